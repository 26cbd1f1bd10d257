"""The admin HTTP API (relay/server/http.py) against a fake server, and the metrics (relay/server/metrics.py)."""
from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from relay.errors import Conflict, NotFound, RelayError, Unavailable
from relay.server.http import MAX_BODY_SIZE, create_app, start_http, stop_http
from relay.server.metrics import DROP_REASON_LABELS, TOTALS, Metrics
from relay_core import DROP_REASONS


class FakeServer:
    """The server interface http.py relies on, with the documented refusals."""

    def __init__(self):
        self.rooms: dict[str, dict] = {}
        self.draining = False
        self.calls: list[tuple] = []
        self.explode = False

    def _check(self, name, *args):
        self.calls.append((name, *args))
        if self.explode:
            raise RuntimeError("secret internal detail")

    def health(self):
        self._check("health")
        return {"status": "ok", "rooms": len(self.rooms)}

    def ready(self):
        return not self.draining

    def list_rooms(self):
        self._check("list_rooms")
        return list(self.rooms.values())

    def _room(self, room_id):
        if room_id not in self.rooms:
            raise NotFound(f"no room {room_id!r}")
        return self.rooms[room_id]

    def room_info(self, room_id):
        self._check("room_info", room_id)
        return self._room(room_id)

    def create_room(self, room_id, **options):
        self._check("create_room", room_id, options)
        if self.draining:
            raise Unavailable("draining")
        if room_id in self.rooms:
            raise Conflict(f"room {room_id!r} exists")
        if options.get("capacity", 2) < 1:
            raise RelayError("capacity must be at least 1", code="bad_option")
        room = {"room": room_id, "state": "waiting", "players": ["alice"], **options}
        self.rooms[room_id] = room
        return room

    def start_room(self, room_id):
        self._check("start_room", room_id)
        room = self._room(room_id)
        if room["state"] != "waiting":
            raise Conflict(f"room {room_id!r} is {room['state']}")
        room["state"] = "running"
        return room

    def end_room(self, room_id, reason="admin"):
        self._check("end_room", room_id, reason)
        room = self._room(room_id)
        room["state"] = "ended"
        room["reason"] = reason
        return room

    def kick(self, room_id, player):
        self._check("kick", room_id, player)
        room = self._room(room_id)
        if player not in room["players"]:
            raise NotFound(f"no player {player!r}")
        room["players"].remove(player)
        return {"room": room_id, "kicked": player}

    def drain(self):
        self._check("drain")
        self.draining = True
        return {"draining": True, "rooms": len(self.rooms)}


def run(scenario, server=None, metrics=None):
    """Run ``await scenario(client, server, metrics)`` against a test server."""
    server = server or FakeServer()
    metrics = metrics or Metrics()

    async def main():
        async with TestClient(TestServer(create_app(server, metrics))) as client:
            return await scenario(client, server, metrics)

    return asyncio.run(main())


async def expect(response, status, error=None):
    """The JSON body of ``response`` after checking its status (and error code)."""
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    if error is not None:
        assert body["error"] == error
        assert isinstance(body["message"], str) and body["message"]
        assert set(body) == {"error", "message"}
    return body


# -- probes and metrics ------------------------------------------------------------------------

def test_health_and_ready_flip_after_drain():
    async def scenario(client, server, metrics):
        assert await expect(await client.get("/health"), 200) == {"status": "ok", "rooms": 0}
        assert await expect(await client.get("/ready"), 200) == {"ready": True}
        assert await expect(await client.post("/admin/drain"), 200) == {"draining": True,
                                                                       "rooms": 0}
        assert await expect(await client.get("/ready"), 503) == {"ready": False}
        assert (await expect(await client.get("/health"), 200))["status"] == "ok"
        await expect(await client.post("/rooms", json={"room": "r"}), 503, "unavailable")
    run(scenario)


def test_metrics_endpoint():
    async def scenario(client, server, metrics):
        metrics.ticks.inc(3)
        metrics.tick_lateness.observe(0.0015)
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
        assert "relay_ticks_total 3.0" in text
        assert 'relay_tick_lateness_seconds_bucket{le="0.002"} 1.0' in text
        assert 'relay_tick_lateness_seconds_bucket{le="0.001"} 0.0' in text
        assert "process_start_time_seconds" in text
        assert "process_cpu_seconds_total" in text
    run(scenario)


# -- rooms -------------------------------------------------------------------------------------

