/* fragment.h - receive-side storage of a connection (PROTOCOL 12.5): an arena for messages
 * held out of order and for partial fragmented messages, with the reassembly_limit budget,
 * and the per-message fragment bookkeeping. Fixed memory, no allocation: the arena is one
 * byte range with a small table of live allocations, compacted when a free range is split. */
#ifndef RC_FRAGMENT_H
#define RC_FRAGMENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct rc_arena_entry {
    uint32_t offset, length;
    int in_use;
} rc_arena_entry;

typedef struct rc_arena {
    uint8_t *data;
    uint32_t capacity;
    rc_arena_entry *entries;
    uint32_t entry_count;
    uint32_t charged;           /* bytes allocated */
} rc_arena;

void rc_arena_init(rc_arena *arena, uint8_t *data, uint32_t capacity, rc_arena_entry *entries,
                   uint32_t entry_count);
void rc_arena_reset(rc_arena *arena);
/* A handle (>= 0) to length bytes, or -1 when they do not fit. */
int rc_arena_alloc(rc_arena *arena, uint32_t length);
void rc_arena_free(rc_arena *arena, int handle);
uint8_t *rc_arena_ptr(rc_arena *arena, int handle);

/* A fragmented message being reassembled. Fragments are placed at index * fragment_size,
 * fragment_size being the length of the first non-last fragment seen (every sender cuts
 * messages into equal pieces, the last one no longer; PROTOCOL 6.4). A last fragment that
 * arrives before any other is kept in an allocation of its own until the layout is known.
 * A non-last fragment of another length, or a last one longer than the others, is refused
 * (bad_fragment). */
typedef struct rc_partial {
    uint8_t count, received;
    uint32_t fragment_size;     /* 0: not known yet */
    uint32_t last_length;
    int handle;                 /* the message, count * fragment_size bytes */
    int tail_handle;            /* the early last fragment, or -1 */
    uint8_t bits[32];
} rc_partial;

/* Releases what a partial message holds. */
void rc_partial_release(rc_partial *partial, rc_arena *arena);

/* PROTOCOL 12.5 FRAGMENT handling for one message. allowance: bytes the arena may grow by
 * for this message (budget). Returns 0 (stored or repeated), or a drop reason; sets
 * *complete and *length when all fragments are present. */
int rc_partial_add(rc_partial *partial, rc_arena *arena, uint8_t index, uint8_t count,
                   const uint8_t *data, size_t length, uint32_t max_message_size,
                   uint32_t allowance, int *complete, uint32_t *total_length);

#endif
