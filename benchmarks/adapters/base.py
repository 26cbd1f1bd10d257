"""The interface every protocol adapter of the loss/latency benchmark implements.

An adapter owns both ends of one connection, in the calling event loop:

* ``await start_server(host, port)`` binds the echo server (port 0 picks a free one) and returns
  its bound ``(host, port)``. The server sends back every message it receives, unchanged, on the
  same reliable ordered stream, as soon as it has it.
* ``await connect(host, port)`` opens the client towards ``(host, port)`` (in the benchmark: the
  link emulator in front of the server) and returns once the protocol says it is connected.
* ``send(payload)`` queues one message on the client's reliable ordered stream and starts
  sending it at once (no waiting for a timer tick).
* every echo the client receives is handed to ``on_echo(payload, now)``, in delivery order,
  with ``now`` = ``loop.time()`` at the moment the protocol handed it to us.
* ``await close()`` releases sockets and timers; it is idempotent.

Protocols that are not asyncio-native (ENet, KCP) are driven from the same loop: their socket is
watched with ``loop.add_reader`` so arriving datagrams are processed at once, and a shared 1 ms
``Ticker`` runs their timers (``enet_host_service`` / ``ikcp_update``).

``datagram_log()`` returns a ``DatagramLog`` (every datagram each side sent, with its send time,
and every datagram each side received, with its arrival time) for adapters that can record it;
the benchmark derives the redundancy limit from it.
"""
from __future__ import annotations

import abc
import asyncio
import collections
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

EchoCallback = Callable[[bytes, float], None]

TICK_SECONDS = 0.001


@dataclass
class DatagramLog:
    """Per-datagram times of one connection, both directions (up = client -> server).

    ``up_sent`` / ``down_sent``: (send time, datagram) in the order the client / server socket
    sent them. ``up_arrived`` / ``down_arrived``: (arrival time, datagram) in the order the server
    / client socket received them. Times are ``loop.time()`` of the one loop everything runs in.
    """

    up_sent: list = field(default_factory=list)
    down_sent: list = field(default_factory=list)
    up_arrived: list = field(default_factory=list)
    down_arrived: list = field(default_factory=list)


class EchoAdapter(abc.ABC):
    """Base class; see the module docstring for the contract."""

    name = "?"
    """Short protocol id used on the command line and in the results (e.g. ``enet``)."""
    label = "?"
    """Human-readable name for tables and plots."""

    def __init__(self, on_echo: EchoCallback):
        self.on_echo = on_echo
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    @abc.abstractmethod
    async def start_server(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Bind the echo server; returns its address."""

    @abc.abstractmethod
    async def connect(self, host: str, port: int, timeout: float = 10.0) -> None:
        """Connect the client to the echo server."""

    @abc.abstractmethod
    def send(self, payload: bytes) -> None:
        """Queue one message on the reliable ordered stream."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close both ends and release their sockets."""

    def datagram_log(self) -> Optional[DatagramLog]:
        return None

    def settings(self) -> dict[str, Any]:
        """The protocol settings in force, for the results file."""
        return {}

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        return self.loop


class Ticker:
    """One periodic timer per event loop that every polled adapter shares.

    Callbacks get ``loop.time()``; the schedule is absolute (no drift) and a late tick is not
    made up for. Sharing one timer keeps the loop from waking once per adapter per millisecond.
    """

    _by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Ticker]" = \
        weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop, period: float = TICK_SECONDS):
        self.loop = loop
        self.period = period
        self.callbacks: "collections.OrderedDict[int, Callable[[float], None]]" = \
            collections.OrderedDict()
        self._next_id = 0
        self._handle: Optional[asyncio.TimerHandle] = None
        self._due = 0.0

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> "Ticker":
        ticker = cls._by_loop.get(loop)
        if ticker is None:
            ticker = cls._by_loop[loop] = cls(loop)
        return ticker

    def add(self, callback: Callable[[float], None]) -> int:
        self._next_id += 1
        self.callbacks[self._next_id] = callback
        if self._handle is None:
            self._due = self.loop.time() + self.period
            self._handle = self.loop.call_at(self._due, self._tick)
        return self._next_id

    def remove(self, token: int) -> None:
        self.callbacks.pop(token, None)
        if not self.callbacks and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now = self.loop.time()
        for callback in list(self.callbacks.values()):
            callback(now)
        if not self.callbacks:
            self._handle = None
            return
        self._due += self.period
        if self._due <= now:
            self._due = now + self.period
        self._handle = self.loop.call_at(self._due, self._tick)


class UdpSocket(asyncio.DatagramProtocol):
    """A minimal asyncio UDP socket that hands datagrams to a callback (used by KCP)."""

    def __init__(self, on_datagram: Callable[[bytes, Any], None]):
        self.on_datagram = on_datagram
        self.transport: Optional[asyncio.DatagramTransport] = None
        self.closed: Optional[asyncio.Future] = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.closed = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr) -> None:
        self.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        pass    # ICMP port unreachable while the other side is not up: a lost datagram

    def connection_lost(self, exc) -> None:
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        if self.closed is not None:
            await asyncio.wait([self.closed], timeout=1.0)
