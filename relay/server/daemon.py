"""The relay server: the asyncio (uvloop) shell around the lobby.

The server owns what the lobby must not: the UDP socket (through a transport driver), the HTTP
side, the clocks and timers, and everything that reports to the outside world. Datagrams
received in one loop iteration all go into the core before the lobby handles the core's events
(relay.server.lobby); a tick loop calls the lobby's tick at the configured rate. After each, the
server observes what the lobby reports -- logs, metrics, Agones, replays (relay.server.recording) --
and flushes what the core has to send.
"""
from __future__ import annotations

import asyncio
import gc
import math
import time
from typing import Any, Optional

import relay
from relay.server.agones import AgonesClient
from relay.config import RelayConfig, is_loopback
from relay.errors import ListenError, RelayError
from relay.server.lobby import LOBBY_EVENTS, Lobby
from relay.logs import LimitLog, get_logger
from relay.server.metrics import Metrics
from relay.server.recording import ReplayRecorder
from relay.server.room import RUNNING, WAITING, Room, RoomEvent
from relay.server.scheduler import TickScheduler
from relay.transport import (
    BATCHED_IO, BatchedEndpointDriver, EndpointDriver, open_batched_driver, open_driver,
    unfragmented,
)

def link_info(stats) -> dict:
    """A peer's link for the admin API: what a player's lag is made of."""
    return {"rtt_ms": round(stats.rtt * 1000.0, 1), "loss": round(stats.loss, 4),
            "mode": stats.redundancy_mode, "burst_length": round(stats.burst_length, 2),
            "min_rtt_ms": round(stats.min_rtt * 1000.0, 1),
            "queue_delay_ms": round(stats.queue_delay * 1000.0, 1), "copying": stats.copying,
            "resends": stats.resends, "spurious_resends": stats.spurious_resends,
            "redundant_bytes": stats.redundant_bytes, "bytes_sent": stats.bytes_sent}


READ_INTERVAL = 0.001
"""Seconds between reads of a busy UDP socket: one wake-up per millisecond under load instead of
one per few datagrams. An input waits at most this long (the tick reads first: no frame misses
an input that has arrived); the input-delay advice sees it that much later."""

READ_BATCHES = 2
"""recvmmsg calls (64 datagrams each) per read pass: a pass is then at most ~1 ms of work, so a
tick that falls due during one starts at most that late (the rest is read in the next pass).
Batches the endpoint refuses whole while reading (a flood) do not count: each recv may read on
through up to 32 of them, at ~0.5 us a datagram, so under a flood a pass takes ~2 ms more."""

RECEIVE_BUFFER = 4 * 2**20
"""SO_RCVBUF asked for (the kernel caps it at net.core.rmem_max): room for the inputs that wait
between reads, and for a burst."""

GC_THRESHOLD = 20_000
"""Allocations between young-generation collections while a server runs (default 700)."""

STATS_INTERVAL = 1.0
"""Seconds between stats passes (``every_second``: idle connections closed, metrics and the
replay disk budget brought up to date)."""

RTT_SAMPLES_PER_SYNC = 256
"""Peers' smoothed RTTs observed into relay_peer_rtt_seconds per stats pass (once a second);
with more peers than this they take turns."""

