"""The lobby hands every refused history or catch-up block, and every frame the core refuses as
too large, back to its room, and a refused part of a history cut into several blocks does not
make the room lose count of the parts still in flight.

The core refuses a block in two ways: ``send_block`` returns False (its queue is full) or raises
ValueError (the block exceeds max_block_size). Both must reach ``Room.on_send_failed`` or the
member stays marked as catching up and never gets another block.

These tests drive ``Lobby._settle`` (private: it is the one place the lobby carries out a room's
actions, and no public entry point reaches it without a match large enough to pass the core's
block limit) with a stand-in endpoint.
"""
from __future__ import annotations

import dataclasses

import pytest

import relay.server.room
from relay import protocol
from relay.config import RelayConfig
from relay.server.room import Room


class StandInEndpoint:
    """What Lobby._settle uses of the core's Endpoint. ``refuse(data)`` decides each block:
    None to take it, False to refuse it as a full queue does, or an exception to raise."""

    def __init__(self, refuse=lambda data: None):
        self.refuse = refuse
        self.taken: list[tuple[int, int]] = []        # (peer id, first frame) of each block taken
        self.offered = 0

    def send_block(self, peer_id: int, data: bytes) -> bool:
        self.offered += 1
        verdict = self.refuse(data)
        if isinstance(verdict, Exception):
            raise verdict
        if verdict is False:
            return False
        self.taken.append((peer_id, protocol.decode_history(data)[0]))
        return True

    def is_connected(self, peer_id: int) -> bool:
        return True

    def send(self, peer_id, channel, data) -> bool:
        return True

    def send_many(self, peer_ids, channel, data):
        return []

    def disconnect(self, peer_id, reason) -> None:
        pass


def too_large(data: bytes) -> ValueError:
    # The core's own words (Endpoint.send_block).
    return ValueError(f"block of {len(data)} bytes exceeds max_block_size (1024)")


def make_lobby():
    from relay.server.lobby import Lobby

    config = RelayConfig()
    config = dataclasses.replace(config, security=dataclasses.replace(config.security,
                                                                      handshake_rate=0))
    return Lobby(config)


def running_room(lobby, frames: int) -> Room:
    room = Room("arena", lobby.settings, 30, 0.0, start_policy="players", start_players=1)
    lobby.rooms["arena"] = room
    room.join(1, "ann", False, 0.0)
    for number in range(frames):
        room.tick(number / 30)
    room.take_actions()
    room.take_events()
    return room


def blocks_for(actions, peer_id: int) -> list[int]:
    return [protocol.decode_history(a.data)[0] for a in actions
            if a.kind == "block" and a.peer_id == peer_id]


def test_a_history_block_too_large_for_the_core_is_repaired_at_the_next_tick():
    # Before: the ValueError path logged and counted, but never told the room, so the late
    # joiner stayed "catching up" and no repair block was ever queued.
    lobby = make_lobby()
    room = running_room(lobby, 5)
    room.join(2, "late", False, 1.0)
    lobby.endpoint = StandInEndpoint(refuse=too_large)
    lobby._settle(room)                     # WELCOME goes, the history block raises ValueError
    assert lobby.endpoint.offered == 1 and lobby.endpoint.taken == []
    late = room.members[2]
    assert not late.catching_up and late.missing_from == 0
    room.tick(1.0)
    assert blocks_for(room.take_actions(), 2) == [0], "the next tick repairs from frame 0"
    assert room.members[2].catching_up


def test_a_catch_up_block_too_large_for_the_core_is_offered_again():
    lobby = make_lobby()
    room = running_room(lobby, 5)
    room.join(2, "late", False, 1.0)
    attempts = []

    def refuse_twice(data):
        attempts.append(protocol.decode_history(data)[0])
        return too_large(data) if len(attempts) <= 2 else None

    lobby.endpoint = StandInEndpoint(refuse=refuse_twice)
    lobby._settle(room)
    for _ in range(3):
        room.tick(1.0)
        lobby._settle(room)
    # Refused, repaired and refused again, then taken: one offer per tick, never stuck.
    assert attempts == [0, 0, 0]
    assert lobby.endpoint.taken == [(2, 0)]
    assert room.members[2].catching_up and room.members[2].blocks_in_flight == 1
    room.on_block_delivered(2)
    assert not room.members[2].catching_up


def test_a_refused_block_for_a_peer_that_is_gone_is_not_repaired():
    lobby = make_lobby()
    room = running_room(lobby, 5)
    room.join(2, "late", False, 1.0)
    lobby.endpoint = StandInEndpoint(refuse=too_large)
    lobby.endpoint.is_connected = lambda peer_id: False
    lobby._settle(room)
    # Its disconnect event detaches it; nothing to repair meanwhile.
    assert room.members[2].missing_from is None


