/* wire.c - the datagram codec of PROTOCOL 3-6 and the packet sealing of 8.8. */
#include "wire.h"
#include "crypto.h"

#include <stdio.h>
#include <string.h>

static const char *const drop_names[RC_DROP_COUNT] = {
    "ok", "truncated", "bad_magic", "bad_version", "unknown_type", "bad_length", "unknown_peer",
    "wrong_session", "duplicate_packet", "stale_packet", "bad_cookie", "expired_cookie",
    "not_accepting", "unexpected_packet", "malformed_record", "unknown_record_kind",
    "unknown_channel", "bad_fragment", "message_out_of_window", "message_too_large",
    "reassembly_full", "bad_block_slice", "block_too_large", "auth_failed", "rate_limited",
    "bad_token", "path_unvalidated"
};

static const char *const reason_names[] = {
    "closed", "server_full", "shutdown", "kicked", "timeout", "protocol_error", "replaced",
    "resend_limit", "token_invalid", "token_expired", "token_used", "token_required",
    "token_unsupported", "source_session_limit"
};

const char *rc_drop_name(int drop)
{
    return (drop >= 0 && drop < RC_DROP_COUNT) ? drop_names[drop] : "unknown";
}

const char *rc_reason_name(int code)
{
    if (code >= 0 && code < (int)(sizeof reason_names / sizeof reason_names[0]))
        return reason_names[code];
    return NULL;
}

void rc_reason_text(char *out, size_t cap, const char *prefix, int code)
{
    const char *name = rc_reason_name(code);
    if (cap == 0)
        return;
    if (name)
        snprintf(out, cap, "%s%s", prefix, name);
    else
        snprintf(out, cap, "%s%d", prefix, code);
}

size_t rc_varint_size(size_t value) { return value < 128 ? 1 : 2; }

size_t rc_varint_write(uint8_t *out, size_t value)
{
    if (value < 128) {
        out[0] = (uint8_t)value;
        return 1;
    }
    out[0] = (uint8_t)(0x80 | (value & 0x7F));
    out[1] = (uint8_t)(value >> 7);
    return 2;
}

int rc_varint_read(const uint8_t *p, size_t pos, size_t end, size_t *value, size_t *next)
{
    if (pos >= end)
        return RC_DROP_MALFORMED_RECORD;
    if (!(p[pos] & 0x80)) {
        *value = p[pos];
        *next = pos + 1;
        return RC_OK;
    }
    if (pos + 1 >= end || (p[pos + 1] & 0x80))
        return RC_DROP_MALFORMED_RECORD;
    *value = (size_t)(p[pos] & 0x7F) | ((size_t)p[pos + 1] << 7);
    *next = pos + 2;
    return RC_OK;
}

void rc_wire_prefix(uint8_t *p, int type)
{
    p[0] = 0x52;
    p[1] = 0x4C;
    p[2] = 1;
    p[3] = (uint8_t)type;
}

int rc_wire_token_block(const uint8_t *p, size_t n, size_t pos, size_t *length)
{
    size_t l;
    if (pos >= n)
        return -RC_DROP_BAD_TOKEN;
    if (p[pos] == 0)
        return 0;
    if (p[pos] != 1 || pos + RC_TOKEN_BLOCK_HEADER > n)
        return -RC_DROP_BAD_TOKEN;
    l = rc_get_u16(p + pos + 1);
    if (l < 127 || l > 509 || pos + RC_TOKEN_BLOCK_HEADER + l > n)
        return -RC_DROP_BAD_TOKEN;
    *length = l;
    return 1;
}

