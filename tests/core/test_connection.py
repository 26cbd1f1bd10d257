"""Handshake with a stateless cookie, connect ids, max peers, heartbeat, timeout, disconnect."""
import tracemalloc

from relay_core import (
    Endpoint, EndpointConfig, PeerConnected, PeerDisconnected, decode_packet, encode_packet,
)
from relay_core.simlink import LinkedPair
from conftest import make_pair, received

SERVER = ("10.0.0.1", 7777)


def server_endpoint(**config):
    return Endpoint(EndpointConfig(accept_connections=True, seed=1, **config))


def connect_request(connect_id=1234):
    return encode_packet(dict(type="connect_request", connect_id=connect_id))


def disconnect_reasons(events):
    return [e.reason for e in events if isinstance(e, PeerDisconnected)]


def test_handshake_connects_both_sides(pair):
    assert pair.client.is_connected(pair.client_peer)
    assert pair.server.peer_count == 1
    assert [type(e) for e in pair.server_events] == [PeerConnected]
    assert pair.server.peer_address(pair.server_peer) == pair.CLIENT_ADDRESS


def test_server_keeps_no_state_for_spoofed_connect_floods():
    """The only memory a flood from random sources touches is the handshake rate table, which
    is bounded: once it is full, 20000 more sources leave nothing behind."""
    server = server_endpoint(handshake_sources=64)

    def flood(first):
        replies = 0
        for i in range(first, first + 20000):
            address = (f"127.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 1000 + i % 50000)
            server.receive(connect_request(i), address, i * 1e-4)
            for reply, to in server.datagrams_to_send(i * 1e-4):
                assert to == address and len(reply) <= 64
                assert decode_packet(reply)["type"] == "challenge"
                replies += 1
        return replies

    assert flood(0) == 20000
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    replies = flood(20000)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert replies == 20000
    assert server.peer_count == 0
    assert growth < 64 * 1024, f"{growth} bytes retained after 20000 spoofed connects"


def test_replies_to_unauthenticated_datagrams_are_never_larger():
    server = server_endpoint(max_peers=1)
    address = ("10.1.1.1", 5)
    request = connect_request(77)
    server.receive(request, address, 0.0)
    [(challenge, _)] = server.datagrams_to_send(0.0)
    assert len(challenge) <= len(request)
    response = encode_packet(dict(decode_packet(challenge), type="connect_response", ack_delay_ms=5))
    server.receive(response, address, 0.0)
    [(accept, _)] = server.datagrams_to_send(0.0)
    assert decode_packet(accept)["type"] == "accept" and len(accept) <= len(response)
    # A second client is refused, also with a reply no larger than what it sent.
    other = ("10.1.1.2", 5)
    server.receive(connect_request(78), other, 0.0)
    [(challenge, _)] = server.datagrams_to_send(0.0)
    response = encode_packet(dict(decode_packet(challenge), type="connect_response", ack_delay_ms=5))
    server.receive(response, other, 0.0)
    [(refuse, _)] = server.datagrams_to_send(0.0)
    assert decode_packet(refuse) == dict(type="refuse", connect_id=78, reason="server_full")
    assert len(refuse) <= len(response)
    assert server.refusals == {"server_full": 1}


def test_cookie_is_bound_to_address_and_time():
    server = server_endpoint(cookie_lifetime=2.0)
    server.receive(connect_request(5), ("10.2.2.2", 9), 0.0)
    [(challenge, _)] = server.datagrams_to_send(0.0)
    response = encode_packet(dict(decode_packet(challenge), type="connect_response", ack_delay_ms=5))
    server.receive(response, ("10.2.2.3", 9), 0.5)          # replayed from another address
    assert server.drops == {"bad_cookie": 1}
    tampered = bytearray(response)
    tampered[27] ^= 1                                       # last byte of the MAC
    server.receive(bytes(tampered), ("10.2.2.2", 9), 0.5)
    assert server.drops == {"bad_cookie": 2}
    server.receive(response, ("10.2.2.2", 9), 3.0)          # too late
    assert server.drops == {"bad_cookie": 2, "expired_cookie": 1}
    assert server.peer_count == 0


def test_handshake_recovers_from_lost_challenges():
    pair = make_pair(seed=3)
    pair.down.profile.loss = 1.0
    pair.client.connect(pair.SERVER_ADDRESS, pair.now)
    pair.run(0.25)                      # a few CONNECT_REQUESTs answered into the void
    pair.down.profile.loss = 0.0
    pair.run(0.5)
    assert pair.server.peer_count == 1
    assert pair.client.is_connected(pair.client.peer_ids[0])
    assert [type(e) for e in pair.server_events] == [PeerConnected]


def test_a_lost_accept_is_answered_again_for_the_same_connect_id():
    pair = make_pair(seed=4)
    client_peer = pair.client.connect(pair.SERVER_ADDRESS, pair.now)
    accepts_dropped = 0
    while pair.server.peer_count == 0:
        pair.step()
    # The server now has the peer; throw away its ACCEPT in flight.
    for datagram in pair.down.arrivals(pair.now + 1.0):
        accepts_dropped += decode_packet(datagram)["type"] == "accept"
    assert accepts_dropped == 1
    pair.run(0.5)
    assert pair.client.is_connected(client_peer)
    assert pair.server.peer_count == 1
    assert [type(e) for e in pair.server_events] == [PeerConnected]


def test_server_full_is_refused_with_a_reason_the_client_sees():
    server_config = EndpointConfig(accept_connections=True, seed=1, max_peers=1)
    first = LinkedPair(server_config, seed=1)
    first.connect()
    late = Endpoint(EndpointConfig(seed=9))
    peer = late.connect(first.SERVER_ADDRESS, first.now)
    address = ("10.0.0.3", 1)
    for _ in range(50):
        first.now += 0.01
        for datagram, _ in late.datagrams_to_send(first.now):
            first.server.receive(datagram, address, first.now)
        for datagram, to in first.server.datagrams_to_send(first.now):
            if to == address:
                late.receive(datagram, first.SERVER_ADDRESS, first.now)
    assert disconnect_reasons([late.next_event()]) == ["refused:server_full"]
    assert first.server.peer_count == 1 and not late.is_connected(peer)


def test_connect_times_out_without_a_server():
    client = Endpoint(EndpointConfig(seed=1, connect_timeout=1.0))
    client.connect(SERVER, 0.0)
    now = 0.0
    sent = 0
    while now < 2.0:
        now += 0.01
        client.handle_timeout(now)
        sent += len(client.datagrams_to_send(now))
    assert disconnect_reasons([client.next_event()]) == ["connect_timeout"]
    assert 5 <= sent <= 11                  # resent every connect_resend_interval (0.1 s)
    assert client.peer_count == 0


def test_idle_peers_exchange_heartbeats_and_stay_connected(pair):
    sent_before = pair.client.peer_stats(pair.client_peer).packets_sent
    pair.run(20.0)                          # twice peer_timeout without application traffic
    assert pair.client.is_connected(pair.client_peer) and pair.server.peer_count == 1
    sent = pair.client.peer_stats(pair.client_peer).packets_sent - sent_before
    assert 35 <= sent <= 45                 # one heartbeat per 0.5 s


def test_silent_peer_is_timed_out_on_both_sides(pair):
    pair.up.profile.loss = pair.down.profile.loss = 1.0
    pair.run(9.0)
    assert pair.server.peer_count == 1
    pair.run(2.0)
    assert disconnect_reasons(pair.server_events) == ["timeout"]
    assert disconnect_reasons(pair.client_events) == ["timeout"]
    assert pair.server.peer_count == pair.client.peer_count == 0


def test_graceful_disconnect_is_seen_by_both_sides(pair):
    pair.client.disconnect(pair.client_peer)
    pair.run(0.05)
    assert disconnect_reasons(pair.client_events) == ["local:closed"]
    assert disconnect_reasons(pair.server_events) == ["remote:closed"]
    assert pair.server.peer_count == 0


def test_disconnect_survives_a_lost_copy():
    pair = make_pair(loss=0.5, seed=12)
    pair.connect()
    pair.server.disconnect(pair.server_peer, "kicked")
    pair.run(0.05)
    assert disconnect_reasons(pair.client_events) == ["remote:kicked"]


def test_a_restarted_client_replaces_its_old_session():
    pair = make_pair(seed=6)
    pair.connect()
    old_session = decode_packet(pair.client.datagrams_to_send(pair.now + 1.0)[0][0])["session_id"]
    restarted = Endpoint(EndpointConfig(seed=99))
    pair.client = restarted
    pair.client_events.clear()
    new_peer = restarted.connect(pair.SERVER_ADDRESS, pair.now)
    pair.run(0.1)
    assert restarted.is_connected(new_peer)
    assert disconnect_reasons(pair.server_events) == ["replaced"]
    assert pair.server.peer_count == 1
    # A late datagram of the old session is dropped, not mistaken for the new one.
    stale = encode_packet(dict(type="data", session_id=old_session, seq=500, ack=0, ack_bits=0,
                               send_time=0, echo_time=0, records=[]))
    pair.server.receive(stale, pair.CLIENT_ADDRESS, pair.now)
    assert pair.server.drops.get("wrong_session") == 1


def test_a_client_endpoint_does_not_accept_connections():
    client = Endpoint(EndpointConfig())
    client.receive(connect_request(), ("10.9.9.9", 1), 0.0)
    assert client.drops == {"not_accepting": 1}
    assert client.datagrams_to_send(0.0) == []


def test_messages_sent_while_connecting_go_out_once_connected():
    pair = make_pair(delay=0.01, seed=2)
    peer = pair.client.connect(pair.SERVER_ADDRESS, pair.now)
    assert pair.client.send(peer, 0, b"early")
    pair.run(0.2)
    assert received(pair.server_events, 0) == [b"early"]


def test_without_acks_a_peer_sends_at_most_the_ack_window_per_round_trip():
    pair = make_pair(delay=0.05, seed=13, peer_timeout=50, max_resends=1000, rto_limit=100)
    pair.connect()
    pair.run(1.0)                                   # an RTT sample of ~100 ms
    pair.down.profile.loss = 1.0                    # from now on no ack comes back
    start = pair.client.peer_stats(pair.client_peer).packets_sent
    for i in range(1000):
        pair.client.send(pair.client_peer, 0, bytes(1000))
        pair.step()
    sent = pair.client.peer_stats(pair.client_peer).packets_sent - start
    # 1 s at ~100 ms RTT: 32 packets, then one per RTT/32 (~3 ms), not one per millisecond.
    assert 32 < sent < 32 + 1000 / 2.5, sent


def test_only_peers_with_work_due_are_flushed_and_next_timeout_tracks_the_earliest():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, heartbeat_interval=0.5))
    clients = [Endpoint(EndpointConfig(seed=10 + i)) for i in range(5)]
    addresses = [("10.7.0.%d" % i, 1) for i in range(5)]
    peers = [c.connect(SERVER, 0.0) for c in clients]
    now = 0.0
    for _ in range(20):                      # handshakes, then quiet
        now += 0.01
        for i, client in enumerate(clients):
            for datagram, _ in client.datagrams_to_send(now):
                server.receive(datagram, addresses[i], now)
        for datagram, to in server.datagrams_to_send(now):
            clients[addresses.index(to)].receive(datagram, SERVER, now)
    assert server.peer_count == 5 and all(c.is_connected(p) for c, p in zip(clients, peers))
    quiet_since = now
    assert server.datagrams_to_send(now) == []
    # Idle: the next thing due is a heartbeat, half a second after the last send.
    assert quiet_since < server.next_timeout() <= quiet_since + 0.5
    # Sending to one peer makes exactly that peer due now, and only it gets a datagram.
    target = server.peer_ids[2]
    server.send(target, 0, b"just you")
    assert server.next_timeout() == 0.0
    sent = server.datagrams_to_send(now + 0.001)
    assert {to for _, to in sent} == {server.peer_address(target)}
    # Once their heartbeats are due, every idle peer gets one.
    sent = server.datagrams_to_send(quiet_since + 0.6)
    assert len({to for _, to in sent}) == 5


