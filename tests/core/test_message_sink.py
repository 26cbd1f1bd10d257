"""Endpoint.set_message_sink: one channel's messages handed over as the core delivers them.

The relay server installs one for player inputs (relay.server.inputs.InputRouter). What it relies
on: the sink sees exactly the messages an event consumer would, once each and in order; never
a message ahead of an earlier event; and whatever the sink declines, or fails on, still arrives
as a MessageReceived event.
"""
from __future__ import annotations

import pytest

from relay_core import ChannelConfig, EndpointConfig, MessageReceived, MessageSink
from relay_core.simlink import LinkedPair, LinkProfile

CONTROL, STREAM = 0, 1
CHANNELS = (ChannelConfig("reliable_ordered", window=64), ChannelConfig("redundant", window=64))


class Recorder(MessageSink):
    """Takes (or declines, or fails on) every message of its channel, and remembers them."""

    def __init__(self, channel: int, answer: object = True):
        super().__init__(channel)
        self.answer = answer
        self.taken: list[tuple[int, bytes]] = []

    def take(self, peer_id, payload, now):
        self.taken.append((peer_id, payload))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def pair(up: LinkProfile | None = None, down: LinkProfile | None = None, seed: int = 3) -> LinkedPair:
    linked = LinkedPair(EndpointConfig(accept_connections=True, seed=seed, channels=CHANNELS),
                        EndpointConfig(seed=seed + 1, channels=CHANNELS), up, down, seed=seed)
    linked.connect()
    return linked


def messages(events, channel: int) -> list[bytes]:
    return [e.payload for e in events if isinstance(e, MessageReceived) and e.channel == channel]


def test_the_sink_takes_its_channels_messages_instead_of_events():
    linked = pair()
    sink = Recorder(STREAM)
    linked.server.set_message_sink(sink)
    for index in range(20):
        linked.client.send(linked.client_peer, STREAM, b"input %d" % index)
        linked.run(0.01)
        linked.client.send(linked.client_peer, CONTROL, b"control %d" % index)
        linked.run(0.01)
    assert sink.taken == [(linked.server_peer, b"input %d" % i) for i in range(20)]
    assert messages(linked.server_events, STREAM) == []
    assert messages(linked.server_events, CONTROL) == [b"control %d" % i for i in range(20)]


def test_a_message_behind_a_queued_event_stays_an_event_in_its_place():
    linked = pair()
    sink = Recorder(STREAM)
    linked.server.set_message_sink(sink)
    # One datagram: the CONTROL message is queued as an event first, so the STREAM messages
    # behind it must not overtake it through the sink.
    linked.client.send(linked.client_peer, CONTROL, b"join")
    linked.client.send(linked.client_peer, STREAM, b"first")
    linked.client.send(linked.client_peer, STREAM, b"second")
    linked.run(0.05)
    received = [(e.channel, e.payload) for e in linked.server_events if isinstance(e, MessageReceived)]
    assert received == [(CONTROL, b"join"), (STREAM, b"first"), (STREAM, b"second")]
    assert sink.taken == []
    linked.client.send(linked.client_peer, STREAM, b"third")      # nothing queued now
    linked.run(0.05)
    assert sink.taken == [(linked.server_peer, b"third")]


@pytest.mark.parametrize("answer", [False, RuntimeError("sink bug")])
def test_what_the_sink_declines_or_fails_on_arrives_as_events(answer):
    linked = pair()
    sink = Recorder(STREAM, answer)
    linked.server.set_message_sink(sink)
    for index in range(5):
        linked.client.send(linked.client_peer, STREAM, b"input %d" % index)
        linked.run(0.01)
    assert [payload for _, payload in sink.taken] == [b"input %d" % i for i in range(5)]
    assert messages(linked.server_events, STREAM) == [b"input %d" % i for i in range(5)]


def test_over_a_lossy_link_the_sink_gets_every_message_once_and_in_order():
    linked = pair(LinkProfile(loss=0.2, delay=0.02, jitter=0.02, duplicate=0.05),
                  LinkProfile(loss=0.2, delay=0.02, jitter=0.02), seed=11)
    sink = Recorder(STREAM)
    linked.server.set_message_sink(sink)
    sent = [b"input %d" % i for i in range(300)]
    for payload in sent:
        linked.client.send(linked.client_peer, STREAM, payload)
        linked.run(1 / 30)
    linked.run(2.0)
    assert [payload for _, payload in sink.taken] == sent
    assert messages(linked.server_events, STREAM) == []


def test_set_message_sink_checks_its_argument_and_none_removes_it():
    linked = pair()
    with pytest.raises(TypeError, match="MessageSink"):
        linked.server.set_message_sink(object())
    with pytest.raises(ValueError, match="channel 2"):
        linked.server.set_message_sink(Recorder(2))
    sink = Recorder(STREAM)
    linked.server.set_message_sink(sink)
    linked.server.set_message_sink(None)
    linked.client.send(linked.client_peer, STREAM, b"after")
    linked.run(0.05)
    assert sink.taken == []
    assert messages(linked.server_events, STREAM) == [b"after"]


def test_peers_that_connect_later_use_the_sink_too():
    linked = LinkedPair(EndpointConfig(accept_connections=True, seed=5, channels=CHANNELS),
                        EndpointConfig(seed=6, channels=CHANNELS))
    sink = Recorder(STREAM)
    linked.server.set_message_sink(sink)        # before anyone connects
    linked.connect()
    linked.client.send(linked.client_peer, STREAM, b"hello")
    linked.run(0.05)
    assert sink.taken == [(linked.server_peer, b"hello")]


def test_a_closed_peer_lets_go_of_its_bound_context_at_once():
    """Whatever may still hold a closed peer object a while (the endpoint's closing list until
    its DISCONNECTs are flushed), what the sink bound to it (a server's room member, and through
    it the room) is not kept with it."""
    import gc
    import weakref

    class Context:
        pass

    pair = LinkedPair(EndpointConfig(accept_connections=True, seed=1, channels=CHANNELS),
                      EndpointConfig(seed=2, channels=CHANNELS))
    pair.connect()
    pair.server.set_message_sink(Recorder(STREAM))
    context = Context()
    held = weakref.ref(context)
    assert pair.server.bind_sink(pair.server_peer, context)
    del context
    gc.collect()
    assert held() is not None
    assert pair.server.disconnect(pair.server_peer)
    gc.collect()
    assert held() is None
    assert not pair.server.bind_sink(pair.server_peer, Context())     # no such peer any more
