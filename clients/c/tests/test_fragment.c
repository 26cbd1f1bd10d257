/* test_fragment.c - reassembly: fragment layout, caps, bad_fragment rules, the arena. */
#include "fragment.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static uint8_t arena_bytes[1024];
static rc_arena_entry entries[4];

static void test_fragments_in_any_order_join_in_index_order(void)
{
    rc_arena arena;
    rc_partial p;
    int complete;
    uint32_t total;
    rc_arena_init(&arena, arena_bytes, sizeof arena_bytes, entries, 4);
    memset(&p, 0, sizeof p);
    CHECK(rc_partial_add(&p, &arena, 2, 3, (const uint8_t *)"gh", 2, 100, 100, &complete, &total) == RC_OK && !complete);
    CHECK(p.tail_handle >= 0 && arena.charged == 2);  /* kept aside: the layout is unknown */
    CHECK(rc_partial_add(&p, &arena, 2, 3, (const uint8_t *)"gh", 2, 100, 100, &complete, &total) == RC_OK && !complete);
    CHECK(rc_partial_add(&p, &arena, 1, 3, (const uint8_t *)"d", 1, 100, 100, &complete, &total) == RC_DROP_BAD_FRAGMENT);
    CHECK(rc_partial_add(&p, &arena, 1, 3, (const uint8_t *)"def", 3, 100, 100, &complete, &total) == RC_OK && !complete);
    CHECK(p.tail_handle < 0 && arena.charged == 9);
    CHECK(rc_partial_add(&p, &arena, 1, 3, (const uint8_t *)"def", 3, 100, 100, &complete, &total) == RC_OK && !complete);
    CHECK(rc_partial_add(&p, &arena, 0, 4, (const uint8_t *)"abc", 3, 100, 100, &complete, &total) == RC_DROP_BAD_FRAGMENT);
    CHECK(rc_partial_add(&p, &arena, 0, 3, (const uint8_t *)"ab", 2, 100, 100, &complete, &total) == RC_DROP_BAD_FRAGMENT);
    CHECK(rc_partial_add(&p, &arena, 0, 3, (const uint8_t *)"abc", 3, 100, 100, &complete, &total) == RC_OK);
    CHECK(complete && total == 8 && memcmp(rc_arena_ptr(&arena, p.handle), "abcdefgh", 8) == 0);
}

static void test_caps_message_too_large_and_budget(void)
{
    rc_arena arena;
    rc_partial p;
    int complete;
    uint32_t total;
    rc_arena_init(&arena, arena_bytes, sizeof arena_bytes, entries, 4);
    memset(&p, 0, sizeof p);
    CHECK(rc_partial_add(&p, &arena, 0, 10, arena_bytes, 20, 150, 1000, &complete, &total) == RC_DROP_MESSAGE_TOO_LARGE);
    memset(&p, 0, sizeof p);
    CHECK(rc_partial_add(&p, &arena, 0, 10, arena_bytes, 20, 1000, 150, &complete, &total) == RC_DROP_REASSEMBLY_FULL);
    memset(&p, 0, sizeof p);
    CHECK(rc_partial_add(&p, &arena, 0, 2, arena_bytes, 20, 25, 1000, &complete, &total) == RC_OK);
    CHECK(rc_partial_add(&p, &arena, 1, 2, arena_bytes, 10, 25, 1000, &complete, &total) == RC_DROP_MESSAGE_TOO_LARGE);
    CHECK(rc_partial_add(&p, &arena, 1, 2, arena_bytes, 5, 25, 1000, &complete, &total) == RC_OK && complete && total == 25);
}

static void test_arena_compacts_to_find_room(void)
{
    rc_arena arena;
    int a, b, c, d;
    rc_arena_init(&arena, arena_bytes, 100, entries, 4);
    a = rc_arena_alloc(&arena, 30);
    b = rc_arena_alloc(&arena, 30);
    c = rc_arena_alloc(&arena, 30);
    CHECK(a >= 0 && b >= 0 && c >= 0);
    memset(rc_arena_ptr(&arena, c), 'c', 30);
    rc_arena_free(&arena, a);
    rc_arena_free(&arena, -1);                       /* freeing a bad handle is harmless */
    rc_arena_free(&arena, b);
    CHECK(arena.charged == 30);
    d = rc_arena_alloc(&arena, 70);                  /* needs the gaps joined */
    CHECK(d >= 0 && arena.charged == 100);
    CHECK(memcmp(rc_arena_ptr(&arena, c), "cccccccccccccccccccccccccccccc", 30) == 0);
    CHECK(rc_arena_alloc(&arena, 1) < 0);
}

static void test_release_frees_both_allocations(void)
{
    rc_arena arena;
    rc_partial p;
    int complete;
    uint32_t total;
    rc_arena_init(&arena, arena_bytes, sizeof arena_bytes, entries, 4);
    memset(&p, 0, sizeof p);
    CHECK(rc_partial_add(&p, &arena, 4, 5, arena_bytes, 7, 1000, 1000, &complete, &total) == RC_OK);
    CHECK(rc_partial_add(&p, &arena, 4, 5, arena_bytes, 7, 1000, 1000, &complete, &total) == RC_OK);
    CHECK(arena.charged == 7);
    rc_partial_release(&p, &arena);
    CHECK(arena.charged == 0 && p.count == 0);
    CHECK(rc_partial_add(&p, &arena, 4, 5, arena_bytes, 7, 1000, 5, &complete, &total) == RC_DROP_REASSEMBLY_FULL);
}

int main(void)
{
    test_release_frees_both_allocations();
    test_fragments_in_any_order_join_in_index_order();
    test_caps_message_too_large_and_budget();
    test_arena_compacts_to_find_room();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
