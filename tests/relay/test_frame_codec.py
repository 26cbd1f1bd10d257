"""The compiled frame codec, relay.frames: the canonical-INPUT decoder against the general
decoder (relay.protocol.decode_client_message), the FRAME encoder against the test oracle
(relay/_frame_oracle.py), byte for byte.
"""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from relay import _frame_oracle, frames, protocol
from relay.protocol import Input


def packed_input(frame, payload, have, **options) -> bytes:
    return msgpack.packb([protocol.INPUT, frame, payload, have], use_bin_type=True, **options)


# -- INPUT decoding -----------------------------------------------------------------------------

EDGE_FRAMES = (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1)
EDGE_HAVES = (-1, 0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1)


@pytest.mark.parametrize("frame", EDGE_FRAMES)
@pytest.mark.parametrize("have", EDGE_HAVES)
@pytest.mark.parametrize("size", (0, 16, 255, 256, 70000))
def test_canonical_inputs_decode_as_the_general_decoder_does(frame, have, size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    data = packed_input(frame, payload, have)
    assert frames.decode_input(data) == (frame, payload, have)
    assert protocol.decode_client_message(data) == Input(frame, payload, have)


@pytest.mark.parametrize("data", [
    b"",
    b"\x94",
    packed_input(1, b"x", -1)[:-1],                         # truncated
    packed_input(1, b"x", -1) + b"\x00",                    # trailing byte
    msgpack.packb([protocol.INPUT, 1, "text", -1]),         # str, not bin
    msgpack.packb([protocol.INPUT, -1, b"x", -1]),          # negative frame
    msgpack.packb([protocol.INPUT, 2**32, b"x", -1]),       # frame beyond u32
    msgpack.packb([protocol.INPUT, 1, b"x", -2]),           # have below -1
    msgpack.packb([protocol.INPUT, 1, b"x", 1, 0]),         # a fifth field
    msgpack.packb([protocol.INPUT, 1, b"x"]),               # a field short
    msgpack.packb([protocol.INPUT, 1.0, b"x", -1]),         # float frame
    msgpack.packb([protocol.INPUT, True, b"x", -1]),        # bool frame
    b"\x94\x05\xcc\x05\xc4\x01x\xff",                        # frame 5 as uint8: not the shortest form
    b"\x94\x05\x01\xc4\x01x\xd0\xff",                        # have -1 as int8: not the shortest form
    b"\x94\x05\x01\xc4\x05x\xff",                            # bin length past the end
    msgpack.packb([protocol.JOIN, "room", "player"]),
])
def test_anything_else_is_left_to_the_general_decoder(data):
    assert frames.decode_input(data) is None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 2**32 - 1), st.binary(max_size=300),
       st.integers(-1, 2**32 - 1), st.integers(0, 40), st.integers(0, 255))
def test_whatever_the_fast_decoder_accepts_the_general_one_reads_the_same(
        noise, frame, payload, have, position, byte):
    data = bytearray(packed_input(frame, payload, have))
    # Mutate one byte, or use random bytes: the fast decoder must never accept something the
    # general decoder reads differently (or refuses).
    if position < len(data):
        data[position] = byte
    for candidate in (bytes(data), noise):
        decoded = frames.decode_input(candidate)
        if decoded is None:
            continue
        assert protocol.decode_client_message(candidate) == Input(*decoded)


# -- FRAME encoding -----------------------------------------------------------------------------

payloads = st.one_of(st.none(), st.binary(max_size=200))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(payloads, max_size=20), st.lists(payloads, max_size=20),
       st.booleans(), st.data())
