"""Deterministic link model: what a path does to each datagram, without sockets or clocks.

``LossyLink`` is one direction of a path. Per datagram, in this order: loss (a time-correlated
loss episode, Gilbert-Elliott burst, then independent), a rate-limited bottleneck with a
bounded drop-tail queue, delay + uniform jitter, an extra hold-back for reordering, and possibly
a duplicate copy with its own jitter. The caller passes the time in and pulls the datagrams that
have arrived, so the same model runs in simulated time (``LinkedPair``, benchmarks) and behind real sockets
(``relay.tools.netem``, which only adds timers and sockets around it).

Units, everywhere in this module: times in seconds, probabilities as fractions 0..1, sizes in
bytes, rates in bits per second (IP/UDP headers counted, ``IP_UDP_OVERHEAD_BYTES``).

Every datagram offered consumes the same seven draws from the link's seeded ``random.Random``,
whatever the profile: so for a seed the i-th datagram's loss draw is fixed, the loss pattern
does not shift when delay, jitter, reordering or duplication change, and raising ``loss`` only
adds drops to those of a lower rate. Loss episodes (``LossEpisodes``) run on their own seeded
generator and on time, not on datagrams, so they do not shift the per-datagram draws either.

``LinkedPair`` joins a server and a client endpoint with two links and a simulated clock, so
tests and benchmarks can run thousands of exchanges at any simulated speed and get the same
result for the same seed.
"""
from __future__ import annotations

import collections
import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from relay_core.config import EndpointConfig
from relay_core.endpoint import Endpoint

# The rate limiter charges IPv4 + UDP headers too: game datagrams are small, and on a real link
# the headers are a large share of what a few dozen bytes of payload cost.
IP_UDP_OVERHEAD_BYTES = 28


@dataclass
class LinkProfile:
    """Impairments of one direction; seconds, probabilities 0..1, bits per second."""

    loss: float = 0.0
    """Probability that a datagram is dropped, independently of the others."""
    burst_enter: float = 0.0
    """Gilbert-Elliott: probability per datagram to go from the good to the bad state (0 = off)."""
    burst_exit: float = 0.25
    """Gilbert-Elliott: probability per datagram to leave the bad state (mean stay 1/burst_exit)."""
    burst_loss: float = 1.0
    """Gilbert-Elliott: probability that a datagram is lost while in the bad state."""
    delay: float = 0.0
    """Base one-way delay, seconds."""
    jitter: float = 0.0
    """Extra delay drawn uniformly from [0, jitter] per datagram (reorders when > send spacing)."""
    duplicate: float = 0.0
    """Probability that a datagram is delivered twice; the copy gets its own jitter, no
    reordering hold-back and no bottleneck time."""
    reorder: float = 0.0
    """Probability that a datagram is held back by an extra ``reorder_delay``."""
    reorder_delay: float = 0.02
    """Hold-back of a reordered datagram, seconds."""
    rate: float = 0.0
    """Bottleneck bandwidth, bits per second, IP/UDP headers counted; 0 = unlimited."""
    queue_limit: int = 1000
    """Datagrams the bottleneck holds (including the one being sent); more are dropped."""
    episode_mean: float = 0.0
    """Loss episodes: mean duration of an episode, seconds (0 = off). During an episode the link
    is down and every datagram is lost, however many are sent (fading, a handover)."""
    episode_share: float = 0.0
    """Loss episodes: long-run fraction of time the link is down, 0..1 (0 = off)."""


class LossEpisodes:
    """Time-correlated loss: an alternating renewal process of "down" and "up" periods, both
    exponentially distributed, with mean down ``mean`` and mean up ``mean * (1 - share) / share``
    so that the long-run down share is ``share``. It is a function of time only, from its own
    seeded generator: two instances with the same seed, origin and parameters go down at the
    same moments (netem uses that for both directions of a path).

    The first period starts at ``origin`` (or the first query) in the down state with
    probability ``share``: with exponential durations that is the stationary start, so there is
    no warm-up. Queries must come in non-decreasing time. ``history`` keeps the down periods
    generated so far as (start, end), up to ``history_limit``.
    """

    __slots__ = ("rng", "origin", "down", "until", "history", "history_limit", "_params")

    def __init__(self, seed: Union[int, str], origin: Optional[float] = None,
                 history_limit: Optional[int] = 100_000):
        self.rng = random.Random(seed)
        self.origin = origin
        self.down = False
        self.until: Optional[float] = None
        self.history: list[tuple[float, float]] = []
        self.history_limit = history_limit
        self._params: Optional[tuple[float, float]] = None

    def is_down(self, now: float, mean: float, share: float) -> bool:
        if mean <= 0.0 or share <= 0.0:
            self.until = None       # turned off: start afresh if turned on again
            self._params = None
            return False
        if share >= 1.0:
            return True
        if self.until is None:
            start = self.origin if self.origin is not None and self.origin <= now else now
            self.down = self.rng.random() < share
            self.until = start
            self._params = (mean, share)
            self._extend(start, mean, share)
        elif self._params != (mean, share):
            self._params = (mean, share)    # new parameters apply from the next period on
        mean, share = self._params
        while self.until is not None and self.until <= now:
            self.down = not self.down
            self._extend(self.until, mean, share)
        return self.down

    def _extend(self, start: float, mean: float, share: float) -> None:
        """Draw the length of the period that starts at ``start`` in the current state."""
        average = mean if self.down else mean * (1.0 - share) / share
        self.until = start + self.rng.expovariate(1.0 / average)
        if self.down and (self.history_limit is None
                          or len(self.history) < self.history_limit):
            self.history.append((start, self.until))


