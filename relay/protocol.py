"""The relay's application protocol: messages between game clients and the relay.

Every message is one msgpack array whose first element is the message type. Messages travel on
two relay_core channels (both ends configure them identically, see ``endpoint_channels``):

    CONTROL (0, reliable_ordered)  JOIN, READY, CHECKSUM, LEAVE / WELCOME, REFUSED, ROOM_STATE, DESYNC, NOTICE
    STREAM  (1, redundant)         INPUT (client -> relay) / FRAME (relay -> client)

A late joiner's or lagging client's missing frames come as one relay_core block holding
``zlib(msgpack([first_frame, [frame_message, ...]]))`` where each frame_message is the exact
FRAME message bytes. docs/RELAY_PROTOCOL.md specifies all of it for client authors.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import msgpack

from relay_core import ChannelConfig

CONTROL = 0
STREAM = 1

# client -> relay
JOIN = 1
READY = 2
CHECKSUM = 3
LEAVE = 4
INPUT = 5
# relay -> client
WELCOME = 20
REFUSED = 21
ROOM_STATE = 22
DESYNC = 23
NOTICE = 24
FRAME = 30

MAX_NAME_LENGTH = 64
FRAME_NUMBER_LIMIT = 2**32          # frame numbers are u32


class ProtocolError(ValueError):
    """A message that does not follow this protocol; ``code`` names the reason (a metric label)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


CONTROL_WINDOW = 16
STREAM_WINDOW = 64


def endpoint_channels() -> tuple[ChannelConfig, ...]:
    """The channel layout both the relay and its clients configure.

    The windows are small on purpose: every connected player costs a window's worth of slots
    on each channel, and the relay's per-player memory budget is about 16 KiB. Control
    messages are rare; 64 frames (2 s at 30 Hz) unacknowledged is already a client that the
    relay repairs with a catch-up block, and frames past the window wait in the queue, not lost.
    """
    return (ChannelConfig("reliable_ordered", window=CONTROL_WINDOW),
            ChannelConfig("redundant", window=STREAM_WINDOW, max_pending=16384))


def pack(*fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def unpack(data: bytes) -> list:
    """Decode one message; raises ProtocolError for anything that is not a typed msgpack array."""
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=len(data),
                                  max_str_len=len(data), max_array_len=len(data),
                                  max_map_len=len(data))
    except Exception as error:   # msgpack raises several unrelated types for bad input
        raise ProtocolError("malformed", f"not msgpack: {error}") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], int):
        raise ProtocolError("malformed", "a message is an array starting with its type")
    return message


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise ProtocolError("bad_name", f"{what} must be a string of 1..{MAX_NAME_LENGTH} characters")
    return value


def _frame_number(value: Any) -> int:
    if not isinstance(value, int) or not 0 <= value < FRAME_NUMBER_LIMIT:
        raise ProtocolError("bad_frame", "frame numbers are integers in 0..2^32-1")
    return value


# -- client -> relay --------------------------------------------------------------------------

@dataclass
class Join:
    room: str
    player: str
    spectator: bool = False

    def encode(self) -> bytes:
        return pack(JOIN, self.room, self.player, self.spectator)


@dataclass
class Input:
    frame: int
    """The frame this input is for."""
    payload: bytes
    have: int
    """Highest frame number the client holds with all frames before it (-1: none yet)."""

    def encode(self) -> bytes:
        return pack(INPUT, self.frame, self.payload, self.have)


@dataclass
class Checksum:
    frame: int
    value: int

    def encode(self) -> bytes:
        return pack(CHECKSUM, self.frame, self.value)


