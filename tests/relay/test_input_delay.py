"""Input-delay advice: the room times each player's inputs and advises a delay (INPUT_DELAY);
the SDK adopts it without giving a frame two inputs or none; over a 60 ms round trip through
real sockets and the link emulator the advice settles where late inputs are rare."""
from __future__ import annotations

import asyncio
import math

import pytest

from relay import protocol
from relay.client import InputDelayAdvice, RelayClient
from relay.protocol import Input, Welcome
from relay.server.room import ADVICE_MIN_SAMPLES

from test_room import Harness, make_room

TICK = 1 / 30


def advice_of(client) -> list[list]:
    return [m[1:] for m in client.of_type(protocol.INPUT_DELAY)]


def play(harness, clients, frames, response, start=0, delay=6, now_of=None):
    """Tick ``frames`` frames; every client answers frame N with its input for N + delay,
    arriving ``response`` seconds after frame N closed (a float or a function of the frame)."""
    room = harness.room
    for number in range(start, start + frames):
        closed_at = number * TICK
        room.tick(closed_at)
        harness.pump()
        took = response(number) if callable(response) else response
        for client in clients:
            room.on_input(client.peer_id, Input(number + delay, b"i", number), closed_at + took)
        harness.pump()


def running_pair(**settings):
    harness = Harness(make_room(start_players=2, **settings))
    clients = [harness.join("alice"), harness.join("bob")]
    return harness, clients


def test_advice_is_the_percentile_response_plus_margin_in_whole_frames():
    harness, (alice, bob) = running_pair(input_delay_margin=0.010)
    play(harness, [alice, bob], 60, response=0.070)
    # 70 ms + 10 ms = 80 ms = 2.4 frames at 30 Hz: 3 frames.
    assert advice_of(alice)[0][:2] == [3, 80]
    assert advice_of(bob)[0][0] == 3
    assert len(advice_of(alice)) == 1                     # nothing changed since: no repeat yet
    [event] = [e for e in harness.take_events("input_delay") if e.detail["player"] == "alice"]
    assert event.detail["frames"] == 3 and event.detail["slot"] == 0


def test_no_advice_before_enough_inputs_and_none_when_disabled():
    harness, (alice, bob) = running_pair()
    play(harness, [alice], ADVICE_MIN_SAMPLES - 1, response=0.05)
    assert advice_of(alice) == []
    harness, (alice, bob) = running_pair(input_delay_advice=False)
    play(harness, [alice, bob], 120, response=0.05)
    assert advice_of(alice) == [] and advice_of(bob) == []


def test_the_first_advice_comes_with_the_tenth_response_time():
    # docs/RELAY_PROTOCOL.md 8.3: "No advice before 10 response times."
    for inputs, advised in ((9, 0), (10, 1)):
        harness, (alice, bob) = running_pair()
        play(harness, [alice], inputs, response=0.05)
        play(harness, [], 60, start=inputs, response=0.05)     # 2 s of reviews, no more inputs
        assert len(advice_of(alice)) == advised


def test_a_rare_slow_input_counts_only_past_the_percentile():
    harness, (alice, bob) = running_pair(input_delay_percentile=95.0, input_delay_window=100)
    play(harness, [alice], 150, response=lambda n: 0.300 if n % 50 == 0 else 0.040)
    # 3 slow inputs in the last 100 stay above the 95th percentile: 40 + 10 ms -> 2 frames.
    assert advice_of(alice)[-1][0] == 2


def test_the_advice_rises_at_once_and_falls_only_with_half_a_frame_to_spare():
    # A window of 30 response times: lowering also waits 1 s (30 frames) with the lower
    # advice enough at every review, so each lowering phase lasts 3 s (the old window's
    # times go out in the first second).
    harness, (alice, bob) = running_pair(input_delay_window=30)
    play(harness, [alice], 60, response=0.050)              # 60 ms: 2 frames
    assert advice_of(alice)[-1][0] == 2
    play(harness, [alice], 30, start=60, response=0.120)    # 130 ms: 4 frames
    assert advice_of(alice)[-1][0] == 4
    # 58 ms = 1.74 frames: 2 would do, but lowering wants half a frame more (2.24 -> 3).
    play(harness, [alice], 90, start=90, response=0.048)
    assert advice_of(alice)[-1][0] == 3
    play(harness, [alice], 90, start=180, response=0.030)   # 40 ms: 1.2 frames (+0.5 -> 2)
    assert advice_of(alice)[-1][0] == 2
    play(harness, [alice], 90, start=270, response=0.054)   # 64 ms: needs 2, stays 2
    assert advice_of(alice)[-1][0] == 2
    play(harness, [alice], 90, start=360, response=0.004)   # 14 ms: 0.42 frames (+0.5 < 1)
    assert advice_of(alice)[-1][0] == 1


