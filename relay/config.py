"""Server settings: embedded defaults, an optional TOML file, then RELAY_<SECTION>_<KEY> overrides.

Every setting is validated; an invalid one raises ConfigError naming the key, the value given
and what is allowed, and `relay serve` exits non-zero with that message.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from relay.errors import ConfigError  # an invalid setting: names the key, the value, what is allowed
from relay_core.config import REDUNDANCY_POLICIES

ENV_PREFIX = "RELAY_"


def _check_host(key: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if value != "localhost":
            raise ConfigError(f"{key}={value!r}: an IPv4/IPv6 address or 'localhost'") from None


def is_loopback(host: str) -> bool:
    """True if a listener on ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:          # a host name: it may resolve anywhere
        return False


def _check_range(key: str, value, low, high) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key}={value!r}: allowed {low}..{high}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: allowed {', '.join(choices)}")


@dataclass
class ServerSettings:
    udp_host: str = "127.0.0.1"
    """Address the game traffic (UDP) listens on. Loopback by default, so that a relay started
    with no settings runs in open mode safely; deployments set 0.0.0.0 and token keys."""
    udp_port: int = 7777
    http_host: str = "127.0.0.1"
    """Address of the metrics and admin API (HTTP)."""
    http_port: int = 9100
    tick_rate: int = 30
    """Frames closed per second, for every room (10..120)."""
    log_format: str = "text"
    """text: key=value lines; json: one JSON object per line."""
    log_level: str = "info"
    drain_timeout: float = 30.0
    """SIGTERM or POST /admin/drain: running matches may finish for this long before they are
    ended with reason drain_deadline, seconds (0: end them at once)."""
    shutdown_timeout: float = 5.0
    """Longest the final shutdown (after draining) may take before the process exits anyway, seconds."""
    max_peers: int = 4096
    """Connected clients (players and spectators) across all rooms."""
    join_timeout: float = 10.0
    """A connection that is in no room this long (it never sent JOIN, or it left) is closed,
    seconds: idle connections must not hold the peer slots players need."""
    mtu: int = 1200
    max_pending_messages: int = 4096
    """Messages queued for one peer on one channel behind a full window; past it a frame is
    not queued (counted as send_queue_full) and the peer is repaired with a catch-up block; a
    control message cannot be repaired, so the peer is disconnected (reason closed)."""
    reassembly_limit: int = 1024 * 1024
    """Bytes one peer may hold in partly received fragmented messages (the rest is dropped,
    counted as reassembly_full)."""
    block_memory_limit: int = 64 * 1024 * 1024
    """Bytes of block receive buffers across all peers."""
    # -- receive memory (issue 17, M4) --
    receive_memory_limit: int = 256 * 1024 * 1024
    """Bytes held for all peers together before delivery: partly received and out-of-order
    messages with their bookkeeping, and block buffers (more is dropped, counted as
    receive_memory_full, and sent again by the client later)."""
    # -- HTTP connection limits (docs/SECURITY.md, "HTTP connections") --
    http_max_connections: int = 256
    """Open HTTP connections at most (probes, scrapes, admin calls need a handful). Also kept
    below the file descriptor limit less its reserve for UDP and replay files; past either, a
    new connection closes the oldest one still waiting for a request head."""
    http_header_timeout: float = 10.0
    """An HTTP connection must send a complete request head (request line and headers) within
    this long of opening or of its previous response, however slowly it trickles, seconds."""
    http_body_timeout: float = 10.0
    """A request body (at most 64 KiB) must arrive within this long, seconds (else 408)."""

    def validate(self) -> None:
        _check_host("server.udp_host", self.udp_host)
        _check_host("server.http_host", self.http_host)
        _check_range("server.udp_port", self.udp_port, 0, 65535)
        _check_range("server.http_port", self.http_port, 0, 65535)
        _check_range("server.tick_rate", self.tick_rate, 10, 120)
        _check_choice("server.log_format", self.log_format, ("text", "json"))
        _check_choice("server.log_level", self.log_level, ("debug", "info", "warning", "error"))
        _check_range("server.drain_timeout", self.drain_timeout, 0.0, 86400.0)
        _check_range("server.shutdown_timeout", self.shutdown_timeout, 0.1, 300.0)
        _check_range("server.max_peers", self.max_peers, 1, 1_000_000)
        _check_range("server.join_timeout", self.join_timeout, 1.0, 3600.0)
        # A reliable message of 256 KiB (a frame, a control message) must fit 255 fragments,
        # each a datagram less its headers and, in token mode, the 16-byte AEAD tag.
        _check_range("server.mtu", self.mtu, 1072, 16384)
        _check_range("server.max_pending_messages", self.max_pending_messages, 16, 1_000_000)
        # The core's floor: one largest reliable message must fit (256 KiB).
        _check_range("server.reassembly_limit", self.reassembly_limit, 256 * 1024, 2**32)
        _check_range("server.block_memory_limit", self.block_memory_limit, 32 * 1024 * 1024, 2**40)
        # Room for one largest block (32 MiB, protocol.MAX_BLOCK_SIZE); the core also wants it
        # at least reassembly_limit.
        _check_range("server.receive_memory_limit", self.receive_memory_limit, 32 * 1024 * 1024, 2**40)
        _check_range("server.http_max_connections", self.http_max_connections, 1, 1_000_000)
        _check_range("server.http_header_timeout", self.http_header_timeout, 0.1, 3600.0)
        _check_range("server.http_body_timeout", self.http_body_timeout, 0.1, 3600.0)


