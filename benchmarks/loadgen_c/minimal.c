/*
 * minimal.c - the load generator's minimal relay client (see minimal.h for what it does).
 * The formats come from clients/c/src (wire.c for packets and records, messages.c for INPUT,
 * frame.c for FRAME and history blocks); the connection state and the loop are its own.
 */
#include "minimal.h"

#include "checks.h"
#include "messages.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

#define MC_SENT_VALID 1
#define MC_SENT_INPUTS 2
#define MC_SENT_CONTROL 4

#define CONNECT_RESEND 0.1
#define CONNECT_TIMEOUT 5.0
#define HEARTBEAT 0.5
#define PEER_TIMEOUT 10.0
#define RECEIVED_WINDOW 64
#define MAX_RESENDS 20
#define RTO_LIMIT 5.0
#define MAX_BLOCK_SLICES 64
/* An INPUT record of ours at most: record header 4, [5, u32 frame, bin 16, have] 1+1+5+18+9 */
#define MC_INPUT_RECORD_MAX 38

enum {
    CLOSE_NONE = 0, CLOSE_REFUSED, CLOSE_REMOTE, CLOSE_LOCAL, CLOSE_CONNECT_TIMEOUT,
    CLOSE_TIMEOUT, CLOSE_RESEND_LIMIT, CLOSE_FRAGMENT, CLOSE_BLOCK
};

static uint16_t ms16(double now)
{
    return (uint16_t)(uint64_t)(now * 1000.0);
}

static float current_rto(const mc_player *p)
{
    float rto;
    if (p->srtt < 0)
        return 0.2f;
    rto = p->srtt + (4 * p->rttvar > 0.002f ? 4 * p->rttvar : 0.002f)
          + (float)p->peer_ack_delay_ms * 1e-3f;
    return rto < 0.03f ? 0.03f : rto > 1.0f ? 1.0f : rto;
}

void mc_init(mc_player *p, uint32_t index)
{
    memset(p, 0, sizeof *p);
    p->index = index;
    p->srtt = -1;
    p->control_deadline = p->stream_deadline = -1;
}

int mc_connect(mc_player *p, uint32_t connect_id, const uint8_t *join_message, size_t length,
               double now)
{
    if (p->state != MC_IDLE || connect_id == 0 || length > MC_CONTROL_MAX)
        return -1;
    p->connect_id = connect_id;
    memcpy(p->control, join_message, length);
    p->control_length = (uint8_t)length;
    p->state = MC_CONNECTING;
    p->handshake_due = now;
    p->connect_deadline = now + CONNECT_TIMEOUT;
    return 0;
}

static void close_now(mc_player *p, int kind, int code, int send_disconnect)
{
    if (p->state == MC_CLOSED || p->state == MC_DISCONNECTING)
        return;
    p->close_kind = (uint8_t)kind;
    p->close_code = (uint8_t)code;
    if (send_disconnect && p->state == MC_CONNECTED) {
        p->state = MC_DISCONNECTING;
        p->disconnects_left = 3;
    } else {
        p->state = MC_CLOSED;
    }
}

void mc_disconnect(mc_player *p)
{
    close_now(p, CLOSE_LOCAL, RC_REASON_CLOSED, 1);
}

const char *mc_close_text(const mc_player *p, char *out, size_t cap)
{
    switch (p->close_kind) {
    case CLOSE_REFUSED: rc_reason_text(out, cap, "refused:", p->close_code); break;
    case CLOSE_REMOTE: rc_reason_text(out, cap, "remote:", p->close_code); break;
    case CLOSE_LOCAL: rc_reason_text(out, cap, "local:", p->close_code); break;
    case CLOSE_CONNECT_TIMEOUT: snprintf(out, cap, "connect_timeout"); break;
    case CLOSE_TIMEOUT: snprintf(out, cap, "timeout"); break;
    case CLOSE_RESEND_LIMIT: snprintf(out, cap, "resend_limit"); break;
    case CLOSE_FRAGMENT: snprintf(out, cap, "fragment (not supported by the minimal client)"); break;
    case CLOSE_BLOCK: snprintf(out, cap, "block of more than %d slices", MAX_BLOCK_SLICES); break;
    default: if (cap) out[0] = 0; break;
    }
    return out;
}

