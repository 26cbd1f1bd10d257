/* conn.c - the client connection state machine (PROTOCOL 5, 8-15), sans-I/O. */
#include "conn.h"
#include "block.h"
#include "channel.h"
#include "crypto.h"
#include "fragment.h"
#include "handshake.h"
#include "link.h"
#include "rtt.h"
#include "seqbuf.h"
#include "wire.h"

#include <string.h>

#define SENT_BUFFER 256u
#define RECEIVED_WINDOW 256u
#define UNIT_CAPACITY 4096u
#define ACK_WINDOW 32
/* A packet is also judged once the peer acks one this many packets newer (and sent after the
 * fixed reorder tolerance): the time window alone, 4 x RTTVAR, is wide on a jittery path. */
#define REORDER_PACKETS 3
#define SCRATCH_SIZE (16384u + 64u)
#define ARENA_SLACK 32768u                  /* the largest fragment twice: rounding up and an early last one */
#define CONTROL_WINDOW 16u
#define STREAM_WINDOW 64u
#define SEND_BUFFER_DEFAULT 32768u
#define ARENA_ENTRIES (2u * (CONTROL_WINDOW + STREAM_WINDOW))  /* a message and an early last fragment per slot */

typedef struct sent_packet {
    double send_time;
    uint64_t unit_start;
    uint32_t stamp;
    uint16_t unit_count;
    uint8_t acked;
} sent_packet;

struct rc_conn {
    rc_conn_config config;
    rc_conn_handler handler;
    rc_conn_state state;
    rc_handshake hs;
    double connect_started, next_handshake_send, last_now;

    uint32_t session_id;
    int sealed, token_mode;
    uint64_t send_counter;
    int have_largest;
    uint64_t largest;
    double peer_ack_delay;

    /* receiving */
    int have_received;
    uint16_t ack;
    uint32_t ack_bits;
    uint16_t ack_send_time;
    double ack_arrival;
    rc_seqbuf received;
    int ack_pending;
    double ack_due, last_receive;

    /* sending */
    rc_seqbuf sent;
    sent_packet *sent_packets;
    uint32_t *units;
    uint64_t unit_head;
    uint16_t highest_acked, loss_cursor, gap_cursor;
    int loss_cursor_set, gap_cursor_set;
    uint32_t stamp;
    double last_send, tokens, tokens_time;
    rc_rtt rtt;
    rc_link link;                   /* the redundancy controller (PROTOCOL 14.5) */

    rc_send_channel send[RC_CHANNEL_COUNT];
    rc_recv_channel recv[RC_CHANNEL_COUNT];
    rc_arena arena;
    rc_recv_limits limits;
    rc_block_recv block;

    /* control packets owed */
    int disconnect_left;
    uint8_t disconnect_packet[RC_DISCONNECT_SECURE_SIZE];
    size_t disconnect_length;
    int path_response_pending;
    uint8_t path_data[8];

    /* packet being written: units */
    uint64_t packet_unit_start;

    rc_conn_stats stats;
    uint8_t *scratch;
    char reason[48];
};

/* -- configuration and memory ------------------------------------------------------------ */

void rc_conn_default_config(rc_conn_config *c)
{
    memset(c, 0, sizeof *c);
    c->mtu = 1200;
    c->connect_timeout = 5.0;
    c->connect_resend_interval = 0.1;
    c->peer_timeout = 10.0;
    c->heartbeat_interval = 0.5;
    c->ack_delay = 1.0 / 30.0;
    c->rto_initial = 0.2;
    c->rto_min = 0.03;
    c->rto_max = 1.0;
    c->rto_limit = 5.0;
    c->max_resends = 20;
    c->max_message_size = 262144;
    c->reassembly_limit = 524288;
    c->max_block_size = 8u * 1024u * 1024u;
    c->send_queue = 1024;
    c->max_send_size = 1200 - 25 - 16;
    c->redundancy_budget = 1200;
    c->redundancy_copies = 4;
    c->redundancy_copy_wait = 1.0;
    c->redundancy_loss_memory = 128;
    c->reorder_tolerance = 0.005;
    c->burst_threshold = 0.2;
    c->congestion_delay = 0.05;
    c->congestion_hold = 5.0;
    c->min_rtt_window = 10.0;
    c->congested_copies = 0;
    c->prompt_copies = 1;
    c->send_rate = 2000000.0;
    c->send_buffer = SEND_BUFFER_DEFAULT;
}

