"""A user-space UDP link emulator: ``relay netem``, for where Linux tc netem is not available.

Clients send to the listen address; for each distinct client address the emulator opens its own
upstream UDP socket (so the server sees one source port per client, as behind a real NAT) and
relays both directions, impairing each direction with its own ``LinkSettings``:

    up   = client -> server        down = server -> client

What happens to each datagram is decided by the link model of ``relay_core.simlink`` (one
``LossyLink`` per direction, each client with its own rate-limited ``Bottleneck``): loss
(time-correlated loss episodes, Gilbert-Elliott burst, then independent), the per-client rate
limiter with its bounded queue, delay + uniform jitter, an extra hold-back for reordering, and
possibly a duplicate copy with its own jitter. This module only adds the sockets, the timers
and the command line. Each direction has its own seeded model, so for the same seed and the
same sequence of datagrams the decisions repeat.

``LinkSettings`` are in the command line's units (ms, percent, kbit/s); ``LinkSettings.profile()``
converts them to the model's (seconds, fractions, bit/s), in that one place.

Library use (tests, benchmarks)::

    emulator = Netem(listen=("127.0.0.1", 0), upstream=("127.0.0.1", server_port),
                     up=LinkSettings(loss=10), down=LinkSettings(delay=20, jitter=10), seed=1)
    await emulator.start()
    client_sock.sendto(data, emulator.listen_address)
    emulator.set_up(LinkSettings())         # impairments change at runtime
    print(emulator.stats())
    await emulator.stop()

Command line: ``relay netem --listen HOST:PORT --upstream HOST:PORT [--loss 10 --delay 20 ...]``
or ``python -m relay.tools.netem ...``; it prints the stats as one JSON line on exit (and every
``--report-seconds``).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from relay_core.simlink import Bottleneck, LinkProfile, LossyLink

__all__ = ["LinkSettings", "Netem", "add_arguments", "main", "run"]

# Asked for on every socket so a burst is not dropped by the kernel before the emulator reads it;
# the kernel silently caps it at net.core.rmem_max / wmem_max.
SOCKET_BUFFER_BYTES = 1 << 20
DEFAULT_DECISION_LIMIT = 1_000_000
# Some loops (uvloop) arm timers in whole milliseconds and may wake a little early; a delivery is
# never sent early, so such a wake-up re-arms at least this far ahead instead of spinning.
MIN_REARM_SECONDS = 0.001

Address = tuple  # (host, port) or the 4-tuple of IPv6, as the socket layer gives it


@dataclass(frozen=True)
class LinkSettings:
    """Impairments for one direction. Percentages are 0..100; burst_* are probabilities 0..1."""

    loss: float = 0.0
    """Independent loss, percent of datagrams."""
    burst_enter: float = 0.0
    """Gilbert-Elliott: probability per datagram to go from the good to the bad state (0 = off)."""
    burst_exit: float = 0.25
    """Gilbert-Elliott: probability per datagram to leave the bad state (mean stay 1/burst_exit)."""
    burst_loss: float = 1.0
    """Gilbert-Elliott: probability that a datagram is lost while in the bad state."""
    delay: float = 0.0
    """Base one-way delay, ms."""
    jitter: float = 0.0
    """Extra delay drawn uniformly from [0, jitter] ms per datagram (can reorder)."""
    reorder: float = 0.0
    """Percent of datagrams held back by an extra ``reorder_delay`` ms."""
    reorder_delay: float = 20.0
    """Hold-back of a reordered datagram, ms."""
    duplicate: float = 0.0
    """Percent of datagrams delivered twice; the copy gets its own jitter, no rate-limiter cost."""
    rate: float = 0.0
    """Per-client bandwidth, kbit/s (1 kbit = 1000 bits, IP/UDP headers counted); 0 = unlimited."""
    queue_limit: int = 1000
    """Datagrams a client's rate limiter holds (including the one being sent); more are dropped."""
    episode_ms: float = 0.0
    """Loss episodes: mean duration, ms (exponential); every datagram is lost during one."""
    episode_share: float = 0.0
    """Loss episodes: percent of the time the link is down (0 = off). Both directions draw the
    same episode times, so with equal settings they go down together."""

    def __post_init__(self) -> None:
        for name in ("loss", "reorder", "duplicate", "episode_share"):
            _check_range(name, getattr(self, name), 0.0, 100.0, "a percentage")
        for name in ("burst_enter", "burst_exit", "burst_loss"):
            _check_range(name, getattr(self, name), 0.0, 1.0, "a probability")
        for name in ("delay", "jitter", "reorder_delay", "rate", "episode_ms"):
            _check_range(name, getattr(self, name), 0.0, float("inf"), "a non-negative number")
        if isinstance(self.queue_limit, bool) or not isinstance(self.queue_limit, int) \
                or self.queue_limit < 1:
            raise ValueError(f"LinkSettings.queue_limit={self.queue_limit!r}: an integer >= 1")
        if self.episode_share > 0.0 and self.episode_ms <= 0.0:
            raise ValueError("LinkSettings.episode_share needs episode_ms > 0 (the mean episode)")

    def profile(self) -> LinkProfile:
        """The same impairments in the link model's units."""
        return LinkProfile(
            loss=self.loss / 100.0, burst_enter=self.burst_enter, burst_exit=self.burst_exit,
            burst_loss=self.burst_loss, delay=self.delay / 1000.0, jitter=self.jitter / 1000.0,
            duplicate=self.duplicate / 100.0, reorder=self.reorder / 100.0,
            reorder_delay=self.reorder_delay / 1000.0, rate=self.rate * 1000.0,
            queue_limit=self.queue_limit, episode_mean=self.episode_ms / 1000.0,
            episode_share=self.episode_share / 100.0)


