"""The peer state machine: relay_core.peer.TRANSITIONS is the whole of it (docs/PROTOCOL.md,
section 9). Each entry is reached through the public API here, and every other (state, trigger)
pair is refused, by the table and on the wire."""
from collections import deque

import pytest

from relay_core import Endpoint, EndpointConfig, PeerConnected, PeerDisconnected, decode_packet, encode_packet
from relay_core.fragment import MemoryBudget
from relay_core.peer import STATE_NAMES, TRANSITIONS, TRIGGER_NAMES, Peer, PeerStateError

SERVER = ("10.0.0.1", 7777)
CLIENT = ("10.0.0.2", 5000)
STATE = {name: value for value, name in enumerate(STATE_NAMES)}
TRIGGER = {name: value for value, name in enumerate(TRIGGER_NAMES)}

DOCUMENTED = {
    ("connecting", "challenge"): "challenged",
    ("challenged", "accept"): "connected",
    ("connecting", "admit"): "connected",
    ("connected", "disconnect"): "disconnecting",
    ("disconnecting", "disconnect_sent"): "closed",
    ("connecting", "close"): "closed",
    ("challenged", "close"): "closed",
    ("connected", "close"): "closed",
}
# Legal triggers from the start that lead a bare peer into each state.
PATH_TO = {
    "connecting": [],
    "challenged": ["challenge"],
    "connected": ["challenge", "accept"],
    "disconnecting": ["challenge", "accept", "disconnect"],
    "closed": ["close"],
}


class Link:
    """A client and a server endpoint; datagrams move only when a test says so."""

    def __init__(self, **server_config):
        self.now = 0.0
        self.server = Endpoint(EndpointConfig(accept_connections=True, seed=1, **server_config))
        self.client = Endpoint(EndpointConfig(seed=2))
        self.peer = self.client.connect(SERVER, self.now)
        self.connect_id = None

    def up(self):
        """The client's datagrams, delivered to the server; their types."""
        sent = [decode_packet(data) for data, _ in self.client.datagrams_to_send(self.now)]
        for packet in sent:
            self.server.receive(encode_packet(packet), CLIENT, self.now)
            self.connect_id = packet.get("connect_id", self.connect_id)
        return [packet["type"] for packet in sent]

    def down(self):
        sent = self.server.datagrams_to_send(self.now)
        for data, _ in sent:
            self.client.receive(data, SERVER, self.now)
        return [decode_packet(data)["type"] for data, _ in sent]

    def to_client(self, packet):
        self.client.receive(encode_packet(packet), SERVER, self.now)

    def challenged(self):
        assert self.up() == ["connect_request"] and self.down() == ["challenge"]
        return self

    def connected(self):
        self.challenged()
        assert self.up() == ["connect_response"] and self.down() == ["accept"]
        return self

    def events(self, endpoint):
        return list(iter(endpoint.next_event, None))


def names(table):
    return {(STATE_NAMES[state], TRIGGER_NAMES[trigger]): STATE_NAMES[new] for (state, trigger), new in
            table.items()}


def bare_peer():
    return Peer(1, SERVER, EndpointConfig().validate(), deque(), 0.0, 5, MemoryBudget(1 << 20))


def peer_in(state):
    peer = bare_peer()
    for trigger in PATH_TO[state]:
        peer._transition(TRIGGER[trigger])
    assert STATE_NAMES[peer.state] == state
    return peer


def test_the_table_is_the_documented_state_machine():
    assert names(TRANSITIONS) == DOCUMENTED


def test_the_table_is_read_only():
    with pytest.raises(TypeError):
        TRANSITIONS[(STATE["closed"], TRIGGER["accept"])] = STATE["connected"]


@pytest.mark.parametrize("state, trigger", sorted(DOCUMENTED))
def test_a_peer_follows_each_entry_of_the_table(state, trigger):
    peer = peer_in(state)
    assert peer.allows(TRIGGER[trigger])
    peer._transition(TRIGGER[trigger])
    assert STATE_NAMES[peer.state] == DOCUMENTED[state, trigger]


@pytest.mark.parametrize("state, trigger", sorted(
    (state, trigger) for state in STATE_NAMES for trigger in TRIGGER_NAMES if (state, trigger) not in DOCUMENTED))
def test_a_peer_refuses_every_other_trigger(state, trigger):
    peer = peer_in(state)
    assert not peer.allows(TRIGGER[trigger])
    with pytest.raises(PeerStateError, match=f"{trigger} is not allowed when {state}"):
        peer._transition(TRIGGER[trigger])
    assert STATE_NAMES[peer.state] == state


