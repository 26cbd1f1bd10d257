"""Desync verdicts (who is the minority, or undecided), checksum histories in replays, and
``relay replay desync`` bundles, down to a real match over sockets."""
from __future__ import annotations

import asyncio
import json
import zlib

import msgpack
import pytest

from relay import protocol
from relay.protocol import Frame
from relay.replay import ReplayError, ReplayReader, ReplayWriter, desync_bundle, main
from relay.server.room import desync_verdict

from test_room import running


# -- verdicts ------------------------------------------------------------------------------------

@pytest.mark.parametrize("checksums,verdict,minority", [
    ({"a": 1, "b": 1, "c": 2}, "minority", ["c"]),
    ({"a": 1, "b": 1, "c": 1, "d": 2, "e": 3}, "minority", ["d", "e"]),
    ({"a": 1, "b": 2}, "undecided", []),
    ({"a": 1, "b": 1, "c": 2, "d": 2}, "undecided", []),
    ({"a": 1, "b": 2, "c": 3}, "undecided", []),
    ({"a": 5, "b": 5}, "agreed", []),
])
def test_verdicts(checksums, verdict, minority):
    result, groups, named = desync_verdict(checksums)
    assert (result, named) == (verdict, minority)
    assert sorted(p for group in groups for p in group) == sorted(checksums)
    assert [len(g) for g in groups] == sorted((len(g) for g in groups), reverse=True)


def test_two_against_two_is_undecided_and_the_first_diverging_frame_is_kept():
    harness, clients = running(("a", "b", "c", "d"))
    harness.tick(40)
    for client, value in zip(clients, (1, 1, 2, 2)):
        harness.checksum(client, 30, value)
    for client, value in zip(clients, (7, 7, 7, 9)):
        harness.checksum(client, 35, value)
    reports = clients[0].of_type(protocol.DESYNC)
    assert reports[0][1:] == [30, {"a": 1, "b": 1, "c": 2, "d": 2}, [], "undecided",
                              [["a", "b"], ["c", "d"]]]
    assert reports[1][1:] == [35, {"a": 7, "b": 7, "c": 7, "d": 9}, ["d"], "minority",
                              [["a", "b", "c"], ["d"]]]
    events = harness.take_events()
    details = [e.detail for e in events if e.kind == "desync"]
    assert [d["first_diverging_frame"] for d in details] == [30, 30]
    checksum_events = [e.detail for e in events if e.kind == "checksum"]
    assert len(checksum_events) == 8 and checksum_events[0] == {
        "frame": 30, "slot": 0, "player": "a", "value": 1}


def test_a_repeated_checksum_is_neither_kept_nor_recorded_twice():
    harness, (a, b, c) = running(("a", "b", "c"))
    harness.tick(5)
    harness.checksum(a, 2, 1)
    harness.checksum(a, 2, 99)
    assert [e.detail["value"] for e in harness.take_events("checksum")] == [1]


# -- replays and bundles -------------------------------------------------------------------------

