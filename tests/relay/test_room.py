"""Room behaviour, driven directly (no sockets): membership, start policies, frame assembly,
inputs, late joins, reconnects, spectators, desync detection, catch-up and lifecycle.

A Room answers with Actions; the helpers here decode them the way a client would (sends with
``decode_relay_message``, frames in order with ``FrameDecoder``, blocks with
``decode_history``) so every assertion is about what a client actually receives.
"""
from __future__ import annotations

import pytest

from relay import protocol
from relay.config import RoomSettings
from relay.protocol import CONTROL, STREAM, Checksum, Frame, Input, Welcome
from relay.server import room as room_module
from relay.server.room import DESYNC_WAIT_FRAMES, ENDED, RUNNING, WAITING, JoinRefused, Room

TICK_RATE = 30


# -- helpers ------------------------------------------------------------------------------------

def make_room(policy="players", start_players=2, capacity=4, now=0.0, **overrides) -> Room:
    settings = RoomSettings(**overrides)
    settings.validate()
    return Room("arena", settings, TICK_RATE, now, start_policy=policy,
                start_players=start_players, capacity=capacity)


class Client:
    """What one peer has received from the room, decoded."""

    def __init__(self, peer_id: int):
        self.peer_id = peer_id
        self.control: list = []          # decoded CONTROL messages (Welcome or raw lists)
        self.frames: list[Frame] = []    # decoded STREAM frames, in arrival order
        self.frame_bytes: list[bytes] = []
        self.blocks: list[tuple[int, list[bytes]]] = []
        self.disconnects: list[str] = []

    @property
    def welcome(self) -> Welcome:
        welcomes = [m for m in self.control if isinstance(m, Welcome)]
        assert len(welcomes) == 1, welcomes
        return welcomes[0]

    def of_type(self, kind: int) -> list[list]:
        return [m for m in self.control if isinstance(m, list) and m[0] == kind]

    def merged_frames(self) -> list[bytes]:
        """History blocks plus live frames, as a client merges them: by frame number, first copy wins."""
        by_number: dict[int, bytes] = {}
        for first, frames in self.blocks:
            for offset, data in enumerate(frames):
                by_number.setdefault(first + offset, data)
        for frame, data in zip(self.frames, self.frame_bytes):
            by_number.setdefault(frame.number, data)
        numbers = sorted(by_number)
        assert numbers == list(range(len(numbers))), f"gap in frames: {numbers}"
        return [by_number[n] for n in numbers]


class Harness:
    """Drives a Room and routes its Actions to per-peer Clients."""

    def __init__(self, room: Room):
        self.room = room
        self.clients: dict[int, Client] = {}
        self.next_peer = 1
        self.events: list = []
        self.decoded: list[Frame] = []
        self.decoder = protocol.FrameDecoder()

    def decode_frame(self, data: bytes) -> Frame:
        """A FRAME as a client that holds every earlier frame decodes it (frames refer to their
        predecessor); the bytes must be the room's history for that frame."""
        number = protocol.frame_number(data)
        while len(self.decoded) <= number:
            self.decoded.append(self.decoder.decode(self.room.history[len(self.decoded)]))
        assert self.room.history[number] == data
        return self.decoded[number]

    def join(self, player: str, spectator: bool = False, now: float = 0.0,
             peer_id: int | None = None) -> Client:
        if peer_id is None:
            peer_id = self.next_peer
            self.next_peer += 1
        client = self.clients.setdefault(peer_id, Client(peer_id))
        self.room.join(peer_id, player, spectator, now)
        self.pump()
        return client

    def pump(self) -> None:
        for action in self.room.take_actions():
            client = self.clients.setdefault(action.peer_id, Client(action.peer_id))
            if action.kind == "send":
                if action.channel == STREAM:
                    message = self.decode_frame(action.data)
                else:
                    message = protocol.decode_relay_message(action.data)
                if action.channel == STREAM:
                    assert isinstance(message, Frame)
                    client.frames.append(message)
                    client.frame_bytes.append(action.data)
                else:
                    assert action.channel == CONTROL
                    client.control.append(message)
            elif action.kind == "block":
                first, frames = protocol.decode_history(action.data)
                client.blocks.append((first, frames))
            elif action.kind == "disconnect":
                client.disconnects.append(action.reason)
            else:  # pragma: no cover - a new action kind needs a test
                raise AssertionError(f"unknown action {action.kind}")
        self.events.extend(self.room.take_events())

    def tick(self, count: int = 1, now: float = 0.0) -> None:
        for _ in range(count):
            self.room.tick(now)
            self.pump()

    def input(self, client: Client, frame: int, payload: bytes = b"x", have: int = -1) -> str:
        return self.room.on_input(client.peer_id, Input(frame, payload, have))

    def checksum(self, client: Client, frame: int, value: int) -> None:
        self.room.on_checksum(client.peer_id, Checksum(frame, value))
        self.pump()

    def take_events(self, kind: str | None = None) -> list:
        events, self.events = self.events, []
        return [e for e in events if kind is None or e.kind == kind]


def running(players=("alice", "bob"), **overrides) -> tuple[Harness, list[Client]]:
    """A room that started as soon as ``players`` joined (players policy)."""
    harness = Harness(make_room(start_players=len(players), **overrides))
    clients = [harness.join(name) for name in players]
    assert harness.room.state == RUNNING
    return harness, clients


def events_in(frame: Frame) -> list[list]:
    return [list(event) for event in frame.events]


# -- joining ------------------------------------------------------------------------------------

def test_join_while_waiting_gets_welcome_with_slot_waiting_state_and_no_history():
    harness = Harness(make_room(start_players=3))
    alice = harness.join("alice")
    bob = harness.join("bob")
    assert alice.welcome == Welcome("arena", "alice", 0, TICK_RATE, WAITING, next_frame=0,
                                    history=0, spectator=False)
    assert bob.welcome.slot == 1 and bob.welcome.state == WAITING
    assert alice.blocks == [] and bob.blocks == []
    assert harness.room.state == WAITING


