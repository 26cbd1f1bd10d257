"""relay.protocol at its limits: every documented bound (docs/RELAY_PROTOCOL.md sections 3, 4.1,
7.1 and 9.2) accepted exactly at the bound and refused one past it, and every malformed message
refused with ProtocolError, never another exception type escaping a decoder (issue #24)."""
from __future__ import annotations

import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay import protocol
from relay.protocol import (CHECKSUM, EVENT_KINDS, INPUT, JOIN, LEAVE, READY, WELCOME, Checksum,
                            Frame, Input, Join, ProtocolError, decode_client_message,
                            decode_frame, decode_history, decode_relay_message, encode_frame,
                            encode_history, pack, put_varint)

U32_MAX = 2**32 - 1


def refused(decode, data: bytes, *args) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        decode(data, *args)
    assert type(caught.value) is ProtocolError
    return caught.value


# -- names (section 3: strings of 1..64 characters) ------------------------------------------

@pytest.mark.parametrize("length", [1, 64])
def test_join_names_of_1_and_64_characters_are_accepted(length):
    name = "é" * length           # characters, not bytes: 64 of them are 128 bytes of UTF-8
    assert decode_client_message(pack(JOIN, name, name)) == Join(name, name)


@pytest.mark.parametrize("room, player", [
    ("r" * 65, "p"), ("r", "p" * 65), ("", "p"), ("r", ""),
])
def test_join_names_outside_1_to_64_characters_are_refused(room, player):
    assert refused(decode_client_message, pack(JOIN, room, player)).code == "bad_name"


@pytest.mark.parametrize("value", [7, None, b"room", ["r"], {"r": 1}, 1.5, True])
def test_join_names_that_are_not_strings_are_refused(value):
    assert refused(decode_client_message, pack(JOIN, value, "p")).code == "bad_name"
    assert refused(decode_client_message, pack(JOIN, "r", value)).code == "bad_name"


def test_join_without_the_spectator_flag_is_a_player():
    join = decode_client_message(pack(JOIN, "room", "p"))
    assert join == Join("room", "p", False) and join.spectator is False
    assert decode_client_message(pack(JOIN, "room", "p", True)).spectator is True


@pytest.mark.parametrize("flag", [0, 1, None, "true"])
def test_join_spectator_flag_must_be_a_boolean(flag):
    refused(decode_client_message, pack(JOIN, "room", "p", flag))


@pytest.mark.parametrize("fields", [(JOIN,), (JOIN, "room"), (INPUT, 0, b""), (CHECKSUM, 0)])
def test_messages_missing_fields_are_refused(fields):
    assert refused(decode_client_message, pack(*fields)).code == "malformed"


# -- CHECKSUM value: -2^63..2^64-1 (section 4.1) ---------------------------------------------

@pytest.mark.parametrize("value", [-2**63, -1, 0, 2**63, 2**64 - 1])
def test_checksum_values_from_minus_2_63_to_2_64_minus_1_are_accepted(value):
    assert decode_client_message(pack(CHECKSUM, 5, value)) == Checksum(5, value)


@pytest.mark.parametrize("value", [1.0, "1", b"\x01", None, True, False])
def test_checksum_values_that_are_not_integers_are_refused(value):
    # Beyond -2^63..2^64-1 msgpack has no integer encoding at all; the float, the string and
    # the boolean are what a broken client can actually send.
    refused(decode_client_message, pack(CHECKSUM, 5, value))


# -- frame numbers and `have` (sections 3, 4.1, 9.1) -----------------------------------------

def test_input_and_checksum_frame_2_32_minus_1_accepted_and_2_32_refused():
    assert decode_client_message(pack(INPUT, U32_MAX, b"x", -1)) == Input(U32_MAX, b"x", -1)
    assert decode_client_message(pack(CHECKSUM, U32_MAX, 1)) == Checksum(U32_MAX, 1)
    assert refused(decode_client_message, pack(INPUT, 2**32, b"x", -1)).code == "bad_frame"
    assert refused(decode_client_message, pack(CHECKSUM, 2**32, 1)).code == "bad_frame"
    assert refused(decode_client_message, pack(INPUT, -1, b"x", -1)).code == "bad_frame"
    assert refused(decode_client_message, pack(CHECKSUM, -1, 1)).code == "bad_frame"


