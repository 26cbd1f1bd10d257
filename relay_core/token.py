"""Connect tokens: a game backend vouches for one player joining one room, once, until expiry.

The backend and the relay share secret keys, named by a key id so they can be rotated. The
backend mints a token per join and gives the game client its text form (``encode()``). The
client keeps the two session keys and sends only ``private`` to the relay, inside its
handshake; the relay opens it with the key named in its header (``open_token``) and learns who
the player is and which keys protect the session. Layout: docs/PROTOCOL.md, "Connect tokens".

The private part is ChaCha20-Poly1305 (relay_core.aead): the header (version, key id, expiry)
travels in clear as associated data, so a relay can read which key to use and the expiry cannot
be changed without breaking the tag; everything else is encrypted.
"""
from __future__ import annotations

import base64
import os
import struct
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from relay_core.aead import AeadError, open_, seal

TOKEN_VERSION = 1
KEY_SIZE = 32
NONCE_SIZE = 12
TAG_SIZE = 16
TOKEN_ID_SIZE = 16
MAX_NAME_BYTES = 64
"""Room and player names, UTF-8 encoded."""
MAX_USER_DATA = 256
MAX_KEY_ID = 0xFFFFFFFF

# version u8, key_id u32, expires u64 (unix milliseconds)
_HEADER = struct.Struct("<BIQ")
HEADER_SIZE = _HEADER.size                         # 13
_FIXED_PLAINTEXT = TOKEN_ID_SIZE + 2 * KEY_SIZE + 1 + 1 + 2
MIN_PRIVATE_SIZE = HEADER_SIZE + NONCE_SIZE + _FIXED_PLAINTEXT + 2 + TAG_SIZE
MAX_PRIVATE_SIZE = (HEADER_SIZE + NONCE_SIZE + _FIXED_PLAINTEXT + 2 * MAX_NAME_BYTES
                    + MAX_USER_DATA + TAG_SIZE)   # 509: fits one handshake datagram

# The public (text) form: version u8, then the session keys and the private part, so that a
# client needs nothing else to connect. Room, player and expiry are read from the private
# part's header and a clear copy; the relay trusts only what it decrypts.
_TEXT_PREFIX = "rt1."


class TokenError(ValueError):
    """A token cannot be used; ``reason`` is ``token_invalid`` or ``token_expired``."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What the relay learns from a valid token."""

    room: str
    player: str
    expires: float
    """Unix time after which the token is refused."""
    token_id: bytes
    """16 random bytes, unique per mint: the single-use check keys on it."""
    user_data: bytes
    """Opaque bytes from the backend (at most MAX_USER_DATA)."""
    client_key: bytes
    """Protects client -> server packets."""
    server_key: bytes
    """Protects server -> client packets."""


@dataclass(frozen=True, slots=True)
class ConnectToken:
    """A minted token as the backend hands it to a game client."""

    private: bytes
    """Opaque to the client: sent in the handshake, opened by the relay."""
    client_key: bytes
    server_key: bytes
    room: str
    player: str
    expires: float

    def encode(self) -> str:
        """URL-safe text form, to give to the game client."""
        room, player = self.room.encode(), self.player.encode()
        body = (self.client_key + self.server_key + bytes([len(room)]) + room
                + bytes([len(player)]) + player + self.private)
        return _TEXT_PREFIX + base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, text: str) -> "ConnectToken":
        """Inverse of encode(); raises TokenError("token_invalid") for anything else."""
        text = text.strip() if isinstance(text, str) else text
        if not isinstance(text, str) or not text.startswith(_TEXT_PREFIX):
            raise TokenError("token_invalid", f"not a connect token (expected {_TEXT_PREFIX!r} prefix)")
        encoded = text[len(_TEXT_PREFIX):]
        try:
            body = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
        except (ValueError, TypeError) as exc:
            raise TokenError("token_invalid", "not base64url text") from exc
        try:
            pos = 2 * KEY_SIZE
            client_key, server_key = body[:KEY_SIZE], body[KEY_SIZE:pos]
            room, pos = _read_name(body, pos)
            player, pos = _read_name(body, pos)
            private = body[pos:]
            if len(server_key) != KEY_SIZE or not MIN_PRIVATE_SIZE <= len(private) <= MAX_PRIVATE_SIZE:
                raise ValueError("wrong length")
            version, _key_id, expires_ms = _HEADER.unpack_from(private)
            if version != TOKEN_VERSION:
                raise ValueError(f"token version {version}")
        except (ValueError, IndexError, struct.error) as exc:
            raise TokenError("token_invalid", f"malformed token ({exc})") from exc
        return cls(private, client_key, server_key, room, player, expires_ms / 1000.0)


def _read_name(body: bytes, pos: int) -> tuple[str, int]:
    length = body[pos]
    end = pos + 1 + length
    if length > MAX_NAME_BYTES or end > len(body):
        raise ValueError("name out of range")
    return body[pos + 1:end].decode("utf-8"), end


def generate_key() -> bytes:
    """A new random 32-byte server key."""
    return os.urandom(KEY_SIZE)


