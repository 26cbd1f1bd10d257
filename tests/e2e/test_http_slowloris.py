"""The HTTP side cannot be starved (docs/SECURITY.md, "HTTP connections"): request heads and
bodies are timed, connections capped, and file descriptors kept for UDP and replay files.

Loopback only, bounded: at most ATTACK_CONNECTIONS sockets, each test a few seconds."""
from __future__ import annotations

import asyncio
import os
import time

from relay.client import RelayClient
from relay.replay import ReplayReader
from relay.server.http import HttpGuard, fd_budget, start_http, stop_http
from relay.server.metrics import Metrics

from live_relay import Player
from relay_serve import RelayServe

PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: relay\r\n"
"""A request line and one header, and never the blank line that ends the head."""


class FakeServer:
    def health(self) -> dict:
        return {"status": "ok"}

    def ready(self) -> bool:
        return True

    def create_room(self, room_id: str, **options) -> dict:
        return {"room": room_id}


async def open_partial(port: int, count: int, timeout: float = 2.0) -> list:
    """``count`` connections that send a partial request head and nothing more (those the
    server did not accept within ``timeout`` are given up)."""
    async def one():
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), timeout)
        except (OSError, asyncio.TimeoutError):
            return None
        try:
            writer.write(PARTIAL_HEAD)
        except OSError:
            pass
        return reader, writer

    return [pair for pair in await asyncio.gather(*[one() for _ in range(count)]) if pair]


def close_all(pairs: list) -> None:
    for _, writer in pairs:
        writer.transport.abort()


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(), within)
    except asyncio.TimeoutError:
        return False
    except OSError:         # reset
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 4")


async def get(port: int, path: str = "/health", timeout: float = 2.0) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n".encode())
        response = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.transport.abort()
    if not response.startswith(b"HTTP/"):
        return 0, response or b"(closed without a response)"
    return int(response.split(b" ", 2)[1]), response


def test_a_request_head_must_be_complete_within_the_header_timeout_however_it_trickles():
    async def main():
        runner, port = await start_http(FakeServer(), Metrics(), "127.0.0.1", 0,
                                         header_timeout=0.5)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            started = time.monotonic()
            writer.write(b"GET /health HTTP/1.1\r\n")
            for _ in range(3):          # a header line every 0.2 s: never idle for long
                await asyncio.sleep(0.2)
                if reader.at_eof():
                    break
                try:
                    writer.write(b"X-Slow: 1\r\n")
                except OSError:
                    break
            assert await closed_by_server(reader, 2.0)
            assert 0.4 <= time.monotonic() - started < 1.5
            # A prompt request on a fresh connection is answered.
            status, _ = await get(port)
            assert status == 200
        finally:
            await stop_http(runner)
    asyncio.run(main())


def test_a_body_must_arrive_within_the_body_timeout():
    async def main():
        runner, port = await start_http(FakeServer(), Metrics(), "127.0.0.1", 0,
                                        body_timeout=0.3)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /rooms HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json"
                         b"\r\nContent-Length: 100\r\n\r\n{\"room\"")
            started = time.monotonic()
            response = await asyncio.wait_for(reader.read(), 3.0)
            assert response.startswith(b"HTTP/1.1 408"), response[:200]
            assert b'"request_timeout"' in response
            assert time.monotonic() - started < 2.0
            writer.transport.abort()
        finally:
            await stop_http(runner)
    asyncio.run(main())


def test_over_the_connection_cap_the_oldest_waiting_connection_makes_room_for_a_probe():
    async def main():
        lines: list = []
        runner, port = await start_http(
            FakeServer(), Metrics(), "127.0.0.1", 0, max_connections=8,
            limit_log=lambda event, kind, **fields: lines.append((event, kind)))
        try:
            idle = await open_partial(port, 40)
            try:
                for _ in range(5):
                    status, _ = await get(port)
                    assert status == 200
                # The cap held: the first idle connections were closed for the newer ones.
                closed = [await closed_by_server(reader, 0.05) for reader, _ in idle[:20]]
                assert sum(closed) >= 20 - 8
            finally:
                close_all(idle)
        finally:
            await stop_http(runner)
        assert ("http_connection_closed", "http_connection_limit") in lines
    asyncio.run(main())


def test_the_guard_keeps_a_reserve_of_descriptors_below_the_limit():
    assert fd_budget(256) == (256, 64)
    assert fd_budget(1024) == (1024, 256)
    assert fd_budget(65536) == (65536, 16384)
    assert HttpGuard(fd_limit=256).max_connections == 192
    assert HttpGuard(fd_limit=1 << 20).max_connections == 256


ATTACK_CONNECTIONS = 400
NOFILE = 256


def test_slowloris_beyond_the_fd_limit_leaves_health_answering_and_new_matches_recorded(tmp_path):
    """More idle half-open connections than the relay has file descriptors: /health answers
    within a second throughout, and a match started meanwhile is recorded."""
    relay = RelayServe(tmp_path, nofile=NOFILE)

    async def main():
        attack = await open_partial(relay.http_port, ATTACK_CONNECTIONS)
        try:
            assert len(attack) > NOFILE * 3 // 4
            latencies = []
            for _ in range(6):
                started = time.monotonic()
                status, body = await get(relay.http_port, timeout=2.0)
                latencies.append(time.monotonic() - started)
                assert status == 200, body
                await asyncio.sleep(0.1)
            assert max(latencies) < 1.0, latencies
            descriptors = len(os.listdir(f"/proc/{relay.process.pid}/fd"))
            print(f"\n{len(attack)} half-open connections, RLIMIT_NOFILE {NOFILE}: /health "
                  f"{len(latencies)}/{len(latencies)} answered, slowest "
                  f"{max(latencies) * 1000:.1f} ms; the relay holds {descriptors} descriptors")
            # More attack connections while a match is played: it is recorded all the same.
            attack += await open_partial(relay.http_port, ATTACK_CONNECTIONS // 2)
            clients = [await RelayClient.connect("127.0.0.1", relay.udp_port, "during-attack",
                                                 name, timeout=10) for name in ("a", "b")]
            players = [Player(client, name) for client, name in zip(clients, ("a", "b"))]
            try:
                await players[0].client.wait_for_state("running")
                await asyncio.gather(*[player.play_until(45, timeout=5) for player in players])
                status, _ = await get(relay.http_port, timeout=2.0)
                assert status == 200
            finally:
                for player in players:
                    await player.client.close()
        finally:
            close_all(attack)

    try:
        asyncio.run(main())
    finally:
        relay.stop()
    files = list(relay.replays.glob("*.replay"))
    assert len(files) == 1, (files, relay.log()[-3000:])
    reader = ReplayReader(files[0])
    assert reader.header["room"] == "during-attack"
    assert sum(1 for _ in reader.frames()) >= 45
    log = relay.log()
    assert "Too many open files" not in log and "Errno 24" not in log, log[-3000:]
    events = relay.log_events()
    assert not [e for e in events if e.get("event") == "replay_open_failed"]
    closed = [e for e in events if e.get("event") == "http_connection_closed"]
    assert closed, log[-3000:]
    # Hundreds closed, one line per kind and interval (the rest are counted into the next).
    assert len(closed) <= 4, closed
