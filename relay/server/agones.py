"""Agones integration: tell the Agones SDK sidecar about this relay over its local REST gateway.

Under Agones every game-server pod runs a sidecar that serves the SDK as JSON over HTTP on
``localhost:$AGONES_SDK_HTTP_PORT`` (9358 unless Agones says otherwise). This module speaks to
it with aiohttp; the relay's game loop never waits on it:

* ``start()`` sends Ready (retried forever with a capped exponential backoff: a GameServer
  that never becomes Ready is useless) and starts a health task that posts Health every
  ``health_interval`` seconds. If nothing listens on the port (the relay runs outside Agones,
  or the sidecar starts after it) one warning is logged and everything keeps retrying in the
  background; ``start()`` returns after at most ``request_timeout``.
* ``room_state()``, ``set_counts()``, ``player_joined()``/``player_left()`` and
  ``set_player_capacity()`` are synchronous and only queue an update. One sender task delivers
  the queue once Ready went through. The queue holds one entry per key (a label, an annotation,
  a player id): a newer value replaces the queued one, a value equal to what the sidecar
  already has is not sent again, and past ``max_pending`` keys the least recently updated entry
  is dropped. A failed update is retried ``max_retries`` times with backoff, then logged and
  dropped; a failed Health ping is simply sent again at the next interval.
* ``shutdown()`` posts Shutdown (with retries); ``request_shutdown()`` does the same from
  synchronous code.

Rooms as Agones capacity (one GameServer hosts up to ``rooms.max_rooms`` rooms):

* The Counter ``agones.rooms_counter`` ("rooms") holds the room slots: the relay sets its capacity
  to ``rooms.max_rooms`` at start and its count to the rooms it holds. A GameServerAllocation
  takes a slot itself (Counter action Increment 1, atomic on Agones' side); the relay frees the
  slot (-1) when that room ends, and takes one (+1) only for a room no allocation counted (admin
  API without ``allocated``, a JOIN that auto-creates it). Counter updates go one at a time, in
  order, and the relay remembers which rooms it counted, so the count never drifts: a +1 Agones
  refuses (no slot left) is not undone later, and an allocation that turns out to be for a room
  the relay already counted gives its extra slot back.
* The relay watches its GameServer (GET /watch/gameserver, reconnecting with backoff). Each
  allocation sets the annotation ``relay.rooms/allocation`` to the room it is for (JSON, see
  ``parse_allocation``) through the allocation's ``metadata``; a new value makes the relay
  create that room (``on_allocation``). ``agones.dev/last-allocated`` is logged. Slots the
  Counter holds for rooms that never appear are given back after ``ALLOCATION_GRACE``.
* State: while any room is held (or an allocation is being created) the GameServer is kept
  Allocated (the relay calls Allocate when it is Ready, e.g. a room created through the admin
  API); a fleet scale-down or rolling update never deletes an Allocated GameServer. When it holds
  no room and the Counter is back to 0, ``agones.when_empty`` decides: ``ready`` calls Ready
  (reusable), ``shutdown`` calls Shutdown.
* ``drain()`` (SIGTERM, POST /admin/drain) sets the Counter's capacity to 0: no allocation can
  pick this relay any more while its matches finish.

What ends up on the GameServer (the sidecar prefixes every key with ``agones.dev/sdk-``):

* labels ``relay-rooms`` (rooms waiting or running, from ``room_state``), ``relay-rooms-running``
  and ``relay-players`` (from ``set_counts``); values are sanitized to valid label values;
* one annotation per room, ``relay-room-<room>`` = ``{"room": .., "state": .., "players": ..}``.
  Room names come from clients, so the key is sanitized (invalid characters replaced, a hash of
  the real name appended when anything was changed) and at most ``max_room_annotations``
  distinct rooms get one: the SDK cannot remove an annotation, and the sidecar writes all of
  them in one GameServer update, so a single invalid or oversized one would block every later
  label and annotation change.

Endpoints used: POST /ready, /health, /shutdown, /allocate {}; GET /gameserver,
/watch/gameserver (lines of {"result": GameServer}); PUT /metadata/label, /metadata/annotation
{"key", "value"}; PATCH /v1beta1/counters/{name} {"count"|"capacity"|"countDiff"} (int64 as
strings); POST /alpha/player/connect, /alpha/player/disconnect {"playerID"}; PUT
/alpha/player/capacity {"count"}. Field names and errors follow Agones' REST gateway (protobuf
names, every field emitted, errors as {"code", "message"} with HTTP 400 for invalid arguments
and 500 for the SDK server's own refusals).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import aiohttp

from relay.config import AgonesSettings
from relay.logs import get_logger

MIN_AGONES_VERSION = "1.41.0"
"""The oldest Agones the relay and deploy/kubernetes/agones/ work with: Counters (CountsAndLists)
became beta, on by default, in 1.41; the manifests use only fields its CRDs know."""
DEFAULT_PORT = 9358
PORT_ENV = "AGONES_SDK_HTTP_PORT"
SDK_PREFIX = "agones.dev/sdk-"
"""What the sidecar puts in front of every label and annotation key."""

LABEL_ROOMS = "relay-rooms"
LABEL_ROOMS_RUNNING = "relay-rooms-running"
LABEL_PLAYERS = "relay-players"
ROOM_ANNOTATION_PREFIX = "relay-room-"

MAX_LABEL_VALUE = 63
MAX_KEY_NAME = 63 - len(SDK_PREFIX.split("/", 1)[1])
"""A key's name part is at most 63 characters, and the sidecar adds "sdk-" to it."""
MAX_PENDING = 1024
MAX_ROOM_ANNOTATIONS = 128
LIVE_ROOM_STATES = ("waiting", "running")

