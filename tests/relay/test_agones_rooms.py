"""Rooms as Agones capacity, against the stand-in sidecar (tests/agones_sidecar.py): the stand-in's
own fidelity to the REST gateway, then the relay's Counter, watch and state rules, then the
server wired to it (admin API, allocations creating rooms)."""
import asyncio
import json
import time

import aiohttp
import pytest

from agones_sidecar import LAST_ALLOCATED, SidecarStandIn
from live_relay import server_config
from relay.config import AgonesSettings, ConfigError
from relay.server import agones as agones_module
from relay.server.agones import ALLOCATION_ANNOTATION, AgonesClient, parse_allocation

from test_agones import RecordingLog, eventually, leftover_tasks


def settings(port, **overrides):
    values = dict(enabled=True, port=port, health_interval=0.05, request_timeout=0.5,
                  max_retries=3, backoff_initial=0.01, backoff_max=0.05)
    values.update(overrides)
    return AgonesSettings(**values)


def allocation(room, **spec):
    return {ALLOCATION_ANNOTATION: json.dumps({"room": room, **spec})}


async def call(sidecar, method, path, body=None):
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"http://127.0.0.1:{sidecar.port}{path}",
                                   json=body) as response:
            return response.status, await response.json(content_type=None)


# -- the stand-in answers like Agones' REST gateway ------------------------------------------

def test_standin_metadata_validation_and_prefix():
    async def main():
        sidecar = await SidecarStandIn().start()
        assert await call(sidecar, "PUT", "/metadata/label", {"key": "rooms", "value": "3"}) == (200, {})
        status, body = await call(sidecar, "PUT", "/metadata/label", {"key": "bad key", "value": "x"})
        assert status == 400 and body["code"] == 3 and "invalid label key" in body["message"]
        status, body = await call(sidecar, "PUT", "/metadata/label", {"key": "ok", "value": "a b"})
        assert status == 400 and "invalid label value" in body["message"]
        status, _ = await call(sidecar, "PUT", "/metadata/label", {"key": "x" * 64, "value": ""})
        assert status == 400
        # Annotation values are free text; keys are checked like label keys.
        assert (await call(sidecar, "PUT", "/metadata/annotation",
                           {"key": "note", "value": "any text {}"}))[0] == 200
        assert (await call(sidecar, "PUT", "/metadata/annotation", {"key": "-x", "value": ""}))[0] == 400
        status, gameserver = await call(sidecar, "GET", "/gameserver")
        assert gameserver["object_meta"]["labels"] == {"agones.dev/sdk-rooms": "3"}
        assert gameserver["object_meta"]["annotations"] == {"agones.dev/sdk-note": "any text {}"}
        assert (await call(sidecar, "PUT", "/metadata/nothing", {}))[0] == 404
        await sidecar.stop()

    asyncio.run(main())


def test_standin_player_tracking_refusals():
    async def main():
        sidecar = await SidecarStandIn(player_capacity=1).start()
        connect = "/alpha/player/connect"
        assert await call(sidecar, "POST", connect, {"playerID": "a"}) == (200, {"bool": True})
        assert await call(sidecar, "POST", connect, {"playerID": "a"}) == (200, {"bool": False})
        status, body = await call(sidecar, "POST", connect, {"playerID": "b"})
        assert status == 500 and body["message"] == "players are already at capacity"
        assert await call(sidecar, "POST", "/alpha/player/disconnect",
                          {"playerID": "zz"}) == (200, {"bool": False})
        assert await call(sidecar, "PUT", "/alpha/player/capacity", {"count": "2"}) == (200, {})
        assert (await call(sidecar, "GET", "/alpha/player/capacity"))[1] == {"count": "2"}
        await sidecar.stop()
        off = await SidecarStandIn(player_tracking=False).start()
        status, body = await call(off, "POST", connect, {"playerID": "a"})
        assert status == 500 and "PlayerTracking not enabled" in body["message"]
        await off.stop()

    asyncio.run(main())


