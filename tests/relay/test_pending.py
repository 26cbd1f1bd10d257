"""relay.server.pending.PendingInputs: a room's inputs waiting for their frames, encoded from
their rows when the frame closes (issue #16).

Checked against a dict of dicts as the oracle and relay.frames.encode_frame_of (the Python-facing
front of the same encoder, itself checked against relay/_frame_oracle.py) as the encoding's,
over runs long enough that inputs sent far ahead (past the 16 near rows) move into their row as
their frames come near, and with the "repeat" policy's copies from the previous frame.
"""
from __future__ import annotations

import random

import pytest

from relay import protocol
from relay.frames import encode_frame_of
from relay.server.pending import PendingInputs


def test_an_input_waits_for_its_frame_and_the_first_one_for_a_slot_stays():
    pending = PendingInputs(4, 121)
    assert pending.put(0, 1, b"b0") and pending.put(2, 3, b"d2")
    assert not pending.put(0, 1, b"again")          # a duplicate changes nothing
    assert pending.buffered() == {0: {1: b"b0"}, 2: {3: b"d2"}}
    assert pending.missing(4) == [0, 2, 3] and pending.missing(1) == [0]
    frame = pending.close(0, 4, None, None)
    assert protocol.decode_frame(frame).inputs == [None, b"b0", None, None]
    assert pending.first == 1 and pending.previous() == [None, b"b0", None, None]
    assert protocol.decode_frame(pending.close(1, 4, None, None)).inputs == [None] * 4
    assert pending.missing(4) == [0, 1, 2]
    assert protocol.decode_frame(pending.close(2, 4, None, None)).inputs == [None, None, None, b"d2"]
    assert pending.buffered() == {}


def test_a_frame_is_encoded_against_the_previous_one_with_its_made_up_inputs_and_events():
    pending = PendingInputs(3, 10)
    pending.put(0, 0, b"same")
    pending.put(0, 1, b"first")
    pending.close(0, 3, None, None)
    pending.put(1, 0, b"same")
    assert pending.missing(3) == [1, 2]
    assert pending.repeat(1) and not pending.repeat(2)      # slot 2 had no input to repeat
    assert not pending.repeat(0)                            # slot 0 has its own
    assert pending.missing(3) == [2]
    events = [["join", 2, "carol"]]
    frame = pending.close(1, 3, [1], events)
    assert frame == encode_frame_of(1, [b"same", b"first", None], events, [1],
                                    [b"same", b"first", None])
    assert pending.missing(3) == [0, 1, 2] and pending.missing(0) == ()


def test_only_the_oldest_frame_closes_and_only_held_frames_and_slots_are_put():
    pending = PendingInputs(2, 3)
    with pytest.raises(ValueError, match="not the oldest held"):
        pending.close(1, 2, None, None)
    with pytest.raises(ValueError, match="count 3 is outside 0 to 2"):
        pending.close(0, 3, None, None)
    with pytest.raises(ValueError, match="outside the frames held, 0 to 2"):
        pending.put(3, 0, b"x")
    pending.close(0, 2, None, None)
    with pytest.raises(ValueError, match="outside the frames held, 1 to 3"):
        pending.put(0, 0, b"late")
    assert pending.put(3, 1, b"x")
    for slot in (-1, 2):
        with pytest.raises(IndexError):
            pending.put(1, slot, b"x")
        with pytest.raises(IndexError):
            pending.drop_slot(slot, 1)
        with pytest.raises(IndexError):
            pending.repeat(slot)
    with pytest.raises(TypeError):
        pending.put(1, 0, None)
    with pytest.raises(TypeError):
        pending.put(1, 0, bytearray(b"x"))
    for capacity, span in ((0, 3), (2, 0)):
        with pytest.raises(ValueError):
            PendingInputs(capacity, span)


def test_a_frame_that_fails_to_encode_stays_open_as_it_was():
    pending = PendingInputs(2, 5)
    pending.put(0, 0, b"a")
    with pytest.raises(ValueError, match="synthesized slot 1 has no input"):
        pending.close(0, 2, [1], None)
    with pytest.raises(ValueError, match="synthesized slot 2 has no input"):
        pending.close(0, 2, [2], None)
    with pytest.raises(KeyError):
        pending.close(0, 2, None, [["no such kind", 0, "x"]])
    assert pending.first == 0 and pending.buffered() == {0: {0: b"a"}}
    assert protocol.decode_frame(pending.close(0, 2, None, None)).inputs == [b"a", None]


@pytest.mark.parametrize("capacity, span", [(3, 121), (1, 2), (8, 17), (5, 40), (300, 20)])
def test_matches_a_dict_of_frames_and_the_encoder_through_puts_drops_repeats_and_closes(capacity, span):
    rng = random.Random(capacity * 1000 + span)
    pending = PendingInputs(capacity, span)
    oracle: dict[int, dict[int, bytes]] = {}
    previous: list = [None] * capacity
    first = 0
    for _ in range(400):
        for _ in range(rng.randrange(0, 6)):
            frame = first + rng.randrange(0, span)
            slot = rng.randrange(0, capacity)
            # some long enough to make a row's buffer grow, some empty
            payload = rng.choice([b"", b"same", bytes(rng.randrange(0, 300)),
                                  f"{frame}:{slot}:{rng.random()}".encode()])
            stored = slot not in oracle.get(frame, {})
            assert pending.put(frame, slot, payload) is stored
            if stored:
                oracle.setdefault(frame, {})[slot] = payload
        if rng.random() < 0.05:
            slot, since = rng.randrange(0, capacity), first + rng.randrange(-2, span)
            pending.drop_slot(slot, since)
            for frame, by_slot in oracle.items():
                if frame >= since:
                    by_slot.pop(slot, None)
            oracle = {frame: by_slot for frame, by_slot in oracle.items() if by_slot}
        assert pending.buffered() == {frame: oracle[frame] for frame in sorted(oracle)}
        held = oracle.pop(first, {})
        count = rng.randrange(0, capacity + 1) if rng.random() < 0.2 else capacity
        assert list(pending.missing(count)) == [s for s in range(count) if s not in held]
        synthesized = []
        for slot in pending.missing(count):
            if rng.random() < 0.5:
                assert pending.repeat(slot) is (previous[slot] is not None)
                if previous[slot] is not None:
                    held[slot] = previous[slot]
                    synthesized.append(slot)
        inputs = [held.get(slot) for slot in range(capacity)]
        expected = encode_frame_of(first, inputs[:count], [], synthesized, previous[:count])
        assert pending.close(first, count, synthesized or None, None) == expected
        previous = inputs
        assert pending.previous() == previous
        first += 1
        assert pending.first == first


def test_an_empty_input_is_an_input_even_first_in_its_row():
    pending = PendingInputs(2, 4)
    assert pending.put(0, 1, b"") and not pending.put(0, 1, b"x")
    assert pending.missing(2) == [0]
    frame = pending.close(0, 2, None, None)
    assert frame == encode_frame_of(0, [None, b""], [], [])
    pending.put(1, 1, b"")
    assert pending.close(1, 2, None, None) == encode_frame_of(1, [None, b""], [], [], [None, b""])
