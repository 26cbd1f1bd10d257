# cython: language_level=3
"""The redundancy controller (docs/PROTOCOL.md, section 12.5).

A peer copies unacked messages of its ``redundant`` channels into later datagrams so that a lost
datagram costs nothing. How many copies pay depends on the path, which the controller reads from
two signals the peer already has:

* the acks, which judge each of our datagrams received or lost in send order: the loss rate,
  and the loss rate right after a loss. Independent losses give the two alike; losses that
  come in runs (a fading radio, a handover, a full queue) make the second far higher, and then
  a copy in the next datagram is lost with the original;
* the RTT samples: their floor over the last two windows is the path's own delay, and a
  smoothed RTT standing well above it means a queue is filling somewhere. A path that is only
  long keeps its floor high and is not congested: there a repair costs a whole round trip, so
  copies are worth more, not less.

From these, one of four modes (``LINK_*`` in redundancy.pxd); ``Peer.flush`` turns the mode
into copies. Congestion outranks loss: copies into a full queue only lengthen it.
"""
from libc.math cimport INFINITY

# EWMA weights: the loss rate over ~64 judged datagrams; the loss rate after a loss over ~8
# losses (a few seconds at a tick rate of 30 Hz and 10 % loss).
cdef double LOSS_ALPHA = 1.0 / 64.0
cdef double AFTER_LOSS_ALPHA = 1.0 / 8.0
# RTT samples in a row above the congestion threshold that make the path congested.
cdef int CONGESTION_SAMPLES = 2

MODE_NAMES = ("clean", "lossy", "bursty", "congested")


cdef void link_settings(LinkSettings* c, unsigned int loss_memory, double burst_threshold,
                        double congestion_delay, double congestion_hold,
                        double min_rtt_window) noexcept nogil:
    c.loss_memory = loss_memory
    c.burst_threshold = burst_threshold
    c.congestion_delay = congestion_delay
    c.congestion_hold = congestion_hold
    c.min_rtt_window = min_rtt_window


cdef void link_init(LinkState* s, double now) noexcept nogil:
    s.loss = 0.0
    s.loss_after_loss = 0.0
    s.previous_lost = False
    s.judged = 0
    s.judged_after_loss = 0
    # A new connection has shown nothing yet: copies until it has proved clean.
    s.since_loss = 0
    s.min_rtt = -1.0
    s.window_min = INFINITY
    s.window_start = now
    s.queue_delay = 0.0
    s.high_samples = 0
    s.congested_until = -1.0
    s.congestion_episodes = 0
    s.mode = LINK_LOSSY


cdef void link_judged(LinkState* s, const LinkSettings* c, bint lost) noexcept nogil:
    """One of our datagrams judged by the acks (in send order): received or lost. Each average
    is a plain mean until it has as many samples as its EWMA remembers, so the two start out
    comparable (a slow loss rate beside a quick one would make any early loss look bursty)."""
    cdef double value = 1.0 if lost else 0.0
    if s.judged < 1000000:
        s.judged += 1
    s.loss += max(LOSS_ALPHA, 1.0 / s.judged) * (value - s.loss)
    if s.previous_lost:
        if s.judged_after_loss < 1000000:
            s.judged_after_loss += 1
        s.loss_after_loss += max(AFTER_LOSS_ALPHA, 1.0 / s.judged_after_loss) * (value - s.loss_after_loss)
    s.previous_lost = lost
    if lost:
        s.since_loss = 0
    elif s.since_loss < c.loss_memory:
        s.since_loss += 1


cdef void link_rtt(LinkState* s, const LinkSettings* c, double sample, double srtt,
                   double now) noexcept nogil:
    """An RTT sample, and the smoothed RTT after it."""
    cdef double threshold
    if now - s.window_start >= c.min_rtt_window:
        # The floor forgets a path that got longer (a new route) within two windows.
        s.min_rtt = s.window_min if s.window_min < INFINITY else s.min_rtt
        s.window_min = INFINITY
        s.window_start = now
    if sample < s.window_min:
        s.window_min = sample
    if s.min_rtt < 0.0 or sample < s.min_rtt:
        s.min_rtt = sample
    s.queue_delay = sample - s.min_rtt
    # Jitter moves single samples around the floor; a filling queue lifts sample after sample
    # past both a fixed margin and the floor itself (a queue longer than the path).
    threshold = c.congestion_delay if c.congestion_delay > s.min_rtt else s.min_rtt
    if s.queue_delay <= threshold:
        s.high_samples = 0
        return
    s.high_samples += 1
    if s.high_samples >= CONGESTION_SAMPLES:
        if s.congested_until < now:
            s.congestion_episodes += 1
        s.congested_until = now + c.congestion_hold


cdef int link_update(LinkState* s, const LinkSettings* c, double now) noexcept nogil:
    """The mode for ``now``, also kept in ``s.mode``."""
    if now < s.congested_until:
        s.mode = LINK_CONGESTED
    elif s.since_loss >= c.loss_memory:
        s.mode = LINK_CLEAN
    elif s.loss_after_loss - s.loss >= c.burst_threshold:
        s.mode = LINK_BURSTY
    else:
        s.mode = LINK_LOSSY
    return s.mode


cdef double link_burst_length(const LinkState* s) noexcept nogil:
    """Mean run of lost datagrams the estimate implies: 1 / (1 - P(lost after a loss))."""
    return 1.0 / (1.0 - s.loss_after_loss) if s.loss_after_loss < 0.999 else 1000.0


cdef class LinkModel:
    """The controller alone, driven from Python: for tests and the docs' examples."""
    cdef LinkState state
    cdef LinkSettings settings

    def __init__(self, unsigned int loss_memory=128, double burst_threshold=0.2,
                 double congestion_delay=0.05, double congestion_hold=5.0,
                 double min_rtt_window=10.0, double now=0.0):
        link_settings(&self.settings, loss_memory, burst_threshold, congestion_delay,
                      congestion_hold, min_rtt_window)
        link_init(&self.state, now)

    def judged(self, bint lost):
        link_judged(&self.state, &self.settings, lost)

    def rtt(self, double sample, double srtt, double now):
        link_rtt(&self.state, &self.settings, sample, srtt, now)

    def update(self, double now):
        return MODE_NAMES[link_update(&self.state, &self.settings, now)]

    @property
    def loss(self):
        return self.state.loss

    @property
    def loss_after_loss(self):
        return self.state.loss_after_loss

    @property
    def burst_length(self):
        return link_burst_length(&self.state)

    @property
    def min_rtt(self):
        return self.state.min_rtt

    @property
    def queue_delay(self):
        return self.state.queue_delay
