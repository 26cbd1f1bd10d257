/* test_frame.c - FRAME v2 decoding (RELAY_PROTOCOL 7.1, the worked examples of section 15)
 * with every malformation of 7.1 rejected, and history blocks (9.2). */
#include "frame.h"
#include "msgpack.h"

#include <stdio.h>
#include <string.h>
#include <zlib.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static const uint8_t frame1000[] = {0xC1, 0xE8, 0x07, 0x04, 0x03, 0x05, 0x02, 0x01, 0xFF, 0x02,
                                    0x00, 0x01, 0x01, 0x00, 0x02, 0x05, 0x63, 0x61, 0x72, 0x6F,
                                    0x6C};
static const uint8_t frame1001[] = {0xC1, 0xE9, 0x07, 0x03, 0x03, 0x07, 0x01, 0x02, 0x02, 0x00,
                                    0x00, 0x02, 0x00, 0x02};

static uint8_t arena_a[4096], arena_b[4096], arena_c[4096];
static uint8_t zmemory[RF_INFLATE_MEMORY];

static int input_is(const rf_frame *f, uint32_t slot, const char *bytes, int length)
{
    return f->length[slot] == length
           && (length <= 0 || memcmp(f->arena + f->offset[slot], bytes, (size_t)length) == 0);
}

static void test_examples(void)
{
    rf_frame empty, a, b;
    uint32_t number;
    int kind, slot;
    const char *name;
    uint32_t name_length;
    rf_frame_init(&empty, arena_c, sizeof arena_c);
    rf_frame_init(&a, arena_a, sizeof arena_a);
    rf_frame_init(&b, arena_b, sizeof arena_b);

    CHECK(rf_frame_number(frame1000, sizeof frame1000, &number) == RF_OK && number == 1000);
    CHECK(rf_decode(frame1000, sizeof frame1000, &empty, &a) == RF_OK);
    CHECK(a.number == 1000 && a.slot_count == 3);
    CHECK(input_is(&a, 0, "\x01\xff", 2) && a.length[1] == -1 && input_is(&a, 2, "\x00\x01", 2));
    CHECK(a.synthesized[0] == 0 && a.event_count == 1);
    CHECK(rf_frame_event(&a, 0, &kind, &slot, &name, &name_length) == 0 && kind == 0 && slot == 2
          && name_length == 5 && memcmp(name, "carol", 5) == 0);
    CHECK(rf_frame_event(&a, 1, &kind, &slot, &name, &name_length) < 0);
    /* frame 1000 needs no previous frame */
    CHECK(rf_decode(frame1000, sizeof frame1000, NULL, &b) == RF_OK);

    CHECK(rf_decode(frame1001, sizeof frame1001, &a, &b) == RF_OK);
    CHECK(b.number == 1001 && b.slot_count == 3 && b.event_count == 0);
    CHECK(input_is(&b, 0, "\x01\xff", 2) && input_is(&b, 1, "\x00\x00", 2)
          && input_is(&b, 2, "\x00\x02", 2));
    CHECK(b.synthesized[0] == 0x02);
    /* its same bit needs frame 1000 */
    CHECK(rf_decode(frame1001, sizeof frame1001, NULL, &b) == RF_NEEDS_PREVIOUS);
    CHECK(rf_decode(frame1001, sizeof frame1001, &empty, &b) == RF_MALFORMED);
    /* too small an arena */
    {
        rf_frame tiny;
        uint8_t small[3];
        rf_frame_init(&tiny, small, sizeof small);
        CHECK(rf_decode(frame1000, sizeof frame1000, &empty, &tiny) == RF_TOO_LARGE);
    }
}

static int decodes(const uint8_t *data, size_t length, const rf_frame *previous)
{
    rf_frame out;
    rf_frame_init(&out, arena_b, sizeof arena_b);
    return rf_decode(data, length, previous, &out);
}

