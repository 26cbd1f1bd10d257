"""Membership behaviours users rely on that no other test pinned (issue #24: each was a mutant
that survived the suite): ready marks across a leave, a slot taken over by a newcomer, the wait
before a desync verdict, the ``left``/``timed_out`` events, and the repair after the core
refused a block. Driven like tests/relay/test_room.py: a sans-I/O Room and its Actions, decoded as a
client would."""
from __future__ import annotations

import dataclasses

from relay import protocol
from relay.config import RelayConfig
from relay.server.room import DESYNC_WAIT_FRAMES, RUNNING, WAITING, Room

from test_room import Harness, make_room, running


def ready_marks(room: Room) -> dict[str, bool]:
    return {p["player"]: p["ready"] for p in room.info()["players"]}


# -- ready marks (RELAY_PROTOCOL 6.2, 10) --------------------------------------------------------

def test_rejoined_player_is_not_ready():
    harness = Harness(make_room(policy="ready", start_players=2, capacity=3))
    alice = harness.join("alice")
    harness.room.set_ready(alice.peer_id, 0.0)
    assert ready_marks(harness.room) == {"alice": True}
    harness.room.detach(alice.peer_id, "leave", 1.0)
    assert ready_marks(harness.room) == {"alice": False}, "a player that leaves loses its mark"
    harness.join("alice", now=2.0)                    # back on a new connection
    bob = harness.join("bob", now=3.0)
    harness.room.set_ready(bob.peer_id, 3.0)
    # Both are connected and start_players is met, but alice has not sent READY since she came
    # back: a stale mark would start the room here.
    assert ready_marks(harness.room) == {"alice": False, "bob": True}
    assert harness.room.state == WAITING


def test_player_reconnecting_over_a_live_connection_is_not_ready():
    # RELAY_PROTOCOL 10: the same player on a new connection (the old one not yet noticed as
    # gone) takes over the slot; a reconnect's ready mark has to be sent again.
    harness = Harness(make_room(policy="ready", start_players=2, capacity=3))
    alice = harness.join("alice")
    harness.room.set_ready(alice.peer_id, 0.0)
    alice2 = harness.join("alice", now=1.0)
    assert alice.disconnects == ["replaced"]
    bob = harness.join("bob", now=2.0)
    harness.room.set_ready(bob.peer_id, 2.0)
    assert ready_marks(harness.room) == {"alice": False, "bob": True}
    assert harness.room.state == WAITING
    harness.room.set_ready(alice2.peer_id, 3.0)
    assert harness.room.state == RUNNING


def test_newcomer_in_an_expired_slot_is_not_ready():
    harness = Harness(make_room(policy="ready", start_players=2, capacity=1, reconnect_grace=1.0))
    alice = harness.join("alice")
    harness.room.set_ready(alice.peer_id, 0.0)
    harness.room.detach(alice.peer_id, "timeout", 0.0)
    carol = harness.join("carol", now=5.0)            # takes alice's expired slot 0
    assert carol.welcome.slot == 0
    assert ready_marks(harness.room) == {"carol": False}


# -- slot takeover ---------------------------------------------------------------------------------

def test_slot_takeover_clears_checksums():
    harness, (ann, ben, cat) = running(("ann", "ben", "cat"), capacity=3, reconnect_grace=1.0)
    harness.tick(10)
    harness.checksum(cat, 5, 99)                      # cat's simulation had diverged...
    harness.room.detach(cat.peer_id, "timeout", 0.0)  # ...and cat is gone for good
    harness.checksum(ann, 5, 1)
    dave = harness.join("dave", now=5.0)              # takes cat's expired slot 2
    assert dave.welcome.slot == 2
    harness.checksum(ben, 5, 1)
    harness.tick(DESYNC_WAIT_FRAMES + 1)
    # ann and ben agree; cat's 99 must not be reported as dave's (a false desync naming him).
    assert ann.of_type(protocol.DESYNC) == [] and dave.of_type(protocol.DESYNC) == []
    assert harness.take_events("desync") == []
    # dave's own report for that frame is his, and agrees.
    harness.checksum(dave, 5, 1)
    assert ann.of_type(protocol.DESYNC) == []


# -- the wait before a desync verdict (RELAY_PROTOCOL 12) ------------------------------------------

def test_desync_verdict_waits_for_every_connected_player():
    harness, (ann, ben, cat) = running(("ann", "ben", "cat"))
    harness.tick(10)
    harness.checksum(ann, 4, 1)
    harness.checksum(ben, 4, 2)                       # a mismatch, but cat has not answered
    assert ann.of_type(protocol.DESYNC) == [], "a verdict from two of three answers"
    harness.tick(3)
    assert ann.of_type(protocol.DESYNC) == []
    harness.checksum(cat, 4, 1)                       # now the minority is known: ben
    assert ann.of_type(protocol.DESYNC) == [
        [protocol.DESYNC, 4, {"ann": 1, "ben": 2, "cat": 1}, ["ben"], "minority",
         [["ann", "cat"], ["ben"]]]]


