"""A room's frame history: every frame comes back exactly, whether in memory or spooled."""
from __future__ import annotations

import os
import sys
import zlib

import pytest

from relay.server import history as history_module
from relay import protocol
from relay.server.history import SPILL_FRAMES, FrameHistory


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


# -- equality (tests compare histories with lists of frames) ------------------------------------

def test_a_history_equals_only_a_list_of_the_same_frames():
    expected = frames(100)
    history = FrameHistory(keep=10)               # frames 0..63 spooled, the rest in memory
    for data in expected:
        history.append(data)
    assert history._spilled_count() > 0
    assert history == list(expected) and not history != list(expected)
    assert history != [b"x"] * 100, "same length, other frames"
    for changed in (0, 40, 99):                   # in a spooled chunk and among the recent ones
        other = list(expected)
        other[changed] = other[changed] + b"!"
        assert history != other
    assert history != expected[:99] and history != expected + [b""]
    twin, stranger = FrameHistory(keep=3), FrameHistory(keep=50)
    for data in expected:
        twin.append(data)
        stranger.append(data[::-1])
    assert history == twin and history != stranger
    assert history != tuple(expected) and history != "frames"


# -- memory_bytes --------------------------------------------------------------------------------

def test_memory_bytes_grows_by_at_least_the_frames_held_in_memory():
    # The frames kept in memory are the bytes objects themselves plus the history's reference
    # to each: memory_bytes may not count less than that. At most 64 bytes a frame above the
    # payload (a bytes object's header is 33 bytes in CPython, a list slot 8) keeps it honest.
    history = FrameHistory(keep=40)
    before = history.memory_bytes()
    held = [b"\xc1" + bytes([n]) * (100 + n) for n in range(40)]   # none spooled yet
    for data in held:
        history.append(data)
    assert history._spilled_count() == 0
    grown = history.memory_bytes() - before
    payload = sum(len(data) for data in held)
    assert grown >= payload
    assert grown >= sum(sys.getsizeof(data) + 8 for data in held)
    assert grown <= payload + 64 * len(held)


