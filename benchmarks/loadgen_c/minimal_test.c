/*
 * minimal_test.c - the minimal client (minimal.c) against the wire's byte-exact examples.
 *
 * stdin: one vector a line, "<name> <hex>" (tests/bench/test_loadgen_c.py writes every vector
 * of tests/vectors/{handshake,data,malformed}.json); stdout: one JSON object a line, what the
 * minimal client's decoder made of it (the vector's "decoded" keys, or "drop": the reason),
 * plus for the packets it answers or writes what it writes:
 *   challenge -> "response": the CONNECT_RESPONSE of a client whose connect_id matches;
 *   accept    -> "first_data": the first DATA of a client that was challenged (JOIN on CONTROL);
 *   data with MESSAGE / BLOCK_ACK records only -> "reencoded": the header written by
 *              mc_fill_header from the same ack state, then the same records.
 * Then the checks of its own on the examples of docs/RELAY_PROTOCOL.md section 15 and of the
 * steady-state loop (FRAME in order, copies deduplicated, acks, INPUT copies, blocks), and a
 * last line "minimal_test: ok" (exit 1 on a failed check).
 */
#include "checks.h"
#include "messages.h"
#include "minimal.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "minimal_test: %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

static size_t from_hex(const char *text, uint8_t *out, size_t cap)
{
    size_t n = 0;
    while (text[0] && text[1] && n < cap) {
        unsigned v;
        if (sscanf(text, "%2x", &v) != 1)
            break;
        out[n++] = (uint8_t)v;
        text += 2;
    }
    return n;
}

static void print_hex(const char *key, const uint8_t *p, size_t n)
{
    size_t i;
    printf(", \"%s\": \"", key);
    for (i = 0; i < n; i++)
        printf("%02x", p[i]);
    putchar('"');
}

static void print_reason(int code)
{
    const char *name = rc_reason_name(code);
    if (name)
        printf(", \"reason\": \"%s\"", name);
    else
        printf(", \"reason\": %d", code);
}

static const char *const type_names[] = {
    "", "connect_request", "challenge", "connect_response", "accept", "refuse", "data",
    "disconnect", "path_challenge", "path_response"
};

/* ---- a sink that records what the client delivered ---- */

static struct {
    int frames, controls;
    uint8_t last[256];
    size_t last_length;
} got;

static void sink_control(void *c, mc_player *p, const uint8_t *d, size_t n)
{
    (void)c; (void)p;
    got.controls++;
    memcpy(got.last, d, n < sizeof got.last ? n : sizeof got.last);
    got.last_length = n;
}

static void sink_frame(void *c, mc_player *p, const uint8_t *d, size_t n, double now)
{
    (void)c; (void)p; (void)now;
    got.frames++;
    memcpy(got.last, d, n < sizeof got.last ? n : sizeof got.last);
    got.last_length = n;
}

static const mc_sink sink = {sink_control, sink_frame, NULL};

static const uint8_t join_bytes[] = {0x94, 0x01, 0xA7, 'l', 'o', 'b', 'b', 'y', '-', '1',
                                     0xA5, 'a', 'l', 'i', 'c', 'e', 0xC2};

/* ---- the vectors ---- */