def test_room_lifecycle():
    async def scenario(client, server, metrics):
        assert await expect(await client.get("/rooms"), 200) == {"rooms": []}
        created = await expect(await client.post("/rooms", json={
            "room": "r1", "capacity": 4, "start_policy": "all_ready", "start_players": 2,
            "tick_rate": 30}), 201)
        assert created["room"] == "r1" and created["capacity"] == 4
        assert server.calls[-1] == ("create_room", "r1", {
            "capacity": 4, "start_policy": "all_ready", "start_players": 2, "tick_rate": 30})
        await expect(await client.post("/rooms", json={"room": "r2"}), 201)
        assert server.calls[-1] == ("create_room", "r2", {})   # absent options are not passed
        await expect(await client.post("/rooms", json={"room": "r3", "allocated": True}), 201)
        assert server.calls[-1] == ("create_room", "r3", {"allocated": True})
        await expect(await client.post("/rooms", json={"room": "r4", "allocated": False}), 201)
        assert server.calls[-1] == ("create_room", "r4", {})
        server.rooms.pop("r3")
        server.rooms.pop("r4")
        rooms = (await expect(await client.get("/rooms"), 200))["rooms"]
        assert [room["room"] for room in rooms] == ["r1", "r2"]
        assert (await expect(await client.get("/rooms/r1"), 200))["state"] == "waiting"
        assert (await expect(await client.post("/rooms/r1/start"), 200))["state"] == "running"
        await expect(await client.post("/rooms/r1/start"), 409, "conflict")
        kicked = await expect(await client.post("/rooms/r1/kick", json={"player": "alice"}), 200)
        assert kicked == {"room": "r1", "kicked": "alice"}
        await expect(await client.post("/rooms/r1/kick", json={"player": "alice"}), 404,
                     "not_found")
        ended = await expect(await client.delete("/rooms/r1"), 200)
        assert ended["state"] == "ended" and server.calls[-1] == ("end_room", "r1", "admin")
        ended = await expect(await client.delete("/rooms/r2", json={"reason": "maintenance"}), 200)
        assert server.calls[-1] == ("end_room", "r2", "maintenance")
    run(scenario)


def test_room_refusals():
    async def scenario(client, server, metrics):
        await expect(await client.post("/rooms", json={"room": "r"}), 201)
        await expect(await client.post("/rooms", json={"room": "r"}), 409, "conflict")
        await expect(await client.post("/rooms", json={"room": "x", "capacity": 0}), 400,
                     "bad_option")
        for method, path in [("GET", "/rooms/nope"), ("POST", "/rooms/nope/start"),
                             ("DELETE", "/rooms/nope")]:
            await expect(await client.request(method, path), 404, "not_found")
        await expect(await client.post("/rooms/nope/kick", json={"player": "p"}), 404,
                     "not_found")
    run(scenario)


def test_percent_encoded_room_ids():
    async def scenario(client, server, metrics):
        await expect(await client.post("/rooms", json={"room": "a b/ü"}), 201)
        body = await expect(await client.get("/rooms/a%20b%2F%C3%BC"), 200)
        assert body["room"] == "a b/ü"
    run(scenario)


# -- request validation ------------------------------------------------------------------------

@pytest.mark.parametrize("body, code, mentions", [
    (b"", "bad_json", "required"),
    (b"{not json", "bad_json", "JSON"),
    (b"[1, 2]", "bad_json", "object"),
    (b'"room"', "bad_json", "object"),
    (b"\xff\xfe\x00", "bad_json", "JSON"),
    (b'{"room": "r", "capacity": NaN}', "bad_json", "NaN"),
    (b'{"capacity": 2}', "bad_field", "room"),
    (b'{"room": ""}', "bad_field", "room"),
    (b'{"room": 7}', "bad_field", "room"),
    (json.dumps({"room": "r" * 65}).encode(), "bad_field", "room"),
    (b'{"room": "r", "colour": "red"}', "unknown_field", "colour"),
    (b'{"room": "r", "capacity": "4"}', "bad_field", "capacity"),
    (b'{"room": "r", "capacity": 4.5}', "bad_field", "capacity"),
    (b'{"room": "r", "capacity": true}', "bad_field", "capacity"),
    (b'{"room": "r", "capacity": null}', "bad_field", "capacity"),
    (b'{"room": "r", "start_policy": 1}', "bad_field", "start_policy"),
    (b'{"room": "r", "tick_rate": [30]}', "bad_field", "tick_rate"),
    (b'{"room": "r", "allocated": "yes"}', "bad_field", "allocated"),
    (b'{"room": "r", "allocated": 1}', "bad_field", "allocated"),
])
def test_create_room_bad_bodies(body, code, mentions):
    async def scenario(client, server, metrics):
        response = await client.post("/rooms", data=body,
                                     headers={"Content-Type": "application/json"})
        assert mentions in (await expect(response, 400, code))["message"]
        assert not server.rooms
    run(scenario)


