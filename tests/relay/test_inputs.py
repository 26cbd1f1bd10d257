"""The server's compiled paths give exactly what the Python paths give.

relay.server.inputs hands canonical INPUTs to rooms (InputRouter, as the core's message sink and over
the event queue) where the lobby's general path would decode them (relay.protocol) and call
Room.on_input; Endpoint.send_many
queues one frame to many peers; Room.broadcast_frames leaves each frame for that (take_frame). Each is
checked against the general path it stands in for: the same inputs buffered, the same frames
delivered, the same counters, and malformed input still dropped and counted.
"""
from __future__ import annotations

import dataclasses

import msgpack
import pytest
from relay import protocol
from relay.config import RelayConfig
from relay.protocol import CONTROL, STREAM, Input
from relay.server.inputs import InputRouter
from relay.server.room import Room
from relay.server import RelayServer
from relay_core import (ChannelConfig, Endpoint, EndpointConfig, MessageReceived, MessageSink,
                        PeerDisconnected)
from relay_core.simlink import LinkedPair

def packed_input(frame, payload, have, **options) -> bytes:
    return msgpack.packb([protocol.INPUT, frame, payload, have], use_bin_type=True, **options)


# -- events to rooms ----------------------------------------------------------------------------

class QueueEndpoint:
    """The part of Endpoint the server's event handling uses, over a list of events."""

    def __init__(self, events):
        self.events = list(events)
        self.sent: list[tuple[int, int, bytes]] = []

    def next_event(self):
        return self.events.pop(0) if self.events else None

    def send(self, peer_id, channel, payload):
        self.sent.append((peer_id, channel, payload))
        return True

    def is_connected(self, peer_id):
        return True


def counter_lines(server: RelayServer) -> list[str]:
    text = server.metrics.render()[0].decode()
    return sorted(line for line in text.splitlines()
                  if line.startswith(("relay_inputs_total", "relay_inputs_refused_total",
                                      "relay_dropped_datagrams_total", "relay_joins_total")))


def traffic(players: int = 3):
    """Peers 1..players in running room r (capacity 4), peer 9 in no room, and a mix of inputs:
    on time, duplicate, late, too large, too far ahead, non-canonical, malformed, on the wrong
    channel, from a non-player, and a disconnect in the middle."""
    events = []
    for frame in range(3, 9):           # the room is at frame 3
        for peer in range(1, players + 1):
            events.append(MessageReceived(peer, STREAM, packed_input(frame, b"%d:%d" % (peer, frame), frame - 1)))
    events += [
        MessageReceived(1, STREAM, packed_input(3, b"again", 2)),                 # duplicate
        MessageReceived(2, STREAM, packed_input(0, b"late", 4)),                  # late, slot taken
        MessageReceived(3, STREAM, packed_input(7, b"x" * 5000, 5)),              # too large
        MessageReceived(1, STREAM, packed_input(10_000, b"far", 5)),              # too far ahead
        MessageReceived(2, STREAM, b"\x94\x05\x09\xc4\x02hi\xd0\xff"),            # have -1 as int8
        MessageReceived(3, STREAM, b"\x94\x05\x07\xc4"),                          # malformed
        MessageReceived(1, STREAM, b"\xc1garbage"),                               # not a client message
        MessageReceived(2, CONTROL, packed_input(8, b"ctl", 5)),                  # wrong channel
        MessageReceived(9, STREAM, packed_input(8, b"stranger", -1)),             # not a player
        PeerDisconnected(3, ("127.0.0.1", 3), "timeout"),
        MessageReceived(3, STREAM, packed_input(9, b"gone", 5)),                  # after leaving
        MessageReceived(1, STREAM, packed_input(9, b"on time", 7)),
        MessageReceived(2, STREAM, packed_input(2, b"late", 8)),                  # late, slot free
    ]
    return events