def test_join_beyond_capacity_is_refused_room_full():
    harness = Harness(make_room(policy="admin", capacity=2))
    harness.join("alice")
    harness.join("bob")
    with pytest.raises(JoinRefused) as refusal:
        harness.room.join(99, "carol", False, 0.0)
    assert refusal.value.code == "room_full"
    assert 99 not in harness.room.members
    assert [s.player for s in harness.room.slots] == ["alice", "bob"]


def test_spectators_are_admitted_up_to_max_spectators_without_using_player_capacity():
    harness = Harness(make_room(policy="admin", capacity=1, max_spectators=2))
    harness.join("alice")
    watchers = [harness.join(f"watcher{i}", spectator=True) for i in range(2)]
    for watcher in watchers:
        assert watcher.welcome.spectator is True and watcher.welcome.slot is None
    with pytest.raises(JoinRefused) as refusal:
        harness.room.join(99, "watcher2", True, 0.0)
    assert refusal.value.code == "spectators_full"
    assert harness.room.spectator_count == 2 and len(harness.room.slots) == 1
    # A seat frees up when a spectator leaves.
    harness.room.detach(watchers[0].peer_id, "leave", 1.0)
    harness.join("watcher3", spectator=True)
    assert harness.room.spectator_count == 2


def test_joining_an_ended_room_is_refused():
    harness = Harness(make_room(policy="admin"))
    harness.join("alice")
    harness.room.end("done")
    for spectator in (False, True):
        with pytest.raises(JoinRefused) as refusal:
            harness.room.join(50, "zed", spectator, 0.0)
        assert refusal.value.code == "room_ended"


def test_new_player_refused_in_running_room_when_late_join_disabled():
    harness, _ = running(allow_late_join=False)
    with pytest.raises(JoinRefused) as refusal:
        harness.room.join(50, "carol", False, 0.0)
    assert refusal.value.code == "running"


# -- start policies -----------------------------------------------------------------------------

def test_players_policy_starts_when_start_players_joined_and_broadcasts_running():
    harness = Harness(make_room(policy="players", start_players=2))
    watcher = harness.join("watcher", spectator=True)
    alice = harness.join("alice")
    assert harness.room.state == WAITING
    assert alice.of_type(protocol.ROOM_STATE) == []
    bob = harness.join("bob")
    assert harness.room.state == RUNNING
    for client in (watcher, alice, bob):
        assert client.of_type(protocol.ROOM_STATE) == [[protocol.ROOM_STATE, RUNNING, 0, None]]
    # bob's WELCOME (state waiting) comes before the ROOM_STATE that starts the room
    assert isinstance(bob.control[0], Welcome) and bob.control[0].state == WAITING
    assert [e.detail for e in harness.take_events("started")] == [{"players": ["alice", "bob"]}]


def test_ready_policy_starts_only_when_every_connected_player_is_ready():
    harness = Harness(make_room(policy="ready", start_players=2))
    alice, bob, carol = (harness.join(name) for name in ("alice", "bob", "carol"))
    harness.room.set_ready(alice.peer_id, 0.0)
    harness.room.set_ready(bob.peer_id, 0.0)
    assert harness.room.state == WAITING      # carol (connected) is not ready yet
    harness.room.set_ready(carol.peer_id, 0.0)
    harness.pump()
    assert harness.room.state == RUNNING
    for client in (alice, bob, carol):
        assert client.of_type(protocol.ROOM_STATE) == [[protocol.ROOM_STATE, RUNNING, 0, None]]


def test_ready_policy_waits_for_start_players_even_if_everyone_is_ready():
    harness = Harness(make_room(policy="ready", start_players=3))
    alice, bob = harness.join("alice"), harness.join("bob")
    harness.room.set_ready(alice.peer_id, 0.0)
    harness.room.set_ready(bob.peer_id, 0.0)
    assert harness.room.state == WAITING
    carol = harness.join("carol")
    assert harness.room.state == WAITING      # carol joined but is not ready
    harness.room.set_ready(carol.peer_id, 0.0)
    assert harness.room.state == RUNNING


def test_ready_from_a_spectator_does_not_count():
    harness = Harness(make_room(policy="ready", start_players=1))
    watcher = harness.join("watcher", spectator=True)
    harness.join("alice")
    harness.room.set_ready(watcher.peer_id, 0.0)
    assert harness.room.state == WAITING


def test_admin_policy_never_starts_by_itself_but_start_does():
    harness = Harness(make_room(policy="admin", start_players=1, capacity=3))
    clients = [harness.join(name) for name in ("alice", "bob", "carol")]
    for client in clients:
        harness.room.set_ready(client.peer_id, 0.0)
    harness.tick(5)
    assert harness.room.state == WAITING
    assert harness.room.open_frame == 0 and clients[0].frames == []
    harness.room.start(1.0)
    harness.pump()
    assert harness.room.state == RUNNING
    for client in clients:
        assert client.of_type(protocol.ROOM_STATE) == [[protocol.ROOM_STATE, RUNNING, 0, None]]
    harness.room.start(2.0)              # starting twice is a no-op
    harness.pump()
    assert clients[0].of_type(protocol.ROOM_STATE) == [[protocol.ROOM_STATE, RUNNING, 0, None]]


def test_ready_policy_starts_when_the_only_unready_player_leaves():
    harness = Harness(make_room(policy="ready", start_players=2))
    alice, bob, carol = (harness.join(name) for name in ("alice", "bob", "carol"))
    harness.room.set_ready(alice.peer_id, 0.0)
    harness.room.set_ready(bob.peer_id, 0.0)
    harness.room.detach(carol.peer_id, "leave", 1.0)
    # Every connected player (alice, bob) is ready and start_players (2) are connected.
    assert harness.room.state == RUNNING


def test_players_policy_starts_when_a_returning_player_completes_start_players():
    harness = Harness(make_room(policy="players", start_players=2))
    alice = harness.join("alice")
    harness.room.detach(alice.peer_id, "timeout", 1.0)
    harness.join("bob", now=2.0)
    assert harness.room.state == WAITING
    harness.join("alice", now=3.0)           # alice reclaims slot 0: two players connected
    assert harness.room.players_connected == 2
    assert harness.room.state == RUNNING


# -- ticks and frames ---------------------------------------------------------------------------

