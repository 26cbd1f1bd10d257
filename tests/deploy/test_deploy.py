"""The deployment artefacts under deploy/ against the server they deploy.

- Every metric the Grafana dashboard and the alert rules query is exported by a running relay
  (live /metrics of an in-process RelayServer), with the label values they select.
- deploy/prometheus/alerts.yml has the structure of a rule file (tests/schemas/), and when
  promtool is installed it passes `promtool check rules` and unit tests of the alert
  expressions; prometheus.yml passes `promtool check config --syntax-only`.
- The Kubernetes manifests validate against the Kubernetes OpenAPI schemas (kubernetes-validate,
  offline); the Agones objects in tests/deploy/test_agones_deploy.py;
  kustomizations render when kubectl is installed.
- docker-compose.yml has the expected services, ports and volumes, and every file it mounts
  or builds from exists; its Prometheus/Grafana wiring matches the files it mounts.
- deploy/systemd/relay.service has the expected keys (and `systemd-analyze verify` passes when
  systemd-analyze is installed).
- The stop timeouts of every variant cover the relay's drain plus shutdown, and every
  RELAY_* variable the artefacts set is a valid setting.

Needs PyYAML, jsonschema and kubernetes-validate (test extras); promtool, kubectl and
systemd-analyze are optional and their checks are skipped without them.
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from relay.config import SECTIONS, ServerSettings, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"

DASHBOARD = DEPLOY / "grafana" / "relay-dashboard.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
UNIT = DEPLOY / "systemd" / "relay.service"
K8S = DEPLOY / "kubernetes"
FLEET = K8S / "agones" / "fleet.yaml"
AUTOSCALER = K8S / "agones" / "fleetautoscaler.yaml"
DEPLOYMENT = K8S / "plain" / "deployment.yaml"
SERVICE = K8S / "plain" / "service.yaml"

# A metric name as PromQL writes it: relay_* (ours) and process_* (prometheus_client's process
# collector, which every relay registers).
METRIC_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:relay|process)_[a-z0-9_]*[a-z0-9])(?![a-z0-9_(])")
SELECTOR_RE = re.compile(r"((?:relay|process)_[a-z0-9_]*[a-z0-9])\s*\{([^}]*)\}")
MATCHER_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus attaches to every scraped sample; the relay does not export them."""

# RELAY_* sections the artefacts may set before relay/config.py has them (load_config ignores
# variables of unknown sections, so they would be inert). Empty: every section exists.
PENDING_SECTIONS: set[str] = set()


def load_yaml_documents(path: Path) -> list:
    with open(path) as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def load_yaml(path: Path):
    (document,) = load_yaml_documents(path)
    return document


def load_schema(name: str) -> dict:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def validate(instance, schema_name: str) -> None:
    jsonschema.Draft202012Validator(load_schema(schema_name)).validate(instance)


# -- the metrics a live relay exports ------------------------------------------------------------

async def _scrape(tmp_path: Path) -> str:
    from aiohttp import ClientSession

    from relay.server import RelayServer

    config = load_config(environ={
        "RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
        "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays")})
    server = RelayServer(config)
    await server.start()
    try:
        async with ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{server.http_port}/metrics") as response:
                assert response.status == 200
                return await response.text()
    finally:
        await server.stop()