def run_server(monkeypatch, compiled: bool, through_sink: bool = False):
    """A server whose room r has had traffic(): through the lobby's general path (every event
    to Lobby._on_event, INPUTs decoded by relay.protocol), through InputRouter.route over the
    event queue (compiled), or (through_sink) as the core hands messages over: INPUTs to
    InputRouter.take while nothing is queued, the rest queued."""
    config = RelayConfig()
    config.rooms = dataclasses.replace(config.rooms, capacity=4, start_players=3)
    server = RelayServer(config)
    lobby = server.lobby
    room = lobby.create_room("r", {}, 0.0)
    for peer in (1, 2, 3):
        room.join(peer, f"p{peer}", False, 0.0)
        lobby.inputs.seat(peer, room)
    room.take_actions()
    room.take_events()
    for _ in range(3):
        room.tick(0.0)
    room.take_actions()
    room.take_frame()
    room.take_events()
    queued = []
    server.taken = 0
    for event in traffic():
        if (through_sink and not queued and isinstance(event, MessageReceived)
                and event.channel == lobby.inputs.channel
                and lobby.inputs.take(event.peer_id, event.payload, 0.05)):
            server.taken += 1
            continue
        queued.append(event)
    server.endpoint = lobby.endpoint = QueueEndpoint(queued)
    if not compiled:
        endpoint = lobby.endpoint
        monkeypatch.setattr(lobby, "handle_events", lambda now: [
            lobby._on_event(event, now) for event in iter(endpoint.next_event, None)])
    server.on_datagrams(0.05)
    return server, room


@pytest.mark.parametrize("through_sink", [False, True], ids=["route", "sink"])
def test_inputs_reach_the_room_and_the_metrics_as_through_the_general_path(monkeypatch, through_sink):
    fast_server, fast_room = run_server(monkeypatch, compiled=True, through_sink=through_sink)
    slow_server, slow_room = run_server(monkeypatch, compiled=False)
    if through_sink:        # 18 on time, a duplicate, 3 refusals; then a non-canonical one queues
        assert fast_server.taken == 22
        assert not fast_server.lobby.inputs.refusals          # reported by the next route()
    assert fast_room.buffered_inputs() == slow_room.buffered_inputs()
    assert fast_room.buffered_inputs()[3] == {0: b"1:3", 1: b"2:3", 2: b"3:3"}
    assert fast_room.buffered_inputs()[9] == {0: b"on time", 1: b"hi"}   # "hi" took the slow path
    assert [(m.peer_id, m.have) for m in fast_room.members.values()] == \
           [(m.peer_id, m.have) for m in slow_room.members.values()]
    assert fast_server.endpoint.sent == slow_server.endpoint.sent    # the same notices
    assert counter_lines(fast_server) == counter_lines(slow_server)
    lines = counter_lines(fast_server)
    assert 'relay_inputs_total{outcome="duplicate"} 1.0' in lines
    assert 'relay_inputs_total{outcome="late"} 0.0' in lines           # open frame 3 is full
    assert 'relay_inputs_refused_total{reason="late_dropped"} 2.0' in lines
    assert 'relay_inputs_refused_total{reason="too_large"} 1.0' in lines
    assert 'relay_inputs_refused_total{reason="too_far_ahead"} 1.0' in lines
    assert 'relay_inputs_refused_total{reason="not_a_player"} 2.0' in lines
    assert 'relay_dropped_datagrams_total{reason="malformed_message"} 2.0' in lines
    assert 'relay_dropped_datagrams_total{reason="wrong_channel"} 1.0' in lines


# -- one frame to many peers ---------------------------------------------------------------------

class BindingEndpoint:
    """The part of Endpoint the router binds peers with."""

    def __init__(self):
        self.bound: dict[int, object] = {}
        self.groups: dict[int, int] = {}

    def bind_sink(self, peer_id, context, group=-1):
        self.bound[peer_id] = context
        self.groups[peer_id] = group
        return True


