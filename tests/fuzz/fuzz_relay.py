"""Fuzzing the relay's own network entry point in memory: what connected clients send, through
RelayServer, its Lobby, the InputRouter and the compiled Room.

tests/fuzz/fuzz_endpoint.py stops at relay_core. Here a real ``RelayServer`` (never started: no
socket, no event loop, replays off) is driven the way its event loop drives it -- datagrams into
its endpoint then ``on_datagrams``, ``tick`` at the tick rate and ``every_second`` once a
second -- by up to MAX_CLIENTS relay_core client Endpoints exchanging
datagrams with it in memory. Each step is a seeded random choice of:

- an application message from a client, on CONTROL or STREAM (sometimes the wrong one): JOIN to
  one of four rooms as a player or a spectator, READY, CHECKSUM, LEAVE, INPUT (frames around the
  open frame, hostile ``have`` values, payloads up to and past rooms.max_input_bytes), built with
  relay.protocol's encoders; the same messages mutated (bit flips, truncations, extensions);
  messages with fields of the wrong msgpack type, huge or negative integers; INPUTs in longer
  msgpack forms than the shortest (valid; the compiled reader leaves most of them to the
  general decoder); random bytes and the message payloads of tests/vectors/data.json;
- a client connecting (token mode: with a connect token, now and then for another room or
  player, expired or signed with an unknown key), leaving gracefully, vanishing, or losing its
  link one way or both for a while;
- an admin room action (end, kick, start), the one way a room ends with members in it;
- only time passing. Every step advances 1-12 ms, with ticks at the tick rate; now and then the
  whole world freezes for 1.5-6 s, so player_timeout, join_timeout and empty rooms run out.

Small limits (3 players a room, 3 rooms, 16 queued messages a peer, a catch-up past 12 frames,
...) make refusals, repairs and catch-up blocks frequent. Runs alternate open and token mode
and draw their tick rate and room policies from the seed. A run ends with a settle: every link
restored, no more messages, time until every member holds every frame released to it and every
message is resolved (at most SETTLE_SECONDS).

The server's endpoint is watched through a forwarding tap (EndpointTap), and the server's
``_observe_event`` and its lobby's ``_on_message``, ``_refuse_input``, ``_drop`` and ``_remove``
are wrapped: to observe, never to change what
they do. Invariants, checked as the run goes:

1. nothing raises out of the server;
2. every room's history holds exactly ``open_frame`` frames; its frames decode in order
   (relay.protocol.FrameDecoder), and each "frame" event reports the frame the history holds;
3. every FRAME the server queues for a connection, live or in a history/catch-up block, is
   byte-identical to that room's frame of the same number, and goes only to a current member;
   the live frames of one membership (one WELCOME) strictly increase, start at WELCOME's
   next_frame, and a player's live frame is always the one just closed; a WELCOME matches the
   member the room admitted (slot, spectator, next_frame = history = the frames released);
4. each client receives exactly what the server queued for it, in order (STREAM and blocks);
5. no gap: merging a membership's live frames and blocks as docs/RELAY_PROTOCOL.md section 9.3
   says, whenever the client has received everything queued for it and the server owes it no
   repair (``missing_from`` None, no block in flight), it holds every frame from 0 to the
   newest it has received, and at least WELCOME's next_frame frames; after the settle it holds
   every frame released to it. When its room ends with no repair owed, it holds every frame of
   the room once everything queued has arrived (a frame lost to a full queue just before the
   end is never repaired: by design, not checked);
6. every STREAM message a client sends is resolved exactly once, for that client's peer: an
   input outcome, an input refusal or a drop; after the settle none is left unresolved on a
   connection both ends still hold. When one datagram brings exactly one resolution,
   it is checked against the message: relay.protocol cannot decode it <=> dropped as
   malformed; a decoded non-INPUT is dropped as wrong_channel; an INPUT is never dropped, is
   refused as too_large iff its payload exceeds max_input_bytes (when the sender is a player of
   a room), is accepted only for the open frame up to max_input_lead ahead, taken late only
   for a frame already closed, refused as too_far_ahead only beyond the lead, never refused
   as not_a_player while its sender is a player;
7. an INPUT accepted (or taken late, into the open frame) is in that frame, in the sender's
   slot, when the frame closes -- if the sender is still a member then (a player who left may
   have had it dropped).

    python tests/fuzz/fuzz_relay.py --seconds 60           # or --runs N; --seed, --mode, --steps
    nice -n 19 python tests/fuzz/fuzz_relay.py --seconds 3600 --seed 7

Prints one JSON line (steps, messages, rooms, frames, input outcomes by reason, violations);
exit status 1 on any violation or exception. A violation ends the fuzzing after its run, and
``last_run`` names that run's seed and mode: ``RelayFuzz(seed, mode).run()`` replays it.
"""
from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import json
import pathlib
import random
import sys
import time
import traceback
from typing import Optional

import msgpack

from relay import protocol
from relay.client import client_config
from relay.config import RelayConfig
from relay.errors import RelayError
from relay.protocol import CONTROL, STREAM, Input, ProtocolError
from relay.server.room import ENDED
from relay.server.scheduler import MAX_CATCH_UP_TICKS
from relay.logs import LimitLog
from relay.server.daemon import RelayServer
from relay_core import BlockReceived, Endpoint, MessageReceived, PeerConnected, PeerDisconnected
from relay_core.token import mint_token

VECTOR_FILE = pathlib.Path(__file__).resolve().parent.parent / "vectors" / "data.json"
SERVER_ADDRESS = ("10.0.0.1", 7777)
ROOM_NAMES = ("arena", "lobby", "duel", "solo")     # one more than max_rooms: too_many_rooms
ROOM_WEIGHTS = (6, 4, 2, 1)     # mostly the first rooms, so that they fill and start
# The last is the longest name JOIN allows (64 characters, 128 bytes of UTF-8: frame events
# carry it); a connect token holds at most 64 bytes, so token mode never mints it.
PLAYER_NAMES = ("ann", "bob", "cy", "dee", "eve", "\u00e9" * 64)
MAX_CLIENTS = 6
MAX_PEERS = 8                   # a vanished client's peer holds a slot until it times out
MAX_INPUT_BYTES = 48
INPUT_LEAD = 8
SPECTATOR_DELAY = 6
# At 120 Hz a client that hears nothing fills its window (64 frames) and queue (16) in 0.7 s,
# so repairs of frames that could not be queued happen well within player_timeout.
TICK_RATES = (30, 60, 120)
KEY_ID, KEY = 7, bytes(range(100, 132))
STEPS_PER_RUN = 1500
SETTLE_SECONDS = 8.0           # past the longest resend backoff after an outage
MODES = ("open", "token")
# msgpack values put where a message expects something else.
HOSTILE_VALUES = (-1, -2**31, -2**63, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1, 0.5, float("nan"),
                  None, True, False, "", "x" * 65, "\u00e9\u00e9", b"", b"\xff" * 300, [], [1, [2]],
                  {}, {"room": "arena"})
