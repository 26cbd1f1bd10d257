"""Replay files: writing, reading back (also after a crash), the size cap, summaries, the CLI."""
import json
import os
import random
import shutil
import zlib

import msgpack
import pytest

from relay import replay
from relay.protocol import Frame, frame_number
from relay.replay import MAGIC, ReplayError, ReplayReader, ReplayWriter, main, summarize


def frame_bytes(number, players=3, skip_odd_for=None):
    """A FRAME message: every slot sends its input, except ``skip_odd_for`` on odd frames."""
    inputs = [bytes([slot, number % 7]) * 4 for slot in range(players)]
    if skip_odd_for is not None and number % 2:
        inputs[skip_odd_for] = None
    events = [["join", slot, f"p{slot}"] for slot in range(players)] if number == 0 else []
    return Frame(number, inputs, events).encode()


def writer(path, **options):
    settings = dict(room="lobby", tick_rate=60, players=["p0", "p1", "p2"], relay_version="9.9")
    settings.update(options)
    return ReplayWriter(path, **settings)


def write_replay(path, frames, **options):
    with writer(path, **options) as w:
        for number in range(frames):
            w.append_frame(number, frame_bytes(number))
    return w


# -- round trip -------------------------------------------------------------------------------

def test_frames_events_header_and_end_round_trip(tmp_path):
    path = tmp_path / "match.replay"
    expected = [frame_bytes(number, skip_odd_for=1) for number in range(1000)]
    w = writer(path, sync_every=25)
    for number, data in enumerate(expected):
        w.append_frame(number, data)
        if number == 500:
            w.append_event(500, "desync", {"frame": 500, "checksums": {"p0": 1, "p1": 2},
                                           "minority": ["p1"]})
    w.append_event(999, "kick", {"player": "p2", 7: "int keys survive"})
    assert w.frames == 1000
    w.close("all_left")
    assert w.closed and not w.truncated
    assert w.bytes_written == os.path.getsize(path)

    reader = ReplayReader(path)
    assert path.read_bytes().startswith(MAGIC)
    assert reader.header["t"] == "header" and reader.header["version"] == 2
    assert reader.header["room"] == "lobby" and reader.header["tick_rate"] == 60
    assert reader.header["players"] == ["p0", "p1", "p2"]
    assert reader.header["relay_version"] == "9.9"
    assert isinstance(reader.header["started_at"], float)
    assert list(reader.frames()) == list(enumerate(expected))
    assert reader.events() == [
        {"t": "event", "n": 500, "kind": "desync",
         "detail": {"frame": 500, "checksums": {"p0": 1, "p1": 2}, "minority": ["p1"]}},
        {"t": "event", "n": 999, "kind": "kick", "detail": {"player": "p2", 7: "int keys survive"}},
    ]
    assert reader.end["t"] == "end" and reader.end["frames"] == 1000
    assert reader.end["reason"] == "all_left"
    assert reader.end["ended_at"] >= reader.header["started_at"]
    assert reader.complete and reader.problem is None and reader.frame_count == 1000


def test_the_file_is_a_magic_line_and_one_zlib_stream_of_msgpack_maps(tmp_path):
    """The documented format, read without relay.replay: what another language would do."""
    path = tmp_path / "match.replay"
    write_replay(path, 3)
    blob = path.read_bytes()
    assert blob[:10] == b"RLREPLAY2\n"
    inflater = zlib.decompressobj()
    raw = inflater.decompress(blob[10:])
    assert inflater.eof and not inflater.unused_data
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    records = list(unpacker)
    assert [record["t"] for record in records] == ["header", "frame", "frame", "frame", "end"]
    assert [record["data"] for record in records[1:4]] == [frame_bytes(n) for n in range(3)]
    assert records[2]["data"][0] == 0xC1 and frame_number(records[2]["data"]) == 1


def test_frames_streams_and_can_be_read_again(tmp_path):
    path = tmp_path / "match.replay"
    write_replay(path, 100)
    reader = ReplayReader(path)
    stream = reader.frames()
    assert next(stream) == (0, frame_bytes(0))
    stream.close()                         # abandoned half-way: nothing breaks
    assert [number for number, _ in reader.frames()] == list(range(100))
    assert reader.complete


def test_an_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "match.replay"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        writer(path)
    assert path.read_bytes() == b"precious"