def seated_room() -> tuple[InputRouter, BindingEndpoint, Room]:
    config = RelayConfig()
    config.rooms = dataclasses.replace(config.rooms, capacity=4, start_players=2)
    room = Room("r", config.rooms, 30, 0.0)
    room.group = 5
    endpoint = BindingEndpoint()
    router = InputRouter(endpoint)
    for peer in (1, 2):
        router.seat(peer, room, room.join(peer, f"p{peer}", False, 0.0))
    router.seat(3, room, room.join(3, "watcher", True, 0.0))
    room.take_actions()
    return router, endpoint, room


def test_a_players_peer_is_bound_to_its_member_while_seated():
    router, endpoint, room = seated_room()
    assert endpoint.bound == {1: room.members[1], 2: room.members[2], 3: None}   # 3: a spectator
    # A player's DATA is held for its room's turn in the tick; a spectator's is taken at once.
    assert endpoint.groups == {1: 5, 2: 5, 3: -1}
    router.unseat(2)
    router.unseat(7)                            # in no room: nothing to unbind
    assert endpoint.bound[2] is None and 7 not in endpoint.bound
    assert endpoint.groups[2] == -1


def test_outcomes_count_every_input_across_runs_reads_and_clears():
    router, endpoint, room = seated_room()
    member = room.members[1]
    shared = {}
    router.outcomes = shared
    for frame in range(3):                       # a run of "accepted"
        assert router.take_bound(1, member, packed_input(frame, b"a", frame - 1), 0.1)
    assert router.take_bound(1, member, packed_input(2, b"again", 1), 0.1)      # "duplicate"
    assert router.take_bound(1, member, packed_input(3, b"b", 2), 0.1)          # "accepted" again
    assert router.outcomes is shared and shared == {"accepted": 4, "duplicate": 1}
    shared.clear()                               # as the server does once a tick
    assert router.take_bound(1, member, packed_input(4, b"c", 3), 0.1)
    assert router.outcomes == {"accepted": 1}
    replacement = {}
    assert router.take_bound(1, member, packed_input(5, b"d", 4), 0.1)
    router.outcomes = replacement                # what was counted stays with the old dict
    assert shared == {"accepted": 2} and router.outcomes == {}


def test_a_bound_input_is_buffered_as_a_looked_up_one_and_a_left_member_takes_the_general_path():
    router, endpoint, room = seated_room()
    member = room.members[1]
    assert router.take_bound(1, member, packed_input(0, b"bound", -1), 0.1)
    assert router.take(2, packed_input(0, b"looked up", -1), 0.1)
    assert router.take_bound(1, member, packed_input(0, b"again", -1), 0.1)
    assert room.buffered_inputs() == {0: {0: b"bound", 1: b"looked up"}}
    assert router.outcomes == {"accepted": 2, "duplicate": 1}
    room.detach(1, "left", 0.2)                 # still seated: the room refuses it, as take() would
    assert router.take_bound(1, member, packed_input(1, b"gone", 0), 0.2)
    assert router.refusals == [(1, "not_a_player")]
    router.unseat(1)                            # in no room: for the general path
    assert not router.take_bound(1, member, packed_input(1, b"gone", 0), 0.2)
    assert not router.take_bound(2, room.members[2], b"\xc1garbage", 0.2)
    assert room.buffered_inputs() == {0: {0: b"bound", 1: b"looked up"}}   # the leave frame's


def bound_input_function():
    """relay.server.room.accept_bound_input as callers reach it: compiled, the C function behind
    the module's capsule (what InputRouter calls); uncompiled (tools/mutation.py), the plain one."""
    import ctypes

    from relay.server import room as room_module

    capsule = getattr(room_module, "__pyx_capi__", {}).get("accept_bound_input")
    if capsule is None:
        return room_module.accept_bound_input
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))
    signature = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.c_longlong,
                                  ctypes.py_object, ctypes.c_longlong, ctypes.c_double)
    return signature(address)


