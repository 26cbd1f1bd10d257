"""A room: membership, input buffers, frame assembly, lifecycle. Sans-I/O, like the core.

The server calls a Room with peer ids, decoded messages and the time; the room answers with
``Action``s (send a message, send a block, disconnect a peer) that the server carries out, and
with ``RoomEvent``s for logs, metrics and the replay. Each tick's frame is the exception when the
server asks (``broadcast_frames``): it waits in the room for the server to take it with its
players (``take_frame``) and hand it to the core in one call, with no Action per tick. A room
never touches a socket or a clock, so tests drive it directly.

Frame N holds, for every slot, the player's input for N or None, plus the membership changes
(join, leave, timeout, reconnect) that happened while N was open, so every client agrees on the
frame at which they took effect. A connected player whose input is missing when N closes gets
what ``rooms.missing_input_policy`` says (nothing, its previous input, or the neutral input),
marked synthesized: the room never waits for a slow player. Frames are encoded once per tick
(compactly, relative to the previous frame) and the same bytes go to every member, to the
history (late joiners, catch-up) and to the replay.

The room also times every player's inputs: how long after it sent frame H (the newest frame the
client said it holds) the input arrived. A high percentile of that, in frames, is the input
delay the player needs for its inputs to make their frames; the room advises it (INPUT_DELAY).

Compiled: relay/server/room.pxd declares ``Slot``, ``Member`` and ``Room`` as extension types with C
fields (every tick and every input reads them for every player) and their per-input and
per-tick methods as C methods (``accept_input``, ``make_up_inputs``, ``fan_out``). This file is
the source of both: uncompiled it is the same room, in plain Python.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Optional

from relay import protocol
from relay.config import RoomSettings
from relay.server.history import FrameHistory
from relay.protocol import CONTROL, STREAM, Checksum, Input, Welcome
from relay.server.pending import PendingInputs
from relay.server.timing import InputTimes

WAITING, RUNNING, ENDED = "waiting", "running", "ended"
ACCEPTED, LATE = "accepted", "late"
"""Outcomes of an input that is buffered (the others: duplicate, refused:<reason>)."""

# A diverging checksum waits at most this many frames for the other players' reports.
DESYNC_WAIT_FRAMES = 30
# Frames per history block: a 30 Hz match's hour of history is ~7 blocks, each well under the
# core's block size limit even with large inputs.
HISTORY_BLOCK_FRAMES = 16384
# Newest frames of a room's history kept in memory (~1 s at 30 Hz; up to 32 more wait to be spooled).
HISTORY_IN_MEMORY = 32
# Each player's input-delay advice is recomputed this often, frames (a room's players together,
# rooms spread over the interval by advice_phase).
ADVICE_EVERY_FRAMES = 15
# Frames answered within the window needed before the first advice.
ADVICE_MIN_SAMPLES = 10
# Rooms closed between two sends of what the tick's pass flushed so far (close_frames'
# send_ready): 32 rooms of 8 fill a few sendmmsg batches.
SEND_READY_ROOMS = 32


class JoinRefused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Action:
    kind: str
    """send | block | disconnect | broadcast (``data`` to every peer in ``peer_ids``)"""
    peer_id: int
    channel: int = CONTROL
    data: bytes = b""
    reason: str = ""
    peer_ids: list = field(default_factory=list)
    """broadcast: the recipients, each exactly as if it had its own "send"."""


@dataclass
class RoomEvent:
    kind: str
    """joined, reconnected, left, timed_out, started, ended, frame, desync, input_refused, ..."""
    detail: dict = field(default_factory=dict)


class Slot:
    """A player's seat in a room: its input index in every frame, kept while the player is
    away (left or timed out) so that it can reconnect."""

    def __init__(self, index: int, player: str, peer_id: Optional[int], ready: bool = False,
                 away_since: Optional[float] = None):
        self.index = index
        self.player = player
        self.peer_id = peer_id
        self.ready = ready
        self.away_since = away_since
        """When the player went away, or None."""

    def __repr__(self) -> str:
        return (f"Slot(index={self.index}, player={self.player!r}, peer_id={self.peer_id!r}, "
                f"ready={self.ready}, away_since={self.away_since!r})")


class Member:
    """A connected client in a room: a player (``slot`` is its index) or a spectator."""

    def __init__(self, peer_id: int, player: str, slot: Optional[int], spectator: bool, have: int = -1,
                 next_live: int = 0, catching_up: bool = False, blocks_in_flight: int = 0,
                 block_first: int = 0, block_end: int = -1, last_sent: int = -1,
                 missing_from: Optional[int] = None, reported: bool = False):
        if type(peer_id) is not int:
            raise TypeError(f"peer_id must be an int, not {type(peer_id).__name__}")
        self.peer_id = peer_id
        self.player = player
        self.slot = slot
        self.spectator = spectator
        self.have = have
        """Highest frame held with every frame before it."""
        self.next_live = next_live
        """First frame it receives on the STREAM channel."""
        self.catching_up = catching_up
        """A history or catch-up block is in flight."""
        self.blocks_in_flight = blocks_in_flight
        self.block_first = block_first
        self.block_end = block_end
        """The client holds everything up to here once the blocks are delivered."""
        self.last_sent = last_sent
        """Last frame queued for it on the STREAM channel."""
        self.missing_from = missing_from
        """A frame from here on could not be queued: repair from here, or None."""
        self.reported = reported
        """It has reported ``have`` at least once."""
        self.advised: Optional[int] = None
        """The input delay last advised (players only; their response times are the room's
        ``input_times``)."""
        self.advised_at = 0.0
        self.lowerable_since = -1.0
        """Since when a lower advice would do (-1.0: it would not)."""
        self.response_ms = 0
        """The response time the advice came from, ms."""
        self.room: Optional[Room] = None
        """The room while it is a member (the input path reaches the room through it)."""

    def __repr__(self) -> str:
        return (f"Member(peer_id={self.peer_id}, player={self.player!r}, slot={self.slot!r}, "
                f"spectator={self.spectator}, have={self.have}, last_sent={self.last_sent})")


class Room:
    """A room's membership, lifecycle and frames."""

    def __init__(self, room_id: str, settings: RoomSettings, tick_rate: int, now: float,
                 start_policy: Optional[str] = None, start_players: Optional[int] = None,
                 capacity: Optional[int] = None):
        self.room_id = room_id
        self.settings = settings
        self.max_input_bytes = settings.max_input_bytes
        self.max_input_lead = settings.max_input_lead
        self.drop_late_inputs = settings.late_input_policy == "drop"
        self.tick_rate = tick_rate
        self.capacity = capacity if capacity is not None else settings.capacity
        self.start_policy = start_policy or settings.start_policy
        self.start_players = start_players if start_players is not None else settings.start_players
        self.state = WAITING
        self.created_at = now
        self.empty_since: Optional[float] = now
        self.slots: list[Slot] = []
        self.members: dict[int, Member] = {}
        self.open_frame = 0
        # The newest frames in memory, the rest in a temporary file: a long match's history
        # would outweigh its players (a delayed spectator's frame is read back each tick).
        self.history = FrameHistory(keep=HISTORY_IN_MEMORY)
        # Inputs received for the open frame and the max_input_lead frames after it, by frame
        # and slot index; the open frame's are taken when it closes.
        self.pending = PendingInputs(self.capacity, self.max_input_lead + 1)
        self.pending_events: list[list] = []
        self.missing_input_policy = settings.missing_input_policy
        self.neutral_input = settings.neutral_input_bytes
        self.synthesized_inputs = 0
        """Inputs made up by missing_input_policy, in all."""
        self.checksums: dict[int, dict[int, int]] = {}
        self.first_desync: Optional[int] = None
        """The first frame at which the players' checksums diverged."""
        self.reported_desyncs: set[int] = set()
        self.pending_desyncs: dict[int, int] = {}
        """Diverging frames waiting for the remaining players' checksums: frame -> deadline."""
        self.end_reason: Optional[str] = None
        self.actions: list[Action] = []
        self.events: list[RoomEvent] = []
        self.broadcast_frames = False
        """True: each tick's frame waits for its players in ``frame_recipients`` (the server
        hands it to the core in one call) instead of going out as a "send" Action per player."""
        self.frame_recipients: list = []
        """broadcast_frames: the ids of the players ``unsent_frame`` is for, in order (meaningful
        only while it is set)."""
        self.unsent_frame: Optional[bytes] = None
        """broadcast_frames: the last closed frame until the server takes it (``take_frame``)."""
        self.report_frames = True
        """Report every closed frame as a "frame" event (for replays; a server without them
        turns it off: one event per room and tick it would drop unread)."""
        self.started_at: Optional[float] = None
        self.input_times: Optional[InputTimes] = (
            InputTimes(self.capacity, settings.input_delay_window)
            if settings.input_delay_advice else None)
        """When recent frames closed and the players' response times to them, for the
        input-delay advice (None: no advice)."""
        self.advice_phase = zlib.crc32(room_id.encode()) % ADVICE_EVERY_FRAMES
        """The room's players are reviewed together, at frames n with (n + phase) a multiple of
        ADVICE_EVERY_FRAMES: one pass over its table, and rooms spread over the ticks."""
        self.group = -1                 # set by the lobby: Endpoint.bind_sink's group

    # -- queries ----------------------------------------------------------------------------

    @property
    def players_connected(self) -> int:
        return sum(1 for slot in self.slots if slot.peer_id is not None)

    @property
    def spectator_count(self) -> int:
        return sum(1 for member in self.members.values() if member.spectator)

    def has_player(self, player: str) -> bool:
        return any(slot.player == player for slot in self.slots)

    def info(self) -> dict:
        return {
            "room": self.room_id, "state": self.state, "frame": self.open_frame,
            "capacity": self.capacity, "start_policy": self.start_policy,
            "start_players": self.start_players, "spectators": self.spectator_count,
            "players": [{"slot": s.index, "player": s.player, "connected": s.peer_id is not None,
                         "ready": s.ready} for s in self.slots],
            "end_reason": self.end_reason,
        }

    def take_actions(self) -> list[Action]:
        actions, self.actions = self.actions, []
        return actions

    def take_events(self) -> list[RoomEvent]:
        events, self.events = self.events, []
        return events

    def take_frame(self) -> tuple[Optional[bytes], list]:
        """broadcast_frames: the closed frame still to send and its players' ids, or (None, [])."""
        frame = self.unsent_frame
        if frame is None:
            return None, []
        self.unsent_frame = None
        return frame, self.frame_recipients

    # -- membership -------------------------------------------------------------------------

    def join(self, peer_id: int, player: str, spectator: bool, now: float) -> Member:
        """Admit a peer; queues its WELCOME (and history block). Raises JoinRefused."""
        if self.state == ENDED:
            raise JoinRefused("room_ended", f"room {self.room_id} has ended")
        if spectator:
            return self._join_spectator(peer_id, player)
        slot = next((s for s in self.slots if s.player == player), None)
        if slot is not None:
            return self._reclaim(slot, peer_id, now)
        if self.state == RUNNING and not self.settings.allow_late_join:
            raise JoinRefused("running", f"room {self.room_id} is running and takes no late joiners")
        if len(self.slots) < self.capacity:
            slot = Slot(len(self.slots), player, peer_id)
            self.slots.append(slot)
        else:
            # A slot whose owner's reconnect grace has run out goes to the newcomer (same index).
            slot = next((s for s in self.slots if self._slot_expired(s, now)), None)
            if slot is None:
                raise JoinRefused("room_full", f"room {self.room_id} is full ({self.capacity} players)")
            slot.player, slot.peer_id, slot.ready, slot.away_since = player, peer_id, False, None
            # Nothing of the previous owner's may reach the newcomer's frames or verdicts.
            self._drop_inputs(slot.index, self.open_frame)
            for by_slot in self.checksums.values():
                by_slot.pop(slot.index, None)
        member = self._admit(peer_id, player, slot.index, spectator=False)
        self.pending_events.append(["join", slot.index, player])
        self.events.append(RoomEvent("joined", {"player": player, "slot": slot.index,
                                                "frame": self.open_frame}))
        self._maybe_start(now)
        return member

    def _reclaim(self, slot: Slot, peer_id: int, now: float) -> Member:
        if slot.peer_id is not None:
            # The same player on a new connection (its old one not yet timed out): the newer
            # connection wins, the old one is closed.
            old = self.members.pop(slot.peer_id, None)
            if old is not None:
                old.room = None
            self.actions.append(Action("disconnect", slot.peer_id, reason="replaced"))
        elif self._slot_expired(slot, now):
            raise JoinRefused("slot_expired", f"player {slot.player}'s slot in {self.room_id} "
                                              f"expired {self.settings.reconnect_grace:g} s after it left")
        slot.peer_id = peer_id
        slot.away_since = None
        # A reconnect sends READY again (RELAY_PROTOCOL 6.2, 10), also when it replaced a
        # connection that was still up (whose mark no leave had cleared).
        slot.ready = False
        member = self._admit(peer_id, slot.player, slot.index, spectator=False)
        self.pending_events.append(["reconnect", slot.index, slot.player])
        self.events.append(RoomEvent("reconnected", {"player": slot.player, "slot": slot.index,
                                                     "frame": self.open_frame}))
        self._maybe_start(now)
        return member

    def _slot_expired(self, slot: Slot, now: float) -> bool:
        return (slot.peer_id is None and slot.away_since is not None
                and now - slot.away_since > self.settings.reconnect_grace)

    def _join_spectator(self, peer_id: int, player: str) -> Member:
        if self.spectator_count >= self.settings.max_spectators:
            raise JoinRefused("spectators_full", f"room {self.room_id} has its "
                                                 f"{self.settings.max_spectators} spectators")
        member = self._admit(peer_id, player, None, spectator=True)
        self.events.append(RoomEvent("spectator_joined", {"player": player}))
        return member

    def _admit(self, peer_id: int, player: str, slot: Optional[int], spectator: bool) -> Member:
        """Register the member, send WELCOME and, in a running room, the history it missed."""
        released = self._released_frames(spectator)
        member = Member(peer_id, player, slot, spectator, next_live=released)
        if slot is not None and self.input_times is not None:
            self.input_times.clear_slot(slot)
        self.members[peer_id] = member
        member.room = self
        self.empty_since = None
        welcome = Welcome(self.room_id, player, slot, self.tick_rate, self.state, released,
                          history=released, spectator=spectator)
        self.actions.append(Action("send", peer_id, CONTROL, welcome.encode()))
        if released:
            self._send_block(member, 0, released)
            self.events.append(RoomEvent("history_sent", {"player": player, "frames": released}))
        return member

    def _send_block(self, member: Member, first: int, end: int) -> None:
        """Frames first..end-1 from the history, as compressed blocks of at most
        HISTORY_BLOCK_FRAMES frames each (a long match's history stays under the block limit)."""
        for start in range(first, end, HISTORY_BLOCK_FRAMES):
            self._queue_history(member, start, min(end, start + HISTORY_BLOCK_FRAMES))
        member.catching_up = True
        member.block_first = first
        member.block_end = end - 1

    def _queue_history(self, member: Member, start: int, stop: int) -> None:
        """One block of frames start..stop-1, halved until it fits protocol.MAX_BLOCK_SIZE: a
        block the core refuses as too large would be refused again at every repair."""
        data = protocol.encode_history(start, self.history[start:stop])
        if len(data) > protocol.MAX_BLOCK_SIZE and stop - start > 1:
            middle = (start + stop) // 2
            self._queue_history(member, start, middle)
            self._queue_history(member, middle, stop)
            return
        self.actions.append(Action("block", member.peer_id, data=data))
        member.blocks_in_flight += 1

    def _released_frames(self, spectator: bool) -> int:
        """Frames a member may have right now: all closed ones, or the delayed ones for spectators."""
        if spectator:
            return max(0, self.open_frame - self.settings.spectator_delay)
        return self.open_frame

    def detach(self, peer_id: int, reason: str, now: float) -> None:
        """A member left (LEAVE, disconnect, timeout or kick); its slot stays reclaimable."""
        member = self.members.pop(peer_id, None)
        if member is None:
            return
        member.room = None
        if member.slot is not None:
            slot = self.slots[member.slot]
            slot.peer_id = None
            slot.ready = False
            slot.away_since = now
            if self.state != ENDED:
                # Frame 0 carries what happened while waiting, so joins and leaves both count.
                kind = "timeout" if reason == "timeout" else "leave"
                self.pending_events.append([kind, slot.index, slot.player])
                # The open frame, which holds the leave, is the player's last: inputs it sent
                # ahead for later frames are dropped (an away slot is nil, section 7).
                self._drop_inputs(slot.index, self.open_frame + 1)
            self.events.append(RoomEvent("timed_out" if reason == "timeout" else "left",
                                         {"player": slot.player, "slot": slot.index,
                                          "reason": reason, "frame": self.open_frame}))
        if not self.members:
            self.empty_since = now
        self._maybe_start(now)

    def kick(self, player: str, now: float) -> Optional[int]:
        """Disconnect a player (its slot stays, as for a timeout); returns its peer id."""
        slot = next((s for s in self.slots if s.player == player), None)
        peer_id: Optional[int]
        if slot is None:
            member = next((m for m in self.members.values() if m.player == player), None)
            if member is None:
                return None
            peer_id = member.peer_id
        else:
            peer_id = slot.peer_id
        if peer_id is not None:
            self.detach(peer_id, "kicked", now)
            self.actions.append(Action("disconnect", peer_id, reason="kicked"))
        self.events.append(RoomEvent("kicked", {"player": player}))
        return peer_id

    def set_ready(self, peer_id: int, now: float) -> None:
        member = self.members.get(peer_id)
        if member is not None and member.slot is not None:
            self.slots[member.slot].ready = True
            self._maybe_start(now)

    # -- lifecycle --------------------------------------------------------------------------

    def _maybe_start(self, now: float) -> None:
        if self.state != WAITING or self.start_policy == "admin":
            return
        connected = [s for s in self.slots if s.peer_id is not None]
        if len(connected) < self.start_players:
            return
        if self.start_policy == "ready" and not all(s.ready for s in connected):
            return
        self.start(now)

    def start(self, now: float) -> None:
        if self.state != WAITING:
            return
        self.state = RUNNING
        self.started_at = now
        self._broadcast(CONTROL, protocol.room_state(RUNNING, self.open_frame))
        self.events.append(RoomEvent("started", {"players": [s.player for s in self.slots]}))

    def end(self, reason: str) -> None:
        if self.state == ENDED:
            return
        self.state = ENDED
        self.end_reason = reason
        # The match is over: spectators get the frames their delay still held back.
        for member in self.members.values():
            if member.spectator:
                for number in range(max(member.last_sent + 1, member.next_live), self.open_frame):
                    self.actions.append(Action("send", member.peer_id, STREAM, self.history[number]))
        self._broadcast(CONTROL, protocol.room_state(ENDED, self.open_frame, reason))
        self.events.append(RoomEvent("ended", {"reason": reason, "frames": self.open_frame}))

    def expired(self, now: float) -> bool:
        """Nobody connected for empty_timeout: the room should end."""
        return (self.state != ENDED and self.empty_since is not None
                and now - self.empty_since >= self.settings.empty_timeout)

    # -- inputs and checksums ---------------------------------------------------------------

    def on_input(self, peer_id: int, message: Input, now: Optional[float] = None) -> str:
        """Buffer one input; returns the outcome: accepted, late, duplicate, or refused:<reason>.
        ``now`` (the arrival time) times the input for the input-delay advice."""
        return self.accept_input(peer_id, message.frame, message.payload, message.have,
                                 -1.0 if now is None else now)

    def accept_input(self, peer_id: int, frame: int, payload: bytes, have: int, now: float) -> str:
        """``on_input`` with the message's fields (relay.server.inputs calls it for every canonical
        INPUT); ``now`` < 0: the input is not timed."""
        member = self.members.get(peer_id)
        if member is None:
            if type(payload) is not bytes:
                raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
            return "refused:not_a_player"
        return self.accept_member_input(member, frame, payload, have, now)

    def accept_member_input(self, member: Member, frame: int, payload: bytes, have: int,
                            now: float) -> str:
        """``accept_input`` for a member already at hand (``member.room`` is this room)."""
        if type(payload) is not bytes:
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        outcome = ACCEPTED
        slot = member.slot
        if slot is None:
            return "refused:not_a_player"
        if have > member.have:
            member.have = have
        member.reported = True
        if self.state != RUNNING:
            return "refused:not_running"
        if now >= 0.0:
            self._time_input(member, frame, have, now)
        if len(payload) > self.max_input_bytes:
            return "refused:too_large"
        if frame < self.open_frame:
            if self.drop_late_inputs:
                return "refused:late_dropped"
            frame, outcome = self.open_frame, LATE
        elif frame > self.open_frame + self.max_input_lead:
            return "refused:too_far_ahead"
        if not self.pending.put(frame, slot, payload):
            return "duplicate" if outcome == ACCEPTED else "refused:late_dropped"
        return outcome

    def _drop_inputs(self, slot_index: int, first: int) -> None:
        """Forget the inputs buffered for slot ``slot_index`` for frame ``first`` and later."""
        self.pending.drop_slot(slot_index, first)

    def buffered_inputs(self) -> dict[int, dict[int, bytes]]:
        """The inputs waiting for their frame to close: frame -> slot index -> payload."""
        return self.pending.buffered()

    def _time_input(self, member: Member, frame: int, have: int, now: float) -> None:
        """How long after frame ``have`` closed this input arrived: the input was sent for frame
        have + d when the client held frame ``have``, so d must exceed this time in frames for it
        to be on time. Inputs sent while catching up say nothing about the link."""
        times = self.input_times
        if times is None or have >= self.open_frame or member.catching_up:
            return
        slot: int = member.slot     # type: ignore[assignment]  # a player's: an int
        times.answer(slot, have, frame < self.open_frame, now)

    def _advise_input_delay(self, member: Member, now: float) -> None:
        times = self.input_times
        if times is None:
            return
        settings = self.settings
        slot: int = member.slot     # type: ignore[assignment]  # a player's: an int
        answered, late, percentile = times.review(slot, self.open_frame - 1,
                                                  settings.input_delay_percentile)
        if answered < ADVICE_MIN_SAMPLES:
            return
        interval = 1.0 / self.tick_rate
        response = percentile + settings.input_delay_margin
        needed = math.ceil(response / interval - 1e-9)
        # Lowering wants half a frame of slack more, so the advice does not flap when the
        # response time sits near a frame boundary, and for as long as the window of response
        # times lasts, so that a quiet spell on a jittery link does not lower it only for the
        # next spike to raise it again (each change shifts the player's inputs).
        relaxed = math.ceil(response / interval + 0.5 - 1e-9)
        current = member.advised
        if current is None or needed > current:
            advised = needed
            member.lowerable_since = -1.0
        elif relaxed < current:
            advised = current
            if member.lowerable_since < 0.0:
                member.lowerable_since = now
            elif now - member.lowerable_since >= settings.input_delay_window * interval - 1e-9:
                advised = relaxed
                member.lowerable_since = -1.0
        else:
            advised = current
            member.lowerable_since = -1.0
        ceiling = min(settings.input_delay_max, settings.max_input_lead)
        advised = max(min(settings.input_delay_min, ceiling), min(ceiling, advised))
        changed = advised != current
        if not changed and now - member.advised_at < settings.input_delay_interval:
            return
        member.advised, member.advised_at = advised, now
        member.response_ms = round(response * 1000)
        self.actions.append(Action("send", member.peer_id, CONTROL, protocol.input_delay(
            advised, member.response_ms, late, answered)))
        if changed:
            self.events.append(RoomEvent("input_delay", {
                "player": member.player, "slot": member.slot, "frames": advised,
                "response_ms": member.response_ms, "late": late, "inputs": answered}))

    def on_checksum(self, peer_id: int, message: Checksum) -> None:
        member = self.members.get(peer_id)
        if member is None or member.slot is None or message.frame >= self.open_frame:
            return
        if message.frame < self.open_frame - self.settings.checksum_window:
            return
        by_slot = self.checksums.setdefault(message.frame, {})
        if member.slot in by_slot:
            return
        by_slot[member.slot] = message.value
        self.events.append(RoomEvent("checksum", {"frame": message.frame, "slot": member.slot,
                                                  "player": member.player,
                                                  "value": message.value}))
        if len(set(by_slot.values())) < 2 or message.frame in self.reported_desyncs:
            return
        # Report once every connected player has answered for the frame (so the minority is
        # known whoever answered first), or DESYNC_WAIT_FRAMES later at the latest.
        connected = {s.index for s in self.slots if s.peer_id is not None}
        if connected <= set(by_slot):
            self.pending_desyncs.pop(message.frame, None)
            self._report_desync(message.frame, by_slot)
        else:
            self.pending_desyncs.setdefault(message.frame, self.open_frame + DESYNC_WAIT_FRAMES)

    def _report_desync(self, frame: int, by_slot: dict[int, int]) -> None:
        if frame in self.reported_desyncs or len(set(by_slot.values())) < 2:
            return
        self.reported_desyncs.add(frame)
        if self.first_desync is None or frame < self.first_desync:
            self.first_desync = frame
        checksums = {self.slots[slot].player: value for slot, value in by_slot.items()}
        verdict, groups, minority = desync_verdict(checksums)
        self._broadcast(CONTROL, protocol.desync(frame, checksums, minority, verdict, groups))
        self.events.append(RoomEvent("desync", {
            "frame": frame, "checksums": checksums, "minority": minority, "verdict": verdict,
            "groups": groups, "first_diverging_frame": self.first_desync}))

    # -- ticks ------------------------------------------------------------------------------

    def tick(self, now: float) -> Optional[bytes]:
        """Close the open frame (running rooms only); returns its bytes."""
        if self.state != RUNNING:
            return None
        if self.unsent_frame is not None:
            # The previous frame was never taken: it goes the general way, ahead of this one.
            self.actions.append(Action("broadcast", -1, STREAM, self.unsent_frame,
                                       peer_ids=self.frame_recipients))
            self.unsent_frame = None
        number = self.open_frame
        synthesized = self.make_up_inputs()
        data = self.pending.close(number, len(self.slots), synthesized, self.pending_events)
        if self.pending_events:
            self.pending_events = []
        self.history.append(data)
        if self.input_times is not None:
            self.input_times.close(number, now)
        self.open_frame += 1
        spectator_frame = number - self.settings.spectator_delay
        broadcast = self.fan_out(number, data, now, spectator_frame, self.settings.catchup_frames,
                                 ADVICE_EVERY_FRAMES)
        if broadcast:
            self.unsent_frame = data
            self.frame_recipients = broadcast
        if self.checksums:          # rooms whose clients send no checksums skip it all
            self._age_checksums(number)
        if self.report_frames:
            self.events.append(RoomEvent("frame", {"frame": number, "data": data}))
        return data

    def _age_checksums(self, number: int) -> None:
        """Report the diverging frames whose wait is over; forget frames past the window."""
        for diverging in [f for f, due in self.pending_desyncs.items() if self.open_frame >= due]:
            del self.pending_desyncs[diverging]
            self._report_desync(diverging, self.checksums.get(diverging, {}))
        stale = number - self.settings.checksum_window
        if stale >= 0:
            self.checksums.pop(stale, None)
            self.reported_desyncs.discard(stale)
            self.pending_desyncs.pop(stale, None)

    def make_up_inputs(self) -> Optional[list]:
        """The open frame's missing input of each connected player made up by
        missing_input_policy ("repeat": the player's input of the previous frame, if it had
        one; "neutral": the neutral input); returns the slots made up, or None."""
        if self.missing_input_policy == "none":
            return None
        pending = self.pending
        synthesized: Optional[list] = None
        for index in pending.missing(len(self.slots)):
            if not self._connected(index):
                continue
            if self.missing_input_policy == "repeat":
                made_up = pending.repeat(index)
            else:
                made_up = pending.put(self.open_frame, index, self.neutral_input)
            if made_up:
                if synthesized is None:
                    synthesized = []
                synthesized.append(index)
        if synthesized is not None:
            self.synthesized_inputs += len(synthesized)
        return synthesized

    def _connected(self, index: int) -> bool:
        slot = self.slots[index]
        if slot is None:
            raise TypeError("slots must hold Slot objects, not None")
        return slot.peer_id is not None

    def fan_out(self, number: int, data: bytes, now: float, spectator_frame: int, catchup_frames: int,
                advice_every: int) -> Optional[list]:
        """Frame ``number`` (``data``) to every member: players get it now (their ids are
        returned for one broadcast when broadcast_frames, else a send each through
        ``_send_stream``), spectators frame ``spectator_frame`` once they are that far. On the
        way: a member that lost frames or is far behind is caught up (``_maybe_catch_up``),
        and every ``advice_every`` frames the players' input delays are reviewed
        (``_advise_input_delay``, all of the room's in the same frame: see ``advice_phase``)."""
        broadcast: Optional[list] = [] if self.broadcast_frames else None
        if advice_every < 1:
            raise ValueError(f"advice_every must be at least 1, got {advice_every}")   # a divisor
        review = (self.input_times is not None
                  and (number + self.advice_phase) % advice_every == 0)
        for member in self.members.values():
            if member is None:
                raise TypeError("members must hold Member objects, not None")
            if not member.catching_up and (member.missing_from is not None or (
                    member.reported and number - member.have > catchup_frames)):
                self._maybe_catch_up(member)
            if member.spectator:
                if spectator_frame >= member.next_live:
                    member.last_sent = spectator_frame
                    self._send_stream(member.peer_id, self.history[spectator_frame])
            else:
                member.last_sent = number
                if broadcast is None:
                    self._send_stream(member.peer_id, data)
                else:
                    broadcast.append(member.peer_id)
                if review:
                    self._advise_input_delay(member, now)
        return broadcast

    def _send_stream(self, peer_id: int, data: bytes) -> None:
        self.actions.append(Action("send", peer_id, STREAM, data))

    def _maybe_catch_up(self, member: Member) -> None:
        """Repair a member with one block: the frames it lacks because a send failed, or,
        for a player far behind, everything after what it reported holding (instead of making
        it wait for the stream to work through its backlog). ``fan_out`` decides who needs it:
        a member with ``missing_from`` set, or one that reported a ``have`` more than
        catchup_frames behind (only players report one)."""
        if member.catching_up:
            return
        first = member.missing_from if member.missing_from is not None else max(0, member.have + 1)
        member.missing_from = None
        end = self._released_frames(member.spectator)
        if first >= end:
            return
        self._send_block(member, first, end)
        self.events.append(RoomEvent("catch_up", {"player": member.player, "first": first,
                                                  "frames": end - first}))

    def on_send_failed(self, peer_id: int, what: str) -> None:
        """The core refused to queue a frame ("stream") or a block ("block") for this member:
        the next tick repairs the gap with a block."""
        member = self.members.get(peer_id)
        if member is None:
            return
        if what == "block":
            # Only this part is lost: the parts of the catch-up queued before it (and after
            # it, if the core takes them) are still delivered, each with a BlockDelivered, so
            # they stay counted. The repair (next tick, from the catch-up's first frame) adds
            # its parts to them, and the catch-up ends only when all of them have arrived:
            # the old parts' deliveries never count against the repair's.
            member.blocks_in_flight = max(0, member.blocks_in_flight - 1)
            member.catching_up = False
            lost = member.block_first
        else:
            lost = member.last_sent
        member.missing_from = lost if member.missing_from is None else min(member.missing_from, lost)

    def on_block_delivered(self, peer_id: int) -> None:
        member = self.members.get(peer_id)
        if member is not None:
            member.blocks_in_flight = max(0, member.blocks_in_flight - 1)
            if member.blocks_in_flight:
                return
            member.catching_up = False
            # Everything closed so far was in the block or is queued on the stream behind it.
            member.have = max(member.have, member.block_end,
                              -1 if member.spectator else self.open_frame - 1)

    def _broadcast(self, channel: int, data: bytes) -> None:
        for peer_id in self.members:
            self.actions.append(Action("send", peer_id, channel, data))


