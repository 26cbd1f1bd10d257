/* test_conn.c - the connection state machine against a scripted server built with the wire
 * codec: handshake, acks, duplicates, refused records, ack scheduling, heartbeats, timeouts,
 * disconnects, REFUSE, PATH_CHALLENGE, sealed sessions, malformed input; ack-gap judgement and
 * what each mode of the redundancy controller writes (PROTOCOL 11.3, 11.5, 12.4, 14.5). */
#include "conn.h"
#include "crypto.h"
#include "link.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

#define CID 0x11223344u
#define SID 0xCAFEBABEu

typedef struct events {
    int connected, messages, blocks, disconnected;
    char reason[64];
    uint8_t last[2048];
    size_t last_length;
    int last_channel;
} events;

static void on_connected(void *c) { ((events *)c)->connected++; }
static void on_message(void *c, int channel, const uint8_t *d, size_t n)
{
    events *e = c;
    e->messages++;
    e->last_channel = channel;
    memcpy(e->last, d, n);
    e->last_length = n;
}
static void on_block(void *c, const uint8_t *d, size_t n) { (void)d; (void)n; ((events *)c)->blocks++; }
static void on_disconnected(void *c, const char *reason)
{
    events *e = c;
    e->disconnected++;
    snprintf(e->reason, sizeof e->reason, "%s", reason);
}

typedef struct fixture {
    rc_conn *conn;
    void *memory;
    events ev;
    uint8_t out[2048];
    uint64_t base_dropped;          /* drops during the handshake (the repeated CHALLENGE) */
} fixture;

static void setup_with(fixture *f, const rc_conn_config *config)
{
    rc_conn_handler handler;
    memset(&f->ev, 0, sizeof f->ev);
    f->base_dropped = 0;
    handler.context = &f->ev;
    handler.on_connected = on_connected;
    handler.on_message = on_message;
    handler.on_block = on_block;
    handler.on_disconnected = on_disconnected;
    f->memory = malloc(rc_conn_memory_size(config));
    f->conn = rc_conn_init(f->memory, config, &handler);
}

static void setup(fixture *f, double peer_timeout)
{
    rc_conn_config config;
    rc_conn_default_config(&config);
    config.peer_timeout = peer_timeout;
    setup_with(f, &config);
}

static uint64_t dropped(fixture *f);

static size_t next(fixture *f, double now) { return rc_conn_next_datagram(f->conn, f->out, sizeof f->out, now); }

/* Datagrams dropped since the handshake completed. */
static uint64_t dropped(fixture *f)
{
    rc_conn_stats s;
    rc_conn_get_stats(f->conn, &s);
    return s.datagrams_dropped - f->base_dropped;
}

/* Connects in open mode (or sealed with keys). */
static void handshake(fixture *f, const uint8_t *token, size_t tl, const uint8_t *ck, const uint8_t *sk)
{
    uint8_t p[64], mac[16];
    size_t n;
    int connected = f->ev.connected;
    memset(mac, 0xAB, 16);
    CHECK(rc_conn_connect(f->conn, CID, token, tl, ck, sk, 0.0) == 0);
    CHECK(rc_conn_get_state(f->conn) == RC_CONNECTING);
    n = next(f, 0.0);
    CHECK(n == (token ? 11 + tl : 64) && f->out[3] == RC_PT_CONNECT_REQUEST);
    CHECK(next(f, 0.05) == 0);                       /* resend only after the interval */
    CHECK(next(f, 0.1) > 0);
    n = rc_write_challenge(p, CID, 1234, mac);
    rc_conn_receive(f->conn, p, n, 0.12);
    CHECK(rc_conn_get_state(f->conn) == RC_CHALLENGED);
    n = next(f, 0.12);
    CHECK(f->out[3] == RC_PT_CONNECT_RESPONSE && n == (token ? 49 + tl : 30));
    CHECK(rc_get_u32(f->out + 4) == CID && rc_get_u32(f->out + 8) == 1234 && f->out[12] == 0xAB);
    CHECK(rc_get_u16(f->out + 28) == 33);
    rc_conn_receive(f->conn, p, rc_write_challenge(p, CID, 1234, mac), 0.13);   /* repeat: dropped */
    n = rc_write_accept(p, CID, SID, 5, token ? 1 : 0, sk);
    rc_conn_receive(f->conn, p, n, 0.15);
    CHECK(rc_conn_get_state(f->conn) == RC_CONNECTED && f->ev.connected == connected + 1);
    CHECK(rc_conn_session_id(f->conn) == SID);
    f->base_dropped = dropped(f);
}

