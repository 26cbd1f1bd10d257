"""The one place relay_core touches cryptography: ChaCha20-Poly1305 IETF (RFC 8439), the AEAD of
connect tokens, handshake tags and sealed packets (docs/PROTOCOL.md, "Packet protection"), and
the keyed BLAKE2s (RFC 7693) of the server's handshake cookie.

BLAKE2s is written out here from the RFC: libsodium has only BLAKE2b, and the cookie is checked
for every forged CONNECT_RESPONSE of a flood before any Python object is made for it
(``blake2s_mac`` in aead.pxd; tests/core/test_aead.py checks it against ``hashlib.blake2s``).

The AEAD is RFC 8439's construction (section 2.8) over two of libsodium's primitives, as
PyNaCl ships them (a wheel with libsodium inside, so nothing is needed from the system): the
ChaCha20 keystream (``crypto_stream_chacha20_ietf_xor_ic``) and Poly1305
(``crypto_onetimeauth_poly1305``), looked up once, at import, in PyNaCl's shared object and
called directly. Composed here rather than called as libsodium's AEAD because datagrams are
short: libsodium's AEAD computes the Poly1305 key block and then the message's blocks one at a
time, while here one keystream call covers both, padded to 256 bytes (the length from which
libsodium computes four blocks at once), and the MAC is one call over a buffer laid out as the
RFC puts it; a 170-byte frame seals in about 0.6x the time. Sealing or opening a packet is a C
call on the datagram's own buffer, with no Python object per packet (``aead_seal`` /
``aead_open`` in aead.pxd); ``seal`` and ``open_`` are the same for Python callers (tokens,
handshakes, tooling).

tests/core/test_aead.py checks it against the ``cryptography`` package's ChaCha20Poly1305, the
declared test oracle, and tests/vectors/ pins every sealed packet byte for byte.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint8_t, uintptr_t

import ctypes

try:
    from nacl import _sodium
except ImportError as error:        # pragma: no cover - a broken install
    raise ImportError(f"relay_core needs PyNaCl (pip install pynacl): {error}") from None

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    static const uint32_t relay_blake2s_iv[8] = {
        0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
        0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

    static const uint8_t relay_blake2s_sigma[10][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
        {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
        {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
        {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
        {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
        {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
        {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
        {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
        {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
        {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0}};

    static inline uint32_t relay_rotr32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    static void relay_blake2s_compress(uint32_t h[8], const uint8_t block[64], uint64_t counter,
                                       int last)
    {
        uint32_t v[16], m[16];
        for (int i = 0; i < 16; i++)
            m[i] = (uint32_t)block[4 * i] | (uint32_t)block[4 * i + 1] << 8 |
                   (uint32_t)block[4 * i + 2] << 16 | (uint32_t)block[4 * i + 3] << 24;
        for (int i = 0; i < 8; i++) {
            v[i] = h[i];
            v[i + 8] = relay_blake2s_iv[i];
        }
        v[12] ^= (uint32_t)counter;
        v[13] ^= (uint32_t)(counter >> 32);
        if (last)
            v[14] = ~v[14];
    #define RELAY_G(a, b, c, d, x, y)                                   \
        do {                                                            \
            v[a] = v[a] + v[b] + (x); v[d] = relay_rotr32(v[d] ^ v[a], 16); \
            v[c] = v[c] + v[d];       v[b] = relay_rotr32(v[b] ^ v[c], 12); \
            v[a] = v[a] + v[b] + (y); v[d] = relay_rotr32(v[d] ^ v[a], 8);  \
            v[c] = v[c] + v[d];       v[b] = relay_rotr32(v[b] ^ v[c], 7);  \
        } while (0)
        for (int r = 0; r < 10; r++) {
            const uint8_t *s = relay_blake2s_sigma[r];
            RELAY_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
            RELAY_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
            RELAY_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
            RELAY_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
            RELAY_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
            RELAY_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
            RELAY_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
            RELAY_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
        }
    #undef RELAY_G
        for (int i = 0; i < 8; i++)
            h[i] ^= v[i] ^ v[i + 8];
    }

    /* The message is the key block (when keyed) then `first` then `second`, fed through one
       64-byte buffer; the last block, full or not, is compressed with the final flag. */
    static void relay_blake2s(uint8_t *out, size_t out_length, const uint8_t *key, size_t key_length,
                              const uint8_t *first, size_t first_length,
                              const uint8_t *second, size_t second_length)
    {
        uint32_t h[8];
        uint8_t block[64];
        size_t filled = 0;
        uint64_t counter = 0;
        const uint8_t *parts[2] = {first, second};
        size_t lengths[2] = {first_length, second_length};
        for (int i = 0; i < 8; i++)
            h[i] = relay_blake2s_iv[i];
        h[0] ^= 0x01010000u ^ ((uint32_t)key_length << 8) ^ (uint32_t)out_length;
        memset(block, 0, sizeof block);
        if (key_length > 0) {
            memcpy(block, key, key_length);
            filled = 64;
        }
        for (int p = 0; p < 2; p++) {
            const uint8_t *in = parts[p];
            size_t length = lengths[p];
            while (length > 0) {
                if (filled == 64) {         /* more follows: this block is not the last */
                    counter += 64;
                    relay_blake2s_compress(h, block, counter, 0);
                    filled = 0;
                    memset(block, 0, sizeof block);
                }
                size_t take = 64 - filled < length ? 64 - filled : length;
                memcpy(block + filled, in, take);
                filled += take;
                in += take;
                length -= take;
            }
        }
        counter += filled;
        relay_blake2s_compress(h, block, counter, 1);
        for (size_t i = 0; i < out_length; i++)
            out[i] = (uint8_t)(h[i / 4] >> (8 * (i % 4)));
    }
    """
    void relay_blake2s(uint8_t* out, size_t out_length, const uint8_t* key, size_t key_length,
                       const uint8_t* first, size_t first_length,
                       const uint8_t* second, size_t second_length) nogil


