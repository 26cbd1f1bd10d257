"""One-process load generator for the relay: many simulated players, the compiled core, no asyncio.

Every simulated player is a ``relay_core`` client ``Endpoint`` (the client SDK's settings) with
its own connected UDP socket on loopback, so the relay sees one address per player exactly as
with real clients. One ``epoll`` loop serves them all: a datagram for a player is read, handed
to its endpoint, and the player reacts the way a lockstep client does (benchmarks/players.py's
``LockstepPlayer``) — on each FRAME N it sends a 16-byte input for frame N + ``input_delay`` on
channel 1 (redundant) — then its endpoint's
datagrams go out at once. Endpoint timers (acks, resends, heartbeats) run from a heap of
deadlines, so an idle player costs nothing. When ``relay._batchio`` is importable, a ready socket
is drained with one ``recv_batch`` call and a player's datagrams leave with one ``send_batch``;
otherwise plain non-blocking ``recv``/``send``.

Checked per player: frames arrive in order, once, without gaps (a jump in frame numbers is a
gap; an older number a duplicate), and — on a sample of frames — that the player's own input is
in the frame it was sent for. Frames a player should have received in a measurement window
(tick rate x window length, less a small tolerance) but did not are counted as lost.

Standalone:

    python benchmarks/loadgen.py --server 127.0.0.1:7777 --players 64 --seconds 10

Every player's socket is on 127.0.0.1, one source to the relay: past 64 players (or 16 rooms)
an open-mode relay needs RELAY_SECURITY_MAX_SESSIONS_PER_SOURCE=0 (and ..._MAX_ROOMS_...=0),
and a fast ramp RELAY_SECURITY_HANDSHAKE_RATE=0, as capacity.py sets them.

Agent mode (``--agent``, used by benchmarks/capacity.py): commands on stdin, one JSON object per
line; answers on stdout, one JSON object per line:

    {"cmd": "add", "players": 64, "timeout": 15}   -> {"ok": true, "running": 64, ...}
    {"cmd": "window_start"}                         -> {"ok": true, "cpu": ...}
    {"cmd": "window_end"}                           -> {"ok": true, "lost_frames": ..., ...}
    {"cmd": "stats"}                                -> totals
    {"cmd": "quit"}
"""
from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import resource
import select
import socket
import sys
import time
from typing import Optional

if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.players import LockstepPlayer, frame_number, seat, window_shortfall
from relay import protocol
from relay.client import client_config
from relay_core import Endpoint, MessageReceived, PeerConnected, PeerDisconnected


def _batchio():
    """``relay._batchio`` if it is importable and behaves as expected on a socket pair."""
    try:
        from relay import _batchio          # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.1", 0))
            a.setblocking(False)
            b.setblocking(False)
            _batchio.send_batch(a.fileno(), [(b"probe-1", b.getsockname()), (b"probe-2", b.getsockname())])
            time.sleep(0.01)
            got = _batchio.recv_batch(b.fileno(), 8, 2048)
            payloads = [item[0] if isinstance(item, tuple) else item for item in got]
            if [bytes(p) for p in payloads] != [b"probe-1", b"probe-2"]:
                return None
        finally:
            a.close()
            b.close()
    except Exception:                   # an API other than the one this was written against
        return None
    return _batchio


class Player(LockstepPlayer):
    """A lockstep player with its own socket and relay_core endpoint, and input checks."""

    __slots__ = ("room", "name", "sock", "fd", "endpoint", "peer", "address", "slot", "welcome",
                 "inputs_checked", "inputs_missing", "error", "timer", "pending_inputs",
                 "joined_at", "running_at", "refused")

    def __init__(self, index: int, room: str, name: str, input_delay: int):
        super().__init__(index, input_delay)
        self.room = room
        self.name = name
        self.sock: Optional[socket.socket] = None
        self.fd = -1
        self.endpoint: Optional[Endpoint] = None
        self.peer = -1
        self.address = None
        self.slot = -1
        self.welcome = False
        self.inputs_checked = 0
        self.inputs_missing = 0
        self.error: Optional[str] = None
        self.refused: Optional[str] = None
        self.timer = -1.0
        self.pending_inputs: dict[int, bytes] = {}
        self.joined_at = 0.0
        self.running_at = 0.0


