"""Sequence buffers: slot = seq % size with a tag check, across the 65535 -> 0 wrap."""
import pytest

from relay_core.seqbuf import SequenceBuffer


def test_an_entry_is_found_only_under_its_own_sequence_number():
    buf = SequenceBuffer(16)
    buf.add(5)
    assert 5 in buf
    assert 21 not in buf          # same slot, different tag
    buf.add(21)
    assert 21 in buf and 5 not in buf


def test_entries_survive_the_wrap():
    buf = SequenceBuffer(256)
    for seq in range(65530, 65536):
        buf.add(seq)
    for seq in range(0, 6):
        buf.add(seq)
    assert all(seq in buf for seq in list(range(65530, 65536)) + list(range(6)))
    assert 65529 not in buf and 6 not in buf


def test_remove_range_clears_skipped_slots_across_the_wrap():
    buf = SequenceBuffer(64)
    for seq in range(65500, 65536):
        buf.add(seq)
    for seq in range(0, 30):
        buf.add(seq)
    buf.discard_range(65534, 3)
    assert 65533 in buf and 4 in buf
    assert not any(seq in buf for seq in (65534, 65535, 0, 1, 2, 3))


def test_remove_range_wider_than_the_buffer_clears_everything():
    buf = SequenceBuffer(8)
    for seq in range(8):
        buf.add(seq)
    buf.discard_range(100, 200)
    assert not any(seq in buf for seq in range(8))


@pytest.mark.parametrize("size", [0, 3, 100, 65536])
def test_size_must_be_a_power_of_two_dividing_the_sequence_space(size):
    with pytest.raises(ValueError):
        SequenceBuffer(size)
