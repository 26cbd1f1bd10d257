"""deploy/kubernetes/agones/ against the Agones version the project pins as its minimum.

- The Fleet and FleetAutoscaler validate against schemas derived from the CRDs of that version
  (tests/schemas/, tools/agones_schemas.py; unknown fields fail, as under strict field
  validation), and the FleetAutoscaler against the rules of Agones' admission webhook, which the
  CRD does not carry; the GameServerAllocation against a schema written from its Go types.
- The pieces agree: the rooms Counter the Fleet declares is the one the relay, the allocation
  and the autoscaler use, its capacity is rooms.max_rooms, the allocation takes a slot on an
  Allocated relay first, the fullest first, and names its room the way the relay reads it.
- The minimum version is one number: the relay's, the schemas', the docs'.
"""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import jsonschema
import pytest

from relay.config import load_config
from relay.server.agones import ALLOCATION_ANNOTATION, MIN_AGONES_VERSION, parse_allocation

from test_deploy import DEPLOY, FLEET, AUTOSCALER, _containers, _env, load_yaml, validate

ALLOCATION = DEPLOY / "kubernetes" / "agones" / "allocation.yaml"
KUSTOMIZATION = DEPLOY / "kubernetes" / "agones" / "kustomization.yaml"
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
SCHEMA_FILES = ["agones-fleet.schema.json", "agones-fleetautoscaler.schema.json",
                "agones-gameserverallocation.schema.json"]


def relay_env() -> dict[str, str]:
    spec = load_yaml(FLEET)["spec"]["template"]["spec"]
    return _env(_containers(spec["template"]["spec"])[spec["container"]])


def relay_config():
    """The relay's settings as the Fleet sets them (the mounted secret files left out)."""
    return load_config(environ={key: value for key, value in relay_env().items()
                                if not key.endswith("_FILE")})


def _int_or_percent(value):
    if isinstance(value, int):
        return value, False
    match = re.fullmatch(r"(\d+)%", str(value))
    assert match, f"bufferSize {value!r}: an integer or a percentage"
    return int(match.group(1)), True


def _buffer_errors(body, low_key, high_key, percent_floor_error):
    """Agones' checks of a buffer policy (Buffer: replicas; Counter and List: capacity)."""
    errors = []
    size, percent = _int_or_percent(body["bufferSize"])
    low, high = body.get(low_key, 0), body[high_key]
    if low > high:
        errors.append(f"{low_key} should be smaller than {high_key}")
    if not percent:
        if size <= 0:
            errors.append("bufferSize must be positive")
        if high < size:
            errors.append(f"{high_key} should be bigger than or equal to bufferSize")
        if low != 0 and low < size:
            errors.append(f"{low_key} should be bigger than or equal to bufferSize")
    else:
        if not 1 <= size <= 99:
            errors.append("bufferSize should be between 1% and 99%")
        if low < 1:
            errors.append(percent_floor_error)
    return errors


def webhook_errors(autoscaler: dict) -> list[str]:
    """What Agones' admission webhook refuses in a FleetAutoscaler (ValidateBufferPolicy,
    ValidateCounterPolicy, ValidateFixedIntervalSync at the pinned version)."""
    errors = []
    policy = autoscaler["spec"]["policy"]
    kind = policy["type"]
    body = policy.get({"Buffer": "buffer", "Counter": "counter", "List": "list",
                       "Webhook": "webhook"}[kind])
    if body is None:
        return [f"{kind.lower()} policy config params are missing"]
    if kind == "Buffer":
        errors += _buffer_errors(body, "minReplicas", "maxReplicas",
                                 "minReplicas must be positive with a percentage buffer")
    if kind in ("Counter", "List"):
        errors += _buffer_errors(body, "minCapacity", "maxCapacity",
                                 "minCapacity should be more than 0 with a percentage buffer")
    sync = autoscaler["spec"].get("sync")
    if sync is not None and sync["fixedInterval"]["seconds"] <= 0:
        errors.append("sync seconds must be positive")
    return errors


# -- the minimum version -----------------------------------------------------------------------

