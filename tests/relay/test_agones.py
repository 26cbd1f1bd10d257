"""Agones SDK client against the stand-in sidecar (tests/agones_sidecar.py), which records every call."""
import asyncio
import json
import re
import socket
import time


from relay.server.agones import (
    LABEL_PLAYERS, LABEL_ROOMS, LABEL_ROOMS_RUNNING, AgonesClient,
    is_valid_key, is_valid_label_value, resolve_port, room_annotation_key, sanitize_label_value,
)
from relay.config import AgonesSettings

from agones_sidecar import SidecarStandIn

LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?)?$")


class RecordingLog:
    def __init__(self):
        self.records = []

    def _record(self, level):
        return lambda event, **fields: self.records.append((level, event, fields))

    def __getattr__(self, level):
        if level in ("debug", "info", "warning", "error", "exception"):
            return self._record(level)
        raise AttributeError(level)

    def events(self, level):
        return [event for lvl, event, _ in self.records if lvl == level]


def settings(port, **overrides):
    values = dict(enabled=True, port=port, health_interval=0.05, request_timeout=0.5,
                  max_retries=3, backoff_initial=0.01, backoff_max=0.05, rooms_counter="")
    values.update(overrides)
    return AgonesSettings(**values)


async def eventually(predicate, timeout=2.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


async def settled(client, sidecar, quiet=0.05):
    """Wait until the client has nothing queued and the sidecar saw no update for ``quiet`` s."""
    await eventually(lambda: client.stats()["pending"] == 0)
    while True:
        updates = [c for c in sidecar.calls if c[2] not in ("/health",)]
        await asyncio.sleep(quiet)
        if len([c for c in sidecar.calls if c[2] not in ("/health",)]) == len(updates):
            return


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def leftover_tasks():
    """Pending tasks other than this test's own and the fake sidecar's connection handlers."""
    def from_server(task):
        code = getattr(task.get_coro(), "cr_code", None)
        return code is not None and ("aiohttp/web_" in code.co_filename
                                     or code.co_filename.endswith("agones_sidecar.py"))
    return [t for t in asyncio.all_tasks()
            if t is not asyncio.current_task() and not from_server(t)]


# -- pure helpers ---------------------------------------------------------------------------

def test_label_values_are_sanitized():
    assert sanitize_label_value("running") == "running"
    assert sanitize_label_value(12) == "12"
    assert sanitize_label_value("lobby 1/ü!") == "lobby-1"
    assert sanitize_label_value("--_.x.y_--") == "x.y"
    assert sanitize_label_value("😀") == ""
    long = sanitize_label_value("a" * 62 + "-b" + "c" * 10)
    assert len(long) <= 63 and long == "a" * 62
    for raw in ["", "-", "ü" * 80, "a b c", "x" * 200, ".a.", "A_b-9"]:
        assert is_valid_label_value(sanitize_label_value(raw)), raw


def test_room_annotation_keys_are_valid_and_distinct():
    assert room_annotation_key("match-1") == "relay-room-match-1"
    keys = {room_annotation_key(room) for room in
            ["a b", "a-b", "a/b", "ü", "😀", "x" * 64, "x" * 63 + "y", "-lead", "relay.room/x"]}
    assert len(keys) == 9
    for key in keys:
        assert is_valid_key(key), key
        assert len("sdk-" + key) <= 63


def test_port_comes_from_settings_then_environment_then_default():
    assert resolve_port(AgonesSettings(port=9999), {"AGONES_SDK_HTTP_PORT": "1234"}) == 9999
    assert resolve_port(AgonesSettings(), {"AGONES_SDK_HTTP_PORT": "1234"}) == 1234
    assert resolve_port(AgonesSettings(port=None), {}) == 9358
    client = AgonesClient(AgonesSettings(enabled=True), environ={"AGONES_SDK_HTTP_PORT": "9400"})
    assert client.base_url == "http://127.0.0.1:9400"


# -- against the fake sidecar ---------------------------------------------------------------

def test_ready_after_start_then_health_at_the_interval():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port), log=RecordingLog())
        await client.start()
        assert [(c[1], c[2], c[3]) for c in sidecar.paths("/ready")] == [("POST", "/ready", {})]
        assert client.stats()["ready_sent"]
        await asyncio.sleep(0.33)
        pings = sidecar.paths("/health")
        assert 5 <= len(pings) <= 9, len(pings)
        assert all(body == {} for body in sidecar.bodies("/health"))
        gaps = [b[0] - a[0] for a, b in zip(pings, pings[1:])]
        assert 0.03 < sorted(gaps)[len(gaps) // 2] < 0.08
        await client.stop()
        count = len(sidecar.paths("/health"))
        await asyncio.sleep(0.12)
        assert len(sidecar.paths("/health")) == count       # no pings after stop
        await sidecar.stop()

    asyncio.run(main())


def test_labels_and_annotations_are_sanitized_and_coalesced():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port, health_interval=10), log=RecordingLog())
        await client.start()
        client.room_state("lobby 1/ü", "waiting", 0)
        for players in range(100):           # one burst: only the last value may be sent
            client.room_state("m1", "running", players)
            client.set_counts(1, players)
        await settled(client, sidecar)
        annotations = sidecar.final("/metadata/annotation")
        assert json.loads(annotations["relay-room-m1"]) == {"room": "m1", "state": "running",
                                                           "players": 99}
        assert sum(1 for b in sidecar.bodies("/metadata/annotation")
                   if b["key"] == "relay-room-m1") == 1
        lobby_key = room_annotation_key("lobby 1/ü")
        assert json.loads(annotations[lobby_key])["room"] == "lobby 1/ü"
        labels = sidecar.final("/metadata/label")
        assert labels == {LABEL_ROOMS: "2", LABEL_ROOMS_RUNNING: "1", LABEL_PLAYERS: "99"}
        assert len(sidecar.paths("/metadata/label")) == 3
        for body in sidecar.bodies("/metadata/label") + sidecar.bodies("/metadata/annotation"):
            assert is_valid_key(body["key"])
        for value in labels.values():
            assert LABEL_VALUE.match(value) and len(value) <= 63

        # Unchanged values are not sent again; changed ones are; arbitrary labels are sanitized.
        before = len(sidecar.calls)
        client.set_counts(1, 99)
        client.room_state("m1", "running", 99)
        await asyncio.sleep(0.05)
        assert len(sidecar.calls) == before
        client.set_counts(0, 0)
        client.room_state("m1", "ended", 0)
        client.set_label("mode", "Deathmatch: Desert Storm!")
        await settled(client, sidecar)
        labels = sidecar.final("/metadata/label")
        assert labels[LABEL_ROOMS_RUNNING] == "0" and labels[LABEL_ROOMS] == "1"
        assert labels["mode"] == "Deathmatch--Desert-Storm"
        assert json.loads(sidecar.final("/metadata/annotation")["relay-room-m1"])["state"] == "ended"
        assert client.stats()["requests_failed"] == 0
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_a_value_set_back_while_another_is_in_flight_is_still_sent():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port, health_interval=10), log=RecordingLog())
        await client.start()
        client.set_label("mode", "a")
        await settled(client, sidecar)
        sidecar.hang["/metadata/label"] = 1
        client.set_label("mode", "b")                 # being sent ...
        await eventually(lambda: len(sidecar.paths("/metadata/label")) == 2)
        client.set_label("mode", "a")                 # ... when it is set back
        sidecar.release.set()
        await settled(client, sidecar)
        assert [b["value"] for b in sidecar.bodies("/metadata/label")] == ["a", "b", "a"]
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_player_tracking_on_and_off():
    async def main():
        sidecar = await SidecarStandIn().start()
        on = AgonesClient(settings(sidecar.port, health_interval=10, player_tracking=True),
                          log=RecordingLog())
        await on.start()
        on.set_player_capacity(16)
        on.player_joined("m1/alice")
        await settled(on, sidecar)
        on.player_joined("m1/bob")
        on.player_left("m1/alice")
        await settled(on, sidecar)
        assert sidecar.bodies("/alpha/player/capacity") == [{"count": 16}]
        assert sidecar.bodies("/alpha/player/connect") == [{"playerID": "m1/alice"},
                                                          {"playerID": "m1/bob"}]
        assert sidecar.bodies("/alpha/player/disconnect") == [{"playerID": "m1/alice"}]
        # A join and a leave before the sender runs coalesce into the leave.
        on.player_joined("m1/carol")
        on.player_left("m1/carol")
        await settled(on, sidecar)
        assert {"playerID": "m1/carol"} not in sidecar.bodies("/alpha/player/connect")
        await on.stop()

        sidecar.calls.clear()
        off = AgonesClient(settings(sidecar.port, health_interval=10), log=RecordingLog())
        await off.start()
        off.set_player_capacity(16)
        off.player_joined("m1/alice")
        off.player_left("m1/alice")
        await asyncio.sleep(0.05)
        assert not [c for c in sidecar.calls if c[2].startswith("/alpha/")]
        await off.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_player_tracking_feature_gate_off_disables_tracking_with_one_warning():
    async def main():
        sidecar = await SidecarStandIn().start()
        sidecar.fail["/alpha/player/connect"] = 100
        sidecar.fail_text["/alpha/player/connect"] = "PlayerTracking not enabled"
        log = RecordingLog()
        client = AgonesClient(settings(sidecar.port, health_interval=10, player_tracking=True), log=log)
        await client.start()
        client.player_joined("a")
        await settled(client, sidecar)
        client.player_joined("b")
        await settled(client, sidecar)
        assert len(sidecar.paths("/alpha/player/connect")) == 1       # not retried, then off
        assert log.events("warning").count("agones_player_tracking_unavailable") == 1
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_shutdown_posts_shutdown_once():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port, health_interval=10), log=RecordingLog())
        await client.start()
        assert await client.shutdown() is True
        assert await client.shutdown() is True
        assert sidecar.bodies("/shutdown") == [{}]
        assert client.stats()["shutdown_sent"]
        assert (await client.get_gameserver())["object_meta"]["name"] == sidecar.name
        assert await client.allocate() is True
        assert sidecar.bodies("/allocate") == [{}]
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_when_empty_shutdown_after_the_last_room_ends():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port, health_interval=10, when_empty="shutdown"),
                              log=RecordingLog())
        await client.start()
        await eventually(lambda: client.state == "Ready")
        client.room_state("a", "running", 2)
        client.room_state("b", "running", 2)
        await eventually(lambda: sidecar.state == "Allocated")     # allocated itself
        client.room_state("a", "ended", 0)               # b still running
        await asyncio.sleep(0.05)
        assert sidecar.paths("/shutdown") == [] and sidecar.paths("/ready")[1:] == []
        client.room_state("b", "ended", 0)
        await eventually(lambda: sidecar.state == "Shutdown")
        client.room_state("b", "ended", 0)
        await asyncio.sleep(0.05)
        assert len(sidecar.paths("/shutdown")) == 1
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_when_empty_shutdown_without_a_watch_needs_a_match():
    async def main():
        sidecar = await SidecarStandIn().start()
        sidecar.fail["/watch/gameserver"] = 1000        # state unknown
        client = AgonesClient(settings(sidecar.port, health_interval=10, when_empty="shutdown",
                                       backoff_max=0.01),
                              log=RecordingLog())
        await client.start()
        client.room_state("lobby", "waiting", 0)
        client.room_state("lobby", "ended", 0)           # no match ran yet: stay up
        await asyncio.sleep(0.05)
        assert sidecar.paths("/shutdown") == []
        client.room_state("a", "running", 2)
        client.room_state("a", "ended", 0)
        await eventually(lambda: sidecar.paths("/shutdown"))
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_transient_errors_are_retried_and_persistent_ones_dropped():
    async def main():
        sidecar = await SidecarStandIn().start()
        sidecar.fail["/ready"] = 2
        sidecar.fail["/metadata/label"] = 2
        sidecar.fail["/shutdown"] = 1
        log = RecordingLog()
        client = AgonesClient(settings(sidecar.port, health_interval=10), log=log)
        await client.start()
        await eventually(lambda: client.stats()["ready_sent"])
        assert len(sidecar.paths("/ready")) == 3
        client.set_label("mode", "duel")
        await settled(client, sidecar)
        assert len(sidecar.paths("/metadata/label")) == 3
        assert sidecar.final("/metadata/label") == {"mode": "duel"}
        assert await client.shutdown() is True
        assert len(sidecar.paths("/shutdown")) == 2

        sidecar.fail["/metadata/label"] = 100        # max_retries=3: 4 attempts, then dropped
        client.set_label("mode", "ffa")
        await settled(client, sidecar)
        assert [b["value"] for b in sidecar.bodies("/metadata/label")].count("ffa") == 4
        stats = client.stats()
        assert stats["updates_failed"] == 1 and stats["requests_failed"] == 2 + 2 + 1 + 4
        assert "HTTP 500" in stats["last_error"]
        assert "agones_update_dropped" in log.events("warning")
        sidecar.fail["/metadata/label"] = 0           # the same value is sent again later
        client.set_label("mode", "ffa")
        await settled(client, sidecar)
        assert [b["value"] for b in sidecar.bodies("/metadata/label")].count("ffa") == 5
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_a_hanging_sidecar_times_out_and_start_does_not_wait_for_it():
    async def main():
        sidecar = await SidecarStandIn().start()
        sidecar.hang["/ready"] = 1
        client = AgonesClient(settings(sidecar.port, health_interval=10, request_timeout=0.1),
                              log=RecordingLog())
        began = time.monotonic()
        await client.start()
        assert 0.08 < time.monotonic() - began < 0.3
        await eventually(lambda: client.stats()["ready_sent"])
        assert len(sidecar.paths("/ready")) == 2
        assert "no answer within 0.1s" in client.stats()["last_error"]
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def _absent_then_present(run):
    async def main():
        port = free_port()
        log = RecordingLog()
        client = AgonesClient(settings(port), log=log)
        began = time.monotonic()
        await client.start()                 # nothing listens on the port
        assert time.monotonic() - began < 0.3
        client.room_state("m1", "running", 2)      # queued until the sidecar answers
        await asyncio.sleep(0.2)                    # ready and health keep failing
        assert client.stats()["requests_failed"] >= 4
        warnings = [r for r in log.records if r[0] == "warning"]
        assert [w[1] for w in warnings] == ["agones_sidecar_unreachable"]
        assert warnings[0][2]["detail"] == (
            f"agones sidecar not reachable at http://127.0.0.1:{port}; "
            "is the pod running under Agones? retrying")
        sidecar = await SidecarStandIn().start(port)
        await eventually(lambda: sidecar.paths("/ready"))
        await eventually(lambda: "relay-room-m1" in sidecar.final("/metadata/annotation"))
        await eventually(lambda: sidecar.paths("/health"))
        assert client.stats()["ready_sent"] and client.stats()["sidecar_reachable"]
        assert "agones_sidecar_reachable" in log.events("info")
        assert log.events("warning") == ["agones_sidecar_unreachable"]
        await client.stop()
        assert leftover_tasks() == []
        await sidecar.stop()

    run(main())


