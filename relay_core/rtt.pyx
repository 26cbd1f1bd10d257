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


cdef class RttEstimator:
    def __init__(self, double initial_rto, double rto_min, double rto_max, double peer_ack_delay=0.0):
        self.rto_min = rto_min
        self.rto_max = rto_max
        self.rto = min(max(initial_rto, rto_min), rto_max)
        self.srtt = 0.0
        self.rttvar = 0.0
        self.has_sample = False
        self.peer_ack_delay = peer_ack_delay

    cpdef void add_sample(self, double rtt) noexcept:
        if rtt < 0.0:
            return
        if not self.has_sample:
            self.srtt = rtt
            self.rttvar = rtt / 2.0
            self.has_sample = True
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.srtt + max(4.0 * self.rttvar, GRANULARITY) + self.peer_ack_delay,
                           self.rto_min), self.rto_max)
