/* messages.c - see messages.h. */
#include "messages.h"
#include "msgpack.h"

#include <string.h>

static int finish(const mp_writer *writer)
{
    return writer->overflow ? -1 : (int)writer->length;
}

int rm_encode_join(uint8_t *out, size_t cap, const char *room, const char *player, int spectator)
{
    mp_writer w;
    mp_writer_init(&w, out, cap);
    mp_write_array(&w, 4);
    mp_write_uint(&w, RM_JOIN);
    mp_write_str(&w, room, strlen(room));
    mp_write_str(&w, player, strlen(player));
    mp_write_bool(&w, spectator);
    return finish(&w);
}

static int encode_bare(uint8_t *out, size_t cap, int type)
{
    mp_writer w;
    mp_writer_init(&w, out, cap);
    mp_write_array(&w, 1);
    mp_write_uint(&w, (uint64_t)type);
    return finish(&w);
}

int rm_encode_ready(uint8_t *out, size_t cap) { return encode_bare(out, cap, RM_READY); }

int rm_encode_leave(uint8_t *out, size_t cap) { return encode_bare(out, cap, RM_LEAVE); }

int rm_encode_checksum(uint8_t *out, size_t cap, uint32_t frame, uint64_t value)
{
    mp_writer w;
    mp_writer_init(&w, out, cap);
    mp_write_array(&w, 3);
    mp_write_uint(&w, RM_CHECKSUM);
    mp_write_uint(&w, frame);
    mp_write_uint(&w, value);      /* unsigned 64-bit, RELAY_PROTOCOL 12 */
    return finish(&w);
}

int rm_encode_input(uint8_t *out, size_t cap, uint32_t frame, const uint8_t *payload,
                    size_t length, int64_t have)
{
    mp_writer w;
    mp_writer_init(&w, out, cap);
    mp_write_array(&w, 4);
    mp_write_uint(&w, RM_INPUT);
    mp_write_uint(&w, frame);
    mp_write_bin(&w, payload, length);
    mp_write_int(&w, have);
    return finish(&w);
}

/* ---- decoding ---- */

static void copy_text(char *out, size_t cap, const uint8_t *text, uint32_t length)
{
    size_t n = length < cap - 1 ? length : cap - 1;
    if (n)
        memcpy(out, text, n);
    out[n] = '\0';
}

static int read_text(mp_reader *r, char *out, size_t cap)
{
    const uint8_t *text;
    uint32_t length;
    if (mp_read_str(r, &text, &length) < 0)
        return -1;
    copy_text(out, cap, text, length);
    return 0;
}

static int read_u32(mp_reader *r, uint32_t *out)
{
    uint64_t value;
    if (mp_read_uint(r, &value) < 0 || value > 0xFFFFFFFFu)
        return -1;
    *out = (uint32_t)value;
    return 0;
}

/* A non-negative count that may be reported as any integer; clamped into u32. */
static int read_count(mp_reader *r, uint32_t *out)
{
    int64_t value;
    if (mp_read_int(r, &value) < 0)
        return -1;
    *out = value < 0 ? 0 : value > 0xFFFFFFFF ? 0xFFFFFFFFu : (uint32_t)value;
    return 0;
}

static int state_code(const uint8_t *text, uint32_t length)
{
    if (length == 7 && memcmp(text, "waiting", 7) == 0)
        return RM_STATE_WAITING;
    if (length == 7 && memcmp(text, "running", 7) == 0)
        return RM_STATE_RUNNING;
    if (length == 5 && memcmp(text, "ended", 5) == 0)
        return RM_STATE_ENDED;
    return RM_STATE_NONE;
}

static int key_is(const mp_value *key, const char *name)
{
    size_t n = strlen(name);
    return key->type == MP_STR && key->length == n && memcmp(key->data, name, n) == 0;
}