int rc_conn_validate_config(const rc_conn_config *c)
{
    if (!c)
        return -1;
    if (c->mtu < 576 || c->mtu > 16384)
        return -1;
    if (!(c->connect_timeout > 0) || !(c->connect_resend_interval > 0) || !(c->peer_timeout > 0))
        return -1;
    if (!(c->heartbeat_interval > 0) || !(c->heartbeat_interval < c->peer_timeout))
        return -1;
    if (!(c->ack_delay >= 0) || c->ack_delay > 65.0)
        return -1;
    if (!(c->rto_initial > 0) || !(c->rto_min > 0) || !(c->rto_max >= c->rto_min) || !(c->rto_limit > 0))
        return -1;
    if (c->max_resends < 1 || c->max_resends > 10000)
        return -1;
    if (c->max_message_size < 1 || c->max_message_size > 255u * (c->mtu - 43))
        return -1;
    if (c->reassembly_limit < c->max_message_size || c->reassembly_limit > 0x40000000u)
        return -1;
    if (c->max_block_size < 1 || c->max_block_size > 65535u * (c->mtu - 49))
        return -1;
    if (c->send_queue < 1 || c->send_queue > 16384)
        return -1;
    if (c->max_send_size < 1 || c->max_send_size > c->mtu - 25 - 16 || c->max_send_size > c->send_buffer)
        return -1;
    if (c->send_buffer > 0x10000000u)
        return -1;
    if (c->redundancy_copies < 1 || c->redundancy_copies > 16)
        return -1;
    if (!(c->redundancy_copy_wait >= 0) || c->redundancy_copy_wait > 4)
        return -1;
    if (c->redundancy_loss_memory < 1 || c->redundancy_loss_memory > 65535)
        return -1;
    if (!(c->reorder_tolerance >= 0) || c->reorder_tolerance > 1)
        return -1;
    if (!(c->burst_threshold > 0) || !(c->burst_threshold < 1))
        return -1;
    if (!(c->congestion_delay > 0) || !(c->congestion_hold > 0) || !(c->min_rtt_window > 0))
        return -1;
    if (c->prompt_copies < 1 || c->prompt_copies > 16 || c->congested_copies > 16)
        return -1;
    if (!(c->send_rate > 0))
        return -1;
    return 0;
}

static const uint32_t windows[RC_CHANNEL_COUNT] = { CONTROL_WINDOW, STREAM_WINDOW };

/* The reassembly arena: reassembly_limit bytes, and at least room for the message delivery
 * waits on (never refused for the budget, PROTOCOL 12.5) with fragment rounding. Messages held
 * ahead of it get what is left beyond that room (rc_recv_limits.hold_limit). */
static uint32_t arena_size(const rc_conn_config *c)
{
    uint32_t least = c->max_message_size + ARENA_SLACK;
    return c->reassembly_limit > least ? c->reassembly_limit : least;
}

typedef struct layout {
    size_t received_tags, sent_tags, sent_packets, units;
    size_t send_msgs[RC_CHANNEL_COUNT], send_bytes[RC_CHANNEL_COUNT], recv_slots[RC_CHANNEL_COUNT];
    size_t arena_entries, arena, bitmap, block, scratch, total;
} layout;

static size_t align_up(size_t n) { return (n + 15u) & ~(size_t)15u; }

static void plan(const rc_conn_config *c, layout *l)
{
    size_t at = align_up(sizeof(rc_conn));
    int i;
#define TAKE(field, bytes) do { l->field = at; at = align_up(at + (bytes)); } while (0)
    TAKE(received_tags, RECEIVED_WINDOW * sizeof(uint32_t));
    TAKE(sent_tags, SENT_BUFFER * sizeof(uint32_t));
    TAKE(sent_packets, SENT_BUFFER * sizeof(sent_packet));
    TAKE(units, UNIT_CAPACITY * sizeof(uint32_t));
    for (i = 0; i < RC_CHANNEL_COUNT; i++) {
        TAKE(send_msgs[i], (windows[i] + c->send_queue) * sizeof(rc_out_msg));
        TAKE(send_bytes[i], c->send_buffer);
        TAKE(recv_slots[i], windows[i] * sizeof(rc_in_slot));
    }
    TAKE(arena_entries, ARENA_ENTRIES * sizeof(rc_arena_entry));
    TAKE(arena, arena_size(c));
    TAKE(bitmap, RC_BLOCK_BITMAP_BYTES);
    TAKE(scratch, SCRATCH_SIZE);
    TAKE(block, c->max_block_size);
#undef TAKE
    l->total = at;
}

size_t rc_conn_memory_size(const rc_conn_config *config)
{
    layout l;
    if (rc_conn_validate_config(config) != 0)
        return 0;
    plan(config, &l);
    return l.total;
}

static void reset_session(rc_conn *conn, double now)
{
    int i;
    conn->session_id = 0;
    conn->sealed = 0;
    conn->send_counter = 0;
    conn->have_largest = 0;
    conn->largest = 0;
    conn->peer_ack_delay = conn->config.ack_delay;
    conn->have_received = 0;
    conn->ack = 0;
    conn->ack_bits = 0;
    conn->ack_send_time = 0;
    conn->ack_arrival = 0;
    rc_seqbuf_clear(&conn->received);
    rc_seqbuf_clear(&conn->sent);
    conn->ack_pending = 0;
    conn->unit_head = 0;
    conn->highest_acked = 65535;
    conn->loss_cursor = conn->gap_cursor = 0;
    conn->loss_cursor_set = conn->gap_cursor_set = 0;
    conn->stamp = 0;
    rc_rtt_init(&conn->rtt, conn->config.rto_initial, conn->config.rto_min, conn->config.rto_max);
    rc_link_init(&conn->link, conn->config.redundancy_loss_memory, conn->config.burst_threshold,
                 conn->config.congestion_delay, conn->config.congestion_hold,
                 conn->config.min_rtt_window, now);
    for (i = 0; i < RC_CHANNEL_COUNT; i++) {
        rc_send_channel_reset(&conn->send[i]);
        rc_recv_channel_reset(&conn->recv[i], &conn->arena);
    }
    rc_arena_reset(&conn->arena);
    rc_block_recv_reset(&conn->block);
    conn->disconnect_left = 0;
    conn->path_response_pending = 0;
}

