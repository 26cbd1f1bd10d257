/* channel.c - reliable send and receive channels (PROTOCOL 11.3, 11.5, 12). */
#include "channel.h"
#include "wire.h"

#include <string.h>

void rc_send_channel_init(rc_send_channel *ch, int id, int redundant, uint32_t window,
                          uint32_t send_queue, rc_out_msg *msgs,
                          uint8_t *bytes, uint32_t bytes_cap, uint32_t max_resends,
                          double rto_limit)
{
    memset(ch, 0, sizeof *ch);
    ch->id = id;
    ch->redundant = redundant;
    ch->window = window;
    ch->queue_limit = window + send_queue;
    ch->msgs = msgs;
    ch->bytes = bytes;
    ch->bytes_cap = bytes_cap;
    ch->max_resends = max_resends;
    ch->rto_limit = rto_limit;
    rc_send_channel_reset(ch);
}

void rc_send_channel_reset(rc_send_channel *ch)
{
    ch->oldest = ch->next_id = 0;
    ch->head_slot = 0;
    ch->head = ch->tail = 0;
    ch->unsent = 0;
    ch->failed = 0;
    ch->last_new_at = -1.0;
    ch->stream_interval = 0.0;
    ch->overdue = 0;
}

/* Live ids are contiguous from oldest, so they sit in consecutive slots from head_slot. */
static rc_out_msg *msg_at(const rc_send_channel *ch, uint16_t msg_id)
{
    return &ch->msgs[(ch->head_slot + (uint16_t)(msg_id - ch->oldest)) % ch->queue_limit];
}

uint32_t rc_send_channel_pending(const rc_send_channel *ch)
{
    return (uint16_t)(ch->next_id - ch->oldest);
}

/* Offset for length bytes at the ring's tail, or -1. Payloads are contiguous; live bytes are
 * [head, tail) when tail >= head, else [head, end) and [0, tail) (wrapped). */
static long ring_reserve(rc_send_channel *ch, uint32_t length)
{
    if (ch->next_id == ch->oldest)
        ch->head = ch->tail = 0;
    if (ch->tail >= ch->head) {
        if (ch->bytes_cap - ch->tail >= length)
            return (long)ch->tail;
        return ch->head > length ? 0 : -1;
    }
    return ch->head - ch->tail > length ? (long)ch->tail : -1;
}

int rc_send_channel_queue(rc_send_channel *ch, const uint8_t *data, size_t length)
{
    long at;
    rc_out_msg *m;
    if (rc_send_channel_pending(ch) >= ch->queue_limit || length > ch->bytes_cap || length > 0xFFFF)
        return -1;
    at = ring_reserve(ch, (uint32_t)length);
    if (at < 0)
        return -1;
    m = msg_at(ch, ch->next_id);
    memset(m, 0, sizeof *m);
    m->offset = (uint32_t)at;
    m->length = (uint16_t)length;
    m->needs_write = 1;
    if (length)
        memcpy(ch->bytes + at, data, length);
    ch->tail = (uint32_t)at + (uint32_t)length;
    ch->next_id++;
    ch->unsent++;
    return 0;
}

static uint16_t window_end(const rc_send_channel *ch)
{
    uint32_t live = rc_send_channel_pending(ch);
    return (uint16_t)(ch->oldest + (live < ch->window ? live : ch->window));
}

int rc_send_channel_has_unsent(const rc_send_channel *ch)
{
    uint16_t id, end = window_end(ch);
    if (ch->unsent == 0)
        return 0;
    for (id = ch->oldest; id != end; id++) {
        const rc_out_msg *m = msg_at(ch, id);
        if (!m->acked && m->needs_write)
            return 1;
    }
    return 0;
}

