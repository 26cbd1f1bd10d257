"""Connect tokens at their limits (docs/PROTOCOL.md 8.7.1): extreme key ids, the largest and
smallest token, and authentic tokens (correct tag) whose plaintext is malformed, which the relay
must refuse as token_invalid rather than trust or crash on (issue #24)."""
from __future__ import annotations

import base64
import os
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from relay_core.token import (
    MAX_PRIVATE_SIZE, MIN_PRIVATE_SIZE, ConnectToken, TokenError, mint_token, open_token,
    token_key_id,
)

NOW = 1_800_000_000.0
KEY = bytes(range(32))
KEY_ID = 9


def invalid(call, *args) -> TokenError:
    with pytest.raises(TokenError) as caught:
        call(*args)
    assert caught.value.reason == "token_invalid"
    return caught.value


# -- key ids ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key_id", [0, 0xFFFFFFFF])
def test_key_ids_0_and_2_32_minus_1_round_trip(key_id):
    token = mint_token(KEY, key_id, "room", "p", 30.0, now=NOW)
    assert token_key_id(token.private) == key_id
    claims = open_token({key_id: KEY}, token.private, NOW)
    assert (claims.room, claims.player) == ("room", "p")
    assert ConnectToken.decode(token.encode()) == token
    # another id (the neighbour, wrapping) does not open it
    invalid(open_token, {key_id ^ 1: KEY}, token.private, NOW)


# -- sizes -----------------------------------------------------------------------------------

def test_largest_token_round_trips_through_its_text_form_and_is_509_bytes():
    room, player = "r" * 64, "é" * 32                  # 64 bytes of UTF-8 each
    user_data = bytes(range(256))
    token = mint_token(KEY, KEY_ID, room, player, 30.0, now=NOW, user_data=user_data)
    assert len(token.private) == 509 == MAX_PRIVATE_SIZE
    decoded = ConnectToken.decode(token.encode())
    assert decoded == token
    claims = open_token({KEY_ID: KEY}, decoded.private, NOW)
    assert (claims.room, claims.player, claims.user_data) == (room, player, user_data)
    assert (claims.client_key, claims.server_key) == (token.client_key, token.server_key)


def test_smallest_token_is_127_bytes_and_round_trips():
    token = mint_token(KEY, KEY_ID, "r", "p", 30.0, now=NOW)
    assert len(token.private) == 127 == MIN_PRIVATE_SIZE
    assert ConnectToken.decode(token.encode()) == token
    assert open_token({KEY_ID: KEY}, token.private, NOW).user_data == b""


def _text(client_key: bytes, server_key: bytes, room: bytes, player: bytes, private: bytes) -> str:
    body = client_key + server_key + bytes([len(room)]) + room + bytes([len(player)]) + player
    return "rt1." + base64.urlsafe_b64encode(body + private).rstrip(b"=").decode()


def test_text_form_with_a_private_part_one_byte_too_long_or_short_is_refused():
    token = mint_token(KEY, KEY_ID, "r" * 64, "p" * 64, 30.0, now=NOW, user_data=bytes(256))
    parts = (token.client_key, token.server_key, token.room.encode(), token.player.encode())
    assert ConnectToken.decode(_text(*parts, token.private)) == token
    invalid(ConnectToken.decode, _text(*parts, token.private + b"\x00"))
    small = mint_token(KEY, KEY_ID, "r", "p", 30.0, now=NOW)
    parts = (small.client_key, small.server_key, b"r", b"p")
    assert ConnectToken.decode(_text(*parts, small.private)) == small
    invalid(ConnectToken.decode, _text(*parts, small.private[:-1]))


def test_text_form_with_a_clear_name_over_64_bytes_is_refused():
    token = mint_token(KEY, KEY_ID, "r", "p", 30.0, now=NOW)
    invalid(ConnectToken.decode,
            _text(token.client_key, token.server_key, b"r" * 65, b"p", token.private))


def test_private_part_one_byte_past_509_or_short_of_127_is_refused_by_open():
    big = mint_token(KEY, KEY_ID, "r" * 64, "p" * 64, 30.0, now=NOW, user_data=bytes(256))
    invalid(open_token, {KEY_ID: KEY}, big.private + b"\x00", NOW)
    small = mint_token(KEY, KEY_ID, "r", "p", 30.0, now=NOW)
    invalid(open_token, {KEY_ID: KEY}, small.private[:-1], NOW)


# -- the text prefix -------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["rt2.", "rt0.", "RT1.", "rt1", "rt1:", "xrt1.", "", "t1."])
def test_a_wrong_prefix_on_a_valid_body_is_refused(prefix):
    text = mint_token(KEY, KEY_ID, "room", "p", 30.0, now=NOW).encode()
    assert text.startswith("rt1.")
    invalid(ConnectToken.decode, prefix + text[len("rt1."):])


# -- authentic but malformed plaintexts ------------------------------------------------------

def seal(plaintext: bytes, key_id: int = KEY_ID, expires_ms: int = int((NOW + 30) * 1000),
         version: int = 1) -> bytes:
    """A private part sealed exactly as a backend does (docs/PROTOCOL.md 8.7.1), around any
    plaintext: the tag is correct, so only the layout checks can refuse it."""
    header = struct.pack("<BIQ", version, key_id, expires_ms)
    nonce = os.urandom(12)
    return header + nonce + ChaCha20Poly1305(KEY).encrypt(nonce, plaintext, header)


