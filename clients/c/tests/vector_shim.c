/* vector_shim.c - small exported functions for the Python tests (ctypes):
 *   rcv_*: the wire codec against the JSON files in tests/vectors (decode to canonical JSON text, encode
 *          from fields, open sealed packets, the connect token's text form);
 *   rct_*: one rc_conn driven from Python against relay_core's Endpoint, with its callbacks
 *          queued as events. Test-only code: it allocates freely. */
#include "block.h"
#include "conn.h"
#include "crypto.h"
#include "token.h"
#include "wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

typedef struct text_out {
    char *buf;
    size_t cap, len;
    int overflow;
} text_out;

static void emit(text_out *t, const char *format, ...)
{
    va_list args;
    int n;
    if (t->overflow)
        return;
    va_start(args, format);
    n = vsnprintf(t->buf + t->len, t->cap - t->len, format, args);
    va_end(args);
    if (n < 0 || (size_t)n >= t->cap - t->len)
        t->overflow = 1;
    else
        t->len += (size_t)n;
}

static void emit_hex(text_out *t, const char *key, const uint8_t *p, size_t n)
{
    size_t i;
    emit(t, ", \"%s\": \"", key);
    for (i = 0; i < n; i++)
        emit(t, "%02x", p[i]);
    emit(t, "\"");
}

static void emit_reason(text_out *t, int code)
{
    const char *name = rc_reason_name(code);
    if (name)
        emit(t, ", \"reason\": \"%s\"", name);
    else
        emit(t, ", \"reason\": %d", code);
}

static const char *const type_names[] = {
    "", "connect_request", "challenge", "connect_response", "accept", "refuse", "data",
    "disconnect", "path_challenge", "path_response"
};
static const char *const kind_names[] = { "message", "fragment", "block_slice", "block_ack" };

SHIM_EXPORT int rcv_init(void);
SHIM_EXPORT int rcv_init(void) { return rc_crypto_init(); }

/* Decodes one datagram as relay_core.wire.decode_packet does. key (32 bytes) or NULL; counter
 * < 0: the packet's seq. Returns 0 with JSON in out, or the drop reason (its name in out). */
SHIM_EXPORT int rcv_decode(const uint8_t *data, size_t n, const uint8_t *key, long long counter,
                           char *out, size_t cap);