@pytest.mark.parametrize("have", [-1, 0, U32_MAX])
def test_input_have_from_minus_1_to_2_32_minus_1_is_accepted(have):
    assert decode_client_message(pack(INPUT, 3, b"x", have)).have == have


@pytest.mark.parametrize("have", [-2, 2**32, 1.0, None, True])
def test_input_have_outside_minus_1_to_2_32_minus_1_is_refused(have):
    assert refused(decode_client_message, pack(INPUT, 3, b"x", have)).code == "bad_frame"


@pytest.mark.parametrize("frame", [True, False, 1.0, "1"])
def test_frame_numbers_must_be_integers_not_booleans(frame):
    refused(decode_client_message, pack(INPUT, frame, b"x", -1))
    refused(decode_client_message, pack(CHECKSUM, frame, 1))


def test_input_payload_must_be_bin_not_str():
    refused(decode_client_message, pack(INPUT, 3, "x", -1))


@pytest.mark.parametrize("kind", [True, False, 1.0, "1", None])
def test_message_type_must_be_an_integer(kind):
    # msgpack true decodes as Python True == 1 == JOIN: it must not pass for a JOIN.
    assert refused(decode_client_message, pack(kind, "room", "p")).code == "malformed"
    assert refused(decode_relay_message, pack(kind, "room", "p")).code == "malformed"


def test_unknown_client_message_types_are_refused():
    for kind in (0, 6, WELCOME, 2**64 - 1, -1):
        assert refused(decode_client_message, pack(kind)).code == "unknown_type"
    assert decode_client_message(pack(READY)) == READY
    assert decode_client_message(pack(LEAVE)) == LEAVE


# -- FRAME (section 7.1) ---------------------------------------------------------------------

def test_frame_number_2_32_minus_1_decodes_and_2_32_is_refused():
    assert decode_frame(encode_frame(Frame(U32_MAX, [b"a"]))).number == U32_MAX
    assert protocol.frame_number(encode_frame(Frame(U32_MAX, []))) == U32_MAX
    over = encode_frame(Frame(2**32, [b"a"]))          # the Python encoder does not check
    refused(decode_frame, over)
    refused(protocol.frame_number, over)


def test_frame_varints_longer_than_5_bytes_are_refused():
    five = bytes([0xC1, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00, 0x00])   # 0 in 5 bytes: allowed
    assert decode_frame(five).number == 0
    six = bytes([0xC1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00, 0x00])
    refused(decode_frame, six)


def _frame_with_slots(count: int) -> bytes:
    out = bytearray((0xC1, 0, 0))
    put_varint(out, count)
    out += bytes((count + 7) >> 3)                     # no slot has an input
    return bytes(out)


def test_frame_slot_count_0_and_256_accepted_257_refused():
    assert decode_frame(_frame_with_slots(0)).inputs == []
    assert decode_frame(_frame_with_slots(256)).inputs == [None] * 256
    assert decode_frame(encode_frame(Frame(1, [b"i"] * 256))).inputs == [b"i"] * 256
    refused(decode_frame, _frame_with_slots(257))


def _frame_with_event(kind: int, slot: int = 0, name: bytes = b"p") -> bytes:
    out = bytearray((0xC1, 0, protocol.FLAG_EVENTS, 1, 0, 1, kind))
    put_varint(out, slot)
    put_varint(out, len(name))
    return bytes(out + name)


def test_frame_event_kinds_within_the_table_decode():
    for code, kind in enumerate(EVENT_KINDS):
        assert decode_frame(_frame_with_event(code)).events == [[kind, 0, "p"]]
    assert _frame_with_event(0) == encode_frame(Frame(0, [None], [["join", 0, "p"]]))