class LoadGen:
    """Many simulated players in one process (see the module docstring)."""

    def __init__(self, server: tuple[str, int], tick_rate: int = 30, input_delay: int = 2,
                 room_prefix: Optional[str] = None, verify_every: int = 8,
                 use_batchio: bool = True):
        self.server = server
        self.tick_rate = tick_rate
        self.input_delay = input_delay
        self.room_prefix = room_prefix or f"cap{os.getpid()}-{int(time.time()) % 100000}"
        self.verify_every = max(0, verify_every)
        self.batchio = _batchio() if use_batchio else None
        self.io = "relay._batchio (recvmmsg/sendmmsg)" if self.batchio else "plain non-blocking sockets"
        self.config = client_config()
        self.players: list[Player] = []
        self.by_fd: dict[int, Player] = {}
        self.epoll = select.epoll()
        self.heap: list = []
        self._seq = 0
        self.extra_fds: dict[int, object] = {}
        self.window_started: Optional[float] = None
        self.disconnects = 0
        self.datagrams_in = 0
        self.datagrams_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        _raise_fd_limit()

    # -- players ---------------------------------------------------------------------------

    def add_players(self, count: int) -> list[Player]:
        """Connect ``count`` more players (whole rooms of 8; the last room may be partial)."""
        now = time.monotonic()
        added = []
        for _ in range(count):
            index = len(self.players)
            room, name = seat(index)
            player = Player(index, f"{self.room_prefix}-{room}", name, self.input_delay)
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            sock.connect(self.server)
            sock.setblocking(False)
            player.sock = sock
            player.fd = sock.fileno()
            player.address = self.server
            player.endpoint = Endpoint(self.config)
            player.peer = player.endpoint.connect(self.server, now)
            player.endpoint.send(player.peer, protocol.CONTROL,
                                 protocol.Join(player.room, player.name).encode())
            player.joined_at = now
            self.players.append(player)
            self.by_fd[player.fd] = player
            self.epoll.register(player.fd, select.EPOLLIN)
            self._flush(player, now)
            added.append(player)
        return added

    def close(self) -> None:
        now = time.monotonic()
        for player in self.players:
            if player.sock is None:
                continue
            try:
                if player.endpoint.is_connected(player.peer):
                    player.endpoint.disconnect(player.peer, "closed")
                    self._flush(player, now)
            except OSError:
                pass
            player.sock.close()
            player.sock = None
        self.epoll.close()

    # -- the loop ----------------------------------------------------------------------------

    def run(self, seconds: float, until=None) -> None:
        """Serve every player for ``seconds`` (or until ``until()`` is true, checked after
        each poll)."""
        deadline = time.monotonic() + seconds
        poll = self.epoll.poll
        by_fd = self.by_fd
        heap = self.heap
        monotonic = time.monotonic
        batchio = self.batchio
        service = self._service
        while True:
            now = monotonic()
            if now >= deadline or (until is not None and until()):
                return
            wake = deadline
            if heap and heap[0][0] < wake:
                wake = heap[0][0]
            events = poll(max(0.0, wake - now), 4096)
            now = monotonic()
            for fd, _mask in events:
                player = by_fd.get(fd)
                if player is None:
                    handler = self.extra_fds.get(fd)
                    if handler is not None:
                        handler()
                    continue
                endpoint = player.endpoint
                if batchio is not None:
                    try:
                        batch = batchio.recv_batch(fd, 16, 2048)
                    except OSError:
                        continue
                    for item in batch:
                        data = item[0] if isinstance(item, tuple) else item
                        self.datagrams_in += 1
                        self.bytes_in += len(data)
                        endpoint.receive(data, player.address, now)
                else:
                    try:
                        data = player.sock.recv(2048)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:         # ICMP port unreachable: the relay went away
                        continue
                    self.datagrams_in += 1
                    self.bytes_in += len(data)
                    endpoint.receive(data, player.address, now)
                service(player, now)
            while heap and heap[0][0] <= now:
                when, _, player = heapq.heappop(heap)
                if when == player.timer and player.sock is not None:
                    player.timer = -1.0
                    self._flush(player, now)

    def _service(self, player: Player, now: float) -> None:
        endpoint = player.endpoint
        event = endpoint.next_event()
        while event is not None:
            kind = type(event)
            if kind is MessageReceived:
                if event.channel == protocol.STREAM:
                    self._on_frame(player, event.payload, now)
                else:
                    self._on_control(player, event.payload, now)
            elif kind is PeerDisconnected:
                if player.error is None:
                    player.error = event.reason
                    self.disconnects += 1
            elif kind is PeerConnected:
                pass
            event = endpoint.next_event()
        self._flush(player, now)

    def _flush(self, player: Player, now: float) -> None:
        endpoint = player.endpoint
        out = endpoint.datagrams_to_send(now)
        if out:
            if self.batchio is not None:
                try:
                    self.batchio.send_batch(player.fd, out)
                except OSError:
                    pass
                for data, _addr in out:
                    self.bytes_out += len(data)
                self.datagrams_out += len(out)
            else:
                send = player.sock.send
                for data, _addr in out:
                    try:
                        send(data)
                    except (BlockingIOError, InterruptedError, ConnectionRefusedError):
                        pass
                    self.datagrams_out += 1
                    self.bytes_out += len(data)
        deadline = endpoint.next_timeout()
        if deadline is not None and deadline != player.timer:
            player.timer = deadline
            self._seq += 1
            heapq.heappush(self.heap, (deadline, self._seq, player))

    def _on_frame(self, player: Player, payload: bytes, now: float) -> None:
        number = frame_number(payload)
        was_running = player.running
        inputs_due = player.on_frame(number)
        if not inputs_due:
            return
        if not was_running:
            player.running_at = now
        if self.verify_every and number % self.verify_every == 0:
            expected = player.pending_inputs.pop(number, None)
            if expected is not None:
                player.inputs_checked += 1
                try:
                    # Every payload names its frame, so no input repeats the previous frame's
                    # and a sampled frame decodes on its own.
                    inputs = protocol.decode_frame(payload).inputs
                except protocol.ProtocolError:
                    inputs = []
                if not (0 <= player.slot < len(inputs) and inputs[player.slot] == expected):
                    player.inputs_missing += 1
        for frame in inputs_due:
            self._send_input(player, frame)

    def _send_input(self, player: Player, frame: int) -> None:
        payload = player.input_payload(frame)
        if player.endpoint.send(player.peer, protocol.STREAM, player.input_message(frame, payload)):
            player.inputs_sent += 1
            if self.verify_every and frame % self.verify_every == 0:
                player.pending_inputs[frame] = payload
                if len(player.pending_inputs) > 64:       # never grows without bound
                    player.pending_inputs.pop(next(iter(player.pending_inputs)))

    def _on_control(self, player: Player, payload: bytes, now: float) -> None:
        try:
            message = protocol.decode_relay_message(payload)
        except protocol.ProtocolError:
            return
        if isinstance(message, protocol.Welcome):
            player.welcome = True
            player.slot = message.slot if message.slot is not None else -1
            player.last = message.next_frame - 1
        elif isinstance(message, list) and message and message[0] == protocol.REFUSED:
            player.refused = f"{message[1]}: {message[2]}"
            if player.error is None:
                player.error = "refused"

    # -- figures -----------------------------------------------------------------------------

    def counts(self) -> dict:
        players = self.players
        return {
            "players": len(players),
            "welcomed": sum(1 for p in players if p.welcome),
            "running": sum(1 for p in players if p.running and p.error is None),
            "errors": sum(1 for p in players if p.error is not None),
            "frames": sum(p.frames for p in players),
            "gaps": sum(p.gaps for p in players),
            "duplicates": sum(p.duplicates for p in players),
            "inputs_sent": sum(p.inputs_sent for p in players),
            "inputs_checked": sum(p.inputs_checked for p in players),
            "inputs_missing": sum(p.inputs_missing for p in players),
            "disconnects": self.disconnects,
            "datagrams_in": self.datagrams_in, "datagrams_out": self.datagrams_out,
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "cpu": _cpu_seconds(), "io": self.io,
            "error_samples": sorted({f"{p.error}{' ' + p.refused if p.refused else ''}"
                                     for p in players if p.error})[:5],
        }

    def window_start(self) -> dict:
        self.window_started = time.monotonic()
        self._window_base = self.counts()
        for player in self.players:
            player.window_frames = player.frames
        return dict(self._window_base, ok=True)

    def window_end(self) -> dict:
        """Figures since window_start: lost frames, gaps, the loader's own CPU."""
        if self.window_started is None:
            raise RuntimeError("window_end without window_start")
        seconds = time.monotonic() - self.window_started
        expected = seconds * self.tick_rate
        lost, short_players, worst = window_shortfall(self.players, expected)
        end = self.counts()
        base = self._window_base
        delta = {key: end[key] - base[key] for key in
                 ("frames", "gaps", "duplicates", "inputs_sent", "inputs_checked",
                  "inputs_missing", "disconnects", "datagrams_in", "datagrams_out", "bytes_in",
                  "bytes_out", "cpu")}
        self.window_started = None
        return dict(delta, ok=True, seconds=seconds, expected_frames_per_player=expected,
                    lost_frames=lost + delta["gaps"], short_players=short_players,
                    worst_shortfall=round(worst, 1), players=end["players"],
                    running=end["running"], errors=end["errors"], io=self.io,
                    error_samples=end["error_samples"])

    def wait_running(self, players: list[Player], timeout: float) -> bool:
        """Serve until every player in ``players`` has received a frame (or failed)."""
        def done():
            return all(p.running or p.error is not None for p in players)
        self.run(timeout, until=done)
        return all(p.running and p.error is None for p in players)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        raise argparse.ArgumentTypeError(f"{host}: this load generator only targets loopback")
    return host, int(port)