def test_tick_before_start_closes_no_frame():
    harness = Harness(make_room(policy="admin"))
    alice = harness.join("alice")
    assert harness.room.tick(0.0) is None
    harness.pump()
    assert harness.room.open_frame == 0 and harness.room.history == [] and alice.frames == []


def test_frames_are_numbered_from_zero_without_gaps():
    harness, (alice, bob) = running()
    harness.tick(5)
    assert [f.number for f in alice.frames] == [0, 1, 2, 3, 4]
    assert [f.number for f in bob.frames] == [0, 1, 2, 3, 4]
    assert harness.room.open_frame == 5


def test_frame_holds_each_slots_input_or_none_in_slot_order():
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    assert harness.input(carol, 0, b"C0") == "accepted"
    assert harness.input(alice, 0, b"A0") == "accepted"
    harness.tick()
    assert harness.input(bob, 1, b"B1") == "accepted"
    harness.tick()
    harness.tick()
    assert [f.inputs for f in alice.frames] == [
        [b"A0", None, b"C0"],
        [None, b"B1", None],
        [None, None, None],
    ]


def test_every_player_gets_the_same_frame_bytes_encoded_once_and_kept_in_history():
    harness, clients = running(("alice", "bob", "carol"))
    harness.input(clients[1], 0, b"hello")
    for number in range(3):
        data = harness.room.tick(0.0)
        actions = harness.room.take_actions()
        stream = [a for a in actions if a.kind == "send" and a.channel == STREAM]
        assert sorted(a.peer_id for a in stream) == sorted(c.peer_id for c in clients)
        assert all(a.data is data for a in stream), "one encoded object shared by all players"
        assert harness.room.history[number] is data
        frame_events = [e for e in harness.room.take_events() if e.kind == "frame"]
        assert frame_events[0].detail == {"frame": number, "data": data}


def test_membership_events_are_in_the_frame_that_was_open_when_they_happened():
    harness = Harness(make_room(policy="players", start_players=2, reconnect_grace=60.0))
    alice, bob = harness.join("alice"), harness.join("bob")
    harness.tick()                                       # frame 0: the joins while waiting
    carol = harness.join("carol", now=1.0)               # open frame 1
    harness.tick()
    harness.tick()                                       # frame 2: nothing
    harness.room.detach(bob.peer_id, "timeout", 2.0)     # open frame 3
    harness.room.detach(carol.peer_id, "leave", 2.0)
    harness.tick()
    harness.join("bob", now=3.0)                          # open frame 4
    harness.tick()
    frames = alice.frames
    assert events_in(frames[0]) == [["join", 0, "alice"], ["join", 1, "bob"]]
    assert events_in(frames[1]) == [["join", 2, "carol"]]
    assert events_in(frames[2]) == []
    assert events_in(frames[3]) == [["timeout", 1, "bob"], ["leave", 2, "carol"]]
    assert events_in(frames[4]) == [["reconnect", 1, "bob"]]
    assert frames[1].inputs == [None, None, None]       # carol's slot exists from her join frame


def test_frame_events_agree_with_membership_when_a_player_leaves_before_the_start():
    harness = Harness(make_room(policy="admin", capacity=3))
    alice, _bob, carol = (harness.join(name) for name in ("alice", "bob", "carol"))
    harness.room.detach(carol.peer_id, "leave", 1.0)
    harness.room.start(2.0)
    harness.tick()
    connected = set()
    for kind, _slot, player in events_in(alice.frames[0]):
        if kind in ("join", "reconnect"):
            connected.add(player)
        else:
            connected.discard(player)
    actual = {p["player"] for p in harness.room.info()["players"] if p["connected"]}
    assert actual == {"alice", "bob"}
    assert connected == actual


# -- inputs -------------------------------------------------------------------------------------

def test_inputs_are_accepted_for_the_open_frame_and_up_to_max_input_lead_ahead():
    harness, (alice, bob) = running(max_input_lead=3)
    assert harness.input(alice, 0, b"now") == "accepted"
    assert harness.input(alice, 3, b"lead") == "accepted"
    assert harness.input(bob, 4, b"far") == "refused:too_far_ahead"
    harness.tick(4)
    assert [f.inputs[0] for f in alice.frames] == [b"now", None, None, b"lead"]
    assert all(f.inputs[1] is None for f in alice.frames)
    # the lead moves with the open frame
    assert harness.input(bob, 4 + 3, b"ok") == "accepted"


def test_inputs_up_to_the_lead_ahead_close_in_their_own_frames_as_the_buffer_wraps():
    # Frame n's inputs share a row with frame n + lead + 1: each row must be empty again by
    # the time the later frame can use it.
    harness, (alice, bob) = running(max_input_lead=2)
    for frame in range(3):
        assert harness.input(alice, frame, b"a%d" % frame) == "accepted"
    for number in range(12):
        assert harness.input(bob, number, b"b%d" % number) == "accepted"
        assert harness.input(alice, number + 2, b"a%d" % (number + 2)) in ("accepted", "duplicate")
        assert harness.input(alice, number + 3, b"x") == "refused:too_far_ahead"
        harness.tick()
    assert [f.inputs for f in alice.frames] == [[b"a%d" % n, b"b%d" % n] for n in range(12)]
    assert harness.room.buffered_inputs() == {12: {0: b"a12"}, 13: {0: b"a13"}}


def test_buffered_inputs_shows_what_waits_for_each_frame_by_slot():
    harness, (alice, bob) = running(max_input_lead=5)
    harness.tick(2)
    assert harness.room.buffered_inputs() == {}
    harness.input(bob, 4, b"b4")
    harness.input(alice, 2, b"a2")
    harness.input(alice, 7, b"a7")
    assert harness.room.buffered_inputs() == {2: {0: b"a2"}, 4: {1: b"b4"}, 7: {0: b"a7"}}
    harness.room.detach(alice.peer_id, "left", 0.0)      # keeps its open frame's input only
    assert harness.room.buffered_inputs() == {2: {0: b"a2"}, 4: {1: b"b4"}}


