/*
 * crypto.h - the one place the library touches cryptography (PROTOCOL 8.8): ChaCha20-Poly1305
 * IETF (RFC 8439) and the OS random source. Backed by libsodium in crypto.c; a port to a
 * platform without libsodium replaces crypto.c alone.
 */
#ifndef RC_CRYPTO_H
#define RC_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define RC_AEAD_KEY 32
#define RC_AEAD_NONCE 12
#define RC_AEAD_TAG 16

/* Once per process before any other call; 0 on success. Safe to call again. */
int rc_crypto_init(void);

/* out = ciphertext || tag (plain_length + 16 bytes); out may equal plain. 0 on success. */
int rc_aead_seal(uint8_t *out, const uint8_t *plain, size_t plain_length,
                 const uint8_t *ad, size_t ad_length,
                 const uint8_t nonce[RC_AEAD_NONCE], const uint8_t key[RC_AEAD_KEY]);

/* in = ciphertext || tag; writes in_length - 16 bytes to out (out may equal in).
 * 0 if the tag verifies, -1 otherwise (out is then unspecified). */
int rc_aead_open(uint8_t *out, const uint8_t *in, size_t in_length,
                 const uint8_t *ad, size_t ad_length,
                 const uint8_t nonce[RC_AEAD_NONCE], const uint8_t key[RC_AEAD_KEY]);

void rc_random_bytes(uint8_t *out, size_t length);

#endif
