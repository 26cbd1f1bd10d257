"""The redundancy policy of redundant channels: 'adaptive' (default) and 'always'.

docs/PROTOCOL.md 11.5 (ack-gap loss detection) and 12.4 (what a redundant channel writes).
"""
from collections import Counter

import pytest

from relay_core import ConfigError, EndpointConfig, decode_packet
from conftest import make_pair, received

REDUNDANT = 1


def stream(pair, count, interval=1 / 30, tag=b"f", size=20, both_ways=False):
    """Server sends ``count`` frames (and the client as many inputs with both_ways)."""
    sent = []
    for i in range(count):
        payload = tag + b"%05d" % i + bytes(size)
        assert pair.server.send(pair.server_peer, REDUNDANT, payload)
        if both_ways:
            assert pair.client.send(pair.client_peer, REDUNDANT, payload)
        sent.append(payload)
        pair.run(interval)
    return sent


def snapshot(endpoint, peer):
    return endpoint.channel_snapshot(peer, REDUNDANT)


def test_a_clean_link_carries_no_copies_once_it_has_proved_clean():
    pair = make_pair(delay=0.03, jitter=0.01, seed=71)
    pair.connect()
    stream(pair, 200)                       # more than redundancy_loss_memory (128) packets
    before = pair.server.peer_stats(pair.server_peer)
    sent = stream(pair, 300)
    pair.run(1.0)
    after = pair.server.peer_stats(pair.server_peer)
    assert after.redundant_bytes == before.redundant_bytes
    assert snapshot(pair.server, pair.server_peer)["fast_resends"] == 0
    assert received(pair.client_events, REDUNDANT)[-300:] == sent
    # The same link under "always": every datagram repeats the ~2 frames in flight.
    always = make_pair(delay=0.03, jitter=0.01, seed=71, redundancy_policy="always")
    always.connect()
    stream(always, 200)
    before = always.server.peer_stats(always.server_peer).redundant_bytes
    stream(always, 300)
    assert always.server.peer_stats(always.server_peer).redundant_bytes - before > 300 * 25


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("loss", [0.1, 0.25])
def test_under_loss_every_message_is_delivered_exactly_once_in_order_both_ways(seed, loss):
    pair = make_pair(loss=loss, delay=0.03, jitter=0.02, seed=seed)
    pair.connect(timeout=20.0)
    sent = stream(pair, 300, both_ways=True)
    pair.run(5.0)
    assert received(pair.client_events, REDUNDANT) == sent
    assert received(pair.server_events, REDUNDANT) == sent
    stats = pair.server.peer_stats(pair.server_peer)
    assert stats.redundant_bytes > 0 and stats.queued_messages == 0


def warmed_clean_pair(**config):
    """A pair over a 20 ms jitter-free link that has proved clean: no copies, settled RTT."""
    pair = make_pair(delay=0.02, seed=5, redundancy_loss_memory=16, **config)
    pair.connect()
    for _ in range(40):
        pair.client.send(pair.client_peer, REDUNDANT, b"warm-up")
        pair.run(0.03)
    pair.run(0.5)
    pair.server_events.clear()
    return pair


def client_state(pair):
    return snapshot(pair.client, pair.client_peer)


def send_two(pair, spacing, first_loss=0.0, first_extra_delay=0.0):
    """The client sends A, then B ``spacing`` seconds later; A's datagram is lost with
    probability first_loss or held back first_extra_delay seconds."""
    link = pair.up.profile
    link.loss, link.reorder, link.reorder_delay = first_loss, 1.0, first_extra_delay
    pair.client.send(pair.client_peer, REDUNDANT, b"A")
    pair.run(0.001)
    link.loss, link.reorder = 0.0, 0.0
    pair.run(spacing - 0.001)
    pair.client.send(pair.client_peer, REDUNDANT, b"B")


def test_ack_gap_resends_a_lost_message_at_once():
    pair = warmed_clean_pair(ack_delay=0.0, rto_min=0.5)    # the RTO cannot be what repairs it
    send_two(pair, 0.010, first_loss=1.0)
    pair.run(0.020 + 0.020 + 0.002)         # B arrives, its ack (showing A missing) comes back
    assert snapshot(pair.client, pair.client_peer)["fast_resends"] == 1
    pair.run(0.021)                         # the resend arrives
    assert received(pair.server_events, REDUNDANT) == [b"A", b"B"]
    assert pair.client.peer_stats(pair.client_peer).resends == 0