def test_a_member_knows_its_room_only_while_it_is_in_it():
    harness, (alice, bob) = running()
    room = harness.room
    member = room.members[alice.peer_id]
    assert member.room is room
    room.detach(alice.peer_id, "left", 0.0)
    assert member.room is None
    harness.join("alice")                               # reclaims slot 0 on a new peer
    again = room.members[harness.next_peer - 1]
    assert again.room is room
    room.join(99, "alice", False, 0.0)                  # the same player again: replaces it
    assert again.room is None and room.members[99].room is room


def test_oversized_input_is_refused_and_max_size_is_accepted():
    harness, (alice, bob) = running(max_input_bytes=8)
    assert harness.input(alice, 0, b"x" * 9) == "refused:too_large"
    assert harness.input(bob, 0, b"x" * 8) == "accepted"
    harness.tick()
    assert alice.frames[0].inputs == [None, b"x" * 8]


def test_duplicate_input_for_the_same_frame_keeps_the_first():
    harness, (alice, _bob) = running()
    assert harness.input(alice, 0, b"first") == "accepted"
    assert harness.input(alice, 0, b"second") == "duplicate"
    assert harness.input(alice, 2, b"ahead") == "accepted"
    assert harness.input(alice, 2, b"again") == "duplicate"
    harness.tick(3)
    assert [f.inputs[0] for f in alice.frames] == [b"first", None, b"ahead"]


def test_late_input_with_policy_next_goes_into_the_open_frame():
    harness, (alice, bob) = running(late_input_policy="next")
    harness.tick(2)                                      # frames 0 and 1 closed, 2 open
    assert harness.input(alice, 0, b"late") == "late"
    harness.tick()
    assert alice.frames[2].number == 2 and alice.frames[2].inputs == [b"late", None]
    assert [f.inputs for f in bob.frames[:2]] == [[None, None], [None, None]]  # closed frames unchanged


def test_late_input_with_policy_next_is_dropped_when_the_open_frame_has_one_already():
    harness, (alice, _bob) = running(late_input_policy="next")
    harness.tick()
    assert harness.input(alice, 1, b"on time") == "accepted"
    assert harness.input(alice, 0, b"late") == "refused:late_dropped"
    harness.tick()
    assert alice.frames[1].inputs == [b"on time", None]
    # and a second late input after a first one was moved forward is dropped too
    assert harness.input(alice, 0, b"late 1") == "late"
    assert harness.input(alice, 1, b"late 2") == "refused:late_dropped"
    harness.tick()
    assert alice.frames[2].inputs == [b"late 1", None]


def test_late_input_with_policy_drop_is_refused():
    harness, (alice, _bob) = running(late_input_policy="drop")
    harness.tick(2)
    assert harness.input(alice, 1, b"late") == "refused:late_dropped"
    harness.tick()
    assert alice.frames[2].inputs == [None, None]


@pytest.mark.parametrize("policy", ["none", "repeat"])
def test_the_leave_frame_is_a_leavers_last_frame_with_an_input(policy):
    harness, (alice, bob) = running(missing_input_policy=policy)
    harness.tick(2)                                      # frame 2 open
    for frame in (2, 3, 4):                              # input delay 3
        assert harness.input(alice, frame, b"a%d" % frame) == "accepted"
    harness.room.detach(alice.peer_id, "leave", 0.0)     # LEAVE while frame 2 is open
    assert harness.input(alice, 5, b"after") == "refused:not_a_player"
    harness.tick(3)
    frames = bob.frames[2:5]
    assert frames[0].events == [["leave", 0, "alice"]] and frames[0].inputs[0] == b"a2"
    assert [f.inputs[0] for f in frames[1:]] == [None, None]     # sent ahead, dropped at the leave
    harness.join("alice", peer_id=9)                     # back at frame 5: a clean slot
    assert harness.input(harness.clients[9], 5, b"back") == "accepted"
    harness.tick()
    assert bob.frames[5].inputs[0] == b"back" and bob.frames[5].events == [["reconnect", 0, "alice"]]


def test_input_before_the_start_is_refused_not_running():
    harness = Harness(make_room(policy="admin"))
    alice = harness.join("alice")
    assert harness.input(alice, 0) == "refused:not_running"
    harness.room.start(0.0)
    harness.tick()
    assert harness.room.history and protocol.decode_relay_message(harness.room.history[0]).inputs == [None]


def test_input_from_a_spectator_or_unknown_peer_is_refused():
    harness, (alice, _bob) = running()
    watcher = harness.join("watcher", spectator=True)
    assert harness.input(watcher, 0) == "refused:not_a_player"
    assert harness.room.on_input(777, Input(0, b"x", -1)) == "refused:not_a_player"
    harness.tick()
    assert alice.frames[0].inputs == [None, None]


def test_input_after_the_room_ended_is_refused():
    harness, (alice, _bob) = running()
    harness.room.end("done")
    assert harness.input(alice, 0) == "refused:not_running"


# -- late join ----------------------------------------------------------------------------------

def test_late_joiner_gets_exactly_the_closed_frames_as_history_then_live_frames():
    harness, (alice, bob) = running()
    for frame in range(7):
        harness.input(alice, frame, b"a%d" % frame)
        harness.tick()
    carol = harness.join("carol", now=1.0)
    assert carol.welcome == Welcome("arena", "carol", 2, TICK_RATE, RUNNING, next_frame=7,
                                    history=7, spectator=False)
    assert len(carol.blocks) == 1
    first, frames = carol.blocks[0]
    assert first == 0
    assert frames == alice.frame_bytes == bob.frame_bytes   # identical bytes, frames 0..6
    harness.tick(3)
    assert [f.number for f in carol.frames] == [7, 8, 9]
    assert events_in(carol.frames[0]) == [["join", 2, "carol"]]
    assert carol.merged_frames() == alice.frame_bytes
    assert harness.take_events("history_sent")[-1].detail == {"player": "carol", "frames": 7}


# -- reconnect ----------------------------------------------------------------------------------

