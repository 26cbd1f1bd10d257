"""RTT, RTT variance, RTO floor/ceiling, per-message x1.5 backoff and the resend limits."""
import pytest

from relay_core import EndpointConfig, PeerDisconnected, decode_packet
from relay_core.rtt import RttEstimator
from conftest import make_pair


def test_rtt_estimate_converges_to_the_measured_round_trip():
    rtt = RttEstimator(0.2, 0.03, 1.0)
    for _ in range(50):
        rtt.add_sample(0.080)
    assert rtt.srtt == pytest.approx(0.080, abs=1e-4)
    assert rtt.rttvar < 0.002
    assert rtt.rto == pytest.approx(max(0.03, rtt.srtt + max(4 * rtt.rttvar, 0.002)))


def test_rto_allows_for_the_time_the_peer_may_hold_an_ack():
    rtt = RttEstimator(0.2, 0.01, 1.0, 0.033)
    for _ in range(100):
        rtt.add_sample(0.040)       # a steady path: the variance decays towards zero
    assert rtt.rto == pytest.approx(0.040 + 0.002 + 0.033, abs=1e-3)


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.05])
@pytest.mark.parametrize("ack_delay, max_packets_per_message", [(0.005, 2.05), (0.034, 1.05)])
def test_a_steady_lossless_stream_causes_no_spurious_resends(delay, ack_delay, max_packets_per_message):
    """A 30 Hz stream both ways: acks wait up to ack_delay for data to ride on, and never
    ping-pong. With ack_delay above the send interval every ack rides on the next message."""
    pair = make_pair(delay=delay, seed=8, ack_delay=ack_delay)
    pair.connect()
    for i in range(300):
        pair.server.send(pair.server_peer, 1, b"frame%d" % i)
        pair.client.send(pair.client_peer, 1, b"input%d" % i)
        pair.run(1 / 30)
    for endpoint, peer in ((pair.server, pair.server_peer), (pair.client, pair.client_peer)):
        stats = endpoint.peer_stats(peer)
        assert stats.resends == 0, stats
        assert stats.packets_sent <= 300 * max_packets_per_message, stats


def resend_times(pair, payload=b"lost forever"):
    """Send one reliable message over a dead downlink; return the times it goes out again."""
    pair.up.profile.loss = 1.0
    pair.client.send(pair.client_peer, 0, payload)
    times = []
    while pair.now < 3.0:
        pair.now += 0.001
        pair.client.handle_timeout(pair.now)
        for datagram, _ in pair.client.datagrams_to_send(pair.now):
            packet = decode_packet(datagram)
            if packet["type"] == "data" and any(r.get("payload") == payload.hex()
                                                for r in packet["records"]):
                times.append(pair.now)
    return times


def test_each_resend_multiplies_that_messages_rto_by_one_and_a_half():
    pair = make_pair(seed=1, rto_initial=0.1, rto_min=0.1, rto_max=0.1, rto_limit=100.0,
                     max_resends=100, peer_timeout=50.0)
    pair.connect()
    times = resend_times(pair)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) >= 5
    for earlier, later in zip(gaps, gaps[1:5]):
        assert later == pytest.approx(earlier * 1.5, abs=0.0021)


def test_peer_is_timed_out_past_the_resend_limit():
    pair = make_pair(seed=2, max_resends=3, rto_limit=100.0, peer_timeout=50.0,
                     heartbeat_interval=10.0)
    pair.connect()
    pair.up.profile.loss = 1.0
    pair.down.profile.loss = 1.0
    pair.client.send(pair.client_peer, 0, b"never acked")
    pair.run(5.0)
    reasons = [e.reason for e in pair.client_events if isinstance(e, PeerDisconnected)]
    assert reasons == ["resend_limit"]
    assert pair.client.peer_count == 0


def test_peer_is_timed_out_past_the_rto_limit():
    pair = make_pair(seed=2, max_resends=1000, rto_limit=0.5, peer_timeout=50.0,
                     heartbeat_interval=10.0)
    pair.connect()
    pair.up.profile.loss = 1.0
    pair.client.send(pair.client_peer, 0, b"never acked")
    pair.run(5.0)
    reasons = [e.reason for e in pair.client_events if isinstance(e, PeerDisconnected)]
    assert reasons == ["resend_limit"]


def test_config_rejects_a_floor_above_the_ceiling():
    from relay_core import ConfigError

    with pytest.raises(ConfigError, match="rto_min"):
        EndpointConfig(rto_min=2.0, rto_max=1.0).validate()


def test_each_side_allows_for_the_ack_delay_the_other_announced():
    server = EndpointConfig(accept_connections=True, seed=1, ack_delay=0.034)
    client = EndpointConfig(seed=2, ack_delay=0.005)
    from relay_core.simlink import LinkedPair, LinkProfile

    pair = LinkedPair(server, client, LinkProfile(delay=0.02), LinkProfile(delay=0.02), seed=1)
    pair.connect()
    for i in range(200):
        pair.client.send(pair.client_peer, 1, b"input%d" % i)
        pair.server.send(pair.server_peer, 1, b"frame%d" % i)
        pair.run(1 / 30)
    client_rto = pair.client.peer_stats(pair.client_peer).rto
    server_rto = pair.server.peer_stats(pair.server_peer).rto
    assert client_rto == pytest.approx(0.040 + 0.002 + 0.034, abs=0.003)
    assert server_rto == pytest.approx(0.040 + 0.002 + 0.005, abs=0.003)
    assert pair.client.peer_stats(pair.client_peer).resends == 0