@dataclass
class RoomSettings:
    auto_create: bool = True
    """Create a room on the first JOIN that names it (otherwise only the admin API creates rooms)."""
    max_rooms: int = 1000
    capacity: int = 8
    """Players per room (spectators do not count)."""
    start_policy: str = "players"
    """players: start when start_players have joined; ready: when that many joined and all
    sent READY; admin: only POST /rooms/{room}/start."""
    start_players: int = 2
    empty_timeout: float = 30.0
    """A room with nobody connected for this long ends, seconds."""
    allow_late_join: bool = True
    """New players may join a running room (they receive the frame history first)."""
    max_input_bytes: int = 256
    late_input_policy: str = "next"
    """An input for a frame already closed: next = put it in the open frame if the player has
    none there yet; drop = discard it. Either way it is counted."""
    max_input_lead: int = 120
    """Inputs more than this many frames ahead of the open frame are refused."""
    player_timeout: float = 10.0
    """A player silent this long is timed out; the room goes on without it, seconds."""
    reconnect_grace: float = 60.0
    """A timed-out or disconnected player may reclaim its slot within this time, seconds."""
    spectator_delay: int = 90
    """Frames spectators lag behind the live stream."""
    max_spectators: int = 16
    catchup_frames: int = 150
    """A client this many frames behind gets the missing frames as one block."""
    checksum_window: int = 600
    """Frames of checksum history kept for desync detection."""
    missing_input_policy: str = "none"
    """What a frame carries for a connected player whose input has not arrived when the frame
    closes: none = no input (nil); repeat = the slot's input of the previous frame; neutral =
    neutral_input. Made-up inputs are marked synthesized in the frame."""
    neutral_input: str = ""
    """The neutral input for missing_input_policy = neutral, as hex (e.g. "00000000")."""
    input_delay_advice: bool = True
    """Measure how long each player's inputs take to arrive and advise it an input delay."""
    input_delay_percentile: float = 99.0
    """Advice covers this percentile of a player's input response times (send of frame N to
    arrival of the input sent after it)."""
    input_delay_margin: float = 0.010
    """Added to that percentile before rounding up to whole frames, seconds."""
    input_delay_min: int = 1
    input_delay_max: int = 10
    """Bounds of the advised input delay, frames (never above max_input_lead)."""
    input_delay_window: int = 150
    """Frames whose answers are kept per player (a response time each, the newest frames), for
    the percentile; a lower advice also waits this many frames of reviews that all allow it."""
    input_delay_interval: float = 5.0
    """The advice is sent when it changes, and repeated this often, seconds."""

    @property
    def neutral_input_bytes(self) -> bytes:
        return bytes.fromhex(self.neutral_input)

    def validate(self) -> None:
        _check_range("rooms.max_rooms", self.max_rooms, 1, 1_000_000)
        _check_range("rooms.capacity", self.capacity, 1, 256)
        _check_choice("rooms.start_policy", self.start_policy, ("players", "ready", "admin"))
        _check_range("rooms.start_players", self.start_players, 1, self.capacity)
        _check_range("rooms.empty_timeout", self.empty_timeout, 0.0, 86400.0)
        _check_range("rooms.max_input_bytes", self.max_input_bytes, 1, 4096)
        _check_choice("rooms.late_input_policy", self.late_input_policy, ("next", "drop"))
        _check_range("rooms.max_input_lead", self.max_input_lead, 1, 10_000)
        _check_range("rooms.player_timeout", self.player_timeout, 1.0, 3600.0)
        _check_range("rooms.reconnect_grace", self.reconnect_grace, 0.0, 86400.0)
        _check_range("rooms.spectator_delay", self.spectator_delay, 0, 100_000)
        _check_range("rooms.max_spectators", self.max_spectators, 0, 10_000)
        _check_range("rooms.catchup_frames", self.catchup_frames, 2, 1_000_000)
        _check_range("rooms.checksum_window", self.checksum_window, 1, 1_000_000)
        _check_choice("rooms.missing_input_policy", self.missing_input_policy,
                      ("none", "repeat", "neutral"))
        try:
            neutral = bytes.fromhex(self.neutral_input)
        except ValueError:
            raise ConfigError(f"rooms.neutral_input={self.neutral_input!r}: hex digits, two per "
                              f"byte (e.g. \"00ff\")") from None
        if len(neutral) > self.max_input_bytes:
            raise ConfigError(f"rooms.neutral_input={self.neutral_input!r}: {len(neutral)} bytes, "
                              f"more than rooms.max_input_bytes={self.max_input_bytes}")
        if self.missing_input_policy == "neutral" and not neutral:
            raise ConfigError("rooms.neutral_input='': rooms.missing_input_policy=neutral needs "
                              "the neutral input as hex bytes")
        _check_range("rooms.input_delay_percentile", self.input_delay_percentile, 50.0, 100.0)
        _check_range("rooms.input_delay_margin", self.input_delay_margin, 0.0, 1.0)
        _check_range("rooms.input_delay_min", self.input_delay_min, 1, 1000)
        _check_range("rooms.input_delay_max", self.input_delay_max, self.input_delay_min, 1000)
        _check_range("rooms.input_delay_window", self.input_delay_window, 10, 10_000)
        _check_range("rooms.input_delay_interval", self.input_delay_interval, 0.1, 3600.0)
        # Every frame must fit one reliable message of the core (256 KiB): inputs plus framing.
        worst_frame = self.capacity * (self.max_input_bytes + 5) + 64
        if worst_frame > 256 * 1024:
            raise ConfigError(f"rooms.capacity={self.capacity} x rooms.max_input_bytes="
                              f"{self.max_input_bytes}: a full frame ({worst_frame} bytes) must fit "
                              f"256 KiB; lower one of them")


