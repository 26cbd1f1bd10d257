"""relay_core: the sans-I/O reliable-UDP protocol core of the relay, compiled with Cython.

No sockets, no clocks: feed datagrams and the current time to an Endpoint, send what it returns,
drain its events. The wire protocol is specified in docs/PROTOCOL.md.
"""
from relay_core.config import ChannelConfig, ConfigError, EndpointConfig, MODES
from relay_core.endpoint import Endpoint
from relay_core.peer import MessageSink
from relay_core.events import (
    BlockDelivered, BlockReceived, Event, MessageReceived, PeerConnected, PeerDisconnected, PeerMigrated,
    PeerStats,
)
from relay_core.token import ConnectToken, TokenClaims, TokenError, generate_key, mint_token, open_token
from relay_core.wire import DROP_REASONS, DecodeError, decode_packet, encode_packet

__all__ = [
    "BlockDelivered", "BlockReceived", "ChannelConfig", "ConfigError", "DROP_REASONS", "DecodeError",
    "Endpoint", "EndpointConfig", "Event", "MODES", "MessageReceived", "MessageSink", "PeerConnected",
    "PeerDisconnected", "PeerMigrated", "PeerStats", "decode_packet", "encode_packet",
    "ConnectToken", "TokenClaims", "TokenError", "generate_key", "mint_token", "open_token",
]