@pytest.mark.parametrize("kind", [len(EVENT_KINDS), len(EVENT_KINDS) + 1, 0xFF])
def test_frame_event_kind_at_or_past_the_table_size_is_refused(kind):
    assert refused(decode_frame, _frame_with_event(kind)).code == "malformed"


def test_frame_event_slot_255_accepted_256_refused():
    assert decode_frame(_frame_with_event(0, slot=255)).events == [["join", 255, "p"]]
    refused(decode_frame, _frame_with_event(0, slot=256))


def test_frame_event_name_of_256_bytes_accepted_257_refused():
    # 64 characters of up to 4 bytes of UTF-8 each
    name = "😀" * 64
    assert decode_frame(_frame_with_event(1, name=name.encode())).events == [["leave", 0, name]]
    refused(decode_frame, _frame_with_event(1, name=name.encode() + b"x"))
    refused(decode_frame, _frame_with_event(1, name=b"\xff"))          # not UTF-8


def test_frame_input_of_2_20_minus_1_bytes_accepted_2_20_refused():
    big = bytes(2**20 - 1)
    assert decode_frame(encode_frame(Frame(0, [big]))).inputs == [big]
    refused(decode_frame, encode_frame(Frame(0, [big + b"x"])))


def test_frame_with_unknown_flags_or_trailing_bytes_is_refused():
    good = encode_frame(Frame(0, [b"a"]))
    refused(decode_frame, good + b"\x00")
    for bit in (0x08, 0x10, 0x80):
        bad = bytearray(good)
        bad[2] |= bit
        refused(decode_frame, bytes(bad))


# -- history blocks (section 9.2) ------------------------------------------------------------

def test_history_block_inflating_exactly_to_max_size_is_accepted_one_byte_over_refused():
    frames = [encode_frame(Frame(n, [b"x" * 100])) for n in range(50)]
    block = encode_history(0, frames)
    size = len(zlib.decompress(block))
    assert decode_history(block, size) == (0, frames)
    assert refused(decode_history, block, size - 1).code == "too_large"


def test_history_block_of_a_zlib_bomb_is_refused_by_the_size_guard():
    bomb = zlib.compress(pack(0, [bytes(10 * 1024 * 1024)]), 9)     # ~10 KiB -> 10 MiB
    assert refused(decode_history, bomb, 1024 * 1024).code == "too_large"


@pytest.mark.parametrize("block", [
    encode_history(5, [b"\xc1\x05\x00\x00"])[:-2],                     # truncated zlib stream
    encode_history(5, [b"\xc1\x05\x00\x00"]) + b"\x00",                # bytes after the stream
    b"not zlib",
    zlib.compress(msgpack.packb([5, ["str"]])),                        # str, not bin
    zlib.compress(msgpack.packb([5, [b"x"], 1])),                      # 3 elements
    zlib.compress(msgpack.packb([5, [b"x"]]) + b"\x00"),               # msgpack trailing byte
    zlib.compress(msgpack.packb([-1, [b"x"]])),                        # first frame < 0
    zlib.compress(msgpack.packb([2**32, []])),                         # first frame > u32
    zlib.compress(msgpack.packb([U32_MAX, [b"x", b"y"]])),             # runs past 2^32-1
    zlib.compress(msgpack.packb([True, [b"x"]])),                      # boolean frame number
    zlib.compress(msgpack.packb([0, b"x"])),                           # frames not an array
    zlib.compress(msgpack.packb(7)),
])
def test_malformed_history_blocks_are_refused(block):
    assert refused(decode_history, block).code == "malformed"


def test_history_block_boundaries_that_are_valid():
    assert decode_history(zlib.compress(msgpack.packb([0, []]))) == (0, [])
    assert decode_history(zlib.compress(msgpack.packb([U32_MAX, []]))) == (U32_MAX, [])
    assert decode_history(zlib.compress(msgpack.packb([U32_MAX, [b"x"]]))) == (U32_MAX, [b"x"])
    assert decode_history(zlib.compress(msgpack.packb([U32_MAX - 1, [b"x", b"y"]]))) \
        == (U32_MAX - 1, [b"x", b"y"])


