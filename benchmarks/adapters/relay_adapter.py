"""Our protocol: two relay_core Endpoints (server and client), each on its own UDP socket, pumped
by relay.transport.EndpointDriver in the calling loop.

One channel, in ``redundant`` or ``reliable_ordered`` mode, on both ends. Everything else is the
EndpointConfig default except ``ack_delay`` (0.005 s unless given; see docs/BENCHMARKS.md).
Both drivers record every datagram they send and receive with its loop time (``DatagramLog``).
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from relay.transport import EndpointDriver
from relay_core import ChannelConfig, Endpoint, EndpointConfig, MessageReceived, PeerConnected, \
    PeerDisconnected

from .base import DatagramLog, EchoAdapter, EchoCallback

CHANNEL = 0


class _RecordingTransport:
    """Stands in for the driver's transport and notes (time, datagram) of every sendto."""

    def __init__(self, transport, loop: asyncio.AbstractEventLoop, log: list):
        self._transport = transport
        self._loop = loop
        self._log = log

    def sendto(self, data, addr=None) -> None:
        self._log.append((self._loop.time(), bytes(data)))
        self._transport.sendto(data, addr)

    def __getattr__(self, name):
        return getattr(self._transport, name)


class _RecordingDriver(EndpointDriver):
    def __init__(self, endpoint: Endpoint, on_events, sent_log: Optional[list],
                 arrived_log: Optional[list]):
        super().__init__(endpoint, on_events)
        self._sent_log = sent_log
        self._arrived_log = arrived_log

    def connection_made(self, transport) -> None:
        if self._sent_log is not None:
            transport = _RecordingTransport(transport, self.loop, self._sent_log)
        super().connection_made(transport)

    def datagram_received(self, data: bytes, addr) -> None:
        if self._arrived_log is not None:
            self._arrived_log.append((self.loop.time(), data))
        super().datagram_received(data, addr)


class RelayAdapter(EchoAdapter):
    """``mode``: ``redundant`` or ``reliable_ordered``."""

    def __init__(self, on_echo: EchoCallback, mode: str = "redundant", ack_delay: float = 0.005,
                 record: bool = True, **config_overrides: Any):
        super().__init__(on_echo)
        if mode not in ("redundant", "reliable_ordered"):
            raise ValueError(f"mode={mode!r}: redundant or reliable_ordered")
        self.mode = mode
        self.name = "ours-redundant" if mode == "redundant" else "ours-reliable"
        self.label = f"ours {mode}"
        self.config = EndpointConfig(channels=(ChannelConfig(mode),), ack_delay=ack_delay,
                                     **config_overrides)
        self.log = DatagramLog() if record else None
        self.server: Optional[_RecordingDriver] = None
        self.client: Optional[_RecordingDriver] = None
        self.peer_id: Optional[int] = None
        self._connected: Optional[asyncio.Future] = None
        self.errors: list[str] = []

    def settings(self) -> dict[str, Any]:
        return {"mode": self.mode, "ack_delay": self.config.ack_delay,
                "rto_min": self.config.rto_min, "rto_initial": self.config.rto_initial,
                "redundancy_budget": self.config.redundancy_budget, "mtu": self.config.mtu,
                "other": "EndpointConfig defaults"}

    async def _open(self, endpoint: Endpoint, on_events, local_addr, sent, arrived):
        loop = self._bind_loop()
        _, driver = await loop.create_datagram_endpoint(
            lambda: _RecordingDriver(endpoint, on_events, sent, arrived), local_addr=local_addr)
        return driver

    async def start_server(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        endpoint = Endpoint(self.config.replace(accept_connections=True, seed=1))
        log = self.log
        self.server = await self._open(endpoint, self._server_events, (host, port),
                                       log.down_sent if log else None,
                                       log.up_arrived if log else None)
        return self.server.transport.get_extra_info("sockname")[:2]

    def _server_events(self, _now: float) -> None:
        endpoint = self.server.endpoint
        while (event := endpoint.next_event()) is not None:
            if type(event) is MessageReceived:
                # Echoed inside the same flush: datagrams_to_send() follows on_events().
                endpoint.send(event.peer_id, CHANNEL, event.payload)

    async def connect(self, host: str, port: int, timeout: float = 10.0) -> None:
        loop = self._bind_loop()
        endpoint = Endpoint(self.config.replace(seed=2))
        log = self.log
        self.client = await self._open(endpoint, self._client_events, ("127.0.0.1", 0),
                                       log.up_sent if log else None,
                                       log.down_arrived if log else None)
        self._connected = loop.create_future()
        self.peer_id = endpoint.connect((host, port), loop.time())
        self.client.request_flush()
        await asyncio.wait_for(asyncio.shield(self._connected), timeout)

    def _client_events(self, now: float) -> None:
        endpoint = self.client.endpoint
        on_echo = self.on_echo
        while (event := endpoint.next_event()) is not None:
            kind = type(event)
            if kind is MessageReceived:
                on_echo(event.payload, now)
            elif kind is PeerConnected:
                if not self._connected.done():
                    self._connected.set_result(None)
            elif kind is PeerDisconnected:
                self.errors.append(f"client disconnected: {event.reason}")
                if not self._connected.done():
                    self._connected.set_exception(ConnectionError(event.reason))

    def send(self, payload: bytes) -> None:
        if not self.client.endpoint.send(self.peer_id, CHANNEL, payload):
            self.errors.append("send refused (peer gone or queue full)")
        self.client.request_flush()

    def peer_stats(self) -> dict[str, Any]:
        """The client's and the server's view of the connection (relay_core PeerStats)."""
        out = {}
        for side, driver in (("client", self.client), ("server", self.server)):
            if driver is None:
                continue
            for peer_id in driver.endpoint.peer_ids:
                stats = driver.endpoint.peer_stats(peer_id)
                out[side] = {name: getattr(stats, name) for name in stats.__dataclass_fields__}
        return out

    async def close(self) -> None:
        for driver in (self.client, self.server):
            if driver is not None and driver.transport is not None:
                driver.close()
                await asyncio.wait([asyncio.ensure_future(driver.closed.wait())], timeout=1.0)
        self.client = self.server = None

    def datagram_log(self) -> Optional[DatagramLog]:
        return self.log