int mc_send_input(mc_player *p, uint32_t frame, int64_t have)
{
    uint16_t id = p->input_next;
    int64_t behind = have < 0 ? 0 : (int64_t)frame - have;
    if ((uint16_t)(p->input_next - p->input_acked) >= MC_INPUT_QUEUE || behind < 0 || behind > 255)
        return -1;
    p->input_frame[id % MC_INPUT_QUEUE] = frame;
    p->input_behind[id % MC_INPUT_QUEUE] = (uint8_t)behind;
    p->input_next++;
    p->stream_due = 1;
    return 0;
}

static int64_t input_have(const mc_player *p, uint16_t id)
{
    uint8_t behind = p->input_behind[id % MC_INPUT_QUEUE];
    return behind == 0 ? -1 : (int64_t)p->input_frame[id % MC_INPUT_QUEUE] - behind;
}

/* ---- receiving -------------------------------------------------------------------------- */

static void on_acks(mc_player *p, const rc_data_header *h, double now)
{
    uint32_t bits = h->ack_bits;
    int behind = rc_seq_diff((uint16_t)(p->next_seq - 1), h->ack);
    int i, progress = 0;
    if (bits == 0 || p->next_seq == 0 || behind < 0 || behind >= MC_SENT_PACKETS)
        return;                                     /* acks nothing we still know */
    if (bits & 1) {
        const mc_sent *e = &p->sent[h->ack % MC_SENT_PACKETS];
        if ((e->flags & MC_SENT_VALID) && e->seq == h->ack) {
            float r = (float)(uint16_t)(ms16(now) - h->echo_time) * 1e-3f;
            if (r < 60.0f) {
                if (p->srtt < 0) {
                    p->srtt = r;
                    p->rttvar = r / 2;
                } else {
                    float d = p->srtt > r ? p->srtt - r : r - p->srtt;
                    p->rttvar = 0.75f * p->rttvar + 0.25f * d;
                    p->srtt = 0.875f * p->srtt + 0.125f * r;
                }
            }
        }
    }
    /* A datagram carried the unacknowledged INPUTs of one range of ids */
    for (i = 0; i < 32 && i + behind < MC_SENT_PACKETS; i++) {
        uint16_t s;
        mc_sent *e;
        if (!(bits >> i & 1))
            continue;
        s = (uint16_t)(h->ack - i);
        e = &p->sent[s % MC_SENT_PACKETS];
        if (!(e->flags & MC_SENT_VALID) || e->seq != s)
            continue;
        if (e->flags & MC_SENT_INPUTS) {
            uint16_t id = e->input_lo;
            if (rc_seq_diff(id, p->input_acked) < 0)
                id = p->input_acked;
            for (; rc_seq_diff(e->input_hi, id) > 0; id++)
                p->input_acked_bits |= (uint64_t)1 << (id % MC_INPUT_WINDOW);
        }
        if (e->flags & MC_SENT_CONTROL)
            p->control_acked = 1;
        e->flags &= (uint8_t)~(MC_SENT_INPUTS | MC_SENT_CONTROL);
    }
    while (p->input_acked != p->input_next
           && (p->input_acked_bits >> (p->input_acked % MC_INPUT_WINDOW) & 1)) {
        p->input_acked_bits &= ~((uint64_t)1 << (p->input_acked % MC_INPUT_WINDOW));
        p->input_acked++;
        progress = 1;
    }
    if (p->control_acked) {
        p->control_deadline = -1;
        p->control_due = 0;
    }
    if (p->input_acked == p->input_next) {
        p->stream_deadline = -1;
        p->stream_resends = 0;
    } else if (progress) {
        if (p->input_unsent != p->input_next)
            p->stream_due = 1;                      /* the window moved on */
        p->stream_resends = 0;
        p->stream_rto = current_rto(p);
        p->stream_deadline = now + p->stream_rto;
    }
}