cdef void blake2s_mac(uint8_t* out, Py_ssize_t out_length, const uint8_t* key, Py_ssize_t key_length,
                      const uint8_t* first, Py_ssize_t first_length,
                      const uint8_t* second, Py_ssize_t second_length) noexcept nogil:
    relay_blake2s(out, <size_t>out_length, key, <size_t>key_length, first, <size_t>first_length,
                  second, <size_t>second_length)


def keyed_blake2s(key, data, int digest_size=16):
    """Keyed BLAKE2s of ``data`` (for tests and tools; the server calls blake2s_mac from C)."""
    cdef bytes k = bytes(key), d = bytes(data)
    cdef bytes out
    if not 1 <= len(k) <= 32 or not 1 <= digest_size <= 32:
        raise ValueError("key of 1..32 bytes and digest_size 1..32")
    out = PyBytes_FromStringAndSize(NULL, digest_size)
    blake2s_mac(<uint8_t*>PyBytes_AS_STRING(out), digest_size, <const uint8_t*>PyBytes_AS_STRING(k),
                len(k), <const uint8_t*>PyBytes_AS_STRING(d), len(d), NULL, 0)
    return out


class AeadError(ValueError):
    """The tag does not verify: the sealed bytes, the associated data, the nonce or the key are
    not those it was sealed with."""


