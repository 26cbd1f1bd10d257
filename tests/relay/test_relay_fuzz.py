"""The in-memory fuzz of the relay's network entry point (tests/fuzz/fuzz_relay.py): a short
seeded run in each security mode comes out clean and does real work, and each of its invariants
(numbered as in the harness's docstring) reports a violation when fed one -- a check that cannot
fail proves nothing. The same harness runs under AddressSanitizer in tests/deploy/test_sanitizers.py.
"""
from __future__ import annotations

import collections
import json
import pathlib
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fuzz"))

import fuzz_relay  # noqa: E402
from fuzz_relay import Membership, RelayFuzz, RoomRecord, Violations, check_room  # noqa: E402

from relay import protocol  # noqa: E402
from relay.protocol import Frame, Input, Welcome  # noqa: E402
from relay.server.room import RUNNING  # noqa: E402
from relay_core import BlockReceived, MessageReceived  # noqa: E402

SEED = 5


def frames(count: int, inputs=(b"a", b"b")) -> list[bytes]:
    """``count`` consecutive frames, each encoded on its own (no "same as previous" bits)."""
    return [protocol.encode_frame(Frame(number, list(inputs))) for number in range(count)]


class FakeRoom:
    """What the checks read of a room."""

    def __init__(self, history, members=None, spectator_delay=2):
        self.room_id = "arena"
        self.history = list(history)
        self.open_frame = len(self.history)
        self.members = members if members is not None else {}
        self.state = RUNNING
        self.settings = SimpleNamespace(spectator_delay=spectator_delay)
        self.drop_late_inputs = False


def membership(history, spectator=False, next_frame=0, peer_id=1):
    """A membership of peer ``peer_id`` in a room that closed ``history``, and its violations."""
    violations = Violations()
    member = SimpleNamespace(missing_from=None, catching_up=False)
    room = FakeRoom(history, {peer_id: member})
    record = RoomRecord(room, violations)
    welcome = Welcome("arena", "ann", None if spectator else 0, 30, RUNNING, next_frame, next_frame, spectator)
    return Membership(record, peer_id, member, welcome, violations), violations


# -- the harness runs clean ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", fuzz_relay.MODES)
def test_a_seeded_run_is_clean_and_reaches_every_path(mode):
    summary = fuzz_relay.fuzz(seed=SEED, runs=6, modes=(mode,))
    assert summary["violations"] == 0 and summary["exceptions"] == 0, summary["violation_samples"]
    assert summary["steps"] == 6 * fuzz_relay.STEPS_PER_RUN
    # Real work, not refusals only: members got frames live and in blocks, inputs were accepted
    # and found in their frames, repairs and every kind of resolution happened.
    assert summary["frames_closed"] > 1000 and summary["frames_received"] > 1000, summary
    assert summary["blocks_received"] > 20 and summary["sends_refused_queue_full"] > 0, summary
    assert summary["inputs"]["accepted"] > 100 and summary["inputs_verified"] > 100, summary
    for outcome in ("late", "duplicate", "refused:too_large", "refused:too_far_ahead", "refused:not_a_player",
                    "refused:not_running", "dropped:malformed_message", "dropped:wrong_channel"):
        assert summary["inputs"].get(outcome, 0) > 0, (outcome, summary["inputs"])
    assert summary["no_gap_checks"] > 1000 and summary["settle_checks"] > 0, summary
    assert summary["ended_room_checks"] > 0 and summary["admin"], summary
    assert summary["welcomes"] > 50 and summary["rooms_created"] >= 6, summary
    if mode == "token":
        assert {"wrong_room", "wrong_player"} <= set(summary["refused"]), summary["refused"]


def test_a_run_is_determined_by_its_seed():
    def counts():
        summary = fuzz_relay.fuzz(seed=SEED + 1, runs=2)
        return {k: v for k, v in summary.items() if k not in ("seconds", "steps_per_second")}

    assert counts() == counts()


def test_a_relay_bug_is_caught_by_a_run(monkeypatch):
    """End to end: history blocks that lack their first frame (a bug planted in the room)."""
    from relay.server import lobby
    from relay.server.room import Action, Room

    class BuggyRoom(Room):      # the compiled Room's methods cannot be patched; a subclass's can
        def _queue_history(self, member, start, stop):
            first = start + 1 if stop - start > 1 else start
            data = protocol.encode_history(first, self.history[first:stop])
            self.actions.append(Action("block", member.peer_id, data=data))
            member.blocks_in_flight += 1

    monkeypatch.setattr(lobby, "Room", BuggyRoom)
    summary = fuzz_relay.fuzz(seed=SEED, runs=2)
    assert summary["violations"] > 0 and "history_missing" in summary["violation_kinds"], summary


