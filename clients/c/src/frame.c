/* frame.c - see frame.h. */
#include "frame.h"
#include "msgpack.h"

#include <string.h>
#include <zlib.h>

void rf_frame_init(rf_frame *frame, uint8_t *arena, size_t capacity)
{
    memset(frame, 0, offsetof(rf_frame, arena));
    frame->arena = arena;
    frame->arena_capacity = capacity;
}

/* Unsigned LEB128, at most 5 bytes, value < limit. */
static int get_varint(const uint8_t *data, size_t length, size_t *position, uint64_t limit,
                      uint64_t *out)
{
    uint64_t value = 0;
    unsigned shift = 0;
    size_t pos = *position;
    for (;;) {
        uint8_t byte;
        if (pos >= length)
            return RF_MALFORMED;
        byte = data[pos++];
        value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
        shift += 7;
        if (shift > 28)
            return RF_MALFORMED;
    }
    if (value >= limit)
        return RF_MALFORMED;
    *position = pos;
    *out = value;
    return RF_OK;
}

int rf_frame_number(const uint8_t *data, size_t length, uint32_t *number)
{
    size_t pos = 1;
    uint64_t value;
    if (length < 1 || data[0] != 0xC1 || get_varint(data, length, &pos, (uint64_t)1 << 32, &value))
        return RF_MALFORMED;
    *number = (uint32_t)value;
    return RF_OK;
}

/* Strict UTF-8 (what Python's bytes.decode() accepts): no overlongs, surrogates or > U+10FFFF. */
static int valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t extra;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { extra = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { extra = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { extra = 3; cp = c & 0x07; }
        else return 0;
        if (n - i <= extra)
            return 0;
        {
            size_t k;
            for (k = 1; k <= extra; k++) {
                if ((s[i + k] & 0xC0) != 0x80)
                    return 0;
                cp = (cp << 6) | (s[i + k] & 0x3F);
            }
        }
        if ((extra == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)))
            || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += extra + 1;
    }
    return 1;
}

static int bit(const uint8_t *bitmap, uint32_t slot)
{
    return bitmap[slot >> 3] >> (slot & 7) & 1;
}