cdef extern from *:
    """
    #include <stddef.h>
    #include <stdint.h>
    #include <string.h>

    typedef int (*relay_stream_xor_ic_fn)(unsigned char *out, const unsigned char *in,
                                          unsigned long long length, const unsigned char *nonce,
                                          uint32_t counter, const unsigned char *key);
    typedef int (*relay_poly1305_fn)(unsigned char *tag, const unsigned char *in,
                                     unsigned long long length, const unsigned char *key);
    typedef int (*relay_poly1305_init_fn)(void *state, const unsigned char *key);
    typedef int (*relay_poly1305_update_fn)(void *state, const unsigned char *in,
                                            unsigned long long length);
    typedef int (*relay_poly1305_final_fn)(void *state, unsigned char *tag);
    typedef int (*relay_verify_16_fn)(const unsigned char *x, const unsigned char *y);

    static relay_stream_xor_ic_fn relay_chacha20_xor_ic;
    static relay_poly1305_fn relay_poly1305;
    static relay_poly1305_init_fn relay_poly1305_init;
    static relay_poly1305_update_fn relay_poly1305_update;
    static relay_poly1305_final_fn relay_poly1305_final;
    static relay_verify_16_fn relay_verify_16;

    /* Longest message (and associated data) sealed or opened in one keystream call on the
       stack; longer ones take the key block and the message in two calls and an incremental
       MAC. Every sealed DATA packet fits. */
    #define RELAY_AEAD_ONE_PASS 2048
    #define RELAY_AEAD_AD_ONE_PASS 64
    #define RELAY_POLY1305_STATE 256

    /* Key material on the stack is wiped through a pointer the compiler cannot see through. */
    static void *(*const volatile relay_wipe)(void *, int, size_t) = memset;
    static const uint8_t relay_zero_pad[16];

    static void relay_aead_bind(void *xor_ic, void *poly1305, void *init, void *update,
                                void *final, void *verify_16)
    {
        relay_chacha20_xor_ic = (relay_stream_xor_ic_fn)xor_ic;
        relay_poly1305 = (relay_poly1305_fn)poly1305;
        relay_poly1305_init = (relay_poly1305_init_fn)init;
        relay_poly1305_update = (relay_poly1305_update_fn)update;
        relay_poly1305_final = (relay_poly1305_final_fn)final;
        relay_verify_16 = (relay_verify_16_fn)verify_16;
    }

    /* Keystream bytes for the Poly1305 key block (block 0) and a message of `length` bytes
       (blocks 1..): while short, rounded up to 256, from which libsodium computes four blocks
       (512: eight) at once; the key block's second half and the blocks past the message are
       computed and not used. */
    static size_t relay_keystream_size(size_t length)
    {
        size_t total = 64 + length;
        return total <= 512 ? (total + 255) & ~(size_t)255 : (total + 63) & ~(size_t)63;
    }

    static void relay_put_le64(uint8_t *out, uint64_t value)
    {
        for (int i = 0; i < 8; i++)
            out[i] = (uint8_t)(value >> (8 * i));
    }

    /* RFC 8439 section 2.8's MAC input around a message already at `message` in a buffer with
       room before it (the associated data, padded to 16 bytes) and after it (the message's
       padding, then both lengths); returns where that input starts and its size in `size`. */
    static uint8_t *relay_mac_input(uint8_t *message, size_t length, const uint8_t *ad,
                                    size_t ad_length, size_t *size)
    {
        size_t ad_padded = (ad_length + 15) & ~(size_t)15, padded = (length + 15) & ~(size_t)15;
        uint8_t *start = message - ad_padded;
        memset(start, 0, ad_padded);
        if (ad_length)
            memcpy(start, ad, ad_length);
        memset(message + length, 0, padded - length);
        relay_put_le64(message + padded, ad_length);
        relay_put_le64(message + padded + 8, length);
        *size = ad_padded + padded + 16;
        return start;
    }

    /* The MAC of the long path: the same input fed in pieces. */
    static void relay_mac_incremental(uint8_t *tag, const uint8_t *poly_key, const uint8_t *ad,
                                      size_t ad_length, const uint8_t *cipher, size_t length)
    {
        uint8_t state[RELAY_POLY1305_STATE] __attribute__((aligned(64)));
        uint8_t lengths[16];
        relay_put_le64(lengths, ad_length);
        relay_put_le64(lengths + 8, length);
        relay_poly1305_init(state, poly_key);
        relay_poly1305_update(state, ad, ad_length);
        relay_poly1305_update(state, relay_zero_pad, (16 - (ad_length & 15)) & 15);
        relay_poly1305_update(state, cipher, length);
        relay_poly1305_update(state, relay_zero_pad, (16 - (length & 15)) & 15);
        relay_poly1305_update(state, lengths, 16);
        relay_poly1305_final(state, tag);
        relay_wipe(state, 0, sizeof state);
    }

    /* The Poly1305 key of the long path: block 0 alone. */
    static void relay_poly_key(uint8_t *block, const uint8_t *nonce, const uint8_t *key)
    {
        memset(block, 0, 64);
        relay_chacha20_xor_ic(block, block, 64, nonce, 0, key);
    }

    /* ciphertext || tag into `out` (length + 16 bytes, not overlapping `plain`). */
    static int relay_aead_seal(uint8_t *out, const uint8_t *plain, size_t length, const uint8_t *ad,
                               size_t ad_length, const uint8_t *nonce, const uint8_t *key)
    {
        uint8_t work[64 + RELAY_AEAD_ONE_PASS + 64] __attribute__((aligned(64)));
        if (length <= RELAY_AEAD_ONE_PASS && ad_length <= RELAY_AEAD_AD_ONE_PASS) {
            uint8_t poly_key[32];
            size_t stream = relay_keystream_size(length), size;
            memset(work, 0, 64);
            memcpy(work + 64, plain, length);
            memset(work + 64 + length, 0, stream - 64 - length);
            relay_chacha20_xor_ic(work, work, stream, nonce, 0, key);
            memcpy(poly_key, work, 32);
            memcpy(out, work + 64, length);
            /* The MAC input is laid out around the ciphertext where it is, over the key block. */
            uint8_t *mac = relay_mac_input(work + 64, length, ad, ad_length, &size);
            relay_poly1305(out + length, mac, size, poly_key);
            relay_wipe(poly_key, 0, sizeof poly_key);
            relay_wipe(work, 0, 64);
            return 0;
        }
        relay_poly_key(work, nonce, key);
        relay_chacha20_xor_ic(out, plain, length, nonce, 1, key);
        relay_mac_incremental(out + length, work, ad, ad_length, out, length);
        relay_wipe(work, 0, 64);
        return 0;
    }

    /* The plaintext (sealed_length - 16 bytes) into `out` and 0, or -1 with nothing written
       when the tag does not verify. `out` must not overlap `sealed`. */
    static int relay_aead_open(uint8_t *out, const uint8_t *sealed, size_t sealed_length,
                               const uint8_t *ad, size_t ad_length, const uint8_t *nonce,
                               const uint8_t *key)
    {
        uint8_t work[64 + RELAY_AEAD_ONE_PASS + 64] __attribute__((aligned(64)));
        uint8_t tag[16];
        int verified;
        if (sealed_length < 16)
            return -1;
        size_t length = sealed_length - 16;
        if (length <= RELAY_AEAD_ONE_PASS && ad_length <= RELAY_AEAD_AD_ONE_PASS) {
            uint8_t mac_work[RELAY_AEAD_AD_ONE_PASS + RELAY_AEAD_ONE_PASS + 16]
                __attribute__((aligned(64)));
            size_t stream = relay_keystream_size(length), size;
            memset(work, 0, 64);
            memcpy(work + 64, sealed, length);
            memset(work + 64 + length, 0, stream - 64 - length);
            relay_chacha20_xor_ic(work, work, stream, nonce, 0, key);
            memcpy(mac_work + RELAY_AEAD_AD_ONE_PASS, sealed, length);
            uint8_t *mac = relay_mac_input(mac_work + RELAY_AEAD_AD_ONE_PASS, length, ad, ad_length,
                                           &size);
            relay_poly1305(tag, mac, size, work);
            verified = relay_verify_16(tag, sealed + length) == 0;
            if (verified)
                memcpy(out, work + 64, length);
            relay_wipe(work, 0, 64 + length);
            return verified ? 0 : -1;
        }
        relay_poly_key(work, nonce, key);
        relay_mac_incremental(tag, work, ad, ad_length, sealed, length);
        relay_wipe(work, 0, 64);
        if (relay_verify_16(tag, sealed + length) != 0)
            return -1;
        relay_chacha20_xor_ic(out, sealed, length, nonce, 1, key);
        return 0;
    }
    """
    int RELAY_POLY1305_STATE
    void relay_aead_bind(void* xor_ic, void* poly1305, void* init, void* update, void* final,
                         void* verify_16)
    int relay_aead_seal(uint8_t* out, const uint8_t* plain, size_t length, const uint8_t* ad,
                        size_t ad_length, const uint8_t* nonce, const uint8_t* key) nogil
    int relay_aead_open(uint8_t* out, const uint8_t* sealed, size_t sealed_length, const uint8_t* ad,
                        size_t ad_length, const uint8_t* nonce, const uint8_t* key) nogil