# -- nothing but ProtocolError escapes (property) --------------------------------------------

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=80) | st.binary(max_size=80),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12)
known_types = st.sampled_from([JOIN, READY, CHECKSUM, LEAVE, INPUT, WELCOME, protocol.REFUSED,
                               protocol.ROOM_STATE, protocol.DESYNC, protocol.NOTICE,
                               protocol.INPUT_DELAY, protocol.FRAME, 0, -1])
messages = st.one_of(
    msgpack_values.map(lambda value: msgpack.packb(value, use_bin_type=True)),
    st.tuples(known_types, st.lists(msgpack_values, max_size=5)).map(
        lambda typed: pack(typed[0], *typed[1])),
    st.binary(max_size=200),
    st.binary(max_size=200).map(lambda data: b"\xc1" + data),
)


def only_protocol_error(decode, data: bytes, *args) -> None:
    try:
        decode(data, *args)
    except ProtocolError:
        pass


@settings(max_examples=400, deadline=None)
@given(messages)
def test_decoders_raise_only_protocol_error_on_any_input(data):
    only_protocol_error(decode_client_message, data)
    only_protocol_error(decode_relay_message, data)
    only_protocol_error(decode_relay_message, data, [b"a", None, b"c"])
    only_protocol_error(decode_frame, data)
    only_protocol_error(decode_frame, data, [b"a", None, b"c"])
    only_protocol_error(decode_history, data)
    only_protocol_error(decode_history, zlib.compress(data))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, U32_MAX),
       st.lists(st.one_of(st.none(), st.binary(max_size=6)), max_size=20),
       st.data())
def test_decode_frame_raises_only_protocol_error_on_damaged_frames(number, inputs, data):
    frame = bytearray(encode_frame(Frame(number, inputs, [["join", 0, "p"]] if inputs else [])))
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(1, len(frame) - 1))
        frame[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(frame)))
    only_protocol_error(decode_frame, bytes(frame[:cut]))
    only_protocol_error(decode_frame, bytes(frame[:cut]), inputs)


# -- edges found by mutation testing (tools/mutation.py) --------------------------------------

@pytest.mark.parametrize("number", [2**32 + 1, 2**33, 2**35 - 1])
def test_frame_numbers_past_2_32_are_refused_not_only_2_32_itself(number):
    assert refused(decode_client_message, pack(INPUT, number, b"x", -1)).code == "bad_frame"
    assert refused(decode_client_message, pack(CHECKSUM, number, 1)).code == "bad_frame"
    refused(decode_frame, encode_frame(Frame(number, [b"a"])))


@pytest.mark.parametrize("number", [0, 128])     # the bitmap at an even and an odd offset
@pytest.mark.parametrize("count, stray", [(12, 0x10), (12, 0x80), (9, 0x02), (15, 0x80)])
def test_bits_past_the_last_slot_of_a_two_byte_bitmap_are_refused(number, count, stray):
    out = bytearray((0xC1,))
    put_varint(out, number)
    out.append(0)
    put_varint(out, count)
    clean = bytes(out) + bytes(2)
    assert decode_frame(clean).inputs == [None] * count
    assert refused(decode_frame, bytes(out) + bytes((0, stray))).code == "malformed"


def test_every_proper_prefix_of_a_frame_is_refused():
    frame = Frame(300, [b"abc", None, b"", b"x" * 200], [["join", 3, "pé"], ["leave", 1, "q"]])
    data = encode_frame(frame)
    assert decode_frame(data) == frame
    for end in range(len(data)):
        refused(decode_frame, data[:end])


