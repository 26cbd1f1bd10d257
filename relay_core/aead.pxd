from libc.stdint cimport uint8_t

cdef enum:
    AEAD_KEY_SIZE = 32
    AEAD_NONCE_SIZE = 12
    AEAD_TAG_SIZE = 16

# ChaCha20-Poly1305 IETF (RFC 8439) for C callers: no Python object per call.
# seal writes plain_length + AEAD_TAG_SIZE bytes (ciphertext || tag) to out; out must not overlap
# plain. open writes sealed_length - AEAD_TAG_SIZE bytes to out and returns 0, or -1 when the
# tag does not verify (or sealed_length < AEAD_TAG_SIZE); out must not overlap sealed.
cdef int aead_seal(uint8_t* out, const uint8_t* plain, Py_ssize_t plain_length,
                   const uint8_t* ad, Py_ssize_t ad_length, const uint8_t* nonce,
                   const uint8_t* key) noexcept nogil
# Keyed BLAKE2s (RFC 7693) of the concatenation of two parts, for the server's handshake
# cookie: key of 1..32 bytes, digest of 1..32 bytes.
cdef void blake2s_mac(uint8_t* out, Py_ssize_t out_length, const uint8_t* key, Py_ssize_t key_length,
                      const uint8_t* first, Py_ssize_t first_length,
                      const uint8_t* second, Py_ssize_t second_length) noexcept nogil
cdef int aead_open(uint8_t* out, const uint8_t* sealed, Py_ssize_t sealed_length,
                   const uint8_t* ad, Py_ssize_t ad_length, const uint8_t* nonce,
                   const uint8_t* key) noexcept nogil
