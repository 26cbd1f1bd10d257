/* token.c - the "rt1." text form of a connect token (PROTOCOL 8.7.1). */
#include "token.h"

#include <string.h>

static int b64url_value(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

/* Unpadded base64url; -1 on a bad character, a dangling sixth bit group or overflow. */
static long b64url_decode(const char *text, size_t length, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t i, n = 0;
    if (length % 4 == 1)
        return -1;
    for (i = 0; i < length; i++) {
        int v = b64url_value(text[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= cap)
                return -1;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits > 0 && (acc & ((1u << bits) - 1)) != 0)
        return -1;
    return (long)n;
}

int rc_token_decode(const char *text, rc_token *token)
{
    uint8_t raw[RC_KEY_BYTES * 2 + 2 + 128 + RC_TOKEN_PRIVATE_MAX + 4];
    long n;
    size_t pos, room_len, player_len, rest;
    if (!text || !token || strncmp(text, "rt1.", 4) != 0)
        return -1;
    n = b64url_decode(text + 4, strlen(text + 4), raw, sizeof raw);
    if (n < 0)
        return -1;
    if ((size_t)n < 2 * RC_KEY_BYTES + 1)
        return -1;
    memset(token, 0, sizeof *token);
    memcpy(token->client_key, raw, RC_KEY_BYTES);
    memcpy(token->server_key, raw + RC_KEY_BYTES, RC_KEY_BYTES);
    pos = 2 * RC_KEY_BYTES;
    room_len = raw[pos++];
    if (room_len < 1 || room_len > 64 || pos + room_len + 1 > (size_t)n)
        return -1;
    memcpy(token->room, raw + pos, room_len);
    pos += room_len;
    player_len = raw[pos++];
    if (player_len < 1 || player_len > 64 || pos + player_len > (size_t)n)
        return -1;
    memcpy(token->player, raw + pos, player_len);
    pos += player_len;
    rest = (size_t)n - pos;
    if (rest < RC_TOKEN_PRIVATE_MIN || rest > RC_TOKEN_PRIVATE_MAX || raw[pos] != 1)
        return -1;
    memcpy(token->private_part, raw + pos, rest);
    token->private_length = rest;
    return 0;
}
