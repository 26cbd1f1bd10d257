/*
 * relay_player.c - the C client's interop and test program (tests/clients): joins a room,
 * plays, and prints ONE JSON line on stdout at exit:
 *
 *   {"player": P, "slot": S, "frames": N, "first": 0, "last": N-1, "gaps": 0, "duplicates": 0,
 *    "hash": "<16 hex digits>", "final_frames": F or null, "end_reason": R, "errors": [...],
 *    ...statistics}
 *
 * Exit status 0 only if "errors" is empty.
 *
 *   relay_player --server HOST:PORT --room R --player P [--spectator] [--token TEXT]
 *                [--seconds S] [--input-delay N] [--auto-input-delay]
 *                [--reconnect-at SECONDS] [--reconnect-token TEXT] [--rebind-at SECONDS]
 *                [--leave]
 *
 * --seconds: stop after S seconds even if the room has not ended (end_reason "seconds");
 * --reconnect-at: a new connection from a new socket (relay_client_reconnect), as after a
 * crash (in token mode with --reconnect-token, a fresh token: tokens are single-use);
 * --rebind-at: a new local port under the same connection (address migration);
 * --leave: send LEAVE before disconnecting at the end.
 *
 * The input for each frame is 8 bytes: FNV-1a 32 of the player name (u32 LE), then the number
 * of frames taken when it was sent (u32 LE). A checksum (the running hash below) is reported
 * every 30 frames, so a DESYNC is an error.
 *
 * "hash": FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over, for every
 * frame taken, in order:
 *   u32 LE frame number, u32 LE slot count (relay_frame_t.slot_count = len(Frame.inputs)),
 *   per slot: nil -> the byte 0xFF; an input -> the byte 0x01, u16 LE length, the bytes;
 *   u32 LE event count, per event: u8 kind code (join 0, leave 1, timeout 2, reconnect 3),
 *   u32 LE slot, u8 name length (UTF-8 bytes), the name.
 * (Synthesized marks are not hashed.) Printed as 16 lowercase hex digits.
 */
#include "relay_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv = 0xcbf29ce484222325ull;

static void hash_bytes(const void *data, size_t length)
{
    const uint8_t *p = (const uint8_t *)data;
    while (length--) {
        fnv ^= *p++;
        fnv *= 0x100000001b3ull;
    }
}

static void hash_u32(uint32_t v)
{
    uint8_t b[4];
    b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); b[2] = (uint8_t)(v >> 16); b[3] = (uint8_t)(v >> 24);
    hash_bytes(b, 4);
}

static void hash_frame(const relay_client_t *client, const relay_frame_t *frame)
{
    uint32_t k;
    hash_u32(frame->number);
    hash_u32(frame->slot_count);
    for (k = 0; k < frame->slot_count; k++) {
        const uint8_t *data;
        int length = relay_frame_input(client, k, &data);
        if (length < 0) {
            uint8_t nil = 0xFF;
            hash_bytes(&nil, 1);
        } else {
            uint8_t head[3];
            head[0] = 0x01; head[1] = (uint8_t)length; head[2] = (uint8_t)(length >> 8);
            hash_bytes(head, 3);
            hash_bytes(data, (size_t)length);
        }
    }
    hash_u32(frame->event_count);
    for (k = 0; k < frame->event_count; k++) {
        relay_frame_event_t event;
        uint8_t kind, name_length;
        relay_frame_event(client, k, &event);
        kind = (uint8_t)event.kind;
        name_length = (uint8_t)event.name_length;
        hash_bytes(&kind, 1);
        hash_u32((uint32_t)event.slot);
        hash_bytes(&name_length, 1);
        hash_bytes(event.name, event.name_length);
    }
}

static uint32_t fnv32(const char *text)
{
    uint32_t h = 0x811c9dc5u;
    while (*text) {
        h ^= (uint8_t)*text++;
        h *= 0x01000193u;
    }
    return h;
}

#define MAX_ERRORS 16
static char errors[MAX_ERRORS][160];
static int error_count;

static void add_error(const char *kind, const char *detail)
{
    if (error_count < MAX_ERRORS) {
        snprintf(errors[error_count], sizeof errors[0], "%s%s%s", kind, detail ? ":" : "",
                 detail ? detail : "");
        error_count++;
    }
}

