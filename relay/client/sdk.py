"""The asyncio client SDK: connect to a relay, join a room, send inputs, receive frames in order.

    client = await RelayClient.connect("127.0.0.1", 7777, room="lobby-1", player="alice",
                                       auto_input_delay=True)
    await client.wait_for_state("running")
    client.send_next_input(b"\\x01\\x00")     # for frames S .. S + input_delay - 1
    async for frame in client.frames():        # every frame once, in order, from frame 0
        simulate(frame.inputs)
        client.report_checksum(frame.number, state_hash())
        client.send_next_input(read_controls())  # for frame.number + input_delay

Frames come live on the STREAM channel; a late joiner's (or a reconnecting or lagging client's)
missing frames come as one block. The SDK merges both by frame number, so ``frames()`` yields
each frame exactly once with no gap, whatever the mix. Frames are kept as received and decoded
when yielded, in order, since a compact FRAME may repeat the previous frame's inputs by
reference.

Input delay: ``send_next_input`` sends for the frame ``input_delay`` frames after the last one
yielded. The relay advises a delay from how long this player's inputs take to arrive
(``advised_input_delay``); with ``auto_input_delay=True`` the SDK adopts it, without ever giving
one frame two inputs or leaving a frame without one (a raise fills the frames it skips over).
"""
from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Optional

from relay import protocol
from relay.errors import RelayError
from relay.protocol import (
    CONTROL, STREAM, Checksum, Frame, FrameDecoder, Input, Join, ProtocolError, Welcome,
)
from relay.transport import EndpointDriver, open_driver
from relay_core import (
    BlockReceived, Endpoint, EndpointConfig, MessageReceived, PeerConnected, PeerDisconnected,
)
from relay_core.token import ConnectToken


def _relay_error(code: str, message: str) -> RelayError:
    """The relay refused us or the connection ended; ``code`` says why."""
    return RelayError(f"{code}: {message}", code)


HANDSHAKE_REFUSALS = {
    "server_full": "the relay has its maximum of connected clients",
    "token_invalid": "the connect token was not minted with a key this relay has, or was altered",
    "token_expired": "the connect token has expired; ask the game backend for a new one",
    "token_used": "the connect token was used already (tokens are single-use); ask the game "
                  "backend for a new one",
    "token_required": "this relay admits only clients with a connect token (token mode)",
    "token_unsupported": "this relay runs in open mode and takes no connect tokens",
    "source_session_limit": "this address already has as many connections as the relay allows "
                            "one address in open mode (security.max_sessions_per_source)",
}
"""Why the relay may refuse a connection during the handshake (PeerDisconnected "refused:X")."""


def _disconnect_error(reason: str) -> RelayError:
    """The RelayError for a PeerDisconnected reason: a handshake refusal gets its own code."""
    if reason.startswith("refused:"):
        code = reason[len("refused:"):]
        return _relay_error(code, "the relay refused the connection: "
                          + HANDSHAKE_REFUSALS.get(code, code))
    return _relay_error("disconnected", reason)


@dataclass
class ClientStats:
    """``RelayClient.stats()``: the connection's measurements (zeros while it is down) and the
    SDK's frame counts."""

    rtt: float
    """Smoothed round-trip time to the relay, seconds."""
    rtt_variance: float
    """Variance of the round-trip time, seconds."""
    loss: float
    """Estimated fraction of this client's packets the relay never acknowledged."""
    frames_received: int
    """Frames received and buffered, live or in blocks, duplicates not counted."""
    duplicates_ignored: int
    """Frames received again (live and in a block, or twice) and discarded."""
    blocks_received: int
    """History and catch-up blocks received."""
    packets_sent: int
    packets_received: int
    bytes_sent: int
    bytes_received: int


