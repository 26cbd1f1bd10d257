"""Connect tokens (relay_core.token): mint, text form, open, and every way a token is refused."""
from __future__ import annotations

import pytest

from relay_core.token import (
    MAX_NAME_BYTES, MAX_PRIVATE_SIZE, MAX_USER_DATA, ConnectToken, TokenClaims, TokenError,
    generate_key, mint_token, open_token, token_key_id,
)

NOW = 1_800_000_000.0
KEY = bytes(range(32))


def _mint(**overrides):
    args = dict(key=KEY, key_id=7, room="arena-1", player="alice", ttl=30.0, now=NOW,
                user_data=b"\x01team=red")
    args.update(overrides)
    return mint_token(args.pop("key"), args.pop("key_id"), args.pop("room"), args.pop("player"),
                      args.pop("ttl"), **args)


def test_generate_key_is_32_random_bytes():
    a, b = generate_key(), generate_key()
    assert len(a) == len(b) == 32 and a != b


def test_open_returns_what_was_minted():
    token = _mint()
    claims = open_token({7: KEY}, token.private, NOW + 1)
    assert isinstance(claims, TokenClaims)
    assert (claims.room, claims.player, claims.user_data) == ("arena-1", "alice", b"\x01team=red")
    assert claims.expires == token.expires == NOW + 30.0
    assert claims.client_key == token.client_key and claims.server_key == token.server_key
    assert len(claims.client_key) == len(claims.server_key) == 32
    assert claims.client_key != claims.server_key
    assert len(claims.token_id) == 16


def test_each_mint_has_its_own_id_and_keys():
    a, b = _mint(), _mint()
    ca, cb = open_token({7: KEY}, a.private, NOW), open_token({7: KEY}, b.private, NOW)
    assert ca.token_id != cb.token_id and ca.client_key != cb.client_key and a.private != b.private


def test_unicode_names_and_limits():
    token = _mint(room="é" * 32, player="p" * MAX_NAME_BYTES, user_data=bytes(MAX_USER_DATA))
    claims = open_token({7: KEY}, token.private, NOW)
    assert claims.room == "é" * 32 and claims.player == "p" * MAX_NAME_BYTES
    assert len(token.private) == MAX_PRIVATE_SIZE


@pytest.mark.parametrize("overrides,field", [
    (dict(room=""), "room"), (dict(room="r" * (MAX_NAME_BYTES + 1)), "room"),
    (dict(room="é" * 33), "room"), (dict(player=""), "player"),
    (dict(player="p" * (MAX_NAME_BYTES + 1)), "player"),
    (dict(user_data=bytes(MAX_USER_DATA + 1)), "user_data"), (dict(ttl=0), "ttl"),
    (dict(ttl=-5), "ttl"), (dict(key=b"short"), "key"), (dict(key_id=-1), "key_id"),
    (dict(key_id=2**32), "key_id"),
])
def test_mint_rejects_out_of_range_input(overrides, field):
    with pytest.raises(ValueError, match=field):
        _mint(**overrides)


def test_wrong_key_id_is_invalid():
    token = _mint()
    with pytest.raises(TokenError) as caught:
        open_token({8: KEY}, token.private, NOW)
    assert caught.value.reason == "token_invalid"


def test_right_id_wrong_key_is_invalid():
    with pytest.raises(TokenError) as caught:
        open_token({7: generate_key()}, _mint().private, NOW)
    assert caught.value.reason == "token_invalid"


def test_every_tampered_byte_is_invalid():
    private = _mint().private
    for i in range(len(private)):
        tampered = bytearray(private)
        tampered[i] ^= 0x40
        with pytest.raises(TokenError) as caught:
            open_token({7: KEY, 0x40000007: KEY}, bytes(tampered), NOW)
        assert caught.value.reason == "token_invalid", f"byte {i}"


def test_truncated_or_extended_is_invalid():
    private = _mint().private
    for bad in (b"", private[:12], private[:-1], private + b"\0", bytes(600)):
        with pytest.raises(TokenError) as caught:
            open_token({7: KEY}, bad, NOW)
        assert caught.value.reason == "token_invalid"


def test_expired_token():
    token = _mint(ttl=10.0)
    assert open_token({7: KEY}, token.private, NOW + 9.999).player == "alice"
    for later in (NOW + 10.0, NOW + 3600):
        with pytest.raises(TokenError) as caught:
            open_token({7: KEY}, token.private, later)
        assert caught.value.reason == "token_expired"


def test_key_rotation_opens_tokens_of_every_listed_key():
    old, new = generate_key(), generate_key()
    keys = {1: old, 2: new}
    a = mint_token(old, 1, "r", "a", 60, now=NOW)
    b = mint_token(new, 2, "r", "b", 60, now=NOW)
    assert open_token(keys, a.private, NOW).player == "a"
    assert open_token(keys, b.private, NOW).player == "b"
    assert token_key_id(a.private) == 1 and token_key_id(b.private) == 2
    with pytest.raises(TokenError):
        open_token({2: new}, a.private, NOW)         # key 1 retired


def test_deterministic_with_injected_randomness():
    counter = iter(range(1000))

    def fake_random(n):
        return bytes(next(counter) & 0xFF for _ in range(n))

    a = _mint(random_bytes=fake_random)
    counter = iter(range(1000))
    b = _mint(random_bytes=fake_random)
    assert a == b
    assert open_token({7: KEY}, a.private, NOW).client_key == bytes(range(28, 60))


def test_text_form_round_trips():
    token = _mint()
    text = token.encode()
    assert text.startswith("rt1.") and text.isascii()
    assert all(c.isalnum() or c in "-_." for c in text), "URL-safe"
    assert ConnectToken.decode(text) == token
    assert ConnectToken.decode(f"  {text}\n") == token          # pasted with whitespace


@pytest.mark.parametrize("text", ["", "hello", "rt1.", "rt1.!!!!", "rt2.AAAA", "rt1." + "A" * 40,
                                  "rt1." + "_" * 1000])
def test_decode_garbage_raises_token_error(text):
    with pytest.raises(TokenError) as caught:
        ConnectToken.decode(text)
    assert caught.value.reason == "token_invalid"


def test_decode_of_a_truncated_text_fails_cleanly():
    text = _mint().encode()
    for cut in range(4, len(text), 7):
        try:
            token = ConnectToken.decode(text[:cut])
        except TokenError:
            continue
        # a cut that still parses must not open
        with pytest.raises(TokenError):
            open_token({7: KEY}, token.private, NOW)
