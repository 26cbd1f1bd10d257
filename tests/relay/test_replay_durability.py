"""Replay files: unique names per room id, flushes by time, the fsync policy (the writer and the
recorder; the kill -9 test is tests/e2e/test_replay_kill.py)."""
from __future__ import annotations

import os
import time

import pytest

from relay import replay
from relay.config import ConfigError, ReplaySettings, load_config
from relay.protocol import Frame
from relay.replay import ReplayReader, ReplayWriter
from relay.server.metrics import Metrics
from relay.server.recording import ReplayRecorder, replay_file_stem


class Log:
    def __init__(self):
        self.lines: list = []

    def info(self, event, **fields):
        self.lines.append(("info", event, fields))

    warning = error = info


def frame(number: int) -> bytes:
    return Frame(number, [b"a", b"b"], []).encode()


def recorder(tmp_path, **settings) -> tuple[ReplayRecorder, list]:
    refusals: list = []
    options = ReplaySettings(directory=str(tmp_path / "replays"), **settings)
    return (ReplayRecorder(options, 30, Metrics(), Log(),
                           lambda event, kind, **fields: refusals.append((event, kind, fields))),
            refusals)


# -- names ------------------------------------------------------------------------------------

def test_rooms_whose_names_map_to_one_slug_are_both_recorded(tmp_path):
    rec, refusals = recorder(tmp_path)
    for room in ("m/X", "m_X", "m?X"):
        rec.open(room, ["a", "b"])
    for room in ("m/X", "m_X", "m?X"):
        for number in range(5):
            rec.frame(room, number, frame(number))
        rec.close(room, "ended")
    assert refusals == []
    files = sorted((tmp_path / "replays").glob("*.replay"))
    assert len(files) == 3
    rooms = {ReplayReader(path).header["room"]: path for path in files}
    assert set(rooms) == {"m/X", "m_X", "m?X"}
    for room, path in rooms.items():
        assert sum(1 for _ in ReplayReader(path).frames()) == 5, room
        assert path.name.startswith("m_X-")


def test_the_same_room_twice_in_one_millisecond_never_overwrites(tmp_path, monkeypatch):
    monkeypatch.setattr("relay.server.recording.time.time", lambda: 1_764_165_753.123)
    rec, refusals = recorder(tmp_path)
    for round_ in range(3):
        rec.open("duel", ["a", "b"])
        for number in range(round_ + 1):
            rec.frame("duel", number, frame(number))
        rec.close("duel", "ended")
    assert refusals == []
    names = sorted(path.name for path in (tmp_path / "replays").glob("*.replay"))
    stem = replay_file_stem("duel", 1_764_165_753.123)
    assert names == [f"{stem}-2.replay", f"{stem}-3.replay", f"{stem}.replay"]
    assert stem.startswith("duel-20251126T140233.123Z-")
    frames = sorted(sum(1 for _ in ReplayReader(tmp_path / "replays" / name).frames())
                    for name in names)
    assert frames == [1, 2, 3]


def test_file_names_are_safe_and_bounded():
    stem = replay_file_stem("../../etc/passwd" + "x" * 200, 0.0)
    assert "/" not in stem and len(stem) < 80
    assert replay_file_stem("a", 0.0) != replay_file_stem("b", 0.0)
    assert replay_file_stem("\udcff", 0.0)      # undecodable text hashes too


def test_an_open_failure_is_logged_through_the_limit_log(tmp_path):
    blocker = tmp_path / "replays"
    blocker.write_text("a file, not a directory")
    rec, refusals = recorder(tmp_path)
    rec.open("m", ["a"])
    rec.open("n", ["a"])
    assert [(event, kind) for event, kind, _ in refusals] == [
        ("replay_open_failed", "replay_open_EEXIST")] * 2


# -- flush by time ----------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frames_on_disk(path) -> int:
    return sum(1 for _ in ReplayReader(path).frames())


def test_frames_reach_the_file_within_the_flush_interval(tmp_path):
    clock = Clock()
    path = tmp_path / "m.replay"
    writer = ReplayWriter(path, room="m", tick_rate=30, players=["a"], relay_version="t",
                          flush_interval=0.1, clock=clock)
    on_disk = []
    for number in range(90):
        clock.now += 1 / 30
        writer.append_frame(number, frame(number))
        on_disk.append(frames_on_disk(path))
    # A frame is readable from the file at most 0.1 s (3 frames at 30 Hz) after it was appended.
    assert all(number + 1 - held <= 3 for number, held in enumerate(on_disk)), on_disk
    assert on_disk[-1] >= 88
    writer.close()