SHIM_EXPORT int rcv_decode(const uint8_t *data, size_t n, const uint8_t *key, long long counter,
                           char *out, size_t cap)
{
    text_out t = { out, cap, 0, 0 };
    uint8_t *plain = NULL;
    int type = rc_wire_check(data, n), result = 0;
    size_t tl = 0;
    if (cap)
        out[0] = 0;
    if (type < 0) {
        snprintf(out, cap, "%s", rc_drop_name(-type));
        return -type;
    }
    emit(&t, "{\"type\": \"%s\"", type_names[type]);
    switch (type) {
    case RC_PT_DATA: {
        rc_data_header h;
        size_t pos;
        const uint8_t *p = data;
        if (key) {
            uint64_t c = counter < 0 ? rc_get_u16(data + 8) : (uint64_t)counter;
            plain = malloc(n + 1);
            if (!plain || rc_open_packet(plain, data, n, RC_DATA_HEADER_SIZE, RC_PT_DATA, c, key) != 0) {
                result = RC_DROP_AUTH_FAILED;
                break;
            }
            p = plain;
            n -= RC_TAG_SIZE;
        }
        rc_data_header_read(p, &h);
        emit(&t, ", \"session_id\": %u, \"seq\": %u, \"ack\": %u, \"ack_bits\": %u, "
                 "\"send_time\": %u, \"echo_time\": %u, \"records\": [",
             h.session_id, h.seq, h.ack, h.ack_bits, h.send_time, h.echo_time);
        for (pos = RC_DATA_HEADER_SIZE; pos < n;) {
            rc_record r;
            size_t next;
            result = rc_record_parse(p, pos, n, &r, &next);
            if (result)
                break;
            emit(&t, "%s{\"kind\": \"%s\"", pos == RC_DATA_HEADER_SIZE ? "" : ", ", kind_names[r.kind]);
            if (r.kind == RC_RK_MESSAGE || r.kind == RC_RK_FRAGMENT)
                emit(&t, ", \"channel\": %d, \"msg_id\": %u", r.channel, r.msg_id);
            if (r.kind == RC_RK_FRAGMENT)
                emit(&t, ", \"fragment_index\": %u, \"fragment_count\": %u", r.fragment_index, r.fragment_count);
            if (r.kind == RC_RK_BLOCK_SLICE)
                emit(&t, ", \"block_id\": %u, \"slice_index\": %u, \"slice_count\": %u, \"block_size\": %u",
                     r.block_id, r.slice_index, r.slice_count, r.block_size);
            if (r.kind == RC_RK_BLOCK_ACK) {
                emit(&t, ", \"block_id\": %u, \"base\": %u", r.block_id, r.base);
                emit_hex(&t, "bitfield", r.payload, r.length);
            } else {
                emit_hex(&t, "payload", r.payload, r.length);
            }
            emit(&t, "}");
            pos = next;
        }
        emit(&t, "]");
        break;
    }
    case RC_PT_CONNECT_REQUEST:
        emit(&t, ", \"connect_id\": %u", rc_get_u32(data + 4));
        if (rc_wire_token_block(data, n, 8, &tl) == 1)
            emit_hex(&t, "token", data + 11, tl);
        break;
    case RC_PT_CHALLENGE:
    case RC_PT_CONNECT_RESPONSE:
        emit(&t, ", \"connect_id\": %u, \"cookie_time\": %u", rc_get_u32(data + 4), rc_get_u32(data + 8));
        emit_hex(&t, "cookie_mac", data + 12, 16);
        if (type == RC_PT_CONNECT_RESPONSE) {
            emit(&t, ", \"ack_delay_ms\": %u", rc_get_u16(data + 28));
            if (n > RC_CONNECT_RESPONSE_SIZE) {
                tl = rc_get_u16(data + 31);
                emit_hex(&t, "token", data + 33, tl);
                emit_hex(&t, "tag", data + n - RC_TAG_SIZE, RC_TAG_SIZE);
            }
        }
        break;
    case RC_PT_ACCEPT:
        emit(&t, ", \"connect_id\": %u, \"session_id\": %u, \"ack_delay_ms\": %u",
             rc_get_u32(data + 4), rc_get_u32(data + 8), rc_get_u16(data + 12));
        if (n == RC_ACCEPT_SECURE_SIZE) {
            emit(&t, ", \"flags\": %u", data[14]);
            emit_hex(&t, "tag", data + 15, RC_TAG_SIZE);
        }
        break;
    case RC_PT_REFUSE:
        emit(&t, ", \"connect_id\": %u", rc_get_u32(data + 4));
        emit_reason(&t, data[8]);
        break;
    case RC_PT_DISCONNECT:
    case RC_PT_PATH_CHALLENGE:
    case RC_PT_PATH_RESPONSE: {
        int path = type != RC_PT_DISCONNECT;
        emit(&t, ", \"session_id\": %u", rc_get_u32(data + 4));
        if (n == RC_DISCONNECT_SIZE || n == RC_PATH_SIZE) {
            if (path)
                emit_hex(&t, "data", data + 8, 8);
            else
                emit_reason(&t, data[8]);
            break;
        }
        emit(&t, ", \"seq\": %u", rc_get_u16(data + 8));
        if (!key) {
            emit_hex(&t, path ? "sealed_data" : "sealed_reason", data + 10, n - 10);
        } else {
            uint8_t buf[RC_PATH_SECURE_SIZE];
            uint64_t c = counter < 0 ? rc_get_u16(data + 8) : (uint64_t)counter;
            if (rc_open_packet(buf, data, n, 10, type, c, key) != 0) {
                result = RC_DROP_AUTH_FAILED;
                break;
            }
            if (path)
                emit_hex(&t, "data", buf + 10, 8);
            else
                emit_reason(&t, buf[10]);
        }
        break;
    }
    default:
        break;
    }
    free(plain);
    if (result) {
        snprintf(out, cap, "%s", rc_drop_name(result));
        return result;
    }
    emit(&t, "}");
    return t.overflow ? -1 : 0;
}

/* -- encoders (each returns the datagram size) ---------------------------------------------- */

SHIM_EXPORT size_t rcv_connect_request(uint8_t *out, uint32_t connect_id, const uint8_t *token, size_t tl);
SHIM_EXPORT size_t rcv_connect_request(uint8_t *out, uint32_t connect_id, const uint8_t *token, size_t tl)
{
    return rc_write_connect_request(out, connect_id, token, tl);
}

SHIM_EXPORT size_t rcv_challenge(uint8_t *out, uint32_t connect_id, uint32_t cookie_time, const uint8_t *mac);
SHIM_EXPORT size_t rcv_challenge(uint8_t *out, uint32_t connect_id, uint32_t cookie_time, const uint8_t *mac)
{
    return rc_write_challenge(out, connect_id, cookie_time, mac);
}