def test_the_advice_falls_only_once_a_whole_window_allowed_it():
    harness, (alice, bob) = running_pair(input_delay_window=30, input_delay_interval=60.0)
    play(harness, [alice], 60, response=0.120)              # 130 ms: 4 frames
    assert [a[0] for a in advice_of(alice)] == [4]
    # 40 ms (2 frames would do) for 1.5 s, then a spike: the window's times were low for
    # 0.5 s only, too short to lower, and the spike ends the wait.
    play(harness, [alice], 45, start=60, response=0.030)
    play(harness, [alice], 3, start=105, response=0.120)
    assert [a[0] for a in advice_of(alice)] == [4]
    # Low again: the wait starts anew once the spike has left the window (1 s), and the
    # advice falls one window (1 s) of reviews later, not before.
    play(harness, [alice], 50, start=108, response=0.030)
    assert [a[0] for a in advice_of(alice)] == [4]
    play(harness, [alice], 40, start=158, response=0.030)
    assert [a[0] for a in advice_of(alice)] == [4, 2]


def test_the_advice_stays_within_its_bounds_and_max_input_lead():
    harness, (alice, bob) = running_pair(input_delay_min=2, input_delay_max=5)
    play(harness, [alice], 60, response=0.001)
    assert advice_of(alice)[-1][0] == 2
    play(harness, [alice], 200, start=60, response=1.0)
    assert advice_of(alice)[-1][0] == 5
    harness, (alice, bob) = running_pair(input_delay_max=50, max_input_lead=4)
    play(harness, [alice], 60, response=1.0, delay=3)
    assert advice_of(alice)[-1][0] == 4


def test_the_advice_is_repeated_every_interval_and_counts_late_inputs():
    harness, (alice, bob) = running_pair(input_delay_interval=1.0)
    # Inputs for the frame that has just closed: every one of them is late.
    play(harness, [alice], 120, response=0.05, delay=0)
    advice = advice_of(alice)
    # 4 s of play: the first advice at the 10th input (0.35 s), then one a second, no more.
    assert len(advice) == 4
    assert {a[0] for a in advice} == {2}
    frames, response_ms, late, inputs = advice[-1]
    assert inputs == late >= ADVICE_MIN_SAMPLES * 9      # every input counted, all late


def test_an_input_for_the_frame_still_open_is_on_time_and_one_for_a_closed_frame_late():
    harness, (alice, bob) = running_pair(input_delay_interval=1.0)
    play(harness, [alice], 60, response=0.05, delay=1)      # for the open frame: just in time
    frames, response_ms, late, inputs = advice_of(alice)[-1]
    assert inputs >= ADVICE_MIN_SAMPLES and late == 0
    play(harness, [alice], 60, response=0.05, start=60, delay=0)     # for the frame just closed
    frames, response_ms, late, inputs = advice_of(alice)[-1]
    assert late > 0


def test_inputs_sent_while_catching_up_or_naming_an_unknown_frame_are_not_timed():
    harness, (alice, bob) = running_pair()
    room = harness.room
    for number in range(40):
        room.tick(number * TICK)
        harness.pump()
        # have = -1 (nothing held yet) and a have that is not closed yet: no sample.
        room.on_input(alice.peer_id, Input(number + 2, b"i", -1), number * TICK + 5.0)
        room.on_input(alice.peer_id, Input(number + 3, b"i", number + 5), number * TICK + 5.0)
    harness.pump()
    assert advice_of(alice) == []
    assert room.input_times.review(0, room.open_frame - 1, 99.0) == (0, 0, 0.0)