def test_an_unknown_trigger_is_refused():
    peer = bare_peer()
    assert not peer.allows(99)
    with pytest.raises(PeerStateError, match="trigger 99 is not allowed when connecting"):
        peer._transition(99)


# -- each entry through the public API ----------------------------------------------------------

def test_connecting_to_challenged_on_a_challenge():
    link = Link()
    assert link.client.peer_state(link.peer) == "connecting"
    link.challenged()
    assert link.client.peer_state(link.peer) == "challenged"
    assert link.up() == ["connect_response"]          # it now answers with the cookie


def test_challenged_to_connected_on_accept():
    link = Link().connected()
    assert link.client.peer_state(link.peer) == "connected"
    assert [type(e) for e in link.events(link.client)] == [PeerConnected]


def test_a_server_peer_is_admitted_connected_by_a_valid_connect_response():
    link = Link().connected()
    [server_peer] = link.server.peer_ids
    assert link.server.peer_state(server_peer) == "connected"
    assert [type(e) for e in link.events(link.server)] == [PeerConnected]


def test_connected_to_disconnecting_to_closed_with_three_disconnects():
    link = Link().connected()
    assert link.client.disconnect(link.peer, "closed")
    with pytest.raises(KeyError):
        link.client.peer_state(link.peer)             # disconnecting: out of the tables already
    assert link.up() == ["disconnect"] * 3
    assert link.up() == [] and link.client.next_timeout() is None      # closed
    assert link.events(link.server)[-1].reason == "remote:closed"


def test_connecting_to_closed_sends_nothing():
    link = Link()
    assert link.client.disconnect(link.peer, "closed")
    assert link.up() == [] and link.client.peer_count == 0
    assert [e.reason for e in link.events(link.client)] == ["local:closed"]


def test_connecting_to_closed_on_connect_timeout():
    link = Link()
    link.now = 10.0
    link.client.handle_timeout(link.now)
    assert link.up() == [] and link.client.peer_count == 0
    assert [e.reason for e in link.events(link.client)] == ["connect_timeout"]


def test_challenged_to_closed_on_refuse():
    link = Link().challenged()
    link.to_client(dict(type="refuse", connect_id=link.connect_id, reason="server_full"))
    assert link.client.peer_count == 0 and link.up() == []
    assert [e.reason for e in link.events(link.client)] == ["refused:server_full"]


def test_connected_to_closed_on_a_disconnect_received():
    link = Link().connected()
    [server_peer] = link.server.peer_ids
    link.server.disconnect(server_peer, "kicked")
    assert link.down() == ["disconnect"] * 3
    assert link.client.peer_count == 0
    assert link.up() == []                            # no DISCONNECT back
    assert [e.reason for e in link.events(link.client) if isinstance(e, PeerDisconnected)] == ["remote:kicked"]


# -- illegal triggers from the wire are dropped, the state unchanged ---------------------------

def test_an_accept_before_the_challenge_is_unexpected():
    link = Link()
    assert link.up() == ["connect_request"]
    link.to_client(dict(type="accept", connect_id=link.connect_id, session_id=9, ack_delay_ms=5))
    assert link.client.peer_state(link.peer) == "connecting"
    assert link.client.drops == {"unexpected_packet": 1}


def test_a_second_challenge_is_unexpected():
    link = Link().challenged()
    link.to_client(dict(type="challenge", connect_id=link.connect_id, cookie_time=1, cookie_mac="00" * 16))
    assert link.client.peer_state(link.peer) == "challenged"
    assert link.client.drops == {"unexpected_packet": 1}


def test_a_refuse_or_accept_after_connecting_changes_nothing():
    link = Link().connected()
    link.to_client(dict(type="refuse", connect_id=link.connect_id, reason="server_full"))
    assert link.client.peer_state(link.peer) == "connected"
    assert link.client.drops == {"unexpected_packet": 1}
    link.to_client(dict(type="accept", connect_id=link.connect_id, session_id=9, ack_delay_ms=5))
    assert link.client.peer_state(link.peer) == "connected"
    assert link.client.drops == {"unexpected_packet": 1, "duplicate_packet": 1}


def test_a_sealed_size_disconnect_in_an_open_connection_is_bad_length():
    link = Link().connected()
    [server_peer] = link.server.peer_ids
    link.server.send(server_peer, 0, b"x")
    session_id = decode_packet(link.server.datagrams_to_send(link.now)[0][0])["session_id"]
    link.to_client(dict(type="disconnect", session_id=session_id, seq=1, sealed_reason="00" * 17))
    assert link.client.peer_state(link.peer) == "connected"
    assert link.client.drops == {"bad_length": 1}
