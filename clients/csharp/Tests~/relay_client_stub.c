/* A stand-in for librelay_client.so with the real header: scripted frames and events, so the
 * binding's marshalling, the bot's hash and its allocation can be checked without a relay. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "relay_client.h"

#define STUB_FRAMES 300u

struct relay_client {
    int state; int joined_events; uint32_t available, taken; int ended_told; int room;
    uint32_t inputs; uint8_t input_byte[2];
};

static void copy_text(char *out, size_t cap, const char *text) {
    strncpy(out, text, cap - 1); out[cap - 1] = 0;
}
void relay_client_default_config(relay_client_config_t *c) {
    memset(c, 0, sizeof *c);
    c->mtu = 1200; c->connect_timeout = 5; c->peer_timeout = 10; c->heartbeat_interval = 0.5;
    c->ack_delay = 1.0 / 30; c->max_message_size = 262144; c->reassembly_limit = 524288;
    c->max_block_size = 8u << 20; c->max_history_size = 32u << 20; c->frame_buffer_bytes = 1u << 20;
    c->frame_buffer_count = 4096; c->input_delay = 2; c->max_input_size = 256; c->send_queue = 1024;
    c->event_queue = 256;
}
uint32_t relay_client_version(void) { return (RELAY_CLIENT_VERSION_MAJOR << 16) | RELAY_CLIENT_VERSION_MINOR; }
size_t relay_client_memory_size(const relay_client_config_t *c) { return c ? sizeof(struct relay_client) : 0; }
struct relay_client *relay_client_create(const relay_client_config_t *c) {
    if (!c || c->input_delay != 3 || c->mtu != 1200 || c->event_queue != 256) return NULL; /* bot passes --input-delay 3 */
    return calloc(1, sizeof(struct relay_client));
}
void relay_client_destroy(struct relay_client *c) { free(c); }
int relay_client_connect(relay_client_t *c, const char *room, const char *player, int spectator,
                         const char *token, double now) {
    (void)now; (void)token; (void)spectator;
    if (!room || !player || strcmp(room, "r\xc3\xa9") != 0) return RELAY_EINVAL;  /* UTF-8 "ré" */
    c->state = RELAY_STATE_CONNECTING; return 0;
}
int relay_client_reconnect(relay_client_t *c, const char *t, double n) { (void)c; (void)t; (void)n; return 0; }
int relay_client_ready(relay_client_t *c) { (void)c; return 0; }
int relay_client_leave(relay_client_t *c, double n) { (void)n; c->state = RELAY_STATE_IDLE; return 0; }
int relay_client_disconnect(relay_client_t *c, double n) { (void)n; c->state = RELAY_STATE_IDLE; return 0; }
relay_client_state_t relay_client_get_state(const relay_client_t *c) { return (relay_client_state_t)c->state; }
void relay_client_receive(relay_client_t *c, const uint8_t *d, size_t l, double n) { (void)c; (void)d; (void)l; (void)n; }
int relay_client_next_datagram(relay_client_t *c, uint8_t *o, size_t cap, double n) { (void)c; (void)o; (void)n; return cap < 1200 ? RELAY_ESMALL : 0; }
double relay_client_next_timeout(const relay_client_t *c) { (void)c; return -1; }
void relay_client_handle_timeout(relay_client_t *c, double n) { (void)c; (void)n; }

