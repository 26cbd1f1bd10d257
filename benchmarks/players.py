"""The simulated lockstep player the load benchmarks share.

Every load benchmark's player behaves the same towards a relay: it joins a room of
``ROOM_SIZE``, and on each FRAME N it sends a 16-byte input for frame N + ``input_delay`` (on
its first frame also the inputs for the frames in between, which no frame will ask for); it
counts frames that arrive twice or skip ahead.

- ``LockstepPlayer``: that behaviour without a transport: which inputs a frame calls for, the
  frame counts, the bytes of an input. ``loadgen.py`` (sockets, epoll, the relay's core) and
  ``enet_relay.py`` (ENet hosts) extend it with their transport's state.
- ``MemoryPlayer``: a ``relay_core`` client endpoint whose datagrams the caller carries in
  memory (``tick_cost.py``, ``tests/e2e/test_churn_memory.py``).
- ``window_shortfall``: the frames players missed in a measurement window.
"""
from __future__ import annotations

import struct
from typing import Iterable

import msgpack

from relay import protocol
from relay.client import client_config
from relay_core import Endpoint, MessageReceived

ROOM_SIZE = 8
INPUT_DELAY = 2
LOST_TOLERANCE_FRAMES = 3
"""Frames a player may be short in a window before the shortfall counts as lost (window edges)."""
MEMORY_SERVER_ADDRESS = ("127.0.0.1", 7777)
"""Where a ``MemoryPlayer`` believes the relay is."""


def frame_number(payload: bytes) -> int:
    """The frame number of a FRAME message, read from its header (no full decode: compact
    frames refer to their predecessor); -1 if ``payload`` is not a FRAME."""
    try:
        return protocol.frame_number(payload)
    except protocol.ProtocolError:
        return -1


def seat(index: int) -> tuple[int, str]:
    """Player ``index``'s room number and player name: rooms fill up ROOM_SIZE at a time."""
    return index // ROOM_SIZE, f"p{index % ROOM_SIZE}"


class LockstepPlayer:
    __slots__ = ("index", "input_delay", "last", "frames", "gaps", "duplicates", "running",
                 "inputs_sent", "window_frames")

    def __init__(self, index: int, input_delay: int = INPUT_DELAY):
        self.index = index
        self.input_delay = input_delay
        self.last = -1
        """Highest frame received in order (every frame before it received)."""
        self.frames = 0
        self.gaps = 0
        self.duplicates = 0
        self.running = False
        """Has received a frame."""
        self.inputs_sent = 0
        self.window_frames = 0
        """``frames`` when the current measurement window started."""

    def on_frame(self, number: int) -> range:
        """Count FRAME ``number``; returns the frames to send inputs for now (none for a
        duplicate or a message that is not a frame, ``number`` < 0)."""
        last = self.last
        if number < 0:
            return range(0)
        if number <= last:
            self.duplicates += 1
            return range(0)
        if last >= 0 and number != last + 1:
            self.gaps += number - last - 1
        self.last = number
        self.frames += 1
        if not self.running:
            self.running = True
            return range(number + 1, number + self.input_delay + 1)
        return range(number + self.input_delay, number + self.input_delay + 1)

    def input_payload(self, frame: int) -> bytes:
        """16 bytes naming the player and the frame, so no input repeats the previous frame's
        and a frame's inputs can be checked on their own."""
        return struct.pack("<IIQ", self.index, frame, frame * 2654435761 & 0xFFFFFFFFFFFFFFFF)

    def input_message(self, frame: int, payload: bytes) -> bytes:
        """The INPUT message carrying ``payload`` for ``frame``."""
        return msgpack.packb((protocol.INPUT, frame, payload, self.last), use_bin_type=True)


class MemoryPlayer(LockstepPlayer):
    """A player whose client ``Endpoint`` exchanges datagrams with the caller, not a socket:
    the caller hands the endpoint what the relay sent it, then calls ``on_events``."""

    __slots__ = ("endpoint", "peer", "address")

    def __init__(self, index: int, now: float):
        super().__init__(index)
        self.endpoint = Endpoint(client_config())
        self.peer = self.endpoint.connect(MEMORY_SERVER_ADDRESS, now)
        self.address = ("127.0.0.2", 10000 + index)
        room, name = seat(index)
        self.endpoint.send(self.peer, protocol.CONTROL,
                           protocol.Join(f"room-{room}", name).encode())

    def on_events(self) -> None:
        endpoint = self.endpoint
        while (event := endpoint.next_event()) is not None:
            if type(event) is MessageReceived and event.channel == protocol.STREAM:
                for frame in self.on_frame(frame_number(event.payload)):
                    endpoint.send(self.peer, protocol.STREAM,
                                  self.input_message(frame, self.input_payload(frame)))
                    self.inputs_sent += 1


def window_shortfall(players: Iterable[LockstepPlayer], expected: float) -> tuple[int, int, float]:
    """(lost frames, players short, worst shortfall) for a window in which each player should
    have received ``expected`` frames: a player more than LOST_TOLERANCE_FRAMES short lost the
    rest."""
    lost = short = 0
    worst = 0.0
    for player in players:
        shortfall = expected - (player.frames - player.window_frames)
        worst = max(worst, shortfall)
        if shortfall > LOST_TOLERANCE_FRAMES:
            lost += int(shortfall - LOST_TOLERANCE_FRAMES)
            short += 1
    return lost, short, worst
