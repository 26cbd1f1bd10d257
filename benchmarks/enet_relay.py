"""A peer relay for benchmarks/capacity.py: the same lockstep room on ENet (pyenet), without us.

This is what a Python developer would write with ENet and no relay stack: one ``enet.Host``,
rooms of 8 players created on the first JOIN, a 30 Hz tick that closes a frame holding every
player's input for it and sends it to everyone in the room as one reliable ENet packet (one
``enet.Packet`` per frame, queued to each member), inputs sent reliable by the clients. Messages
are msgpack arrays with the relay protocol's type numbers (JOIN 1, INPUT 5, WELCOME 20), and
frames use the relay's own compact FRAME encoding (relay.protocol.encode_frame, relative to the
previous frame), so datagram sizes and encoding work are the same as the relay's.

    python benchmarks/enet_relay.py serve --port 7800           # the relay
    python benchmarks/enet_relay.py load --server 127.0.0.1:7800 --players 64 --seconds 5

``serve`` answers ``stats`` on stdin with one JSON line on stdout: ticks, the tick-lateness
histogram (the relay's bucket bounds, cumulative counts), datagrams and bytes in and out (ENet's
host counters), peers, rooms. ``load`` is an ENet load generator: one process, one client
``enet.Host`` per player, an epoll loop over their sockets; on each FRAME N a player sends its
input for N + 2. With ``--agent`` it takes the same stdin commands as benchmarks/loadgen.py
(add, window_start, window_end, stats, quit), so capacity.py ramps both relays the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from typing import Optional

import msgpack

if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.loadgen import drive
from benchmarks.players import ROOM_SIZE, LockstepPlayer, seat, window_shortfall
from relay import protocol

try:
    import enet
except ImportError:                     # reported by capacity.py; tests skip
    enet = None

JOIN, INPUT, WELCOME = 1, 5, 20
LATENESS_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
"""Same bounds as the relay's relay_tick_lateness_seconds histogram."""
MAX_PEERS = 4095                        # ENET_PROTOCOL_MAXIMUM_PEER_ID


def _require_enet() -> None:
    if enet is None:
        raise SystemExit("enet_relay: pyenet is not installed (pip install pyenet)")


# -- the relay ------------------------------------------------------------------------------

class Room:
    __slots__ = ("name", "peers", "slots", "running", "frame", "pending", "last_inputs")

    def __init__(self, name: str):
        self.name = name
        self.peers: list = []               # enet.Peer, index = slot
        self.slots: dict[str, int] = {}
        self.running = False
        self.frame = 0
        self.pending: dict[int, dict[int, bytes]] = {}   # frame -> slot -> input
        self.last_inputs: list = []         # the previous frame's: compact frames refer to them