@dataclass
class ReplaySettings:
    enabled: bool = True
    directory: str = "replays"
    """Where replay files go; created if missing."""
    max_bytes: int = 256 * 1024 * 1024
    """Compressed size at which one replay stops growing (counted and logged)."""
    max_disk_bytes: int = 8 * 1024**3
    """Total size of the *.replay files in the directory: past it the oldest finished replays
    are deleted; if the replays still being written alone exceed it, the newest of them is
    closed and no new one starts until there is room (each counted and logged). 0: no cap."""
    # -- durability (docs/OPERATIONS.md, "Replay durability") --
    flush_interval: float = 0.1
    """Longest a frame stays in the writer's buffers, seconds: every tick hands what is older
    to the kernel, so a relay killed (kill -9, OOM, crash) loses at most this much of a match."""
    fsync: str = "interval"
    """When replay data is forced to the disk, against power loss and kernel crashes (a killed
    process loses nothing the kernel has): interval = every fsync_interval, in a background
    thread (the tick never waits for the disk); always = at every flush, on the tick (each
    waits for the disk: a few rooms on a fast disk only); never = when the kernel writes back
    (about 30 s on Linux defaults)."""
    fsync_interval: float = 1.0
    """Seconds between fsyncs of a replay being written, with fsync = "interval"."""

    def validate(self) -> None:
        if not self.directory:
            raise ConfigError("replay.directory='': a directory path")
        _check_range("replay.max_bytes", self.max_bytes, 1024, 2**40)
        if self.max_disk_bytes:
            _check_range("replay.max_disk_bytes", self.max_disk_bytes, self.max_bytes, 2**50)
        _check_range("replay.flush_interval", self.flush_interval, 0.0, 60.0)
        _check_choice("replay.fsync", self.fsync, REPLAY_FSYNC_POLICIES)
        _check_range("replay.fsync_interval", self.fsync_interval, 0.01, 3600.0)


