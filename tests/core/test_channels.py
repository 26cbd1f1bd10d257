"""Delivery modes: reliable_ordered, redundant, unreliable_sequenced, unreliable."""
import pytest

from relay_core import ChannelConfig, Endpoint, EndpointConfig, decode_packet
from conftest import make_pair, received

RELIABLE, REDUNDANT, SEQUENCED, UNRELIABLE = 0, 1, 2, 3


def exchange(pair, channel, count, interval=0.03, settle=3.0):
    sent = [b"m%05d" % i for i in range(count)]
    for payload in sent:
        assert pair.client.send(pair.client_peer, channel, payload)
        pair.run(interval)
    pair.run(settle)
    return sent, received(pair.server_events, channel)


@pytest.mark.parametrize("channel", [RELIABLE, REDUNDANT])
def test_reliable_modes_deliver_everything_once_in_order_under_loss(channel):
    pair = make_pair(loss=0.2, delay=0.02, jitter=0.02, seed=11)
    pair.connect()
    sent, got = exchange(pair, channel, 300)
    assert got == sent


def lose_first_of_two(channel, **config):
    """Send two messages 6 ms apart over a 20 ms link; the datagram with the first is lost.
    Returns the pair 20 ms after the second went out (one one-way delay)."""
    pair = make_pair(delay=0.02, seed=5, **config)
    pair.connect()
    pair.up.profile.loss = 1.0
    pair.client.send(pair.client_peer, channel, b"first")
    pair.run(0.001)
    pair.up.profile.loss = 0.0
    pair.run(0.005)
    pair.client.send(pair.client_peer, channel, b"second")
    pair.run(0.0215)
    return pair


def test_lost_frame_is_repaired_by_next_datagram_with_policy_always():
    pair = lose_first_of_two(REDUNDANT, redundancy_policy="always")
    # Both arrive with the second datagram, one send interval later: no RTO wait.
    assert received(pair.server_events, REDUNDANT) == [b"first", b"second"]
    assert pair.client.peer_stats(pair.client_peer).resends == 0


def test_first_loss_on_a_clean_link_is_resent_on_the_ack_gap_before_any_rto():
    # The RTO cannot be what repairs it; the link proves clean within the warm-up.
    pair = make_pair(delay=0.02, seed=5, rto_min=0.25, redundancy_loss_memory=16)
    pair.connect()
    for i in range(30):                     # RTT samples: the reorder window settles at 5 ms
        pair.client.send(pair.client_peer, REDUNDANT, b"warm-up")
        pair.run(0.03)
    pair.run(0.5)
    pair.server_events.clear()
    copies_before = pair.client.peer_stats(pair.client_peer).redundant_bytes
    pair.up.profile.loss = 1.0
    pair.client.send(pair.client_peer, REDUNDANT, b"first")
    pair.run(0.001)
    pair.up.profile.loss = 0.0
    pair.run(0.01)
    pair.client.send(pair.client_peer, REDUNDANT, b"second")
    pair.run(0.0215)
    # adaptive: a clean link carries no copies, so the second waits for the first...
    assert received(pair.server_events, REDUNDANT) == []
    # ...which goes again as soon as the ack of the second shows the gap (one round trip and
    # the ack delay after the second) and arrives 20 ms later: 75 ms after the first was sent.
    pair.run(0.005 + 0.02 + 0.02 + 0.002)
    assert received(pair.server_events, REDUNDANT) == [b"first", b"second"]
    snapshot = pair.client.channel_snapshot(pair.client_peer, REDUNDANT)
    assert snapshot["fast_resends"] == 1 and snapshot["resends"] == 0
    assert pair.client.peer_stats(pair.client_peer).redundant_bytes == copies_before


def test_reliable_ordered_repairs_a_loss_only_by_rto():
    pair = lose_first_of_two(RELIABLE)
    assert received(pair.server_events, RELIABLE) == []      # the second waits behind the first
    pair.run(0.5)
    assert received(pair.server_events, RELIABLE) == [b"first", b"second"]
    assert pair.client.peer_stats(pair.client_peer).resends >= 1


def test_redundant_copies_stay_within_the_redundancy_budget():
    pair = make_pair(delay=0.05, seed=5, redundancy_budget=100, redundancy_policy="always")
    pair.connect()
    sent_before = set()
    copies_seen = 0
    for i in range(40):                     # 40 unacked 20-byte messages during one RTT
        pair.client.send(pair.client_peer, REDUNDANT, bytes(20))
        pair.client.handle_timeout(pair.now)
        for datagram, _ in pair.client.datagrams_to_send(pair.now):
            records = decode_packet(datagram)["records"]
            copies = [r for r in records if r["msg_id"] in sent_before]
            assert sum(len(bytes.fromhex(r["payload"])) + 4 for r in copies) <= 100
            copies_seen += len(copies)
            sent_before.update(r["msg_id"] for r in records)
        pair.now += 0.001
    assert copies_seen > 40