static size_t server_data(uint8_t *p, uint16_t seq, uint16_t ack, uint32_t bits, uint16_t send_time)
{
    rc_data_header h;
    h.session_id = SID;
    h.seq = seq;
    h.ack = ack;
    h.ack_bits = bits;
    h.send_time = send_time;
    h.echo_time = 0;
    rc_data_header_write(p, &h);
    return RC_DATA_HEADER_SIZE;
}

static void test_open_handshake_then_messages_and_acks(void)
{
    fixture f;
    uint8_t p[256];
    size_t n;
    rc_data_header h;
    rc_conn_stats s;
    setup(&f, 10.0);
    CHECK(rc_conn_send(f.conn, 0, (const uint8_t *)"x", 1) == -1);   /* closed */
    handshake(&f, NULL, 0, NULL, NULL);
    CHECK(rc_conn_send(f.conn, 0, (const uint8_t *)"hello", 5) == 0);
    n = next(&f, 0.2);
    CHECK(n == 20 + 4 + 5 && f.out[3] == RC_PT_DATA);
    rc_data_header_read(f.out, &h);
    CHECK(h.session_id == SID && h.seq == 0 && h.ack_bits == 0 && h.send_time == 200);
    CHECK(next(&f, 0.2) == 0 && rc_conn_pending(f.conn, 0) == 1);
    /* the server acks packet 0 and sends message 0 on channel 1 */
    n = server_data(p, 0, 0, 1, 500);
    n += rc_message_record_write(p + n, 1, 0, (const uint8_t *)"frame", 5);
    rc_conn_receive(f.conn, p, n, 0.25);
    CHECK(f.ev.messages == 1 && f.ev.last_channel == 1 && memcmp(f.ev.last, "frame", 5) == 0);
    CHECK(rc_conn_pending(f.conn, 0) == 0);
    rc_conn_get_stats(f.conn, &s);
    CHECK(s.packets_acked == 1 && s.rtt > 0);
    /* the ack waits for ack_delay (1/30 s), then goes alone */
    CHECK(next(&f, 0.26) == 0);
    CHECK(rc_conn_next_timeout(f.conn) > 0.28 && rc_conn_next_timeout(f.conn) < 0.29);
    n = next(&f, 0.3125);
    rc_data_header_read(f.out, &h);
    CHECK(n == 20 && h.ack == 0 && h.ack_bits == 1 && h.seq == 1);
    CHECK(h.echo_time == (uint16_t)(500 + 62));      /* held 62.5 ms, floored */
    /* a network duplicate is dropped and not delivered again */
    rc_conn_receive(f.conn, p, server_data(p, 0, 0, 1, 500) + rc_message_record_write(p + 20, 1, 0, (const uint8_t *)"frame", 5), 0.32);
    CHECK(f.ev.messages == 1 && dropped(&f) == 1);
    /* a packet with only BLOCK_ACK records schedules no ack; a heartbeat follows later */
    n = server_data(p, 1, 1, 3, 600);
    n += rc_block_ack_record_write(p + n, 0, 0, NULL, 0);
    rc_conn_receive(f.conn, p, n, 0.33);
    CHECK(next(&f, 0.5) == 0 && next(&f, 0.8) == 0);
    CHECK(next(&f, 0.82) > 0);                       /* heartbeat_interval after the last send */
    free(f.memory);
}