REPLAY_FSYNC_POLICIES = ("never", "interval", "always")


SECURITY_MODES = ("auto", "open", "token")
KEY_SIZE = 32
"""Bytes of a token key (relay_core.token.KEY_SIZE)."""
MAX_KEY_ID = 0xFFFFFFFF
MIN_ADMIN_TOKEN = 16


def _decode_key(where: str, key_id: str, text: str) -> tuple[int, bytes]:
    if not key_id.strip().isdigit() or not 0 <= int(key_id) <= MAX_KEY_ID:
        raise ConfigError(f"{where}: key id {key_id!r}: an integer 0..{MAX_KEY_ID}")
    # Standard or URL-safe base64, padded or not (`openssl rand -base64 32` and `relay token
    # keygen` both work).
    text = text.strip().replace("-", "+").replace("_", "/")
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: key {key_id}: not base64 text") from None
    if len(key) != KEY_SIZE:
        raise ConfigError(f"{where}: key {key_id}: {len(key)} bytes, a key is {KEY_SIZE} bytes "
                          f"(generate one with `relay token keygen`)")
    return int(key_id), key


def parse_keys(text: str, where: str = "security.keys") -> dict[int, bytes]:
    """``"ID:BASE64KEY"`` pairs separated by commas or whitespace -> {key id: 32-byte key}."""
    keys: dict[int, bytes] = {}
    for item in text.replace(",", " ").split():
        key_id, sep, encoded = item.partition(":")
        if not sep:
            raise ConfigError(f"{where}: an item without ':' (not shown: it may be a key); "
                              f"expected ID:BASE64KEY pairs")
        number, key = _decode_key(where, key_id, encoded)
        if number in keys:
            raise ConfigError(f"{where}: key id {number} appears twice")
        keys[number] = key
    return keys


