"""A stand-in for the Agones SDK sidecar's REST gateway, as Agones 1.56 serves it.

What it models (learned from Agones' pkg/sdkserver, sdks/swagger and pkg/util/runtime):

* the routes and methods of the SDK's sdk and alpha swagger files and the beta Counters (Lists
  are not modelled); anything else is 404 {"code": 5, "message": "Not Found"};
* request bodies as protojson reads them: protobuf or JSON field names, int64 as a number or a
  string, unknown fields ignored, a body that is not JSON -> 400 {"code": 3};
* answers as the gateway writes them: protobuf field names, every field present, int64 as
  strings; errors as {"code", "message", "details"}: InvalidArgument -> 400, the SDK server's
  own errors (errors.Errorf, gRPC code Unknown) -> 500;
* SetLabel/SetAnnotation: 400 for a key that is not a qualified name and for an invalid label
  value (Agones >= 1.56); stored with the "agones.dev/sdk-" prefix;
* player tracking (alpha): false for a duplicate connect or an unknown disconnect, 500 "players
  are already at capacity", 500 "PlayerTracking not enabled" with the gate off;
* Counters (beta): GET/PATCH /v1beta1/counters/{name}; exactly one of count, capacity, countDiff;
  the count kept within [0, capacity] ("out of range" 500), "counter not found" 500; one
  request at a time (the SDK server holds a mutex);
* the GameServer state machine: Scheduled -> Ready (Ready) -> Allocated (Allocate or an
  allocation) -> Ready / Shutdown; Unhealthy after failureThreshold health periods without a
  Health ping, and nothing leaves Unhealthy or Shutdown;
* GET /watch/gameserver: the GameServer now, then one {"result": GameServer} line per change.

``allocate()`` plays the allocator's part (a GameServerAllocation picking this GameServer).
Every call is recorded; ``fail[path] = n`` answers the next n calls 500, ``hang[path] = n``
holds the next n calls until ``release`` is set.
"""
import asyncio
import json
import re
import time
from datetime import datetime, timezone

from aiohttp import web

SDK_PREFIX = "agones.dev/sdk-"
LAST_ALLOCATED = "agones.dev/last-allocated"

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_qualified_name(key):
    """Kubernetes' IsQualifiedName: [prefix/]name, name 1..63, prefix a DNS subdomain."""
    if not isinstance(key, str):
        return False
    parts = key.split("/")
    if len(parts) > 2:
        return False
    name = parts[-1]
    if not name or len(name) > 63 or not _NAME.match(name):
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > 253:
            return False
        if not all(_DNS_LABEL.match(label) for label in prefix.split(".")):
            return False
    return True


def is_label_value(value):
    return isinstance(value, str) and len(value) <= 63 and bool(_LABEL_VALUE.match(value))