def test_reordering_within_the_reorder_window_is_not_taken_for_loss():
    pair = warmed_clean_pair(ack_delay=0.0, rto_min=0.5)
    copies_before = client_state(pair)["redundant_bytes"]
    # A is held back 4 ms, so B (sent 3 ms after it, inside the 5 ms reorder_tolerance) arrives
    # first and the server's immediate ack of B shows A missing.
    send_two(pair, 0.003, first_extra_delay=0.004)
    pair.run(0.2)
    assert received(pair.server_events, REDUNDANT) == [b"A", b"B"]
    state = client_state(pair)
    assert state["fast_resends"] == 0 and state["resends"] == 0
    # Not judged lost, so the link still counts as clean: no copies started.
    assert state["redundant_bytes"] == copies_before


def test_reordering_beyond_the_window_is_judged_lost_and_costs_one_needless_resend():
    pair = warmed_clean_pair(ack_delay=0.0, rto_min=0.5)
    send_two(pair, 0.010, first_extra_delay=0.030)      # A arrives 20 ms after B
    pair.run(0.2)
    assert received(pair.server_events, REDUNDANT) == [b"A", b"B"]   # delivered once
    assert snapshot(pair.client, pair.client_peer)["fast_resends"] == 1
    assert pair.server.peer_stats(pair.server_peer).duplicate_messages >= 1


def test_a_wider_reorder_tolerance_absorbs_the_same_reordering():
    pair = warmed_clean_pair(ack_delay=0.0, rto_min=0.5, reorder_tolerance=0.05)
    send_two(pair, 0.010, first_extra_delay=0.030)
    pair.run(0.2)
    assert received(pair.server_events, REDUNDANT) == [b"A", b"B"]
    assert snapshot(pair.client, pair.client_peer)["fast_resends"] == 0


def carriers_per_message(policy, copies=2, loss=0.0, seed=81, copy_wait=0.0, **config):
    """Client sends 100 messages 10 ms apart over a 200 ms RTT link (about 20 unacked at any
    time); returns how many datagrams carried each message id, and the client's snapshot."""
    pair = make_pair(delay=0.1, loss=loss, seed=seed, redundancy_policy=policy,
                     redundancy_copies=copies, redundancy_copy_wait=copy_wait, **config)
    pair.connect()
    carried = Counter()
    most_copies = 0
    for i in range(100):
        pair.client.send(pair.client_peer, REDUNDANT, b"m%03d" % i)
        for _ in range(10):
            pair.now += 0.001
            now = pair.now
            for datagram in pair.up.arrivals(now):
                pair.server.receive(datagram, pair.client_address, now)
            for datagram in pair.down.arrivals(now):
                pair.client.receive(datagram, pair.SERVER_ADDRESS, now)
            for endpoint, link in ((pair.server, pair.down), (pair.client, pair.up)):
                endpoint.handle_timeout(now)
                for datagram, _ in endpoint.datagrams_to_send(now):
                    if endpoint is pair.client:
                        for record in decode_packet(datagram)["records"]:
                            carried[record["msg_id"]] += 1
                    link.send(datagram, now)
            state = snapshot(pair.client, pair.client_peer)
            most_copies = max([most_copies] + [m["copies"] for m in state["messages"]])
    return carried, most_copies, snapshot(pair.client, pair.client_peer)


def test_copies_per_message_are_bounded_by_redundancy_copies():
    # A new connection counts as losing until it proves clean, so copies are on here.
    for copies in (1, 2, 3):
        carried, most, state = carriers_per_message("adaptive", copies)
        assert state["resends"] == state["fast_resends"] == 0
        assert max(carried.values()) == 1 + copies and most == copies
    carried, most, _ = carriers_per_message("always")
    assert max(carried.values()) > 10       # "always": every datagram until acked


def test_later_copies_wait_for_an_srtt_and_then_go_only_to_the_unacked():
    # redundancy_copy_wait 1 (default): the second copy would be due 205 ms (one SRTT and the
    # peer's ack delay) after the send, when the ack of a clean link is back: only the first
    # copy goes.
    carried, most, state = carriers_per_message("adaptive", 2, copy_wait=1.0)
    # (Message 0 goes before the first RTT sample, when the wait is one initial RTO.)
    assert max(n for msg_id, n in carried.items() if msg_id > 0) == 2