int rc_wire_check(const uint8_t *p, size_t n)
{
    int type;
    size_t tl = 0;
    int fmt;
    if (n < 4)
        return -RC_DROP_TRUNCATED;
    if (p[0] != 0x52 || p[1] != 0x4C)
        return -RC_DROP_BAD_MAGIC;
    if (p[2] != 1)
        return -RC_DROP_BAD_VERSION;
    type = p[3];
    if (type < 1 || type > 9)
        return -RC_DROP_UNKNOWN_TYPE;
    switch (type) {
    case RC_PT_DATA:
        return n < RC_DATA_HEADER_SIZE ? -RC_DROP_TRUNCATED : type;
    case RC_PT_CONNECT_REQUEST:
        if (n < RC_CONNECT_REQUEST_SIZE)
            return -RC_DROP_BAD_LENGTH;
        fmt = rc_wire_token_block(p, n, 8, &tl);
        return fmt < 0 ? fmt : type;
    case RC_PT_CHALLENGE:
        return n == RC_CHALLENGE_SIZE ? type : -RC_DROP_BAD_LENGTH;
    case RC_PT_CONNECT_RESPONSE:
        if (n < RC_CONNECT_RESPONSE_SIZE)
            return -RC_DROP_BAD_LENGTH;
        if (n > RC_CONNECT_RESPONSE_SIZE) {
            fmt = rc_wire_token_block(p, n, RC_CONNECT_RESPONSE_SIZE, &tl);
            if (fmt < 0)
                return fmt;
            if (fmt == 0 || n != RC_CONNECT_RESPONSE_SIZE + RC_TOKEN_BLOCK_HEADER + tl + RC_TAG_SIZE)
                return -RC_DROP_BAD_LENGTH;
        }
        return type;
    case RC_PT_ACCEPT:
        return (n == RC_ACCEPT_SIZE || n == RC_ACCEPT_SECURE_SIZE) ? type : -RC_DROP_BAD_LENGTH;
    case RC_PT_REFUSE:
        return n == RC_REFUSE_SIZE ? type : -RC_DROP_BAD_LENGTH;
    case RC_PT_DISCONNECT:
        return (n == RC_DISCONNECT_SIZE || n == RC_DISCONNECT_SECURE_SIZE) ? type : -RC_DROP_BAD_LENGTH;
    default:
        return (n == RC_PATH_SIZE || n == RC_PATH_SECURE_SIZE) ? type : -RC_DROP_BAD_LENGTH;
    }
}

void rc_data_header_read(const uint8_t *p, rc_data_header *h)
{
    h->session_id = rc_get_u32(p + 4);
    h->seq = rc_get_u16(p + 8);
    h->ack = rc_get_u16(p + 10);
    h->ack_bits = rc_get_u32(p + 12);
    h->send_time = rc_get_u16(p + 16);
    h->echo_time = rc_get_u16(p + 18);
}

void rc_data_header_write(uint8_t *p, const rc_data_header *h)
{
    rc_wire_prefix(p, RC_PT_DATA);
    rc_put_u32(p + 4, h->session_id);
    rc_put_u16(p + 8, h->seq);
    rc_put_u16(p + 10, h->ack);
    rc_put_u32(p + 12, h->ack_bits);
    rc_put_u16(p + 16, h->send_time);
    rc_put_u16(p + 18, h->echo_time);
}

int rc_record_parse(const uint8_t *p, size_t pos, size_t end, rc_record *r, size_t *next)
{
    size_t length = 0, at;
    int drop;
    memset(r, 0, sizeof *r);
    r->kind = p[pos] >> 5;
    r->channel = p[pos] & 0x1F;
    switch (r->kind) {
    case RC_RK_MESSAGE:
        if (end - pos < 4)
            return RC_DROP_MALFORMED_RECORD;
        r->msg_id = rc_get_u16(p + pos + 1);
        at = pos + 3;
        break;
    case RC_RK_FRAGMENT:
        if (end - pos < 6)
            return RC_DROP_MALFORMED_RECORD;
        r->msg_id = rc_get_u16(p + pos + 1);
        r->fragment_index = p[pos + 3];
        r->fragment_count = p[pos + 4];
        if (r->fragment_count < 2 || r->fragment_index >= r->fragment_count)
            return RC_DROP_BAD_FRAGMENT;
        at = pos + 5;
        break;
    case RC_RK_BLOCK_SLICE:
        if (end - pos < 12)
            return RC_DROP_MALFORMED_RECORD;
        r->channel = 0;
        r->block_id = rc_get_u16(p + pos + 1);
        r->slice_index = rc_get_u16(p + pos + 3);
        r->slice_count = rc_get_u16(p + pos + 5);
        r->block_size = rc_get_u32(p + pos + 7);
        if (r->slice_count == 0 || r->slice_index >= r->slice_count)
            return RC_DROP_BAD_BLOCK_SLICE;
        at = pos + 11;
        break;
    case RC_RK_BLOCK_ACK:
        if (end - pos < 6)
            return RC_DROP_MALFORMED_RECORD;
        r->channel = 0;
        r->block_id = rc_get_u16(p + pos + 1);
        r->base = rc_get_u16(p + pos + 3);
        length = p[pos + 5];
        if (length > end - pos - 6)
            return RC_DROP_MALFORMED_RECORD;
        r->payload = p + pos + 6;
        r->length = length;
        *next = pos + 6 + length;
        return RC_OK;
    default:
        return RC_DROP_UNKNOWN_RECORD_KIND;
    }
    drop = rc_varint_read(p, at, end, &length, &at);
    if (drop)
        return drop;
    if (length > end - at)
        return RC_DROP_MALFORMED_RECORD;
    r->payload = p + at;
    r->length = length;
    *next = at + length;
    return RC_OK;
}