class Refused(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def invalid(message):
    return Refused(400, 3, message)


def unknown(message):
    return Refused(500, 2, message)


def _int64(body, *names):
    """protojson: an int64 field under its protobuf or JSON name, a number or a string."""
    for name in names:
        if name in body and body[name] is not None:
            value = body[name]
            if isinstance(value, bool):
                raise invalid(f"proto: invalid value for int64 field {name}: {value}")
            try:
                return int(value)
            except (TypeError, ValueError):
                raise invalid(f"proto: invalid value for int64 field {name}: {value!r}")
    return None


class SidecarStandIn:
    ROUTES = [
        ("POST", "/ready"), ("POST", "/health"), ("POST", "/shutdown"), ("POST", "/allocate"),
        ("POST", "/reserve"), ("GET", "/gameserver"), ("GET", "/watch/gameserver"),
        ("PUT", "/metadata/label"), ("PUT", "/metadata/annotation"),
        ("POST", "/alpha/player/connect"), ("POST", "/alpha/player/disconnect"),
        ("PUT", "/alpha/player/capacity"), ("GET", "/alpha/player/capacity"),
        ("GET", "/alpha/player/count"), ("GET", "/alpha/player/connected"),
        ("GET", "/alpha/player/connected/{playerID}"),
        ("GET", "/v1beta1/counters/{name}"), ("PATCH", "/v1beta1/counters/{name}"),
    ]

    def __init__(self, *, name="relay-x7k2p", counters=None, player_tracking=True,
                 counts_and_lists=True, player_capacity=0, health_period=5.0,
                 failure_threshold=3, initial_delay=0.0, health_disabled=False):
        self.name = name
        self.state = "Scheduled"
        self.labels = {}
        self.annotations = {}
        self.counters = {key: {"count": count, "capacity": capacity}
                         for key, (count, capacity) in (counters or {}).items()}
        self.player_tracking = player_tracking
        self.counts_and_lists = counts_and_lists
        self.player_capacity = player_capacity
        self.players = []
        self.health = {"disabled": health_disabled, "period_seconds": health_period,
                       "failure_threshold": failure_threshold, "initial_delay_seconds": initial_delay}
        self.last_health = None
        self.health_failures = 0
        self.generation = 1
        self.calls = []          # (time, method, path, body)
        self.fail = {}
        self.fail_text = {}
        self.hang = {}
        self.release = asyncio.Event()
        self.runner = None
        self.port = None
        self._watchers = []
        self._health_task = None
        self._lock = asyncio.Lock()

    # -- the GameServer ---------------------------------------------------------------------

    def gameserver(self):
        """As the REST gateway writes it: protobuf names, every field, int64 as strings."""
        return {
            "object_meta": {
                "name": self.name, "namespace": "default", "uid": "0b5e-4c1d", "resource_version":
                str(self.generation), "generation": str(self.generation),
                "creation_timestamp": "1764165600", "deletion_timestamp": "0",
                "annotations": dict(self.annotations), "labels": dict(self.labels)},
            "spec": {"health": {
                "disabled": self.health["disabled"],
                "period_seconds": int(self.health["period_seconds"]),
                "failure_threshold": self.health["failure_threshold"],
                "initial_delay_seconds": int(self.health["initial_delay_seconds"])}},
            "status": {
                "state": self.state, "address": "10.0.0.7", "addresses": [
                    {"type": "InternalIP", "address": "10.0.0.7"}],
                "ports": [{"name": "game", "port": 7501}],
                "players": {"count": str(len(self.players)), "capacity": str(self.player_capacity),
                            "ids": list(self.players)} if self.player_tracking else None,
                "counters": {key: {"count": str(c["count"]), "capacity": str(c["capacity"])}
                             for key, c in self.counters.items()},
                "lists": {}},
        }

    def _changed(self):
        self.generation += 1
        line = json.dumps({"result": self.gameserver()}).encode() + b"\n"
        for queue in self._watchers:
            queue.put_nowait(line)

    def _set_state(self, state):
        # The SDK cannot move a GameServer out of Unhealthy, nor out of Shutdown.
        if self.state in ("Unhealthy", "Shutdown") or self.state == state:
            return
        self.state = state
        self._changed()

    def allocate(self, *, states=("Allocated", "Ready"), min_available=None, counters=None,
                 annotations=None, labels=None):
        """What a GameServerAllocation does when its selectors pick this GameServer: checks
        the state and the Counters' available capacity, then in one update applies the Counter
        actions (Increment), the metadata, agones.dev/last-allocated and Allocated. False (and
        nothing changed) if this GameServer does not match."""
        if self.state not in states:
            return False
        for key, need in (min_available or {}).items():
            counter = self.counters.get(key)
            if counter is None or counter["capacity"] - counter["count"] < need:
                return False
        for key, amount in (counters or {}).items():
            counter = self.counters.get(key)
            if counter is None or counter["count"] + amount > counter["capacity"]:
                return False
        for key, amount in (counters or {}).items():
            self.counters[key]["count"] += amount
        self.annotations.update(annotations or {})
        self.labels.update(labels or {})
        self.annotations[LAST_ALLOCATED] = datetime.now(timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        self.state = "Allocated"
        self._changed()
        return True

    # -- HTTP -------------------------------------------------------------------------------

    async def handle(self, request):
        raw = await request.read() if request.can_read_body else b""
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = None
        self.calls.append((time.monotonic(), request.method, request.path, body))
        if self.hang.get(request.path, 0) > 0:
            self.hang[request.path] -= 1
            await self.release.wait()
        if self.fail.get(request.path, 0) > 0:
            self.fail[request.path] -= 1
            return self._error(unknown(self.fail_text.get(request.path, "transient")))
        if body is None or not isinstance(body, dict):
            return self._error(invalid("proto: syntax error: the body is not a JSON object"))
        if request.path == "/watch/gameserver":
            return await self._watch(request)
        try:
            async with self._lock:
                result = self._dispatch(request.method, request.path, body, request.match_info)
        except Refused as refusal:
            return self._error(refusal)
        return web.json_response(result)

    async def _not_found(self, request):
        self.calls.append((time.monotonic(), request.method, request.path, None))
        return self._error(Refused(404, 5, "Not Found"))

    def _error(self, refusal):
        return web.json_response({"code": refusal.code, "message": refusal.message, "details": []},
                                 status=refusal.status)

    def _dispatch(self, method, path, body, match):
        if path == "/ready":
            self._set_state("Ready")
            self._health_started()
            return {}
        if path == "/allocate":
            self._set_state("Allocated")
            return {}
        if path == "/shutdown":
            self._set_state("Shutdown")
            return {}
        if path == "/health":
            self.last_health = time.monotonic()
            self.health_failures = 0
            return {}
        if path == "/reserve":
            self._set_state("Reserved")
            return {}
        if path == "/gameserver":
            return self.gameserver()
        if path in ("/metadata/label", "/metadata/annotation"):
            return self._metadata(path.rsplit("/", 1)[1], body)
        if path.startswith("/alpha/player/"):
            return self._players(method, path, body, match)
        if path.startswith("/v1beta1/counters/"):
            return self._counter(method, match["name"], body)
        raise Refused(404, 5, "Not Found")

    def _metadata(self, kind, body):
        key, value = body.get("key", ""), body.get("value", "")
        if not isinstance(key, str) or not isinstance(value, str):
            raise invalid("proto: invalid value for string field")
        if not is_qualified_name(key):
            raise invalid(f"invalid {kind} key {key!r}: must be a qualified name")
        if kind == "label" and not is_label_value(value):
            raise invalid(f"invalid label value {value!r} for key {key!r}")
        target = self.labels if kind == "label" else self.annotations
        target[SDK_PREFIX + key] = value
        self._changed()
        return {}

    def _players(self, method, path, body, match):
        if not self.player_tracking:
            raise unknown("PlayerTracking not enabled")
        if path == "/alpha/player/capacity":
            if method == "GET":
                return {"count": str(self.player_capacity)}
            count = _int64(body, "count")
            self.player_capacity = count or 0
            self._changed()
            return {}
        if path == "/alpha/player/count":
            return {"count": str(len(self.players))}
        if path == "/alpha/player/connected":
            return {"list": list(self.players)}
        if "playerID" in match:
            return {"bool": match["playerID"] in self.players}
        player = body.get("playerID", body.get("player_id", ""))
        if path.endswith("/connect"):
            if player in self.players:
                return {"bool": False}
            if len(self.players) >= self.player_capacity:
                raise unknown("players are already at capacity")
            self.players.append(player)
        else:
            if player not in self.players:
                return {"bool": False}
            self.players.remove(player)
        self._changed()
        return {"bool": True}

    def _counter(self, method, name, body):
        if not self.counts_and_lists:
            raise unknown("CountsAndLists not enabled")
        counter = self.counters.get(name)
        if method == "GET":
            if counter is None:
                raise unknown(f"counter not found: {name}")
            return {"name": name, "count": str(counter["count"]),
                    "capacity": str(counter["capacity"])}
        count = _int64(body, "count")
        capacity = _int64(body, "capacity")
        diff = _int64(body, "countDiff", "count_diff") or 0
        if diff == 0 and count is None and capacity is None:
            raise unknown("invalid argument. Malformed CounterUpdateRequest")
        if counter is None:
            raise unknown(f"counter not found: {name}")
        new_capacity = counter["capacity"] if capacity is None else capacity
        if new_capacity < 0:
            raise unknown("out of range. Capacity must be greater than or equal to 0. "
                          f"Found Capacity: {new_capacity}")
        new_count = counter["count"] if count is None else count
        if count is not None and not 0 <= count <= new_capacity:
            raise unknown("out of range. Count must be within range [0,Capacity]. "
                          f"Found Count: {count}, Capacity: {new_capacity}")
        new_count += diff
        if diff and not 0 <= new_count <= new_capacity:
            raise unknown("out of range. Count must be within range [0,Capacity]. "
                          f"Found Count: {new_count}, Capacity: {new_capacity}")
        # A capacity below the count truncates it when the batch is applied.
        counter["capacity"], counter["count"] = new_capacity, min(new_count, new_capacity)
        self._changed()
        return {"name": "", "count": "0", "capacity": "0"}

    async def _watch(self, request):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue = asyncio.Queue()
        queue.put_nowait(json.dumps({"result": self.gameserver()}).encode() + b"\n")
        self._watchers.append(queue)
        try:
            while True:
                line = await queue.get()
                if line is None:
                    break
                await response.write(line)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.remove(queue)
        return response

    def end_watches(self):
        """Close every watch stream (as a restarting sidecar would)."""
        for queue in self._watchers:
            queue.put_nowait(None)

    # -- health -----------------------------------------------------------------------------

    def _health_started(self):
        if self._health_task is None and not self.health["disabled"]:
            self._health_task = asyncio.get_running_loop().create_task(self._health_checks())

    async def _health_checks(self):
        """Every period, a period without a ping is a failure; failureThreshold of them in a
        row mark the GameServer Unhealthy."""
        period = self.health["period_seconds"]
        await asyncio.sleep(self.health["initial_delay_seconds"])
        if self.last_health is None:
            self.last_health = time.monotonic()
        while True:
            await asyncio.sleep(period)
            if time.monotonic() - self.last_health > period:
                self.health_failures += 1
                if self.health_failures >= self.health["failure_threshold"]:
                    self.state = "Unhealthy"
                    self._changed()
                    return

    # -- running ----------------------------------------------------------------------------

    async def start(self, port=0):
        app = web.Application()
        for method, path in self.ROUTES:
            app.router.add_route(method, path, self.handle)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self):
        self.release.set()
        self.end_watches()
        if self._health_task is not None:
            self._health_task.cancel()
        await self.runner.cleanup()

    def paths(self, path):
        return [c for c in self.calls if c[2] == path]

    def bodies(self, path):
        return [c[3] for c in self.calls if c[2] == path]

    def final(self, path):
        """key -> last value sent, for label/annotation calls."""
        return {body["key"]: body["value"] for body in self.bodies(path)}
