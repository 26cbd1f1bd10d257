"""The one place relay_core touches cryptography: ChaCha20-Poly1305 IETF (RFC 8439), the AEAD of
connect tokens, handshake tags and sealed packets (docs/PROTOCOL.md, "Packet protection").

It is libsodium's, as PyNaCl ships it (a wheel with libsodium inside, so nothing is needed from
the system): the C functions are looked up once, at import, through PyNaCl's cffi module, and
called directly. Sealing or opening a packet is then a C call on the datagram's own buffer, with
no Python object per packet (``aead_seal`` / ``aead_open`` in aead.pxd); ``seal`` and ``open_``
are the same for Python callers (tokens, handshakes, tooling).

tests/core/test_aead.py checks it against the ``cryptography`` package's ChaCha20Poly1305, the
declared test oracle, and tests/vectors/ pins every sealed packet byte for byte.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint8_t, uintptr_t

try:
    from nacl import _sodium
except ImportError as error:        # pragma: no cover - a broken install
    raise ImportError(f"relay_core needs PyNaCl (pip install pynacl): {error}") from None

ctypedef int (*encrypt_fn)(unsigned char* c, unsigned long long* c_length, const unsigned char* m,
                           unsigned long long m_length, const unsigned char* ad,
                           unsigned long long ad_length, const unsigned char* nsec,
                           const unsigned char* npub, const unsigned char* k) noexcept nogil
ctypedef int (*decrypt_fn)(unsigned char* m, unsigned long long* m_length, unsigned char* nsec,
                           const unsigned char* c, unsigned long long c_length,
                           const unsigned char* ad, unsigned long long ad_length,
                           const unsigned char* npub, const unsigned char* k) noexcept nogil


class AeadError(ValueError):
    """The tag does not verify: the sealed bytes, the associated data, the nonce or the key are
    not those it was sealed with."""


cdef object _ffi = _sodium.ffi
cdef object _lib = _sodium.lib         # held for the life of the module: the functions live in it
if _lib.sodium_init() < 0:
    raise ImportError("libsodium (PyNaCl) failed to initialise")


cdef uintptr_t _address(str name) except 0:
    return int(_ffi.cast("uintptr_t", _ffi.addressof(_lib, name)))


cdef encrypt_fn _encrypt = <encrypt_fn>_address("crypto_aead_chacha20poly1305_ietf_encrypt")
cdef decrypt_fn _decrypt = <decrypt_fn>_address("crypto_aead_chacha20poly1305_ietf_decrypt")

KEY_SIZE = AEAD_KEY_SIZE
NONCE_SIZE = AEAD_NONCE_SIZE
TAG_SIZE = AEAD_TAG_SIZE


cdef int aead_seal(uint8_t* out, const uint8_t* plain, Py_ssize_t plain_length,
                   const uint8_t* ad, Py_ssize_t ad_length, const uint8_t* nonce,
                   const uint8_t* key) noexcept nogil:
    cdef unsigned long long written = 0
    return _encrypt(out, &written, plain, <unsigned long long>plain_length, ad,
                    <unsigned long long>ad_length, NULL, nonce, key)


cdef int aead_open(uint8_t* out, const uint8_t* sealed, Py_ssize_t sealed_length,
                   const uint8_t* ad, Py_ssize_t ad_length, const uint8_t* nonce,
                   const uint8_t* key) noexcept nogil:
    cdef unsigned long long written = 0
    if sealed_length < AEAD_TAG_SIZE:
        return -1
    return 0 if _decrypt(out, &written, NULL, sealed, <unsigned long long>sealed_length, ad,
                         <unsigned long long>ad_length, nonce, key) == 0 else -1


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