def test_sequenced_channel_drops_anything_older_than_the_newest_delivered():
    pair = make_pair(delay=0.01, jitter=0.03, seed=9)       # jitter > spacing: reordering
    pair.connect()
    sent, got = exchange(pair, SEQUENCED, 300, interval=0.005, settle=0.5)
    indices = [sent.index(payload) for payload in got]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    assert len(got) < len(sent), "the reordering link should have made some arrive late"


def test_unreliable_channel_delivers_as_received_with_losses():
    pair = make_pair(loss=0.3, delay=0.01, jitter=0.03, seed=4)
    pair.connect()
    sent, got = exchange(pair, UNRELIABLE, 300, interval=0.005, settle=0.5)
    assert set(got) <= set(sent)
    assert 0.5 * len(sent) < len(got) < len(sent)
    indices = [sent.index(payload) for payload in got]
    assert indices != sorted(indices), "as received: reordering shows through"


def test_duplicated_datagrams_never_deliver_a_message_twice():
    pair = make_pair(duplicate=0.5, delay=0.01, jitter=0.02, seed=2)
    pair.connect()
    for channel in (RELIABLE, REDUNDANT, SEQUENCED):
        pair.server_events.clear()
        sent, got = exchange(pair, channel, 200, interval=0.003, settle=1.0)
        assert len(got) == len(set(got))


def test_channels_keep_independent_ordering():
    pair = make_pair(loss=0.1, delay=0.02, seed=8)
    pair.connect()
    for i in range(100):
        pair.client.send(pair.client_peer, RELIABLE, b"r%d" % i)
        pair.client.send(pair.client_peer, REDUNDANT, b"f%d" % i)
        pair.run(0.01)
    pair.run(3)
    assert received(pair.server_events, RELIABLE) == [b"r%d" % i for i in range(100)]
    assert received(pair.server_events, REDUNDANT) == [b"f%d" % i for i in range(100)]


def test_sender_never_uses_a_message_id_the_receiver_cannot_buffer():
    channels = (ChannelConfig("reliable_ordered", window=16),)
    pair = make_pair(delay=0.05, seed=1, channels=channels)
    pair.connect()
    for i in range(100):
        pair.client.send(pair.client_peer, 0, b"%d" % i)
    ids = []
    for _ in range(20):
        pair.now += 0.001
        for datagram, _ in pair.client.datagrams_to_send(pair.now):
            ids += [r["msg_id"] for r in decode_packet(datagram)["records"]]
    assert ids and max(ids) < 16
    pair.run(3)
    assert received(pair.server_events, 0) == [b"%d" % i for i in range(100)]


def test_send_queue_is_bounded():
    channels = (ChannelConfig("reliable_ordered", window=8, max_pending=10),)
    endpoint = Endpoint(EndpointConfig(channels=channels))
    peer = endpoint.connect(("127.0.0.1", 1), 0.0)
    accepted = [endpoint.send(peer, 0, b"x") for _ in range(30)]
    assert accepted == [True] * (8 + 10) + [False] * 12     # the window's 8, then 10 behind it
    assert endpoint.channel_snapshot(peer, 0)["pending"] == 10


def test_send_rejects_programming_errors_with_clear_messages():
    endpoint = Endpoint(EndpointConfig())
    peer = endpoint.connect(("127.0.0.1", 1), 0.0)
    with pytest.raises(ValueError, match="channel 9 does not exist"):
        endpoint.send(peer, 9, b"x")
    with pytest.raises(ValueError, match="exceeds one datagram"):
        endpoint.send(peer, UNRELIABLE, bytes(5000))
    with pytest.raises(ValueError, match="max_message_size"):
        endpoint.send(peer, RELIABLE, bytes(300 * 1024))
    assert endpoint.send(12345, RELIABLE, b"x") is False     # unknown peer: not an exception