static void vector(const char *name, const uint8_t *d, size_t n)
{
    mc_parsed v;
    int type = mc_parse(d, n, &v), k;
    printf("{\"name\": \"%s\"", name);
    if (type < 0) {
        printf(", \"drop\": \"%s\"}\n", rc_drop_name(-type));
        return;
    }
    printf(", \"type\": \"%s\"", type_names[type]);
    switch (type) {
    case RC_PT_CONNECT_REQUEST:
        printf(", \"connect_id\": %u", v.id);
        break;
    case RC_PT_CHALLENGE:
    case RC_PT_CONNECT_RESPONSE:
        printf(", \"connect_id\": %u, \"cookie_time\": %u", v.id, v.cookie_time);
        print_hex("cookie_mac", d + 12, 16);
        if (type == RC_PT_CONNECT_RESPONSE)
            printf(", \"ack_delay_ms\": %u", v.ack_delay_ms);
        if (type == RC_PT_CHALLENGE) {
            mc_player p;
            uint8_t out[MC_MTU];
            size_t length;
            mc_init(&p, 0);
            mc_connect(&p, v.id, join_bytes, sizeof join_bytes, 0.0);
            length = mc_next_datagram(&p, out, 0.0);             /* CONNECT_REQUEST */
            CHECK(length == 64 && out[3] == RC_PT_CONNECT_REQUEST && rc_get_u32(out + 4) == v.id);
            CHECK(mc_receive(&p, d, n, 0.01, &sink) == 0 && p.state == MC_CHALLENGED);
            length = mc_next_datagram(&p, out, 0.01);
            print_hex("response", out, length);
        }
        break;
    case RC_PT_ACCEPT:
        printf(", \"connect_id\": %u, \"session_id\": %u, \"ack_delay_ms\": %u", v.id, v.session_id,
               v.ack_delay_ms);
        {
            mc_player p;
            uint8_t out[MC_MTU], challenge[28];
            size_t length;
            mc_init(&p, 0);
            mc_connect(&p, v.id, join_bytes, sizeof join_bytes, 0.0);
            rc_write_challenge(challenge, v.id, 1, (const uint8_t *)"0123456789abcdef");
            mc_receive(&p, challenge, sizeof challenge, 0.0, &sink);
            CHECK(mc_receive(&p, d, n, 0.02, &sink) == 0 && p.state == MC_CONNECTED);
            CHECK(mc_receive(&p, d, n, 0.02, &sink) == RC_DROP_DUPLICATE_PACKET);
            length = mc_next_datagram(&p, out, 0.02);
            print_hex("first_data", out, length);
        }
        break;
    case RC_PT_REFUSE:
        printf(", \"connect_id\": %u", v.id);
        print_reason(v.reason);
        break;
    case RC_PT_DISCONNECT:
        printf(", \"session_id\": %u", v.id);
        print_reason(v.reason);
        break;
    case RC_PT_PATH_CHALLENGE:
    case RC_PT_PATH_RESPONSE:
        printf(", \"session_id\": %u", v.id);
        print_hex("data", d + 8, 8);
        break;
    case RC_PT_DATA: {
        int plain = 1;
        printf(", \"session_id\": %u, \"seq\": %u, \"ack\": %u, \"ack_bits\": %u, "
               "\"send_time\": %u, \"echo_time\": %u, \"records\": [",
               v.id, v.seq, v.ack, v.ack_bits, v.send_time, v.echo_time);
        for (k = 0; k < v.record_count; k++) {
            const struct rc_record_view *r = &v.records[k];
            printf("%s{", k ? ", " : "");
            switch (r->kind) {
            case RC_RK_MESSAGE:
                printf("\"kind\": \"message\", \"channel\": %d, \"msg_id\": %u", r->channel, r->msg_id);
                print_hex("payload", r->payload, r->length);
                break;
            case RC_RK_FRAGMENT:
                printf("\"kind\": \"fragment\", \"channel\": %d, \"msg_id\": %u, "
                       "\"fragment_index\": %u, \"fragment_count\": %u", r->channel, r->msg_id,
                       r->fragment_index, r->fragment_count);
                print_hex("payload", r->payload, r->length);
                plain = 0;
                break;
            case RC_RK_BLOCK_SLICE:
                printf("\"kind\": \"block_slice\", \"block_id\": %u, \"slice_index\": %u, "
                       "\"slice_count\": %u, \"block_size\": %u", r->block_id, r->slice_index,
                       r->slice_count, r->block_size);
                print_hex("payload", r->payload, r->length);
                plain = 0;
                break;
            default:
                printf("\"kind\": \"block_ack\", \"block_id\": %u, \"base\": %u", r->block_id, r->base);
                print_hex("bitfield", r->payload, r->length);
                break;
            }
            putchar('}');
        }
        putchar(']');
        if (plain && (v.ack_bits || (v.ack == 0 && v.echo_time == 0))) {
            /* the header from the same state with mc_fill_header, then the same records */
            mc_player p;
            uint8_t out[20000];
            size_t pos = RC_DATA_HEADER_SIZE;
            double now = (v.send_time + 0.5) / 1000.0;
            mc_init(&p, 0);
            p.session_id = v.id;
            p.next_seq = v.seq;
            p.received_any = v.ack_bits != 0;
            p.recv_ack = v.ack;
            p.recv_bits = v.ack_bits;
            p.echo_send_time = v.echo_time;
            p.echo_arrival = now;
            mc_fill_header(&p, now, out);
            for (k = 0; k < v.record_count; k++) {
                const struct rc_record_view *r = &v.records[k];
                if (r->kind == RC_RK_MESSAGE)
                    pos += rc_message_record_write(out + pos, r->channel, r->msg_id, r->payload,
                                                   r->length);
                else
                    pos += rc_block_ack_record_write(out + pos, r->block_id, r->base, r->payload,
                                                     r->length);
            }
            print_hex("reencoded", out, pos);
        }
        break;
    }
    default:
        break;
    }
    puts("}");
}

