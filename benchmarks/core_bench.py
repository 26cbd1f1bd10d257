#!/usr/bin/env python3
"""Throughput of the compiled protocol core (relay_core) on a frame-sync workload.

One room: a server endpoint and N client endpoints (default 8) connected in memory. Every
simulated 30 Hz tick the server sends one 40-byte frame to every client and every client sends one
16-byte input to the server, both on the ``redundant`` channel (1). The simulated clock is not
paced: ticks run back to back as fast as the machine allows.

  1. direct   no loss; once per tick every endpoint runs handle_timeout + datagrams_to_send and
              each datagram is handed straight to its receiver at the same simulated time.
  1s. sealed  as 1, in token mode: every DATA packet sealed with ChaCha20-Poly1305 (the same
              room, clients connecting with connect tokens); prints datagrams/s of both and the
              ratio sealed / open.
  2. lossy    every datagram through relay_core.simlink.LossyLink (10% loss, 20 ms +-10 ms per
              direction, seeded) on a 1 ms simulated grid; at the end every frame and input must
              have been delivered exactly once and in order (PASS/FAIL, exit status 1 on FAIL).
  +  a pure-Python reference (struct pack/unpack of the 20-byte DATA header) measured in the same
     run, so the core's cost per packet can be quoted as a ratio on a noisy machine.

Figures are printed (and written as JSON with --json); they are never asserted on by tests.
Run:  python3 benchmarks/core_bench.py [--seconds 5] [--players 8] [--seed 1] [--ticks N]
                                       [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import heapq
import json
import math
import os
import platform
import statistics
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import relay_core  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:     # run from a source checkout with the core built in place
    sys.path.insert(0, ROOT)
if ROOT not in sys.path:
    sys.path.append(ROOT)   # for benchmarks.machine

import importlib.machinery  # noqa: E402

from relay_core import (  # noqa: E402
    Endpoint, EndpointConfig, MessageReceived, PeerConnected, PeerDisconnected, decode_packet,
)
from relay_core import endpoint as _endpoint_module  # noqa: E402
from relay_core.simlink import LinkProfile, LossyLink  # noqa: E402
from relay_core.token import mint_token  # noqa: E402

from benchmarks.machine import cpu_model, usable_cores  # noqa: E402

TICK_HZ = 30
CHANNEL = 1                     # "redundant" in the default channel set
FRAME_SIZE = 40                 # server -> client, one per client per tick
INPUT_SIZE = 16                 # client -> server, one per client per tick
SERVER_ADDRESS = ("10.0.0.1", 7777)
WARMUP_TICKS = 60               # untimed, after the handshake: RTT and acks settle
CENSUS_TICKS = 150              # untimed, every datagram decoded to count records
FIRST_CHUNK_TICKS = 10          # timing chunks start this long and double up to ~MIN_CHUNK_WALL
MIN_CHUNK_WALL = 0.05           # seconds; the min/median/max spread is over chunks at least this long
REF_BURST = 1000                # struct pack + unpack pairs measured after every timed chunk

U32 = struct.Struct("<I")
FRAME_PAD = bytes(range(FRAME_SIZE - 4))
INPUT_PAD = bytes(range(100, 100 + INPUT_SIZE - 4))
# The DATA header as a pure-Python codec would see it: magic(2) version type session seq ack
# ack_bits send_time echo_time.
HEADER = struct.Struct("<2sBBIHHIHH")
assert HEADER.size == 20


# -- machine ------------------------------------------------------------------------------------

def machine_info() -> dict:
    cpu = cpu_model()
    usable = usable_cores()
    try:
        import Cython
        cython = Cython.__version__
    except ImportError:
        cython = "not importable"
    try:
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        load = "unknown"
    path = _endpoint_module.__file__
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cython": cython,
        "relay_core": path,
        "compiled": path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)),
        "platform": platform.platform(),
        "loadavg_at_start": load,
        "gc_enabled": gc.isenabled(),
    }


# -- room ---------------------------------------------------------------------------------------

def client_address(i: int) -> tuple:
    return (f"10.0.{1 + i // 250}.{1 + i % 250}", 40000 + i)


class Room:
    """A server and ``players`` clients, handshake done in memory (no loss, 1 ms steps)."""

    def __init__(self, players: int, seed: int, ack_delay: float, sealed: bool = False):
        self.players = players
        # sealed: token mode, every DATA packet sealed (the default encrypt_packets=True)
        keys = {1: bytes(range(32))} if sealed else None
        self.server = Endpoint(EndpointConfig(accept_connections=True, seed=seed, ack_delay=ack_delay,
                                              token_keys=keys), unix_offset=0.0)
        self.clients = [Endpoint(EndpointConfig(seed=seed + 1 + i, ack_delay=ack_delay))
                        for i in range(players)]
        self.addresses = [client_address(i) for i in range(players)]
        self.index_of = {address: i for i, address in enumerate(self.addresses)}
        self.now = 0.0
        tokens = [mint_token(keys[1], 1, "bench", f"p{i}", 3600.0, now=0.0) if sealed else None
                  for i in range(players)]
        self.to_server = [c.connect(SERVER_ADDRESS, self.now, t) for c, t in zip(self.clients, tokens)]
        self.on_server = [0] * players      # server-side peer id of client i
        self._handshake()
        self.tick_base = self.now + 0.001  # simulated time of tick 0 in the direct scenario

    def _handshake(self) -> None:
        server, clients = self.server, self.clients
        connected = [False] * self.players
        server_side = 0
        for _ in range(5000):
            now = self.now
            for i, c in enumerate(clients):
                c.handle_timeout(now)
                for data, _address in c.datagrams_to_send(now):
                    server.receive(data, self.addresses[i], now)
            server.handle_timeout(now)
            for data, address in server.datagrams_to_send(now):
                clients[self.index_of[address]].receive(data, SERVER_ADDRESS, now)
            while (event := server.next_event()) is not None:
                if isinstance(event, PeerConnected):
                    self.on_server[self.index_of[event.address]] = event.peer_id
                    server_side += 1
            for i, c in enumerate(clients):
                while (event := c.next_event()) is not None:
                    if isinstance(event, PeerConnected):
                        connected[i] = True
            if server_side == self.players and all(connected):
                return
            self.now += 0.001
        raise RuntimeError("handshake did not complete in 5 simulated seconds")

    def stats(self) -> dict:
        """Counters summed per direction: 'down' server -> clients, 'up' clients -> server."""
        down = [self.server.peer_stats(pid) for pid in self.on_server]
        up = [c.peer_stats(pid) for c, pid in zip(self.clients, self.to_server)]
        out = {}
        for name, side in (("down", down), ("up", up)):
            out[name] = {
                "packets_sent": sum(s.packets_sent for s in side),
                "bytes_sent": sum(s.bytes_sent for s in side),
                "messages_sent": sum(s.messages_sent for s in side),
                "redundant_bytes": sum(s.redundant_bytes for s in side),
                "resends": sum(s.resends for s in side),
                "packets_lost": sum(s.packets_lost for s in side),
                "queued_messages": sum(s.queued_messages for s in side),
                # duplicates suppressed by the *receivers* of this direction
                "duplicate_messages": sum(s.duplicate_messages for s in (up if name == "down" else down)),
                "rtt_ms_mean": 1000.0 * sum(s.rtt for s in side) / len(side),
                "loss_estimate_mean": sum(s.loss for s in side) / len(side),
            }
        return out


def stats_delta(after: dict, before: dict) -> dict:
    out = {}
    for direction in after:
        out[direction] = {}
        for key, value in after[direction].items():
            if key.endswith("_mean") or key == "queued_messages":
                out[direction][key] = value          # a level, not a counter
            else:
                out[direction][key] = value - before[direction][key]
    return out


class Checker:
    """Exactly-once, in-order check: payloads carry their tick number in the first 4 bytes."""

    def __init__(self, players: int):
        self.next_frame = [0] * players     # per client: next frame number expected
        self.next_input = [0] * players     # per client: next input number expected at the server
        self.errors: list[str] = []
        self.disconnects: list = []

    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)
        else:
            self.errors[-1] = "... more errors"

    def verify(self, frames_sent: int, inputs_sent: int) -> list[str]:
        problems = list(self.errors)
        for i, n in enumerate(self.next_frame):
            if n != frames_sent:
                problems.append(f"client {i}: delivered frames 0..{n - 1}, sent 0..{frames_sent - 1}")
        for i, n in enumerate(self.next_input):
            if n != inputs_sent:
                problems.append(f"server: delivered inputs 0..{n - 1} of client {i}, "
                                f"sent 0..{inputs_sent - 1}")
        problems.extend(f"disconnect: {d!r}" for d in self.disconnects)
        return problems


class Census:
    """Decodes datagrams (untimed phase) to count message records per datagram."""

    def __init__(self):
        self.seen = set()
        self.per_direction = {d: {"datagrams": 0, "bytes": 0, "message_records": 0, "copies": 0,
                                  "empty": 0} for d in ("down", "up")}

    def __call__(self, direction: str, data: bytes) -> None:
        packet = decode_packet(data)
        counts = self.per_direction[direction]
        counts["datagrams"] += 1
        counts["bytes"] += len(data)
        messages = [r for r in packet.get("records", ()) if r["kind"] == "message"]
        if not messages:
            counts["empty"] += 1
        for r in messages:
            key = (direction, packet["session_id"], r["channel"], r["msg_id"], r["payload"])
            counts["message_records"] += 1
            if key in self.seen:
                counts["copies"] += 1       # a piggybacked redundant copy or an RTO resend
            else:
                self.seen.add(key)

    def summary(self) -> dict:
        out = {}
        total = {"datagrams": 0, "bytes": 0, "message_records": 0, "copies": 0, "empty": 0}
        for direction, counts in self.per_direction.items():
            for key in total:
                total[key] += counts[key]
            out[direction] = dict(counts)
        out["all"] = total
        for counts in out.values():
            n = max(counts["datagrams"], 1)
            counts["messages_per_datagram"] = counts["message_records"] / n
            counts["copies_per_datagram"] = counts["copies"] / n
            counts["avg_datagram_bytes"] = counts["bytes"] / n
        return out


# -- timing -------------------------------------------------------------------------------------

def reference_burst(n: int = REF_BURST) -> float:
    """ns per packet of the pure-Python reference: (one header pack + one unpack) / 2."""
    pack, unpack, perf = HEADER.pack, HEADER.unpack, time.perf_counter
    t0 = perf()
    for seq in range(n):
        unpack(pack(b"RL", 1, 6, 0x12345678, seq, seq, 0xFFFFFFFF, seq, seq))
    return 1e9 * (perf() - t0) / (2 * n)


class Timer:
    """perf_counter and process_time per chunk of ticks, with a reference burst after each chunk
    (outside the timed region) so that the core can be quoted as a ratio to pure Python measured
    at the same moment on a noisy, shared machine."""

    def __init__(self):
        self.chunks: list[tuple[float, float, int, float]] = []    # (wall, cpu, packets, ref ns)
        self.wall = 0.0
        self.cpu = 0.0
        self.chunk_ticks = FIRST_CHUNK_TICKS

    def add(self, wall: float, cpu: float, packets: int) -> None:
        self.chunks.append((wall, cpu, packets, reference_burst()))
        self.wall += wall
        self.cpu += cpu
        if wall < MIN_CHUNK_WALL and self.chunk_ticks < 1 << 16:
            self.chunk_ticks *= 2

    def spread(self) -> dict:
        rates = sorted(p / w for w, _c, p, _r in self.chunks if w > 0 and p)
        if not rates:
            return {"min": 0.0, "median": 0.0, "max": 0.0, "chunks": 0}
        return {"min": rates[0], "median": statistics.median(rates), "max": rates[-1],
                "chunks": len(rates)}

    def reference(self) -> dict:
        refs = [r for *_x, r in self.chunks]
        ratios = [1e9 * w / p / r for w, _c, p, r in self.chunks if p]
        return {"ref_ns_median": statistics.median(refs) if refs else float("nan"),
                "ratio_median": statistics.median(ratios) if ratios else float("nan")}


# -- scenario 1: direct delivery, no loss ---------------------------------------------------------

def run_direct(room: Room, checker: Checker, first_tick: int, ticks: int, seconds: float,
               timer: Timer | None, tap=None) -> dict:
    """Run ticks [first_tick, ...) back to back; with ``timer``, stop once ``seconds`` of wall
    time are spent (or after ``ticks`` ticks when ticks > 0). Returns counts."""
    server, clients = room.server, room.clients
    addresses, index_of = room.addresses, room.index_of
    srv_send, srv_recv, srv_next = server.send, server.receive, server.next_event
    srv_timeout, srv_flush = server.handle_timeout, server.datagrams_to_send
    srv_peers = list(room.on_server)
    client_of_peer = {pid: i for i, pid in enumerate(room.on_server)}
    client_io = [(c.send, pid, c.handle_timeout, c.datagrams_to_send) for c, pid in zip(clients, room.to_server)]
    client_recv = [c.receive for c in clients]
    client_next = [c.next_event for c in clients]
    next_frame, next_input = checker.next_frame, checker.next_input
    unpack_from = U32.unpack_from
    message_type = MessageReceived
    perf, proc = time.perf_counter, time.process_time
    base = room.tick_base
    encoded = decoded = delivered = refused = 0
    k = first_tick
    stop_tick = first_tick + ticks if ticks > 0 else None
    while True:
        if timer is not None:
            chunk_packets = encoded + decoded
            w0, c0 = perf(), proc()
        for _ in range(timer.chunk_ticks if timer is not None else ticks):
            now = base + k / TICK_HZ
            frame = U32.pack(k) + FRAME_PAD
            for pid in srv_peers:
                if not srv_send(pid, CHANNEL, frame):
                    refused += 1
            inp = U32.pack(k) + INPUT_PAD
            for c_send, pid, _t, _f in client_io:
                if not c_send(pid, CHANNEL, inp):
                    refused += 1
            srv_timeout(now)
            down = srv_flush(now)
            ups = []
            for _s, _p, c_timeout, c_flush in client_io:
                c_timeout(now)
                ups.append(c_flush(now))
            encoded += len(down)
            for data, address in down:
                client_recv[index_of[address]](data, SERVER_ADDRESS, now)
            decoded += len(down)
            for i, up in enumerate(ups):
                encoded += len(up)
                decoded += len(up)
                address = addresses[i]
                for data, _address in up:
                    srv_recv(data, address, now)
            if tap is not None:
                for data, _address in down:
                    tap("down", data)
                for up in ups:
                    for data, _address in up:
                        tap("up", data)
            while (event := srv_next()) is not None:
                if type(event) is message_type:
                    i = client_of_peer[event.peer_id]
                    n = unpack_from(event.payload)[0]
                    if n != next_input[i]:
                        checker.error(f"server: input {n} from client {i}, expected {next_input[i]}")
                    next_input[i] = n + 1
                    delivered += 1
                elif type(event) is PeerDisconnected:
                    checker.disconnects.append(event)
            for i, c_next in enumerate(client_next):
                while (event := c_next()) is not None:
                    if type(event) is message_type:
                        n = unpack_from(event.payload)[0]
                        if n != next_frame[i]:
                            checker.error(f"client {i}: frame {n}, expected {next_frame[i]}")
                        next_frame[i] = n + 1
                        delivered += 1
                    elif type(event) is PeerDisconnected:
                        checker.disconnects.append(event)
            k += 1
            if stop_tick is not None and k >= stop_tick:
                break
        if timer is None:
            break
        timer.add(perf() - w0, proc() - c0, encoded + decoded - chunk_packets)
        if (k >= stop_tick) if stop_tick is not None else (timer.wall >= seconds):
            break
    room.now = base + (k - 1) / TICK_HZ
    return {"ticks": k - first_tick, "encoded": encoded, "decoded": decoded,
            "delivered": delivered, "refused_sends": refused, "next_tick": k}


# -- scenario 2: lossy links on a 1 ms grid -------------------------------------------------------

def ceil_ms(t: float) -> int:
    """First millisecond m with m / 1000.0 >= t (the grid step at which t is due)."""
    m = math.ceil(t * 1000.0)
    if m / 1000.0 < t:
        m += 1
    elif (m - 1) / 1000.0 >= t:
        m -= 1
    return m


class LossyRoom:
    """The room with a LossyLink per client per direction, driven on a 1 ms simulated grid.

    Each millisecond: due link arrivals are received, tick sends are queued (every 1/30 s),
    then every endpoint that received, sent or has a timer due runs handle_timeout and
    datagrams_to_send and has its events drained. Milliseconds at which nothing is due are
    skipped: the core would do nothing at them (this is a 1 ms event loop driven by
    next_timeout(), not a poll of every endpoint every millisecond).
    """

    INF = 1 << 62

    def __init__(self, room: Room, profile: LinkProfile, seed: int):
        self.room = room
        n = room.players
        self.down = [LossyLink(profile, seed * 1000 + 2 * i + 1) for i in range(n)]
        self.up = [LossyLink(profile, seed * 1000 + 2 * i + 2) for i in range(n)]
        self.links = self.down + self.up            # link j: down i = j, up i = n + j
        self.scheduled = [self.INF] * (2 * n)       # ms of each link's pending wake entry
        self.wake: list[tuple[int, int]] = []
        self.deadline_ms = [self.INF] * (n + 1)     # endpoint 0 = server, 1 + i = client i
        self.ms = ceil_ms(room.now) + 1
        self.base_ms = self.ms                       # tick k happens at base_ms + ceil(k*1000/30)
        self.touched = [True] * (n + 1)             # received or queued since last serviced

    def tick_ms(self, k: int) -> int:
        return self.base_ms + (k * 1000 + TICK_HZ - 1) // TICK_HZ

    def run(self, checker: Checker, first_tick: int, ticks: int, seconds: float,
            timer: Timer | None, tap=None, send: bool = True, drain_limit_ms: int = 0) -> dict:
        """Run ticks [first_tick, ...): ``ticks`` of them, or with a timer as many as fit in
        ``seconds`` of wall time. With send=False, no new messages: run until every sent frame
        and input is delivered or ``drain_limit_ms`` simulated ms pass."""
        room = self.room
        server, clients, n = room.server, room.clients, room.players
        endpoints = [server] + clients
        addresses = room.addresses
        index_of = room.index_of
        client_of_peer = {pid: i for i, pid in enumerate(room.on_server)}
        srv_peers = list(room.on_server)
        next_frame, next_input = checker.next_frame, checker.next_input
        links = self.links
        scheduled, wake, deadline_ms = self.scheduled, self.wake, self.deadline_ms
        unpack_from = U32.unpack_from
        message_type = MessageReceived
        heappush, heappop = heapq.heappush, heapq.heappop
        perf, proc = time.perf_counter, time.process_time
        INF = self.INF
        encoded = decoded = delivered = refused = 0
        core_wall = 0.0                 # wall time inside relay_core calls (and the event check)
        touched = self.touched
        k = first_tick
        stop_tick = first_tick + ticks if ticks > 0 else None
        next_tick_ms = self.tick_ms(k) if send else INF
        ms = self.ms
        end_ms = ms + drain_limit_ms
        chunk_start_tick = k
        if timer is not None:
            chunk_packets, w0, c0 = 0, perf(), proc()
        frames_target = inputs_target = 0
        if not send:
            frames_target = inputs_target = first_tick
        while True:
            # -- choose the next millisecond with something due
            nxt = next_tick_ms
            if wake and wake[0][0] < nxt:
                nxt = wake[0][0]
            d = min(deadline_ms)
            if d < nxt:
                nxt = d
            if not send:
                if (all(f == frames_target for f in next_frame)
                        and all(f == inputs_target for f in next_input)):
                    break
                if nxt >= end_ms:
                    break
            ms = nxt if nxt > ms else ms + 1
            now = ms / 1000.0
            # -- arrivals
            while wake and wake[0][0] <= ms:
                at, j = heappop(wake)
                if scheduled[j] != at:
                    continue                    # superseded entry
                scheduled[j] = INF
                link = links[j]
                arrivals = link.arrivals(now)
                t0 = perf()
                if j < n:
                    receive = clients[j].receive
                    for data in arrivals:
                        receive(data, SERVER_ADDRESS, now)
                    touched[1 + j] = True
                else:
                    receive = server.receive
                    address = addresses[j - n]
                    for data in arrivals:
                        receive(data, address, now)
                    touched[0] = True
                core_wall += perf() - t0
                decoded += len(arrivals)
                na = link.next_arrival()
                if na is not None:
                    at = ceil_ms(na)
                    scheduled[j] = at
                    heappush(wake, (at, j))
            # -- the 30 Hz tick
            if ms >= next_tick_ms:
                t0 = perf()
                frame = U32.pack(k) + FRAME_PAD
                for pid in srv_peers:
                    if not server.send(pid, CHANNEL, frame):
                        refused += 1
                inp = U32.pack(k) + INPUT_PAD
                for i, c in enumerate(clients):
                    if not c.send(room.to_server[i], CHANNEL, inp):
                        refused += 1
                core_wall += perf() - t0
                for e in range(n + 1):
                    touched[e] = True
                k += 1
                next_tick_ms = self.tick_ms(k)
                tick_done = True
            else:
                tick_done = False
            # -- service endpoints that received, were sent to, or have a timer due
            for e in range(n + 1):
                if not touched[e] and deadline_ms[e] > ms:
                    continue
                touched[e] = False
                ep = endpoints[e]
                t0 = perf()
                ep.handle_timeout(now)
                out = ep.datagrams_to_send(now)
                core_wall += perf() - t0
                encoded += len(out)
                for data, address in out:
                    j = index_of[address] if e == 0 else n + e - 1
                    if tap is not None:
                        tap("down" if e == 0 else "up", data)
                    link = links[j]
                    link.send(data, now)
                    na = link.next_arrival()
                    if na is not None:
                        at = ceil_ms(na)
                        if at < scheduled[j]:
                            scheduled[j] = at
                            heappush(wake, (at, j))
                t0 = perf()
                while (event := ep.next_event()) is not None:
                    if type(event) is message_type:
                        payload = event.payload
                        m = unpack_from(payload)[0]
                        if e == 0:
                            i = client_of_peer[event.peer_id]
                            if m != next_input[i]:
                                checker.error(f"server: input {m} from client {i}, expected {next_input[i]}")
                            next_input[i] = m + 1
                        else:
                            i = e - 1
                            if m != next_frame[i]:
                                checker.error(f"client {i}: frame {m}, expected {next_frame[i]}")
                            next_frame[i] = m + 1
                        delivered += 1
                    elif type(event) is PeerDisconnected:
                        checker.disconnects.append(event)
                t = ep.next_timeout()
                core_wall += perf() - t0
                if t is None:
                    deadline_ms[e] = INF
                else:
                    at = ceil_ms(t)
                    deadline_ms[e] = at if at > ms else ms + 1
            # -- end of the millisecond: chunk timing and the stop condition (after the tick's
            # sends were flushed, so nothing queued is left behind for the next run)
            if tick_done:
                done = stop_tick is not None and k >= stop_tick
                if timer is not None and (done or k - chunk_start_tick >= timer.chunk_ticks):
                    packets = encoded + decoded
                    timer.add(perf() - w0, proc() - c0, packets - chunk_packets)
                    chunk_packets, chunk_start_tick = packets, k
                    if done or (stop_tick is None and timer.wall >= seconds):
                        break
                    w0, c0 = perf(), proc()
                elif done:
                    break
        self.ms = ms
        room.now = ms / 1000.0
        return {"ticks": k - first_tick, "encoded": encoded, "decoded": decoded,
                "delivered": delivered, "refused_sends": refused, "next_tick": k,
                "core_wall": core_wall, "simulated_ms": ms}


# -- reference ----------------------------------------------------------------------------------

def python_reference(seconds: float) -> dict:
    """struct pack + unpack of the 20-byte DATA header: what a pure-Python codec pays per packet
    before doing any protocol work at all."""
    pack, unpack = HEADER.pack, HEADER.unpack
    perf, proc = time.perf_counter, time.process_time
    packed = pack(b"RL", 1, 6, 0x12345678, 1, 2, 0xFFFFFFFF, 3, 4)
    n = 20000
    results = {"pack": [], "unpack": []}
    end = perf() + seconds
    while perf() < end:
        w0, c0 = perf(), proc()
        for seq in range(n):
            pack(b"RL", 1, 6, 0x12345678, seq, seq, 0xFFFFFFFF, seq, seq)
        results["pack"].append(((perf() - w0) / n, (proc() - c0) / n))
        w0, c0 = perf(), proc()
        for _ in range(n):
            unpack(packed)
        results["unpack"].append(((perf() - w0) / n, (proc() - c0) / n))
    out = {}
    for op, samples in results.items():
        out[op + "_ns"] = 1e9 * statistics.median(w for w, _c in samples)
        out[op + "_cpu_ns"] = 1e9 * statistics.median(c for _w, c in samples)
    out["per_packet_ns"] = (out["pack_ns"] + out["unpack_ns"]) / 2
    out["per_packet_cpu_ns"] = (out["pack_cpu_ns"] + out["unpack_cpu_ns"]) / 2
    return out


# -- report -------------------------------------------------------------------------------------

def figures(counts: dict, timer: Timer, stats: dict, census: dict, players: int) -> dict:
    wall, cpu = timer.wall, timer.cpu
    enc, dec = counts["encoded"], counts["decoded"]
    processed = enc + dec
    sent_packets = stats["down"]["packets_sent"] + stats["up"]["packets_sent"]
    sent_bytes = stats["down"]["bytes_sent"] + stats["up"]["bytes_sent"]
    reference = timer.reference()
    return {
        "ticks": counts["ticks"],
        "simulated_seconds": counts["ticks"] / TICK_HZ,
        "wall_s": wall,
        "cpu_s": cpu,
        "encoded": enc,
        "decoded": dec,
        "delivered": counts["delivered"],
        "packets_encoded_per_s": enc / wall,
        "packets_decoded_per_s": dec / wall,
        "packets_processed_per_s": processed / wall,
        "packets_processed_per_cpu_s": processed / cpu if cpu > 0 else float("nan"),
        "chunk_processed_per_s": timer.spread(),
        "messages_delivered_per_s": counts["delivered"] / wall,
        "us_per_packet": 1e6 * wall / processed,
        "cpu_us_per_packet": 1e6 * cpu / processed,
        "reference_ns_alongside": reference["ref_ns_median"],
        "ratio_to_reference": reference["ratio_median"],
        "datagrams_per_link_per_tick": enc / (counts["ticks"] * players * 2),
        "avg_datagram_bytes": sent_bytes / sent_packets if sent_packets else 0.0,
        "messages_per_datagram": census["all"]["messages_per_datagram"],
        "copies_per_datagram": census["all"]["copies_per_datagram"],
        "stats_packets_sent": sent_packets,
        "refused_sends": counts["refused_sends"],
        "peer_stats": stats,
        "census": census,
    }


def k_(x: float) -> str:
    return f"{x / 1000:,.1f}k"


def print_figures(f: dict) -> None:
    spread = f["chunk_processed_per_s"]
    print(f"  ticks run           {f['ticks']:,} ({f['simulated_seconds']:,.0f} simulated s)  "
          f"wall {f['wall_s']:.2f} s  cpu {f['cpu_s']:.2f} s  (cpu/wall {f['cpu_s'] / f['wall_s']:.2f})")
    print(f"  packets encoded/s   {k_(f['packets_encoded_per_s'])}   ({f['encoded']:,} from datagrams_to_send)")
    print(f"  packets decoded/s   {k_(f['packets_decoded_per_s'])}   ({f['decoded']:,} receive() calls)")
    print(f"  packets processed/s {k_(f['packets_processed_per_s'])} wall, "
          f"{k_(f['packets_processed_per_cpu_s'])} per cpu-s   "
          f"[{spread['chunks']} chunks: min {k_(spread['min'])} / median {k_(spread['median'])} "
          f"/ max {k_(spread['max'])}]")
    print(f"  messages delivered/s {k_(f['messages_delivered_per_s'])}   ({f['delivered']:,} MessageReceived)")
    print(f"  us per packet       {f['us_per_packet']:.2f} wall, {f['cpu_us_per_packet']:.2f} cpu   "
          f"(= {f['ratio_to_reference']:.1f}x the Python header reference, "
          f"{f['reference_ns_alongside']:.0f} ns, measured between chunks)")
    census = f["census"]
    print(f"  datagrams per tick  {f['datagrams_per_link_per_tick']:.2f} per client per direction "
          f"(1 message each way per tick is sent)")
    print(f"  avg datagram size   {f['avg_datagram_bytes']:.1f} B   "
          f"(down {census['down']['avg_datagram_bytes']:.1f} B, up {census['up']['avg_datagram_bytes']:.1f} B; "
          f"incl. 20 B header)")
    print(f"  messages/datagram   {f['messages_per_datagram']:.2f}   of which copies "
          f"(piggybacked redundant or resent) {f['copies_per_datagram']:.2f}   "
          f"[down {census['down']['messages_per_datagram']:.2f}/{census['down']['copies_per_datagram']:.2f}, "
          f"up {census['up']['messages_per_datagram']:.2f}/{census['up']['copies_per_datagram']:.2f}; "
          f"{census['all']['empty']} of {census['all']['datagrams']} carried no message; "
          f"census of {CENSUS_TICKS} untimed ticks]")
    for direction, label in (("down", "server->clients"), ("up", "clients->server")):
        s = f["peer_stats"][direction]
        print(f"  peer_stats {label:15s} packets {s['packets_sent']:,}  bytes {s['bytes_sent']:,}  "
              f"redundant bytes {s['redundant_bytes']:,}  resends {s['resends']:,}  "
              f"lost {s['packets_lost']:,}  dup msgs at receiver {s['duplicate_messages']:,}  "
              f"srtt {s['rtt_ms_mean']:.1f} ms")
    if f["refused_sends"]:
        print(f"  WARNING: send() refused {f['refused_sends']:,} messages (queue full)")
    if f["stats_packets_sent"] != f["encoded"]:
        print(f"  note: peer_stats counted {f['stats_packets_sent']:,} packets sent, "
              f"the benchmark {f['encoded']:,}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="wall-clock seconds of timed ticks per scenario (default 5)")
    parser.add_argument("--players", type=int, default=8, help="clients in the room (default 8)")
    parser.add_argument("--seed", type=int, default=1, help="seed for endpoints and links (default 1)")
    parser.add_argument("--ticks", type=int, default=0,
                        help="run exactly this many timed ticks per scenario instead of --seconds "
                             "(reproducible lossy run)")
    parser.add_argument("--ack-delay", type=float, default=1 / 30,
                        help="every endpoint's ack_delay in seconds (default one tick, 1/30: acks "
                             "ride on the next tick's datagram, as a tick-driven relay runs it)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = parser.parse_args(argv)
    if args.players < 1 or args.seconds <= 0 or args.ticks < 0:
        parser.error("--players >= 1, --seconds > 0, --ticks >= 0")

    machine = machine_info()
    print("relay_core benchmark (benchmarks/core_bench.py) -- figures only, never asserted on")
    print(f"  cpu        {machine['cpu']}  ({machine['cores']} cores, {machine['usable_cores']} usable)")
    print(f"  python     {machine['python']}   cython {machine['cython']}")
    print(f"  relay_core {machine['relay_core']}  ({'compiled' if machine['compiled'] else 'NOT COMPILED'})")
    print(f"  platform   {machine['platform']}   loadavg {machine['loadavg_at_start']}   "
          f"gc {'on' if machine['gc_enabled'] else 'off'}")
    print(f"  run        --seconds {args.seconds:g} --players {args.players} --seed {args.seed}"
          f" --ack-delay {args.ack_delay:.4f}" + (f" --ticks {args.ticks}" if args.ticks else ""))
    print()

    ref = python_reference(0.3)
    print("Pure-Python reference (NOT the core; for ratios): struct.pack / struct.unpack of the 20-byte "
          "DATA header")
    print(f"  pack {ref['pack_ns']:.0f} ns, unpack {ref['unpack_ns']:.0f} ns  "
          f"(cpu {ref['pack_cpu_ns']:.0f} / {ref['unpack_cpu_ns']:.0f} ns); reference per packet = "
          f"(pack + unpack) / 2 = {ref['per_packet_ns']:.0f} ns. A {REF_BURST}-pair burst is re-measured "
          f"after every timed chunk below and the ratios use those.")
    print()

    results = {"machine": machine, "args": vars(args), "reference": ref}
    failed = False

    # -- 1: direct
    print(f"1. direct: {args.players} clients, 30 Hz, {FRAME_SIZE} B frame down + {INPUT_SIZE} B "
          f"input up per client per tick on the redundant channel, no loss, delivered at once")
    room = Room(args.players, args.seed, args.ack_delay)
    checker = Checker(args.players)
    state = run_direct(room, checker, 0, WARMUP_TICKS, 0, None)
    before = room.stats()
    timer = Timer()
    counts = run_direct(room, checker, state["next_tick"], args.ticks, args.seconds, timer)
    stats = stats_delta(room.stats(), before)
    census = Census()
    state = run_direct(room, checker, counts["next_tick"], CENSUS_TICKS, 0, None, tap=census)
    sent = state["next_tick"]
    # frames sent at the last tick are delivered in that tick: nothing is in flight
    problems = checker.verify(sent, sent)
    direct = figures(counts, timer, stats, census.summary(), args.players)
    direct["verify"] = problems
    print_figures(direct)
    resends = stats["down"]["resends"] + stats["up"]["resends"]
    messages = stats["down"]["messages_sent"] + stats["up"]["messages_sent"]
    if resends > messages // 2:
        print(f"  note                {resends:,} RTO resends for {messages:,} messages with no loss: the "
              f"ack rides on the peer's next tick datagram, 1/30 s later, and the RTO is "
              f"{1000 * room.server.peer_stats(room.on_server[0]).rto:.0f} ms (--ack-delay below a "
              f"tick); the copies counted above are these resends, not redundant piggybacks")
    print(f"  check               {'PASS' if not problems else 'FAIL'}: every frame and input "
          f"delivered exactly once, in order ({sent:,} ticks incl. warm-up and census)")
    for p in problems[:10]:
        print(f"    {p}")
    failed |= bool(problems)
    results["direct"] = direct
    print()

    # -- 1s: direct, sealed
    print("1s. sealed: as 1, in token mode: every DATA packet sealed with ChaCha20-Poly1305 "
          "(16 B tag), keys from connect tokens")
    room = Room(args.players, args.seed, args.ack_delay, sealed=True)
    assert room.server.session_info(room.on_server[0])["encrypted"]
    checker = Checker(args.players)
    state = run_direct(room, checker, 0, WARMUP_TICKS, 0, None)
    timer = Timer()
    counts = run_direct(room, checker, state["next_tick"], args.ticks, args.seconds, timer)
    sent = counts["next_tick"]
    problems = checker.verify(sent, sent)
    processed = counts["encoded"] + counts["decoded"]
    sealed = {"ticks": counts["ticks"], "wall_s": timer.wall, "cpu_s": timer.cpu,
              "packets_processed_per_s": processed / timer.wall,
              "us_per_packet": 1e6 * timer.wall / processed,
              "chunk_processed_per_s": timer.spread(),
              "ratio_to_open": (processed / timer.wall) / direct["packets_processed_per_s"],
              "verify": problems}
    spread = sealed["chunk_processed_per_s"]
    print(f"  ticks run           {counts['ticks']:,}  wall {timer.wall:.2f} s  cpu {timer.cpu:.2f} s")
    print(f"  datagrams/s         open {k_(direct['packets_processed_per_s'])}  "
          f"sealed {k_(sealed['packets_processed_per_s'])}  "
          f"(sealed/open = {sealed['ratio_to_open']:.2f}; {sealed['us_per_packet']:.2f} vs "
          f"{direct['us_per_packet']:.2f} us per datagram sent or received)   "
          f"[{spread['chunks']} chunks: min {k_(spread['min'])} / median {k_(spread['median'])} "
          f"/ max {k_(spread['max'])}]")
    print(f"  check               {'PASS' if not problems else 'FAIL'}: every frame and input "
          f"delivered exactly once, in order ({sent:,} ticks incl. warm-up)")
    failed |= bool(problems)
    results["sealed"] = sealed
    print()

    # -- 2: lossy
    profile = LinkProfile(loss=0.10, delay=0.010, jitter=0.020)
    print(f"2. lossy: same room, every datagram through LossyLink: {profile.loss:.0%} loss, "
          f"{1000 * (profile.delay + profile.jitter / 2):.0f} ms +-{500 * profile.jitter:.0f} ms "
          f"per direction (seed {args.seed}), 1 ms simulated steps")
    room = Room(args.players, args.seed, args.ack_delay)
    lossy = LossyRoom(room, profile, args.seed)
    checker = Checker(args.players)
    state = lossy.run(checker, 0, WARMUP_TICKS, 0, None)
    before = room.stats()
    timer = Timer()
    counts = lossy.run(checker, state["next_tick"], args.ticks, args.seconds, timer)
    stats = stats_delta(room.stats(), before)
    census = Census()
    state = lossy.run(checker, counts["next_tick"], CENSUS_TICKS, 0, None, tap=census)
    sent = state["next_tick"]
    drain = lossy.run(checker, sent, 0, 0, None, send=False, drain_limit_ms=10_000)
    problems = checker.verify(sent, sent)
    f = figures(counts, timer, stats, census.summary(), args.players)
    core_wall = counts["core_wall"]
    f["core_calls_wall_s"] = core_wall
    f["core_only_packets_processed_per_s"] = (counts["encoded"] + counts["decoded"]) / core_wall
    f["core_only_us_per_packet"] = 1e6 * core_wall / (counts["encoded"] + counts["decoded"])
    f["drain_simulated_ms"] = drain["simulated_ms"] - state["simulated_ms"]
    f["final_peer_stats"] = room.stats()
    f["verify"] = problems
    print_figures(f)
    print(f"  core calls only     {core_wall:.2f} s of the {timer.wall:.2f} s wall were inside relay_core "
          f"calls (+ the event check); the rest is the pure-Python LossyLink and 1 ms scheduler. "
          f"Core only: {k_(f['core_only_packets_processed_per_s'])} packets processed/s, "
          f"{f['core_only_us_per_packet']:.2f} us/packet")
    print(f"  check               {'PASS' if not problems else 'FAIL'}: every client received every "
          f"frame exactly once and in order, the server every input ({sent:,} ticks incl. warm-up "
          f"and census; drained in {f['drain_simulated_ms']} simulated ms)")
    for p in problems[:10]:
        print(f"    {p}")
    failed |= bool(problems)
    results["lossy"] = f
    print()

    # -- 3: summary
    tag = (f"{machine['cpu']}, {machine['python']}, Cython {machine['cython']}, "
           f"{args.players} clients @30Hz")
    lines = []
    for name, label, res in (("direct", "no loss", direct),
                             ("lossy", "10% loss 20+-10ms", f)):
        down, up = res["peer_stats"]["down"], res["peer_stats"]["up"]
        lines.append(
            f"core_bench {name} ({label}): {k_(res['packets_processed_per_s'])} packets/s processed "
            f"({res['us_per_packet']:.2f} us/packet, {res['ratio_to_reference']:.1f}x "
            f"a Python struct header pack/unpack"
            + (f"; {res['core_only_us_per_packet']:.2f} us/packet inside core calls"
               if "core_only_us_per_packet" in res else "")
            + f"), {k_(res['messages_delivered_per_s'])} msgs/s, "
            f"{res['datagrams_per_link_per_tick']:.2f} datagrams/tick/link, "
            f"{res['avg_datagram_bytes']:.0f} B/datagram, {res['messages_per_datagram']:.2f} msgs/datagram"
            + (f", resends {down['resends'] + up['resends']:,}, "
               f"redundant {down['redundant_bytes'] + up['redundant_bytes']:,} B"
               f", {'PASS' if not res['verify'] else 'FAIL'}")
            + f" [{tag}]")
    lines.append(f"core_bench sealed (no loss, token mode): {k_(sealed['packets_processed_per_s'])} "
                 f"datagrams/s processed ({sealed['us_per_packet']:.2f} us/datagram), "
                 f"{sealed['ratio_to_open']:.2f}x the open-mode rate, "
                 f"{'PASS' if not sealed['verify'] else 'FAIL'} [{tag}]")
    results["summary"] = lines
    print("3. summary")
    for line in lines:
        print("  " + line)

    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