def test_a_bound_input_reaches_its_members_room_and_none_once_the_member_has_left():
    _, _, room = seated_room()
    accept_bound_input = bound_input_function()
    member = room.members[1]
    assert accept_bound_input(member, 0, b"bound", -1, 0.1) == "accepted"
    assert accept_bound_input(member, 0, b"again", -1, 0.1) == "duplicate"
    room.detach(1, "left", 0.2)
    assert member.room is None
    assert accept_bound_input(member, 1, b"gone", 0, 0.2) is None     # for the general path
    assert room.buffered_inputs() == {0: {0: b"bound"}}


def test_the_core_hands_a_bound_peers_messages_to_take_bound_with_its_context():
    pair = connected_pair()
    calls = []

    class Sink(MessageSink):
        def take(self, peer_id, payload, now):
            calls.append(("take", payload))
            return True

        def take_bound(self, peer_id, context, payload, now):
            calls.append((context, payload))
            return True

    pair.server.set_message_sink(Sink(STREAM))
    assert not pair.server.bind_sink(12345, "nobody")
    assert pair.server.bind_sink(pair.server_peer, "member")
    pair.client.send(pair.client_peer, STREAM, b"one")
    pair.run(0.2)
    assert pair.server.bind_sink(pair.server_peer, None)
    pair.client.send(pair.client_peer, STREAM, b"two")
    pair.run(0.2)
    assert calls == [("member", b"one"), ("take", b"two")]


def frames_by_peer(room: Room) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for action in room.take_actions():
        if action.kind == "broadcast":
            for peer_id in action.peer_ids:
                out.setdefault(peer_id, []).append(action.data)
        elif action.kind == "send" and action.channel == STREAM:
            out.setdefault(action.peer_id, []).append(action.data)
    frame, recipients = room.take_frame()
    for peer_id in recipients:
        out.setdefault(peer_id, []).append(frame)
    return out


def play(broadcast: bool, collect_every: int = 1) -> dict[int, list[bytes]]:
    config = RelayConfig()
    settings_ = dataclasses.replace(config.rooms, capacity=4, start_players=2, spectator_delay=2)
    room = Room("r", settings_, 30, 0.0)
    room.broadcast_frames = broadcast
    received: dict[int, list[bytes]] = {}

    def collect():
        for peer, frames in frames_by_peer(room).items():
            received.setdefault(peer, []).extend(frames)

    room.join(1, "a", False, 0.0)
    room.join(2, "b", False, 0.0)
    room.join(5, "watcher", True, 0.0)
    for number in range(12):
        room.on_input(1, Input(number, b"a%d" % number, number - 1), 0.0)
        if number % 3:
            room.on_input(2, Input(number, b"b", number - 1), 0.0)
        if number == 5:
            room.join(3, "c", False, 0.0)           # a late joiner
        if number == 8:
            room.detach(2, "leave", 0.0)
        room.tick(number / 30)
        if number % collect_every == collect_every - 1:
            collect()
    return received


def test_a_broadcast_frame_reaches_the_same_peers_with_the_same_bytes():
    assert play(broadcast=True) == play(broadcast=False)
    frames = play(broadcast=True)
    assert len(frames[1]) == 12 and len(frames[5]) == 10      # the spectator is 2 frames behind


def test_a_frame_not_taken_before_the_next_tick_still_goes_out_in_order():
    # The previous frame becomes a "broadcast" Action, ahead of the new one.
    assert play(broadcast=True, collect_every=3) == play(broadcast=False)


def connected_pair(max_pending: int = 16384) -> LinkedPair:
    channels = (ChannelConfig("reliable_ordered", window=16),
                ChannelConfig("redundant", window=8, max_pending=max_pending))
    pair = LinkedPair(EndpointConfig(accept_connections=True, seed=1, channels=channels),
                      EndpointConfig(seed=2, channels=channels))
    pair.connect()
    return pair


