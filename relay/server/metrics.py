"""Every Prometheus metric the relay exports, defined in one place.

Each server instance owns one ``Metrics`` and with it a private ``CollectorRegistry`` (plus the
process collector), so several servers — and tests — can run in one process without their
numbers mixing. The server updates the metrics through the attributes (``metrics.ticks.inc()``,
``metrics.inputs.labels(outcome="late").inc()``) and mirrors the core's cumulative counters with
``sync_drops``/``sync_totals``/``sync_peers`` about once a second; ``render()`` produces the
``/metrics`` response.

Mirroring cumulative totals: the core reports absolute numbers (``Endpoint.drops``, the per-peer
``PeerStats``). ``add_counter_delta`` remembers the last total seen per *key* and adds only the
difference to the counter, so the counter never goes down. A total smaller than the last one
means its source started again from zero (a new Endpoint), and the whole new total is counted —
the same rule Prometheus applies to counter resets. So a total must come from one source that
only ever grows: never pass a sum over peers (it shrinks when a peer leaves); give each peer its
own ``source`` (``sync_peers`` does) and ``forget`` it once it is gone.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector,
    ProcessCollector, generate_latest,
)

from relay_core.wire import DROP_REASONS

ROOM_STATES = ("waiting", "running", "ended")
INPUT_OUTCOMES = ("accepted", "late", "duplicate", "refused")
INPUT_REFUSAL_REASONS = ("too_large", "too_far_ahead", "not_running", "not_a_player",
                         "late_dropped")
APP_DROP_REASONS = ("malformed_message", "wrong_channel", "unexpected_block", "too_large",
                    "send_queue_full")
"""Drops the relay itself counts (a datagram the core delivered but the app protocol rejects,
or a message the core would not queue: send_queue_full is a peer's queue at
server.max_pending_messages)."""
DROP_REASON_LABELS = tuple(DROP_REASONS) + APP_DROP_REASONS
BLOCK_OUTCOMES = ("started", "delivered")
JOIN_OUTCOMES = ("joined", "reconnected", "spectator", "refused")
JOIN_REFUSAL_REASONS = ("room_full", "spectators_full", "too_many_rooms", "unknown_room",
                        "draining", "running", "room_ended", "slot_expired", "already_joined",
                        "wrong_room", "wrong_player", "join_timeout", "source_room_limit")
"""The usual refusal reasons, created at zero; any other reason gets its series when it happens."""
HANDSHAKE_REFUSAL_REASONS = ("server_full", "token_invalid", "token_expired", "token_used",
                             "token_required", "token_unsupported", "source_session_limit")
ADMIN_AUTH_FAILURES = ("missing", "malformed", "wrong")
REPLAY_DISK_ACTIONS = ("deleted", "stopped", "not_recorded")
AGONES_STATES = ("Scheduled", "RequestReady", "Ready", "Reserved", "Allocated", "Unhealthy",
                 "Shutdown")
"""GameServer states as Agones names them (the ones a running relay's pod can be in); another
state gets its series when it is seen."""
AGONES_ALLOCATIONS = ("allocator", "self")

TICK_LATENESS_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
RTT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0)

# (attribute, type, exported name, help, label names, label values to create up front, extra kwargs)
# Series with known label values are created at zero so that rate() and absent() work from the
# first scrape instead of the series appearing at its first event.
_SPECS: tuple[tuple[str, type, str, str, tuple[str, ...], tuple[str, ...], dict], ...] = (
    ("peers", Gauge, "relay_peers", "Connected peers (players and spectators).", (), (), {}),
    ("rooms", Gauge, "relay_rooms", "Rooms by state.", ("state",), ROOM_STATES, {}),
    ("ticks", Counter, "relay_ticks_total", "Ticks of the frame loop.", (), (), {}),
    ("tick_lateness", Histogram, "relay_tick_lateness_seconds",
     "How late each tick started after its scheduled time.", (), (),
     {"buckets": TICK_LATENESS_BUCKETS}),
    ("frames_broadcast", Counter, "relay_frames_broadcast_total",
     "Frames sent, one per frame per recipient.", (), (), {}),
    ("frames_closed", Counter, "relay_frames_closed_total",
     "Frames closed, one per room per tick.", (), (), {}),
    ("inputs", Counter, "relay_inputs_total", "Inputs received from players, by outcome.",
     ("outcome",), INPUT_OUTCOMES, {}),
    ("inputs_refused", Counter, "relay_inputs_refused_total", "Inputs refused, by reason.",
     ("reason",), INPUT_REFUSAL_REASONS, {}),
    ("datagrams_received", Counter, "relay_datagrams_received_total",
     "UDP datagrams received from peers.", (), (), {}),
    ("datagrams_sent", Counter, "relay_datagrams_sent_total", "UDP datagrams sent to peers.",
     (), (), {}),
    ("bytes_received", Counter, "relay_received_bytes_total", "UDP payload bytes received.",
     (), (), {}),
    ("bytes_sent", Counter, "relay_sent_bytes_total", "UDP payload bytes sent.", (), (), {}),
    ("resends", Counter, "relay_resends_total",
     "Reliable messages resent after their retransmission timeout.", (), (), {}),
    ("redundant_bytes", Counter, "relay_redundant_bytes_total",
     "Bytes of piggybacked copies of already-sent messages.", (), (), {}),
    ("spurious_resends", Counter, "relay_spurious_resends_total",
     "Resends that were not needed: the message (or its ack) was only late; a lower bound.",
     (), (), {}),
    ("redundancy_peers", Gauge, "relay_peers_redundancy",
     "Connected peers by the mode of their redundancy controller: clean (no copies), lossy, "
     "bursty, congested (copies cut), or always (that policy).", ("mode",),
     ("clean", "lossy", "bursty", "congested", "always"), {}),
    ("rtt", Histogram, "relay_peer_rtt_seconds",
     "Smoothed round-trip time of each peer, sampled periodically.", (), (),
     {"buckets": RTT_BUCKETS}),
    ("receive_memory", Gauge, "relay_receive_memory_bytes",
     "Bytes held for peers before delivery (partial and out-of-order messages with their "
     "bookkeeping, block buffers): used, and the limit (server.receive_memory_limit).",
     ("kind",), ("used", "limit"), {}),
    ("loss", Gauge, "relay_peer_loss_ratio", "Mean estimated packet loss over connected peers.",
     (), (), {}),
    ("drops", Counter, "relay_dropped_datagrams_total",
     "Datagrams or messages dropped, by reason.", ("reason",), DROP_REASON_LABELS, {}),
    ("desyncs", Counter, "relay_desyncs_total", "Checksum mismatches detected.", (), (), {}),
    ("synthesized_inputs", Counter, "relay_synthesized_inputs_total",
     "Inputs the relay filled in for connected players whose input missed its frame "
     "(rooms.missing_input_policy repeat or neutral).", (), (), {}),
    ("input_delay_advice", Histogram, "relay_input_delay_advice_frames",
     "Input delays advised to players, in frames, one sample each time a player's advice changes.", (), (),
     {"buckets": (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30)}),
    ("migrations", Counter, "relay_peer_migrations_total",
     "Peers whose source address changed mid-session (NAT rebinding, network switch) and "
     "moved after the new path answered its challenge.", (), (), {}),
    ("blocks", Counter, "relay_block_transfers_total",
     "Block transfers (history catch-up), by outcome.", ("outcome",), BLOCK_OUTCOMES, {}),
    ("joins", Counter, "relay_joins_total", "Join requests, by outcome.", ("outcome",),
     JOIN_OUTCOMES, {}),
    ("refusals", Counter, "relay_join_refusals_total", "Refused joins, by reason.",
     ("reason",), JOIN_REFUSAL_REASONS, {}),
    ("handshake_refusals", Counter, "relay_handshake_refusals_total",
     "Connections refused during the handshake (relay full, bad, expired or reused connect "
     "token, too many from one source in open mode), by reason.", ("reason",), HANDSHAKE_REFUSAL_REASONS, {}),
    ("security_open_mode", Gauge, "relay_security_open_mode",
     "1 when clients connect without connect tokens (open mode), 0 in token mode.", (), (), {}),
    ("admin_auth_failures", Counter, "relay_admin_auth_failures_total",
     "Admin API requests refused for a missing, malformed or wrong bearer token.",
     ("reason",), ADMIN_AUTH_FAILURES, {}),
    ("replay_bytes", Counter, "relay_replay_written_bytes_total", "Bytes written to replays.",
     (), (), {}),
    ("replay_disk", Counter, "relay_replay_disk_cap_total",
     "Replays deleted (oldest finished), stopped early or not recorded to keep "
     "replay.max_disk_bytes, by action.", ("action",), REPLAY_DISK_ACTIONS, {}),
    ("draining", Gauge, "relay_draining", "1 while the relay is draining, else 0.", (), (), {}),
    ("agones_state", Gauge, "relay_agones_state",
     "1 for the state of this relay's GameServer as last watched (agones.enabled), else 0.",
     ("state",), AGONES_STATES, {}),
    ("agones_rooms", Gauge, "relay_agones_rooms",
     "Room slots: held by this relay (live rooms and allocations not yet created), and the "
     "Agones rooms Counter's count and capacity as last watched.", ("kind",),
     ("held", "counter_count", "counter_capacity"), {}),
    ("agones_allocations", Counter, "relay_agones_allocations_total",
     "Allocations of this GameServer: by an allocator, or by the relay itself for a room "
     "created while it was Ready.", ("by",), AGONES_ALLOCATIONS, {}),
    ("agones_sidecar_failures", Counter, "relay_agones_sidecar_failures_total",
     "Requests to the Agones SDK sidecar that failed (each retry counts).", (), (), {}),
)

# sync_totals keyword -> counter attribute (the same names), and PeerStats field -> keyword.
TOTALS = ("datagrams_received", "datagrams_sent", "bytes_received", "bytes_sent", "resends",
          "spurious_resends", "redundant_bytes")
PEER_STATS_FIELDS = {
    "datagrams_received": "packets_received", "datagrams_sent": "packets_sent",
    "bytes_received": "bytes_received", "bytes_sent": "bytes_sent",
    "resends": "resends", "spurious_resends": "spurious_resends", "redundant_bytes": "redundant_bytes",
}
PEER_TOTALS = ("resends", "spurious_resends", "redundant_bytes")
"""What ``sync_peers`` mirrors by default (see there)."""


class Metrics:
    """All relay metrics on a private registry; attributes are the prometheus_client objects."""

    peers: Gauge
    rooms: Gauge
    ticks: Counter
    tick_lateness: Histogram
    frames_broadcast: Counter
    frames_closed: Counter
    inputs: Counter
    inputs_refused: Counter
    datagrams_received: Counter
    datagrams_sent: Counter
    bytes_received: Counter
    bytes_sent: Counter
    resends: Counter
    redundant_bytes: Counter
    spurious_resends: Counter
    redundancy_peers: Gauge
    rtt: Histogram
    receive_memory: Gauge
    loss: Gauge
    drops: Counter
    desyncs: Counter
    synthesized_inputs: Counter
    input_delay_advice: Histogram
    migrations: Counter
    blocks: Counter
    joins: Counter
    refusals: Counter
    handshake_refusals: Counter
    security_open_mode: Gauge
    admin_auth_failures: Counter
    replay_bytes: Counter
    replay_disk: Counter
    draining: Gauge
    agones_state: Gauge
    agones_rooms: Gauge
    agones_allocations: Counter
    agones_sidecar_failures: Counter

    def __init__(self, process: bool = True, platform: bool = True):
        self.registry = CollectorRegistry(auto_describe=True)
        for attribute, kind, name, documentation, labels, values, kwargs in _SPECS:
            metric = kind(name, documentation, labelnames=labels, registry=self.registry, **kwargs)
            for value in values:
                metric.labels(value)
            setattr(self, attribute, metric)
        if process:     # process_cpu_seconds_total, process_start_time_seconds, memory, fds
            ProcessCollector(registry=self.registry)
        if platform:    # python_info
            PlatformCollector(registry=self.registry)
        self._last_totals: dict[Hashable, dict[Hashable, float]] = {}   # source -> key -> total
        self._peer_sources: set[Hashable] = set()
        self._before_render: list = []

    def before_render(self, publish) -> None:
        """Call ``publish()`` before every ``render()``: an owner that keeps hot-path counts as
        plain integers (published in batches) brings the metrics up to date for a scrape."""
        self._before_render.append(publish)

    # -- exposition --------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric and its content type, for ``GET /metrics``."""
        for publish in self._before_render:
            publish()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    @staticmethod
    def names() -> list[str]:
        """The relay's own metric names as PromQL refers to them, in definition order.

        Counters carry their ``_total``; a histogram ``h`` is listed once and also exposes
        ``h_bucket``, ``h_sum`` and ``h_count`` (see ``sample_names``). The process and platform
        collectors' ``process_*``/``python_info`` are not included.
        """
        return [name for _, _, name, *_ in _SPECS]

    @staticmethod
    def sample_names() -> list[str]:
        """Every sample name the relay's own metrics expose (``_bucket``/``_sum``/``_count``,
        ``_created`` of counters and histograms included)."""
        out = []
        for _, kind, name, *_ in _SPECS:
            if kind is Counter:
                out += [name, name[:-len("_total")] + "_created"]
            elif kind is Histogram:
                out += [name + "_bucket", name + "_count", name + "_sum", name + "_created"]
            else:
                out.append(name)
        return out

    # -- convenience setters -----------------------------------------------------------------

    def set_rooms(self, counts: Mapping[str, int]) -> None:
        """Set the room gauge for every state; states missing from ``counts`` are 0."""
        for state in set(ROOM_STATES) | set(counts):
            self.rooms.labels(state).set(counts.get(state, 0))

    def set_draining(self, draining: bool) -> None:
        self.draining.set(1 if draining else 0)

    def add_counts(self, counts: Mapping[tuple[str, Any], int]) -> None:
        """Add counts kept as plain integers: ``(attribute, label value or None) -> n``
        (``("joins", "refused")``, ``("frames_closed", None)``)."""
        for (attribute, label), count in counts.items():
            metric = getattr(self, attribute)
            (metric if label is None else metric.labels(label)).inc(count)

    # -- mirroring cumulative totals ---------------------------------------------------------

    def sync_agones(self, stats: Mapping[str, Any]) -> None:
        """Mirror ``AgonesClient.stats()``: the GameServer's state, the room slots, and the
        cumulative allocation and failure counts."""
        state = stats.get("state")
        for child_state in {*AGONES_STATES, *([state] if state else [])}:
            self.agones_state.labels(state=child_state).set(1 if child_state == state else 0)
        self.agones_rooms.labels(kind="held").set(stats.get("rooms_held") or 0)
        count, capacity = stats.get("counter_seen") or (0, 0)
        self.agones_rooms.labels(kind="counter_count").set(count)
        self.agones_rooms.labels(kind="counter_capacity").set(capacity)
        self.add_counter_delta(self.agones_allocations.labels(by="allocator"),
                               stats.get("allocations_seen", 0), "allocator", source="agones")
        self.add_counter_delta(self.agones_allocations.labels(by="self"),
                               stats.get("self_allocations", 0), "self", source="agones")
        self.add_counter_delta(self.agones_sidecar_failures, stats.get("requests_failed", 0),
                               "failures", source="agones")

    def add_counter_delta(self, counter: Any, new_total: float, key: Hashable,
                          source: Hashable = None) -> float:
        """Increment ``counter`` (a Counter or a labelled child) by how much ``new_total`` grew
        since the last call with the same ``source`` and ``key``; returns the increment.

        ``key`` names the total within its source (one key per counter and label set). The
        first total seen counts in full (the source started from zero); a total below the last
        one means the source restarted and counts in full again.
        """
        if new_total < 0:
            raise ValueError(f"a cumulative total cannot be negative: {new_total!r} for {key!r}")
        last_totals = self._last_totals.get(source)
        if last_totals is None:
            last_totals = self._last_totals[source] = {}
        last = last_totals.get(key, 0)
        delta = new_total - last if new_total >= last else new_total
        last_totals[key] = new_total
        if delta:
            counter.inc(delta)
        return delta

    def sync_drops(self, drops: Mapping[str, int], source: Hashable = "endpoint") -> None:
        """Mirror a cumulative ``{reason: count}`` (``Endpoint.drops``) into ``drops``.

        Reasons absent from ``drops`` are left alone (the core omits zero counts); a reason seen
        for the first time gets its own series.
        """
        for reason, total in drops.items():
            self.add_counter_delta(self.drops.labels(reason), total, ("drops", reason), source)

    def sync_refusals(self, refusals: Mapping[str, int], source: Hashable = "endpoint") -> None:
        """Mirror a cumulative ``{reason: count}`` of handshake refusals (``Endpoint.refusals``)."""
        for reason, total in refusals.items():
            self.add_counter_delta(self.handshake_refusals.labels(reason), total,
                                   ("handshake_refusals", reason), source)

    def sync_totals(self, source: Hashable = "endpoint", **totals: int) -> None:
        """Mirror cumulative traffic totals of one source: keywords ``datagrams_received``,
        ``datagrams_sent``, ``bytes_received``, ``bytes_sent``, ``resends``, ``redundant_bytes``
        (any subset)."""
        for name, total in totals.items():
            if name not in TOTALS:
                raise TypeError(f"sync_totals() got an unexpected keyword {name!r}")
            self.add_counter_delta(getattr(self, name), total, name, source)

    def sync_peers(self, stats: Mapping[Hashable, Any],
                   totals: Iterable[str] = PEER_TOTALS) -> None:
        """Fold ``{peer_id: PeerStats}`` of every connected peer into the metrics, once per
        sampling period: the cumulative ``totals`` per peer (peers missing from ``stats`` are
        forgotten), one RTT observation per peer that has a sample, and the mean loss estimate.

        By default only ``resends``, ``spurious_resends`` and ``redundant_bytes`` are mirrored: datagrams and bytes
        are best counted at the socket, which also sees handshakes and dropped datagrams that
        no peer's stats include. Pass ``totals=TOTALS`` to mirror those from the peers instead
        (never both). A peer's traffic between its last sample and its disconnect is not seen.
        """
        fields = [(name, PEER_STATS_FIELDS[name]) for name in totals]
        for peer_id, peer in stats.items():
            source = ("peer", peer_id)
            for name, field in fields:
                self.add_counter_delta(getattr(self, name), getattr(peer, field), name, source)
            if peer.rtt > 0:
                self.rtt.observe(peer.rtt)
        for peer_id in self._peer_sources - stats.keys():
            self.forget(("peer", peer_id))
        self._peer_sources = set(stats)
        self.loss.set(sum(peer.loss for peer in stats.values()) / len(stats) if stats else 0.0)

    def forget(self, source: Hashable) -> None:
        """Drop the remembered totals of a source that is gone (a disconnected peer)."""
        self._last_totals.pop(source, None)

    def sources(self) -> set[Hashable]:
        """Sources with remembered totals (for tests and debugging)."""
        return set(self._last_totals)