static void test_malformed(void)
{
    rf_frame empty, prev;
    uint8_t buf[64];
    size_t k;
    rf_frame_init(&empty, arena_c, sizeof arena_c);
    rf_frame_init(&prev, arena_a, sizeof arena_a);
    CHECK(rf_decode(frame1000, sizeof frame1000, &empty, &prev) == RF_OK);

    /* every truncation of both examples */
    for (k = 0; k < sizeof frame1000; k++)
        CHECK(decodes(frame1000, k, &empty) == RF_MALFORMED);
    for (k = 0; k < sizeof frame1001; k++)
        CHECK(decodes(frame1001, k, &prev) == RF_MALFORMED);
    /* a trailing byte */
    memcpy(buf, frame1000, sizeof frame1000);
    buf[sizeof frame1000] = 0;
    CHECK(decodes(buf, sizeof frame1000 + 1, &empty) == RF_MALFORMED);
    /* not a FRAME */
    buf[0] = 0x94;
    CHECK(decodes(buf, sizeof frame1000, &empty) == RF_MALFORMED);
    /* flags bits 3..7 */
    for (k = 3; k < 8; k++) {
        memcpy(buf, frame1000, sizeof frame1000);
        buf[3] |= (uint8_t)(1u << k);
        CHECK(decodes(buf, sizeof frame1000, &empty) == RF_MALFORMED);
    }
    /* present bit for slot >= n (n = 3: bit 3) */
    memcpy(buf, frame1000, sizeof frame1000);
    buf[5] |= 0x08;
    CHECK(decodes(buf, sizeof frame1000, &empty) == RF_MALFORMED);
    /* same bit for slot >= n */
    memcpy(buf, frame1001, sizeof frame1001);
    buf[6] |= 0x10;
    CHECK(decodes(buf, sizeof frame1001, &prev) == RF_MALFORMED);
    /* synthesized bit for slot >= n */
    memcpy(buf, frame1001, sizeof frame1001);
    buf[7] |= 0x80;
    CHECK(decodes(buf, sizeof frame1001, &prev) == RF_MALFORMED);
    /* same bit for a slot the previous frame had nil (slot 1 of frame 1000) */
    {
        static const uint8_t f[] = {0xC1, 0xE9, 0x07, 0x01, 0x03, 0x02, 0x02};
        CHECK(decodes(f, sizeof f, &prev) == RF_MALFORMED);
    }
    /* same / synthesized bit for a slot without input */
    {
        static const uint8_t f[] = {0xC1, 0x01, 0x01, 0x01, 0x00, 0x01};
        static const uint8_t g[] = {0xC1, 0x01, 0x02, 0x01, 0x00, 0x01};
        CHECK(decodes(f, sizeof f, &prev) == RF_MALFORMED);
        CHECK(decodes(g, sizeof g, &prev) == RF_MALFORMED);
    }
    /* varints: 5 bytes fine, 6 bytes or >= 2^32 not */
    {
        static const uint8_t max[] = {0xC1, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x00, 0x00};
        static const uint8_t big[] = {0xC1, 0xFF, 0xFF, 0xFF, 0xFF, 0x10, 0x00, 0x00};
        static const uint8_t longer[] = {0xC1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00, 0x00};
        static const uint8_t slots[] = {0xC1, 0x00, 0x00, 0x81, 0x02};    /* 257 slots */
        rf_frame out;
        rf_frame_init(&out, arena_b, sizeof arena_b);
        CHECK(rf_decode(max, sizeof max, &empty, &out) == RF_OK && out.number == 0xFFFFFFFFu);
        CHECK(decodes(big, sizeof big, &empty) == RF_MALFORMED);
        CHECK(decodes(longer, sizeof longer, &empty) == RF_MALFORMED);
        CHECK(decodes(slots, sizeof slots, &empty) == RF_MALFORMED);
    }
    /* events: unknown kind, slot >= 256, bad UTF-8, name too long */
    {
        uint8_t f[] = {0xC1, 0x00, 0x04, 0x00, 0x01, 0x00, 0x02, 0x01, 0x61};
        CHECK(decodes(f, sizeof f, &empty) == RF_OK);
        f[5] = 4;
        CHECK(decodes(f, sizeof f, &empty) == RF_MALFORMED);
        f[5] = 3;
        f[8] = 0xFF;
        CHECK(decodes(f, sizeof f, &empty) == RF_MALFORMED);
        f[8] = 0x61;
        f[6] = 0x80;    /* slot varint 0x80 0x01 = 128 ... then bytes shift: malformed */
        CHECK(decodes(f, sizeof f, &empty) == RF_MALFORMED);
    }
    {
        static const uint8_t f[] = {0xC1, 0x00, 0x04, 0x00, 0x01, 0x00, 0x80, 0x02, 0x00};
        CHECK(decodes(f, sizeof f, &empty) == RF_MALFORMED);    /* slot 256 */
    }
    /* an input longer than the frame */
    {
        static const uint8_t f[] = {0xC1, 0x00, 0x00, 0x01, 0x01, 0x05, 0x01};
        CHECK(decodes(f, sizeof f, &empty) == RF_MALFORMED);
    }
    /* zero slots, no flags */
    {
        static const uint8_t f[] = {0xC1, 0x00, 0x00, 0x00};
        CHECK(decodes(f, sizeof f, &empty) == RF_OK);
    }
}