# -- each invariant can fail -----------------------------------------------------------------------

def test_1_an_exception_out_of_the_server_fails_the_run(monkeypatch, capsys):
    from relay.server import RelayServer

    def broken_tick(self, now):
        raise KeyError("planted")

    monkeypatch.setattr(RelayServer, "tick", broken_tick)
    assert fuzz_relay.main(["--runs", "1", "--mode", "open"]) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["exceptions"] == 1 and "KeyError: 'planted'" in summary["violation_samples"][0]


@pytest.mark.parametrize("case", ["history_shorter_than_open_frame", "undecodable_frame", "frame_event_differs"])
def test_2_a_history_that_does_not_match_the_frames_closed_is_reported(case):
    violations = Violations()
    room = FakeRoom(frames(3))
    record = RoomRecord(room, violations)
    if case == "history_shorter_than_open_frame":
        room.open_frame = 4
        check_room(room, record, violations)
        expected = "history_length"
    elif case == "undecodable_frame":
        room.history.append(b"\xc1\x03\x09")           # frame 3 with unknown flag bits
        room.open_frame = 4
        check_room(room, record, violations)
        expected = "frame_undecodable"
    else:
        record.reported(2, frames(3, (b"x",))[2])
        expected = "frame_event_differs"
    assert dict(violations.by_kind) == {expected: 1}
    clean, fine = Violations(), FakeRoom(frames(3))
    check_room(fine, RoomRecord(fine, clean), clean)
    assert clean.total == 0


@pytest.mark.parametrize("case", ["not_the_rooms_frame", "to_a_non_member", "repeated", "not_the_newest",
                                  "before_welcome", "block_not_the_rooms", "block_beyond_released"])
def test_3_a_frame_queued_wrongly_is_reported(case):
    closed = frames(6)
    joined, violations = membership(closed, next_frame=2)
    if case == "not_the_rooms_frame":
        joined.queued_live(frames(6, (b"x",))[5])
        expected = "frame_differs"
    elif case == "to_a_non_member":
        joined.room.members.clear()
        joined.queued_live(closed[5])
        expected = "frame_to_non_member"
    elif case == "repeated":
        joined.queued_live(closed[5])
        joined.queued_live(closed[5])
        expected = "live_frame_order"
    elif case == "not_the_newest":
        joined.queued_live(closed[4])                 # a player's live frame is the one just closed
        expected = "live_frame_not_newest"
    elif case == "before_welcome":
        spectator, violations = membership(closed, spectator=True, next_frame=4)
        spectator.queued_live(closed[3])
        expected = "live_frame_before_welcome"
    elif case == "block_not_the_rooms":
        joined.queued_block(protocol.encode_history(0, frames(2, (b"x",))))
        expected = "frame_differs"
    else:
        spectator, violations = membership(closed, spectator=True)      # delay 2: 4 released
        spectator.queued_block(protocol.encode_history(0, closed[:5]))
        expected = "block_beyond_released"
    assert violations.by_kind[expected] >= 1, dict(violations.by_kind)
    fine, clean = membership(closed, next_frame=2)
    fine.queued_block(protocol.encode_history(0, closed[:2]))
    fine.queued_live(closed[5])
    assert clean.total == 0, clean.samples


def stub_connection(events, stream=(), blocks=()):
    queue = list(events)
    endpoint = SimpleNamespace(next_event=lambda: queue.pop(0) if queue else None)
    return SimpleNamespace(address=("10.1.0.1", 20000), endpoint=endpoint,
                           stream_queued=collections.deque(stream),
                           blocks_queued=collections.deque(blocks))


@pytest.mark.parametrize("case", ["other_bytes", "nothing_queued", "other_block"])
def test_4_a_client_receiving_other_than_what_was_queued_is_reported(case):
    harness = RelayFuzz(SEED, "open", steps=0)
    closed = frames(3)
    joined, _ = membership(closed)
    if case == "other_bytes":
        conn = stub_connection([MessageReceived(1, 1, closed[1])], stream=[(closed[2], joined)])
        expected = "stream_not_as_queued"
    elif case == "nothing_queued":
        conn = stub_connection([MessageReceived(1, 1, closed[1])])
        expected = "stream_not_queued"
    else:
        conn = stub_connection([BlockReceived(1, 0, protocol.encode_history(0, closed[:1]))],
                               blocks=[(protocol.encode_history(0, closed[:2]), joined)])
        expected = "block_not_as_queued"
    harness.client_events(conn)
    assert dict(harness.violations.by_kind) == {expected: 1}
    fine = stub_connection([MessageReceived(1, 1, closed[2])], stream=[(closed[2], joined)])
    clean = RelayFuzz(SEED, "open", steps=0)
    clean.client_events(fine)
    assert clean.violations.total == 0


