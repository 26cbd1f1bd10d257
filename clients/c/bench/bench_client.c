/*
 * bench_client.c - figures for the C client library (run by benchmarks/c_client.py):
 *   - bytes allocated per client (relay_client_memory_size, and what create really allocated);
 *   - allocations after create over a whole session (handshake, WELCOME, frames, acks), counted
 *     by interposing malloc/calloc/realloc for the whole process, so zlib and libsodium count too;
 *   - frames per second through the full receive path on one core: a DATA datagram carrying a
 *     FRAME goes into relay_client_receive, the frame comes out of relay_client_next_frame and
 *     every slot's input is read, the client's acks are drained.
 * The bench plays the relay with the library's own wire codec; the frames and relay messages
 * come from relay.protocol (a file written by the Python side), so they are the relay's bytes.
 *
 * usage: bench_client FRAMES_FILE
 * FRAMES_FILE: u32 message count, then per message u32 length + bytes: WELCOME, ROOM_STATE
 * running, then FRAME 0, 1, 2, ... (little-endian).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "relay_client.h"
#include "wire.h"

/* ---- allocation counting (glibc) ------------------------------------------------------------ */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static int counting;
static unsigned long allocations;

void *malloc(size_t size)
{
    if (counting) allocations++;
    return __libc_malloc(size);
}
void *calloc(size_t count, size_t size)
{
    if (counting) allocations++;
    return __libc_calloc(count, size);
}
void *realloc(void *pointer, size_t size)
{
    if (counting) allocations++;
    return __libc_realloc(pointer, size);
}
void free(void *pointer) { __libc_free(pointer); }

/* The library's own allocator hook: what create asked for. */
static size_t bytes_allocated;
static void *bench_allocate(void *context, size_t bytes)
{
    (void)context;
    bytes_allocated += bytes;
    return __libc_malloc(bytes);
}
static void bench_release(void *context, void *pointer)
{
    (void)context;
    __libc_free(pointer);
}

/* ---- the relay side --------------------------------------------------------------------------- */
typedef struct message { uint32_t length; uint8_t *data; } message;

static message *read_messages(const char *path, uint32_t *count)
{
    FILE *file = fopen(path, "rb");
    if (!file) { perror(path); exit(2); }
    uint8_t word[4];
    if (fread(word, 1, 4, file) != 4) exit(2);
    *count = rc_get_u32(word);
    message *messages = __libc_calloc(*count, sizeof *messages);
    for (uint32_t i = 0; i < *count; i++) {
        if (fread(word, 1, 4, file) != 4) exit(2);
        messages[i].length = rc_get_u32(word);
        messages[i].data = __libc_malloc(messages[i].length ? messages[i].length : 1);
        if (fread(messages[i].data, 1, messages[i].length, file) != messages[i].length) exit(2);
    }
    fclose(file);
    return messages;
}

typedef struct relay_side {
    uint32_t session_id;
    uint16_t seq;
    int have_client_seq;
    uint16_t client_seq;
    uint16_t msg_id[2];
} relay_side;

static double clock_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void deterministic_random(void *context, uint8_t *out, size_t length)
{
    (void)context;
    for (size_t i = 0; i < length; i++) out[i] = (uint8_t)(0x5A + i);
}

/* Reads every datagram the client has due and answers the handshake; DATA only moves acks. */
static void drain_client(relay_client_t *client, relay_side *relay, double now)
{
    uint8_t out[RELAY_MAX_DATAGRAM], reply[64];
    int length;
    while ((length = relay_client_next_datagram(client, out, sizeof out, now)) > 0) {
        int type = rc_wire_check(out, (size_t)length);
        if (type == RC_PT_CONNECT_REQUEST) {
            static const uint8_t mac[16] = {1, 2, 3};
            size_t n = rc_write_challenge(reply, rc_get_u32(out + 4), 1000, mac);
            relay_client_receive(client, reply, n, now);
        } else if (type == RC_PT_CONNECT_RESPONSE) {
            size_t n = rc_write_accept(reply, rc_get_u32(out + 4), relay->session_id, 33, 0, NULL);
            relay_client_receive(client, reply, n, now);
        } else if (type == RC_PT_DATA) {
            rc_data_header header;
            rc_data_header_read(out, &header);
            if (!relay->have_client_seq || rc_seq_newer(header.seq, relay->client_seq))
                relay->client_seq = header.seq;
            relay->have_client_seq = 1;
        }
    }
}