size_t rc_message_record_size(size_t length) { return 3 + rc_varint_size(length) + length; }

size_t rc_message_record_write(uint8_t *out, int channel, uint16_t msg_id,
                               const uint8_t *data, size_t length)
{
    size_t n;
    out[0] = (uint8_t)(channel & 0x1F);
    rc_put_u16(out + 1, msg_id);
    n = 3 + rc_varint_write(out + 3, length);
    if (length)
        memcpy(out + n, data, length);
    return n + length;
}

size_t rc_fragment_record_write(uint8_t *out, int channel, uint16_t msg_id, uint8_t index,
                                uint8_t count, const uint8_t *data, size_t length)
{
    size_t n;
    out[0] = (uint8_t)(0x20 | (channel & 0x1F));
    rc_put_u16(out + 1, msg_id);
    out[3] = index;
    out[4] = count;
    n = 5 + rc_varint_write(out + 5, length);
    if (length)
        memcpy(out + n, data, length);
    return n + length;
}

size_t rc_block_slice_record_write(uint8_t *out, uint16_t block_id, uint16_t index,
                                   uint16_t count, uint32_t block_size,
                                   const uint8_t *data, size_t length)
{
    size_t n;
    out[0] = 0x40;
    rc_put_u16(out + 1, block_id);
    rc_put_u16(out + 3, index);
    rc_put_u16(out + 5, count);
    rc_put_u32(out + 7, block_size);
    n = 11 + rc_varint_write(out + 11, length);
    if (length)
        memcpy(out + n, data, length);
    return n + length;
}

size_t rc_block_ack_record_write(uint8_t *out, uint16_t block_id, uint16_t base,
                                 const uint8_t *bitfield, size_t bitfield_length)
{
    out[0] = 0x60;
    rc_put_u16(out + 1, block_id);
    rc_put_u16(out + 3, base);
    out[5] = (uint8_t)bitfield_length;
    if (bitfield_length)
        memcpy(out + 6, bitfield, bitfield_length);
    return 6 + bitfield_length;
}

size_t rc_write_connect_request(uint8_t *out, uint32_t connect_id, const uint8_t *token,
                                size_t token_length)
{
    size_t n = 9;
    rc_wire_prefix(out, RC_PT_CONNECT_REQUEST);
    rc_put_u32(out + 4, connect_id);
    if (token) {
        out[8] = 1;
        rc_put_u16(out + 9, (uint16_t)token_length);
        memcpy(out + 11, token, token_length);
        n = 11 + token_length;
    } else {
        out[8] = 0;
    }
    if (n < RC_CONNECT_REQUEST_SIZE) {
        memset(out + n, 0, RC_CONNECT_REQUEST_SIZE - n);
        n = RC_CONNECT_REQUEST_SIZE;
    }
    return n;
}

size_t rc_write_challenge(uint8_t *out, uint32_t connect_id, uint32_t cookie_time,
                          const uint8_t mac[16])
{
    rc_wire_prefix(out, RC_PT_CHALLENGE);
    rc_put_u32(out + 4, connect_id);
    rc_put_u32(out + 8, cookie_time);
    memcpy(out + 12, mac, 16);
    return RC_CHALLENGE_SIZE;
}

void rc_nonce(uint8_t nonce[12], int type, uint64_t counter)
{
    int i;
    memset(nonce, 0, 12);
    nonce[0] = (uint8_t)type;
    for (i = 0; i < 8; i++)
        nonce[4 + i] = (uint8_t)(counter >> (8 * i));
}

/* The tag over out[0..length) (empty plaintext) appended at out + length. */
static void append_tag(uint8_t *out, size_t length, int type, uint64_t counter,
                       const uint8_t key[32])
{
    uint8_t nonce[12];
    rc_nonce(nonce, type, counter);
    rc_aead_seal(out + length, out + length, 0, out, length, nonce, key);
}

size_t rc_write_connect_response(uint8_t *out, const uint8_t challenge_body[24],
                                 uint16_t ack_delay_ms, const uint8_t *token, size_t token_length,
                                 const uint8_t *client_key)
{
    size_t n;
    rc_wire_prefix(out, RC_PT_CONNECT_RESPONSE);
    memcpy(out + 4, challenge_body, 24);
    rc_put_u16(out + 28, ack_delay_ms);
    if (!token)
        return RC_CONNECT_RESPONSE_SIZE;
    out[30] = 1;
    rc_put_u16(out + 31, (uint16_t)token_length);
    memcpy(out + 33, token, token_length);
    n = 33 + token_length;
    append_tag(out, n, RC_PT_CONNECT_RESPONSE, rc_get_u32(out + 4), client_key);
    return n + RC_TAG_SIZE;
}

