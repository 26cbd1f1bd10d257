/* block.h - block transfer, receiving side (PROTOCOL 13): slices into one buffer of
 * max_block_size bytes, BLOCK_ACK generation. The client never sends blocks. */
#ifndef RC_BLOCK_H
#define RC_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define RC_BLOCK_BITMAP_BYTES 8192      /* one bit per slice index 0..65535 */
#define RC_BLOCK_ACK_MAX_SLICES 512

typedef void (*rc_block_fn)(void *context, const uint8_t *data, size_t length);

typedef struct rc_block_recv {
    uint8_t *buffer;
    uint32_t max_block_size;
    uint8_t *received;                  /* RC_BLOCK_BITMAP_BYTES */
    uint16_t expected;                  /* block id x */
    int active;                         /* the first slice of x has arrived */
    uint32_t block_size, slice_size, received_count;
    uint16_t slice_count, base;
    int have_completed;
    uint16_t completed_id, completed_count;
    int ack_owed, ack_completed;        /* owed BLOCK_ACK; for the completed block */
} rc_block_recv;

void rc_block_recv_init(rc_block_recv *b, uint8_t *buffer, uint32_t max_block_size,
                        uint8_t *bitmap);
void rc_block_recv_reset(rc_block_recv *b);
/* A BLOCK_SLICE record: 0 or a drop reason (refused). */
int rc_block_recv_slice(rc_block_recv *b, const rc_record *r, rc_block_fn on_block,
                        void *context);
/* Size of the owed BLOCK_ACK record (0: none owed). */
size_t rc_block_recv_ack_size(const rc_block_recv *b);
/* Writes the owed BLOCK_ACK if it fits buf[pos..end); returns the new pos. */
size_t rc_block_recv_write_ack(rc_block_recv *b, uint8_t *buf, size_t pos, size_t end);

#endif
