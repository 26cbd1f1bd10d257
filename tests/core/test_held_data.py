"""Endpoint.bind_sink's group: a grouped peer's DATA is held until its group is run.

The relay server groups a room's players so that each player's datagram is handled, its room's
frame queued and the player flushed one right after the other in the room's turn of the tick
(relay.server.room.close_frames). What that relies on: nothing of a held datagram is seen before
its group runs; it is then taken exactly as it would have been on arrival (in order, at its
arrival time); and whatever flushes the endpoint, runs its timers or ends a connection takes
everything held first, so no call observes a peer behind its own datagrams.
"""
from __future__ import annotations

import pytest

from relay_core import ChannelConfig, EndpointConfig, MessageReceived, MessageSink
from relay_core.simlink import LinkedPair

CONTROL, STREAM = 0, 1
CHANNELS = (ChannelConfig("reliable_ordered", window=64), ChannelConfig("redundant", window=64))
GROUP = 3


class Recorder(MessageSink):
    def __init__(self):
        super().__init__(STREAM)
        self.taken: list[bytes] = []

    def take(self, peer_id, payload, now):
        self.taken.append(payload)
        return True


def grouped(seed: int = 3, group: int = GROUP) -> tuple[LinkedPair, Recorder]:
    linked = LinkedPair(EndpointConfig(accept_connections=True, seed=seed, channels=CHANNELS),
                        EndpointConfig(seed=seed + 1, channels=CHANNELS), seed=seed)
    linked.connect()
    sink = Recorder()
    linked.server.set_message_sink(sink)
    assert linked.server.bind_sink(linked.server_peer, None, group)
    return linked, sink


def client_sends(linked: LinkedPair, channel: int, payload: bytes) -> list[bytes]:
    """What the client sends for one message now, as datagrams for the server."""
    linked.client.send(linked.client_peer, channel, payload)
    return [data for data, _ in linked.client.datagrams_to_send(linked.now)]


def deliver(linked: LinkedPair, datagrams: list[bytes], at: float) -> None:
    for data in datagrams:
        linked.server.receive(data, linked.client_address, at)


def events(linked: LinkedPair) -> list:
    found = []
    while (event := linked.server.next_event()) is not None:
        found.append(event)
    return found


def test_nothing_of_a_held_datagram_is_seen_until_its_group_runs():
    linked, sink = grouped()
    deliver(linked, client_sends(linked, STREAM, b"input"), linked.now)
    deliver(linked, client_sends(linked, CONTROL, b"ready"), linked.now)
    before = linked.server.peer_stats(linked.server_peer).packets_received
    assert sink.taken == [] and events(linked) == []
    assert not linked.server.run_group(GROUP + 1)       # another group: nothing held there
    assert not linked.server.run_group(10_000)          # one never used
    assert sink.taken == []
    assert linked.server.run_group(GROUP)                # True: an event is waiting
    assert sink.taken == [b"input"]
    assert [e.payload for e in events(linked) if isinstance(e, MessageReceived)] == [b"ready"]
    assert linked.server.peer_stats(linked.server_peer).packets_received == before + 2
    assert not linked.server.run_group(GROUP)            # taken once


def test_held_datagrams_are_taken_in_order_and_as_of_their_arrival():
    """The RTT sample of an ack held for half a second is the one taken on arrival."""
    results = []
    for hold in (False, True):
        linked, sink = grouped(seed=11, group=GROUP if hold else -1)
        linked.server.send(linked.server_peer, STREAM, b"frame")
        for data, _ in linked.server.datagrams_to_send(linked.now):
            linked.client.receive(data, linked.SERVER_ADDRESS, linked.now + 0.02)
        linked.now += 0.03
        datagrams = client_sends(linked, STREAM, b"first") + client_sends(linked, STREAM, b"second")
        arrival = linked.now + 0.02
        deliver(linked, datagrams, arrival)
        if hold:
            assert sink.taken == []
            linked.server.run_group(GROUP)
        results.append((sink.taken, linked.server.peer_stats(linked.server_peer).rtt))
    assert results[0] == results[1]
    assert results[1][0] == [b"first", b"second"]


@pytest.mark.parametrize("call", ["datagrams_to_send", "handle_timeout", "disconnect", "ungroup"])
def test_whatever_flushes_runs_timers_or_ends_a_connection_takes_what_is_held_first(call):
    linked, sink = grouped()
    deliver(linked, client_sends(linked, STREAM, b"input"), linked.now)
    assert sink.taken == []
    server = linked.server
    if call == "datagrams_to_send":
        server.datagrams_to_send(linked.now)
    elif call == "handle_timeout":
        server.handle_timeout(linked.now)
    elif call == "disconnect":
        assert server.disconnect(linked.server_peer)
    else:
        assert server.bind_sink(linked.server_peer, None)       # back to no group
    assert sink.taken == [b"input"]


def test_a_datagram_from_another_address_takes_what_is_held_first():
    """Address migration: the datagrams from the old address come first."""
    linked, sink = grouped()
    deliver(linked, client_sends(linked, STREAM, b"old address"), linked.now)
    moved = client_sends(linked, STREAM, b"new address")
    linked.rebind_client(("10.9.9.9", 4000))
    deliver(linked, moved, linked.now)
    assert sink.taken[:1] == [b"old address"]


def test_what_is_held_is_bounded_a_flood_is_taken_as_it_comes():
    """Past MAX_HELD_BYTES (4 MiB) everything held is taken at once: a flood of copies of one
    datagram from a player's address costs no more memory than a few MiB."""
    linked, sink = grouped()
    datagrams = client_sends(linked, STREAM, bytes(1000))
    assert len(datagrams) == 1
    copies = (4 << 20) // len(datagrams[0]) + 64
    deliver(linked, datagrams * copies, linked.now)
    assert sink.taken == [bytes(1000)]          # taken once: the copies are duplicates
    stats = linked.server.peer_stats(linked.server_peer)
    assert stats.packets_received == 1


def test_send_many_with_now_flushes_each_peer_at_once_and_the_flush_does_not_visit_it_again():
    linked, _ = grouped()
    server, peer = linked.server, linked.server_peer
    server.datagrams_to_send(linked.now)
    before = server.peer_stats(peer).packets_sent
    assert server.send_many([peer], STREAM, b"frame", linked.now) == []
    assert server.peer_stats(peer).packets_sent == before + 1      # written already
    sent = server.datagrams_to_send(linked.now)
    assert len(sent) == 1 and sent[0][1] == linked.client_address
    assert server.peer_stats(peer).packets_sent == before + 1      # and only once
    for data, _ in sent:
        linked.client.receive(data, linked.SERVER_ADDRESS, linked.now)
    got = []
    while (event := linked.client.next_event()) is not None:
        got.append(event)
    assert [e.payload for e in got if isinstance(e, MessageReceived)] == [b"frame"]


def test_bind_sink_refuses_a_negative_group_other_than_none():
    linked, _ = grouped()
    with pytest.raises(ValueError, match="group must be -1"):
        linked.server.bind_sink(linked.server_peer, None, -2)
