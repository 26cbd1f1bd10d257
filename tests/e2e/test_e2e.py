"""End to end over real UDP sockets on loopback, through the user-space link emulator."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from relay import protocol
from relay.client import RelayClient, RelayError, replay_frames
from relay.tools.netem import Netem
from relay.replay import ReplayReader
from relay.server import RelayServer

from live_relay import BAD_LINK, Player, digest, running_room, running_server, server_config

def test_four_players_over_a_lossy_link_see_every_frame_once_in_order(tmp_path):
    async def scenario():
        server = await running_server(tmp_path, start_players=4, player_timeout=2.0)
        emulators = []
        players = []
        try:
            for i in range(4):
                netem = Netem(("127.0.0.1", 0), server.udp_address, up=BAD_LINK, down=BAD_LINK, seed=i)
                await netem.start()
                emulators.append(netem)
            clients = await asyncio.gather(*[
                RelayClient.connect(*emulators[i].listen_address, "match", f"p{i}", timeout=10)
                for i in range(4)])
            # 4 frames (133 ms) of input delay cover a 40-60 ms round trip plus a repair.
            players = [Player(client, f"p{i}", input_delay=4) for i, client in enumerate(clients)]
            for player in players:
                await player.client.wait_for_state("running")
            frames_wanted = 20 * 30
            await asyncio.gather(*[p.play_until(frames_wanted, timeout=5) for p in players])

            # A late joiner gets the whole history, then the live stream.
            late_netem = Netem(("127.0.0.1", 0), server.udp_address, up=BAD_LINK, down=BAD_LINK, seed=9)
            await late_netem.start()
            emulators.append(late_netem)
            late = Player(await RelayClient.connect(*late_netem.listen_address, "match", "late",
                                                    timeout=10), "late")
            history = late.client.welcome.history
            assert history > frames_wanted
            target = history + 30
            await asyncio.gather(late.play_until(target, 10), *[p.play_until(target, 5) for p in players])

            for player in players + [late]:
                numbers = [f.number for f in player.frames]
                assert numbers[: target + 1] == list(range(target + 1)), player.name
            reference = digest(players[0].frames[: target + 1])
            for player in players[1:] + [late]:
                assert digest(player.frames[: target + 1]) == reference, player.name
            # Inputs made it into their frames despite 10 % loss each way.
            own = sum(1 for f in players[0].frames[10:frames_wanted] if f.inputs[0] is not None)
            assert own > 0.95 * (frames_wanted - 10)
            assert set(server.endpoint.drops) <= {"duplicate_packet"}, server.endpoint.drops
        finally:
            for player in players:
                await player.client.close()
            await server.stop()
            for netem in emulators:
                await netem.stop()

    asyncio.run(scenario())


def test_killed_client_times_out_and_the_room_goes_on_then_reconnects_without_gap(tmp_path):
    async def scenario():
        async with running_room(tmp_path, "r", ["a", "b"], player_timeout=1.0,
                                reconnect_grace=30) as (server, (a, b)):
            await asyncio.gather(a.play_until(30, 5), b.play_until(30, 5))
            b.client.driver.close()            # killed: no LEAVE, no DISCONNECT
            await a.play_until(30 + 3 * 30, 5)      # three seconds later the room still runs
            events = [e for f in a.frames for e in f.events]
            assert ["timeout", 1, "b"] in events
            timed_out_at = next(f.number for f in a.frames if ["timeout", 1, "b"] in f.events)
            assert all(f.inputs[1] is None for f in a.frames if f.number > timed_out_at)

            # b comes back from a new socket: same slot, no gap, no duplicate.
            seen = b.frames[-1].number
            await b.client.reconnect()
            assert b.client.welcome.slot == 1
            await asyncio.gather(b.play_until(a.frames[-1].number + 30, 5),
                                 a.play_until(a.frames[-1].number + 30, 5))
            numbers = [f.number for f in b.frames]
            assert numbers == list(range(len(numbers))), "gap or duplicate after reconnect"
            assert numbers[-1] > seen
            assert any(["reconnect", 1, "b"] in f.events for f in a.frames)
            assert digest(b.frames) == digest(a.frames[: len(b.frames)])

    asyncio.run(scenario())


def test_checksum_mismatch_is_reported_to_the_room_and_counted(tmp_path):
    async def scenario():
        async with running_room(tmp_path, "d", ["ann", "ben", "cat"], start_players=3) as (server, players):
            await asyncio.gather(*[p.play_until(10, 5) for p in players])
            for player in players:
                value = 1234 if player.name != "cat" else 9999
                player.client.report_checksum(5, value)
            await asyncio.gather(*[p.play_until(40, 5) for p in players])
            for player in players:
                assert player.client.desyncs == [[5, {"ann": 1234, "ben": 1234, "cat": 9999}, ["cat"],
                                                  "minority", [["ann", "ben"], ["cat"]]]]
            metrics = server.metrics.render()[0].decode()
            assert "relay_desyncs_total 1.0" in metrics

    asyncio.run(scenario())


def test_bad_input_gets_an_error_or_a_counted_drop_while_the_room_keeps_running(tmp_path):
    async def scenario():
        async with running_room(tmp_path, "x", ["a", "b"], max_input_bytes=32) as (server, (a, b)):
            host, port = server.udp_address
            await asyncio.gather(a.play_until(10, 5), b.play_until(10, 5))
            # Garbage datagrams from a stranger and from a player's own socket.
            stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for datagram in (b"", b"\x00" * 3, b"RL\x01\x06" + os.urandom(40), os.urandom(1400)):
                stranger.sendto(datagram, (host, port))
                a.client.driver.transport.sendto(datagram, (host, port))
            stranger.close()
            # Oversized input and a message that is not msgpack, over the real protocol.
            a.client.send_input(a.frames[-1].number + 5, bytes(100))
            a.client.endpoint.send(a.client.peer_id, protocol.CONTROL, b"\xc1 not msgpack")
            a.client.driver.request_flush()
            await asyncio.gather(a.play_until(60, 5), b.play_until(60, 5))
            assert [f.number for f in a.frames] == list(range(len(a.frames)))
            codes = [notice[0] for notice in a.client.notices]
            assert "input_too_large" in codes and "malformed" in codes
            metrics = server.metrics.render()[0].decode()
            assert 'relay_inputs_refused_total{reason="too_large"} 1.0' in metrics
            assert 'relay_dropped_datagrams_total{reason="malformed_message"} 1.0' in metrics
            assert server.rooms["x"].state == "running"

            # Bad admin requests get JSON errors.
            base = f"http://127.0.0.1:{server.http_port}"

            def request(method, path, body=None):
                data = None if body is None else json.dumps(body).encode()
                req = urllib.request.Request(base + path, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=5) as response:
                        return response.status, json.loads(response.read())
                except urllib.error.HTTPError as error:
                    return error.code, json.loads(error.read())

            loop = asyncio.get_running_loop()
            status, body = await loop.run_in_executor(None, request, "GET", "/rooms/nope")
            assert status == 404 and body["error"] == "room_not_found"
            status, body = await loop.run_in_executor(None, request, "POST", "/rooms", {"room": "x"})
            assert status == 409
            status, body = await loop.run_in_executor(None, request, "POST", "/rooms",
                                                      {"room": "y", "capacity": 0})
            assert status == 400 and "capacity" in body["message"]
            status, body = await loop.run_in_executor(None, request, "POST", "/rooms/x/kick",
                                                      {"player": "nobody"})
            assert status == 404
            await asyncio.gather(a.play_until(90, 5), b.play_until(90, 5))

    asyncio.run(scenario())


def test_spectator_receives_the_stream_with_its_delay(tmp_path):
    async def scenario():
        async with running_room(tmp_path, "s", ["a", "b"], spectator_delay=15) as (server, (a, b)):
            host, port = server.udp_address
            await asyncio.gather(a.play_until(40, 5), b.play_until(40, 5))
            watcher = await RelayClient.connect(host, port, "s", "watcher", spectator=True)
            live_at_join = a.frames[-1].number
            assert watcher.welcome.slot is None
            assert watcher.welcome.history <= live_at_join + 1 - 15
            seen = []
            async def watch():
                while len(seen) < 60:
                    frame = await watcher.next_frame_or_none(timeout=5)
                    seen.append((frame.number, time.monotonic()))
            await asyncio.gather(watch(), a.play_until(120, 5), b.play_until(120, 5))
            assert [n for n, _ in seen] == list(range(60))
            assert digest([a.frames[n] for n, _ in seen]) == digest(
                [f for f in a.frames[:60]])
            # The spectator trails the players by the delay (15 frames = 0.5 s at 30 Hz).
            newest = seen[-1][0]
            assert a.frames[-1].number - newest >= 14
            await watcher.close()

    asyncio.run(scenario())


def free_port(kind=socket.SOCK_DGRAM):
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_drains_then_ends_rooms_tells_clients_and_leaves_a_complete_replay(tmp_path):
    udp_port, http_port = free_port(), free_port(socket.SOCK_STREAM)
    env = dict(os.environ, RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(udp_port),
               RELAY_SERVER_HTTP_PORT=str(http_port), RELAY_REPLAY_DIRECTORY=str(tmp_path),
               RELAY_SERVER_LOG_FORMAT="json", RELAY_SERVER_DRAIN_TIMEOUT="1.5")
    process = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        async def scenario():
            deadline = time.monotonic() + 20
            while True:
                try:
                    a = await RelayClient.connect("127.0.0.1", udp_port, "final", "a", timeout=1)
                    break
                except RelayError:
                    assert time.monotonic() < deadline, "relay serve did not come up"
            b = await RelayClient.connect("127.0.0.1", udp_port, "final", "b")
            pa, pb = Player(a, "a"), Player(b, "b")
            await a.wait_for_state("running")
            await asyncio.gather(pa.play_until(45, 5), pb.play_until(45, 5))
            process.send_signal(signal.SIGTERM)
            # Draining: the match goes on, new players are turned away...
            await asyncio.gather(pa.play_until(60, 5), pb.play_until(60, 5))
            with pytest.raises(RelayError, match="draining"):
                await RelayClient.connect("127.0.0.1", udp_port, "another", "c")
            # ...until the drain deadline ends it, with the reason delivered.
            await a.wait_for_state("ended", timeout=5)
            return a
        client = asyncio.run(scenario())
        assert process.wait(timeout=15) == 0
        assert client.final_frames >= 46
        _, stderr = process.communicate(timeout=5)
        lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert any(line["event"] == "stopped" for line in lines)
        [replay] = list(tmp_path.glob("*.replay"))
        reader = ReplayReader(replay)
        frames = list(reader.frames())
        assert reader.complete and reader.end["reason"] == "drain_deadline"
        assert [n for n, _ in frames] == list(range(len(frames)))
        assert len(frames) == client.final_frames
        # The SDK reads the replay back as the same frames a live client received.
        replayed = list(replay_frames(replay))
        assert [f.number for f in replayed] == list(range(client.final_frames))
        assert replayed[10].inputs == [b"a:10", b"b:10"]
    finally:
        if process.poll() is None:
            process.kill()


def test_admin_drain_lets_running_matches_finish_until_the_deadline(tmp_path):
    async def scenario():
        async with running_room(tmp_path, "match", ["a", "b"], start_policy="players") as (server, (a, b)):
            server.config.server.drain_timeout = 1.0
            host, port = server.udp_address
            lobby = await RelayClient.connect(host, port, "lobby", "solo")      # waiting room
            await asyncio.gather(a.play_until(15, 5), b.play_until(15, 5))
            loop = asyncio.get_running_loop()

            def get(path):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}",
                                                timeout=5) as response:
                        return response.status
                except urllib.error.HTTPError as error:
                    return error.code

            assert await loop.run_in_executor(None, get, "/ready") == 200
            request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/admin/drain",
                                             data=b"{}", method="POST")
            await loop.run_in_executor(None, lambda: urllib.request.urlopen(request, timeout=5).read())
            assert await loop.run_in_executor(None, get, "/ready") == 503      # at once
            await lobby.wait_for_state("ended", timeout=5)                      # not started: ended now
            assert lobby.end_reason == "draining"
            with pytest.raises(RelayError, match="draining"):
                await RelayClient.connect(host, port, "match", "newcomer")
            # The running match goes on, and its players may still reconnect.
            await b.client.reconnect()
            await asyncio.gather(a.play_until(40, 5), b.play_until(40, 5))
            await a.client.wait_for_state("ended", timeout=5)
            assert a.client.end_reason == "drain_deadline"
            assert a.client.final_frames >= 40
            assert server.drained.is_set() and not server.rooms
            await lobby.close()

    asyncio.run(scenario())


def test_the_relay_reports_to_the_agones_sidecar_and_asks_to_shut_down_when_drained(tmp_path):
    from agones_sidecar import SidecarStandIn

    async def scenario():
        sidecar = SidecarStandIn(counters={"rooms": (0, 1000)})
        await sidecar.start()
        config = server_config(tmp_path)
        config.agones.enabled = True
        config.agones.port = sidecar.port
        config.agones.player_tracking = True
        config.agones.health_interval = 0.1
        config.server.drain_timeout = 0.5
        server = RelayServer(config)
        await server.start()
        host, port = server.udp_address
        try:
            a = Player(await RelayClient.connect(host, port, "gs-match", "a"), "a")
            b = Player(await RelayClient.connect(host, port, "gs-match", "b"), "b")
            await a.client.wait_for_state("running")
            await asyncio.gather(a.play_until(60, 5), b.play_until(60, 5))
            paths = [path for _, _, path, _ in sidecar.calls]
            # The GameServer read and the Counter's capacity set before Ready.
            assert paths.index("/gameserver") < paths.index("/ready")
            assert sidecar.bodies("/v1beta1/counters/rooms")[0] == {
                "capacity": str(config.rooms.max_rooms)}
            assert paths.index("/v1beta1/counters/rooms") < paths.index("/ready")
            assert paths.count("/health") >= 5
            # The players' JOIN created the room: the relay allocated itself and took a slot.
            assert sidecar.state == "Allocated" and sidecar.counters["rooms"]["count"] == 1
            connects = [body["playerID"] for _, _, path, body in sidecar.calls
                        if path == "/alpha/player/connect"]
            assert sorted(connects) == ["gs-match/a", "gs-match/b"]
            annotations = [body for _, _, path, body in sidecar.calls if path == "/metadata/annotation"]
            assert any('"state":"running"' in body["value"] for body in annotations)
            server.drain()
            await asyncio.wait_for(server.drained.wait(), 5)
            for _ in range(50):
                if any(path == "/shutdown" for _, _, path, _ in sidecar.calls):
                    break
                await asyncio.sleep(0.05)
            assert any(path == "/shutdown" for _, _, path, _ in sidecar.calls)
            assert sidecar.state == "Shutdown" and sidecar.counters["rooms"]["capacity"] == 0
            await a.client.close()
            await b.client.close()
        finally:
            await server.stop()
            await sidecar.stop()

    asyncio.run(scenario())