static size_t make_block(uint8_t *out, size_t cap, uint32_t first, const uint8_t *const *frames,
                         const size_t *lengths, uint32_t count, uint8_t *raw, size_t *raw_length)
{
    mp_writer w;
    uLongf compressed = (uLongf)cap;
    uint32_t k;
    mp_writer_init(&w, raw, 4096);
    mp_write_array(&w, 2);
    mp_write_uint(&w, first);
    mp_write_array(&w, count);
    for (k = 0; k < count; k++)
        mp_write_bin(&w, frames[k], lengths[k]);
    *raw_length = w.length;
    if (compress2(out, &compressed, raw, w.length, 6) != Z_OK)
        return 0;
    return compressed;
}

static void test_history(void)
{
    static const uint8_t example[] = {0x92, 0xCD, 0x03, 0xE8, 0x91, 0xC4, 0x15, 0xC1, 0xE8, 0x07,
                                      0x04, 0x03, 0x05, 0x02, 0x01, 0xFF, 0x02, 0x00, 0x01, 0x01,
                                      0x00, 0x02, 0x05, 0x63, 0x61, 0x72, 0x6F, 0x6C};
    const uint8_t *frames[2] = {frame1000, frame1001};
    size_t lengths[2] = {sizeof frame1000, sizeof frame1001};
    uint8_t raw[4096], block[4096], inflated[4096];
    size_t raw_length, block_length, inflated_length, offset, position;
    uint32_t first, count;
    const uint8_t *data;
    size_t length;

    block_length = make_block(block, sizeof block, 1000, frames, lengths, 1, raw, &raw_length);
    CHECK(raw_length == sizeof example && memcmp(raw, example, sizeof example) == 0);
    CHECK(rf_history_peek(block, block_length, zmemory, &first, &count) == RF_OK && first == 1000
          && count == 1);
    CHECK(rf_history_inflate(block, block_length, zmemory, inflated, sizeof inflated,
                             &inflated_length) == RF_OK && inflated_length == sizeof example);
    CHECK(rf_history_parse(inflated, inflated_length, &first, &count, &offset) == RF_OK
          && first == 1000 && count == 1);
    position = offset;
    CHECK(rf_history_next(inflated, inflated_length, &position, &data, &length) == RF_OK
          && length == sizeof frame1000 && memcmp(data, frame1000, length) == 0
          && position == inflated_length);

    block_length = make_block(block, sizeof block, 1000, frames, lengths, 2, raw, &raw_length);
    CHECK(rf_history_peek(block, block_length, zmemory, &first, &count) == RF_OK && count == 2);
    /* the cap: one byte short is too large */
    CHECK(rf_history_inflate(block, block_length, zmemory, inflated, raw_length - 1,
                             &inflated_length) == RF_TOO_LARGE);
    CHECK(rf_history_inflate(block, block_length, zmemory, inflated, raw_length,
                             &inflated_length) == RF_OK);
    /* truncated or corrupt zlib */
    CHECK(rf_history_inflate(block, block_length - 3, zmemory, inflated, sizeof inflated,
                             &inflated_length) == RF_MALFORMED);
    block[block_length / 2] ^= 0x55;
    CHECK(rf_history_inflate(block, block_length, zmemory, inflated, sizeof inflated,
                             &inflated_length) != RF_OK
          || rf_history_parse(inflated, inflated_length, &first, &count, &offset) != RF_OK
          || count != 2);
    /* bad structures */
    {
        uint8_t bad[64];
        memcpy(bad, example, sizeof example);
        bad[sizeof example] = 0x00;                /* trailing */
        CHECK(rf_history_parse(bad, sizeof example + 1, &first, &count, &offset) == RF_MALFORMED);
        bad[5] = 0xA5;                             /* str instead of bin */
        CHECK(rf_history_parse(bad, sizeof example, &first, &count, &offset) == RF_MALFORMED);
        memcpy(bad, example, sizeof example);
        bad[0] = 0x93;
        CHECK(rf_history_parse(bad, sizeof example, &first, &count, &offset) == RF_MALFORMED);
        /* first + count past 2^32 */
        {
            static const uint8_t past[] = {0x92, 0xCE, 0xFF, 0xFF, 0xFF, 0xFF, 0x92, 0xC4, 0x00,
                                           0xC4, 0x00};
            CHECK(rf_history_parse(past, sizeof past, &first, &count, &offset) == RF_MALFORMED);
        }
    }
}

int main(void)
{
    test_examples();
    test_malformed();
    test_history();
    if (failures)
        return 1;
    printf("test_frame: ok\n");
    return 0;
}