def read_key_file(path: str) -> dict[int, bytes]:
    """A TOML file of ``ID = "BASE64KEY"`` lines -> {key id: 32-byte key}."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"security.keys_file={path!r}: cannot read it: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"security.keys_file={path!r}: not valid TOML (expected lines "
                          f"ID = \"BASE64KEY\"): {error}") from None
    keys: dict[int, bytes] = {}
    for key_id, encoded in document.items():
        if not isinstance(encoded, str):
            raise ConfigError(f"security.keys_file={path!r}: key {key_id}: expected "
                              f"{key_id} = \"BASE64KEY\"")
        number, key = _decode_key(f"security.keys_file={path!r}", key_id, encoded)
        if number in keys:     # "1" and "01" are different TOML keys
            raise ConfigError(f"security.keys_file={path!r}: key id {number} appears twice")
        keys[number] = key
    return keys


@dataclass
class SecuritySettings:
    mode: str = "auto"
    """token: every connection needs a connect token minted with one of the keys; open: anyone
    may connect and join (for loopback and trusted networks); auto: open when server.udp_host
    is a loopback address, token otherwise."""
    keys: str = ""
    """Token keys inline, "ID:BASE64KEY" pairs separated by commas. Prefer keys_file or the
    RELAY_SECURITY_KEYS variable: keys are secrets."""
    keys_file: str = ""
    """TOML file of ID = "BASE64KEY" lines (a Kubernetes Secret, a root-only file)."""
    mint_key_id: int = -1
    """The key `relay token mint` and `relay bot` mint with; -1: the highest key id."""
    encrypt_packets: bool = True
    """Token mode: encrypt and authenticate every session packet (false: tokens authorize the
    handshake only)."""
    handshake_rate: float = 100.0
    """Handshake packets accepted per second from one source address (a connecting client
    sends about 10 per second while it retries; a NAT may hide many players behind one
    address); the rest are dropped as rate_limited. 0: unlimited."""
    handshake_burst: int = 200
    """Handshake packets one source address may send at once before handshake_rate applies."""
    handshake_budget: float = 20000.0
    """Handshake packets answered per second over all sources together; the rest of a flood of
    forged handshakes is dropped as handshake_budget, a client's resends first in line. 0:
    unlimited."""
    # -- open mode per-source caps (docs/SECURITY.md, "Open mode: per-source caps") --
    max_sessions_per_source: int = 64
    """Open mode: connections at once from one source (an IPv4 address, an IPv6 /64); more are
    refused in the handshake (source_session_limit). 0: unlimited. Token mode: no cap."""
    max_rooms_per_source: int = 16
    """Open mode: rooms alive at once that JOINs from one source created; a JOIN that would
    create one more is refused (source_room_limit). Rooms made with POST /rooms do not count.
    0: unlimited. Token mode: no cap."""
    admin_token: str = ""
    """Bearer token of the admin API; required when server.http_host is not loopback. Prefer
    admin_token_file or RELAY_SECURITY_ADMIN_TOKEN."""
    admin_token_file: str = ""
    """File holding the admin bearer token (surrounding whitespace ignored)."""

    def validate(self) -> None:
        _check_choice("security.mode", self.mode, SECURITY_MODES)
        _check_range("security.mint_key_id", self.mint_key_id, -1, MAX_KEY_ID)
        if self.handshake_rate != 0 and not 0.1 <= self.handshake_rate <= 1_000_000.0:
            raise ConfigError(f"security.handshake_rate={self.handshake_rate!r}: allowed 0 "
                              f"(unlimited) or 0.1..1000000.0 per second")
        _check_range("security.handshake_burst", self.handshake_burst, 1, 1_000_000)
        if self.handshake_budget != 0 and not 1.0 <= self.handshake_budget <= 10_000_000.0:
            raise ConfigError(f"security.handshake_budget={self.handshake_budget!r}: allowed 0 "
                              f"(unlimited) or 1.0..10000000.0 per second")
        _check_range("security.max_sessions_per_source", self.max_sessions_per_source, 0, 1_000_000)
        _check_range("security.max_rooms_per_source", self.max_rooms_per_source, 0, 1_000_000)
        keys = self.load_keys()
        if self.mint_key_id >= 0 and self.mint_key_id not in keys:
            raise ConfigError(f"security.mint_key_id={self.mint_key_id}: no key has this id "
                              f"(ids: {', '.join(map(str, sorted(keys))) or 'none'})")
        self.load_admin_token()

    def load_keys(self) -> dict[int, bytes]:
        """Every key, from ``keys`` and ``keys_file`` (an id in both is an error)."""
        keys = parse_keys(self.keys)
        if self.keys_file:
            for key_id, key in read_key_file(self.keys_file).items():
                if key_id in keys:
                    raise ConfigError(f"security.keys_file={self.keys_file!r}: key id {key_id} "
                                      f"is also in security.keys")
                keys[key_id] = key
        return keys

    def mint_key(self) -> tuple[int, bytes]:
        """(key id, key) to mint tokens with; ConfigError if there is no key."""
        keys = self.load_keys()
        if not keys:
            raise ConfigError("no token key: set security.keys_file or RELAY_SECURITY_KEYS "
                              "(generate a key with `relay token keygen`)")
        key_id = self.mint_key_id if self.mint_key_id >= 0 else max(keys)
        return key_id, keys[key_id]

    def load_admin_token(self) -> str | None:
        if self.admin_token and self.admin_token_file:
            raise ConfigError("security.admin_token and security.admin_token_file are both set; "
                              "keep one")
        key, token = "security.admin_token", self.admin_token
        if self.admin_token_file:
            key = f"security.admin_token_file={self.admin_token_file!r}"
            try:
                token = Path(self.admin_token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as error:
                raise ConfigError(f"{key}: cannot read it: "
                                  f"{getattr(error, 'strerror', None) or error}") from None
        if not token:
            return None
        if len(token) < MIN_ADMIN_TOKEN or not token.isascii() or not token.isprintable() \
                or any(char.isspace() for char in token):
            # Never echo the secret itself.
            raise ConfigError(f"{key}: at least {MIN_ADMIN_TOKEN} printable ASCII characters "
                              f"without spaces (e.g. `openssl rand -hex 32`)")
        return token

    def effective_mode(self, udp_host: str) -> str:
        """"open" or "token": what "auto" means for a listener on ``udp_host``."""
        if self.mode != "auto":
            return self.mode
        return "open" if is_loopback(udp_host) else "token"


WHEN_EMPTY_POLICIES = ("ready", "shutdown")
_COUNTER_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")


@dataclass
class AgonesSettings:
    enabled: bool = False
    """Talk to the Agones SDK sidecar (run under Agones only)."""
    host: str = "127.0.0.1"
    port: int = 0
    """The sidecar's HTTP port; 0 (or None) = $AGONES_SDK_HTTP_PORT, else 9358."""
    health_interval: float = 5.0
    """Seconds between Health pings; keep it well under the GameServer's health.periodSeconds."""
    when_empty: str = "ready"
    """What an Allocated GameServer does once it holds no room: ready = go back to Ready (the
    fleet may reuse or remove it); shutdown = ask Agones to shut it down (a fresh one replaces it)."""
    rooms_counter: str = "rooms"
    """The Agones Counter holding this relay's room slots (capacity rooms.max_rooms, count the
    rooms held); "" = no Counter (Agones before 1.41, or the CountsAndLists gate off)."""
    player_tracking: bool = False
    """Report player connects/disconnects (Agones PlayerTracking alpha feature gate)."""
    request_timeout: float = 2.0
    max_retries: int = 5
    """Retries after a failed update or Shutdown before it is dropped (Ready retries forever)."""
    backoff_initial: float = 0.2
    backoff_max: float = 5.0

    def validate(self) -> "AgonesSettings":
        if not isinstance(self.host, str) or not self.host or any(c.isspace() for c in self.host):
            raise ConfigError(f"agones.host={self.host!r}: a host name or address")
        if self.port is not None:
            _check_range("agones.port", self.port, 0, 65535)
        _check_range("agones.health_interval", self.health_interval, 0.01, 300.0)
        if self.when_empty not in WHEN_EMPTY_POLICIES:
            raise ConfigError(f"agones.when_empty={self.when_empty!r}: one of "
                              f"{', '.join(WHEN_EMPTY_POLICIES)}")
        if not isinstance(self.rooms_counter, str) or (
                self.rooms_counter and not _COUNTER_NAME.fullmatch(self.rooms_counter)):
            raise ConfigError(f"agones.rooms_counter={self.rooms_counter!r}: empty, or a Counter "
                              "name of 1..63 characters [A-Za-z0-9_.-] starting and ending "
                              "alphanumeric")
        _check_range("agones.request_timeout", self.request_timeout, 0.01, 60.0)
        _check_range("agones.max_retries", self.max_retries, 0, 100)
        _check_range("agones.backoff_initial", self.backoff_initial, 0.001, 60.0)
        _check_range("agones.backoff_max", self.backoff_max, self.backoff_initial, 600.0)
        return self