def test_a_lockstep_server_is_woken_only_by_its_ticks():
    """Every tick each player's input (acking the last frame) arrives and its frame goes out.
    Nothing is ever due between ticks: an acked frame's RTO must not wake the endpoint
    (ReliableSendChannel.next_deadline finds the true earliest after an ack), and a player's
    deadline that each visit moves later must not either (the visit supersedes its schedule
    entry). Each tick sends one datagram per player."""
    interval = 1 / 30
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, ack_delay=interval))
    clients = [Endpoint(EndpointConfig(seed=20 + i, ack_delay=interval)) for i in range(8)]
    addresses = [("10.9.0.%d" % i, 1) for i in range(8)]
    where = {address: i for i, address in enumerate(addresses)}
    for client in clients:
        client.connect(SERVER, 0.0)
    now = 0.0

    def deliver(sent):
        for datagram, to in sent:
            clients[where[to]].receive(datagram, SERVER, now)

    for _ in range(20):
        now += 0.01
        for i, client in enumerate(clients):
            for datagram, _ in client.datagrams_to_send(now):
                server.receive(datagram, addresses[i], now)
        deliver(server.datagrams_to_send(now))
    assert server.peer_count == 8
    peer_ids = server.peer_ids
    tick_at = now
    wakeups = 0
    for tick in range(300):
        tick_at += interval
        while (wake := server.next_timeout()) is not None and wake < tick_at:
            now = max(now, wake)
            server.handle_timeout(now)
            deliver(server.datagrams_to_send(now))
            wakeups += 1
        now = tick_at
        for i, client in enumerate(clients):         # each player's input for this tick
            client.send(client.peer_ids[0], 0, b"input %d" % tick)
            for datagram, _ in client.datagrams_to_send(now):
                server.receive(datagram, addresses[i], now)
        deliver(server.datagrams_to_send(now))
        server.send_many(peer_ids, 0, b"frame %d" % tick)
        sent = server.datagrams_to_send(now)
        assert sorted(to for _, to in sent) == sorted(addresses)
        deliver(sent)
    assert wakeups == 0