def test_standin_counter_bounds_and_atomic_updates():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 2)}).start()
        path = "/v1beta1/counters/rooms"
        assert await call(sidecar, "GET", path) == (200, {"name": "rooms", "count": "0",
                                                          "capacity": "2"})
        bodies = [{"countDiff": "1"}] * 5
        results = await asyncio.gather(*(call(sidecar, "PATCH", path, b) for b in bodies))
        assert sorted(status for status, _ in results) == [200, 200, 500, 500, 500]
        assert all("out of range" in body["message"] for status, body in results if status == 500)
        assert sidecar.counters["rooms"]["count"] == 2
        status, body = await call(sidecar, "PATCH", path, {})
        assert status == 500 and "Malformed CounterUpdateRequest" in body["message"]
        status, body = await call(sidecar, "GET", "/v1beta1/counters/players")
        assert status == 500 and body["message"] == "counter not found: players"
        assert (await call(sidecar, "PATCH", path, {"count": 3}))[0] == 500
        assert (await call(sidecar, "PATCH", path, {"capacity": "1"}))[0] == 200
        assert sidecar.counters["rooms"] == {"count": 1, "capacity": 1}     # truncated
        await sidecar.stop()

    asyncio.run(main())


def test_standin_state_machine_watch_and_health():
    async def main():
        sidecar = await SidecarStandIn(health_period=0.05, failure_threshold=2,
                                       counters={"rooms": (0, 4)}).start()
        lines = []

        async def watch():
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{sidecar.port}/watch/gameserver") as r:
                    async for line in r.content:
                        lines.append(json.loads(line))

        watcher = asyncio.get_running_loop().create_task(watch())
        await eventually(lambda: lines)
        assert lines[0]["result"]["status"]["state"] == "Scheduled"
        assert sidecar.allocate() is False                      # not Ready yet
        await call(sidecar, "POST", "/ready", {})
        await call(sidecar, "POST", "/health", {})
        assert sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                annotations=allocation("m1")) is True
        await eventually(lambda: lines[-1]["result"]["status"]["state"] == "Allocated")
        last = lines[-1]["result"]
        assert last["status"]["counters"]["rooms"] == {"count": "1", "capacity": "4"}
        assert LAST_ALLOCATED in last["object_meta"]["annotations"]
        await call(sidecar, "POST", "/ready", {})
        await eventually(lambda: lines[-1]["result"]["status"]["state"] == "Ready")
        # No Health ping for failureThreshold periods: Unhealthy, and the SDK cannot undo it.
        await eventually(lambda: sidecar.state == "Unhealthy", timeout=1.0)
        await call(sidecar, "POST", "/ready", {})
        assert sidecar.state == "Unhealthy" and sidecar.allocate() is False
        sidecar.end_watches()
        await asyncio.wait_for(watcher, 1)
        await sidecar.stop()

    asyncio.run(main())


# -- the relay's Counter, watch and state rules ------------------------------------------------

class Rooms:
    """What the server does for the client: creates allocated rooms, reports room states."""

    def __init__(self, client, refuse=()):
        self.client = client
        self.refuse = set(refuse)
        self.created = {}
        client.on_allocation = self.allocated

    def allocated(self, room, spec):
        if room in self.refuse:
            return False
        self.created[room] = spec
        self.client.room_state(room, "waiting", 0)
        return True


async def started(sidecar, slots=4, **overrides):
    client = AgonesClient(settings(sidecar.port, **overrides), log=RecordingLog())
    client.set_room_slots(slots)
    rooms = Rooms(client)
    await client.start()
    await eventually(lambda: client.state == "Ready" and client.stats()["watch_events"] > 0)
    return client, rooms


def count(sidecar):
    return sidecar.counters["rooms"]["count"]