def write_match(path, frames=120, diverge_at=60, players=("ann", "ben", "cat")):
    """A replay like the relay writes: frames with repeated inputs, checksums every 10 frames,
    cat's diverging from ``diverge_at``."""
    writer = ReplayWriter(path, room="m", tick_rate=30, players=list(players), relay_version="t")
    previous: list = []
    expected = []
    for number in range(frames):
        inputs = [bytes([slot, number // 7]) for slot in range(len(players))]
        frame = Frame(number, inputs, [["join", s, p] for s, p in enumerate(players)]
                      if number == 0 else [], [1] if number % 5 == 0 else [])
        writer.append_frame(number, frame.encode(previous))
        expected.append(frame)
        previous = inputs
        if number % 10 == 9:
            for slot, player in enumerate(players):
                value = 1000 + number + (1 if player == "cat" and number >= diverge_at else 0)
                writer.append_checksum(number, slot, player, value)
    writer.append_event(69, "desync", {"frame": 69, "minority": ["cat"], "verdict": "minority"})
    writer.close()
    return expected


def test_checksums_round_trip_through_a_replay(tmp_path):
    path = tmp_path / "m.replay"
    write_match(path)
    reader = ReplayReader(path)
    records = reader.checksums()
    assert len(records) == 12 * 3 and reader.complete
    assert records[0] == {"t": "checksum", "n": 9, "slot": 0, "player": "ann", "value": 1009}
    with pytest.raises(ValueError):
        ReplayWriter(tmp_path / "x.replay", room="m", tick_rate=30, players=[],
                     relay_version="t").append_checksum(1, 0, "a", 2**64)


def test_the_bundle_holds_the_frames_around_n_every_checksum_history_and_the_verdicts(tmp_path):
    path = tmp_path / "m.replay"
    expected = write_match(path)
    bundle = desync_bundle(path, 69, radius=5)
    assert bundle["format"] == "relay-desync-bundle" and bundle["version"] == 1
    assert (bundle["first_frame"], bundle["last_frame"]) == (64, 74)
    assert [f["n"] for f in bundle["frames"]] == list(range(64, 75))
    assert bundle["frames"][1] == {"n": 65, "inputs": expected[65].inputs, "synthesized": [1],
                                   "events": []}
    assert bundle["previous_inputs"] == expected[63].inputs
    assert sorted(bundle["checksums"]) == ["ann", "ben", "cat"]
    assert bundle["checksums"]["cat"][:2] == [[9, 1009], [19, 1019]]
    assert bundle["checksums"]["cat"][6] == [69, 1070]
    assert bundle["first_diverging_frame"] == 69 and bundle["last_agreeing_frame"] == 59
    assert bundle["at_frame"]["verdict"] == "minority" and bundle["at_frame"]["minority"] == ["cat"]
    assert bundle["at_first_diverging_frame"]["groups"] == [["ann", "ben"], ["cat"]]
    assert bundle["desyncs"] == [{"n": 69, "frame": 69, "minority": ["cat"], "verdict": "minority"}]
    whole = desync_bundle(path, 69, radius=5, from_start=True)
    assert whole["first_frame"] == 0 and whole["frames"][0]["events"][0] == ["join", 0, "ann"]


def test_the_cli_writes_json_and_msgpack_bundles(tmp_path, capsys):
    path = tmp_path / "m.replay"
    expected = write_match(path)
    out = tmp_path / "bundle.json"
    assert main(["desync", str(path), "--frame", "69", "--radius", "2", "-o", str(out)]) == 0
    assert "minority ['cat']" in capsys.readouterr().err
    bundle = json.loads(out.read_text())
    assert bundle["frames"][0]["inputs"] == [value.hex() for value in expected[67].inputs]
    packed = tmp_path / "bundle.msgpack"
    assert main(["desync", str(path), "--frame", "69", "-o", str(packed)]) == 0
    bundle = msgpack.unpackb(packed.read_bytes(), raw=False, strict_map_key=False)
    assert bundle["frames"][30]["inputs"] == expected[69].inputs
    assert main(["desync", str(path), "--frame", "69", "--radius", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["frame"] == 69


def test_the_cli_explains_a_frame_the_replay_does_not_hold(tmp_path, capsys):
    path = tmp_path / "m.replay"
    write_match(path, frames=50)
    assert main(["desync", str(path), "--frame", "500"]) == 1
    assert "frame 500 is not in the replay (it holds frames 0..49)" in capsys.readouterr().err
    assert main(["desync", str(tmp_path / "none.replay"), "--frame", "1"]) == 1
    with pytest.raises(ReplayError):
        desync_bundle(tmp_path / "none.replay", 1)


def test_version_1_replays_still_read(tmp_path):
    """A file written before compact frames: msgpack FRAMEs, magic RLREPLAY1."""
    records = [{"t": "header", "version": 1, "room": "old", "tick_rate": 30, "started_at": 1.0,
                "players": ["a"], "relay_version": "0.0"}]
    records += [{"t": "frame", "n": n, "data": msgpack.packb([30, n, [b"x"], []], use_bin_type=True)}
                for n in range(3)]
    records.append({"t": "end", "frames": 3, "reason": "ended", "ended_at": 2.0})
    path = tmp_path / "old.replay"
    path.write_bytes(b"RLREPLAY1\n" + zlib.compress(b"".join(msgpack.packb(r, use_bin_type=True)
                                                             for r in records)))
    reader = ReplayReader(path)
    assert reader.version == 1 and reader.complete
    assert [f.inputs for f in reader.decoded_frames()] == [[b"x"]] * 3
    assert desync_bundle(path, 1)["frames"][1]["inputs"] == [b"x"]


# -- a real match --------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_diverging_player_is_named_and_the_replay_reproduces_the_frames(tmp_path, capsys):
    from live_relay import running_room

    async def scenario():
        async with running_room(tmp_path, "d", ["ann", "ben", "cat"], start_players=3) as (
                server, players):
            for checkpoint in (20, 40, 60):
                await asyncio.gather(*[p.play_until(checkpoint + 2, 5) for p in players])
                for player in players:
                    value = 1234 + checkpoint + (checkpoint >= 40 and player.name == "cat")
                    player.client.report_checksum(checkpoint, value)
            await asyncio.gather(*[p.play_until(100, 5) for p in players])
            for player in players:
                desyncs = player.client.desyncs
                assert [d[0] for d in desyncs] == [40, 60]
                assert desyncs[0][2:] == [["cat"], "minority", [["ann", "ben"], ["cat"]]]
            return players[0].frames

    frames = asyncio.run(scenario())
    [replay] = list((tmp_path / "replays").glob("*.replay"))
    out = tmp_path / "bundle.json"
    assert main(["desync", str(replay), "--frame", "40", "--radius", "10", "-o", str(out)]) == 0
    bundle = json.loads(out.read_text())
    assert bundle["first_diverging_frame"] == 40 and bundle["last_agreeing_frame"] == 20
    assert bundle["at_frame"]["minority"] == ["cat"]
    assert {player: [n for n, _ in history] for player, history in bundle["checksums"].items()} \
        == {"ann": [20, 40, 60], "ben": [20, 40, 60], "cat": [20, 40, 60]}
    for entry in bundle["frames"]:
        live = frames[entry["n"]]
        assert entry["inputs"] == [None if v is None else v.hex() for v in live.inputs]
