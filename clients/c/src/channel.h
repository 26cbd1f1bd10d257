/* channel.h - the client's two reliable channels (PROTOCOL 12): reliable_ordered and
 * redundant send windows with a pending queue, RTO backoff and resend limits, redundant copies
 * as the redundancy controller's mode says (11.5, 12.4, 14.5: link.h) and RTO resends riding a
 * live stream (11.3); and the ordered receive window (12.5).
 * All storage is handed in by the connection (no allocation). */
#ifndef RC_CHANNEL_H
#define RC_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "fragment.h"

typedef struct rc_out_msg {
    double rto, deadline, written_at;
    uint32_t offset;                /* payload in the channel's byte ring */
    uint32_t stamp;                 /* latest datagram that carried it */
    uint16_t length;                /* <= max_send_size < 16384 */
    uint16_t resends;               /* <= max_resends + 1 <= 10001 */
    /* Bit-fields, so that an entry stays 40 bytes (window + send_queue of them per channel).
     * overdue: the RTO expired on a live stream, and it rides the stream's next datagram. */
    unsigned needs_write : 1, sent : 1, acked : 1, overdue : 1;
    unsigned copies : 8;            /* copies since the last (re)send, up to 255 */
} rc_out_msg;

typedef struct rc_send_channel {
    int id, redundant;
    uint32_t window;
    uint32_t queue_limit;           /* window + send_queue: msgs[] entries */
    uint32_t head_slot;             /* msgs[] slot of the oldest live id; the rest follow */
    rc_out_msg *msgs;
    uint16_t oldest, next_id;       /* live ids: oldest .. next_id - 1 */
    uint8_t *bytes;
    uint32_t bytes_cap, head, tail; /* FIFO byte ring of the live messages' payloads */
    uint32_t unsent;
    int failed;
    uint32_t max_resends;
    double rto_limit;
    uint64_t messages_sent, resends, fast_resends, redundant_bytes;
    /* The stream (redundant channels: where an RTO resend can ride): when the latest new
     * message was first sent, the smoothed time between datagrams that carried new ones, and
     * the messages waiting to ride the next one. */
    double last_new_at, stream_interval;
    uint32_t overdue;
} rc_send_channel;

/* msgs: window + send_queue entries. */
void rc_send_channel_init(rc_send_channel *ch, int id, int redundant, uint32_t window,
                          uint32_t send_queue, rc_out_msg *msgs,
                          uint8_t *bytes, uint32_t bytes_cap, uint32_t max_resends,
                          double rto_limit);
void rc_send_channel_reset(rc_send_channel *ch);
/* Queues a copy of the message: 0, or -1 (queue or byte ring full). */
int rc_send_channel_queue(rc_send_channel *ch, const uint8_t *data, size_t length);
uint32_t rc_send_channel_pending(const rc_send_channel *ch);
/* A message in the window waits to be written (new or due for resend). */
int rc_send_channel_has_unsent(const rc_send_channel *ch);

/* Called by the writer for each unit written: channel, msg_id. */
typedef void (*rc_unit_fn)(void *context, int channel, uint16_t msg_id);

/* Writes new and resend-due messages into buf[pos..end), oldest first, stopping at the first
 * that does not fit. Returns the new pos. */
size_t rc_send_channel_write(rc_send_channel *ch, uint8_t *buf, size_t pos, size_t end,
                             double now, double rto, uint32_t stamp, rc_unit_fn unit,
                             void *context);
/* Redundant copies (PROTOCOL 12.4) when copies is set, and overdue messages whatever it is
 * (their RTO resend riding the stream, 11.3). max_copies 0: every datagram until acked, the
 * deadline left alone; else at most max_copies per (re)send, the first prompt_copies at once
 * and the others once late_after has passed since the message was last written. */
size_t rc_send_channel_write_copies(rc_send_channel *ch, uint8_t *buf, size_t pos, size_t end,
                                    size_t budget, uint32_t stamp, int copies,
                                    uint32_t max_copies, uint32_t prompt_copies, double now,
                                    double late_after, rc_unit_fn unit, void *context);
void rc_send_channel_on_ack(rc_send_channel *ch, uint16_t msg_id);
/* Ack-gap loss of the datagram with stamp (PROTOCOL 11.5). */
void rc_send_channel_on_lost(rc_send_channel *ch, uint16_t msg_id, uint32_t stamp, double now);
/* RTO expiries; returns the earliest deadline left (< 0: none). lateness_likely (the
 * controller says clean or congested): on a live stream an expired message is marked overdue
 * instead of getting a datagram of its own (PROTOCOL 11.3). */
double rc_send_channel_expire(rc_send_channel *ch, double now, int lateness_likely);
double rc_send_channel_next_deadline(const rc_send_channel *ch);

/* Receive side (reliable_ordered and redundant are the same, PROTOCOL 12.5). */
typedef struct rc_in_slot {
    uint8_t state;                  /* 0 empty, 1 complete (held), 2 partial */
    int handle;                     /* arena allocation */
    uint32_t length;
    rc_partial partial;
} rc_in_slot;

typedef void (*rc_deliver_fn)(void *context, int channel, const uint8_t *data, size_t length);

typedef struct rc_recv_channel {
    int id;
    uint32_t window;
    uint16_t expected;
    rc_in_slot *slots;              /* window entries, slot msg_id mod window */
    uint64_t duplicates, delivered;
} rc_recv_channel;

typedef struct rc_recv_limits {
    rc_arena *arena;
    uint32_t max_message_size;
    uint32_t hold_limit;            /* bytes the arena may hold for ids ahead of expected */
} rc_recv_limits;

void rc_recv_channel_init(rc_recv_channel *ch, int id, uint32_t window, rc_in_slot *slots);
void rc_recv_channel_reset(rc_recv_channel *ch, rc_arena *arena);
/* One MESSAGE (fragment_count 0) or FRAGMENT record: 0 or a drop reason (record refused). */
int rc_recv_channel_record(rc_recv_channel *ch, const rc_recv_limits *limits, uint16_t msg_id,
                           int fragment, uint8_t fragment_index, uint8_t fragment_count,
                           const uint8_t *data, size_t length, rc_deliver_fn deliver,
                           void *context);

#endif
