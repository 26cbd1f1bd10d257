/* block.c - block receiver (PROTOCOL 6.5, 6.6, 13). */
#include "block.h"

#include <string.h>

void rc_block_recv_init(rc_block_recv *b, uint8_t *buffer, uint32_t max_block_size,
                        uint8_t *bitmap)
{
    b->buffer = buffer;
    b->max_block_size = max_block_size;
    b->received = bitmap;
    rc_block_recv_reset(b);
}

void rc_block_recv_reset(rc_block_recv *b)
{
    b->expected = 0;
    b->active = 0;
    b->block_size = b->slice_size = b->received_count = 0;
    b->slice_count = b->base = 0;
    b->have_completed = 0;
    b->completed_id = b->completed_count = 0;
    b->ack_owed = b->ack_completed = 0;
}

static int has_slice(const rc_block_recv *b, uint32_t i) { return (b->received[i >> 3] >> (i & 7)) & 1; }

int rc_block_recv_slice(rc_block_recv *b, const rc_record *r, rc_block_fn on_block,
                        void *context)
{
    int d = rc_seq_diff(r->block_id, b->expected);
    uint32_t start, stop;
    if (d < 0) {
        if (b->have_completed && r->block_id == b->completed_id) {
            b->ack_owed = 1;
            b->ack_completed = 1;
        }
        return RC_OK;
    }
    if (d > 0)
        return RC_DROP_BAD_BLOCK_SLICE;
    if (!b->active) {
        uint32_t count = r->slice_count, size = r->block_size, slice;
        if (size > b->max_block_size)
            return RC_DROP_BLOCK_TOO_LARGE;
        slice = (uint32_t)(((uint64_t)size + count - 1) / count);
        if (size == 0 ? count != 1 : (uint64_t)(count - 1) * slice >= size)
            return RC_DROP_BAD_BLOCK_SLICE;
        b->block_size = size;
        b->slice_count = (uint16_t)count;
        b->slice_size = slice;
        b->received_count = 0;
        b->base = 0;
        memset(b->received, 0, ((size_t)count + 7) / 8);
        b->active = 1;
    } else if (r->block_size != b->block_size || r->slice_count != b->slice_count) {
        return RC_DROP_BAD_BLOCK_SLICE;
    }
    start = (uint32_t)r->slice_index * b->slice_size;
    stop = start + b->slice_size;
    if (stop > b->block_size)
        stop = b->block_size;
    if (r->length != (size_t)(stop - start))
        return RC_DROP_BAD_BLOCK_SLICE;
    b->ack_owed = 1;
    b->ack_completed = 0;
    if (has_slice(b, r->slice_index))
        return RC_OK;
    if (r->length)
        memcpy(b->buffer + start, r->payload, r->length);
    b->received[r->slice_index >> 3] |= (uint8_t)(1u << (r->slice_index & 7));
    b->received_count++;
    while (b->base < b->slice_count && has_slice(b, b->base))
        b->base++;
    if (b->received_count == b->slice_count) {
        b->have_completed = 1;
        b->completed_id = b->expected;
        b->completed_count = b->slice_count;
        b->ack_completed = 1;
        b->active = 0;
        b->expected++;
        on_block(context, b->buffer, b->block_size);
    }
    return RC_OK;
}

static size_t bitfield_slices(const rc_block_recv *b)
{
    size_t n = (size_t)b->slice_count - b->base;
    return n > RC_BLOCK_ACK_MAX_SLICES ? RC_BLOCK_ACK_MAX_SLICES : n;
}

size_t rc_block_recv_ack_size(const rc_block_recv *b)
{
    if (!b->ack_owed)
        return 0;
    if (b->ack_completed)
        return 6;
    return 6 + (bitfield_slices(b) + 7) / 8;
}

size_t rc_block_recv_write_ack(rc_block_recv *b, uint8_t *buf, size_t pos, size_t end)
{
    size_t size = rc_block_recv_ack_size(b);
    if (size == 0 || pos + size > end)
        return pos;
    if (b->ack_completed) {
        pos += rc_block_ack_record_write(buf + pos, b->completed_id, b->completed_count, NULL, 0);
    } else {
        uint8_t bits[RC_BLOCK_ACK_MAX_SLICES / 8];
        size_t n = bitfield_slices(b), i;
        memset(bits, 0, sizeof bits);
        for (i = 0; i < n; i++)
            if (has_slice(b, (uint32_t)b->base + (uint32_t)i))
                bits[i >> 3] |= (uint8_t)(1u << (i & 7));
        pos += rc_block_ack_record_write(buf + pos, b->expected, b->base, bits, (n + 7) / 8);
    }
    b->ack_owed = 0;
    return pos;
}