def test_without_a_flush_interval_frames_wait_for_sync_every(tmp_path):
    path = tmp_path / "m.replay"
    writer = ReplayWriter(path, room="m", tick_rate=30, players=["a"], relay_version="t")
    for number in range(45):
        writer.append_frame(number, frame(number))
    assert frames_on_disk(path) == 30
    writer.close()


def test_flush_interval_0_flushes_every_frame(tmp_path):
    path = tmp_path / "m.replay"
    writer = ReplayWriter(path, room="m", tick_rate=30, players=["a"], relay_version="t",
                          flush_interval=0.0)
    for number in range(5):
        writer.append_frame(number, frame(number))
        assert frames_on_disk(path) == number + 1
    writer.close()


# -- fsync ------------------------------------------------------------------------------------

@pytest.fixture
def fsyncs(monkeypatch):
    calls: list = []
    real = os.fsync
    if replay._fsync_pool is not None:          # earlier tests' background fsyncs are done
        replay._fsync_pool.submit(lambda: None).result(timeout=10)

    def counting(fd):
        calls.append(fd)
        real(fd)
    monkeypatch.setattr(replay.os, "fsync", counting)
    return calls


def test_fsync_always_syncs_every_flush_in_the_caller(tmp_path, fsyncs):
    writer = ReplayWriter(tmp_path / "m.replay", room="m", tick_rate=30, players=["a"],
                          relay_version="t", flush_interval=0.0, fsync="always")
    fd = writer._file.fileno()
    for number in range(4):
        writer.append_frame(number, frame(number))
    assert fsyncs == [fd] * 5          # the header and 4 frames
    writer.close()
    assert len(fsyncs) == 6 and writer.fsync_errors == 0


def test_fsync_interval_syncs_in_the_background_at_most_every_interval(tmp_path, fsyncs):
    clock = Clock()
    writer = ReplayWriter(tmp_path / "m.replay", room="m", tick_rate=30, players=["a"],
                          relay_version="t", flush_interval=0.0, fsync="interval",
                          fsync_interval=1.0, clock=clock)
    for number in range(90):           # 3 s at 30 Hz
        clock.now += 1 / 30
        writer.append_frame(number, frame(number))
        pending = writer._fsync_pending
        if pending is not None:
            pending.result(timeout=5)
    assert writer.fsyncs in (2, 3)
    writer.close()
    writer._fsync_pending.result(timeout=5)
    assert writer.fsyncs in (3, 4) and len(fsyncs) == writer.fsyncs
    assert writer.fsync_errors == 0


def test_fsync_never_does_not_sync(tmp_path, fsyncs):
    with ReplayWriter(tmp_path / "m.replay", room="m", tick_rate=30, players=["a"],
                      relay_version="t", flush_interval=0.0) as writer:
        for number in range(10):
            writer.append_frame(number, frame(number))
    assert fsyncs == []


def test_replay_durability_settings_are_checked():
    config = load_config(environ={})
    assert (config.replay.flush_interval, config.replay.fsync,
            config.replay.fsync_interval) == (0.1, "interval", 1.0)
    with pytest.raises(ConfigError, match=r"^replay\.fsync='sometimes'"):
        load_config(environ={"RELAY_REPLAY_FSYNC": "sometimes"})
    with pytest.raises(ValueError):
        ReplayWriter("unused", room="m", tick_rate=30, players=[], relay_version="t",
                     fsync="sometimes")


def test_a_writer_open_for_a_while_stays_cheap(tmp_path):
    # 100 ms flushes cost a few bytes per flush, not a rewrite: 10 s at 30 Hz stays small.
    path = tmp_path / "m.replay"
    started = time.perf_counter()
    with ReplayWriter(path, room="m", tick_rate=30, players=["a", "b"], relay_version="t",
                      flush_interval=0.0) as writer:
        for number in range(300):
            writer.append_frame(number, frame(number))
    assert time.perf_counter() - started < 1.0
    assert path.stat().st_size < 300 * 20