int relay_client_poll_event(relay_client_t *c, relay_event_t *e) {
    memset(e, 0, sizeof *e);
    if (c->state == RELAY_STATE_JOINED && c->joined_events == 0) {
        c->joined_events = 1; e->type = RELAY_EVENT_WELCOME; e->slot = 1; e->room_state = RELAY_ROOM_RUNNING;
        e->tick_rate = 30; c->room = RELAY_ROOM_RUNNING;
        copy_text(e->code, sizeof e->code, "welcome-code"); copy_text(e->text, sizeof e->text, "t\xc3\xa9xt");
        return 1;
    }
    if (c->taken == STUB_FRAMES && !c->ended_told) {
        c->ended_told = 1; c->room = RELAY_ROOM_ENDED; e->type = RELAY_EVENT_ROOM_STATE;
        e->room_state = RELAY_ROOM_ENDED; e->frame = STUB_FRAMES; copy_text(e->code, sizeof e->code, "admin");
        return 1;
    }
    return 0;
}
int relay_client_next_frame(relay_client_t *c, relay_frame_t *f) {
    if (c->taken >= c->available) return 0;
    f->number = c->taken++; f->slot_count = 3; f->event_count = f->number == 0 ? 2 : (f->number == 7);
    return 1;
}
static int input_of(const relay_client_t *c, uint32_t slot, const uint8_t **data) {
    static const uint8_t bytes[] = {1, 2, 3};
    uint32_t n = c->taken - 1;
    static uint8_t first[2];
    if (slot == 0) { first[0] = (uint8_t)n; first[1] = 'a'; *data = first; return 2; }
    if (slot == 1) { if (n % 3 == 0) return RELAY_NIL; *data = bytes; return 3; }
    if (slot == 2) { *data = bytes; return 0; }
    return RELAY_NIL;
}
int relay_frame_input(const relay_client_t *c, uint32_t slot, const uint8_t **data) { return input_of(c, slot, data); }
int relay_frame_copy_input(const relay_client_t *c, uint32_t slot, uint8_t *out, size_t cap) {
    const uint8_t *d; int n = input_of(c, slot, &d);
    if (n < 0) return n;
    if ((size_t)n > cap) return RELAY_ESMALL;
    memcpy(out, d, (size_t)n); return n;
}
int relay_frame_synthesized(const relay_client_t *c, uint32_t slot) { (void)c; return slot == 2; }
int relay_frame_event(const relay_client_t *c, uint32_t index, relay_frame_event_t *e) {
    static const char *names[] = {"alice", "b\xc3\xb6" "b"};
    uint32_t n = c->taken - 1;
    if (n == 7 && index == 0) { e->kind = RELAY_LEAVE; e->slot = 0; e->name = names[0]; e->name_length = 5; return 0; }
    if (n != 0 || index > 1) return RELAY_EINVAL;
    e->kind = RELAY_JOIN; e->slot = (int32_t)index; e->name = names[index];
    e->name_length = (uint32_t)strlen(names[index]); return 0;
}
int relay_client_send_input(relay_client_t *c, const uint8_t *p, size_t l) {
    if (!p || l != 8) return RELAY_EINVAL;
    c->inputs++; return 1;
}
int relay_client_send_input_for(relay_client_t *c, uint32_t f, const uint8_t *p, size_t l) { (void)f; return relay_client_send_input(c, p, l); }
int relay_client_report_checksum(relay_client_t *c, uint32_t f, uint64_t v) { (void)c; (void)f; (void)v; return 0; }
void relay_client_get_stats(const relay_client_t *c, relay_client_stats_t *s) {
    memset(s, 0, sizeof *s); s->rtt = 0.25; s->live_frames_dropped = c->taken;
    s->redundancy_mode = RELAY_LINK_BURSTY; s->burst_length = 2.5;
}
uint32_t relay_client_next_frame_number(const relay_client_t *c) { return c->taken; }
int64_t relay_client_have(const relay_client_t *c) { return (int64_t)c->available - 1; }
uint32_t relay_client_input_delay(const relay_client_t *c) { (void)c; return 3; }
int relay_client_set_input_delay(relay_client_t *c, uint32_t f) { (void)c; return f ? 0 : RELAY_EINVAL; }
relay_room_state_t relay_client_room_state(const relay_client_t *c) { return (relay_room_state_t)c->room; }
uint32_t relay_client_final_frames(const relay_client_t *c) { return c->room == RELAY_ROOM_ENDED ? STUB_FRAMES : 0; }
int32_t relay_client_slot(const relay_client_t *c) { return c->joined_events ? 1 : -1; }
int relay_client_finished(const relay_client_t *c) { return c->ended_told && c->taken == STUB_FRAMES; }
double relay_client_time(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (double)t.tv_sec + t.tv_nsec / 1e9;
}
int relay_client_open(relay_client_t *c, const char *host, uint16_t port) {
    (void)c; return host && port == 7777 ? 0 : RELAY_ESOCKET;
}
int relay_client_reopen(relay_client_t *c) { (void)c; return 0; }
void relay_client_close(relay_client_t *c) { (void)c; }
int relay_client_update(relay_client_t *c, double now) {
    (void)now;
    if (c->state == RELAY_STATE_CONNECTING) c->state = RELAY_STATE_JOINED;
    else if (c->state == RELAY_STATE_JOINED && c->room == RELAY_ROOM_RUNNING && c->available < STUB_FRAMES) c->available++;
    return 0;
}
int relay_client_wait(relay_client_t *c, double timeout) {
    struct timespec t = {0, 200000}; (void)c; (void)timeout; nanosleep(&t, NULL); return 0;
}
