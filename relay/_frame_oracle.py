"""A test oracle for the FRAME encoder: an independent, plain Python encoder of the compact
FRAME layout (docs/RELAY_PROTOCOL.md section 7.1).

The relay encodes frames with relay.frames.encode_frame (compiled; relay.protocol exports it).
Nothing in relay imports this module: tests compare the compiled encoder with it, byte for byte
(tests/relay/test_frame_codec.py), and read it as the layout's reference.
"""
from __future__ import annotations

from typing import Optional

from relay.protocol import (EVENT_KINDS, FLAG_EVENTS, FLAG_SAME, FLAG_SYNTHESIZED, FRAME_MARKER,
                            Frame)

_EVENT_CODES = {kind: code for code, kind in enumerate(EVENT_KINDS)}


def put_varint(out: bytearray, value: int) -> None:
    """Append ``value`` as an unsigned LEB128 varint."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode_frame(frame: Frame, previous: Optional[list] = None) -> bytes:
    inputs = frame.inputs
    count = len(inputs)
    width = (count + 7) >> 3
    present = bytearray(width)
    same = bytearray(width)
    synthesized = bytearray(width)
    payloads = bytearray()
    previous = previous or []
    for slot, payload in enumerate(inputs):
        if payload is None:
            continue
        bit = 1 << (slot & 7)
        present[slot >> 3] |= bit
        if slot < len(previous) and previous[slot] == payload:
            same[slot >> 3] |= bit
        else:
            put_varint(payloads, len(payload))
            payloads += payload
    for slot in frame.synthesized:
        if not 0 <= slot < count or inputs[slot] is None:
            raise ValueError(f"synthesized slot {slot} has no input in frame {frame.number}")
        synthesized[slot >> 3] |= 1 << (slot & 7)
    flags = ((FLAG_SAME if any(same) else 0) | (FLAG_SYNTHESIZED if frame.synthesized else 0)
             | (FLAG_EVENTS if frame.events else 0))
    out = bytearray((FRAME_MARKER,))
    put_varint(out, frame.number)
    out.append(flags)
    put_varint(out, count)
    out += present
    if flags & FLAG_SAME:
        out += same
    if flags & FLAG_SYNTHESIZED:
        out += synthesized
    out += payloads
    if frame.events:
        put_varint(out, len(frame.events))
        for kind, slot, player in frame.events:
            name = player.encode()
            out.append(_EVENT_CODES[kind])
            put_varint(out, slot)
            put_varint(out, len(name))
            out += name
    return bytes(out)
