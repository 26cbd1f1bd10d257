#!/usr/bin/env python3
"""A small lockstep game client on top of ``relay.client.RelayClient``.

Every player runs the same deterministic simulation (a few dots walking around a 1024 x 1024
world) and only ever exchanges inputs: each player sends its input for frame N + input_delay
after it has applied frame N, the relay closes one frame per tick with everyone's input, and
every client applies the same frames in the same order, so every client computes the same
world. Every ``--checksum-every`` frames each client reports a hash of its world to the relay,
which compares them across players and answers DESYNC if they differ.

    python examples/lockstep_client.py 127.0.0.1:7777 --room demo --player alice --frames 300
    python examples/lockstep_client.py 127.0.0.1:7777 --room demo --player bob --frames 300

Against a relay in token mode each player passes the connect token minted for it, which names
its room and player:

    python examples/lockstep_client.py RELAY_HOST:7777 --token "$(relay token mint \
        --room demo --player alice --ttl 5m --key-file keys.toml)"

(see examples/README.md). The core is ``run()``, an ordinary coroutine that tests import.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

from relay.client import RelayClient, RelayError
from relay.protocol import Frame
from relay_core.token import ConnectToken

WORLD_SIZE = 1024
SPEED = 3
TARGET_PERIOD = 64
"""Frames between changes of a player's target: inputs steer towards it."""


# -- the game: a deterministic simulation driven only by frames --------------------------------

@dataclass
class Dot:
    slot: int
    player: str
    x: int
    y: int
    active: bool = True