def test_later_parts_of_a_history_whose_first_part_was_refused_do_not_end_the_repair_early(
        monkeypatch):
    # A history of 10 frames in parts of 4: [0..3] [4..7] [8, 9]. The core refuses the first
    # and takes the other two, which it still delivers. Before: the refusal set the in-flight
    # count to 0, so those two deliveries were taken off the repair's count, and the member was
    # marked caught up while the repair's last part was still in flight.
    monkeypatch.setattr(relay.server.room, "HISTORY_BLOCK_FRAMES", 4)
    lobby = make_lobby()
    room = running_room(lobby, 10)
    room.join(2, "late", False, 1.0)
    lobby.endpoint = StandInEndpoint(
        refuse=lambda data: False if lobby.endpoint.offered == 1 else None)
    lobby._settle(room)
    assert lobby.endpoint.taken == [(2, 4), (2, 8)]
    late = room.members[2]
    assert late.blocks_in_flight == 2, "the two parts the core took are still in flight"
    assert not late.catching_up, "the repair is due at the next tick"

    room.tick(1.0)
    lobby._settle(room)                     # the repair: frames 0..10 in three parts
    assert lobby.endpoint.taken[2:] == [(2, 0), (2, 4), (2, 8)]
    late = room.members[2]
    assert late.catching_up and late.blocks_in_flight == 5
    for delivered in range(4):              # the two old parts, then two of the repair's
        room.on_block_delivered(2)
        assert room.members[2].catching_up, f"caught up after {delivered + 1} of 5 deliveries"
    room.on_block_delivered(2)
    assert not room.members[2].catching_up
    assert room.members[2].blocks_in_flight == 0


@pytest.mark.parametrize("refused", [1, 2])
def test_a_refused_later_part_keeps_the_parts_before_it_counted(monkeypatch, refused):
    monkeypatch.setattr(relay.server.room, "HISTORY_BLOCK_FRAMES", 4)
    lobby = make_lobby()
    room = running_room(lobby, 10)
    room.join(2, "late", False, 1.0)
    lobby.endpoint = StandInEndpoint(
        refuse=lambda data: False if lobby.endpoint.offered == refused + 1 else None)
    lobby._settle(room)
    assert len(lobby.endpoint.taken) == 2
    late = room.members[2]
    assert late.blocks_in_flight == 2 and late.missing_from == 0 and not late.catching_up
    room.tick(1.0)
    lobby._settle(room)
    assert [first for _, first in lobby.endpoint.taken[2:]] == [0, 4, 8]
    for _ in range(4):
        room.on_block_delivered(2)
        assert room.members[2].catching_up
    room.on_block_delivered(2)
    assert not room.members[2].catching_up


def test_server_hands_a_block_refused_by_a_full_queue_back_to_the_room_for_repair():
    lobby = make_lobby()
    room = running_room(lobby, 5)
    room.join(2, "late", False, 1.0)
    lobby.endpoint = StandInEndpoint(refuse=lambda data: False)
    lobby._settle(room)                               # WELCOME goes, the history block is refused
    assert lobby.endpoint.offered == 1 and lobby.endpoint.taken == []
    room.tick(1.0)
    repairs = [a for a in room.take_actions() if a.kind == "block" and a.peer_id == 2]
    assert len(repairs) == 1 and protocol.decode_history(repairs[0].data)[0] == 0


class RefusingFrames(StandInEndpoint):
    """Takes blocks; refuses STREAM messages of ``refused`` (frame bytes) as too large, as the
    core does for a frame past max_message_size."""

    def __init__(self, refused: set):
        super().__init__()
        self.refused = refused

    def _check(self, channel, data):
        if channel == protocol.STREAM and data in self.refused:
            raise ValueError(f"message of {len(data)} bytes on channel 1 exceeds max_message_size")

    def send(self, peer_id, channel, data) -> bool:
        self._check(channel, data)
        return True

    def send_many(self, peer_ids, channel, data):
        self._check(channel, data)
        return []


@pytest.mark.parametrize("broadcast", [True, False])
def test_a_frame_too_large_for_one_message_reaches_every_player_in_a_catch_up_block(broadcast):
    # Before: the ValueError was counted and logged, and the frame was simply lost for the
    # whole room (clients wait for it forever).
    lobby = make_lobby()
    room = running_room(lobby, 5)
    room.join(2, "bob", False, 1.0)
    room.broadcast_frames = broadcast
    lobby.endpoint = StandInEndpoint()
    lobby._settle(room)
    room.on_block_delivered(2)                          # bob's history arrived
    data = room.tick(1.0)                               # frame 5: the core refuses it
    lobby.endpoint = RefusingFrames({data})
    lobby._settle(room)
    assert {peer: room.members[peer].missing_from for peer in (1, 2)} == {1: 5, 2: 5}
    room.tick(1.1)                                      # frame 6 goes; 5 is repaired
    lobby._settle(room)
    assert sorted(lobby.endpoint.taken) == [(1, 5), (2, 5)]