# -- the SDK -------------------------------------------------------------------------------------

class StubClient(RelayClient):
    """The SDK's input scheduling without a connection: send_input records the frames."""

    def __init__(self, **options):
        super().__init__("127.0.0.1", 9, "room", "me", **options)
        self.welcome = Welcome("room", "me", 0, 30, "running", 10, 10)
        self.sent: list[int] = []

    def send_input(self, frame, payload):
        self.sent.append(frame)
        self.last_input_frame = max(self.last_input_frame, frame)
        return True


def test_send_next_input_follows_the_advice_without_duplicating_or_skipping_frames():
    client = StubClient(input_delay=2, auto_input_delay=True)
    client.next_frame = 10                          # history 0..9 applied; live from 10
    assert client.send_next_input(b"x") == [10, 11]
    plan = {13: 5, 20: 1, 30: 3, 40: 3}
    for applied in range(10, 60):
        client.next_frame = applied + 1             # frame ``applied`` was yielded
        if applied in plan:
            client.input_delay_advice = InputDelayAdvice(plan[applied], 0, 0, 0)
        client.send_next_input(b"x")
    assert client.sent == list(range(10, client.sent[-1] + 1)), "a frame got two inputs or none"
    assert client.input_delay == 3 and client.sent[-1] == 59 + 3


def test_without_auto_the_advice_is_only_reported():
    client = StubClient(input_delay=2)
    client.next_frame = 10
    client.input_delay_advice = InputDelayAdvice(6, 180, 3, 150)
    assert client.advised_input_delay == 6
    assert client.send_next_input(b"x") == [10, 11]
    assert client.input_delay == 2
    with pytest.raises(ValueError):
        StubClient(input_delay=0)


# -- through real sockets ------------------------------------------------------------------------

@pytest.mark.slow
def test_over_a_60_ms_round_trip_the_advice_settles_where_late_inputs_are_rare(tmp_path):
    from relay.tools.netem import LinkSettings, Netem

    from live_relay import running_server

    link = LinkSettings(delay=30, jitter=4)               # 60-68 ms round trip, no loss

    async def player(client: RelayClient, frames: int) -> list:
        seen = []
        await client.wait_for_state("running")
        client.send_next_input(client.player.encode())
        while len(seen) < frames:
            frame = await client.next_frame_or_none(timeout=5)
            assert frame is not None
            seen.append(frame)
            client.send_next_input(client.player.encode())
        return seen

    async def scenario():
        # Late inputs are dropped, so a frame without our input is exactly a late input.
        server = await running_server(tmp_path, start_players=2, late_input_policy="drop")
        emulators, clients = [], []
        try:
            for seed in range(2):
                netem = Netem(("127.0.0.1", 0), server.udp_address, up=link, down=link, seed=seed)
                await netem.start()
                emulators.append(netem)
            clients = await asyncio.gather(*[
                RelayClient.connect(*emulators[i].listen_address, "advice", f"p{i}", timeout=10,
                                    input_delay=1, auto_input_delay=True)
                for i in range(2)])
            seen = await asyncio.gather(*[player(client, 240) for client in clients])
            for client, frames in zip(clients, seen):
                slot = client.welcome.slot
                assert client.advised_input_delay in (3, 4), client.input_delay_advice
                assert client.input_delay == client.advised_input_delay
                early = sum(1 for f in frames[2:15] if f.inputs[slot] is None)
                late = sum(1 for f in frames[-120:] if f.inputs[slot] is None)
                assert early >= 8, "a delay of 1 frame is too short for this link"
                assert late <= 2, f"{late} of the last 120 frames lack {client.player}'s input"
        finally:
            for client in clients:
                await client.close()
            await server.stop()
            for netem in emulators:
                await netem.stop()

    asyncio.run(scenario())


def answered(times, slot, frame, late, response, closed_at=100.0):
    """Frame ``frame`` closed at ``closed_at`` (if its row does not hold it yet) and the slot's
    input answering it arrived ``response`` seconds later."""
    return times.answer(slot, frame, late, closed_at + response)


