"""One endpoint-wide receive budget (issue 17, M4): everything peers make the endpoint hold
before delivery -- fragments with their bookkeeping, messages waiting for an earlier one, a
receive window's storage, block buffers -- is counted in ``receive_memory_limit``; a record
past it is refused (``receive_memory_full``, not acked: the sender offers it again), and all of
it comes back when a peer leaves."""
from relay_core import Endpoint, EndpointConfig, decode_packet, encode_packet
from conftest import received

SERVER = ("10.0.0.1", 7777)
LIMITS = dict(max_message_size=40_000, reassembly_limit=100_000, max_block_size=1_000_000)


class Hub:
    """One server and many clients over a perfect in-memory link, in simulated time."""

    def __init__(self, receive_memory_limit, peers=40, **config):
        self.server = Endpoint(EndpointConfig(accept_connections=True, seed=1, max_peers=peers,
                                              handshake_rate=None,
                                              receive_memory_limit=receive_memory_limit,
                                              **LIMITS, **config))
        self.clients = {}               # address -> (endpoint, peer id)
        self.events = []
        self.now = 0.0
        self.seq = {}
        self.sessions = {}

    def connect(self, count):
        addresses = []
        for _ in range(count):
            address = ("10.1.0.%d" % (len(self.clients) + 1), 4000)
            client = Endpoint(EndpointConfig(seed=100 + len(self.clients), **LIMITS))
            self.clients[address] = (client, client.connect(SERVER, self.now))
            addresses.append(address)
        self.step(0.01, 10)
        assert all(self.clients[a][0].is_connected(self.clients[a][1]) for a in addresses)
        return addresses

    def step(self, dt=0.001, times=1):
        for _ in range(times):
            self.now += dt
            for address, (client, _) in self.clients.items():
                client.handle_timeout(self.now)
                for datagram, _ in client.datagrams_to_send(self.now):
                    self.server.receive(datagram, address, self.now)
            self.server.handle_timeout(self.now)
            for datagram, to in self.server.datagrams_to_send(self.now):
                if to in self.clients:
                    self.clients[to][0].receive(datagram, SERVER, self.now)
            while (event := self.server.next_event()) is not None:
                self.events.append(event)

    def session(self, address):
        if address not in self.sessions:
            client, _ = self.clients[address]
            heartbeat = client.datagrams_to_send(self.now + 5.0)[0][0]
            self.sessions[address] = decode_packet(heartbeat)["session_id"]
        return self.sessions[address]

    def forge(self, address, records, session):
        """A DATA packet from ``address`` carrying ``records``; the next free packet seq."""
        seq = self.seq.get(address, 1000)
        self.seq[address] = seq + 1
        self.server.receive(encode_packet(dict(type="data", session_id=session, seq=seq, ack=0,
                                               ack_bits=0, send_time=0, echo_time=0,
                                               records=records)), address, self.now)


def fragment(channel, msg_id, index, count, payload):
    return dict(kind="fragment", channel=channel, msg_id=msg_id, fragment_index=index,
                fragment_count=count, payload=payload.hex())


def park(hub, address):
    """M4 from one connection: on both reliable channels, the message delivery waits for
    without its last fragment, and one 1-byte fragment of every other id in the window."""
    session = hub.session(address)
    for channel in (0, 1):
        for index in range(39):
            hub.forge(address, [fragment(channel, 0, index, 40, bytes(1000))], session)
        small = [fragment(channel, msg_id, 0, 255, b"x") for msg_id in range(1, 256)]
        for i in range(0, len(small), 80):
            hub.forge(address, small[i:i + 80], session)
        assert hub.server.receive_memory["used"] <= hub.server.receive_memory["limit"]


