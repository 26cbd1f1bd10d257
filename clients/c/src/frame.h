/*
 * frame.h - compact FRAME (version 2) decoding against the previous frame's inputs
 * (docs/RELAY_PROTOCOL.md section 7.1) and history blocks, zlib(msgpack([first_frame,
 * [frame bytes, ...]])) (section 9.2).
 */
#ifndef RC_FRAME_H
#define RC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define RF_MAX_SLOTS 256
#define RF_MAX_EVENT_NAME 256     /* bytes: 64 characters of up to 4 bytes */

enum {
    RF_OK = 0,
    RF_MALFORMED = -1,            /* breaks a rule of section 7.1 */
    RF_NEEDS_PREVIOUS = -2,       /* a same bit with no previous frame given */
    RF_TOO_LARGE = -3             /* the decoded frame does not fit the arena */
};

/* A decoded frame. Inputs and events are copied into the arena (the caller's memory), so the
 * frame stays valid after the FRAME bytes are gone and can be the next frame's `previous`.
 * Event records in the arena: kind u8, slot u8, name length u16 LE, name. */
typedef struct rf_frame {
    uint32_t number;
    uint32_t slot_count;
    int32_t length[RF_MAX_SLOTS];     /* -1: nil */
    uint32_t offset[RF_MAX_SLOTS];    /* into arena */
    uint8_t synthesized[RF_MAX_SLOTS / 8];
    uint32_t event_count;
    uint32_t events_offset;           /* first event record in arena */
    uint32_t events_end;
    uint8_t *arena;
    size_t arena_capacity;
} rf_frame;

void rf_frame_init(rf_frame *frame, uint8_t *arena, size_t capacity);   /* empty: no slots */

/* The number of a FRAME message (0xC1, varint) without decoding the rest: 0 or RF_MALFORMED. */
int rf_frame_number(const uint8_t *data, size_t length, uint32_t *number);

/* Decodes data into *out. previous: the previous frame's decoded inputs (a frame with
 * slot_count 0 before frame 0), or NULL if there is none (a same bit is then
 * RF_NEEDS_PREVIOUS). out must not be previous. */
int rf_decode(const uint8_t *data, size_t length, const rf_frame *previous, rf_frame *out);

/* The event at index: 0 and its fields (name points into the arena), or -1 past the last.
 * Walks the records from the first (frames hold few events). */
int rf_frame_event(const rf_frame *frame, uint32_t index, int *kind, int *slot,
                   const char **name, uint32_t *name_length);

/* ---- history blocks ---- */

/* zlib works from this fixed memory (no malloc): 64 KiB is ample for inflate. */
#define RF_INFLATE_MEMORY (64 * 1024)

/* The block's first frame and frame count, read by inflating only its first bytes.
 * 0 or RF_MALFORMED. */
int rf_history_peek(const uint8_t *block, size_t length, void *zmemory, uint32_t *first,
                    uint32_t *count);

/* Inflates the whole block into out (cap bytes): 0 and *out_length, RF_TOO_LARGE if it expands
 * past cap, RF_MALFORMED if it is not a complete zlib stream. */
int rf_history_inflate(const uint8_t *block, size_t length, void *zmemory, uint8_t *out,
                       size_t cap, size_t *out_length);

/* Checks an inflated block: exactly [first_frame u32, [bin, ...]] with nothing after it and
 * first_frame + count <= 2^32. 0 and *first, *count, *frames_offset (the first bin), or
 * RF_MALFORMED. */
int rf_history_parse(const uint8_t *raw, size_t length, uint32_t *first, uint32_t *count,
                     size_t *frames_offset);

/* The bin at *position (a frame of a parsed block): 0, the frame's bytes, *position moved past
 * it; RF_MALFORMED if there is no bin there. */
int rf_history_next(const uint8_t *raw, size_t length, size_t *position, const uint8_t **frame,
                    size_t *frame_length);

#endif
