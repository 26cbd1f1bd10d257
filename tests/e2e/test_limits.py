"""Every resource cap of the relay, each at its limit: the last thing that fits is admitted, the
next one is refused or dropped with a counted reason (a metric label, and a log line).

Connections, rooms, players, spectators and input size run through real sockets on loopback;
the per-peer send queue, fragment reassembly and block buffers through the core configured
exactly as the server configures it; the replay disk budget on a real directory."""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay.client import RelayClient, RelayError, client_config
from relay.config import ConfigError, load_config
from relay.protocol import STREAM, STREAM_WINDOW
from relay.replay import ReplayReader, enforce_disk_cap
from relay.server.lobby import endpoint_config
from relay.server import RelayServer
from relay_core import MessageReceived
from relay_core.simlink import LinkedPair


def settings(tmp_path, **environ):
    base = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
            "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays"),
            "RELAY_REPLAY_ENABLED": "false"}
    base.update({key: str(value) for key, value in environ.items()})
    return load_config(environ=base)


@contextlib.asynccontextmanager
async def relay(tmp_path, **environ):
    server = RelayServer(settings(tmp_path, **environ))
    await server.start()
    clients: list[RelayClient] = []

    async def join(room, player, spectator=False):
        host, port = server.udp_address
        client = await RelayClient.connect(host, port, room, player, spectator, timeout=3)
        clients.append(client)
        return client

    async def refused(room, player, spectator=False) -> str:
        with pytest.raises(RelayError) as caught:
            await join(room, player, spectator)
        return caught.value.code

    server.join, server.refused = join, refused
    try:
        yield server
    finally:
        for client in clients:
            await client.close()
        await server.stop()


def metric(server: RelayServer, name: str, **labels) -> float:
    server._sync_stats()
    body, _ = server.metrics.render()
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise KeyError(f"{name}{labels}")


def run(coroutine):
    return asyncio.run(coroutine)


# -- connections, rooms, players, spectators, inputs (real sockets) -----------------------------

def test_max_peers_admits_exactly_that_many_connections(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_SERVER_MAX_PEERS=3, RELAY_ROOMS_START_POLICY="admin") as server:
            first = await server.join("r", "a")
            await server.join("r", "b")
            await server.join("r", "c")                               # the 3rd fits
            assert await server.refused("r", "d") == "server_full"    # the 4th does not
            assert metric(server, "relay_handshake_refusals_total", reason="server_full") == 1
            # The cap is on connections at once: one leaves, one more gets in.
            await first.close()
            await asyncio.sleep(0.1)
            await server.join("r", "d")
    run(scenario())


def test_max_rooms_admits_exactly_that_many_rooms(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_ROOMS_MAX_ROOMS=2, RELAY_ROOMS_START_POLICY="admin") as server:
            await server.join("one", "a")
            await server.join("two", "a")
            assert await server.refused("three", "a") == "too_many_rooms"
            await server.join("two", "b")                 # existing rooms still take players
            assert sorted(server.rooms) == ["one", "two"]
            assert metric(server, "relay_join_refusals_total", reason="too_many_rooms") == 1
    run(scenario())


def test_open_mode_sessions_per_source_admits_exactly_that_many_from_one_address(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_SECURITY_MODE="open", RELAY_SECURITY_MAX_SESSIONS_PER_SOURCE=2,
                         RELAY_ROOMS_START_POLICY="admin") as server:
            first = await server.join("r", "a")                     # every client on 127.0.0.1
            await server.join("r", "b")
            assert await server.refused("r", "c") == "source_session_limit"
            assert metric(server, "relay_handshake_refusals_total", reason="source_session_limit") == 1
            await first.close()                                     # one leaves, one gets in
            await asyncio.sleep(0.1)
            await server.join("r", "c")
    run(scenario())


def test_open_mode_rooms_per_source_admits_exactly_that_many_rooms_from_one_address(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_SECURITY_MODE="open", RELAY_SECURITY_MAX_ROOMS_PER_SOURCE=2,
                         RELAY_ROOMS_START_POLICY="admin") as server:
            await server.join("one", "a")
            await server.join("two", "a")
            assert await server.refused("three", "a") == "source_room_limit"
            server.create_room("three")                   # the admin API's rooms do not count
            await server.join("three", "a")               # existing rooms still take players
            assert metric(server, "relay_join_refusals_total", reason="source_room_limit") == 1
            server.end_room("one")                        # a room that ends frees its place
            await server.join("four", "a")
            assert sorted(server.rooms) == ["four", "three", "two"]
    run(scenario())