@pytest.fixture(scope="module")
def live_metrics(tmp_path_factory) -> dict[str, dict]:
    """{sample name: {"type": family type, "labels": {label: {values seen}}}} of a live relay.

    A family without samples yet (a labelled metric whose label values appear with the first
    event, like relay_join_refusals_total) still declares its sample names through its type.
    """
    text = asyncio.run(_scrape(tmp_path_factory.mktemp("live")))
    names: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                                     "_created"),
                    "summary": ("", "_sum", "_count", "_created")}.get(family.type, ("",))
        for suffix in suffixes:
            names.setdefault(family.name + suffix, {"type": family.type, "labels": {}})
        for sample in family.samples:
            entry = names.setdefault(sample.name, {"type": family.type, "labels": {}})
            for label, value in sample.labels.items():
                entry["labels"].setdefault(label, set()).add(value)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(panels):
        for panel in panels:
            exprs.extend(target["expr"] for target in panel.get("targets", []) if "expr" in target)
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def alert_exprs() -> list[str]:
    return [rule["expr"] for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


EXPR_SOURCES = {"dashboard": dashboard_exprs, "alerts": alert_exprs}


@pytest.mark.parametrize("source", sorted(EXPR_SOURCES))
def test_queried_metrics_are_exported(source, live_metrics):
    exprs = EXPR_SOURCES[source]()
    used = {name for expr in exprs for name in METRIC_RE.findall(expr)}
    assert any(name.startswith("relay_") for name in used), f"no relay metric found in {source}"
    missing = sorted(name for name in used if name not in live_metrics)
    assert not missing, f"{source} queries metrics the relay does not export: {missing}"
    # The histogram suffixes only exist for histograms; a gauge never gets a _total.
    for name in used:
        if name.endswith(("_bucket", "_sum", "_count")):
            assert live_metrics[name]["type"] in ("histogram", "summary"), name


@pytest.mark.parametrize("source", sorted(EXPR_SOURCES))
def test_selected_label_values_exist(source, live_metrics):
    """name{label="value"} selects a label value the relay creates (all of ours are created at
    zero up front), so a misspelt outcome or state does not silently select nothing."""
    for expr in EXPR_SOURCES[source]():
        for name, matchers in SELECTOR_RE.findall(expr):
            for label, op, value in MATCHER_RE.findall(matchers):
                if op != "=" or label in TARGET_LABELS:
                    continue
                seen = live_metrics[name]["labels"].get(label, set())
                assert value in seen, f"{source}: {name}{{{label}={value!r}}}: exported {sorted(seen)}"


@pytest.mark.parametrize("source", sorted(EXPR_SOURCES))
def test_counters_and_buckets_are_rated(source, live_metrics):
    """A counter or histogram bucket is only meaningful through rate()/increase()."""
    for expr in EXPR_SOURCES[source]():
        for match in METRIC_RE.finditer(expr):
            name = match.group(1)
            kind = live_metrics.get(name, {}).get("type")
            if kind == "counter" or name.endswith("_bucket"):
                before = expr[:match.start()].rstrip()
                assert re.search(r"\b(rate|irate|increase)\($", before), (
                    f"{source}: {name} is not inside rate()/increase(): {expr}")


# -- Grafana dashboard -------------------------------------------------------------------------

def test_dashboard_structure():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "Relay"
    assert dashboard["uid"] and len(dashboard["uid"]) <= 40
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["type"] == "query"
    assert variables["instance"]["datasource"]["uid"] == "${datasource}"

    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({target["refId"] for target in targets}) == len(targets)
        for target in targets:
            assert target["datasource"]["uid"] == "${datasource}"
            # Every query follows the relay selector.
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


def test_dashboard_covers_the_relay():
    used = {name for expr in dashboard_exprs() for name in METRIC_RE.findall(expr)}
    expected = {
        "relay_peers", "relay_rooms", "relay_tick_lateness_seconds_bucket",
        "relay_datagrams_received_total", "relay_datagrams_sent_total",
        "relay_received_bytes_total", "relay_sent_bytes_total", "relay_resends_total",
        "relay_redundant_bytes_total", "relay_peer_rtt_seconds_bucket", "relay_peer_loss_ratio",
        "relay_desyncs_total", "relay_dropped_datagrams_total", "relay_inputs_total",
        "relay_joins_total", "relay_join_refusals_total", "relay_block_transfers_total",
        "relay_frames_broadcast_total", "relay_draining",
    }
    assert expected <= used, f"dashboard lacks {sorted(expected - used)}"


# -- Prometheus rules and config ---------------------------------------------------------------

REQUIRED_ALERTS = {"RelayDown", "RelayTickLatenessHigh", "RelayDesync", "RelayDropRateHigh",
                   "RelayPeerLossHigh", "RelayDrainingTooLong"}


def test_alert_rules_schema():
    rules = load_yaml(ALERTS)
    validate(rules, "prometheus-rules.schema.json")
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    names = [rule["alert"] for rule in alerts]
    assert len(names) == len(set(names)), "alert names must be unique"
    assert REQUIRED_ALERTS <= set(names), sorted(REQUIRED_ALERTS - set(names))
    group_names = [group["name"] for group in rules["groups"]]
    assert len(group_names) == len(set(group_names))
    for rule in alerts:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
    down = next(rule for rule in alerts if rule["alert"] == "RelayDown")
    assert re.sub(r"\s+", "", down["expr"]) == 'up{job="relay"}==0' and down["for"] == "1m"


def test_prometheus_config_scrapes_relay():
    config = load_yaml(PROMETHEUS_CONFIG)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    relay = jobs["relay"]      # the alerts select job="relay"
    assert relay["scrape_interval"] == "5s"
    assert [target for group in relay["static_configs"] for target in group["targets"]] == [
        "relay:9100"]
    assert "/etc/prometheus/alerts.yml" in config["rule_files"]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus); "
                    "the schema test still checks alerts.yml's structure")
    return promtool