def test_one_minimum_agones_version():
    for name in SCHEMA_FILES:
        schema = json.loads((SCHEMAS / name).read_text())
        assert schema["x-agones-version"] == MIN_AGONES_VERSION, name
    major_minor = ".".join(MIN_AGONES_VERSION.split(".")[:2])
    assert re.search(rf"Agones {re.escape(major_minor)}\b", OPERATIONS.read_text()), (
        f"docs/OPERATIONS.md must state the minimum Agones version ({major_minor})")
    for path in (FLEET, ALLOCATION):
        assert f"Agones >= {major_minor}" in path.read_text(), path.name


# -- each object against its schema -------------------------------------------------------------

def test_fleet_validates_against_the_pinned_crd():
    validate(load_yaml(FLEET), "agones-fleet.schema.json")


def test_fleetautoscaler_validates_against_the_pinned_crd_and_webhook():
    autoscaler = load_yaml(AUTOSCALER)
    validate(autoscaler, "agones-fleetautoscaler.schema.json")
    assert webhook_errors(autoscaler) == []


def test_allocation_validates_against_its_schema():
    validate(load_yaml(ALLOCATION), "agones-gameserverallocation.schema.json")


def test_the_schemas_refuse_what_the_pinned_agones_refuses():
    fleet = load_yaml(FLEET)
    broken = copy.deepcopy(fleet)
    broken["spec"]["template"]["spec"]["ports"][0]["portPolicy"] = "dynamic"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-fleet.schema.json")
    broken = copy.deepcopy(fleet)
    broken["spec"]["template"]["spec"]["helth"] = broken["spec"]["template"]["spec"].pop("health")
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-fleet.schema.json")
    broken = copy.deepcopy(fleet)
    broken["spec"]["priorities"][0]["order"] = "Biggest"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-fleet.schema.json")
    autoscaler = load_yaml(AUTOSCALER)
    broken = copy.deepcopy(autoscaler)
    broken["spec"]["policy"]["type"] = "Chain"          # newer than 1.41
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-fleetautoscaler.schema.json")
    broken = copy.deepcopy(autoscaler)
    del broken["spec"]["policy"]["counter"]["maxCapacity"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-fleetautoscaler.schema.json")
    # The webhook's rules: an absolute buffer above minCapacity, a percentage without one.
    broken = copy.deepcopy(autoscaler)
    broken["spec"]["policy"]["counter"].update(bufferSize=256, minCapacity=128)
    assert webhook_errors(broken) == ["minCapacity should be bigger than or equal to bufferSize"]
    broken["spec"]["policy"]["counter"].update(bufferSize="5%", minCapacity=0)
    assert webhook_errors(broken) == ["minCapacity should be more than 0 with a percentage buffer"]
    buffer = {"type": "Buffer", "buffer": {"bufferSize": 5, "minReplicas": 2, "maxReplicas": 10}}
    assert webhook_errors({"spec": {"policy": buffer}}) == [
        "minReplicas should be bigger than or equal to bufferSize"]
    allocation = load_yaml(ALLOCATION)
    broken = copy.deepcopy(allocation)
    broken["spec"]["selectors"][0]["gameServerState"] = "Reserved"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-gameserverallocation.schema.json")
    broken = copy.deepcopy(allocation)
    del broken["spec"]["counters"]["rooms"]["amount"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "agones-gameserverallocation.schema.json")


# -- the pieces agree ----------------------------------------------------------------------------

def test_fleet_runs_many_rooms_per_relay_behind_the_rooms_counter():
    fleet = load_yaml(FLEET)
    spec = fleet["spec"]["template"]["spec"]
    env = relay_env()
    config = relay_config()
    assert env["RELAY_AGONES_ENABLED"] == "true"
    counter = config.agones.rooms_counter
    assert counter and spec["counters"][counter] == {"count": 0,
                                                     "capacity": config.rooms.max_rooms}
    assert config.rooms.max_rooms >= 64, "the point is many rooms per relay"
    assert config.agones.when_empty == "ready"
    assert {"type": "Counter", "key": counter, "order": "Descending"} in fleet["spec"]["priorities"]
    assert fleet["spec"]["scheduling"] == "Packed"
    assert spec["eviction"]["safe"] == "Never"
    # Health pings well inside Agones' period; the rest of the pod as before.
    assert config.agones.health_interval * 2 <= spec["health"]["periodSeconds"]
    game = {port["name"]: port for port in spec["ports"]}["game"]
    assert game["protocol"] == "UDP" and game["portPolicy"] == "Dynamic"
    assert game["containerPort"] == config.server.udp_port
    relay = _containers(spec["template"]["spec"])[spec["container"]]
    http_ports = {port["name"]: port["containerPort"] for port in relay["ports"]}
    assert http_ports["http"] == config.server.http_port
    assert env["RELAY_SERVER_HTTP_HOST"] == "0.0.0.0"
    if config.agones.player_tracking:
        assert spec.get("players", {}).get("initialCapacity"), "player tracking needs a capacity"
    assert "cpu" not in relay["resources"].get("limits", {}), "a CPU limit throttles the frame loop"
    pod = spec["template"]["spec"]
    assert pod.get("automountServiceAccountToken", True), "the Agones SDK sidecar needs the token"
    assert "livenessProbe" not in relay
    assert 8080 not in {port["containerPort"] for port in relay.get("ports", [])}
    # Rolling out a new template must wait for matches: SIGTERM drains within the grace period.
    assert fleet["spec"]["strategy"]["type"] == "RollingUpdate"
    assert pod["terminationGracePeriodSeconds"] > config.server.drain_timeout


def test_autoscaler_buffers_free_room_slots_of_the_fleet():
    autoscaler = load_yaml(AUTOSCALER)
    fleet = load_yaml(FLEET)
    assert autoscaler["spec"]["fleetName"] == fleet["metadata"]["name"]
    policy = autoscaler["spec"]["policy"]
    assert policy["type"] == "Counter"
    counter = policy["counter"]
    assert counter["key"] == relay_config().agones.rooms_counter
    capacity = fleet["spec"]["template"]["spec"]["counters"][counter["key"]]["capacity"]
    # Capacities are whole relays: a limit between two relays is never reached exactly.
    assert counter["minCapacity"] % capacity == 0 and counter["maxCapacity"] % capacity == 0
    assert counter["minCapacity"] >= capacity


def test_allocation_packs_rooms_and_takes_the_slot_atomically():
    allocation = load_yaml(ALLOCATION)
    spec = allocation["spec"]
    fleet = load_yaml(FLEET)
    counter = relay_config().agones.rooms_counter
    states = [selector["gameServerState"] for selector in spec["selectors"]]
    assert states == ["Allocated", "Ready"] * 2, "an Allocated relay with a free slot first"
    release = fleet["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"]
    (image,) = load_yaml(KUSTOMIZATION)["images"]
    assert release == image["newTag"], "the template's release label is the image tag"
    fleet_label = {"agones.dev/fleet": fleet["metadata"]["name"]}
    assert [s["matchLabels"] for s in spec["selectors"]] == [
        {**fleet_label, "app.kubernetes.io/version": release}] * 2 + [fleet_label] * 2
    for selector in spec["selectors"]:
        assert selector["counters"][counter]["minAvailable"] >= 1
    # Ascending: the least available capacity first, i.e. the fullest relay.
    assert spec["priorities"][0] == {"type": "Counter", "key": counter, "order": "Ascending"}
    action = spec["counters"][counter]
    assert action["action"] == "Increment"
    assert action["amount"] <= min(s["counters"][counter]["minAvailable"] for s in spec["selectors"])
    # The room travels as the relay reads it.
    (key, value), = spec["metadata"]["annotations"].items()
    assert key == ALLOCATION_ANNOTATION
    room = parse_allocation(value)
    assert room["room"] and room["players"]
    # A request, not a resource: never applied with the kustomization.
    assert "allocation.yaml" not in load_yaml(KUSTOMIZATION)["resources"]


def test_percentage_buffer_covers_a_relay_start_at_peak():
    """The autoscaler's percentage of allocated slots, at the 10 000-room peak fleet_sim uses,
    holds at least the rooms that arrive while the autoscaler reacts and a relay starts."""
    counter = load_yaml(AUTOSCALER)["spec"]["policy"]["counter"]
    size, percent = _int_or_percent(counter["bufferSize"])
    sync = load_yaml(AUTOSCALER)["spec"]["sync"]["fixedInterval"]["seconds"]
    peak, mean_match_s, startup_s = 10_000, 15 * 60 * math.exp(0.125), 30
    buffer = math.ceil(peak * 100 / (100 - size)) - peak if percent else size
    assert buffer >= peak / mean_match_s * (sync + startup_s)