def decode_client_message(data: bytes):
    """Parse a client message into Join / Input / Checksum, or the bare type for READY / LEAVE."""
    message = unpack(data)
    kind = message[0]
    try:
        if kind == JOIN:
            spectator = message[3] if len(message) > 3 else False
            if not isinstance(spectator, bool):
                raise ProtocolError("malformed", "JOIN spectator flag must be a boolean")
            return Join(_name(message[1], "room"), _name(message[2], "player"), spectator)
        if kind == INPUT:
            payload, have = message[2], message[3]
            if not isinstance(payload, bytes):
                raise ProtocolError("malformed", "INPUT payload must be bytes")
            if not isinstance(have, int) or not -1 <= have < FRAME_NUMBER_LIMIT:
                raise ProtocolError("bad_frame", "INPUT 'have' must be -1 or a frame number")
            return Input(_frame_number(message[1]), payload, have)
        if kind == CHECKSUM:
            value = message[2]
            if not isinstance(value, int) or not -2**63 <= value < 2**64:
                raise ProtocolError("malformed", "CHECKSUM value must be a 64-bit integer")
            return Checksum(_frame_number(message[1]), value)
        if kind in (READY, LEAVE):
            return kind
    except IndexError:
        raise ProtocolError("malformed", f"message type {kind} is missing fields") from None
    raise ProtocolError("unknown_type", f"unknown client message type {kind}")


# -- relay -> client --------------------------------------------------------------------------

@dataclass
class Welcome:
    room: str
    player: str
    slot: Optional[int]
    """Index of this player's input in every frame (None for a spectator)."""
    tick_rate: int
    state: str
    next_frame: int
    """First frame that will come live on the STREAM channel."""
    history: int
    """Frames 0..history-1 (or the spectator's delayed range) follow as a block; 0: none."""
    spectator: bool = False

    def encode(self) -> bytes:
        return pack(WELCOME, {"room": self.room, "player": self.player, "slot": self.slot,
                              "tick_rate": self.tick_rate, "state": self.state,
                              "next_frame": self.next_frame, "history": self.history,
                              "spectator": self.spectator})


@dataclass
class Frame:
    number: int
    inputs: list
    """One entry per slot: the player's input bytes, or None for "no input"."""
    events: list = field(default_factory=list)
    """Membership changes that take effect in this frame: [kind, slot, player] with kind one of
    join, leave, timeout, reconnect."""

    def encode(self) -> bytes:
        return pack(FRAME, self.number, self.inputs, self.events)


def decode_relay_message(data: bytes):
    """Parse a relay message (for clients): Welcome, Frame, or a list for the others."""
    message = unpack(data)
    kind = message[0]
    try:
        if kind == FRAME:
            return Frame(_frame_number(message[1]), list(message[2]), list(message[3]))
        if kind == WELCOME:
            body = message[1]
            return Welcome(body["room"], body["player"], body["slot"], body["tick_rate"],
                           body["state"], body["next_frame"], body["history"], body["spectator"])
        if kind in (REFUSED, ROOM_STATE, DESYNC, NOTICE):
            return message
    except (IndexError, KeyError, TypeError):
        raise ProtocolError("malformed", f"relay message type {kind} is malformed") from None
    raise ProtocolError("unknown_type", f"unknown relay message type {kind}")


def refused(code: str, text: str) -> bytes:
    return pack(REFUSED, code, text)


def room_state(state: str, frame: int, reason: Optional[str] = None) -> bytes:
    return pack(ROOM_STATE, state, frame, reason)


def desync(frame: int, checksums: dict[str, int], minority: list[str]) -> bytes:
    return pack(DESYNC, frame, checksums, minority)


def notice(code: str, text: str) -> bytes:
    return pack(NOTICE, code, text)


# -- history blocks ---------------------------------------------------------------------------

def encode_history(first_frame: int, frames: list[bytes]) -> bytes:
    return zlib.compress(pack(first_frame, frames), 6)


def decode_history(block: bytes, max_size: int = 64 * 1024 * 1024) -> tuple[int, list[bytes]]:
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(block, max_size)
        if inflater.unconsumed_tail:
            raise ProtocolError("too_large", "history block expands past the size limit")
        first, frames = msgpack.unpackb(raw, raw=False)
    except ProtocolError:
        raise
    except Exception as error:
        raise ProtocolError("malformed", f"bad history block: {error}") from None
    return first, frames