ALLOCATION_ANNOTATION = "relay.rooms/allocation"
"""The GameServer annotation each allocation sets (its ``metadata``) to the room it is for, as
JSON (``parse_allocation``). One key, overwritten by every allocation: a key per room would grow
the GameServer past Kubernetes' 256 KiB of annotations within a few thousand matches."""
ALLOCATION_GRACE = 60.0
"""Seconds the Counter may hold more slots than the relay has rooms for (allocations that named
no room, or whose annotation the watch never showed and whose room nobody created through the
admin API) before the relay gives the extra slots back."""
LAST_ALLOCATED = "agones.dev/last-allocated"
"""Set by Agones on every allocation (an RFC 3339 time)."""
MAX_ENDED_ROOMS = 4096
"""Ended rooms remembered, for an allocation annotation that arrives after its room ended."""
COUNTER_PATH = "/v1beta1/counters/"
ROOM_SPEC_OPTIONS = {"capacity": int, "start_policy": str, "start_players": int}


def parse_allocation(value: str) -> dict:
    """The room an allocation is for (the annotation's value): a JSON object with ``room`` (its
    name, 1..64 characters, unique per match), optional ``players`` (player names) and room
    options ``capacity``, ``start_policy``, ``start_players``. Without ``capacity`` but with
    players, the room has one slot per player. ValueError names what is wrong."""
    spec = json.loads(value)
    if not isinstance(spec, dict):
        raise ValueError("the room spec must be a JSON object")
    room = spec.get("room")
    if not isinstance(room, str) or not 1 <= len(room) <= 64:
        raise ValueError("room must be a name of 1..64 characters")
    unknown = set(spec) - set(ROOM_SPEC_OPTIONS) - {"players", "room"}
    if unknown:
        raise ValueError(f"unknown room spec field {sorted(unknown)[0]!r}")
    players = spec.get("players", [])
    if not isinstance(players, list) or not all(isinstance(p, str) and p for p in players):
        raise ValueError("players must be a list of player names")
    options = {}
    for key, kind in ROOM_SPEC_OPTIONS.items():
        if key in spec:
            if not isinstance(spec[key], kind) or isinstance(spec[key], bool):
                raise ValueError(f"{key} must be {'an integer' if kind is int else 'a string'}")
            options[key] = spec[key]
    if players and "capacity" not in options:
        options["capacity"] = len(players)
    return {"room": room, "players": list(players), "options": options}

_INVALID_VALUE_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_VALID_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?)?$")


def sanitize_label_value(value: Any) -> str:
    """A valid Kubernetes label value made from ``value``: at most 63 characters of
    [A-Za-z0-9_.-], starting and ending alphanumeric; other characters become '-'. May be ''."""
    text = _INVALID_VALUE_CHARS.sub("-", str(value))
    text = _EDGE.sub("", text)[:MAX_LABEL_VALUE]
    return _EDGE.sub("", text)


def is_valid_label_value(value: str) -> bool:
    return len(value) <= MAX_LABEL_VALUE and _VALID_VALUE.match(value) is not None


def is_valid_key(key: str) -> bool:
    """True if ``agones.dev/sdk-<key>`` is a valid label/annotation key."""
    return 0 < len(key) <= MAX_KEY_NAME and _VALID_VALUE.match(key) is not None


