"""The asyncio shell that pumps a relay_core Endpoint over one UDP socket.

Used by the server and the client SDK alike: datagrams that arrive in one event-loop iteration
are all handed to the core before one flush; a flush lets the owner consume the core's events,
sends what the core returns, and arms a single timer at the core's next_timeout().

Two drivers with one interface: EndpointDriver, an asyncio DatagramProtocol (one callback per
datagram, one sendto per datagram; any platform), and BatchedEndpointDriver (Linux), which reads
a readable socket with recvmmsg and sends a flush with sendmmsg (relay._batchio), a few syscalls
per wake-up whatever the number of datagrams.
"""
from __future__ import annotations

import asyncio
import errno
import math
import os
import socket
import sys
from typing import Callable, Optional

from relay_core import Endpoint

try:
    from relay import _batchio
except ImportError:         # not built (a source checkout without build_ext)
    _batchio = None  # type: ignore[assignment]  # BATCHED_IO says which

# Linux's <linux/in.h> values; the socket module does not name them.
IP_MTU_DISCOVER = 10
IP_PMTUDISC_PROBE = 3

# The largest protocol mtu whose datagrams (plus 28 bytes of IPv4 and UDP headers) fit IPv6's
# minimum link MTU of 1280: such datagrams cross practically any path whole, so they can be
# sent with DF, as QUIC sends its 1200-byte packets. A larger mtu keeps IPv4 fragmentation as
# the fallback on a path that needs it.
DF_MTU_LIMIT = 1252


def unfragmented(mtu: int) -> bool:
    """Whether a server with this protocol ``mtu`` sends its IPv4 datagrams with DF."""
    return mtu <= DF_MTU_LIMIT

BATCHED_IO = _batchio is not None and _batchio.AVAILABLE and sys.platform.startswith("linux")
"""Whether BatchedEndpointDriver can run here (Linux, relay._batchio compiled)."""


class WakeTimer:
    """One timer at the core's next deadline, re-armed only when the deadline moves."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]):
        self.loop = loop
        self.callback = callback
        self._handle: Optional[asyncio.Handle] = None
        self._deadline = 0.0        # uvloop hands back a plain Handle (no when()) for past times

    def arm(self, deadline: Optional[float], now: float) -> None:
        if self._handle is not None:
            if deadline is not None and abs(self._deadline - deadline) < 0.0005:
                return
            self._handle.cancel()
            self._handle = None
        if deadline is not None:
            self._deadline = deadline
            # In whole milliseconds, rounded up. uvloop counts time in milliseconds and rounds
            # a delay to the nearest one: a timer armed at the deadline itself may fire up to
            # 0.5 ms before it is due, and then (delay < 0.5 ms: call_soon) again and again,
            # a flush over every peer each time, until the clock reaches it.
            delay = deadline - now
            self._handle = self.loop.call_later(
                math.ceil(delay * 1000.0 - 1e-6) / 1000.0 if delay > 0.0 else 0.0, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self.callback()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class EndpointDriver(asyncio.DatagramProtocol):
    """Counters: ``datagrams_received``, ``bytes_received``, ``datagrams_sent``, ``bytes_sent``.
    """

    def __init__(self, endpoint: Endpoint, on_events: Callable[[float], None],
                 on_received: Optional[Callable[[int], None]] = None,
                 on_sent: Optional[Callable[[int, int], None]] = None,
                 on_error: Optional[Callable[[Exception], None]] = None):
        self.endpoint = endpoint
        self.on_events = on_events
        self.on_received = on_received
        self.on_sent = on_sent
        self.on_error = on_error
        self.transport: Optional[asyncio.DatagramTransport] = None
        self.loop = asyncio.get_running_loop()
        self.datagrams_received = self.bytes_received = 0
        self.datagrams_sent = self.bytes_sent = 0
        self._flush_pending = False
        self._wake = WakeTimer(self.loop, self._on_timer)
        self.closed = asyncio.Event()

    # asyncio callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self._wake.cancel()
        self.closed.set()

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (the other side went away) surface here; the core's timeouts decide.
        if self.on_error is not None:
            self.on_error(exc)

    def datagram_received(self, data: bytes, addr) -> None:
        self.datagrams_received += 1
        self.bytes_received += len(data)
        if self.on_received is not None:
            self.on_received(len(data))
        self.endpoint.receive(data, addr, self.loop.time())
        self.request_flush()

    # driving

    def now(self) -> float:
        return self.loop.time()

    def request_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_pending = False
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        self.on_events(now)
        sent = self.endpoint.datagrams_to_send(now)
        self.on_events(now)         # timers run inside datagrams_to_send may have closed peers
        sendto = self.transport.sendto
        size = 0
        for data, addr in sent:
            sendto(data, addr)
            size += len(data)
        self.datagrams_sent += len(sent)
        self.bytes_sent += size
        if sent and self.on_sent is not None:
            self.on_sent(len(sent), size)
        self._arm_timer(now)

    def _arm_timer(self, now: float) -> None:
        self._wake.arm(self.endpoint.next_timeout(), now)

    def _on_timer(self) -> None:
        self.flush()

    def close(self) -> None:
        self._wake.cancel()
        if self.transport is not None:
            self.transport.close()


async def open_driver(endpoint: Endpoint, local_addr, on_events, **callbacks) -> EndpointDriver:
    loop = asyncio.get_running_loop()
    _, driver = await loop.create_datagram_endpoint(
        lambda: EndpointDriver(endpoint, on_events, **callbacks), local_addr=local_addr)
    return driver


class _BatchedTransport:
    """The part of a DatagramTransport the driver's owner uses: extra info, closing, sendto."""

    def __init__(self, driver: "BatchedEndpointDriver", sock: socket.socket):
        self._driver = driver
        self._extra = {"socket": sock, "sockname": sock.getsockname()}

    def get_extra_info(self, name: str, default=None):
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._driver.is_closing

    def close(self) -> None:
        self._driver.close()

    abort = close

    def sendto(self, data, addr) -> None:
        self._driver.send([(bytes(data), addr)])