def test_timed_out_player_reclaims_its_slot_within_reconnect_grace():
    harness, (alice, bob) = running(reconnect_grace=10.0)
    harness.tick(3)
    harness.room.detach(bob.peer_id, "timeout", 100.0)
    harness.tick(2)
    bob2 = harness.join("bob", now=110.0)               # exactly at the end of the grace
    assert bob2.peer_id != bob.peer_id
    assert bob2.welcome.slot == 1 and bob2.welcome.next_frame == 5 and bob2.welcome.history == 5
    assert bob2.blocks == [(0, alice.frame_bytes)]
    assert len(harness.room.slots) == 2
    harness.tick()
    assert events_in(alice.frames[5]) == [["reconnect", 1, "bob"]]
    assert bob2.merged_frames() == alice.frame_bytes
    assert harness.input(bob2, 6, b"back") == "accepted"
    assert harness.input(bob, 6, b"ghost") == "refused:not_a_player"
    assert [e.detail["slot"] for e in harness.take_events("reconnected")] == [1]


def test_player_rejoining_after_reconnect_grace_is_refused_slot_expired():
    harness, (_alice, bob) = running(reconnect_grace=10.0)
    harness.room.detach(bob.peer_id, "timeout", 100.0)
    with pytest.raises(JoinRefused) as refusal:
        harness.room.join(50, "bob", False, 110.5)
    assert refusal.value.code == "slot_expired"
    assert 50 not in harness.room.members and harness.room.slots[1].peer_id is None


def test_timed_out_player_reclaims_its_slot_even_when_late_join_is_disabled():
    harness, (_alice, bob) = running(allow_late_join=False)
    harness.tick(2)
    harness.room.detach(bob.peer_id, "timeout", 1.0)
    bob2 = harness.join("bob", now=2.0)
    assert bob2.welcome.slot == 1 and bob2.welcome.history == 2


def test_same_player_on_a_new_connection_replaces_the_old_one():
    harness, (alice, bob) = running()
    harness.tick(2)
    bob2 = harness.join("bob", now=1.0)
    assert bob.disconnects == ["replaced"]
    assert bob.peer_id not in harness.room.members
    assert harness.room.slots[1].peer_id == bob2.peer_id
    assert bob2.welcome.slot == 1 and bob2.blocks == [(0, alice.frame_bytes)]
    bob_frames_before = len(bob.frames)
    harness.tick()
    assert len(bob.frames) == bob_frames_before          # the old peer gets nothing more
    assert [f.number for f in bob2.frames] == [2]
    assert events_in(bob2.frames[0]) == [["reconnect", 1, "bob"]]
    # the old peer going away later does not detach the new one
    harness.room.detach(bob.peer_id, "timeout", 2.0)
    assert harness.room.slots[1].peer_id == bob2.peer_id


# -- spectators ---------------------------------------------------------------------------------

def test_spectator_receives_frame_n_minus_delay_at_the_tick_closing_frame_n():
    harness = Harness(make_room(start_players=2, spectator_delay=3))
    watcher = harness.join("watcher", spectator=True)
    alice, _bob = harness.join("alice"), harness.join("bob")
    for number in range(8):
        harness.input(alice, number, b"%d" % number)
        harness.tick()
        expected = list(range(0, number - 3 + 1))
        assert [f.number for f in watcher.frames] == expected
    assert watcher.frame_bytes == alice.frame_bytes[:5]


def test_late_spectator_gets_history_up_to_the_delayed_point_then_live_frames():
    harness, (alice, _bob) = running(spectator_delay=4)
    for number in range(10):
        harness.input(alice, number, b"%d" % number)
        harness.tick()
    watcher = harness.join("watcher", spectator=True)
    assert watcher.welcome.spectator and watcher.welcome.slot is None
    assert watcher.welcome.next_frame == 6 and watcher.welcome.history == 6
    assert watcher.blocks == [(0, alice.frame_bytes[:6])]
    harness.tick(3)
    assert [f.number for f in watcher.frames] == [6, 7, 8]
    assert watcher.merged_frames() == alice.frame_bytes[:9]


def test_spectator_joining_before_the_delay_has_passed_gets_no_history_and_starts_at_zero():
    harness, (alice, _bob) = running(spectator_delay=5)
    harness.tick(2)
    watcher = harness.join("watcher", spectator=True)
    assert watcher.welcome.next_frame == 0 and watcher.welcome.history == 0
    assert watcher.blocks == []
    harness.tick(4)                         # closes frames 2..5: frame 0 released at the last
    assert [f.number for f in watcher.frames] == [0]
    assert watcher.frame_bytes == alice.frame_bytes[:1]


def test_spectator_whose_frame_could_not_be_queued_gets_a_repair_block():
    harness, (_alice, _bob) = running(spectator_delay=0, catchup_frames=2)
    watcher = harness.join("watcher", spectator=True)
    harness.tick(5)
    harness.room.on_send_failed(watcher.peer_id, "stream")   # frame 4 never reached the spectator
    harness.tick(2)
    assert watcher.blocks, "the spectator should get the frames it missed as a block"


# -- desync -------------------------------------------------------------------------------------

def test_two_players_with_different_checksums_get_one_desync_broadcast():
    harness, (alice, bob) = running()
    watcher = harness.join("watcher", spectator=True)
    harness.tick(3)
    harness.checksum(alice, 1, 111)
    assert alice.of_type(protocol.DESYNC) == []
    harness.checksum(bob, 1, 222)
    expected = [protocol.DESYNC, 1, {"alice": 111, "bob": 222}, [], "undecided",
                [["alice"], ["bob"]]]
    for client in (alice, bob, watcher):
        assert client.of_type(protocol.DESYNC) == [expected]
    assert [e.detail for e in harness.take_events("desync")] == [
        {"frame": 1, "checksums": {"alice": 111, "bob": 222}, "minority": [],
         "verdict": "undecided", "groups": [["alice"], ["bob"]], "first_diverging_frame": 1}]


def test_desync_with_three_players_names_the_odd_one_as_minority():
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    harness.tick(2)
    harness.checksum(alice, 0, 7)
    harness.checksum(carol, 0, 7)
    harness.checksum(bob, 0, -5)
    assert alice.of_type(protocol.DESYNC) == [
        [protocol.DESYNC, 0, {"alice": 7, "carol": 7, "bob": -5}, ["bob"], "minority",
         [["alice", "carol"], ["bob"]]]]


