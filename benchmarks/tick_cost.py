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

    python benchmarks/tick_cost.py --players 768 --ticks 300 --repeat 3 [--in-place]

``--in-place`` takes the datagrams the way ``relay serve`` does (Harness): through a loopback
socket, read with recvmmsg and taken in the receive buffer (receive), written into the
endpoint's outbox (flush); the receive phase then includes the kernel's side of the reads.
benchmarks/tick_misses.py counts this path by default.

The best of ``--repeat`` runs is reported (the least disturbed by the rest of the machine), per
phase in microseconds per player-tick.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import socket
import sys
import time
from typing import Optional

if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.players import MEMORY_SERVER_ADDRESS, ROOM_SIZE, MemoryPlayer
from relay._batchio import BatchSocket
from relay.config import RelayConfig
from relay.logs import configure as configure_logs
from relay.server.daemon import GC_THRESHOLD, RelayServer

PHASES = ("receive", "events", "tick", "flush")
# In place: datagrams read per recvmmsg (the server's batch), and players' datagrams sent
# before the server reads them (well under what a default 208 KiB socket buffer holds).
IN_PLACE_BATCH = 256
IN_PLACE_CHUNK = 64


def _nothing() -> None:
    pass


class Harness:
    """A RelayServer and its players in one process. ``in_place``: the players' datagrams reach
    the server as they do in ``relay serve``: through a loopback UDP socket, read by a
    ``BatchSocket`` (recvmmsg) whose endpoint takes connected players' DATA in the receive
    buffer (``Endpoint.receive_raw``), and the server's DATA is written into the endpoint's
    outbox (``flush_in_place``), handed to the players from there; the server's CPU then
    includes the kernel's receive. Without it, ``Endpoint.receive_batch`` and
    ``datagrams_to_send`` with a bytes object and an address tuple per datagram, no kernel."""

    def __init__(self, players: int, tick_rate: int = 30, replays: bool = False,
                 in_place: bool = False):
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
        self.io: Optional[BatchSocket] = None
        self.server_socket: Optional[socket.socket] = None
        self.player_sockets: list[socket.socket] = []
        if in_place:
            self._open_sockets()
        self.by_address = {p.address: p for p in self.players}
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.player_ticks = 0
        # Called right before and right after the server's calls of a timed tick
        # (benchmarks/tick_misses.py counts cache misses between them).
        self.server_calls_begin = self.server_calls_end = _nothing

    def _open_sockets(self) -> None:
        """The server's socket and one per player (each player's address is its socket's)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = len(self.players) + 64
        if soft < wanted:
            if hard != resource.RLIM_INFINITY and hard < wanted:
                raise SystemExit(f"tick_cost: {len(self.players)} players need {wanted} open "
                                 f"files; the limit is {hard}")
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        self.server_socket = server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("127.0.0.1", 0))
        server.setblocking(False)
        self.io = BatchSocket(server.fileno(), max_datagrams=IN_PLACE_BATCH)
        self.io.set_admission(self.endpoint, in_place=True)
        for player in self.players:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.2", 0))
            sock.connect(server.getsockname())
            self.player_sockets.append(sock)
            player.address = sock.getsockname()

    def close(self) -> None:
        for sock in self.player_sockets + [self.server_socket]:
            if sock is not None:
                sock.close()
        self.server_socket, self.player_sockets = None, []

    def _server_call(self, call, timed: bool) -> float:
        """``call()`` as a server call of the tick (between server_calls_begin and _end when
        ``timed``); the server's CPU time for it."""
        if timed:
            self.server_calls_begin()
        t0 = time.process_time()
        call()
        spent = time.process_time() - t0
        if timed:
            self.server_calls_end()
        return spent

    def _receive(self, arrival: float, timed: bool) -> float:
        """The players' datagrams to the server; the server's CPU time for taking them."""
        if self.io is not None:
            return self._receive_in_place(arrival, timed)
        batch = self._client_datagrams(arrival)
        return self._server_call(lambda: self.endpoint.receive_batch(batch, arrival), timed)

    def _receive_in_place(self, arrival: float, timed: bool) -> float:
        """The players' datagrams through the loopback socket, read as the server reads them
        after each IN_PLACE_CHUNK (less than a default socket buffer holds); the server's CPU
        time for the reads."""
        spent, waiting = 0.0, 0
        for player, sock in zip(self.players, self.player_sockets):
            for data, _ in player.endpoint.datagrams_to_send(arrival):
                sock.send(data)
                waiting += 1
            if waiting >= IN_PLACE_CHUNK:
                spent += self._server_call(lambda: self._read(arrival), timed)
                waiting = 0
        if waiting:
            spent += self._server_call(lambda: self._read(arrival), timed)
        return spent

    def _read(self, arrival: float) -> None:
        """What waits on the server's socket, as the server's driver reads it."""
        io = self.io
        assert io is not None
        while True:
            before = io.datagrams_read
            rest = io.recv(-1, arrival)
            if rest:
                self.endpoint.receive_batch(rest, arrival)
            if io.datagrams_read == before:
                break

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
        received = self._receive(arrival, timed)
        if timed:
            self.server_calls_begin()
        t1 = clock()
        server.on_datagrams(arrival)
        t2 = clock()
        self.now += self.interval
        server.tick(self.now)
        t3 = clock()
        out = (endpoint.datagrams_to_send(self.now) if self.io is None
               else self.io.flush_in_place(self.now))
        t4 = clock()
        if timed:
            self.server_calls_end()
            totals = self.totals
            totals["receive"] += received
            totals["events"] += t2 - t1
            totals["tick"] += t3 - t2
            totals["flush"] += t4 - t3
            self.player_ticks += len(self.players)
        if self.io is not None:
            out = out + self.io.outbox_datagrams(0)
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
                "frames_expected": ticks * len(self.players), "us_per_player_tick": per,
                # In place: the datagrams the server took in its receive buffer (warm-up too).
                "datagrams_in_place": None if self.io is None else self.io.taken_in_place}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=768, help="players, in rooms of 8 (default 768)")
    parser.add_argument("--ticks", type=int, default=300, help="measured ticks per run (default 300)")
    parser.add_argument("--warmup", type=int, default=60, help="ticks before measuring (default 60)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (default 3)")
    parser.add_argument("--in-place", action="store_true",
                        help="datagrams through a loopback socket, as relay serve takes them "
                             "(the receive phase then includes the kernel's)")
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
        harness = Harness(args.players, in_place=args.in_place)
        try:
            runs.append(harness.run(args.ticks, args.warmup))
        finally:
            harness.close()
    best = min(runs, key=lambda r: r["us_per_player_tick"]["total"])
    lost = best["frames_expected"] - best["frames_received"]
    kernel = "the kernel's receive included" if args.in_place else "no kernel"
    print(f"tick cost: {best['players']} players, {best['ticks']} ticks, best of {args.repeat} "
          f"(server CPU only, {kernel}; frames short {lost})")
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
