/* fragment.c - reassembly storage (PROTOCOL 6.4, 12.5). */
#include "fragment.h"
#include "wire.h"

#include <string.h>

void rc_arena_init(rc_arena *arena, uint8_t *data, uint32_t capacity, rc_arena_entry *entries,
                   uint32_t entry_count)
{
    arena->data = data;
    arena->capacity = capacity;
    arena->entries = entries;
    arena->entry_count = entry_count;
    rc_arena_reset(arena);
}

void rc_arena_reset(rc_arena *arena)
{
    memset(arena->entries, 0, arena->entry_count * sizeof(rc_arena_entry));
    arena->charged = 0;
}

/* Moves every live allocation down to the start of the arena, in offset order. */
static void compact(rc_arena *arena)
{
    uint32_t next = 0, i;
    for (;;) {
        uint32_t best = arena->entry_count;
        for (i = 0; i < arena->entry_count; i++) {
            const rc_arena_entry *e = &arena->entries[i];
            if (e->in_use == 1 && (best == arena->entry_count || e->offset < arena->entries[best].offset))
                best = i;
        }
        if (best == arena->entry_count)
            break;
        if (arena->entries[best].offset != next && arena->entries[best].length)
            memmove(arena->data + next, arena->data + arena->entries[best].offset,
                    arena->entries[best].length);
        arena->entries[best].offset = next;
        arena->entries[best].in_use = 2;            /* placed */
        next += arena->entries[best].length;
    }
    for (i = 0; i < arena->entry_count; i++)
        if (arena->entries[i].in_use == 2)
            arena->entries[i].in_use = 1;
}

/* Lowest offset with length free bytes among the live allocations, or -1. */
static long find_gap(const rc_arena *arena, uint32_t length)
{
    uint32_t candidate = 0;
    int moved = 1;
    while (moved) {
        uint32_t i;
        moved = 0;
        if ((uint64_t)candidate + length > arena->capacity)
            return -1;
        for (i = 0; i < arena->entry_count; i++) {
            const rc_arena_entry *e = &arena->entries[i];
            if (e->in_use && e->length > 0 && e->offset < candidate + length
                && candidate < e->offset + e->length) {
                candidate = e->offset + e->length;
                moved = 1;
            }
        }
    }
    return (uint64_t)candidate + length <= arena->capacity ? (long)candidate : -1;
}

int rc_arena_alloc(rc_arena *arena, uint32_t length)
{
    uint32_t i;
    long at;
    if ((uint64_t)arena->charged + length > arena->capacity)
        return -1;
    for (i = 0; i < arena->entry_count; i++)
        if (!arena->entries[i].in_use)
            break;
    if (i == arena->entry_count)
        return -1;
    at = find_gap(arena, length);
    if (at < 0) {
        compact(arena);
        at = find_gap(arena, length);
        if (at < 0)
            return -1;
    }
    arena->entries[i].in_use = 1;
    arena->entries[i].offset = (uint32_t)at;
    arena->entries[i].length = length;
    arena->charged += length;
    return (int)i;
}

void rc_arena_free(rc_arena *arena, int handle)
{
    if (handle < 0 || (uint32_t)handle >= arena->entry_count || !arena->entries[handle].in_use)
        return;
    arena->charged -= arena->entries[handle].length;
    arena->entries[handle].in_use = 0;
}

uint8_t *rc_arena_ptr(rc_arena *arena, int handle)
{
    return arena->data + arena->entries[handle].offset;
}

void rc_partial_release(rc_partial *partial, rc_arena *arena)
{
    if (partial->count == 0)
        return;
    if (partial->handle >= 0)
        rc_arena_free(arena, partial->handle);
    if (partial->tail_handle >= 0)
        rc_arena_free(arena, partial->tail_handle);
    memset(partial, 0, sizeof *partial);
    partial->handle = partial->tail_handle = -1;
}

int rc_partial_add(rc_partial *partial, rc_arena *arena, uint8_t index, uint8_t count,
                   const uint8_t *data, size_t length, uint32_t max_message_size,
                   uint32_t allowance, int *complete, uint32_t *total_length)
{
    int last = index == count - 1;
    *complete = 0;
    if (partial->count == 0) {
        memset(partial, 0, sizeof *partial);
        partial->count = count;
        partial->handle = partial->tail_handle = -1;
    } else if (partial->count != count) {
        return RC_DROP_BAD_FRAGMENT;
    }
    if (partial->bits[index >> 3] & (1u << (index & 7)))
        return RC_OK;                               /* repeated fragment */
    if (partial->fragment_size == 0 && last) {
        /* the layout is unknown until a non-last fragment arrives: keep it aside */
        if ((uint64_t)(count - 1) + length > max_message_size)
            return RC_DROP_MESSAGE_TOO_LARGE;
        if (length > allowance)
            return RC_DROP_REASSEMBLY_FULL;
        partial->tail_handle = rc_arena_alloc(arena, (uint32_t)length);
        if (partial->tail_handle < 0)
            return RC_DROP_REASSEMBLY_FULL;
        if (length)
            memcpy(rc_arena_ptr(arena, partial->tail_handle), data, length);
    } else if (partial->fragment_size == 0) {
        uint64_t reserve = (uint64_t)count * length;
        if (length == 0 || (partial->tail_handle >= 0 && partial->last_length > length))
            return RC_DROP_BAD_FRAGMENT;
        if ((uint64_t)(count - 1) * length + (partial->tail_handle >= 0 ? partial->last_length : 1)
            > max_message_size)
            return RC_DROP_MESSAGE_TOO_LARGE;
        if (reserve > allowance)
            return RC_DROP_REASSEMBLY_FULL;
        partial->handle = rc_arena_alloc(arena, (uint32_t)reserve);
        if (partial->handle < 0)
            return RC_DROP_REASSEMBLY_FULL;
        partial->fragment_size = (uint32_t)length;
        if (partial->tail_handle >= 0) {
            if (partial->last_length)
                memcpy(rc_arena_ptr(arena, partial->handle) + (size_t)(count - 1) * length,
                       rc_arena_ptr(arena, partial->tail_handle), partial->last_length);
            rc_arena_free(arena, partial->tail_handle);
            partial->tail_handle = -1;
        }
    } else if (last ? length > partial->fragment_size : length != partial->fragment_size) {
        return RC_DROP_BAD_FRAGMENT;
    } else if (last && (uint64_t)(count - 1) * partial->fragment_size + length > max_message_size) {
        return RC_DROP_MESSAGE_TOO_LARGE;
    }
    if (partial->handle >= 0 && length)
        memcpy(rc_arena_ptr(arena, partial->handle) + (size_t)index * partial->fragment_size, data, length);
    if (last)
        partial->last_length = (uint32_t)length;
    partial->bits[index >> 3] |= (uint8_t)(1u << (index & 7));
    partial->received++;
    if (partial->received == partial->count) {
        *complete = 1;
        *total_length = (uint32_t)(partial->count - 1) * partial->fragment_size + partial->last_length;
    }
    return RC_OK;
}
