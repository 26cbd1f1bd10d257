/* test_channel.c - reliable send window, queue, RTO backoff, copies, ack-gap resends, and the
 * ordered receive window (PROTOCOL 11.3, 11.5, 12). */
#include "channel.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static int units;
static void count_unit(void *context, int channel, uint16_t msg_id)
{
    (void)context; (void)channel; (void)msg_id;
    units++;
}

static rc_out_msg msgs[32];
static uint8_t bytes[256];
static const uint8_t src[256];  /* message payloads (never the ring itself) */

static void make(rc_send_channel *ch, int redundant, uint32_t window, uint32_t queue)
{
    rc_send_channel_init(ch, 1, redundant, window, queue, msgs, bytes, sizeof bytes, 3, 5.0);
}

/* The ids of the MESSAGE records in buf[20..end). */
static int ids(const uint8_t *buf, size_t end, uint16_t *out)
{
    size_t pos = 20, next;
    int n = 0;
    rc_record r;
    while (pos < end && rc_record_parse(buf, pos, end, &r, &next) == RC_OK) {
        out[n++] = r.msg_id;
        pos = next;
    }
    return n;
}

static void test_window_holds_later_messages_in_the_queue(void)
{
    rc_send_channel ch;
    uint8_t buf[1200];
    uint16_t got[64];
    int i;
    make(&ch, 0, 8, 8);
    for (i = 0; i < 16; i++)
        CHECK(rc_send_channel_queue(&ch, (const uint8_t *)"abcdefgh", 8) == 0);
    CHECK(rc_send_channel_queue(&ch, (const uint8_t *)"x", 1) == -1);      /* window + queue full */
    CHECK(rc_send_channel_pending(&ch) == 16);
    CHECK(rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.0, 0.2, 1, count_unit, NULL) > 20);
    {
        size_t end = rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.0, 0.2, 2, count_unit, NULL);
        CHECK(end == 20);                                                  /* nothing new */
    }
    CHECK(!rc_send_channel_has_unsent(&ch));
    rc_send_channel_on_ack(&ch, 1);                    /* out of order: oldest stays 0 */
    CHECK(ch.oldest == 0);
    rc_send_channel_on_ack(&ch, 0);
    CHECK(ch.oldest == 2 && rc_send_channel_has_unsent(&ch));
    {
        size_t end = rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.1, 0.2, 3, count_unit, NULL);
        int n = ids(buf, end, got);
        CHECK(n == 2 && got[0] == 8 && got[1] == 9);
    }
}

static void test_write_stops_at_the_first_message_that_does_not_fit(void)
{
    rc_send_channel ch;
    uint8_t buf[64];
    uint16_t got[8];
    size_t end;
    make(&ch, 0, 8, 8);
    rc_send_channel_queue(&ch, src, 10);
    rc_send_channel_queue(&ch, src, 30);
    rc_send_channel_queue(&ch, src, 2);
    end = rc_send_channel_write(&ch, buf, 20, 60, 0.0, 0.2, 1, count_unit, NULL);
    CHECK(ids(buf, end, got) == 1 && got[0] == 0);
    end = rc_send_channel_write(&ch, buf, 20, 60, 0.0, 0.2, 2, count_unit, NULL);
    CHECK(ids(buf, end, got) == 2 && got[0] == 1 && got[1] == 2);
}

static void test_rto_backs_off_and_fails_past_max_resends(void)
{
    rc_send_channel ch;
    uint8_t buf[1200];
    double t = 0.0;
    int i;
    make(&ch, 0, 8, 8);
    rc_send_channel_queue(&ch, (const uint8_t *)"m", 1);
    rc_send_channel_write(&ch, buf, 20, sizeof buf, t, 0.2, 1, count_unit, NULL);
    CHECK(rc_send_channel_next_deadline(&ch) > 0.199 && rc_send_channel_next_deadline(&ch) < 0.201);
    rc_send_channel_expire(&ch, 0.1, 0);
    CHECK(!rc_send_channel_has_unsent(&ch));
    t = 0.2;
    rc_send_channel_expire(&ch, t, 0);
    CHECK(rc_send_channel_has_unsent(&ch) && ch.resends == 1);
    CHECK(msgs[0].rto > 0.299 && msgs[0].rto < 0.301);
    for (i = 0; i < 3 && !ch.failed; i++) {
        rc_send_channel_write(&ch, buf, 20, sizeof buf, t, 0.2, (uint32_t)(2 + i), count_unit, NULL);
        t = rc_send_channel_next_deadline(&ch);
        rc_send_channel_expire(&ch, t, 0);
    }
    CHECK(ch.failed && ch.resends == 4);
}