int rf_decode(const uint8_t *data, size_t length, const rf_frame *previous, rf_frame *out)
{
    size_t pos = 1, used = 0;
    uint64_t value, count;
    uint32_t width, slot;
    uint8_t flags;
    const uint8_t *present, *same = NULL, *synth = NULL;
    uint8_t *arena = out->arena;

    if (length < 1 || data[0] != 0xC1 || get_varint(data, length, &pos, (uint64_t)1 << 32, &value))
        return RF_MALFORMED;
    out->number = (uint32_t)value;
    if (pos >= length)
        return RF_MALFORMED;
    flags = data[pos++];
    if (flags & ~0x07)
        return RF_MALFORMED;
    if (get_varint(data, length, &pos, RF_MAX_SLOTS + 1, &count))
        return RF_MALFORMED;
    width = (uint32_t)(count + 7) >> 3;
    /* bitmaps: present, then same and synthesized if flagged */
    {
        const uint8_t **maps[3];
        int k, n = 0;
        maps[n++] = &present;
        if (flags & 0x01) maps[n++] = &same;
        if (flags & 0x02) maps[n++] = &synth;
        for (k = 0; k < n; k++) {
            if (width > length - pos)
                return RF_MALFORMED;
            *maps[k] = data + pos;
            if ((count & 7) && (data[pos + width - 1] >> (count & 7)))
                return RF_MALFORMED;
            pos += width;
        }
    }
    out->slot_count = (uint32_t)count;
    memset(out->synthesized, 0, sizeof out->synthesized);
    for (slot = 0; slot < count; slot++) {
        int is_present = bit(present, slot);
        if (!is_present && ((same && bit(same, slot)) || (synth && bit(synth, slot))))
            return RF_MALFORMED;
        if (synth && bit(synth, slot))
            out->synthesized[slot >> 3] |= (uint8_t)(1u << (slot & 7));
    }
    for (slot = 0; slot < count; slot++) {
        const uint8_t *source;
        uint64_t n;
        if (!bit(present, slot)) {
            out->length[slot] = -1;
            out->offset[slot] = 0;
            continue;
        }
        if (same && bit(same, slot)) {
            if (previous == NULL)
                return RF_NEEDS_PREVIOUS;
            if (slot >= previous->slot_count || previous->length[slot] < 0)
                return RF_MALFORMED;
            n = (uint64_t)previous->length[slot];
            source = previous->arena + previous->offset[slot];
        } else {
            if (get_varint(data, length, &pos, (uint64_t)1 << 20, &n) || n > length - pos)
                return RF_MALFORMED;
            source = data + pos;
            pos += (size_t)n;
        }
        if (n > out->arena_capacity - used)
            return RF_TOO_LARGE;
        if (n)
            memcpy(arena + used, source, (size_t)n);
        out->offset[slot] = (uint32_t)used;
        out->length[slot] = (int32_t)n;
        used += (size_t)n;
    }
    out->event_count = 0;
    out->events_offset = (uint32_t)used;
    if (flags & 0x04) {
        uint64_t events, k;
        if (get_varint(data, length, &pos, (uint64_t)length + 1, &events))
            return RF_MALFORMED;
        for (k = 0; k < events; k++) {
            uint64_t event_slot, name_length;
            uint8_t kind;
            if (pos >= length || data[pos] >= 4)
                return RF_MALFORMED;
            kind = data[pos++];
            if (get_varint(data, length, &pos, RF_MAX_SLOTS, &event_slot)
                || get_varint(data, length, &pos, RF_MAX_EVENT_NAME + 1, &name_length)
                || name_length > length - pos || !valid_utf8(data + pos, (size_t)name_length))
                return RF_MALFORMED;
            if (4 + name_length > out->arena_capacity - used)
                return RF_TOO_LARGE;
            arena[used] = kind;
            arena[used + 1] = (uint8_t)event_slot;
            arena[used + 2] = (uint8_t)(name_length & 0xFF);
            arena[used + 3] = (uint8_t)(name_length >> 8);
            memcpy(arena + used + 4, data + pos, (size_t)name_length);
            used += 4 + (size_t)name_length;
            pos += (size_t)name_length;
        }
        out->event_count = (uint32_t)events;
    }
    out->events_end = (uint32_t)used;
    if (pos != length)
        return RF_MALFORMED;
    return RF_OK;
}

int rf_frame_event(const rf_frame *frame, uint32_t index, int *kind, int *slot,
                   const char **name, uint32_t *name_length)
{
    size_t pos = frame->events_offset;
    uint32_t k;
    if (index >= frame->event_count)
        return -1;
    for (k = 0;; k++) {
        const uint8_t *record = frame->arena + pos;
        uint32_t n = (uint32_t)record[2] | (uint32_t)record[3] << 8;
        if (k == index) {
            *kind = record[0];
            *slot = record[1];
            *name = (const char *)(record + 4);
            *name_length = n;
            return 0;
        }
        pos += 4 + n;
    }
}

/* ---- history blocks ---- */

/* zlib allocates from the caller's fixed memory: a bump allocator reset for every stream. */
typedef struct zarena {
    size_t used;
    size_t capacity;
} zarena;

static voidpf zarena_alloc(voidpf opaque, uInt items, uInt size)
{
    zarena *arena = (zarena *)opaque;
    size_t bytes = (size_t)items * size;
    size_t start = (arena->used + 15) & ~(size_t)15;
    if (size && bytes / size != items)
        return Z_NULL;
    if (start > arena->capacity || bytes > arena->capacity - start)
        return Z_NULL;
    arena->used = start + bytes;
    return (uint8_t *)(arena + 1) + start;
}

static void zarena_free(voidpf opaque, voidpf address)
{
    (void)opaque;
    (void)address;
}