def test_desync_names_the_odd_one_even_when_it_reports_first():
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    harness.tick(2)
    harness.checksum(bob, 0, -5)
    harness.checksum(alice, 0, 7)
    harness.checksum(carol, 0, 7)
    desyncs = alice.of_type(protocol.DESYNC)
    assert desyncs and desyncs[-1][3] == ["bob"]


def test_equal_checksums_report_nothing():
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    harness.tick(2)
    for client in (alice, bob, carol):
        harness.checksum(client, 0, 42)
        harness.checksum(client, 1, 2**64 - 1)
    assert alice.of_type(protocol.DESYNC) == [] and harness.take_events("desync") == []


def test_desync_is_reported_once_per_frame():
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"))
    harness.tick(3)
    harness.checksum(alice, 0, 1)
    harness.checksum(bob, 0, 2)
    harness.checksum(carol, 0, 3)
    harness.checksum(bob, 0, 4)              # a repeat (first value per player is kept)
    harness.checksum(alice, 1, 1)
    harness.checksum(bob, 1, 2)              # a different frame is its own report...
    assert [m[1] for m in alice.of_type(protocol.DESYNC)] == [0]   # ...once carol answers
    harness.tick(DESYNC_WAIT_FRAMES)         # or when she has not answered in time
    frames = [m[1] for m in alice.of_type(protocol.DESYNC)]
    assert frames == [0, 1]
    assert len(harness.take_events("desync")) == 2


def test_checksums_for_frames_not_yet_closed_are_ignored():
    harness, (alice, bob) = running()
    harness.tick()                           # frame 0 closed, 1 open
    harness.checksum(alice, 1, 10)           # open frame: ignored
    harness.checksum(bob, 5, 20)             # future frame: ignored
    harness.tick(6)
    harness.checksum(bob, 1, 99)
    harness.checksum(bob, 5, 99)
    assert alice.of_type(protocol.DESYNC) == []   # alice's early report was never stored
    harness.checksum(alice, 1, 10)
    assert [m[1] for m in alice.of_type(protocol.DESYNC)] == [1]


def test_checksums_older_than_the_checksum_window_or_from_spectators_are_ignored():
    harness, (alice, bob) = running(checksum_window=5)
    watcher = harness.join("watcher", spectator=True)
    harness.tick(10)                         # open frame 10: frames < 5 are out of the window
    harness.checksum(alice, 4, 1)
    harness.checksum(bob, 4, 2)
    harness.checksum(alice, 5, 1)
    harness.checksum(watcher, 5, 2)
    assert alice.of_type(protocol.DESYNC) == []
    harness.checksum(bob, 5, 2)
    assert [m[1] for m in alice.of_type(protocol.DESYNC)] == [5]


# -- catch-up -----------------------------------------------------------------------------------

def test_lagging_player_gets_a_catch_up_block_from_have_plus_one():
    harness, (alice, bob) = running(catchup_frames=5)
    harness.tick(3)
    harness.input(bob, 3, have=2)
    harness.tick(5)                          # closed 0..7: bob (have 2) is 5 behind: no block
    assert bob.blocks == []
    harness.tick()                           # closed 0..8: 6 behind
    assert len(bob.blocks) == 1
    first, frames = bob.blocks[0]
    assert first == 3
    assert frames == alice.frame_bytes[3:9]
    assert [e.detail for e in harness.take_events("catch_up")] == [
        {"player": "bob", "first": 3, "frames": 6}]
    assert alice.blocks == []


def test_no_second_catch_up_block_while_one_is_in_flight_nor_after_delivery():
    harness, (alice, bob) = running(catchup_frames=3)
    harness.input(bob, 0, have=-1)
    harness.tick(4)                          # closed 0..3: 4 behind
    assert bob.blocks == [(0, alice.frame_bytes[:4])]
    for number in range(4, 6):               # block in flight; bob still lacks frame 0
        harness.input(bob, number, have=-1)
        harness.tick()
    assert len(bob.blocks) == 1
    harness.room.on_block_delivered(bob.peer_id)
    harness.tick()
    assert len(bob.blocks) == 1, "a delivered block covers the gap; no repeat"
    for number in range(7, 20):              # bob keeps up from now on
        harness.input(bob, number, have=number - 1)
        harness.tick()
    assert len(bob.blocks) == 1


def test_catch_up_block_that_took_long_to_deliver_is_not_followed_by_a_redundant_one():
    harness, (alice, bob) = running(catchup_frames=3)
    harness.input(bob, 0, have=-1)
    harness.tick(4)
    assert bob.blocks == [(0, alice.frame_bytes[:4])]
    for number in range(4, 12):              # a slow block: 8 ticks in flight
        harness.input(bob, number, have=-1)
        harness.tick()
    assert [f.number for f in bob.frames][4:] == list(range(4, 12))   # sent live behind it
    harness.room.on_block_delivered(bob.peer_id)
    harness.tick()
    assert len(bob.blocks) == 1, f"second block repeats live frames: first={bob.blocks[-1][0]}"


def test_player_that_never_reported_progress_gets_no_catch_up_block():
    harness, (alice, bob) = running(catchup_frames=2)
    harness.tick(20)
    assert alice.blocks == [] and bob.blocks == []


def test_player_whose_frame_could_not_be_queued_gets_a_repair_block_next_tick():
    harness, (alice, bob) = running(catchup_frames=3)
    harness.tick(6)
    harness.room.on_send_failed(bob.peer_id, "stream")  # frame 5 did not make it into bob's queue
    harness.tick()
    assert len(bob.blocks) == 1
    first, frames = bob.blocks[0]
    assert first <= 5
    assert frames == alice.frame_bytes[first:7]


# -- lifecycle ----------------------------------------------------------------------------------

def test_end_broadcasts_ended_with_reason_and_frame_count_and_stops_ticking():
    harness, (alice, bob) = running()
    watcher = harness.join("watcher", spectator=True)
    harness.tick(4)
    harness.room.end("finished")
    harness.pump()
    assert harness.room.state == ENDED
    for client in (alice, bob, watcher):
        assert client.of_type(protocol.ROOM_STATE)[-1] == [protocol.ROOM_STATE, ENDED, 4, "finished"]
    assert [e.detail for e in harness.take_events("ended")] == [{"reason": "finished", "frames": 4}]
    assert harness.room.tick(0.0) is None
    harness.room.end("again")                # ending twice changes nothing
    harness.pump()
    assert len(alice.of_type(protocol.ROOM_STATE)) == 2
    assert harness.room.info()["end_reason"] == "finished"


