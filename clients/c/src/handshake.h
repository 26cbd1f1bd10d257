/* handshake.h - the client side of the connection handshake (PROTOCOL 4.1-4.4, 8.1, 8.7). */
#ifndef RC_HANDSHAKE_H
#define RC_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "token.h"

typedef struct rc_handshake {
    uint32_t connect_id;
    uint16_t ack_delay_ms;              /* ours, announced in CONNECT_RESPONSE */
    int token_mode;
    uint8_t token[RC_TOKEN_PRIVATE_MAX];
    size_t token_length;
    uint8_t client_key[RC_KEY_BYTES], server_key[RC_KEY_BYTES];
    uint8_t challenge_body[24];         /* CHALLENGE bytes 4..27 */
    /* from ACCEPT */
    uint32_t session_id;
    uint16_t peer_ack_delay_ms;
    int sealed;
} rc_handshake;

/* token NULL: open mode. 0, or -1 (bad token length). */
int rc_handshake_start(rc_handshake *hs, uint32_t connect_id, uint16_t ack_delay_ms,
                       const uint8_t *token, size_t token_length, const uint8_t *client_key,
                       const uint8_t *server_key);
/* Datagram sizes: CONNECT_REQUEST <= 64 + 11 + 509, CONNECT_RESPONSE <= 49 + 509. */
size_t rc_handshake_request(const rc_handshake *hs, uint8_t *out);
size_t rc_handshake_response(const rc_handshake *hs, uint8_t *out);

/* Datagrams checked by rc_wire_check. Each returns 0 or a drop reason. */
int rc_handshake_on_challenge(rc_handshake *hs, const uint8_t *p, size_t n);
int rc_handshake_on_accept(rc_handshake *hs, const uint8_t *p, size_t n);
int rc_handshake_on_refuse(const rc_handshake *hs, const uint8_t *p, size_t n, int *reason);

#endif