static void test_copies_go_newest_first_within_the_budget_and_are_bounded(void)
{
    rc_send_channel ch;
    uint8_t buf[1200];
    uint16_t got[16];
    size_t end;
    int i;
    make(&ch, 1, 16, 8);
    for (i = 0; i < 5; i++)
        rc_send_channel_queue(&ch, src, 10);     /* record size 14 */
    rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.0, 0.2, 1, count_unit, NULL);
    rc_send_channel_queue(&ch, src, 10);
    end = rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.01, 0.2, 2, count_unit, NULL);
    end = rc_send_channel_write_copies(&ch, buf, end, sizeof buf, 3 * 14, 2, 1, 4, 1, 0.01, 1.0,
                                       count_unit, NULL);
    CHECK(ids(buf, end, got) == 4 && got[0] == 5 && got[1] == 2 && got[2] == 3 && got[3] == 4);
    CHECK(ch.redundant_bytes == 3 * 14);
    /* second copy of 2..4 waits for late_after; 0, 1 get their first */
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 3, 1, 4, 1, 0.02, 1.0, count_unit, NULL);
    CHECK(ids(buf, end, got) == 3 && got[0] == 0 && got[1] == 1 && got[2] == 5);
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 4, 1, 4, 1, 2.0, 1.0, count_unit, NULL);
    CHECK(ids(buf, end, got) == 6);
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 5, 1, 2, 1, 3.0, 1.0, count_unit, NULL);
    CHECK(ids(buf, end, got) == 0);                /* max copies reached */
}

static void test_ack_gap_resends_only_from_the_latest_carrier(void)
{
    rc_send_channel ch;
    uint8_t buf[1200];
    make(&ch, 1, 16, 8);
    rc_send_channel_queue(&ch, src, 4);
    rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.0, 0.2, 7, count_unit, NULL);
    rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 8, 1, 4, 1, 0.0, 0.0, count_unit, NULL);
    rc_send_channel_on_lost(&ch, 0, 7, 0.1);       /* a later datagram (8) carried a copy */
    CHECK(!rc_send_channel_has_unsent(&ch));
    rc_send_channel_on_lost(&ch, 0, 8, 0.1);
    CHECK(rc_send_channel_has_unsent(&ch) && ch.fast_resends == 1);
    rc_send_channel_on_ack(&ch, 0);
    CHECK(!rc_send_channel_has_unsent(&ch) && rc_send_channel_pending(&ch) == 0);
}

static void test_byte_ring_wraps_and_refuses_when_full(void)
{
    rc_send_channel ch;
    uint8_t buf[1200];
    int i;
    rc_send_channel_init(&ch, 0, 0, 16, 16, msgs, bytes, 100, 3, 5.0);
    for (i = 0; i < 3; i++)
        CHECK(rc_send_channel_queue(&ch, src, 30) == 0);
    CHECK(rc_send_channel_queue(&ch, src, 30) == -1);
    rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.0, 0.2, 1, count_unit, NULL);
    rc_send_channel_on_ack(&ch, 0);
    CHECK(rc_send_channel_queue(&ch, (const uint8_t *)"0123456789012345678901234567", 28) == 0);
    CHECK(msgs[3].offset == 0);                    /* wrapped to the start */
    CHECK(rc_send_channel_queue(&ch, src, 5) == -1);
    rc_send_channel_on_ack(&ch, 1);
    rc_send_channel_on_ack(&ch, 2);
    CHECK(rc_send_channel_queue(&ch, src, 60) == 0);
}

static void test_prompt_copies_and_what_a_copy_does_to_the_deadline(void)
{
    rc_send_channel ch;
    uint8_t buf[1200];
    uint16_t got[8];
    size_t end;
    make(&ch, 1, 16, 8);
    rc_send_channel_queue(&ch, src, 4);
    rc_send_channel_write(&ch, buf, 20, sizeof buf, 0.0, 0.2, 1, count_unit, NULL);
    /* copies off: nothing, whatever the limits */
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 2, 0, 0, 1, 0.01, 1.0,
                                       count_unit, NULL);
    CHECK(ids(buf, end, got) == 0);
    /* lossy, prompt_copies 2: two copies at once, the third waits for late_after; each copy
     * restarts the RTO deadline */
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 3, 1, 4, 2, 0.01, 1.0,
                                       count_unit, NULL);
    CHECK(ids(buf, end, got) == 1 && msgs[0].deadline > 0.2099 && msgs[0].deadline < 0.2101);
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 4, 1, 4, 2, 0.02, 1.0,
                                       count_unit, NULL);
    CHECK(ids(buf, end, got) == 1);
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 5, 1, 4, 2, 0.03, 1.0,
                                       count_unit, NULL);
    CHECK(ids(buf, end, got) == 0);
    /* bursty (max_copies 0): every datagram, and the deadline stays where it was */
    end = rc_send_channel_write_copies(&ch, buf, 20, sizeof buf, 1200, 6, 1, 0, 1, 0.1, 1.0,
                                       count_unit, NULL);
    CHECK(ids(buf, end, got) == 1 && msgs[0].deadline > 0.2199 && msgs[0].deadline < 0.2201);
    CHECK(ch.redundant_bytes == 3 * 8 && ch.overdue == 0);
}

