"""Deterministic in-memory links for driving endpoints without sockets.

``LossyLink`` is one direction of a path with seeded loss, delay, jitter, reordering and
duplication. ``LinkedPair`` joins a server and a client endpoint with two links and a simulated
clock, so tests and benchmarks can run thousands of exchanges at any simulated speed and get the
same result for the same seed.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from relay_core.config import EndpointConfig
from relay_core.endpoint import Endpoint


@dataclass
class LinkProfile:
    loss: float = 0.0
    """Probability that a datagram is dropped."""
    delay: float = 0.0
    """Base one-way delay, seconds."""
    jitter: float = 0.0
    """Extra delay drawn uniformly from [0, jitter] per datagram (reorders when > send spacing)."""
    duplicate: float = 0.0
    """Probability that a datagram is delivered twice."""
    reorder: float = 0.0
    """Probability that a datagram is held back by an extra ``reorder_delay``."""
    reorder_delay: float = 0.02


@dataclass
class LinkCounters:
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0
    bytes_sent: int = 0
    drop_decisions: list = field(default_factory=list)
    """True/False per datagram offered, in order: the emulator's actual drop decisions."""


class LossyLink:
    """One direction of a simulated path; deterministic for a given seed."""

    def __init__(self, profile: LinkProfile, seed: int):
        self.profile = profile
        self.rng = random.Random(seed)
        self.counters = LinkCounters()
        self._in_flight: list[tuple[float, int, bytes]] = []
        self._order = 0

    def send(self, datagram: bytes, now: float) -> None:
        p = self.profile
        self.counters.sent += 1
        self.counters.bytes_sent += len(datagram)
        dropped = self.rng.random() < p.loss
        self.counters.drop_decisions.append(dropped)
        if dropped:
            self.counters.dropped += 1
            return
        copies = 2 if self.rng.random() < p.duplicate else 1
        self.counters.duplicated += copies - 1
        for _ in range(copies):
            arrival = now + p.delay + self.rng.uniform(0.0, p.jitter)
            if self.rng.random() < p.reorder:
                arrival += p.reorder_delay
            self._order += 1
            heapq.heappush(self._in_flight, (arrival, self._order, datagram))

    def arrivals(self, now: float) -> list[bytes]:
        out = []
        while self._in_flight and self._in_flight[0][0] <= now:
            out.append(heapq.heappop(self._in_flight)[2])
        return out

    def next_arrival(self) -> Optional[float]:
        return self._in_flight[0][0] if self._in_flight else None


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