static void test_a_refused_record_leaves_the_packet_unacknowledged(void)
{
    fixture f;
    uint8_t p[256];
    size_t n;
    rc_data_header h;
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    n = server_data(p, 0, 0, 0, 0);
    n += rc_message_record_write(p + n, 0, 0, (const uint8_t *)"a", 1);
    n += rc_message_record_write(p + n, 5, 0, (const uint8_t *)"b", 1);   /* unknown channel */
    rc_conn_receive(f.conn, p, n, 0.2);
    CHECK(f.ev.messages == 1 && dropped(&f) == 1);
    n = next(&f, 0.8);
    rc_data_header_read(f.out, &h);
    CHECK(n == 20 && h.ack_bits == 0);                /* nothing acknowledged */
    /* the same packet again: the first record is a harmless duplicate, still refused */
    rc_conn_receive(f.conn, p, server_data(p, 0, 0, 0, 0) + 5 + 5, 0.9);
    CHECK(f.ev.messages == 1 && dropped(&f) == 2);
    /* malformed datagrams are counted, never crash */
    rc_conn_receive(f.conn, p, 3, 1.0);
    rc_conn_receive(f.conn, (const uint8_t *)"RL\1\6\0\0\0\0", 8, 1.0);
    CHECK(dropped(&f) == 4);
    free(f.memory);
}

static void test_peer_timeout_sends_three_disconnects(void)
{
    fixture f;
    int i;
    setup(&f, 2.0);
    handshake(&f, NULL, 0, NULL, NULL);
    CHECK(rc_conn_next_timeout(f.conn) <= 0.15 + 0.5 + 1e-9);
    for (i = 0; i < 3; i++)
        while (next(&f, 0.2 + i * 0.5) > 0) {}
    rc_conn_handle_timeout(f.conn, 2.16);
    CHECK(f.ev.disconnected == 1 && strcmp(f.ev.reason, "timeout") == 0);
    CHECK(rc_conn_get_state(f.conn) == RC_DISCONNECTING);
    for (i = 0; i < 3; i++) {
        CHECK(next(&f, 2.16) == RC_DISCONNECT_SIZE && f.out[3] == RC_PT_DISCONNECT && f.out[8] == 4);
        CHECK(rc_get_u32(f.out + 4) == SID);
    }
    CHECK(next(&f, 2.16) == 0 && rc_conn_get_state(f.conn) == RC_CLOSED);
    free(f.memory);
}

static void test_remote_and_local_disconnects(void)
{
    fixture f;
    uint8_t p[32];
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    rc_conn_receive(f.conn, p, rc_write_disconnect(p, SID + 1, 3), 0.2);  /* wrong session */
    CHECK(f.ev.disconnected == 0);
    rc_conn_receive(f.conn, p, rc_write_disconnect(p, SID, 3), 0.2);
    CHECK(f.ev.disconnected == 1 && strcmp(f.ev.reason, "remote:kicked") == 0);
    CHECK(rc_conn_get_state(f.conn) == RC_CLOSED && next(&f, 0.3) == 0);
    handshake(&f, NULL, 0, NULL, NULL);
    rc_conn_disconnect(f.conn, 2, 0.3);
    CHECK(strcmp(f.ev.reason, "local:shutdown") == 0);
    CHECK(next(&f, 0.3) == 9 && next(&f, 0.3) == 9 && next(&f, 0.3) == 9 && next(&f, 0.3) == 0);
    free(f.memory);
}

static void test_refuse_and_connect_timeout(void)
{
    fixture f;
    uint8_t p[16];
    setup(&f, 10.0);
    CHECK(rc_conn_connect(f.conn, CID, NULL, 0, NULL, NULL, 0.0) == 0);
    rc_conn_receive(f.conn, p, rc_write_refuse(p, CID + 1, 1), 0.01);       /* other attempt */
    CHECK(f.ev.disconnected == 0);
    rc_conn_receive(f.conn, p, rc_write_refuse(p, CID, 1), 0.01);
    CHECK(strcmp(f.ev.reason, "refused:server_full") == 0 && rc_conn_get_state(f.conn) == RC_CLOSED);
    CHECK(rc_conn_connect(f.conn, CID, NULL, 0, NULL, NULL, 1.0) == 0);
    rc_conn_handle_timeout(f.conn, 5.9);
    CHECK(f.ev.disconnected == 1);
    rc_conn_handle_timeout(f.conn, 6.0);
    CHECK(f.ev.disconnected == 2 && strcmp(f.ev.reason, "connect_timeout") == 0);
    free(f.memory);
}

