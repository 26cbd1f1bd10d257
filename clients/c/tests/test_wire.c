/* test_wire.c - the datagram codec: prefix rules, varints, records, control packets, sealing. */
#include "crypto.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond) do { if (!(cond)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static void test_prefix_rules_reject_in_protocol_order(void)
{
    uint8_t p[64] = { 0x52, 0x4C, 1, 6 };
    CHECK(rc_wire_check(p, 3) == -RC_DROP_TRUNCATED);
    CHECK(rc_wire_check(p, 19) == -RC_DROP_TRUNCATED);
    CHECK(rc_wire_check(p, 20) == RC_PT_DATA);
    p[0] = 0x53;
    CHECK(rc_wire_check(p, 20) == -RC_DROP_BAD_MAGIC);
    p[0] = 0x52; p[2] = 2;
    CHECK(rc_wire_check(p, 20) == -RC_DROP_BAD_VERSION);
    p[2] = 1; p[3] = 10;
    CHECK(rc_wire_check(p, 20) == -RC_DROP_UNKNOWN_TYPE);
    p[3] = RC_PT_CHALLENGE;
    CHECK(rc_wire_check(p, 28) == RC_PT_CHALLENGE);
    CHECK(rc_wire_check(p, 29) == -RC_DROP_BAD_LENGTH);
    p[3] = RC_PT_CONNECT_REQUEST;
    CHECK(rc_wire_check(p, 63) == -RC_DROP_BAD_LENGTH);
    CHECK(rc_wire_check(p, 64) == RC_PT_CONNECT_REQUEST);
    p[8] = 2;
    CHECK(rc_wire_check(p, 64) == -RC_DROP_BAD_TOKEN);
}

static void test_varint_uses_one_or_two_bytes(void)
{
    uint8_t b[4];
    size_t v, next;
    CHECK(rc_varint_write(b, 127) == 1 && b[0] == 0x7F);
    CHECK(rc_varint_write(b, 128) == 2 && b[0] == 0x80 && b[1] == 0x01);
    CHECK(rc_varint_write(b, 300) == 2 && b[0] == 0xAC && b[1] == 0x02);
    CHECK(rc_varint_write(b, 16383) == 2 && b[0] == 0xFF && b[1] == 0x7F);
    b[0] = 0x83; b[1] = 0x00;
    CHECK(rc_varint_read(b, 0, 2, &v, &next) == RC_OK && v == 3 && next == 2);
    b[1] = 0x80;
    CHECK(rc_varint_read(b, 0, 2, &v, &next) == RC_DROP_MALFORMED_RECORD);
    CHECK(rc_varint_read(b, 0, 1, &v, &next) == RC_DROP_MALFORMED_RECORD);
}

static void test_records_round_trip(void)
{
    uint8_t buf[256], bits[2] = { 0x0A, 0x80 };
    size_t pos = 0, next;
    rc_record r;
    pos += rc_message_record_write(buf + pos, 31, 65535, (const uint8_t *)"hi", 2);
    pos += rc_fragment_record_write(buf + pos, 0, 7, 1, 3, (const uint8_t *)"abcd", 4);
    pos += rc_block_slice_record_write(buf + pos, 2, 1, 3, 10, (const uint8_t *)"\4\5\6\7", 4);
    pos += rc_block_ack_record_write(buf + pos, 2, 3, bits, 2);
    CHECK(rc_record_parse(buf, 0, pos, &r, &next) == RC_OK);
    CHECK(r.kind == RC_RK_MESSAGE && r.channel == 31 && r.msg_id == 65535 && r.length == 2);
    CHECK(rc_record_parse(buf, next, pos, &r, &next) == RC_OK);
    CHECK(r.kind == RC_RK_FRAGMENT && r.fragment_index == 1 && r.fragment_count == 3 && r.length == 4);
    CHECK(rc_record_parse(buf, next, pos, &r, &next) == RC_OK);
    CHECK(r.kind == RC_RK_BLOCK_SLICE && r.block_id == 2 && r.slice_count == 3 && r.block_size == 10);
    CHECK(rc_record_parse(buf, next, pos, &r, &next) == RC_OK);
    CHECK(r.kind == RC_RK_BLOCK_ACK && r.base == 3 && r.length == 2 && r.payload[1] == 0x80);
    CHECK(next == pos);
}

