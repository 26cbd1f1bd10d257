"""Handshake admission under floods (docs/PROTOCOL.md section 8.9): the global handshake budget,
the resend lane that keeps a client from being locked out by whoever forges its IP, buckets per
IPv6 /64, cookie-verified responses on their own address's bucket, and a batch's established
sessions before its handshakes."""
from __future__ import annotations

import random

import pytest

from relay_core import Endpoint, EndpointConfig, MessageReceived
from relay_core.wire import decode_packet, encode_packet

VICTIM = ("192.0.2.7", 5555)
SERVER = ("10.0.0.1", 7777)


def forged_request(rng):
    return encode_packet(dict(type="connect_request", connect_id=rng.getrandbits(32)))


def connect_under(server, client_address, flood, start, limit=2.0, step=0.01):
    """Connects a client at ``client_address`` while ``flood(now)`` feeds the server forged
    datagrams every ``step``; returns the seconds it took (None: not within ``limit``)."""
    client = Endpoint(EndpointConfig(seed=3))
    peer = client.connect(SERVER, start)
    now = start
    while now < start + limit:
        flood(now)
        for data, _ in client.datagrams_to_send(now):
            server.receive(data, client_address, now)
        for data, to in server.datagrams_to_send(now):
            if to == client_address:
                client.receive(data, SERVER, now)
        if client.is_connected(peer):
            return now - start
        now += step
    return None


def test_forging_a_clients_ip_does_not_lock_it_out():
    """The M2 attack: 2 000 forged requests a second from the victim's IP (any port) drain its
    IP's bucket; the victim's own resend is still answered and it joins in well under 1 s."""
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1))       # default limits
    rng = random.Random(2)

    def flood(now):
        for _ in range(20):                                  # 20 per 10 ms
            server.receive(forged_request(rng), (VICTIM[0], rng.randint(1024, 65535)), now)
        server.datagrams_to_send(now)

    for i in range(100):                                     # a second of flood first
        flood(i * 0.01)
    assert server.drops["rate_limited"] > 1000
    took = connect_under(server, VICTIM, flood, 1.0)
    assert took is not None and took <= 0.5, took
    assert server.peer_count == 1


def test_a_forged_flood_over_the_global_budget_is_dropped_and_a_client_still_joins():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_budget=1000.0))
    rng = random.Random(3)

    def flood(now):
        for _ in range(100):                                 # 10 000 a second, random sources
            source = (f"198.51.{rng.randint(0, 255)}.{rng.randint(1, 254)}", rng.randint(1024, 65535))
            server.receive(forged_request(rng), source, now)
        server.datagrams_to_send(now)

    for i in range(100):
        flood(i * 0.01)
    answered = 10_000 - server.drops["handshake_budget"]
    # A tenth of a second's burst, then the rate less the reserve fresh requests may not use.
    assert 900 <= answered <= 1100, answered
    took = connect_under(server, ("203.0.113.9", 4000), flood, 1.0)
    assert took is not None and took <= 0.5, took
    assert server.peer_count == 1                            # no state for any forged request


def test_the_budget_counts_answers_only():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_budget=10.0,
                                     handshake_rate=1.0, handshake_burst=1))
    request = encode_packet(dict(type="connect_request", connect_id=5))
    for port in range(1, 31):           # one IP: its bucket allows one, the rest are not answered
        server.receive(request, ("192.0.2.1", port), 0.0)
    assert len(server.datagrams_to_send(0.0)) == 1
    assert server.drops == {"rate_limited": 29}
    for i in range(8):                  # the budget is untouched by what was not answered
        server.receive(request, (f"192.0.2.{10 + i}", 1), 0.0)
    # Burst 10 less the reserve of 2.5 fresh requests may not use: 7 answers, 1 already spent.
    assert len(server.datagrams_to_send(0.0)) == 6
    assert server.drops == {"rate_limited": 29, "handshake_budget": 2}


def test_ipv6_sources_share_a_bucket_per_64():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_rate=1.0,
                                     handshake_burst=5))
    rng = random.Random(4)
    for i in range(50):                 # one /64, a new address every time
        server.receive(forged_request(rng), (f"2001:db8:1:2::{i + 1:x}", 4000, 0, 0), 0.0)
    assert server.drops == {"rate_limited": 45}
    server.receive(forged_request(rng), ("2001:db8:1:3::1", 4000, 0, 0), 0.0)   # another /64
    assert server.drops == {"rate_limited": 45}
    assert len(server.datagrams_to_send(0.0)) == 6


