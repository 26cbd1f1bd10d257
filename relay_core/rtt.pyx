"""Smoothed RTT, RTT variance and the retransmission timeout derived from them.

The estimator follows RFC 6298 (alpha 1/8, beta 1/4) for SRTT and RTTVAR. RTT samples exclude the
time the peer held our packet before answering (it is echoed back), so like QUIC's PTO the RTO
adds that allowance back: RTO = SRTT + max(4 * RTTVAR, granularity) + peer_ack_delay, clamped to
a configurable floor and ceiling. Without the allowance a steady path drives RTTVAR to zero and
every ack that waits for the peer's next datagram arrives after the RTO. The floor keeps a LAN peer from resending on every scheduling hiccup; the
ceiling bounds the first resend of a message. Per-message backoff (x1.5 per resend, as measured
in the frame-sync thesis to beat ENet's doubling under loss) lives with the message, not here.
"""

# Clock and timer granularity: the variance term never drops below it.
cdef double GRANULARITY = 0.002


cdef void rtt_init(Rtt* r, const RttLimits* limits, double initial_rto,
                   double peer_ack_delay) noexcept nogil:
    r.rto = min(max(initial_rto, limits.rto_min), limits.rto_max)
    r.srtt = 0.0
    r.rttvar = 0.0
    r.has_sample = False
    r.peer_ack_delay = peer_ack_delay


cdef void rtt_add_sample(Rtt* r, const RttLimits* limits, double sample) noexcept nogil:
    if sample < 0.0:
        return
    if not r.has_sample:
        r.srtt = sample
        r.rttvar = sample / 2.0
        r.has_sample = True
    else:
        r.rttvar = 0.75 * r.rttvar + 0.25 * abs(r.srtt - sample)
        r.srtt = 0.875 * r.srtt + 0.125 * sample
    r.rto = min(max(r.srtt + max(4.0 * r.rttvar, GRANULARITY) + r.peer_ack_delay, limits.rto_min),
                limits.rto_max)


cdef class RttEstimator:
    """One Rtt, for Python callers (tests): the same functions a peer uses."""

    def __init__(self, double initial_rto, double rto_min, double rto_max, double peer_ack_delay=0.0):
        self.limits.rto_min = rto_min
        self.limits.rto_max = rto_max
        rtt_init(&self.state, &self.limits, initial_rto, peer_ack_delay)

    def add_sample(self, double rtt):
        rtt_add_sample(&self.state, &self.limits, rtt)

    @property
    def srtt(self):
        return self.state.srtt

    @property
    def rttvar(self):
        return self.state.rttvar

    @property
    def rto(self):
        return self.state.rto

    @property
    def has_sample(self):
        return self.state.has_sample
