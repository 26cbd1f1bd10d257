# The RTT estimate a peer keeps inline (one of its hot fields, not an object of its own):
# rtt_init sets it up, rtt_add_sample takes a sample. RttEstimator wraps one for Python callers.
cdef struct Rtt:
    double srtt                 # smoothed round trip, seconds
    double rttvar               # smoothed mean deviation, seconds
    double rto                  # retransmission timeout for a first send, seconds
    bint has_sample
    double peer_ack_delay       # longest the peer may hold an ack, seconds

cdef struct RttLimits:
    # The RTO's floor and ceiling (EndpointConfig's, shared by an endpoint's peers).
    double rto_min
    double rto_max

cdef void rtt_init(Rtt* r, const RttLimits* limits, double initial_rto,
                   double peer_ack_delay) noexcept nogil
cdef void rtt_add_sample(Rtt* r, const RttLimits* limits, double sample) noexcept nogil


cdef class RttEstimator:
    cdef Rtt state
    cdef RttLimits limits
