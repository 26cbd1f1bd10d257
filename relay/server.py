"""The relay server: the asyncio (uvloop) shell around relay_core and the rooms.

One UDP socket feeds one relay_core Endpoint. Datagrams received in one loop iteration are all
handed to the core before a single flush, which turns the core's events into room calls and
sends what the core returns; a timer is armed at the core's next_timeout(). One tick loop
closes a frame in every running room at the configured rate. Rooms are sans-I/O (room.py): this
module only carries out what they ask for and reports it (logs, metrics, replays, admin API).
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import re
import time
from pathlib import Path
from typing import Optional

import relay
from relay import protocol
from relay.agones import AgonesClient
from relay.config import RelayConfig, RoomSettings, is_loopback
from relay.errors import Conflict, NotFound, RelayError, Unavailable
from relay.logs import get_logger
from relay.metrics import Metrics
from relay.protocol import CONTROL, STREAM, Checksum, Input, Join, ProtocolError
from relay.replay import ReplayWriter, enforce_disk_cap
from relay.room import ENDED, RUNNING, WAITING, Action, JoinRefused, Room
from relay.scheduler import TickScheduler
from relay.transport import BATCHED_IO, EndpointDriver, open_batched_driver, open_driver
from relay_core import (
    BlockDelivered, BlockReceived, Endpoint, EndpointConfig, MessageReceived, PeerConnected,
    PeerDisconnected, PeerMigrated,
)
from relay_core.token import TokenClaims

# Compiled with the core (rooms time inputs with it too); tests set it to None to compare the
# Python receive path.
from relay import _fastpath

ROOM_OPTIONS = {"capacity", "start_policy", "start_players"}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


READ_INTERVAL = 0.001
"""Seconds between reads of a busy UDP socket: one wake-up per millisecond under load instead of
one per few datagrams. An input waits at most this long (the tick reads first: no frame misses
an input that has arrived); the input-delay advice sees it that much later."""

READ_BATCHES = 2
"""recvmmsg calls (64 datagrams each) per read pass: a pass is then at most ~1 ms of work, so a
tick that falls due during one starts at most that late (the rest is read in the next pass)."""

RECEIVE_BUFFER = 4 * 2**20
"""SO_RCVBUF asked for (the kernel caps it at net.core.rmem_max): room for the inputs that wait
between reads, and for a burst."""

GC_THRESHOLD = 20_000
"""Allocations between young-generation collections while a server runs (default 700)."""

RTT_SAMPLES_PER_SYNC = 256
"""Peers' smoothed RTTs observed into relay_peer_rtt_seconds per stats pass (once a second);
with more peers than this they take turns."""

LIMIT_LOG_INTERVAL = 10.0
"""Seconds between log lines about one kind of refusal or drop at a limit (each is counted)."""


class LimitLog:
    """Logs a repeated event (a cap hit, a flood of refusals) at most once per interval per
    kind, with how many happened since the last line, so a flood cannot flood the log."""

    def __init__(self, log, interval: float = LIMIT_LOG_INTERVAL):
        self.log = log
        self.interval = interval
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def __call__(self, event: str, kind: str, count: int = 1, **fields) -> None:
        self._count[kind] = self._count.get(kind, 0) + count
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) >= self.interval:
            self.log.warning(event, reason=kind, count=self._count.pop(kind), **fields)
            self._last[kind] = now


def endpoint_config(config: RelayConfig) -> EndpointConfig:
    rooms = config.rooms
    server = config.server
    security = config.security
    # max_pending is a local send-queue bound: the two ends need not agree on it.
    channels = tuple(dataclasses.replace(channel, max_pending=server.max_pending_messages)
                     for channel in protocol.endpoint_channels())
    return EndpointConfig(
        accept_connections=True,
        channels=channels,
        mtu=config.server.mtu,
        max_peers=config.server.max_peers,
        peer_timeout=rooms.player_timeout,
        heartbeat_interval=min(0.5, rooms.player_timeout / 4),
        # Acks ride on the next tick's frame instead of going out alone.
        ack_delay=1.0 / config.server.tick_rate,
        # Copies of unacked frames, when the redundancy policy sends them, may fill the datagram.
        redundancy_budget=config.server.mtu,
        # Per-player memory: small packet buffers (32 packets in flight is the ack window
        # anyway), and a unit ring that grows at most to a window of small frames.
        sent_packet_buffer=64,
        received_packet_window=64,
        sent_unit_capacity=512,
        max_block_size=protocol.MAX_BLOCK_SIZE,
        reassembly_limit=server.reassembly_limit,
        block_memory_limit=server.block_memory_limit,
        # Token mode: every connection needs a connect token (docs/SECURITY.md).
        token_keys=security.load_keys() if config.security_mode == "token" else None,
        encrypt_packets=security.encrypt_packets,
        handshake_rate=security.handshake_rate or None,
        handshake_burst=security.handshake_burst,
    )


class RelayServer:
    def __init__(self, config: RelayConfig, metrics: Optional[Metrics] = None):
        config.check_serve()        # ConfigError: token mode without keys, public admin API without token
        self.config = config
        self.settings: RoomSettings = config.rooms
        self.tick_rate = config.server.tick_rate
        self.metrics = metrics or Metrics()
        self.log = get_logger("relay.server")
        self.limit_log = LimitLog(self.log)
        self.security_mode = config.security_mode
        self.metrics.security_open_mode.set(1 if self.security_mode == "open" else 0)
        self.metrics.before_render(self._publish_counts)
        self.endpoint = Endpoint(endpoint_config(config))
        self.agones = AgonesClient(config.agones)      # does nothing unless agones.enabled
        self.rooms: dict[str, Room] = {}
        self.peer_room: dict[int, str] = {}
        self.peer_claims: dict[int, TokenClaims] = {}
        """Token mode: who each connection's token says it is (room, player)."""
        self._roomless: dict[int, float] = {}
        """Connections in no room -> when they were first seen so (see _close_roomless)."""
        self.replays: dict[str, ReplayWriter] = {}
        self.notified: dict[int, set[str]] = {}
        self.draining = False
        self.drain_deadline: Optional[float] = None
        self._drain_timer: Optional[asyncio.TimerHandle] = None
        self.drained = asyncio.Event()
        """Set once draining has begun and no room is left."""
        self.stopping = False
        self.started_at = time.time()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.driver: Optional[EndpointDriver] = None
        self.udp_address: Optional[tuple] = None
        self.http_port: Optional[int] = None
        self._http_runner = None
        self._scheduler: Optional[TickScheduler] = None
        self._stats_task: Optional[asyncio.Task] = None
        self._seen_drops: dict[str, int] = {}
        self._seen_refusals: dict[str, int] = {}
        # Per-input and per-datagram counts go to Prometheus once per tick, not one .inc() each.
        self._input_outcomes: dict[str, int] = {}
        # Inputs from the core straight into their rooms (the STREAM channel's message sink).
        self.inputs = _fastpath.InputRouter(self.peer_room, self.rooms) if _fastpath else None
        if self.inputs is not None:
            self.inputs.outcomes = self._input_outcomes
            self.endpoint.set_message_sink(self.inputs)
        self._traffic_seen = (0, 0, 0, 0)
        self._rtt_cursor = 0
        self.stopped = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        from relay.http import start_http

        self.loop = asyncio.get_running_loop()
        server = self.config.server
        # Batched syscalls (recvmmsg/sendmmsg) where the platform has them, read at most every
        # READ_INTERVAL (the tick reads what waits before closing frames). Datagrams and bytes
        # are counted by the driver and published with every tick.
        # A read pass flushes the core only when it has output due now; every tick flushes.
        options = dict(read_interval=READ_INTERVAL, receive_buffer=RECEIVE_BUFFER,
                       max_batches=READ_BATCHES, defer_flush=True) if BATCHED_IO else {}
        open_udp = open_batched_driver if BATCHED_IO else open_driver
        self.driver = await open_udp(
            self.endpoint, (server.udp_host, server.udp_port), self._process_events,
            on_error=lambda exc: self.log.debug("udp_error", error=str(exc)), **options)
        self.udp_address = self.driver.transport.get_extra_info("sockname")[:2]
        self._http_runner, self.http_port = await start_http(
            self, self.metrics, server.http_host, server.http_port,
            admin_token=self.config.security.load_admin_token(),
            require_auth=not is_loopback(server.http_host))
        if self.security_mode == "open" and not is_loopback(server.udp_host):
            self.log.warning(
                "open_mode_on_public_address", udp=server.udp_host,
                detail="SECURITY: anyone who can reach this address may join any room as any "
                       "player and read its frames; set security.mode = \"token\" and keys "
                       "(docs/SECURITY.md)")
        # Every datagram, event and tick allocates a few short-lived containers; at the default
        # threshold (700) the cyclic collector ran ~100 times a second at 500 players (~6 % of
        # the CPU). Nothing on the hot paths forms cycles, so collect far less often, and keep
        # what exists at start-up (modules, config) out of every collection.
        if gc.get_threshold()[0] < GC_THRESHOLD:
            gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        gc.freeze()
        self._scheduler = TickScheduler(self.tick_rate, self._tick, self.metrics)
        self._scheduler.start()
        self._stats_task = self.loop.create_task(self._stats_loop())
        if self.config.agones.player_tracking:
            # Agones refuses every player connect until a capacity is set.
            self.agones.set_player_capacity(min(server.max_peers,
                                                self.settings.max_rooms * self.settings.capacity))
        await self.agones.start()         # Ready: both sockets are bound, players may come
        self.log.info("started", udp=f"{self.udp_address[0]}:{self.udp_address[1]}",
                      http=f"{server.http_host}:{self.http_port}", tick_rate=self.tick_rate,
                      auto_create=self.settings.auto_create, replays=self.config.replay.enabled,
                      security=self.security_mode, version=relay.__version__)

    async def stop(self, reason: str = "shutdown") -> None:
        """Stop taking work, end every room (clients are told why), flush replays, close."""
        if self.stopping:
            await self.stopped.wait()
            return
        self.stopping = True
        self.draining = True
        self.metrics.set_draining(True)
        self.log.info("stopping", reason=reason, rooms=len(self.rooms), peers=self.endpoint.peer_count)
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._scheduler is not None:
            await self._scheduler.stop()
        if self._stats_task is not None:
            self._stats_task.cancel()
        for room in list(self.rooms.values()):
            room.end(reason)
            self._drain(room)
            self._remove_room(room)
        self._flush()
        for peer_id in self.endpoint.peer_ids:
            self.endpoint.disconnect(peer_id, "shutdown")
        self._flush()
        for room_id in list(self.replays):
            self._close_replay(room_id, reason)
        if self._http_runner is not None:
            from relay.http import stop_http

            await stop_http(self._http_runner)
        if self.driver is not None:
            self.driver.close()
        await self.agones.stop()
        self.log.info("stopped", reason=reason)
        self.stopped.set()

    # -- datagrams --------------------------------------------------------------------------

    def _publish_counts(self) -> None:
        """Counts kept as plain integers on the hot paths, into their metrics (every tick)."""
        metrics = self.metrics
        outcomes = self._input_outcomes         # shared with the InputRouter: cleared, not replaced
        if outcomes:
            for outcome, count in outcomes.items():
                metrics.inputs.labels(outcome=outcome).inc(count)
            outcomes.clear()
        driver = self.driver
        if driver is not None:
            totals = (driver.datagrams_received, driver.bytes_received,
                      driver.datagrams_sent, driver.bytes_sent)
            seen = self._traffic_seen
            if totals != seen:
                self._traffic_seen = totals
                metrics.datagrams_received.inc(totals[0] - seen[0])
                metrics.bytes_received.inc(totals[1] - seen[1])
                metrics.datagrams_sent.inc(totals[2] - seen[2])
                metrics.bytes_sent.inc(totals[3] - seen[3])

    def _flush(self) -> None:
        if self.driver is not None:
            self.driver.flush()

    # -- core events ------------------------------------------------------------------------

    def _process_events(self, now: float) -> None:
        if self.inputs is not None:
            # INPUTs straight to their rooms in compiled code; every other event below.
            self.inputs.route(self.endpoint, self._on_event, self._refuse_input, now)
            return
        endpoint = self.endpoint
        while (event := endpoint.next_event()) is not None:
            self._on_event(event, now)

    def _on_event(self, event, now: float) -> None:
        kind = type(event)
        if kind is MessageReceived:
            self._on_message(event.peer_id, event.channel, event.payload, now)
        elif kind is PeerConnected:
            if event.claims is not None:
                self.peer_claims[event.peer_id] = event.claims
            self.log.debug("peer_connected", peer=event.peer_id, address=str(event.address),
                           player=event.claims.player if event.claims else None)
        elif kind is PeerDisconnected:
            self._on_disconnect(event.peer_id, event.reason, now)
        elif kind is PeerMigrated:
            # The core validated the new path and already sends there; the room is keyed
            # by peer id, so nothing else moves.
            self.metrics.migrations.inc()
            room = self._room_of(event.peer_id)
            self.log.info("peer_migrated", peer=event.peer_id,
                          old_address=str(event.old_address),
                          new_address=str(event.new_address),
                          room=room.room_id if room else None)
        elif kind is BlockDelivered:
            room = self._room_of(event.peer_id)
            if room is not None:
                room.on_block_delivered(event.peer_id)
            self.metrics.blocks.labels(outcome="delivered").inc()
        elif kind is BlockReceived:
            self._drop(event.peer_id, "unexpected_block", "clients do not send blocks")

    def _on_disconnect(self, peer_id: int, reason: str, now: float) -> None:
        self.notified.pop(peer_id, None)
        self.peer_claims.pop(peer_id, None)
        room = self._room_of(peer_id)
        self.peer_room.pop(peer_id, None)
        if room is not None:
            # A dead link (idle timeout or resend limit) is a timeout; anything else a leave.
            room.detach(peer_id, "timeout" if reason in ("timeout", "resend_limit") else reason, now)
            self._drain(room)
        self.log.info("peer_disconnected", peer=peer_id, reason=reason,
                      room=room.room_id if room else None)

    def _on_message(self, peer_id: int, channel: int, payload: bytes, now: float) -> None:
        try:
            message = protocol.decode_client_message(payload)
        except ProtocolError as error:
            self._drop(peer_id, "malformed_message", str(error), notice_code=error.code)
            return
        room = self._room_of(peer_id)
        if isinstance(message, Input):
            if channel != STREAM:
                self._drop(peer_id, "wrong_channel", "inputs go on channel 1", notice_code="wrong_channel")
                return
            if room is None:
                self._refuse_input(peer_id, "not_a_player")
                return
            outcome = room.on_input(peer_id, message, now)
            if outcome.startswith("refused:"):
                self._refuse_input(peer_id, outcome[8:])
            else:
                self._input_outcomes[outcome] = self._input_outcomes.get(outcome, 0) + 1
            return
        if channel != CONTROL:
            self._drop(peer_id, "wrong_channel", "control messages go on channel 0")
            return
        if isinstance(message, Join):
            self._on_join(peer_id, message, now)
        elif room is None:
            self._notice(peer_id, "not_joined", "join a room first")
        elif isinstance(message, Checksum):
            room.on_checksum(peer_id, message)
        elif message == protocol.READY:
            room.set_ready(peer_id, now)
        elif message == protocol.LEAVE:
            room.detach(peer_id, "leave", now)
            self.peer_room.pop(peer_id, None)
        if room is not None:
            self._drain(room)

    def _on_join(self, peer_id: int, join: Join, now: float) -> None:
        if peer_id in self.peer_room:
            self._refuse(peer_id, "already_joined", f"this connection is already in room "
                                                    f"{self.peer_room[peer_id]}")
            return
        claims = self.peer_claims.get(peer_id)
        if claims is not None:
            # The token, not the JOIN, says who this is and where it may go.
            if join.room != claims.room:
                self._refuse(peer_id, "wrong_room", f"the connect token is for room {claims.room}, "
                                                    f"not {join.room}")
                return
            if join.player != claims.player:
                self._refuse(peer_id, "wrong_player", f"the connect token is for player "
                                                      f"{claims.player}, not {join.player}")
                return
        room = self.rooms.get(join.room)
        if self.draining and not (room is not None and room.state == RUNNING
                                  and room.has_player(join.player)):
            # Draining: matches in progress may finish (and their players reconnect), nothing new.
            self._refuse(peer_id, "draining", "the relay is draining; try another relay")
            return
        if room is None:
            if not self.settings.auto_create:
                self._refuse(peer_id, "unknown_room", f"room {join.room} does not exist")
                return
            try:
                room = self._create_room(join.room, {}, now)
            except RelayError as error:
                self._refuse(peer_id, error.code, str(error))
                return
        try:
            member = room.join(peer_id, join.player, join.spectator, now)
        except JoinRefused as refusal:
            self._refuse(peer_id, refusal.code, str(refusal))
            return
        self.peer_room[peer_id] = room.room_id
        outcome = "spectator" if member.spectator else "joined"
        self.metrics.joins.labels(outcome=outcome).inc()
        self._drain(room)

    def _refuse(self, peer_id: int, code: str, text: str) -> None:
        self.metrics.joins.labels(outcome="refused").inc()
        self.metrics.refusals.labels(reason=code).inc()
        self._send_control(peer_id, protocol.refused(code, text))
        # One line per connection; a connection that keeps sending JOINs is summarized.
        seen = self.notified.setdefault(peer_id, set())
        if "join_refused" in seen:
            self.limit_log("joins_refused_repeatedly", code, peer=peer_id)
        else:
            seen.add("join_refused")
            self.log.info("join_refused", peer=peer_id, reason=code, detail=text)

    def _refuse_input(self, peer_id: int, reason: str) -> None:
        self.metrics.inputs.labels(outcome="refused").inc()
        self.metrics.inputs_refused.labels(reason=reason).inc()
        if reason in ("too_large", "not_a_player"):
            self._notice(peer_id, f"input_{reason}", f"input refused: {reason}")

    def _drop(self, peer_id: int, reason: str, detail: str, notice_code: Optional[str] = None) -> None:
        self.metrics.drops.labels(reason=reason).inc()
        self.log.debug("message_dropped", peer=peer_id, reason=reason, detail=detail)
        if notice_code is not None:
            self._notice(peer_id, notice_code, detail)

    def _notice(self, peer_id: int, code: str, text: str) -> None:
        """Tell a client once per kind of mistake (a flood of bad messages gets one answer)."""
        seen = self.notified.setdefault(peer_id, set())
        if code not in seen:
            seen.add(code)
            self._send_control(peer_id, protocol.notice(code, text))

    def _send_control(self, peer_id: int, data: bytes) -> None:
        """A CONTROL message of the server's own (REFUSED, NOTICE)."""
        if not self.endpoint.send(peer_id, CONTROL, data) and self.endpoint.is_connected(peer_id):
            self._send_queue_full(self._room_of(peer_id), peer_id, CONTROL)

    def _room_of(self, peer_id: int) -> Optional[Room]:
        room_id = self.peer_room.get(peer_id)
        return self.rooms.get(room_id) if room_id is not None else None

    # -- rooms ------------------------------------------------------------------------------

    def _create_room(self, room_id: str, options: dict, now: float) -> Room:
        if self.draining:
            raise Unavailable("the relay is draining and creates no rooms")
        if room_id in self.rooms:
            raise Conflict(f"room {room_id} exists", "room_exists")
        if len(self.rooms) >= self.settings.max_rooms:
            raise Unavailable(f"the relay already has {self.settings.max_rooms} rooms", "too_many_rooms")
        if options.get("tick_rate", self.tick_rate) != self.tick_rate:
            raise RelayError(f"tick_rate={options['tick_rate']!r}: the tick rate is server-wide "
                             f"({self.tick_rate} Hz, server.tick_rate)", "bad_option")
        options = {k: v for k, v in options.items() if k != "tick_rate"}
        unknown = set(options) - ROOM_OPTIONS
        if unknown:
            raise RelayError(f"unknown room option {sorted(unknown)[0]!r}; allowed: "
                             f"{', '.join(sorted(ROOM_OPTIONS))}", "bad_option")
        capacity = options.get("capacity", self.settings.capacity)
        policy = options.get("start_policy", self.settings.start_policy)
        start_players = options.get("start_players", min(self.settings.start_players, capacity)
                                    if isinstance(capacity, int) else None)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or not 1 <= capacity <= 256:
            raise RelayError(f"capacity={capacity!r}: an integer in 1..256", "bad_option")
        if policy not in ("players", "ready", "admin"):
            raise RelayError(f"start_policy={policy!r}: players, ready or admin", "bad_option")
        if (not isinstance(start_players, int) or isinstance(start_players, bool)
                or not 1 <= start_players <= capacity):
            raise RelayError(f"start_players={start_players!r}: an integer in 1..{capacity}", "bad_option")
        room = Room(room_id, self.settings, self.tick_rate, now, start_policy=policy,
                    start_players=start_players, capacity=capacity)
        room.broadcast_frames = True        # one Endpoint.send_many per frame
        self.rooms[room_id] = room
        self.agones.room_state(room_id, WAITING, 0)
        self.log.info("room_created", room=room_id, capacity=capacity, start_policy=policy,
                      start_players=start_players)
        return room

    def _drain(self, room: Room) -> None:
        """Carry out what a room asked for, and report what happened in it."""
        for action in room.take_actions():
            self._execute(room, action)
        for event in room.take_events():
            self._report(room, event)

    def _execute(self, room: Room, action: Action) -> None:
        try:
            self._carry_out(room, action)
        except ValueError as error:
            # The core refuses a message or block beyond its size limits (a huge frame or
            # history): this member misses it, the room goes on.
            self.metrics.drops.labels(reason="too_large").inc()
            self.log.error("send_refused", room=room.room_id, peer=action.peer_id,
                           kind=action.kind, bytes=len(action.data), error=str(error))
            if action.kind == "block":
                if self.endpoint.is_connected(action.peer_id):
                    # As for a block the core's queue refused: the member's catch-up is not left
                    # open waiting for a delivery that never comes, and is repaired at a later tick.
                    room.on_send_failed(action.peer_id, "block")
            elif action.channel == STREAM:
                # A frame too large for one message (inputs at the configured maximum plus
                # many events): every member it was for gets it in a catch-up block (blocks
                # go up to protocol.MAX_BLOCK_SIZE) at the next tick, so no frame is lost.
                recipients = action.peer_ids if action.kind == "broadcast" else (action.peer_id,)
                for peer_id in recipients:
                    if self.endpoint.is_connected(peer_id):
                        room.on_send_failed(peer_id, "stream")

    def _carry_out(self, room: Room, action: Action) -> None:
        if action.kind == "broadcast":
            for peer_id in self.endpoint.send_many(action.peer_ids, action.channel, action.data):
                self._send_queue_full(room, peer_id, action.channel)
        elif action.kind == "send":
            if not self.endpoint.send(action.peer_id, action.channel, action.data):
                if self.endpoint.is_connected(action.peer_id):
                    self._send_queue_full(room, action.peer_id, action.channel)
        elif action.kind == "block":
            if self.endpoint.send_block(action.peer_id, action.data):
                self.metrics.blocks.labels(outcome="started").inc()
            elif self.endpoint.is_connected(action.peer_id):
                room.on_send_failed(action.peer_id, "block")
        elif action.kind == "disconnect":
            self.peer_room.pop(action.peer_id, None)
            self.endpoint.disconnect(action.peer_id, action.reason)

    def _send_queue_full(self, room: Optional[Room], peer_id: int, channel: int) -> None:
        """The peer's queue is at server.max_pending_messages: the message is dropped. A frame
        is repaired later with a block. A CONTROL message cannot be: the client would go on
        without it (a WELCOME lost: a member never told so, sent frames for a room it does not
        know; a REFUSED lost: a JOIN never answered), so the connection is closed instead, and
        the client reconnects (a player gets its slot back)."""
        self.metrics.drops.labels(reason="send_queue_full").inc()
        self.limit_log("limit_reached", "send_queue_full",
                       room=room.room_id if room is not None else None, peer=peer_id,
                       limit=self.config.server.max_pending_messages)
        if channel == STREAM:
            room.on_send_failed(peer_id, "stream")
        else:
            self.endpoint.disconnect(peer_id, "closed")

    def _report(self, room: Room, event) -> None:
        detail = event.detail
        if event.kind == "frame":
            writer = self.replays.get(room.room_id)
            if writer is not None:
                before = writer.bytes_written
                try:
                    writer.append_frame(detail["frame"], detail["data"])
                except (OSError, ValueError) as error:
                    # A full disk ends the replay, never the match.
                    self.replays.pop(room.room_id, None)
                    self.log.error("replay_write_failed", room=room.room_id, error=str(error))
                    return
                self.metrics.replay_bytes.inc(writer.bytes_written - before)
            return
        if event.kind == "checksum":
            # Every player's checksum history goes into the replay (relay replay desync).
            writer = self.replays.get(room.room_id)
            if writer is not None:
                try:
                    writer.append_checksum(detail["frame"], detail["slot"], detail["player"],
                                           detail["value"])
                except (OSError, ValueError) as error:
                    self.replays.pop(room.room_id, None)
                    self.log.error("replay_write_failed", room=room.room_id, error=str(error))
            return
        if event.kind == "input_delay":
            self.metrics.input_delay_advice.observe(detail["frames"])
            self.log.debug("input_delay_advised", room=room.room_id, **detail)
            return
        if event.kind == "started":
            self._open_replay(room)
        elif event.kind == "ended":
            self._close_replay(room.room_id, detail["reason"])
        elif event.kind == "desync":
            self.metrics.desyncs.inc()
            writer = self.replays.get(room.room_id)
            if writer is not None:
                writer.append_event(detail["frame"], "desync", detail)
            self.log.warning("desync", room=room.room_id, frame=detail["frame"],
                             checksums=detail["checksums"], minority=detail["minority"],
                             verdict=detail["verdict"])
            return
        elif event.kind == "reconnected":
            self.metrics.joins.labels(outcome="reconnected").inc()
        self._mirror_to_agones(room, event)
        self.log.info(event.kind, room=room.room_id, **detail)

    def _mirror_to_agones(self, room: Room, event) -> None:
        """Room state and players into the GameServer (labels, annotations, player tracking);
        queued, never waits on the sidecar."""
        connected = sum(1 for slot in room.slots if slot.peer_id is not None)
        self.agones.room_state(room.room_id, room.state, connected)
        # Player ids are per GameServer, and players are named per room.
        if event.kind in ("joined", "reconnected"):
            self.agones.player_joined(f"{room.room_id}/{event.detail['player']}")
        elif event.kind in ("left", "timed_out"):
            self.agones.player_left(f"{room.room_id}/{event.detail['player']}")
        elif event.kind == "ended":
            for slot in room.slots:
                self.agones.player_left(f"{room.room_id}/{slot.player}")

    def _open_replay(self, room: Room) -> None:
        settings = self.config.replay
        if not settings.enabled:
            return
        directory = Path(settings.directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if settings.max_disk_bytes and self._enforce_replay_disk_cap() >= settings.max_disk_bytes:
                # Only the matches being recorded are left, and they fill the budget.
                self.metrics.replay_disk.labels(action="not_recorded").inc()
                self.limit_log("limit_reached", "replay_max_disk_bytes", room=room.room_id,
                               limit=settings.max_disk_bytes, detail="match not recorded")
                return
            name = f"{_SAFE_NAME.sub('_', room.room_id)}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.replay"
            self.replays[room.room_id] = ReplayWriter(
                directory / name, room=room.room_id, tick_rate=self.tick_rate,
                players=[slot.player for slot in room.slots], relay_version=relay.__version__,
                max_bytes=settings.max_bytes)
        except OSError as error:
            self.log.error("replay_open_failed", room=room.room_id, error=str(error))

    def _enforce_replay_disk_cap(self) -> int:
        """Delete the oldest finished replays past replay.max_disk_bytes; the bytes in use after."""
        settings = self.config.replay
        usage = enforce_disk_cap(settings.directory, settings.max_disk_bytes,
                                 {writer.path: writer.bytes_written for writer in self.replays.values()})
        for path, size in usage.deleted:
            self.metrics.replay_disk.labels(action="deleted").inc()
            self.log.info("replay_deleted", path=str(path), bytes=size,
                          reason="replay.max_disk_bytes", limit=settings.max_disk_bytes)
        return usage.total

    def _check_replay_disk(self) -> None:
        """Once a second: keep the replays within replay.max_disk_bytes. When the matches being
        recorded alone exceed it, the newest recordings stop (their files close cleanly and then
        count as finished, oldest deleted first)."""
        limit = self.config.replay.max_disk_bytes
        if not (limit and self.config.replay.enabled) or self._enforce_replay_disk_cap() <= limit:
            return
        live = sum(writer.bytes_written for writer in self.replays.values())
        for room_id in reversed(list(self.replays)):      # newest first
            if live <= limit:
                break
            live -= self.replays[room_id].bytes_written
            self._close_replay(room_id, "disk_cap")
            self.metrics.replay_disk.labels(action="stopped").inc()
            self.log.warning("limit_reached", reason="replay_max_disk_bytes", room=room_id,
                             limit=limit, detail="recording stopped")
        self._enforce_replay_disk_cap()

    def _close_replay(self, room_id: str, reason: str) -> None:
        writer = self.replays.pop(room_id, None)
        if writer is not None:
            writer.close(reason)
            self.log.info("replay_closed", room=room_id, frames=writer.frames,
                          bytes=writer.bytes_written, truncated=writer.truncated)

    # -- ticks ------------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        read_now = getattr(self.driver, "read_now", None)
        if read_now is not None:
            read_now()              # inputs waiting in the socket make this tick's frames
        closed = broadcast = synthesized = 0
        for room in list(self.rooms.values()):
            synthesized_before = room.synthesized_inputs
            if room.tick(now) is not None:
                closed += 1
                broadcast += len(room.members)
                synthesized += room.synthesized_inputs - synthesized_before
            if room.expired(now):
                room.end("empty")
            elif self.draining and not room.members:
                room.end("draining")      # nobody left to finish the match for
            self._drain(room)
            if room.state == ENDED:
                self._remove_room(room)
        if closed:
            self.metrics.frames_closed.inc(closed)
            self.metrics.frames_broadcast.inc(broadcast)
            if synthesized:
                self.metrics.synthesized_inputs.inc(synthesized)
        self._flush()
        self._publish_counts()

    def _remove_room(self, room: Room) -> None:
        self.rooms.pop(room.room_id, None)
        room.history.close()
        for peer_id in list(room.members):
            self.peer_room.pop(peer_id, None)
        if self.draining and not self.rooms:
            self._drained()

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self._close_roomless(self.loop.time())
                self._sync_stats()
            except Exception:        # never let metrics kill the server
                self.log.exception("stats_failed")

    def _close_roomless(self, now: float) -> None:
        """Close connections that have been in no room for server.join_timeout (checked once a
        second): anyone who can finish a handshake could otherwise hold every peer slot."""
        timeout = self.config.server.join_timeout
        since, self._roomless = self._roomless, {}
        for peer_id in self.endpoint.peer_ids:
            if peer_id in self.peer_room:
                continue
            first_seen = since.get(peer_id, now)
            if now - first_seen < timeout:
                self._roomless[peer_id] = first_seen
            elif self.endpoint.disconnect(peer_id, "timeout"):
                self.metrics.refusals.labels(reason="join_timeout").inc()
                self.limit_log("connections_closed", "join_timeout")

    def _sync_stats(self) -> None:
        metrics = self.metrics
        metrics.peers.set(self.endpoint.peer_count)
        counts = {WAITING: 0, RUNNING: 0, ENDED: 0}
        for room in self.rooms.values():
            counts[room.state] += 1
        metrics.set_rooms(counts)
        self.agones.set_counts(counts[RUNNING], sum(
            1 for room in self.rooms.values() for slot in room.slots if slot.peer_id is not None))
        drops = self.endpoint.drops
        for reason in ("reassembly_full", "rate_limited", "auth_failed"):
            grew = drops.get(reason, 0) - self._seen_drops.get(reason, 0)
            if grew > 0:
                self.limit_log("datagrams_dropped", reason, count=grew)
        self._seen_drops = drops
        metrics.sync_drops(drops)
        refusals = self.endpoint.refusals
        for reason, total in refusals.items():
            grew = total - self._seen_refusals.get(reason, 0)
            if grew > 0:
                self.limit_log("handshakes_refused", reason, count=grew)
        self._seen_refusals = refusals
        metrics.sync_refusals(refusals)
        self._check_replay_disk()
        # Resends and redundant bytes over all peers, RTT and loss, in one pass in the core
        # (datagrams are counted at the socket). A PeerStats per peer every second cost a
        # tick's worth of time at a few thousand players.
        metrics.sync_totals(**self.endpoint.traffic_totals())
        rtts, loss = self.endpoint.link_samples()
        metrics.loss.set(loss)
        # At most RTT_SAMPLES_PER_SYNC observations per pass, taking turns over the peers.
        if len(rtts) > RTT_SAMPLES_PER_SYNC:
            start = self._rtt_cursor % len(rtts)
            self._rtt_cursor = start + RTT_SAMPLES_PER_SYNC
            rtts = (rtts + rtts)[start:start + RTT_SAMPLES_PER_SYNC]
        for rtt in rtts:
            metrics.rtt.observe(rtt)
        self._publish_counts()

    # -- admin API (called by relay.http on the loop thread) ---------------------------------

    def health(self) -> dict:
        return {"status": "ok", "version": relay.__version__,
                "uptime_s": round(time.time() - self.started_at, 3),
                "rooms": len(self.rooms), "peers": self.endpoint.peer_count,
                "draining": self.draining}

    def ready(self) -> bool:
        return not self.draining and self.driver is not None

    def list_rooms(self) -> list[dict]:
        return [room.info() for room in self.rooms.values()]

    def room_info(self, room_id: str) -> dict:
        return self._get_room(room_id).info()

    def create_room(self, room_id: str, **options) -> dict:
        room = self._create_room(room_id, options, self.loop.time())
        return room.info()

    def start_room(self, room_id: str) -> dict:
        room = self._get_room(room_id)
        if room.state != WAITING:
            raise Conflict(f"room {room_id} is {room.state}, not waiting", "not_waiting")
        room.start(self.loop.time())
        self._drain(room)
        self._flush()
        return room.info()

    def end_room(self, room_id: str, reason: str = "admin") -> dict:
        room = self._get_room(room_id)
        room.end(reason)
        self._drain(room)
        self._remove_room(room)
        self._flush()
        return room.info()

    def kick(self, room_id: str, player: str) -> dict:
        room = self._get_room(room_id)
        if room.kick(player, self.loop.time()) is None and not any(
                slot.player == player for slot in room.slots):
            raise NotFound(f"player {player} is not in room {room_id}", "player_not_found")
        self._drain(room)
        self._flush()
        return room.info()

    def drain(self) -> dict:
        """Stop taking rooms and players at once (readiness goes false); running matches may
        finish until drain_timeout, then they end with reason drain_deadline."""
        if not self.draining:
            self.draining = True
            self.metrics.set_draining(True)
            timeout = self.config.server.drain_timeout
            self.drain_deadline = time.time() + timeout
            for room in list(self.rooms.values()):
                if room.state == WAITING or not room.members:
                    room.end("draining")
                    self._drain(room)
                    self._remove_room(room)
            self._drain_timer = self.loop.call_later(timeout, self._drain_deadline_passed)
            if not self.rooms:
                self._drained()
            self._flush()
            self.log.info("draining", rooms=len(self.rooms), deadline_s=timeout)
        return {"draining": True, "rooms": len(self.rooms),
                "running": sum(1 for room in self.rooms.values() if room.state == RUNNING),
                "deadline": self.drain_deadline}

    def _drained(self) -> None:
        """Draining and no room left: tell waiters, and Agones that this server may go."""
        self.drained.set()
        self.agones.request_shutdown()

    def _drain_deadline_passed(self) -> None:
        self._drain_timer = None
        for room in list(self.rooms.values()):
            room.end("drain_deadline")
            self._drain(room)
            self._remove_room(room)
        self._flush()
        self._drained()

    async def drain_and_stop(self) -> None:
        """SIGTERM: drain, wait for the matches to finish (bounded by drain_timeout), stop."""
        self.drain()
        await self.drained.wait()
        await self.stop("shutdown")

    def _get_room(self, room_id: str) -> Room:
        room = self.rooms.get(room_id)
        if room is None:
            raise NotFound(f"room {room_id} does not exist", "room_not_found")
        return room
