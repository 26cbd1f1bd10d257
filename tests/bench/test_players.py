"""benchmarks/players.py: the lockstep player every load benchmark simulates."""
from __future__ import annotations

import msgpack

from benchmarks.players import (
    LOST_TOLERANCE_FRAMES, ROOM_SIZE, LockstepPlayer, seat, window_shortfall,
)
from relay import protocol


def test_first_frame_asks_for_every_input_up_to_the_delay_then_one_per_frame():
    player = LockstepPlayer(0, input_delay=3)
    assert list(player.on_frame(10)) == [11, 12, 13]
    assert list(player.on_frame(11)) == [14]
    assert (player.frames, player.last, player.running) == (2, 11, True)


def test_gaps_duplicates_and_non_frames_are_counted_not_answered():
    player = LockstepPlayer(0)
    player.on_frame(0)
    assert list(player.on_frame(4)) == [6]
    assert player.gaps == 3
    assert list(player.on_frame(2)) == [] and player.duplicates == 1
    assert list(player.on_frame(-1)) == [] and player.duplicates == 1
    assert player.frames == 2


def test_inputs_name_player_and_frame():
    player = LockstepPlayer(5)
    payload = player.input_payload(7)
    assert len(payload) == 16 and payload != player.input_payload(8)
    assert payload != LockstepPlayer(6).input_payload(7)
    player.last = 6
    assert msgpack.unpackb(player.input_message(7, payload)) == [protocol.INPUT, 7, payload, 6]


def test_seats_fill_rooms_in_order():
    assert seat(0) == (0, "p0")
    assert seat(ROOM_SIZE - 1) == (0, f"p{ROOM_SIZE - 1}")
    assert seat(ROOM_SIZE) == (1, "p0")


def test_window_shortfall_forgives_the_window_edges():
    players = [LockstepPlayer(i) for i in range(3)]
    for player, frames in zip(players, (100, 100 - LOST_TOLERANCE_FRAMES, 90)):
        player.frames = frames
    lost, short, worst = window_shortfall(players, 100.0)
    assert (lost, short, worst) == (10 - LOST_TOLERANCE_FRAMES, 1, 10.0)