cdef object _lib = _sodium.lib
if _lib.sodium_init() < 0:          # also picks libsodium's fastest ChaCha20 for this CPU
    raise ImportError("libsodium (PyNaCl) failed to initialise")


cdef void* _bind_primitives() except NULL:
    """The primitives' addresses in PyNaCl's shared object (exported there, not through its cffi
    module), bound to the C above. The library stays loaded: PyNaCl holds it."""
    sodium = ctypes.CDLL(_sodium.__file__)
    cdef dict found = {}
    for name in ("crypto_stream_chacha20_ietf_xor_ic", "crypto_onetimeauth_poly1305",
                 "crypto_onetimeauth_poly1305_init", "crypto_onetimeauth_poly1305_update",
                 "crypto_onetimeauth_poly1305_final", "crypto_verify_16",
                 "crypto_onetimeauth_poly1305_statebytes"):
        try:
            found[name] = ctypes.cast(getattr(sodium, name), ctypes.c_void_p).value
        except AttributeError:
            raise ImportError(f"PyNaCl's libsodium lacks {name}") from None
    statebytes = ctypes.CFUNCTYPE(ctypes.c_size_t)(found["crypto_onetimeauth_poly1305_statebytes"])()
    if statebytes > RELAY_POLY1305_STATE:
        raise ImportError(f"libsodium's Poly1305 state is {statebytes} bytes; "
                          f"relay_core.aead holds {RELAY_POLY1305_STATE}")
    relay_aead_bind(<void*><uintptr_t>found["crypto_stream_chacha20_ietf_xor_ic"],
                    <void*><uintptr_t>found["crypto_onetimeauth_poly1305"],
                    <void*><uintptr_t>found["crypto_onetimeauth_poly1305_init"],
                    <void*><uintptr_t>found["crypto_onetimeauth_poly1305_update"],
                    <void*><uintptr_t>found["crypto_onetimeauth_poly1305_final"],
                    <void*><uintptr_t>found["crypto_verify_16"])
    return <void*>1