rc_conn *rc_conn_init(void *memory, const rc_conn_config *config, const rc_conn_handler *handler)
{
    rc_conn *conn = memory;
    uint8_t *base = memory;
    layout l;
    int i;
    if (!memory || rc_conn_validate_config(config) != 0)
        return NULL;
    if (rc_crypto_init() != 0)
        return NULL;
    plan(config, &l);
    memset(conn, 0, sizeof *conn);
    conn->config = *config;
    if (handler)
        conn->handler = *handler;
    rc_seqbuf_init(&conn->received, (uint32_t *)(void *)(base + l.received_tags), RECEIVED_WINDOW);
    rc_seqbuf_init(&conn->sent, (uint32_t *)(void *)(base + l.sent_tags), SENT_BUFFER);
    conn->sent_packets = (sent_packet *)(void *)(base + l.sent_packets);
    conn->units = (uint32_t *)(void *)(base + l.units);
    for (i = 0; i < RC_CHANNEL_COUNT; i++) {
        rc_send_channel_init(&conn->send[i], i, i == RC_STREAM, windows[i], config->send_queue,
                             (rc_out_msg *)(void *)(base + l.send_msgs[i]),
                             base + l.send_bytes[i], config->send_buffer, config->max_resends,
                             config->rto_limit);
        rc_recv_channel_init(&conn->recv[i], i, windows[i], (rc_in_slot *)(void *)(base + l.recv_slots[i]));
    }
    rc_arena_init(&conn->arena, base + l.arena, arena_size(config),
                  (rc_arena_entry *)(void *)(base + l.arena_entries), ARENA_ENTRIES);
    conn->limits.arena = &conn->arena;
    conn->limits.max_message_size = config->max_message_size;
    conn->limits.hold_limit = arena_size(config) - config->max_message_size - ARENA_SLACK;
    rc_block_recv_init(&conn->block, base + l.block, config->max_block_size, base + l.bitmap);
    conn->scratch = base + l.scratch;
    conn->state = RC_CLOSED;
    reset_session(conn, 0.0);
    return conn;
}

/* -- helpers ----------------------------------------------------------------------------- */

/* floor() for the clock values here, without libm: x >= 0 truncates; others give 0. */
static double floor_pos(double x)
{
    if (!(x >= 0) || x >= 1.8e19)
        return 0.0;
    return (double)(uint64_t)x;
}

static uint16_t ms16(double now)
{
    return (uint16_t)(uint64_t)floor_pos(now * 1000.0);
}

static void close_with(rc_conn *conn, const char *reason)
{
    size_t n = strlen(reason);
    if (n >= sizeof conn->reason)
        n = sizeof conn->reason - 1;
    memcpy(conn->reason, reason, n);
    conn->reason[n] = 0;
    if (conn->handler.on_disconnected)
        conn->handler.on_disconnected(conn->handler.context, conn->reason);
}

/* Connected -> disconnecting with DISCONNECT(code) x3 owed; reports reason. */
static void begin_disconnect(rc_conn *conn, uint8_t code, const char *reason)
{
    if (conn->sealed) {
        conn->disconnect_length = rc_write_disconnect_sealed(conn->disconnect_packet, conn->session_id,
                                                             code, conn->send_counter,
                                                             conn->hs.client_key);
        conn->send_counter++;
    } else {
        conn->disconnect_length = rc_write_disconnect(conn->disconnect_packet, conn->session_id, code);
    }
    conn->disconnect_left = 3;
    conn->state = RC_DISCONNECTING;
    close_with(conn, reason);
}

static void drop(rc_conn *conn)
{
    conn->stats.datagrams_dropped++;
}

static double tag_reserve(const rc_conn *conn) { return conn->token_mode ? RC_TAG_SIZE : 0; }

static void refill(rc_conn *conn, double now)
{
    double capacity = conn->config.send_rate * 0.05;
    if (capacity < 4.0 * conn->config.mtu)
        capacity = 4.0 * conn->config.mtu;
    if (now > conn->tokens_time) {
        conn->tokens += (now - conn->tokens_time) * conn->config.send_rate;
        conn->tokens_time = now;
    }
    if (conn->tokens > capacity)
        conn->tokens = capacity;
}

/* -- connect ----------------------------------------------------------------------------- */

int rc_conn_connect(rc_conn *conn, uint32_t connect_id, const uint8_t *token_private,
                    size_t token_length, const uint8_t client_key[32],
                    const uint8_t server_key[32], double now)
{
    double ad_ms = floor_pos(conn->config.ack_delay * 1000.0 + 0.5);
    if (!conn || connect_id == 0)
        return -1;
    if (ad_ms > 65535)
        ad_ms = 65535;
    if (rc_handshake_start(&conn->hs, connect_id, (uint16_t)ad_ms, token_private, token_length,
                           client_key, server_key) != 0)
        return -1;
    reset_session(conn, now);
    conn->token_mode = token_private != NULL;
    conn->state = RC_CONNECTING;
    conn->connect_started = now;
    conn->next_handshake_send = now;
    conn->last_now = now;
    conn->reason[0] = 0;
    return 0;
}

