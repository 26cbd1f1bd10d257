"""Open mode: connected peers per source (``max_sessions_per_source``, issue #17 L1). One source
(an IPv4 address, an IPv6 /64) cannot hold every peer slot with bare handshakes; token mode is
not limited (a carrier-grade NAT puts many players behind one address)."""
from __future__ import annotations

import pytest

from relay_core import ConfigError, Endpoint, EndpointConfig, PeerDisconnected
from relay_core.events import PeerMigrated
from relay_core.simlink import LinkedPair
from relay_core.sources import source_key
from relay_core.token import mint_token
from relay_core.wire import REASON_CODES, decode_packet, encode_packet

UNIX = 1_900_000_000.0
KEY = bytes(range(32))


def server_endpoint(**config):
    return Endpoint(EndpointConfig(accept_connections=True, seed=1, **config), unix_offset=UNIX)


def handshake(server, address, connect_id, now=0.0, token=None):
    """A bare handshake from ``address`` (a client that never sends anything after it):
    the server's final reply, decoded."""
    request = dict(type="connect_request", connect_id=connect_id)
    server.receive(encode_packet(request), address, now)
    [challenge] = [data for data, to in server.datagrams_to_send(now) if to == address]
    response = dict(decode_packet(challenge), type="connect_response", ack_delay_ms=5)
    server.receive(encode_packet(response), address, now)
    [reply] = [data for data, to in server.datagrams_to_send(now) if to == address]
    return decode_packet(reply)


def test_source_keys():
    assert source_key(("192.0.2.1", 5)) == source_key(("192.0.2.1", 6)) == "192.0.2.1"
    assert source_key(("2001:db8:1:2::1", 5, 0, 0)) == "2001:db8:1:2::/64"
    assert source_key(("2001:db8:1:2:ffff:1:2:3", 9, 0, 0)) == "2001:db8:1:2::/64"
    assert source_key(("2001:db8:1:3::1", 5, 0, 0)) == "2001:db8:1:3::/64"
    assert source_key(("::ffff:192.0.2.1", 5, 0, 0)) == "192.0.2.1"      # dual-stack socket
    assert source_key(("fe80::1%eth0", 5, 0, 2)) == "fe80::/64"
    assert source_key("a unix socket path") == "a unix socket path"


def test_one_ipv4_source_is_capped_and_others_still_connect():
    server = server_endpoint(max_sessions_per_source=3)
    for port in range(3):
        assert handshake(server, ("192.0.2.1", 1000 + port), port + 1)["type"] == "accept"
    refused = handshake(server, ("192.0.2.1", 2000), 99)
    assert refused == dict(type="refuse", connect_id=99, reason="source_session_limit")
    assert server.refusals == {"source_session_limit": 1}
    assert server.peer_count == 3
    assert handshake(server, ("192.0.2.2", 1000), 100)["type"] == "accept"
    assert server.peer_count == 4


def test_an_ipv6_source_is_its_slash_64():
    server = server_endpoint(max_sessions_per_source=2)
    assert handshake(server, ("2001:db8:0:1::1", 1, 0, 0), 1)["type"] == "accept"
    assert handshake(server, ("2001:db8:0:1::2", 1, 0, 0), 2)["type"] == "accept"
    # Another address of the same /64 is the same source.
    assert handshake(server, ("2001:db8:0:1:abcd::9", 1, 0, 0), 3)["reason"] == "source_session_limit"
    assert handshake(server, ("2001:db8:0:2::1", 1, 0, 0), 4)["type"] == "accept"


