"""Block transfer: slices, slice-ack bitfield, resend of unacked slices, live traffic unaffected."""
import os

import pytest

from relay_core import BlockDelivered, BlockReceived, decode_packet
from conftest import make_pair, received


def blocks(events):
    return [(e.block_id, e.data) for e in events if isinstance(e, BlockReceived)]


@pytest.mark.parametrize("loss", [0.0, 0.1, 0.3])
def test_a_large_block_arrives_intact_under_loss(loss):
    pair = make_pair(loss=loss, delay=0.02, jitter=0.01, seed=31)
    pair.connect()
    history = os.urandom(300 * 1024)
    assert pair.server.send_block(pair.server_peer, history)
    pair.run(20)
    assert blocks(pair.client_events) == [(0, history)]
    assert [e.block_id for e in pair.server_events if isinstance(e, BlockDelivered)] == [0]
    stats = pair.server.peer_stats(pair.server_peer)
    if loss:
        assert stats.block_slices_resent > 0


def test_blocks_arrive_in_order_including_empty_and_one_byte_blocks():
    pair = make_pair(loss=0.05, delay=0.01, seed=32)
    pair.connect()
    payloads = [b"", b"x", os.urandom(1024), os.urandom(1025), os.urandom(50000)]
    for payload in payloads:
        assert pair.server.send_block(pair.server_peer, payload)
    pair.run(10)
    assert blocks(pair.client_events) == list(enumerate(payloads))


def test_block_transfer_does_not_stall_live_frames():
    pair = make_pair(loss=0.05, delay=0.02, seed=33, send_rate=150_000)
    pair.connect()
    pair.server.send_block(pair.server_peer, os.urandom(400 * 1024))
    frame_delays = []
    for frame in range(60):                 # 2 s of 30 Hz frames while the block is in flight
        pair.server.send(pair.server_peer, 1, b"frame%d" % frame)
        sent_at = pair.now
        before = len(received(pair.client_events, 1))
        while len(received(pair.client_events, 1)) == before and pair.now - sent_at < 1.0:
            pair.step()
        frame_delays.append(pair.now - sent_at)
        pair.run(max(0.0, 1 / 30 - (pair.now - sent_at)))
    assert not blocks(pair.client_events), "400 KiB at 150 kB/s is still in flight after 2 s"
    frame_delays.sort()
    assert frame_delays[len(frame_delays) // 2] < 0.03      # median: one-way delay + a tick
    pair.run(10)
    assert len(blocks(pair.client_events)) == 1


def test_slices_are_acked_with_a_bitfield():
    pair = make_pair(delay=0.01, seed=34)
    pair.connect()
    pair.server.send_block(pair.server_peer, bytes(20 * 1024))
    acks = []
    for _ in range(100):
        pair.now += 0.001
        for datagram in pair.up.arrivals(pair.now):
            pair.server.receive(datagram, pair.CLIENT_ADDRESS, pair.now)
        for datagram in pair.down.arrivals(pair.now):
            pair.client.receive(datagram, pair.SERVER_ADDRESS, pair.now)
        for datagram, _ in pair.server.datagrams_to_send(pair.now):
            pair.down.send(datagram, pair.now)
        for datagram, _ in pair.client.datagrams_to_send(pair.now):
            acks += [r for r in decode_packet(datagram)["records"] if r["kind"] == "block_ack"]
            pair.up.send(datagram, pair.now)
    assert acks
    assert acks[-1]["base"] == 20           # all 20 slices received


def test_block_larger_than_the_cap_is_refused():
    pair = make_pair(seed=35, max_block_size=10000)
    pair.connect()
    with pytest.raises(ValueError, match="max_block_size"):
        pair.server.send_block(pair.server_peer, bytes(10001))


def test_receiver_drops_a_block_announced_beyond_its_cap():
    from relay_core import EndpointConfig
    from relay_core.simlink import LinkedPair

    pair = LinkedPair(EndpointConfig(accept_connections=True, seed=1),
                      EndpointConfig(seed=2, max_block_size=5000), seed=1)
    pair.connect()
    pair.server.send_block(pair.server_peer, bytes(6000))
    pair.run(0.2)
    assert pair.client.drops.get("block_too_large", 0) >= 1
    assert not blocks(pair.client_events)
    pair.server.send(pair.server_peer, 1, b"live")
    pair.run(0.2)
    assert received(pair.client_events, 1) == [b"live"]


def test_block_buffers_share_one_budget_across_peers():
    from relay_core import Endpoint, EndpointConfig

    receiver = Endpoint(EndpointConfig(accept_connections=True, seed=1, max_block_size=100_000,
                                       block_memory_limit=150_000))
    senders = [Endpoint(EndpointConfig(seed=10 + i)) for i in range(3)]
    addresses = [("10.5.0.%d" % i, 1) for i in range(3)]
    peers = [s.connect(("10.0.0.1", 7777), 0.0) for s in senders]
    now = 0.0
    queued = [False] * 3
    done = []
    for _ in range(3000):
        now += 0.001
        for i, sender in enumerate(senders):
            if not queued[i] and sender.is_connected(peers[i]):
                queued[i] = sender.send_block(peers[i], bytes([i]) * 100_000)
            sender.handle_timeout(now)
            for datagram, _ in sender.datagrams_to_send(now):
                receiver.receive(datagram, addresses[i], now)
        receiver.handle_timeout(now)
        for datagram, to in receiver.datagrams_to_send(now):
            senders[addresses.index(to)].receive(datagram, ("10.0.0.1", 7777), now)
        while (event := receiver.next_event()) is not None:
            if isinstance(event, BlockReceived):
                done.append((now, event.data[0]))
    assert sorted(data for _, data in done) == [0, 1, 2]
    assert receiver.drops.get("reassembly_full", 0) > 0     # the third waited for memory


def test_next_timeout_is_never_in_the_past_while_a_block_is_in_flight():
    pair = make_pair(delay=0.03, seed=36, send_rate=200_000)
    pair.connect()
    pair.server.send_block(pair.server_peer, bytes(300 * 1024))
    wakeups = 0
    while not blocks(pair.client_events) and pair.now < 30:
        timeout = pair.server.next_timeout()
        arrival = min(filter(None, [pair.up.next_arrival(), pair.down.next_arrival()]), default=None)
        candidates = [t for t in (timeout, arrival, pair.client.next_timeout()) if t is not None]
        target = max(min(candidates), pair.now + 0.0001)
        pair.now = target - pair.tick
        pair.step()
        wakeups += 1
    assert blocks(pair.client_events)
    # 300 slices; acks, resends and pacing account for a few wakeups each, not a spin.
    assert wakeups < 300 * 8