/* -- acks -------------------------------------------------------------------------------- */

static void ack_units(rc_conn *conn, const sent_packet *p)
{
    uint32_t i;
    if (conn->unit_head - p->unit_start > UNIT_CAPACITY)
        return;                                     /* the ring lapped it: RTO repairs */
    for (i = 0; i < p->unit_count; i++) {
        uint32_t u = conn->units[(p->unit_start + i) & (UNIT_CAPACITY - 1)];
        rc_send_channel_on_ack(&conn->send[u >> 16], (uint16_t)u);
    }
}

static void lost_units(rc_conn *conn, const sent_packet *p, double now)
{
    uint32_t i;
    if (conn->unit_head - p->unit_start > UNIT_CAPACITY)
        return;
    for (i = 0; i < p->unit_count; i++) {
        uint32_t u = conn->units[(p->unit_start + i) & (UNIT_CAPACITY - 1)];
        if (conn->send[u >> 16].redundant)
            rc_send_channel_on_lost(&conn->send[u >> 16], (uint16_t)u, p->stamp, now);
    }
}

/* The peer holds ack: judge every older packet of ours sent more than the reorder window
 * before it, or 3 packets older and sent more than reorder_tolerance before it (PROTOCOL 11.5).
 * One not acked by now arrived after ack or never; each judgement goes to the controller in
 * send order. */
static void ack_gap(rc_conn *conn, uint16_t ack, double now)
{
    double window = 4.0 * conn->rtt.rttvar;
    double ack_time = conn->sent_packets[rc_seqbuf_index(&conn->sent, ack)].send_time;
    if (window < conn->config.reorder_tolerance)
        window = conn->config.reorder_tolerance;
    if (!conn->gap_cursor_set) {
        conn->gap_cursor = 0;
        conn->gap_cursor_set = 1;
    }
    if (rc_seq_diff(ack, conn->gap_cursor) > (int)SENT_BUFFER)
        conn->gap_cursor = (uint16_t)(ack - SENT_BUFFER);
    while (rc_seq_newer(ack, conn->gap_cursor)) {
        uint16_t p = conn->gap_cursor;
        if (rc_seqbuf_contains(&conn->sent, p)) {
            sent_packet *sp = &conn->sent_packets[rc_seqbuf_index(&conn->sent, p)];
            double ahead = ack_time - sp->send_time;
            if (!(ahead > window)
                && (rc_seq_diff(ack, p) < REORDER_PACKETS || !(ahead > conn->config.reorder_tolerance)))
                break;
            rc_link_judged(&conn->link, !sp->acked);
            if (!sp->acked)
                lost_units(conn, sp, now);
        }
        conn->gap_cursor++;
    }
}

static void judge_loss(rc_conn *conn, uint16_t ack)
{
    if (!conn->loss_cursor_set) {
        conn->loss_cursor = 0;
        conn->loss_cursor_set = 1;
    }
    if (rc_seq_diff(ack, conn->loss_cursor) > (int)(SENT_BUFFER + ACK_WINDOW))
        conn->loss_cursor = (uint16_t)(ack - SENT_BUFFER - ACK_WINDOW);
    while (rc_seq_diff(ack, conn->loss_cursor) >= ACK_WINDOW) {
        uint16_t p = conn->loss_cursor;
        if (rc_seqbuf_contains(&conn->sent, p)) {
            if (conn->sent_packets[rc_seqbuf_index(&conn->sent, p)].acked) {
                conn->stats.loss *= 0.95;
            } else {
                conn->stats.loss += 0.05 * (1.0 - conn->stats.loss);
                conn->stats.packets_lost++;
            }
        }
        conn->loss_cursor++;
    }
}

static void process_acks(rc_conn *conn, const rc_data_header *h, double now)
{
    int i;
    if (h->ack_bits == 0 || !rc_seqbuf_contains(&conn->sent, h->ack))
        return;
    if (rc_seq_newer(h->ack, conn->highest_acked))
        conn->highest_acked = h->ack;
    for (i = 0; i < 32; i++) {
        uint16_t s = (uint16_t)(h->ack - i);
        sent_packet *p;
        if (!(h->ack_bits & (1u << i)) || !rc_seqbuf_contains(&conn->sent, s))
            continue;
        p = &conn->sent_packets[rc_seqbuf_index(&conn->sent, s)];
        if (p->acked)
            continue;
        p->acked = 1;
        conn->stats.packets_acked++;
        ack_units(conn, p);
    }
    if (h->ack_bits & 1u) {
        double sample = (double)(uint16_t)(ms16(now) - h->echo_time) / 1000.0;
        if (sample < 60.0) {
            rc_rtt_sample(&conn->rtt, sample, conn->peer_ack_delay);
            rc_link_rtt(&conn->link, sample, conn->rtt.srtt, now);
        }
        ack_gap(conn, h->ack, now);
    }
    judge_loss(conn, h->ack);
}