@dataclass
class LinkSettings:
    """How the relay's STREAM copies frames to lossy players (docs/PROTOCOL.md 12.4, 14.5);
    each player's own link picks the mode."""

    redundancy_policy: str = "adaptive"
    """adaptive: a redundancy controller per player reads its acks and RTT and copies as its
    path needs (clean: none; lossy: one copy at once, more where an ack is overdue; bursty:
    every unacked frame in every datagram; congested: none). always: every unacked frame in
    every datagram, whatever the path."""
    burst_threshold: float = 0.2
    """bursty once the loss rate right after a loss exceeds the loss rate by this."""
    congestion_delay: float = 0.05
    """congested once two RTT samples in a row stand this far (seconds), and more than the
    path's floor, above the floor."""
    congestion_hold: float = 5.0
    """Seconds congested mode lasts after the last sign of a queue."""
    congested_copies: int = 0
    """Copies per frame while congested (0: none; losses go to the ack-gap resend)."""
    redundancy_copies: int = 4
    """lossy: most copies per frame after each send."""
    prompt_copies: int = 1
    """lossy: copies that follow a frame at once, before an ack could say they are needed."""

    def validate(self) -> "LinkSettings":
        _check_choice("link.redundancy_policy", self.redundancy_policy, REDUNDANCY_POLICIES)
        _check_range("link.burst_threshold", self.burst_threshold, 0.01, 0.99)
        _check_range("link.congestion_delay", self.congestion_delay, 0.001, 10.0)
        _check_range("link.congestion_hold", self.congestion_hold, 0.1, 600.0)
        _check_range("link.congested_copies", self.congested_copies, 0, 16)
        _check_range("link.redundancy_copies", self.redundancy_copies, 1, 16)
        _check_range("link.prompt_copies", self.prompt_copies, 1, 16)
        return self