@dataclass
class LinkCounters:
    sent: int = 0
    """Datagrams offered to the link."""
    bytes_sent: int = 0
    dropped: int = 0
    """dropped_loss + dropped_burst + dropped_queue + dropped_episode."""
    dropped_episode: int = 0
    dropped_loss: int = 0
    dropped_burst: int = 0
    dropped_queue: int = 0
    duplicated: int = 0
    drop_decisions: list = field(default_factory=list)
    """True/False per datagram offered, in order: the emulator's actual drop decisions (up to
    the link's ``decision_limit``)."""
    decisions_omitted: int = 0
    """Decisions past ``decision_limit``, not recorded."""
    delays: list = field(default_factory=list)
    """(queueing delay, one-way delay) in seconds per datagram that got through, in offer order,
    recorded like ``drop_decisions``: the time in the bottleneck's queue and on the wire, then
    delay, jitter and reordering hold-back (the duplicate's is not recorded)."""


class Bottleneck:
    """A rate-limited hop: datagrams are serialised back to back at the profile's rate, and at
    most ``queue_limit`` of them wait (a drop-tail queue). A link has one of its own; a caller
    that shares a link among several paths (netem: one per client) passes one per path."""

    __slots__ = ("busy_until", "finish_times")

    def __init__(self) -> None:
        self.busy_until = 0.0
        self.finish_times: collections.deque[float] = collections.deque()

    def admit(self, now: float, size: int, profile: LinkProfile) -> Optional[float]:
        """When this datagram has left the bottleneck, or None if the queue is full."""
        finish_times = self.finish_times
        while finish_times and finish_times[0] <= now:
            finish_times.popleft()
        if len(finish_times) >= profile.queue_limit:
            return None
        start = max(now, self.busy_until)
        self.busy_until = start + (size + IP_UDP_OVERHEAD_BYTES) * 8 / profile.rate
        finish_times.append(self.busy_until)
        return self.busy_until


class LossyLink:
    """One direction of a simulated path; deterministic for a given seed (an int or a str).

    ``profile`` may be replaced at any time; it applies to datagrams offered from then on.
    ``decision_limit`` caps the recorded drop decisions (None: all, 0: none), so a long-running
    emulator does not grow without bound.
    """

    def __init__(self, profile: LinkProfile, seed: Union[int, str],
                 decision_limit: Optional[int] = None,
                 episode_seed: Union[int, str, None] = None):
        self.profile = profile
        self.rng = random.Random(seed)
        self.counters = LinkCounters()
        self.decision_limit = decision_limit
        self.bottleneck = Bottleneck()
        self.in_bad_state = False
        # Their own generator: episodes do not consume the seven per-datagram draws.
        self.episodes = LossEpisodes(f"{seed}/episodes" if episode_seed is None else episode_seed)
        self._in_flight: list[tuple[float, int, bytes, Any]] = []
        self._order = 0

    def send(self, datagram: bytes, now: float, route: Any = None,
             bottleneck: Optional[Bottleneck] = None) -> None:
        """Offer a datagram at ``now``: drop it, or schedule its arrival (and its copy's).
        ``route`` is handed back with it by ``routed_arrivals``; ``bottleneck`` is the rate
        limiter it passes through (default: the link's own)."""
        p = self.profile
        counters = self.counters
        counters.sent += 1
        counters.bytes_sent += len(datagram)
        draw = self.rng.random
        loss_draw, state_draw, burst_draw = draw(), draw(), draw()
        jitter_draw, reorder_draw, duplicate_draw, copy_jitter_draw = draw(), draw(), draw(), draw()

        # Gilbert-Elliott as tc netem runs it: move between states first, then lose by state.
        if p.burst_enter == 0.0:
            self.in_bad_state = False  # bursts turned off must not leave the link stuck bad
        elif self.in_bad_state:
            if state_draw < p.burst_exit:
                self.in_bad_state = False
        elif state_draw < p.burst_enter:
            self.in_bad_state = True
        if self.episodes.is_down(now, p.episode_mean, p.episode_share):
            counters.dropped_episode += 1
            self._decide(True)
            return
        if self.in_bad_state and burst_draw < p.burst_loss:
            counters.dropped_burst += 1
            self._decide(True)
            return
        if loss_draw < p.loss:
            counters.dropped_loss += 1
            self._decide(True)
            return

        leaves_at = now
        if p.rate > 0.0:
            finish = (bottleneck or self.bottleneck).admit(now, len(datagram), p)
            if finish is None:
                counters.dropped_queue += 1
                self._decide(True)
                return
            leaves_at = finish
        self._decide(False)

        arrives_at = leaves_at + p.delay
        due = arrives_at + p.jitter * jitter_draw
        if reorder_draw < p.reorder:
            due += p.reorder_delay
        limit = self.decision_limit
        if limit is None or len(counters.delays) < limit:
            counters.delays.append((leaves_at - now, due - now))
        self._schedule(due, datagram, route)
        if duplicate_draw < p.duplicate:
            counters.duplicated += 1
            self._schedule(arrives_at + p.jitter * copy_jitter_draw, datagram, route)

    def _decide(self, dropped: bool) -> None:
        counters = self.counters
        if dropped:
            counters.dropped += 1
        limit = self.decision_limit
        if limit is None or len(counters.drop_decisions) < limit:
            counters.drop_decisions.append(dropped)
        else:
            counters.decisions_omitted += 1

    def _schedule(self, due: float, datagram: bytes, route: Any) -> None:
        # (due, offer order): datagrams due at the same time keep the order they were offered in.
        self._order += 1
        heapq.heappush(self._in_flight, (due, self._order, datagram, route))

    def routed_arrivals(self, now: float) -> list[tuple[bytes, Any]]:
        """(datagram, route) of everything due by ``now``, in arrival order."""
        out = []
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] <= now:
            _, _, datagram, route = heapq.heappop(in_flight)
            out.append((datagram, route))
        return out

    def arrivals(self, now: float) -> list[bytes]:
        return [datagram for datagram, _ in self.routed_arrivals(now)]

    def next_arrival(self) -> Optional[float]:
        return self._in_flight[0][0] if self._in_flight else None

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def discard_in_flight(self) -> int:
        """Forget every datagram not yet arrived; returns how many there were."""
        count = len(self._in_flight)
        self._in_flight.clear()
        return count


