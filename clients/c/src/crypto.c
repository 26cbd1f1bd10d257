/* crypto.c - crypto.h on libsodium. */
#include "crypto.h"

#include <sodium.h>

int rc_crypto_init(void)
{
    return sodium_init() < 0 ? -1 : 0;
}

int rc_aead_seal(uint8_t *out, const uint8_t *plain, size_t plain_length,
                 const uint8_t *ad, size_t ad_length,
                 const uint8_t nonce[RC_AEAD_NONCE], const uint8_t key[RC_AEAD_KEY])
{
    unsigned long long clen = 0;
    return crypto_aead_chacha20poly1305_ietf_encrypt(out, &clen, plain, plain_length, ad,
                                                     ad_length, NULL, nonce, key) == 0 ? 0 : -1;
}

int rc_aead_open(uint8_t *out, const uint8_t *in, size_t in_length,
                 const uint8_t *ad, size_t ad_length,
                 const uint8_t nonce[RC_AEAD_NONCE], const uint8_t key[RC_AEAD_KEY])
{
    unsigned long long mlen = 0;
    if (in_length < RC_AEAD_TAG)
        return -1;
    return crypto_aead_chacha20poly1305_ietf_decrypt(out, &mlen, NULL, in, in_length, ad,
                                                     ad_length, nonce, key) == 0 ? 0 : -1;
}

void rc_random_bytes(uint8_t *out, size_t length)
{
    randombytes_buf(out, length);
}
