/* test_messages.c - client message encoding (RELAY_PROTOCOL 15 bytes) and relay message
 * decoding, unknown types and extra elements. */
#include "messages.h"
#include "msgpack.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static int same(const uint8_t *a, int length, const uint8_t *b, size_t expected)
{
    return length == (int)expected && memcmp(a, b, expected) == 0;
}

static void test_encode(void)
{
    static const uint8_t join[] = {0x94, 0x01, 0xA7, 0x6C, 0x6F, 0x62, 0x62, 0x79, 0x2D, 0x31,
                                   0xA5, 0x61, 0x6C, 0x69, 0x63, 0x65, 0xC2};
    static const uint8_t input[] = {0x94, 0x05, 0xCD, 0x03, 0xEA, 0xC4, 0x02, 0x01, 0xFF, 0xCD,
                                    0x03, 0xE8};
    static const uint8_t checksum[] = {0x93, 0x03, 0x3B, 0xCF, 0xB9, 0x05, 0xCB, 0xAE, 0xA7,
                                       0x59, 0x42, 0x4B};
    static const uint8_t payload[] = {0x01, 0xFF};
    static const uint8_t have_none[] = {0x94, 0x05, 0x00, 0xC4, 0x00, 0xFF};
    uint8_t out[64];
    int n;
    n = rm_encode_join(out, sizeof out, "lobby-1", "alice", 0);
    CHECK(same(out, n, join, sizeof join));
    n = rm_encode_input(out, sizeof out, 1002, payload, 2, 1000);
    CHECK(same(out, n, input, sizeof input));
    n = rm_encode_checksum(out, sizeof out, 59, 0xB905CBAEA759424Bull);
    CHECK(same(out, n, checksum, sizeof checksum));
    n = rm_encode_input(out, sizeof out, 0, payload, 0, -1);
    CHECK(same(out, n, have_none, sizeof have_none));
    n = rm_encode_ready(out, sizeof out);
    CHECK(n == 2 && out[0] == 0x91 && out[1] == 0x02);
    n = rm_encode_leave(out, sizeof out);
    CHECK(n == 2 && out[0] == 0x91 && out[1] == 0x04);
    CHECK(rm_encode_join(out, 5, "lobby-1", "alice", 0) < 0);
    n = rm_encode_join(out, sizeof out, "r", "s", 1);
    CHECK(n == 7 && out[6] == 0xC3);
}