static void test_path_challenge_is_answered_with_the_session_id(void)
{
    fixture f;
    uint8_t p[32], data[8] = { 9, 8, 7, 6, 5, 4, 3, 2 };
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    rc_conn_receive(f.conn, p, rc_write_path(p, RC_PT_PATH_CHALLENGE, SID, data), 0.2);
    CHECK(next(&f, 0.2) == RC_PATH_SIZE && f.out[3] == RC_PT_PATH_RESPONSE);
    CHECK(rc_get_u32(f.out + 4) == SID && memcmp(f.out + 8, data, 8) == 0);
    rc_conn_receive(f.conn, p, rc_write_path(p, RC_PT_PATH_RESPONSE, SID, data), 0.2);
    CHECK(dropped(&f) == 1);
    free(f.memory);
}

static void test_sealed_session_round_trip_and_forgery(void)
{
    fixture f;
    uint8_t token[127], ck[32], sk[32], p[256], plain[256];
    size_t n;
    rc_data_header h;
    memset(token, 1, sizeof token);
    memset(ck, 2, 32);
    memset(sk, 3, 32);
    setup(&f, 10.0);
    handshake(&f, token, sizeof token, ck, sk);
    CHECK(rc_conn_is_sealed(f.conn));
    rc_conn_send(f.conn, 1, (const uint8_t *)"input", 5);
    n = next(&f, 0.2);
    CHECK(n == 20 + 4 + 5 + 16);
    CHECK(rc_open_packet(plain, f.out, n, 20, RC_PT_DATA, 0, ck) == 0);
    CHECK(memcmp(plain + 24, "input", 5) == 0);
    /* server DATA sealed with counter 0, then a forged copy */
    n = server_data(p, 0, 0, 1, 0);
    n += rc_message_record_write(p + n, 0, 0, (const uint8_t *)"ok", 2);
    n = rc_seal_data(p, n, 0, sk);
    p[25] ^= 1;
    rc_conn_receive(f.conn, p, n, 0.25);
    CHECK(f.ev.messages == 0 && dropped(&f) == 1 && rc_conn_pending(f.conn, 1) == 1);
    p[25] ^= 1;
    rc_conn_receive(f.conn, p, n, 0.25);
    CHECK(f.ev.messages == 1 && rc_conn_pending(f.conn, 1) == 0);
    /* an unsealed DISCONNECT cannot end it; the sealed one does */
    rc_conn_receive(f.conn, p, rc_write_disconnect(p, SID, 0), 0.3);
    CHECK(f.ev.disconnected == 0);
    n = next(&f, 0.3);
    rc_data_header_read(f.out, &h);
    CHECK(h.seq == 1);
    rc_conn_receive(f.conn, p, rc_write_disconnect_sealed(p, SID, 3, 1, sk), 0.4);
    CHECK(f.ev.disconnected == 1 && strcmp(f.ev.reason, "remote:kicked") == 0);
    free(f.memory);
}

static void test_token_mode_rejects_an_untagged_accept(void)
{
    fixture f;
    uint8_t token[127], ck[32], sk[32], p[64], mac[16] = { 0 };
    memset(token, 1, sizeof token);
    memset(ck, 2, 32);
    memset(sk, 3, 32);
    setup(&f, 10.0);
    CHECK(rc_conn_connect(f.conn, CID, token, sizeof token, ck, sk, 0.0) == 0);
    rc_conn_receive(f.conn, p, rc_write_challenge(p, CID, 1, mac), 0.0);
    rc_conn_receive(f.conn, p, rc_write_accept(p, CID, SID, 5, 0, NULL), 0.0);
    CHECK(rc_conn_get_state(f.conn) == RC_CHALLENGED && dropped(&f) == 1);
    rc_conn_receive(f.conn, p, rc_write_accept(p, CID, SID, 5, 1, ck), 0.0);   /* wrong key */
    CHECK(rc_conn_get_state(f.conn) == RC_CHALLENGED && dropped(&f) == 2);
    rc_conn_receive(f.conn, p, rc_write_accept(p, CID, SID, 5, 0, sk), 0.0);
    CHECK(rc_conn_get_state(f.conn) == RC_CONNECTED && !rc_conn_is_sealed(f.conn));
    free(f.memory);
}