class LinkedPair:
    """A server and a client endpoint joined by two lossy links and one simulated clock."""

    SERVER_ADDRESS = ("10.0.0.1", 7777)
    CLIENT_ADDRESS = ("10.0.0.2", 40000)

    def __init__(
        self,
        server_config: Optional[EndpointConfig] = None,
        client_config: Optional[EndpointConfig] = None,
        up: Optional[LinkProfile] = None,
        down: Optional[LinkProfile] = None,
        seed: int = 0,
        tick: float = 0.001,
        unix_offset: Optional[float] = None,
    ):
        server_config = server_config or EndpointConfig(accept_connections=True, seed=seed)
        client_config = client_config or EndpointConfig(seed=seed + 1)
        # unix time = simulated time + unix_offset (token expiry); None: the wall clock's.
        self.server = Endpoint(server_config, unix_offset)
        self.client = Endpoint(client_config, unix_offset)
        self.up = LossyLink(up or LinkProfile(), seed * 2 + 101)        # client -> server
        self.down = LossyLink(down or LinkProfile(), seed * 2 + 202)    # server -> client
        self.now = 0.0
        self.tick = tick
        self.server_events: list[Any] = []
        self.client_events: list[Any] = []
        self.client_peer: Optional[int] = None
        self.server_peer: Optional[int] = None
        self.client_address = self.CLIENT_ADDRESS
        """Where the client's datagrams come from, as the server sees it (rebind_client())."""
        self.unrouted = 0
        """Server datagrams addressed elsewhere than client_address: nobody receives them."""

    def connect(self, timeout: float = 5.0, token: Any = None) -> None:
        """Handshake (with a ConnectToken in token mode); afterwards ``client_peer`` and
        ``server_peer`` are set."""
        from relay_core.events import PeerConnected

        self.client_peer = self.client.connect(self.SERVER_ADDRESS, self.now, token)
        self.run_until(lambda: any(isinstance(e, PeerConnected) for e in self.server_events)
                       and any(isinstance(e, PeerConnected) for e in self.client_events), timeout)
        self.server_peer = next(e.peer_id for e in self.server_events if isinstance(e, PeerConnected))

    def rebind_client(self, address: Any) -> None:
        """The client's source address changes (a NAT rebinding, a new network): from now on
        the server sees its datagrams come from ``address``, and what the server sends to the
        old address is lost."""
        self.client_address = address

    def step(self) -> None:
        """Advance the clock by one tick: deliver arrivals, run timers, send."""
        self.now += self.tick
        now = self.now
        for datagram in self.up.arrivals(now):
            self.server.receive(datagram, self.client_address, now)
        for datagram in self.down.arrivals(now):
            self.client.receive(datagram, self.SERVER_ADDRESS, now)
        for endpoint, events, link in ((self.server, self.server_events, self.down),
                                       (self.client, self.client_events, self.up)):
            endpoint.handle_timeout(now)
            for datagram, address in endpoint.datagrams_to_send(now):
                if endpoint is self.server and address != self.client_address:
                    self.unrouted += 1
                    continue
                link.send(datagram, now)
            while (event := endpoint.next_event()) is not None:
                events.append(event)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.step()

    def run_until(self, done: Callable[[], bool], timeout: float) -> None:
        end = self.now + timeout
        while not done():
            if self.now >= end:
                raise TimeoutError(f"condition not met within {timeout} simulated seconds")
            self.step()
