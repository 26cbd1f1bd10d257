"""The lobby: every room of one relay and who is in which, driven without sockets or clocks.

The lobby owns the protocol core's ``Endpoint`` (itself sans-I/O) and the rooms. The server
hands it the time and calls it when the core has events (``handle_events``), when a tick is due
(``tick``) and for the admin API (``create_room``, ``start_room``, ``end_room``, ``kick``,
``begin_drain``, ``end_all``). The lobby turns core events into room calls (joins, inputs,
checksums, leaves), carries out what rooms ask for through the Endpoint (messages, blocks,
disconnects) and never calls the server back. What happened comes out two ways:

- ``take_reports()``: ``(room or None, RoomEvent)`` pairs for the server to log, mirror to
  Agones and record in replays -- the rooms' own events, and the lobby's (``peer_connected``,
  ``join_refused``, ``send_refused``, ``drained``... see ``LOBBY_EVENTS``);
- ``counts``: plain integers keyed by ``(metric, label)`` (``("joins", "refused")``), and
  ``input_outcomes`` for the compiled input router, which the server moves into Prometheus once
  per tick instead of one metric call per input.

So tests drive joins, play and the tick's room loop with a ``LinkedPair`` and a fake clock.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Hashable, Optional

from relay import protocol
from relay.config import RelayConfig, RoomSettings
from relay.errors import Conflict, NotFound, RelayError, Unavailable
from relay.server.inputs import InputRouter
from relay.protocol import CONTROL, STREAM, Checksum, Input, Join, ProtocolError
from relay.server.room import (
    ENDED, RUNNING, WAITING, Action, JoinRefused, Room, RoomEvent, close_frames,
)
from relay_core import (
    BlockDelivered, BlockReceived, Endpoint, EndpointConfig, MessageReceived, PeerConnected,
    PeerDisconnected, PeerMigrated,
)
from relay_core.sources import source_key
from relay_core.token import TokenClaims

ROOM_OPTION_TYPES: dict[str, type] = {
    "capacity": int, "start_policy": str, "start_players": int, "tick_rate": int,
}
"""Options a room may be created with (``POST /rooms``), with their JSON types; ``tick_rate``
is accepted only when it equals the server's."""

START_POLICIES = ("players", "ready", "admin")

LOBBY_EVENTS = (
    "peer_connected", "peer_disconnected", "peer_migrated", "join_refused", "message_dropped",
    "send_refused", "send_queue_full", "room_created", "connections_closed", "drained",
)
"""Kinds of the lobby's own reports (rooms report the rest: joined, started, frame, ...)."""

Report = tuple[Optional[Room], RoomEvent]


def endpoint_config(config: RelayConfig) -> EndpointConfig:
    """The protocol core's settings for a relay with this configuration."""
    rooms = config.rooms
    server = config.server
    security = config.security
    # max_pending is a local send-queue bound: the two ends need not agree on it.
    channels = tuple(dataclasses.replace(channel, max_pending=server.max_pending_messages)
                     for channel in protocol.endpoint_channels())
    return EndpointConfig(
        accept_connections=True,
        channels=channels,
        mtu=server.mtu,
        max_peers=server.max_peers,
        peer_timeout=rooms.player_timeout,
        heartbeat_interval=min(0.5, rooms.player_timeout / 4),
        # Acks ride on the next tick's frame instead of going out alone.
        ack_delay=1.0 / server.tick_rate,
        # Copies of unacked frames, when the redundancy controller sends them, may fill the
        # datagram.
        redundancy_budget=server.mtu,
        redundancy_policy=config.link.redundancy_policy,
        burst_threshold=config.link.burst_threshold,
        congestion_delay=config.link.congestion_delay,
        congestion_hold=config.link.congestion_hold,
        congested_copies=config.link.congested_copies,
        redundancy_copies=config.link.redundancy_copies,
        prompt_copies=config.link.prompt_copies,
        # Per-player memory: small packet buffers (32 packets in flight is the ack window
        # anyway), and a unit ring that grows at most to a window of small frames.
        sent_packet_buffer=64,
        received_packet_window=64,
        sent_unit_capacity=512,
        max_block_size=protocol.MAX_BLOCK_SIZE,
        reassembly_limit=server.reassembly_limit,
        block_memory_limit=server.block_memory_limit,
        receive_memory_limit=server.receive_memory_limit,
        # Token mode: every connection needs a connect token (docs/SECURITY.md).
        token_keys=security.load_keys() if config.security_mode == "token" else None,
        encrypt_packets=security.encrypt_packets,
        handshake_rate=security.handshake_rate or None,
        handshake_burst=security.handshake_burst,
        handshake_budget=security.handshake_budget or None,
        # Open mode only; the core ignores it in token mode.
        max_sessions_per_source=security.max_sessions_per_source,
    )