def _check_range(name: str, value: Any, low: float, high: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        bound = f"{low:g}..{high:g}" if high != float("inf") else f">= {low:g}"
        raise ValueError(f"LinkSettings.{name}={value!r}: {what} {bound}")


# --------------------------------------------------------------------------------------------
# One direction of the link


class _DeliveryCounters:
    __slots__ = ("delivered", "bytes_delivered", "undeliverable", "cancelled")

    def __init__(self) -> None:
        self.delivered = self.bytes_delivered = self.undeliverable = self.cancelled = 0


class _Link:
    """One direction: the ``LossyLink`` model decides each datagram's fate and arrival time; this
    shell feeds it on the monotonic clock and sends what has arrived.

    A single ``call_at`` is armed for the model's earliest pending arrival: no task or timer per
    datagram. All clients of a direction share the model (one seeded sequence of decisions);
    each client has its own bottleneck, as each would have its own access link.
    """

    def __init__(self, name: str, settings: LinkSettings, seed: int, record_decisions: bool,
                 decision_limit: int):
        self.name = name
        self.settings = settings
        self.recording = record_decisions
        # A string seed is hashed deterministically (unlike a tuple), and differs per direction.
        # Episodes are seeded without the direction: equal settings, equal down periods.
        self.model = LossyLink(settings.profile(), f"relay.netem/{seed}/{name}",
                               decision_limit if record_decisions else 0,
                               episode_seed=f"relay.netem/{seed}/episodes")
        self.counters = _DeliveryCounters()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.send: Callable[[bytes, "_ClientMapping"], Optional[bool]] = lambda payload, to: False
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_due = 0.0

    def set_settings(self, settings: LinkSettings) -> None:
        self.settings = settings
        self.model.profile = settings.profile()

    def offer(self, payload: bytes, mapping: "_ClientMapping") -> None:
        """A datagram arrived for this direction: the model drops or schedules it."""
        now = time.monotonic()
        self.model.send(payload, now, mapping, mapping.bottlenecks[self.name])
        # An unimpaired datagram is due at once: sent now, without waiting for the timer.
        for due_payload, due_mapping in self.model.routed_arrivals(now):
            self.deliver(due_payload, due_mapping)
        due = self.model.next_arrival()
        if due is not None and (self._timer is None or due < self._timer_due):
            self._arm(due, now)

    def _arm(self, due: float, now: float, min_wait: float = 0.0) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self.loop is not None
        self._timer_due = due
        # Deadlines are kept on time.monotonic(); converted to a wait so that a loop whose clock
        # is coarser (uvloop counts whole milliseconds) still waits the full time.
        self._timer = self.loop.call_at(self.loop.time() + max(due - now, min_wait), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = time.monotonic()
        arrived = self.model.routed_arrivals(now)
        for payload, mapping in arrived:
            self.deliver(payload, mapping)
        due = self.model.next_arrival()
        if due is not None:
            self._arm(due, now, 0.0 if arrived else MIN_REARM_SECONDS)

    def deliver(self, payload: bytes, mapping: "_ClientMapping") -> None:
        sent = self.send(payload, mapping)
        if sent is None:
            return  # held until the socket is ready; counted when it really goes out
        if sent:
            self.record_delivery(len(payload))
        else:
            self.counters.undeliverable += 1

    def record_delivery(self, size: int) -> None:
        self.counters.delivered += 1
        self.counters.bytes_delivered += size

    @property
    def in_flight(self) -> int:
        return self.model.in_flight

    @property
    def decisions(self) -> list[bool]:
        return self.model.counters.drop_decisions

    def cancel_pending(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.counters.cancelled += self.model.discard_in_flight()

    def stats(self, include_decisions: bool) -> dict[str, Any]:
        m = self.model.counters
        c = self.counters
        out: dict[str, Any] = {
            "datagrams_in": m.sent,
            "bytes_in": m.bytes_sent,
            "dropped": m.dropped,
            "dropped_loss": m.dropped_loss,
            "dropped_burst": m.dropped_burst,
            "dropped_queue": m.dropped_queue,
            "dropped_episode": m.dropped_episode,
            "duplicated": m.duplicated,
            "delivered": c.delivered,
            "bytes_delivered": c.bytes_delivered,
            "in_flight": self.in_flight,
            "undeliverable": c.undeliverable,
            "cancelled": c.cancelled,
        }
        if self.recording:
            out["decisions_recorded"] = len(m.drop_decisions)
            out["decisions_omitted"] = m.decisions_omitted
            if include_decisions:
                out["decisions"] = list(m.drop_decisions)
        return out


# --------------------------------------------------------------------------------------------
# Client mappings and the sockets


class _ClientMapping:
    """One client address and the upstream socket that stands for it."""

    __slots__ = ("client_address", "upstream_local_address", "transport", "attach_task",
                 "waiting", "last_activity", "closed", "bottlenecks", "socket_closed")

    def __init__(self, client_address: Address, upstream_local_address: Address, now: float,
                 socket_closed: asyncio.Future):
        self.client_address = client_address
        self.upstream_local_address = upstream_local_address
        self.transport: Optional[asyncio.DatagramTransport] = None
        self.attach_task: Optional[asyncio.Task] = None
        # Up datagrams due before the transport exists (its creation takes a loop iteration).
        self.waiting: list[bytes] = []
        self.last_activity = now
        self.closed = False
        self.bottlenecks = {"up": Bottleneck(), "down": Bottleneck()}
        self.socket_closed = socket_closed


class _ClosingProtocol(asyncio.DatagramProtocol):
    def __init__(self, netem: "Netem", closed: asyncio.Future):
        self.netem = netem
        self.closed = closed

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (e.g. port unreachable from a server that is not up yet): counted, not
        # fatal, as a real network path would lose the datagram and carry on.
        self.netem._socket_errors += 1

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _ListenProtocol(_ClosingProtocol):
    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.netem._from_client(data, addr)


class _UpstreamProtocol(_ClosingProtocol):
    def __init__(self, netem: "Netem", closed: asyncio.Future, mapping: _ClientMapping):
        super().__init__(netem, closed)
        self.mapping = mapping

    def datagram_received(self, data: bytes, addr: Address) -> None:
        # The socket is connected to the upstream, so the kernel only passes its datagrams.
        self.netem._from_upstream(data, self.mapping)


def _enlarge_buffers(sock: socket.socket) -> None:
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        except OSError:
            pass


class Netem:
    """The emulator: a listen socket, one upstream socket per client, and two impaired links."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        up: Optional[LinkSettings] = None,
        down: Optional[LinkSettings] = None,
        seed: Optional[int] = None,
        idle_timeout: float = 60.0,
        record_decisions: bool = False,
        decision_limit: int = DEFAULT_DECISION_LIMIT,
        max_clients: int = 1024,
    ):
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout={idle_timeout!r}: must be > 0 seconds")
        if max_clients < 1:
            raise ValueError(f"max_clients={max_clients!r}: must be >= 1")
        self.listen = listen
        self.upstream = upstream
        # Without a seed, pick one and report it in stats() so the run can be repeated.
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.idle_timeout = idle_timeout
        self.max_clients = max_clients
        self._up = _Link("up", up or LinkSettings(), self.seed, record_decisions, decision_limit)
        self._down = _Link("down", down or LinkSettings(), self.seed, record_decisions,
                           decision_limit)
        self._up.send = self._send_upstream
        self._down.send = self._send_to_client
        self._mappings: dict[Address, _ClientMapping] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._listen_transport: Optional[asyncio.DatagramTransport] = None
        self._listen_closed: Optional[asyncio.Future] = None
        self._upstream_family = socket.AF_INET
        self._upstream_sockaddr: Address = upstream
        self._sweep_handle: Optional[asyncio.TimerHandle] = None
        self._started_at: Optional[float] = None
        self._stopped_at: Optional[float] = None
        self._stopped = False
        self._closing_sockets: list[asyncio.Future] = []
        self._mappings_opened = 0
        self._mappings_expired = 0
        self._clients_rejected = 0
        self._socket_errors = 0
        self._rebinds = 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the upstream and bind the listen socket; ``listen_address`` is then known.
        Raises OSError with a message naming the address that failed."""
        if self._loop is not None:
            raise RuntimeError("Netem.start() called twice")
        loop = self._loop = asyncio.get_running_loop()
        self._up.loop = self._down.loop = loop
        # Resolved once, so opening a client's socket later is a synchronous connect() to an IP.
        upstream_text = f"{self.upstream[0]}:{self.upstream[1]}"
        try:
            infos = await loop.getaddrinfo(*self.upstream, type=socket.SOCK_DGRAM)
        except OSError as exc:
            reason = exc.strerror or exc
            raise OSError(f"cannot resolve upstream {upstream_text}: {reason}") from exc
        self._upstream_family, _, _, _, self._upstream_sockaddr = infos[0]
        # Bound here rather than by create_datagram_endpoint(local_addr=...): the error is ours
        # to word, and uvloop leaks a transport when its own bind fails.
        listen_text = f"{self.listen[0]}:{self.listen[1]}"
        try:
            infos = await loop.getaddrinfo(*self.listen, type=socket.SOCK_DGRAM,
                                           flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            sock = socket.socket(family, socket.SOCK_DGRAM)
        except OSError as exc:
            raise OSError(f"cannot listen on {listen_text}: {exc.strerror or exc}") from exc
        try:
            sock.setblocking(False)
            _enlarge_buffers(sock)
            sock.bind(sockaddr)
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen on {listen_text}: {exc.strerror or exc}") from exc
        self._listen_closed = listen_closed = loop.create_future()
        self._listen_transport, _ = await loop.create_datagram_endpoint(
            lambda: _ListenProtocol(self, listen_closed), sock=sock)
        self._started_at = time.monotonic()
        # One time origin for both directions' episodes, so that they coincide.
        self._up.model.episodes.origin = self._down.model.episodes.origin = self._started_at
        self._schedule_sweep()

    async def stop(self) -> None:
        """Cancel pending deliveries and close every socket; idempotent."""
        if self._stopped or self._loop is None:
            self._stopped = True
            return
        self._stopped = True
        self._stopped_at = time.monotonic()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._up.cancel_pending()
        self._down.cancel_pending()
        attaching = []
        for mapping in list(self._mappings.values()):
            if mapping.attach_task is not None and not mapping.attach_task.done():
                attaching.append(mapping.attach_task)
            self._close_mapping(mapping)
        self._mappings.clear()
        if self._listen_transport is not None and self._listen_closed is not None:
            self._listen_transport.close()
            self._closing_sockets.append(self._listen_closed)
        await asyncio.gather(*attaching, return_exceptions=True)
        # Transports close on the next loop iterations; wait so that callers (tests) can rely
        # on the ports being free when stop() returns.
        waiting = [f for f in self._closing_sockets if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=1.0)
        self._closing_sockets.clear()

    async def __aenter__(self) -> "Netem":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    @property
    def listen_address(self) -> tuple[str, int]:
        """The bound (host, port) clients send to; available after start()."""
        if self._listen_transport is None:
            raise RuntimeError("Netem is not started")
        return tuple(self._listen_transport.get_extra_info("sockname")[:2])

    # -- runtime control ----------------------------------------------------------------------

    @property
    def up(self) -> LinkSettings:
        return self._up.settings

    @property
    def down(self) -> LinkSettings:
        return self._down.settings

    def set_up(self, settings: LinkSettings) -> None:
        """Change client -> server impairments; applies to datagrams arriving from now on."""
        self._up.set_settings(settings)

    def set_down(self, settings: LinkSettings) -> None:
        """Change server -> client impairments; applies to datagrams arriving from now on."""
        self._down.set_settings(settings)

    def client_mappings(self) -> dict[Address, Address]:
        """Live mappings: client address -> local address of its upstream socket."""
        return {addr: m.upstream_local_address for addr, m in self._mappings.items()}

    def rebind(self, client_address: Optional[Address] = None) -> dict[Address, Address]:
        """Emulate a NAT rebinding: give a client (or every client) a new upstream socket, so
        the server sees its datagrams come from a new source port mid-session. Replies still in
        flight to the old port are lost, as behind a real NAT. Returns old -> new local address
        of each rebound mapping."""
        if self._loop is None or self._stopped:
            raise RuntimeError("Netem is not running")
        if client_address is None:
            mappings = list(self._mappings.values())
        elif client_address in self._mappings:
            mappings = [self._mappings[client_address]]
        else:
            raise KeyError(f"no client mapping for {client_address!r}")
        moved = {}
        for mapping in mappings:
            sock = self._upstream_socket()
            if sock is None:
                continue
            old_address = mapping.upstream_local_address
            if mapping.transport is not None:
                mapping.transport.close()
                self._closing_sockets.append(mapping.socket_closed)
            elif mapping.attach_task is not None:
                mapping.attach_task.cancel()
            mapping.transport = None
            mapping.upstream_local_address = sock.getsockname()[:2]
            mapping.socket_closed = self._loop.create_future()
            mapping.attach_task = self._loop.create_task(self._attach(mapping, sock))
            self._rebinds += 1
            moved[old_address] = mapping.upstream_local_address
        return moved

    def drop_decisions(self, direction: str) -> list[bool]:
        """Per datagram of ``direction`` ("up"/"down"), in arrival order: was it dropped?
        Needs ``record_decisions=True``; all clients of a direction share one sequence."""
        link = self._link(direction)
        if not link.recording:
            raise RuntimeError("drop decisions are recorded only with record_decisions=True")
        return list(link.decisions)

    def delays(self, direction: str) -> list[tuple[float, float]]:
        """(queueing delay, one-way delay) in seconds of each datagram of ``direction`` that got
        through, in arrival order at the emulator; recorded with ``record_decisions=True``."""
        link = self._link(direction)
        if not link.recording:
            raise RuntimeError("delays are recorded only with record_decisions=True")
        return list(link.model.counters.delays)

    def episodes(self, direction: str) -> list[tuple[float, float]]:
        """The loss episodes of ``direction`` drawn so far, (start, end) on time.monotonic()."""
        return list(self._link(direction).model.episodes.history)

    def stats(self, include_decisions: bool = False) -> dict[str, Any]:
        """Counters as a JSON-ready dict: totals, then per direction ("up", "down")
        datagrams_in, bytes_in, dropped (= dropped_loss + dropped_burst + dropped_queue +
        dropped_episode),
        duplicated, delivered (copies included), bytes_delivered, in_flight, undeliverable (the
        mapping had closed), cancelled (pending at stop), and the settings in force."""
        if self._started_at is None:
            elapsed = 0.0
        else:
            elapsed = (self._stopped_at or time.monotonic()) - self._started_at
        up = self._up.stats(include_decisions)
        up["in_flight"] += sum(len(m.waiting) for m in self._mappings.values())
        return {
            "elapsed_s": round(elapsed, 3),
            "seed": self.seed,
            "clients": len(self._mappings),
            "mappings_opened": self._mappings_opened,
            "mappings_expired": self._mappings_expired,
            "clients_rejected": self._clients_rejected,
            "socket_errors": self._socket_errors,
            "rebinds": self._rebinds,
            "up": up,
            "down": self._down.stats(include_decisions),
            "settings": {"up": dataclasses.asdict(self._up.settings),
                         "down": dataclasses.asdict(self._down.settings)},
        }

    def _link(self, direction: str) -> _Link:
        if direction == "up":
            return self._up
        if direction == "down":
            return self._down
        raise ValueError(f"direction={direction!r}: 'up' or 'down'")

    # -- datagram paths -----------------------------------------------------------------------

    def _from_client(self, data: bytes, addr: Address) -> None:
        if self._stopped:
            return
        mapping = self._mappings.get(addr)
        if mapping is None:
            mapping = self._open_mapping(addr)
            if mapping is None:
                return
        mapping.last_activity = time.monotonic()
        self._up.offer(data, mapping)

    def _from_upstream(self, data: bytes, mapping: _ClientMapping) -> None:
        if self._stopped or mapping.closed:
            return
        mapping.last_activity = time.monotonic()
        self._down.offer(data, mapping)

    def _send_upstream(self, payload: bytes, mapping: _ClientMapping) -> Optional[bool]:
        if mapping.closed:
            return False
        mapping.last_activity = time.monotonic()
        if mapping.transport is None:
            mapping.waiting.append(payload)
            return None
        mapping.transport.sendto(payload)
        return True

    def _send_to_client(self, payload: bytes, mapping: _ClientMapping) -> bool:
        # Still sent after the mapping expired: the datagram was already on its way.
        transport = self._listen_transport
        if transport is None or transport.is_closing():
            return False
        transport.sendto(payload, mapping.client_address)
        return True

    def _open_mapping(self, client_address: Address) -> Optional[_ClientMapping]:
        if len(self._mappings) >= self.max_clients:
            self._clients_rejected += 1
            return None
        assert self._loop is not None
        sock = self._upstream_socket()
        if sock is None:
            return None
        mapping = _ClientMapping(client_address, sock.getsockname()[:2], time.monotonic(),
                                 self._loop.create_future())
        self._mappings[client_address] = mapping
        self._mappings_opened += 1
        mapping.attach_task = self._loop.create_task(self._attach(mapping, sock))
        return mapping

    def _upstream_socket(self) -> Optional[socket.socket]:
        sock = socket.socket(self._upstream_family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            _enlarge_buffers(sock)
            # connect() on UDP to an IP address does not block; it fixes our source port now and
            # makes the kernel discard datagrams from anyone but the upstream.
            sock.connect(self._upstream_sockaddr)
        except OSError:
            sock.close()
            self._socket_errors += 1
            return None
        return sock

    async def _attach(self, mapping: _ClientMapping, sock: socket.socket) -> None:
        assert self._loop is not None
        try:
            transport, _ = await self._loop.create_datagram_endpoint(
                lambda: _UpstreamProtocol(self, mapping.socket_closed, mapping), sock=sock)
        except asyncio.CancelledError:
            sock.close()
            raise
        except OSError:
            sock.close()
            self._socket_errors += 1
            self._up.counters.undeliverable += len(mapping.waiting)
            mapping.waiting.clear()
            self._close_mapping(mapping)
            self._mappings.pop(mapping.client_address, None)
            return
        if mapping.closed:
            transport.close()
            self._closing_sockets.append(mapping.socket_closed)
            return
        mapping.transport = transport
        for payload in mapping.waiting:
            transport.sendto(payload)
            self._up.record_delivery(len(payload))
        mapping.waiting.clear()

    def _close_mapping(self, mapping: _ClientMapping) -> None:
        mapping.closed = True
        self._up.counters.cancelled += len(mapping.waiting)
        mapping.waiting.clear()
        if mapping.transport is not None:
            mapping.transport.close()
            self._closing_sockets.append(mapping.socket_closed)
        elif mapping.attach_task is not None:
            mapping.attach_task.cancel()

    # -- idle expiry --------------------------------------------------------------------------

    def _schedule_sweep(self) -> None:
        assert self._loop is not None
        # A few sweeps per timeout: a mapping lives at most ~25% past its idle timeout.
        interval = min(1.0, max(0.01, self.idle_timeout / 4))
        self._sweep_handle = self._loop.call_later(interval, self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        expired = [m for m in self._mappings.values()
                   if now - m.last_activity >= self.idle_timeout]
        for mapping in expired:
            del self._mappings[mapping.client_address]
            self._close_mapping(mapping)
            self._mappings_expired += 1
        # Forget close notifications already delivered, so a long run does not accumulate them.
        self._closing_sockets = [f for f in self._closing_sockets if not f.done()]
        self._schedule_sweep()


# --------------------------------------------------------------------------------------------
# Command line

# LinkSettings field -> (flag stem, argparse type name, help). Each gets --STEM for both
# directions and --up-STEM / --down-STEM overrides.
_LINK_FLAGS: dict[str, tuple[str, str, str]] = {
    "loss": ("loss", "percent", "independent loss, %% of datagrams (0..100)"),
    "burst_enter": ("burst-enter", "probability",
                    "burst loss: probability per datagram to enter the bad state (0..1, 0 = off)"),
    "burst_exit": ("burst-exit", "probability",
                   "burst loss: probability per datagram to leave the bad state (0..1)"),
    "burst_loss": ("burst-loss", "probability",
                   "burst loss: loss probability while in the bad state (0..1)"),
    "delay": ("delay", "milliseconds", "one-way delay, ms"),
    "jitter": ("jitter", "milliseconds", "extra delay drawn uniformly from 0..JITTER ms"),
    "reorder": ("reorder", "percent", "%% of datagrams held back by --reorder-delay (0..100)"),
    "reorder_delay": ("reorder-delay", "milliseconds", "hold-back of a reordered datagram, ms"),
    "duplicate": ("duplicate", "percent", "%% of datagrams delivered twice (0..100)"),
    "rate": ("rate", "kbits",
             "per-client bandwidth, kbit/s, IP/UDP headers counted (0 = unlimited)"),
    "queue_limit": ("queue-limit", "count",
                    "datagrams a client's rate limiter queues before dropping"),
    "episode_ms": ("episode-ms", "milliseconds",
                   "loss episodes: mean duration, ms (exponential; every datagram is lost)"),
    "episode_share": ("episode-share", "percent",
                      "loss episodes: %% of the time the link is down (0 = off)"),
}


def _float_in(low: float, high: float, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            bound = f"{low:g}..{high:g}" if high != float("inf") else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"{what} {bound}, got {text}")
        return value
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


_METAVARS = {"percent": "PCT", "probability": "P", "milliseconds": "MS", "kbits": "KBITS",
             "count": "N"}
_TYPES: dict[str, Callable[[str], Any]] = {
    "percent": _float_in(0.0, 100.0, "a percentage"),
    "probability": _float_in(0.0, 1.0, "a probability"),
    "milliseconds": _float_in(0.0, float("inf"), "milliseconds"),
    "kbits": _float_in(0.0, float("inf"), "kbit/s"),
    "count": _positive_int,
}


def _host_port(text: str, allow_port_zero: bool) -> tuple[str, int]:
    host, colon, port_text = text.rpartition(":")
    if not colon or not host or not port_text.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise argparse.ArgumentTypeError(
            f"an IPv6 host needs brackets, e.g. [::1]:PORT, got {text!r}")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        allowed = "0..65535 (0 = any free port)" if allow_port_zero else "1..65535"
        raise argparse.ArgumentTypeError(f"port must be {allowed}, got {port}")
    return host, port


def _listen_address(text: str) -> tuple[str, int]:
    return _host_port(text, allow_port_zero=True)


def _upstream_address(text: str) -> tuple[str, int]:
    return _host_port(text, allow_port_zero=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the netem flags to ``parser`` (``main`` uses this; so can ``relay netem``)."""
    parser.add_argument("--listen", required=True, type=_listen_address, metavar="HOST:PORT",
                        help="address clients send to (port 0 picks a free port)")
    parser.add_argument("--upstream", required=True, type=_upstream_address, metavar="HOST:PORT",
                        help="the UDP server datagrams are relayed to")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for the impairment decisions "
                             "(default: random, reported in the stats)")
    parser.add_argument("--idle-timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                        help="close a client's upstream socket after this long without traffic "
                             "(default 60)")
    parser.add_argument("--max-clients", type=_positive_int, default=1024,
                        help="client addresses mapped at once; datagrams from more are dropped "
                             "(default 1024)")
    parser.add_argument("--duration", type=_positive_float, default=None, metavar="SECONDS",
                        help="stop after this long (default: until SIGINT/SIGTERM)")
    parser.add_argument("--report-seconds", type=_positive_float, default=None, metavar="N",
                        help="also print the stats JSON line every N seconds")
    parser.add_argument("--rebind-every", type=_positive_float, default=None, metavar="SECONDS",
                        help="give every client a new upstream source port this often, as a NAT "
                             "rebinding or a Wi-Fi to cellular switch would (default: never)")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="event loop (default: uvloop if installed)")

    defaults = LinkSettings()
    both = parser.add_argument_group("impairments (both directions)")
    overrides = parser.add_argument_group(
        "per-direction overrides (up = client -> server, down = server -> client)")
    for field_name, (stem, type_name, help_text) in _LINK_FLAGS.items():
        default = getattr(defaults, field_name)
        both.add_argument(f"--{stem}", dest=field_name, type=_TYPES[type_name], default=None,
                          metavar=_METAVARS[type_name], help=f"{help_text} (default {default:g})")
        for direction in ("up", "down"):
            overrides.add_argument(f"--{direction}-{stem}", dest=f"{direction}_{field_name}",
                                   type=_TYPES[type_name], default=None,
                                   metavar=_METAVARS[type_name],
                                   help=f"--{stem} for {direction} only")


def settings_from_args(args: argparse.Namespace) -> tuple[LinkSettings, LinkSettings]:
    """(up, down) LinkSettings from parsed flags: --up-X / --down-X over --X over defaults."""
    result = []
    for direction in ("up", "down"):
        values = {}
        for field_name in _LINK_FLAGS:
            value = getattr(args, f"{direction}_{field_name}", None)
            if value is None:
                value = getattr(args, field_name, None)
            if value is not None:
                values[field_name] = value
        result.append(LinkSettings(**values))
    return result[0], result[1]


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def _print_stats(emulator: Netem, final: bool) -> None:
    print(json.dumps({"final": final, **emulator.stats()}), flush=True)


async def _serve(args: argparse.Namespace) -> int:
    try:
        up, down = settings_from_args(args)
    except ValueError as exc:   # a combination one flag cannot check (--episode-share alone)
        print(f"relay netem: error: {exc}", file=sys.stderr)
        return 2
    emulator = Netem(listen=args.listen, upstream=args.upstream, up=up, down=down, seed=args.seed,
                     idle_timeout=args.idle_timeout, max_clients=args.max_clients)
    try:
        await emulator.start()
    except OSError as exc:
        await emulator.stop()
        print(f"relay netem: error: {exc}", file=sys.stderr)
        return 1
    host, port = emulator.listen_address
    upstream_host, upstream_port = args.upstream
    print(f"relay netem: listening on {host}:{port}, upstream {upstream_host}:{upstream_port}, "
          f"seed {emulator.seed}", file=sys.stderr, flush=True)

    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous = signal.getsignal(signum)
            loop.add_signal_handler(signum, stop_requested.set)
            installed.append((signum, previous))
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread, or no signals here: --duration still ends the run

    background = []
    if args.rebind_every:
        async def rebind_periodically() -> None:
            while True:
                await asyncio.sleep(args.rebind_every)
                emulator.rebind()
        background.append(asyncio.create_task(rebind_periodically()))
    if args.report_seconds:
        async def report_periodically() -> None:
            while True:
                await asyncio.sleep(args.report_seconds)
                _print_stats(emulator, final=False)
        background.append(asyncio.create_task(report_periodically()))
    try:
        try:
            await asyncio.wait_for(stop_requested.wait(), timeout=args.duration)
        except asyncio.TimeoutError:
            pass
    finally:
        for task in background:
            task.cancel()
        for signum, previous in installed:
            loop.remove_signal_handler(signum)
            if previous is not None:
                signal.signal(signum, previous)
        await emulator.stop()
    _print_stats(emulator, final=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the emulator for flags parsed with ``add_arguments``; returns the exit status."""
    with asyncio.Runner(loop_factory=_loop_factory(args.loop)) as runner:
        return runner.run(_serve(args))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="relay netem",
        description="User-space UDP link emulator: relays clients <-> an upstream UDP server with "
                    "seeded loss, burst loss, loss episodes, delay, jitter, reordering, duplication and rate "
                    "limits per direction. Prints stats as JSON lines on stdout.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