def test_room_capacity_admits_exactly_that_many_players(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_ROOMS_CAPACITY=2, RELAY_ROOMS_START_PLAYERS=2) as server:
            await server.join("r", "a")
            await server.join("r", "b")
            assert await server.refused("r", "c") == "room_full"
            await server.join("r", "watcher", spectator=True)      # spectators do not count
            assert metric(server, "relay_join_refusals_total", reason="room_full") == 1
    run(scenario())


def test_max_spectators_admits_exactly_that_many_spectators(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_ROOMS_MAX_SPECTATORS=2) as server:
            await server.join("r", "a")
            await server.join("r", "s1", spectator=True)
            await server.join("r", "s2", spectator=True)
            assert await server.refused("r", "s3", spectator=True) == "spectators_full"
            await server.join("r", "b")                           # players still welcome
            assert metric(server, "relay_join_refusals_total", reason="spectators_full") == 1
    run(scenario())


def test_an_input_of_max_input_bytes_is_relayed_and_one_byte_more_is_refused(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_ROOMS_MAX_INPUT_BYTES=16, RELAY_ROOMS_START_PLAYERS=1,
                         RELAY_ROOMS_INPUT_DELAY_ADVICE="false") as server:
            client = await server.join("r", "a")
            await client.wait_for_state("running")
            start = client.welcome.next_frame
            client.send_input(start + 3, b"F" * 16)
            client.send_input(start + 4, b"G" * 17)
            frames = {}
            while start + 4 not in frames:
                frame = await client.next_frame_or_none(timeout=3)
                frames[frame.number] = frame
            assert frames[start + 3].inputs[0] == b"F" * 16
            assert frames[start + 4].inputs[0] != b"G" * 17
            assert metric(server, "relay_inputs_refused_total", reason="too_large") == 1
            assert any(notice[0] == "input_too_large" for notice in client.notices)
    run(scenario())


# -- per-peer queues, reassembly and block buffers (the core as the server configures it) --------

@pytest.mark.parametrize("max_pending", [16, 40])
def test_a_peers_send_queue_holds_its_window_plus_max_pending_messages(tmp_path, max_pending):
    config = settings(tmp_path, RELAY_SERVER_MAX_PENDING_MESSAGES=max_pending)
    pair = LinkedPair(endpoint_config(config), client_config())
    pair.connect()
    pair.down.profile.loss = 1.0          # the client hears nothing, so nothing is acked
    queued = 0
    while queued < 10_000 and pair.server.send(pair.server_peer, STREAM, b"frame"):
        queued += 1
        pair.step()
    assert queued == STREAM_WINDOW + max_pending
    assert not pair.server.send(pair.server_peer, STREAM, b"frame")


def test_a_full_send_queue_is_counted_and_the_relay_goes_on(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_SERVER_TICK_RATE=120, RELAY_SERVER_MAX_PENDING_MESSAGES=16,
                         RELAY_ROOMS_START_PLAYERS=1, RELAY_ROOMS_PLAYER_TIMEOUT=30) as server:
            deaf = await server.join("r", "deaf")
            await deaf.wait_for_state("running")
            deaf.driver.close()              # stops reading and acking, without a goodbye
            deadline = time.monotonic() + 10
            while metric(server, "relay_dropped_datagrams_total", reason="send_queue_full") == 0:
                assert time.monotonic() < deadline, "the queue never filled"
                await asyncio.sleep(0.1)
            # Other rooms are unaffected.
            other = await server.join("other", "a")
            await other.wait_for_state("running")
            assert (await other.next_frame_or_none(timeout=3)) is not None
    run(scenario())


def test_reassembly_and_block_memory_limits_reach_the_core(tmp_path):
    config = settings(tmp_path, RELAY_SERVER_REASSEMBLY_LIMIT=300_000,
                      RELAY_SERVER_BLOCK_MEMORY_LIMIT=40 * 1024 * 1024)
    core = endpoint_config(config).validate()
    assert (core.reassembly_limit, core.block_memory_limit) == (300_000, 40 * 1024 * 1024)
    assert all(channel.max_pending == config.server.max_pending_messages for channel in core.channels)