static int on_block_slice(mc_player *p, const rc_record *r)
{
    static uint8_t zmemory[RF_INFLATE_MEMORY];
    int d = rc_seq_diff(r->block_id, p->block_expected);
    if (d < 0) {
        if (d == -1 && p->block_completed_slices)
            p->block_owed = 2;                      /* the sender missed the completion ack */
        return 0;
    }
    if (d > 0)
        return RC_DROP_BAD_BLOCK_SLICE;
    if (p->block_slices == 0) {
        if (r->slice_count > MAX_BLOCK_SLICES) {
            close_now(p, CLOSE_BLOCK, RC_REASON_CLOSED, 1);
            return 0;
        }
        p->block_slices = r->slice_count;
        p->block_seen = 0;
        p->blocks++;
    } else if (r->slice_count != p->block_slices) {
        return RC_DROP_BAD_BLOCK_SLICE;
    }
    if (r->slice_index == 0 && !(p->block_seen & 1)) {
        uint32_t first, count;
        if (rf_history_peek(r->payload, r->length, zmemory, &first, &count) == RF_OK)
            p->block_frames += count;
    }
    p->block_seen |= (uint64_t)1 << r->slice_index;
    p->block_owed = 1;
    if (p->block_seen == (p->block_slices == 64 ? ~(uint64_t)0
                                                : (((uint64_t)1 << p->block_slices) - 1))) {
        p->block_completed_slices = p->block_slices;
        p->block_expected++;
        p->block_slices = 0;
        p->block_seen = 0;
        p->block_owed = 2;
    }
    return 0;
}

static void mark_received(mc_player *p, uint16_t seq, uint16_t send_time, double now)
{
    if (!p->received_any) {
        p->received_any = 1;
        p->recv_ack = seq;
        p->recv_bits = 1;
    } else {
        int d = rc_seq_diff(seq, p->recv_ack);
        if (d > 0) {
            p->recv_bits = d >= 64 ? 1 : (p->recv_bits << d) | 1;
            p->recv_ack = seq;
        } else {
            p->recv_bits |= (uint64_t)1 << -d;     /* -d < RECEIVED_WINDOW: checked before */
            return;
        }
    }
    p->echo_send_time = send_time;
    p->echo_arrival = now;
}

static int on_data(mc_player *p, const uint8_t *data, size_t length, double now,
                   const mc_sink *sink)
{
    rc_data_header h;
    size_t pos = RC_DATA_HEADER_SIZE, next;
    int any = 0;
    rc_data_header_read(data, &h);
    if (h.session_id != p->session_id)
        return RC_DROP_WRONG_SESSION;
    if (p->received_any) {
        int d = rc_seq_diff(h.seq, p->recv_ack);
        if (d <= 0) {
            if (-d >= RECEIVED_WINDOW)
                return RC_DROP_STALE_PACKET;
            if (p->recv_bits >> -d & 1)
                return RC_DROP_DUPLICATE_PACKET;
        }
    }
    p->last_admitted = now;
    on_acks(p, &h, now);
    while (pos < length) {
        rc_record r;
        int drop = rc_record_parse(data, pos, length, &r, &next);
        if (drop)
            return drop;
        if (r.kind == RC_RK_MESSAGE || r.kind == RC_RK_FRAGMENT) {
            uint16_t *expected;
            int window, d;
            if (r.channel == 0) {
                expected = &p->control_expected;
                window = MC_CONTROL_WINDOW;
            } else if (r.channel == 1) {
                expected = &p->stream_expected;
                window = MC_STREAM_WINDOW;
            } else {
                return RC_DROP_UNKNOWN_CHANNEL;
            }
            d = rc_seq_diff(r.msg_id, *expected);
            if (d >= window)
                return RC_DROP_MESSAGE_OUT_OF_WINDOW;
            if (d > 0) {
                p->refused++;                       /* held by no one: offered again later */
                return RC_DROP_REASSEMBLY_FULL;
            }
            if (d == 0) {
                if (r.kind == RC_RK_FRAGMENT) {
                    close_now(p, CLOSE_FRAGMENT, RC_REASON_CLOSED, 1);
                    return 0;
                }
                (*expected)++;
                if (r.channel == 0)
                    sink->control(sink->context, p, r.payload, r.length);
                else
                    sink->frame(sink->context, p, r.payload, r.length, now);
                if (p->state != MC_CONNECTED)
                    return 0;
            }
        } else if (r.kind == RC_RK_BLOCK_SLICE) {
            int drop2 = on_block_slice(p, &r);
            if (drop2)
                return drop2;
            if (p->state != MC_CONNECTED)
                return 0;
        }
        any |= r.kind != RC_RK_BLOCK_ACK;
        pos = next;
    }
    mark_received(p, h.seq, h.send_time, now);
    if (any && !p->ack_pending) {
        p->ack_pending = 1;
        p->ack_due = now + MC_ACK_DELAY;
    }
    return 0;
}

