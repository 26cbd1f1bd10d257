"""The C client's FRAME and history decoders (clients/c/src/frame.c, through
clients/c/tests/relay_shim.c and ctypes) against relay.protocol as the oracle.

Random frame sequences are encoded by ``relay.protocol.encode_frame`` against the previous
frame's inputs and decoded in order by C: same inputs, synthesized slots and events. Mutated
frames are accepted or rejected by both decoders alike (and decode identically when accepted).
History blocks from ``relay.protocol.encode_history`` read back frame for frame.
"""
from __future__ import annotations

import ctypes
import zlib

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from relay import protocol
from relay.protocol import Frame, ProtocolError

EVENT_KINDS = protocol.EVENT_KINDS
OUT_CAP = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def lib(c_build):
    lib = ctypes.CDLL(str(c_build / "librelay_client_testing.so"))
    lib.relay_shim_decode_frame.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                            ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p,
                                            ctypes.c_size_t]
    lib.relay_shim_decode_frame.restype = ctypes.c_int
    lib.relay_shim_decode_history.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                              ctypes.c_char_p, ctypes.c_size_t]
    lib.relay_shim_decode_history.restype = ctypes.c_int
    return lib


_out = ctypes.create_string_buffer(OUT_CAP)


def c_decode(lib, data: bytes, previous):
    """(number, inputs, synthesized, events) as C decodes it, or the negative error code."""
    blob = msgpack.packb(list(previous), use_bin_type=True) if previous is not None else b""
    n = lib.relay_shim_decode_frame(data, len(data), blob, len(blob), previous is not None,
                                    _out, OUT_CAP)
    if n < 0:
        return n
    number, inputs, synthesized, events = msgpack.unpackb(_out.raw[:n], raw=False)
    return number, inputs, synthesized, [[EVENT_KINDS[k], s, name] for k, s, name in events]


def py_decode(data: bytes, previous):
    try:
        frame = protocol.decode_frame(data, previous)
    except ProtocolError as error:
        return error.code
    return frame.number, frame.inputs, frame.synthesized, frame.events


names = st.text(min_size=1, max_size=64)


@st.composite
def frame_sequences(draw):
    slots = draw(st.one_of(st.integers(0, 12), st.sampled_from([7, 8, 9, 255, 256])))
    count = draw(st.integers(1, 6))
    start = draw(st.integers(0, 2**32 - 1 - count))
    payload = st.one_of(st.none(), st.binary(max_size=20))
    frames = []
    previous = None
    for k in range(count):
        inputs = []
        for slot in range(slots):
            if previous is not None and slot < len(previous) and draw(st.booleans()):
                inputs.append(previous[slot])          # repeated: a same bit (or nil again)
            else:
                inputs.append(draw(payload))
        present = [s for s, value in enumerate(inputs) if value is not None]
        synthesized = sorted(draw(st.sets(st.sampled_from(present)))) if present else []
        events = draw(st.lists(st.tuples(st.sampled_from(EVENT_KINDS), st.integers(0, 255), names)
                               .map(list), max_size=3))
        frames.append(Frame(start + k, inputs, events, synthesized))
        previous = inputs
    return frames


@settings(max_examples=300, deadline=None)
@given(frame_sequences())
def test_frames_decode_like_python(lib, frames):
    previous = []
    for frame in frames:
        data = protocol.encode_frame(frame, previous)
        assert c_decode(lib, data, previous) == (frame.number, frame.inputs, frame.synthesized,
                                                 frame.events)
        previous = frame.inputs


@settings(max_examples=400, deadline=None)
@given(frame_sequences(), st.data())
def test_mutated_frames_rejected_alike(lib, frames, data):
    previous = [] if len(frames) == 1 else frames[-2].inputs
    encoded = bytearray(protocol.encode_frame(frames[-1], previous))
    mutation = data.draw(st.sampled_from(["flip", "truncate", "append", "insert"]))
    if mutation == "flip":
        position = data.draw(st.integers(0, len(encoded) - 1))
        encoded[position] ^= 1 << data.draw(st.integers(0, 7))
    elif mutation == "truncate":
        del encoded[data.draw(st.integers(0, len(encoded) - 1)):]
    elif mutation == "append":
        encoded += data.draw(st.binary(min_size=1, max_size=3))
    else:
        encoded.insert(data.draw(st.integers(0, len(encoded))), data.draw(st.integers(0, 255)))
    use_previous = data.draw(st.booleans())
    prev = previous if use_previous else None
    expected = py_decode(bytes(encoded), prev)
    actual = c_decode(lib, bytes(encoded), prev)
    if isinstance(expected, str):
        assert isinstance(actual, int) and actual < 0, (expected, actual)
        if expected == "needs_previous":
            assert actual == -2
    else:
        assert actual == expected


def test_worked_examples(lib):
    f1000 = Frame(1000, [b"\x01\xff", None, b"\x00\x01"], [["join", 2, "carol"]])
    f1001 = Frame(1001, [b"\x01\xff", b"\x00\x00", b"\x00\x02"], [], [1])
    d1000 = protocol.encode_frame(f1000, [])
    d1001 = protocol.encode_frame(f1001, f1000.inputs)
    assert len(d1000) == 21 and len(d1001) == 14
    assert c_decode(lib, d1000, []) == (1000, f1000.inputs, [], f1000.events)
    assert c_decode(lib, d1001, f1000.inputs) == (1001, f1001.inputs, [1], [])
    assert c_decode(lib, d1001, None) == -2


def c_history(lib, block: bytes, max_size: int = 64 * 1024 * 1024):
    cap = max(OUT_CAP, 2 * len(block) + 1024)
    out = ctypes.create_string_buffer(cap)
    n = lib.relay_shim_decode_history(block, len(block), max_size, out, cap)
    if n < 0:
        return n
    return tuple(msgpack.unpackb(out.raw[:n], raw=False))


@settings(max_examples=100, deadline=None)
@given(frame_sequences())
def test_history_blocks(lib, frames):
    previous = []
    encoded = []
    for frame in frames:
        encoded.append(protocol.encode_frame(frame, previous))
        previous = frame.inputs
    block = protocol.encode_history(frames[0].number, encoded)
    first, decoded = protocol.decode_history(block)
    assert c_history(lib, block) == (first, decoded)
    # the inflate cap: one byte short of the inflated size is refused
    size = len(zlib.decompress(block))
    assert c_history(lib, block, size) == (first, decoded)
    assert c_history(lib, block, size - 1) == -3


def test_bad_history_blocks(lib):
    good = protocol.encode_history(5, [b"\xc1\x05\x00\x00"])
    assert c_history(lib, good) == (5, [b"\xc1\x05\x00\x00"])
    assert c_history(lib, good[:-2]) < 0                                     # truncated zlib
    assert c_history(lib, b"not zlib") < 0
    assert c_history(lib, zlib.compress(msgpack.packb([5, ["str"]]))) < 0    # str, not bin
    assert c_history(lib, zlib.compress(msgpack.packb([5, [b"x"], 1]))) < 0  # 3 elements
    assert c_history(lib, zlib.compress(msgpack.packb([5, [b"x"]]) + b"\x00")) < 0  # trailing
    assert c_history(lib, zlib.compress(msgpack.packb([2**32 - 1, [b"x", b"y"]]))) < 0
    assert c_history(lib, zlib.compress(msgpack.packb([0, []]))) == (0, [])