class World:
    """Integer-only state, changed only by ``apply(frame)``: identical frames, identical worlds."""

    def __init__(self) -> None:
        self.frame = -1
        """Number of the last frame applied."""
        self.dots: dict[int, Dot] = {}

    def apply(self, frame: Frame) -> None:
        if frame.number != self.frame + 1:
            raise ValueError(f"frame {frame.number} applied after frame {self.frame}")
        # Membership changes take effect at the start of the frame that carries them.
        for kind, slot, player in frame.events:
            if kind == "join":
                spawn = zlib.crc32(f"spawn:{slot}:{player}".encode())
                self.dots[slot] = Dot(slot, player, spawn % WORLD_SIZE, (spawn >> 10) % WORLD_SIZE)
            elif kind == "reconnect" and slot in self.dots:
                self.dots[slot].active = True
            elif kind in ("leave", "timeout") and slot in self.dots:
                self.dots[slot].active = False
        for slot, payload in enumerate(frame.inputs):
            dot = self.dots.get(slot)
            if payload is None or dot is None or len(payload) < 2:
                continue                    # no input from this slot in this frame: stand still
            dx, dy = struct.unpack_from("<bb", payload)
            dot.x = (dot.x + max(-1, min(1, dx)) * SPEED) % WORLD_SIZE
            dot.y = (dot.y + max(-1, min(1, dy)) * SPEED) % WORLD_SIZE
        self.frame = frame.number

    def snapshot(self) -> tuple:
        return (self.frame, tuple((d.slot, d.player, d.x, d.y, d.active)
                                  for d in sorted(self.dots.values(), key=lambda d: d.slot)))

    def checksum(self) -> int:
        """64-bit hash of the whole state (unsigned, as the relay compares it)."""
        digest = hashlib.blake2b(repr(self.snapshot()).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")


def choose_input(world: World, slot: int, player: str, frame_number: int) -> bytes:
    """The 'player': steer towards a target that moves every TARGET_PERIOD frames."""
    target = zlib.crc32(f"target:{player}:{frame_number // TARGET_PERIOD}".encode())
    dot = world.dots.get(slot)
    if dot is None:
        return struct.pack("<bb", 0, 0)
    tx, ty = target % WORLD_SIZE, (target >> 10) % WORLD_SIZE
    return struct.pack("<bb", (tx > dot.x) - (tx < dot.x), (ty > dot.y) - (ty < dot.y))


# -- the client ----------------------------------------------------------------------------------

@dataclass
class RunResult:
    player: str
    slot: Optional[int]
    frames: int
    """Frames applied (0 .. frames-1)."""
    state: tuple
    """``World.snapshot()`` after the last frame applied."""
    live_from: int = 0
    """WELCOME.next_frame: the first frame that came live; earlier ones came as history."""
    checksums: dict[int, int] = field(default_factory=dict)
    """Checksums reported to the relay, by frame number."""
    desyncs: list = field(default_factory=list)
    """DESYNC messages received: [frame, {player: checksum}, minority]."""
    notices: list = field(default_factory=list)
    inputs_sent: int = 0
    inputs_missing: int = 0
    """Frames (after our first input was due) that closed without an input from us (or with
    one the relay synthesized because ours was late)."""
    input_delay: int = 0
    """The input delay in use at the end (the relay's advice with auto_input_delay)."""
    advised_input_delay: Optional[int] = None
    error: Optional[str] = None


async def run(host: str, port: int, room: Optional[str], player: Optional[str], frames: int, *,
              input_delay: int = 2, checksum_every: int = 30, start_timeout: float = 60.0,
              timeout: float = 10.0, linger: float = 0.5,
              log: Optional[Callable[[str], None]] = None,
              perturb_at: Optional[int] = None, auto_input_delay: bool = False,
              token: Optional[str] = None) -> RunResult:
    """Join ``room`` as ``player``, play frames 0 .. frames-1, return the final world.

    ``token``: the connect token (its text, ``rt1.``...) for a relay in token mode; ``room``
    and ``player`` may then be None: the token names them.

    ``input_delay``: our input for frame N + input_delay is sent once frame N is applied;
    ``auto_input_delay``: follow the relay's advice instead (the SDK changes the delay without
    giving a frame two inputs or none).
    ``linger``: seconds to stay in the room after the last frame, so that the relay can compare
    the last checksums and a DESYNC can reach us. ``perturb_at``: for demonstrations and tests,
    corrupt our own world at that frame to provoke a DESYNC.
    """
    if frames < 1 or input_delay < 1 or checksum_every < 1:
        raise ValueError("frames, input_delay and checksum_every must be >= 1")
    say = log or (lambda text: None)
    client = await RelayClient.connect(host, port, room, player, timeout=timeout,
                                       input_delay=input_delay, auto_input_delay=auto_input_delay,
                                       token=token)
    room, player = client.room, client.player
    welcome = client.welcome
    world = World()
    result = RunResult(player, welcome.slot, 0, world.snapshot(), live_from=welcome.next_frame)
    say(f"[{player}] joined room {welcome.room} as slot {welcome.slot} ({welcome.state}, "
        f"{welcome.tick_rate} Hz, live from frame {welcome.next_frame}, "
        f"{welcome.history} frames of history)")
    try:
        try:
            await client.wait_for_state("running", timeout=start_timeout)
        except asyncio.TimeoutError:
            result.error = f"room {room} did not start within {start_timeout:g} s"
            return result
        slot = welcome.slot
        first_live = welcome.next_frame

        def send_next_input() -> None:
            # The SDK picks the frame (last applied + input delay) and skips the history's
            # frames, which closed before we joined.
            sent = client.send_next_input(choose_input(world, slot, player, world.frame + 1))
            result.inputs_sent += len(sent)

        send_next_input()
        while world.frame < frames - 1:
            try:
                frame = await client.next_frame_or_none(timeout=timeout)
            except asyncio.TimeoutError:
                result.error = f"no frame for {timeout:g} s after frame {world.frame}"
                break
            if frame is None:
                result.error = (f"connection lost: {client.error}" if client.error
                                else f"room ended after {client.final_frames} frames")
                break
            world.apply(frame)
            if frame.number == perturb_at and slot in world.dots:
                world.dots[slot].x = (world.dots[slot].x + 1) % WORLD_SIZE
            if (frame.number >= first_live + input_delay
                    and (slot >= len(frame.inputs) or frame.inputs[slot] is None
                         or slot in frame.synthesized)):
                result.inputs_missing += 1
            send_next_input()
            if (frame.number + 1) % checksum_every == 0 or frame.number == frames - 1:
                value = world.checksum()
                result.checksums[frame.number] = value
                client.report_checksum(frame.number, value)
                say(f"[{player}] frame {frame.number:5d}  checksum {value:016x}  "
                    + "  ".join(f"{d.player}@({d.x},{d.y})" for d in world.dots.values()))
        result.frames = world.frame + 1
        result.state = world.snapshot()
        result.input_delay = client.input_delay
        result.advised_input_delay = client.advised_input_delay
        if result.error is None and linger > 0:
            await asyncio.sleep(linger)
        result.desyncs = [list(d) for d in client.desyncs]
        result.notices = [list(n) for n in client.notices]
        for frame_number, checksums, minority, *verdict in result.desyncs:
            say(f"[{player}] DESYNC at frame {frame_number}: {checksums} "
                f"verdict {verdict[0] if verdict else '-'}, minority {minority}")
        return result
    finally:
        await client.close()


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host or "127.0.0.1", int(port)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Toy lockstep game client for the relay.")
    parser.add_argument("server", type=_host_port, metavar="HOST:PORT",
                        help="the relay's UDP address, e.g. 127.0.0.1:7777")
    parser.add_argument("--room", help="room to join (default: the token's, else demo)")
    parser.add_argument("--player", help="player name, unique in the room (default: the token's)")
    parser.add_argument("--token", metavar="TOKEN",
                        help="connect token for a relay in token mode (relay token mint); it "
                             "names the room and the player")
    parser.add_argument("--frames", type=int, default=300, help="stop after this many frames")
    parser.add_argument("--input-delay", type=int, default=2,
                        help="frames between applying frame N and the frame our next input is for")
    parser.add_argument("--auto-input-delay", action="store_true",
                        help="follow the relay's input-delay advice (starting from --input-delay)")
    parser.add_argument("--checksum-every", type=int, default=30, metavar="N",
                        help="report a checksum of the world every N frames")
    parser.add_argument("--start-timeout", type=float, default=60.0,
                        help="seconds to wait for the room to start (for the other players)")
    args = parser.parse_args(argv)
    if args.token is None:
        if args.player is None:
            parser.error("--player is required (or --token, which names the player)")
        args.room = args.room or "demo"
    name = args.player
    if name is None:
        try:
            name = ConnectToken.decode(args.token).player
        except ValueError as error:         # TokenError: not a connect token
            parser.error(f"--token: {error}")
    host, port = args.server
    try:
        result = asyncio.run(run(host, port, args.room, args.player, args.frames,
                                 token=args.token,
                                 input_delay=args.input_delay, checksum_every=args.checksum_every,
                                 auto_input_delay=args.auto_input_delay,
                                 start_timeout=args.start_timeout,
                                 log=lambda text: print(text, flush=True)))
    except (RelayError, ValueError) as error:
        print(f"[{name}] {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:       # run() has left the room on its way out
        print(f"[{name}] interrupted", file=sys.stderr)
        return 130
    final = result.checksums.get(result.frames - 1)
    print(f"[{result.player}] done: {result.frames} frames, final checksum "
          f"{'-' if final is None else format(final, '016x')}, inputs sent {result.inputs_sent}, "
          f"missing from their frame {result.inputs_missing}, input delay {result.input_delay} "
          f"(advised {result.advised_input_delay}), desyncs {len(result.desyncs)}")
    if result.error:
        print(f"[{result.player}] error: {result.error}", file=sys.stderr)
    return 0 if result.error is None and not result.desyncs else 1


if __name__ == "__main__":
    sys.exit(main())
