/* test_client.c - the relay client's frame store and inputs, driven through the conn
 * callbacks (client_internal.h) without a transport: live frames and blocks merged with no
 * gap and no duplicate in every arrival order, bounded buffers, reconnect, bad frames, and the
 * input-delay rules of send_input (RELAY_PROTOCOL 8.3, 9.3). */
#include "client_internal.h"
#include "messages.h"
#include "msgpack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

/* ---- a deterministic room: frame n's inputs, encoded like relay.protocol.encode_frame ---- */

#define SLOTS 3

/* slot s's input in frame n: -1 nil, else its length; bytes into out */
static int input_of(uint32_t n, int s, uint8_t *out)
{
    if (s == 1 && n % 5 == 0)
        return RELAY_NIL;
    out[0] = (uint8_t)s;
    out[1] = (uint8_t)(n / 3);       /* changes every third frame: same bits get used */
    return 2;
}

static size_t put_varint(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static size_t encode_frame(uint32_t n, uint8_t *out)
{
    uint8_t present = 0, same = 0, payloads[64], cur[2], prev[2];
    size_t p = 0, o = 0;
    int s;
    for (s = 0; s < SLOTS; s++) {
        int length = input_of(n, s, cur);
        if (length < 0)
            continue;
        present |= (uint8_t)(1 << s);
        if (n > 0 && input_of(n - 1, s, prev) == length && memcmp(prev, cur, 2) == 0) {
            same |= (uint8_t)(1 << s);
            continue;
        }
        p += put_varint(payloads + p, (uint64_t)length);
        memcpy(payloads + p, cur, (size_t)length);
        p += (size_t)length;
    }
    out[o++] = 0xC1;
    o += put_varint(out + o, n);
    out[o++] = (uint8_t)((same ? 1 : 0) | (n == 0 ? 4 : 0));
    out[o++] = SLOTS;
    out[o++] = present;
    if (same)
        out[o++] = same;
    memcpy(out + o, payloads, p);
    o += p;
    if (n == 0) {                    /* frame 0: joins */
        out[o++] = 2;
        out[o++] = 0; out[o++] = 0; out[o++] = 1; out[o++] = 'a';
        out[o++] = 0; out[o++] = 1; out[o++] = 2; out[o++] = 'b'; out[o++] = 'b';
    }
    return o;
}

static void deliver_live(relay_client_t *c, uint32_t n)
{
    uint8_t buf[128];
    size_t length = encode_frame(n, buf);
    rc_client_on_message(c, RC_STREAM, buf, length);
}

static void deliver_block(relay_client_t *c, uint32_t first, uint32_t end)
{
    static uint8_t raw[1 << 20], block[1 << 20];
    uint8_t frame[128];
    mp_writer w;
    uLongf compressed = sizeof block;
    uint32_t n;
    mp_writer_init(&w, raw, sizeof raw);
    mp_write_array(&w, 2);
    mp_write_uint(&w, first);
    mp_write_array(&w, end - first);
    for (n = first; n < end; n++) {
        size_t length = encode_frame(n, frame);
        mp_write_bin(&w, frame, length);
    }
    if (w.overflow || compress2(block, &compressed, raw, w.length, 6) != Z_OK) {
        printf("test bug: block\n");
        exit(2);
    }
    rc_client_on_block(c, block, compressed);
}

/* Takes up to `count` frames, checking each against the room; returns how many. */
static uint32_t taken_total;
static int take(relay_client_t *c, int count)
{
    relay_frame_t f;
    int got = 0;
    while (got < count) {
        int status = relay_client_next_frame(c, &f);
        int s;
        CHECK(status >= 0);
        if (status <= 0)
            break;
        CHECK(f.number == taken_total);
        CHECK(f.slot_count == SLOTS);
        CHECK(f.event_count == (f.number == 0 ? 2u : 0u));
        for (s = 0; s < SLOTS + 1; s++) {
            uint8_t expected[2];
            const uint8_t *data;
            int length = s < SLOTS ? input_of(f.number, s, expected) : RELAY_NIL;
            int actual = relay_frame_input(c, (uint32_t)s, &data);
            CHECK(actual == length);
            if (length > 0 && actual == length)
                CHECK(memcmp(data, expected, 2) == 0);
        }
        if (f.number == 0) {
            relay_frame_event_t e;
            CHECK(relay_frame_event(c, 1, &e) == 0 && e.kind == RELAY_JOIN && e.slot == 1
                  && e.name_length == 2 && memcmp(e.name, "bb", 2) == 0);
        }
        taken_total++;
        got++;
    }
    return got;
}

static relay_client_t *make_client(uint32_t ring_count, uint32_t ring_bytes, uint32_t history)
{
    relay_client_config_t config;
    relay_client_t *c;
    relay_client_default_config(&config);
    config.max_message_size = 1024;
    config.frame_buffer_bytes = ring_bytes;
    config.frame_buffer_count = ring_count;
    config.max_history_size = history;
    config.event_queue = 64;
    c = relay_client_create(&config);
    if (c == NULL || relay_client_connect(c, "room", "player", 0, NULL, 0.0) != 0) {
        printf("cannot create a client\n");
        exit(2);
    }
    taken_total = 0;
    return c;
}

static void welcome(relay_client_t *c, uint32_t next_frame, const char *state)
{
    uint8_t buf[256];
    mp_writer w;
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 2);
    mp_write_uint(&w, 20);
    mp_write_map(&w, 8);
    mp_write_str(&w, "room", 4); mp_write_str(&w, "room", 4);
    mp_write_str(&w, "player", 6); mp_write_str(&w, "player", 6);
    mp_write_str(&w, "slot", 4); mp_write_uint(&w, 0);
    mp_write_str(&w, "tick_rate", 9); mp_write_uint(&w, 30);
    mp_write_str(&w, "state", 5); mp_write_str(&w, state, strlen(state));
    mp_write_str(&w, "next_frame", 10); mp_write_uint(&w, next_frame);
    mp_write_str(&w, "history", 7); mp_write_uint(&w, next_frame);
    mp_write_str(&w, "spectator", 9); mp_write_bool(&w, 0);
    rc_client_on_message(c, RC_CONTROL, buf, w.length);
}

