"""KCP through the PyPI ``kcp`` binding (ikcp.c): two KCP control blocks carried over UDP by us.

KCP is sans-I/O: its output callback hands us segments and we ``sendto`` them; every datagram
we receive goes to ``ikcp_input``. ``ikcp_update`` runs on a shared 1 ms tick with the loop's
clock in milliseconds (KCP itself only flushes every ``interval``). After each ``send`` (client)
and each echo (server) we call ``ikcp_flush`` so the segment leaves at once (what kcp-go does on
every Write); acks and retransmissions wait for KCP's own interval flush.

Modes (the two presets of the KCP README; window sizes and MTU at KCP's defaults: send window
32, receive window 128, MTU 1400, message mode):

* ``normal``: ``ikcp_nodelay(kcp, 0, 40, 0, 0)``: RTO floor 100 ms, x2 backoff, no fast
  resend, congestion window on.
* ``fast``: ``ikcp_nodelay(kcp, 1, 10, 2, 1)``: RTO floor 30 ms, x1.5 backoff, fast resend after
  2 skipping acks, congestion window off.
"""
from __future__ import annotations

from typing import Any, Optional

from .base import EchoAdapter, EchoCallback, Ticker, UdpSocket

CONV_ID = 0x5EED
MODES = {
    # nodelay, interval ms, resend, nc (no congestion control)
    "normal": (False, 40, 0, False),
    "fast": (True, 10, 2, True),
}
SEND_WINDOW = 32
RECEIVE_WINDOW = 128
MTU = 1400


def import_kcp():
    """The KCP class of the ``kcp`` package; raises ImportError with the reason if unavailable."""
    from kcp import KCP     # PyPI: kcp
    return KCP


class KcpAdapter(EchoAdapter):
    def __init__(self, on_echo: EchoCallback, mode: str = "fast"):
        super().__init__(on_echo)
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.name = f"kcp-{mode}"
        self.label = f"KCP {mode}"
        self.KCP = import_kcp()
        self.server_socket: Optional[UdpSocket] = None
        self.client_socket: Optional[UdpSocket] = None
        self.server_kcp = None
        self.client_kcp = None
        self.client_peer: Optional[tuple] = None        # as seen by the server (the emulator)
        self.server_address: Optional[tuple] = None     # as dialled by the client
        self._tick_token: Optional[int] = None
        self._epoch = 0.0
        self.errors: list[str] = []

    def settings(self) -> dict[str, Any]:
        nodelay, interval, resend, nc = MODES[self.mode]
        return {"nodelay": int(nodelay), "interval_ms": interval, "resend": resend, "nc": int(nc),
                "send_window": SEND_WINDOW, "receive_window": RECEIVE_WINDOW, "mtu": MTU,
                "update": "every 1 ms", "flush_after_send": True}

    def _new_kcp(self, output):
        nodelay, interval, resend, nc = MODES[self.mode]
        kcp = self.KCP(CONV_ID, max_transmission=MTU, no_delay=nodelay, update_interval=interval,
                       resend_count=resend, no_congestion_control=nc,
                       send_window_size=SEND_WINDOW, receive_window_size=RECEIVE_WINDOW)
        kcp.include_outbound_handler(output)
        # ikcp_flush does nothing before the first ikcp_update.
        kcp.update(self._ms(self.loop.time()))
        return kcp

    def _ms(self, now: float) -> int:
        return int((now - self._epoch) * 1000.0) & 0xFFFFFFFF

    def _ensure_ticking(self) -> None:
        loop = self._bind_loop()
        if self._tick_token is None:
            self._epoch = loop.time()
            self._tick_token = Ticker.for_loop(loop).add(self._tick)

    def _tick(self, now: float) -> None:
        ms = self._ms(now)
        if self.server_kcp is not None:
            self.server_kcp.update(ms)
        if self.client_kcp is not None:
            self.client_kcp.update(ms)

    async def start_server(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        loop = self._bind_loop()
        self._ensure_ticking()
        self.server_kcp = self._new_kcp(self._server_output)
        _, self.server_socket = await loop.create_datagram_endpoint(
            lambda: UdpSocket(self._server_datagram), local_addr=(host, port))
        return self.server_socket.transport.get_extra_info("sockname")[:2]

    def _server_output(self, _kcp, data: bytes) -> None:
        if self.client_peer is not None and self.server_socket is not None:
            self.server_socket.transport.sendto(data, self.client_peer)

    def _server_datagram(self, data: bytes, addr) -> None:
        if self.client_peer is None:
            self.client_peer = addr
        kcp = self.server_kcp
        try:
            kcp.receive(data)
        except Exception as exc:    # noqa: BLE001 - a foreign datagram: count, carry on
            self.errors.append(f"server input: {exc!r}")
            return
        echoed = False
        for message in kcp.get_all_received():
            kcp.enqueue(bytes(message))
            echoed = True
        if echoed:
            kcp.flush()

    async def connect(self, host: str, port: int, timeout: float = 10.0) -> None:
        """KCP has no handshake: connecting is opening the socket."""
        loop = self._bind_loop()
        self._ensure_ticking()
        self.server_address = (host, port)
        self.client_kcp = self._new_kcp(self._client_output)
        _, self.client_socket = await loop.create_datagram_endpoint(
            lambda: UdpSocket(self._client_datagram), local_addr=("127.0.0.1", 0))

    def _client_output(self, _kcp, data: bytes) -> None:
        if self.client_socket is not None:
            self.client_socket.transport.sendto(data, self.server_address)

    def _client_datagram(self, data: bytes, _addr) -> None:
        kcp = self.client_kcp
        try:
            kcp.receive(data)
        except Exception as exc:    # noqa: BLE001
            self.errors.append(f"client input: {exc!r}")
            return
        now = self.loop.time()
        for message in kcp.get_all_received():
            self.on_echo(bytes(message), now)

    def send(self, payload: bytes) -> None:
        self.client_kcp.enqueue(payload)
        self.client_kcp.flush()

    async def close(self) -> None:
        if self._tick_token is not None and self.loop is not None:
            Ticker.for_loop(self.loop).remove(self._tick_token)
            self._tick_token = None
        for sock in (self.client_socket, self.server_socket):
            if sock is not None:
                await sock.close()
        self.client_socket = self.server_socket = None
        self.client_kcp = self.server_kcp = None
