"""The asyncio shell that pumps a relay_core Endpoint over one UDP socket.

Used by the server and the client SDK alike: datagrams that arrive in one event-loop iteration
are all handed to the core before one flush; a flush lets the owner consume the core's events,
sends what the core returns, and arms a single timer at the core's next_timeout().
"""
from __future__ import annotations

import asyncio
from typing import Callable, Optional

from relay_core import Endpoint


class EndpointDriver(asyncio.DatagramProtocol):
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
        self._flush_pending = False
        self._timer: Optional[asyncio.Handle] = None
        self._timer_deadline = 0.0      # uvloop hands back a plain Handle (no when()) for past times
        self.closed = asyncio.Event()

    # asyncio callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.closed.set()

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (the other side went away) surface here; the core's timeouts decide.
        if self.on_error is not None:
            self.on_error(exc)

    def datagram_received(self, data: bytes, addr) -> None:
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
        if sent and self.on_sent is not None:
            self.on_sent(len(sent), size)
        self._arm_timer(now)

    def _arm_timer(self, now: float) -> None:
        deadline = self.endpoint.next_timeout()
        if self._timer is not None:
            if deadline is not None and abs(self._timer_deadline - deadline) < 0.0005:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer_deadline = deadline
            self._timer = self.loop.call_at(max(deadline, now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


async def open_driver(endpoint: Endpoint, local_addr, on_events, **callbacks) -> EndpointDriver:
    loop = asyncio.get_running_loop()
    _, driver = await loop.create_datagram_endpoint(
        lambda: EndpointDriver(endpoint, on_events, **callbacks), local_addr=local_addr)
    return driver