def test_context_manager_closes_with_error_reason_on_exception(tmp_path):
    path = tmp_path / "match.replay"
    with pytest.raises(RuntimeError):
        with writer(path) as w:
            w.append_frame(0, frame_bytes(0))
            raise RuntimeError("boom")
    reader = ReplayReader(path)
    assert reader.complete and reader.end["reason"] == "error" and reader.frame_count == 1


# -- crashes ----------------------------------------------------------------------------------

def test_a_copy_taken_while_the_writer_runs_reads_up_to_the_last_sync_point(tmp_path):
    path, copy = tmp_path / "live.replay", tmp_path / "copy.replay"
    w = writer(path, sync_every=10)
    for number in range(95):                # synced automatically after frame 89
        w.append_frame(number, frame_bytes(number))
    shutil.copy(path, copy)
    reader = ReplayReader(copy)
    frames = list(reader.frames())
    assert frames == [(n, frame_bytes(n)) for n in range(90)]
    assert not reader.complete and reader.end is None
    assert "not closed cleanly" in reader.problem and "after frame 89" in reader.problem

    w.append_event(94, "admin", {"action": "pause"})   # events are synced at once
    w.flush()
    shutil.copy(path, copy)
    reader = ReplayReader(copy)
    assert [n for n, _ in reader.frames()] == list(range(95))
    assert [event["kind"] for event in reader.events()] == ["admin"]
    assert not reader.complete
    w.close()
    assert ReplayReader(path).complete


def test_a_header_only_file_of_a_crashed_writer_is_readable(tmp_path):
    path, copy = tmp_path / "live.replay", tmp_path / "copy.replay"
    w = writer(path)
    shutil.copy(path, copy)                 # the header is synced by the constructor
    reader = ReplayReader(copy)
    assert reader.header["room"] == "lobby"
    assert list(reader.frames()) == [] and not reader.complete
    w.close()


def test_every_cut_point_yields_every_frame_before_the_last_sync_point(tmp_path):
    path = tmp_path / "match.replay"
    w = writer(path, sync_every=7)
    sync_points = [(w.bytes_written, 0)]     # (file size, frames readable) at each sync point
    for number in range(200):
        w.append_frame(number, frame_bytes(number, skip_odd_for=number % 3))
        if w.frames % 7 == 0:
            assert os.path.getsize(path) == w.bytes_written
            sync_points.append((w.bytes_written, w.frames))
    w.close()
    blob = path.read_bytes()
    everything = list(ReplayReader(path).frames())
    cuts = sorted(set(range(0, len(blob), 13)) | set(range(len(blob) - 40, len(blob)))
                  | {offset + delta for offset, _ in sync_points for delta in (-1, 0, 1)})
    cut_file = tmp_path / "cut.replay"
    for cut in cuts:
        cut_file.write_bytes(blob[:cut])
        guaranteed = max((frames for size, frames in sync_points if size <= cut), default=None)
        if guaranteed is None:                 # before the header's sync point
            try:
                reader = ReplayReader(cut_file)
            except ReplayError as error:
                assert any(text in str(error) for text in ("empty", "truncated", "before the header")), cut
            else:
                assert list(reader.frames()) == [] and not reader.complete, cut
            continue
        reader = ReplayReader(cut_file)
        frames = list(reader.frames())
        assert frames == everything[:len(frames)], cut
        assert len(frames) >= guaranteed, cut
        assert not reader.complete and reader.problem, cut


