/*
 * checks.h - what the C load generator verifies about the frames its players take, kept apart
 * from the I/O so that checks_test.c can show every check failing on a bad stream.
 */
#ifndef LG_CHECKS_H
#define LG_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#define LG_INPUT_SIZE 16
#define LG_LOST_TOLERANCE_FRAMES 3   /* benchmarks/players.py LOST_TOLERANCE_FRAMES */

/* 64-bit FNV-1a, continued from `hash` (start from LG_FNV_OFFSET). */
#define LG_FNV_OFFSET 0xcbf29ce484222325ULL
uint64_t lg_fnv1a(uint64_t hash, const void *data, size_t length);

/* A player's input for `frame`: the bytes of benchmarks/players.py's input_payload
 * (struct "<IIQ": player index, frame, frame * 2654435761 mod 2^64), so the server sees the
 * same load from either loader and a frame's input can be checked on its own. */
void lg_input_payload(uint32_t player_index, uint32_t frame, uint8_t out[LG_INPUT_SIZE]);
/* 1 if data is one of the player's inputs, for whichever frame it names (an input that came
 * late and was carried into a later frame is still the player's own). */
int lg_input_is_players(uint32_t player_index, const uint8_t *data, size_t length);

/* Frames in order, once, without a gap. last: the last frame taken (-1 before the first). */
typedef struct lg_sequence {
    int64_t last;
    uint64_t frames, gaps, duplicates;
} lg_sequence_t;

typedef enum { LG_IN_ORDER = 0, LG_GAP = 1, LG_DUPLICATE = 2 } lg_sequence_verdict_t;
void lg_sequence_init(lg_sequence_t *sequence);
/* Counts frame `number`; a gap counts the frames skipped; a duplicate or older frame is not
 * counted as a frame. */
lg_sequence_verdict_t lg_sequence_take(lg_sequence_t *sequence, uint32_t number);

/* One room's record of the content hash of its recent frames: the first member to take frame
 * N writes its hash, every later member compares with it. */
#define LG_LEDGER_FRAMES 256
typedef struct lg_ledger_entry {
    uint32_t frame;
    uint32_t valid;
    uint64_t hash;
} lg_ledger_entry_t;
typedef struct lg_room_ledger {
    lg_ledger_entry_t entries[LG_LEDGER_FRAMES];
    uint64_t mismatches, compared, unverified;
} lg_room_ledger_t;

typedef enum { LG_FIRST = 0, LG_MATCH = 1, LG_MISMATCH = 2, LG_TOO_OLD = 3 } lg_ledger_verdict_t;
void lg_ledger_init(lg_room_ledger_t *ledger);
/* TOO_OLD: a member this far behind finds a newer frame in the slot; it is counted as
 * unverified rather than silently passed. */
lg_ledger_verdict_t lg_ledger_check(lg_room_ledger_t *ledger, uint32_t frame, uint64_t hash);

/* Latency histogram: LG_HIST_STEP_US wide buckets up to LG_HIST_BUCKETS * step, then one
 * overflow bucket; the maximum is kept exactly. */
#define LG_HIST_STEP_US 10
#define LG_HIST_BUCKETS 200000        /* 2 s */
typedef struct lg_histogram {
    uint32_t counts[LG_HIST_BUCKETS + 1];
    uint64_t samples;
    double max_seconds;
} lg_histogram_t;
void lg_histogram_clear(lg_histogram_t *histogram);
void lg_histogram_add(lg_histogram_t *histogram, double seconds);
/* The q-quantile (0 < q <= 1) in seconds: the upper edge of the bucket holding it (the
 * maximum when it falls in the overflow bucket); 0 with no samples. */
double lg_histogram_quantile(const lg_histogram_t *histogram, double q);

/* Frames a player lost in a window in which it should have taken `expected` and took `taken`:
 * benchmarks/players.py window_shortfall, one player at a time. */
uint64_t lg_window_lost(double expected, uint64_t taken, double *shortfall);

#endif