/* ---- the steady-state loop, on crafted packets ---- */

static mc_player connected(void)
{
    mc_player p;
    uint8_t b[64], out[MC_MTU];
    mc_init(&p, 7);
    mc_connect(&p, 0x01020304, join_bytes, sizeof join_bytes, 0.0);
    mc_next_datagram(&p, out, 0.0);
    rc_write_challenge(b, 0x01020304, 1, (const uint8_t *)"0123456789abcdef");
    mc_receive(&p, b, 28, 0.0, &sink);
    mc_next_datagram(&p, out, 0.0);
    rc_write_accept(b, 0x01020304, 0x1A2B3C4D, 33, 0, NULL);
    mc_receive(&p, b, 14, 0.0, &sink);
    return p;
}

/* A relay DATA: seq, acking `ack` (bits), one MESSAGE per (channel, id, payload) given. */
static size_t relay_data(uint8_t *out, uint16_t seq, uint16_t ack, uint32_t bits, int records,
                         const int *channels, const uint16_t *ids, const uint8_t *const *payloads,
                         const size_t *lengths)
{
    rc_data_header h = {0x1A2B3C4D, seq, ack, bits, 0, 0};
    size_t pos = RC_DATA_HEADER_SIZE;
    int k;
    rc_wire_prefix(out, RC_PT_DATA);
    rc_data_header_write(out, &h);
    for (k = 0; k < records; k++)
        pos += rc_message_record_write(out + pos, channels[k], ids[k], payloads[k], lengths[k]);
    return pos;
}

static const uint8_t frame_1000[] = {0xC1, 0xE8, 0x07, 0x04, 0x03, 0x05, 0x02, 0x01, 0xFF, 0x02,
                                     0x00, 0x01, 0x01, 0x00, 0x02, 0x05, 'c', 'a', 'r', 'o', 'l'};
static const uint8_t frame_1001[] = {0xC1, 0xE9, 0x07, 0x03, 0x03, 0x07, 0x01, 0x02, 0x02, 0x00,
                                     0x00, 0x02, 0x00, 0x02};

