"""The relay's own CPU per player-tick, without the kernel or the event loop.

benchmarks/capacity.py measures the whole server over real sockets: its figures include the
kernel's UDP work (about 4 us a player-tick on our machines) and move by +-10 % from run to run
on a shared machine. This benchmark isolates the part we write and can change: a RelayServer
(rooms, the compiled core, the server's receive/tick/flush paths) driven in one process with
in-memory datagrams, by benchmarks/players.py's simulated players (rooms of 8, a 16-byte input for
frame N + 2 on every FRAME N, as benchmarks/loadgen.py's). Only the server's calls are timed
(``time.process_time``); the players' work is not.

Per tick, as the server does it under load:

    receive   Endpoint.receive_batch of every player's datagrams (a room's players' are only
              held there, for the room's turn in the tick)
    events    the core's events to the rooms (INPUTs through relay.server.inputs)
    tick      RelayServer.tick: in each room's turn its players' datagrams are handled (their
              INPUTs into the room), its frame closed and queued, and each player flushed
    flush     Endpoint.datagrams_to_send: the datagrams, and whatever else is due

    python benchmarks/tick_cost.py --players 768 --ticks 300 --repeat 3

The best of ``--repeat`` runs is reported (the least disturbed by the rest of the machine), per
phase in microseconds per player-tick.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from typing import Optional

if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.players import MEMORY_SERVER_ADDRESS, ROOM_SIZE, MemoryPlayer
from relay.config import RelayConfig
from relay.logs import configure as configure_logs
from relay.server.daemon import GC_THRESHOLD, RelayServer

PHASES = ("receive", "events", "tick", "flush")


def _nothing() -> None:
    pass


class Harness:
    def __init__(self, players: int, tick_rate: int = 30, replays: bool = False):
        config = RelayConfig()
        config = dataclasses.replace(
            # Every player is on 127.0.0.2: no per-source limits.
            config, security=dataclasses.replace(config.security, handshake_rate=0,
                                                 max_sessions_per_source=0, max_rooms_per_source=0),
            server=dataclasses.replace(config.server, max_peers=max(players, 64)),
            rooms=dataclasses.replace(config.rooms, max_rooms=max(1, players // ROOM_SIZE + 1)),
            # As in benchmarks/capacity.py: replays are a disk feature with their own cost.
            replay=dataclasses.replace(config.replay, enabled=replays))
        self.server = RelayServer(config)
        self.endpoint = self.server.endpoint
        self.interval = 1.0 / tick_rate
        self.now = 0.0
        self.players = [MemoryPlayer(i, self.now) for i in range(players)]
        self.by_address = {p.address: p for p in self.players}
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.player_ticks = 0
        # Called right before and right after the server's calls of a timed tick
        # (benchmarks/tick_misses.py counts cache misses between them).
        self.server_calls_begin = self.server_calls_end = _nothing

    def _deliver(self, datagrams, now: float) -> None:
        by_address = self.by_address
        for data, address in datagrams:
            player = by_address[address]
            player.endpoint.receive(data, MEMORY_SERVER_ADDRESS, now)
        for player in self.players:
            player.on_events()

    def _client_datagrams(self, now: float) -> list:
        batch = []
        for player in self.players:
            address = player.address
            for data, _ in player.endpoint.datagrams_to_send(now):
                batch.append((data, address))
        return batch

    def tick(self, timed: bool) -> None:
        clock = time.process_time
        server, endpoint = self.server, self.endpoint
        # Inputs arrive during the tick; the frame closes at its end.
        arrival = self.now + self.interval / 2
        batch = self._client_datagrams(arrival)
        if timed:
            self.server_calls_begin()
        t0 = clock()
        endpoint.receive_batch(batch, arrival)
        t1 = clock()
        server.on_datagrams(arrival)
        t2 = clock()
        self.now += self.interval
        server.tick(self.now)
        t3 = clock()
        out = endpoint.datagrams_to_send(self.now)
        t4 = clock()
        if timed:
            self.server_calls_end()
            totals = self.totals
            totals["receive"] += t1 - t0
            totals["events"] += t2 - t1
            totals["tick"] += t3 - t2
            totals["flush"] += t4 - t3
            self.player_ticks += len(self.players)
        self._deliver(out, self.now + 0.001)

    def run(self, ticks: int, warmup: int) -> dict:
        for _ in range(warmup):
            self.tick(False)
        running = sum(1 for p in self.players if p.frames > 0)
        if running < len(self.players):
            raise RuntimeError(f"only {running} of {len(self.players)} players receive frames "
                               f"after {warmup} warm-up ticks")
        frames_before = sum(p.frames for p in self.players)
        for _ in range(ticks):
            self.tick(True)
        frames = sum(p.frames for p in self.players) - frames_before
        per = {phase: 1e6 * seconds / self.player_ticks for phase, seconds in self.totals.items()}
        per["total"] = sum(per.values())
        return {"players": len(self.players), "ticks": ticks, "frames_received": frames,
                "frames_expected": ticks * len(self.players), "us_per_player_tick": per}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=768, help="players, in rooms of 8 (default 768)")
    parser.add_argument("--ticks", type=int, default=300, help="measured ticks per run (default 300)")
    parser.add_argument("--warmup", type=int, default=60, help="ticks before measuring (default 60)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    configure_logs("warning")
    if args.players < ROOM_SIZE or args.ticks < 1 or args.repeat < 1:
        parser.error("--players at least 8, --ticks and --repeat at least 1")
    # The collector as the server sets it up (RelayServer.start).
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    runs = []
    for _ in range(args.repeat):
        gc.collect()
        runs.append(Harness(args.players).run(args.ticks, args.warmup))
    best = min(runs, key=lambda r: r["us_per_player_tick"]["total"])
    lost = best["frames_expected"] - best["frames_received"]
    print(f"tick cost: {best['players']} players, {best['ticks']} ticks, best of {args.repeat} "
          f"(server CPU only, no kernel; frames short {lost})")
    for phase in PHASES + ("total",):
        values = " ".join(f"{r['us_per_player_tick'][phase]:6.2f}" for r in runs)
        print(f"  {phase:8s} {best['us_per_player_tick'][phase]:6.2f} us/player-tick   (runs: {values})")
    total = best["us_per_player_tick"]["total"]
    print(f"  = {1e6 / (total * 30):.0f} players per core at 30 Hz before the kernel's share")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"best": best, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