static void test_config_validation_and_memory(void)
{
    rc_conn_config c;
    rc_conn_default_config(&c);
    CHECK(rc_conn_validate_config(&c) == 0);
    CHECK(rc_conn_memory_size(&c) - c.max_block_size < 1024u * 1024u);
    c.max_send_size = c.mtu - 40;
    CHECK(rc_conn_validate_config(&c) == -1 && rc_conn_memory_size(&c) == 0);
    rc_conn_default_config(&c);
    c.heartbeat_interval = c.peer_timeout;
    CHECK(rc_conn_validate_config(&c) == -1);
    rc_conn_default_config(&c);
    c.mtu = 500;
    CHECK(rc_conn_validate_config(&c) == -1);
    /* The controller's settings, in relay_core's ranges. */
    rc_conn_default_config(&c);
    CHECK(c.burst_threshold == 0.2 && c.congestion_delay == 0.05 && c.congestion_hold == 5.0);
    CHECK(c.min_rtt_window == 10.0 && c.congested_copies == 0 && c.prompt_copies == 1);
    c.congested_copies = 16;
    c.prompt_copies = 16;
    CHECK(rc_conn_validate_config(&c) == 0);
#define REFUSED(field, value) do { rc_conn_default_config(&c); c.field = value; \
        CHECK(rc_conn_validate_config(&c) == -1); } while (0)
    REFUSED(burst_threshold, 0.0);
    REFUSED(burst_threshold, 1.0);
    REFUSED(congestion_delay, 0.0);
    REFUSED(congestion_hold, 0.0);
    REFUSED(min_rtt_window, -1.0);
    REFUSED(congested_copies, 17);
    REFUSED(prompt_copies, 0);
    REFUSED(prompt_copies, 17);
    REFUSED(redundancy_loss_memory, 0);
#undef REFUSED
}

/* -- ack gaps and the redundancy controller ---------------------------------------------- */

/* The ids of the stream MESSAGE records in the client's datagram f->out[0..n). */
static int stream_ids(const fixture *f, size_t n, uint16_t *out, int cap)
{
    size_t pos = RC_DATA_HEADER_SIZE, after;
    rc_record r;
    int count = 0;
    while (pos < n && rc_record_parse(f->out, pos, n, &r, &after) == RC_OK) {
        if (r.kind == RC_RK_MESSAGE && r.channel == RC_STREAM && count < cap)
            out[count++] = r.msg_id;
        pos = after;
    }
    return count;
}

