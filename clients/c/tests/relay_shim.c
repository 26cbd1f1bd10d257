/*
 * relay_shim.c - entry points for tests/clients/test_c_frames.py (ctypes on
 * librelay_client_testing.so): the C FRAME and history decoders with msgpack in and out, so
 * Python can compare them with relay.protocol.
 */
#include "frame.h"
#include "msgpack.h"

#include <stdlib.h>
#include <string.h>

#define SHIM_BAD_PREVIOUS (-10)
#define SHIM_SMALL (-11)

int relay_shim_decode_frame(const uint8_t *data, size_t length, const uint8_t *previous,
                            size_t previous_length, int has_previous, uint8_t *out, size_t cap);
int relay_shim_decode_history(const uint8_t *block, size_t length, size_t max_size, uint8_t *out,
                              size_t cap);

static uint8_t previous_arena[1 << 20], out_arena[1 << 20];

/* data: a FRAME; previous: msgpack [bin or nil, ...] (ignored unless has_previous).
 * Writes msgpack [number, [bin or nil, ...], [synthesized slot, ...], [[kind, slot, name], ...]]
 * into out and returns its length, or a negative RF_* / SHIM_* code. */
int relay_shim_decode_frame(const uint8_t *data, size_t length, const uint8_t *previous,
                            size_t previous_length, int has_previous, uint8_t *out, size_t cap)
{
    rf_frame prev, frame;
    mp_writer w;
    uint32_t k;
    int status;
    rf_frame_init(&prev, previous_arena, sizeof previous_arena);
    rf_frame_init(&frame, out_arena, sizeof out_arena);
    if (has_previous) {
        mp_reader r;
        uint32_t count;
        size_t used = 0;
        mp_reader_init(&r, previous, previous_length);
        if (mp_read_array(&r, &count) < 0 || count > RF_MAX_SLOTS)
            return SHIM_BAD_PREVIOUS;
        prev.slot_count = count;
        for (k = 0; k < count; k++) {
            mp_value v;
            if (mp_read(&r, &v) < 0)
                return SHIM_BAD_PREVIOUS;
            if (v.type == MP_NIL) {
                prev.length[k] = -1;
            } else if (v.type == MP_BIN && v.length <= sizeof previous_arena - used) {
                memcpy(previous_arena + used, v.data, v.length);
                prev.offset[k] = (uint32_t)used;
                prev.length[k] = (int32_t)v.length;
                used += v.length;
            } else {
                return SHIM_BAD_PREVIOUS;
            }
        }
    }
    status = rf_decode(data, length, has_previous ? &prev : NULL, &frame);
    if (status != RF_OK)
        return status;
    mp_writer_init(&w, out, cap);
    mp_write_array(&w, 4);
    mp_write_uint(&w, frame.number);
    mp_write_array(&w, frame.slot_count);
    for (k = 0; k < frame.slot_count; k++) {
        if (frame.length[k] < 0)
            mp_write_nil(&w);
        else
            mp_write_bin(&w, frame.arena + frame.offset[k], (size_t)frame.length[k]);
    }
    {
        uint32_t synthesized = 0;
        for (k = 0; k < frame.slot_count; k++)
            synthesized += frame.synthesized[k >> 3] >> (k & 7) & 1;
        mp_write_array(&w, synthesized);
        for (k = 0; k < frame.slot_count; k++)
            if (frame.synthesized[k >> 3] >> (k & 7) & 1)
                mp_write_uint(&w, k);
    }
    mp_write_array(&w, frame.event_count);
    for (k = 0; k < frame.event_count; k++) {
        int kind, slot;
        const char *name;
        uint32_t name_length;
        rf_frame_event(&frame, k, &kind, &slot, &name, &name_length);
        mp_write_array(&w, 3);
        mp_write_uint(&w, (uint64_t)kind);
        mp_write_uint(&w, (uint64_t)slot);
        mp_write_str(&w, name, name_length);
    }
    return w.overflow ? SHIM_SMALL : (int)w.length;
}

/* block: a history block. Inflates (at most max_size bytes), checks it, reads every frame with
 * the lazy reader and writes msgpack [first_frame, [bin, ...]] into out; its length, or a
 * negative RF_* / SHIM_* code. The peeked header must agree with the parsed one. */
int relay_shim_decode_history(const uint8_t *block, size_t length, size_t max_size, uint8_t *out,
                              size_t cap)
{
    static uint8_t zmemory[RF_INFLATE_MEMORY];
    uint8_t *raw = (uint8_t *)malloc(max_size ? max_size : 1);
    size_t produced, offset, position;
    uint32_t first, count, peek_first, peek_count, k;
    mp_writer w;
    int status;
    if (raw == NULL)
        return SHIM_SMALL;
    status = rf_history_inflate(block, length, zmemory, raw, max_size, &produced);
    if (status == RF_OK)
        status = rf_history_parse(raw, produced, &first, &count, &offset);
    if (status == RF_OK
        && (rf_history_peek(block, length, zmemory, &peek_first, &peek_count) != RF_OK
            || peek_first != first || peek_count != count))
        status = SHIM_BAD_PREVIOUS;
    if (status != RF_OK) {
        free(raw);
        return status;
    }
    mp_writer_init(&w, out, cap);
    mp_write_array(&w, 2);
    mp_write_uint(&w, first);
    mp_write_array(&w, count);
    position = offset;
    for (k = 0; k < count; k++) {
        const uint8_t *frame;
        size_t frame_length;
        if (rf_history_next(raw, produced, &position, &frame, &frame_length) != RF_OK) {
            free(raw);
            return RF_MALFORMED;
        }
        mp_write_bin(&w, frame, frame_length);
    }
    free(raw);
    return w.overflow ? SHIM_SMALL : (int)w.length;
}