static void mark_received(rc_conn *conn, const rc_data_header *h, double now)
{
    uint16_t s = h->seq;
    if (!conn->have_received) {
        conn->have_received = 1;
        conn->ack = s;
        conn->ack_bits = 1;
        conn->ack_send_time = h->send_time;
        conn->ack_arrival = now;
    } else {
        int d = rc_seq_diff(s, conn->ack);
        if (d > 0) {
            if (d > 1)
                rc_seqbuf_remove_range(&conn->received, (uint16_t)(conn->ack + 1), (uint16_t)(s - 1));
            conn->ack_bits = d >= 32 ? 1u : ((conn->ack_bits << d) | 1u);
            conn->ack = s;
            conn->ack_send_time = h->send_time;
            conn->ack_arrival = now;
        } else if (d < 0 && -d < 32) {
            conn->ack_bits |= 1u << (-d);
        }
    }
    rc_seqbuf_insert(&conn->received, s);
}

/* -- receive ----------------------------------------------------------------------------- */

static void deliver_message(void *context, int channel, const uint8_t *data, size_t length)
{
    rc_conn *conn = context;
    conn->stats.messages_received++;
    if (conn->handler.on_message)
        conn->handler.on_message(conn->handler.context, channel, data, length);
}

static void deliver_block(void *context, const uint8_t *data, size_t length)
{
    rc_conn *conn = context;
    if (conn->handler.on_block)
        conn->handler.on_block(conn->handler.context, data, length);
}

static void receive_data(rc_conn *conn, const uint8_t *p, size_t n, double now)
{
    rc_data_header h;
    size_t pos, original = n;
    int refused = RC_OK, schedules_ack = 0;
    uint64_t dups_before;
    if (rc_get_u32(p + 4) != conn->session_id) {
        drop(conn);
        return;
    }
    if (conn->sealed) {
        uint64_t counter;
        if (n < RC_DATA_HEADER_SIZE + RC_TAG_SIZE || n > SCRATCH_SIZE) {
            drop(conn);
            return;
        }
        counter = rc_counter_from_seq(conn->have_largest, conn->largest, rc_get_u16(p + 8));
        if (rc_open_packet(conn->scratch, p, n, RC_DATA_HEADER_SIZE, RC_PT_DATA, counter,
                           conn->hs.server_key) != 0) {
            drop(conn);
            return;
        }
        if (!conn->have_largest || counter > conn->largest) {
            conn->largest = counter;
            conn->have_largest = 1;
        }
        p = conn->scratch;
        n -= RC_TAG_SIZE;
    }
    rc_data_header_read(p, &h);
    if (conn->have_received) {
        int d = rc_seq_diff(h.seq, conn->ack);
        if (d <= 0 && (-d >= (int)RECEIVED_WINDOW || rc_seqbuf_contains(&conn->received, h.seq))) {
            drop(conn);
            return;
        }
    }
    conn->last_receive = now;
    conn->stats.packets_received++;
    conn->stats.bytes_received += original;
    process_acks(conn, &h, now);
    dups_before = conn->recv[0].duplicates + conn->recv[1].duplicates;
    for (pos = RC_DATA_HEADER_SIZE; pos < n && conn->state == RC_CONNECTED;) {
        rc_record r;
        size_t next = pos;
        refused = rc_record_parse(p, pos, n, &r, &next);
        if (refused)
            break;
        switch (r.kind) {
        case RC_RK_MESSAGE:
        case RC_RK_FRAGMENT:
            schedules_ack = 1;
            if (r.channel >= RC_CHANNEL_COUNT) {
                refused = RC_DROP_UNKNOWN_CHANNEL;
                break;
            }
            refused = rc_recv_channel_record(&conn->recv[r.channel], &conn->limits, r.msg_id,
                                             r.kind == RC_RK_FRAGMENT, r.fragment_index,
                                             r.fragment_count, r.payload, r.length,
                                             deliver_message, conn);
            break;
        case RC_RK_BLOCK_SLICE:
            schedules_ack = 1;
            refused = rc_block_recv_slice(&conn->block, &r, deliver_block, conn);
            break;
        default:
            break;                                  /* BLOCK_ACK: the client sends no blocks */
        }
        if (refused)
            break;
        pos = next;
    }
    conn->stats.duplicate_messages += conn->recv[0].duplicates + conn->recv[1].duplicates - dups_before;
    if (refused) {
        drop(conn);
        /* A block or message larger than this client was configured for would be offered
         * again and again, and the stream would stall: end the connection with the reason. */
        if (conn->state == RC_CONNECTED
            && (refused == RC_DROP_BLOCK_TOO_LARGE || refused == RC_DROP_MESSAGE_TOO_LARGE))
            begin_disconnect(conn, RC_REASON_PROTOCOL_ERROR, rc_drop_name(refused));
        return;
    }
    if (conn->state != RC_CONNECTED)
        return;
    mark_received(conn, &h, now);
    if (schedules_ack && !conn->ack_pending) {
        conn->ack_pending = 1;
        conn->ack_due = now + conn->config.ack_delay;
    }
}

static int open_control(rc_conn *conn, const uint8_t *p, size_t n, int type, uint8_t *plain)
{
    uint64_t counter = rc_counter_from_seq(conn->have_largest, conn->largest, rc_get_u16(p + 8));
    uint8_t buf[RC_PATH_SECURE_SIZE];
    if (n > sizeof buf || rc_open_packet(buf, p, n, 10, type, counter, conn->hs.server_key) != 0)
        return -1;
    memcpy(plain, buf + 10, n - 10 - RC_TAG_SIZE);
    if (!conn->have_largest || counter > conn->largest) {
        conn->largest = counter;
        conn->have_largest = 1;
    }
    return 0;
}

