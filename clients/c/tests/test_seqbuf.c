/* test_seqbuf.c - sequence buffers: tags, the wrap, clearing skipped numbers. */
#include "seqbuf.h"

#include <stdio.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static void test_an_entry_is_replaced_by_the_number_size_later(void)
{
    uint32_t tags[8];
    rc_seqbuf b;
    rc_seqbuf_init(&b, tags, 8);
    CHECK(!rc_seqbuf_contains(&b, 3));
    CHECK(rc_seqbuf_insert(&b, 3) == 3);
    CHECK(rc_seqbuf_contains(&b, 3) && !rc_seqbuf_contains(&b, 11));
    rc_seqbuf_insert(&b, 11);
    CHECK(rc_seqbuf_contains(&b, 11) && !rc_seqbuf_contains(&b, 3));
    rc_seqbuf_remove(&b, 3);                       /* not present: no effect */
    CHECK(rc_seqbuf_contains(&b, 11));
    rc_seqbuf_remove(&b, 11);
    CHECK(!rc_seqbuf_contains(&b, 11));
}

static void test_slots_survive_the_wrap(void)
{
    uint32_t tags[16];
    rc_seqbuf b;
    rc_seqbuf_init(&b, tags, 16);
    rc_seqbuf_insert(&b, 65535);
    rc_seqbuf_insert(&b, 0);
    CHECK(rc_seqbuf_index(&b, 65535) == 15 && rc_seqbuf_index(&b, 0) == 0);
    CHECK(rc_seqbuf_contains(&b, 65535) && rc_seqbuf_contains(&b, 0));
}

static void test_remove_range_clears_skipped_numbers(void)
{
    uint32_t tags[8];
    rc_seqbuf b;
    uint16_t i;
    rc_seqbuf_init(&b, tags, 8);
    for (i = 0; i < 8; i++)
        rc_seqbuf_insert(&b, (uint16_t)(65532 + i));
    rc_seqbuf_remove_range(&b, 65534, 1);
    CHECK(rc_seqbuf_contains(&b, 65532) && rc_seqbuf_contains(&b, 65533));
    CHECK(!rc_seqbuf_contains(&b, 65534) && !rc_seqbuf_contains(&b, 0) && !rc_seqbuf_contains(&b, 1));
    CHECK(rc_seqbuf_contains(&b, 2));
    rc_seqbuf_remove_range(&b, 100, 200);          /* more than the size: everything */
    for (i = 0; i < 8; i++)
        CHECK(tags[i] == RC_SEQBUF_EMPTY);
}

int main(void)
{
    test_an_entry_is_replaced_by_the_number_size_later();
    test_slots_survive_the_wrap();
    test_remove_range_clears_skipped_numbers();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