/* token NULL: open form. Otherwise the tag is computed under client_key. */
SHIM_EXPORT size_t rcv_connect_response(uint8_t *out, uint32_t connect_id, uint32_t cookie_time,
                                        const uint8_t *mac, uint16_t ack_delay_ms,
                                        const uint8_t *token, size_t tl, const uint8_t *client_key);
SHIM_EXPORT size_t rcv_connect_response(uint8_t *out, uint32_t connect_id, uint32_t cookie_time,
                                        const uint8_t *mac, uint16_t ack_delay_ms,
                                        const uint8_t *token, size_t tl, const uint8_t *client_key)
{
    uint8_t body[24];
    rc_put_u32(body, connect_id);
    rc_put_u32(body + 4, cookie_time);
    memcpy(body + 8, mac, 16);
    return rc_write_connect_response(out, body, ack_delay_ms, token, tl, client_key);
}

SHIM_EXPORT size_t rcv_accept(uint8_t *out, uint32_t connect_id, uint32_t session_id, uint16_t ack_delay_ms,
                              int flags, const uint8_t *server_key);
SHIM_EXPORT size_t rcv_accept(uint8_t *out, uint32_t connect_id, uint32_t session_id, uint16_t ack_delay_ms,
                              int flags, const uint8_t *server_key)
{
    return rc_write_accept(out, connect_id, session_id, ack_delay_ms, flags, server_key);
}

SHIM_EXPORT size_t rcv_refuse(uint8_t *out, uint32_t connect_id, int reason);
SHIM_EXPORT size_t rcv_refuse(uint8_t *out, uint32_t connect_id, int reason)
{
    return rc_write_refuse(out, connect_id, (uint8_t)reason);
}

/* key NULL: open 9-byte form; else sealed with counter. */
SHIM_EXPORT size_t rcv_disconnect(uint8_t *out, uint32_t session_id, int reason, const uint8_t *key,
                                  unsigned long long counter);
SHIM_EXPORT size_t rcv_disconnect(uint8_t *out, uint32_t session_id, int reason, const uint8_t *key,
                                  unsigned long long counter)
{
    if (!key)
        return rc_write_disconnect(out, session_id, (uint8_t)reason);
    return rc_write_disconnect_sealed(out, session_id, (uint8_t)reason, counter, key);
}

SHIM_EXPORT size_t rcv_path(uint8_t *out, int type, uint32_t session_id, const uint8_t *data,
                            const uint8_t *key, unsigned long long counter);
SHIM_EXPORT size_t rcv_path(uint8_t *out, int type, uint32_t session_id, const uint8_t *data,
                            const uint8_t *key, unsigned long long counter)
{
    if (!key)
        return rc_write_path(out, type, session_id, data);
    return rc_write_path_sealed(out, type, session_id, data, counter, key);
}

SHIM_EXPORT size_t rcv_data_header(uint8_t *out, uint32_t session_id, int seq, int ack,
                                   uint32_t ack_bits, int send_time, int echo_time);
SHIM_EXPORT size_t rcv_data_header(uint8_t *out, uint32_t session_id, int seq, int ack,
                                   uint32_t ack_bits, int send_time, int echo_time)
{
    rc_data_header h;
    h.session_id = session_id;
    h.seq = (uint16_t)seq;
    h.ack = (uint16_t)ack;
    h.ack_bits = ack_bits;
    h.send_time = (uint16_t)send_time;
    h.echo_time = (uint16_t)echo_time;
    rc_data_header_write(out, &h);
    return RC_DATA_HEADER_SIZE;
}

SHIM_EXPORT size_t rcv_message(uint8_t *out, size_t pos, int channel, int msg_id, const uint8_t *data, size_t n);
SHIM_EXPORT size_t rcv_message(uint8_t *out, size_t pos, int channel, int msg_id, const uint8_t *data, size_t n)
{
    return pos + rc_message_record_write(out + pos, channel, (uint16_t)msg_id, data, n);
}

SHIM_EXPORT size_t rcv_fragment(uint8_t *out, size_t pos, int channel, int msg_id, int index, int count,
                                const uint8_t *data, size_t n);
SHIM_EXPORT size_t rcv_fragment(uint8_t *out, size_t pos, int channel, int msg_id, int index, int count,
                                const uint8_t *data, size_t n)
{
    return pos + rc_fragment_record_write(out + pos, channel, (uint16_t)msg_id, (uint8_t)index,
                                          (uint8_t)count, data, n);
}