size_t rc_send_channel_write(rc_send_channel *ch, uint8_t *buf, size_t pos, size_t end,
                             double now, double rto, uint32_t stamp, rc_unit_fn unit,
                             void *context)
{
    uint16_t id, stop = window_end(ch);
    for (id = ch->oldest; id != stop && ch->unsent > 0; id++) {
        rc_out_msg *m = msg_at(ch, id);
        size_t size;
        if (m->acked || !m->needs_write)
            continue;
        size = rc_message_record_size(m->length);
        if (pos + size > end)
            break;
        pos += rc_message_record_write(buf + pos, ch->id, id, ch->bytes + m->offset, m->length);
        unit(context, ch->id, id);
        m->needs_write = 0;
        ch->unsent--;
        m->stamp = stamp;
        m->copies = 0;
        m->written_at = now;
        if (m->overdue) {
            m->overdue = 0;
            ch->overdue--;
        }
        if (!m->sent) {
            m->sent = 1;
            m->rto = rto;
            m->deadline = now + rto;
            ch->messages_sent++;
            /* Datagrams in one burst are one step of the stream. */
            if (now > ch->last_new_at) {
                if (ch->last_new_at >= 0.0)
                    ch->stream_interval += (now - ch->last_new_at - ch->stream_interval) * 0.125;
                ch->last_new_at = now;
            }
        }
    }
    return pos;
}

/* Whether this datagram (stamp) should carry a copy of m. */
static int copy_due(const rc_out_msg *m, uint32_t stamp, int copies, uint32_t max_copies,
                    uint32_t prompt_copies, double now, double late_after)
{
    if (m->acked || !m->sent || m->needs_write || m->stamp == stamp)
        return 0;
    if (m->overdue)
        return 1;
    if (!copies)
        return 0;
    if (max_copies == 0)
        return 1;
    return m->copies < max_copies && (m->copies < prompt_copies || now - m->written_at >= late_after);
}

size_t rc_send_channel_write_copies(rc_send_channel *ch, uint8_t *buf, size_t pos, size_t end,
                                    size_t budget, uint32_t stamp, int copies,
                                    uint32_t max_copies, uint32_t prompt_copies, double now,
                                    double late_after, rc_unit_fn unit, void *context)
{
    uint32_t count = (uint16_t)(window_end(ch) - ch->oldest), start = count, i;
    size_t total = 0, limit = end > pos ? end - pos : 0;
    if (budget < limit)
        limit = budget;
    for (i = count; i-- > 0;) {
        const rc_out_msg *m = msg_at(ch, (uint16_t)(ch->oldest + i));
        if (copy_due(m, stamp, copies, max_copies, prompt_copies, now, late_after)) {
            size_t size = rc_message_record_size(m->length);
            if (total + size > limit)
                break;
            total += size;
            start = i;
        }
    }
    for (i = start; i < count; i++) {
        uint16_t id = (uint16_t)(ch->oldest + i);
        rc_out_msg *m = msg_at(ch, id);
        if (!copy_due(m, stamp, copies, max_copies, prompt_copies, now, late_after))
            continue;
        pos += rc_message_record_write(buf + pos, ch->id, id, ch->bytes + m->offset, m->length);
        unit(context, ch->id, id);
        m->stamp = stamp;
        if (m->overdue) {
            /* Its RTO resend, riding along: the RTO runs from here, copies start over. */
            m->overdue = 0;
            ch->overdue--;
            m->written_at = now;
            m->copies = 0;
            m->deadline = now + m->rto;
            continue;
        }
        if (m->copies < 255)
            m->copies++;
        if (max_copies > 0 && m->deadline < now + m->rto)
            m->deadline = now + m->rto;
        ch->redundant_bytes += rc_message_record_size(m->length);
    }
    return pos;
}