def room_options(settings: RoomSettings, tick_rate: int, options: dict) -> dict:
    """``Room`` keyword arguments for a room created with ``options`` (JOIN-created rooms pass
    none): the configured defaults, each given value checked. RelayError(bad_option) names the
    first bad one."""
    if options.get("tick_rate", tick_rate) != tick_rate:
        raise RelayError(f"tick_rate={options['tick_rate']!r}: the tick rate is server-wide "
                         f"({tick_rate} Hz, server.tick_rate)", "bad_option")
    unknown = set(options) - set(ROOM_OPTION_TYPES)
    if unknown:
        allowed = ", ".join(sorted(set(ROOM_OPTION_TYPES) - {"tick_rate"}))
        raise RelayError(f"unknown room option {sorted(unknown)[0]!r}; allowed: {allowed}",
                         "bad_option")
    capacity = options.get("capacity", settings.capacity)
    policy = options.get("start_policy", settings.start_policy)
    start_players = options.get("start_players", min(settings.start_players, capacity)
                                if isinstance(capacity, int) else None)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or not 1 <= capacity <= 256:
        raise RelayError(f"capacity={capacity!r}: an integer in 1..256", "bad_option")
    if policy not in START_POLICIES:
        raise RelayError(f"start_policy={policy!r}: players, ready or admin", "bad_option")
    if (not isinstance(start_players, int) or isinstance(start_players, bool)
            or not 1 <= start_players <= capacity):
        raise RelayError(f"start_players={start_players!r}: an integer in 1..{capacity}", "bad_option")
    return {"capacity": capacity, "start_policy": policy, "start_players": start_players}