def test_absent_sidecar_one_warning_then_ready_when_it_appears():
    _absent_then_present(asyncio.run)


def test_absent_sidecar_on_uvloop():
    import uvloop

    _absent_then_present(uvloop.run)


def test_queue_is_bounded_and_drops_the_oldest():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port, health_interval=10, player_tracking=True),
                              log=RecordingLog())
        client.max_pending = 3
        for name in "abcde":                   # queued before start: nothing is sent yet
            client.player_joined(name)
        client.player_joined("c")              # refreshed: now the most recent
        assert client.stats()["pending"] == 3 and client.stats()["updates_dropped"] == 2
        await client.start()
        await settled(client, sidecar)
        assert sidecar.bodies("/alpha/player/connect") == [{"playerID": p} for p in "dec"]
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_room_annotations_are_capped():
    async def main():
        sidecar = await SidecarStandIn().start()
        log = RecordingLog()
        client = AgonesClient(settings(sidecar.port, health_interval=10), log=log)
        client.max_room_annotations = 2
        await client.start()
        for room in ("a", "b", "c", "d"):
            client.room_state(room, "waiting", 0)
        client.room_state("a", "running", 1)     # a known room keeps being updated
        await settled(client, sidecar)
        assert set(sidecar.final("/metadata/annotation")) == {"relay-room-a", "relay-room-b"}
        assert sidecar.final("/metadata/label")[LABEL_ROOMS] == "4"
        assert client.stats()["annotations_skipped"] == 2
        assert log.events("warning") == ["agones_room_annotations_capped"]
        await client.stop()
        await sidecar.stop()

    asyncio.run(main())