def accept_room_input(room: Room, peer_id: int, frame: int, payload: bytes, have: int,
                      now: float) -> str:
    """``room.accept_input(...)``: relay.server.inputs calls it as a C function when this module is
    compiled (no Python call per input); ``room`` must be a Room."""
    typed_room = room       # a Room in relay/server/room.pxd: the type is checked, the call is C
    return typed_room.accept_input(peer_id, frame, payload, have, now)


def accept_bound_input(member: Member, frame: int, payload: bytes, have: int,
                       now: float) -> Optional[str]:
    """``member.room.accept_member_input(member, ...)`` for a member the core handed over with
    its peer (relay.server.inputs), as a C function like accept_room_input; None when the member
    has left its room (the caller takes the general path)."""
    typed_member = member
    typed_room = typed_member.room
    if typed_room is None:
        return None
    return typed_room.accept_member_input(typed_member, frame, payload, have, now)


def close_frames(rooms: list, now: float, send_many, draining: bool, reports: list,
                 run_group=None, handle_events=None, send_ready=None) -> tuple:
    """One tick of the server's rooms in one compiled pass: ``Room.tick`` for each of ``rooms``
    and, for a room with no actions waiting, its frame handed at once to ``send_many`` (the
    core's ``Endpoint.send_many``) on STREAM and its events appended to ``reports`` as
    (room, event), with no Python run per room.

    With ``run_group`` (the core's ``Endpoint.run_group``), each room's players' held datagrams
    are taken first (their inputs go into the room, their acks into the core) and the frame is
    sent with ``send_many(..., now)``, which flushes each player right after it is queued: a
    player's state is brought into the cache once per tick, not once per pass. Whatever events
    that leaves waiting (a control message) go to ``handle_events(now)`` before the room's
    frame closes, as they would have had they been taken on arrival. ``send_ready()``, called
    after every SEND_READY_ROOMS rooms, sends what is flushed so far (the first rooms' frames
    leave while the last are closed).

    Returns (frames closed, members they went to, inputs synthesized, the rooms the server must
    settle itself, the frame sends that failed). A room to settle is one with actions waiting,
    nobody connected (it may have expired), or none left while ``draining``: its frame stays in
    ``take_frame``, to go out after its actions, and its events wait too. A failed send is
    (room, peer ids, frame bytes, the ValueError ``send_many`` raised) or, for the players whose
    queue was full, (room, their ids, frame bytes, None); that room's events wait for the server
    to report them after the failure."""
    closed = broadcast = synthesized = 0
    unsettled: list = []
    failed: list = []
    passed = 0
    for typed_room in rooms:
        if send_ready is not None and passed and passed % SEND_READY_ROOMS == 0:
            send_ready()
        passed += 1
        before = typed_room.synthesized_inputs
        if run_group is not None and typed_room.group >= 0 and run_group(typed_room.group):
            handle_events(now)
        if typed_room.tick(now) is not None:
            closed += 1
            broadcast += len(typed_room.members)
            synthesized += typed_room.synthesized_inputs - before
        if (typed_room.actions or typed_room.empty_since is not None or typed_room.state == ENDED
                or (draining and not typed_room.members)):
            unsettled.append(typed_room)
            continue
        frame = typed_room.unsent_frame
        if frame is not None:
            typed_room.unsent_frame = None
            try:
                refused = (send_many(typed_room.frame_recipients, STREAM, frame) if run_group is None
                           else send_many(typed_room.frame_recipients, STREAM, frame, now))
            except ValueError as error:
                failed.append((typed_room, typed_room.frame_recipients, len(frame), error))
                continue
            if refused:
                failed.append((typed_room, refused, len(frame), None))
                continue
        if typed_room.events:
            for event in typed_room.take_events():
                reports.append((typed_room, event))
    return closed, broadcast, synthesized, unsettled, failed


def desync_verdict(checksums: dict[str, int]) -> tuple[str, list[list[str]], list[str]]:
    """Group players by checksum value. Returns (verdict, groups largest first, minority):
    "minority" when one group is strictly larger than every other (the players outside it are
    the minority, sorted), "undecided" when there is no such group (1 vs 1, 2 vs 2, all
    different), "agreed" when every value is equal."""
    by_value: dict[int, list[str]] = {}
    for player, value in checksums.items():
        by_value.setdefault(value, []).append(player)
    groups = sorted((sorted(players) for players in by_value.values()),
                    key=lambda players: (-len(players), players))
    if len(groups) < 2:
        return "agreed", groups, []
    if len(groups[0]) > len(groups[1]):
        return "minority", groups, sorted(p for group in groups[1:] for p in group)
    return "undecided", groups, []
