/* msgpack.c - see msgpack.h. Vendored on purpose (no dependency; ports anywhere). */
#include "msgpack.h"

#include <string.h>

void mp_writer_init(mp_writer *writer, uint8_t *data, size_t capacity)
{
    writer->data = data;
    writer->capacity = capacity;
    writer->length = 0;
    writer->overflow = 0;
}

static void put_bytes(mp_writer *writer, const void *bytes, size_t count)
{
    if (writer->overflow || count > writer->capacity - writer->length) {
        writer->overflow = 1;
        return;
    }
    if (count)
        memcpy(writer->data + writer->length, bytes, count);
    writer->length += count;
}

/* A type byte followed by `width` bytes of value, big-endian. */
static void put_tagged(mp_writer *writer, uint8_t tag, uint64_t value, int width)
{
    uint8_t bytes[9];
    int k;
    bytes[0] = tag;
    for (k = 0; k < width; k++)
        bytes[1 + k] = (uint8_t)(value >> (8 * (width - 1 - k)));
    put_bytes(writer, bytes, (size_t)width + 1);
}

void mp_write_nil(mp_writer *writer) { put_tagged(writer, 0xC0, 0, 0); }

void mp_write_bool(mp_writer *writer, int value) { put_tagged(writer, value ? 0xC3 : 0xC2, 0, 0); }

void mp_write_uint(mp_writer *writer, uint64_t value)
{
    if (value < 0x80)
        put_tagged(writer, (uint8_t)value, 0, 0);
    else if (value <= 0xFF)
        put_tagged(writer, 0xCC, value, 1);
    else if (value <= 0xFFFF)
        put_tagged(writer, 0xCD, value, 2);
    else if (value <= 0xFFFFFFFFu)
        put_tagged(writer, 0xCE, value, 4);
    else
        put_tagged(writer, 0xCF, value, 8);
}

void mp_write_int(mp_writer *writer, int64_t value)
{
    if (value >= 0)
        mp_write_uint(writer, (uint64_t)value);
    else if (value >= -32)
        put_tagged(writer, (uint8_t)(0xE0 | (uint8_t)(value + 32)), 0, 0);
    else if (value >= INT8_MIN)
        put_tagged(writer, 0xD0, (uint64_t)value, 1);
    else if (value >= INT16_MIN)
        put_tagged(writer, 0xD1, (uint64_t)value, 2);
    else if (value >= INT32_MIN)
        put_tagged(writer, 0xD2, (uint64_t)value, 4);
    else
        put_tagged(writer, 0xD3, (uint64_t)value, 8);
}

void mp_write_str(mp_writer *writer, const char *text, size_t length)
{
    if (length < 32)
        put_tagged(writer, (uint8_t)(0xA0 | length), 0, 0);
    else if (length <= 0xFF)
        put_tagged(writer, 0xD9, length, 1);
    else if (length <= 0xFFFF)
        put_tagged(writer, 0xDA, length, 2);
    else
        put_tagged(writer, 0xDB, length, 4);
    put_bytes(writer, text, length);
}

void mp_write_bin(mp_writer *writer, const uint8_t *data, size_t length)
{
    if (length <= 0xFF)
        put_tagged(writer, 0xC4, length, 1);
    else if (length <= 0xFFFF)
        put_tagged(writer, 0xC5, length, 2);
    else
        put_tagged(writer, 0xC6, length, 4);
    put_bytes(writer, data, length);
}

void mp_write_array(mp_writer *writer, uint32_t count)
{
    if (count < 16)
        put_tagged(writer, (uint8_t)(0x90 | count), 0, 0);
    else if (count <= 0xFFFF)
        put_tagged(writer, 0xDC, count, 2);
    else
        put_tagged(writer, 0xDD, count, 4);
}

void mp_write_map(mp_writer *writer, uint32_t count)
{
    if (count < 16)
        put_tagged(writer, (uint8_t)(0x80 | count), 0, 0);
    else if (count <= 0xFFFF)
        put_tagged(writer, 0xDE, count, 2);
    else
        put_tagged(writer, 0xDF, count, 4);
}

/* ---- reader ---- */

void mp_reader_init(mp_reader *reader, const uint8_t *data, size_t length)
{
    reader->data = data;
    reader->length = length;
    reader->position = 0;
}

static uint64_t get_be(const uint8_t *bytes, int width)
{
    uint64_t value = 0;
    int k;
    for (k = 0; k < width; k++)
        value = (value << 8) | bytes[k];
    return value;
}