@pytest.mark.parametrize("count", [9, 16, 17, 256])
def test_inputs_repeated_from_the_previous_frame_round_trip_in_every_bitmap_byte(count):
    previous = [bytes([slot % 251]) for slot in range(count)]
    inputs = [p if slot % 3 else b"new" for slot, p in enumerate(previous)]
    frame = Frame(7, inputs, synthesized=[count - 1])
    data = encode_frame(frame, previous)
    assert len(data) < len(encode_frame(frame)), "repeats are sent as references"
    assert decode_frame(data, previous) == frame


# -- the block limits the spec states (section 2.2 and the history block of section 10) -------

def test_the_block_limits_are_the_ones_the_spec_states():
    import inspect
    import re
    from pathlib import Path

    spec = (Path(__file__).resolve().parents[2] / "docs" / "RELAY_PROTOCOL.md").read_text()
    [block_mib] = re.findall(r"^\| `max_block_size` \| (\d+) MiB \|", spec, re.M)
    [inflated_mib] = re.findall(r"the SDK refuses more than (\d+) MiB inflated", spec)
    assert protocol.MAX_BLOCK_SIZE == int(block_mib) * 1024 * 1024
    default = inspect.signature(decode_history).parameters["max_size"].default
    assert default == int(inflated_mib) * 1024 * 1024


# -- relay -> client messages (section 4.2): every field checked, as the C client does -------

WELCOME_BODY = {"room": "r", "player": "p", "slot": 0, "tick_rate": 30, "state": "waiting",
                "next_frame": 0, "history": 0, "spectator": False}


def test_a_welcome_without_the_spectator_flag_is_a_player_welcome():
    body = {key: value for key, value in WELCOME_BODY.items() if key != "spectator"}
    assert decode_relay_message(pack(WELCOME, body)).spectator is False
    spectator = {**WELCOME_BODY, "slot": None, "spectator": True}
    welcome = decode_relay_message(pack(WELCOME, spectator))
    assert (welcome.slot, welcome.spectator) == (None, True)
    edge = {**WELCOME_BODY, "slot": 2**31 - 1, "next_frame": U32_MAX, "history": U32_MAX}
    assert decode_relay_message(pack(WELCOME, edge)).next_frame == U32_MAX


@pytest.mark.parametrize("key, value", [
    ("room", 1), ("player", None), ("slot", -1), ("slot", 2**31), ("slot", "0"), ("slot", True),
    ("tick_rate", -1), ("tick_rate", 2**32), ("state", 0), ("next_frame", -1),
    ("next_frame", 2**32), ("history", -1), ("history", 1.0), ("spectator", 1)])
def test_a_welcome_field_of_the_wrong_type_or_range_is_malformed(key, value):
    assert refused(decode_relay_message, pack(WELCOME, {**WELCOME_BODY, key: value})).code == "malformed"


@pytest.mark.parametrize("key", sorted(set(WELCOME_BODY) - {"spectator"}))
def test_a_welcome_missing_a_field_is_malformed(key):
    body = {k: v for k, v in WELCOME_BODY.items() if k != key}
    assert refused(decode_relay_message, pack(WELCOME, body)).code == "malformed"


GOOD_RELAY_MESSAGES = [
    [protocol.REFUSED, "room_full", "the room is full"],
    [protocol.NOTICE, "already_joined", "text"],
    [protocol.ROOM_STATE, "running", 0],
    [protocol.ROOM_STATE, "ended", U32_MAX, "finished"],
    [protocol.ROOM_STATE, "ended", 5, None],
    [protocol.DESYNC, 7, {"a": 1, "b": -2}, ["b"], "minority"],
    [protocol.DESYNC, 7, {"a": 1, "b": 2**64 - 1}, [], "undecided", [["a"], ["b"]]],
    [protocol.INPUT_DELAY, 3, 80, 0, 100],
]


@pytest.mark.parametrize("message", GOOD_RELAY_MESSAGES, ids=lambda m: str(m[0]))
def test_well_formed_relay_messages_decode_as_sent(message):
    assert decode_relay_message(pack(*message)) == message


