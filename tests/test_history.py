"""A room's frame history: every frame comes back exactly, whether in memory or spooled."""
from __future__ import annotations

import os

import pytest

from relay import history as history_module
from relay.history import SPILL_FRAMES, FrameHistory


def frames(count: int) -> list[bytes]:
    return [b"\xc1frame-%d-" % n + bytes([n % 251]) * (n % 40) for n in range(count)]


def test_every_frame_reads_back_exactly_after_spooling():
    expected = frames(1000)
    history = FrameHistory(keep=10)
    for number, data in enumerate(expected):
        history.append(data)
        assert len(history) == number + 1
        assert history[number] is data                 # the newest are the objects sent
    assert history == expected and list(history) == expected
    assert [history[n] for n in range(1000)] == expected
    assert history[-1] is expected[-1]
    for start, stop in ((0, 1000), (0, 5), (3, 700), (985, 1000), (990, 2000), (500, 400)):
        assert history[start:stop] == expected[start:stop]
    assert history[::7] == expected[::7]
    with pytest.raises(IndexError):
        history[1000]
    # Only the newest stay in memory: the rest cost 8 bytes of offset per chunk of frames.
    assert len(history._recent) < 10 + SPILL_FRAMES
    assert history.memory_bytes() < 8 * (1000 // SPILL_FRAMES + 1) + (10 + SPILL_FRAMES) * 120
    history.close()
    assert len(history) == 0 and history == []


def test_frames_stay_in_memory_when_the_spool_file_fails(monkeypatch, tmp_path):
    expected = frames(300)
    history = FrameHistory(keep=4, directory=str(tmp_path))
    for data in expected[:100]:
        history.append(data)
    real_pwrite = os.pwrite

    def full_disk(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(history_module.os, "pwrite", full_disk)
    for data in expected[100:]:
        history.append(data)
    monkeypatch.setattr(history_module.os, "pwrite", real_pwrite)
    assert history == expected
    assert history[:300] == expected


def test_the_spool_file_is_unnamed_and_goes_with_the_history(tmp_path):
    history = FrameHistory(keep=2, directory=str(tmp_path))
    for data in frames(200):
        history.append(data)
    assert os.listdir(tmp_path) == []          # unlinked at creation: nothing left behind
    history.close()


def test_frames_of_every_size_read_back_exactly():
    # Spooled frames carry their length as a varint: 1, 2 and 3 bytes, and empty frames.
    sizes = [0, 1, 127, 128, 129, 300, 16383, 16384, 70000, 0, 5] * 7
    expected = [bytes([n % 256]) * size for n, size in enumerate(sizes)]
    history = FrameHistory(keep=3)
    for data in expected:
        history.append(data)
    assert history._spilled_count() > 0
    assert list(history) == expected
    for start in range(len(expected)):
        assert history[start] == expected[start]
        assert history[start:start + 40] == expected[start:start + 40]


def test_memory_does_not_grow_a_word_per_frame_over_a_long_match():
    # An hour of a 30 Hz room: what stays in memory is a few offsets, not one per frame.
    history = FrameHistory(keep=64)
    frame = b"\xc1" + bytes(20)
    for _ in range(30 * 3600):
        history.append(frame)
    assert len(history) == 30 * 3600
    assert history.memory_bytes() < 30 * 3600 * 8 / SPILL_FRAMES + (64 + SPILL_FRAMES) * 60
    assert history[12345] == frame and history[-1] is frame
    history.close()