static void json_string(const char *text)
{
    putchar('"');
    for (; *text; text++) {
        unsigned char c = (unsigned char)*text;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void usage(void)
{
    fprintf(stderr, "usage: relay_player --server HOST:PORT --room R --player P [--spectator] "
                    "[--token TEXT] [--seconds S] [--input-delay N] [--auto-input-delay] "
                    "[--reconnect-at S] [--reconnect-token TEXT] [--rebind-at S] [--leave]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *server = NULL, *room = NULL, *player = NULL, *token = NULL, *token2 = NULL;
    int spectator = 0, auto_delay = 0, leave = 0, input_delay = 2, k;
    double seconds = 600, reconnect_at = -1, rebind_at = -1, start, now;
    char host[256], end_reason[80] = "", name[300] = "";
    const char *colon = NULL;
    int port;
    relay_client_config_t config;
    relay_client_t *client;
    relay_client_stats_t stats;
    uint64_t frames = 0, gaps = 0, duplicates = 0;
    int64_t first = -1, last = -1;
    int stopping = 0, status;

    for (k = 1; k < argc; k++) {
        const char *a = argv[k];
        const char *v = k + 1 < argc ? argv[k + 1] : NULL;
        if (strcmp(a, "--spectator") == 0) spectator = 1;
        else if (strcmp(a, "--auto-input-delay") == 0) auto_delay = 1;
        else if (strcmp(a, "--leave") == 0) leave = 1;
        else if (v == NULL) usage();
        else {
            k++;
            if (strcmp(a, "--server") == 0) server = v;
            else if (strcmp(a, "--room") == 0) room = v;
            else if (strcmp(a, "--player") == 0) player = v;
            else if (strcmp(a, "--token") == 0) token = v;
            else if (strcmp(a, "--reconnect-token") == 0) token2 = v;
            else if (strcmp(a, "--seconds") == 0) seconds = atof(v);
            else if (strcmp(a, "--input-delay") == 0) input_delay = atoi(v);
            else if (strcmp(a, "--reconnect-at") == 0) reconnect_at = atof(v);
            else if (strcmp(a, "--rebind-at") == 0) rebind_at = atof(v);
            else usage();
        }
    }
    if (server == NULL || (colon = strrchr(server, ':')) == NULL || (size_t)(colon - server) >= sizeof host
        || (token == NULL && (room == NULL || player == NULL)) || input_delay < 1)
        usage();
    memcpy(host, server, (size_t)(colon - server));
    host[colon - server] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {       /* [::1]:7777 */
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    port = atoi(colon + 1);

    relay_client_default_config(&config);
    config.input_delay = (uint32_t)input_delay;
    config.auto_input_delay = auto_delay;
    config.max_block_size = 32u * 1024 * 1024;
    client = relay_client_create(&config);
    if (client == NULL) {
        fprintf(stderr, "relay_player: cannot create the client\n");
        return 1;
    }
    start = relay_client_time();
    if (player != NULL)
        snprintf(name, sizeof name, "%s", player);
    if (relay_client_open(client, host, (uint16_t)port) != 0) {
        add_error("socket", host);
        stopping = 1;
    } else if ((status = relay_client_connect(client, room, player, spectator, token, start)) != 0) {
        add_error("connect", status == RELAY_ETOKEN ? "token" : "invalid");
        stopping = 1;
    }

    while (!stopping) {
        relay_event_t event;
        relay_frame_t frame;
        now = relay_client_time();
        relay_client_update(client, now);
        while (relay_client_poll_event(client, &event) == 1) {
            fprintf(stderr, "[%s %.3f] event %d code=%s text=%s frame=%u\n", name,
                    now - start, (int)event.type, event.code, event.text, (unsigned)event.frame);
            if (event.type == RELAY_EVENT_WELCOME) {
                snprintf(name, sizeof name, "%s", event.text);    /* the name joined with */
            } else if (event.type == RELAY_EVENT_REFUSED) {
                add_error("refused", event.code);
                stopping = 1;
            } else if (event.type == RELAY_EVENT_DESYNC) {
                char detail[32];
                snprintf(detail, sizeof detail, "%u", (unsigned)event.frame);
                add_error("desync", detail);
            } else if (event.type == RELAY_EVENT_ROOM_STATE && event.room_state == RELAY_ROOM_ENDED) {
                snprintf(end_reason, sizeof end_reason, "%s", event.code);
            } else if (event.type == RELAY_EVENT_DISCONNECTED
                       && relay_client_room_state(client) != RELAY_ROOM_ENDED) {
                if (strcmp(event.code, "remote:shutdown") != 0)
                    add_error("disconnected", event.code);
                snprintf(end_reason, sizeof end_reason, "disconnected:%s", event.code);
            }
        }
        while ((status = relay_client_next_frame(client, &frame)) == 1) {
            if ((int64_t)frame.number != last + 1) {
                if ((int64_t)frame.number <= last) duplicates++;
                else gaps++;
            }
            if (first < 0)
                first = frame.number;
            last = frame.number;
            frames++;
            hash_frame(client, &frame);
            if (!spectator && frame.number % 30 == 29)
                relay_client_report_checksum(client, frame.number, fnv);
        }
        if (status < 0) {
            add_error("bad_frame", NULL);
            break;
        }
        if (!spectator && relay_client_room_state(client) == RELAY_ROOM_RUNNING
            && relay_client_get_state(client) == RELAY_STATE_JOINED) {
            uint8_t input[8];
            uint32_t who = fnv32(name);
            uint32_t taken = relay_client_next_frame_number(client);
            for (k = 0; k < 4; k++) {
                input[k] = (uint8_t)(who >> (8 * k));
                input[4 + k] = (uint8_t)(taken >> (8 * k));
            }
            relay_client_send_input(client, input, sizeof input);
        }
        relay_client_update(client, now);
        if (relay_client_finished(client)) {
            if (end_reason[0] == '\0')
                snprintf(end_reason, sizeof end_reason, "finished");
            break;
        }
        if (now - start >= seconds) {
            snprintf(end_reason, sizeof end_reason, "seconds");
            break;
        }
        if (rebind_at >= 0 && now - start >= rebind_at) {
            rebind_at = -1;
            fprintf(stderr, "[%s] rebind\n", name);
            if (relay_client_reopen(client) != 0)
                add_error("rebind", NULL);
        }
        if (reconnect_at >= 0 && now - start >= reconnect_at) {
            reconnect_at = -1;
            fprintf(stderr, "[%s] reconnect\n", name);
            if (relay_client_reopen(client) != 0 || relay_client_reconnect(client, token2, now) != 0)
                add_error("reconnect", NULL);
        }
        relay_client_wait(client, 0.01);
    }

    /* say goodbye: LEAVE (with --leave) and DISCONNECT, pumped for at most a second */
    now = relay_client_time();
    if (relay_client_get_state(client) != RELAY_STATE_IDLE) {
        if (leave)
            relay_client_leave(client, now);
        else
            relay_client_disconnect(client, now);
        while (relay_client_get_state(client) != RELAY_STATE_IDLE && relay_client_time() - now < 1.0) {
            relay_client_update(client, relay_client_time());
            relay_client_wait(client, 0.01);
        }
    }

    relay_client_get_stats(client, &stats);
    printf("{\"player\": ");
    json_string(name[0] ? name : player ? player : "");
    printf(", \"slot\": %d, \"frames\": %llu, \"first\": %lld, \"last\": %lld, \"gaps\": %llu, "
           "\"duplicates\": %llu, \"hash\": \"%016llx\", \"final_frames\": ",
           (int)relay_client_slot(client), (unsigned long long)frames, (long long)first,
           (long long)last, (unsigned long long)gaps, (unsigned long long)duplicates,
           (unsigned long long)fnv);
    if (relay_client_room_state(client) == RELAY_ROOM_ENDED)
        printf("%u", (unsigned)relay_client_final_frames(client));
    else
        printf("null");
    printf(", \"end_reason\": ");
    json_string(end_reason);
    printf(", \"input_delay\": %u, \"frames_received\": %llu, \"frames_duplicate\": %llu, "
           "\"blocks_received\": %llu, \"live_frames_dropped\": %llu, \"datagrams_dropped\": %llu, "
           "\"rtt\": %.4f, \"errors\": [",
           (unsigned)relay_client_input_delay(client), (unsigned long long)stats.frames_received,
           (unsigned long long)stats.frames_duplicate, (unsigned long long)stats.blocks_received,
           (unsigned long long)stats.live_frames_dropped, (unsigned long long)stats.datagrams_dropped,
           stats.rtt);
    for (k = 0; k < error_count; k++) {
        if (k)
            printf(", ");
        json_string(errors[k]);
    }
    printf("]}\n");
    fflush(stdout);
    relay_client_destroy(client);
    return error_count ? 1 : 0;
}