def test_desync_verdict_comes_desync_wait_frames_after_the_mismatch_at_the_latest():
    harness, (ann, ben, cat) = running(("ann", "ben", "cat"))
    harness.tick(10)
    harness.checksum(ann, 4, 1)
    harness.checksum(ben, 4, 2)                       # open frame 10: due at open frame 40
    harness.tick(DESYNC_WAIT_FRAMES - 1)
    assert harness.room.open_frame == 10 + DESYNC_WAIT_FRAMES - 1
    assert ann.of_type(protocol.DESYNC) == []
    harness.tick()                                    # cat never answered: what arrived
    assert ann.of_type(protocol.DESYNC) == [
        [protocol.DESYNC, 4, {"ann": 1, "ben": 2}, [], "undecided", [["ann"], ["ben"]]]]
    harness.checksum(cat, 4, 1)                       # too late: reported once per frame
    assert len(ann.of_type(protocol.DESYNC)) == 1


# -- left / timed_out events (logs, Agones player tracking) ----------------------------------------

def test_leave_and_kick_emit_left_and_timeout_emits_timed_out():
    harness, (ann, ben, cat) = running(("ann", "ben", "cat"))
    harness.tick(3)
    harness.take_events()
    harness.room.detach(ann.peer_id, "leave", 1.0)
    harness.room.detach(ben.peer_id, "timeout", 1.0)
    harness.room.kick("cat", 1.0)
    harness.pump()
    events = [(e.kind, e.detail) for e in harness.take_events() if e.kind in ("left", "timed_out")]
    assert events == [
        ("left", {"player": "ann", "slot": 0, "reason": "leave", "frame": 3}),
        ("timed_out", {"player": "ben", "slot": 1, "reason": "timeout", "frame": 3}),
        ("left", {"player": "cat", "slot": 2, "reason": "kicked", "frame": 3}),
    ]


def test_a_player_leaving_a_waiting_room_emits_left():
    harness = Harness(make_room(policy="admin"))
    ann = harness.join("ann")
    harness.room.detach(ann.peer_id, "disconnect", 1.0)
    harness.pump()
    assert [e.detail for e in harness.take_events("left")] == [
        {"player": "ann", "slot": 0, "reason": "disconnect", "frame": 0}]


def test_a_replaced_connection_emits_no_left_event():
    # RELAY_PROTOCOL 10: the old connection's membership ends silently, only "reconnected".
    harness, (_ann, ben) = running(("ann", "ben"))
    harness.take_events()
    harness.join("ben", now=1.0)
    harness.room.detach(ben.peer_id, "timeout", 2.0)   # the old peer's own disconnect, later
    harness.pump()
    kinds = [e.kind for e in harness.take_events()]
    assert "reconnected" in kinds and "left" not in kinds and "timed_out" not in kinds


def test_left_and_timed_out_events_reach_agones_player_tracking():
    config = RelayConfig()
    server = _server(config)
    tracked: list[tuple[str, str]] = []
    server.agones.player_joined = lambda player: tracked.append(("joined", player))
    server.agones.player_left = lambda player: tracked.append(("left", player))
    room = Room("arena", config.rooms, 30, 0.0, start_policy="admin")
    server.rooms["arena"] = room
    room.join(1, "ann", False, 0.0)
    room.join(2, "ben", False, 0.0)
    room.detach(1, "leave", 1.0)
    room.detach(2, "timeout", 1.0)
    for event in room.take_events():
        server._mirror_to_agones(room, event)
    assert tracked == [("joined", "arena/ann"), ("joined", "arena/ben"),
                       ("left", "arena/ann"), ("left", "arena/ben")]


# -- the core refuses a block (RELAY_PROTOCOL 9.2: repair at the next tick) -------------------------

def test_refused_history_block_is_repaired_at_the_next_tick():
    harness, (ann, _ben) = running()
    harness.tick(7)
    late = harness.join("late")
    assert late.blocks == [(0, ann.frame_bytes)]      # frames 0..6 (the client never gets it:)
    harness.room.on_send_failed(late.peer_id, "block")
    late.blocks.clear()
    harness.tick()
    # The repair starts at the refused block's first frame and reaches the newest closed frame.
    assert late.blocks == [(0, ann.frame_bytes[:8])]
    assert [e.detail for e in harness.take_events("catch_up")] == [
        {"player": "late", "first": 0, "frames": 8}]
    harness.room.on_block_delivered(late.peer_id)
    harness.tick(3)
    assert len(late.blocks) == 1                      # delivered: nothing more to repair
    assert late.merged_frames() == ann.frame_bytes


def test_refused_catch_up_block_is_repaired_from_its_first_frame():
    harness, (ann, ben) = running(catchup_frames=3)
    harness.tick(2)
    harness.input(ben, 2, have=1)
    harness.tick(4)                                   # closed 0..5: ben (have 1) is 4 behind
    assert [first for first, _ in ben.blocks] == [2]
    harness.room.on_send_failed(ben.peer_id, "block")
    harness.tick()
    assert [first for first, _ in ben.blocks] == [2, 2]
    assert ben.blocks[-1][1] == ann.frame_bytes[2:7]


def test_refused_spectator_history_block_is_repaired_up_to_its_released_frames():
    harness, (ann, _ben) = running(spectator_delay=4)
    harness.tick(10)
    watcher = harness.join("watcher", spectator=True)
    assert watcher.blocks == [(0, ann.frame_bytes[:6])]
    harness.room.on_send_failed(watcher.peer_id, "block")
    harness.tick()
    assert watcher.blocks[-1] == (0, ann.frame_bytes[:7])


def _server(config: RelayConfig):
    from relay.server import RelayServer

    config = dataclasses.replace(config, security=dataclasses.replace(config.security,
                                                                      handshake_rate=0))
    return RelayServer(config)