def test_capacity_is_published_and_admin_rooms_allocate_the_relay():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, _ = await started(sidecar)
        assert sidecar.counters["rooms"] == {"count": 0, "capacity": 4}
        client.room_state("a", "waiting", 0)                  # admin API / JOIN: no allocation
        await eventually(lambda: sidecar.state == "Allocated" and count(sidecar) == 1)
        client.room_state("b", "running", 2)
        await eventually(lambda: count(sidecar) == 2)
        client.room_state("a", "ended", 0)
        await eventually(lambda: count(sidecar) == 1)
        await asyncio.sleep(0.05)
        assert sidecar.state == "Allocated"                   # b still runs
        client.room_state("b", "ended", 0)
        await eventually(lambda: sidecar.state == "Ready" and count(sidecar) == 0)
        assert client.stats()["self_allocations"] == 1 and client.stats()["returned_ready"] == 1
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_an_allocation_creates_its_room_and_the_count_never_drifts():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, rooms = await started(sidecar)
        spec = {"players": ["ann", "bob", "cy"], "start_players": 3}
        assert sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                annotations=allocation("m1", **spec))
        await eventually(lambda: "m1" in rooms.created)
        assert rooms.created["m1"] == {"room": "m1", "players": ["ann", "bob", "cy"],
                                       "options": {"start_players": 3, "capacity": 3}}
        await asyncio.sleep(0.05)
        assert count(sidecar) == 1                            # the allocation's slot, no other
        assert client.last_allocated == sidecar.annotations[LAST_ALLOCATED]
        assert "agones_allocated" in client.log.events("info")
        # A room the relay created itself, then an allocation for it shows up: one slot, not two.
        client.room_state("m2", "waiting", 0)
        await eventually(lambda: count(sidecar) == 2)
        assert sidecar.allocate(counters={"rooms": 1}, annotations=allocation("m2"))
        await eventually(lambda: client.allocated_room("m2"))
        await eventually(lambda: count(sidecar) == 2)
        # A room that ended before its allocation's annotation arrived gives the slot back.
        client.room_state("m3", "waiting", 0)
        client.room_state("m3", "ended", 0)
        assert sidecar.allocate(counters={"rooms": 1}, annotations=allocation("m3"))
        await asyncio.sleep(0.1)
        assert count(sidecar) == 2
        for room in ("m1", "m2"):
            client.room_state(room, "ended", 0)
        await eventually(lambda: count(sidecar) == 0 and sidecar.state == "Ready")
        assert sidecar.paths("/allocate") == []            # the allocator allocated it
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_a_refused_allocation_gives_its_slot_back_and_full_relays_are_not_oversubscribed():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, rooms = await started(sidecar, slots=2)
        rooms.refuse.add("bad")
        assert sidecar.allocate(counters={"rooms": 1}, annotations=allocation("bad"))
        await eventually(lambda: client.stats()["allocations_failed"] == 1)
        await eventually(lambda: count(sidecar) == 0 and sidecar.state == "Ready")
        # Two slots: two allocations fit, the third finds no room, and a room created
        # meanwhile without an allocation is refused its +1, so it frees nothing at its end.
        assert sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                annotations=allocation("x"))
        assert sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                annotations=allocation("y"))
        assert not sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                    annotations=allocation("z"))
        await eventually(lambda: {"x", "y"} <= set(rooms.created))
        client.room_state("extra", "waiting", 0)
        await eventually(lambda: client.stats()["counter_refused"] == 1)
        client.room_state("extra", "ended", 0)
        client.room_state("x", "ended", 0)
        await eventually(lambda: count(sidecar) == 1)
        await asyncio.sleep(0.05)
        assert count(sidecar) == 1                            # y still holds its slot
        client.room_state("y", "ended", 0)
        await eventually(lambda: count(sidecar) == 0 and sidecar.state == "Ready")
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_slots_of_allocations_whose_room_never_appears_are_given_back(monkeypatch):
    monkeypatch.setattr(agones_module, "ALLOCATION_GRACE", 0.2)

    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, rooms = await started(sidecar)
        # An allocation that names no room, and one whose annotation is not JSON.
        assert sidecar.allocate(counters={"rooms": 1})
        assert sidecar.allocate(counters={"rooms": 1},
                                annotations={ALLOCATION_ANNOTATION: "m-9 please"})
        client.room_state("live", "waiting", 0)          # a room of its own meanwhile
        await eventually(lambda: count(sidecar) == 3)
        await asyncio.sleep(0.1)
        assert count(sidecar) == 3                        # within the grace period
        await eventually(lambda: count(sidecar) == 1, timeout=3)
        assert client.stats()["counter_repaired"] == 2
        assert "agones_allocation_unreadable" in client.log.events("warning")
        client.room_state("live", "ended", 0)
        await eventually(lambda: count(sidecar) == 0 and sidecar.state == "Ready")
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_one_annotation_however_many_allocations():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, rooms = await started(sidecar, slots=50)
        for n in range(40):
            assert sidecar.allocate(counters={"rooms": 1}, annotations=allocation(f"r{n}"))
            await asyncio.sleep(0.002)
        await eventually(lambda: len(rooms.created) == 40 and count(sidecar) == 40)
        assert [k for k in sidecar.annotations if k.startswith("relay.rooms/")] == [
            ALLOCATION_ANNOTATION]
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_earlier_allocations_are_not_ours_and_a_left_count_is_reset():
    async def main():
        sidecar = SidecarStandIn(counters={"rooms": (3, 4)})
        sidecar.state = "Allocated"                           # the container restarted
        sidecar.annotations.update(allocation("old"))
        await sidecar.start()
        client, rooms = await started(sidecar)
        assert rooms.created == {} and count(sidecar) == 0
        assert "agones_counter_reset" in client.log.events("warning")
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_ready_waits_until_the_gameserver_was_read_so_the_counter_is_seeded():
    async def main():
        # A sidecar whose GameServer read fails while Ready would succeed (one that comes up
        # between the two requests): Ready before the read would leave the Counter unseeded.
        sidecar = SidecarStandIn(counters={"rooms": (5, 1000)})       # a count left behind
        sidecar.fail["/gameserver"] = 3
        await sidecar.start()
        client = AgonesClient(settings(sidecar.port), log=RecordingLog())
        client.set_room_slots(8)
        await client.start()
        await eventually(lambda: client.ready_sent)
        ready_at = next(i for i, call in enumerate(sidecar.calls) if call[2] == "/ready")
        reads = [i for i, call in enumerate(sidecar.calls)
                 if call[1] == "GET" and call[2] == "/gameserver"]
        assert len(reads) == 4 and reads[-1] < ready_at       # three refused, then read
        await eventually(lambda: sidecar.counters["rooms"] == {"count": 0, "capacity": 8})
        assert "agones_counter_reset" in client.log.events("warning")
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_rooms_held_before_the_sidecar_answers_are_counted_once_it_does():
    from test_agones import free_port

    async def main():
        port = free_port()
        client = AgonesClient(settings(port), log=RecordingLog())
        client.set_room_slots(8)
        await client.start()                              # nothing listens yet
        for n in range(300):                              # churn while the sidecar is away
            client.room_state(f"gone-{n}", "waiting", 0)
            client.room_state(f"gone-{n}", "ended", 0)
        client.room_state("a", "waiting", 0)
        client.room_state("b", "running", 2)
        assert client.stats()["requests_failed"] > 0
        assert len(client._counter_ops) == 0              # nothing piles up meanwhile
        sidecar = SidecarStandIn(counters={"rooms": (5, 1000)})    # a count left behind
        await sidecar.start(port)
        await eventually(lambda: sidecar.state == "Allocated")    # it holds rooms
        assert sidecar.counters["rooms"] == {"count": 2, "capacity": 8}
        client.room_state("a", "ended", 0)
        client.room_state("b", "ended", 0)
        await eventually(lambda: count(sidecar) == 0 and sidecar.state == "Ready")
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_drain_closes_the_relay_to_allocations():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, rooms = await started(sidecar)
        assert sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                annotations=allocation("m1"))
        await eventually(lambda: "m1" in rooms.created)
        client.drain()
        await eventually(lambda: sidecar.counters["rooms"]["capacity"] == 0)
        assert not sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                    annotations=allocation("m2"))
        client.room_state("m1", "ended", 0)
        await asyncio.sleep(0.1)
        assert sidecar.state == "Allocated"           # draining: Shutdown comes from the server
        assert client.stats()["counter_refused"] == 0
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_without_the_counter_one_warning_and_rooms_still_allocate():
    async def main():
        sidecar = await SidecarStandIn().start()              # no spec.counters in the Fleet
        client, _ = await started(sidecar)
        client.room_state("a", "waiting", 0)
        await eventually(lambda: sidecar.state == "Allocated")
        client.room_state("a", "ended", 0)
        await eventually(lambda: sidecar.state == "Ready")
        assert client.log.events("warning") == ["agones_counter_unavailable"]
        await client.stop()
        assert leftover_tasks() == []
        await sidecar.stop()

    asyncio.run(main())


