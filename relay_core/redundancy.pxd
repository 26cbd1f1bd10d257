# The redundancy controller: what a peer's acks and RTT say about the path, and so how
# `redundant` channels copy. A plain struct inside each Peer (no allocation of its own); the
# rules are in redundancy.pyx and docs/PROTOCOL.md, section 12.5.

cdef enum:
    LINK_CLEAN = 0          # no recent loss: no copies
    LINK_LOSSY = 1          # losses independent of each other: a copy in the next datagram,
                            #   later ones only where an ack is overdue
    LINK_BURSTY = 2         # losses come in runs: every datagram carries every unacked message
    LINK_CONGESTED = 3      # the RTT stands above the path's floor: a queue is filling, cut copies
    LINK_MODES = 4

cdef struct LinkState:
    # The doubles, then the counters and flags: 88 bytes, no padding.
    # Loss pattern: our datagrams as the acks judge them, in send order.
    double loss                 # EWMA of "lost" over every judged datagram
    double loss_after_loss      # EWMA of "lost" over datagrams judged right after a lost one
    # Delay: the path's floor, and how far the smoothed RTT stands above it.
    double min_rtt              # least RTT sample of this window and the last (-1: none yet)
    double window_min           # least sample of the current window
    double window_start
    double queue_delay          # the last RTT sample over min_rtt, seconds
    double congested_until      # congested mode holds until then
    unsigned long long congestion_episodes
    bint previous_lost
    unsigned int judged         # datagrams judged so far (capped), for the averages' start
    unsigned int judged_after_loss
    unsigned int since_loss     # judged received in a row since the last one lost
    int high_samples            # samples in a row whose queue_delay passed the threshold
    int mode                    # LINK_*: as of the last link_update

cdef struct LinkSettings:
    # EndpointConfig's, shared by an endpoint's peers (peer.PeerSettings).
    unsigned int loss_memory
    double burst_threshold
    double congestion_delay
    double congestion_hold
    double min_rtt_window

cdef void link_settings(LinkSettings* c, unsigned int loss_memory, double burst_threshold,
                        double congestion_delay, double congestion_hold,
                        double min_rtt_window) noexcept nogil
cdef void link_init(LinkState* s, double now) noexcept nogil
cdef void link_judged(LinkState* s, const LinkSettings* c, bint lost) noexcept nogil
cdef void link_rtt(LinkState* s, const LinkSettings* c, double sample, double srtt,
                   double now) noexcept nogil
cdef int link_update(LinkState* s, const LinkSettings* c, double now) noexcept nogil
cdef double link_burst_length(const LinkState* s) noexcept nogil