int mp_read(mp_reader *reader, mp_value *value)
{
    const uint8_t *p = reader->data + reader->position;
    size_t left = reader->length - reader->position;
    size_t header = 1;     /* bytes of type byte and length/value field */
    uint64_t payload = 0;  /* bytes of str/bin/ext data after the header */
    uint8_t tag;
    int width = 0;

    if (left == 0)
        return -1;
    tag = p[0];
    memset(value, 0, sizeof *value);
    if (tag <= 0x7F) {
        value->type = MP_UINT;
        value->u = tag;
    } else if (tag >= 0xE0) {
        value->type = MP_INT;
        value->i = (int8_t)tag;
    } else if (tag <= 0x8F) {
        value->type = MP_MAP;
        value->length = tag & 0x0F;
    } else if (tag <= 0x9F) {
        value->type = MP_ARRAY;
        value->length = tag & 0x0F;
    } else if (tag <= 0xBF) {
        value->type = MP_STR;
        payload = tag & 0x1F;
    } else {
        switch (tag) {
        case 0xC0: value->type = MP_NIL; break;
        case 0xC2: case 0xC3: value->type = MP_BOOL; value->u = tag & 1; break;
        case 0xC4: case 0xC5: case 0xC6:
            value->type = MP_BIN; width = 1 << (tag - 0xC4); break;
        case 0xC7: case 0xC8: case 0xC9:
            value->type = MP_EXT; width = 1 << (tag - 0xC7); break;
        case 0xCA: value->type = MP_FLOAT; header = 5; break;
        case 0xCB: value->type = MP_FLOAT; header = 9; break;
        case 0xCC: case 0xCD: case 0xCE: case 0xCF:
            value->type = MP_UINT; width = 1 << (tag - 0xCC); break;
        case 0xD0: case 0xD1: case 0xD2: case 0xD3:
            value->type = MP_INT; width = 1 << (tag - 0xD0); break;
        case 0xD4: case 0xD5: case 0xD6: case 0xD7: case 0xD8:
            value->type = MP_EXT; header = 2; payload = (uint64_t)1 << (tag - 0xD4); break;
        case 0xD9: case 0xDA: case 0xDB:
            value->type = MP_STR; width = 1 << (tag - 0xD9); break;
        case 0xDC: case 0xDD:
            value->type = MP_ARRAY; width = 2 << (tag - 0xDC); break;
        case 0xDE: case 0xDF:
            value->type = MP_MAP; width = 2 << (tag - 0xDE); break;
        default:
            return -1;     /* 0xC1: never used */
        }
        if (width) {
            uint64_t field;
            header = 1 + (size_t)width;
            if (left < header)
                return -1;
            field = get_be(p + 1, width);
            switch (value->type) {
            case MP_UINT: value->u = field; break;
            case MP_INT:
                /* sign-extend */
                if (width < 8 && (field >> (8 * width - 1)))
                    field |= ~(uint64_t)0 << (8 * width);
                value->i = (int64_t)field;
                if (value->i >= 0) {          /* a signed encoding of a non-negative value */
                    value->type = MP_UINT;
                    value->u = field;
                }
                break;
            case MP_ARRAY: case MP_MAP: value->length = (uint32_t)field; break;
            case MP_EXT: header += 1; payload = field; break;   /* + the ext type byte */
            default: payload = field; break;
            }
        }
    }
    if (left < header || payload > left - header)
        return -1;
    if (value->type == MP_STR || value->type == MP_BIN || value->type == MP_EXT) {
        value->data = p + header;
        value->length = (uint32_t)payload;
    }
    if (value->type == MP_INT && value->i >= 0) {   /* negative fixint never is; safety */
        value->type = MP_UINT;
        value->u = (uint64_t)value->i;
    }
    reader->position += header + (size_t)payload;
    return 0;
}

int mp_skip(mp_reader *reader)
{
    size_t start = reader->position;
    uint64_t remaining = 1;
    mp_value value;
    while (remaining > 0) {
        if (mp_read(reader, &value) < 0) {
            reader->position = start;
            return -1;
        }
        remaining--;
        if (value.type == MP_ARRAY)
            remaining += value.length;
        else if (value.type == MP_MAP)
            remaining += 2 * (uint64_t)value.length;
        /* Every element takes at least one byte: a count beyond the input is truncated. */
        if (remaining > reader->length - reader->position) {
            reader->position = start;
            return -1;
        }
    }
    return 0;
}

int mp_read_uint(mp_reader *reader, uint64_t *out)
{
    size_t start = reader->position;
    mp_value value;
    if (mp_read(reader, &value) < 0)
        return -1;
    if (value.type != MP_UINT) {
        reader->position = start;
        return -1;
    }
    *out = value.u;
    return 0;
}

int mp_read_int(mp_reader *reader, int64_t *out)
{
    size_t start = reader->position;
    mp_value value;
    if (mp_read(reader, &value) < 0)
        return -1;
    if (!mp_value_int_in(&value, INT64_MIN, INT64_MAX, out)) {
        reader->position = start;
        return -1;
    }
    return 0;
}

int mp_read_array(mp_reader *reader, uint32_t *count)
{
    size_t start = reader->position;
    mp_value value;
    if (mp_read(reader, &value) < 0)
        return -1;
    if (value.type != MP_ARRAY) {
        reader->position = start;
        return -1;
    }
    *count = value.length;
    return 0;
}

int mp_read_str(mp_reader *reader, const uint8_t **text, uint32_t *length)
{
    size_t start = reader->position;
    mp_value value;
    if (mp_read(reader, &value) < 0)
        return -1;
    if (value.type != MP_STR) {
        reader->position = start;
        return -1;
    }
    *text = value.data;
    *length = value.length;
    return 0;
}

int mp_value_int_in(const mp_value *value, int64_t minimum, int64_t maximum, int64_t *out)
{
    int64_t v;
    if (value->type == MP_UINT) {
        if (value->u > (uint64_t)INT64_MAX)
            return 0;
        v = (int64_t)value->u;
    } else if (value->type == MP_INT) {
        v = value->i;
    } else {
        return 0;
    }
    if (v < minimum || v > maximum)
        return 0;
    if (out)
        *out = v;
    return 1;
}
