/*
 * checks_test.c - the load generator's frame checks on streams with known faults: each check
 * must pass a good stream and catch the bad one (built and run by tests/bench/test_loadgen_c.py).
 */
#include "checks.h"

#include <stdio.h>
#include <string.h>

static int failures;

#define EXPECT(condition) do { \
        if (!(condition)) { \
            failures++; \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition); \
        } \
    } while (0)

static void test_sequence(void)
{
    lg_sequence_t s;
    lg_sequence_init(&s);
    EXPECT(lg_sequence_take(&s, 5) == LG_IN_ORDER);        /* a first frame may be any */
    EXPECT(lg_sequence_take(&s, 6) == LG_IN_ORDER);
    EXPECT(lg_sequence_take(&s, 9) == LG_GAP);             /* 7 and 8 missing */
    EXPECT(s.gaps == 2);
    EXPECT(lg_sequence_take(&s, 9) == LG_DUPLICATE);
    EXPECT(lg_sequence_take(&s, 4) == LG_DUPLICATE);       /* older than the last */
    EXPECT(s.duplicates == 2);
    EXPECT(s.frames == 3 && s.last == 9);
}

static void test_ledger(void)
{
    static lg_room_ledger_t ledger;
    lg_ledger_init(&ledger);
    EXPECT(lg_ledger_check(&ledger, 10, 0xabc) == LG_FIRST);
    EXPECT(lg_ledger_check(&ledger, 10, 0xabc) == LG_MATCH);
    EXPECT(lg_ledger_check(&ledger, 10, 0xabd) == LG_MISMATCH);
    EXPECT(ledger.mismatches == 1 && ledger.compared == 2);
    /* a member LG_LEDGER_FRAMES behind finds a newer frame in its slot: unverified, not a match */
    EXPECT(lg_ledger_check(&ledger, 10 + LG_LEDGER_FRAMES, 1) == LG_FIRST);
    EXPECT(lg_ledger_check(&ledger, 10, 0xabc) == LG_TOO_OLD);
    EXPECT(ledger.unverified == 1);
}

static void test_hash_sees_every_byte(void)
{
    uint8_t a[LG_INPUT_SIZE], b[LG_INPUT_SIZE];
    size_t i;
    lg_input_payload(3, 100, a);
    for (i = 0; i < sizeof a; i++) {
        memcpy(b, a, sizeof a);
        b[i] ^= 1;
        EXPECT(lg_fnv1a(LG_FNV_OFFSET, a, sizeof a) != lg_fnv1a(LG_FNV_OFFSET, b, sizeof b));
    }
    /* the known FNV-1a 64 of "a" */
    EXPECT(lg_fnv1a(LG_FNV_OFFSET, "a", 1) == 0xaf63dc4c8601ec8cULL);
}

static void test_input_payload(void)
{
    /* struct.pack("<IIQ", 7, 3, 3 * 2654435761) from benchmarks/players.py */
    static const uint8_t expected[LG_INPUT_SIZE] = {
        7, 0, 0, 0, 3, 0, 0, 0, 0x13, 0x6d, 0xa6, 0xda, 0x01, 0, 0, 0};
    uint8_t out[LG_INPUT_SIZE], other[LG_INPUT_SIZE];
    lg_input_payload(7, 3, out);
    EXPECT(memcmp(out, expected, sizeof out) == 0);
    lg_input_payload(7, 4, other);
    EXPECT(memcmp(out, other, sizeof out) != 0);            /* another frame's input differs */
    lg_input_payload(6, 3, other);
    EXPECT(memcmp(out, other, sizeof out) != 0);            /* another player's input differs */
    /* own inputs, for any frame, against another player's and damaged bytes */
    EXPECT(lg_input_is_players(7, out, sizeof out));
    lg_input_payload(7, 4000000, other);
    EXPECT(lg_input_is_players(7, other, sizeof other));
    lg_input_payload(6, 3, other);
    EXPECT(!lg_input_is_players(7, other, sizeof other));
    memcpy(other, out, sizeof out);
    other[12] ^= 0x40;
    EXPECT(!lg_input_is_players(7, other, sizeof other));
    EXPECT(!lg_input_is_players(7, out, sizeof out - 1));
}

static void test_histogram(void)
{
    static lg_histogram_t h;
    int i;
    lg_histogram_clear(&h);
    EXPECT(lg_histogram_quantile(&h, 0.5) == 0.0);
    for (i = 1; i <= 100; i++)
        lg_histogram_add(&h, i * 1e-3);                       /* 1 .. 100 ms */
    EXPECT(h.samples == 100);
    EXPECT(lg_histogram_quantile(&h, 0.5) > 0.0499 && lg_histogram_quantile(&h, 0.5) < 0.0502);
    EXPECT(lg_histogram_quantile(&h, 0.99) > 0.0989 && lg_histogram_quantile(&h, 0.99) < 0.0992);
    EXPECT(lg_histogram_quantile(&h, 1.0) == 0.1);
    lg_histogram_add(&h, 5.0);                                /* beyond the last bucket */
    EXPECT(lg_histogram_quantile(&h, 1.0) == 5.0 && h.max_seconds == 5.0);
}

static void test_window_lost(void)
{
    double shortfall;
    EXPECT(lg_window_lost(300.0, 300, &shortfall) == 0 && shortfall == 0.0);
    EXPECT(lg_window_lost(300.0, 297, NULL) == 0);            /* within the tolerance */
    EXPECT(lg_window_lost(300.0, 290, &shortfall) == 7 && shortfall == 10.0);
}

int main(void)
{
    test_sequence();
    test_ledger();
    test_hash_sees_every_byte();
    test_input_payload();
    test_histogram();
    test_window_lost();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    puts("checks_test: ok");
    return 0;
}