void rc_conn_receive(rc_conn *conn, const uint8_t *data, size_t length, double now)
{
    int type, result, code;
    char text[40];
    if (!conn || (!data && length))
        return;
    conn->last_now = now;
    type = rc_wire_check(data, length);
    if (type < 0) {
        drop(conn);
        return;
    }
    switch (type) {
    case RC_PT_CHALLENGE:
        if (conn->state != RC_CONNECTING || rc_handshake_on_challenge(&conn->hs, data, length) != RC_OK) {
            drop(conn);
            return;
        }
        conn->state = RC_CHALLENGED;
        conn->next_handshake_send = now;
        return;
    case RC_PT_ACCEPT:
        if (conn->state != RC_CHALLENGED) {
            drop(conn);                             /* duplicate_packet / unexpected_packet */
            return;
        }
        if (rc_handshake_on_accept(&conn->hs, data, length) != RC_OK) {
            drop(conn);
            return;
        }
        conn->session_id = conn->hs.session_id;
        conn->sealed = conn->hs.sealed;
        conn->peer_ack_delay = conn->hs.peer_ack_delay_ms / 1000.0;
        conn->state = RC_CONNECTED;
        conn->last_receive = now;
        conn->last_send = now;
        conn->tokens = 0;
        conn->tokens_time = now - 1e9;
        refill(conn, now);
        if (conn->handler.on_connected)
            conn->handler.on_connected(conn->handler.context);
        return;
    case RC_PT_REFUSE:
        if ((conn->state != RC_CONNECTING && conn->state != RC_CHALLENGED)
            || rc_handshake_on_refuse(&conn->hs, data, length, &code) != RC_OK) {
            drop(conn);
            return;
        }
        conn->state = RC_CLOSED;
        rc_reason_text(text, sizeof text, "refused:", code);
        close_with(conn, text);
        return;
    case RC_PT_DATA:
        if (conn->state != RC_CONNECTED) {
            drop(conn);
            return;
        }
        receive_data(conn, data, length, now);
        return;
    case RC_PT_DISCONNECT:
        if (conn->state != RC_CONNECTED || rc_get_u32(data + 4) != conn->session_id) {
            drop(conn);
            return;
        }
        if (conn->sealed) {
            uint8_t reason;
            if (length != RC_DISCONNECT_SECURE_SIZE
                || open_control(conn, data, length, RC_PT_DISCONNECT, &reason) != 0) {
                drop(conn);
                return;
            }
            code = reason;
        } else {
            if (length != RC_DISCONNECT_SIZE) {
                drop(conn);
                return;
            }
            code = data[8];
        }
        conn->state = RC_CLOSED;
        rc_reason_text(text, sizeof text, "remote:", code);
        close_with(conn, text);
        return;
    case RC_PT_PATH_CHALLENGE:
        if (conn->state != RC_CONNECTED) {
            drop(conn);
            return;
        }
        if (conn->sealed) {
            uint8_t challenge[8];
            if (length != RC_PATH_SECURE_SIZE
                || open_control(conn, data, length, RC_PT_PATH_CHALLENGE, challenge) != 0) {
                drop(conn);
                return;
            }
            memcpy(conn->path_data, challenge, 8);
        } else {
            if (length != RC_PATH_SIZE) {
                drop(conn);
                return;
            }
            memcpy(conn->path_data, data + 8, 8);
        }
        conn->path_response_pending = 1;
        return;
    default:                                        /* handshake requests, PATH_RESPONSE */
        result = RC_DROP_UNEXPECTED_PACKET;
        (void)result;
        drop(conn);
        return;
    }
}

/* -- timers ------------------------------------------------------------------------------ */

void rc_conn_handle_timeout(rc_conn *conn, double now)
{
    int i, mode, lateness_likely;
    if (!conn)
        return;
    conn->last_now = now;
    switch (conn->state) {
    case RC_CONNECTING:
    case RC_CHALLENGED:
        if (now >= conn->connect_started + conn->config.connect_timeout) {
            conn->state = RC_CLOSED;
            close_with(conn, "connect_timeout");
        }
        return;
    case RC_CONNECTED:
        if (now >= conn->last_receive + conn->config.peer_timeout) {
            begin_disconnect(conn, RC_REASON_TIMEOUT, "timeout");
            return;
        }
        /* An expiry on a path without recent loss, or with a filling queue, is more likely a
         * late ack than a lost message. */
        mode = rc_link_update(&conn->link, now);
        lateness_likely = mode == RC_LINK_CLEAN || mode == RC_LINK_CONGESTED;
        for (i = 0; i < RC_CHANNEL_COUNT; i++) {
            rc_send_channel_expire(&conn->send[i], now, lateness_likely);
            if (conn->send[i].failed) {
                begin_disconnect(conn, RC_REASON_RESEND_LIMIT, "resend_limit");
                return;
            }
        }
        return;
    default:
        return;
    }
}

static int window_open(const rc_conn *conn, double now)
{
    double reopen;
    if (rc_seq_diff((uint16_t)conn->send_counter, conn->highest_acked) <= ACK_WINDOW)
        return 1;
    reopen = conn->rtt.has_sample ? conn->rtt.srtt / 32.0 : conn->rtt.rto;
    return now >= conn->last_send + reopen;
}