@dataclass
class RelayConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    rooms: RoomSettings = field(default_factory=RoomSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    agones: AgonesSettings = field(default_factory=AgonesSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    link: LinkSettings = field(default_factory=LinkSettings)

    def validate(self) -> "RelayConfig":
        self.server.validate()
        self.rooms.validate()
        self.replay.validate()
        self.agones.validate()
        self.security.validate()
        self.link.validate()
        return self

    @property
    def security_mode(self) -> str:
        """"open" or "token", with "auto" resolved for server.udp_host."""
        return self.security.effective_mode(self.server.udp_host)

    @property
    def admin_auth_required(self) -> bool:
        """Whether the admin API demands a bearer token (non-loopback HTTP, or a token set)."""
        return not is_loopback(self.server.http_host) or self.security.load_admin_token() is not None

    def check_serve(self) -> None:
        """What a valid file may still lack to serve safely; ConfigError saying what to set.

        Kept out of validate(): an example file or an image's environment is valid on its own,
        and its secrets arrive at deployment (a key file, a Kubernetes Secret)."""
        if self.security_mode == "token" and not self.security.load_keys():
            raise ConfigError(
                f"security.mode={self.security.mode!r} needs token keys "
                f"(server.udp_host={self.server.udp_host!r} is not loopback-only): set "
                f"security.keys_file or RELAY_SECURITY_KEYS (generate a key with `relay token "
                f"keygen`), or security.mode = \"open\" to let anyone connect")
        if not is_loopback(self.server.http_host) and self.security.load_admin_token() is None:
            raise ConfigError(
                f"server.http_host={self.server.http_host!r} is not loopback-only, so the admin "
                f"API needs a bearer token: set security.admin_token_file or "
                f"RELAY_SECURITY_ADMIN_TOKEN (e.g. `openssl rand -hex 32`)")


SECTIONS = {f.name: f.type for f in dataclasses.fields(RelayConfig)}


def _coerce(key: str, raw: Any, kind: type, from_env: bool) -> Any:
    """Convert a TOML or environment value to the field's type, or explain what is expected.

    Environment variables are always strings, so only they are parsed; in TOML a quoted number
    is a mistake worth reporting."""
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if from_env and raw.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return raw.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}={raw!r}: true or false")
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if from_env:
            try:
                return int(raw)
            except ValueError:
                pass
        raise ConfigError(f"{key}={raw!r}: an integer")
    if kind is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if from_env:
            try:
                return float(raw)
            except ValueError:
                pass
        raise ConfigError(f"{key}={raw!r}: a number")
    if not isinstance(raw, str):
        raise ConfigError(f"{key}={raw!r}: a string")
    return raw


def _field_types(section_type: type) -> dict[str, type]:
    names = {"bool": bool, "int": int, "float": float, "str": str}
    return {f.name: names[f.type] if isinstance(f.type, str) else f.type
            for f in dataclasses.fields(section_type)}


def _apply(config: RelayConfig, section: str, key: str, raw: Any, from_env: bool = False) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"[{section}]: unknown section; allowed {', '.join(SECTIONS)}")
    target = getattr(config, section)
    types = _field_types(type(target))
    if key not in types:
        raise ConfigError(f"{section}.{key}={raw!r}: unknown setting; allowed {', '.join(types)}")
    setattr(target, key, _coerce(f"{section}.{key}", raw, types[key], from_env))


