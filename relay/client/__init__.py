"""The asyncio client SDK: join a room, send inputs, take frames in order (sdk.py).

Games in other languages use the C library and its bindings (clients/); this package is for
Python programs, bots and tools.
"""
from relay.client.sdk import (
    HANDSHAKE_REFUSALS, ClientStats, InputDelayAdvice, RelayClient, RelayError, client_config,
    replay_frames,
)

__all__ = ["HANDSHAKE_REFUSALS", "ClientStats", "InputDelayAdvice", "RelayClient", "RelayError",
           "client_config", "replay_frames"]