INPUT_SIZES = (0, 1, 2, 4, 8, 16, MAX_INPUT_BYTES - 1, MAX_INPUT_BYTES, MAX_INPUT_BYTES + 1,
               2 * MAX_INPUT_BYTES, 300)
INPUT_SIZE_WEIGHTS = (4, 4, 4, 8, 8, 6, 2, 2, 2, 1, 1)


def vector_payloads() -> list[bytes]:
    """The message and fragment payloads of the transport vectors: bytes a relay_core peer
    delivers as messages, although not application messages."""
    vectors = json.loads(VECTOR_FILE.read_text())["vectors"]
    return [bytes.fromhex(record["payload"]) for vector in vectors
            for record in vector["decoded"].get("records", ()) if record.get("kind") in ("message", "fragment")]


VECTOR_PAYLOADS = vector_payloads()


def fuzz_config(mode: str, rng: random.Random) -> RelayConfig:
    """Small limits, so that refusals, repairs and catch-ups happen within a few hundred steps;
    the room policies are drawn from the run's seed."""
    base = RelayConfig()
    policy = rng.choice(("none", "repeat", "neutral"))
    rooms = dataclasses.replace(
        base.rooms, capacity=3, start_players=2, max_rooms=3, max_spectators=2,
        start_policy=rng.choice(("players", "ready")), allow_late_join=rng.random() < 0.8,
        max_input_bytes=MAX_INPUT_BYTES, max_input_lead=INPUT_LEAD,
        late_input_policy=rng.choice(("next", "drop")), missing_input_policy=policy,
        neutral_input="00ff" if policy == "neutral" else "", player_timeout=2.0,
        reconnect_grace=rng.choice((0.5, 4.0)), empty_timeout=3.0, spectator_delay=SPECTATOR_DELAY,
        catchup_frames=12, checksum_window=40, input_delay_window=10, input_delay_interval=1.0)
    server = dataclasses.replace(base.server, tick_rate=rng.choice(TICK_RATES), join_timeout=2.0,
                                 max_peers=MAX_PEERS, max_pending_messages=16)
    keys = f"{KEY_ID}:{base64.b64encode(KEY).decode()}" if mode == "token" else ""
    return RelayConfig(server=server, rooms=rooms, replay=dataclasses.replace(base.replay, enabled=False),
                       agones=base.agones,
                       security=dataclasses.replace(base.security, mode=mode, keys=keys)).validate()


class Quiet:
    """Stands in for the server's logger: a run logs thousands of joins and leaves, and the
    JSON summary owns stdout."""

    def _ignore(self, *args, **kwargs) -> None:
        pass

    debug = info = warning = error = exception = _ignore


class SimulatedLoop:
    """What the admin calls (kick, start_room) read of the server's event loop: its clock."""

    def __init__(self, clock):
        self.time = clock


class Violations:
    """Broken invariants, counted by kind; the first few described."""

    def __init__(self, keep: int = 20):
        self.by_kind: collections.Counter = collections.Counter()
        self.samples: list[str] = []
        self.keep = keep

    def __call__(self, kind: str, detail: str) -> None:
        self.by_kind[kind] += 1
        if len(self.samples) < self.keep:
            self.samples.append(f"{kind}: {detail}")

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


# -- what the server closed and queued ------------------------------------------------------

class RoomRecord:
    """A room's closed frames, copied from its history as they appear (invariant 2), and the
    accepted inputs waiting for their frame to close (invariant 7)."""

    def __init__(self, room, violations: Violations):
        self.room = room
        self.violations = violations
        self.frames: list[bytes] = []
        self.decoder = protocol.FrameDecoder()
        self.expected: dict[int, list] = {}     # frame -> [(slot, payload, peer id, Member)]
        self.inputs_verified = 0
        self.inputs_unverifiable = 0

    def sync(self) -> None:
        """Take the frames the room has closed since the last call (from its history: what
        late joiners and repairs are sent, read back from the spool once spilled)."""
        history = self.room.history
        closed = len(history)
        if closed > len(self.frames):
            for number, data in enumerate(history[len(self.frames):closed], len(self.frames)):
                self.frames.append(data)
                self._closed(number, data)

    def _closed(self, number: int, data: bytes) -> None:
        try:
            frame = self.decoder.decode(data)
        except ProtocolError as error:
            self.violations("frame_undecodable", f"room {self.room.room_id} frame {number}: {error}")
            self.decoder = protocol.FrameDecoder(number + 1)
            frame = None
        for slot, payload, peer_id, member in self.expected.pop(number, ()):
            if self.room.members.get(peer_id) is not member:
                self.inputs_unverifiable += 1       # it left: inputs ahead may have been dropped
            elif frame is None or slot >= len(frame.inputs) or frame.inputs[slot] != payload:
                got = frame.inputs[slot] if frame is not None and slot < len(frame.inputs) else None
                self.violations("accepted_input_missing",
                                f"room {self.room.room_id} frame {number} slot {slot}: accepted "
                                f"{payload.hex()}, frame has {got.hex() if got is not None else None}")
            else:
                self.inputs_verified += 1

    def reported(self, number: int, data: bytes) -> None:
        """The server's "frame" event for frame ``number``."""
        self.sync()
        if not 0 <= number < len(self.frames) or self.frames[number] != data:
            self.violations("frame_event_differs", f"room {self.room.room_id}: frame {number} reported "
                                                   f"with {len(self.frames)} frames in the history")

    def expect_input(self, number: int, slot: int, payload: bytes, peer_id: int, member) -> None:
        self.sync()
        if number < len(self.frames):
            self.violations("input_for_closed_frame", f"room {self.room.room_id}: input taken for "
                                                      f"frame {number}, already closed")
            return
        self.expected.setdefault(number, []).append((slot, payload, peer_id, member))


def check_room(room, record: RoomRecord, violations: Violations) -> None:
    """Invariant 2: the history holds exactly the closed frames."""
    record.sync()
    if len(room.history) != room.open_frame or len(record.frames) != room.open_frame:
        violations("history_length", f"room {room.room_id}: open frame {room.open_frame}, "
                                     f"history {len(room.history)}, seen {len(record.frames)}")