int mc_receive(mc_player *p, const uint8_t *data, size_t length, double now, const mc_sink *sink)
{
    int type = rc_wire_check(data, length), drop = 0;
    if (type < 0) {
        p->drops++;
        return -type;
    }
    switch (type) {
    case RC_PT_CHALLENGE:
        if (p->state != MC_CONNECTING || rc_get_u32(data + 4) != p->connect_id) {
            drop = RC_DROP_UNEXPECTED_PACKET;
            break;
        }
        memcpy(p->challenge, data + 4, sizeof p->challenge);
        p->state = MC_CHALLENGED;
        p->handshake_due = now;
        break;
    case RC_PT_ACCEPT:
        if (rc_get_u32(data + 4) != p->connect_id || length != RC_ACCEPT_SIZE)
            drop = RC_DROP_UNEXPECTED_PACKET;
        else if (p->state == MC_CONNECTED)
            drop = RC_DROP_DUPLICATE_PACKET;
        else if (p->state != MC_CHALLENGED || rc_get_u32(data + 8) == 0)
            drop = RC_DROP_UNEXPECTED_PACKET;
        else {
            p->session_id = rc_get_u32(data + 8);
            p->peer_ack_delay_ms = rc_get_u16(data + 12);
            p->state = MC_CONNECTED;
            p->last_admitted = p->last_sent = now;
            p->control_due = 1;                     /* the JOIN, queued before */
            p->control_rto = p->stream_rto = current_rto(p);
        }
        break;
    case RC_PT_REFUSE:
        if ((p->state != MC_CONNECTING && p->state != MC_CHALLENGED)
            || rc_get_u32(data + 4) != p->connect_id)
            drop = RC_DROP_UNEXPECTED_PACKET;
        else
            close_now(p, CLOSE_REFUSED, data[8], 0);
        break;
    case RC_PT_DISCONNECT:
        if (p->state != MC_CONNECTED)
            drop = RC_DROP_UNKNOWN_PEER;
        else if (rc_get_u32(data + 4) != p->session_id)
            drop = RC_DROP_WRONG_SESSION;
        else if (length != RC_DISCONNECT_SIZE)
            drop = RC_DROP_BAD_LENGTH;
        else
            close_now(p, CLOSE_REMOTE, data[8], 0);
        break;
    case RC_PT_DATA:
        drop = p->state == MC_CONNECTED ? on_data(p, data, length, now, sink) : RC_DROP_UNKNOWN_PEER;
        break;
    default:
        drop = RC_DROP_UNEXPECTED_PACKET;
        break;
    }
    if (drop)
        p->drops++;
    return drop;
}

/* ---- timers ----------------------------------------------------------------------------- */