@pytest.mark.parametrize("second_size, dropped", [(500, False), (10_000, True)])
def test_fragments_beyond_the_reassembly_limit_are_dropped_and_counted(tmp_path, second_size, dropped):
    """Two large messages in flight at once: the first one's opening fragment is lost, so the
    server holds the rest of it; the second one fits beside it or it does not, in which case
    its fragments are dropped (reassembly_full) until the first completes. Nothing is lost."""
    limit = 256 * 1024
    config = settings(tmp_path, RELAY_SERVER_REASSEMBLY_LIMIT=limit)
    pair = LinkedPair(endpoint_config(config), client_config())
    pair.connect()
    deliver, sent = pair.up.send, []

    def lose_the_first(datagram, now):
        sent.append(datagram)
        if len(sent) > 1:
            deliver(datagram, now)

    pair.up.send = lose_the_first
    # Room for a small second message beside the first: the first's bookkeeping is charged
    # too (64 bytes a fragment, ~15 kB here).
    first = bytes(range(256)) * ((limit - 20 * 1024) // 256)
    second = b"b" * second_size
    assert pair.client.send(pair.client_peer, 0, first)
    pair.run(0.02)
    assert pair.client.send(pair.client_peer, 0, second)
    pair.run(3.0)
    assert (pair.server.drops.get("reassembly_full", 0) > 0) is dropped
    delivered = [event.payload for event in pair.server_events if isinstance(event, MessageReceived)]
    assert delivered == [first, second]


def test_limits_outside_their_range_are_refused(tmp_path):
    for name, value in (("RELAY_SERVER_MAX_PENDING_MESSAGES", 8),
                        ("RELAY_SERVER_REASSEMBLY_LIMIT", 1000),
                        ("RELAY_SERVER_BLOCK_MEMORY_LIMIT", 1024),
                        ("RELAY_REPLAY_MAX_DISK_BYTES", 1000)):
        with pytest.raises(ConfigError, match=name):
            settings(tmp_path, **{name: value})


# -- replay disk budget -----------------------------------------------------------------------

def make_replay(directory: Path, name: str, size: int, age: float) -> Path:
    path = directory / name
    path.write_bytes(b"r" * size)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_disk_cap_deletes_the_oldest_finished_replays_down_to_exactly_the_cap(tmp_path):
    old = make_replay(tmp_path, "old.replay", 1000, age=300)
    mid = make_replay(tmp_path, "mid.replay", 1000, age=200)
    new = make_replay(tmp_path, "new.replay", 1000, age=100)
    other = make_replay(tmp_path, "notes.txt", 50_000, age=400)     # not ours: never touched
    live = tmp_path / "live.replay"
    live.write_bytes(b"l" * 500)

    usage = enforce_disk_cap(tmp_path, 3500, {str(live): 500})       # exactly at the cap
    assert usage.deleted == [] and usage.total == 3500
    usage = enforce_disk_cap(tmp_path, 3499, {str(live): 500})       # one byte over
    assert [Path(path).name for path, _ in usage.deleted] == ["old.replay"]
    assert usage.total == 2500 and not old.exists() and mid.exists() and new.exists()
    usage = enforce_disk_cap(tmp_path, 100, {str(live): 500})        # the live one stays
    assert {Path(path).name for path, _ in usage.deleted} == {"mid.replay", "new.replay"}
    assert live.exists() and other.exists() and usage.total == 500


def test_the_relay_keeps_its_replays_within_max_disk_bytes(tmp_path):
    """Recording rooms that alone pass the budget: the newest recording stops (and, being the
    only finished file, goes), a further match is not recorded, the older recording goes on."""
    config = settings(tmp_path, RELAY_REPLAY_ENABLED="true", RELAY_REPLAY_MAX_BYTES=1024,
                      RELAY_REPLAY_MAX_DISK_BYTES=1024)
    directory = Path(config.replay.directory)
    directory.mkdir()
    stale = make_replay(directory, "stale.replay", 700, age=3600)

    async def scenario():
        server = RelayServer(config)
        recorder = server.recorder
        recorder.open("a", [])
        recorder.open("b", [])
        assert stale.exists()              # 700 bytes: within the budget so far
        for writer in recorder.writers.values():
            for number in range(40):
                writer.append_frame(number, os.urandom(24))    # incompressible
            writer.flush()
        assert sum(w.bytes_written for w in recorder.writers.values()) > 1024
        recorder.open("c", [])
        assert not stale.exists()          # deleted first, yet the live recordings fill the budget
        assert "c" not in recorder.writers
        recorder.check_disk()
        assert list(recorder.writers) == ["a"]
        files = sorted(path.name for path in directory.glob("*.replay"))
        assert len(files) == 1 and files[0].startswith("a-")
        disk = server.metrics.replay_disk
        assert disk.labels("deleted")._value.get() == 2          # stale, then b's
        assert disk.labels("stopped")._value.get() == 1
        assert disk.labels("not_recorded")._value.get() == 1
        recorder.close("a", "ended")
        assert ReaderFrames(directory / files[0]) > 0
    asyncio.run(scenario())


def ReaderFrames(path: Path) -> int:
    return sum(1 for _ in ReplayReader(path).frames())