class Membership:
    """One connection's stay in one room, from the WELCOME the server queued for it: the frames
    the server queued for it (invariant 3) and what its client made of them (invariant 5), merged
    by frame number as docs/RELAY_PROTOCOL.md section 9.3 says."""

    def __init__(self, record: RoomRecord, peer_id: int, member, welcome: protocol.Welcome,
                 violations: Violations):
        self.record = record
        self.room = record.room
        self.peer_id = peer_id
        self.member = member
        self.spectator = welcome.spectator
        self.slot = welcome.slot
        self.next_frame = welcome.next_frame
        self.violations = violations
        self.where = f"room {self.room.room_id} peer {peer_id}{' (spectator)' if self.spectator else ''}"
        self.last_live_queued = -1
        self.final_frames: Optional[int] = None
        """Set when the room ended with nothing owed to this member: it must get them all."""
        # The client's side.
        self.next = 0                           # the next frame the game needs
        self.buffer: dict[int, bytes] = {}      # frames received ahead of it
        self.last_live_received = -1

    def active(self) -> bool:
        """Still a member of a room that has not ended (the server's view)."""
        return self.room.state != ENDED and self.room.members.get(self.peer_id) is self.member

    def owes_nothing(self) -> bool:
        """The server has no repair or block outstanding for this member."""
        return self.member.missing_from is None and not self.member.catching_up

    def released(self) -> int:
        """Frames this member may hold by now (RELAY_PROTOCOL sections 9 and 11)."""
        self.record.sync()
        closed = len(self.record.frames)
        return max(0, closed - self.room.settings.spectator_delay) if self.spectator else closed

    # the server's side (invariant 3)

    def _matches_record(self, number: int, data: bytes, what: str) -> None:
        self.record.sync()
        if not 0 <= number < len(self.record.frames) or self.record.frames[number] != data:
            self.violations("frame_differs", f"{self.where}: {what} {number} is not the room's frame "
                                             f"{number} ({len(self.record.frames)} closed)")

    def queued_live(self, data: bytes) -> None:
        try:
            number = protocol.frame_number(data)
        except ProtocolError as error:
            self.violations("stream_not_a_frame", f"{self.where}: {error}")
            return
        self._matches_record(number, data, "live frame")
        if self.room.members.get(self.peer_id) is not self.member:
            self.violations("frame_to_non_member", f"{self.where}: live frame {number}")
        if number <= self.last_live_queued:
            self.violations("live_frame_order", f"{self.where}: live frame {number} after {self.last_live_queued}")
        if number < self.next_frame:
            self.violations("live_frame_before_welcome", f"{self.where}: live frame {number}, "
                                                         f"WELCOME said {self.next_frame}")
        if not self.spectator and number != len(self.record.frames) - 1:
            self.violations("live_frame_not_newest", f"{self.where}: live frame {number} with "
                                                     f"{len(self.record.frames)} closed")
        self.last_live_queued = number

    def queued_block(self, data: bytes) -> None:
        try:
            first, frames = protocol.decode_history(data)
        except ProtocolError as error:
            self.violations("block_undecodable", f"{self.where}: {error}")
            return
        for number, frame in enumerate(frames, first):
            self._matches_record(number, frame, "block frame")
        if self.room.members.get(self.peer_id) is not self.member:
            self.violations("block_to_non_member", f"{self.where}: block {first}+{len(frames)}")
        if first + len(frames) > self.released():
            self.violations("block_beyond_released", f"{self.where}: frames {first}..{first + len(frames) - 1}, "
                                                     f"{self.released()} released")

    # the client's side (invariant 5)

    def received_live(self, data: bytes) -> None:
        number = protocol.frame_number(data)
        if number <= self.last_live_received:
            self.violations("live_frame_repeated", f"{self.where}: received live frame {number} "
                                                   f"after {self.last_live_received}")
        self.last_live_received = number
        self._hold(number, data)

    def received_block(self, data: bytes) -> None:
        first, frames = protocol.decode_history(data)
        for number, frame in enumerate(frames, first):
            self._hold(number, frame)

    def _hold(self, number: int, data: bytes) -> None:
        if number < self.next or number in self.buffer:
            return                      # a block repeats frames the client has: discarded
        self.buffer[number] = data
        while self.next in self.buffer:
            del self.buffer[self.next]
            self.next += 1

    def check_no_gap(self) -> None:
        """Called when the client has everything the server queued for it and is owed nothing."""
        if self.buffer:
            self.violations("frame_gap", f"{self.where}: holds frames {sorted(self.buffer)[:5]}... "
                                         f"but not {self.next}")
        if self.next < self.next_frame:
            self.violations("history_missing", f"{self.where}: holds {self.next} frames, WELCOME "
                                               f"promised {self.next_frame}")

    def room_ended(self) -> None:
        """ROOM_STATE "ended" queued for it: what it lacks then but is not owed a repair for is
        on its way (RELAY_PROTOCOL section 11: a spectator gets the frames its delay held
        back). A frame it was owed (missing_from) is not repaired once the room is gone."""
        if self.room.members.get(self.peer_id) is self.member and self.member.missing_from is None:
            self.record.sync()
            self.final_frames = len(self.record.frames)

    def check_complete(self, target: int) -> None:
        if self.next < target:
            self.violations("frames_never_arrived", f"{self.where}: holds {self.next} frames, "
                                                    f"should hold {target} by now")


class EndpointTap:
    """The server's relay_core Endpoint, watched: every call goes through unchanged, and what
    the core accepts to send (a message queued, a block enqueued) is reported to the harness,
    so each frame a client receives can be traced to the membership it was queued for."""

    def __init__(self, endpoint: Endpoint, on_queued):
        self._endpoint = endpoint
        self._on_queued = on_queued
        self.queue_full = 0                 # sends refused by a full queue (repairs follow)

    def __getattr__(self, name):
        return getattr(self._endpoint, name)

    def send(self, peer_id, channel, payload):
        queued = self._endpoint.send(peer_id, channel, payload)
        if queued:
            self._on_queued(peer_id, channel, payload, False)
        elif self._endpoint.is_connected(peer_id):
            self.queue_full += 1
        return queued

    def send_many(self, peer_ids, channel, payload, now=-1.0):
        peer_ids = list(peer_ids)
        # Peers gone or closing are skipped silently; refused ones (a full queue) are returned.
        connected = [peer_id for peer_id in peer_ids if self._endpoint.is_connected(peer_id)]
        refused = self._endpoint.send_many(peer_ids, channel, payload, now)
        self.queue_full += len(refused)
        for peer_id in connected:
            if peer_id not in refused:
                self._on_queued(peer_id, channel, payload, False)
        return refused

    def send_block(self, peer_id, data):
        queued = self._endpoint.send_block(peer_id, data)
        if queued:
            self._on_queued(peer_id, STREAM, data, True)
        elif self._endpoint.is_connected(peer_id):
            self.queue_full += 1
        return queued