def test_room_expires_after_empty_timeout_with_nobody_connected():
    harness = Harness(make_room(policy="admin", now=0.0, empty_timeout=30.0))
    assert not harness.room.expired(29.9)
    assert harness.room.expired(30.0)
    alice = harness.join("alice", now=10.0)
    assert not harness.room.expired(1000.0)
    watcher = harness.join("watcher", spectator=True, now=11.0)
    harness.room.detach(alice.peer_id, "leave", 20.0)
    assert not harness.room.expired(1000.0)     # a spectator is still connected
    harness.room.detach(watcher.peer_id, "leave", 40.0)
    assert not harness.room.expired(69.9)
    assert harness.room.expired(70.0)
    harness.room.end("empty")
    assert not harness.room.expired(1000.0)


def test_kick_disconnects_the_player_but_keeps_its_slot_reserved():
    harness, (alice, bob) = running(capacity=2)
    harness.tick()
    assert harness.room.kick("bob", 1.0) == bob.peer_id
    harness.pump()
    assert bob.disconnects == ["kicked"]
    assert bob.peer_id not in harness.room.members
    assert [s.player for s in harness.room.slots] == ["alice", "bob"]
    assert harness.room.slots[1].peer_id is None
    assert harness.input(bob, 1) == "refused:not_a_player"
    harness.tick()
    assert events_in(alice.frames[1]) == [["leave", 1, "bob"]]
    with pytest.raises(JoinRefused) as refusal:    # the slot still counts against capacity
        harness.room.join(60, "carol", False, 2.0)
    assert refusal.value.code == "room_full"
    assert harness.room.kick("nobody", 2.0) is None
    assert harness.room.kick("bob", 2.0) is None     # already away: nothing to disconnect
    bob2 = harness.join("bob", now=3.0)              # the reserved slot is bob's to reclaim
    assert bob2.welcome.slot == 1


def test_kick_removes_a_spectator():
    harness, _ = running()
    watcher = harness.join("watcher", spectator=True)
    assert harness.room.kick("watcher", 1.0) == watcher.peer_id
    harness.pump()
    assert watcher.disconnects == ["kicked"] and harness.room.spectator_count == 0


# -- long run -----------------------------------------------------------------------------------

def test_frame_numbers_and_bytes_stay_consistent_over_1200_ticks():
    harness, (alice, bob, carol) = running(("alice", "bob", "carol"), spectator_delay=30,
                                           catchup_frames=10_000)
    watcher = harness.join("watcher", spectator=True)
    players = (alice, bob, carol)
    for number in range(1200):
        for index, client in enumerate(players):
            if (number + index) % (index + 2) == 0:
                assert harness.input(client, number, b"%d:%d" % (index, number),
                                     have=number - 1) == "accepted"
        harness.tick()
        assert len(harness.room.history) == harness.room.open_frame == number + 1
    history = harness.room.history
    for number, data in enumerate(history):
        frame = protocol.decode_relay_message(data)
        assert frame.number == number
        for index in range(3):
            expected = b"%d:%d" % (index, number) if (number + index) % (index + 2) == 0 else None
            assert frame.inputs[index] == expected
    for client in players:
        assert client.frame_bytes == history
        assert client.blocks == []
    assert watcher.frame_bytes == history[:1200 - 30]


def test_spectators_receive_every_frame_when_the_room_ends():
    harness, (alice, bob) = running(spectator_delay=20)
    watcher = harness.join("watcher", spectator=True)
    harness.tick(50)
    harness.room.end("admin")
    harness.pump()
    numbers = [f.number for f in watcher.frames]
    assert numbers == list(range(50)), "the delay's worth of frames is released at the end"
    assert watcher.of_type(protocol.ROOM_STATE)[-1][1:] == ["ended", 50, "admin"]


def test_a_reused_slot_carries_nothing_of_its_previous_owner():
    harness, (alice, bob) = running(capacity=2, reconnect_grace=1.0, max_input_lead=300)
    harness.tick()
    assert harness.input(bob, 100, b"old bob") == "accepted"
    harness.room.detach(bob.peer_id, "timeout", now=0.0)
    harness.checksum(alice, 0, 1)
    carol = harness.join("carol", now=5.0)              # bob's grace has run out
    assert carol.welcome.slot == 1
    harness.tick(105)
    frame_100 = next(f for f in alice.frames if f.number == 100)
    assert frame_100.inputs[1] is None


def test_a_history_block_over_the_size_limit_is_split_until_each_part_fits(monkeypatch):
    import relay.server.room

    monkeypatch.setattr(relay.server.room.protocol, "MAX_BLOCK_SIZE", 40)
    harness, (alice, bob) = running()
    harness.tick(35)
    late = harness.join("late")
    firsts = [first for first, _ in late.blocks]
    assert len(firsts) > 1 and firsts == sorted(firsts) and firsts[0] == 0
    assert late.merged_frames()[:35] == alice.frame_bytes[:35]
    member = harness.room.members[late.peer_id]
    assert member.blocks_in_flight == len(firsts)
    for _ in firsts:
        harness.room.on_block_delivered(late.peer_id)
    assert not harness.room.members[late.peer_id].catching_up


def test_a_long_history_goes_in_several_blocks(monkeypatch):
    import relay.server.room

    monkeypatch.setattr(relay.server.room, "HISTORY_BLOCK_FRAMES", 10)
    harness, (alice, bob) = running()
    harness.tick(35)
    late = harness.join("late")
    assert [first for first, _ in late.blocks] == [0, 10, 20, 30]
    assert late.merged_frames()[:35] == alice.frame_bytes[:35]
    for _ in range(3):
        harness.room.on_block_delivered(late.peer_id)
    assert harness.room.members[late.peer_id].catching_up
    harness.room.on_block_delivered(late.peer_id)
    assert not harness.room.members[late.peer_id].catching_up


# -- the lobby's compiled pass over its rooms ----------------------------------------------------

