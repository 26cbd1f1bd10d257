/*
 * token.h - the connect token's text form as the client receives it from the game backend
 * (PROTOCOL 8.7.1): "rt1." + base64url(client_key || server_key || u8 room_len || room ||
 * u8 player_len || player || private part). The client treats the private part as opaque.
 */
#ifndef RC_TOKEN_H
#define RC_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#define RC_TOKEN_PRIVATE_MIN 127
#define RC_TOKEN_PRIVATE_MAX 509
#define RC_KEY_BYTES 32

typedef struct rc_token {
    uint8_t client_key[RC_KEY_BYTES];
    uint8_t server_key[RC_KEY_BYTES];
    char room[65];                  /* NUL-terminated */
    char player[65];
    uint8_t private_part[RC_TOKEN_PRIVATE_MAX];
    size_t private_length;
} rc_token;

/* 0 and fills *token, or -1 if text is not a well-formed version-1 token. */
int rc_token_decode(const char *text, rc_token *token);

#endif