static void frames_of_the_protocol_examples(void)
{
    mc_player p;
    const rf_frame *f;
    int kind, slot;
    const char *name;
    uint32_t name_length;
    mc_init(&p, 0);
    CHECK(mc_decode_frame(&p, frame_1000, sizeof frame_1000, &f) == RF_OK);
    CHECK(f->number == 1000 && f->slot_count == 3 && f->length[0] == 2 && f->length[1] == -1);
    CHECK(memcmp(f->arena + f->offset[0], "\x01\xff", 2) == 0);
    CHECK(memcmp(f->arena + f->offset[2], "\x00\x01", 2) == 0 && f->event_count == 1);
    CHECK(rf_frame_event(f, 0, &kind, &slot, &name, &name_length) == 0 && kind == 0 && slot == 2
          && name_length == 5 && memcmp(name, "carol", 5) == 0);
    /* frame 1001 resolves slot 0's same bit against the compact copy of frame 1000 */
    CHECK(mc_decode_frame(&p, frame_1001, sizeof frame_1001, &f) == RF_OK);
    CHECK(f->number == 1001 && f->slot_count == 3 && f->length[0] == 2 && f->length[1] == 2);
    CHECK(memcmp(f->arena + f->offset[0], "\x01\xff", 2) == 0);
    CHECK(memcmp(f->arena + f->offset[1], "\x00\x00", 2) == 0 && (f->synthesized[0] & 2));
    CHECK(memcmp(f->arena + f->offset[2], "\x00\x02", 2) == 0);
    /* without frame 1000 the same bit cannot be resolved: an error, not a guess */
    mc_init(&p, 0);
    CHECK(mc_decode_frame(&p, frame_1001, sizeof frame_1001, &f) == RF_NEEDS_PREVIOUS);
}

static void input_datagram_of_the_protocol_example(void)
{
    /* RELAY_PROTOCOL.md section 15's INPUT datagram, with this loader's 16-byte payload:
     * session 0x1A2B3C4D, seq 1234, acking 1240 and the 31 before, send_time 0x5000, echo
     * 0x4FD0, INPUT for frame 1002 with have 1000 as message 1003 of channel 1. */
    static const uint8_t header[] = {0x52, 0x4C, 0x01, 0x06, 0x4D, 0x3C, 0x2B, 0x1A, 0xD2, 0x04,
                                     0xD8, 0x04, 0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x50, 0xD0, 0x4F,
                                     0x01, 0xEB, 0x03, 0x1A, 0x94, 0x05, 0xCD, 0x03, 0xEA, 0xC4,
                                     0x10};
    uint8_t expected[64], out[MC_MTU], payload[LG_INPUT_SIZE];
    double now = (0x15000 + 0.5) / 1000.0;
    mc_player p = connected();
    size_t length;
    p.next_seq = 1234;
    p.received_any = 1;
    p.recv_ack = 1240;
    p.recv_bits = 0xFFFFFFFF;
    p.echo_send_time = 0x4FD0;
    p.echo_arrival = now;
    p.control_due = 0;
    p.control_acked = 1;
    p.last_sent = now;
    p.input_next = p.input_acked = p.input_unsent = 1003;
    CHECK(mc_send_input(&p, 1002, 1000) == 0);
    length = mc_next_datagram(&p, out, now);
    memcpy(expected, header, sizeof header);
    lg_input_payload(7, 1002, payload);
    memcpy(expected + sizeof header, payload, sizeof payload);
    memcpy(expected + sizeof header + sizeof payload, "\xCD\x03\xE8", 3);
    CHECK(length == sizeof header + sizeof payload + 3);
    CHECK(memcmp(out, expected, sizeof header + sizeof payload + 3) == 0);
    CHECK(mc_next_datagram(&p, out, now) == 0);          /* nothing else due */
}

