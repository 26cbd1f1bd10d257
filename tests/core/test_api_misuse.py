"""The compiled modules refuse a misused public API with an exception.

They are built with boundscheck=False and wraparound=False, so an argument of the wrong shape or
out of range (a 1-tuple where (data, address) belongs, a channel index past the last channel,
None where bytes belong, a list that changes during a call) would otherwise be read past its end.
Each test here crashed or read garbage before its entry point checked (issue #24, item 3).
"""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import types
from collections import deque

import pytest

from relay import protocol
from relay.server import room as compiled_room
from relay.config import RelayConfig
from relay_core import Endpoint, EndpointConfig
from relay_core.channel import make_receive_channel, make_send_channel
from relay_core.block import BlockReceiver, BlockSender
from relay_core.fragment import MemoryBudget, PartialMessage, split_message
from relay_core.peer import Peer
from relay_core.wire import encode_packet

batchio = pytest.importorskip("relay._batchio")
frames = pytest.importorskip("relay.frames")
inputs = pytest.importorskip("relay.server.inputs")
timing = pytest.importorskip("relay.server.timing")

CHANNELS = len(EndpointConfig().channels)


def server(**config) -> Endpoint:
    return Endpoint(EndpointConfig(accept_connections=True, seed=1, **config))


def client_with_a_peer() -> tuple[Endpoint, int]:
    client = Endpoint(EndpointConfig(seed=2))
    return client, client.connect(("127.0.0.1", 9), 0.0)


def bare_peer(config: EndpointConfig | None = None) -> Peer:
    return Peer(1, ("127.0.0.1", 9), config or EndpointConfig().validate(), deque(), 0.0, 5,
                MemoryBudget(1 << 20))


# -- relay_core.endpoint --------------------------------------------------------------------------

@pytest.mark.parametrize("item", [(b"\x00" * 20,), (), None], ids=["1-tuple", "empty", "None"])
def test_receive_batch_refuses_an_item_without_an_address(item):
    endpoint = server()
    with pytest.raises(ValueError, match=r"datagrams\[1\]"):
        endpoint.receive_batch([(b"\x00" * 20, ("127.0.0.1", 1)), item], 0.0)


@pytest.mark.parametrize("data", [64, None, 1.5], ids=["int", "None", "float"])
def test_receive_refuses_data_that_is_not_bytes(data):
    endpoint = server()
    with pytest.raises(TypeError, match="data must be bytes"):
        endpoint.receive(data, ("127.0.0.1", 1), 0.0)
    with pytest.raises(TypeError, match="data must be bytes"):
        endpoint.receive_batch([(data, ("127.0.0.1", 1))], 0.0)
    assert endpoint.drops == {}


def test_receive_still_takes_bytes_like_data():
    endpoint = server()
    endpoint.receive(bytearray(b"\x00" * 20), ("127.0.0.1", 1), 0.0)
    assert endpoint.receive_batch([(memoryview(b"\x00" * 20), ("127.0.0.1", 1))], 0.0) == 20
    assert sum(endpoint.drops.values()) == 2


@pytest.mark.parametrize("channel", [CHANNELS, 40, -1, -(2**31)])
def test_channel_snapshot_refuses_a_channel_out_of_range(channel):
    client, peer_id = client_with_a_peer()
    with pytest.raises(IndexError, match=f"channel {channel} does not exist"):
        client.channel_snapshot(peer_id, channel)
    assert client.channel_snapshot(peer_id, 0)["next_id"] == 0


def test_handshake_rate_limit_takes_an_empty_address():
    # The rate limit buckets by address[0] for a tuple; () has none.
    endpoint = server(handshake_rate=10.0)
    request = encode_packet({"type": "connect_request", "connect_id": 7})
    endpoint.receive(request, (), 0.0)
    replies = endpoint.datagrams_to_send(0.0)
    assert [address for _, address in replies] == [()]
    assert decode_type(replies[0][0]) == "challenge"


def decode_type(datagram: bytes) -> str:
    from relay_core.wire import decode_packet
    return decode_packet(datagram)["type"]


def test_endpoint_refuses_a_config_that_is_not_an_endpoint_config():
    # A look-alike whose validate() checks nothing could size the scratch buffer below the mtu.
    look_alike = types.SimpleNamespace(validate=lambda: look_alike, mtu=16)
    with pytest.raises(TypeError, match="config must be a relay_core.EndpointConfig"):
        Endpoint(look_alike)


