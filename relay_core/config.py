"""Endpoint and channel configuration: one typed object with defaults and validation."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping, Optional

from relay_core.token import KEY_SIZE
# Datagram space is budgeted with the wire's own sizes: the DATA header, the largest record
# headers, and the AEAD tag of an encrypted DATA packet (docs/PROTOCOL.md, "Packet protection").
from relay_core.wire import (
    DATA_HEADER_BYTES, FRAGMENT_OVERHEAD_BYTES, MAX_RECORD_LENGTH, MESSAGE_OVERHEAD_BYTES,
    SLICE_OVERHEAD_BYTES, TAG_BYTES,
)

MODES = ("reliable_ordered", "redundant", "unreliable_sequenced", "unreliable")
REDUNDANCY_POLICIES = ("adaptive", "always")
_MAX_KEY_ID = 0xFFFFFFFF


class ConfigError(ValueError):
    """An invalid setting, of the core or the relay (relay.errors re-exports it): the message
    names the field or key, the value and what is allowed."""


@dataclass(frozen=True)
class ChannelConfig:
    mode: str = "reliable_ordered"
    """One of reliable_ordered, redundant, unreliable_sequenced, unreliable."""
    window: int = 256
    """Message ids in flight (reliable modes): a power of two, 8..4096. Both ends must agree."""
    max_pending: int = 4096
    """Messages queued behind a full window before send() refuses more."""

    def validate(self, index: int) -> None:
        where = f"channels[{index}]"
        if self.mode not in MODES:
            raise ConfigError(f"{where}.mode={self.mode!r}: allowed {', '.join(MODES)}")
        if not (8 <= self.window <= 4096) or self.window & (self.window - 1):
            raise ConfigError(f"{where}.window={self.window}: a power of two in 8..4096")
        if self.max_pending < 1:
            raise ConfigError(f"{where}.max_pending={self.max_pending}: at least 1")


def default_channels() -> tuple[ChannelConfig, ...]:
    return (
        ChannelConfig("reliable_ordered"),
        ChannelConfig("redundant"),
        ChannelConfig("unreliable_sequenced"),
        ChannelConfig("unreliable"),
    )


@dataclass(frozen=True)
class EndpointConfig:
    """Everything an Endpoint needs; both ends of a connection must agree on ``channels``."""

    channels: tuple[ChannelConfig, ...] = field(default_factory=default_channels)
    mtu: int = 1200
    """Largest UDP payload we send, bytes (576..16384)."""
    accept_connections: bool = False
    """True for a server: answer CONNECT_REQUEST from anyone."""
    max_peers: int = 1024
    """Connected peers at once; further connects are refused with ``server_full``."""

    rto_initial: float = 0.2
    rto_min: float = 0.03
    rto_max: float = 1.0
    """Floor and ceiling of the RTO computed from SRTT + 4 * RTTVAR, seconds."""
    rto_limit: float = 5.0
    """A message whose backed-off RTO exceeds this times the peer out (resend_limit)."""
    max_resends: int = 20
    """A message resent more often than this times the peer out (resend_limit)."""
    peer_timeout: float = 10.0
    """Nothing received for this long: the peer is timed out."""
    heartbeat_interval: float = 0.5
    """Nothing sent for this long: send an empty DATA packet (keeps acks and RTT fresh)."""
    ack_delay: float = 0.005
    """Longest we hold an ack hoping to piggyback it on data."""

    connect_timeout: float = 5.0
    connect_resend_interval: float = 0.1
    cookie_lifetime: float = 10.0
    """How long a CHALLENGE cookie stays valid, seconds."""

    max_message_size: int = 256 * 1024
    """Largest reliable message, bytes; larger ones must go by block transfer."""
    max_fragments_in_flight: int = 1024
    """Unacked fragments per channel; further large messages wait."""
    reassembly_limit: int = 1024 * 1024
    """Bytes a peer may hold in its reliable receive windows: partly received fragmented
    messages and messages waiting for an earlier one, with their bookkeeping (about 64 bytes
    per fragment or message held, plus 8 per fragment of a partial message). The message
    delivery waits for on each channel may go beyond it (up to max_message_size), never beyond
    receive_memory_limit."""

    block_slice_size: Optional[int] = None
    """Bytes per block slice; None: 1024, or less if the mtu leaves less room."""
    block_window: int = 256
    """Block slices in flight past the first unacked one (<= 512)."""
    max_block_size: int = 16 * 1024 * 1024
    max_queued_blocks: int = 8
    block_memory_limit: int = 64 * 1024 * 1024
    """Bytes of block receive buffers across all peers; a block that would pass it waits."""
    receive_memory_limit: int = 256 * 1024 * 1024
    """Bytes held for all peers together before delivery: everything reassembly_limit and
    block_memory_limit count, with its bookkeeping. A record that would pass it is refused
    (receive_memory_full) and sent again later; what a peer holds is returned when it leaves."""

    send_rate: float = 2_000_000.0
    """Per-peer pacing budget, bytes/s. Redundant copies and block slices wait when it is spent;
    new messages, resends and acks never do."""
    redundancy_policy: str = "adaptive"
    """When redundant channels piggyback copies. "adaptive": as the peer's redundancy
    controller's mode says (docs/PROTOCOL.md 12.5: clean, lossy, bursty, congested), and a
    message whose latest datagram the peer's acks show lost is resent at once. "always": every
    unacked message in every datagram that carries messages, repaired otherwise by RTO only."""
    redundancy_copies: int = 4
    """adaptive, lossy mode: most copies of a message after each (re)send, each in a later
    datagram: the first in the next one, the others only once redundancy_copy_wait has passed."""
    redundancy_copy_wait: float = 1.0
    """adaptive, lossy mode: copies after a message's first copy wait until this many SRTTs,
    plus the peer's ack delay, have passed since it was sent, so they go only where its ack has
    not come back (0: no wait)."""
    redundancy_loss_memory: int = 128
    """adaptive: copies go on until this many of our packets in a row are judged received
    (then the mode is clean)."""
    burst_threshold: float = 0.2
    """adaptive: bursty mode while the estimated loss rate right after a loss exceeds the loss
    rate by at least this (independent losses keep the two alike; bursts of mean length b put
    the first at 1 - 1/b)."""
    congestion_delay: float = 0.05
    """adaptive: congested mode once the smoothed RTT stands more than this, and more than the
    path's RTT floor itself, above that floor (seconds)."""
    congestion_hold: float = 5.0
    """adaptive: congested mode lasts this long after the last RTT sample that showed it (s)."""
    min_rtt_window: float = 10.0
    """adaptive: the RTT floor is the least sample of the current and the previous window of
    this length (seconds), so a path that got longer is learned within two windows."""
    prompt_copies: int = 1
    """adaptive: copies of a message that go in the datagrams right after its send, before an
    ack could say whether they are needed."""
    congested_copies: int = 0
    """adaptive, congested mode: most copies of a message after each (re)send (0: none)."""
    reorder_tolerance: float = 0.005
    """adaptive: a packet is judged lost once the peer acks one sent more than
    max(reorder_tolerance, 4 x RTTVAR) seconds after it; later arrivals count as reordering."""
    redundancy_budget: int = 1024
    """Bytes of piggybacked copies per datagram."""

    sent_packet_buffer: int = 256
    received_packet_window: int = 256
    sent_unit_capacity: int = 4096
    max_datagrams_per_flush: int = 64
    """Per peer per datagrams_to_send() call: keeps one busy peer from starving the rest."""
    seed: Optional[int] = None
    """Seed for connect ids, session ids, the cookie key and path challenges; None uses the OS
    random source."""

    token_keys: Optional[Mapping[int, bytes]] = None
    """Server: key id -> 32-byte key that opens connect tokens. None is open mode (no tokens,
    no encryption); otherwise every connection needs a valid, unused token."""
    encrypt_packets: bool = True
    """Server, token mode: protect DATA and DISCONNECT with the token's session keys (the client
    follows what the server's ACCEPT says). False: tokens authenticate the handshake only."""
    handshake_rate: Optional[float] = 100.0
    """Handshake packets (CONNECT_REQUEST, CONNECT_RESPONSE) accepted per second per source IP;
    None: unlimited. A client sends about 10 per second while it retries."""
    handshake_burst: int = 200
    """Handshake packets a source IP may send at once before handshake_rate applies."""
    handshake_sources: int = 16384
    """Source IPs whose handshake budget is remembered; the least recently seen is forgotten."""
    handshake_budget: Optional[float] = 20000.0
    """Server: handshake packets answered per second over all sources together (CHALLENGEs and
    REFUSEs to CONNECT_REQUESTs, cookie-verified CONNECT_RESPONSEs); None: unlimited. Bounds the
    CPU a flood of forged handshakes from random sources can take from established sessions."""
    path_challenge_budget: int = 1024
    """Bytes of PATH_CHALLENGE we send to a peer's unvalidated new address."""
    max_sessions_per_source: int = 0
    """Server, open mode only: connected peers at once from one source (an IPv4 address, an
    IPv6 /64; relay_core.sources); further connects from it are refused with
    ``source_session_limit``, and a peer does not move to a source already at the limit. 0:
    unlimited. Token mode ignores it: tokens authenticate, and a carrier-grade NAT may put
    thousands of players behind one address."""

    def validate(self) -> "EndpointConfig":
        def bad(name: str, allowed: str) -> ConfigError:
            return ConfigError(f"{name}={getattr(self, name)!r}: {allowed}")

        if not self.channels or len(self.channels) > 32:
            raise ConfigError(f"channels: 1..32 channels, got {len(self.channels)}")
        for index, channel in enumerate(self.channels):
            if not isinstance(channel, ChannelConfig):
                raise ConfigError(f"channels[{index}]: expected ChannelConfig, got {channel!r}")
            channel.validate(index)
        if not 576 <= self.mtu <= 16384:
            raise bad("mtu", "576..16384 bytes")
        if self.max_peers < 1:
            raise bad("max_peers", "at least 1")
        for name in ("rto_initial", "rto_min", "rto_max", "rto_limit", "peer_timeout",
                     "heartbeat_interval", "connect_timeout", "connect_resend_interval",
                     "cookie_lifetime", "send_rate", "congestion_delay", "congestion_hold",
                     "min_rtt_window"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if self.ack_delay < 0:
            raise bad("ack_delay", "must be >= 0")
        if self.rto_min > self.rto_max:
            raise bad("rto_min", f"must not exceed rto_max={self.rto_max}")
        if self.heartbeat_interval >= self.peer_timeout:
            raise bad("heartbeat_interval", f"must be below peer_timeout={self.peer_timeout}")
        if not 1 <= self.max_resends <= 10000:
            raise bad("max_resends", "1..10000")
        # Bounds on fragment and slice counts hold in encrypted sessions too, whose datagrams
        # carry TAG_BYTES fewer bytes of records.
        if not 1 <= self.max_message_size <= 255 * (self.fragment_size - TAG_BYTES):
            raise bad("max_message_size", f"1..{255 * (self.fragment_size - TAG_BYTES)} "
                                          "(255 fragments at this mtu, less the AEAD tag)")
        if self.max_fragments_in_flight < 255:
            raise bad("max_fragments_in_flight", "at least 255 (one largest message)")
        if self.reassembly_limit < self.max_message_size:
            raise bad("reassembly_limit", f"at least max_message_size={self.max_message_size}")
        if self.receive_memory_limit < max(self.reassembly_limit, self.max_block_size):
            raise bad("receive_memory_limit", "at least reassembly_limit and max_block_size")
        largest_slice = self.mtu - DATA_HEADER_BYTES - SLICE_OVERHEAD_BYTES
        if self.block_slice_size is not None and not 64 <= self.block_slice_size <= largest_slice:
            raise bad("block_slice_size", f"64..{largest_slice} at this mtu")
        if not 1 <= self.block_window <= 512:
            raise bad("block_window", "1..512 slices")
        largest_block = min(65535 * self.session_slice_size(TAG_BYTES), 2**32 - 1)
        if not 1 <= self.max_block_size <= largest_block:
            raise bad("max_block_size", f"1..{largest_block} bytes (65535 slices)")
        if self.block_memory_limit < self.max_block_size:
            raise bad("block_memory_limit", f"at least max_block_size={self.max_block_size}")
        if self.max_queued_blocks < 1:
            raise bad("max_queued_blocks", "at least 1")
        if self.redundancy_policy not in REDUNDANCY_POLICIES:
            raise bad("redundancy_policy", f"one of {', '.join(REDUNDANCY_POLICIES)}")
        if not 1 <= self.redundancy_copies <= 16:
            raise bad("redundancy_copies", "1..16 copies per message")
        if not 0 <= self.redundancy_copy_wait <= 4:
            raise bad("redundancy_copy_wait", "0..4 (SRTTs)")
        if not 1 <= self.redundancy_loss_memory <= 65535:
            raise bad("redundancy_loss_memory", "1..65535 packets")
        if not 0 <= self.reorder_tolerance <= 1.0:
            raise bad("reorder_tolerance", "0..1 seconds")
        if self.redundancy_budget < 0:
            raise bad("redundancy_budget", "must be >= 0 (copies never exceed the room left in a datagram)")
        if not 0 < self.burst_threshold < 1:
            raise bad("burst_threshold", "above 0 and below 1 (a probability)")
        if not 1 <= self.prompt_copies <= 16:
            raise bad("prompt_copies", "1..16 copies per message")
        if not 0 <= self.congested_copies <= 16:
            raise bad("congested_copies", "0..16 copies per message")
        for name in ("sent_packet_buffer", "received_packet_window"):
            value = getattr(self, name)
            if not 64 <= value <= 32768 or value & (value - 1):
                raise bad(name, "a power of two in 64..32768")
        if not 256 <= self.sent_unit_capacity <= 1 << 20 or self.sent_unit_capacity & (self.sent_unit_capacity - 1):
            raise bad("sent_unit_capacity", "a power of two in 256..1048576")
        if self.max_datagrams_per_flush < 1:
            raise bad("max_datagrams_per_flush", "at least 1")
        if self.token_keys is not None:
            if not isinstance(self.token_keys, Mapping) or not self.token_keys:
                raise bad("token_keys", "None (open mode) or a non-empty mapping key id -> 32-byte key")
            for key_id, key in self.token_keys.items():
                if not isinstance(key_id, int) or isinstance(key_id, bool) or not 0 <= key_id <= _MAX_KEY_ID:
                    raise ConfigError(f"token_keys: key id {key_id!r} is not an integer 0..{_MAX_KEY_ID}")
                if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_SIZE:
                    raise ConfigError(f"token_keys[{key_id}]: must be {KEY_SIZE} bytes "
                                      f"(relay_core.token.generate_key())")
            if not self.accept_connections:
                raise bad("token_keys", "only a server (accept_connections=True) opens tokens")
        if not isinstance(self.encrypt_packets, bool):
            raise bad("encrypt_packets", "True or False")
        if self.handshake_rate is not None and not (0 < self.handshake_rate < float("inf")):
            raise bad("handshake_rate", "None (unlimited) or a finite number > 0 per second")
        if self.handshake_burst < 1:
            raise bad("handshake_burst", "at least 1 packet")
        if self.handshake_sources < 1:
            raise bad("handshake_sources", "at least 1")
        if self.handshake_budget is not None and not (1.0 <= self.handshake_budget < float("inf")):
            raise bad("handshake_budget", "None (unlimited) or a finite number >= 1 per second")
        if self.path_challenge_budget < 0:
            raise bad("path_challenge_budget", "must be >= 0 bytes")
        if self.max_sessions_per_source < 0:
            raise bad("max_sessions_per_source", "must be >= 0 (0: unlimited)")
        return self

    @property
    def fragment_size(self) -> int:
        """Payload bytes per fragment: what is left of one datagram after the headers."""
        return self.mtu - DATA_HEADER_BYTES - FRAGMENT_OVERHEAD_BYTES

    @property
    def slice_size(self) -> int:
        """Block slice size in use (block_slice_size, or its default for this mtu)."""
        if self.block_slice_size is not None:
            return self.block_slice_size
        return min(1024, self.mtu - DATA_HEADER_BYTES - SLICE_OVERHEAD_BYTES)

    def session_slice_size(self, reserve: int) -> int:
        """Slice size of a session whose datagrams keep ``reserve`` bytes for the AEAD tag."""
        return min(self.slice_size, self.mtu - DATA_HEADER_BYTES - SLICE_OVERHEAD_BYTES - reserve)

    @property
    def max_whole_message(self) -> int:
        """Largest payload sent as one MESSAGE record; unreliable messages may not exceed it."""
        return min(self.mtu - DATA_HEADER_BYTES - MESSAGE_OVERHEAD_BYTES, MAX_RECORD_LENGTH)

    def replace(self, **changes) -> "EndpointConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return EndpointConfig(**values)