def test_a_closed_session_frees_its_place():
    server = server_endpoint(max_sessions_per_source=2)
    first = ("192.0.2.1", 1000)
    assert handshake(server, first, 1)["type"] == "accept"
    assert handshake(server, ("192.0.2.1", 1001), 2)["type"] == "accept"
    assert handshake(server, ("192.0.2.1", 1002), 3)["type"] == "refuse"
    [peer_id] = [p for p in server.peer_ids if server.peer_address(p) == first]
    server.disconnect(peer_id, "kicked")
    assert handshake(server, ("192.0.2.1", 1002), 4)["type"] == "accept"
    # A client restarting at the same address replaces its old session: one place, not two.
    assert handshake(server, ("192.0.2.1", 1002), 5)["type"] == "accept"
    assert server.peer_count == 2
    # A timed-out one frees its place too.
    server.handle_timeout(60.0)
    assert server.peer_count == 0
    assert handshake(server, ("192.0.2.1", 1003), 6, now=60.0)["type"] == "accept"
    assert handshake(server, ("192.0.2.1", 1004), 7, now=60.0)["type"] == "accept"
    assert server.refusals == {"source_session_limit": 1}


def test_unlimited_by_default_in_the_core():
    server = server_endpoint()
    for port in range(40):
        assert handshake(server, ("192.0.2.1", 1000 + port), port + 1)["type"] == "accept"


def test_token_mode_is_not_capped():
    config = EndpointConfig(accept_connections=True, seed=1, token_keys={1: KEY},
                            max_sessions_per_source=1)
    server = Endpoint(config, UNIX)
    now = 0.0
    # Three clients behind one NAT address (different ports), each with its own token, one
    # after the other on one clock.
    for i in range(3):
        pair = LinkedPair(config, seed=i + 1, unix_offset=UNIX)
        pair.server, pair.now = server, now
        pair.client_address = ("198.51.100.7", 40000 + i)
        pair.connect(token=mint_token(KEY, 1, "room", f"p{i}", 60, now=UNIX))
        now = pair.now
    assert server.peer_count == 3
    assert server.refusals == {}


def test_the_client_sees_the_reason():
    config = EndpointConfig(accept_connections=True, seed=1, max_sessions_per_source=1)
    first = LinkedPair(config, seed=1)
    first.connect()
    second = LinkedPair(config, seed=2)
    second.server, second.now = first.server, first.now
    second.client_address = (first.CLIENT_ADDRESS[0], first.CLIENT_ADDRESS[1] + 1)
    second.client.connect(second.SERVER_ADDRESS, second.now)
    second.run(1.0)
    reasons = [e.reason for e in second.client_events if isinstance(e, PeerDisconnected)]
    assert reasons == ["refused:source_session_limit"]
    assert REASON_CODES["source_session_limit"] == 13


def test_the_count_follows_a_migrating_session_and_a_full_source_is_not_joined():
    config = EndpointConfig(accept_connections=True, seed=1, max_sessions_per_source=1)
    pair = LinkedPair(config, seed=3)
    pair.connect()
    full = ("10.0.0.9", 5000)
    assert handshake(pair.server, full, 77, pair.now)["type"] == "accept"

    def play(seconds):
        for _ in range(int(seconds / 0.02)):
            pair.client.send(pair.client_peer, 0, b"input")
            pair.run(0.02)

    # Its new address is a source already at the limit: the session stays where it was.
    pair.rebind_client(("10.0.0.9", 6000))
    play(0.5)
    assert pair.server.peer_address(pair.server_peer) == pair.CLIENT_ADDRESS
    assert pair.server.drops.get("path_unvalidated", 0) >= 1
    # A free source: it moves there, and takes its count along.
    pair.rebind_client(("10.0.0.7", 6000))
    play(0.5)
    assert [e for e in pair.server_events if isinstance(e, PeerMigrated)] == [
        PeerMigrated(pair.server_peer, pair.CLIENT_ADDRESS, ("10.0.0.7", 6000))]
    assert handshake(pair.server, (pair.CLIENT_ADDRESS[0], 1), 78, pair.now)["type"] == "accept"
    assert handshake(pair.server, ("10.0.0.7", 1), 79, pair.now)["reason"] == "source_session_limit"
    # A new port of the same source is no new source: NAT rebinding always moves.
    pair.rebind_client(("10.0.0.7", 6001))
    play(0.5)
    assert pair.server.peer_address(pair.server_peer) == ("10.0.0.7", 6001)


def test_a_negative_limit_is_refused():
    with pytest.raises(ConfigError, match="max_sessions_per_source=-1"):
        EndpointConfig(accept_connections=True, max_sessions_per_source=-1).validate()