@pytest.mark.parametrize("case", ["gap", "history_missing", "repeated_live", "incomplete_after_settle",
                                  "incomplete_after_end"])
def test_5_a_client_missing_frames_is_reported(case):
    closed = frames(6)
    joined, violations = membership(closed, next_frame=3)
    joined.received_block(protocol.encode_history(0, closed[:3]))
    if case == "gap":
        joined.received_live(closed[3])
        joined.received_live(closed[5])                 # 4 never came
        joined.check_no_gap()
        expected = "frame_gap"
    elif case == "history_missing":
        late, violations = membership(closed, next_frame=3)
        late.received_live(closed[3])                   # the history block never came
        late.check_no_gap()
        expected = "history_missing"
    elif case == "repeated_live":
        joined.received_live(closed[3])
        joined.received_live(closed[3])
        expected = "live_frame_repeated"
    elif case == "incomplete_after_settle":
        joined.received_live(closed[3])
        joined.check_complete(6)
        expected = "frames_never_arrived"
    else:
        joined.room_ended()                             # 6 frames closed, nothing owed
        joined.received_live(closed[3])
        joined.check_complete(joined.final_frames)
        expected = "frames_never_arrived"
    assert violations.by_kind[expected] >= 1, dict(violations.by_kind)
    # A block that repeats live frames, live frames from WELCOME's next_frame: complete.
    fine, clean = membership(closed, next_frame=3)
    for number in (3, 4, 5):
        fine.received_live(closed[number])
    fine.received_block(protocol.encode_history(0, closed[:5]))
    fine.check_no_gap()
    fine.check_complete(6)
    assert clean.total == 0 and fine.next == 6


@pytest.mark.parametrize("message, resolution", [
    (b"\x94\x05\x00", "accepted"),                                        # malformed, not dropped
    (Input(3, b"ok", -1).encode(), "dropped:malformed_message"),         # valid, dropped as malformed
    (protocol.pack(protocol.READY), "refused:not_a_player"),             # a control message on STREAM
    (Input(3, b"ok", -1).encode(), "dropped:wrong_channel"),             # an INPUT dropped
    (Input(3, bytes(fuzz_relay.MAX_INPUT_BYTES + 1), -1).encode(), "accepted"),
    (Input(3, b"ok", -1).encode(), "refused:too_large"),
])
def test_6_an_input_resolved_against_its_content_is_reported(message, resolution):
    harness = RelayFuzz(SEED, "open", steps=0)
    harness.verify(message, resolution, None, None)
    assert dict(harness.violations.by_kind) == {"resolution_mismatch": 1}


@pytest.mark.parametrize("case", ["accepted_beyond_the_lead", "late_for_an_open_frame", "far_ahead_within_lead",
                                  "not_a_player_while_one"])
def test_6_an_input_resolved_against_the_open_frame_is_reported(case):
    harness = RelayFuzz(SEED, "open", steps=0)
    joined, _ = membership(frames(6))                  # frame 6 open
    message, resolution = {
        "accepted_beyond_the_lead": (Input(6 + fuzz_relay.INPUT_LEAD + 1, b"x", 5), "accepted"),
        "late_for_an_open_frame": (Input(6, b"x", 5), "late"),
        "far_ahead_within_lead": (Input(7, b"x", 5), "refused:too_far_ahead"),
        "not_a_player_while_one": (Input(7, b"x", 5), "refused:not_a_player"),
    }[case]
    harness.verify(message.encode(), resolution, joined, joined)
    assert dict(harness.violations.by_kind) == {"resolution_mismatch": 1}
    harness.verify(Input(7, b"x", 5).encode(), "accepted", joined, joined)
    assert harness.violations.total == 1 and joined.record.expected == {7: [(0, b"x", 1, joined.member)]}


@pytest.mark.parametrize("case", ["resolved_twice", "wrong_peer", "outside_a_delivery"])
def test_6_a_stream_message_not_resolved_once_for_its_sender_is_reported(case):
    harness = RelayFuzz(SEED, "open", steps=0)
    conn = SimpleNamespace(address=("10.1.0.1", 20000),
                           sent_stream=collections.deque([Input(1, b"x", -1).encode()]))
    if case == "resolved_twice":
        harness.attribute(conn, [(4, "refused:not_a_player"), (None, "accepted")], None, {4})
        expected = "stream_resolved_twice"
    elif case == "wrong_peer":
        harness.attribute(conn, [(5, "refused:not_a_player")], None, {4})
        expected = "resolution_wrong_peer"
    else:
        harness._resolved([(4, "refused:not_a_player")])
        expected = "resolution_outside_delivery"
    assert dict(harness.violations.by_kind) == {expected: 1}


