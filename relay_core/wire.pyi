"""Python-visible API of relay_core.wire (compiled); the cdef codecs are C-only."""
from collections.abc import Mapping
from typing import Any

from typing_extensions import Buffer

DROP_REASONS: tuple[str, ...]
PACKET_TYPES: dict[int, str]
RECORD_KINDS: dict[int, str]
REASONS: dict[int, str]
REASON_CODES: dict[str, int]
DATA_HEADER_BYTES: int
MESSAGE_OVERHEAD_BYTES: int
FRAGMENT_OVERHEAD_BYTES: int
SLICE_OVERHEAD_BYTES: int
MAX_RECORD_LENGTH: int
TAG_BYTES: int

class DecodeError(ValueError):
    reason: str
    def __init__(self, reason: str) -> None: ...

def counter_from_seq(largest: int | None, seq: int) -> int: ...
def packet_nonce(packet_type: int, counter: int) -> bytes: ...
def seq_greater_than(a: int, b: int) -> bool: ...
def seq_distance(a: int, b: int) -> int: ...
def seal(key: bytes, packet_type: int, counter: int, header: Buffer, plaintext: Buffer) -> bytes: ...
def unseal(key: bytes, packet_type: int, counter: int, header: Buffer, sealed: Buffer) -> bytes: ...
def decode_packet(data: Buffer, key: bytes | None = None, counter: int | None = None) -> dict[str, Any]: ...
def encode_packet(packet: Mapping[str, Any], key: bytes | None = None, counter: int | None = None) -> bytes: ...