def test_room_id_of_64_characters_is_fine():
    async def scenario(client, server, metrics):
        await expect(await client.post("/rooms", json={"room": "r" * 64}), 201)
        await expect(await client.get("/rooms/" + "r" * 64), 200)
        await expect(await client.get("/rooms/" + "r" * 65), 400, "bad_field")
    run(scenario)


def test_kick_and_end_bad_bodies():
    async def scenario(client, server, metrics):
        await expect(await client.post("/rooms", json={"room": "r"}), 201)
        await expect(await client.post("/rooms/r/kick"), 400, "bad_json")
        await expect(await client.post("/rooms/r/kick", json={}), 400, "bad_field")
        await expect(await client.post("/rooms/r/kick", json={"player": ""}), 400, "bad_field")
        await expect(await client.post("/rooms/r/kick", json={"player": ["a"]}), 400,
                     "bad_field")
        await expect(await client.post("/rooms/r/kick", json={"player": "a", "why": 1}), 400,
                     "unknown_field")
        await expect(await client.delete("/rooms/r", data=b"nope"), 400, "bad_json")
        await expect(await client.delete("/rooms/r", json={"reason": 5}), 400, "bad_field")
        await expect(await client.delete("/rooms/r", json={"reason": ""}), 400, "bad_field")
        await expect(await client.delete("/rooms/r", json={"why": "x"}), 400, "unknown_field")
        assert server.rooms["r"]["state"] == "waiting"
        assert server.rooms["r"]["players"] == ["alice"]
    run(scenario)


def test_body_too_large():
    async def scenario(client, server, metrics):
        body = json.dumps({"room": "r", "start_policy": "x" * MAX_BODY_SIZE}).encode()
        response = await client.post("/rooms", data=body)
        await expect(response, 413, "request_entity_too_large")
        assert not server.rooms
    run(scenario)


# -- routing errors and failures ---------------------------------------------------------------

def test_unknown_route_and_wrong_method_are_json():
    async def scenario(client, server, metrics):
        body = await expect(await client.get("/nope"), 404, "not_found")
        assert "/nope" in body["message"]
        await expect(await client.get("/rooms/r/start"), 405, "method_not_allowed")
        response = await client.put("/rooms")
        await expect(response, 405, "method_not_allowed")
        assert set(response.headers["Allow"].split(",")) >= {"GET", "POST"}
        await expect(await client.delete("/admin/drain"), 405, "method_not_allowed")
        await expect(await client.post("/health"), 405, "method_not_allowed")
    run(scenario)


def test_unexpected_exception_is_500_json_and_logged(caplog):
    async def scenario(client, server, metrics):
        server.explode = True
        with caplog.at_level(logging.ERROR, logger="relay.server.http"):
            body = await expect(await client.get("/rooms"), 500, "internal")
        assert "secret" not in json.dumps(body)
        assert "Traceback" not in json.dumps(body)
        server.explode = False
        await expect(await client.get("/rooms"), 200)     # the server keeps serving
    run(scenario)
    records = [r for r in caplog.records if r.name == "relay.server.http"]
    assert records and records[0].exc_info is not None
    assert "GET /rooms" in records[0].getMessage()


def test_unserialisable_result_is_500():
    class Weird(FakeServer):
        def health(self):
            return {"status": "ok", "when": object()}

    async def scenario(client, server, metrics):
        await expect(await client.get("/health"), 500, "internal")
    run(scenario, server=Weird())


def test_start_and_stop_http_on_a_free_port():
    async def main():
        server, metrics = FakeServer(), Metrics()
        runner, port = await start_http(server, metrics, "127.0.0.1", 0)
        try:
            assert port > 0
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/health") as response:
                    assert response.status == 200
                    assert (await response.json())["status"] == "ok"
        finally:
            await stop_http(runner)
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as session:
                await session.get(f"http://127.0.0.1:{port}/health")
    asyncio.run(main())


# -- metrics -----------------------------------------------------------------------------------