void rc_send_channel_on_ack(rc_send_channel *ch, uint16_t msg_id)
{
    rc_out_msg *m;
    uint32_t offset = (uint16_t)(msg_id - ch->oldest);
    if (offset >= rc_send_channel_pending(ch) || offset >= ch->window)
        return;
    m = msg_at(ch, msg_id);
    if (m->acked || !m->sent)
        return;
    m->acked = 1;
    if (m->needs_write) {
        m->needs_write = 0;
        ch->unsent--;
    }
    if (m->overdue) {
        m->overdue = 0;
        ch->overdue--;
    }
    while (ch->oldest != ch->next_id && msg_at(ch, ch->oldest)->acked) {
        m = msg_at(ch, ch->oldest);
        ch->head = m->offset + m->length;
        ch->oldest++;
        ch->head_slot = (ch->head_slot + 1) % ch->queue_limit;
    }
    if (ch->oldest == ch->next_id)
        ch->head = ch->tail = 0;
    else
        ch->head = msg_at(ch, ch->oldest)->offset;
}

void rc_send_channel_on_lost(rc_send_channel *ch, uint16_t msg_id, uint32_t stamp, double now)
{
    rc_out_msg *m;
    uint32_t offset = (uint16_t)(msg_id - ch->oldest);
    if (offset >= rc_send_channel_pending(ch) || offset >= ch->window)
        return;
    m = msg_at(ch, msg_id);
    if (m->acked || !m->sent || m->needs_write || m->stamp != stamp)
        return;
    m->needs_write = 1;
    ch->unsent++;
    if (m->resends < 0xFFFF)
        m->resends++;
    ch->fast_resends++;
    if (m->resends > ch->max_resends)
        ch->failed = 1;
    m->deadline = now + m->rto;
}

/* On a live stream (a new message went out within two intervals) an expiry where lateness is
 * likely rides the stream's next datagram, so a path whose RTT jumps is not sent extra
 * datagrams for what is only late; if none comes within min(rto, 2 intervals), the message
 * is resent on its own after all. On a lossy path an expiry more likely means a loss, and a
 * datagram of its own also gets past a burst sooner. */
double rc_send_channel_expire(rc_send_channel *ch, double now, int lateness_likely)
{
    uint16_t id, stop = window_end(ch);
    double earliest = -1.0;
    int live = lateness_likely && ch->redundant && ch->last_new_at >= 0.0
               && ch->stream_interval > 0.0 && now - ch->last_new_at <= 2.0 * ch->stream_interval;
    for (id = ch->oldest; id != stop; id++) {
        rc_out_msg *m = msg_at(ch, id);
        if (m->acked || !m->sent)
            continue;
        if (now >= m->deadline && m->overdue) {
            /* The stream stopped before a datagram could carry it: resend it now. */
            m->overdue = 0;
            ch->overdue--;
            m->deadline = now + m->rto;
            if (!m->needs_write) {
                m->needs_write = 1;
                ch->unsent++;
            }
        } else if (now >= m->deadline) {
            if (m->resends < 0xFFFF)
                m->resends++;
            ch->resends++;
            m->rto *= 1.5;
            m->deadline = now + m->rto;
            if (m->resends > ch->max_resends || m->rto > ch->rto_limit)
                ch->failed = 1;
            if (live && !m->needs_write) {
                double ride = 2.0 * ch->stream_interval;
                m->overdue = 1;
                ch->overdue++;
                m->deadline = now + (m->rto < ride ? m->rto : ride);
            } else if (!m->needs_write) {
                m->needs_write = 1;
                ch->unsent++;
            }
        }
        if (earliest < 0.0 || m->deadline < earliest)
            earliest = m->deadline;
    }
    return earliest;
}

double rc_send_channel_next_deadline(const rc_send_channel *ch)
{
    uint16_t id, stop = window_end(ch);
    double earliest = -1.0;
    for (id = ch->oldest; id != stop; id++) {
        const rc_out_msg *m = msg_at(ch, id);
        if (m->acked || !m->sent)
            continue;
        if (earliest < 0.0 || m->deadline < earliest)
            earliest = m->deadline;
    }
    return earliest;
}

/* -- receive ---------------------------------------------------------------------------- */

