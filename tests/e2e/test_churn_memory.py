"""Rooms and connections that are gone leave nothing behind in the server.

A relay runs for weeks while rooms open and close and players come and go; anything it keeps
per room or per connection after they end is a leak an operator only sees as slowly growing
memory. Here a RelayServer runs in one process (in-memory datagrams, the compiled core, replays
on) through cycles of: 16 players connect, join two fresh rooms, play three seconds,
disconnect; the rooms end. After a warm-up, the Python heap -- which includes the core's C
buffers (allocated through PyMem) -- must not grow with the number of cycles.
"""
from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from pathlib import Path

from benchmarks.players import MEMORY_SERVER_ADDRESS, ROOM_SIZE, MemoryPlayer
from relay.config import RelayConfig
from relay.server import RelayServer

TICK = 1 / 30


class Silent:
    """A logger that writes nothing: lines written to stdout wait in its buffer, and
    tracemalloc would count them as the server's memory."""

    def __getattr__(self, level):
        return lambda *args, **fields: None


class Churn:
    def __init__(self, replay_directory: Path):
        config = RelayConfig()
        config = dataclasses.replace(
            # Every player is on 127.0.0.2: no per-source limits.
            config, security=dataclasses.replace(config.security, handshake_rate=0,
                                                 max_sessions_per_source=0, max_rooms_per_source=0),
            rooms=dataclasses.replace(config.rooms, empty_timeout=1.0),
            replay=dataclasses.replace(config.replay, enabled=True, directory=str(replay_directory)))
        self.server = RelayServer(config)
        self.server.log = self.server.recorder.log = self.server.limit_log.log = Silent()
        self.endpoint = self.server.endpoint
        self.now = 0.0
        self.serial = 0

    def step(self, players: list[MemoryPlayer]) -> None:
        arrival = self.now + TICK / 2
        batch = [(data, p.address) for p in players
                 for data, _ in p.endpoint.datagrams_to_send(arrival)]
        self.endpoint.receive_batch(batch, arrival)
        self.server.on_datagrams(arrival)
        self.now += TICK
        self.server.tick(self.now)
        by_address = {p.address: p for p in players}
        for data, address in self.endpoint.datagrams_to_send(self.now):
            if address in by_address:
                by_address[address].endpoint.receive(data, MEMORY_SERVER_ADDRESS,
                                                     self.now + 0.001)
        for player in players:
            player.on_events()

    def cycle(self, rooms: int = 2) -> None:
        # Fresh players (new addresses, new room names, as benchmarks.players numbers them).
        players = [MemoryPlayer(self.serial + i, self.now) for i in range(rooms * ROOM_SIZE)]
        self.serial += len(players)
        for _ in range(90):
            self.step(players)
        assert all(p.frames > 30 for p in players), [p.frames for p in players]
        for player in players:
            player.endpoint.disconnect(player.peer)
        for _ in range(60):             # past rooms.empty_timeout: the rooms end
            self.step(players)
        assert not self.server.rooms and self.endpoint.peer_count == 0


def test_room_and_connection_churn_leaves_nothing_behind(tmp_path):
    churn = Churn(tmp_path)
    tracemalloc.start()
    try:
        for _ in range(4):              # warm-up: caches, dict sizes, interned names
            churn.cycle()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(16):             # 256 connections and 32 rooms come and go
            churn.cycle()
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(list(tmp_path.iterdir())) >= 40      # the rooms did play (a replay each)
    # One connection's state alone is ~6 KB and a room's more: a leak of either over 256
    # connections and 32 rooms is far above this.
    assert growth < 16 * 1024, f"{growth} bytes more after 16 more cycles"
    server = churn.server
    lobby = server.lobby
    assert not lobby.peer_room and not lobby.peer_claims and not lobby.notified
    assert not server.recorder.writers
