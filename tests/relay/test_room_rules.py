"""Rules a room keeps that mutation testing found unpinned (issue #24): names compared by value
(as they arrive from the network, never interned), the spec's exact figures (the desync wait,
response times in milliseconds), checksums for frames that are not closed yet, the checksum
window's memory bound, history blocks cut to fit the block limit, and what a delivered block
tells the room."""
from __future__ import annotations

import pytest

from relay import protocol
from relay.config import load_config
from relay.protocol import Checksum, Input

from test_room import Harness, running


def fresh(name: str) -> str:
    """``name`` as a new string object, as one decoded from a datagram is."""
    return "".join(list(name))


# -- names ------------------------------------------------------------------------------------

def test_a_player_rejoining_under_a_name_decoded_afresh_gets_its_own_slot_back():
    harness, (alice, bob) = running()
    harness.room.detach(alice.peer_id, "left", 1.0)
    harness.room.join(10, fresh("alice"), False, 1.5)
    assert harness.room.members[10].slot == 0
    assert len(harness.room.slots) == 2


def test_has_player_and_kick_match_the_exact_name_only():
    harness, (alice, bob) = running(("bob", "alice"))
    room = harness.room
    assert room.has_player(fresh("alice")) and room.has_player("bob")
    assert not room.has_player("carol") and not room.has_player("aaron")
    assert room.kick(fresh("alice"), 1.0) == bob.peer_id      # bob is "alice" (second to join)
    assert bob.peer_id not in room.members and alice.peer_id in room.members