def test_corrupt_data_mid_stream_stops_the_reader_without_an_exception(tmp_path):
    path = tmp_path / "match.replay"
    w = writer(path, sync_every=10)
    sync_points = []
    for number in range(300):
        w.append_frame(number, frame_bytes(number, skip_odd_for=number % 3))
        if w.frames % 10 == 0:
            sync_points.append((w.bytes_written, w.frames))
    w.close()
    blob = path.read_bytes()
    everything = list(ReplayReader(path).frames())
    for offset in (len(blob) // 3, len(blob) // 2, len(blob) - 30, len(blob) - 2):
        damaged = bytearray(blob)
        damaged[offset:offset + 8] = bytes(b ^ 0x5A for b in damaged[offset:offset + 8])
        (tmp_path / "bad.replay").write_bytes(damaged)
        reader = ReplayReader(tmp_path / "bad.replay")
        frames = list(reader.frames())          # no exception
        # everything before the damaged sync interval comes back intact (zlib drops the output
        # of a failing call; the reader recovers it)
        intact = max(frames for size, frames in sync_points if size <= offset)
        assert len(frames) >= intact and frames[:intact] == everything[:intact], offset
        assert not reader.complete and reader.problem, offset


# -- writer rules -----------------------------------------------------------------------------

def test_frame_numbers_must_be_consecutive_from_zero(tmp_path):
    w = writer(tmp_path / "match.replay")
    with pytest.raises(ValueError, match="expected frame 0, got 1"):
        w.append_frame(1, frame_bytes(1))
    w.append_frame(0, frame_bytes(0))
    w.append_frame(1, frame_bytes(1))
    for wrong in (1, 3, 0, -1):
        with pytest.raises(ValueError, match="consecutive"):
            w.append_frame(wrong, frame_bytes(2))
    w.append_frame(2, frame_bytes(2))          # a refused frame leaves the writer usable
    with pytest.raises(TypeError):
        w.append_frame(3, "not bytes")
    w.close()
    assert [n for n, _ in ReplayReader(tmp_path / "match.replay").frames()] == [0, 1, 2]


def test_an_unserializable_event_is_refused_without_damaging_the_stream(tmp_path):
    path = tmp_path / "match.replay"
    w = writer(path)
    w.append_frame(0, frame_bytes(0))
    with pytest.raises(TypeError):
        w.append_event(0, "admin", {"who": object()})
    w.append_event(0, "admin", {"who": "ops"})
    w.append_frame(1, frame_bytes(1))
    w.close()
    reader = ReplayReader(path)
    assert reader.complete and reader.frame_count == 2
    assert [event["detail"] for event in reader.events()] == [{"who": "ops"}]


def test_close_is_idempotent_and_appends_after_close_are_refused(tmp_path):
    path = tmp_path / "match.replay"
    w = write_replay(path, 10)
    w.close("again")
    before = path.read_bytes()
    w.close("and again")
    w.flush()
    assert path.read_bytes() == before and w.bytes_written == len(before)
    assert ReplayReader(path).end["reason"] == "ended"
    with pytest.raises(ValueError, match="closed"):
        w.append_frame(10, frame_bytes(10))
    with pytest.raises(ValueError, match="closed"):
        w.append_event(10, "admin", {})


def test_long_end_reasons_are_cut(tmp_path):
    writer(tmp_path / "a.replay").close("x" * 1000)
    assert ReplayReader(tmp_path / "a.replay").end["reason"] == "x" * replay.MAX_REASON_BYTES
    writer(tmp_path / "b.replay").close("é" * 1000)            # cut at a character boundary
    assert ReplayReader(tmp_path / "b.replay").end["reason"] == "é" * (replay.MAX_REASON_BYTES // 2)


# -- size cap ---------------------------------------------------------------------------------

def noise_frame(number, rng):
    return Frame(number, [rng.randbytes(40), rng.randbytes(40)]).encode()


@pytest.mark.parametrize("max_bytes,sync_every", [(1024, 30), (4096, 30), (20_000, 1), (20_000, 500)])
def test_max_bytes_stops_the_file_growing_and_says_so_once(tmp_path, max_bytes, sync_every):
    path = tmp_path / "capped.replay"
    rng = random.Random(max_bytes)
    w = writer(path, players=["a", "b"], max_bytes=max_bytes, sync_every=sync_every)
    sent = []
    for number in range(2000):
        data = noise_frame(number, rng)
        sent.append(data)
        w.append_frame(number, data)
        if number == 5:
            w.append_event(5, "admin", {"action": "pause"})
    assert w.truncated
    kept = w.frames
    assert 0 < kept < 2000 and w.dropped_frames == 2000 - kept
    dropped_events = w.dropped_events                        # the pause, if already capped
    w.append_event(1999, "desync", {"frame": 1999})          # dropped too
    assert w.dropped_events == dropped_events + 1
    with pytest.raises(ValueError, match="consecutive"):     # still checked while dropping
        w.append_frame(5, sent[5])
    w.close("shutdown")
    size = os.path.getsize(path)
    assert size == w.bytes_written <= max_bytes
    # most of the budget is used: the cap is not hit early
    assert size > max_bytes - 700

    reader = ReplayReader(path)
    assert list(reader.frames()) == list(enumerate(sent[:kept]))
    truncations = [event for event in reader.events() if event["kind"] == "truncated"]
    assert len(truncations) == 1
    assert truncations[0]["n"] == kept and truncations[0]["detail"]["max_bytes"] == max_bytes
    assert reader.complete and reader.end["frames"] == kept and reader.end["reason"] == "shutdown"
    assert summarize(path)["truncated"]


@pytest.mark.parametrize("seed", range(6))
def test_the_cap_holds_for_mixed_data_and_sync_intervals(tmp_path, seed):
    rng = random.Random(seed)
    max_bytes = rng.randrange(1024, 60_000)
    path = tmp_path / "capped.replay"
    w = writer(path, players=["a", "b"], max_bytes=max_bytes, sync_every=rng.choice([1, 7, 30, 1000]))
    for number in range(3000):
        if rng.random() < 0.5:
            inputs = [rng.randbytes(rng.randrange(0, 300)), None]
        else:
            inputs = [b"same" * rng.randrange(1, 50), b"x"]
        w.append_frame(number, Frame(number, inputs).encode())
        if rng.random() < 0.01:
            w.append_event(number, "admin", {"blob": rng.randbytes(rng.randrange(0, 500))})
    w.close("capped " * 20)
    assert w.truncated and os.path.getsize(path) <= max_bytes
    reader = ReplayReader(path)
    assert reader.complete and reader.frame_count == w.frames


def test_a_generous_cap_changes_nothing(tmp_path):
    path = tmp_path / "capped.replay"
    w = write_replay(path, 500, max_bytes=1_000_000)
    assert not w.truncated and w.frames == 500
    reader = ReplayReader(path)
    assert reader.complete and reader.frame_count == 500 and reader.events() == []


def test_a_cap_too_small_for_the_header_keeps_just_header_and_closing_records(tmp_path):
    path = tmp_path / "tiny.replay"
    w = writer(path, max_bytes=100)
    assert w.truncated
    w.append_frame(0, frame_bytes(0))
    w.close()
    reader = ReplayReader(path)
    assert reader.complete and reader.frame_count == 0
    assert [(event["kind"], event["n"]) for event in reader.events()] == [("truncated", 0)]


# -- files that are not (good) replays --------------------------------------------------------

@pytest.mark.parametrize("content,message", [
    (b"", "empty file"),
    (b"PK\x03\x04" + bytes(100), "not a relay replay file"),
    (b"#!/bin/sh\necho hello\n", "not a relay replay file"),
    (b"RLREPLAY3\n" + zlib.compress(b"\x80"), "version 3 is not supported"),
    (b"RLREP", "truncated replay file"),
    (MAGIC, "ends before the header"),
    (MAGIC + b"\x78", "ends before the header"),
    (MAGIC + b"this is not zlib data at all", "corrupt compressed data"),
    (MAGIC + zlib.compress(msgpack.packb({"t": "frame", "n": 0, "data": b""})), "not a header"),
    (MAGIC + zlib.compress(msgpack.packb([1, 2, 3])), "not a header"),
    (MAGIC + zlib.compress(b"\xc1"), "corrupt record"),
    (MAGIC + zlib.compress(msgpack.packb({"t": "header", "version": 7})), "version 7"),
    (MAGIC + zlib.compress(msgpack.packb({"t": "header", "version": 2, "room": "r"})),
     "'tick_rate' is missing"),
    (MAGIC + zlib.compress(msgpack.packb({"t": "header", "version": 1, "room": "r"})),
     "does not match the file's magic"),
])
def test_foreign_empty_or_corrupt_files_raise_a_clear_replay_error(tmp_path, content, message):
    path = tmp_path / "file.bin"
    path.write_bytes(content)
    with pytest.raises(ReplayError, match=message) as error:
        ReplayReader(path)
    assert str(path) in str(error.value)
    assert isinstance(error.value, ValueError)


def test_missing_file_and_directory_raise_replay_error(tmp_path):
    with pytest.raises(ReplayError, match="no such file"):
        ReplayReader(tmp_path / "nope.replay")
    with pytest.raises(ReplayError, match="directory"):
        ReplayReader(tmp_path)


def test_garbage_after_a_clean_end_is_reported(tmp_path):
    path = tmp_path / "match.replay"
    write_replay(path, 5)
    with open(path, "ab") as file:
        file.write(b"junk")
    reader = ReplayReader(path)
    assert reader.frame_count == 5 and reader.end is not None
    assert not reader.complete and "after the end" in reader.problem


# -- summaries and the CLI --------------------------------------------------------------------

def summary_file(tmp_path, close=True):
    path = tmp_path / "summary.replay"
    w = writer(path, tick_rate=60, sync_every=50)
    for number in range(600):
        w.append_frame(number, frame_bytes(number, skip_odd_for=2))
    w.append_event(100, "desync", {"frame": 100})
    w.append_event(200, "desync", {"frame": 200})
    w.append_event(300, "kick", {"player": "p2"})
    if close:
        w.close("finished")
    return path, w


def test_summarize_reports_the_figures(tmp_path):
    path, _ = summary_file(tmp_path)
    summary = summarize(path)
    assert summary["room"] == "lobby" and summary["tick_rate"] == 60
    assert summary["players"] == ["p0", "p1", "p2"]
    assert summary["frames"] == 600 and summary["duration_s"] == 10.0
    assert (summary["first_frame"], summary["last_frame"]) == (0, 599)
    assert summary["events"] == {"desync": 2, "kick": 1}
    assert summary["membership"] == {"join": 3}
    assert summary["inputs_per_player"] == [
        {"slot": 0, "player": "p0", "inputs": 600, "synthesized": 0},
        {"slot": 1, "player": "p1", "inputs": 600, "synthesized": 0},
        {"slot": 2, "player": "p2", "inputs": 300, "synthesized": 0}]
    assert summary["complete"] and summary["end_reason"] == "finished"
    assert summary["problem"] is None and not summary["truncated"]
    assert summary["file_bytes"] == os.path.getsize(path)
    assert summary["compression_ratio"] > 3            # repetitive frames compress well
    assert summary["raw_bytes"] > summary["file_bytes"]
    assert summary["bad_frames"] == 0


def test_summarize_a_crashed_file_and_late_joiners(tmp_path):
    path = tmp_path / "late.replay"
    w = writer(path, players=["a"], sync_every=1)
    w.append_frame(0, Frame(0, [b"x"]).encode())
    w.append_frame(1, Frame(1, [b"x", None], [["join", 1, "late"]]).encode())
    w.append_frame(2, Frame(2, [b"x", b"y"]).encode())
    w.append_frame(3, b"\x93\x01\x02\x03")            # not a FRAME message: counted, not fatal
    summary = summarize(path)                          # still open: reads as a crashed file
    assert summary["frames"] == 4 and not summary["complete"]
    assert summary["end_reason"] is None and "not closed cleanly" in summary["problem"]
    assert summary["inputs_per_player"] == [
        {"slot": 0, "player": "a", "inputs": 3, "synthesized": 0},
        {"slot": 1, "player": "late", "inputs": 1, "synthesized": 0}]
    assert summary["bad_frames"] == 1
    assert "INCOMPLETE" in replay.format_summary(summary)
    w.close()


def test_summarize_an_empty_match(tmp_path):
    path = tmp_path / "empty.replay"
    writer(path).close()
    summary = summarize(path)
    assert summary["frames"] == 0 and summary["first_frame"] is None
    assert summary["duration_s"] == 0.0 and summary["complete"]
    assert "none" in replay.format_summary(summary)


def test_inspect_prints_the_summary(tmp_path, capsys):
    path, _ = summary_file(tmp_path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lobby" in out and "600 (0..599)" in out and "10.0 s at 60 Hz" in out
    assert "complete, ended: finished" in out and "desync 2" in out and "2:p2 300" in out


def test_inspect_json_is_valid_json_of_the_summary(tmp_path, capsys):
    path, _ = summary_file(tmp_path)
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == summarize(path)


def test_inspect_a_missing_or_corrupt_file_fails_with_one_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.replay")]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "no such file" in captured.err
    (tmp_path / "bad.replay").write_bytes(b"hello")
    assert main(["inspect", str(tmp_path / "bad.replay"), "--json"]) == 1
    assert "not a relay replay file" in capsys.readouterr().err


def test_add_arguments_mounts_under_a_parent_cli(tmp_path, capsys):
    import argparse

    path, _ = summary_file(tmp_path)
    parser = argparse.ArgumentParser(prog="relay")
    sub = parser.add_subparsers(dest="command", required=True)
    replay.add_arguments(sub.add_parser("replay"))
    args = parser.parse_args(["replay", "inspect", str(path)])
    assert args.command == "replay" and args.func(args) == 0
    assert "lobby" in capsys.readouterr().out


def _version_1_file(path, frames) -> None:
    """A replay as version 1 wrote it: magic RLREPLAY1, header version 1, each frame the older
    msgpack FRAME ``[30, number, inputs, events]`` (the module docstring)."""
    records = [{"t": "header", "version": 1, "room": "old", "tick_rate": 30, "started_at": 1.5,
                "players": ["a", "b"], "relay_version": "0.1"}]
    records += [{"t": "frame", "n": n, "data": msgpack.packb(frame, use_bin_type=True)}
                for n, frame in enumerate(frames)]
    records.append({"t": "end", "frames": len(frames), "reason": "finished", "ended_at": 2.0})
    compressor = zlib.compressobj()
    body = b"".join(compressor.compress(msgpack.packb(r, use_bin_type=True)) for r in records)
    path.write_bytes(b"RLREPLAY1\n" + body + compressor.flush())


def test_a_version_1_replay_reads_back_with_its_msgpack_frames(tmp_path):
    path = tmp_path / "v1.replay"
    _version_1_file(path, [[30, 0, [b"a0", None], [["join", 0, "a"]]], [30, 1, [b"a1", b"b1"], []]])
    reader = ReplayReader(path)
    assert reader.version == 1 and reader.header["room"] == "old" and reader.complete
    assert list(reader.decoded_frames()) == [
        Frame(0, [b"a0", None], [["join", 0, "a"]]), Frame(1, [b"a1", b"b1"], [])]


@pytest.mark.parametrize("frame", [[31, 0, [], []], [30, "0", [], []], [30, 0, {}, []], [30, 0]])
def test_a_version_1_frame_of_another_layout_is_a_protocol_error(tmp_path, frame):
    from relay.protocol import ProtocolError

    path = tmp_path / "v1.replay"
    _version_1_file(path, [frame])
    with pytest.raises(ProtocolError) as refusal:
        list(ReplayReader(path).decoded_frames())
    assert refusal.value.code == "malformed"


def late_joiner_file(tmp_path):
    """A match that started with alice alone; bob joined slot 1 at frame 5, and after bob's
    grace ran out carol took slot 1 at frame 9."""
    path = tmp_path / "late.replay"
    with writer(path, players=["alice"], tick_rate=30) as w:
        for number in range(12):
            events = {0: [["join", 0, "alice"]], 5: [["join", 1, "bob"]],
                      9: [["join", 1, "carol"]]}.get(number, [])
            inputs = [b"a"] if number < 5 else [b"a", b"b"]
            w.append_frame(number, Frame(number, inputs, events).encode())
    return path


def test_inspect_lists_late_joiners_in_the_header(tmp_path, capsys):
    path = late_joiner_file(tmp_path)
    summary = summarize(path)
    assert summary["players"] == ["alice", "bob"]
    assert summary["late_joiners"] == [{"slot": 1, "player": "bob", "frame": 5},
                                       {"slot": 1, "player": "carol", "frame": 9}]
    assert main(["inspect", str(path)]) == 0
    players = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("players"))
    assert "0:alice" in players and "1:bob (joined at frame 5)" in players
    assert "1:carol at frame 9" in players
    assert main(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["players"] == ["alice", "bob"]


def test_players_there_at_the_start_are_not_late_joiners(tmp_path):
    path, _ = summary_file(tmp_path)
    assert summarize(path)["late_joiners"] == []


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path):
    """`relay replay inspect --json FILE | head`: the reader goes away, no traceback."""
    import subprocess
    import sys
    from pathlib import Path

    path, _ = summary_file(tmp_path)
    root = Path(__file__).resolve().parents[2]
    for module in ("relay.cli", "relay.replay"):
        args = ["replay", "inspect", "--json", str(path)] if module == "relay.cli" else \
            ["inspect", "--json", str(path)]
        read, write = os.pipe()
        os.close(read)              # the reader is gone before anything is written
        result = subprocess.run([sys.executable, "-m", module, *args], cwd=root, stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=60)
        os.close(write)
        assert result.stderr == "", result.stderr
        assert result.returncode == 141


def test_broken_pipe_in_process_returns_the_sigpipe_status(tmp_path, monkeypatch):
    from relay import cli

    class GoneReader:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    path, _ = summary_file(tmp_path)
    monkeypatch.setattr("sys.stdout", GoneReader())
    assert cli.main(["replay", "inspect", "--json", str(path)]) == cli.EXIT_BROKEN_PIPE