def test_the_watch_reconnects_after_the_stream_ends():
    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        client, rooms = await started(sidecar)
        sidecar.end_watches()
        await asyncio.sleep(0.1)
        assert sidecar.allocate(counters={"rooms": 1}, annotations=allocation("late"))
        await eventually(lambda: "late" in rooms.created)
        assert len(sidecar.paths("/watch/gameserver")) >= 2
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_allocation_specs_and_settings():
    assert parse_allocation('{"room": "r"}') == {"room": "r", "players": [], "options": {}}
    assert parse_allocation('{"room": "r", "players": ["a", "b"]}') == {
        "room": "r", "players": ["a", "b"], "options": {"capacity": 2}}
    assert parse_allocation('{"room": "r", "capacity": 8, "start_policy": "ready"}')["options"] == {
        "capacity": 8, "start_policy": "ready"}
    for bad in ('', '[1]', '{}', '{"room": ""}', '{"room": "r", "players": [1]}',
                '{"room": "r", "capacity": "8"}', '{"room": "r", "mode": 1}',
                '{"room": "r", "capacity": true}', '{"room": 7}'):
        with pytest.raises(ValueError):
            parse_allocation(bad)
    for bad in (dict(when_empty="delete"), dict(rooms_counter="bad name"),
                dict(rooms_counter="x" * 64)):
        with pytest.raises(ConfigError):
            AgonesSettings(**bad).validate()
    AgonesSettings(when_empty="shutdown", rooms_counter="").validate()