# -- agent mode ------------------------------------------------------------------------------

class Agent:
    """Serves commands from a controlling process (stdin) while the players keep playing."""

    def __init__(self, load: LoadGen, deadline: float):
        self.load = load
        self.deadline = deadline
        self.buffer = b""
        self.quit = False
        self.pending_add: Optional[tuple[list[Player], float]] = None
        fd = sys.stdin.fileno()
        os.set_blocking(fd, False)
        self.fd = fd
        load.extra_fds[fd] = self.on_input
        load.epoll.register(fd, select.EPOLLIN)

    def reply(self, message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def on_input(self) -> None:
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.quit = True
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                self.command(json.loads(line))

    def command(self, message: dict) -> None:
        load = self.load
        cmd = message.get("cmd")
        if cmd == "add":
            players = load.add_players(int(message["players"]))
            self.pending_add = (players, time.monotonic() + float(message.get("timeout", 15)))
        elif cmd == "window_start":
            self.reply(load.window_start())
        elif cmd == "window_end":
            self.reply(load.window_end())
        elif cmd == "stats":
            self.reply(dict(load.counts(), ok=True))
        elif cmd == "quit":
            self.quit = True
        else:
            self.reply({"ok": False, "error": f"unknown command {cmd!r}"})

    def check(self) -> bool:
        if self.pending_add is not None:
            players, deadline = self.pending_add
            done = all(p.running or p.error is not None for p in players)
            if done or time.monotonic() >= deadline:
                self.pending_add = None
                ok = all(p.running and p.error is None for p in players)
                self.reply(dict(self.load.counts(), ok=ok, added=len(players)))
        return self.quit or time.monotonic() >= self.deadline

    def serve(self) -> None:
        self.reply({"ok": True, "ready": True, "io": self.load.io, "pid": os.getpid()})
        while not self.check():
            self.load.run(0.05, until=self.check)


def drive(load, args) -> Optional[dict]:
    """What both load generators' command lines do: serve capacity.py's commands (``--agent``,
    returns None), or add ``--players``, wait until they play, and measure ``--seconds``."""
    if args.agent:
        Agent(load, time.monotonic() + min(args.max_lifetime, 3600.0)).serve()
        return None
    players = load.add_players(max(1, args.players))
    started = load.wait_running(players, 15.0)
    load.window_start()
    load.run(min(max(args.seconds, 0.1), 600.0))
    result = load.window_end()
    result["all_running"] = started
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", type=_host_port, default=("127.0.0.1", 7777),
                        help="relay UDP address on loopback, HOST:PORT")
    parser.add_argument("--players", type=int, default=64, help="players (rooms of 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds (max 600)")
    parser.add_argument("--tick-rate", type=int, default=30)
    parser.add_argument("--input-delay", type=int, default=2)
    parser.add_argument("--no-batchio", action="store_true", help="plain sockets even if "
                        "relay._batchio is importable")
    parser.add_argument("--agent", action="store_true", help="take commands on stdin (capacity.py)")
    parser.add_argument("--max-lifetime", type=float, default=1800.0,
                        help="agent mode: exit after this many seconds whatever happens")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # Thousands of players' state lives for the whole run: collect young objects rarely (the
    # cyclic GC was a few % of the load generator's CPU at the default threshold).
    gc.set_threshold(20_000, *gc.get_threshold()[1:])
    gc.freeze()
    load = LoadGen(args.server, args.tick_rate, args.input_delay,
                   use_batchio=not args.no_batchio)
    try:
        result = drive(load, args)
        if result is None:
            return 0
        started = result["all_running"]
        if args.json:
            print(json.dumps(result))
        else:
            print(f"loadgen: {result['players']} players ({result['running']} running), "
                  f"{result['seconds']:.1f} s, io: {result['io']}")
            print(f"  frames {result['frames']}, lost {result['lost_frames']} "
                  f"(gaps {result['gaps']}, players short {result['short_players']}), "
                  f"duplicates {result['duplicates']}, inputs missing "
                  f"{result['inputs_missing']}/{result['inputs_checked']} checked")
            print(f"  datagrams in {result['datagrams_in'] / result['seconds']:.0f}/s, out "
                  f"{result['datagrams_out'] / result['seconds']:.0f}/s; loader CPU "
                  f"{100 * result['cpu'] / result['seconds']:.1f} %")
        ok = started and result["lost_frames"] == 0 and result["errors"] == 0
        return 0 if ok else 1
    finally:
        load.close()


if __name__ == "__main__":
    sys.exit(main())