size_t rc_write_accept(uint8_t *out, uint32_t connect_id, uint32_t session_id,
                       uint16_t ack_delay_ms, int flags, const uint8_t *tag_key)
{
    rc_wire_prefix(out, RC_PT_ACCEPT);
    rc_put_u32(out + 4, connect_id);
    rc_put_u32(out + 8, session_id);
    rc_put_u16(out + 12, ack_delay_ms);
    if (!tag_key)
        return RC_ACCEPT_SIZE;
    out[14] = (uint8_t)flags;
    append_tag(out, 15, RC_PT_ACCEPT, connect_id, tag_key);
    return RC_ACCEPT_SECURE_SIZE;
}

size_t rc_write_refuse(uint8_t *out, uint32_t connect_id, uint8_t reason)
{
    rc_wire_prefix(out, RC_PT_REFUSE);
    rc_put_u32(out + 4, connect_id);
    out[8] = reason;
    return RC_REFUSE_SIZE;
}

size_t rc_write_disconnect(uint8_t *out, uint32_t session_id, uint8_t reason)
{
    rc_wire_prefix(out, RC_PT_DISCONNECT);
    rc_put_u32(out + 4, session_id);
    out[8] = reason;
    return RC_DISCONNECT_SIZE;
}

size_t rc_write_path(uint8_t *out, int type, uint32_t session_id, const uint8_t data[8])
{
    rc_wire_prefix(out, type);
    rc_put_u32(out + 4, session_id);
    memcpy(out + 8, data, 8);
    return RC_PATH_SIZE;
}

static size_t sealed_control(uint8_t *out, int type, uint32_t session_id, const uint8_t *plain,
                             size_t plain_length, uint64_t counter, const uint8_t key[32])
{
    uint8_t nonce[12];
    rc_wire_prefix(out, type);
    rc_put_u32(out + 4, session_id);
    rc_put_u16(out + 8, (uint16_t)counter);
    rc_nonce(nonce, type, counter);
    rc_aead_seal(out + 10, plain, plain_length, out, 10, nonce, key);
    return 10 + plain_length + RC_TAG_SIZE;
}

size_t rc_write_disconnect_sealed(uint8_t *out, uint32_t session_id, uint8_t reason,
                                  uint64_t counter, const uint8_t key[32])
{
    return sealed_control(out, RC_PT_DISCONNECT, session_id, &reason, 1, counter, key);
}

size_t rc_write_path_sealed(uint8_t *out, int type, uint32_t session_id, const uint8_t data[8],
                            uint64_t counter, const uint8_t key[32])
{
    uint8_t plain[8];
    memcpy(plain, data, 8);
    return sealed_control(out, type, session_id, plain, 8, counter, key);
}

size_t rc_seal_data(uint8_t *out, size_t length, uint64_t counter, const uint8_t key[32])
{
    uint8_t nonce[12];
    rc_nonce(nonce, RC_PT_DATA, counter);
    rc_aead_seal(out + RC_DATA_HEADER_SIZE, out + RC_DATA_HEADER_SIZE,
                 length - RC_DATA_HEADER_SIZE, out, RC_DATA_HEADER_SIZE, nonce, key);
    return length + RC_TAG_SIZE;
}

int rc_open_packet(uint8_t *out, const uint8_t *in, size_t n, size_t header, int type,
                   uint64_t counter, const uint8_t key[32])
{
    uint8_t nonce[12];
    if (n < header + RC_TAG_SIZE)
        return -1;
    rc_nonce(nonce, type, counter);
    if (out != in)
        memmove(out, in, header);
    return rc_aead_open(out + header, in + header, n - header, in, header, nonce, key);
}

uint64_t rc_counter_from_seq(int have_largest, uint64_t largest, uint16_t seq)
{
    uint64_t expected, candidate;
    if (!have_largest)
        return seq;
    expected = largest + 1;
    candidate = (expected & ~(uint64_t)0xFFFF) | seq;
    if (candidate + 0x8000 <= expected)
        candidate += 0x10000;
    else if (candidate > expected + 0x8000 && candidate >= 0x10000)
        candidate -= 0x10000;
    return candidate;
}