void mc_handle_timeout(mc_player *p, double now)
{
    if (p->state == MC_CONNECTING || p->state == MC_CHALLENGED) {
        if (now >= p->connect_deadline)
            close_now(p, CLOSE_CONNECT_TIMEOUT, 0, 0);
        return;
    }
    if (p->state != MC_CONNECTED)
        return;
    if (now >= p->last_admitted + PEER_TIMEOUT) {
        close_now(p, CLOSE_TIMEOUT, RC_REASON_TIMEOUT, 1);
        return;
    }
    if (!p->control_acked && p->control_deadline >= 0 && now >= p->control_deadline) {
        p->control_resends++;
        p->control_rto *= 1.5f;
        p->control_deadline = now + p->control_rto;
        p->control_due = 1;
        if (p->control_resends > MAX_RESENDS || p->control_rto > RTO_LIMIT)
            close_now(p, CLOSE_RESEND_LIMIT, RC_REASON_RESEND_LIMIT, 1);
    }
    if (p->input_acked != p->input_next && p->stream_deadline >= 0 && now >= p->stream_deadline) {
        p->stream_resends++;
        p->stream_rto *= 1.5f;
        p->stream_deadline = now + p->stream_rto;
        p->stream_due = 1;
        p->stream_resend = 1;
        if (p->stream_resends > MAX_RESENDS || p->stream_rto > RTO_LIMIT)
            close_now(p, CLOSE_RESEND_LIMIT, RC_REASON_RESEND_LIMIT, 1);
    }
}

double mc_next_timeout(const mc_player *p)
{
    double next;
    switch (p->state) {
    case MC_CONNECTING:
    case MC_CHALLENGED:
        return p->handshake_due < p->connect_deadline ? p->handshake_due : p->connect_deadline;
    case MC_DISCONNECTING:
        return 0;
    case MC_CONNECTED:
        break;
    default:
        return -1;
    }
    if (p->control_due || p->stream_due || p->block_owed)
        return 0;
    next = p->last_sent + HEARTBEAT;
    if (p->last_admitted + PEER_TIMEOUT < next)
        next = p->last_admitted + PEER_TIMEOUT;
    if (p->ack_pending && p->ack_due < next)
        next = p->ack_due;
    if (!p->control_acked && p->control_deadline >= 0 && p->control_deadline < next)
        next = p->control_deadline;
    if (p->stream_deadline >= 0 && p->stream_deadline < next)
        next = p->stream_deadline;
    return next;
}

/* ---- sending ---------------------------------------------------------------------------- */

void mc_fill_header(const mc_player *p, double now, uint8_t header[20])
{
    rc_data_header h;
    h.session_id = p->session_id;
    h.seq = p->next_seq;
    h.send_time = ms16(now);
    if (p->received_any) {
        double held = (now - p->echo_arrival) * 1000.0;
        h.ack = p->recv_ack;
        h.ack_bits = (uint32_t)p->recv_bits;
        h.echo_time = (uint16_t)(p->echo_send_time
                                 + (uint16_t)(held < 0 ? 0 : held > 60000 ? 60000 : held));
    } else {
        h.ack = 0;
        h.ack_bits = 0;
        h.echo_time = 0;
    }
    rc_wire_prefix(header, RC_PT_DATA);
    rc_data_header_write(header, &h);
}

size_t mc_write_block_ack(const mc_player *p, uint8_t *out)
{
    uint8_t bitfield[8];
    uint64_t bits;
    uint16_t base, count;
    size_t n, k;
    if (p->block_owed == 2)
        return rc_block_ack_record_write(out, (uint16_t)(p->block_expected - 1),
                                         p->block_completed_slices, NULL, 0);
    count = p->block_slices;
    for (base = 0; base < count && (p->block_seen >> base & 1); base++)
        ;
    bits = base < 64 ? p->block_seen >> base : 0;
    n = ((size_t)(count - base) + 7) / 8;
    for (k = 0; k < n; k++)
        bitfield[k] = (uint8_t)(bits >> (8 * k));
    return rc_block_ack_record_write(out, p->block_expected, base, bitfield, n);
}