class SendMany:
    """Stands in for Endpoint.send_many: records each call; refuses or raises when told to."""

    def __init__(self, refuse=(), error=None):
        self.calls: list = []
        self.refuse, self.error = list(refuse), error

    def __call__(self, peer_ids, channel, payload, *now):
        self.calls.append((list(peer_ids), channel, payload, *now))
        if self.error is not None:
            raise self.error
        return [p for p in peer_ids if p in self.refuse]


def broadcasting(players=("alice", "bob")) -> tuple[Harness, list[Client]]:
    harness, clients = running(players, missing_input_policy="neutral", neutral_input="00")
    harness.room.broadcast_frames = True
    harness.room.take_events()
    return harness, clients


def test_close_frames_sends_each_rooms_frame_at_once_and_reports_its_events():
    (a, _), (b, _) = broadcasting(), broadcasting(("carol", "dave", "erin"))
    send_many, reports = SendMany(), []
    closed, broadcast, synthesized, unsettled, failed = room_module.close_frames(
        [a.room, b.room], 1.0, send_many, False, reports)
    assert (closed, broadcast, unsettled, failed) == (2, 5, [], [])
    assert synthesized == a.room.synthesized_inputs + b.room.synthesized_inputs > 0
    assert send_many.calls == [([1, 2], STREAM, a.room.history[0]),
                               ([1, 2, 3], STREAM, b.room.history[0])]
    assert [(room, event.kind, event.detail["frame"]) for room, event in reports] == [
        (a.room, "frame", 0), (b.room, "frame", 0)]
    assert a.room.take_frame() == (None, []) and not a.room.actions and not a.room.events
    before = a.room.synthesized_inputs
    closed, _, synthesized, _, _ = room_module.close_frames([a.room], 2.0, send_many, False, [])
    assert closed == 1 and synthesized == a.room.synthesized_inputs - before == 2   # this tick's only


def test_close_frames_runs_each_rooms_group_first_and_its_events_before_the_frame_closes():
    """With the core's run_group, a room's held datagrams are taken in its turn, the events
    that leaves go to handle_events before the room's frame closes (as on arrival), and the
    frame goes out with send_many(..., now): its players flushed at once."""
    (a, _), (b, _), (idle, _) = broadcasting(), broadcasting(), broadcasting()
    a.room.group, b.room.group = 4, 7               # idle: in no group, nothing to run
    runs, handled = [], []

    def run_group(group):
        runs.append((group, a.room.open_frame, b.room.open_frame))
        return group == 7                           # b's held datagrams left an event

    def handle_events(now):
        handled.append((now, b.room.open_frame))

    send_many = SendMany()
    closed, *_ = room_module.close_frames([a.room, b.room, idle.room], 1.0, send_many, False, [],
                                          run_group, handle_events)
    assert closed == 3
    assert runs == [(4, 0, 0), (7, 1, 0)]           # each before its own room's frame
    assert handled == [(1.0, 0)]                    # only after b's, before b's frame closed
    assert [call[3] for call in send_many.calls] == [1.0, 1.0, 1.0]
    # Every SEND_READY_ROOMS rooms, what the pass flushed so far is sent.
    ready = []
    rooms = [broadcasting()[0].room for _ in range(2 * room_module.SEND_READY_ROOMS + 1)]
    room_module.close_frames(rooms, 2.0, SendMany(), False, [], run_group, handle_events,
                             lambda: ready.append(sum(room.open_frame == 1 for room in rooms)))
    every = room_module.SEND_READY_ROOMS
    assert ready == [every, 2 * every]              # the rooms closed by each call


def test_close_frames_leaves_a_room_with_more_to_settle_to_the_server():
    """Actions waiting, nobody connected, or no one left while draining: the room's frame and
    events wait, to go out behind its actions."""
    quiet, _ = broadcasting()
    busy, _ = broadcasting()
    busy.room.actions.append(room_module.Action("send", 1, CONTROL, b"x"))
    empty, _ = broadcasting()
    for peer in (1, 2):
        empty.room.detach(peer, "left", 0.0)
    empty.room.take_events()
    send_many, reports = SendMany(), []
    closed, _, _, unsettled, failed = room_module.close_frames(
        [busy.room, quiet.room, empty.room], 1.0, send_many, False, reports)
    assert unsettled == [busy.room, empty.room] and failed == [] and closed == 3
    assert [call[2] for call in send_many.calls] == [quiet.room.history[0]]
    assert [room for room, _ in reports] == [quiet.room]
    assert busy.room.take_frame() == (busy.room.history[0], [1, 2]) and busy.room.events
    ended, _ = broadcasting()
    ended.room.end("admin")
    ended.room.take_actions()
    ended.room.take_events()
    _, _, _, unsettled, _ = room_module.close_frames([ended.room], 1.0, SendMany(), False, [])
    assert unsettled == [ended.room]                # for the server to forget
    _, _, _, unsettled, _ = room_module.close_frames([quiet.room], 2.0, SendMany(), True, [])
    assert unsettled == []                          # draining, but it has players
    quiet.room.members.clear()
    _, _, _, unsettled, _ = room_module.close_frames([quiet.room], 3.0, SendMany(), True, [])
    assert unsettled == [quiet.room]


def test_close_frames_reports_refused_and_failed_sends_and_keeps_their_events():
    """The room whose send failed keeps its events for the server; the next room goes on."""
    (harness, _), (after, _) = broadcasting(), broadcasting()
    reports: list = []
    send_many = SendMany(refuse=[2])
    _, _, _, _, failed = room_module.close_frames([harness.room, after.room], 1.0, send_many,
                                                  False, reports)
    assert failed == [(harness.room, [2], len(harness.room.history[0]), None),
                      (after.room, [2], len(after.room.history[0]), None)]
    assert reports == [] and harness.room.events        # reported after the failure, by the server
    harness.room.take_events()
    error = ValueError("too large")
    _, _, _, _, failed = room_module.close_frames([harness.room, after.room], 2.0,
                                                  SendMany(error=error), False, reports)
    assert failed == [(harness.room, [1, 2], len(harness.room.history[1]), error),
                      (after.room, [1, 2], len(after.room.history[1]), error)]
    assert harness.room.take_frame() == (None, [])     # taken: the server reports it, not resends