# -- relay_core.peer ------------------------------------------------------------------------------

@pytest.mark.parametrize("channel", [CHANNELS, -1])
def test_peer_refuses_a_channel_out_of_range(channel):
    peer = bare_peer()
    with pytest.raises(IndexError, match=f"channel {channel} does not exist"):
        peer.queue_message(channel, b"x")
    with pytest.raises(IndexError, match=f"channel {channel} does not exist"):
        peer.channel_snapshot(channel)
    assert peer.queue_message(0, b"x") is True


def test_peer_queue_message_refuses_none():
    with pytest.raises(TypeError, match="payload"):
        bare_peer().queue_message(0, None)


def test_peer_refuses_a_missing_block_budget():
    with pytest.raises(TypeError, match="block_budget"):
        Peer(1, ("127.0.0.1", 9), EndpointConfig().validate(), deque(), 0.0, 5, None)


@pytest.mark.parametrize("size", [0, 48, -64])
def test_peer_refuses_a_sent_packet_buffer_that_is_not_a_power_of_two(size):
    # Slots are found by seq & (size - 1): 0 would index the whole 16-bit range.
    with pytest.raises(ValueError, match="sent_packet_buffer"):
        bare_peer(EndpointConfig(sent_packet_buffer=size))


# -- relay_core.channel ---------------------------------------------------------------------------

SEND_OPTIONS = dict(window=64, max_pending=16, fragment_size=1000, whole_limit=1100,
                    max_fragments_in_flight=64, max_resends=10, rto_limit=5.0)


@pytest.mark.parametrize("change, name", [
    ({"fragment_size": 0}, "fragment_size"), ({"whole_limit": -1}, "whole_limit"),
    ({"window": 0}, "window"), ({"window": 48}, "window"), ({"window": 65536}, "window"),
])
def test_send_channel_refuses_sizes_out_of_range(change, name):
    with pytest.raises(ValueError, match=name):
        make_send_channel(0, "reliable_ordered", **{**SEND_OPTIONS, **change})
    assert make_send_channel(0, "reliable_ordered", **SEND_OPTIONS).snapshot()["slots"] == 8


@pytest.mark.parametrize("channel_id", [256, -1])
def test_send_channel_refuses_an_id_that_does_not_fit_a_byte(channel_id):
    with pytest.raises(ValueError, match="channel_id"):
        make_send_channel(channel_id, "unreliable", **SEND_OPTIONS)


def test_receive_channel_refuses_a_missing_budget_or_a_bad_window():
    with pytest.raises(TypeError, match="budget"):
        make_receive_channel(0, "reliable_ordered", window=64, budget=None, max_message_size=1000)
    with pytest.raises(ValueError, match="window"):
        make_receive_channel(0, "redundant", window=100, budget=MemoryBudget(1000),
                             max_message_size=1000)


# -- relay_core.block ------------------------------------------------------------------------------

def run_isolated(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: before its fix it killed the process (SIGFPE)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)