SHIM_EXPORT size_t rcv_block_slice(uint8_t *out, size_t pos, int block_id, int index, int count,
                                   uint32_t block_size, const uint8_t *data, size_t n);
SHIM_EXPORT size_t rcv_block_slice(uint8_t *out, size_t pos, int block_id, int index, int count,
                                   uint32_t block_size, const uint8_t *data, size_t n)
{
    return pos + rc_block_slice_record_write(out + pos, (uint16_t)block_id, (uint16_t)index,
                                             (uint16_t)count, block_size, data, n);
}

SHIM_EXPORT size_t rcv_block_ack(uint8_t *out, size_t pos, int block_id, int base, const uint8_t *bits, size_t n);
SHIM_EXPORT size_t rcv_block_ack(uint8_t *out, size_t pos, int block_id, int base, const uint8_t *bits, size_t n)
{
    return pos + rc_block_ack_record_write(out + pos, (uint16_t)block_id, (uint16_t)base, bits, n);
}

SHIM_EXPORT size_t rcv_seal_data(uint8_t *out, size_t n, const uint8_t *key, unsigned long long counter);
SHIM_EXPORT size_t rcv_seal_data(uint8_t *out, size_t n, const uint8_t *key, unsigned long long counter)
{
    return rc_seal_data(out, n, counter, key);
}

SHIM_EXPORT unsigned long long rcv_counter_from_seq(int have, unsigned long long largest, int seq);
SHIM_EXPORT unsigned long long rcv_counter_from_seq(int have, unsigned long long largest, int seq)
{
    return rc_counter_from_seq(have, largest, (uint16_t)seq);
}

/* Connect token text: 0 and the fields, or -1. room and player: 65 bytes each. */
SHIM_EXPORT int rcv_token(const char *text, uint8_t *client_key, uint8_t *server_key, char *room,
                          char *player, uint8_t *private_part, size_t *private_length);
SHIM_EXPORT int rcv_token(const char *text, uint8_t *client_key, uint8_t *server_key, char *room,
                          char *player, uint8_t *private_part, size_t *private_length)
{
    rc_token token;
    if (rc_token_decode(text, &token) != 0)
        return -1;
    memcpy(client_key, token.client_key, 32);
    memcpy(server_key, token.server_key, 32);
    memcpy(room, token.room, 65);
    memcpy(player, token.player, 65);
    memcpy(private_part, token.private_part, token.private_length);
    *private_length = token.private_length;
    return 0;
}

/* -- a connection driven from Python ----------------------------------------------------------- */

typedef struct rct_event {
    struct rct_event *next;
    int type;                       /* 1 connected, 2 message, 3 block, 4 disconnected */
    int channel;
    size_t length;
    uint8_t data[];
} rct_event;

typedef struct rct {
    rc_conn *conn;
    void *memory;
    rct_event *head, *tail;
} rct;

static void push(rct *t, int type, int channel, const void *data, size_t length)
{
    rct_event *e = malloc(sizeof *e + length + 1);
    if (!e)
        abort();
    e->next = NULL;
    e->type = type;
    e->channel = channel;
    e->length = length;
    if (length)
        memcpy(e->data, data, length);
    e->data[length] = 0;
    if (t->tail)
        t->tail->next = e;
    else
        t->head = e;
    t->tail = e;
}

static void on_connected(void *c) { push(c, 1, 0, NULL, 0); }
static void on_message(void *c, int ch, const uint8_t *d, size_t n) { push(c, 2, ch, d, n); }
static void on_block(void *c, const uint8_t *d, size_t n) { push(c, 3, 0, d, n); }
static void on_disconnected(void *c, const char *reason) { push(c, 4, 0, reason, strlen(reason)); }

/* peer_timeout <= 0, max_block_size 0, mtu 0: defaults. */
SHIM_EXPORT rct *rct_new(double peer_timeout, uint32_t max_block_size, uint32_t mtu);
SHIM_EXPORT rct *rct_new(double peer_timeout, uint32_t max_block_size, uint32_t mtu)
{
    rc_conn_config config;
    rc_conn_handler handler;
    rct *t = calloc(1, sizeof *t);
    size_t size;
    if (!t)
        return NULL;
    rc_conn_default_config(&config);
    if (peer_timeout > 0)
        config.peer_timeout = peer_timeout;
    if (max_block_size)
        config.max_block_size = max_block_size;
    if (mtu) {
        config.mtu = mtu;
        config.max_send_size = mtu - 41;
    }
    size = rc_conn_memory_size(&config);
    t->memory = size ? malloc(size) : NULL;
    handler.context = t;
    handler.on_connected = on_connected;
    handler.on_message = on_message;
    handler.on_block = on_block;
    handler.on_disconnected = on_disconnected;
    t->conn = t->memory ? rc_conn_init(t->memory, &config, &handler) : NULL;
    if (!t->conn) {
        free(t->memory);
        free(t);
        return NULL;
    }
    return t;
}