def test_send_many_queues_what_send_would_and_names_the_full_queues():
    fast, slow = connected_pair(max_pending=3), connected_pair(max_pending=3)
    refused = []
    for number in range(14):
        data = b"frame %d" % number
        refused.append(fast.server.send_many([fast.server_peer, 999], STREAM, data))
        assert slow.server.send(slow.server_peer, STREAM, data) == (not refused[-1])
    # 8 enter the window, 3 wait behind it; the rest are refused (the connected peer's id; the
    # unknown peer 999 is skipped, as send() would refuse it silently).
    assert refused == [[]] * 11 + [[fast.server_peer]] * 3
    assert (fast.server.channel_snapshot(fast.server_peer, STREAM)
            == slow.server.channel_snapshot(slow.server_peer, STREAM))
    for pair in (fast, slow):
        pair.run(1.0)
    delivered = [[e.payload for e in pair.client_events if isinstance(e, MessageReceived)]
                 for pair in (fast, slow)]
    assert delivered[0] == delivered[1] == [b"frame %d" % n for n in range(11)]


def test_send_many_refuses_what_send_refuses():
    pair = connected_pair()
    with pytest.raises(ValueError):
        pair.server.send_many([pair.server_peer], 7, b"x")
    with pytest.raises(ValueError):
        pair.server.send_many([pair.server_peer], CONTROL, b"x" * (pair.server.config.max_message_size + 1))
    pair.server.disconnect(pair.server_peer)
    assert pair.server.send_many([pair.server_peer], STREAM, b"x") == []      # gone: skipped


def test_traffic_totals_keep_the_traffic_of_closed_peers():
    pair = connected_pair()
    for number in range(5):
        pair.server.send(pair.server_peer, STREAM, b"frame %d" % number)
    pair.run(0.5)
    totals = pair.server.traffic_totals()
    stats = pair.server.peer_stats(pair.server_peer)
    assert totals == {"resends": stats.resends, "spurious_resends": stats.spurious_resends,
                      "redundant_bytes": stats.redundant_bytes}
    rtts, loss = pair.server.link_samples()
    assert rtts == [stats.rtt] and loss == stats.loss
    counts = pair.server.redundancy_counts()
    assert set(counts) == {"clean", "lossy", "bursty", "congested", "always"}
    assert counts[stats.redundancy_mode] == 1 and sum(counts.values()) == 1
    pair.server.disconnect(pair.server_peer)
    assert pair.server.traffic_totals() == totals
    assert pair.server.link_samples() == ([], 0.0)
    assert set(pair.server.redundancy_counts().values()) == {0}


# -- flushing only when output is due ------------------------------------------------------------

def test_output_due_says_when_a_flush_has_something_to_send_now():
    pair = connected_pair()
    server, client = pair.server, pair.client
    pair.run(0.2)
    server.datagrams_to_send(pair.now)
    assert not server.output_due
    # A client datagram that only acks and carries an input: its ack can wait for the next
    # frame (ack_delay), so nothing is due now.
    client.send(pair.client_peer, STREAM, b"input")
    [(datagram, _)] = client.datagrams_to_send(pair.now)
    server.receive(datagram, pair.CLIENT_ADDRESS, pair.now)
    assert [e.payload for e in iter(server.next_event, None)] == [b"input"]
    assert not server.output_due
    # ... until its ack is due: then the same kind of datagram makes output due at once.
    later = pair.now + server.config.ack_delay + 0.001
    client.send(pair.client_peer, STREAM, b"input 2")
    [(datagram, _)] = client.datagrams_to_send(later)
    server.receive(datagram, pair.CLIENT_ADDRESS, later)
    assert server.output_due
    assert server.datagrams_to_send(later)          # the ack goes out
    assert not server.output_due
    # Anything queued to send is due.
    server.send(pair.server_peer, STREAM, b"frame")
    assert server.output_due
    server.datagrams_to_send(later)
    server.send_many([pair.server_peer], STREAM, b"frame 2")
    assert server.output_due
    server.datagrams_to_send(later)
    # A handshake from a new client is answered at once.
    other = Endpoint(EndpointConfig(seed=9, channels=server.config.channels))
    other.connect(pair.SERVER_ADDRESS, later)
    [(request, _)] = other.datagrams_to_send(later)
    server.receive(request, ("10.0.0.3", 5000), later)
    assert server.output_due