# -- the server wired to it -----------------------------------------------------------------

def scrape(server):
    text = server.metrics.render()[0].decode()
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("relay_agones"))}


def test_the_server_creates_allocated_rooms_and_keeps_its_gameserver_allocated(tmp_path):
    from relay.server.daemon import RelayServer

    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        config = server_config(tmp_path, max_rooms=3)
        config.agones.enabled = True
        config.agones.port = sidecar.port
        config.agones.health_interval = 0.1
        config.agones.backoff_initial = 0.01
        server = RelayServer(config)
        await server.start()
        try:
            await eventually(lambda: server.agones.state == "Ready")
            assert sidecar.counters["rooms"]["capacity"] == 3
            # The allocator's way: the allocation names the room, the relay creates it.
            assert sidecar.allocate(min_available={"rooms": 1}, counters={"rooms": 1},
                                    annotations=allocation("m1", players=["a", "b"]))
            await eventually(lambda: "m1" in server.rooms)
            assert server.rooms["m1"].capacity == 2
            # The allocator then calls the admin API with allocated: the same room, no new slot.
            assert server.create_room("m1", allocated=True)["room"] == "m1"
            # An admin room on an Allocated relay takes a slot of its own.
            server.create_room("admin-1")
            await eventually(lambda: count(sidecar) == 2)
            # An allocated room created through the admin API before its annotation shows up.
            server.create_room("m2", allocated=True)
            assert sidecar.allocate(counters={"rooms": 1}, annotations=allocation("m2"))
            await eventually(lambda: count(sidecar) == 3)
            await asyncio.sleep(0.1)
            assert count(sidecar) == 3 and sorted(server.rooms) == ["admin-1", "m1", "m2"]
            # What /metrics says of it.
            await eventually(lambda: server.agones.counter_seen == (3, 3))
            exported = scrape(server)
            assert exported['relay_agones_state{state="Allocated"}'] == 1
            assert exported['relay_agones_state{state="Ready"}'] == 0
            assert exported['relay_agones_rooms{kind="held"}'] == 3
            assert exported['relay_agones_rooms{kind="counter_count"}'] == 3
            assert exported['relay_agones_rooms{kind="counter_capacity"}'] == 3
            assert exported['relay_agones_allocations_total{by="allocator"}'] == 2
            assert exported["relay_agones_sidecar_failures_total"] == 0
            for room in ("m1", "admin-1", "m2"):
                server.end_room(room)
            await eventually(lambda: sidecar.state == "Ready" and count(sidecar) == 0)
            # A room created through the admin API on a Ready relay allocates it.
            server.create_room("solo")
            await eventually(lambda: sidecar.state == "Allocated")
            await eventually(lambda: scrape(server)['relay_agones_allocations_total{by="self"}'] == 1)
            server.drain()
            await eventually(lambda: sidecar.state == "Shutdown", timeout=3)
            assert sidecar.counters["rooms"]["capacity"] == 0
        finally:
            await server.stop()
            await sidecar.stop()

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 10