# -- the clients ------------------------------------------------------------------------------

class Connection:
    """One client connection (a relay_core Endpoint in client mode at its own address), what the
    server queued for it and has not arrived yet, and what it sent on STREAM that the server has
    not resolved yet."""

    def __init__(self, index: int, now: float, rng: random.Random, mode: str, unix_offset: float):
        self.address = (f"10.1.{index // 200}.{index % 200 + 1}", 20000 + index % 40000)
        self.room = rng.choices(ROOM_NAMES, ROOM_WEIGHTS)[0]
        self.player = rng.choice(PLAYER_NAMES if mode == "open" else PLAYER_NAMES[:-1])
        self.endpoint = Endpoint(client_config(seed=rng.getrandbits(32), peer_timeout=8.0), unix_offset)
        token = None
        if mode == "token":
            key, ttl, minted = KEY, 3600.0, unix_offset + now
            roll = rng.random()
            if roll < 0.03:
                key = bytes(32)                 # a key the relay does not have
            elif roll < 0.06:
                minted -= 7200.0                # expired an hour ago
            token = mint_token(key, KEY_ID, self.room, self.player, ttl, now=minted,
                               random_bytes=rng.randbytes)
        self.peer = self.endpoint.connect(SERVER_ADDRESS, now, token)
        self.stream_queued: collections.deque = collections.deque()    # (bytes, Membership)
        self.blocks_queued: collections.deque = collections.deque()
        self.sent_stream: collections.deque = collections.deque()      # bytes, awaiting resolution
        self.server_peer: Optional[int] = None
        self.uplink_down_until = 0.0            # its datagrams to the server are lost
        self.downlink_down_until = 0.0          # the server's datagrams to it are lost
        self.next_input_frame = 0

    def uplink_down(self, now: float) -> bool:
        return now < self.uplink_down_until

    def downlink_down(self, now: float) -> bool:
        return now < self.downlink_down_until

    def drained(self) -> bool:
        return not self.stream_queued and not self.blocks_queued


# -- the harness ------------------------------------------------------------------------------

