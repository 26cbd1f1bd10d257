"""Per-peer send budget, good/bad mode, and the statistics each peer exposes."""
from relay_core import PeerStats
from conftest import make_pair

REDUNDANT = 1


def stream_frames(pair, count, size=40, interval=1 / 30):
    for i in range(count):
        pair.server.send(pair.server_peer, REDUNDANT, bytes([i % 256]) * size)
        pair.run(interval)


def test_stats_expose_rtt_loss_bytes_packets_resends_and_redundancy():
    pair = make_pair(loss=0.1, delay=0.03, jitter=0.01, seed=41)
    pair.connect()
    stream_frames(pair, 200)
    pair.client.send(pair.client_peer, 0, b"x")
    pair.run(1.0)
    stats = pair.server.peer_stats(pair.server_peer)
    assert isinstance(stats, PeerStats)
    assert 0.055 < stats.rtt < 0.09 and stats.rtt_variance > 0 and stats.rto >= 0.03
    assert 0.03 < stats.loss < 0.3
    assert stats.packets_sent >= 200 and stats.packets_received > 0
    assert stats.bytes_sent > 200 * 40 and stats.bytes_received > 0
    assert stats.packets_acked > 0 and stats.packets_lost > 0
    assert stats.messages_sent == 200
    assert stats.redundant_bytes > 0
    assert pair.client.peer_stats(pair.client_peer).messages_received == 200
    assert stats.queued_messages == 0


def test_packets_lost_are_exactly_the_datagrams_the_link_dropped():
    """The loss count judges each of our packets once it is 32 behind the newest ack, by the
    in-flight and DATA bit masks (no read of its SentPacket slot). With the return path clean
    and both sides sending every step, every packet that arrived is acked, so the packets
    counted lost are exactly the server's datagrams the forward link dropped, and the loss
    estimate has moved by one EWMA step per packet."""
    pair = make_pair(delay=0.01, seed=43, max_resends=1000, rto_limit=60)
    pair.connect()
    dropped_before = pair.down.counters.dropped
    offered_before = len(pair.down.counters.drop_decisions)
    sent_before = pair.server.peer_stats(pair.server_peer).packets_sent
    pair.down.profile.loss = 0.25
    for i in range(600):
        pair.server.send(pair.server_peer, 0, b"frame %d" % i)
        pair.client.send(pair.client_peer, 0, b"input %d" % i)
        pair.run(0.005)
    pair.down.profile.loss = 0.0
    for i in range(100):                    # clean: the ack moves well past the lossy packets
        pair.server.send(pair.server_peer, 0, b"frame")
        pair.client.send(pair.client_peer, 0, b"input")
        pair.run(0.005)
    stats = pair.server.peer_stats(pair.server_peer)
    dropped = pair.down.counters.dropped - dropped_before
    assert dropped > 100
    assert stats.packets_lost == dropped
    assert stats.packets_sent - sent_before > 600 + dropped
    # The estimate is the EWMA (weight 0.05) of the link's own decisions, up to a packet
    # among the newest, which are not judged yet.
    estimates, loss = [], 0.0
    for was_dropped in pair.down.counters.drop_decisions[offered_before:]:
        loss = loss + 0.05 * (1.0 - loss) if was_dropped else loss - 0.05 * loss
        estimates.append(loss)
    assert stats.loss in estimates[-64:]


def test_pacing_budget_caps_redundant_bytes_on_a_slow_link():
    def redundant_bytes(send_rate):
        pair = make_pair(delay=0.15, seed=42, send_rate=send_rate, redundancy_policy="always")
        pair.connect()
        stream_frames(pair, 150, size=200, interval=0.01)       # 20 kB/s of new frames
        return pair.server.peer_stats(pair.server_peer).redundant_bytes

    generous, tight = redundant_bytes(2_000_000), redundant_bytes(25_000)
    assert tight < generous / 3, (tight, generous)


def test_new_messages_are_never_held_back_by_the_pacing_budget():
    pair = make_pair(delay=0.02, seed=43, send_rate=1000)
    pair.connect()
    stream_frames(pair, 60, size=200, interval=0.01)
    pair.run(1.0)
    assert pair.client.peer_stats(pair.client_peer).messages_received == 60