def test_promtool_check_rules():
    result = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_config():
    promtool = _promtool()
    result = subprocess.run([promtool, "check", "config", "--syntax-only", str(PROMETHEUS_CONFIG)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
                     "$instance": ".*"}


def test_promtool_parses_dashboard_queries(tmp_path):
    """The dashboard's queries are valid PromQL once Grafana's variables are substituted
    (checked as recording rules, the one way promtool parses a bare expression)."""
    promtool = _promtool()
    dashboard = json.loads(DASHBOARD.read_text())
    rules = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"unknown Grafana variable in {target['expr']}"
            rules.append({"record": f"dashboard:panel{panel['id']}:{target['refId']}",
                          "expr": expr})
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", "dashboard.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# Unit tests of the alert expressions and `for` durations (promtool test rules): the series a
# relay would export, the alerts expected to fire at a time, with their labels. Annotations are
# stripped from the copy of the rules under test (their templates are checked by check rules).
RELAY = {"job": "relay", "instance": "relay:9100"}


def _series(name: str, values: str, **labels) -> dict:
    labels = {**RELAY, **labels}
    text = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def _tick_lateness(le_values: dict[str, str]) -> list[dict]:
    return [_series("relay_tick_lateness_seconds_bucket", values, le=le)
            for le, values in le_values.items()]


ALERT_CASES = [
    ("RelayDown", [_series("up", "1 1 0 0 0 0 0")],
     {"1m": [], "2m": [], "4m": [{"severity": "critical", **RELAY}]}),
    ("RelayFrameLoopStalled",
     [_series("up", "1x20"), _series("relay_ticks_total", "0+1800x5 9000x15")],
     {"4m": [], "12m": [{"severity": "critical", **RELAY}]}),
    ("RelayDesync", [_series("relay_desyncs_total", "0 0 1 1 1 1 1 1 1 1 1 1")],
     {"1m": [], "3m": [{"severity": "warning", **RELAY}], "11m": []}),
    ("RelayDropRateHigh",
     [_series("relay_datagrams_received_total", "0+6000x30"),
      _series("relay_dropped_datagrams_total", "0+600x30", reason="bad_magic")],
     {"5m": [], "20m": [{"severity": "warning", "instance": RELAY["instance"]}]}),
    ("RelayDropRateHigh",      # 1 % dropped: no alert
     [_series("relay_datagrams_received_total", "0+6000x30"),
      _series("relay_dropped_datagrams_total", "0+60x30", reason="bad_magic")],
     {"20m": []}),
    ("RelayTickLatenessHigh",   # every tick 2..5 ms late
     _tick_lateness({"0.001": "0x20", "0.002": "0x20", "0.005": "0+1800x20",
                     "+Inf": "0+1800x20"}),
     {"3m": [], "15m": [{"severity": "warning", "instance": RELAY["instance"]}]}),
    ("RelayTickLatenessHigh",   # every tick under 1 ms late: no alert
     _tick_lateness({"0.001": "0+1800x20", "0.002": "0+1800x20", "0.005": "0+1800x20",
                     "+Inf": "0+1800x20"}),
     {"15m": []}),
    ("RelayPeerLossHigh", [_series("relay_peer_loss_ratio", "0.2x20"), _series("relay_peers", "4x20")],
     {"5m": [], "15m": [{"severity": "warning", **RELAY}]}),
    ("RelayPeerLossHigh", [_series("relay_peer_loss_ratio", "0.2x20"), _series("relay_peers", "0x20")],
     {"15m": []}),
    ("RelayAgonesSidecarFailing", [_series("relay_agones_sidecar_failures_total", "0+60x20")],
     {"3m": [], "10m": [{"severity": "warning", **RELAY}]}),
    ("RelayAgonesSidecarFailing", [_series("relay_agones_sidecar_failures_total", "0+1x20")],
     {"10m": []}),
    ("RelayDrainingTooLong", [_series("relay_draining", "0 1x30")],
     {"10m": [], "20m": [{"severity": "warning", **RELAY}]}),
    ("RelayTargetMissing", [{"series": 'up{job="prometheus", instance="localhost:9090"}',
                             "values": "1x10"}],
     {"3m": [], "7m": [{"severity": "warning", "job": "relay"}]}),
]


def test_promtool_alert_unit_tests(tmp_path):
    promtool = _promtool()
    rules = load_yaml(ALERTS)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = []
    for alert, series, expectations in ALERT_CASES:
        tests.append({
            "name": f"{alert} {len(tests)}",
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": at, "alertname": alert,
                 "exp_alerts": [{"exp_labels": labels} for labels in firing]}
                for at, firing in expectations.items()],
        })
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests},
        sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- Kubernetes --------------------------------------------------------------------------------