/* -- receive -- */

static char delivered[64][16];
static int delivered_count;
static void deliver(void *context, int channel, const uint8_t *data, size_t length)
{
    (void)context; (void)channel;
    memcpy(delivered[delivered_count], data, length);
    delivered[delivered_count][length] = 0;
    delivered_count++;
}

static void test_receive_window_delivers_in_order_once(void)
{
    static uint8_t arena_bytes[4096];
    rc_arena_entry entries[8];
    rc_arena arena;
    rc_in_slot slots[8];
    rc_recv_channel ch;
    rc_recv_limits limits;
    rc_arena_init(&arena, arena_bytes, sizeof arena_bytes, entries, 8);
    limits.arena = &arena;
    limits.max_message_size = 1000;
    limits.hold_limit = 20;
    rc_recv_channel_init(&ch, 0, 8, slots);
    delivered_count = 0;
    CHECK(rc_recv_channel_record(&ch, &limits, 2, 0, 0, 0, (const uint8_t *)"c", 1, deliver, NULL) == RC_OK);
    CHECK(rc_recv_channel_record(&ch, &limits, 1, 0, 0, 0, (const uint8_t *)"b", 1, deliver, NULL) == RC_OK);
    CHECK(delivered_count == 0);
    CHECK(rc_recv_channel_record(&ch, &limits, 8, 0, 0, 0, (const uint8_t *)"x", 1, deliver, NULL)
          == RC_DROP_MESSAGE_OUT_OF_WINDOW);
    CHECK(rc_recv_channel_record(&ch, &limits, 3, 0, 0, 0, src, 30, deliver, NULL) == RC_DROP_REASSEMBLY_FULL);
    CHECK(rc_recv_channel_record(&ch, &limits, 0, 0, 0, 0, (const uint8_t *)"a", 1, deliver, NULL) == RC_OK);
    CHECK(delivered_count == 3 && strcmp(delivered[0], "a") == 0 && strcmp(delivered[2], "c") == 0);
    CHECK(arena.charged == 0);
    CHECK(rc_recv_channel_record(&ch, &limits, 1, 0, 0, 0, (const uint8_t *)"b", 1, deliver, NULL) == RC_OK);
    CHECK(delivered_count == 3 && ch.duplicates == 1);
    /* fragments of id 3 (expected): count must agree, a MESSAGE for it is bad_fragment */
    CHECK(rc_recv_channel_record(&ch, &limits, 3, 1, 1, 3, (const uint8_t *)"de", 2, deliver, NULL) == RC_OK);
    CHECK(rc_recv_channel_record(&ch, &limits, 3, 1, 0, 4, (const uint8_t *)"de", 2, deliver, NULL) == RC_DROP_BAD_FRAGMENT);
    CHECK(rc_recv_channel_record(&ch, &limits, 3, 0, 0, 0, (const uint8_t *)"z", 1, deliver, NULL) == RC_DROP_BAD_FRAGMENT);
    CHECK(rc_recv_channel_record(&ch, &limits, 3, 1, 2, 3, (const uint8_t *)"f", 1, deliver, NULL) == RC_OK);
    CHECK(rc_recv_channel_record(&ch, &limits, 3, 1, 0, 3, (const uint8_t *)"ab", 2, deliver, NULL) == RC_OK);
    CHECK(delivered_count == 4 && strcmp(delivered[3], "abdef") == 0);
    CHECK(arena.charged == 0);
}

int main(void)
{
    test_window_holds_later_messages_in_the_queue();
    test_write_stops_at_the_first_message_that_does_not_fit();
    test_rto_backs_off_and_fails_past_max_resends();
    test_copies_go_newest_first_within_the_budget_and_are_bounded();
    test_ack_gap_resends_only_from_the_latest_carrier();
    test_prompt_copies_and_what_a_copy_does_to_the_deadline();
    test_byte_ring_wraps_and_refuses_when_full();
    test_receive_window_delivers_in_order_once();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