def test_6_a_stream_message_never_resolved_is_reported():
    harness = RelayFuzz(SEED, "open", steps=0)
    harness.connect()
    conn = next(iter(harness.connections.values()))
    conn.endpoint.send(conn.peer, protocol.CONTROL, protocol.Join("arena", "ann").encode())
    for _ in range(40):
        harness.advance(0.005)
    # In a room, so join_timeout does not close it during the settle.
    assert harness.server.rooms["arena"].members and harness.violations.total == 0
    harness.settle()
    assert harness.violations.total == 0
    conn.sent_stream.append(Input(0, b"x", -1).encode())    # as if sent, but the server never saw it
    harness.settle()
    assert dict(harness.violations.by_kind) == {"stream_message_unresolved": 1}


def test_7_an_accepted_input_missing_from_its_frame_is_reported():
    violations = Violations()
    member = SimpleNamespace()
    room = FakeRoom([], {1: member})
    record = RoomRecord(room, violations)
    record.expect_input(0, 1, b"mine", 1, member)
    record.expect_input(1, 0, b"kept", 1, member)
    room.history.append(protocol.encode_frame(Frame(0, [b"a", b"other"])))
    room.history.append(protocol.encode_frame(Frame(1, [b"kept", None])))
    record.sync()
    assert dict(violations.by_kind) == {"accepted_input_missing": 1} and record.inputs_verified == 1
    # A sender that left before the frame closed may have had it dropped: not checked.
    record.expect_input(2, 0, b"gone", 1, member)
    room.members.clear()
    room.history.append(protocol.encode_frame(Frame(2, [None, None])))
    record.sync()
    assert violations.total == 1 and record.inputs_unverifiable == 1


# -- bugs the fuzz found ---------------------------------------------------------------------------

def test_a_control_message_the_queue_cannot_take_closes_the_connection_instead_of_going_missing():
    """Found by the fuzz. A member whose CONTROL send queue is full (16 in flight, 16 waiting:
    here DESYNCs while it hears nothing) had every further CONTROL message dropped while it
    stayed in the room; after a LEAVE and a JOIN it was admitted again with its WELCOME dropped,
    and sent frames and a history block for a room it had never been told it was in. A reliable
    ordered message cannot be repaired like a frame: the relay closes the connection instead
    (the client reconnects and gets its slot back)."""
    seed = next(s for s in range(SEED, SEED + 50)
                if RelayFuzz(s, "open", steps=0).config.rooms.start_policy == "players")
    harness = RelayFuzz(seed, "open", steps=0)
    for _ in range(3):
        harness.connect()
    ann, bob, cy = harness.connections.values()
    for conn, player in ((ann, "ann"), (bob, "bob"), (cy, "cy")):
        conn.endpoint.send(conn.peer, protocol.CONTROL, protocol.Join("arena", player).encode())
    for _ in range(20):
        harness.advance(0.005)
    room = harness.server.rooms["arena"]
    assert room.state == RUNNING and len(room.members) == 3
    victim = harness.server_peer(cy)
    cy.downlink_down_until = harness.now + 60.0         # it is heard, but hears nothing
    queue = protocol.CONTROL_WINDOW + harness.config.server.max_pending_messages
    checksums = 0
    while checksums < queue + 30 + 10 and harness.server.endpoint.is_connected(victim):
        # ann and bob disagree on every frame; cy's answer never comes, so each DESYNC goes out
        # DESYNC_WAIT_FRAMES (30) later, to all three.
        frame = room.open_frame - 1
        for conn, value in ((ann, 1), (bob, 2)):
            conn.endpoint.send(conn.peer, protocol.CONTROL, protocol.Checksum(frame, value).encode())
        checksums += 1
        harness.advance(harness.tick)
    cy.endpoint.send(cy.peer, protocol.CONTROL, protocol.pack(protocol.LEAVE))
    cy.endpoint.send(cy.peer, protocol.CONTROL, protocol.Join("arena", "cy").encode())
    for _ in range(20):
        harness.advance(0.005)
    assert not harness.server.endpoint.is_connected(victim), "a member missing CONTROL messages"
    assert victim not in harness.server.lobby.peer_room and victim not in room.members
    assert harness.violations.total == 0, harness.violations.samples