size_t mc_next_datagram(mc_player *p, uint8_t *out, double now)
{
    size_t pos = RC_DATA_HEADER_SIZE;
    mc_sent *e;
    uint8_t flags = MC_SENT_VALID;
    uint16_t input_lo = 0, input_hi = 0;
    switch (p->state) {
    case MC_CONNECTING:
        if (now < p->handshake_due)
            return 0;
        p->handshake_due = now + CONNECT_RESEND;
        return rc_write_connect_request(out, p->connect_id, NULL, 0);
    case MC_CHALLENGED:
        if (now < p->handshake_due)
            return 0;
        p->handshake_due = now + CONNECT_RESEND;
        return rc_write_connect_response(out, p->challenge, (uint16_t)(MC_ACK_DELAY * 1000 + 0.5),
                                         NULL, 0, NULL);
    case MC_DISCONNECTING:
        if (--p->disconnects_left == 0)
            p->state = MC_CLOSED;
        return rc_write_disconnect(out, p->session_id, p->close_code);
    case MC_CONNECTED:
        break;
    default:
        return 0;
    }
    if (!p->control_due && !p->stream_due && !p->block_owed
        && !(p->ack_pending && now >= p->ack_due) && now < p->last_sent + HEARTBEAT)
        return 0;
    if (p->control_due && !p->control_acked) {
        pos += rc_message_record_write(out + pos, 0, 0, p->control, p->control_length);
        flags |= MC_SENT_CONTROL;
        if (p->control_deadline < 0)
            p->control_deadline = now + p->control_rto;
    }
    p->control_due = 0;
    if (p->stream_due && p->input_acked != p->input_next) {
        /* One range of ids, at most `room` of them and none past the window: a resend from the
         * oldest unacknowledged on; otherwise the ones never written and, as redundant copies,
         * the unacknowledged ones just before them. */
        uint16_t room = (uint16_t)((MC_MTU - 16 - pos) / MC_INPUT_RECORD_MAX), id;
        uint16_t limit = (uint16_t)(p->input_acked + MC_INPUT_WINDOW);
        if (rc_seq_diff(p->input_next, limit) < 0)
            limit = p->input_next;
        if (p->stream_resend) {
            input_lo = p->input_acked;
            input_hi = (uint16_t)(input_lo + room);
            if (rc_seq_diff(input_hi, limit) > 0)
                input_hi = limit;
        } else {
            input_hi = (uint16_t)(p->input_unsent + room);
            if (rc_seq_diff(input_hi, limit) > 0)
                input_hi = limit;
            input_lo = (uint16_t)(input_hi - room);
            if (rc_seq_diff(input_lo, p->input_acked) < 0)
                input_lo = p->input_acked;
        }
        for (id = input_lo; id != input_hi; id++) {
            uint8_t message[48], payload[LG_INPUT_SIZE];
            uint32_t slot = id % MC_INPUT_QUEUE;
            int length;
            if (p->input_acked_bits >> (id % MC_INPUT_WINDOW) & 1)
                continue;
            lg_input_payload(p->index, p->input_frame[slot], payload);
            length = rm_encode_input(message, sizeof message, p->input_frame[slot], payload,
                                     sizeof payload, input_have(p, id));
            pos += rc_message_record_write(out + pos, 1, id, message, (size_t)length);
        }
        if (input_hi != input_lo)
            flags |= MC_SENT_INPUTS;
        if (rc_seq_diff(input_hi, p->input_unsent) > 0)
            p->input_unsent = input_hi;
        /* more to write now only if new ones did not fit (not if the window is full) */
        p->stream_due = p->input_unsent != limit;
        p->stream_resend = 0;
        if (p->stream_deadline < 0 && input_hi != input_lo) {
            p->stream_rto = current_rto(p);
            p->stream_deadline = now + p->stream_rto;
        }
    } else {
        p->stream_due = 0;
    }
    if (p->block_owed) {
        pos += mc_write_block_ack(p, out + pos);
        p->block_owed = 0;
    }
    mc_fill_header(p, now, out);
    e = &p->sent[p->next_seq % MC_SENT_PACKETS];
    e->seq = p->next_seq;
    e->input_lo = input_lo;
    e->input_hi = input_hi;
    e->flags = flags;
    p->next_seq++;
    p->last_sent = now;
    p->ack_pending = 0;
    return pos;
}

/* ---- frames ------------------------------------------------------------------------------ */