static int open_stream(z_stream *stream, void *zmemory, const uint8_t *block, size_t length)
{
    zarena *arena = (zarena *)zmemory;
    arena->used = 0;
    arena->capacity = RF_INFLATE_MEMORY - ((sizeof(zarena) + 15) & ~(size_t)15);
    memset(stream, 0, sizeof *stream);
    stream->zalloc = zarena_alloc;
    stream->zfree = zarena_free;
    stream->opaque = arena;
    if (length > 0xFFFFFFFFu)
        return RF_MALFORMED;
    stream->next_in = (Bytef *)(uintptr_t)block;
    stream->avail_in = (uInt)length;
    return inflateInit(stream) == Z_OK ? RF_OK : RF_MALFORMED;
}

int rf_history_peek(const uint8_t *block, size_t length, void *zmemory, uint32_t *first,
                    uint32_t *count)
{
    uint8_t head[16];
    z_stream stream;
    int status;
    mp_reader r;
    uint32_t fields;
    uint64_t number;
    mp_value frames;
    size_t produced;

    if (open_stream(&stream, zmemory, block, length))
        return RF_MALFORMED;
    stream.next_out = head;
    stream.avail_out = sizeof head;
    status = inflate(&stream, Z_SYNC_FLUSH);
    produced = sizeof head - stream.avail_out;
    inflateEnd(&stream);
    if (status != Z_OK && status != Z_STREAM_END && status != Z_BUF_ERROR)
        return RF_MALFORMED;
    mp_reader_init(&r, head, produced);
    if (mp_read_array(&r, &fields) < 0 || fields != 2 || mp_read_uint(&r, &number) < 0
        || number > 0xFFFFFFFFu || mp_read(&r, &frames) < 0 || frames.type != MP_ARRAY)
        return RF_MALFORMED;
    *first = (uint32_t)number;
    *count = frames.length;
    return RF_OK;
}

int rf_history_inflate(const uint8_t *block, size_t length, void *zmemory, uint8_t *out,
                       size_t cap, size_t *out_length)
{
    z_stream stream;
    int status;
    if (open_stream(&stream, zmemory, block, length))
        return RF_MALFORMED;
    stream.next_out = out;
    stream.avail_out = (uInt)(cap > 0xFFFFFFFFu ? 0xFFFFFFFFu : cap);
    status = inflate(&stream, Z_FINISH);
    *out_length = (size_t)stream.total_out;
    inflateEnd(&stream);
    if (status == Z_STREAM_END)
        return RF_OK;
    if (stream.avail_out == 0 && (status == Z_BUF_ERROR || status == Z_OK))
        return RF_TOO_LARGE;
    return RF_MALFORMED;
}

int rf_history_parse(const uint8_t *raw, size_t length, uint32_t *first, uint32_t *count,
                     size_t *frames_offset)
{
    mp_reader r;
    uint32_t fields, n, k;
    uint64_t number;
    size_t offset;
    mp_reader_init(&r, raw, length);
    if (mp_read_array(&r, &fields) < 0 || fields != 2 || mp_read_uint(&r, &number) < 0
        || number > 0xFFFFFFFFu || mp_read_array(&r, &n) < 0
        || number + n > ((uint64_t)1 << 32))
        return RF_MALFORMED;
    offset = r.position;
    for (k = 0; k < n; k++) {
        mp_value value;
        if (mp_read(&r, &value) < 0 || value.type != MP_BIN)
            return RF_MALFORMED;
    }
    if (r.position != length)
        return RF_MALFORMED;
    *first = (uint32_t)number;
    *count = n;
    *frames_offset = offset;
    return RF_OK;
}

int rf_history_next(const uint8_t *raw, size_t length, size_t *position, const uint8_t **frame,
                    size_t *frame_length)
{
    mp_reader r;
    mp_value value;
    mp_reader_init(&r, raw, length);
    r.position = *position;
    if (*position > length || mp_read(&r, &value) < 0 || value.type != MP_BIN)
        return RF_MALFORMED;
    *frame = value.data;
    *frame_length = value.length;
    *position = r.position;
    return RF_OK;
}