class Lobby:
    def __init__(self, config: RelayConfig, endpoint: Optional[Endpoint] = None):
        self.config = config
        self.settings: RoomSettings = config.rooms
        self.tick_rate = config.server.tick_rate
        self.endpoint = endpoint if endpoint is not None else Endpoint(endpoint_config(config))
        self.rooms: dict[str, Room] = {}
        self.peer_claims: dict[int, TokenClaims] = {}
        """Token mode: who each connection's token says it is (room, player)."""
        self.notified: dict[int, set[str]] = {}
        """Per connection, the kinds of mistake it was told about (each is told once)."""
        self.draining = False
        self.report_frames = config.replay.enabled
        """Rooms report each closed frame ("frame" events): only replays read them."""
        self.counts: Counter = Counter()
        """(metric, label or None) -> how many since the server last published them."""
        self._input_outcomes: dict[str, int] = {}
        self._roomless: dict[int, float] = {}
        """Connections in no room -> when they were first seen so (see close_roomless)."""
        self._reports: list[Report] = []
        # Open mode: JOINs may create rooms, so one source could take every room slot.
        self.rooms_per_source = (config.security.max_rooms_per_source
                                 if config.security_mode == "open" else 0)
        """Rooms alive at once that JOINs from one source created; 0: unlimited."""
        self._room_source: dict[str, Hashable] = {}
        """Room id -> the source whose JOIN created it (counted rooms only, while alive)."""
        self.rooms_by_source: Counter = Counter()
        """Source -> its counted rooms alive now (relay_core.sources.source_key)."""
        self._free_groups: list[int] = []
        """The core's groups (Endpoint.bind_sink) of rooms removed, for the next rooms: a
        room's players' DATA is held in its group until the room's turn in the tick."""
        self._groups_used = 0
        # INPUTs go from the core straight into their rooms (the STREAM channel's message
        # sink); the router holds who is in which room, the lobby seats and unseats peers.
        self.inputs = InputRouter(self.endpoint)
        self.inputs.outcomes = self._input_outcomes
        self._room_of_peer: dict[int, Room] = self.inputs.room_of_peer
        self.endpoint.set_message_sink(self.inputs)

    # -- outputs ----------------------------------------------------------------------------

    def take_reports(self) -> list[Report]:
        reports, self._reports = self._reports, []
        return reports

    def _report(self, room: Optional[Room], kind: str, /, **detail) -> None:
        self._reports.append((room, RoomEvent(kind, detail)))

    @property
    def peer_room(self) -> dict[int, str]:
        """Peer id -> id of the room it is in (a snapshot)."""
        return {peer_id: room.room_id for peer_id, room in self._room_of_peer.items()}

    def room_of(self, peer_id: int) -> Optional[Room]:
        return self._room_of_peer.get(peer_id)

    def get_room(self, room_id: str) -> Room:
        room = self.rooms.get(room_id)
        if room is None:
            raise NotFound(f"room {room_id} does not exist", "room_not_found")
        return room

    # -- core events ------------------------------------------------------------------------

    def handle_events(self, now: float) -> None:
        """Everything the core has for the relay: canonical INPUTs straight into their rooms
        (compiled), every other event through ``_on_event``."""
        self.inputs.route(self.endpoint, self._on_event, self._refuse_input, now)

    def _on_event(self, event, now: float) -> None:
        kind = type(event)
        if kind is MessageReceived:
            self._on_message(event.peer_id, event.channel, event.payload, now)
        elif kind is PeerConnected:
            if event.claims is not None:
                self.peer_claims[event.peer_id] = event.claims
            self._report(None, "peer_connected", peer=event.peer_id, address=str(event.address),
                         player=event.claims.player if event.claims else None)
        elif kind is PeerDisconnected:
            self._on_disconnect(event.peer_id, event.reason, now)
        elif kind is PeerMigrated:
            # The core validated the new path and already sends there; the room is keyed
            # by peer id, so nothing else moves.
            self.counts["migrations", None] += 1
            room = self.room_of(event.peer_id)
            self._report(room, "peer_migrated", peer=event.peer_id,
                         old_address=str(event.old_address), new_address=str(event.new_address))
        elif kind is BlockDelivered:
            room = self.room_of(event.peer_id)
            if room is not None:
                room.on_block_delivered(event.peer_id)
            self.counts["blocks", "delivered"] += 1
        elif kind is BlockReceived:
            self._drop(event.peer_id, "unexpected_block", "clients do not send blocks")

    def _on_disconnect(self, peer_id: int, reason: str, now: float) -> None:
        self.notified.pop(peer_id, None)
        self.peer_claims.pop(peer_id, None)
        room = self.room_of(peer_id)
        self.inputs.unseat(peer_id)
        if room is not None:
            # A dead link (idle timeout or resend limit) is a timeout; anything else a leave.
            room.detach(peer_id, "timeout" if reason in ("timeout", "resend_limit") else reason, now)
            self._settle(room)
        self._report(room, "peer_disconnected", peer=peer_id, reason=reason)

    def _on_message(self, peer_id: int, channel: int, payload: bytes, now: float) -> None:
        try:
            message = protocol.decode_client_message(payload)
        except ProtocolError as error:
            self._drop(peer_id, "malformed_message", str(error), notice_code=error.code)
            return
        room = self.room_of(peer_id)
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
            self.inputs.unseat(peer_id)
        if room is not None:
            self._settle(room)

    def _on_join(self, peer_id: int, join: Join, now: float) -> None:
        seated = self.room_of(peer_id)
        if seated is not None:
            self._refuse(peer_id, "already_joined", f"this connection is already in room "
                                                    f"{seated.room_id}")
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
            source = None
            if self.rooms_per_source:
                if not self.endpoint.is_connected(peer_id):
                    return          # closed since it sent the JOIN: nobody to create a room for
                source = source_key(self.endpoint.peer_address(peer_id))
                if self.rooms_by_source[source] >= self.rooms_per_source:
                    self._refuse(peer_id, "source_room_limit",
                                 f"rooms created from this address are at their limit "
                                 f"({self.rooms_per_source} open at once, "
                                 f"security.max_rooms_per_source); join an existing room")
                    return
            try:
                room = self.create_room(join.room, {}, now)
            except RelayError as error:
                self._refuse(peer_id, error.code, str(error))
                return
            if source is not None:
                self._room_source[room.room_id] = source
                self.rooms_by_source[source] += 1
        try:
            member = room.join(peer_id, join.player, join.spectator, now)
        except JoinRefused as refusal:
            self._refuse(peer_id, refusal.code, str(refusal))
            return
        self.inputs.seat(peer_id, room, member)
        self.counts["joins", "spectator" if member.spectator else "joined"] += 1
        self._settle(room)

    def _refuse(self, peer_id: int, code: str, text: str) -> None:
        self.counts["joins", "refused"] += 1
        self.counts["refusals", code] += 1
        self._send_control(peer_id, protocol.refused(code, text))
        # One line per connection; a connection that keeps sending JOINs is summarized.
        seen = self.notified.setdefault(peer_id, set())
        repeated = "join_refused" in seen
        seen.add("join_refused")
        self._report(None, "join_refused", peer=peer_id, reason=code, detail=text, repeated=repeated)

    def _refuse_input(self, peer_id: int, reason: str) -> None:
        self.counts["inputs", "refused"] += 1
        self.counts["inputs_refused", reason] += 1
        if reason in ("too_large", "not_a_player"):
            self._notice(peer_id, f"input_{reason}", f"input refused: {reason}")

    def _drop(self, peer_id: int, reason: str, detail: str, notice_code: Optional[str] = None) -> None:
        self.counts["drops", reason] += 1
        self._report(None, "message_dropped", peer=peer_id, reason=reason, detail=detail)
        if notice_code is not None:
            self._notice(peer_id, notice_code, detail)

    def _notice(self, peer_id: int, code: str, text: str) -> None:
        """Tell a client once per kind of mistake (a flood of bad messages gets one answer)."""
        seen = self.notified.setdefault(peer_id, set())
        if code not in seen:
            seen.add(code)
            self._send_control(peer_id, protocol.notice(code, text))

    def _send_control(self, peer_id: int, data: bytes) -> None:
        """A CONTROL message of the lobby's own (REFUSED, NOTICE)."""
        if not self.endpoint.send(peer_id, CONTROL, data) and self.endpoint.is_connected(peer_id):
            self._send_queue_full(self.room_of(peer_id), peer_id, CONTROL)

    # -- rooms ------------------------------------------------------------------------------

    def create_room(self, room_id: str, options: dict, now: float) -> Room:
        """A new waiting room; RelayError (draining, room_exists, too_many_rooms, bad_option)."""
        if self.draining:
            raise Unavailable("the relay is draining and creates no rooms")
        if room_id in self.rooms:
            raise Conflict(f"room {room_id} exists", "room_exists")
        if len(self.rooms) >= self.settings.max_rooms:
            raise Unavailable(f"the relay already has {self.settings.max_rooms} rooms", "too_many_rooms")
        room = Room(room_id, self.settings, self.tick_rate, now,
                    **room_options(self.settings, self.tick_rate, options))
        room.broadcast_frames = True        # one Endpoint.send_many per frame
        room.report_frames = self.report_frames
        if self._free_groups:
            room.group = self._free_groups.pop()
        else:
            room.group = self._groups_used
            self._groups_used += 1
        self.rooms[room_id] = room
        self._report(room, "room_created", capacity=room.capacity, start_policy=room.start_policy,
                     start_players=room.start_players)
        return room

    def start_room(self, room_id: str, now: float) -> Room:
        room = self.get_room(room_id)
        if room.state != WAITING:
            raise Conflict(f"room {room_id} is {room.state}, not waiting", "not_waiting")
        room.start(now)
        self._settle(room)
        return room

    def end_room(self, room_id: str, reason: str) -> Room:
        room = self.get_room(room_id)
        self._end(room, reason)
        return room

    def kick(self, room_id: str, player: str, now: float) -> Room:
        room = self.get_room(room_id)
        if room.kick(player, now) is None and not room.has_player(player):
            raise NotFound(f"player {player} is not in room {room_id}", "player_not_found")
        self._settle(room)
        return room

    def begin_drain(self) -> None:
        """No new rooms or players from now on; rooms with no match to finish end at once."""
        if self.draining:
            return
        self.draining = True
        for room in list(self.rooms.values()):
            if room.state == WAITING or not room.members:
                self._end(room, "draining")
        if not self.rooms:
            self._report(None, "drained")

    def end_all(self, reason: str) -> None:
        for room in list(self.rooms.values()):
            self._end(room, reason)

    def _end(self, room: Room, reason: str) -> None:
        room.end(reason)
        self._settle(room)
        self._remove(room)

    def _remove(self, room: Room) -> None:
        if self.rooms.pop(room.room_id, None) is room:
            source = self._room_source.pop(room.room_id, None)
            if source is not None:
                self.rooms_by_source[source] -= 1
                if not self.rooms_by_source[source]:
                    del self.rooms_by_source[source]
        room.history.close()
        for peer_id in list(room.members):
            self.inputs.unseat(peer_id)
        if room.group >= 0:
            self._free_groups.append(room.group)
            room.group = -1
        if self.draining and not self.rooms:
            self._report(None, "drained")

    def _settle(self, room: Room) -> None:
        """Carry out what a room asked for, then send its frame; what happened in it goes out
        as reports."""
        if room.actions:
            for action in room.take_actions():
                self._execute(room, action)
        frame, recipients = room.take_frame()
        if frame is not None:
            self._broadcast_frame(room, frame, recipients)
        if room.events:
            for event in room.take_events():
                self._reports.append((room, event))

    def _broadcast_frame(self, room: Room, frame: bytes, recipients: list) -> None:
        try:
            refused = self.endpoint.send_many(recipients, STREAM, frame)
        except ValueError as error:
            self._not_queued(room, "broadcast", STREAM, recipients, len(frame), error)
            return
        for peer_id in refused:
            self._send_queue_full(room, peer_id, STREAM)

    def _execute(self, room: Room, action: Action) -> None:
        try:
            self._carry_out(room, action)
        except ValueError as error:
            recipients = action.peer_ids if action.kind == "broadcast" else [action.peer_id]
            self._not_queued(room, action.kind, action.channel, recipients, len(action.data), error)

    def _not_queued(self, room: Room, kind: str, channel: int, recipients: list, size: int,
                    error: ValueError) -> None:
        """The core refused a message or block beyond its size limits (a huge frame or
        history): these members miss it, the room goes on."""
        self.counts["drops", "too_large"] += 1
        self._report(room, "send_refused", peer=-1 if kind == "broadcast" else recipients[0],
                     kind=kind, bytes=size, error=str(error))
        if kind == "block":
            if self.endpoint.is_connected(recipients[0]):
                # As for a block the core's queue refused: the member's catch-up is not left
                # open waiting for a delivery that never comes, and is repaired at a later tick.
                room.on_send_failed(recipients[0], "block")
        elif channel == STREAM:
            # A frame too large for one message (inputs at the configured maximum plus
            # many events): every member it was for gets it in a catch-up block (blocks
            # go up to protocol.MAX_BLOCK_SIZE) at the next tick, so no frame is lost.
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
                self.counts["blocks", "started"] += 1
            elif self.endpoint.is_connected(action.peer_id):
                room.on_send_failed(action.peer_id, "block")
        elif action.kind == "disconnect":
            self.inputs.unseat(action.peer_id)
            self.endpoint.disconnect(action.peer_id, action.reason)

    def _send_queue_full(self, room: Optional[Room], peer_id: int, channel: int) -> None:
        """The peer's queue is at server.max_pending_messages: the message is dropped. A frame
        is repaired later with a block. A CONTROL message cannot be: the client would go on
        without it (a WELCOME lost: a member never told so, sent frames for a room it does not
        know; a REFUSED lost: a JOIN never answered), so the connection is closed instead, and
        the client reconnects (a player gets its slot back)."""
        self.counts["drops", "send_queue_full"] += 1
        self._report(room, "send_queue_full", peer=peer_id,
                     limit=self.config.server.max_pending_messages)
        if channel == STREAM and room is not None:
            room.on_send_failed(peer_id, "stream")
        else:
            self.endpoint.disconnect(peer_id, "closed")

    # -- the tick ---------------------------------------------------------------------------

    def tick(self, now: float, send_ready: Optional[Callable[[], None]] = None) -> None:
        """Close a frame in every running room; end rooms left empty (or, draining, with no
        one to finish the match for) and forget ended ones. The rooms' common case (a frame and
        its events) is one compiled pass (``close_frames``); the rest is settled here.
        ``send_ready``: the driver's, to send what the pass has flushed every few rooms."""
        closed, broadcast, synthesized, unsettled, failed = close_frames(
            list(self.rooms.values()), now, self.endpoint.send_many, self.draining, self._reports,
            self.endpoint.run_group, self.handle_events, send_ready)
        for room, peer_ids, size, error in failed:
            if error is not None:
                self._not_queued(room, "broadcast", STREAM, peer_ids, size, error)
            else:
                for peer_id in peer_ids:
                    self._send_queue_full(room, peer_id, STREAM)
            self._settle(room)          # its events, after the failure's report
        for room in unsettled:
            if room.expired(now):
                room.end("empty")
            elif self.draining and not room.members:
                room.end("draining")      # nobody left to finish the match for
            self._settle(room)
            if room.state == ENDED:
                self._remove(room)
        if closed:
            self.counts["frames_closed", None] += closed
            self.counts["frames_broadcast", None] += broadcast
            if synthesized:
                self.counts["synthesized_inputs", None] += synthesized

    def close_roomless(self, now: float, timeout: float) -> None:
        """Close connections that have been in no room for ``timeout`` seconds (call about once
        a second): anyone who can finish a handshake could otherwise hold every peer slot."""
        since, self._roomless = self._roomless, {}
        closed = 0
        for peer_id in self.endpoint.peer_ids:
            if peer_id in self._room_of_peer:
                continue
            first_seen = since.get(peer_id, now)
            if now - first_seen < timeout:
                self._roomless[peer_id] = first_seen
            elif self.endpoint.disconnect(peer_id, "timeout"):
                closed += 1
        if closed:
            self.counts["refusals", "join_timeout"] += closed
            self._report(None, "connections_closed", reason="join_timeout", count=closed)

    # -- queries ----------------------------------------------------------------------------

    @property
    def input_outcomes(self) -> dict[str, int]:
        """accepted/late/duplicate -> inputs since the server last cleared it (the dict it
        clears): the general path's and the compiled input router's, up to the latest input."""
        return self.inputs.outcomes

    def room_counts(self) -> dict[str, int]:
        counts = {WAITING: 0, RUNNING: 0, ENDED: 0}
        for room in self.rooms.values():
            counts[room.state] += 1
        return counts

    def players_connected(self) -> int:
        return sum(room.players_connected for room in self.rooms.values())
