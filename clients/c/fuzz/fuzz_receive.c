/* fuzz_receive.c - libFuzzer target: an rc_conn brought to connected (open or sealed, chosen by
 * the first input byte) is fed the rest of the input as datagrams, split at the separator
 * "\xFF\xFE"; between datagrams it is asked for its own datagrams and its timers run, so acks,
 * resends, copies, blocks and disconnects all execute. Nothing may crash, leak or trip ASan or
 * UBSan. Datagrams that start with "RL\1\6" are re-sealed under the server key in a sealed run
 * so the fuzzer reaches the record parser there too. */
#include "conn.h"
#include "crypto.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#define SID 0x5E551011u
#define CID 0x0C0FFEE1u

static void on_message(void *c, int channel, const uint8_t *d, size_t n)
{
    (void)c; (void)channel;
    if (n)
        (void)((volatile const uint8_t *)d)[n - 1];
}
static void on_block(void *c, const uint8_t *d, size_t n)
{
    (void)c;
    if (n)
        (void)((volatile const uint8_t *)d)[n - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t client_key[32] = { 1 }, server_key[32] = { 2 };
    static uint8_t token[127] = { 1 };
    rc_conn_config config;
    rc_conn_handler handler = { NULL, NULL, on_message, on_block, NULL };
    uint8_t out[2048], mac[16] = { 0 }, p[2048];
    void *memory;
    rc_conn *conn;
    double now = 0.0;
    int sealed;
    size_t start, i;
    uint64_t counter = 0;
    if (size < 1)
        return 0;
    rc_conn_default_config(&config);
    config.max_block_size = 1u << 20;
    config.reassembly_limit = 64 * 1024 + 32768;
    config.max_message_size = 64 * 1024;
    config.send_queue = 64;
    memory = malloc(rc_conn_memory_size(&config));
    conn = rc_conn_init(memory, &config, &handler);
    if (!conn)
        abort();                                    /* a config the library rejects: fix the target */
    sealed = data[0] & 1;
    if (sealed)
        rc_conn_connect(conn, CID, token, sizeof token, client_key, server_key, now);
    else
        rc_conn_connect(conn, CID, NULL, 0, NULL, NULL, now);
    while (rc_conn_next_datagram(conn, out, sizeof out, now) > 0) {}
    rc_conn_receive(conn, p, rc_write_challenge(p, CID, 7, mac), now);
    while (rc_conn_next_datagram(conn, out, sizeof out, now) > 0) {}
    rc_conn_receive(conn, p, rc_write_accept(p, CID, SID, 5, sealed, sealed ? server_key : NULL), now);
    rc_conn_send(conn, RC_CONTROL, (const uint8_t *)"join", 4);
    rc_conn_send(conn, RC_STREAM, (const uint8_t *)"input", 5);

    data++;
    size--;
    for (start = 0, i = 0; i <= size; i++) {
        if (i == size || (i + 1 < size && data[i] == 0xFF && data[i + 1] == 0xFE)) {
            const uint8_t *d = data + start;
            size_t n = i - start;
            if (sealed && n >= 20 && n + 16 <= sizeof p && memcmp(d, "RL\1\6", 4) == 0) {
                memcpy(p, d, n);
                rc_put_u32(p + 4, SID);
                rc_put_u16(p + 8, (uint16_t)counter);
                n = rc_seal_data(p, n, counter++, server_key);
                d = p;
            } else if (!sealed && n >= 8 && d[0] == 'R' && d[1] == 'L') {
                memcpy(p, d, n < sizeof p ? n : sizeof p);
                if (n > sizeof p)
                    n = sizeof p;
                rc_put_u32(p + 4, SID);             /* reach the session's code paths */
                d = p;
            }
            rc_conn_receive(conn, d, n, now);
            now += (n & 7) * 0.013;
            rc_conn_handle_timeout(conn, now);
            while (rc_conn_next_datagram(conn, out, sizeof out, now) > 0) {}
            if ((n & 15) == 3)
                rc_conn_send(conn, (int)(n & 1), d, n < 64 ? n : 64);
            (void)rc_conn_next_timeout(conn);
            start = i + 2;
            i++;
        }
    }
    now += 11.0;
    rc_conn_handle_timeout(conn, now);
    while (rc_conn_next_datagram(conn, out, sizeof out, now) > 0) {}
    free(memory);
    return 0;
}