def test_departed_peers_cells_go_to_new_peers_and_their_entries_never_answer_next_timeout():
    """Peers come and go in waves. A departed peer's schedule entries stay in the heap, judged
    void by its cell's generation alone: next_timeout skips them even when they are the
    earliest (an unacked message's RTO), and the cell goes to a later peer, whose schedule
    then works as anyone's."""
    server = Endpoint(EndpointConfig(accept_connections=True, seed=3, heartbeat_interval=0.5))
    now = 0.0
    clients: dict = {}                      # address -> client Endpoint
    serial = 0

    def exchange():
        for address, client in clients.items():
            for datagram, _ in client.datagrams_to_send(now):
                server.receive(datagram, address, now)
        sent = server.datagrams_to_send(now)
        for datagram, to in sent:
            clients[to].receive(datagram, SERVER, now)
        return sent

    def run(seconds):
        nonlocal now
        heard = set()
        for _ in range(round(seconds / 0.01)):
            now += 0.01
            heard |= {to for _, to in exchange()}
        return heard

    def join(count):
        nonlocal serial
        for _ in range(count):
            serial += 1
            client = Endpoint(EndpointConfig(seed=100 + serial))
            client.connect(SERVER, now)
            clients[("10.6.%d.%d" % (serial // 200, serial % 200), 1)] = client

    join(30)
    run(0.2)
    assert server.peer_count == 30 and server.schedule_sizes["cells"] == 30
    for wave in range(3):
        earliest_kept = server.next_timeout()       # every peer idle: a heartbeat
        assert earliest_kept > now + 0.05
        leaving = server.peer_ids[:12]
        for peer_id in leaving:                     # an RTO each, far before any heartbeat...
            server.send(peer_id, 0, b"never acked")
        assert len(server.datagrams_to_send(now)) == 12
        for peer_id in leaving:                     # ... and gone
            del clients[server.peer_address(peer_id)]
            assert server.disconnect(peer_id)
        server.datagrams_to_send(now)               # the DISCONNECTs
        assert server.peer_count == 18 and server.schedule_sizes["free_cells"] == 12
        assert server.next_timeout() == earliest_kept, f"wave {wave}"
        join(12)
        heard = run(1.2)
        assert server.peer_count == 30
        assert server.schedule_sizes["cells"] == 30 and server.schedule_sizes["free_cells"] == 0
        assert heard == set(clients), f"wave {wave}: {len(set(clients) - heard)} peers unheard"
        assert server.schedule_sizes["entries"] <= 2 * 30 + 1024


def test_closing_most_peers_leaves_the_others_timers_intact():
    """The flush schedule borrows its peers: closing them (enough at once that their entries
    are swept out of it) must leave every other peer's timer in place, and the closed ones
    get nothing more than their DISCONNECT."""
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, heartbeat_interval=0.5))
    count = 160
    clients = [Endpoint(EndpointConfig(seed=10 + i)) for i in range(count)]
    addresses = [("10.8.%d.%d" % (i // 200, i % 200), 1) for i in range(count)]
    where = {address: i for i, address in enumerate(addresses)}
    for client in clients:
        client.connect(SERVER, 0.0)
    now = 0.0

    def exchange():
        for i, client in enumerate(clients):
            for datagram, _ in client.datagrams_to_send(now):
                server.receive(datagram, addresses[i], now)
        sent = server.datagrams_to_send(now)
        for datagram, to in sent:
            clients[where[to]].receive(datagram, SERVER, now)
        return sent

    for _ in range(20):
        now += 0.01
        exchange()
    assert server.peer_count == count
    closed = server.peer_ids[:140]
    kept = {server.peer_address(p) for p in server.peer_ids[140:]}
    gone = {server.peer_address(p) for p in closed}
    for peer_id in closed:
        assert server.disconnect(peer_id)
    assert {to for _, to in server.datagrams_to_send(now)} == gone      # the DISCONNECTs
    assert server.peer_count == 20
    heard = set()
    for _ in range(150):            # 1.5 s: three heartbeat intervals
        now += 0.01
        heard |= {to for _, to in server.datagrams_to_send(now)}
        assert server.next_timeout() is None or server.next_timeout() <= now + 0.5
    assert heard == kept