class EnetRelay:
    def __init__(self, port: int, tick_rate: int = 30, max_peers: int = MAX_PEERS):
        _require_enet()
        self.host = enet.Host(enet.Address(b"127.0.0.1", port), max_peers, 2, 0, 0)
        self.port = self.host.address.port
        self.tick_rate = tick_rate
        self.rooms: dict[str, Room] = {}
        self.peer_room: dict = {}            # enet.Peer -> (Room, slot)
        self.ticks = 0
        self.lateness = [0] * (len(LATENESS_BUCKETS) + 1)
        self.lateness_sum = 0.0
        self.frames_closed = 0
        self.inputs = 0
        self.late_inputs = 0

    def on_receive(self, peer, data: bytes) -> None:
        message = msgpack.unpackb(data, raw=False)
        kind = message[0]
        if kind == INPUT:
            entry = self.peer_room.get(peer)
            if entry is None:
                return
            room, slot = entry
            frame = message[1]
            self.inputs += 1
            if frame < room.frame:
                frame = room.frame              # late: into the open frame, as the relay does
                self.late_inputs += 1
            room.pending.setdefault(frame, {}).setdefault(slot, message[2])
        elif kind == JOIN:
            name, player = message[1], message[2]
            room = self.rooms.get(name)
            if room is None:
                room = self.rooms[name] = Room(name)
            if len(room.peers) >= ROOM_SIZE:
                peer.disconnect()
                return
            slot = len(room.peers)
            room.peers.append(peer)
            room.slots[player] = slot
            self.peer_room[peer] = (room, slot)
            peer.send(0, enet.Packet(msgpack.packb([WELCOME, {"room": name, "slot": slot,
                                                             "next_frame": room.frame}]),
                                     enet.PACKET_FLAG_RELIABLE))
            if len(room.peers) == ROOM_SIZE:
                room.running = True

    def on_disconnect(self, peer) -> None:
        entry = self.peer_room.pop(peer, None)
        if entry is not None:
            room, slot = entry
            room.peers[slot] = None
            if not any(room.peers):
                self.rooms.pop(room.name, None)

    def tick(self) -> None:
        reliable = enet.PACKET_FLAG_RELIABLE
        encode_frame, Frame = protocol.encode_frame, protocol.Frame
        for room in self.rooms.values():
            if not room.running:
                continue
            received = room.pending.pop(room.frame, {})
            inputs = [received.get(i) for i in range(len(room.peers))]
            data = encode_frame(Frame(room.frame, inputs), room.last_inputs)
            room.last_inputs = inputs
            room.frame += 1
            self.frames_closed += 1
            packet = enet.Packet(data, reliable)
            for peer in room.peers:
                if peer is not None:
                    peer.send(0, packet)
        self.host.flush()

    def stats(self) -> dict:
        host = self.host
        cumulative, total = [], 0
        for count in self.lateness:
            total += count
            cumulative.append(total)
        return {
            "ticks": self.ticks, "lateness_bounds": list(LATENESS_BUCKETS),
            "lateness_cumulative": cumulative, "lateness_sum": self.lateness_sum,
            "frames_closed": self.frames_closed, "inputs": self.inputs,
            "late_inputs": self.late_inputs,
            "datagrams_in": host.totalReceivedPackets, "datagrams_out": host.totalSentPackets,
            "bytes_in": host.totalReceivedData, "bytes_out": host.totalSentData,
            "peers": len(self.peer_room), "rooms": len(self.rooms), "pid": os.getpid(),
        }

    def serve(self, seconds: float, control_fd: Optional[int] = None) -> None:
        """Run for at most ``seconds``; ``control_fd`` (stdin) takes ``stats`` / ``quit``."""
        host = self.host
        interval = 1.0 / self.tick_rate
        poller = select.epoll()
        poller.register(host.socket.fileno(), select.EPOLLIN)
        if control_fd is not None:
            os.set_blocking(control_fd, False)
            poller.register(control_fd, select.EPOLLIN)
        buffer = b""
        started = time.monotonic()
        deadline = started + seconds
        k = 0
        due = started + interval
        NONE, RECEIVE = enet.EVENT_TYPE_NONE, enet.EVENT_TYPE_RECEIVE
        CONNECT, DISCONNECT = enet.EVENT_TYPE_CONNECT, enet.EVENT_TYPE_DISCONNECT
        bounds = LATENESS_BUCKETS
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            if now >= due:
                lateness = now - due
                if lateness > 5 * interval:           # stalled: re-anchor, as the relay does
                    due += int(lateness / interval) * interval
                    lateness = now - due
                index = 0
                while index < len(bounds) and lateness > bounds[index]:
                    index += 1
                self.lateness[index] += 1
                self.lateness_sum += lateness
                self.ticks += 1
                k += 1
                due += interval
                self.tick()
                continue
            ready = poller.poll(due - now)
            for fd, _ in ready:
                if fd == control_fd:
                    try:
                        chunk = os.read(control_fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        return
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        command = line.strip().decode()
                        if command == "stats":
                            sys.stdout.write(json.dumps(self.stats()) + "\n")
                            sys.stdout.flush()
                        elif command == "quit":
                            return
            # Receive everything waiting (and let ENet send its acks).
            event = host.service(0)
            while event is not None and event.type != NONE:
                kind = event.type
                if kind == RECEIVE:
                    self.on_receive(event.peer, event.packet.data)
                elif kind == CONNECT:
                    pass
                elif kind == DISCONNECT:
                    self.on_disconnect(event.peer)
                event = host.check_events()
            host.flush()


# -- the load generator -----------------------------------------------------------------------

class EnetPlayer(LockstepPlayer):
    __slots__ = ("room", "name", "host", "peer", "fd", "connected", "slot", "error", "serviced")

    def __init__(self, index: int, room: str, name: str, input_delay: int):
        super().__init__(index, input_delay)
        self.room, self.name = room, name
        self.host = self.peer = None
        self.fd = -1
        self.connected = False
        self.slot = -1
        self.error: Optional[str] = None
        self.serviced = 0.0


class EnetLoad:
    """Many ENet client hosts in one process; the same figures as loadgen.LoadGen."""

    def __init__(self, server: tuple[str, int], tick_rate: int = 30, input_delay: int = 2):
        _require_enet()
        self.address = enet.Address(server[0].encode(), server[1])
        self.tick_rate = tick_rate
        self.input_delay = input_delay
        self.prefix = f"enet{os.getpid()}-{int(time.time()) % 100000}"
        self.players: list[EnetPlayer] = []
        self.by_fd: dict[int, EnetPlayer] = {}
        self.epoll = select.epoll()
        self.extra_fds: dict[int, object] = {}
        self.disconnects = 0
        self.window_started: Optional[float] = None
        self._base: dict = {}
        self.io = "enet client hosts (one socket each), epoll"
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ImportError, ValueError, OSError):
            pass

    def add_players(self, count: int) -> list[EnetPlayer]:
        added = []
        for _ in range(count):
            index = len(self.players)
            room, name = seat(index)
            player = EnetPlayer(index, f"{self.prefix}-{room}", name, self.input_delay)
            player.host = enet.Host(None, 1, 2, 0, 0)
            player.peer = player.host.connect(self.address, 2)
            player.host.flush()
            player.fd = player.host.socket.fileno()
            self.players.append(player)
            self.by_fd[player.fd] = player
            self.epoll.register(player.fd, select.EPOLLIN)
            added.append(player)
        return added

    def _service(self, player: EnetPlayer, now: float) -> None:
        host = player.host
        player.serviced = now
        try:
            event = host.service(0)
        except IOError:
            return
        NONE = enet.EVENT_TYPE_NONE
        while event is not None and event.type != NONE:
            kind = event.type
            if kind == enet.EVENT_TYPE_RECEIVE:
                self._on_message(player, event.packet.data)
            elif kind == enet.EVENT_TYPE_CONNECT:
                player.connected = True
                player.peer.send(0, enet.Packet(msgpack.packb([JOIN, player.room, player.name]),
                                                enet.PACKET_FLAG_RELIABLE))
            elif kind == enet.EVENT_TYPE_DISCONNECT:
                if player.error is None:
                    player.error = "disconnected"
                    self.disconnects += 1
            event = host.check_events()
        host.flush()

    def _on_message(self, player: EnetPlayer, data: bytes) -> None:
        if data[:1] == b"\xc1":                   # a compact FRAME: its number is enough here
            for frame in player.on_frame(protocol.frame_number(data)):
                self._send_input(player, frame)
            return
        message = msgpack.unpackb(data, raw=False)
        if message[0] == WELCOME:
            player.slot = message[1]["slot"]
            player.last = message[1]["next_frame"] - 1

    def _send_input(self, player: EnetPlayer, frame: int) -> None:
        message = player.input_message(frame, player.input_payload(frame))
        player.peer.send(0, enet.Packet(message, enet.PACKET_FLAG_RELIABLE))
        player.inputs_sent += 1

    def run(self, seconds: float, until=None) -> None:
        deadline = time.monotonic() + seconds
        poll = self.epoll.poll
        by_fd = self.by_fd
        sweep_at = time.monotonic() + 0.1
        while True:
            now = time.monotonic()
            if now >= deadline or (until is not None and until()):
                return
            events = poll(max(0.0, min(deadline, sweep_at) - now), 4096)
            now = time.monotonic()
            for fd, _ in events:
                player = by_fd.get(fd)
                if player is None:
                    handler = self.extra_fds.get(fd)
                    if handler is not None:
                        handler()
                    continue
                self._service(player, now)
            if now >= sweep_at:
                # ENet's own timers (pings, resends) run only inside service().
                sweep_at = now + 0.1
                for player in self.players:
                    if now - player.serviced > 0.1:
                        self._service(player, now)

    def counts(self) -> dict:
        players = self.players
        times = os.times()
        return {
            "players": len(players),
            "running": sum(1 for p in players if p.running and p.error is None),
            "errors": sum(1 for p in players if p.error is not None),
            "frames": sum(p.frames for p in players), "gaps": sum(p.gaps for p in players),
            "duplicates": sum(p.duplicates for p in players),
            "inputs_sent": sum(p.inputs_sent for p in players),
            "disconnects": self.disconnects, "cpu": times.user + times.system, "io": self.io,
            "error_samples": sorted({p.error for p in players if p.error})[:5],
        }

    def window_start(self) -> dict:
        self.window_started = time.monotonic()
        self._base = self.counts()
        for player in self.players:
            player.window_frames = player.frames
        return dict(self._base, ok=True)

    def window_end(self) -> dict:
        seconds = time.monotonic() - self.window_started
        expected = seconds * self.tick_rate
        lost, short, worst = window_shortfall(self.players, expected)
        end = self.counts()
        delta = {k: end[k] - self._base[k] for k in
                 ("frames", "gaps", "duplicates", "inputs_sent", "disconnects", "cpu")}
        self.window_started = None
        return dict(delta, ok=True, seconds=seconds, expected_frames_per_player=expected,
                    lost_frames=lost + delta["gaps"], short_players=short,
                    worst_shortfall=round(worst, 1), players=end["players"],
                    running=end["running"], errors=end["errors"], io=self.io,
                    error_samples=end["error_samples"])

    def wait_running(self, players: list[EnetPlayer], timeout: float) -> bool:
        self.run(timeout, until=lambda: all(p.running or p.error for p in players))
        return all(p.running and p.error is None for p in players)

    def close(self) -> None:
        for player in self.players:
            try:
                player.peer.disconnect_now(0)
            except Exception:
                pass
        self.epoll.close()


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    host = host or "127.0.0.1"
    if not host.startswith("127."):
        raise argparse.ArgumentTypeError(f"{host}: loopback only")
    return host, int(port)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    serve = sub.add_parser("serve", help="run the ENet relay on 127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="UDP port (0: any free; printed)")
    serve.add_argument("--tick-rate", type=int, default=30)
    serve.add_argument("--seconds", type=float, default=900.0, help="exit after this long (max 3600)")
    load = sub.add_parser("load", help="ENet load generator")
    load.add_argument("--server", type=_host_port, required=True)
    load.add_argument("--players", type=int, default=64)
    load.add_argument("--seconds", type=float, default=5.0)
    load.add_argument("--tick-rate", type=int, default=30)
    load.add_argument("--agent", action="store_true", help="commands on stdin (capacity.py)")
    load.add_argument("--max-lifetime", type=float, default=1800.0)
    load.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    _require_enet()

    if args.mode == "serve":
        relay = EnetRelay(args.port, args.tick_rate)
        print(json.dumps({"ready": True, "port": relay.port, "pid": os.getpid()}), flush=True)
        relay.serve(min(args.seconds, 3600.0), control_fd=sys.stdin.fileno())
        return 0

    loader = EnetLoad(args.server, args.tick_rate)
    try:
        result = drive(loader, args)
        if result is None:
            return 0
        started = result["all_running"]
        if args.json:
            print(json.dumps(result))
        else:
            print(f"enet load: {result['players']} players ({result['running']} running), "
                  f"{result['seconds']:.1f} s: frames {result['frames']}, lost "
                  f"{result['lost_frames']}, loader CPU {100 * result['cpu'] / result['seconds']:.1f} %")
        return 0 if started and result["lost_frames"] == 0 else 1
    finally:
        loader.close()


if __name__ == "__main__":
    sys.exit(main())
