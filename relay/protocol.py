"""The relay's application protocol: messages between game clients and the relay.

Every message is one msgpack array whose first element is the message type, except FRAME: a
compact binary layout (``encode_frame``) that starts with the byte 0xC1, which msgpack never
uses, so the first byte tells the two apart. Messages travel on two relay_core channels (both
ends configure them identically, see ``endpoint_channels``):

    CONTROL (0, reliable_ordered)  JOIN, READY, CHECKSUM, LEAVE / WELCOME, REFUSED, ROOM_STATE,
                                   DESYNC, NOTICE, INPUT_DELAY
    STREAM  (1, redundant)         INPUT (client -> relay) / FRAME (relay -> client)

A FRAME may say "same input as in the previous frame" for a slot instead of repeating the bytes,
so frames are decoded in order (``FrameDecoder``); every client receives every frame from 0.

A late joiner's or lagging client's missing frames come as one relay_core block holding
``zlib(msgpack([first_frame, [frame_message, ...]]))`` where each frame_message is the exact
FRAME message bytes. docs/RELAY_PROTOCOL.md specifies all of it for client authors.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import msgpack

from relay.frames import EVENT_KINDS as EVENT_KINDS, encode_frame, put_varint as put_varint
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
INPUT_DELAY = 25
FRAME = 30
"""The FRAME message type as named in events and docs; on the wire a frame starts with
FRAME_MARKER (compact layout, docs/RELAY_PROTOCOL.md section 7.1), not with this number."""
FRAME_MARKER = 0xC1
FRAME_VERSION = 2

MAX_NAME_LENGTH = 64
MAX_BLOCK_SIZE = 32 * 1024 * 1024
"""Largest history block the relay sends and its clients accept (RELAY_PROTOCOL 2.2)."""
FRAME_NUMBER_LIMIT = 2**32          # frame numbers are u32
U32_MAX = FRAME_NUMBER_LIMIT - 1


class ProtocolError(ValueError):
    """A message that does not follow this protocol; ``code`` names the reason (a metric label)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


CONTROL_WINDOW = 16
STREAM_WINDOW = 64


