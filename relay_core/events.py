"""Events the endpoint reports; drained with ``Endpoint.next_event()``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Event:
    """Base class of every endpoint event.

    Events are created per delivered message, so they are plain slotted dataclasses: a frozen
    dataclass costs an object.__setattr__ call per field on this hot path.
    """

    __slots__ = ()


@dataclass(slots=True)
class PeerConnected(Event):
    peer_id: int
    """Handle used with send(), disconnect() and peer_stats()."""
    address: Any
    """The peer's transport address as given to receive() or connect()."""
    claims: Any = None
    """Server in token mode: the TokenClaims of the token the peer connected with (room,
    player, user_data, ...). None on the client and in open mode."""


@dataclass(slots=True)
class PeerDisconnected(Event):
    peer_id: int
    address: Any
    reason: str
    """Why: ``timeout``, ``connect_timeout``, ``resend_limit``, ``replaced``, ``refused:<code>``,
    ``remote:<code>`` (the other side disconnected) or ``local:<code>`` (we did)."""


@dataclass(slots=True)
class PeerMigrated(Event):
    peer_id: int
    old_address: Any
    new_address: Any
    """The peer proved it receives at this address (PATH_RESPONSE); it is used from now on."""


@dataclass(slots=True)
class MessageReceived(Event):
    peer_id: int
    channel: int
    """Channel index as configured on both endpoints."""
    payload: bytes
    """The message exactly as the sender passed it to send()."""


@dataclass(slots=True)
class BlockReceived(Event):
    peer_id: int
    block_id: int
    """Blocks from one peer are numbered 0, 1, 2... (mod 65536) in the order they were sent."""
    data: bytes


@dataclass(slots=True)
class BlockDelivered(Event):
    peer_id: int
    block_id: int
    """The receiver has acknowledged every slice of this block."""


@dataclass(frozen=True, slots=True)
class PeerStats:
    """A snapshot of one connection's measurements (see docs/PROTOCOL.md, "Statistics")."""

    rtt: float
    """Smoothed round-trip time, seconds (0.0 before the first sample)."""
    rtt_variance: float
    rto: float
    """Current retransmission timeout for a first send, seconds."""
    loss: float
    """Estimated fraction of our packets the peer never acknowledged (EWMA)."""
    redundancy_mode: str
    """The redundancy controller's mode (docs/PROTOCOL.md 12.5): "clean", "lossy", "bursty" or
    "congested" under the `adaptive` policy; "always" under `always`."""
    burst_length: float
    """Mean run of lost datagrams the acks imply (1.0: losses independent of each other)."""
    min_rtt: float
    """The path's RTT floor: least sample of the last one or two windows, seconds (0.0: none)."""
    queue_delay: float
    """Smoothed RTT above that floor, seconds: the controller's congestion signal."""
    copying: bool
    """True while `redundant` channels write copies: always under the `always` policy, in every
    mode but "clean" under `adaptive`."""
    packets_sent: int
    packets_received: int
    bytes_sent: int
    bytes_received: int
    packets_acked: int
    packets_lost: int
    messages_sent: int
    messages_received: int
    resends: int
    """RTO expiries across all reliable messages."""
    spurious_resends: int
    """Resends that were not needed: the acknowledged datagram was sent before them (the message
    was only late, or its ack was lost). All of a message's resends when its first send got
    through; else its last one (a lower bound)."""
    redundant_bytes: int
    """Bytes of piggybacked copies of already-sent messages."""
    duplicate_messages: int
    block_slices_sent: int
    block_slices_resent: int
    queued_messages: int
    """Messages waiting to be sent or acknowledged, all channels."""