def k8s_validate(document: dict, version: str) -> None:
    """kubernetes-validate in strict mode (unknown fields fail), with a short failure message."""
    try:
        kubernetes_validate.validate(document, version, strict=True)
        return
    except kubernetes_validate.ValidationError as error:
        where = "/".join(str(part) for part in error.absolute_path)
        problem = f"{where}: {error.message}"
    pytest.fail(f"{document['kind']} {document['metadata']['name']} (Kubernetes {version}): "
                f"{problem}", pytrace=False)


def _kubernetes_versions() -> list[str]:
    """The oldest and the newest Kubernetes release kubernetes-validate ships schemas of."""
    versions = kubernetes_validate.utils.all_versions()
    return sorted({versions[0], versions[-1]})


def _containers(pod_spec: dict) -> dict[str, dict]:
    return {container["name"]: container for container in pod_spec["containers"]}


def _env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


@pytest.mark.parametrize("version", _kubernetes_versions())
@pytest.mark.parametrize("path", [DEPLOYMENT, SERVICE], ids=lambda path: path.name)
def test_kubernetes_manifests_validate(path, version):
    documents = load_yaml_documents(path)
    assert documents
    for document in documents:
        k8s_validate(document, version)


@pytest.mark.parametrize("version", _kubernetes_versions())
def test_fleet_pod_template_validates(version):
    """The GameServers' pod template is a core/v1 PodTemplateSpec: validate it as one."""
    fleet = load_yaml(FLEET)
    pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "relay"},
                    "template": fleet["spec"]["template"]["spec"]["template"]}
    k8s_validate(pod_template, version)


