/* checks.c - see checks.h. */
#include "checks.h"

#include <string.h>

uint64_t lg_fnv1a(uint64_t hash, const void *data, size_t length)
{
    const uint8_t *bytes = (const uint8_t *)data;
    size_t i;
    for (i = 0; i < length; i++) {
        hash ^= bytes[i];
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

static void put_u32le(uint8_t *out, uint32_t v)
{
    out[0] = (uint8_t)v;
    out[1] = (uint8_t)(v >> 8);
    out[2] = (uint8_t)(v >> 16);
    out[3] = (uint8_t)(v >> 24);
}

void lg_input_payload(uint32_t player_index, uint32_t frame, uint8_t out[LG_INPUT_SIZE])
{
    uint64_t mixed = (uint64_t)frame * 2654435761ULL;
    put_u32le(out, player_index);
    put_u32le(out + 4, frame);
    put_u32le(out + 8, (uint32_t)mixed);
    put_u32le(out + 12, (uint32_t)(mixed >> 32));
}

int lg_input_is_players(uint32_t player_index, const uint8_t *data, size_t length)
{
    uint8_t expected[LG_INPUT_SIZE];
    uint32_t frame;
    if (length != LG_INPUT_SIZE)
        return 0;
    frame = (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16
            | (uint32_t)data[7] << 24;
    lg_input_payload(player_index, frame, expected);
    return memcmp(data, expected, LG_INPUT_SIZE) == 0;
}

void lg_sequence_init(lg_sequence_t *sequence)
{
    memset(sequence, 0, sizeof *sequence);
    sequence->last = -1;
}

lg_sequence_verdict_t lg_sequence_take(lg_sequence_t *sequence, uint32_t number)
{
    lg_sequence_verdict_t verdict = LG_IN_ORDER;
    if ((int64_t)number <= sequence->last) {
        sequence->duplicates++;
        return LG_DUPLICATE;
    }
    /* The first frame may be any number (a player joining a running room starts late). */
    if (sequence->last >= 0 && (int64_t)number != sequence->last + 1) {
        sequence->gaps += (uint64_t)((int64_t)number - sequence->last - 1);
        verdict = LG_GAP;
    }
    sequence->last = number;
    sequence->frames++;
    return verdict;
}

void lg_ledger_init(lg_room_ledger_t *ledger)
{
    memset(ledger, 0, sizeof *ledger);
}

lg_ledger_verdict_t lg_ledger_check(lg_room_ledger_t *ledger, uint32_t frame, uint64_t hash)
{
    lg_ledger_entry_t *entry = &ledger->entries[frame % LG_LEDGER_FRAMES];
    if (entry->valid && entry->frame == frame) {
        ledger->compared++;
        if (entry->hash != hash) {
            ledger->mismatches++;
            return LG_MISMATCH;
        }
        return LG_MATCH;
    }
    if (entry->valid && entry->frame > frame) {
        ledger->unverified++;
        return LG_TOO_OLD;
    }
    entry->frame = frame;
    entry->valid = 1;
    entry->hash = hash;
    return LG_FIRST;
}

void lg_histogram_clear(lg_histogram_t *histogram)
{
    memset(histogram, 0, sizeof *histogram);
}

void lg_histogram_add(lg_histogram_t *histogram, double seconds)
{
    double us = seconds * 1e6;
    size_t bucket;
    if (us < 0)
        us = 0;
    bucket = us >= (double)LG_HIST_BUCKETS * LG_HIST_STEP_US ? LG_HIST_BUCKETS
                                                              : (size_t)(us / LG_HIST_STEP_US);
    histogram->counts[bucket]++;
    histogram->samples++;
    if (seconds > histogram->max_seconds)
        histogram->max_seconds = seconds;
}

double lg_histogram_quantile(const lg_histogram_t *histogram, double q)
{
    uint64_t rank, seen = 0;
    size_t i;
    if (histogram->samples == 0)
        return 0.0;
    rank = (uint64_t)(q * (double)histogram->samples + 0.999999);
    if (rank < 1)
        rank = 1;
    for (i = 0; i < LG_HIST_BUCKETS; i++) {
        seen += histogram->counts[i];
        if (seen >= rank) {
            double edge = (double)(i + 1) * LG_HIST_STEP_US * 1e-6;
            return edge < histogram->max_seconds ? edge : histogram->max_seconds;
        }
    }
    return histogram->max_seconds;
}

uint64_t lg_window_lost(double expected, uint64_t taken, double *shortfall)
{
    double missing = expected - (double)taken;
    if (shortfall)
        *shortfall = missing;
    if (missing > LG_LOST_TOLERANCE_FRAMES)
        return (uint64_t)(missing - LG_LOST_TOLERANCE_FRAMES);
    return 0;
}
