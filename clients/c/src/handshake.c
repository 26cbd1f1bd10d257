/* handshake.c - client handshake (PROTOCOL 8.1, 8.7). */
#include "handshake.h"
#include "crypto.h"
#include "wire.h"

#include <string.h>

int rc_handshake_start(rc_handshake *hs, uint32_t connect_id, uint16_t ack_delay_ms,
                       const uint8_t *token, size_t token_length, const uint8_t *client_key,
                       const uint8_t *server_key)
{
    memset(hs, 0, sizeof *hs);
    hs->connect_id = connect_id;
    hs->ack_delay_ms = ack_delay_ms;
    if (token) {
        if (token_length < RC_TOKEN_PRIVATE_MIN || token_length > RC_TOKEN_PRIVATE_MAX
            || !client_key || !server_key)
            return -1;
        hs->token_mode = 1;
        memcpy(hs->token, token, token_length);
        hs->token_length = token_length;
        memcpy(hs->client_key, client_key, RC_KEY_BYTES);
        memcpy(hs->server_key, server_key, RC_KEY_BYTES);
    }
    return 0;
}

size_t rc_handshake_request(const rc_handshake *hs, uint8_t *out)
{
    return rc_write_connect_request(out, hs->connect_id, hs->token_mode ? hs->token : NULL,
                                    hs->token_length);
}

size_t rc_handshake_response(const rc_handshake *hs, uint8_t *out)
{
    return rc_write_connect_response(out, hs->challenge_body, hs->ack_delay_ms,
                                     hs->token_mode ? hs->token : NULL, hs->token_length,
                                     hs->client_key);
}

int rc_handshake_on_challenge(rc_handshake *hs, const uint8_t *p, size_t n)
{
    if (n != RC_CHALLENGE_SIZE || rc_get_u32(p + 4) != hs->connect_id)
        return RC_DROP_UNEXPECTED_PACKET;
    memcpy(hs->challenge_body, p + 4, 24);
    return RC_OK;
}

int rc_handshake_on_accept(rc_handshake *hs, const uint8_t *p, size_t n)
{
    uint32_t session_id;
    if (rc_get_u32(p + 4) != hs->connect_id)
        return RC_DROP_UNEXPECTED_PACKET;
    session_id = rc_get_u32(p + 8);
    if (hs->token_mode) {
        uint8_t nonce[RC_AEAD_NONCE], empty[1];
        if (n != RC_ACCEPT_SECURE_SIZE)
            return RC_DROP_AUTH_FAILED;
        rc_nonce(nonce, RC_PT_ACCEPT, hs->connect_id);
        if (rc_aead_open(empty, p + 15, RC_TAG_SIZE, p, 15, nonce, hs->server_key) != 0)
            return RC_DROP_AUTH_FAILED;
        if (p[14] & ~1u)
            return RC_DROP_UNEXPECTED_PACKET;
        hs->sealed = p[14] & 1;
    } else if (n != RC_ACCEPT_SIZE) {
        return RC_DROP_UNEXPECTED_PACKET;
    }
    if (session_id == 0)
        return RC_DROP_UNEXPECTED_PACKET;
    hs->session_id = session_id;
    hs->peer_ack_delay_ms = rc_get_u16(p + 12);
    return RC_OK;
}

int rc_handshake_on_refuse(const rc_handshake *hs, const uint8_t *p, size_t n, int *reason)
{
    if (n != RC_REFUSE_SIZE || rc_get_u32(p + 4) != hs->connect_id)
        return RC_DROP_UNEXPECTED_PACKET;
    *reason = p[8];
    return RC_OK;
}