def test_window_storage_stays_small_on_a_clean_link_and_grows_when_messages_pile_up():
    # Per-peer memory: a stream with a frame or two unacked keeps the smallest storage, and a
    # receiver that only ever sees messages in order holds none; a backlog grows both (and the
    # sent-unit ring) without losing or reordering a message.
    pair = make_pair(delay=0.02, jitter=0.01, seed=3, sent_unit_capacity=4096)
    pair.connect()
    sent, got = exchange(pair, REDUNDANT, 60, settle=0.5)
    assert got == sent
    client = pair.client.channel_snapshot(pair.client_peer, REDUNDANT)
    server = pair.server.channel_snapshot(pair.server_peer, REDUNDANT)
    assert client["slots"] == 8 and client["sent_unit_capacity"] == 32
    assert server["receive_slots"] == 0

    pair.server_events.clear()
    pair.up.profile.loss = 0.2
    burst = [b"b%05d" % i for i in range(400)]
    for payload in burst:
        assert pair.client.send(pair.client_peer, REDUNDANT, payload)
    pair.run(0.3)
    client = pair.client.channel_snapshot(pair.client_peer, REDUNDANT)
    assert client["slots"] == 256                       # the whole window is in flight
    assert client["sent_unit_capacity"] > 32
    assert pair.server.channel_snapshot(pair.server_peer, REDUNDANT)["receive_slots"] > 8
    pair.up.profile.loss = 0.0
    pair.run(5.0)
    assert received(pair.server_events, REDUNDANT) == burst


def test_sent_unit_ring_never_grows_past_its_limit_and_acks_still_repair():
    # At the limit the ring overwrites; acks for packets whose units are gone are ignored and
    # those messages are repaired by RTO: still everything once, in order.
    pair = make_pair(loss=0.2, delay=0.03, jitter=0.02, seed=9, sent_unit_capacity=256,
                     redundancy_policy="always")
    pair.connect()
    burst = [b"x%04d" % i for i in range(300)]
    for payload in burst:
        assert pair.client.send(pair.client_peer, RELIABLE, payload)
        assert pair.client.send(pair.client_peer, REDUNDANT, payload)
    pair.run(0.5)
    assert pair.client.channel_snapshot(pair.client_peer, REDUNDANT)["sent_unit_capacity"] == 256
    pair.run(10.0)
    assert received(pair.server_events, RELIABLE) == burst
    assert received(pair.server_events, REDUNDANT) == burst


def test_channels_past_the_first_four_work_like_the_first():
    """A peer reaches its first INLINE_CHANNELS channels without its channel lists; the rest
    through them. Eight channels, every mode twice, under loss: each delivers as its mode says."""
    modes = ("reliable_ordered", "redundant", "unreliable_sequenced", "unreliable")
    channels = tuple(ChannelConfig(modes[i % 4], window=16) for i in range(8))
    pair = make_pair(loss=0.2, delay=0.02, seed=21, channels=channels)
    pair.connect()
    sent = {channel: [b"c%d-%03d" % (channel, i) for i in range(60)] for channel in range(8)}
    for i in range(60):
        for channel in range(8):
            assert pair.client.send(pair.client_peer, channel, sent[channel][i])
            assert pair.server.send(pair.server_peer, channel, sent[channel][i])
        pair.run(0.03)
    pair.run(3.0)
    for channel in range(8):
        for events in (pair.server_events, pair.client_events):
            got = received(events, channel)
            if modes[channel % 4] in ("reliable_ordered", "redundant"):
                assert got == sent[channel], channel
            else:
                assert 0 < len(got) < 60 and set(got) <= set(sent[channel]), channel
    stats = pair.client.peer_stats(pair.client_peer)
    assert stats.redundant_bytes > 0


def test_a_send_window_holds_each_payload_once_and_lets_go_of_it():
    """The send window keeps its payloads as C references: acked ones are released, and
    whatever is still queued or in flight goes with the endpoint."""
    import gc
    import sys

    whole = b"w" * 300 + b"counted"
    fragmented = b"f" * 5000 + b"counted"
    before = sys.getrefcount(whole), sys.getrefcount(fragmented)
    pair = make_pair(loss=0.2, seed=3)
    pair.connect()
    for i in range(120):
        pair.server.send(pair.server_peer, REDUNDANT, whole)
        pair.server.send(pair.server_peer, RELIABLE, whole)
        if i % 20 == 0:
            pair.server.send(pair.server_peer, RELIABLE, fragmented)
        pair.run(0.03)
    pair.run(5.0)
    assert (sys.getrefcount(whole), sys.getrefcount(fragmented)) == before
    for _ in range(50):
        pair.server.send(pair.server_peer, REDUNDANT, whole)
    pair.run(0.001)
    assert sys.getrefcount(whole) == before[0] + 50
    del pair
    gc.collect()
    assert sys.getrefcount(whole) == before[0]