def plaintext(room: bytes = b"room", player: bytes = b"p", user_data: bytes = b"",
              room_length: int | None = None, player_length: int | None = None,
              user_data_length: int | None = None, tail: bytes = b"") -> bytes:
    keys = bytes(16) + bytes(range(32)) + bytes(range(32, 64))
    return (keys
            + bytes([len(room) if room_length is None else room_length]) + room
            + bytes([len(player) if player_length is None else player_length]) + player
            + struct.pack("<H", len(user_data) if user_data_length is None else user_data_length)
            + user_data + tail)


def test_a_well_formed_sealed_plaintext_opens():
    # the control for the cases below: this test's sealing is the real format
    claims = open_token({KEY_ID: KEY}, seal(plaintext(user_data=b"ud")), NOW)
    assert (claims.room, claims.player, claims.user_data) == ("room", "p", b"ud")
    claims = open_token({KEY_ID: KEY}, seal(plaintext(b"r" * 64, b"p" * 64, bytes(256))), NOW)
    assert (claims.room, claims.player, len(claims.user_data)) == ("r" * 64, "p" * 64, 256)


PAD = bytes(40)   # keeps every case within 127..509 bytes, so the layout checks are reached

MALFORMED = {
    "room_length_0": plaintext(room=b"", user_data=PAD),
    "player_length_0": plaintext(player=b"", user_data=PAD),
    "room_length_65": plaintext(room=b"r" * 65),
    "player_length_65": plaintext(player=b"p" * 65),
    "room_length_255": plaintext(room=b"r" * 255),
    "room_runs_past_the_end": plaintext()[:80] + bytes([64]) + b"r" * 10,
    "player_runs_past_the_end": plaintext(room=b"r" * 10)[:80 + 11] + bytes([64]) + b"p" * 10,
    "user_data_runs_past_the_end": plaintext(user_data=PAD, user_data_length=len(PAD) + 1),
    "user_data_length_missing": plaintext(room=b"r" * 64, player=b"p" * 10)[:-2],
    "bytes_after_user_data": plaintext(user_data=PAD, tail=b"\x00"),
    "user_data_over_256_bytes": plaintext(room=b"r", player=b"p", user_data=bytes(257)),
    "room_not_utf8": plaintext(room=b"\xff\xfe", user_data=PAD),
    "player_not_utf8": plaintext(player=b"\xc3", user_data=PAD),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_an_authentic_token_with_a_malformed_plaintext_is_invalid(case):
    private = seal(MALFORMED[case])
    assert MIN_PRIVATE_SIZE <= len(private) <= MAX_PRIVATE_SIZE, "reaches the layout checks"
    error = invalid(open_token, {KEY_ID: KEY}, private, NOW)
    assert "malformed" in str(error)


def test_an_authentic_token_of_another_version_is_invalid():
    invalid(open_token, {KEY_ID: KEY}, seal(plaintext(), version=2), NOW)


def test_an_authentic_token_expires_at_its_expiry_to_the_millisecond():
    private = seal(plaintext(), expires_ms=int(NOW * 1000) + 1)
    assert open_token({KEY_ID: KEY}, private, NOW).expires == NOW + 0.001
    with pytest.raises(TokenError) as caught:
        open_token({KEY_ID: KEY}, private, NOW + 0.001)
    assert caught.value.reason == "token_expired"


# -- edges found by mutation testing (tools/mutation.py) --------------------------------------

def test_a_minted_token_keeps_its_expiry_to_the_millisecond():
    token = mint_token(KEY, KEY_ID, "r", "p", ttl=1.5, now=NOW)
    assert token.expires == NOW + 1.5
    assert ConnectToken.decode(token.encode()).expires == NOW + 1.5


def test_a_key_of_32_characters_that_is_not_bytes_is_refused():
    with pytest.raises(ValueError, match="must be 32 bytes"):
        mint_token("k" * 32, KEY_ID, "r", "p", ttl=60, now=NOW)


@pytest.mark.parametrize("version", [0, 2, 255])
def test_token_key_id_is_none_for_a_header_of_another_version(version):
    private = mint_token(KEY, KEY_ID, "r", "p", ttl=60, now=NOW).private
    assert token_key_id(private) == KEY_ID
    assert token_key_id(bytes([version]) + private[1:]) is None


@pytest.mark.parametrize("length", [0, 1, 12])
def test_token_key_id_is_none_for_a_header_shorter_than_13_bytes(length):
    private = mint_token(KEY, KEY_ID, "r", "p", ttl=60, now=NOW).private
    assert token_key_id(private[:length]) is None


@pytest.mark.parametrize("user_data", [b"", b"\x01", b"ab", bytes(range(200))])
def test_user_data_of_each_small_length_round_trips(user_data):
    private = mint_token(KEY, KEY_ID, "r", "p", ttl=60, now=NOW, user_data=user_data).private
    assert open_token({KEY_ID: KEY}, private, NOW).user_data == user_data
