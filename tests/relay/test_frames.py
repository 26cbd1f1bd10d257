"""Compact FRAME messages (docs/RELAY_PROTOCOL.md section 7.1) and the missing-input policy:
the codec byte for byte, malformed frames, in-order decoding, what rooms put into frames, and
clients decoding them through real sockets and the link emulator."""
from __future__ import annotations

import asyncio
import random

import pytest

from relay import protocol
from relay.protocol import Frame, FrameDecoder, ProtocolError, decode_frame, frame_number
from relay.server.room import RUNNING

from test_room import Harness, make_room


# -- the codec ----------------------------------------------------------------------------------

def test_a_frame_round_trips_with_nil_inputs_events_and_synthesized_marks():
    previous = [b"\x01\x02", b"held", None, b""]
    frame = Frame(70000, [b"\x01\x02", b"new!", b"\x00", b""], [["join", 2, "carol"],
                                                              ["leave", 1, "b\u00f6b"]], [3])
    data = frame.encode(previous)
    assert data[0] == protocol.FRAME_MARKER and frame_number(data) == 70000
    assert decode_frame(data, previous) == frame


def test_the_layout_is_the_documented_one():
    previous = [b"\x01\xff", None, b"\x00\x01"]
    data = Frame(1001, [b"\x01\xff", b"\x07", b"\x00\x02"], [], [0]).encode(previous)
    assert data == bytes([
        0xC1, 0xE9, 0x07,         # marker, number 1001 (varint)
        0x03,                     # flags: same bitmap, synthesized bitmap
        0x03,                     # 3 slots
        0b111,                    # present: slots 0, 1, 2
        0b001,                    # same: slot 0 repeats frame 1000's input
        0b001,                    # synthesized: slot 0
        0x01, 0x07,               # slot 1: 1 byte
        0x02, 0x00, 0x02,         # slot 2: 2 bytes
    ])


def test_repeated_inputs_cost_almost_nothing():
    inputs = [bytes([slot, 1, 2, 3]) for slot in range(8)]
    fresh = Frame(500, inputs).encode()
    repeated = Frame(501, list(inputs)).encode(inputs)
    assert len(fresh) == 1 + 2 + 1 + 1 + 1 + 8 * 5
    assert len(repeated) == 1 + 2 + 1 + 1 + 1 + 1     # marker, number, flags, slots, 2 bitmaps
    one_changed = Frame(502, [b"abcd"] + inputs[1:]).encode(inputs)
    assert len(one_changed) == len(repeated) + 5


def test_many_slots_use_multi_byte_bitmaps():
    inputs = [None if slot % 3 else bytes([slot]) for slot in range(256)]
    frame = Frame(3, inputs, [], [slot for slot in range(0, 256, 3)])
    assert decode_frame(frame.encode()) == frame
    assert decode_frame(Frame(0, []).encode()) == Frame(0, [])


def test_a_frame_that_repeats_inputs_needs_the_previous_frame():
    data = Frame(9, [b"x", b"y"]).encode([b"x", b"z"])
    with pytest.raises(ProtocolError) as error:
        decode_frame(data)
    assert error.value.code == "needs_previous"
    assert str(error.value).startswith("FRAME 9 repeats inputs of frame 8;")
    with pytest.raises(ProtocolError):
        decode_frame(data, [None, b"y"])                 # slot 0 had no input to repeat
    assert decode_frame(data, [b"x", b"z"]).inputs == [b"x", b"y"]


def test_the_decoder_takes_frames_in_order_only():
    decoder = FrameDecoder()
    previous: list = []
    frames = []
    rng = random.Random(3)
    for number in range(200):
        inputs = [rng.choice([None, b"a", b"bb", rng.randbytes(3)]) for _ in range(4)]
        frames.append(Frame(number, inputs).encode(previous))
        previous = inputs
    with pytest.raises(ProtocolError) as error:
        decoder.decode(frames[1])
    assert error.value.code == "out_of_order"
    decoded = [decoder.decode(data) for data in frames]
    assert [f.number for f in decoded] == list(range(200))


