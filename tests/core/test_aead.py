"""relay_core.aead (ChaCha20-Poly1305 IETF composed from libsodium's primitives, called from C)
against the declared test oracle, the ``cryptography`` package's ChaCha20Poly1305: the same bytes for every key, nonce,
plaintext and associated data, and refusal of anything altered. The cookie's keyed BLAKE2s
(written out in relay_core.aead) against hashlib.blake2s."""
import hashlib

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings, strategies as st

from relay_core import aead
from relay_core.aead import keyed_blake2s

keys = st.binary(min_size=32, max_size=32)
nonces = st.binary(min_size=12, max_size=12)


@settings(max_examples=300, deadline=None)
@given(key=keys, nonce=nonces, plaintext=st.binary(max_size=1500), ad=st.binary(max_size=64))
def test_seal_and_open_match_the_oracle(key, nonce, plaintext, ad):
    sealed = aead.seal(key, nonce, plaintext, ad)
    assert sealed == ChaCha20Poly1305(key).encrypt(nonce, plaintext, ad)
    assert len(sealed) == len(plaintext) + aead.TAG_SIZE
    assert aead.open_(key, nonce, sealed, ad) == plaintext
    # Buffers other than bytes are taken as they are.
    assert aead.open_(bytearray(key), memoryview(nonce), bytearray(sealed), memoryview(ad)) == plaintext


@settings(max_examples=200, deadline=None)
@given(key=keys, nonce=nonces, plaintext=st.binary(max_size=200), ad=st.binary(max_size=32),
       data=st.data())
def test_any_altered_byte_of_ciphertext_tag_or_associated_data_is_refused(key, nonce, plaintext, ad,
                                                                          data):
    sealed = bytearray(aead.seal(key, nonce, plaintext, ad))
    where = data.draw(st.sampled_from(["sealed", "ad", "nonce", "key"] if ad else ["sealed", "nonce", "key"]))
    target = {"sealed": sealed, "ad": bytearray(ad), "nonce": bytearray(nonce), "key": bytearray(key)}[where]
    index = data.draw(st.integers(0, len(target) - 1))
    target[index] ^= data.draw(st.integers(1, 255))
    altered = {"sealed": sealed, "ad": ad, "nonce": nonce, "key": key}
    altered[where] = target
    with pytest.raises(aead.AeadError):
        aead.open_(altered["key"], altered["nonce"], altered["sealed"], altered["ad"])
    with pytest.raises(InvalidTag):         # the oracle agrees
        ChaCha20Poly1305(bytes(altered["key"])).decrypt(bytes(altered["nonce"]), bytes(altered["sealed"]),
                                                         bytes(altered["ad"]))


# Both of the composition's paths and their edges: the keystream's rounding (to 256 up to 512
# bytes with the key block, then to 64), the one-pass limits (2 048 bytes of message, 64 of
# associated data) and the MAC's 16-byte padding on either side.
@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 191, 192, 193, 447, 448, 449, 960, 2047, 2048,
                                  2049, 5000])
@pytest.mark.parametrize("ad_size", [0, 1, 20, 63, 64, 65, 200])
def test_every_path_of_the_composition_matches_the_oracle(size, ad_size):
    key, nonce = bytes(range(32)), bytes(range(100, 112))
    plaintext, ad = bytes((7 * i) & 0xFF for i in range(size)), bytes((3 * i + 1) & 0xFF for i in range(ad_size))
    sealed = aead.seal(key, nonce, plaintext, ad)
    assert sealed == ChaCha20Poly1305(key).encrypt(nonce, plaintext, ad)
    assert aead.open_(key, nonce, sealed, ad) == plaintext
    for index in {0, len(sealed) // 2, len(sealed) - 1}:
        altered = bytearray(sealed)
        altered[index] ^= 0x80
        with pytest.raises(aead.AeadError):
            aead.open_(key, nonce, bytes(altered), ad)
    if ad:
        with pytest.raises(aead.AeadError):
            aead.open_(key, nonce, sealed, ad[:-1] + bytes([ad[-1] ^ 1]))


def test_sealed_data_shorter_than_a_tag_is_refused_not_read():
    for size in range(aead.TAG_SIZE):
        with pytest.raises(aead.AeadError):
            aead.open_(bytes(32), bytes(12), bytes(size))


@pytest.mark.parametrize("key, nonce", [(bytes(31), bytes(12)), (bytes(33), bytes(12)),
                                        (bytes(32), bytes(11)), (bytes(32), bytes(13))])
def test_keys_and_nonces_of_the_wrong_size_are_a_value_error(key, nonce):
    with pytest.raises(ValueError, match="must be"):
        aead.seal(key, nonce, b"x")
    with pytest.raises(ValueError, match="must be"):
        aead.open_(key, nonce, bytes(20))


def test_sizes_are_those_of_rfc_8439():
    assert (aead.KEY_SIZE, aead.NONCE_SIZE, aead.TAG_SIZE) == (32, 12, 16)


# -- the handshake cookie's keyed BLAKE2s, against hashlib (the declared oracle) -----------------

@settings(max_examples=200, deadline=None)
@given(key=st.binary(min_size=1, max_size=32), data=st.binary(max_size=300),
       digest_size=st.integers(1, 32))
def test_keyed_blake2s_matches_hashlib(key, data, digest_size):
    assert keyed_blake2s(key, data, digest_size) == hashlib.blake2s(data, key=key, digest_size=digest_size).digest()


@pytest.mark.parametrize("size", [0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 1200])
def test_keyed_blake2s_at_block_boundaries(size):
    key, data = bytes(range(32)), bytes(range(256)) * 5
    assert keyed_blake2s(key, data[:size]) == hashlib.blake2s(data[:size], key=key, digest_size=16).digest()


def test_keyed_blake2s_refuses_bad_sizes():
    with pytest.raises(ValueError):
        keyed_blake2s(b"", b"x")
    with pytest.raises(ValueError):
        keyed_blake2s(bytes(33), b"x")
    with pytest.raises(ValueError):
        keyed_blake2s(b"k", b"x", 33)