def test_a_verified_response_is_charged_to_its_own_address_not_to_the_forged_ip():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_rate=1.0,
                                     handshake_burst=2))
    client = Endpoint(EndpointConfig(seed=3))
    peer = client.connect(SERVER, 0.0)
    (request, _), = client.datagrams_to_send(0.0)
    server.receive(request, VICTIM, 0.0)
    (challenge, _), = server.datagrams_to_send(0.0)
    rng = random.Random(5)
    for _ in range(100):                # the forger empties the IP's bucket
        server.receive(forged_request(rng), (VICTIM[0], rng.randint(1024, 65535)), 0.0)
    client.receive(challenge, SERVER, 0.0)
    (response, _), = client.datagrams_to_send(0.0)
    server.receive(response, VICTIM, 0.0)
    for data, to in server.datagrams_to_send(0.0):
        client.receive(data, SERVER, 0.0)
    assert client.is_connected(peer)


def test_a_batch_takes_data_and_verified_responses_before_requests():
    """A batch where forged requests come first: the player's DATA is delivered and a client's
    cookie-carrying response admitted, although the requests alone exceed the budget."""
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_budget=20.0))
    player = Endpoint(EndpointConfig(seed=7))
    player_peer = player.connect(SERVER, 0.0)
    player_address = ("192.0.2.50", 1000)
    for _ in range(3):                  # the player connects before the flood
        for data, _ in player.datagrams_to_send(0.0):
            server.receive(data, player_address, 0.0)
        for data, _ in server.datagrams_to_send(0.0):
            player.receive(data, SERVER, 0.0)
    assert player.is_connected(player_peer)
    newcomer = Endpoint(EndpointConfig(seed=8))
    newcomer_peer = newcomer.connect(SERVER, 0.05)
    newcomer_address = ("192.0.2.60", 1000)
    (request, _), = newcomer.datagrams_to_send(0.05)
    server.receive(request, newcomer_address, 0.05)
    for data, _ in server.datagrams_to_send(0.05):
        newcomer.receive(data, SERVER, 0.05)
    (response, _), = newcomer.datagrams_to_send(0.05)
    player.send(player_peer, 0, b"input 1")
    (data, _), = player.datagrams_to_send(0.1)
    rng = random.Random(6)
    batch = [(forged_request(rng), (f"198.51.100.{i % 250 + 1}", 2000 + i)) for i in range(200)]
    batch += [(data, player_address), (response, newcomer_address)]
    server.receive_batch(batch, 0.1)
    events = list(iter(server.next_event, None))
    assert [e.payload for e in events if isinstance(e, MessageReceived)] == [b"input 1"]
    for reply, to in server.datagrams_to_send(0.1):
        if to == newcomer_address:
            newcomer.receive(reply, SERVER, 0.1)
    assert newcomer.is_connected(newcomer_peer)
    assert server.drops["handshake_budget"] >= 180
    assert server.peer_count == 2


@pytest.mark.parametrize("value", [0.0, 0.5, float("inf"), float("nan")])
def test_handshake_budget_must_be_none_or_at_least_one(value):
    with pytest.raises(ValueError, match="handshake_budget"):
        EndpointConfig(accept_connections=True, handshake_budget=value).validate()


def test_replies_to_the_flood_stay_within_the_budget_over_time():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_budget=500.0))
    rng = random.Random(9)
    replies = 0
    for i in range(300):                # 3 s of 5 000 forged requests a second
        for _ in range(50):
            source = (f"198.51.{rng.randint(0, 255)}.{rng.randint(1, 254)}", rng.randint(1024, 65535))
            server.receive(forged_request(rng), source, i * 0.01)
        sent = server.datagrams_to_send(i * 0.01)
        assert {decode_packet(d)["type"] for d, _ in sent} <= {"challenge"}
        replies += len(sent)
    assert replies <= 50 + 3 * 500 + 50, replies
    assert replies >= 3 * 500 * 0.7, replies


def test_sources_are_grouped_as_relay_core_sources_groups_them():
    """The rate table's sources (64-bit keys in C) are relay_core.sources.source_key's: an
    IPv4-mapped IPv6 address is its IPv4 address, an IPv6 /64 is one source, a port is not."""
    from relay_core.sources import source_key
    addresses = [("192.0.2.1", 1), ("192.0.2.1", 2), ("::ffff:192.0.2.1", 3, 0, 0),
                 ("2001:db8:1:2::1", 4, 0, 0), ("2001:db8:1:2:ffff::9", 5, 0, 0),
                 ("2001:db8:1:3::1", 6, 0, 0), ("192.0.2.2", 1)]
    for a in addresses:
        for b in addresses:
            server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_rate=1.0,
                                             handshake_burst=1))
            server.receive(encode_packet(dict(type="connect_request", connect_id=1)), a, 0.0)
            server.receive(encode_packet(dict(type="connect_request", connect_id=2)), b, 0.0)
            shared = server.drops.get("rate_limited", 0) == 1
            assert shared == (source_key(a) == source_key(b)), (a, b)