@pytest.mark.parametrize("data", [
    b"\xc1",                                     # no number
    b"\xc1\x80",                                 # number varint cut short
    b"\xc1\xff\xff\xff\xff\x7f\x00\x00",         # number above u32
    b"\xc1\x01",                                 # no flags
    b"\xc1\x01\x08\x00",                         # unknown flag
    b"\xc1\x01\x00\x02",                         # bitmap missing
    b"\xc1\x01\x00\x02\x04",                     # bit past the last slot
    b"\xc1\x01\x00\x02\x01",                     # slot 0 present, payload missing
    b"\xc1\x01\x00\x02\x01\x05ab",               # payload cut short
    b"\xc1\x01\x01\x02\x00\x01",                 # same without present
    b"\xc1\x01\x00\x01\x00\x00",                 # a byte past the end
    b"\xc1\x01\x04\x00\x01\x09\x00\x00",         # unknown event kind
    b"\xc1\x01\x04\x00\x01\x00\x00\x05ab",       # event name cut short
    b"\xc1\x01\x04\x00\x01\x00\x00\x01\xff",     # event name not UTF-8
    b"\xc1\x01\x00\xff\x03" + bytes(32),         # more than 256 slots
])
def test_malformed_frames_raise_protocol_error(data):
    with pytest.raises(ProtocolError):
        decode_frame(data, [b"x"] * 8)


def test_every_truncation_and_random_corruption_is_a_protocol_error_never_a_crash():
    rng = random.Random(7)
    good = Frame(123456, [b"abcd", None, b"", b"xyz"], [["join", 1, "zed"]], [0]).encode()
    for cut in range(len(good)):
        with pytest.raises(ProtocolError):
            decode_frame(good[:cut])
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(1, len(data))] = rng.randrange(256)
        try:
            frame = decode_frame(bytes(data), [b"q"] * 8)
        except ProtocolError:
            continue
        assert isinstance(frame, Frame)


# -- the room: missing inputs --------------------------------------------------------------------

def policy_room(policy, neutral="", players=("alice", "bob", "carol")):
    harness = Harness(make_room(start_players=len(players), missing_input_policy=policy,
                                neutral_input=neutral))
    clients = [harness.join(name) for name in players]
    assert harness.room.state == RUNNING
    return harness, clients


def test_policy_none_leaves_a_missing_input_nil_and_marks_nothing():
    harness, (alice, bob, carol) = policy_room("none")
    harness.input(alice, 0, b"A")
    harness.input(bob, 0, b"B")
    harness.tick(2)
    assert [(f.inputs, f.synthesized) for f in alice.frames] == [
        ([b"A", b"B", None], []), ([None, None, None], [])]


def test_policy_repeat_repeats_the_slots_previous_input_and_marks_it():
    harness, (alice, bob, carol) = policy_room("repeat")
    harness.input(alice, 0, b"A0")
    harness.input(bob, 0, b"B0")
    harness.tick()
    harness.input(bob, 1, b"B1")
    harness.tick()
    harness.tick()
    frames = alice.frames
    assert [f.inputs for f in frames] == [[b"A0", b"B0", None],
                                          [b"A0", b"B1", None],     # carol never sent: nil
                                          [b"A0", b"B1", None]]
    assert [f.synthesized for f in frames] == [[], [0], [0, 1]]
    # Every member decodes the same thing from the same bytes.
    assert alice.frame_bytes == bob.frame_bytes == carol.frame_bytes