def endpoint_channels() -> tuple[ChannelConfig, ...]:
    """The channel layout both the relay and its clients configure.

    The windows are small on purpose: a channel's storage grows with the messages in flight up
    to its window (a player on a good link has one or two frames unacked), and the relay's
    per-player memory budget is about 16 KiB. Control messages are rare; 64 frames (2 s at
    30 Hz) unacknowledged is already a client that the relay repairs with a catch-up block, and
    frames past the window wait in the queue, not lost.
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
    if not isinstance(message, list) or not message or not _is_int(message[0]):
        raise ProtocolError("malformed", "a message is an array starting with its type")
    return message


def _is_int(value: Any) -> bool:
    """A msgpack integer (msgpack true/false decode as bool, a subclass of int: not integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise ProtocolError("bad_name", f"{what} must be a string of 1..{MAX_NAME_LENGTH} characters")
    return value


def _frame_number(value: Any) -> int:
    if not _is_int(value) or not 0 <= value < FRAME_NUMBER_LIMIT:
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
            if not _is_int(have) or not -1 <= have < FRAME_NUMBER_LIMIT:
                raise ProtocolError("bad_frame", "INPUT 'have' must be -1 or a frame number")
            return Input(_frame_number(message[1]), payload, have)
        if kind == CHECKSUM:
            value = message[2]
            if not _is_int(value) or not -2**63 <= value < 2**64:
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
    """One closed frame of a room: every player's input for one tick, and the membership
    changes that take effect in it. Every client of the room gets the same frames."""

    number: int
    """The frame's number: 0, 1, 2, ... per room, one per tick while the room runs."""
    inputs: list
    """One entry per slot (index = slot): the player's input bytes, or None for "no input". As
    long as the room had slots when the frame closed; a slot past the end has no input."""
    events: list = field(default_factory=list)
    """Membership changes that take effect in this frame, in order: [kind, slot, player] with
    kind one of join, leave, timeout, reconnect (EVENT_KINDS), e.g. ['join', 0, 'alice']."""
    synthesized: list = field(default_factory=list)
    """Slots (ascending) whose input the relay made up because the player's did not arrive
    before the frame closed (``rooms.missing_input_policy``); their ``inputs`` entry holds it."""

    def encode(self, previous: Optional[list] = None) -> bytes:
        """The compact FRAME message; ``previous`` is the previous frame's ``inputs`` (None: no
        "same as previous" references, a frame any decoder can read on its own)."""
        return encode_frame(self, previous)


# -- compact frames ---------------------------------------------------------------------------
#
# C1 | number varint | flags u8 | slots varint | present bitmap | [same bitmap] | [synth bitmap]
#    | payloads (varint length + bytes, per present slot not marked same) | [events]
# Bitmaps are ceil(slots / 8) bytes, slot i is bit (i % 8) of byte i // 8. Specified byte for
# byte in docs/RELAY_PROTOCOL.md section 7.1. Written by relay.frames (compiled: encode_frame,
# put_varint, EVENT_KINDS); read here.

FLAG_SAME = 0x01
FLAG_SYNTHESIZED = 0x02
FLAG_EVENTS = 0x04
_KNOWN_FLAGS = FLAG_SAME | FLAG_SYNTHESIZED | FLAG_EVENTS
MAX_SLOTS = 256


def get_varint(data: bytes, pos: int, limit: int = FRAME_NUMBER_LIMIT) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``; ProtocolError if it is cut short,
    longer than 5 bytes or not below ``limit``."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ProtocolError("malformed", "FRAME ends inside a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 28:
            raise ProtocolError("malformed", "FRAME varint longer than 5 bytes")
    if value >= limit:
        raise ProtocolError("malformed", f"FRAME value {value} out of range (< {limit})")
    return value, pos


def frame_number(data: bytes) -> int:
    """The number of a FRAME message without decoding the rest (ProtocolError if not a FRAME)."""
    if not data or data[0] != FRAME_MARKER:
        raise ProtocolError("malformed", "not a FRAME message")
    return get_varint(data, 1)[0]


def _bits(data: bytes, pos: int, width: int, count: int) -> tuple[list[int], int]:
    if pos + width > len(data):
        raise ProtocolError("malformed", "FRAME ends inside a bitmap")
    slots = [slot for slot in range(count) if data[pos + (slot >> 3)] >> (slot & 7) & 1]
    if count & 7 and data[pos + width - 1] >> (count & 7):
        raise ProtocolError("malformed", "FRAME bitmap has bits past the last slot")
    return slots, pos + width


def decode_frame(data: bytes, previous: Optional[list] = None) -> Frame:
    """Decode a compact FRAME; ``previous`` is the previous frame's decoded ``inputs`` (needed
    only if the frame refers to it: ProtocolError "needs_previous" otherwise)."""
    number = frame_number(data)
    _, pos = get_varint(data, 1)
    if pos >= len(data):
        raise ProtocolError("malformed", "FRAME ends before its flags")
    flags = data[pos]
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError("malformed", f"FRAME flags {flags:#04x} has unknown bits")
    count, pos = get_varint(data, pos + 1, MAX_SLOTS + 1)
    width = (count + 7) >> 3
    present, pos = _bits(data, pos, width, count)
    same: list[int] = []
    synthesized: list[int] = []
    if flags & FLAG_SAME:
        same, pos = _bits(data, pos, width, count)
    if flags & FLAG_SYNTHESIZED:
        synthesized, pos = _bits(data, pos, width, count)
    present_set = set(present)
    if not present_set.issuperset(same) or not present_set.issuperset(synthesized):
        raise ProtocolError("malformed", "FRAME marks a slot same/synthesized that has no input")
    inputs: list = [None] * count
    same_set = set(same)
    for slot in present:
        if slot in same_set:
            if previous is None:
                raise ProtocolError("needs_previous", f"FRAME {number} repeats inputs of frame "
                                                      f"{number - 1}; decode frames in order")
            if slot >= len(previous) or previous[slot] is None:
                raise ProtocolError("malformed", f"FRAME {number} repeats slot {slot}'s input, "
                                                 f"which the previous frame does not have")
            inputs[slot] = previous[slot]
            continue
        length, pos = get_varint(data, pos, 1 << 20)
        if pos + length > len(data):
            raise ProtocolError("malformed", "FRAME ends inside an input")
        inputs[slot] = data[pos:pos + length]
        pos += length
    events = []
    if flags & FLAG_EVENTS:
        event_count, pos = get_varint(data, pos, len(data) + 1)
        for _ in range(event_count):
            if pos >= len(data) or data[pos] >= len(EVENT_KINDS):
                raise ProtocolError("malformed", "FRAME event kind missing or unknown")
            kind = EVENT_KINDS[data[pos]]
            slot, pos = get_varint(data, pos + 1, MAX_SLOTS)
            length, pos = get_varint(data, pos, MAX_NAME_LENGTH * 4 + 1)
            if pos + length > len(data):
                raise ProtocolError("malformed", "FRAME ends inside an event")
            try:
                player = data[pos:pos + length].decode()
            except UnicodeDecodeError:
                raise ProtocolError("malformed", "FRAME event player is not UTF-8") from None
            pos += length
            events.append([kind, slot, player])
    if pos != len(data):
        raise ProtocolError("malformed", f"FRAME has {len(data) - pos} bytes past its end")
    return Frame(number, inputs, events, synthesized)


class FrameDecoder:
    """Decodes one room's frames in order, keeping the previous frame's inputs for the "same as
    previous" references. Feed it every frame from ``next_number`` on (0 for a new client)."""

    def __init__(self, next_number: int = 0, previous: Optional[list] = None):
        self.next_number = next_number
        self.previous: list = list(previous) if previous is not None else []

    def decode(self, data: bytes) -> Frame:
        number = frame_number(data)
        if number != self.next_number:
            raise ProtocolError("out_of_order", f"FRAME {number} while expecting frame "
                                                f"{self.next_number}")
        frame = decode_frame(data, self.previous)
        self.previous = frame.inputs
        self.next_number = number + 1
        return frame


def _int_in(value: Any, low: int, high: int) -> bool:
    return _is_int(value) and low <= value <= high


def _is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _welcome(body: Any) -> Welcome:
    if not isinstance(body, dict):
        raise TypeError("WELCOME carries a map")
    slot, spectator = body["slot"], body.get("spectator", False)   # older relays omit spectator
    if not (isinstance(body["room"], str) and isinstance(body["player"], str)
            and (slot is None or _int_in(slot, 0, 2**31 - 1))
            and _int_in(body["tick_rate"], 0, U32_MAX) and isinstance(body["state"], str)
            and _int_in(body["next_frame"], 0, U32_MAX) and _int_in(body["history"], 0, U32_MAX)
            and isinstance(spectator, bool)):
        raise TypeError("a WELCOME field has the wrong type or range")
    return Welcome(body["room"], body["player"], slot, body["tick_rate"], body["state"],
                   body["next_frame"], body["history"], spectator)


# What each relay -> client message other than WELCOME must hold after its type (section 4.2):
# (fewest elements, a check per element; elements past the checks are not looked at).
_RELAY_MESSAGE_SHAPES = {
    REFUSED: (3, (lambda code: isinstance(code, str), lambda text: isinstance(text, str))),
    NOTICE: (3, (lambda code: isinstance(code, str), lambda text: isinstance(text, str))),
    ROOM_STATE: (3, (lambda state: isinstance(state, str), lambda frame: _int_in(frame, 0, U32_MAX),
                     lambda reason: reason is None or isinstance(reason, str))),
    DESYNC: (5, (lambda frame: _int_in(frame, 0, U32_MAX),
                 lambda checksums: isinstance(checksums, dict) and all(
                     isinstance(player, str) and _is_int(value) for player, value in checksums.items()),
                 _is_text_list, lambda verdict: isinstance(verdict, str),
                 lambda groups: isinstance(groups, list) and all(_is_text_list(g) for g in groups))),
    INPUT_DELAY: (5, (lambda frames: _int_in(frames, 0, U32_MAX),) * 4),
}


def decode_relay_message(data: bytes, previous: Optional[list] = None):
    """Parse a relay message (for clients): Welcome, Frame, or, for the others, the message as
    a list whose elements have been checked against section 4.2. A FRAME that refers to the
    previous frame's inputs needs them as ``previous`` (or use FrameDecoder)."""
    if data[:1] == b"\xc1":
        return decode_frame(data, previous)
    message = unpack(data)
    kind = message[0]
    try:
        if kind == WELCOME:
            return _welcome(message[1])
        shape = _RELAY_MESSAGE_SHAPES.get(kind)
        if shape is not None:
            fewest, checks = shape
            if len(message) < fewest or not all(
                    check(value) for check, value in zip(checks, message[1:])):
                raise TypeError("an element has the wrong type or range")
            return message
    except (IndexError, KeyError, TypeError):
        raise ProtocolError("malformed", f"relay message type {kind} is malformed") from None
    raise ProtocolError("unknown_type", f"unknown relay message type {kind}")


def refused(code: str, text: str) -> bytes:
    return pack(REFUSED, code, text)


def room_state(state: str, frame: int, reason: Optional[str] = None) -> bytes:
    return pack(ROOM_STATE, state, frame, reason)


def desync(frame: int, checksums: dict[str, int], minority: list[str], verdict: str,
           groups: list[list[str]]) -> bytes:
    return pack(DESYNC, frame, checksums, minority, verdict, groups)


def input_delay(frames: int, response_ms: int, late: int, samples: int) -> bytes:
    return pack(INPUT_DELAY, frames, response_ms, late, samples)


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
        if not inflater.eof or inflater.unused_data:
            raise ProtocolError("malformed", "history block is not one complete zlib stream")
        first, frames = msgpack.unpackb(raw, raw=False)
    except ProtocolError:
        raise
    except Exception as error:
        raise ProtocolError("malformed", f"bad history block: {error}") from None
    if (not _is_int(first) or not isinstance(frames, list)
            or not all(isinstance(frame, bytes) for frame in frames)
            or not 0 <= first <= FRAME_NUMBER_LIMIT - max(len(frames), 1)):
        raise ProtocolError("malformed", "a history block is [first_frame: u32, [frame: bin, ...]] "
                                         "with every frame number below 2^32")
    return first, frames