SHIM_EXPORT size_t rct_memory_size(void);
SHIM_EXPORT size_t rct_memory_size(void)
{
    rc_conn_config config;
    rc_conn_default_config(&config);
    return rc_conn_memory_size(&config);
}

SHIM_EXPORT void rct_free(rct *t);
SHIM_EXPORT void rct_free(rct *t)
{
    while (t->head) {
        rct_event *e = t->head;
        t->head = e->next;
        free(e);
    }
    free(t->memory);
    free(t);
}

SHIM_EXPORT int rct_connect(rct *t, uint32_t connect_id, const uint8_t *token, size_t tl,
                            const uint8_t *client_key, const uint8_t *server_key, double now);
SHIM_EXPORT int rct_connect(rct *t, uint32_t connect_id, const uint8_t *token, size_t tl,
                            const uint8_t *client_key, const uint8_t *server_key, double now)
{
    return rc_conn_connect(t->conn, connect_id, token, tl, client_key, server_key, now);
}

SHIM_EXPORT void rct_receive(rct *t, const uint8_t *data, size_t n, double now);
SHIM_EXPORT void rct_receive(rct *t, const uint8_t *data, size_t n, double now)
{
    rc_conn_receive(t->conn, data, n, now);
}

SHIM_EXPORT size_t rct_next_datagram(rct *t, uint8_t *out, size_t cap, double now);
SHIM_EXPORT size_t rct_next_datagram(rct *t, uint8_t *out, size_t cap, double now)
{
    return rc_conn_next_datagram(t->conn, out, cap, now);
}

SHIM_EXPORT double rct_next_timeout(rct *t);
SHIM_EXPORT double rct_next_timeout(rct *t) { return rc_conn_next_timeout(t->conn); }

SHIM_EXPORT void rct_handle_timeout(rct *t, double now);
SHIM_EXPORT void rct_handle_timeout(rct *t, double now) { rc_conn_handle_timeout(t->conn, now); }

SHIM_EXPORT int rct_send(rct *t, int channel, const uint8_t *data, size_t n);
SHIM_EXPORT int rct_send(rct *t, int channel, const uint8_t *data, size_t n)
{
    return rc_conn_send(t->conn, channel, data, n);
}

SHIM_EXPORT void rct_disconnect(rct *t, int reason, double now);
SHIM_EXPORT void rct_disconnect(rct *t, int reason, double now)
{
    rc_conn_disconnect(t->conn, (uint8_t)reason, now);
}

SHIM_EXPORT int rct_state(rct *t);
SHIM_EXPORT int rct_state(rct *t) { return (int)rc_conn_get_state(t->conn); }

SHIM_EXPORT int rct_sealed(rct *t);
SHIM_EXPORT int rct_sealed(rct *t) { return rc_conn_is_sealed(t->conn); }

SHIM_EXPORT uint32_t rct_pending(rct *t, int channel);
SHIM_EXPORT uint32_t rct_pending(rct *t, int channel) { return rc_conn_pending(t->conn, channel); }

SHIM_EXPORT void rct_stats(rct *t, rc_conn_stats *stats);
SHIM_EXPORT void rct_stats(rct *t, rc_conn_stats *stats) { rc_conn_get_stats(t->conn, stats); }

/* Length of the oldest event (-1: none); rct_pop copies it out and removes it. */
SHIM_EXPORT long rct_peek(rct *t, int *type, int *channel);
SHIM_EXPORT long rct_peek(rct *t, int *type, int *channel)
{
    if (!t->head)
        return -1;
    *type = t->head->type;
    *channel = t->head->channel;
    return (long)t->head->length;
}

SHIM_EXPORT void rct_pop(rct *t, uint8_t *out);
SHIM_EXPORT void rct_pop(rct *t, uint8_t *out)
{
    rct_event *e = t->head;
    if (!e)
        return;
    if (e->length)
        memcpy(out, e->data, e->length);
    t->head = e->next;
    if (!t->head)
        t->tail = NULL;
    free(e);
}