def _source_of(error: ConfigError, sources: Mapping[str, str]) -> Optional[str]:
    """Where the setting an error names (its "section.key" prefix) was set, if not a default."""
    return sources.get(re.split(r"[=:]", str(error), maxsplit=1)[0])


def parse_override(text: str) -> tuple[str, str, str]:
    """``"section.key=value"`` (a --set argument) -> (section, key, value); ConfigError if the
    text has no dot before the '=' or no '='."""
    name, sep, value = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise ConfigError(f"--set {text!r}: expected SECTION.KEY=VALUE (e.g. server.udp_port=7778)")
    return section, key, value


def load_config(path: Optional[str | Path] = None,
                environ: Optional[Mapping[str, str]] = None,
                overrides: Sequence[tuple[str, str, str, str]] = ()) -> RelayConfig:
    """Defaults, then the TOML file (if any), then RELAY_<SECTION>_<KEY> variables, then
    ``overrides`` (command-line flags: (section, key, text, flag) tuples, the text parsed as an
    environment variable's); validated. A ConfigError names where the bad setting came from:
    the file (``path: key=...``), the variable or the flag."""
    config = RelayConfig()
    sources: dict[str, str] = {}
    """"section.key" -> where its value came from, for error messages."""
    if path is not None:
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from None
        for section, values in document.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: {section}: expected a [{section}] table")
            for key, raw in values.items():
                try:
                    _apply(config, section, key, raw)
                except ConfigError as error:
                    raise ConfigError(f"{path}: {error}") from None
                sources[f"{section}.{key}"] = f"file {path}"
    for name, raw in (os.environ if environ is None else environ).items():
        if not name.startswith(ENV_PREFIX) or name in ("RELAY_CONFIG",):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        section, _, key = rest.partition("_")
        if section not in SECTIONS:
            continue        # another program's RELAY_* variable
        try:
            _apply(config, section, key, raw, from_env=True)
        except ConfigError as error:
            raise ConfigError(f"{error} (from environment variable {name})") from None
        sources[f"{section}.{key}"] = f"environment variable {name}"
    for section, key, raw, flag in overrides:
        try:
            _apply(config, section, key, raw, from_env=True)
        except ConfigError as error:
            raise ConfigError(f"{error} (from {flag})") from None
        sources[f"{section}.{key}"] = flag
    try:
        return config.validate()
    except ConfigError as error:
        source = _source_of(error, sources)
        if source is None:
            raise
        if source.startswith("file "):
            raise ConfigError(f"{source[len('file '):]}: {error}") from None
        raise ConfigError(f"{error} (from {source})") from None


SECRETS = {("security", "keys"), ("security", "admin_token")}
"""Settings never logged: describe() shows whether they are set."""


def minting_keys(key_texts: Optional[list[str]], key_file: Optional[str],
                 config_path: Optional[str]) -> tuple[dict[int, bytes], int]:
    """Token keys and the default mint key id for the command-line tools: from ``--key`` texts
    and a ``--key-file`` when given, else from the relay settings (``config_path``,
    RELAY_CONFIG, RELAY_SECURITY_KEYS, RELAY_SECURITY_KEYS_FILE). Raises ConfigError."""
    if key_texts or key_file:
        keys = parse_keys(" ".join(key_texts or ()), "--key")
        if key_file:
            for key_id, key in read_key_file(key_file).items():
                if key_id in keys:
                    raise ConfigError(f"key id {key_id} is in both --key and --key-file")
                keys[key_id] = key
        return keys, max(keys)
    security = load_config(config_path or os.environ.get("RELAY_CONFIG")).security
    keys = security.load_keys()
    if not keys:
        raise ConfigError("no token key: pass --key ID:BASE64KEY or --key-file FILE, or set "
                          "security.keys_file / RELAY_SECURITY_KEYS (see `relay token keygen`)")
    return keys, security.mint_key()[0]


def describe(config: RelayConfig) -> dict:
    """The effective settings as a plain dict (logged at start-up), secrets masked."""
    settings = dataclasses.asdict(config)
    for section, key in SECRETS:
        if settings[section][key]:
            settings[section][key] = "<set>"
    return settings
