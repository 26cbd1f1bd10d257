"""Smoothed RTT, RTT variance and the retransmission timeout derived from them.

The estimator follows RFC 6298 (alpha 1/8, beta 1/4, RTO = SRTT + 4 * RTTVAR) with a configurable
floor and ceiling. The floor keeps a LAN peer from resending on every scheduling hiccup; the
ceiling bounds the first resend of a message. Per-message backoff (x1.5 per resend, as measured
in the frame-sync thesis to beat ENet's doubling under loss) lives with the message, not here.
"""

cdef class RttEstimator:
    def __init__(self, double initial_rto, double rto_min, double rto_max):
        self.rto_min = rto_min
        self.rto_max = rto_max
        self.rto = min(max(initial_rto, rto_min), rto_max)
        self.srtt = 0.0
        self.rttvar = 0.0
        self.has_sample = False

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
        self.rto = min(max(self.srtt + 4.0 * self.rttvar, self.rto_min), self.rto_max)