def room_annotation_key(room: str) -> str:
    """``relay-room-<room>``, made a valid key: a room name that had to be changed (invalid
    characters, too long) gets an 8-hex-digit hash of the real name so two rooms never share
    a key by accident."""
    room = str(room)
    budget = MAX_KEY_NAME - len(ROOM_ANNOTATION_PREFIX)
    if _VALID_VALUE.match(room) and 0 < len(room) <= budget:
        return ROOM_ANNOTATION_PREFIX + room
    digest = hashlib.sha1(room.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    base = sanitize_label_value(room)[:budget - 9]
    base = _EDGE.sub("", base)
    return f"{ROOM_ANNOTATION_PREFIX}{base}-{digest}" if base else f"{ROOM_ANNOTATION_PREFIX}{digest}"


def resolve_port(settings: AgonesSettings, environ: Optional[Mapping[str, str]] = None) -> int:
    """The configured port, else $AGONES_SDK_HTTP_PORT, else 9358."""
    if settings.port:
        return int(settings.port)
    raw = (os.environ if environ is None else environ).get(PORT_ENV, "").strip()
    if raw:
        try:
            port = int(raw)
        except ValueError:
            port = -1
        if not 0 < port <= 65535:
            raise ValueError(f"{PORT_ENV}={raw!r}: not a TCP port number")
        return port
    return DEFAULT_PORT


@dataclass
class _Update:
    method: str
    path: str
    body: dict

    def same(self, other: Optional["_Update"]) -> bool:
        return (other is not None and self.method == other.method and self.path == other.path
                and self.body == other.body)


class AgonesClient:
    """The relay's side of the Agones SDK. Create it always; with ``enabled`` false every
    method is a no-op, so the server needs no conditionals."""

    def __init__(self, settings: AgonesSettings, log=None,
                 session_factory: Optional[Callable[[], aiohttp.ClientSession]] = None,
                 environ: Optional[Mapping[str, str]] = None):
        self.settings = settings
        self.log = log if log is not None else get_logger("relay.server.agones")
        self.enabled = bool(settings.enabled)
        self.player_tracking = bool(settings.player_tracking)
        self._session_factory = session_factory
        self.host = settings.host
        self.port = resolve_port(settings, environ) if self.enabled else (settings.port or DEFAULT_PORT)
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        self.base_url = f"http://{host}:{self.port}"
        self.max_pending = MAX_PENDING
        self.max_room_annotations = MAX_ROOM_ANNOTATIONS

        self._session: Optional[aiohttp.ClientSession] = None
        self._ready_task: Optional[asyncio.Task] = None
        self._health_task: Optional[asyncio.Task] = None
        self._sender_task: Optional[asyncio.Task] = None
        self._shutdown_task: Optional[asyncio.Task] = None
        self._ready_event = asyncio.Event()
        self._first_ready_attempt = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._pending: OrderedDict[tuple, _Update] = OrderedDict()
        self._delivered: dict[tuple, _Update] = {}
        self._inflight: Optional[tuple[tuple, _Update]] = None
        self._rooms: dict[str, str] = {}
        self._annotated: set[str] = set()
        self._match_ran = False
        self._started = False
        self._stopping: Optional[asyncio.Future] = None
        self._unreachable = False
        self._warned: set[str] = set()

        # Rooms as the Counter's count (see the module docstring).
        self.counter = str(settings.rooms_counter or "") if self.enabled else ""
        self.room_slots: Optional[int] = None
        """The Counter's capacity the relay publishes (rooms.max_rooms); None: left as is."""
        self.on_allocation: Optional[Callable[[str, dict], bool]] = None
        """Creates the room an allocation is for: (room, parse_allocation result) -> True if
        the room exists now. Set by the server."""
        self._origin: dict[str, str] = {}
        """Live room -> "allocation" (an allocation counted it) or "self" (the relay does)."""
        self._expected: set[str] = set()
        """Rooms the admin API said an allocation counted, before its annotation was seen."""
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._pending_allocations: set[str] = set()
        self._allocation_value: Optional[str] = None
        self._excess_since: Optional[float] = None
        self._seeded = False
        self._seed_done = False
        self._counted: dict[str, bool] = {}
        """Rooms the Counter holds a slot for, as the counter task learned from Agones' answers."""
        self._counter_ops: deque[tuple[str, str]] = deque()
        self._counter_wakeup = asyncio.Event()
        self._counter_busy = False
        self._counter_task: Optional[asyncio.Task] = None
        self._watch_task: Optional[asyncio.Task] = None
        self._state_task: Optional[asyncio.Task] = None
        self._draining = False
        self._ever_held = False
        self._watching = False
        self._state_target: Optional[str] = None
        self._state_target_until = 0.0
        self.state: Optional[str] = None
        """The GameServer's state as last seen on the watch (Ready, Allocated, ...)."""
        self.gameserver: Optional[dict] = None
        self.counter_seen: Optional[tuple[int, int]] = None
        """(count, capacity) of the rooms Counter as last seen on the watch."""
        self.last_allocated: Optional[str] = None
        self.allocations_seen = 0
        self.allocations_failed = 0
        self.counter_refused = 0
        self.counter_repaired = 0
        self.self_allocations = 0
        self.returned_ready = 0
        self.watch_events = 0

        self.requests_ok = 0
        self.requests_failed = 0
        self.last_error: Optional[str] = None
        self.ready_sent = False
        self.health_sent = 0
        self.shutdown_sent = False
        self.updates_sent = 0
        self.updates_failed = 0
        self.updates_dropped = 0
        self.annotations_skipped = 0

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Send Ready and start the health and sender tasks. Returns once the first Ready
        attempt finished (at most ``request_timeout``); never raises for a missing sidecar."""
        if not self.enabled or self._started or self._stopping is not None:
            return
        self._started = True
        self._ensure_session()
        loop = asyncio.get_running_loop()
        self._ready_task = loop.create_task(self._ready_loop(), name="agones-ready")
        self._health_task = loop.create_task(self._health_loop(), name="agones-health")
        self._sender_task = loop.create_task(self._sender_loop(), name="agones-sender")
        self._counter_task = loop.create_task(self._counter_loop(), name="agones-counter")
        self._watch_task = loop.create_task(self._watch_loop(), name="agones-watch")
        try:
            await asyncio.wait_for(self._first_ready_attempt.wait(), self.settings.request_timeout)
        except asyncio.TimeoutError:
            pass

    async def stop(self) -> None:
        """Cancel every task and close the HTTP session; safe to call more than once. A
        Shutdown request in flight gets up to ``request_timeout`` to finish first."""
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
            return
        self._stopping = asyncio.get_running_loop().create_future()
        try:
            if self._shutdown_task is not None and not self._shutdown_task.done():
                await asyncio.wait({self._shutdown_task}, timeout=self.settings.request_timeout)
            tasks = [task for task in (self._ready_task, self._health_task, self._sender_task,
                                       self._shutdown_task, self._counter_task, self._watch_task,
                                       self._state_task)
                     if task is not None and not task.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if self._session is not None:
                await self._session.close()
                self._session = None
            if self.enabled:
                self.log.info("agones_stopped", **self.stats())
        finally:
            self._stopping.set_result(None)

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self._session_factory is not None:
                self._session = self._session_factory()
            else:
                # trust_env=False: an HTTP(S)_PROXY in the pod must not capture localhost calls.
                self._session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout),
                    trust_env=False)
        return self._session

    # -- what the server reports (synchronous, never blocks) ---------------------------------

    def room_state(self, room: str, state: str, players: int) -> None:
        """A room was created, changed state or gained/lost players. Queues the room's
        annotation and the ``relay-rooms`` label, keeps the rooms Counter and the GameServer's
        state in step (see the module docstring)."""
        if not self.enabled:
            return
        room, state = str(room), str(state)
        if state in LIVE_ROOM_STATES:
            if room not in self._rooms:
                self._room_opened(room)
            self._rooms[room] = state
            if state == "running":
                self._match_ran = True
        elif room in self._rooms:
            del self._rooms[room]
            self._room_closed(room)
        if room in self._annotated or len(self._annotated) < self.max_room_annotations:
            self._annotated.add(room)
            key = room_annotation_key(room)
            value = json.dumps({"room": room, "state": state, "players": int(players)},
                               separators=(",", ":"), sort_keys=True)
            self._enqueue(("annotation", key), "PUT", "/metadata/annotation",
                          {"key": key, "value": value})
        else:
            self.annotations_skipped += 1
            self._warn_once("annotations", "agones_room_annotations_capped",
                            limit=self.max_room_annotations,
                            detail="further rooms get no relay-room-* annotation")
        self._set_label(LABEL_ROOMS, len(self._rooms))
        self._reconcile_state()

    def expect_allocation(self, room: str) -> None:
        """The admin API is creating ``room`` for an allocation that took its Counter slot
        (``"allocated": true``): the relay must not take another one for it."""
        if self.enabled:
            self._expected.add(str(room))

    def forget_expected(self, room: str) -> None:
        """The room ``expect_allocation`` announced could not be created."""
        self._expected.discard(str(room))

    def allocated_room(self, room: str) -> bool:
        """True if ``room`` is live and an allocation counted it."""
        return self._origin.get(str(room)) == "allocation"

    def set_room_slots(self, slots: int) -> None:
        """The rooms Counter's capacity (rooms.max_rooms); sent before Ready."""
        self.room_slots = max(0, int(slots))

    def drain(self) -> None:
        """No allocation may pick this relay any more: the Counter's capacity goes to 0 (which
        also zeroes its count: later room ends send nothing)."""
        if not self.enabled or self._draining:
            return
        self._draining = True
        if self.counter:
            self._counter_ops.clear()
            self._counter_ops.append(("capacity", "0"))
            self._counter_wakeup.set()

    # -- the rooms Counter ------------------------------------------------------------------

    def _room_opened(self, room: str) -> None:
        self._ever_held = True
        self._ended.pop(room, None)
        if room in self._pending_allocations or room in self._expected:
            self._pending_allocations.discard(room)
            self._expected.discard(room)
            self._origin[room] = "allocation"
            self._counter_op("held", room)
        else:
            self._origin[room] = "self"
            self._counter_op("take", room)

    def _room_closed(self, room: str) -> None:
        origin = self._origin.pop(room, "self")
        self._ended[room] = origin
        while len(self._ended) > MAX_ENDED_ROOMS:
            self._ended.popitem(last=False)
        self._counter_op("free", room)

    def _allocation_seen(self, room: str, spec: dict) -> None:
        """A new relay.rooms/allocation value: an allocation took a slot for ``room``."""
        self.allocations_seen += 1
        self._ever_held = True
        if room in self._rooms:
            # Created before its annotation arrived (admin API, a JOIN): if the relay counted it
            # itself, the allocation's slot is one too many.
            if self._origin.get(room) == "self":
                self._origin[room] = "allocation"
                self._counter_op("adopt", room)
            return
        if room in self._ended:
            if self._ended.pop(room) == "self":
                self._counter_op("give_back", room)     # ended before its allocation showed up
            return
        self._pending_allocations.add(room)
        created = False
        if self.on_allocation is not None and not self._draining:
            try:
                created = bool(self.on_allocation(room, spec))
            except Exception as error:      # a bad spec must not stop the watch
                self.log.warning("agones_allocation_failed", room=room, error=repr(error))
        if room in self._pending_allocations:       # not created: its slot goes back
            self._pending_allocations.discard(room)
            if not created:
                self.allocations_failed += 1
                self._counter_op("give_back", room)

    def _counter_op(self, op: str, room: str) -> None:
        if not self.counter or self._draining or self._stopping is not None or not self._seed_done:
            return      # before the seed, the count it sets covers this room
        self._counter_ops.append((op, room))
        self._counter_wakeup.set()

    async def _counter_loop(self) -> None:
        await self._ready_event.wait()
        while True:
            if not self._counter_ops:
                self._counter_busy = False
                self._counter_wakeup.clear()
                self._reconcile_state()
                await self._counter_wakeup.wait()
                continue
            self._counter_busy = True
            op, room = self._counter_ops.popleft()
            if op == "held":
                self._counted[room] = True
            elif op == "take":
                self._counted[room] = await self._update_counter({"countDiff": "1"}, op, room)
            elif op == "free":
                if self._counted.pop(room, False):
                    await self._update_counter({"countDiff": "-1"}, op, room)
            elif op == "adopt":
                if self._counted.get(room):
                    await self._update_counter({"countDiff": "-1"}, op, room)
                self._counted[room] = True
            elif op == "give_back":
                await self._update_counter({"countDiff": "-1"}, op, room)
            elif op == "repair":        # ``room`` holds the number of slots
                await self._update_counter({"countDiff": str(-int(room))}, op, "")
            elif op == "capacity":
                self._counted.clear()
                await self._update_counter({"capacity": room}, op, "")

    async def _update_counter(self, body: dict, op: str, room: str) -> bool:
        """PATCH the rooms Counter; True once Agones applied it. A refusal (out of range) is
        final; other failures are retried like any update."""
        path = COUNTER_PATH + self.counter
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt - 1))
            ok, retry, text = await self._request("PATCH", path, body)
            if ok:
                self.updates_sent += 1
                return True
            lowered = text.lower()
            if "not found" in lowered or "not enabled" in lowered:
                self._counter_ops.clear()
                self.counter = ""
                self._warn_once("counter", "agones_counter_unavailable", error=text[:200],
                                detail="the Fleet's template has no such Counter, or the "
                                       "CountsAndLists feature gate is off; rooms are not "
                                       "published as Agones capacity")
                return False
            if "out of range" in lowered:
                self.counter_refused += 1
                self.log.warning("agones_counter_refused", op=op, room=room, body=body,
                                 error=text[:200])
                return False
            if not retry:
                break
        self.updates_failed += 1
        self.log.warning("agones_counter_update_dropped", op=op, room=room, body=body,
                         error=self.last_error)
        return False

    def _check_excess_slots(self, now: float) -> None:
        """More slots taken than rooms the relay counts, for ALLOCATION_GRACE: give them back."""
        if (not self.counter or self._draining or not self._watching or self.counter_seen is None
                or self._counter_busy or self._counter_ops or self._pending_allocations):
            return
        expected = sum(1 for room in self._rooms if self._counted.get(room))
        excess = self.counter_seen[0] - expected
        if excess <= 0:
            self._excess_since = None
            return
        if self._excess_since is None:
            self._excess_since = now
            return
        if now - self._excess_since < ALLOCATION_GRACE:
            return
        self._excess_since = None
        self.counter_repaired += excess
        self.log.warning("agones_counter_repaired", slots=excess, count=self.counter_seen[0],
                         rooms=expected, detail="slots taken by allocations whose room never "
                         "appeared; given back")
        self._counter_ops.append(("repair", str(excess)))
        self._counter_wakeup.set()

    # -- the GameServer: watch and state ----------------------------------------------------

    def held(self) -> int:
        """Rooms held: live ones plus allocations whose room is being created."""
        return len(self._rooms) + len(self._pending_allocations)

    def _reconcile_state(self) -> None:
        """Allocated while a room is held; back to Ready (or Shutdown) when none is."""
        if (not self.enabled or self._draining or self.shutdown_sent
                or self._stopping is not None or not self.ready_sent):
            return
        if self._state_task is not None and not self._state_task.done():
            return
        if self._state_target is not None:
            if self.state != self._state_target and self._now() < self._state_target_until:
                return          # asked for already; the watch has not shown it yet
            self._state_target = None
        held = self.held()
        if held and self.state == "Ready":
            self.self_allocations += 1
            self._state_call("/allocate", "allocate", "Allocated")
            return
        if held or not self._ever_held or self._counter_busy or self._counter_ops:
            return
        if self.counter and self.counter_seen is not None and self.counter_seen[0] > 0:
            return      # an allocation whose annotation is on its way, or our -1 not seen yet
        if self.settings.when_empty == "shutdown":
            # Without a watch (the state unknown): once a match ran.
            if self.state == "Allocated" or (not self._watching and self._match_ran):
                self.log.info("agones_empty", detail="no room left; requesting shutdown")
                self.request_shutdown()
            return
        if self.state == "Allocated":
            self.returned_ready += 1
            self.log.info("agones_empty", detail="no room left; back to Ready")
            self._state_call("/ready", "ready_again", "Ready")

    def _state_call(self, path: str, what: str, target: str) -> None:
        async def call() -> None:
            if await self._send_with_retries("POST", path, {}, what):
                # Watch events already on their way still show the old state: no second call
                # until the watch shows this one (or a while passed).
                self._state_target = target
                self._state_target_until = self._now() + 5 * self.settings.request_timeout
        self._state_task = asyncio.get_running_loop().create_task(call(), name=f"agones-{what}")

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _on_gameserver(self, gameserver: dict) -> None:
        self.gameserver = gameserver
        self.watch_events += 1
        meta = gameserver.get("object_meta") or {}
        status = gameserver.get("status") or {}
        state = status.get("state") or None
        if state != self.state:
            self.log.info("agones_state", state=state, was=self.state)
            self.state = state
        counter = (status.get("counters") or {}).get(self.counter) if self.counter else None
        if isinstance(counter, dict):
            try:
                self.counter_seen = (int(counter.get("count", 0)), int(counter.get("capacity", 0)))
            except (TypeError, ValueError):
                self.counter_seen = None
        annotations = meta.get("annotations") or {}
        last = annotations.get(LAST_ALLOCATED)
        if last and last != self.last_allocated:
            if self.last_allocated is not None or self._seeded:
                self.log.info("agones_allocated", at=last, state=state)
            self.last_allocated = last
        value = annotations.get(ALLOCATION_ANNOTATION)
        fresh = value is not None and value != self._allocation_value
        self._allocation_value = value
        if not self._seeded:
            # What is there before the relay ever was Ready belongs to an earlier process.
            self._seeded = True
            fresh = False
        if fresh:
            assert value is not None
            try:
                spec = parse_allocation(value)
            except ValueError as error:
                self.allocations_failed += 1
                self.log.warning("agones_allocation_unreadable", value=value[:200],
                                 error=str(error), detail=f"{ALLOCATION_ANNOTATION} must be "
                                 "JSON with the room; the slot goes back after a grace period")
            else:
                self._allocation_seen(spec["room"], spec)
        self._reconcile_state()

    async def _seed(self) -> None:
        """Before Ready: learn the GameServer as it is (old allocations are not ours), set the
        Counter's capacity and its count to the rooms the relay holds already (a count left by
        an earlier process in this pod included). Until this succeeded room changes queue no
        Counter update: the count set here covers them."""
        ok, _retry, text = await self._request("GET", "/gameserver", None)
        if not ok:
            return
        try:
            gameserver = json.loads(text)
        except ValueError:
            gameserver = None
        if isinstance(gameserver, dict):
            self._on_gameserver(gameserver)
        if self.counter:
            if self.room_slots is not None:
                await self._update_counter({"capacity": str(self.room_slots)}, "capacity", "")
            held = len(self._rooms)
            if self.counter and self.counter_seen is not None and self.counter_seen[0] != held:
                if self.counter_seen[0] > held:
                    self.log.warning("agones_counter_reset", count=self.counter_seen[0],
                                     rooms=held, detail="a count left by an earlier process")
                await self._update_counter({"count": str(held)}, "reset", "")
            self._counted = {room: True for room in self._rooms}
        self._seed_done = True

    async def _watch_loop(self) -> None:
        """GET /watch/gameserver: one {"result": GameServer} JSON line per change, for as long
        as the sidecar runs; reconnects with backoff."""
        session = self._ensure_session()
        url = self.base_url + "/watch/gameserver"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.request_timeout)
        await self._first_ready_attempt.wait()      # after the seed (old allocations skipped)
        attempt = 0
        while True:
            try:
                # read_bufsize: one line is a whole GameServer (labels, annotations).
                async with session.get(url, timeout=timeout, read_bufsize=2**20) as response:
                    if response.status != 200:
                        self._failed(f"GET /watch/gameserver: HTTP {response.status}")
                    else:
                        async for line in response.content:
                            if not line.strip():
                                continue
                            try:
                                message = json.loads(line)
                            except ValueError:
                                self._failed("GET /watch/gameserver: a line that is not JSON")
                                continue
                            result = message.get("result") if isinstance(message, dict) else None
                            if isinstance(result, dict):
                                attempt = 0
                                self._watching = True
                                self._on_gameserver(result)
                            elif isinstance(message, dict) and "error" in message:
                                self._failed(f"GET /watch/gameserver: {message['error']}")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as error:
                self._failed(f"GET /watch/gameserver: {type(error).__name__}: {error}")
            self._watching = False
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    def set_counts(self, rooms_running: int, players: int) -> None:
        """Labels ``relay-rooms-running`` and ``relay-players`` (sent only when they change)."""
        if not self.enabled:
            return
        self._set_label(LABEL_ROOMS_RUNNING, int(rooms_running))
        self._set_label(LABEL_PLAYERS, int(players))

    def player_joined(self, player_id: str) -> None:
        """PlayerConnect (alpha), if ``player_tracking``. Player ids are GameServer-wide: pass
        something unique across rooms, e.g. ``f"{room}/{player}"``."""
        if self.enabled and self.player_tracking:
            self._enqueue(("player", str(player_id)), "POST", "/alpha/player/connect",
                          {"playerID": str(player_id)})

    def player_left(self, player_id: str) -> None:
        if self.enabled and self.player_tracking:
            self._enqueue(("player", str(player_id)), "POST", "/alpha/player/disconnect",
                          {"playerID": str(player_id)})

    def set_player_capacity(self, count: int) -> None:
        """PlayerCapacity (alpha), if ``player_tracking``. Agones refuses PlayerConnect beyond
        it, and it starts at the GameServer's ``players.initialCapacity`` (0 unless set)."""
        if self.enabled and self.player_tracking:
            self._enqueue(("capacity",), "PUT", "/alpha/player/capacity", {"count": int(count)})

    def set_label(self, key: str, value: Any) -> None:
        """Any other label; ``key`` must be a valid key name, the value is sanitized."""
        if not self.enabled:
            return
        if not is_valid_key(key):
            raise ValueError(f"label key {key!r}: 1..{MAX_KEY_NAME} of [A-Za-z0-9_.-], "
                             "starting and ending alphanumeric")
        self._set_label(key, value)

    def _set_label(self, key: str, value: Any) -> None:
        value = sanitize_label_value(value)
        self._enqueue(("label", key), "PUT", "/metadata/label", {"key": key, "value": value})

    def _enqueue(self, key: tuple, method: str, path: str, body: dict) -> None:
        if self._stopping is not None:
            return
        update = _Update(method, path, body)
        queued = self._pending.get(key)
        if queued is not None:
            if not update.same(queued):
                self._pending[key] = update
            self._pending.move_to_end(key)
            return
        # The value the sidecar will have for this key: the one being sent, else the last sent.
        current = (self._inflight[1] if self._inflight is not None and self._inflight[0] == key
                   else self._delivered.get(key))
        if update.same(current):
            return
        while len(self._pending) >= self.max_pending:
            dropped_key, _ = self._pending.popitem(last=False)
            self.updates_dropped += 1
            self._warn_once("queue_full", "agones_queue_full", limit=self.max_pending,
                            dropped=str(dropped_key),
                            detail="least recently updated entries are dropped")
        self._pending[key] = update
        self._wakeup.set()

    # -- requests the server awaits ---------------------------------------------------------

    async def shutdown(self) -> bool:
        """POST /shutdown (with retries); True once the sidecar accepted it. Concurrent calls
        share one request; after success it is not sent again."""
        task = self._shutdown_request()
        if task is None:
            return self.shutdown_sent
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                return False        # stop() cancelled the request, not our caller
            raise

    def request_shutdown(self) -> None:
        """``shutdown()`` from synchronous code (the game loop): runs in the background, and
        ``stop()`` gives it up to ``request_timeout`` to finish."""
        self._shutdown_request()

    def _shutdown_request(self) -> Optional[asyncio.Task]:
        if not self.enabled or self.shutdown_sent or self._stopping is not None:
            return None
        task = self._shutdown_task
        if task is None or task.done():
            task = self._shutdown_task = asyncio.get_running_loop().create_task(
                self._shutdown_once(), name="agones-shutdown")
        return task

    async def _shutdown_once(self) -> bool:
        ok = await self._send_with_retries("POST", "/shutdown", {}, "shutdown")
        if ok:
            self.shutdown_sent = True
        return ok

    async def allocate(self) -> bool:
        """POST /allocate (with retries): mark this GameServer Allocated, so a fleet scale-down
        will not delete it, when players reach it without a GameServerAllocation."""
        if not self.enabled or self._stopping is not None:
            return False
        return await self._send_with_retries("POST", "/allocate", {}, "allocate")

    async def get_gameserver(self) -> Optional[dict]:
        """GET /gameserver (one attempt): the GameServer as JSON, or None."""
        if not self.enabled or self._stopping is not None:
            return None
        ok, _retry, text = await self._request("GET", "/gameserver", None)
        if not ok:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    def stats(self) -> dict:
        return {
            "enabled": self.enabled, "url": self.base_url,
            "requests_ok": self.requests_ok, "requests_failed": self.requests_failed,
            "last_error": self.last_error, "ready_sent": self.ready_sent,
            "health_sent": self.health_sent, "shutdown_sent": self.shutdown_sent,
            "updates_sent": self.updates_sent, "updates_failed": self.updates_failed,
            "updates_dropped": self.updates_dropped, "pending": len(self._pending),
            "annotations_skipped": self.annotations_skipped,
            "sidecar_reachable": not self._unreachable,
            "state": self.state, "counter": self.counter or None,
            "counter_seen": list(self.counter_seen) if self.counter_seen else None,
            "rooms_held": self.held(), "allocations_seen": self.allocations_seen,
            "allocations_failed": self.allocations_failed,
            "counter_refused": self.counter_refused, "counter_repaired": self.counter_repaired,
            "self_allocations": self.self_allocations,
            "returned_ready": self.returned_ready, "watch_events": self.watch_events,
        }

    # -- background tasks -------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        settings = self.settings
        return min(settings.backoff_max, settings.backoff_initial * (2 ** min(attempt, 30)))

    async def _ready_loop(self) -> None:
        attempt = 0
        while True:
            if not self._seed_done:
                await self._seed()
            # Ready only once the GameServer was read: a sidecar that came up between a failed
            # read and a Ready would otherwise leave the Counter never seeded.
            ok = self._seed_done and (await self._request("POST", "/ready", {}))[0]
            self._first_ready_attempt.set()
            if ok:
                self.ready_sent = True
                self._ready_event.set()
                self.log.info("agones_ready", url=self.base_url, attempts=attempt + 1)
                return
            if attempt == 0 and not self._unreachable:
                self.log.warning("agones_ready_failed", url=self.base_url, error=self.last_error,
                                 detail="retrying in the background")
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    async def _health_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.health_interval
        due = loop.time()
        failing = False
        while True:
            ok, _retry, _text = await self._request("POST", "/health", {})
            if ok:
                self.health_sent += 1
                if failing:
                    self.log.info("agones_health_recovered")
                failing = False
            elif not failing:
                failing = True
                if not self._unreachable:
                    self.log.warning("agones_health_failed", error=self.last_error,
                                     detail="pinging again every interval")
            self._check_excess_slots(loop.time())
            due += interval
            now = loop.time()
            if due < now:       # a slow request or a stalled loop: no burst of catch-up pings
                due = now
            await asyncio.sleep(due - now)

    async def _sender_loop(self) -> None:
        await self._ready_event.wait()      # updates wait (coalescing) until the sidecar is up
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            key, update = self._pending.popitem(last=False)
            self._inflight = (key, update)
            try:
                await self._deliver(key, update)
            finally:
                self._inflight = None

    async def _deliver(self, key: tuple, update: _Update) -> None:
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt - 1))
                if key in self._pending:    # superseded while waiting: the newer value goes
                    return
            ok, retry, text = await self._request(update.method, update.path, update.body)
            if ok:
                self.updates_sent += 1
                if update.path == "/alpha/player/disconnect":
                    self._delivered.pop(key, None)      # forget players who left
                else:
                    self._delivered[key] = update
                return
            if update.path.startswith("/alpha/player/") and self._player_refusal(text, update):
                retry = False
            if not retry:
                break
        self.updates_failed += 1
        self._delivered.pop(key, None)
        self.log.warning("agones_update_dropped", method=update.method, path=update.path,
                         body=update.body, error=self.last_error,
                         attempts=attempt + 1)

    def _player_refusal(self, text: str, update: _Update) -> bool:
        """Errors from the player-tracking endpoints that no retry will fix."""
        lowered = text.lower()
        if "not enabled" in lowered:
            self.player_tracking = False
            for key in [k for k in self._pending if k[0] in ("player", "capacity")]:
                del self._pending[key]
            self._warn_once("player_tracking", "agones_player_tracking_unavailable",
                            error=text[:200], detail="the PlayerTracking feature gate is off; "
                            "player tracking disabled")
            return True
        if "capacity" in lowered:
            self._warn_once("player_capacity", "agones_player_capacity_reached", error=text[:200],
                            detail="set the GameServer's players.initialCapacity or call "
                            "set_player_capacity")
            return True
        return False

    async def _send_with_retries(self, method: str, path: str, body: dict, what: str) -> bool:
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self._backoff(attempt - 1))
            ok, retry, _text = await self._request(method, path, body)
            if ok:
                self.log.info(f"agones_{what}", url=self.base_url, attempts=attempt + 1)
                return True
            if not retry:
                break
        self.log.error(f"agones_{what}_failed", url=self.base_url, error=self.last_error,
                       attempts=attempt + 1)
        return False

    # -- HTTP -------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: Optional[dict]) -> tuple[bool, bool, str]:
        """One call. Returns (ok, worth retrying, response text); never raises but on cancel."""
        session = self._ensure_session()
        url = self.base_url + path
        try:
            async with session.request(
                    method, url, json=body,
                    timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout)) as response:
                text = await response.text()
                status = response.status
        except aiohttp.ClientConnectorError as error:
            self._failed(f"{method} {path}: {error.os_error or error}")
            if not self._unreachable:
                self._unreachable = True
                self.log.warning("agones_sidecar_unreachable", url=self.base_url,
                                 detail=f"agones sidecar not reachable at {self.base_url}; "
                                        "is the pod running under Agones? retrying")
            return False, True, ""
        except asyncio.TimeoutError:
            self._failed(f"{method} {path}: no answer within {self.settings.request_timeout}s")
            return False, True, ""
        except (aiohttp.ClientError, OSError, ValueError) as error:
            self._failed(f"{method} {path}: {type(error).__name__}: {error}")
            return False, True, ""
        if self._unreachable:
            self._unreachable = False
            self.log.info("agones_sidecar_reachable", url=self.base_url)
        if 200 <= status < 300:
            self.requests_ok += 1
            return True, False, text
        self._failed(f"{method} {path}: HTTP {status} {text.strip()[:200]}")
        return False, status >= 500 or status in (408, 429), text

    def _failed(self, error: str) -> None:
        self.requests_failed += 1
        self.last_error = error
        self.log.debug("agones_request_failed", error=error)

    def _warn_once(self, what: str, event: str, **fields) -> None:
        if what not in self._warned:
            self._warned.add(what)
            self.log.warning(event, **fields)