@pytest.mark.parametrize("message", [
    [protocol.REFUSED, "room_full"], [protocol.REFUSED, 1, "text"], [protocol.REFUSED, "c", None],
    [protocol.NOTICE, "code"], [protocol.NOTICE, "code", b"bytes"],
    [protocol.ROOM_STATE, "running"], [protocol.ROOM_STATE, 1, 0], [protocol.ROOM_STATE, "x", -1],
    [protocol.ROOM_STATE, "x", 2**32], [protocol.ROOM_STATE, "ended", 5, 7],
    [protocol.DESYNC, 7, {"a": 1}, ["a"]], [protocol.DESYNC, -1, {}, [], "v"],
    [protocol.DESYNC, 7, {"a": "1"}, [], "v"], [protocol.DESYNC, 7, {1: 1}, [], "v"],
    [protocol.DESYNC, 7, [], [], "v"], [protocol.DESYNC, 7, {}, ["a", 1], "v"],
    [protocol.DESYNC, 7, {}, [], None], [protocol.DESYNC, 7, {}, [], "v", [["a", 2]]],
    [protocol.DESYNC, 7, {}, [], "v", "groups"],
    [protocol.INPUT_DELAY, 3, 80, 0], [protocol.INPUT_DELAY, -1, 80, 0, 1],
    [protocol.INPUT_DELAY, 3, 80, 0, "1"], [protocol.INPUT_DELAY, 3, True, 0, 1],
], ids=lambda m: str(m))
def test_a_relay_message_missing_an_element_or_of_the_wrong_type_is_malformed(message):
    assert refused(decode_relay_message, pack(*message)).code == "malformed"


@pytest.mark.parametrize("message", [
    [protocol.REFUSED, "room_full", "text", "later"], [protocol.NOTICE, "c", "t", 1, 2],
    [protocol.ROOM_STATE, "ended", 5, "finished", {"more": 1}],
    [protocol.DESYNC, 7, {}, [], "undecided", [], "later"],
    [protocol.INPUT_DELAY, 3, 80, 0, 100, "later"],
], ids=lambda m: str(m[0]))
def test_elements_past_the_ones_a_relay_message_defines_are_ignored(message):
    # Section 4.2: later versions may append elements; a client ignores them.
    assert decode_relay_message(pack(*message)) == message


# -- edges found by mutation testing ---------------------------------------------------------

def test_a_varint_cut_short_far_into_a_frame_is_malformed():
    # Cut right before the event count and the event's slot, both past offset 256 (where
    # small-integer identity no longer holds): the varint reader must see the end itself.
    data = encode_frame(Frame(1, [bytes(290)], [["join", 0, "p"]]))
    event = bytes([EVENT_KINDS.index("join"), 0, 1]) + b"p"
    assert data.endswith(b"\x01" + event) and len(data) > 300
    for cut in (len(data) - len(event) - 1, len(data) - len(event) + 1, len(data) - 1):
        assert refused(decode_frame, data[:cut]).code == "malformed"


@pytest.mark.parametrize("slot", [2, 3, 9, -1])
def test_a_synthesized_slot_outside_the_frame_is_a_value_error_when_encoding(slot):
    with pytest.raises(ValueError, match="synthesized slot"):
        encode_frame(Frame(4, [b"a", b"b"], [], [slot]))


def test_the_frame_decoder_refuses_a_frame_it_already_decoded():
    frames = [encode_frame(Frame(n, [b"x%d" % n])) for n in range(3)]
    decoder = protocol.FrameDecoder()
    decoder.decode(frames[0])
    decoder.decode(frames[1])
    for stale in (frames[0], frames[1]):
        assert refused(decoder.decode, stale).code == "out_of_order"
    assert decoder.decode(frames[2]).number == 2


def test_frame_0_is_a_frame_number_like_any_other():
    assert decode_client_message(pack(INPUT, 0, b"x", -1)) == Input(0, b"x", -1)
    assert decode_client_message(pack(CHECKSUM, 0, 5)) == Checksum(0, 5)
    assert refused(decode_client_message, pack(INPUT, -1, b"x", -1)).code == "bad_frame"