def test_parked_fragments_of_many_peers_stay_within_the_endpoint_budget():
    limit = 2_000_000
    hub = Hub(limit)
    honest = hub.connect(2)
    attackers = hub.connect(30)
    for address in attackers:
        park(hub, address)
    memory = hub.server.receive_memory
    drops = hub.server.drops
    # Full, never beyond; further parking refused and counted, per peer and endpoint-wide.
    assert limit - 100_000 < memory["used"] <= limit
    assert drops["receive_memory_full"] > 0 and drops["reassembly_full"] > 0
    # Under the old accounting each of these peers held ~0.35 MB (~10 MB in all).
    assert memory["used"] < 30 * 100_000

    # Established peers' normal traffic (whole messages, in order) still flows...
    for i, address in enumerate(honest):
        client, peer = hub.clients[address]
        for channel in (0, 1):
            client.send(peer, channel, b"input %d/%d" % (i, channel))
    hub.step(0.001, 50)
    for channel in (0, 1):
        assert sorted(received(hub.events, channel)) == [b"input 0/%d" % channel,
                                                         b"input 1/%d" % channel]
    # ...and a fragmented message waits for memory, refused (never lost) until there is some.
    client, peer = hub.clients[honest[0]]
    client.send(peer, 0, b"L" * 30_000)
    hub.step(0.01, 30)
    assert b"L" * 30_000 not in received(hub.events, 0)
    for address in attackers:
        hub.server.disconnect(hub.server.peer_ids[-1])
    hub.step(0.01, 200)
    assert b"L" * 30_000 in received(hub.events, 0)


def test_one_greedy_peer_gets_its_own_cap_and_no_more():
    hub = Hub(10_000_000)
    greedy, honest = hub.connect(2)
    park(hub, greedy)
    held = hub.server.receive_memory["used"]
    # reassembly_limit, plus the message delivery waits for on each of the two reliable
    # channels (39 of 40 fragments, with their bookkeeping), plus the windows' storage.
    assert 100_000 < held <= 100_000 + 2 * (40_000 + 40 * 64 + 160 + 8 * 40) + 2 * 6000
    assert hub.server.drops["reassembly_full"] > 0
    assert "receive_memory_full" not in hub.server.drops
    # Everyone else still has room: a large message of another peer goes through.
    client, peer = hub.clients[honest]
    client.send(peer, 0, b"M" * 35_000)
    hub.step(0.005, 40)
    assert received(hub.events, 0) == [b"M" * 35_000]


def test_everything_a_peer_held_comes_back_when_it_leaves():
    hub = Hub(50_000_000)
    closed, timed_out, replaced, stays = hub.connect(4)
    for address in (closed, timed_out, replaced):
        park(hub, address)
        # and the first slices of a block that never completes
        session = hub.session(address)
        for index in range(3):
            hub.forge(address, [dict(kind="block_slice", block_id=0, slice_index=index,
                                     slice_count=900, block_size=900_000,
                                     payload=bytes(1000).hex())], session)
    memory = hub.server.receive_memory
    assert memory["used"] > 3 * 900_000 and memory["blocks"] == 3 * 900_000
    ids = dict(zip((closed, timed_out, replaced, stays), hub.server.peer_ids))

    hub.server.disconnect(ids[closed])
    # The client at ``replaced`` restarts: a new connection from the same address.
    client = Endpoint(EndpointConfig(seed=999, **LIMITS))
    hub.clients[replaced] = (client, client.connect(SERVER, hub.now))
    # ``timed_out`` goes silent; ``stays`` keeps talking.
    del hub.clients[timed_out]
    for _ in range(12):
        hub.step(1.0)
    assert set(hub.server.peer_ids) == {ids[stays], max(hub.server.peer_ids)}
    assert hub.server.receive_memory["used"] == 0
    assert hub.server.receive_memory["blocks"] == 0
    del hub.clients[replaced]
    del hub.clients[stays]
    hub.step(11.0)
    assert hub.server.peer_count == 0 and hub.server.receive_memory["used"] == 0


def test_the_limit_must_hold_the_largest_message_and_block():
    import pytest
    from relay_core import ConfigError
    with pytest.raises(ConfigError, match="receive_memory_limit"):
        EndpointConfig(receive_memory_limit=1_000_000).validate()
    assert EndpointConfig().receive_memory_limit == 256 * 1024 * 1024