UNWATCHED_SEND = 128
"""Datagrams from which a send goes out with the socket unwatched for reading: unwatching and
watching again cost ~3.5 us (uvloop's remove_reader and add_reader with the loop turn that
applies them); each datagram sent while watched, ~0.15 us of wake-up (measured at 2 048
players: 4 % of the relay's CPU). What arrives meanwhile waits in the receive buffer and
the watch, level-triggered, fires at once when it comes back."""


class BatchedEndpointDriver:
    """EndpointDriver's interface over a non-blocking UDP socket read and written in batches.

    A readable socket is drained with recvmmsg, up to ``max_batches`` x ``max_datagrams``
    datagrams per wake-up (one ``now`` per batch), then flushed once; a flush goes out with
    sendmmsg. What the kernel will not take (EAGAIN) waits in a queue of at most ``max_queue``
    datagrams, sent in order when the socket is writable; beyond that datagrams are dropped and
    counted in ``dropped`` (and reported to ``on_error``), never silently.

    ``read_interval`` > 0: after a pass that found datagrams and drained the socket, the socket is
    left unwatched until the interval is up (what arrives meanwhile waits in the kernel's receive
    buffer), so a loaded server wakes about once per interval instead of once per handful of
    datagrams -- each wake-up costs a scheduler switch, an event-loop turn and a flush. While
    every interval's pass finds datagrams the socket stays unwatched and a timer reads it; the
    watch comes back once a pass finds nothing. ``read_now()`` reads at once (the relay server
    calls it before closing a tick's frames, so no waiting input misses its frame). A send of
    UNWATCHED_SEND datagrams or more goes out with the socket unwatched (see there).

    ``defer_flush``: after a read pass the owner gets the core's events at once, but the core
    is flushed only if it has output due now (``Endpoint.output_due``: a handshake reply, a
    queued send, an ack that opens the window, a loss to repair). The owner must then flush at
    least every tick, as the relay server does: a received input's ack rides on the next frame
    anyway, and the pass spares a second visit to every peer it touched (cold in the CPU's
    caches by then at a few hundred players).

    Counters: ``datagrams_received``, ``bytes_received``, ``datagrams_sent`` and ``bytes_sent``
    (what the kernel took), ``dropped`` (send queue overflow, or left unsent at close), ``send_failed`` (refused
    by the kernel or unusable addresses: each is reported to ``on_error``), and the BatchSocket's
    ``send_errors`` / ``recv_errors`` (ICMP-style losses) and ``truncated`` (received datagrams
    longer than ``max_size``), all reported to ``on_error`` as they happen.
    """

    def __init__(self, endpoint: Endpoint, on_events: Callable[[float], None],
                 on_received: Optional[Callable[[int], None]] = None,
                 on_sent: Optional[Callable[[int, int], None]] = None,
                 on_error: Optional[Callable[[Exception], None]] = None,
                 *, sock: socket.socket, max_datagrams: int = 64, max_size: int = 65536,
                 max_batches: int = 16, max_queue: int = 8192,
                 read_interval: float = 0.0, defer_flush: bool = False):
        if not BATCHED_IO:
            raise RuntimeError("batched UDP I/O needs Linux and the compiled relay._batchio")
        self.endpoint = endpoint
        self.on_events = on_events
        self.on_received = on_received
        self.on_sent = on_sent
        self.on_error = on_error
        self.loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self.sock = sock
        self._fd = sock.fileno()
        self.io = _batchio.BatchSocket(self._fd, max_datagrams, max_size)
        # A server's endpoint drops flood datagrams it can tell at a glance before any Python
        # object is made for them (Endpoint.admit_raw), and takes its connected peers' DATA in
        # the receive buffer (Endpoint.receive_raw) unless on_received wants every datagram's
        # size; a client's admits everything.
        if isinstance(endpoint, Endpoint):
            self.io.set_admission(endpoint, in_place=on_received is None)
        self.max_batches = max_batches
        self.max_queue = max_queue
        self.read_interval = read_interval
        self.defer_flush = defer_flush
        self._read_paused: Optional[asyncio.TimerHandle] = None
        self.transport = _BatchedTransport(self, sock)
        self.is_closing = False
        self.dropped = 0
        self.send_failed = 0
        self.datagrams_received = self.bytes_received = 0
        self.datagrams_sent = self.bytes_sent = 0
        self._queue: list = []
        self._queue_head = 0
        self._writing = False
        self._outbox_sent = 0               # the outbox's datagrams send_ready sent already
        self._flush_handle: Optional[asyncio.Handle] = None
        self._wake = WakeTimer(self.loop, self._on_timer)
        self.closed = asyncio.Event()
        self.loop.add_reader(self._fd, self._on_readable)

    # errors

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (the other side went away) and datagrams that could not go: the core's
        # timeouts decide what they mean.
        if self.on_error is not None:
            self.on_error(exc)

    def _lost(self, io_errors: int, truncated: int) -> None:
        io = self.io
        if io.recv_errors + io.send_errors != io_errors:
            self.error_received(OSError(io.last_error, os.strerror(io.last_error)))
        if io.truncated != truncated:
            self.error_received(OSError(errno.EMSGSIZE, f"{io.truncated - truncated} datagram(s) "
                                                        f"longer than {io.max_size} bytes dropped"))

    # receiving

    def _on_readable(self) -> None:
        count = self._read_pass()
        # Pause only once the socket is drained: under a flood the reads go on every loop turn
        # (each bounded by max_batches, so a tick still gets its turn), at full speed.
        if (0 < count < self.max_batches * self.io.max_datagrams and self.read_interval > 0.0
                and self._read_paused is None):
            self.loop.remove_reader(self._fd)
            self._read_paused = self.loop.call_later(self.read_interval, self._resume_reading)

    def _resume_reading(self) -> None:
        self._read_paused = None
        if self.is_closing:
            return
        count = self._read_pass()          # what arrived while paused, at once
        if 0 < count < self.max_batches * self.io.max_datagrams:
            # Still busy: read again one interval from now and leave the socket unwatched, which
            # spares the two epoll_ctl calls (and the loop's bookkeeping) of watching it again
            # only to unwatch it after the next pass.
            self._read_paused = self.loop.call_later(self.read_interval, self._resume_reading)
        else:
            # Quiet (wake on the next datagram), or more waiting than a pass takes (the
            # level-triggered watch fires again at once).
            self.loop.add_reader(self._fd, self._on_readable)

    def read_now(self) -> int:
        """Read and hand to the core whatever is waiting, now (even while paused by
        ``read_interval``); returns the number of datagrams."""
        return self._read_pass()

    def _read_pass(self) -> int:
        if self.is_closing:
            return 0
        io = self.io
        recv = io.recv
        endpoint = self.endpoint
        on_received = self.on_received
        time = self.loop.time
        full = io.max_datagrams
        io_errors, truncated = io.recv_errors + io.send_errors, io.truncated
        read_before, bytes_before = io.datagrams_read, io.bytes_read
        for _ in range(self.max_batches):
            before = io.datagrams_read
            try:
                batch = recv(-1, time())
            except OSError as exc:
                self.error_received(exc)
                break
            if batch:
                if on_received is not None:
                    for data, _addr in batch:
                        on_received(len(data))
                endpoint.receive_batch(batch, time())
            read = io.datagrams_read - before
            if read == 0 or read % full:
                break           # drained: spare the syscall that would say EAGAIN
        # Every datagram read counts, including those the endpoint's admission refused.
        count = io.datagrams_read - read_before
        self.datagrams_received += count
        self.bytes_received += io.bytes_read - bytes_before
        if io.recv_errors + io.send_errors != io_errors or io.truncated != truncated:
            self._lost(io_errors, truncated)
        if count:
            if self.defer_flush:
                self.on_events(time())
                if endpoint.output_due:
                    self.flush()
            else:
                self.flush()
        return count

    # driving

    def now(self) -> float:
        return self.loop.time()

    def request_flush(self) -> None:
        if self._flush_handle is None and not self.is_closing:
            self._flush_handle = self.loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_handle = None
        self.flush()

    def flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self.is_closing:
            return
        now = self.loop.time()
        self.on_events(now)
        in_place = self.io.in_place
        # In place: the connected peers' DATA is written into the endpoint's outbox and goes
        # out from there, after the rest (handshake replies first, as ever).
        sent = self.io.flush_in_place(now) if in_place else self.endpoint.datagrams_to_send(now)
        self.on_events(now)         # timers run inside datagrams_to_send may have closed peers
        if sent:
            self.send(sent)
        if in_place and self.io.outbox_count > self._outbox_sent:
            self._send_outbox(self._outbox_sent)
        self._outbox_sent = 0       # the outbox is the core's again: the next write starts it anew
        self._arm_timer(now)

    def send_ready(self) -> None:
        """Send what the core wrote into its outbox since the last flush, ahead of that flush:
        the relay's rooms' pass calls it every few rooms, so that the first rooms' frames
        leave while the last ones are still being closed. The flush sends the rest."""
        if self.is_closing or not self.io.in_place:
            return
        count = self.io.outbox_written      # 0 until the core writes in it after the last flush
        if count > self._outbox_sent:
            self._send_outbox(self._outbox_sent)
            self._outbox_sent = count

    def _arm_timer(self, now: float) -> None:
        self._wake.arm(self.endpoint.next_timeout(), now)

    def _on_timer(self) -> None:
        self.flush()

    # sending

    def send(self, datagrams: list) -> None:
        """Send [(bytes, address), ...] now, after whatever is already waiting for the socket."""
        if self.is_closing:
            self._drop(len(datagrams), "the driver is closed")
            return
        if self._writing:
            self._enqueue(datagrams, 0)         # keep the order: the queue goes first
            return
        start = self._send_from(datagrams, 0)
        if start < len(datagrams):
            self._enqueue(datagrams, start)

    def _send_outbox(self, start: int = 0) -> None:
        """Send the outbox's datagrams from ``start``; what the socket cannot take now is
        queued as copies."""
        io = self.io
        if self._writing:
            self._enqueue(io.outbox_datagrams(start), 0)     # keep the order: the queue goes first
            return
        start = self._send_from(None, start, io.outbox_count)
        if start < io.outbox_count:
            self._enqueue(io.outbox_datagrams(start), 0)

    def _send_from(self, datagrams: Optional[list], start: int, total: int = -1) -> int:
        """Send datagrams[start:] (None: the endpoint's outbox, ``total`` long) until done or
        EAGAIN; returns the index of the first unsent."""
        if datagrams is not None:
            total = len(datagrams)
        # While the socket is watched for reading, every datagram the kernel frees after sending
        # it wakes the watch's queue (to say "writable", which nobody asked for): a locked queue
        # the other side's datagrams to us also take. A big batch goes out unwatched instead.
        unwatch = total - start >= UNWATCHED_SEND and self._read_paused is None
        if unwatch:
            self.loop.remove_reader(self._fd)
        try:
            return self._send_batches(datagrams, start, total)
        finally:
            if unwatch and not self.is_closing:
                self.loop.add_reader(self._fd, self._on_readable)

    def _send_batches(self, datagrams: Optional[list], start: int, total: int) -> int:
        io = self.io
        count = size = 0
        io_errors = io.recv_errors + io.send_errors
        while start < total:         # each pass consumes at least one datagram or stops
            try:
                done = io.send(datagrams, start) if datagrams is not None else io.send_outbox(start)
            except (OSError, TypeError, ValueError, OverflowError) as exc:
                count += io.last_sent_count
                size += io.last_sent_bytes
                start += getattr(exc, "sent", 0) + 1      # that one cannot go: skip it
                self.send_failed += 1
                self.error_received(exc)
                continue
            count += io.last_sent_count
            size += io.last_sent_bytes
            start += done
            break
        self.datagrams_sent += count
        self.bytes_sent += size
        if count and self.on_sent is not None:
            self.on_sent(count, size)
        if io.recv_errors + io.send_errors != io_errors:
            self._lost(io_errors, io.truncated)
        return start

    def _enqueue(self, datagrams: list, start: int) -> None:
        room = self.max_queue - (len(self._queue) - self._queue_head)
        end = len(datagrams)
        if end - start > room:
            keep = max(room, 0)
            self._drop(end - start - keep, "the send queue is full")
            end = start + keep
        if end > start:
            self._queue.extend(datagrams[start:end])
            if not self._writing:
                self._writing = True
                self.loop.add_writer(self._fd, self._on_writable)

    def _drop(self, count: int, why: str) -> None:
        self.dropped += count
        self.error_received(OSError(errno.ENOBUFS, f"{count} datagram(s) dropped: {why}"))

    def _on_writable(self) -> None:
        if self.is_closing:
            return
        queue = self._queue
        head = self._send_from(queue, self._queue_head)
        if head >= len(queue):
            self._queue = []
            self._queue_head = 0
            self._writing = False
            self.loop.remove_writer(self._fd)
        elif head > 1024 and 2 * head > len(queue):
            del queue[:head]
            self._queue_head = 0
        else:
            self._queue_head = head

    @property
    def queued(self) -> int:
        """Datagrams waiting for the socket to take them."""
        return len(self._queue) - self._queue_head

    def close(self) -> None:
        if self.is_closing:
            return
        self.is_closing = True
        self._wake.cancel()
        if self._read_paused is not None:
            self._read_paused.cancel()
            self._read_paused = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._read_paused is None:
            self.loop.remove_reader(self._fd)
        if self._writing:
            self.loop.remove_writer(self._fd)
            self._writing = False
            head = self._send_from(self._queue, self._queue_head)      # a last try
            if head < len(self._queue):
                self._drop(len(self._queue) - head, "unsent at close")
            self._queue = []
            self._queue_head = 0
        self.sock.close()
        self.closed.set()