def _check_key(key: bytes, key_id: int) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_SIZE:
        raise ValueError(f"key {key_id}: must be {KEY_SIZE} bytes")
    if not 0 <= key_id <= MAX_KEY_ID:
        raise ValueError(f"key_id={key_id}: 0..{MAX_KEY_ID}")


def _encode_name(what: str, value: str) -> bytes:
    encoded = value.encode("utf-8")
    if not 1 <= len(encoded) <= MAX_NAME_BYTES:
        raise ValueError(f"{what}={value!r}: 1..{MAX_NAME_BYTES} bytes of UTF-8")
    return encoded


def mint_token(key: bytes, key_id: int, room: str, player: str, ttl: float, *,
               now: Optional[float] = None, user_data: bytes = b"",
               random_bytes: Optional[Callable[[int], bytes]] = None) -> ConnectToken:
    """Mint a single-use token for ``player`` to join ``room``, valid for ``ttl`` seconds.

    ``now`` is unix time (default time.time()); ``random_bytes(n)`` replaces os.urandom for the
    nonce, token id and session keys (deterministic test vectors only).
    """
    _check_key(key, key_id)
    room_bytes, player_bytes = _encode_name("room", room), _encode_name("player", player)
    user_data = bytes(user_data)
    if len(user_data) > MAX_USER_DATA:
        raise ValueError(f"user_data of {len(user_data)} bytes: at most {MAX_USER_DATA}")
    if not ttl > 0:
        raise ValueError(f"ttl={ttl!r}: must be > 0 seconds")
    random_bytes = random_bytes or os.urandom
    expires_ms = int(((time.time() if now is None else now) + ttl) * 1000)
    nonce = random_bytes(NONCE_SIZE)
    token_id = random_bytes(TOKEN_ID_SIZE)
    client_key = random_bytes(KEY_SIZE)
    server_key = random_bytes(KEY_SIZE)
    header = _HEADER.pack(TOKEN_VERSION, key_id, expires_ms)
    plaintext = b"".join((
        token_id, client_key, server_key,
        bytes([len(room_bytes)]), room_bytes, bytes([len(player_bytes)]), player_bytes,
        struct.pack("<H", len(user_data)), user_data,
    ))
    private = header + nonce + seal(key, nonce, plaintext, header)
    return ConnectToken(private, client_key, server_key, room, player, expires_ms / 1000.0)


def token_key_id(private: bytes) -> Optional[int]:
    """The key id in a private part's clear header, or None if it has no valid header."""
    if len(private) < HEADER_SIZE or private[0] != TOKEN_VERSION:
        return None
    return _HEADER.unpack_from(private)[1]


def open_token(keys: Mapping[int, bytes], private: bytes, unix_now: float) -> TokenClaims:
    """Decrypt and check a token's private part with the key its header names.

    Raises TokenError("token_invalid") for an unknown key id, a bad tag (any byte changed) or a
    malformed layout, and TokenError("token_expired") once ``unix_now`` reaches its expiry.
    """
    private = bytes(private)
    if not MIN_PRIVATE_SIZE <= len(private) <= MAX_PRIVATE_SIZE:
        raise TokenError("token_invalid", f"{len(private)} bytes")
    version, key_id, expires_ms = _HEADER.unpack_from(private)
    if version != TOKEN_VERSION:
        raise TokenError("token_invalid", f"version {version}")
    key = keys.get(key_id)
    if key is None:
        raise TokenError("token_invalid", f"unknown key id {key_id}")
    header = private[:HEADER_SIZE]
    nonce = private[HEADER_SIZE:HEADER_SIZE + NONCE_SIZE]
    try:
        plaintext = open_(key, nonce, private[HEADER_SIZE + NONCE_SIZE:], header)
    except AeadError:
        raise TokenError("token_invalid", "authentication failed") from None
    # The layout below was written by whoever holds the key, but is still checked: a key
    # shared with a buggy backend must not crash the relay.
    try:
        token_id = plaintext[:TOKEN_ID_SIZE]
        pos = TOKEN_ID_SIZE
        client_key = plaintext[pos:pos + KEY_SIZE]
        server_key = plaintext[pos + KEY_SIZE:pos + 2 * KEY_SIZE]
        pos += 2 * KEY_SIZE
        room, pos = _read_name(plaintext, pos)
        player, pos = _read_name(plaintext, pos)
        (length,) = struct.unpack_from("<H", plaintext, pos)
        if length > MAX_USER_DATA:
            raise ValueError(f"user_data of {length} bytes")
        user_data = plaintext[pos + 2:pos + 2 + length]
        if len(user_data) != length or pos + 2 + length != len(plaintext) or not room or not player:
            raise ValueError("bad layout")
    except (ValueError, IndexError, struct.error) as exc:
        raise TokenError("token_invalid", f"malformed contents ({exc})") from exc
    expires = expires_ms / 1000.0
    if unix_now >= expires:
        raise TokenError("token_expired", f"expired {unix_now - expires:.1f} s ago")
    return TokenClaims(room, player, expires, token_id, user_data, client_key, server_key)