class RelayFuzz:
    """One run: a fresh RelayServer, its clients, and the invariants (module docstring)."""

    def __init__(self, seed: int, mode: str, violations: Optional[Violations] = None,
                 steps: int = STEPS_PER_RUN):
        self.rng = random.Random(seed)
        self.mode = mode
        self.steps = steps
        self.violations = violations if violations is not None else Violations()
        self.stats: collections.Counter = collections.Counter()
        self.config = fuzz_config(mode, self.rng)
        self.server = server = RelayServer(self.config)
        server.log = Quiet()
        server.limit_log = LimitLog(Quiet())
        server.lobby.report_frames = True       # replays are off, but every frame is checked
        server.endpoint = server.lobby.endpoint = EndpointTap(server.endpoint, self._queued)
        server.loop = SimulatedLoop(lambda: self.now)
        self.unix_offset = server.endpoint.unix_offset
        self.now = 1.0
        self.tick = 1.0 / self.config.server.tick_rate
        self.next_tick = self.now + self.tick
        self.next_second = self.now + 1.0
        self.connections: dict[tuple, Connection] = {}
        self.current: dict[tuple, Membership] = {}      # address -> latest WELCOMEd membership
        self.records: dict[int, RoomRecord] = {}        # id(room) -> its record (holds the room)
        self.next_index = 0
        self.group: Optional[list] = None               # resolutions during one delivery
        self.general_outcomes: collections.Counter = collections.Counter()
        self.in_message: Optional[list] = None          # resolutions inside one _on_message
        self._observe()

    # observing the server

    def _observe(self) -> None:
        server = self.server
        lobby = server.lobby
        report, on_message = server._observe_event, lobby._on_message
        refuse_input, drop, remove = lobby._refuse_input, lobby._drop, lobby._remove

        def observed_report(room, event):
            if event.kind == "frame":
                self.record_for(room).reported(event.detail["frame"], event.detail["data"])
            report(room, event)

        def observed_on_message(peer_id, channel, payload, now):
            if channel != STREAM:
                self.in_message = []            # a CONTROL message's drops are not resolutions
                try:
                    return on_message(peer_id, channel, payload, now)
                finally:
                    self.in_message = None
            before = dict(lobby.input_outcomes)     # read through the property: up to date
            self.in_message = inner = []
            try:
                on_message(peer_id, channel, payload, now)
            finally:
                self.in_message = None
            for outcome, count in lobby.input_outcomes.items():
                for _ in range(count - before.get(outcome, 0)):
                    inner.append((peer_id, outcome))
                    self.general_outcomes[outcome] += 1
            self._resolved(inner)

        def observed_remove(room):
            # The history of a removed room is closed before the server sees its last events.
            if id(room) in self.records:
                self.records[id(room)].sync()
            remove(room)

        def observed_refuse_input(peer_id, reason):
            self._note(peer_id, "refused:" + reason)
            refuse_input(peer_id, reason)

        def observed_drop(peer_id, reason, detail, notice_code=None):
            self._note(peer_id, "dropped:" + reason)
            drop(peer_id, reason, detail, notice_code)

        server._observe_event = observed_report
        lobby._on_message = observed_on_message
        lobby._refuse_input = observed_refuse_input
        lobby._drop = observed_drop
        lobby._remove = observed_remove

    def _note(self, peer_id: int, resolution: str) -> None:
        if self.in_message is not None:
            self.in_message.append((peer_id, resolution))
        elif resolution == "dropped:unexpected_block":
            self.stats["unexpected_blocks"] += 1
        else:
            self._resolved([(peer_id, resolution)])     # the compiled path's refusals

    def _resolved(self, resolutions: list) -> None:
        if self.group is None:
            if resolutions:
                self.violations("resolution_outside_delivery", f"{resolutions} with no datagram in")
            return
        self.group.extend(resolutions)

    def record_for(self, room) -> RoomRecord:
        record = self.records.get(id(room))
        if record is None:
            record = self.records[id(room)] = RoomRecord(room, self.violations)
            self.stats["rooms_created"] += 1
        return record

    def _queued(self, peer_id: int, channel: int, data: bytes, block: bool) -> None:
        """The core took a message or block for ``peer_id``: check it (invariant 3) and expect
        it at that connection's client (invariant 4)."""
        address = self.server.endpoint.peer_address(peer_id)
        conn = self.connections.get(address)
        if channel == CONTROL:
            self._queued_control(peer_id, address, data)
            return
        membership = self.current.get(address)
        if membership is None or membership.peer_id != peer_id:
            self.violations("stream_outside_room", f"peer {peer_id} was sent {'a block' if block else 'a frame'} "
                                                   f"before any WELCOME")
            return
        if block:
            membership.queued_block(data)
            self.stats["blocks_queued"] += 1
        else:
            membership.queued_live(data)
        if conn is not None:
            (conn.blocks_queued if block else conn.stream_queued).append((data, membership))

    def _queued_control(self, peer_id: int, address, data: bytes) -> None:
        try:
            message = protocol.decode_relay_message(data)
        except ProtocolError as error:
            self.violations("control_undecodable", f"peer {peer_id}: {error}: {data[:40].hex()}")
            return
        if not isinstance(message, protocol.Welcome):
            membership = self.current.get(address)
            if message[0] == protocol.ROOM_STATE and message[1] == "ended" and membership is not None:
                membership.room_ended()
            name = {protocol.REFUSED: "refused", protocol.NOTICE: "notice", protocol.ROOM_STATE: "room_state",
                    protocol.DESYNC: "desync", protocol.INPUT_DELAY: "input_delay"}.get(message[0], "other")
            self.stats[f"{name}:{message[1]}" if name in ("refused", "notice", "room_state") else name] += 1
            return
        self.stats["welcomes"] += 1
        room = self.server.rooms.get(message.room)
        member = room.members.get(peer_id) if room is not None else None
        if member is None:
            self.violations("welcome_without_member", f"peer {peer_id} welcomed to {message.room}")
            return
        record = self.record_for(room)
        membership = Membership(record, peer_id, member, message, self.violations)
        released = membership.released()
        if (member.spectator != message.spectator or member.slot != message.slot
                or not message.next_frame == message.history == released):
            self.violations("welcome_mismatch", f"{message} for {member}, {released} released")
        self.current[address] = membership

    # moving datagrams

    def server_peer(self, conn: Connection) -> Optional[int]:
        """The server's peer for this connection now, or None. A client whose handshake outlives
        its first server-side peer (the ACCEPT lost, the peer closed by join_timeout) gets a new
        one when a copy of its CONNECT_RESPONSE gets through: what the first had queued for it
        is gone with it."""
        endpoint = self.server.endpoint
        peer_ids = endpoint.peer_ids
        if conn.server_peer in peer_ids:
            return conn.server_peer
        found = next((peer_id for peer_id in peer_ids if endpoint.peer_address(peer_id) == conn.address), None)
        if found is not None:
            if conn.server_peer is not None:
                conn.stream_queued.clear()
                conn.blocks_queued.clear()
            conn.server_peer = found
        return found

    def deliver_to_server(self, conn: Connection, data: bytes) -> None:
        """One datagram in, then the events, as the server's read path does; every STREAM
        message resolved meanwhile is this client's (invariant 6)."""
        server = self.server
        before = dict(server.lobby.input_outcomes)  # read through the property: up to date
        membership = self.current.get(conn.address)
        peer_before = self.server_peer(conn)        # the datagram may end with it closed
        self.group, self.general_outcomes = [], collections.Counter()
        try:
            server.endpoint.receive(data, conn.address, self.now)
            # A room's players' DATA is held for the room's turn in the tick (Endpoint.bind_sink):
            # taken here, as if that turn came next, so that what it resolves is this datagram's.
            for room in list(server.rooms.values()):
                if room.group >= 0:
                    server.endpoint.run_group(room.group)
            server.on_datagrams(self.now)
        finally:
            group, self.group = self.group, None
        self.stats["datagrams_to_server"] += 1
        for outcome, count in server.lobby.input_outcomes.items():  # the compiled path's (no peer id)
            for _ in range(count - before.get(outcome, 0) - self.general_outcomes[outcome]):
                group.append((None, outcome))
        if group:
            peers = {peer_before, self.server_peer(conn)} - {None}
            self.attribute(conn, group, membership, peers)

    def attribute(self, conn: Connection, group: list, membership: Optional[Membership], peers: set) -> None:
        for peer_id, resolution in group:
            self.stats[f"input:{resolution}"] += 1
            if peer_id is not None and peer_id not in peers:
                self.violations("resolution_wrong_peer", f"{resolution} for peer {peer_id}, "
                                                         f"datagram from peer {sorted(peers)}")
        if len(group) > len(conn.sent_stream):
            self.violations("stream_resolved_twice", f"{len(group)} resolutions, {len(conn.sent_stream)} "
                                                     f"messages outstanding: {group}")
            conn.sent_stream.clear()
            return
        messages = [conn.sent_stream.popleft() for _ in group]
        if len(group) == 1:
            self.verify(messages[0], group[0][1], membership, self.current.get(conn.address))
        else:
            self.stats["resolutions_unattributed"] += len(group)

    def verify(self, message: bytes, resolution: str, before: Optional[Membership],
               after: Optional[Membership]) -> None:
        """Invariants 6 and 7 for one STREAM message and the one resolution it got."""
        def wrong(why):
            self.violations("resolution_mismatch", f"{why}: {resolution} for {message[:60].hex()}")

        try:
            decoded = protocol.decode_client_message(message)
        except ProtocolError:
            if resolution != "dropped:malformed_message":
                wrong("relay.protocol cannot decode it")
            return
        if resolution == "dropped:malformed_message":
            wrong("relay.protocol decodes it")
            return
        if not isinstance(decoded, Input):
            if resolution != "dropped:wrong_channel":
                wrong("a control message on STREAM")
            return
        if resolution.startswith("dropped:"):
            wrong("an INPUT on STREAM")
            return
        too_large = len(decoded.payload) > MAX_INPUT_BYTES
        if (resolution == "refused:too_large") != too_large and resolution not in (
                "refused:not_a_player", "refused:not_running"):
            wrong(f"payload of {len(decoded.payload)} bytes")
        # Frame checks only when the sender was the same player member from before the datagram
        # to after it (a JOIN or LEAVE in the same datagram changes what was right).
        if before is None or before is not after or not before.active() or before.spectator:
            return
        if resolution == "refused:not_a_player":
            wrong("the sender is a player in the room")
            return
        open_frame = before.room.open_frame
        if resolution == "accepted":
            if not open_frame <= decoded.frame <= open_frame + INPUT_LEAD:
                wrong(f"frame {decoded.frame} with frame {open_frame} open")
            else:
                before.record.expect_input(decoded.frame, before.slot, decoded.payload, before.peer_id, before.member)
        elif resolution == "late":
            if decoded.frame >= open_frame or before.room.drop_late_inputs:
                wrong(f"frame {decoded.frame} with frame {open_frame} open")
            else:
                before.record.expect_input(open_frame, before.slot, decoded.payload, before.peer_id, before.member)
        elif resolution == "duplicate" and not open_frame <= decoded.frame <= open_frame + INPUT_LEAD:
            wrong(f"frame {decoded.frame} with frame {open_frame} open")
        elif resolution == "refused:late_dropped" and decoded.frame >= open_frame:
            wrong(f"frame {decoded.frame} with frame {open_frame} open")
        elif resolution == "refused:too_far_ahead" and decoded.frame <= open_frame + INPUT_LEAD:
            wrong(f"frame {decoded.frame} with frame {open_frame} open")

    def flush_server(self) -> None:
        """What the server's driver does on a flush: events, datagrams out, events again; the
        datagrams reach their clients (unless the link is down)."""
        server = self.server
        server.on_datagrams(self.now)
        out = server.endpoint.datagrams_to_send(self.now)
        server.on_datagrams(self.now)
        touched = {}
        for data, address in out:
            self.stats["datagrams_to_clients"] += 1
            conn = self.connections.get(address)
            if conn is not None and not conn.downlink_down(self.now):
                conn.endpoint.receive(data, SERVER_ADDRESS, self.now)
                touched[address] = conn
        for conn in touched.values():
            self.client_events(conn)

    def pump_client(self, conn: Connection) -> None:
        out = conn.endpoint.datagrams_to_send(self.now)
        self.client_events(conn)
        for data, to in out:
            if to != SERVER_ADDRESS:
                self.violations("client_sent_elsewhere", f"{conn.address} -> {to}")
            elif not conn.uplink_down(self.now):
                self.deliver_to_server(conn, data)

    def client_events(self, conn: Connection) -> None:
        """Invariant 4: each message and block arrives as the server queued it, in order."""
        while (event := conn.endpoint.next_event()) is not None:
            kind = type(event)
            if kind is MessageReceived:
                if event.channel != STREAM:
                    self.stats["control_received"] += 1
                    continue
                if not conn.stream_queued:
                    self.violations("stream_not_queued", f"{conn.address} received {event.payload[:20].hex()}")
                    continue
                data, membership = conn.stream_queued.popleft()
                if data != event.payload:
                    self.violations("stream_not_as_queued", f"{conn.address}: got {event.payload[:20].hex()}, "
                                                            f"queued {data[:20].hex()}")
                    continue
                self.stats["frames_received"] += 1
                membership.received_live(data)
            elif kind is BlockReceived:
                if not conn.blocks_queued:
                    self.violations("block_not_queued", f"{conn.address} received a block")
                    continue
                data, membership = conn.blocks_queued.popleft()
                if data != event.data:
                    self.violations("block_not_as_queued", f"{conn.address}: a different block")
                    continue
                self.stats["blocks_received"] += 1
                membership.received_block(data)
            elif kind is PeerConnected:
                self.stats["connected"] += 1
            elif kind is PeerDisconnected:
                self.stats[f"client_disconnected:{event.reason.split(':')[0]}"] += 1
                self.connections.pop(conn.address, None)

    # time

    def advance(self, dt: float) -> None:
        self.now += dt
        for conn in list(self.connections.values()):
            self.pump_client(conn)
        self.flush_server()
        while self.now >= self.next_tick:      # as relay.server.scheduler fires them
            behind = self.now - self.next_tick
            if behind > MAX_CATCH_UP_TICKS * self.tick:     # a stall: re-anchored, not caught up
                self.next_tick += int(behind / self.tick) * self.tick
            self.server.tick(self.now)
            self.stats["ticks"] += 1
            self.next_tick += self.tick
            self.flush_server()
        if self.now >= self.next_second:        # the server's stats loop
            self.server.every_second(self.now)
            self.next_second = self.now + 1.0
            self.flush_server()

    # what clients do

    def connect(self) -> None:
        if len(self.connections) >= MAX_CLIENTS:
            return
        conn = Connection(self.next_index, self.now, self.rng, self.mode, self.unix_offset)
        self.next_index += 1
        self.connections[conn.address] = conn
        self.stats["connections"] += 1

    def room_of(self, conn: Connection):
        membership = self.current.get(conn.address)
        if membership is not None and membership.active():
            return membership.room, membership
        return self.server.rooms.get(conn.room), None

    def input_message(self, conn: Connection) -> bytes:
        return self.input_fields(conn).encode()

    def input_fields(self, conn: Connection) -> Input:
        rng = self.rng
        room, membership = self.room_of(conn)
        open_frame = room.open_frame if room is not None else 0
        roll = rng.random()
        if roll < 0.7:                  # a client playing with an input delay of one or more
            frame = max(conn.next_input_frame, open_frame + 1)
            conn.next_input_frame = frame + 1
        elif roll < 0.95:
            frame = max(0, open_frame + rng.randint(-4, INPUT_LEAD + 3))
        else:
            frame = rng.choice((0, 2**32 - 1, rng.randrange(2**32)))
        holds = membership.next - 1 if membership is not None else -1
        have = rng.choices((holds, -1, open_frame - 1, max(-1, open_frame - 30), rng.randrange(2**32), 2**32 - 1),
                           (10, 1, 2, 1, 1, 1))[0]
        size = rng.choices(INPUT_SIZES, INPUT_SIZE_WEIGHTS)[0]
        return Input(frame, rng.randbytes(size), have)

    def noncanonical_input(self, conn: Connection) -> bytes:
        """A valid INPUT in longer msgpack forms than the shortest: relay.protocol reads it, the
        compiled reader leaves most of them to it."""
        rng = self.rng
        message = self.input_fields(conn)
        frame, payload, have = message.frame, message.payload, message.have
        parts = [rng.choice((b"\x94", b"\xdc\x00\x04", b"\xdd\x00\x00\x00\x04")),
                 rng.choice((b"\x05", b"\xcc\x05", b"\xd0\x05", b"\xcd\x00\x05")),
                 rng.choice((b"\xce" + frame.to_bytes(4, "big"), b"\xcf" + frame.to_bytes(8, "big"),
                             b"\xd3" + frame.to_bytes(8, "big", signed=True))),
                 rng.choice((b"\xc5" + len(payload).to_bytes(2, "big"), b"\xc6" + len(payload).to_bytes(4, "big"))),
                 payload]
        if have < 0:
            parts.append(rng.choice((b"\xd0\xff", b"\xd1\xff\xff", b"\xd3" + b"\xff" * 8)))
        else:
            parts.append(rng.choice((b"\xce" + have.to_bytes(4, "big"), b"\xcf" + have.to_bytes(8, "big"))))
        return b"".join(parts)

    def join_message(self, conn: Connection) -> bytes:
        rng = self.rng
        keep = 0.85 if self.mode == "token" else 0.6     # the token names one room and player
        room = conn.room if rng.random() < keep else rng.choices(ROOM_NAMES, ROOM_WEIGHTS)[0]
        player = conn.player if rng.random() < keep else rng.choice(PLAYER_NAMES)
        spectator = rng.random() < 0.2
        if not spectator and rng.random() < 0.2:
            return protocol.pack(protocol.JOIN, room, player)       # the flag may be left out
        return protocol.Join(room, player, spectator).encode()

    def checksum_message(self, conn: Connection) -> bytes:
        rng = self.rng
        room, _ = self.room_of(conn)
        open_frame = room.open_frame if room is not None else 0
        frame = max(0, open_frame - rng.randint(1, 6)) if rng.random() < 0.9 else rng.randrange(2**32)
        return protocol.Checksum(frame, rng.choice((1, 1, 2, 3, 2**64 - 1, -2**63))).encode()

    def valid_message(self, conn: Connection) -> tuple[str, bytes, int]:
        # Mostly what a client would send next: a JOIN when in no room, inputs when in one.
        _, membership = self.room_of(conn)
        weights = (60, 3, 5, 12, 3) if membership is not None else (20, 65, 5, 5, 5)
        kind = self.rng.choices(("input", "join", "ready", "checksum", "leave"), weights)[0]
        if kind == "input":
            return kind, self.input_message(conn), STREAM
        if kind == "join":
            return kind, self.join_message(conn), CONTROL
        if kind == "checksum":
            return kind, self.checksum_message(conn), CONTROL
        return kind, protocol.pack(protocol.READY if kind == "ready" else protocol.LEAVE), CONTROL

    def hostile_message(self, conn: Connection) -> bytes:
        """A message array with fields of the wrong type or range, missing or extra."""
        rng = self.rng
        kind, data, _ = self.valid_message(conn)
        fields = msgpack.unpackb(data, raw=False)
        for _ in range(rng.randint(1, 2)):
            roll = rng.random()
            if roll < 0.7:
                fields[rng.randrange(len(fields))] = rng.choice(HOSTILE_VALUES)
            elif roll < 0.85 and len(fields) > 1:
                del fields[rng.randrange(1, len(fields))]
            else:
                fields.append(rng.choice(HOSTILE_VALUES))
        return msgpack.packb(fields, use_bin_type=rng.random() < 0.9)

    def mutate(self, data: bytes) -> bytes:
        rng = self.rng
        data = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(5)
            if op == 0 and data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            elif op == 1 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == 2:
                del data[rng.randrange(len(data) + 1):]
            elif op == 3:
                data += rng.randbytes(rng.randint(1, 16))
            else:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        return bytes(data)

    def send_message(self, conn: Connection) -> None:
        rng = self.rng
        how = rng.choices(("valid", "mutated", "hostile", "noncanonical", "random"), (62, 14, 12, 6, 6))[0]
        if how == "valid":
            kind, data, channel = self.valid_message(conn)
            how = f"valid:{kind}"
        elif how == "mutated":
            _, data, channel = self.valid_message(conn)
            data = self.mutate(data)
        elif how == "hostile":
            data, channel = self.hostile_message(conn), rng.choice((CONTROL, STREAM))
        elif how == "noncanonical":
            data, channel = self.noncanonical_input(conn), STREAM
        else:
            roll = rng.random()
            if roll < 0.4:
                data = rng.choice(VECTOR_PAYLOADS)
            elif roll < 0.7:
                data = b"\x94\x05" + rng.randbytes(rng.randint(0, 12))     # looks like an INPUT
            else:
                data = rng.randbytes(rng.choice((0, 1, 2, 5, 20, 200)))
            channel = rng.choice((CONTROL, STREAM))
        if rng.random() < 0.08:
            channel = STREAM if channel == CONTROL else CONTROL
        if conn.endpoint.send(conn.peer, channel, data):
            self.stats["messages_sent"] += 1
            self.stats[f"sent:{how}"] += 1
            if channel == STREAM:
                conn.sent_stream.append(data)

    def admin(self) -> None:
        """The admin API's room calls (relay.server.http calls them on the loop): the one way a room
        ends with members in it."""
        rng = self.rng
        room_id = rng.choice(ROOM_NAMES)
        action = rng.choice(("end", "kick", "start"))
        try:
            if action == "end":
                self.server.end_room(room_id)
            elif action == "kick":
                self.server.kick(room_id, rng.choice(PLAYER_NAMES))
            else:
                self.server.start_room(room_id)
            self.stats[f"admin:{action}"] += 1
        except RelayError as error:         # no such room or player, not waiting
            self.stats[f"admin_refused:{error.code}"] += 1

    # a step, a run

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        conns = list(self.connections.values())
        # Rates per step (~150 steps a simulated second): a client lives for several seconds.
        if roll < 0.03 or not conns:
            self.connect()
        elif roll < 0.034:
            conn = rng.choice(conns)
            conn.endpoint.disconnect(conn.peer)
            self.stats["disconnects"] += 1
        elif roll < 0.0365:
            del self.connections[rng.choice(conns).address]       # gone without a word
            self.stats["vanished"] += 1
        elif roll < 0.0425:
            # Both ways, or one way: a client that hears nothing but is heard is not timed out,
            # and its frames fill the window (64) and then the queue (16): repairs follow.
            conn, until = rng.choice(conns), self.now + rng.uniform(0.1, 5.0)
            which = rng.choice(("both", "down", "down", "up"))
            if which != "up":
                conn.downlink_down_until = until
            if which != "down":
                conn.uplink_down_until = until
            self.stats["outages"] += 1
        elif roll < 0.0435:
            self.now += rng.uniform(1.5, 6.0)    # the whole world stalls: timeouts run out
            self.stats["freezes"] += 1
        elif roll < 0.045:
            self.admin()
        elif roll < 0.14:
            pass
        else:
            self.send_message(rng.choice(conns))
        self.advance(rng.uniform(0.001, 0.012))
        self.stats["steps"] += 1
        self.check()

    def check(self) -> None:
        """The invariants that hold between any two steps (2 and 5)."""
        for room in self.server.rooms.values():
            check_room(room, self.record_for(room), self.violations)
        for conn in self.connections.values():
            membership = self.current.get(conn.address)
            if membership is None or not conn.drained():
                continue
            if membership.active() and membership.owes_nothing():
                membership.check_no_gap()
                self.stats["no_gap_checks"] += 1
            elif membership.final_frames is not None:
                membership.check_complete(membership.final_frames)
                membership.final_frames = None          # once is enough
                self.stats["ended_room_checks"] += 1

    def settle(self) -> None:
        """Links back, no more messages, at most SETTLE_SECONDS: every member must come to hold
        every frame released to it when the settle began (invariant 5), and every STREAM message
        of a connection both ends still hold must be resolved (invariant 6)."""
        for conn in self.connections.values():
            conn.uplink_down_until = conn.downlink_down_until = 0.0
        targets = []
        for conn in self.connections.values():
            membership = self.current.get(conn.address)
            if membership is not None and membership.active():
                targets.append((conn, membership, membership.released()))

        def both_ends_connected(conn):
            peer = self.server_peer(conn)
            return (conn.address in self.connections and conn.endpoint.is_connected(conn.peer)
                    and peer is not None and self.server.endpoint.is_connected(peer))

        def done():
            return (all(m.next >= target or not m.active() or conn.address not in self.connections
                        for conn, m, target in targets)
                    and not any(conn.sent_stream and both_ends_connected(conn)
                                for conn in self.connections.values()))

        end = self.now + SETTLE_SECONDS
        while self.now < end and not done():
            self.advance(self.tick / 2)
            self.check()
        for conn, membership, target in targets:
            if membership.active() and conn.address in self.connections:
                membership.check_complete(target)
                self.stats["settle_checks"] += 1
        for conn in self.connections.values():
            if conn.sent_stream and both_ends_connected(conn):
                self.violations("stream_message_unresolved", f"{conn.address}: {len(conn.sent_stream)} "
                                                             f"STREAM messages never resolved")

    def run(self, deadline: Optional[float] = None) -> None:
        """``steps`` steps (fewer if ``deadline``, time.monotonic(), passes) and the settle."""
        try:
            for _ in range(self.steps):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self.step()
            self.settle()
        except Exception:
            self.stats["exceptions"] += 1
            self.violations("exception", traceback.format_exc()[-3000:])
        finally:
            for room in self.server.rooms.values():
                room.history.close()        # its spool file

    def summary_counts(self) -> collections.Counter:
        counts = collections.Counter(self.stats)
        counts["sends_refused_queue_full"] = self.server.endpoint.queue_full
        counts["frames_closed"] = sum(len(record.frames) for record in self.records.values())
        counts["inputs_verified"] = sum(record.inputs_verified for record in self.records.values())
        counts["inputs_unverifiable"] = sum(record.inputs_unverifiable for record in self.records.values())
        return counts