def test_the_compiled_frame_encoder_writes_the_oracles_bytes(number, inputs, previous, repeat, data):
    if repeat:      # some slots the same as in the previous frame
        inputs = [previous[i] if i < len(previous) and data.draw(st.booleans()) else value
                  for i, value in enumerate(inputs)]
    present = [slot for slot, value in enumerate(inputs) if value is not None]
    synthesized = sorted(data.draw(st.sets(st.sampled_from(present)))) if present else []
    frame = protocol.Frame(number, inputs, [], synthesized)
    for prev in (previous, None, []):
        expected = _frame_oracle.encode_frame(frame, prev)
        assert frames.encode_frame(frame, prev) == expected
        assert protocol.decode_frame(expected, prev).inputs == inputs


events = st.lists(st.tuples(st.sampled_from(protocol.EVENT_KINDS), st.integers(0, 255),
                             st.text(max_size=64)).map(list), max_size=5)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(payloads, max_size=10), events)
def test_frames_with_membership_events_are_the_oracles_bytes(number, inputs, frame_events):
    frame = protocol.Frame(number, inputs, frame_events, [])
    expected = _frame_oracle.encode_frame(frame)
    assert frames.encode_frame(frame) == expected
    assert protocol.decode_frame(expected).events == frame_events


@pytest.mark.parametrize("slots", [256, 257, 600])
def test_frames_past_256_slots_and_non_bytes_previous_inputs_are_the_oracles_bytes(slots):
    """Bitmaps for up to 256 slots live on the stack, wider ones on the heap; a previous input
    that is not bytes is compared as Python compares it."""
    inputs = [None if i % 7 == 3 else b"%d" % (i % 11) for i in range(slots)]
    previous = [bytearray(value) if value is not None and i % 3 == 0 else value
                for i, value in enumerate(reversed(inputs))]
    present = [slot for slot, value in enumerate(inputs) if value is not None]
    frame = protocol.Frame(slots, inputs, [["join", slots - 1, "last"]], present[::5])
    for prev in (previous, inputs, None):
        assert frames.encode_frame(frame, prev) == _frame_oracle.encode_frame(frame, prev)


def test_join_with_lengths_prefixes_each_part_as_put_varint_would():
    parts = [b"", b"a", bytes(127), bytes(128), bytes(20000)]
    expected = bytearray()
    for part in parts:
        frames.put_varint(expected, len(part))
        expected += part
    assert frames.join_with_lengths(parts) == bytes(expected)
    assert frames.join_with_lengths([]) == b""
    with pytest.raises(TypeError, match="bytes"):
        frames.join_with_lengths([b"a", bytearray(b"b")])


def test_the_compiled_frame_encoder_refuses_what_the_oracle_refuses():
    frame = protocol.Frame(3, [b"a", None], [], [1])
    with pytest.raises(ValueError):
        _frame_oracle.encode_frame(frame)
    with pytest.raises(ValueError):
        frames.encode_frame(frame)
    unknown_event = protocol.Frame(4, [b"a"], [["vanish", 0, "bob"]], [])
    with pytest.raises(KeyError):
        _frame_oracle.encode_frame(unknown_event)
    with pytest.raises(KeyError):
        frames.encode_frame(unknown_event)


def test_relay_protocol_encodes_with_the_compiled_codec():
    assert protocol.encode_frame is frames.encode_frame
    assert protocol.put_varint is frames.put_varint
    assert protocol.EVENT_KINDS is frames.EVENT_KINDS
    frame = protocol.Frame(300, [b"x" * 200, None, b"y"], [["join", 1, "bob"]], [2])
    assert frame.encode([b"x" * 200]) == _frame_oracle.encode_frame(frame, [b"x" * 200])


@pytest.mark.parametrize("value", [0, 1, 127, 128, 16383, 16384, 2**32 - 1])
def test_put_varint_writes_the_oracles_bytes(value):
    compiled, oracle = bytearray(b"head"), bytearray(b"head")
    frames.put_varint(compiled, value)
    _frame_oracle.put_varint(oracle, value)
    assert compiled == oracle
    assert protocol.get_varint(bytes(compiled), 4, 2**32) == (value, len(compiled))