static void send_message(relay_client_t *client, relay_side *relay, int channel,
                         const message *m, double now)
{
    uint8_t datagram[RELAY_MAX_DATAGRAM];
    rc_data_header header = {relay->session_id, relay->seq++, relay->client_seq,
                             relay->have_client_seq ? 0xFFFFFFFFu : 0u,
                             (uint16_t)(now * 1000), 0};
    rc_data_header_write(datagram, &header);
    size_t n = RC_DATA_HEADER_SIZE
        + rc_message_record_write(datagram + RC_DATA_HEADER_SIZE, channel,
                                  relay->msg_id[channel]++, m->data, m->length);
    relay_client_receive(client, datagram, n, now);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FRAMES_FILE\n", argv[0]);
        return 2;
    }
    uint32_t count;
    message *messages = read_messages(argv[1], &count);
    uint32_t frames = count - 2;

    relay_client_config_t config;
    relay_client_default_config(&config);
    config.allocate = bench_allocate;
    config.release = bench_release;
    config.random_bytes = deterministic_random;
    size_t budget = relay_client_memory_size(&config);
    relay_client_t *client = relay_client_create(&config);
    if (!client) return 2;
    counting = 1;

    relay_side relay = {0x1234567u, 0, 0, 0, {0, 0}};
    double now = 0.0;
    if (relay_client_connect(client, "bench", "p1", 0, NULL, now) != 0) return 2;
    drain_client(client, &relay, now);
    drain_client(client, &relay, now);
    if (relay_client_get_state(client) < RELAY_STATE_CONNECTED) {
        fprintf(stderr, "handshake failed\n");
        return 1;
    }
    send_message(client, &relay, 0, &messages[0], now);    /* WELCOME */
    send_message(client, &relay, 0, &messages[1], now);    /* ROOM_STATE running */

    relay_event_t event;
    while (relay_client_poll_event(client, &event)) {}
    relay_frame_t frame;
    uint8_t input[512];
    uint64_t checksum = 0, taken = 0;
    double started = clock_now();
    for (uint32_t i = 0; i < frames; i++) {
        now += 1.0 / 30;
        send_message(client, &relay, 1, &messages[2 + i], now);
        while (relay_client_next_frame(client, &frame) == 1) {
            for (uint32_t slot = 0; slot < frame.slot_count; slot++) {
                int length = relay_frame_copy_input(client, slot, input, sizeof input);
                checksum += (uint64_t)(length + 1) + (length > 0 ? input[0] : 0);
            }
            taken++;
        }
        relay_client_handle_timeout(client, now);
        drain_client(client, &relay, now);
    }
    double elapsed = clock_now() - started;
    counting = 0;

    relay_client_stats_t stats;
    relay_client_get_stats(client, &stats);
    printf("{\"memory_budget\": %zu, \"bytes_allocated\": %zu, \"allocations_after_create\": %lu, "
           "\"frames\": %u, \"frames_taken\": %llu, \"seconds\": %.6f, \"frames_per_second\": %.0f, "
           "\"datagrams_dropped\": %llu, \"checksum\": %llu}\n",
           budget, bytes_allocated, allocations, frames, (unsigned long long)taken, elapsed,
           taken / elapsed, (unsigned long long)stats.datagrams_dropped,
           (unsigned long long)checksum);
    relay_client_destroy(client);
    return taken == frames ? 0 : 1;
}