static int has_id(const uint16_t *ids, int count, uint16_t id)
{
    int i;
    for (i = 0; i < count; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

/* Queues stream message id and returns the length of the datagram sent at t. */
static size_t stream(fixture *f, uint16_t id, double t)
{
    uint8_t payload[8] = { 0 };
    payload[0] = (uint8_t)id;
    payload[1] = (uint8_t)(id >> 8);
    CHECK(rc_conn_send(f->conn, RC_STREAM, payload, sizeof payload) == 0);
    return next(f, t);
}

/* A server DATA packet with no records (so the client owes no ack) acking our packet ack - i
 * for each bit i; its echo_time says ack was sent at echo_sent: the RTT sample is about
 * now - echo_sent. */
static void server_ack(fixture *f, uint16_t seq, uint16_t ack, uint32_t bits, double echo_sent,
                       double now)
{
    uint8_t p[RC_DATA_HEADER_SIZE];
    rc_data_header h;
    h.session_id = SID;
    h.seq = seq;
    h.ack = ack;
    h.ack_bits = bits;
    h.send_time = 0;
    h.echo_time = (uint16_t)(uint32_t)(echo_sent * 1000.0 + 0.5);
    rc_data_header_write(p, &h);
    rc_conn_receive(f->conn, p, sizeof p, now);
}

static rc_conn_stats stats_of(const fixture *f)
{
    rc_conn_stats s;
    rc_conn_get_stats(f->conn, &s);
    return s;
}

static void test_a_new_connection_is_lossy_and_copies_promptly(void)
{
    fixture f;
    uint16_t ids[8];
    size_t n;
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    CHECK(stats_of(&f).redundancy_mode == RC_LINK_LOSSY && stats_of(&f).burst_length == 1.0);
    CHECK(stream(&f, 0, 0.2) > 0);
    n = stream(&f, 1, 0.21);
    CHECK(stream_ids(&f, n, ids, 8) == 2 && ids[0] == 1 && ids[1] == 0);   /* new, then the copy */
    n = stream(&f, 2, 0.22);                /* 0's second copy waits until its ack is overdue */
    CHECK(stream_ids(&f, n, ids, 8) == 2 && ids[0] == 2 && ids[1] == 1);
    CHECK(stats_of(&f).redundant_bytes == 2 * (4 + 8));
    free(f.memory);
}

static void test_ack_gap_judges_a_packet_three_packets_older(void)
{
    fixture f;
    uint16_t ids[8];
    size_t n;
    int k;
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    /* Datagram k carries message k and a prompt copy of k - 1. */
    for (k = 0; k < 5; k++)
        CHECK(stream(&f, (uint16_t)k, 0.2 + 0.01 * k) > 0);
    /* Packet 2 acked with a 100 ms RTT: the reorder window, 4 x RTTVAR, is 200 ms. Packets 0
     * and 1 are only 1 and 2 packets older: not judged, nothing resent. */
    server_ack(&f, 0, 2, 1u, 0.22, 0.32);
    CHECK(next(&f, 0.32) == 0);
    /* Packet 4 (and 3, 2): packets 0 and 1 are 3 and more older and were sent more than
     * reorder_tolerance before it, so they are judged lost although within the window; 1 was
     * message 0's latest carrier, so message 0 is resent at once. Packet 2 waits. */
    server_ack(&f, 1, 4, 7u, 0.24, 0.34);
    n = next(&f, 0.34);
    CHECK(n > 0 && stream_ids(&f, n, ids, 8) == 1 && ids[0] == 0);
    CHECK(stats_of(&f).redundancy_mode == RC_LINK_LOSSY);
    free(f.memory);

    /* Packets of one burst never judge each other, however many apart. */
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    for (k = 0; k < 4; k++)
        CHECK(stream(&f, (uint16_t)k, 0.2) > 0);
    server_ack(&f, 0, 3, 1u, 0.2, 0.3);
    CHECK(next(&f, 0.3) == 0);
    free(f.memory);
}

static void test_a_clean_stream_carries_rto_expiries_and_resends_once_it_stops(void)
{
    fixture f;
    rc_conn_config config;
    uint16_t ids[8];
    size_t n;
    uint64_t sent;
    double t, t10 = 0.7, t11 = 0.75;
    int k, steps;
    rc_conn_default_config(&config);
    config.redundancy_loss_memory = 4;
    setup_with(&f, &config);
    handshake(&f, NULL, 0, NULL, NULL);
    /* A 20 Hz stream over a 20 ms path, every datagram acked: clean after 4 judged. */
    for (k = 0; k < 10; k++) {
        t = 0.2 + 0.05 * k;
        CHECK(stream(&f, (uint16_t)k, t) > 0);
        server_ack(&f, (uint16_t)k, (uint16_t)k, (2u << k) - 1u, t, t + 0.02);
    }
    rc_conn_handle_timeout(f.conn, 0.68);
    CHECK(stats_of(&f).redundancy_mode == RC_LINK_CLEAN && stats_of(&f).redundant_bytes == 0);
    sent = stats_of(&f).packets_sent;
    /* The acks stop coming (the RTT jumps): message 10's RTO expires while the stream is live.
     * It is only marked overdue; no datagram of its own. */
    n = stream(&f, 10, t10);
    CHECK(stream_ids(&f, n, ids, 8) == 1 && ids[0] == 10);
    t = rc_conn_next_timeout(f.conn);
    CHECK(t > t10 + 0.029 && t < t10 + 0.045);
    CHECK(next(&f, t) == 0 && stats_of(&f).resends == 1);
    /* It rides the stream's next datagram, as a resend, not a copy. */
    n = stream(&f, 11, t11);
    CHECK(stream_ids(&f, n, ids, 8) == 2 && has_id(ids, 2, 10) && has_id(ids, 2, 11));
    CHECK(stats_of(&f).packets_sent == sent + 2 && stats_of(&f).redundant_bytes == 0);
    /* The stream stops. The expiries that follow are marked overdue too, and the first that no
     * datagram carried within min(rto, 2 x interval) is resent in a datagram of its own (with
     * the other overdue one riding along). */
    n = 0;
    for (steps = 0; n == 0 && steps < 10; steps++) {
        t = rc_conn_next_timeout(f.conn);
        n = next(&f, t);
    }
    CHECK(n > 0 && t > t11 + 0.07 && t < t11 + 0.1);
    CHECK(stream_ids(&f, n, ids, 8) == 2 && has_id(ids, 2, 11) && has_id(ids, 2, 10));
    CHECK(stats_of(&f).resends == 3);
    /* The stream is dead now (nothing new within two intervals): an expiry is resent at once. */
    t = rc_conn_next_timeout(f.conn);
    n = next(&f, t);
    CHECK(n > 0 && stream_ids(&f, n, ids, 8) == 1 && ids[0] == 11);
    CHECK(stats_of(&f).resends == 4 && stats_of(&f).redundancy_mode == RC_LINK_CLEAN);
    free(f.memory);
}

static void test_runs_of_losses_copy_every_unacked_message_into_every_datagram(void)
{
    fixture f;
    uint16_t ids[16];
    size_t n;
    int k;
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    for (k = 0; k < 8; k++)
        CHECK(stream(&f, (uint16_t)k, 0.2 + 0.01 * k) > 0);
    /* Packets 3 and 4 lost together: judged received, received, received, lost, lost. */
    server_ack(&f, 0, 7, 0xE7u, 0.27, 0.3);
    n = stream(&f, 8, 0.31);                /* 3 (its latest carrier was 4) resent at once */
    CHECK(stream_ids(&f, n, ids, 16) == 2 && ids[0] == 3 && ids[1] == 8);
    CHECK(stats_of(&f).redundancy_mode == RC_LINK_BURSTY && stats_of(&f).burst_length > 1.5);
    n = stream(&f, 9, 0.31);
    CHECK(stream_ids(&f, n, ids, 16) == 3 && ids[0] == 9 && has_id(ids, 3, 3) && has_id(ids, 3, 8));
    n = stream(&f, 10, 0.31);               /* lossy would stop at one prompt copy each */
    CHECK(stream_ids(&f, n, ids, 16) == 4 && ids[0] == 10 && has_id(ids, 4, 3) && has_id(ids, 4, 8)
          && has_id(ids, 4, 9));
    free(f.memory);
}

static void test_a_filling_queue_stops_copies(void)
{
    fixture f;
    uint16_t ids[8];
    size_t n;
    setup(&f, 10.0);
    handshake(&f, NULL, 0, NULL, NULL);
    CHECK(stream(&f, 0, 0.2) > 0);
    n = stream(&f, 1, 0.2);
    CHECK(stream_ids(&f, n, ids, 8) == 2);                     /* lossy: a prompt copy */
    server_ack(&f, 0, 1, 3u, 0.2, 0.22);                        /* the floor: 20 ms */
    /* Two samples in a row 200 ms above it. */
    CHECK(stream(&f, 2, 0.3) > 0);
    server_ack(&f, 1, 2, 7u, 0.1, 0.32);
    CHECK(stream(&f, 3, 0.35) > 0);
    server_ack(&f, 2, 3, 15u, 0.15, 0.37);
    CHECK(stream(&f, 4, 0.4) > 0);
    n = stream(&f, 5, 0.4);
    CHECK(stream_ids(&f, n, ids, 8) == 1 && ids[0] == 5);      /* congested_copies 0: none */
    CHECK(stats_of(&f).redundancy_mode == RC_LINK_CONGESTED);
    free(f.memory);
}

int main(void)
{
    if (rc_crypto_init() != 0)
        return 1;
    test_open_handshake_then_messages_and_acks();
    test_a_refused_record_leaves_the_packet_unacknowledged();
    test_peer_timeout_sends_three_disconnects();
    test_remote_and_local_disconnects();
    test_refuse_and_connect_timeout();
    test_path_challenge_is_answered_with_the_session_id();
    test_sealed_session_round_trip_and_forgery();
    test_token_mode_rejects_an_untagged_accept();
    test_config_validation_and_memory();
    test_a_new_connection_is_lossy_and_copies_promptly();
    test_ack_gap_judges_a_packet_three_packets_older();
    test_a_clean_stream_carries_rto_expiries_and_resends_once_it_stops();
    test_runs_of_losses_copy_every_unacked_message_into_every_datagram();
    test_a_filling_queue_stops_copies();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