/* ---- merging ---- */

static void test_orders(void)
{
    /* history 0..19 as a block, live 20..39; six arrival orders of three parts, a frame
     * before WELCOME, catch-up overlapping live */
    int order;
    for (order = 0; order < 6; order++) {
        static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
        relay_client_t *c = make_client(64, 4096, 65536);
        int k;
        uint32_t n;
        rc_client_on_connected(c);
        for (k = 0; k < 3; k++) {
            switch (orders[order][k]) {
            case 0: deliver_block(c, 0, 20); break;
            case 1: for (n = 20; n < 30; n++) deliver_live(c, n); break;
            case 2: welcome(c, 20, "running"); break;
            }
            take(c, 7);
        }
        for (n = 30; n < 40; n++) {
            deliver_live(c, n);
            if (n == 35)
                deliver_block(c, 10, 36);         /* a catch-up repeating frames */
        }
        take(c, 1000);
        CHECK(taken_total == 40);
        CHECK(relay_client_have(c) == 39);
        relay_client_destroy(c);
    }
}

static uint32_t rnd_state = 12345;
static uint32_t rnd(uint32_t n)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return (rnd_state >> 8) % n;
}

static void test_random(void)
{
    int round;
    for (round = 0; round < 200; round++) {
        /* a small ring so live frames get dropped and blocks have to repair them */
        relay_client_t *c = make_client(4 + rnd(40), 1024 + rnd(2048), 1 << 20);
        uint32_t closed = 0, total = 200 + rnd(200);
        int64_t last_have = -1;
        relay_client_stats_t stats;
        rc_client_on_connected(c);
        if (rnd(2))
            welcome(c, 0, "waiting");
        while (closed < total) {
            uint32_t what = rnd(10);
            if (what < 6) {
                deliver_live(c, closed++);
            } else if (what == 6) {
                int64_t have = relay_client_have(c);
                uint32_t first = (uint32_t)rnd((uint32_t)(have + 2));
                if (first < closed)
                    deliver_block(c, first, closed);
            } else {
                take(c, (int)rnd(8));
            }
            {
                int64_t have = relay_client_have(c);
                CHECK(have >= (int64_t)taken_total - 1);
                CHECK(have >= last_have || relay_client_next_frame_number(c) > 0);
                last_have = have;
            }
        }
        /* the relay repairs whatever is missing, as catch-up does */
        while (taken_total < total) {
            int64_t have = relay_client_have(c);
            if (have + 1 < (int64_t)total)
                deliver_block(c, (uint32_t)(have + 1), total);
            take(c, 1000);
        }
        CHECK(taken_total == total);
        relay_client_get_stats(c, &stats);
        CHECK(stats.frames_received == total);
        relay_client_destroy(c);
    }
}