static int decode_welcome(mp_reader *r, rm_message *m)
{
    mp_value count, key, value;
    uint32_t k;
    unsigned seen = 0;
    if (mp_read(r, &count) < 0 || count.type != MP_MAP)
        return -1;
    for (k = 0; k < count.length; k++) {
        if (mp_read(r, &key) < 0)
            return -1;
        if (key.type == MP_ARRAY || key.type == MP_MAP)
            return -1;
        if (mp_read(r, &value) < 0)
            return -1;
        if (value.type == MP_ARRAY || value.type == MP_MAP) {
            /* not one of ours: skip its elements */
            uint64_t remaining = value.type == MP_MAP ? 2 * (uint64_t)value.length : value.length;
            while (remaining-- > 0)
                if (mp_skip(r) < 0)
                    return -1;
            if (key_is(&key, "room") || key_is(&key, "player") || key_is(&key, "slot")
                || key_is(&key, "tick_rate") || key_is(&key, "state")
                || key_is(&key, "next_frame") || key_is(&key, "history")
                || key_is(&key, "spectator"))
                return -1;
            continue;
        }
        if (key_is(&key, "room")) {
            if (value.type != MP_STR) return -1;
            copy_text(m->room, sizeof m->room, value.data, value.length);
            seen |= 1;
        } else if (key_is(&key, "player")) {
            if (value.type != MP_STR) return -1;
            copy_text(m->player, sizeof m->player, value.data, value.length);
            seen |= 2;
        } else if (key_is(&key, "slot")) {
            int64_t slot;
            if (value.type == MP_NIL)
                m->slot = -1;
            else if (mp_value_int_in(&value, 0, 0x7FFFFFFF, &slot))
                m->slot = (int32_t)slot;
            else
                return -1;
            seen |= 4;
        } else if (key_is(&key, "tick_rate")) {
            int64_t rate;
            if (!mp_value_int_in(&value, 0, 0xFFFFFFFF, &rate)) return -1;
            m->tick_rate = (uint32_t)rate;
            seen |= 8;
        } else if (key_is(&key, "state")) {
            if (value.type != MP_STR) return -1;
            m->state = state_code(value.data, value.length);
            seen |= 16;
        } else if (key_is(&key, "next_frame")) {
            int64_t frame;
            if (!mp_value_int_in(&value, 0, 0xFFFFFFFF, &frame)) return -1;
            m->next_frame = (uint32_t)frame;
            seen |= 32;
        } else if (key_is(&key, "history")) {
            int64_t history;
            if (!mp_value_int_in(&value, 0, 0xFFFFFFFF, &history)) return -1;
            m->history = (uint32_t)history;
            seen |= 64;
        } else if (key_is(&key, "spectator")) {
            if (value.type != MP_BOOL) return -1;
            m->spectator = (int)value.u;
            seen |= 128;
        }
    }
    /* spectator may be absent (older relays); everything else is required */
    return (seen & 0x7F) == 0x7F ? 0 : -1;
}

int rm_decode(const uint8_t *data, size_t length, rm_message *m)
{
    mp_reader r;
    uint32_t count;
    int64_t type;
    mp_value value;

    memset(m, 0, sizeof *m);
    m->slot = -1;
    mp_reader_init(&r, data, length);
    if (mp_read_array(&r, &count) < 0 || count < 1 || mp_read_int(&r, &type) < 0)
        return -1;
    m->type = (int)(type >= 0 && type < 1000 ? type : 0);
    switch (type) {
    case RM_WELCOME:
        if (count < 2 || decode_welcome(&r, m) < 0)
            return -1;
        return 1;
    case RM_REFUSED:
    case RM_NOTICE:
        if (count < 3 || read_text(&r, m->code, sizeof m->code) < 0
            || read_text(&r, m->text, sizeof m->text) < 0)
            return -1;
        return 1;
    case RM_ROOM_STATE: {
        const uint8_t *text;
        uint32_t n;
        if (count < 3 || mp_read_str(&r, &text, &n) < 0 || read_u32(&r, &m->frame) < 0)
            return -1;
        m->state = state_code(text, n);
        if (count >= 4) {
            if (mp_read(&r, &value) < 0)
                return -1;
            if (value.type == MP_STR)
                copy_text(m->code, sizeof m->code, value.data, value.length);
            else if (value.type != MP_NIL)
                return -1;
        }
        return 1;
    }
    case RM_DESYNC: {
        uint32_t k, names;
        size_t used = 0;
        if (count < 5 || read_u32(&r, &m->frame) < 0 || mp_skip(&r) < 0)   /* checksums */
            return -1;
        if (mp_read_array(&r, &names) < 0)
            return -1;
        for (k = 0; k < names; k++) {
            const uint8_t *text;
            uint32_t n;
            if (mp_read_str(&r, &text, &n) < 0)
                return -1;
            if (k > 0 && used + 1 < sizeof m->text)
                m->text[used++] = ',';
            while (n-- > 0 && used + 1 < sizeof m->text)
                m->text[used++] = (char)*text++;
        }
        m->text[used] = '\0';
        if (read_text(&r, m->code, sizeof m->code) < 0)
            return -1;
        return 1;
    }
    case RM_INPUT_DELAY:
        if (count < 5 || read_count(&r, &m->delay_frames) < 0
            || read_count(&r, &m->response_ms) < 0 || read_count(&r, &m->late) < 0
            || read_count(&r, &m->inputs) < 0)
            return -1;
        return 1;
    default:
        return 0;
    }
}