def test_the_drop_late_input_policy_read_from_a_file_drops_late_inputs(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text('[rooms]\nlate_input_policy = "drop"\n')
    settings = load_config(path, environ={}).rooms
    from relay.server.room import Room

    harness = Harness(Room("arena", settings, 30, 0.0, start_policy="players", start_players=2,
                           capacity=4))
    alice = harness.join("alice")
    harness.join("bob")
    harness.tick(3)
    assert harness.input(alice, 1) == "refused:late_dropped"


# -- checksums and desyncs --------------------------------------------------------------------

def test_a_checksum_for_a_frame_not_closed_yet_is_ignored():
    harness, (alice, bob) = running()
    harness.tick(5)
    room = harness.room
    for frame in (5, 6, 50):                           # 5 is the open frame
        room.on_checksum(alice.peer_id, Checksum(frame, 1))
        room.on_checksum(bob.peer_id, Checksum(frame, 2))
    harness.tick(100)
    assert harness.take_events("checksum") == [] and harness.take_events("desync") == []


def test_a_desync_verdict_waits_exactly_30_frames_for_the_missing_checksums():
    # docs/RELAY_PROTOCOL.md section 12: "at the latest 30 frames later (DESYNC_WAIT_FRAMES)".
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    room = harness.room
    harness.tick(300)                                  # frames past 256: no small-int identity
    room.on_checksum(alice.peer_id, Checksum(290, 1))
    room.on_checksum(bob.peer_id, Checksum(290, 2))    # carol never answers
    harness.take_events()
    harness.tick(29)
    assert harness.take_events("desync") == []
    harness.tick(1)
    [desync] = harness.take_events("desync")
    assert desync.detail["frame"] == 290


def test_checksums_older_than_the_window_are_forgotten():
    harness, (alice, bob) = running(checksum_window=20)
    room = harness.room
    for number in range(200):
        harness.tick(1)
        room.on_checksum(alice.peer_id, Checksum(number, 7))
        room.on_checksum(bob.peer_id, Checksum(number, 8 if number % 50 == 0 else 7))
    # Frames 0..179 are out of the window: nothing of them is kept, frame 0 included.
    assert min(room.checksums) >= 200 - 21 and len(room.checksums) <= 21
    assert min(room.reported_desyncs, default=200) >= 200 - 21
    assert 0 not in room.checksums and 0 not in room.reported_desyncs


def test_desync_groups_are_listed_largest_first_then_by_name():
    from relay.server.room import desync_verdict

    verdict, groups, minority = desync_verdict({"a": 1, "b": 2, "c": 2})
    assert (verdict, groups, minority) == ("minority", [["b", "c"], ["a"]], ["a"])
    verdict, groups, minority = desync_verdict({"d": 1, "c": 2, "b": 3, "a": 3})
    assert groups == [["a", "b"], ["c"], ["d"]] and minority == ["c", "d"]


# -- input-delay advice -----------------------------------------------------------------------

def test_the_advice_reports_the_response_time_in_whole_milliseconds():
    from test_input_delay import advice_of, play, running_pair

    harness, (alice, bob) = running_pair(input_delay_margin=0.010, input_delay_max=100,
                                         max_input_lead=100)
    play(harness, [alice], 60, response=1.0, delay=40)
    frames, response_ms, late, inputs = advice_of(alice)[-1]
    assert response_ms == 1010 and frames == 31               # 1.01 s at 30 Hz: 30.3 frames


def test_the_advice_falls_with_half_a_frame_spare_once_a_window_allowed_it():
    from test_input_delay import advice_of, play, running_pair

    harness, (alice, bob) = running_pair(input_delay_window=30, input_delay_margin=0.0)
    play(harness, [alice], 60, response=0.110)               # 3.3 frames: 4
    assert advice_of(alice)[-1][0] == 4
    # 2.2 frames: 3 would do, and 2.2 + 0.5 = 2.7 leaves half a frame to spare under 3 (the
    # old times leave the window in 1 s, the lower advice must do for 1 s more).
    play(harness, [alice], 90, start=60, response=0.0733)
    assert advice_of(alice)[-1][0] == 3


# -- history blocks ---------------------------------------------------------------------------

def test_history_blocks_are_halved_until_each_fits_the_block_limit(monkeypatch):
    harness, (alice, bob) = running()
    harness.tick(40)
    limit = len(protocol.encode_history(0, harness.room.history[0:5]))
    monkeypatch.setattr(protocol, "MAX_BLOCK_SIZE", limit)
    late = harness.join("late")
    covered = []
    for first, frames in late.blocks:
        covered += range(first, first + len(frames))
        data = protocol.encode_history(first, frames)
        assert len(data) <= limit or len(frames) == 1
    assert covered == list(range(40)), "every frame once, in order"
    assert harness.room.members[late.peer_id].blocks_in_flight == len(late.blocks) > 1


def test_a_single_frame_larger_than_the_block_limit_goes_alone(monkeypatch):
    harness, (alice, bob) = running()
    harness.tick(6)
    monkeypatch.setattr(protocol, "MAX_BLOCK_SIZE", 1)  # every frame is too large
    late = harness.join("late")
    assert [(first, len(frames)) for first, frames in late.blocks] == [(n, 1) for n in range(6)]


def test_a_delivered_catch_up_block_sets_what_the_member_holds():
    harness, (alice, bob) = running(spectator_delay=10)
    harness.tick(30)
    room = harness.room
    watcher = harness.join("watcher", spectator=True)
    member = room.members[watcher.peer_id]
    assert [(first, len(frames)) for first, frames in watcher.blocks] == [(0, 20)]
    room.on_block_delivered(watcher.peer_id)
    assert member.have == 19 and not member.catching_up      # the block's last frame
    late = harness.join("late")
    room.on_block_delivered(late.peer_id)
    assert room.members[late.peer_id].have == room.open_frame - 1 == 29


def test_a_spectator_holding_only_frame_0_after_its_block_has_frame_0():
    harness, (alice, bob) = running(spectator_delay=10)
    room = harness.room
    harness.tick(room.settings.spectator_delay + 1 - room.open_frame)
    watcher = harness.join("watcher", spectator=True)
    assert [(first, len(frames)) for first, frames in watcher.blocks] == [(0, 1)]
    room.on_block_delivered(watcher.peer_id)
    assert room.members[watcher.peer_id].have == 0      # not past the block's one frame


def test_a_block_failure_with_none_in_flight_leaves_the_count_at_zero():
    harness, (alice, bob) = running()
    harness.tick(10)
    room = harness.room
    late = harness.join("late")
    member = room.members[late.peer_id]
    assert member.blocks_in_flight == 1
    room.on_send_failed(late.peer_id, "block")
    room.on_send_failed(late.peer_id, "block")           # a second report: nothing more in flight
    assert member.blocks_in_flight == 0
    harness.tick(1)                                       # the repair
    assert member.blocks_in_flight == 1 and member.catching_up
    room.on_block_delivered(late.peer_id)
    assert not member.catching_up


def test_inputs_sent_ahead_by_a_player_who_leaves_are_dropped_from_later_frames():
    harness, (alice, bob) = running()
    harness.tick(2)
    room = harness.room
    for frame in (2, 3, 4):
        assert harness.input(alice, frame, b"a%d" % frame) == "accepted"
    room.detach(alice.peer_id, "left", 1.0)
    harness.tick(3)
    frames = {frame.number: frame for frame in bob.frames}
    assert frames[2].inputs[0] == b"a2"                   # the open frame keeps it
    assert frames[3].inputs[0] is None and frames[4].inputs[0] is None
    assert room.on_input(bob.peer_id, Input(5, b"b", 4)) == "accepted"


def test_only_a_timeout_makes_a_timed_out_event_every_other_reason_a_left_one():
    from relay_core.wire import REASONS

    for reason in [*REASONS.values(), "left"]:
        harness, (alice, bob) = running()
        harness.room.detach(alice.peer_id, fresh(reason), 1.0)
        harness.pump()
        [event] = [e for e in harness.take_events() if e.kind in ("left", "timed_out")]
        assert event.kind == ("timed_out" if reason == "timeout" else "left"), reason


def test_spectators_past_max_spectators_are_refused_at_any_count():
    from relay.server.room import JoinRefused

    harness, (alice, bob) = running(max_spectators=300)
    for n in range(300):
        harness.room.join(100 + n, f"watcher{n}", True, 1.0)
    with pytest.raises(JoinRefused) as refusal:
        harness.room.join(999, "one-too-many", True, 1.0)
    assert refusal.value.code == "spectators_full"


def test_a_response_time_of_exactly_two_frames_is_advised_two_frames():
    # 32 Hz: a frame is 31.25 ms, and 62.5 ms is exact in binary, so no rounding blurs it.
    from relay.config import RoomSettings
    from relay.server.room import Room

    settings = RoomSettings(input_delay_margin=0.0)
    harness = Harness(Room("arena", settings, 32, 0.0, start_policy="players", start_players=2,
                           capacity=4))
    alice = harness.join("alice")
    harness.join("bob")
    for number in range(60):
        closed_at = number / 32
        harness.room.tick(closed_at)
        harness.pump()
        harness.room.on_input(alice.peer_id, Input(number + 6, b"i", number), closed_at + 0.0625)
        harness.pump()
    assert [m[1] for m in alice.of_type(protocol.INPUT_DELAY)][-1] == 2


def test_a_history_longer_than_one_block_goes_in_blocks_of_16384_frames():
    harness, (alice, bob) = running()
    for _ in range(16384 + 20):
        harness.room.tick(0.0)
    harness.room.take_actions()
    late = harness.join("late")
    assert [(first, len(frames)) for first, frames in late.blocks] == [(0, 16384), (16384, 20)]


def test_the_desync_wait_starts_with_the_first_disagreeing_checksum():
    harness, (a, b, c, d) = running(("a", "b", "c", "d"))
    room = harness.room
    harness.tick(10)
    room.on_checksum(a.peer_id, Checksum(5, 1))
    room.on_checksum(b.peer_id, Checksum(5, 1))          # agreeing so far: nothing to wait for
    harness.tick(20)
    room.on_checksum(c.peer_id, Checksum(5, 2))          # the disagreement; d never answers
    harness.take_events()
    harness.tick(29)
    assert harness.take_events("desync") == []
    harness.tick(1)
    assert [e.detail["frame"] for e in harness.take_events("desync")] == [5]


def test_the_first_desync_is_the_earliest_frame_even_when_a_later_one_is_reported_first():
    # A frame waits for every player's checksum (or 30 frames): frame 20 can be reported
    # before frame 10, whose third checksum never comes; first_diverging_frame is still 10.
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    room = harness.room
    harness.tick(40)
    harness.take_events()
    harness.checksum(alice, 10, 1)
    harness.checksum(bob, 10, 2)                       # carol never answers for frame 10
    for player, value in ((alice, 5), (bob, 6), (carol, 5)):
        harness.checksum(player, 20, value)
    [later] = harness.take_events("desync")
    assert later.detail["frame"] == 20 and later.detail["first_diverging_frame"] == 20
    harness.tick(30)
    [earlier] = harness.take_events("desync")
    assert earlier.detail["frame"] == 10 and earlier.detail["first_diverging_frame"] == 10
    assert room.first_desync == 10


def test_rooms_review_their_players_at_phases_spread_over_the_advice_interval():
    from relay.config import RoomSettings
    from relay.server.room import ADVICE_EVERY_FRAMES, Room

    phases = {Room(f"room-{i}", RoomSettings(), 30, 0.0).advice_phase for i in range(60)}
    assert all(0 <= phase < ADVICE_EVERY_FRAMES for phase in phases)
    assert len(phases) >= ADVICE_EVERY_FRAMES // 2       # crc32 of the ids spreads them