def test_under_loss_the_copies_since_a_send_stay_bounded():
    # The bound is the lossy mode's (the controller's bursty mode copies until acked): 40 %
    # independent loss can look bursty for a moment, which a threshold of 0.99 rules out.
    _, most, state = carriers_per_message("adaptive", 2, loss=0.4, seed=82, burst_threshold=0.99)
    assert most == 2
    assert state["fast_resends"] > 0        # some messages lost with all their copies


@pytest.mark.parametrize("field,value", [
    ("redundancy_policy", "sometimes"), ("redundancy_copies", 0), ("redundancy_copies", 17),
    ("redundancy_copy_wait", -0.5), ("redundancy_copy_wait", float("nan")),
    ("redundancy_loss_memory", 0), ("reorder_tolerance", -0.001), ("reorder_tolerance", 2.0),
])
def test_bad_policy_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        EndpointConfig(**{field: value}).validate()


def test_a_message_whose_later_copy_is_still_in_flight_is_not_resent():
    # Copies are on (a connection starts out losing; the warm-up is shorter than
    # redundancy_loss_memory), the reorder window has settled at 5 ms.
    def run(second_lost):
        pair = make_pair(delay=0.02, seed=5, ack_delay=0.0, rto_min=0.5)
        pair.connect()
        for _ in range(30):
            pair.client.send(pair.client_peer, REDUNDANT, b"warm-up")
            pair.run(0.03)
        pair.run(0.3)
        pair.server_events.clear()
        link = pair.up.profile
        link.loss = 1.0                                   # packet 1: A, lost
        pair.client.send(pair.client_peer, REDUNDANT, b"A")
        pair.run(0.001)
        link.loss = 0.0
        pair.run(0.009)
        # packet 2: B and the first copy of A; held back 4 ms (or lost)
        link.loss, link.reorder, link.reorder_delay = (1.0 if second_lost else 0.0), 1.0, 0.004
        pair.client.send(pair.client_peer, REDUNDANT, b"B")
        pair.run(0.001)
        link.loss = link.reorder = 0.0
        pair.run(0.002)
        pair.client.send(pair.client_peer, REDUNDANT, b"C")   # packet 3, 3 ms after packet 2
        pair.run(0.02)
        pair.client.send(pair.client_peer, REDUNDANT, b"D")   # packet 4: judges packet 2
        pair.run(0.2)
        return pair

    # The ack of packet 3 arrives first and shows packets 1 and 2 missing. Packet 1 is judged
    # lost, but A's latest carrier is packet 2, sent inside the reorder window of packet 3: A
    # waits for packet 2's fate, which is an ack.
    pair = run(second_lost=False)
    assert received(pair.server_events, REDUNDANT) == [b"A", b"B", b"C", b"D"]
    assert client_state(pair)["fast_resends"] == 0 and client_state(pair)["resends"] == 0
    # With packet 2 lost as well, its loss, judged on the ack of packet 4, resends A (B rode
    # packet 3 as a copy and is acknowledged).
    pair = run(second_lost=True)
    assert received(pair.server_events, REDUNDANT) == [b"A", b"B", b"C", b"D"]
    assert client_state(pair)["fast_resends"] == 1 and client_state(pair)["resends"] == 0


def test_ack_gap_resends_count_towards_max_resends():
    from relay_core import PeerDisconnected

    pair = make_pair(delay=0.02, seed=9, max_resends=3, rto_min=0.5, rto_max=1.0)
    pair.connect()
    send = pair.up.send
    # A path that loses every datagram carrying this one message, and nothing else: the peer
    # keeps acknowledging later packets, so only the resend limit can end it.
    pair.up.send = lambda datagram, now: None if b"doomed" in datagram else send(datagram, now)
    pair.client.send(pair.client_peer, REDUNDANT, b"doomed")
    for _ in range(100):
        pair.client.send(pair.client_peer, REDUNDANT, b"other")
        pair.run(0.03)
        if any(isinstance(e, PeerDisconnected) for e in pair.client_events):
            break
    gone = [e for e in pair.client_events if isinstance(e, PeerDisconnected)]
    assert gone and gone[0].reason == "resend_limit"
    assert pair.now < 2.5       # long before RTO backoff alone would have got there