def test_stop_is_idempotent_and_leaves_no_tasks():
    async def main():
        sidecar = await SidecarStandIn().start()
        client = AgonesClient(settings(sidecar.port), log=RecordingLog())
        await client.start()
        client.room_state("m1", "running", 1)
        client.request_shutdown()
        await client.stop()
        await client.stop()
        await asyncio.gather(client.stop(), client.stop())
        assert leftover_tasks() == []
        assert client._session is None
        # Everything is a no-op afterwards.
        client.room_state("m1", "ended", 0)
        client.set_counts(0, 0)
        await client.start()
        assert await client.shutdown() is True
        assert leftover_tasks() == [] and client._session is None
        await sidecar.stop()

    asyncio.run(main())


def test_stop_without_start_and_disabled_client_do_nothing():
    async def main():
        sidecar = await SidecarStandIn().start()
        idle = AgonesClient(settings(sidecar.port))
        await idle.stop()
        await idle.stop()
        disabled = AgonesClient(AgonesSettings(enabled=False, port=sidecar.port))
        await disabled.start()
        disabled.room_state("m1", "running", 2)
        disabled.set_counts(1, 2)
        disabled.player_joined("x")
        disabled.request_shutdown()
        assert await disabled.shutdown() is False
        await asyncio.sleep(0.05)
        await disabled.stop()
        assert sidecar.calls == []
        assert disabled.stats()["enabled"] is False
        assert leftover_tasks() == []
        await sidecar.stop()

    asyncio.run(main())


def test_settings_validate_like_the_config_file():
    from relay.config import ConfigError

    AgonesSettings().validate()
    AgonesSettings(port=None).validate()
    for bad in (dict(health_interval=0), dict(port=70000), dict(max_retries=-1),
                dict(host=""), dict(backoff_initial=2.0, backoff_max=1.0)):
        try:
            AgonesSettings(**bad).validate()
        except ConfigError as error:
            assert str(error).startswith(f"agones.{next(iter(bad))}") or "backoff" in str(error)
        else:
            raise AssertionError(f"{bad} accepted")