class RelayServer:
    def __init__(self, config: RelayConfig, metrics: Optional[Metrics] = None):
        config.check_serve()        # ConfigError: token mode without keys, public admin API without token
        self.config = config
        self.tick_rate = config.server.tick_rate
        self.metrics = metrics or Metrics()
        self.log = get_logger("relay.server")
        self.limit_log = LimitLog(self.log)
        self.security_mode = config.security_mode
        self.metrics.security_open_mode.set(1 if self.security_mode == "open" else 0)
        self.metrics.before_render(self._publish_counts)
        self.lobby = Lobby(config)
        self.endpoint = self.lobby.endpoint
        self.recorder = ReplayRecorder(config.replay, self.tick_rate, self.metrics, self.log,
                                       self.limit_log)
        self.agones = AgonesClient(config.agones)      # does nothing unless agones.enabled
        self.agones.set_room_slots(config.rooms.max_rooms)
        self.agones.on_allocation = self._create_allocated_room
        self.drain_deadline: Optional[float] = None
        self._drain_timer: Optional[asyncio.TimerHandle] = None
        self.drained = asyncio.Event()
        """Set once draining has begun and no room is left."""
        self.stopping = False
        self.started_at = time.time()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.driver: Optional[EndpointDriver | BatchedEndpointDriver] = None
        self.udp_address: Optional[tuple] = None
        self.http_port: Optional[int] = None
        self._http_runner: Any = None
        self._scheduler: Optional[TickScheduler] = None
        # When the next once-a-second pass is due (``every_second``, run by ``tick``): never
        # until ``start``, so a server driven by hand runs it only when called.
        self._stats_due = math.inf
        self._seen_drops: dict[str, int] = {}
        self._seen_refusals: dict[str, int] = {}
        self._traffic_seen = (0, 0, 0, 0)
        self._rtt_cursor = 0
        self.stopped = asyncio.Event()

    @property
    def rooms(self) -> dict[str, Room]:
        return self.lobby.rooms

    @property
    def draining(self) -> bool:
        return self.lobby.draining

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        from relay.server.http import fd_budget, raise_fd_limit, start_http

        self.loop = asyncio.get_running_loop()
        server = self.config.server
        # File descriptors: the soft limit up to the hard one; HTTP may use all but a reserve,
        # which must hold the replay files of the matches recorded at once (relay.server.http).
        before, soft = raise_fd_limit()
        limit, reserve = fd_budget()
        replays = self.config.rooms.max_rooms if self.config.replay.enabled else 0
        if replays + 32 > reserve:
            self.log.warning("fd_reserve_small", fd_limit=limit, reserve=reserve,
                             max_rooms=self.config.rooms.max_rooms,
                             detail="more matches than the reserve holds may go unrecorded; "
                                    "raise RLIMIT_NOFILE (LimitNOFILE, "
                                    "ulimit -n) to at least 4 x (rooms.max_rooms + 32)")
        # Batched syscalls (recvmmsg/sendmmsg) where the platform has them, read at most every
        # READ_INTERVAL (the tick reads what waits before closing frames). Datagrams and bytes
        # are counted by the driver and published with every tick.
        # A read pass flushes the core only when it has output due now; every tick flushes.
        address = (server.udp_host, server.udp_port)
        on_error = lambda exc: self.log.debug("udp_error", error=str(exc))  # noqa: E731
        driver: EndpointDriver | BatchedEndpointDriver
        try:
            if BATCHED_IO:
                driver = await open_batched_driver(
                    self.endpoint, address, self.on_datagrams, on_error=on_error,
                    read_interval=READ_INTERVAL, receive_buffer=RECEIVE_BUFFER,
                    max_batches=READ_BATCHES, defer_flush=True,
                    dont_fragment=unfragmented(server.mtu))
            else:
                driver = await open_driver(self.endpoint, address, self.on_datagrams, on_error=on_error)
        except OSError as error:
            raise ListenError("udp", server.udp_host, server.udp_port, error) from error
        self.driver = driver
        assert driver.transport is not None     # open: the socket is bound
        self.udp_address = driver.transport.get_extra_info("sockname")[:2]
        try:
            self._http_runner, self.http_port = await start_http(
                self, self.metrics, server.http_host, server.http_port,
                admin_token=self.config.security.load_admin_token(),
                require_auth=not is_loopback(server.http_host),
                max_connections=server.http_max_connections,
                header_timeout=server.http_header_timeout, body_timeout=server.http_body_timeout,
                limit_log=self.limit_log)
        except BaseException as error:
            # A half-started relay must not keep the UDP port (nor take datagrams nobody serves).
            driver.close()
            self.driver = None
            if isinstance(error, OSError):
                raise ListenError("http", server.http_host, server.http_port, error) from error
            raise
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
        self._scheduler = TickScheduler(self.tick_rate, self.tick, self.metrics)
        self._scheduler.start()
        self._stats_due = self.loop.time() + STATS_INTERVAL
        if self.config.agones.player_tracking:
            # Agones refuses every player connect until a capacity is set.
            rooms = self.config.rooms
            self.agones.set_player_capacity(min(server.max_peers, rooms.max_rooms * rooms.capacity))
        await self.agones.start()         # Ready: both sockets are bound, players may come
        self.log.info("started", udp=f"{self.udp_address[0]}:{self.udp_address[1]}",
                      http=f"{server.http_host}:{self.http_port}", tick_rate=self.tick_rate,
                      auto_create=self.config.rooms.auto_create, replays=self.config.replay.enabled,
                      security=self.security_mode, version=relay.__version__,
                      fd_limit=soft, fd_limit_was=before)

    async def stop(self, reason: str = "shutdown") -> None:
        """Stop taking work, end every room (clients are told why), flush replays, close."""
        if self.stopping:
            await self.stopped.wait()
            return
        self.stopping = True
        self.lobby.draining = True      # no joins or rooms while the tick loop stops
        self.metrics.set_draining(True)
        self.log.info("stopping", reason=reason, rooms=len(self.rooms), peers=self.endpoint.peer_count)
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._scheduler is not None:
            await self._scheduler.stop()
        self._stats_due = math.inf
        self.lobby.end_all(reason)
        self._settle()
        for peer_id in self.endpoint.peer_ids:
            self.endpoint.disconnect(peer_id, "shutdown")
        self._flush()
        self.recorder.close_all(reason)
        if self._http_runner is not None:
            from relay.server.http import stop_http

            await stop_http(self._http_runner)
        if self.driver is not None:
            self.driver.close()
        await self.agones.stop()
        self.log.info("stopped", reason=reason)
        self.stopped.set()

    # -- the loop's work --------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            raise RuntimeError("the server has not been started")
        return self.loop

    def _now(self) -> float:
        return self._running_loop().time()

    def on_datagrams(self, now: float) -> None:
        """The driver fed the core a batch of datagrams (it flushes after). With ``tick`` it is
        all the loop does, so a server without sockets can be driven by calling both."""
        self.lobby.handle_events(now)
        self._observe()

    def tick(self, now: float) -> None:
        read_now = getattr(self.driver, "read_now", None)
        if read_now is not None:
            read_now()              # inputs waiting in the socket make this tick's frames
        # The rooms' pass sends each batch of rooms' frames as they are flushed (send_ready).
        self.lobby.tick(now, getattr(self.driver, "send_ready", None))
        self._settle()
        if now >= self._stats_due:
            # Right after a tick's frames went out: the pass (~3 ms at 2 000 players, growing
            # with them) takes the gap before the next tick instead of making late whichever
            # tick fell due while it ran, as a timer of its own did.
            self._stats_due = now + STATS_INTERVAL
            self._stats_pass(now)

    def _settle(self) -> None:
        """Report what the lobby did, and send what the core has for the network now."""
        self._observe()
        self._flush()

    def _flush(self) -> None:
        if self.driver is not None:
            self.driver.flush()

    def _publish_counts(self) -> None:
        """Counts kept as plain integers on the hot paths, into their metrics: before every
        scrape and once a second (the stats pass), never per tick or packet."""
        metrics = self.metrics
        if self.agones.enabled:
            metrics.sync_agones(self.agones.stats())
        lobby = self.lobby
        if lobby.counts:
            metrics.add_counts(lobby.counts)
            lobby.counts.clear()
        outcomes = lobby.input_outcomes         # the input router's too, to its latest input: cleared, not replaced
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

    # -- what happened: logs, replays, Agones -----------------------------------------------

    def _observe(self) -> None:
        for room, event in self.lobby.take_reports():
            self._observe_event(room, event)

    def _observe_event(self, room: Optional[Room], event: RoomEvent) -> None:
        kind, detail = event.kind, event.detail
        if kind in LOBBY_EVENTS:
            self._observe_lobby_event(room, kind, detail)
            return
        assert room is not None         # a room's own event
        room_id = room.room_id
        if kind == "frame":
            self.recorder.frame(room_id, detail["frame"], detail["data"])
        elif kind == "checksum":
            self.recorder.checksum(room_id, detail["frame"], detail["slot"], detail["player"],
                                   detail["value"])
        elif kind == "input_delay":
            self.metrics.input_delay_advice.observe(detail["frames"])
            self.log.debug("input_delay_advised", room=room_id, **detail)
        elif kind == "desync":
            self.metrics.desyncs.inc()
            self.recorder.event(room_id, detail["frame"], "desync", detail)
            self.log.warning("desync", room=room_id, frame=detail["frame"],
                             checksums=detail["checksums"], minority=detail["minority"],
                             verdict=detail["verdict"])
        else:
            # The room's lifecycle and membership: joined, reconnected, left, started, ended...
            if kind == "started":
                self.recorder.open(room_id, [slot.player for slot in room.slots])
            elif kind == "ended":
                self.recorder.close(room_id, detail["reason"])
            elif kind == "reconnected":
                self.metrics.joins.labels(outcome="reconnected").inc()
            self._mirror_to_agones(room, event)
            self.log.info(kind, room=room_id, **detail)

    def _observe_lobby_event(self, room: Optional[Room], kind: str, detail: dict) -> None:
        room_id = room.room_id if room is not None else None
        if kind in ("peer_connected", "message_dropped"):
            self.log.debug(kind, **detail)
        elif kind in ("peer_disconnected", "peer_migrated"):
            self.log.info(kind, room=room_id, **detail)
        elif kind == "join_refused":
            if detail["repeated"]:
                self.limit_log("joins_refused_repeatedly", detail["reason"], peer=detail["peer"])
            else:
                self.log.info("join_refused", peer=detail["peer"], reason=detail["reason"],
                              detail=detail["detail"])
        elif kind == "send_refused":
            self.log.error("send_refused", room=room_id, **detail)
        elif kind == "send_queue_full":
            self.limit_log("limit_reached", "send_queue_full", room=room_id, **detail)
        elif kind == "connections_closed":
            self.limit_log("connections_closed", detail["reason"], count=detail["count"])
        elif kind == "room_created" and room_id is not None:
            self.agones.room_state(room_id, WAITING, 0)
            self.log.info("room_created", room=room_id, **detail)
        elif kind == "drained":
            self._drained()

    def _mirror_to_agones(self, room: Room, event: RoomEvent) -> None:
        """Room state and players into the GameServer (labels, annotations, player tracking);
        queued, never waits on the sidecar."""
        self.agones.room_state(room.room_id, room.state, room.players_connected)
        # Player ids are per GameServer, and players are named per room.
        if event.kind in ("joined", "reconnected"):
            self.agones.player_joined(f"{room.room_id}/{event.detail['player']}")
        elif event.kind in ("left", "timed_out"):
            self.agones.player_left(f"{room.room_id}/{event.detail['player']}")
        elif event.kind == "ended":
            for slot in room.slots:
                self.agones.player_left(f"{room.room_id}/{slot.player}")

    # -- once a second ----------------------------------------------------------------------

    def _stats_pass(self, now: float) -> None:
        try:
            self.every_second(now)
        except Exception as error:        # never let metrics kill the server or its tick
            # Once per interval and kind with a count: a lasting fault (EMFILE, a full disk)
            # must not write a line every second.
            self.limit_log("stats_failed", type(error).__name__, error=repr(error))

    def every_second(self, now: float) -> None:
        """Connections idle in no room closed, metrics and the replay disk budget brought up
        to date (the stats pass, which ``tick`` runs once a second after a tick's frames)."""
        self.lobby.close_roomless(now, self.config.server.join_timeout)
        self._settle()
        self._sync_stats()

    def _sync_stats(self) -> None:
        metrics = self.metrics
        metrics.peers.set(self.endpoint.peer_count)
        memory = self.endpoint.receive_memory
        metrics.receive_memory.labels("used").set(memory["used"])
        metrics.receive_memory.labels("limit").set(memory["limit"])
        counts = self.lobby.room_counts()
        metrics.set_rooms(counts)
        self.agones.set_counts(counts[RUNNING], self.lobby.players_connected())
        drops = self.endpoint.drops
        for reason in ("reassembly_full", "receive_memory_full", "rate_limited", "auth_failed"):
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
        self.recorder.check_disk()
        # Resends and redundant bytes over all peers, RTT and loss, in one pass in the core
        # (datagrams are counted at the socket). A PeerStats per peer every second cost a
        # tick's worth of time at a few thousand players.
        metrics.sync_totals(**self.endpoint.traffic_totals())
        for mode, count in self.endpoint.redundancy_counts().items():
            metrics.redundancy_peers.labels(mode=mode).set(count)
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

    # -- admin API (called by relay.server.http on the loop thread) ---------------------------------

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
        """The room, and for each connected player its link as the relay sees it."""
        room = self.lobby.get_room(room_id)
        info = room.info()
        for slot, player in zip(room.slots, info["players"]):
            if slot.peer_id is not None and self.endpoint.is_connected(slot.peer_id):
                player["link"] = link_info(self.endpoint.peer_stats(slot.peer_id))
        return info

    def create_room(self, room_id: str, allocated: bool = False, **options) -> dict:
        """A new waiting room. ``allocated``: a GameServerAllocation already took this room's
        slot in the Agones rooms Counter; if the relay already created the room from that
        allocation's annotation, the room is returned as it is."""
        if allocated and self.agones.enabled:
            room = self.rooms.get(room_id)
            if room is not None and self.agones.allocated_room(room_id):
                return room.info()
            self.agones.expect_allocation(room_id)
        try:
            room = self.lobby.create_room(room_id, options, self._now())
        except BaseException:
            self.agones.forget_expected(room_id)
            raise
        self._settle()
        return room.info()

    def _create_allocated_room(self, room_id: str, spec: dict) -> bool:
        """Agones allocated a room slot for ``room_id`` (the watch saw its annotation)."""
        if room_id in self.rooms:
            return True
        try:
            self.lobby.create_room(room_id, spec["options"], self._now())
        except RelayError as error:
            self.log.warning("allocated_room_refused", room=room_id, code=error.code,
                             error=str(error))
            return False
        self._settle()
        self.log.info("room_allocated", room=room_id, players=spec["players"])
        return True

    def start_room(self, room_id: str) -> dict:
        room = self.lobby.start_room(room_id, self._now())
        self._settle()
        return room.info()

    def end_room(self, room_id: str, reason: str = "admin") -> dict:
        room = self.lobby.end_room(room_id, reason)
        self._settle()
        return room.info()

    def kick(self, room_id: str, player: str) -> dict:
        room = self.lobby.kick(room_id, player, self._now())
        self._settle()
        return room.info()

    def drain(self) -> dict:
        """Stop taking rooms and players at once (readiness goes false); running matches may
        finish until drain_timeout, then they end with reason drain_deadline."""
        if not self.draining:
            self.agones.drain()         # no allocation picks this relay any more
            self.metrics.set_draining(True)
            timeout = self.config.server.drain_timeout
            self.drain_deadline = time.time() + timeout
            self._drain_timer = self._running_loop().call_later(timeout, self._drain_deadline_passed)
            self.lobby.begin_drain()
            self._settle()
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
        self.lobby.end_all("drain_deadline")
        self._settle()
        self._drained()

    async def drain_and_stop(self) -> None:
        """SIGTERM: drain, wait for the matches to finish (bounded by drain_timeout), stop."""
        self.drain()
        await self.drained.wait()
        await self.stop("shutdown")
