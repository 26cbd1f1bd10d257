cdef class RttEstimator:
    cdef readonly double srtt          # smoothed round trip, seconds
    cdef readonly double rttvar        # smoothed mean deviation, seconds
    cdef readonly double rto           # retransmission timeout for a first send, seconds
    cdef readonly bint has_sample
    cdef readonly double rto_min
    cdef readonly double rto_max
    cdef public double peer_ack_delay  # longest the peer may hold an ack, seconds

    cpdef void add_sample(self, double rtt) noexcept