double rc_conn_next_timeout(const rc_conn *conn)
{
    double t = -1.0;
    int i;
#define EARLIER(x) do { double x_ = (x); if (t < 0 || x_ < t) t = x_; } while (0)
    if (!conn)
        return -1.0;
    switch (conn->state) {
    case RC_CONNECTING:
    case RC_CHALLENGED:
        EARLIER(conn->next_handshake_send);
        EARLIER(conn->connect_started + conn->config.connect_timeout);
        return t;
    case RC_DISCONNECTING:
        return conn->last_now;
    case RC_CONNECTED:
        if (conn->path_response_pending || rc_block_recv_ack_size(&conn->block) > 0)
            return conn->last_now;
        if (conn->ack_pending)
            EARLIER(conn->ack_due);
        EARLIER(conn->last_send + conn->config.heartbeat_interval);
        EARLIER(conn->last_receive + conn->config.peer_timeout);
        for (i = 0; i < RC_CHANNEL_COUNT; i++) {
            double d = rc_send_channel_next_deadline(&conn->send[i]);
            if (d >= 0)
                EARLIER(d);
            if (rc_send_channel_has_unsent(&conn->send[i])) {
                if (window_open(conn, conn->last_now))
                    EARLIER(conn->last_now);
                else
                    EARLIER(conn->last_send + (conn->rtt.has_sample ? conn->rtt.srtt / 32.0 : conn->rtt.rto));
            }
        }
        return t;
    default:
        return -1.0;
    }
#undef EARLIER
}

/* -- sending ----------------------------------------------------------------------------- */

static void record_unit(void *context, int channel, uint16_t msg_id)
{
    rc_conn *conn = context;
    conn->units[conn->unit_head & (UNIT_CAPACITY - 1)] = ((uint32_t)channel << 16) | msg_id;
    conn->unit_head++;
}

static size_t build_data(rc_conn *conn, uint8_t *out, double now)
{
    rc_data_header h;
    size_t pos = RC_DATA_HEADER_SIZE, end = conn->config.mtu - (size_t)tag_reserve(conn), size;
    uint16_t seq = (uint16_t)conn->send_counter;
    uint32_t stamp = ++conn->stamp;
    uint64_t unit_start = conn->unit_head;
    int i, open = window_open(conn, now);
    /* As the controller's mode says (PROTOCOL 12.4, 14.5): no copies on a clean path; on a
     * lossy one a bounded number per message, the first prompt_copies at once and the others
     * only where an ack is overdue; on a bursty one every datagram until acked (max 0); on a
     * congested one congested_copies (0: none). */
    int mode = rc_link_update(&conn->link, now);
    int copies = mode != RC_LINK_CLEAN
                 && (mode != RC_LINK_CONGESTED || conn->config.congested_copies > 0);
    uint32_t max_copies = mode == RC_LINK_LOSSY ? conn->config.redundancy_copies
                        : mode == RC_LINK_CONGESTED ? conn->config.congested_copies : 0;
    sent_packet *sp;
    if (open)
        for (i = 0; i < RC_CHANNEL_COUNT; i++)
            pos = rc_send_channel_write(&conn->send[i], out, pos, end, now, conn->rtt.rto, stamp,
                                        record_unit, conn);
    {
        int wrote_messages = pos > RC_DATA_HEADER_SIZE;
        pos = rc_block_recv_write_ack(&conn->block, out, pos, end);
        refill(conn, now);
        /* Copies ride only with new or resent messages (on an ack-only datagram they would make
         * the peer ack back), and overdue messages ride whatever the mode. */
        if (wrote_messages && conn->tokens > 0 && (copies || conn->send[RC_STREAM].overdue > 0)) {
            double late = conn->rtt.has_sample
                ? conn->config.redundancy_copy_wait * conn->rtt.srtt + conn->peer_ack_delay
                : conn->config.redundancy_copy_wait * conn->rtt.rto;
            uint64_t before = conn->send[RC_STREAM].redundant_bytes;
            pos = rc_send_channel_write_copies(&conn->send[RC_STREAM], out, pos, end,
                                               conn->config.redundancy_budget, stamp, copies,
                                               max_copies, conn->config.prompt_copies, now, late,
                                               record_unit, conn);
            conn->stats.redundant_bytes += conn->send[RC_STREAM].redundant_bytes - before;
        }
    }
    h.session_id = conn->session_id;
    h.seq = seq;
    h.ack = conn->have_received ? conn->ack : 0;
    h.ack_bits = conn->have_received ? conn->ack_bits : 0;
    h.send_time = ms16(now);
    h.echo_time = 0;
    if (conn->have_received) {
        double held = floor_pos((now - conn->ack_arrival) * 1000.0);
        if (held < 0)
            held = 0;
        if (held > 60000)
            held = 60000;
        h.echo_time = (uint16_t)(conn->ack_send_time + (uint32_t)held);
    }
    rc_data_header_write(out, &h);
    size = pos;
    if (conn->sealed)
        size = rc_seal_data(out, pos, conn->send_counter, conn->hs.client_key);
    conn->send_counter++;
    sp = &conn->sent_packets[rc_seqbuf_insert(&conn->sent, seq)];
    sp->send_time = now;
    sp->acked = 0;
    sp->stamp = stamp;
    sp->unit_start = unit_start;
    sp->unit_count = (uint16_t)(conn->unit_head - unit_start);
    conn->last_send = now;
    conn->ack_pending = 0;
    conn->tokens -= (double)(size + 28);
    conn->stats.packets_sent++;
    conn->stats.bytes_sent += size;
    return size;
}