int mc_decode_frame(mc_player *p, const uint8_t *data, size_t length, const rf_frame **out)
{
    static uint8_t arena[8192];
    static rf_frame previous, frame;
    const rf_frame *prev = NULL;
    uint32_t number, slot;
    int status;
    if (rf_frame_number(data, length, &number) != RF_OK)
        return RF_MALFORMED;
    if (p->prev_valid && p->prev_number + 1 == number) {
        previous.slot_count = p->prev_count;
        previous.arena = &p->prev_data[0][0];
        for (slot = 0; slot < p->prev_count; slot++) {
            previous.length[slot] = p->prev_length[slot];
            previous.offset[slot] = slot * MC_SLOT_BYTES;
        }
        prev = &previous;
    } else if (number == 0) {
        previous.slot_count = 0;                    /* the empty frame before frame 0 */
        prev = &previous;
    }
    rf_frame_init(&frame, arena, sizeof arena);
    status = rf_decode(data, length, prev, &frame);
    if (status != RF_OK)
        return status;
    if (frame.slot_count > MC_SLOTS)
        return RF_TOO_LARGE;
    for (slot = 0; slot < frame.slot_count; slot++) {
        if (frame.length[slot] > MC_SLOT_BYTES)
            return RF_TOO_LARGE;
        p->prev_length[slot] = (int8_t)frame.length[slot];
        if (frame.length[slot] > 0)
            memcpy(p->prev_data[slot], arena + frame.offset[slot], (size_t)frame.length[slot]);
    }
    p->prev_count = (uint8_t)frame.slot_count;
    p->prev_number = number;
    p->prev_valid = 1;
    *out = &frame;
    return RF_OK;
}

/* ---- inspection -------------------------------------------------------------------------- */

int mc_parse(const uint8_t *data, size_t length, mc_parsed *out)
{
    int type = rc_wire_check(data, length);
    memset(out, 0, sizeof *out);
    out->type = type;
    if (type < 0)
        return type;
    switch (type) {
    case RC_PT_CONNECT_REQUEST:
    case RC_PT_CHALLENGE:
    case RC_PT_CONNECT_RESPONSE:
    case RC_PT_ACCEPT:
    case RC_PT_REFUSE:
        out->id = rc_get_u32(data + 4);
        if (type == RC_PT_CHALLENGE || type == RC_PT_CONNECT_RESPONSE)
            out->cookie_time = rc_get_u32(data + 8);
        if (type == RC_PT_CONNECT_RESPONSE)
            out->ack_delay_ms = rc_get_u16(data + 28);
        if (type == RC_PT_ACCEPT) {
            out->session_id = rc_get_u32(data + 8);
            out->ack_delay_ms = rc_get_u16(data + 12);
        }
        if (type == RC_PT_REFUSE)
            out->reason = data[8];
        return type;
    case RC_PT_DISCONNECT:
    case RC_PT_PATH_CHALLENGE:
    case RC_PT_PATH_RESPONSE:
        out->id = rc_get_u32(data + 4);
        if (type == RC_PT_DISCONNECT)
            out->reason = data[8];
        return type;
    default:
        break;
    }
    {
        rc_data_header h;
        size_t pos = RC_DATA_HEADER_SIZE, next;
        rc_data_header_read(data, &h);
        out->id = h.session_id;
        out->seq = h.seq;
        out->ack = h.ack;
        out->ack_bits = h.ack_bits;
        out->send_time = h.send_time;
        out->echo_time = h.echo_time;
        while (pos < length) {
            rc_record r;
            struct rc_record_view *v;
            int drop = rc_record_parse(data, pos, length, &r, &next);
            if (drop) {
                out->type = -drop;
                return -drop;
            }
            if (out->record_count == MC_PARSE_RECORDS)
                return RC_PT_DATA;
            v = &out->records[out->record_count++];
            v->kind = r.kind;
            v->channel = r.channel;
            v->msg_id = r.msg_id;
            v->fragment_index = r.fragment_index;
            v->fragment_count = r.fragment_count;
            v->block_id = r.block_id;
            v->slice_index = r.slice_index;
            v->slice_count = r.slice_count;
            v->base = r.base;
            v->block_size = r.block_size;
            v->payload = r.payload;
            v->length = r.length;
            pos = next;
        }
    }
    return RC_PT_DATA;
}