static void test_bad_records_are_named(void)
{
    uint8_t frag[] = { 0x20, 0, 0, 0, 1, 0 }, kind[] = { 0xE0 }, cut[] = { 0x00, 0, 0, 5, 'a' };
    uint8_t slice[] = { 0x40, 0, 0, 3, 0, 3, 0, 10, 0, 0, 0, 0 };
    rc_record r;
    size_t next;
    CHECK(rc_record_parse(frag, 0, sizeof frag, &r, &next) == RC_DROP_BAD_FRAGMENT);
    CHECK(rc_record_parse(kind, 0, sizeof kind, &r, &next) == RC_DROP_UNKNOWN_RECORD_KIND);
    CHECK(rc_record_parse(cut, 0, sizeof cut, &r, &next) == RC_DROP_MALFORMED_RECORD);
    CHECK(rc_record_parse(slice, 0, sizeof slice, &r, &next) == RC_DROP_BAD_BLOCK_SLICE);
}

static void test_sequence_arithmetic_wraps(void)
{
    CHECK(rc_seq_diff(0, 65535) == 1 && rc_seq_newer(0, 65535));
    CHECK(rc_seq_diff(65535, 0) == -1 && !rc_seq_newer(65535, 0));
    CHECK(!rc_seq_newer(32768, 0) && !rc_seq_newer(0, 32768));
}

static void test_sealed_packets_open_only_with_their_key_and_counter(void)
{
    uint8_t key[32], other[32], buf[128], out[128], data[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    size_t n;
    memset(key, 7, 32);
    memset(other, 8, 32);
    n = rc_write_path_sealed(buf, RC_PT_PATH_RESPONSE, 99, data, 70000, key);
    CHECK(n == RC_PATH_SECURE_SIZE && rc_wire_check(buf, n) == RC_PT_PATH_RESPONSE);
    CHECK(rc_get_u16(buf + 8) == (uint16_t)70000);
    CHECK(rc_open_packet(out, buf, n, 10, RC_PT_PATH_RESPONSE, 70000, key) == 0);
    CHECK(memcmp(out + 10, data, 8) == 0);
    CHECK(rc_open_packet(out, buf, n, 10, RC_PT_PATH_RESPONSE, 70001, key) != 0);
    CHECK(rc_open_packet(out, buf, n, 10, RC_PT_PATH_RESPONSE, 70000, other) != 0);
    CHECK(rc_open_packet(out, buf, n, 10, RC_PT_PATH_CHALLENGE, 70000, key) != 0);
    n = rc_write_disconnect_sealed(buf, 5, 3, 2, key);
    CHECK(n == RC_DISCONNECT_SECURE_SIZE);
    CHECK(rc_open_packet(out, buf, n, 10, RC_PT_DISCONNECT, 2, key) == 0 && out[10] == 3);
}

static void test_counter_reconstruction_follows_the_largest(void)
{
    CHECK(rc_counter_from_seq(0, 0, 9) == 9);
    CHECK(rc_counter_from_seq(1, 0xFFFF, 0) == 0x10000);
    CHECK(rc_counter_from_seq(1, 0x10002, 0xFFFE) == 0xFFFE);
    CHECK(rc_counter_from_seq(1, 0x2FFF0, 0x0005) == 0x30005);
}

static void test_reason_text_uses_names_or_numbers(void)
{
    char text[32];
    rc_reason_text(text, sizeof text, "remote:", 0);
    CHECK(strcmp(text, "remote:closed") == 0);
    rc_reason_text(text, sizeof text, "refused:", 12);
    CHECK(strcmp(text, "refused:token_unsupported") == 0);
    rc_reason_text(text, sizeof text, "refused:", 13);
    CHECK(strcmp(text, "refused:source_session_limit") == 0);
    rc_reason_text(text, sizeof text, "refused:", 14);      /* a code from a newer relay */
    CHECK(strcmp(text, "refused:14") == 0);
    rc_reason_text(text, sizeof text, "remote:", 200);
    CHECK(strcmp(text, "remote:200") == 0);
    CHECK(strcmp(rc_drop_name(RC_DROP_PATH_UNVALIDATED), "path_unvalidated") == 0);
}

int main(void)
{
    if (rc_crypto_init() != 0)
        return 1;
    test_prefix_rules_reject_in_protocol_order();
    test_varint_uses_one_or_two_bytes();
    test_records_round_trip();
    test_bad_records_are_named();
    test_sequence_arithmetic_wraps();
    test_sealed_packets_open_only_with_their_key_and_counter();
    test_counter_reconstruction_follows_the_largest();
    test_reason_text_uses_names_or_numbers();
    if (failures)
        printf("%d failure(s)\n", failures);
    return failures != 0;
}