size_t rc_conn_next_datagram(rc_conn *conn, uint8_t *out, size_t cap, double now)
{
    size_t n;
    int i, due = 0;
    if (!conn || !out)
        return 0;
    if (conn->state == RC_CONNECTING || conn->state == RC_CHALLENGED || conn->state == RC_CONNECTED)
        rc_conn_handle_timeout(conn, now);
    conn->last_now = now;
    switch (conn->state) {
    case RC_CONNECTING:
    case RC_CHALLENGED:
        if (now < conn->next_handshake_send)
            return 0;
        if (cap < (conn->hs.token_mode ? 49 + conn->hs.token_length : (size_t)RC_CONNECT_REQUEST_SIZE))
            return 0;                               /* the longer of the two handshake packets */
        n = conn->state == RC_CONNECTING ? rc_handshake_request(&conn->hs, out)
                                         : rc_handshake_response(&conn->hs, out);
        conn->next_handshake_send = now + conn->config.connect_resend_interval;
        conn->stats.packets_sent++;
        conn->stats.bytes_sent += n;
        return n;
    case RC_DISCONNECTING:
        if (cap < conn->disconnect_length)
            return 0;
        memcpy(out, conn->disconnect_packet, conn->disconnect_length);
        conn->stats.packets_sent++;
        conn->stats.bytes_sent += conn->disconnect_length;
        if (--conn->disconnect_left <= 0)
            conn->state = RC_CLOSED;
        return conn->disconnect_length;
    case RC_CONNECTED:
        break;
    default:
        return 0;
    }
    if (cap < conn->config.mtu)
        return 0;
    if (conn->path_response_pending) {
        conn->path_response_pending = 0;
        if (conn->sealed) {
            n = rc_write_path_sealed(out, RC_PT_PATH_RESPONSE, conn->session_id, conn->path_data,
                                     conn->send_counter, conn->hs.client_key);
            conn->send_counter++;
        } else {
            n = rc_write_path(out, RC_PT_PATH_RESPONSE, conn->session_id, conn->path_data);
        }
        conn->stats.packets_sent++;
        conn->stats.bytes_sent += n;
        return n;
    }
    if (conn->ack_pending && now >= conn->ack_due)
        due = 1;
    if (now >= conn->last_send + conn->config.heartbeat_interval)
        due = 1;
    if (rc_block_recv_ack_size(&conn->block) > 0)
        due = 1;
    if (!due && window_open(conn, now))
        for (i = 0; i < RC_CHANNEL_COUNT; i++)
            if (rc_send_channel_has_unsent(&conn->send[i]))
                due = 1;
    if (!due)
        return 0;
    return build_data(conn, out, now);
}

/* -- API --------------------------------------------------------------------------------- */

int rc_conn_send(rc_conn *conn, int channel, const uint8_t *data, size_t length)
{
    if (!conn || channel < 0 || channel >= RC_CHANNEL_COUNT || (!data && length))
        return -1;
    if (conn->state != RC_CONNECTING && conn->state != RC_CHALLENGED && conn->state != RC_CONNECTED)
        return -1;
    if (length > conn->config.max_send_size)
        return -1;
    return rc_send_channel_queue(&conn->send[channel], data, length);
}

void rc_conn_disconnect(rc_conn *conn, uint8_t reason_code, double now)
{
    char text[40];
    if (!conn)
        return;
    conn->last_now = now;
    rc_reason_text(text, sizeof text, "local:", reason_code);
    if (conn->state == RC_CONNECTED) {
        begin_disconnect(conn, reason_code, text);
    } else if (conn->state == RC_CONNECTING || conn->state == RC_CHALLENGED) {
        conn->state = RC_CLOSED;
        close_with(conn, text);
    }
}

rc_conn_state rc_conn_get_state(const rc_conn *conn) { return conn ? conn->state : RC_CLOSED; }

void rc_conn_get_stats(const rc_conn *conn, rc_conn_stats *stats)
{
    int i;
    if (!conn || !stats)
        return;
    *stats = conn->stats;
    stats->rtt = conn->rtt.srtt;
    stats->rtt_variance = conn->rtt.rttvar;
    stats->rto = conn->rtt.rto;
    stats->burst_length = rc_link_burst_length(&conn->link);
    stats->redundancy_mode = conn->link.mode;
    stats->messages_sent = 0;
    stats->resends = 0;
    for (i = 0; i < RC_CHANNEL_COUNT; i++) {
        stats->messages_sent += conn->send[i].messages_sent;
        stats->resends += conn->send[i].resends;
    }
}

uint32_t rc_conn_pending(const rc_conn *conn, int channel)
{
    if (!conn || channel < 0 || channel >= RC_CHANNEL_COUNT)
        return 0;
    return rc_send_channel_pending(&conn->send[channel]);
}

uint32_t rc_conn_session_id(const rc_conn *conn) { return conn ? conn->session_id : 0; }
int rc_conn_is_sealed(const rc_conn *conn) { return conn ? conn->sealed : 0; }