def test_block_sender_refuses_a_zero_slice_size_instead_of_dividing_by_it():
    result = run_isolated("""
        from relay_core.block import BlockSender
        try:
            sender = BlockSender(0, 256, 8)
        except ValueError as error:
            print("refused:", error)
        else:
            sender.enqueue(b"x" * 100)      # ceil(100 / 0) in C
            print("accepted")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused:") and "slice_size" in result.stdout


@pytest.mark.parametrize("arguments, name", [
    ((-1, 256, 8), "slice_size"), ((16384, 256, 8), "slice_size"),
    ((1024, 0, 8), "window"), ((1024, -3, 8), "window"), ((1024, 513, 8), "window"),
    ((1024, 256, 0), "max_queued"), ((1024, 256, -1), "max_queued"),
])
def test_block_sender_refuses_arguments_out_of_range(arguments, name):
    with pytest.raises(ValueError, match=name):
        BlockSender(*arguments)
    assert BlockSender(1, 512, 1).enqueue(b"x") is True


def test_block_sender_enqueue_refuses_none():
    sender = BlockSender(1024, 256, 8)
    with pytest.raises(TypeError, match="data"):
        sender.enqueue(None)
    assert sender.pending_blocks == 0
    assert sender.enqueue(b"") is True and sender.pending_blocks == 1


def test_block_sender_refuses_a_block_of_more_than_65535_slices():
    # The slice count is a u16 on the wire: 65536 slices would be announced as 0.
    sender = BlockSender(1, 256, 8)
    with pytest.raises(ValueError, match="65535 slices"):
        sender.enqueue(b"x" * 65536)
    assert sender.pending_blocks == 0
    assert sender.enqueue(b"x" * 65535) is True


def test_block_receiver_refuses_a_missing_budget():
    with pytest.raises(TypeError, match="budget"):
        BlockReceiver(1 << 20, None)
    BlockReceiver(1 << 20, MemoryBudget(1 << 20))


@pytest.mark.parametrize("size", [-1, 2**32])
def test_block_receiver_refuses_a_max_block_size_that_is_not_a_u32(size):
    # Compared as a u32 with each block_size: -1 would admit every block.
    with pytest.raises(ValueError, match="max_block_size"):
        BlockReceiver(size, MemoryBudget(1 << 20))


# -- relay_core.fragment ---------------------------------------------------------------------------

@pytest.mark.parametrize("count", [-5, 0, 1, 256])
def test_partial_message_refuses_a_fragment_count_outside_2_to_255(count):
    # RELAY_PROTOCOL 6.4: fragment_count is 2..255.
    with pytest.raises(ValueError, match="fragment_count"):
        PartialMessage(count)
    assert PartialMessage(2).fragment_count == 2 and PartialMessage(255).fragment_count == 255


def test_memory_budget_refuses_a_negative_limit():
    with pytest.raises(ValueError, match="limit"):
        MemoryBudget(-1)
    assert MemoryBudget(0).limit == 0


@pytest.mark.parametrize("size", [0, -4])
def test_split_message_refuses_a_fragment_size_below_one(size):
    # 0 failed inside range() naming nothing; -4 returned no fragment for a non-empty payload.
    with pytest.raises(ValueError, match="fragment_size"):
        split_message(b"payload", size)
    assert split_message(b"payload", 3) == [b"pay", b"loa", b"d"]


def test_split_message_refuses_none():
    with pytest.raises(TypeError, match="payload"):
        split_message(None, 10)


# -- relay._batchio -------------------------------------------------------------------------------

class ShrinkingHost(str):
    """An address host whose hash empties the list being sent, once."""

    victim: list = []

    def __hash__(self):
        if self.victim:
            self.victim.clear()
        return str.__hash__(self)


def test_batch_socket_send_survives_a_list_that_shrinks():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        receiver.bind(("127.0.0.1", 0))
        receiver.setblocking(False)
        sender.setblocking(False)
        port = receiver.getsockname()[1]
        datagrams = [(b"first", (ShrinkingHost("127.0.0.1"), port))]
        datagrams += [(b"next %d" % i, ("127.0.0.1", port)) for i in range(9)]
        ShrinkingHost.victim = datagrams
        io = batchio.BatchSocket(sender.fileno())
        try:
            sent = io.send(datagrams)
        finally:
            ShrinkingHost.victim = []
        assert datagrams == []              # it did shrink, during the call
        # What was offered went: the call worked on its own copy.
        assert sent == 10 and io.last_sent_count == 10
        receiver.settimeout(5.0)
        got = [receiver.recv(100) for _ in range(10)]
        assert got == [b"first"] + [b"next %d" % i for i in range(9)]


def test_batch_socket_send_from_an_offset_copies_only_the_rest():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(5.0)
        sender.setblocking(False)
        port = receiver.getsockname()[1]
        datagrams = [(b"%d" % i, ("127.0.0.1", port)) for i in range(5)]
        io = batchio.BatchSocket(sender.fileno())
        assert io.send(datagrams, 3) == 2
        assert [receiver.recv(10) for _ in range(2)] == [b"3", b"4"]
        with pytest.raises(IndexError, match="start 6"):
            io.send(datagrams, 6)
        with pytest.raises(IndexError, match="start -1"):
            io.send(datagrams, -1)


# -- relay.frames, relay.server.inputs, relay.server.timing, relay.server.room ----------------------------

def test_decode_input_refuses_none():
    with pytest.raises(TypeError, match="data must be bytes"):
        frames.decode_input(None)


def test_put_varint_refuses_a_negative_value_and_what_is_not_a_bytearray():
    with pytest.raises(ValueError, match="unsigned"):
        frames.put_varint(bytearray(), -1)
    with pytest.raises(TypeError):
        frames.put_varint(None, 1)


def test_input_router_take_refuses_none():
    router = inputs.InputRouter()
    with pytest.raises(TypeError, match="payload must be bytes"):
        router.take(1, None, 0.0)


def test_input_router_refuses_to_seat_a_peer_in_no_room():
    with pytest.raises(TypeError):
        inputs.InputRouter().seat(1, None)


def test_accept_input_refuses_a_payload_of_none():
    with pytest.raises(TypeError, match="payload"):
        quiet_room().accept_input(1, 0, None, -1, 0.0)


def test_input_times_refuse_a_negative_frame_and_time_no_answer_to_it():
    # Its row is frame % window in C: a negative frame would write before the table.
    times = timing.InputTimes(2, 150)
    with pytest.raises(ValueError, match="frame must be >= 0"):
        times.close(-1, 0.0)
    times.close(0, 0.0)
    assert times.answer(0, -1, False, 1.0) == -1.0 and times.answer(0, 0, False, 1.0) == 1.0


def test_input_times_refuse_an_empty_window_and_a_slot_outside_the_room():
    with pytest.raises(ValueError, match="at least 1"):
        timing.InputTimes(8, 0)
    with pytest.raises(ValueError, match="at least 1"):
        timing.InputTimes(0, 150)
    times = timing.InputTimes(8, 150)
    for slot in (-1, 8):
        with pytest.raises(ValueError, match="slot"):
            times.review(slot, 0, 99.0)
        with pytest.raises(ValueError, match="slot"):
            times.clear_slot(slot)
        with pytest.raises(ValueError, match="slot"):
            times.answer(slot, 0, False, 0.0)


class QuietRoom(compiled_room.Room):
    """A room whose fan-out only records what it sends."""

    def _send_stream(self, peer_id, data):
        self.sent.append((peer_id, data))

    def _maybe_catch_up(self, member):
        pass

    def _advise_input_delay(self, member, now):
        pass


def quiet_room():
    room = QuietRoom("r", RelayConfig().rooms, 30, 0.0)
    room.sent = []
    return room


def player(peer_id=1, slot=0):
    return compiled_room.Member(peer_id, "p%d" % peer_id, slot, False)


def test_fan_out_refuses_a_zero_advice_interval():
    room = quiet_room()
    room.members = {1: player()}
    with pytest.raises(ValueError, match="advice_every must be at least 1"):
        room.fan_out(0, b"frame", 0.0, -1, 150, 0)
    room.fan_out(0, b"frame", 0.0, -1, 150, 1)
    assert room.sent == [(1, b"frame")]


def test_fan_out_reads_a_spectators_frame_with_item_access():
    room = quiet_room()
    room.history = [b"frame 0"]                 # a plain list: indexed out of range below
    room.members = {2: compiled_room.Member(2, "watcher", None, True, next_live=0)}
    with pytest.raises(IndexError):
        room.fan_out(9, b"frame 9", 0.0, 5, 150, 1)
    room.fan_out(9, b"frame 9", 0.0, 0, 150, 1)
    assert room.sent == [(2, b"frame 0")]


def test_fan_out_refuses_a_member_that_is_none():
    room = quiet_room()
    room.members = {1: None}
    with pytest.raises(TypeError, match="members"):
        room.fan_out(0, b"frame", 0.0, -1, 150, 1)


def test_making_up_inputs_refuses_a_slot_that_is_none():
    room = quiet_room()
    room.slots = [None]
    room.missing_input_policy = "repeat"
    with pytest.raises(TypeError, match="slots"):
        room.make_up_inputs()


def test_encode_frame_refuses_a_negative_frame_number_or_event_slot():
    with pytest.raises(ValueError, match="frame.number"):
        frames.encode_frame(protocol.Frame(-5, [b"a"]))
    with pytest.raises(ValueError, match="event slot"):
        frames.encode_frame(protocol.Frame(5, [b"a"], [["join", -1, "bob"]]))


class Meddler:
    """A previous input whose comparison empties the frame's input list."""

    def __init__(self, victim):
        self.victim = victim

    def __eq__(self, other):
        self.victim.clear()
        return False

    __hash__ = None


def test_encode_frame_survives_inputs_that_change_while_compared():
    inputs = [b"a" * 40, b"b" * 300, None, b"c"]
    expected = frames.encode_frame(protocol.Frame(7, list(inputs)))
    frame = protocol.Frame(7, inputs)
    previous = [Meddler(inputs), Meddler(inputs)]
    assert frames.encode_frame(frame, previous) == expected
    assert inputs == []                     # it did change, during the call
