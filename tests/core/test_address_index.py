"""The endpoint's address index (Endpoint._index): the C hash from a sockaddr to its peer that
receive_raw uses to take a connected peer's DATA in the receive buffer. It must follow every
connect, close and migration exactly, or DATA would reach the wrong peer or none."""
from __future__ import annotations

import random

from relay_core.simlink import LinkedPair
from relay_core import EndpointConfig

from test_source_limits import handshake, server_endpoint


def _address(rng: random.Random, index: int):
    if index % 3 == 2:
        return (f"2001:db8:{index:x}::{rng.randrange(1, 0xFFFF):x}", 1000 + index % 50, 0, 0)
    return (f"10.{index % 200}.{index // 200}.{rng.randrange(1, 255)}", 2000 + index)


def test_the_index_follows_hundreds_of_connects_and_closes():
    rng = random.Random(5)
    server = server_endpoint(max_peers=4000)
    peers = {}                    # address -> peer id
    for index in range(600):      # grows the index from 64 slots several times
        address = _address(rng, index)
        assert handshake(server, address, index + 1)["type"] == "accept"
        [peer_id] = [p for p in server.peer_ids if p not in peers.values()]
        peers[address] = peer_id
    for address, peer_id in peers.items():
        assert server.indexed_peer(address) == peer_id
    # Close a random 60 %: each removal shifts entries back; every survivor must stay findable.
    closed = rng.sample(sorted(peers, key=repr), 360)
    for address in closed:
        server.disconnect(peers.pop(address))
        server.datagrams_to_send(0.0)
    for address in closed:
        assert server.indexed_peer(address) is None
    for address, peer_id in peers.items():
        assert server.indexed_peer(address) == peer_id
    # Reuse: new peers at some of the closed addresses.
    for index, address in enumerate(closed[:100]):
        assert handshake(server, address, 5000 + index)["type"] == "accept"
        assert server.indexed_peer(address) not in (None, *peers.values())


def test_a_migrated_peer_is_found_at_its_new_address_only():
    pair = LinkedPair(EndpointConfig(accept_connections=True, seed=1), seed=3)
    pair.connect()
    assert pair.server.indexed_peer(pair.CLIENT_ADDRESS) == pair.server_peer
    moved = ("10.0.0.7", 6000)
    pair.rebind_client(moved)
    for _ in range(25):
        pair.client.send(pair.client_peer, 0, b"input")
        pair.run(0.02)
    assert pair.server.peer_address(pair.server_peer) == moved
    assert pair.server.indexed_peer(moved) == pair.server_peer
    assert pair.server.indexed_peer(pair.CLIENT_ADDRESS) is None


def test_what_is_not_an_ip_address_is_not_indexed():
    server = server_endpoint()
    assert server.indexed_peer("a unix socket path") is None
    assert server.indexed_peer(("not an ip", 5)) is None
    assert server.indexed_peer(("192.0.2.1", 5)) is None


def test_send_many_finds_every_live_peer_by_id_through_connects_and_closes():
    """The id index (Endpoint._by_id, send_many's lookup) through growth from 64 slots, closes
    that leave holes in probe runs, and ids past the table's size that share a home slot: a send
    to every id ever handed out reaches exactly the live peers, and strange ids are skipped."""
    from relay_core import Endpoint
    rng = random.Random(11)
    endpoint = Endpoint(EndpointConfig())
    live, gone = set(), set()
    for round_number in range(4):
        for index in range(150):
            live.add(endpoint.connect(("10.1.%d.%d" % (round_number, index), 4000), 0.0))
        for peer_id in rng.sample(sorted(live), 90):
            endpoint.disconnect(peer_id)
            live.remove(peer_id)
            gone.add(peer_id)
    assert set(endpoint.peer_ids) == live and len(live) == 240 and max(live) > 512
    queued_before = {p: endpoint.channel_snapshot(p, 1)["next_id"] for p in live}
    everyone = sorted(live | gone) + [0, -3, 10**6, 2**40, "x", None]
    assert endpoint.send_many(everyone, 1, b"frame") == []
    for peer_id in live:
        assert endpoint.channel_snapshot(peer_id, 1)["next_id"] == queued_before[peer_id] + 1
    half = sorted(live)[::2]
    endpoint.send_many(half, 1, b"frame")
    for peer_id in live:
        assert endpoint.channel_snapshot(peer_id, 1)["next_id"] == (
            queued_before[peer_id] + 1 + (peer_id in half))
    # Room-sized lists (send_many asks for all their peers first), strange ids among them.
    queued_before = {p: endpoint.channel_snapshot(p, 1)["next_id"] for p in live}
    shuffled = everyone + [2**31, -2**31 - 1]
    rng.shuffle(shuffled)
    for start in range(0, len(shuffled), 8):
        assert endpoint.send_many(shuffled[start:start + 8], 1, b"frame") == []
    for peer_id in live:
        assert endpoint.channel_snapshot(peer_id, 1)["next_id"] == queued_before[peer_id] + 1