static void test_decode(void)
{
    static const uint8_t room_state[] = {0x94, 0x16, 0xA7, 0x72, 0x75, 0x6E, 0x6E, 0x69, 0x6E,
                                         0x67, 0x00, 0xC0};
    uint8_t buf[512];
    mp_writer w;
    rm_message m;

    CHECK(rm_decode(room_state, sizeof room_state, &m) == 1);
    CHECK(m.type == RM_ROOM_STATE && m.state == RM_STATE_RUNNING && m.frame == 0 && m.code[0] == 0);

    /* WELCOME: keys in another order, an extra key, extra trailing element */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 3);
    mp_write_uint(&w, 20);
    mp_write_map(&w, 9);
    mp_write_str(&w, "spectator", 9); mp_write_bool(&w, 0);
    mp_write_str(&w, "history", 7); mp_write_uint(&w, 1234);
    mp_write_str(&w, "extra", 5); mp_write_array(&w, 2); mp_write_uint(&w, 1); mp_write_str(&w, "x", 1);
    mp_write_str(&w, "next_frame", 10); mp_write_uint(&w, 1234);
    mp_write_str(&w, "state", 5); mp_write_str(&w, "running", 7);
    mp_write_str(&w, "tick_rate", 9); mp_write_uint(&w, 30);
    mp_write_str(&w, "slot", 4); mp_write_uint(&w, 3);
    mp_write_str(&w, "player", 6); mp_write_str(&w, "alice", 5);
    mp_write_str(&w, "room", 4); mp_write_str(&w, "lobby-1", 7);
    mp_write_uint(&w, 77);
    CHECK(rm_decode(buf, w.length, &m) == 1);
    CHECK(m.type == RM_WELCOME && m.slot == 3 && m.tick_rate == 30 && m.state == RM_STATE_RUNNING
          && m.next_frame == 1234 && m.history == 1234 && !m.spectator
          && strcmp(m.room, "lobby-1") == 0 && strcmp(m.player, "alice") == 0);
    /* a spectator's WELCOME: slot nil */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 2);
    mp_write_uint(&w, 20);
    mp_write_map(&w, 8);
    mp_write_str(&w, "room", 4); mp_write_str(&w, "r", 1);
    mp_write_str(&w, "player", 6); mp_write_str(&w, "s", 1);
    mp_write_str(&w, "slot", 4); mp_write_nil(&w);
    mp_write_str(&w, "tick_rate", 9); mp_write_uint(&w, 30);
    mp_write_str(&w, "state", 5); mp_write_str(&w, "waiting", 7);
    mp_write_str(&w, "next_frame", 10); mp_write_uint(&w, 0);
    mp_write_str(&w, "history", 7); mp_write_uint(&w, 0);
    mp_write_str(&w, "spectator", 9); mp_write_bool(&w, 1);
    CHECK(rm_decode(buf, w.length, &m) == 1 && m.slot == -1 && m.spectator
          && m.state == RM_STATE_WAITING);
    /* a WELCOME missing a key is malformed; a slot that is a string too */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 2);
    mp_write_uint(&w, 20);
    mp_write_map(&w, 1);
    mp_write_str(&w, "room", 4); mp_write_str(&w, "r", 1);
    CHECK(rm_decode(buf, w.length, &m) < 0);

    /* REFUSED, NOTICE */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 3);
    mp_write_uint(&w, 21);
    mp_write_str(&w, "room_full", 9);
    mp_write_str(&w, "the room is full", 16);
    CHECK(rm_decode(buf, w.length, &m) == 1 && m.type == RM_REFUSED
          && strcmp(m.code, "room_full") == 0 && strcmp(m.text, "the room is full") == 0);
    buf[1] = 24;
    CHECK(rm_decode(buf, w.length, &m) == 1 && m.type == RM_NOTICE);

    /* ROOM_STATE ended with a reason */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 4);
    mp_write_uint(&w, 22);
    mp_write_str(&w, "ended", 5);
    mp_write_uint(&w, 150);
    mp_write_str(&w, "admin", 5);
    CHECK(rm_decode(buf, w.length, &m) == 1 && m.state == RM_STATE_ENDED && m.frame == 150
          && strcmp(m.code, "admin") == 0);

    /* DESYNC */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 6);
    mp_write_uint(&w, 23);
    mp_write_uint(&w, 90);
    mp_write_map(&w, 3);
    mp_write_str(&w, "a", 1); mp_write_uint(&w, 1);
    mp_write_str(&w, "b", 1); mp_write_uint(&w, 1);
    mp_write_str(&w, "c", 1); mp_write_uint(&w, 0xFFFFFFFFFFFFFFFFull);
    mp_write_array(&w, 2);
    mp_write_str(&w, "c", 1);
    mp_write_str(&w, "dd", 2);
    mp_write_str(&w, "minority", 8);
    mp_write_array(&w, 0);
    CHECK(rm_decode(buf, w.length, &m) == 1 && m.type == RM_DESYNC && m.frame == 90
          && strcmp(m.code, "minority") == 0 && strcmp(m.text, "c,dd") == 0);

    /* INPUT_DELAY with an extra element */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 6);
    mp_write_uint(&w, 25);
    mp_write_uint(&w, 4);
    mp_write_uint(&w, 120);
    mp_write_uint(&w, 3);
    mp_write_uint(&w, 150);
    mp_write_nil(&w);
    CHECK(rm_decode(buf, w.length, &m) == 1 && m.delay_frames == 4 && m.response_ms == 120
          && m.late == 3 && m.inputs == 150);
    /* too short */
    buf[0] = 0x94;
    CHECK(rm_decode(buf, w.length, &m) < 0);

    /* unknown type ignored; garbage malformed */
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 2);
    mp_write_uint(&w, 99);
    mp_write_str(&w, "future", 6);
    CHECK(rm_decode(buf, w.length, &m) == 0);
    buf[0] = 0xC1;
    CHECK(rm_decode(buf, 1, &m) < 0);
    CHECK(rm_decode(buf, 0, &m) < 0);
    buf[0] = 0x90;    /* empty array */
    CHECK(rm_decode(buf, 1, &m) < 0);
}

int main(void)
{
    test_encode();
    test_decode();
    if (failures)
        return 1;
    printf("test_messages: ok\n");
    return 0;
}