static void test_bounds_and_reconnect(void)
{
    relay_client_t *c = make_client(32, 1024, 65536);
    relay_client_stats_t stats;
    uint32_t n;
    for (n = 0; n < 100; n++)             /* frames before WELCOME are kept */
        deliver_live(c, n);
    relay_client_get_stats(c, &stats);
    CHECK(stats.live_frames_dropped == 68);
    CHECK(relay_client_have(c) == 31);
    take(c, 10);
    /* a reconnect keeps next and the buffers; the relay sends history from 0 again */
    CHECK(relay_client_reconnect(c, NULL, 1.0) == 0);
    rc_client_on_connected(c);
    for (n = 120; n < 130; n++)           /* live from the new open frame */
        deliver_live(c, n);
    welcome(c, 120, "running");
    CHECK(relay_client_have(c) == 31);
    deliver_block(c, 0, 120);
    CHECK(relay_client_have(c) == 129);
    take(c, 1000);
    CHECK(taken_total == 130);
    relay_client_get_stats(c, &stats);
    CHECK(stats.frames_received == 130);
    CHECK(stats.frames_duplicate >= 32);
    relay_client_destroy(c);

    /* a new block while an older one is still unread: both kept */
    c = make_client(8, 1024, 65536);
    deliver_block(c, 0, 100);
    take(c, 10);
    for (n = 100; n < 108; n++)
        deliver_live(c, n);
    for (n = 108; n < 200; n++)           /* dropped: ring full */
        deliver_live(c, n);
    deliver_block(c, 108, 200);           /* catch-up from have + 1 */
    CHECK(relay_client_have(c) == 199);
    take(c, 1000);
    CHECK(taken_total == 200);
    relay_client_destroy(c);

    /* a long history in many consecutive blocks, none taken yet: one run, nothing dropped */
    c = make_client(8, 1024, 1 << 20);
    for (n = 0; n < 30; n++)
        deliver_block(c, n * 20, n * 20 + 20 + (n % 3 == 0 ? 5 : 0));
    CHECK(c->segment_count == 1);
    CHECK(relay_client_have(c) == 599);
    take(c, 1000);
    CHECK(taken_total == 600);
    relay_client_destroy(c);

    /* a block that does not fit the history buffer ends the stream with the reason; the
     * frames already held are still taken, then the stream reports the break */
    c = make_client(8, 1024, 2048);
    rc_client_on_connected(c);
    deliver_block(c, 0, 50);
    deliver_block(c, 50, 400);
    CHECK(relay_client_have(c) == 49);
    {
        relay_event_t e;
        relay_frame_t f;
        int saw = 0;
        while (relay_client_poll_event(c, &e) == 1)
            if (e.type == RELAY_EVENT_DISCONNECTED && strcmp(e.code, "history_too_large") == 0)
                saw++;
        CHECK(saw == 1);
        CHECK(!relay_client_finished(c));
        take(c, 50);
        CHECK(taken_total == 50);
        CHECK(relay_client_next_frame(c, &f) == RELAY_ESTATE);
        CHECK(relay_client_finished(c));
    }
    relay_client_destroy(c);
}

static void test_bad_frame(void)
{
    relay_client_t *c = make_client(8, 1024, 4096);
    relay_frame_t f;
    relay_event_t e;
    uint8_t buf[128];
    size_t length = encode_frame(0, buf);
    int saw = 0;
    rc_client_on_connected(c);
    buf[length++] = 0;                    /* a trailing byte */
    rc_client_on_message(c, RC_STREAM, buf, length);
    CHECK(relay_client_have(c) == 0);
    CHECK(relay_client_next_frame(c, &f) < 0);
    CHECK(relay_client_next_frame(c, &f) < 0);
    while (relay_client_poll_event(c, &e) == 1)
        if (e.type == RELAY_EVENT_DISCONNECTED && strcmp(e.code, "bad_frame") == 0)
            saw++;
    CHECK(saw == 1);
    CHECK(relay_client_finished(c));
    relay_client_destroy(c);
}

/* ---- inputs ---- */

static int64_t sent_frames[64];
static int64_t sent_have[64];
static int sent_count;