static void steady_state(void)
{
    mc_player p = connected();
    uint8_t d[MC_MTU], out[MC_MTU];
    mc_parsed v;
    size_t n, length;
    int channels[3] = {1, 1, 0};
    uint16_t ids[3];
    const uint8_t *payloads[3] = {frame_1000, frame_1000, join_bytes};
    size_t lengths[3] = {sizeof frame_1000, sizeof frame_1000, sizeof join_bytes};
    double now = 1.0;

    /* the JOIN goes first, on CONTROL as message 0 */
    length = mc_next_datagram(&p, out, now);
    CHECK(mc_parse(out, length, &v) == RC_PT_DATA && v.seq == 0 && v.ack_bits == 0);
    CHECK(v.record_count == 1 && v.records[0].channel == 0 && v.records[0].msg_id == 0
          && v.records[0].length == sizeof join_bytes);
    /* FRAME 0 of STREAM and a redundant copy of it in one packet, which acks our packet 0 */
    memset(&got, 0, sizeof got);
    ids[0] = 0; ids[1] = 0;
    n = relay_data(d, 0, 0, 1, 2, channels, ids, payloads, lengths);
    CHECK(mc_receive(&p, d, n, now + 0.01, &sink) == 0);
    CHECK(got.frames == 1 && p.stream_expected == 1 && p.control_acked);
    CHECK(p.srtt >= 0);                                   /* an RTT sample */
    /* the same datagram again: a duplicate packet, nothing delivered */
    CHECK(mc_receive(&p, d, n, now + 0.01, &sink) == RC_DROP_DUPLICATE_PACKET && got.frames == 1);
    /* message 2 before 1: refused (no reassembly budget), the packet is not acknowledged */
    ids[0] = 2;
    n = relay_data(d, 1, 0, 1, 1, channels, ids, payloads, lengths);
    CHECK(mc_receive(&p, d, n, now + 0.02, &sink) == RC_DROP_REASSEMBLY_FULL);
    CHECK(got.frames == 1 && p.refused == 1 && p.recv_ack == 0);
    /* an ack is owed (the FRAME packet had a record): an ack-only DATA at ack_delay */
    CHECK(mc_next_datagram(&p, out, now + 0.02) == 0);
    length = mc_next_datagram(&p, out, now + 0.01 + MC_ACK_DELAY);
    CHECK(mc_parse(out, length, &v) == RC_PT_DATA && v.record_count == 0 && v.ack == 0
          && v.ack_bits == 1 && v.seq == 1);
    /* INPUTs: the new one and, as copies, the unacknowledged ones before it */
    CHECK(mc_send_input(&p, 3, 1) == 0);
    length = mc_next_datagram(&p, out, now + 0.05);
    CHECK(mc_parse(out, length, &v) == RC_PT_DATA && v.record_count == 1 && v.records[0].msg_id == 0);
    CHECK(mc_send_input(&p, 4, 2) == 0);
    length = mc_next_datagram(&p, out, now + 0.08);
    CHECK(mc_parse(out, length, &v) == RC_PT_DATA && v.seq == 3 && v.record_count == 2
          && v.records[0].msg_id == 0 && v.records[1].msg_id == 1 && v.records[1].channel == 1);
    /* the relay acks packet 3 (bits: 3, 2): both INPUTs retire; nothing left to resend */
    ids[0] = 1;
    n = relay_data(d, 2, 3, 3, 1, channels, ids, payloads, lengths);
    CHECK(mc_receive(&p, d, n, now + 0.1, &sink) == 0);
    CHECK(p.input_acked == 2 && p.stream_deadline < 0 && got.frames == 2);
    /* an unacknowledged INPUT is resent on its RTO */
    CHECK(mc_send_input(&p, 5, 3) == 0);
    length = mc_next_datagram(&p, out, now + 0.11);
    CHECK(length > 0 && p.stream_deadline > now + 0.11);
    mc_handle_timeout(&p, p.stream_deadline + 0.001);
    length = mc_next_datagram(&p, out, p.stream_deadline);
    CHECK(mc_parse(out, length, &v) == RC_PT_DATA && v.record_count == 1 && v.records[0].msg_id == 2
          && p.stream_resends == 1);
    /* a DISCONNECT from the relay closes it */
    rc_write_disconnect(d, 0x1A2B3C4D, RC_REASON_KICKED);
    CHECK(mc_receive(&p, d, RC_DISCONNECT_SIZE, now + 0.2, &sink) == 0 && p.state == MC_CLOSED);
    {
        char text[64];
        CHECK(strcmp(mc_close_text(&p, text, sizeof text), "remote:kicked") == 0);
    }
}

