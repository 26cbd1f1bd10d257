/*
 * msgpack.h - a small msgpack codec for exactly what the relay protocol uses (nil, bool,
 * integers of every width, str, bin, array, map; floats and ext are only skipped).
 *
 * Vendored on purpose: the client library has no third-party dependency besides zlib and the
 * crypto backend, so it ports to consoles and mobile platforms by recompiling these files.
 * The writer never writes past its buffer (it records an overflow instead); the reader is
 * bounds-checked and never reads past the end of its input.
 */
#ifndef RC_MSGPACK_H
#define RC_MSGPACK_H

#include <stddef.h>
#include <stdint.h>

typedef struct mp_writer {
    uint8_t *data;
    size_t capacity;
    size_t length;
    int overflow;                   /* set once a write did not fit */
} mp_writer;

void mp_writer_init(mp_writer *writer, uint8_t *data, size_t capacity);
void mp_write_nil(mp_writer *writer);
void mp_write_bool(mp_writer *writer, int value);
void mp_write_uint(mp_writer *writer, uint64_t value);
void mp_write_int(mp_writer *writer, int64_t value);      /* shortest form, unsigned if >= 0 */
void mp_write_str(mp_writer *writer, const char *text, size_t length);
void mp_write_bin(mp_writer *writer, const uint8_t *data, size_t length);
void mp_write_array(mp_writer *writer, uint32_t count);
void mp_write_map(mp_writer *writer, uint32_t count);

typedef enum mp_type {
    MP_NIL, MP_BOOL, MP_UINT, MP_INT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP, MP_EXT
} mp_type;

/* One value as read: for MP_UINT `u`, for MP_INT (a negative number) `i`, for MP_BOOL `u`
 * (0/1), for MP_STR/MP_BIN/MP_EXT `data` + `length` (pointing into the input), for
 * MP_ARRAY/MP_MAP `length` = element count (the elements follow; map: key, value, ...). */
typedef struct mp_value {
    mp_type type;
    uint64_t u;
    int64_t i;
    const uint8_t *data;
    uint32_t length;
} mp_value;

typedef struct mp_reader {
    const uint8_t *data;
    size_t length;
    size_t position;
} mp_reader;

void mp_reader_init(mp_reader *reader, const uint8_t *data, size_t length);
/* Reads the next value's header (and its bytes for str/bin). 0, or -1 if truncated or not
 * msgpack (0xC1). The reader does not advance on failure. */
int mp_read(mp_reader *reader, mp_value *value);
/* Skips one whole value, nested elements included. 0 or -1. */
int mp_skip(mp_reader *reader);
/* Typed helpers: 0, or -1 on a type mismatch or truncation. */
int mp_read_uint(mp_reader *reader, uint64_t *value);     /* a non-negative integer */
int mp_read_int(mp_reader *reader, int64_t *value);       /* an integer in int64 range */
int mp_read_array(mp_reader *reader, uint32_t *count);
int mp_read_str(mp_reader *reader, const uint8_t **text, uint32_t *length);
/* 1 if the value is an integer in [minimum, maximum] (as int64 comparisons; uint above
 * INT64_MAX counts as above any maximum), else 0. */
int mp_value_int_in(const mp_value *value, int64_t minimum, int64_t maximum, int64_t *out);

#endif
