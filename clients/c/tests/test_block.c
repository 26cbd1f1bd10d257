/* test_block.c - block receiver: layout checks, BLOCK_ACK contents, completion, old blocks. */
#include "block.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static uint8_t buffer[4096], bitmap[RC_BLOCK_BITMAP_BYTES], got[4096];
static size_t got_length;
static int blocks;

static void on_block(void *context, const uint8_t *data, size_t length)
{
    (void)context;
    memcpy(got, data, length);
    got_length = length;
    blocks++;
}

static rc_record slice(uint16_t block_id, uint16_t index, uint16_t count, uint32_t size,
                       const uint8_t *data, size_t length)
{
    rc_record r;
    memset(&r, 0, sizeof r);
    r.kind = RC_RK_BLOCK_SLICE;
    r.block_id = block_id;
    r.slice_index = index;
    r.slice_count = count;
    r.block_size = size;
    r.payload = data;
    r.length = length;
    return r;
}

static int parse_ack(const uint8_t *buf, size_t end, rc_record *r)
{
    size_t next;
    return rc_record_parse(buf, 0, end, r, &next) == RC_OK && next == end && r->kind == RC_RK_BLOCK_ACK;
}

static void test_slices_out_of_order_complete_the_block(void)
{
    rc_block_recv b;
    rc_record r, ack;
    uint8_t data[10] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 }, out[128];
    size_t end;
    rc_block_recv_init(&b, buffer, sizeof buffer, bitmap);
    blocks = 0;
    CHECK(rc_block_recv_ack_size(&b) == 0);
    r = slice(0, 2, 3, 10, data + 8, 2);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK);
    end = rc_block_recv_write_ack(&b, out, 0, sizeof out);
    CHECK(parse_ack(out, end, &ack) && ack.block_id == 0 && ack.base == 0 && ack.length == 1 && ack.payload[0] == 0x04);
    CHECK(rc_block_recv_ack_size(&b) == 0);
    r = slice(0, 1, 3, 10, data + 4, 3);             /* wrong length: slices are 4, 4, 2 */
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_DROP_BAD_BLOCK_SLICE);
    r = slice(0, 1, 3, 11, data + 4, 4);             /* another block_size */
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_DROP_BAD_BLOCK_SLICE);
    r = slice(1, 0, 3, 10, data, 4);                 /* a future block */
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_DROP_BAD_BLOCK_SLICE);
    r = slice(0, 0, 3, 10, data, 4);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK);
    end = rc_block_recv_write_ack(&b, out, 0, sizeof out);
    CHECK(parse_ack(out, end, &ack) && ack.base == 1 && ack.length == 1 && ack.payload[0] == 0x02);
    r = slice(0, 1, 3, 10, data + 4, 4);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK);
    CHECK(blocks == 1 && got_length == 10 && memcmp(got, data, 10) == 0);
    end = rc_block_recv_write_ack(&b, out, 0, sizeof out);
    CHECK(parse_ack(out, end, &ack) && ack.block_id == 0 && ack.base == 3 && ack.length == 0);
    /* a repeated slice of the completed block owes the completion ack again */
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK && blocks == 1);
    end = rc_block_recv_write_ack(&b, out, 0, sizeof out);
    CHECK(parse_ack(out, end, &ack) && ack.block_id == 0 && ack.base == 3);
}

static void test_layout_and_size_limits(void)
{
    rc_block_recv b;
    rc_record r;
    uint8_t data[8] = { 0 };
    rc_block_recv_init(&b, buffer, 100, bitmap);
    blocks = 0;
    r = slice(0, 0, 1, 101, data, 8);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_DROP_BLOCK_TOO_LARGE);
    r = slice(0, 0, 5, 4, data, 1);                  /* 5 slices of 1 byte cannot make 4 */
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_DROP_BAD_BLOCK_SLICE);
    r = slice(0, 0, 2, 0, data, 0);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_DROP_BAD_BLOCK_SLICE);
    r = slice(0, 0, 1, 0, data, 0);                  /* the empty block */
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK && blocks == 1 && got_length == 0);
    CHECK(b.expected == 1);
}

static void test_ack_bitfield_covers_at_most_512_slices(void)
{
    rc_block_recv b;
    rc_record r, ack;
    static uint8_t out[256];
    uint8_t data[1] = { 7 };
    size_t end;
    rc_block_recv_init(&b, buffer, sizeof buffer, bitmap);
    r = slice(0, 600, 1000, 1000, data, 1);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK);
    r = slice(0, 5, 1000, 1000, data, 1);
    CHECK(rc_block_recv_slice(&b, &r, on_block, NULL) == RC_OK);
    CHECK(rc_block_recv_ack_size(&b) == 6 + 64);
    CHECK(rc_block_recv_write_ack(&b, out, 0, 60) == 0);      /* does not fit: stays owed */
    end = rc_block_recv_write_ack(&b, out, 0, sizeof out);
    CHECK(parse_ack(out, end, &ack) && ack.base == 0 && ack.length == 64 && ack.payload[0] == 0x20);
}

int main(void)
{
    test_slices_out_of_order_complete_the_block();
    test_layout_and_size_limits();
    test_ack_bitfield_covers_at_most_512_slices();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