static void on_send(void *context, int channel, const uint8_t *data, size_t length)
{
    mp_reader r;
    uint32_t count;
    uint64_t type, frame;
    mp_value payload;
    int64_t have;
    (void)context;
    if (channel != RC_STREAM)
        return;
    mp_reader_init(&r, data, length);
    if (mp_read_array(&r, &count) < 0 || count != 4 || mp_read_uint(&r, &type) < 0 || type != 5
        || mp_read_uint(&r, &frame) < 0 || mp_read(&r, &payload) < 0 || payload.type != MP_BIN
        || mp_read_int(&r, &have) < 0) {
        printf("FAIL: a bad INPUT\n");
        failures++;
        return;
    }
    if (sent_count < 64) {
        sent_frames[sent_count] = (int64_t)frame;
        sent_have[sent_count] = have;
    }
    sent_count++;
}

static void advise(relay_client_t *c, uint32_t frames)
{
    uint8_t buf[32];
    mp_writer w;
    mp_writer_init(&w, buf, sizeof buf);
    mp_write_array(&w, 5);
    mp_write_uint(&w, 25);
    mp_write_uint(&w, frames);
    mp_write_uint(&w, 100);
    mp_write_uint(&w, 0);
    mp_write_uint(&w, 150);
    rc_client_on_message(c, RC_CONTROL, buf, w.length);
}

static int sends(relay_client_t *c, int64_t from, int64_t to)
{
    int before = sent_count, result;
    int64_t f;
    result = relay_client_send_input(c, (const uint8_t *)"x", 1);
    if (result != sent_count - before)
        return 0;
    for (f = from; f <= to; f++)
        if (before + (f - from) >= 64 || sent_frames[before + (f - from)] != f)
            return 0;
    return result == (to >= from ? (int)(to - from + 1) : 0);
}

static void test_inputs(void)
{
    {
        relay_client_config_t config;
        relay_client_t *c;
        relay_client_default_config(&config);
        config.auto_input_delay = 1;
        c = relay_client_create(&config);
        CHECK(c != NULL);
        rc_client_set_send_hook(c, on_send, NULL);
        CHECK(relay_client_send_input(c, (const uint8_t *)"x", 1) == RELAY_ESTATE);
        CHECK(relay_client_connect(c, "room", "player", 0, NULL, 0.0) == 0);
        rc_client_on_connected(c);
        welcome(c, 0, "waiting");
        taken_total = 0;
        CHECK(sends(c, 0, 1));                 /* start: S .. S+d-1 */
        CHECK(sent_have[0] == -1);
        CHECK(sends(c, 2, 1));                 /* nothing new until a frame is taken */
        deliver_live(c, 0);
        take(c, 1);
        CHECK(sends(c, 2, 2));
        CHECK(sent_have[sent_count - 1] == 0);
        advise(c, 4);                          /* a rise fills the frames in between */
        deliver_live(c, 1);
        take(c, 1);
        CHECK(sends(c, 3, 5));
        CHECK(relay_client_input_delay(c) == 4);
        advise(c, 2);                          /* a fall: nothing until the target passes */
        deliver_live(c, 2);
        take(c, 1);
        CHECK(sends(c, 6, 5));
        deliver_live(c, 3);
        take(c, 1);
        CHECK(sends(c, 6, 5));
        deliver_live(c, 4);
        take(c, 1);
        CHECK(sends(c, 6, 6));
        /* buffered frames raise have */
        deliver_live(c, 5);
        deliver_live(c, 6);
        CHECK(relay_client_have(c) == 6);
        relay_client_destroy(c);

        /* a late joiner: frames before WELCOME.next_frame are closed */
        c = relay_client_create(&config);
        rc_client_set_send_hook(c, on_send, NULL);
        CHECK(relay_client_connect(c, "room", "player", 0, NULL, 0.0) == 0);
        rc_client_on_connected(c);
        welcome(c, 500, "running");
        CHECK(sends(c, 500, 501));
        CHECK(relay_client_send_input(c, NULL, 300) == RELAY_EINVAL);   /* too large */
        relay_client_destroy(c);
    }
}

static void test_config(void)
{
    relay_client_config_t config;
    relay_client_default_config(&config);
    CHECK(relay_client_memory_size(&config) > config.max_history_size);
    config.input_delay = 0;
    CHECK(relay_client_memory_size(&config) == 0 && relay_client_create(&config) == NULL);
    relay_client_default_config(&config);
    config.mtu = 100;
    CHECK(relay_client_create(&config) == NULL);
    CHECK(relay_client_create(NULL) == NULL);
}

int main(void)
{
    test_config();
    test_orders();
    test_random();
    test_bounds_and_reconnect();
    test_bad_frame();
    test_inputs();
    if (failures) {
        printf("test_client: %d failures\n", failures);
        return 1;
    }
    printf("test_client: ok\n");
    return 0;
}