def test_plain_deployment():
    deployment = load_yaml(DEPLOYMENT)
    pod = deployment["spec"]["template"]["spec"]
    relay = _containers(pod)["relay"]
    assert relay["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert relay["livenessProbe"]["httpGet"]["path"] == "/health"
    assert relay["lifecycle"]["preStop"]
    assert pod["terminationGracePeriodSeconds"] == 45
    # kube-proxy flushes the UDP conntrack entries of an endpoint that fails readiness: the
    # probe must not notice a SIGTERM drain before the pod is gone (see the manifest).
    readiness = relay["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] > \
        pod["terminationGracePeriodSeconds"]
    assert "cpu" not in relay["resources"].get("limits", {}), "a CPU limit throttles the frame loop"
    ports = {port["name"]: port for port in relay["ports"]}
    assert ports["game"]["protocol"] == "UDP"

    services = {service["metadata"]["name"]: service for service in load_yaml_documents(SERVICE)}
    game = services["relay"]["spec"]
    assert game["type"] == "LoadBalancer"
    assert [(port["port"], port["protocol"], port["targetPort"]) for port in game["ports"]] == [
        (7777, "UDP", "game")]
    metrics = services["relay-metrics"]["spec"]
    assert metrics.get("type", "ClusterIP") == "ClusterIP"
    assert [(port["port"], port["targetPort"]) for port in metrics["ports"]] == [(9100, "http")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for service in services.values():
        assert service["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("variant", ["agones", "plain"])
def test_kustomizations(variant):
    directory = K8S / variant
    kustomization = load_yaml(directory / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    for resource in kustomization["resources"]:
        assert (directory / resource).is_file(), resource
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: kustomization not rendered")
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    images = {container["image"] for doc in rendered for container in _pod_containers(doc)}
    assert images and all(":" in image for image in images), images


def _pod_containers(document: dict) -> list[dict]:
    spec = document.get("spec", {})
    if document["kind"] == "Deployment":
        return spec["template"]["spec"]["containers"]
    if document["kind"] == "Fleet":
        return spec["template"]["spec"]["template"]["spec"]["containers"]
    return []


# -- docker compose ----------------------------------------------------------------------------

def _compose_path(value: str) -> Path:
    return (COMPOSE.parent / value).resolve()


def test_compose_file():
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    assert {"relay", "prometheus", "grafana"} <= set(services)

    relay = services["relay"]
    context = _compose_path(relay["build"]["context"])
    assert context == ROOT
    dockerfile = context / relay["build"].get("dockerfile", "Dockerfile")
    assert dockerfile.is_file(), f"{dockerfile} is missing"
    if "healthcheck" not in relay:
        assert re.search(r"^HEALTHCHECK\s", dockerfile.read_text(), re.M), (
            "the relay service relies on the image's HEALTHCHECK")
    assert "7777:7777/udp" in relay["ports"]
    assert any(port.endswith("9100:9100/tcp") or port.endswith("9100:9100")
               for port in relay["ports"])
    assert relay["environment"]["RELAY_SERVER_HTTP_HOST"] == "0.0.0.0"
    assert any(volume.endswith(":" + relay["environment"]["RELAY_REPLAY_DIRECTORY"])
               for volume in relay["volumes"])

    for name in ("prometheus", "grafana"):
        image = services[name]["image"]
        repository, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: pin {image}"

    declared_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert _compose_path(source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared_volumes, f"{name}: volume {source} is not declared"
        for port in service.get("ports", []):
            assert re.fullmatch(r"((\d+\.){3}\d+:)?\d+:\d+(/(tcp|udp))?", port), port


def _mounts(service: dict) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")):
            mounts[target] = _compose_path(source)
    return mounts


def test_compose_wiring():
    """The files mounted into Prometheus and Grafana are the ones their configs point at."""
    services = load_yaml(COMPOSE)["services"]
    prometheus = _mounts(services["prometheus"])
    config_flag = next(arg for arg in services["prometheus"]["command"]
                       if arg.startswith("--config.file="))
    config_path = prometheus[config_flag.split("=", 1)[1]]
    assert config_path == PROMETHEUS_CONFIG.resolve()
    for rule_file in load_yaml(config_path)["rule_files"]:
        assert prometheus[rule_file] == ALERTS.resolve()
    target = load_yaml(config_path)["scrape_configs"][0]["static_configs"][0]["targets"][0]
    host, port = target.split(":")
    assert host in services and port == "9100"

    grafana = _mounts(services["grafana"])
    datasources = grafana["/etc/grafana/provisioning/datasources"]
    dashboards = grafana["/etc/grafana/provisioning/dashboards"]
    (datasource,) = [source for path in sorted(datasources.glob("*.y*ml"))
                     for source in load_yaml(path)["datasources"]]
    assert datasource["type"] == "prometheus"
    assert datasource["url"].split("//")[1].split(":")[0] == "prometheus"
    (provider,) = [provider for path in sorted(dashboards.glob("*.y*ml"))
                   for provider in load_yaml(path)["providers"]]
    dashboard_dir = provider["options"]["path"]
    mounted = [host for container, host in grafana.items()
               if container.startswith(dashboard_dir.rstrip("/") + "/")]
    assert mounted == [DASHBOARD.resolve()]


# -- systemd -----------------------------------------------------------------------------------

def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: {section: {key: [values in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line {number}: continuation lines are not expected"
        if line.startswith("["):
            assert line.endswith("]"), f"line {number}: {raw!r}"
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"line {number}: key outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"line {number}: not key=value: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def systemd_seconds(value: str) -> float:
    """A systemd time span ('45', '45s', '1min 30s', '2m') in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def test_systemd_unit():
    unit = parse_unit(UNIT)
    assert {"Unit", "Service", "Install"} <= set(unit)
    service = {key: values[-1] for key, values in unit["Service"].items()}
    assert service["ExecStart"] == "/opt/relay/venv/bin/relay serve --config /etc/relay/relay.toml"
    assert service["User"] and service["User"] != "root"
    assert service["Restart"] == "on-failure"
    assert 1 <= systemd_seconds(service["RestartSec"]) <= 60
    assert int(unit["Unit"]["StartLimitBurst"][-1]) >= 1
    assert systemd_seconds(unit["Unit"]["StartLimitIntervalSec"][-1]) > 0
    assert service["KillSignal"] == "SIGTERM"
    assert systemd_seconds(service["TimeoutStopSec"]) >= 40
    environment = " ".join(unit["Service"]["Environment"])
    assert "RELAY_REPLAY_DIRECTORY=/var/lib/relay/replays" in environment.split()
    assert service["StateDirectory"] == "relay"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices",
                "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                "ProtectControlGroups", "RestrictNamespaces", "LockPersonality"):
        assert service[key] == "yes", key
    assert service["ProtectSystem"] == "strict"
    assert service["CapabilityBoundingSet"] == ""
    assert service["RestrictAddressFamilies"].split() == ["AF_INET", "AF_INET6", "AF_UNIX"]
    assert "@system-service" in unit["Service"]["SystemCallFilter"]
    assert service["MemoryDenyWriteExecute"] in ("yes", "no")
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_analyze_verify(tmp_path):
    """`systemd-analyze verify`: unknown keys, bad values, a missing executable. The venv path
    only exists on an installed host, so the copy under test runs this test's relay script."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    relay = Path(sys.executable).parent / "relay"
    if not relay.exists():
        pytest.skip(f"no relay script next to {sys.executable}")
    text = UNIT.read_text().replace("/opt/relay/venv/bin/relay", str(relay))
    (tmp_path / "relay.service").write_text(text)
    result = subprocess.run([analyze, "verify", str(tmp_path / "relay.service")],
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "relay.service" not in output, output
    security = subprocess.run([analyze, "security", "--offline=yes", "--threshold=30",
                               str(tmp_path / "relay.service")],
                              capture_output=True, text=True, timeout=60)
    assert security.returncode == 0, security.stdout[-2000:] + security.stderr


# -- across the variants -----------------------------------------------------------------------

def test_stop_timeouts_cover_the_drain():
    """SIGTERM drains for up to server.drain_timeout and then shuts down within
    server.shutdown_timeout; every variant must wait that long (plus a margin) before SIGKILL."""
    defaults = ServerSettings()
    needed = getattr(defaults, "drain_timeout", 30.0) + defaults.shutdown_timeout + 5
    unit = parse_unit(UNIT)
    compose = load_yaml(COMPOSE)["services"]["relay"]
    fleet = load_yaml(FLEET)["spec"]["template"]["spec"]["template"]["spec"]
    deployment = load_yaml(DEPLOYMENT)["spec"]["template"]["spec"]
    pre_stop = _containers(deployment)["relay"].get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    pre_stop_seconds = pre_stop.get("sleep", {}).get("seconds", 0)
    if command[:1] == ["sleep"]:
        pre_stop_seconds = float(command[1])
    assert not pre_stop or pre_stop_seconds, f"preStop hook of unknown duration: {pre_stop}"
    waits = {
        "systemd TimeoutStopSec": systemd_seconds(unit["Service"]["TimeoutStopSec"][-1]),
        "compose stop_grace_period": systemd_seconds(compose["stop_grace_period"]),
        "agones terminationGracePeriodSeconds": fleet["terminationGracePeriodSeconds"],
        "deployment terminationGracePeriodSeconds (less preStop)":
            deployment["terminationGracePeriodSeconds"] - pre_stop_seconds,
    }
    short = {name: wait for name, wait in waits.items() if wait < needed}
    assert not short, f"need >= {needed} s: {short}"


def _relay_environments() -> dict[str, dict[str, str]]:
    unit = parse_unit(UNIT)
    systemd = dict(item.split("=", 1) for line in unit["Service"]["Environment"]
                   for item in line.split())
    compose = {key: str(value)
               for key, value in load_yaml(COMPOSE)["services"]["relay"]["environment"].items()}
    fleet = load_yaml(FLEET)["spec"]["template"]["spec"]
    return {
        "systemd": systemd,
        "compose": compose,
        "agones": _env(_containers(fleet["template"]["spec"])[fleet["container"]]),
        "plain": _env(_containers(load_yaml(DEPLOYMENT)["spec"]["template"]["spec"])["relay"]),
    }


@pytest.mark.parametrize("variant", ["systemd", "compose", "agones", "plain"])
def test_relay_environment_is_valid(variant, tmp_path):
    """Every RELAY_<SECTION>_<KEY> an artefact sets is a setting the relay accepts."""
    environ = {key: value for key, value in _relay_environments()[variant].items()
               if key.startswith("RELAY_")}
    unknown = {key for key in environ
               if key[len("RELAY_"):].lower().partition("_")[0] not in SECTIONS}
    pending = {key for key in unknown
               if key[len("RELAY_"):].lower().partition("_")[0] in PENDING_SECTIONS}
    assert unknown == pending, f"{variant}: variables of no relay section: {sorted(unknown - pending)}"
    environ["RELAY_REPLAY_DIRECTORY"] = str(tmp_path)     # validated, not created, but stay local
    # Secrets are never written into an artefact, only the paths where they are mounted...
    assert not {"RELAY_SECURITY_KEYS", "RELAY_SECURITY_ADMIN_TOKEN"} & set(environ), variant
    # ...which the test fills the way the secret store would.
    secrets = {"RELAY_SECURITY_KEYS_FILE": f'1 = "{"A" * 43}="\n',
               "RELAY_SECURITY_ADMIN_TOKEN_FILE": "0123456789abcdef0123456789abcdef\n"}
    for name, content in secrets.items():
        if name in environ:
            path = tmp_path / name.lower()
            path.write_text(content)
            environ[name] = str(path)
    config = load_config(environ=environ)
    # Every variant serves players beyond loopback: token mode, and it could start.
    assert config.server.udp_host == "0.0.0.0" and config.security_mode == "token", variant
    config.check_serve()


def test_secrets_come_from_a_secret_store_mounted_where_the_relay_reads_them():
    """Kubernetes: the Secret relay-secrets is mounted read-only at the directory of the
    RELAY_SECURITY_*_FILE paths. Compose: the same files as compose secrets, from a directory
    git ignores. systemd: the keys as a credential."""
    fleet = load_yaml(FLEET)["spec"]["template"]["spec"]
    pods = {"agones": (fleet["template"]["spec"], _containers(fleet["template"]["spec"])[fleet["container"]]),
            "plain": (load_yaml(DEPLOYMENT)["spec"]["template"]["spec"], None)}
    pods["plain"] = (pods["plain"][0], _containers(pods["plain"][0])["relay"])
    for variant, (pod, container) in pods.items():
        env = _env(container)
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
        for name in ("RELAY_SECURITY_KEYS_FILE", "RELAY_SECURITY_ADMIN_TOKEN_FILE"):
            directory = str(Path(env[name]).parent)
            mount = mounts[directory]
            assert mount.get("readOnly") is True, variant
            assert volumes[mount["name"]]["secret"]["secretName"] == "relay-secrets", variant
            key = Path(env[name]).name
            example = load_yaml(K8S / "plain" / "secret.example.yaml")
            assert key in example["stringData"], (variant, key)
    kustomized = load_yaml(K8S / "plain" / "kustomization.yaml")["resources"]
    assert "secret.example.yaml" not in kustomized, "no placeholder secret gets applied"

    compose = load_yaml(COMPOSE)
    relay = compose["services"]["relay"]
    environment = relay["environment"]
    for secret in relay["secrets"]:
        source = _compose_path(compose["secrets"][secret]["file"])
        ignore = source.parent / ".gitignore"
        assert ignore.is_file() and "*" in ignore.read_text().split(), secret
        assert f"/run/secrets/{secret}" in environment.values(), secret

    unit = parse_unit(UNIT)["Service"]
    credentials = dict(line.split(":", 1) for line in unit["LoadCredential"])
    assert "RELAY_SECURITY_KEYS_FILE=/run/credentials/relay.service/relay-keys" in " ".join(unit["Environment"])
    assert "relay-keys" in credentials