def fuzz(seed: int = 1, runs: int = 0, seconds: float = 0.0, modes=MODES, steps: int = STEPS_PER_RUN) -> dict:
    """Runs of RelayFuzz (seeds seed*1000+i, modes in turn) until ``runs`` or ``seconds``; the
    summary."""
    started = time.monotonic()
    deadline = started + seconds if seconds else None
    violations = Violations()
    totals: collections.Counter = collections.Counter()
    done = 0
    last_run = None
    while (not runs or done < runs) and (deadline is None or time.monotonic() < deadline):
        last_run = {"seed": seed * 1000 + done, "mode": modes[done % len(modes)]}
        harness = RelayFuzz(last_run["seed"], last_run["mode"], violations, steps)
        harness.run(deadline)
        totals.update(harness.summary_counts())
        done += 1
        if violations.total:
            break                   # the first run with a violation is the one to reproduce
    elapsed = time.monotonic() - started
    from relay.server import inputs, room
    from relay_core import endpoint
    return {
        "runs": done, "steps": totals["steps"], "seconds": round(elapsed, 1),
        "steps_per_second": round(totals["steps"] / elapsed, 1) if elapsed else 0.0,
        "messages_sent": totals["messages_sent"],
        "sent": {k[5:]: v for k, v in sorted(totals.items()) if k.startswith("sent:")},
        "connections": totals["connections"], "welcomes": totals["welcomes"],
        "rooms_created": totals["rooms_created"], "ticks": totals["ticks"],
        "frames_closed": totals["frames_closed"], "frames_received": totals["frames_received"],
        "blocks_queued": totals["blocks_queued"], "blocks_received": totals["blocks_received"],
        "sends_refused_queue_full": totals["sends_refused_queue_full"],
        "inputs": {k[6:]: v for k, v in sorted(totals.items()) if k.startswith("input:")},
        "inputs_verified": totals["inputs_verified"], "inputs_unverifiable": totals["inputs_unverifiable"],
        "resolutions_unattributed": totals["resolutions_unattributed"],
        "refused": {k[8:]: v for k, v in sorted(totals.items()) if k.startswith("refused:")},
        "notices": {k[7:]: v for k, v in sorted(totals.items()) if k.startswith("notice:")},
        "desyncs": totals["desync"], "input_delay_advice": totals["input_delay"],
        "disconnects": totals["disconnects"], "vanished": totals["vanished"], "outages": totals["outages"],
        "freezes": totals["freezes"],
        "admin": {k[6:]: v for k, v in sorted(totals.items()) if k.startswith("admin:")},
        "no_gap_checks": totals["no_gap_checks"], "ended_room_checks": totals["ended_room_checks"],
        "settle_checks": totals["settle_checks"],
        "client_disconnected": {k[20:]: v for k, v in sorted(totals.items()) if k.startswith("client_disconnected:")},
        "datagrams": totals["datagrams_to_server"] + totals["datagrams_to_clients"],
        "exceptions": totals["exceptions"], "violations": violations.total,
        "last_run": last_run,       # the one to reproduce: RelayFuzz(seed, mode, steps=...).run()
        "violation_kinds": dict(violations.by_kind), "violation_samples": violations.samples,
        "modules": {"relay.server.inputs": inputs.__file__, "relay.server.room": room.__file__,
                    "relay_core.endpoint": endpoint.__file__},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long")
    parser.add_argument("--runs", type=int, default=0, help="stop after this many runs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS_PER_RUN, help="steps per run")
    parser.add_argument("--mode", choices=("open", "token", "both"), default="both")
    args = parser.parse_args(argv)
    if not args.seconds and not args.runs:
        parser.error("give --seconds or --runs")
    modes = MODES if args.mode == "both" else (args.mode,)
    summary = fuzz(args.seed, args.runs, args.seconds, modes, args.steps)
    print(json.dumps(summary), flush=True)
    return 1 if summary["violations"] or summary["exceptions"] else 0


if __name__ == "__main__":
    sys.exit(main())