void rc_recv_channel_init(rc_recv_channel *ch, int id, uint32_t window, rc_in_slot *slots)
{
    ch->id = id;
    ch->window = window;
    ch->slots = slots;
    ch->expected = 0;
    ch->duplicates = ch->delivered = 0;
    memset(slots, 0, window * sizeof *slots);
}

void rc_recv_channel_reset(rc_recv_channel *ch, rc_arena *arena)
{
    uint32_t i;
    for (i = 0; i < ch->window; i++) {
        rc_in_slot *s = &ch->slots[i];
        if (s->state == 1)
            rc_arena_free(arena, s->handle);
        else if (s->state == 2)
            rc_partial_release(&s->partial, arena);
        memset(s, 0, sizeof *s);
    }
    ch->expected = 0;
}

static rc_in_slot *slot_of(rc_recv_channel *ch, uint16_t msg_id)
{
    return &ch->slots[msg_id & (ch->window - 1)];
}

/* Delivers held messages from expected on. */
static void drain(rc_recv_channel *ch, rc_arena *arena, rc_deliver_fn deliver, void *context)
{
    for (;;) {
        rc_in_slot *s = slot_of(ch, ch->expected);
        if (s->state != 1)
            return;
        s->state = 0;
        ch->expected++;
        ch->delivered++;
        deliver(context, ch->id, rc_arena_ptr(arena, s->handle), s->length);
        rc_arena_free(arena, s->handle);
    }
}

int rc_recv_channel_record(rc_recv_channel *ch, const rc_recv_limits *limits, uint16_t msg_id,
                           int fragment, uint8_t fragment_index, uint8_t fragment_count,
                           const uint8_t *data, size_t length, rc_deliver_fn deliver,
                           void *context)
{
    int d = rc_seq_diff(msg_id, ch->expected);
    rc_in_slot *s;
    rc_arena *arena = limits->arena;
    if (d < 0) {
        ch->duplicates++;
        return RC_OK;
    }
    if ((uint32_t)d >= ch->window)
        return RC_DROP_MESSAGE_OUT_OF_WINDOW;
    s = slot_of(ch, msg_id);
    if (s->state == 1) {
        ch->duplicates++;
        return RC_OK;
    }
    if (!fragment) {
        if (s->state == 2)
            return RC_DROP_BAD_FRAGMENT;
        if (d == 0) {
            ch->expected++;
            ch->delivered++;
            deliver(context, ch->id, data, length);
            drain(ch, arena, deliver, context);
            return RC_OK;
        }
        if (arena->charged + length > limits->hold_limit)
            return RC_DROP_REASSEMBLY_FULL;
        s->handle = rc_arena_alloc(arena, (uint32_t)length);
        if (s->handle < 0)
            return RC_DROP_REASSEMBLY_FULL;
        if (length)
            memcpy(rc_arena_ptr(arena, s->handle), data, length);
        s->length = (uint32_t)length;
        s->state = 1;
        return RC_OK;
    }
    {
        int complete = 0, drop;
        uint32_t total = 0, allowance;
        if (s->state == 0)
            memset(&s->partial, 0, sizeof s->partial);     /* count 0: set up by the first */
        if (d == 0)
            allowance = arena->capacity - arena->charged;
        else
            allowance = arena->charged < limits->hold_limit ? limits->hold_limit - arena->charged : 0;
        drop = rc_partial_add(&s->partial, arena, fragment_index, fragment_count, data, length,
                              limits->max_message_size, allowance, &complete, &total);
        if (drop) {
            if (s->state == 0)
                memset(&s->partial, 0, sizeof s->partial);
            return drop;
        }
        s->state = 2;
        if (!complete)
            return RC_OK;
        s->handle = s->partial.handle;
        s->length = total;
        s->state = 1;
        memset(&s->partial, 0, sizeof s->partial);
        drain(ch, arena, deliver, context);
        return RC_OK;
    }
}
