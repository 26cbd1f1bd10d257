"""ENet through pyenet: one server host and one client host, reliable packets on channel 0.

ENet keeps its own non-blocking socket and clock. We call ``host.service(0)`` whenever its socket
is readable (``loop.add_reader``) and on a shared 1 ms tick (its resend, ack and ping timers),
and ``host.flush()`` right after every send, so a message leaves at once instead of at the next
tick. Everything else is ENet's default: unlimited bandwidth, default RTT/RTO, throttle,
ping interval and timeouts.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from .base import EchoAdapter, EchoCallback, Ticker


def import_enet():
    """The pyenet module; raises ImportError with the reason if it cannot be loaded."""
    import enet     # PyPI: pyenet
    return enet


class EnetAdapter(EchoAdapter):
    name = "enet"
    label = "ENet (reliable)"

    def __init__(self, on_echo: EchoCallback):
        super().__init__(on_echo)
        self.enet = import_enet()
        self.server = None
        self.client = None
        self.peer = None
        self._readers: list[int] = []
        self._tick_token: Optional[int] = None
        self._connected: Optional[asyncio.Future] = None
        self.errors: list[str] = []

    def settings(self) -> dict[str, Any]:
        try:
            from importlib.metadata import version
            pyenet_version = version("pyenet")
        except Exception:   # noqa: BLE001 - informational only
            pyenet_version = "?"
        return {"pyenet": pyenet_version, "flags": "PACKET_FLAG_RELIABLE", "channels": 1,
                "bandwidth": "unlimited (0/0)", "service": "on readable + every 1 ms",
                "flush_after_send": True, "other": "ENet defaults"}

    def _start_polling(self, host, service) -> None:
        loop = self._bind_loop()
        fd = host.socket.fileno()
        loop.add_reader(fd, service)
        self._readers.append(fd)
        if self._tick_token is None:
            self._tick_token = Ticker.for_loop(loop).add(self._tick)

    def _tick(self, _now: float) -> None:
        if self.server is not None:
            self._service_server()
        if self.client is not None:
            self._service_client()

    async def start_server(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        enet = self.enet
        self.server = enet.Host(enet.Address(host.encode(), port), 8, 1, 0, 0)
        self._start_polling(self.server, self._service_server)
        return host, self.server.address.port

    def _service_server(self) -> None:
        enet = self.enet
        host = self.server
        if host is None:
            return
        sent = False
        while True:
            event = host.service(0)
            if event is None or event.type == enet.EVENT_TYPE_NONE:
                break
            if event.type == enet.EVENT_TYPE_RECEIVE:
                event.peer.send(0, enet.Packet(event.packet.data, enet.PACKET_FLAG_RELIABLE))
                sent = True
        if sent:
            host.flush()

    async def connect(self, host: str, port: int, timeout: float = 10.0) -> None:
        enet = self.enet
        loop = self._bind_loop()
        self._connected = loop.create_future()
        self.client = enet.Host(None, 1, 1, 0, 0)
        self.peer = self.client.connect(enet.Address(host.encode(), port), 1)
        self._start_polling(self.client, self._service_client)
        self.client.flush()
        await asyncio.wait_for(asyncio.shield(self._connected), timeout)

    def _service_client(self) -> None:
        enet = self.enet
        host = self.client
        if host is None:
            return
        while True:
            event = host.service(0)
            if event is None or event.type == enet.EVENT_TYPE_NONE:
                break
            kind = event.type
            if kind == enet.EVENT_TYPE_RECEIVE:
                self.on_echo(event.packet.data, self.loop.time())
            elif kind == enet.EVENT_TYPE_CONNECT:
                if not self._connected.done():
                    self._connected.set_result(None)
            elif kind == enet.EVENT_TYPE_DISCONNECT:
                self.errors.append("client disconnected")
                if not self._connected.done():
                    self._connected.set_exception(ConnectionError("ENet connect failed"))

    def send(self, payload: bytes) -> None:
        enet = self.enet
        if self.peer.send(0, enet.Packet(payload, enet.PACKET_FLAG_RELIABLE)) < 0:
            self.errors.append("peer.send failed")
        self.client.flush()

    async def close(self) -> None:
        loop = self.loop
        if loop is not None:
            for fd in self._readers:
                loop.remove_reader(fd)
            if self._tick_token is not None:
                Ticker.for_loop(loop).remove(self._tick_token)
        self._readers.clear()
        self._tick_token = None
        if self.peer is not None and self.client is not None:
            try:
                self.peer.disconnect_now()
                self.client.flush()
            except Exception:   # noqa: BLE001 - best effort at teardown
                pass
        # pyenet destroys the host (and closes its socket) when the object is freed.
        self.peer = None
        self.client = None
        self.server = None