_bind_primitives()

KEY_SIZE = AEAD_KEY_SIZE
NONCE_SIZE = AEAD_NONCE_SIZE
TAG_SIZE = AEAD_TAG_SIZE


cdef int aead_seal(uint8_t* out, const uint8_t* plain, Py_ssize_t plain_length,
                   const uint8_t* ad, Py_ssize_t ad_length, const uint8_t* nonce,
                   const uint8_t* key) noexcept nogil:
    return relay_aead_seal(out, plain, <size_t>plain_length, ad, <size_t>ad_length, nonce, key)


cdef int aead_open(uint8_t* out, const uint8_t* sealed, Py_ssize_t sealed_length,
                   const uint8_t* ad, Py_ssize_t ad_length, const uint8_t* nonce,
                   const uint8_t* key) noexcept nogil:
    if sealed_length < AEAD_TAG_SIZE:
        return -1
    return relay_aead_open(out, sealed, <size_t>sealed_length, ad, <size_t>ad_length, nonce, key)


cdef inline int _check(const Py_buffer* view, Py_ssize_t size, str what) except -1:
    if view.len != size:
        raise ValueError(f"{what} must be {size} bytes, got {view.len}")
    return 0


def seal(key, nonce, plaintext, associated_data=b""):
    """``plaintext`` sealed under ``key`` (32 bytes) and ``nonce`` (12): ciphertext || 16-byte tag."""
    cdef Py_buffer k, n, m, a
    cdef bytes out
    PyObject_GetBuffer(key, &k, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(nonce, &n, PyBUF_SIMPLE)
        try:
            PyObject_GetBuffer(plaintext, &m, PyBUF_SIMPLE)
            try:
                PyObject_GetBuffer(associated_data, &a, PyBUF_SIMPLE)
                try:
                    _check(&k, AEAD_KEY_SIZE, "key")
                    _check(&n, AEAD_NONCE_SIZE, "nonce")
                    out = PyBytes_FromStringAndSize(NULL, m.len + AEAD_TAG_SIZE)
                    aead_seal(<uint8_t*>PyBytes_AS_STRING(out), <const uint8_t*>m.buf, m.len,
                              <const uint8_t*>a.buf, a.len, <const uint8_t*>n.buf,
                              <const uint8_t*>k.buf)
                    return out
                finally:
                    PyBuffer_Release(&a)
            finally:
                PyBuffer_Release(&m)
        finally:
            PyBuffer_Release(&n)
    finally:
        PyBuffer_Release(&k)


def open_(key, nonce, sealed, associated_data=b""):
    """The plaintext of ``sealed`` (ciphertext || tag); AeadError if the tag does not verify."""
    cdef Py_buffer k, n, c, a
    cdef bytes out
    cdef int status
    PyObject_GetBuffer(key, &k, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(nonce, &n, PyBUF_SIMPLE)
        try:
            PyObject_GetBuffer(sealed, &c, PyBUF_SIMPLE)
            try:
                PyObject_GetBuffer(associated_data, &a, PyBUF_SIMPLE)
                try:
                    _check(&k, AEAD_KEY_SIZE, "key")
                    _check(&n, AEAD_NONCE_SIZE, "nonce")
                    if c.len < AEAD_TAG_SIZE:
                        raise AeadError("sealed data shorter than the tag")
                    out = PyBytes_FromStringAndSize(NULL, c.len - AEAD_TAG_SIZE)
                    status = aead_open(<uint8_t*>PyBytes_AS_STRING(out), <const uint8_t*>c.buf,
                                       c.len, <const uint8_t*>a.buf, a.len,
                                       <const uint8_t*>n.buf, <const uint8_t*>k.buf)
                    if status != 0:
                        raise AeadError("the tag does not verify")
                    return out
                finally:
                    PyBuffer_Release(&a)
            finally:
                PyBuffer_Release(&c)
        finally:
            PyBuffer_Release(&n)
    finally:
        PyBuffer_Release(&k)