def test_input_times_keep_the_last_window_of_frames_and_take_nearest_rank_percentiles():
    from relay.server.timing import InputTimes

    times = InputTimes(2, 5)
    assert times.review(0, 10, 99.0) == (0, 0, 0.0)
    for frame, value in enumerate([0.5, 0.1, 0.4, 0.2, 0.3, 0.9, 0.05]):
        times.close(frame, 100.0)
        assert answered(times, 0, frame, frame % 2 == 0, value) == pytest.approx(value)
        answered(times, 1, frame, False, 1.0)
    window = [0.4, 0.2, 0.3, 0.9, 0.05]         # frames 2..6, the last five answered
    for percent in (1, 20, 40, 50, 60, 80, 99, 100):
        rank = max(1, -(-percent * 5 // 100))
        count, late, value = times.review(0, 6, percent)
        # Samples are kept as 32-bit floats.
        assert count == 5 and value == pytest.approx(sorted(window)[rank - 1], rel=1e-6)
    assert times.review(0, 6, 99.0)[1] == 3     # frames 2, 4 and 6 were answered late
    assert times.review(1, 6, 50.0) == (5, 0, 1.0)
    # Reviewed later, frames older than the window no longer count, answered or not.
    assert times.review(0, 8, 99.0)[:2] == (3, 2)
    assert times.review(0, 20, 99.0) == (0, 0, 0.0)
    with pytest.raises(ValueError):
        InputTimes(2, 0)


def test_input_times_keep_the_slowest_answer_to_a_frame_and_time_only_frames_they_hold():
    from relay.server.timing import InputTimes

    times = InputTimes(1, 4)
    assert answered(times, 0, 7, False, 0.05) == -1.0     # frame 7 never closed: not timed
    times.close(7, 100.0)
    assert times.review(0, 7, 100.0) == (0, 0, 0.0)
    answered(times, 0, 7, False, 0.05)
    answered(times, 0, 7, True, 0.02)           # a second input answering frame 7
    assert times.review(0, 7, 100.0) == (1, 1, pytest.approx(0.05))
    assert answered(times, 0, 3, False, 0.9) == -1.0      # frame 7 holds its row, not 3
    assert times.answer(0, 7, False, 99.0) == 0.0         # before the close (clocks): 0
    times.close(11, 200.0)                      # frame 11 takes the row over from 7
    assert times.review(0, 11, 100.0) == (0, 0, 0.0)
    answered(times, 0, 11, False, 0.01, closed_at=200.0)
    assert times.review(0, 11, 100.0) == (1, 0, pytest.approx(0.01))
    times.clear_slot(0)
    assert times.review(0, 11, 100.0) == (0, 0, 0.0)
    with pytest.raises(ValueError, match="slot"):
        times.answer(1, 11, False, 0.0)


def test_input_times_percentiles_match_a_sort_on_random_windows():
    import random

    from relay.server.timing import InputTimes

    rng = random.Random(7)
    for window in (1, 2, 3, 10, 150, 1024, 1025, 3000):     # past 1024: gathered on the heap
        times = InputTimes(3, window)
        frames = rng.randrange(1, 3 * window + 1)
        values, marks = [], []
        for frame in range(frames):
            value = rng.choice([0.01, 0.02, 0.5]) if rng.random() < 0.3 else rng.random()
            late = rng.random() < 0.3
            values.append(value)
            marks.append(late)
            times.close(frame, 100.0)
            answered(times, 1, frame, late, value)
        held = sorted(values[-window:])
        # Around the 16 largest (read in one pass) and past them (selected).
        near_top = [100 * (len(held) - m + 0.5) / len(held) for m in (1, 2, 15, 16, 17, 18)
                    if m <= len(held)]
        for percent in [0.1, 10, 50, 90, 95, 99, 100] + near_top:
            rank = max(1, math.ceil(percent / 100 * len(held)))
            count, late, value = times.review(1, frames - 1, percent)
            assert count == len(held) and late == sum(marks[-window:]), window
            assert value == pytest.approx(held[rank - 1], rel=1e-6), (window, percent)
        assert times.review(0, frames - 1, 99.0) == (0, 0, 0.0)