def samples(metrics: Metrics) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of a rendered registry."""
    text = metrics.render()[0].decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: Metrics, name: str, **labels) -> float:
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def test_render_content_type_and_names():
    metrics = Metrics()
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    metrics.refusals.labels("some_new_reason").inc()    # reasons are open-ended
    exposed = {name for name, _ in samples(metrics)}
    relay_exposed = {name for name in exposed if name.startswith("relay_")}
    assert relay_exposed == set(Metrics.sample_names())
    for name in Metrics.names():
        assert name in exposed or name + "_bucket" in exposed
    assert len(Metrics.names()) == len(set(Metrics.names())) == 37
    assert {"process_start_time_seconds", "python_info"} <= exposed
    assert all(name.startswith("relay_") for name in Metrics.names())
    families = text_string_to_metric_families(body.decode())
    for family in families:      # counters are exposed with _total, as names() lists them
        if family.name.startswith("relay_") and family.type == "counter":
            assert family.name + "_total" in Metrics.names()


def test_known_label_values_exist_at_zero():
    metrics = Metrics()
    assert value(metrics, "relay_rooms", state="running") == 0
    assert value(metrics, "relay_inputs_total", outcome="late") == 0
    assert value(metrics, "relay_inputs_refused_total", reason="too_far_ahead") == 0
    assert value(metrics, "relay_joins_total", outcome="spectator") == 0
    assert value(metrics, "relay_block_transfers_total", outcome="delivered") == 0
    for reason in DROP_REASONS:
        assert value(metrics, "relay_dropped_datagrams_total", reason=reason) == 0
    assert value(metrics, "relay_dropped_datagrams_total", reason="malformed_message") == 0
    assert "malformed_message" in DROP_REASON_LABELS


def test_two_instances_are_independent():
    a, b = Metrics(), Metrics()
    a.ticks.inc(5)
    a.joins.labels("joined").inc()
    a.sync_drops({"bad_magic": 3})
    assert value(a, "relay_ticks_total") == 5
    assert value(b, "relay_ticks_total") == 0
    assert value(b, "relay_joins_total", outcome="joined") == 0
    assert value(b, "relay_dropped_datagrams_total", reason="bad_magic") == 0
    b.sync_drops({"bad_magic": 1})
    assert value(a, "relay_dropped_datagrams_total", reason="bad_magic") == 3
    assert value(b, "relay_dropped_datagrams_total", reason="bad_magic") == 1


def test_sync_drops_counts_deltas_and_new_reasons():
    metrics = Metrics()
    metrics.sync_drops({})
    metrics.sync_drops({"bad_magic": 2})
    metrics.sync_drops({"bad_magic": 5, "truncated": 1})
    metrics.sync_drops({"bad_magic": 5, "truncated": 1})
    metrics.sync_drops({"truncated": 4, "some_future_reason": 7})
    assert value(metrics, "relay_dropped_datagrams_total", reason="bad_magic") == 5
    assert value(metrics, "relay_dropped_datagrams_total", reason="truncated") == 4
    assert value(metrics, "relay_dropped_datagrams_total", reason="some_future_reason") == 7
    # app-level drops counted directly are untouched by syncing the core's
    metrics.drops.labels("malformed_message").inc()
    metrics.sync_drops({"bad_magic": 6})
    assert value(metrics, "relay_dropped_datagrams_total", reason="malformed_message") == 1
    assert value(metrics, "relay_dropped_datagrams_total", reason="bad_magic") == 6


def test_sync_never_decreases_and_treats_a_drop_as_a_restart():
    metrics = Metrics()
    metrics.sync_drops({"bad_magic": 10})
    metrics.sync_drops({"bad_magic": 3})          # a new Endpoint counting from zero
    assert value(metrics, "relay_dropped_datagrams_total", reason="bad_magic") == 13
    metrics.sync_drops({"bad_magic": 4})
    assert value(metrics, "relay_dropped_datagrams_total", reason="bad_magic") == 14
    with pytest.raises(ValueError):
        metrics.sync_drops({"bad_magic": -1})
    assert value(metrics, "relay_dropped_datagrams_total", reason="bad_magic") == 14


def test_sync_totals():
    metrics = Metrics()
    metrics.sync_totals(datagrams_received=10, datagrams_sent=20, bytes_received=1000,
                        bytes_sent=2000, resends=1, redundant_bytes=50)
    metrics.sync_totals(datagrams_received=15, datagrams_sent=20, bytes_received=1500,
                        bytes_sent=2600, resends=1, redundant_bytes=80)
    metrics.sync_totals(datagrams_received=16)     # a subset is fine
    assert value(metrics, "relay_datagrams_received_total") == 16
    assert value(metrics, "relay_datagrams_sent_total") == 20
    assert value(metrics, "relay_received_bytes_total") == 1500
    assert value(metrics, "relay_sent_bytes_total") == 2600
    assert value(metrics, "relay_resends_total") == 1
    assert value(metrics, "relay_redundant_bytes_total") == 80
    # separate sources are tracked separately
    metrics.sync_totals("other", datagrams_received=4)
    metrics.sync_totals(datagrams_received=17)
    assert value(metrics, "relay_datagrams_received_total") == 21
    with pytest.raises(TypeError):
        metrics.sync_totals(packets=1)


def test_add_counter_delta():
    metrics = Metrics()
    child = metrics.inputs.labels("accepted")
    assert metrics.add_counter_delta(child, 5, "k") == 5
    assert metrics.add_counter_delta(child, 5, "k") == 0
    assert metrics.add_counter_delta(child, 9, "k") == 4
    assert metrics.add_counter_delta(child, 2, "k") == 2      # restarted source
    assert metrics.add_counter_delta(child, 3, "k", source="x") == 3
    assert value(metrics, "relay_inputs_total", outcome="accepted") == 14


class Stats:
    """The PeerStats fields sync_peers reads."""

    def __init__(self, sent, received, rtt=0.05, loss=0.0):
        self.packets_sent, self.packets_received = sent, received
        self.bytes_sent, self.bytes_received = sent * 100, received * 100
        self.resends, self.redundant_bytes = sent // 10, sent * 3
        self.spurious_resends = sent // 20
        self.rtt, self.loss = rtt, loss


def test_sync_peers_per_peer_totals_survive_disconnects():
    metrics = Metrics()
    metrics.sync_peers({1: Stats(10, 5, loss=0.1)})        # by default: resends, redundancy
    assert value(metrics, "relay_resends_total") == 1
    assert value(metrics, "relay_spurious_resends_total") == 0
    assert value(metrics, "relay_redundant_bytes_total") == 30
    metrics.sync_peers({1: Stats(40, 5, loss=0.1)})
    assert value(metrics, "relay_spurious_resends_total") == 2
    assert value(metrics, "relay_datagrams_sent_total") == 0
    metrics = Metrics()
    metrics.sync_peers({1: Stats(10, 5, loss=0.1), 2: Stats(20, 10, loss=0.3)}, totals=TOTALS)
    assert value(metrics, "relay_datagrams_sent_total") == 30
    assert value(metrics, "relay_peer_loss_ratio") == pytest.approx(0.2)
    metrics.sync_peers({2: Stats(25, 12, loss=0.2)}, totals=TOTALS)   # peer 1 left
    assert value(metrics, "relay_datagrams_sent_total") == 35
    assert value(metrics, "relay_received_bytes_total") == 1700
    assert value(metrics, "relay_peer_loss_ratio") == pytest.approx(0.2)
    assert ("peer", 1) not in metrics.sources()
    metrics.sync_peers({2: Stats(26, 12), 3: Stats(4, 4, rtt=0.0)}, totals=TOTALS)
    assert value(metrics, "relay_datagrams_sent_total") == 40
    assert value(metrics, "relay_peer_rtt_seconds_count") == 4   # peer 3 has no RTT sample yet
    assert value(metrics, "relay_peer_rtt_seconds_bucket", le="0.05") == 4
    metrics.sync_peers({}, totals=TOTALS)
    assert value(metrics, "relay_peer_loss_ratio") == 0
    assert not metrics.sources() - {"endpoint"}


def test_sync_peers_with_real_peer_stats():
    from relay_core import PeerStats
    fields = {name: 0 for name in PeerStats.__dataclass_fields__}
    fields.update(rtt=0.02, loss=0.5, packets_sent=3, bytes_sent=300)
    metrics = Metrics()
    metrics.sync_peers({7: PeerStats(**fields)}, totals=TOTALS)
    assert value(metrics, "relay_datagrams_sent_total") == 3
    assert value(metrics, "relay_sent_bytes_total") == 300
    assert value(metrics, "relay_peer_loss_ratio") == 0.5


def test_room_gauge_and_draining_helpers():
    metrics = Metrics()
    metrics.set_rooms({"running": 2, "waiting": 1})
    metrics.set_rooms({"running": 3})
    assert value(metrics, "relay_rooms", state="running") == 3
    assert value(metrics, "relay_rooms", state="waiting") == 0
    assert value(metrics, "relay_rooms", state="ended") == 0
    metrics.set_draining(True)
    assert value(metrics, "relay_draining") == 1