static void blocks(void)
{
    mc_player p = connected();
    uint8_t d[MC_MTU], out[64];
    rc_data_header h = {0x1A2B3C4D, 0, 0, 0, 0, 0};
    size_t n, length;
    mc_parsed v;
    int k;
    /* a 20-slice block with slices 1..3 received: BLOCK_ACK base 0, bitfield 0E 00 00 (PROTOCOL
     * 6.6) */
    for (k = 1; k <= 3; k++) {
        static const uint8_t slice[10];
        rc_wire_prefix(d, RC_PT_DATA);
        h.seq = (uint16_t)k;
        rc_data_header_write(d, &h);
        n = RC_DATA_HEADER_SIZE + rc_block_slice_record_write(d + RC_DATA_HEADER_SIZE, 0,
                                                               (uint16_t)k, 20, 200, slice, 10);
        CHECK(mc_receive(&p, d, n, 1.0, &sink) == 0);
    }
    CHECK(p.blocks == 1 && p.block_owed == 1);
    length = mc_write_block_ack(&p, out);
    CHECK(length == 9 && memcmp(out, "\x60\x00\x00\x00\x00\x03\x0e\x00\x00", 9) == 0);
    /* a slice of a block newer than the one expected is refused */
    rc_wire_prefix(d, RC_PT_DATA);
    h.seq = 9;
    rc_data_header_write(d, &h);
    n = RC_DATA_HEADER_SIZE + rc_block_slice_record_write(d + RC_DATA_HEADER_SIZE, 1, 0, 1, 1,
                                                           (const uint8_t *)"x", 1);
    CHECK(mc_receive(&p, d, n, 1.0, &sink) == RC_DROP_BAD_BLOCK_SLICE);
    /* the rest of the block: completed, acknowledged with base = slice_count, no bitfield */
    for (k = 0; k < 20; k++) {
        static const uint8_t slice[10];
        if (k >= 1 && k <= 3)
            continue;
        rc_wire_prefix(d, RC_PT_DATA);
        h.seq = (uint16_t)(10 + k);
        rc_data_header_write(d, &h);
        n = RC_DATA_HEADER_SIZE + rc_block_slice_record_write(d + RC_DATA_HEADER_SIZE, 0,
                                                               (uint16_t)k, 20, 200, slice, 10);
        CHECK(mc_receive(&p, d, n, 1.0, &sink) == 0);
    }
    CHECK(p.block_expected == 1 && p.block_owed == 2 && p.blocks == 1);
    length = mc_next_datagram(&p, d, 1.0);              /* JOIN + the completion ack */
    CHECK(mc_parse(d, length, &v) == RC_PT_DATA && v.record_count == 2
          && v.records[1].kind == RC_RK_BLOCK_ACK && v.records[1].block_id == 0
          && v.records[1].base == 20 && v.records[1].length == 0);
}

int main(void)
{
    char line[70000];
    static uint8_t data[40000];
    while (fgets(line, sizeof line, stdin)) {
        char *space = strchr(line, ' ');
        size_t n;
        if (!space)
            continue;
        *space = 0;
        space[1 + strcspn(space + 1, "\r\n")] = 0;
        n = from_hex(space + 1, data, sizeof data);
        vector(line, data, n);
    }
    frames_of_the_protocol_examples();
    input_datagram_of_the_protocol_example();
    steady_state();
    blocks();
    if (failures) {
        fprintf(stderr, "minimal_test: %d checks failed\n", failures);
        return 1;
    }
    puts("minimal_test: ok");
    return 0;
}
