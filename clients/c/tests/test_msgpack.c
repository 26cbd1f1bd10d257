/* test_msgpack.c - the vendored msgpack codec: every width, bounds, skipping. */
#include "msgpack.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static size_t write_uint(uint64_t v, uint8_t *out)
{
    mp_writer w;
    mp_writer_init(&w, out, 16);
    mp_write_uint(&w, v);
    return w.length;
}

static size_t write_int(int64_t v, uint8_t *out)
{
    mp_writer w;
    mp_writer_init(&w, out, 16);
    mp_write_int(&w, v);
    return w.length;
}

static void test_integers(void)
{
    static const struct { uint64_t value; size_t length; uint8_t first; } unsigned_cases[] = {
        {0, 1, 0x00}, {127, 1, 0x7F}, {128, 2, 0xCC}, {255, 2, 0xCC}, {256, 3, 0xCD},
        {65535, 3, 0xCD}, {65536, 5, 0xCE}, {0xFFFFFFFFu, 5, 0xCE}, {0x100000000ull, 9, 0xCF},
        {0xFFFFFFFFFFFFFFFFull, 9, 0xCF}};
    static const struct { int64_t value; size_t length; uint8_t first; } signed_cases[] = {
        {-1, 1, 0xFF}, {-32, 1, 0xE0}, {-33, 2, 0xD0}, {-128, 2, 0xD0}, {-129, 3, 0xD1},
        {-32768, 3, 0xD1}, {-32769, 5, 0xD2}, {INT32_MIN, 5, 0xD2}, {(int64_t)INT32_MIN - 1, 9, 0xD3},
        {INT64_MIN, 9, 0xD3}, {5, 1, 0x05}};
    size_t k;
    uint8_t buf[16];
    for (k = 0; k < sizeof unsigned_cases / sizeof unsigned_cases[0]; k++) {
        mp_reader r;
        uint64_t out;
        size_t n = write_uint(unsigned_cases[k].value, buf);
        CHECK(n == unsigned_cases[k].length && buf[0] == unsigned_cases[k].first);
        mp_reader_init(&r, buf, n);
        CHECK(mp_read_uint(&r, &out) == 0 && out == unsigned_cases[k].value && r.position == n);
        mp_reader_init(&r, buf, n - 1);              /* truncated */
        CHECK(n == 1 || mp_read_uint(&r, &out) < 0);
    }
    for (k = 0; k < sizeof signed_cases / sizeof signed_cases[0]; k++) {
        mp_reader r;
        int64_t out;
        size_t n = write_int(signed_cases[k].value, buf);
        CHECK(n == signed_cases[k].length && buf[0] == signed_cases[k].first);
        mp_reader_init(&r, buf, n);
        CHECK(mp_read_int(&r, &out) == 0 && out == signed_cases[k].value);
    }
    /* a signed encoding of a positive value reads as unsigned */
    {
        static const uint8_t d0[] = {0xD0, 0x05}, d3[] = {0xD3, 0, 0, 0, 0, 0, 0, 1, 0};
        mp_reader r;
        uint64_t u;
        mp_reader_init(&r, d0, sizeof d0);
        CHECK(mp_read_uint(&r, &u) == 0 && u == 5);
        mp_reader_init(&r, d3, sizeof d3);
        CHECK(mp_read_uint(&r, &u) == 0 && u == 256);
    }
    /* uint64 above INT64_MAX does not fit mp_read_int */
    {
        mp_reader r;
        int64_t out;
        size_t n = write_uint(0xFFFFFFFFFFFFFFFFull, buf);
        mp_reader_init(&r, buf, n);
        CHECK(mp_read_int(&r, &out) < 0 && r.position == 0);
    }
}

static void test_strings_and_containers(void)
{
    static uint8_t buf[140000];
    static uint8_t blob[66000];
    size_t sizes[] = {0, 1, 31, 32, 255, 256, 65535, 65536};
    size_t k;
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        mp_writer w;
        mp_reader r;
        mp_value v;
        size_t n = sizes[k];
        memset(blob, 'x', n);
        mp_writer_init(&w, buf, sizeof buf);
        mp_write_str(&w, (const char *)blob, n);
        mp_write_bin(&w, blob, n);
        CHECK(!w.overflow);
        mp_reader_init(&r, buf, w.length);
        CHECK(mp_read(&r, &v) == 0 && v.type == MP_STR && v.length == n);
        CHECK(mp_read(&r, &v) == 0 && v.type == MP_BIN && v.length == n);
        CHECK(r.position == w.length);
        /* truncated payload never reads past the buffer */
        if (n > 0) {
            mp_reader_init(&r, buf, w.length - 1);
            CHECK(mp_read(&r, &v) == 0);
            CHECK(mp_read(&r, &v) < 0);
        }
    }
    {
        mp_writer w;
        mp_reader r;
        uint32_t count;
        mp_value v;
        mp_writer_init(&w, buf, sizeof buf);
        mp_write_array(&w, 3);
        mp_write_nil(&w);
        mp_write_bool(&w, 1);
        mp_write_map(&w, 1);
        mp_write_str(&w, "k", 1);
        mp_write_array(&w, 20);
        for (k = 0; k < 20; k++)
            mp_write_uint(&w, k * 1000);
        mp_write_uint(&w, 99);
        mp_reader_init(&r, buf, w.length);
        CHECK(mp_read_array(&r, &count) == 0 && count == 3);
        CHECK(mp_read(&r, &v) == 0 && v.type == MP_NIL);
        CHECK(mp_read(&r, &v) == 0 && v.type == MP_BOOL && v.u == 1);
        CHECK(mp_skip(&r) == 0);
        CHECK(mp_read(&r, &v) == 0 && v.type == MP_UINT && v.u == 99);
        CHECK(r.position == w.length);
        /* skip of a truncated container fails and does not move */
        mp_reader_init(&r, buf + 3, w.length - 5);
        CHECK(mp_skip(&r) < 0 && r.position == 0);
    }
    /* overflow is recorded, not written past */
    {
        mp_writer w;
        uint8_t small[4] = {0, 0, 0, 0xAA};
        mp_writer_init(&w, small, 3);
        mp_write_str(&w, "hello", 5);
        CHECK(w.overflow && small[3] == 0xAA);
    }
    /* 0xC1 and a huge array count */
    {
        static const uint8_t c1[] = {0xC1}, huge[] = {0xDD, 0xFF, 0xFF, 0xFF, 0xFF, 0x01};
        static const uint8_t floats[] = {0xCB, 0, 0, 0, 0, 0, 0, 0, 0, 0xCA, 0, 0, 0, 0, 0xD4, 1, 2};
        mp_reader r;
        mp_value v;
        mp_reader_init(&r, c1, 1);
        CHECK(mp_read(&r, &v) < 0);
        mp_reader_init(&r, huge, sizeof huge);
        CHECK(mp_skip(&r) < 0);
        mp_reader_init(&r, floats, sizeof floats);
        CHECK(mp_skip(&r) == 0 && mp_skip(&r) == 0 && mp_skip(&r) == 0 && r.position == sizeof floats);
    }
}

int main(void)
{
    test_integers();
    test_strings_and_containers();
    if (failures)
        return 1;
    printf("test_msgpack: ok\n");
    return 0;
}