async def open_batched_driver(endpoint: Endpoint, local_addr, on_events,
                              receive_buffer: Optional[int] = None, dont_fragment: bool = False,
                              **callbacks) -> BatchedEndpointDriver:
    """Bind a UDP socket at ``local_addr`` (resolved like create_datagram_endpoint does) and
    drive ``endpoint`` over it with batched syscalls. Linux only: see BATCHED_IO.
    ``receive_buffer``: ask the kernel for this SO_RCVBUF (it caps it at net.core.rmem_max).
    ``dont_fragment``: set DF on IPv4 datagrams (see unfragmented)."""
    if not BATCHED_IO:
        raise RuntimeError("batched UDP I/O needs Linux and the compiled relay._batchio")
    loop = asyncio.get_running_loop()
    host, port = local_addr[0], local_addr[1]
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"getaddrinfo({host!r}, {port!r}) returned nothing")
    error: Optional[OSError] = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if receive_buffer:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            if dont_fragment and family == socket.AF_INET:
                # DF on every datagram: the kernel then skips choosing an IP ID per datagram
                # (a hash and a shared counter per destination, ~4 % of the relay's CPU at 2,000
                # players). PROBE, not DO: the path MTU the kernel learns never fails a send.
                sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
            sock.bind(address)
        except OSError as exc:
            sock.close()
            error = error or exc
            continue
        try:
            return BatchedEndpointDriver(endpoint, on_events, sock=sock, **callbacks)
        except BaseException:
            sock.close()
            raise
    assert error is not None        # every address was tried and failed to bind
    raise error
