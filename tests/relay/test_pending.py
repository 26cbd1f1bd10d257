"""relay.server.pending.PendingInputs: a room's inputs waiting for their frames (issue #16).

Checked against a dict of dicts as the oracle, over runs long enough that inputs sent far ahead
(past the C block of the next 16 frames) move into the block as their frames come near, and
with the payloads' reference counts back where they were once everything is taken or dropped.
"""
from __future__ import annotations

import random
import sys

import pytest

from relay.server.pending import PendingInputs


def test_an_input_waits_for_its_frame_and_the_first_one_for_a_slot_stays():
    pending = PendingInputs(4, 121)
    assert pending.put(0, 1, b"b0") and pending.put(2, 3, b"d2")
    assert not pending.put(0, 1, b"again")          # a duplicate changes nothing
    assert pending.buffered() == {0: {1: b"b0"}, 2: {3: b"d2"}}
    assert pending.take(0) == [None, b"b0", None, None]
    assert pending.first == 1
    assert pending.take(1) is None                  # none came for frame 1
    assert pending.take(2) == [None, None, None, b"d2"]
    assert pending.buffered() == {}


def test_only_the_oldest_frame_is_taken_and_only_held_frames_and_slots_are_put():
    pending = PendingInputs(2, 3)
    with pytest.raises(ValueError, match="not the oldest held"):
        pending.take(1)
    with pytest.raises(ValueError, match="outside the frames held, 0 to 2"):
        pending.put(3, 0, b"x")
    pending.take(0)
    with pytest.raises(ValueError, match="outside the frames held, 1 to 3"):
        pending.put(0, 0, b"late")
    assert pending.put(3, 1, b"x")
    for slot in (-1, 2):
        with pytest.raises(IndexError):
            pending.put(1, slot, b"x")
        with pytest.raises(IndexError):
            pending.drop_slot(slot, 1)
    with pytest.raises(TypeError):
        pending.put(1, 0, None)
    with pytest.raises(TypeError):
        pending.put(1, 0, bytearray(b"x"))
    for capacity, span in ((0, 3), (2, 0)):
        with pytest.raises(ValueError):
            PendingInputs(capacity, span)


@pytest.mark.parametrize("capacity, span", [(3, 121), (1, 2), (8, 17), (5, 40)])
def test_matches_a_dict_of_frames_through_puts_drops_and_takes(capacity, span):
    rng = random.Random(capacity * 1000 + span)
    pending = PendingInputs(capacity, span)
    oracle: dict[int, dict[int, bytes]] = {}
    first = 0
    for _ in range(600):
        for _ in range(rng.randrange(0, 6)):
            frame = first + rng.randrange(0, span)
            slot = rng.randrange(0, capacity)
            payload = f"{frame}:{slot}:{rng.random()}".encode()
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
        expected = oracle.pop(first, None)
        taken = pending.take(first)
        assert taken == (None if not expected else [expected.get(slot) for slot in range(capacity)])
        first += 1
        assert pending.first == first


def test_payload_references_are_given_back_by_take_drop_and_dealloc():
    payloads = [bytes([65 + i]) * (40 + i) for i in range(6)]     # not interned or cached
    before = [sys.getrefcount(p) for p in payloads]
    pending = PendingInputs(3, 40)
    pending.put(0, 0, payloads[0])
    pending.put(1, 1, payloads[1])
    pending.put(30, 2, payloads[2])                 # past the block: waits in a row of its own
    pending.put(31, 0, payloads[3])
    pending.put(2, 2, payloads[4])
    pending.put(5, 1, payloads[5])
    taken = pending.take(0)
    assert taken[0] is payloads[0]
    del taken
    pending.drop_slot(1, 0)                         # frames 1 and 5 lose slot 1
    pending.drop_slot(0, 31)
    assert pending.buffered() == {2: {2: payloads[4]}, 30: {2: payloads[2]}}
    for frame in range(1, 16):                      # frame 30 comes into the block on the way
        pending.take(frame)
    assert pending.buffered() == {30: {2: payloads[2]}}
    del pending
    assert [sys.getrefcount(p) for p in payloads] == before