def test_policy_repeat_never_makes_up_inputs_for_a_player_who_is_away():
    harness, (alice, bob, carol) = policy_room("repeat")
    for client in (alice, bob, carol):
        harness.input(client, 0, b"go")
    harness.tick()
    harness.room.detach(bob.peer_id, "timeout", 1.0)
    harness.tick(2)
    assert [f.inputs[1] for f in alice.frames] == [b"go", None, None]
    assert alice.frames[2].synthesized == [0, 2]
    bob2 = harness.join("bob", now=2.0)
    harness.tick()
    assert alice.frames[3].inputs[1] is None        # nothing to repeat after coming back
    assert bob2.welcome.slot == 1


def test_policy_neutral_fills_missing_inputs_of_connected_players_with_the_neutral_input():
    harness, (alice, bob, carol) = policy_room("neutral", neutral="00ff")
    harness.input(alice, 0, b"\x00\xff")            # a real input equal to the neutral one
    harness.room.detach(carol.peer_id, "leave", 0.0)
    harness.tick()
    frame = alice.frames[0]
    assert frame.inputs == [b"\x00\xff", b"\x00\xff", None]
    assert frame.synthesized == [1]                  # alice's was sent, carol is away
    assert harness.room.synthesized_inputs == 1


def test_a_late_joiner_and_a_caught_up_player_decode_the_same_frames():
    harness, (alice, bob, carol) = policy_room("repeat")
    rng = random.Random(5)
    for number in range(40):
        for client in (alice, bob, carol):
            if rng.random() < 0.5:
                harness.input(client, number, rng.choice([b"L", b"R", b"LR"]), have=number - 1)
        harness.tick()
    late = harness.join("dave")
    harness.tick(5)
    history = late.merged_frames()
    decoder = FrameDecoder()
    decoded = [decoder.decode(data) for data in history]
    assert decoded == alice.frames[:len(decoded)]
    assert any(f.synthesized for f in decoded)


# -- through real sockets ------------------------------------------------------------------------

@pytest.mark.slow
def test_players_and_a_late_joiner_decode_identical_frames_over_a_lossy_link(tmp_path):
    from relay.client import RelayClient, replay_frames
    from relay.tools.netem import Netem
    from relay.replay import ReplayReader

    from live_relay import BAD_LINK, Player, running_server

    async def scenario():
        server = await running_server(tmp_path, start_players=3, missing_input_policy="repeat")
        emulators, players = [], []
        try:
            for seed in range(4):
                netem = Netem(("127.0.0.1", 0), server.udp_address, up=BAD_LINK, down=BAD_LINK,
                              seed=seed)
                await netem.start()
                emulators.append(netem)
            names = ["p0", "p1", "lazy"]
            clients = await asyncio.gather(*[
                RelayClient.connect(*emulators[i].listen_address, "frames", name, timeout=10)
                for i, name in enumerate(names)])
            players = [Player(client, name, input_delay=4) for client, name in zip(clients, names)]
            lazy = players[2]
            original_send = lazy.send
            lazy.send = lambda number: original_send(number) if number % 3 == 0 else None
            await players[0].client.wait_for_state("running")
            await asyncio.gather(*[p.play_until(150, 5) for p in players])
            late = Player(await RelayClient.connect(*emulators[3].listen_address, "frames", "late",
                                                    timeout=10), "late", input_delay=4)
            players.append(late)
            target = late.client.welcome.next_frame + 30
            await asyncio.gather(*[p.play_until(target, 10) for p in players])
            reference = players[0].frames[:target + 1]
            for player in players[1:]:
                assert player.frames[:target + 1] == reference, player.name
            slot = lazy.client.welcome.slot
            synthesized = [f for f in reference if slot in f.synthesized]
            assert len(synthesized) > 60             # the lazy player's frames were filled in
            assert all(f.inputs[slot] is not None for f in reference[20:])
        finally:
            for player in players:
                await player.client.close()
            await server.stop()
            for netem in emulators:
                await netem.stop()
        return reference

    reference = asyncio.run(scenario())
    [replay] = list((tmp_path / "replays").glob("*.replay"))
    assert ReplayReader(replay).version == 2
    assert list(replay_frames(replay))[:len(reference)] == reference