def test_memory_bytes_counts_the_in_memory_spool_after_a_spool_failure(monkeypatch):
    def full_disk(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(history_module.os, "pwrite", full_disk)
    history = FrameHistory(keep=4)
    stored = frames(400)
    for data in stored:
        history.append(data)
    assert history._spilled_count() > 0 and history._file is None
    # Every frame, spooled or not, is in memory now: at least its bytes.
    assert history.memory_bytes() >= sum(len(data) for data in stored)
    assert history == stored


# -- a failing spool file leaks no file descriptor -----------------------------------------------

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_failed_spool_write_closes_its_file(monkeypatch, tmp_path):
    def full_disk(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(history_module.os, "pwrite", full_disk)
    before = open_fds()
    histories = [FrameHistory(keep=2, directory=str(tmp_path)) for _ in range(5)]
    for history in histories:
        for data in frames(100):
            history.append(data)
        assert history._file is None
    assert open_fds() == before
    for history in histories:
        assert list(history) == frames(100)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_spool_failing_after_a_good_start_closes_its_file(monkeypatch, tmp_path):
    # The first chunks went to the file; then the disk fills: they are read back into memory
    # and the file is closed.
    before = open_fds()
    history = FrameHistory(keep=2, directory=str(tmp_path))
    for data in frames(100):
        history.append(data)
    assert history._file is not None and open_fds() == before + 1
    spool = history._file

    def full_disk(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(history_module.os, "pwrite", full_disk)
    for data in frames(200)[100:]:
        history.append(data)
    assert spool.closed and history._file is None
    assert open_fds() == before
    assert history == frames(200)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_spool_file_that_cannot_be_created_leaves_no_descriptor(monkeypatch, tmp_path):
    def no_file(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(history_module.tempfile, "TemporaryFile", no_file)
    before = open_fds()
    history = FrameHistory(keep=2, directory=str(tmp_path))
    for data in frames(100):
        history.append(data)
    assert open_fds() == before and history == frames(100)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_close_releases_the_spool_file(tmp_path):
    before = open_fds()
    history = FrameHistory(keep=2, directory=str(tmp_path))
    for data in frames(100):
        history.append(data)
    assert open_fds() == before + 1
    history.close()
    assert open_fds() == before


# -- a spool that can be neither written nor read back ---------------------------------------

REAL_PREAD = os.pread


def disk_error(*args, **kwargs):
    raise OSError(5, "Input/output error")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_spool_neither_writable_nor_readable_keeps_every_new_frame_in_memory(monkeypatch, tmp_path):
    # Before: the failed read-back escaped append (a room's tick raised) with the file open.
    before = open_fds()
    history = FrameHistory(keep=2, directory=str(tmp_path))
    stored = frames(400)
    for data in stored[:100]:
        history.append(data)
    spooled = history._spilled_count()
    assert spooled > 0 and history._file is not None
    monkeypatch.setattr(history_module.os, "pwrite", disk_error)
    monkeypatch.setattr(history_module.os, "pread", disk_error)
    for number, data in enumerate(stored[100:300], 100):
        history.append(data)                            # never raises
        assert len(history) == number + 1 and history[number] is data
    # Nothing more was spooled; the file, the only copy of the spooled frames, is kept.
    assert history._spilled_count() == spooled and history._memory is None
    assert history._file is not None and open_fds() == before + 1
    assert history[spooled:300] == stored[spooled:300]
    # One failed spill per SPILL_FRAMES frames, not one per append.
    assert 1 <= history.spool_failures <= (300 - 100) // SPILL_FRAMES + 1
    # The disk recovers: what was spooled reads back, and spilling catches up.
    monkeypatch.undo()
    assert history == stored[:300]
    for data in stored[300:]:
        history.append(data)
    assert history == stored
    assert len(history._recent) < 2 + SPILL_FRAMES
    history.close()
    assert open_fds() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_spool_readable_again_after_a_double_failure_moves_to_memory(monkeypatch, tmp_path):
    before = open_fds()
    history = FrameHistory(keep=2, directory=str(tmp_path))
    stored = frames(300)
    for data in stored[:100]:
        history.append(data)
    monkeypatch.setattr(history_module.os, "pwrite", disk_error)
    monkeypatch.setattr(history_module.os, "pread", disk_error)
    for data in stored[100:150]:
        history.append(data)
    # Still no write, but the read-back works: the next try moves the spool to memory.
    monkeypatch.setattr(history_module.os, "pread", REAL_PREAD)
    for data in stored[150:]:
        history.append(data)
    assert history._file is None and history._memory is not None
    assert open_fds() == before
    assert history == stored
    assert len(history._recent) < 2 + SPILL_FRAMES


# -- the inflated-size guard of history blocks ---------------------------------------------------

def test_a_history_block_inflating_past_max_size_is_refused():
    stored = [bytes(1000)] * 100                  # ~100 KB that compress to very little
    block = protocol.encode_history(7, stored)
    inflated = len(zlib.decompress(block))
    assert len(block) < inflated // 50
    assert protocol.decode_history(block) == (7, stored)
    assert protocol.decode_history(block, max_size=inflated) == (7, stored)
    for limit in (inflated - 1, inflated // 2, 1024):
        with pytest.raises(protocol.ProtocolError) as refusal:
            protocol.decode_history(block, max_size=limit)
        assert refusal.value.code == "too_large"


def test_a_room_history_block_decodes_within_the_sdk_limit():
    # What the relay sends for a spooled history reads back through the guarded decoder.
    history = FrameHistory(keep=4)
    stored = frames(300)
    for data in stored:
        history.append(data)
    first, decoded = protocol.decode_history(protocol.encode_history(0, history[0:300]))
    assert (first, decoded) == (0, stored)


# -- edges found by mutation testing -------------------------------------------------------------

def test_iteration_reads_back_more_spilled_frames_than_one_read_holds():
    # Iteration reads the spool 4096 frames at a time: cross that boundary twice.
    stored = [b"%d" % n for n in range(2 * 4096 + 100)]
    history = FrameHistory(keep=8)
    for data in stored:
        history.append(data)
    assert history._spilled_count() > 2 * 4096
    assert list(history) == stored
    assert [data for data in history] == stored
    history.close()


def test_memory_bytes_counts_the_frames_in_memory_and_the_chunk_offsets_only():
    history = FrameHistory(keep=8)
    stored = frames(500)
    for data in stored:
        history.append(data)
    in_memory = stored[history._spilled_count():]
    chunks = history._spilled_count() // SPILL_FRAMES
    assert chunks > 0
    per_frame = sys.getsizeof(b"") + 8
    assert history.memory_bytes() == sum(len(data) + per_frame for data in in_memory) + 8 * chunks
    history.close()
    assert history.memory_bytes() == 0


def test_memory_bytes_counts_an_in_memory_spool_byte_for_byte(monkeypatch):
    history = FrameHistory(keep=4)
    monkeypatch.setattr(history_module.os, "pwrite", disk_error)
    stored = frames(200)
    for data in stored:
        history.append(data)
    spilled = history._spilled_count()
    # Each spilled frame costs its length prefix (one byte under 128) and its bytes.
    spool = bytearray()
    for data in stored[:spilled]:
        protocol.put_varint(spool, len(data))
        spool += data
    per_frame = sys.getsizeof(b"") + 8
    expected = (sum(len(data) + per_frame for data in stored[spilled:])
                + 8 * (spilled // SPILL_FRAMES) + len(spool))
    assert history.memory_bytes() == expected
    assert history == stored


def test_close_starts_the_history_afresh_on_a_new_spool(tmp_path):
    history = FrameHistory(keep=2, directory=str(tmp_path))
    for data in frames(300):
        history.append(data)
    history.close()
    assert len(history) == 0 and history.memory_bytes() == 0
    # Reused after close: frames spill from offset 0 of a new file, at the usual point.
    again = [b"again-%d" % n for n in range(200)]
    for number, data in enumerate(again):
        history.append(data)
        assert len(history._recent) < 2 + SPILL_FRAMES
    assert list(history) == again and history[:] == again
    assert history._size == sum(1 + len(data) for data in again[:history._spilled_count()])
    history.close()


def test_close_after_a_spool_failure_forgets_the_in_memory_spool(monkeypatch):
    history = FrameHistory(keep=2)
    monkeypatch.setattr(history_module.os, "pwrite", disk_error)
    for data in frames(100):
        history.append(data)
    assert history._memory is not None
    history.close()
    monkeypatch.undo()
    again = [b"next-%d" % n for n in range(100)]
    for data in again:
        history.append(data)
    assert list(history) == again and history._memory is None and history._file is not None
    history.close()


def test_a_short_spool_write_keeps_the_frames_in_memory(monkeypatch, tmp_path):
    real_pwrite = os.pwrite

    def short_write(fd, data, offset):
        return real_pwrite(fd, bytes(data)[:len(data) - 1], offset)

    history = FrameHistory(keep=2, directory=str(tmp_path))
    stored = frames(200)
    for data in stored[:50]:
        history.append(data)
    monkeypatch.setattr(history_module.os, "pwrite", short_write)
    for data in stored[50:]:
        history.append(data)
    assert history.spool_failures == 1 and history._file is None
    assert list(history) == stored


def test_a_spool_file_that_fails_to_close_still_leaves_the_frames_in_memory(monkeypatch, tmp_path):
    history = FrameHistory(keep=2, directory=str(tmp_path))
    stored = frames(200)
    for data in stored[:50]:
        history.append(data)
    spool = history._file
    real_close = spool.close

    def failing_close():
        real_close()
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(spool, "close", failing_close)
    monkeypatch.setattr(history_module.os, "pwrite", disk_error)
    for data in stored[50:]:
        history.append(data)                            # never raises
    assert history._file is None and list(history) == stored


def test_repeated_spool_failures_are_all_counted_and_logged_at_powers_of_two(monkeypatch, tmp_path):
    import structlog

    history = FrameHistory(keep=2, directory=str(tmp_path))
    for data in frames(40):
        history.append(data)
    assert history._file is not None
    monkeypatch.setattr(history_module.os, "pwrite", disk_error)
    monkeypatch.setattr(history_module.os, "pread", disk_error)
    with structlog.testing.capture_logs() as logs:
        for data in frames(40 + 10 * SPILL_FRAMES)[40:]:
            history.append(data)
    assert history.spool_failures == 10
    logged = [entry["failures"] for entry in logs if entry["event"] == "history_spool_failed"]
    assert logged == [1, 2, 4, 8]
    assert all(entry["log_level"] == "warning" for entry in logs)


@pytest.mark.parametrize("keep", [0, 1, 40, 64])
def test_the_newest_keep_frames_stay_in_memory_as_sent_and_spill_in_chunks_of_32(keep):
    # The spill point is keep + SPILL_FRAMES (32) frames in memory, after a close too.
    history = FrameHistory(keep=keep)
    assert history.keep == max(1, keep) and SPILL_FRAMES == 32
    kept = max(1, keep)
    for _ in range(2):
        stored = frames(kept + 5 * SPILL_FRAMES)
        for number, data in enumerate(stored):
            history.append(data)
            assert history[-1] is data
            in_memory = len(history._recent)
            assert in_memory == (number + 1 if number + 1 < kept + SPILL_FRAMES
                                 else kept + (number + 1 - kept) % SPILL_FRAMES)
        assert list(history) == stored
        history.close()


def test_the_spool_file_is_unbuffered():
    # A buffer would cost every room ~4 KB; frames go through os.pwrite/os.pread anyway.
    history = FrameHistory(keep=1)
    for data in frames(40):
        history.append(data)
    assert history._file is not None and not hasattr(history._file, "raw")
    history.close()


def test_reading_one_spilled_frame_reads_only_its_chunk(monkeypatch):
    history = FrameHistory(keep=1)
    stored = frames(1000)
    for data in stored:
        history.append(data)
    reads = []

    def recorded_pread(fd, size, offset):
        reads.append(size)
        return REAL_PREAD(fd, size, offset)

    monkeypatch.setattr(history_module.os, "pread", recorded_pread)
    assert history[900] == stored[900]
    chunk = stored[896:928]
    assert reads == [sum(1 + len(data) for data in chunk)]


def test_negative_steps_and_indexes_read_back_like_a_list():
    history = FrameHistory(keep=2)
    stored = frames(200)
    for data in stored:
        history.append(data)
    assert history[::-1] == stored[::-1] and history[150:10:-3] == stored[150:10:-3]
    assert history[-200] == stored[0]
    for index in (200, -201, 10_000):
        with pytest.raises(IndexError, match="^frame history index out of range$"):
            history[index]


def test_a_truncated_spool_file_is_an_os_error_saying_how_short(tmp_path):
    history = FrameHistory(keep=2, directory=str(tmp_path))
    stored = frames(100)
    for data in stored:
        history.append(data)
    first_chunk = sum(1 + len(data) for data in stored[:SPILL_FRAMES])
    second_chunk = sum(1 + len(data) for data in stored[SPILL_FRAMES:2 * SPILL_FRAMES])
    os.ftruncate(history._file.fileno(), first_chunk + 5)
    with pytest.raises(OSError, match=rf"^frame history file is short \(5 of {second_chunk} "
                                      rf"bytes\)$"):
        history[SPILL_FRAMES]
    assert history[0] == stored[0]                      # the intact chunk still reads
    assert history[99] is stored[99]                    # frames in memory are still there