def client_config(ack_delay: float = 1 / 30, **overrides) -> EndpointConfig:
    """The protocol core's settings a client uses by default: the relay's two channels, blocks
    up to the relay's largest history block, the core's defaults for the rest; ``overrides``
    are further ``EndpointConfig`` fields (e.g. ``peer_timeout``)."""
    return EndpointConfig(channels=protocol.endpoint_channels(), ack_delay=ack_delay,
                          redundancy_budget=overrides.pop("redundancy_budget", 1200),
                          max_block_size=protocol.MAX_BLOCK_SIZE, block_memory_limit=64 * 1024 * 1024,
                          **overrides)


@dataclass
class InputDelayAdvice:
    frames: int
    """The advised input delay."""
    response_ms: int
    """The relay's measure of this player's input response time (percentile plus margin)."""
    late: int
    """Of the ``inputs`` frames answered, how many with an input that arrived after its frame had
    closed."""
    inputs: int
    """How many of the relay's last ``rooms.input_delay_window`` frames the player answered."""


class RelayClient:
    """One connection to a relay, joined to one room as a player or a spectator.

    ``await RelayClient.connect(host, port, room, player, ...)`` connects and joins (``token``
    for a relay in token mode; it names the room and the player). Then:

    * ``wait_for_state("running")``, then ``send_next_input(payload)`` once and again after
      each frame: the input for the frame ``input_delay`` frames after the last one yielded;
    * ``async for frame in frames()`` (or ``next_frame_or_none()``): every ``Frame`` of the room
      once, in order, from frame 0, live and history merged;
    * ``report_checksum(frame, value)`` for desync detection (reports land in ``desyncs``);
    * the room's end: ``room_state == "ended"``, ``final_frames`` and ``end_reason``; a lost
      connection: ``error``; ``reconnect()`` to take the slot back; ``close()`` to leave.

    Refusals raise ``RelayError`` (its ``code`` is the relay's reason). docs/CLIENT_SDK.md is
    the reference.
    """

    def __init__(self, host: str, port: int, room: Optional[str] = None,
                 player: Optional[str] = None, spectator: bool = False,
                 config: Optional[EndpointConfig] = None, input_delay: int = 2,
                 auto_input_delay: bool = False, token: "ConnectToken | str | None" = None):
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.server_address: tuple[str, int] = (str(address[0]), int(address[1]))
        self.token = self._check_token(token)
        """The connect token of the next connection (a token-mode relay needs one, single-use)."""
        # A token names its room and player; the relay refuses a JOIN naming others.
        room = room if room is not None else (self.token.room if self.token else None)
        player = player if player is not None else (self.token.player if self.token else None)
        if room is None or player is None:
            raise ValueError("room and player are required (or a token, which names them)")
        self.room: str = room
        self.player: str = player
        self.spectator = spectator
        self.config = config or client_config()
        self.welcome: Optional[Welcome] = None
        """The relay's WELCOME of the current connection: slot, tick rate, first live frame."""
        self.room_state: Optional[str] = None
        """"waiting", "running" or "ended", as the relay last said (None before the welcome)."""
        self.final_frames: Optional[int] = None
        """Once the room has ended: the number of frames it closed. Frames 0 .. final_frames-1
        all exist, and frames() yields every one of them before it stops. None until then."""
        self.end_reason: Optional[str] = None
        """Once the room has ended: why. "empty" (nobody connected for rooms.empty_timeout),
        "admin" or the admin's own text (ended through the admin API), "draining" (the relay
        began draining while the room waited, or its last member left during a drain),
        "drain_deadline" (the relay was draining and server.drain_timeout ran out during the
        match), "shutdown" (the relay stopped at once). None until then."""
        self.desyncs: list[list] = []
        """DESYNC reports, each [frame, {player: checksum}, minority, verdict, groups]."""
        self.notices: list[list] = []
        """The relay's complaints about this client's messages, each [code, text]."""
        self.next_frame = 0
        """Number of the next frame frames() will yield; everything before it was yielded."""
        if input_delay < 1:
            raise ValueError(f"input_delay={input_delay!r}: at least 1 frame")
        self.input_delay = input_delay
        """Frames between the last frame yielded and the frame send_next_input() is for."""
        self.auto_input_delay = auto_input_delay
        """Adopt the relay's advice (``advised_input_delay``) at each send_next_input()."""
        self.input_delay_advice: Optional[InputDelayAdvice] = None
        """The relay's latest INPUT_DELAY message, if any."""
        self.last_input_frame = -1
        """Highest frame an input was sent for."""
        self._buffer: dict[int, bytes] = {}
        self._decoder = FrameDecoder()
        self._ready = asyncio.Event()
        self._frame_ready = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._error: Optional[RelayError] = None
        self._frames_received = 0
        self._duplicates = 0
        self._blocks = 0
        self.endpoint: Optional[Endpoint] = None
        self.driver: Optional[EndpointDriver] = None
        self.peer_id: Optional[int] = None

    # -- connecting -------------------------------------------------------------------------

    @classmethod
    async def connect(cls, host: str, port: int, room: Optional[str] = None,
                      player: Optional[str] = None, spectator: bool = False,
                      timeout: float = 5.0, config: Optional[EndpointConfig] = None,
                      input_delay: int = 2, auto_input_delay: bool = False,
                      token: "ConnectToken | str | None" = None) -> "RelayClient":
        """Connect and join; returns once the relay has welcomed us (raises RelayError if not:
        its ``code`` is the relay's reason, e.g. room_full, token_expired, wrong_room).

        ``token``: the connect token from the game backend (``ConnectToken`` or its text), for
        a relay in token mode; room and player default to the token's."""
        client = cls(host, port, room, player, spectator, config, input_delay=input_delay,
                     auto_input_delay=auto_input_delay, token=token)
        await client._open(timeout)
        return client

    @staticmethod
    def _check_token(token: "ConnectToken | str | None") -> "Optional[ConnectToken]":
        if token is None or isinstance(token, ConnectToken):
            return token
        if isinstance(token, str):
            return ConnectToken.decode(token)       # TokenError (a ValueError) if garbled
        raise TypeError(f"token: a ConnectToken, its text or None, not {type(token).__name__}")

    async def _open(self, timeout: float) -> None:
        self.endpoint = endpoint = Endpoint(self.config)
        self.welcome = None
        family_host = "::" if ":" in self.server_address[0] else "0.0.0.0"
        self.driver = driver = await open_driver(endpoint, (family_host, 0), self._on_events)
        self._ready.clear()
        self.peer_id = endpoint.connect(self.server_address, driver.now(), token=self.token)
        endpoint.send(self.peer_id, CONTROL, Join(self.room, self.player, self.spectator).encode())
        driver.flush()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            self._hang_up()
            raise _relay_error("timeout", f"no welcome from {self.server_address} within {timeout} s") from None
        if self._error is not None:
            self._hang_up()
            raise self._error

    def _hang_up(self) -> None:
        """Close without waiting: say goodbye if connected, so the relay frees the slot now."""
        live = self._connection()
        if live is not None:
            endpoint, driver, peer_id = live
            endpoint.disconnect(peer_id, "closed")
            driver.flush()
        if self.driver is not None:
            self.driver.close()

    async def reconnect(self, timeout: float = 5.0,
                        token: "ConnectToken | str | None" = None) -> None:
        """Drop this connection (as a network change would) and rejoin with the same player
        from a new socket. The relay gives the slot back; frames() resumes without gap or
        duplicate. A token-mode relay needs a fresh ``token`` (tokens are single-use)."""
        if token is not None:
            self.token = self._check_token(token)
        if self.driver is not None:
            self.driver.close()
        self._error = None
        await self._open(timeout)

    async def close(self, leave: bool = True) -> None:
        """Leave the room (if ``leave``) and disconnect gracefully."""
        if self.driver is None or self.endpoint is None:
            return
        live = self._connection()
        if live is not None:
            endpoint, driver, peer_id = live
            if leave:
                endpoint.send(peer_id, CONTROL, protocol.pack(protocol.LEAVE))
                driver.flush()
            endpoint.disconnect(peer_id, "closed")
            driver.flush()
        self.driver.close()
        self._frame_ready.set()

    # -- sending ----------------------------------------------------------------------------

    @property
    def have(self) -> int:
        """Highest frame held with every frame before it (reported to the relay with inputs)."""
        return self.next_frame - 1 + self._contiguous_buffered()

    def _contiguous_buffered(self) -> int:
        count = 0
        while self.next_frame + count in self._buffer:
            count += 1
        return count

    def send_input(self, frame: int, payload: bytes) -> bool:
        """Queue our input for ``frame``; it goes out with the next datagram on the redundant
        channel, which repeats it while the link is losing packets until it is acknowledged."""
        live = self._connection()
        if live is None:
            return False
        endpoint, driver, peer_id = live
        sent = endpoint.send(peer_id, STREAM, Input(frame, payload, self.have).encode())
        driver.request_flush()
        if sent:
            self.last_input_frame = max(self.last_input_frame, frame)
        return sent

    @property
    def advised_input_delay(self) -> Optional[int]:
        """The input delay the relay advises for this player's link, frames (None: not yet)."""
        return self.input_delay_advice.frames if self.input_delay_advice else None

    def send_next_input(self, payload: bytes) -> list[int]:
        """Send ``payload`` as the input for frame (last frame yielded + ``input_delay``);
        returns the frames it was sent for. Every frame gets exactly one input from here:
        after a rise of the delay (or at the start of play) the payload also goes to the frames
        between the last one sent and the new target; after a fall, calls send nothing ([])
        until the target passes the last frame sent."""
        if self.auto_input_delay and self.advised_input_delay is not None:
            self.input_delay = self.advised_input_delay
        # The frames before the first live one are history: closed, no input can reach them.
        live_from = self.welcome.next_frame if self.welcome is not None else 0
        base = max(self.next_frame, live_from) - 1
        target = base + self.input_delay
        sent = []
        for frame in range(max(self.last_input_frame + 1, base + 1), target + 1):
            if not self.send_input(frame, payload):
                break
            sent.append(frame)
        return sent

    def report_checksum(self, frame: int, value: int) -> None:
        """Report a hash of the game state after simulating ``frame`` (desync detection)."""
        live = self._connection()
        if live is not None:
            endpoint, driver, peer_id = live
            endpoint.send(peer_id, CONTROL, Checksum(frame, value & 0xFFFFFFFFFFFFFFFF).encode())
            driver.request_flush()

    def ready(self) -> None:
        """Mark this player ready (matters only to a room with the "ready" start policy)."""
        live = self._connection()
        if live is not None:
            endpoint, driver, peer_id = live
            endpoint.send(peer_id, CONTROL, protocol.pack(protocol.READY))
            driver.request_flush()

    def _connection(self) -> Optional[tuple[Endpoint, EndpointDriver, int]]:
        """(endpoint, driver, peer id) while connected, else None."""
        if self.endpoint is None or self.driver is None or self.peer_id is None:
            return None
        if not self.endpoint.is_connected(self.peer_id):
            return None
        return self.endpoint, self.driver, self.peer_id

    def _live(self) -> bool:
        return self._connection() is not None

    # -- receiving --------------------------------------------------------------------------

    async def frames(self) -> AsyncIterator[Frame]:
        """Every frame, once, in order. Ends when the room ends or the connection is lost."""
        while True:
            frame = await self.next_frame_or_none()
            if frame is None:
                return
            yield frame

    async def next_frame_or_none(self, timeout: Optional[float] = None) -> Optional[Frame]:
        """The next frame in order; None when the room has ended or the connection is gone."""
        while True:
            data = self._buffer.pop(self.next_frame, None)
            if data is not None:
                try:
                    frame = self._decoder.decode(data)
                except ProtocolError as error:
                    # Frames refer to their predecessor: nothing after this one can be decoded.
                    self._error = _relay_error("bad_frame", str(error))
                    return None
                self.next_frame += 1
                return frame
            if self.room_state == "ended" and (self.final_frames is None
                                               or self.next_frame >= self.final_frames):
                return None
            if self._error is not None:
                return None
            self._frame_ready.clear()
            await asyncio.wait_for(self._frame_ready.wait(), timeout)

    async def wait_for_state(self, state: str, timeout: float = 10.0) -> None:
        """Return once ``room_state`` is ``state``; asyncio.TimeoutError after ``timeout`` s."""
        while self.room_state != state:
            self._state_changed.clear()
            await asyncio.wait_for(self._state_changed.wait(), timeout)

    @property
    def connected(self) -> bool:
        """True while the connection to the relay is up."""
        return self._live()

    @property
    def error(self) -> Optional[RelayError]:
        """Why the connection ended (code "disconnected", the reason in the message) or the
        stream broke ("bad_frame"); None while all is well."""
        return self._error

    def stats(self) -> ClientStats:
        """RTT, loss and traffic of the connection, and the frames received."""
        live = self._connection()
        core = live[0].peer_stats(live[2]) if live is not None else None
        return ClientStats(
            rtt=core.rtt if core else 0.0, rtt_variance=core.rtt_variance if core else 0.0,
            loss=core.loss if core else 0.0, frames_received=self._frames_received,
            duplicates_ignored=self._duplicates, blocks_received=self._blocks,
            packets_sent=core.packets_sent if core else 0,
            packets_received=core.packets_received if core else 0,
            bytes_sent=core.bytes_sent if core else 0, bytes_received=core.bytes_received if core else 0)

    def _on_events(self, now: float) -> None:
        if self.endpoint is None:
            return
        while (event := self.endpoint.next_event()) is not None:
            if type(event) is MessageReceived:
                self._on_message(event.channel, event.payload)
            elif type(event) is BlockReceived:
                self._on_history(event.data)
            elif type(event) is PeerDisconnected:
                if self._error is None:
                    self._error = _disconnect_error(event.reason)
                self._ready.set()
                self._frame_ready.set()
                self._state_changed.set()
            elif type(event) is PeerConnected:
                pass

    def _on_message(self, channel: int, payload: bytes) -> None:
        if payload[:1] == b"\xc1":
            try:
                self._store(protocol.frame_number(payload), payload)
            except ProtocolError:
                pass
            return
        try:
            message = protocol.decode_relay_message(payload)
        except ProtocolError:
            return
        if isinstance(message, Welcome):
            self.welcome = message
            self.room_state = message.state
            # A live frame may have arrived before anything else; history covers the rest.
            self._ready.set()
            self._state_changed.set()
        elif message[0] == protocol.REFUSED:
            if self.welcome is None:
                self._error = _relay_error(message[1], message[2])
                self._ready.set()
            else:
                self.notices.append(message[1:])    # e.g. a second JOIN on this connection
        elif message[0] == protocol.ROOM_STATE:
            self.room_state = message[1]
            if message[1] == "ended":
                self.final_frames = message[2]
                self.end_reason = message[3] if len(message) > 3 else None
            self._state_changed.set()
            self._frame_ready.set()
        elif message[0] == protocol.DESYNC:
            self.desyncs.append(message[1:])
        elif message[0] == protocol.NOTICE:
            self.notices.append(message[1:])
        elif message[0] == protocol.INPUT_DELAY and len(message) >= 5:
            frames, response_ms, late, inputs = message[1:5]
            if isinstance(frames, int) and frames >= 1:
                self.input_delay_advice = InputDelayAdvice(frames, response_ms, late, inputs)

    def _on_history(self, block: bytes) -> None:
        try:
            first, frames = protocol.decode_history(block)
        except ProtocolError:
            return
        self._blocks += 1
        for number, data in enumerate(frames, start=first):
            if isinstance(data, bytes):
                self._store(number, data)

    def _store(self, number: int, data: bytes) -> None:
        if number < self.next_frame or number in self._buffer:
            self._duplicates += 1
            return
        self._buffer[number] = data
        self._frames_received += 1
        if number == self.next_frame:
            self._frame_ready.set()


def replay_frames(path) -> "Iterator[Frame]":
    """Iterate a replay file's frames in order, decoded exactly as a live client sees them."""
    from relay.replay import ReplayReader

    yield from ReplayReader(path).decoded_frames()
