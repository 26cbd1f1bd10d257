/*
 * loadgen.c - the relay's load generator in C: thousands of simulated lockstep players from one
 * thread on one core, carried over a few UDP sockets with batched syscalls. Each player is
 * (--client) either the loader's own minimal client (minimal.h: ~1.3 KiB of state in one array,
 * open mode; the default) or a relay_client_t of clients/c (the library, token mode included;
 * the cross-check), both sans-I/O: no socket of their own, no clock.
 *
 * Addresses: the relay knows a player by its source address. Every socket is bound to
 * 0.0.0.0:<ephemeral> with IP_PKTINFO; each datagram a player sends carries an in_pktinfo
 * cmsg whose ipi_spec_dst is that player's own 127.a.b.c, and the relay's answer comes back to
 * that address, which the receive cmsg (ipi_addr) names. So one recvmmsg/sendmmsg moves up to
 * BATCH datagrams of any players, and the relay still sees one address per player.
 *
 * Players behave as benchmarks/players.py's LockstepPlayer (and loadgen.py): join room
 * "<prefix>-<index / 8>" as "p<index % 8>"; on each frame N taken, send a 16-byte input for frame
 * N + input_delay on the redundant channel (on the first frame also those in between).
 *
 * Checked on every frame (checks.h): in order, once, no gap; the same content for every member
 * of a room (FNV-1a of the frame per (room, frame)); the player's own input in the frame it was
 * sent for. Measured: input-to-frame latency (the input for F queued -> frame F taken).
 *
 * Modes: standalone (--server --players --seconds [--json]; exit 1 on a lost frame or a failed
 * check: a gap, a duplicate, a room mismatch, a foreign input; late inputs are only counted) and --agent (benchmarks/capacity.py: JSON lines on stdin and stdout, the protocol of
 * benchmarks/loadgen.py). Every wait is bounded; the process ends by itself after
 * --max-lifetime seconds. Only loopback servers are accepted.
 */
#define _GNU_SOURCE
#include "checks.h"
#include "messages.h"
#include "minimal.h"
#include "relay_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ROOM_SIZE 8
#define MAX_SOCKETS 64
#define MAX_PLAYERS 200000
#define BATCH 256                   /* datagrams per recvmmsg / sendmmsg */
#define RECV_BUFFER 2048            /* the relay's mtu is 1200 */
#define SENT_RING 32                /* inputs in flight per player whose send time is kept */
#define CONTROL_SPACE 64            /* in_pktinfo + the drop counter */
#define ERROR_SAMPLES 5
#define WHEEL 1024                  /* timer wheel: buckets of WHEEL_TICK, about 1 s ahead */
#define WHEEL_TICK 0.001
#define NO_BUCKET 0xFFFFFFFFu

/* ---- players ------------------------------------------------------------------------------ */

typedef struct player {
    relay_client_t *client;
    uint32_t index;
    uint32_t address;               /* host order, 127.a.b.c */
    int32_t slot;
    uint32_t wheel_bucket;          /* the timer wheel's bucket of its live entry, or NO_BUCKET */
    double timer;
    lg_sequence_t sequence;
    uint64_t window_frames;         /* sequence.frames when the window started */
    uint64_t inputs_sent, inputs_checked, inputs_missing, inputs_foreign;
    uint32_t sent_frame[SENT_RING];
    double sent_at[SENT_RING];
    uint8_t connected, welcomed, running, failed, dirty;
    char error[80];             /* "kind" + a 64-byte code from the library */
} player_t;

typedef struct socket_out {
    int fd;
    int count;
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    union {
        char bytes[CMSG_SPACE(sizeof(struct in_pktinfo))];
        struct cmsghdr align;
    } control[BATCH];
    uint8_t *buffers;               /* BATCH * mtu */
    uint32_t drops_seen;            /* SO_RXQ_OVFL: the kernel's drop counter for this socket */
} socket_out_t;

typedef struct totals {
    uint64_t frames, gaps, duplicates, inputs_sent, inputs_checked, inputs_missing, inputs_foreign;
    uint64_t disconnects, datagrams_in, datagrams_out, bytes_in, bytes_out;
    uint64_t room_mismatches, rooms_compared, frames_unverified, kernel_drops, send_failures;
    uint64_t stray_datagrams, catchup_blocks, live_frames_dropped, notices;
    uint64_t block_frames, records_refused, transport_drops;
    double cpu, cpu_user, cpu_system;
} totals_t;

static struct {
    struct sockaddr_in server;
    int tick_rate, input_delay, socket_count;
    double connect_rate, max_lifetime;
    char room_prefix[40];
    char **tokens;                  /* --tokens: player i connects with tokens[i] (token mode) */
    uint32_t token_count;
    relay_client_config_t config;
    int minimal;                    /* --client minimal: mc_player per player (minimal.h) */
    mc_player *minis;               /* one contiguous array, indexed like players */
    uint64_t connect_seed;

    player_t *players;
    uint32_t count, capacity, connected_upto;
    lg_room_ledger_t **rooms;
    uint32_t room_count;
    struct bucket { uint32_t *items, count, capacity; } wheel[WHEEL];
    uint32_t wheel_cursor;          /* the first bucket not yet run */
    double wheel_origin;
    uint32_t *dirty;
    uint32_t dirty_count;
    socket_out_t sockets[MAX_SOCKETS];
    int epoll_fd;

    uint64_t datagrams_in, datagrams_out, bytes_in, bytes_out, disconnects, kernel_drops;
    uint64_t send_failures, stray_datagrams, notices;
    lg_histogram_t latency;
    /* Is the loader keeping up? reply delay: from the first datagram a pass received to the
     * flush of what the pass wrote (the INPUTs answering those frames); timer lateness: how
     * long after its time a timer ran. Both since window_start. */
    double pass_first_rx, reply_delay_max, reply_delay_sum, timer_late_max;
    uint64_t reply_passes;
    double window_started;          /* < 0: no window */
    totals_t window_base;
    long rss_before_players;
    double connect_tokens, connect_refill_at;
} lg;

static double monotonic_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    fputs("loadgen_c: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(2);
}

/* Player i's own source address: 127.a.b.c with c in 1..254 and a >= 1, so never 127.0.0.x
 * (127.0.0.1 is where relays listen) and never a .0 or .255 host part. */
static uint32_t player_address(uint32_t index)
{
    uint32_t c = 1 + index % 254, rest = index / 254;
    return (127u << 24) | ((1 + rest / 256) << 16) | ((rest % 256) << 8) | c;
}

static int64_t player_of_address(uint32_t address)
{
    uint32_t a = (address >> 16) & 0xff, b = (address >> 8) & 0xff, c = address & 0xff;
    int64_t index;
    if ((address >> 24) != 127 || a < 1 || c < 1 || c > 254)
        return -1;
    index = ((int64_t)(a - 1) * 256 + b) * 254 + (c - 1);
    return index < lg.count && player_address((uint32_t)index) == address ? index : -1;
}

static void set_error(player_t *p, const char *kind, const char *detail)
{
    if (p->failed)
        return;
    p->failed = 1;
    snprintf(p->error, sizeof p->error, "%s%s%s", kind, detail && *detail ? " " : "",
             detail ? detail : "");
}

/* ---- the timer wheel ------------------------------------------------------------------------
 * Player indices in buckets of WHEEL_TICK by player.timer; a timer further than the wheel goes
 * in its last bucket and is put back when that comes round. Entries are not removed: an entry
 * whose bucket is not the player's wheel_bucket is stale and skipped. So moving a timer costs
 * one append and touches no other player; a lazy move (later) costs nothing at all: the entry
 * fires early, finds the timer later and is put back. */

static uint32_t bucket_of(double when)
{
    double at = (when - lg.wheel_origin) / WHEEL_TICK;
    uint32_t b = at <= (double)lg.wheel_cursor ? lg.wheel_cursor : (uint32_t)at;
    if (b - lg.wheel_cursor >= WHEEL)
        b = lg.wheel_cursor + WHEEL - 1;
    return b;
}

static void wheel_push(player_t *p, uint32_t b)
{
    struct bucket *k = &lg.wheel[b % WHEEL];
    if (k->count == k->capacity) {
        k->capacity = k->capacity ? 2 * k->capacity : 64;
        k->items = realloc(k->items, k->capacity * sizeof *k->items);
        if (!k->items)
            die("out of memory for timers");
    }
    k->items[k->count++] = p->index;
    p->wheel_bucket = b;
}

static void timer_remove(player_t *p)
{
    p->wheel_bucket = NO_BUCKET;
    p->timer = -1;
}

/* lazy: only an earlier time (or no timer yet) moves the entry */
static void schedule(player_t *p, double when, int lazy)
{
    uint32_t b;
    if (lazy && p->wheel_bucket != NO_BUCKET && when >= p->timer) {
        p->timer = when;
        return;
    }
    p->timer = when;
    b = bucket_of(when);
    if (b != p->wheel_bucket)
        wheel_push(p, b);
}

/* When the wheel next has an entry (within `horizon`), or now + horizon. */
static double wheel_next(double now, double horizon)
{
    uint32_t b, end = lg.wheel_cursor + (uint32_t)(horizon / WHEEL_TICK) + 1;
    for (b = lg.wheel_cursor; b != end && b - lg.wheel_cursor < WHEEL; b++) {
        const struct bucket *k = &lg.wheel[b % WHEEL];
        double first = -1;
        uint32_t i;
        if (k->count == 0)
            continue;
        if (b != lg.wheel_cursor)
            return lg.wheel_origin + b * WHEEL_TICK;
        for (i = 0; i < k->count; i++) {          /* the current bucket: its first live timer */
            const player_t *p = &lg.players[k->items[i]];
            if (p->wheel_bucket == b && (first < 0 || p->timer < first))
                first = p->timer;
        }
        if (first >= 0)
            return first;
    }
    return now + horizon;
}

/* ---- sending --------------------------------------------------------------------------------- */

static void flush_socket(socket_out_t *s)
{
    int done = 0, waits = 0;
    while (done < s->count) {
        int sent = sendmmsg(s->fd, s->msgs + done, (unsigned)(s->count - done), 0);
        if (sent > 0) {
            done += sent;
            continue;
        }
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == ENOBUFS) && waits++ < 10) {
            struct pollfd pfd = {s->fd, POLLOUT, 0};
            poll(&pfd, 1, 1);
            continue;
        }
        /* what is left is lost, as on a network; the reliable layer resends */
        lg.send_failures += (uint64_t)(s->count - done);
        break;
    }
    s->count = 0;
}

static void flush_all(void)
{
    int k;
    for (k = 0; k < lg.socket_count; k++)
        if (lg.sockets[k].count)
            flush_socket(&lg.sockets[k]);
}

/* Moves every datagram the player's client has due into its socket's batch. */
static void pull_datagrams(player_t *p, double now)
{
    socket_out_t *s = &lg.sockets[p->index % (uint32_t)lg.socket_count];
    for (;;) {
        uint8_t *buffer;
        int length;
        struct in_pktinfo *info;
        if (s->count == BATCH)
            flush_socket(s);
        buffer = s->buffers + (size_t)s->count * lg.config.mtu;
        length = lg.minimal ? (int)mc_next_datagram(&lg.minis[p->index], buffer, now)
                            : relay_client_next_datagram(p->client, buffer, lg.config.mtu, now);
        if (length <= 0)
            return;
        s->iov[s->count].iov_base = buffer;
        s->iov[s->count].iov_len = (size_t)length;
        info = (struct in_pktinfo *)(void *)CMSG_DATA(&s->control[s->count].align);
        info->ipi_ifindex = 0;
        info->ipi_spec_dst.s_addr = htonl(p->address);
        info->ipi_addr.s_addr = 0;
        s->count++;
        lg.datagrams_out++;
        lg.bytes_out += (uint64_t)length;
    }
}

/* ---- a player's reactions ---------------------------------------------------------------- */

static void send_input(player_t *p, uint32_t frame, double now)
{
    uint8_t payload[LG_INPUT_SIZE];
    int status;
    if (lg.minimal) {
        /* have: frames are taken in order, so the last one taken (-1 before frame 0) */
        status = mc_send_input(&lg.minis[p->index], frame, p->sequence.last) == 0 ? RELAY_OK : -1;
        if (status != RELAY_OK)
            set_error(p, "stream", "input queue full");
    } else {
        lg_input_payload(p->index, frame, payload);
        status = relay_client_send_input_for(p->client, frame, payload, sizeof payload);
    }
    if (status == RELAY_OK) {
        p->inputs_sent++;
        p->sent_frame[frame % SENT_RING] = frame;
        p->sent_at[frame % SENT_RING] = now;
    }
}

static uint64_t frame_hash(const relay_client_t *client, const relay_frame_t *frame)
{
    uint64_t hash = lg_fnv1a(LG_FNV_OFFSET, &frame->number, sizeof frame->number);
    uint32_t slot, k;
    hash = lg_fnv1a(hash, &frame->slot_count, sizeof frame->slot_count);
    for (slot = 0; slot < frame->slot_count; slot++) {
        const uint8_t *data;
        int32_t length = relay_frame_input(client, slot, &data);
        uint8_t synthesized = (uint8_t)relay_frame_synthesized(client, slot);
        hash = lg_fnv1a(hash, &length, sizeof length);
        hash = lg_fnv1a(hash, &synthesized, 1);
        if (length > 0)
            hash = lg_fnv1a(hash, data, (size_t)length);
    }
    for (k = 0; k < frame->event_count; k++) {
        relay_frame_event_t event;
        if (relay_frame_event(client, k, &event) != RELAY_OK)
            continue;
        hash = lg_fnv1a(hash, &event.kind, sizeof event.kind);
        hash = lg_fnv1a(hash, &event.slot, sizeof event.slot);
        hash = lg_fnv1a(hash, event.name, event.name_length);
    }
    return hash;
}

/* A word at a time (every member of a room hashes with the same function, so any good mix
 * does; FNV-1a a byte at a time was 4 % of the minimal client's loader time). */
static uint64_t mix64(uint64_t hash, uint64_t word)
{
    hash = (hash ^ word) * 0x9E3779B97F4A7C15ULL;
    return hash ^ (hash >> 29);
}

static uint64_t hash_bytes(uint64_t hash, const uint8_t *data, size_t length)
{
    uint64_t word;
    for (; length >= 8; data += 8, length -= 8) {
        memcpy(&word, data, 8);
        hash = mix64(hash, word);
    }
    if (length) {
        word = 0;
        memcpy(&word, data, length);
        hash = mix64(hash, word ^ (uint64_t)length << 56);
    }
    return hash;
}

/* A frame's content hash, as decoded by clients/c/src/frame.c (the minimal client). */
static uint64_t rf_frame_hash(const rf_frame *frame)
{
    uint64_t hash = mix64(LG_FNV_OFFSET, (uint64_t)frame->number << 32 | frame->slot_count);
    uint32_t slot, k;
    for (slot = 0; slot < frame->slot_count; slot++) {
        uint32_t length = (uint32_t)frame->length[slot];
        uint64_t synthesized = frame->synthesized[slot >> 3] >> (slot & 7) & 1;
        hash = mix64(hash, (uint64_t)length | synthesized << 32);
        if (frame->length[slot] > 0)
            hash = hash_bytes(hash, frame->arena + frame->offset[slot], length);
    }
    for (k = 0; k < frame->event_count; k++) {
        int kind, slot_of;
        const char *name;
        uint32_t name_length;
        if (rf_frame_event(frame, k, &kind, &slot_of, &name, &name_length) != 0)
            continue;
        hash = lg_fnv1a(hash, &kind, sizeof kind);
        hash = lg_fnv1a(hash, &slot_of, sizeof slot_of);
        hash = lg_fnv1a(hash, name, name_length);
    }
    return hash;
}

/* A frame taken: number, content hash, and the player's own slot (length -1: nil). */
static void on_frame(player_t *p, uint32_t number, uint64_t hash, int length, const uint8_t *data,
                     int synthesized, double now)
{
    uint32_t f;
    uint32_t at = number % SENT_RING;
    if (lg_sequence_take(&p->sequence, number) == LG_DUPLICATE)
        return;
    lg_ledger_check(lg.rooms[p->index / ROOM_SIZE], number, hash);
    if (p->running && p->sent_frame[at] == number && p->sent_at[at] > 0) {
        uint8_t expected[LG_INPUT_SIZE];
        lg_input_payload(p->index, number, expected);
        p->inputs_checked++;
        if (synthesized || length != LG_INPUT_SIZE || memcmp(data, expected, LG_INPUT_SIZE) != 0) {
            /* Missing: the input reached the relay after its frame closed (a timing figure):
             * the slot is nil, made up by the relay, or holds an earlier input of ours that
             * came late and was carried into this frame. Foreign: bytes that are no input of
             * this player's, a relay bug. */
            p->inputs_missing++;
            if (!synthesized && length >= 0 && !lg_input_is_players(p->index, data, (size_t)length))
                p->inputs_foreign++;
        }
        if (lg.window_started >= 0)
            lg_histogram_add(&lg.latency, now - p->sent_at[at]);
        p->sent_at[at] = 0;
    }
    if (!p->running) {
        p->running = 1;
        for (f = number + 1; f <= number + (uint32_t)lg.input_delay; f++)
            send_input(p, f, now);
    } else {
        send_input(p, number + (uint32_t)lg.input_delay, now);
    }
}

static void serve_player(player_t *p, double now)
{
    relay_event_t event;
    relay_frame_t frame;
    int status;
    double next;
    while (relay_client_poll_event(p->client, &event) == 1) {
        switch (event.type) {
        case RELAY_EVENT_WELCOME:
            p->welcomed = 1;
            p->slot = event.slot;
            break;
        case RELAY_EVENT_REFUSED:
            set_error(p, "refused", event.code);
            break;
        case RELAY_EVENT_NOTICE:
            lg.notices++;
            set_error(p, "notice", event.code);
            break;
        case RELAY_EVENT_DISCONNECTED:
            if (!p->failed)
                lg.disconnects++;
            set_error(p, event.code, NULL);
            break;
        default:
            break;
        }
    }
    while ((status = relay_client_next_frame(p->client, &frame)) == 1) {
        const uint8_t *data = NULL;
        int length = p->slot >= 0 ? relay_frame_input(p->client, (uint32_t)p->slot, &data) : -1;
        int synthesized = p->slot >= 0 && relay_frame_synthesized(p->client, (uint32_t)p->slot);
        on_frame(p, frame.number, frame_hash(p->client, &frame), length, data, synthesized, now);
    }
    if (status < 0)
        set_error(p, "stream", "broken");
    pull_datagrams(p, now);
    next = relay_client_next_timeout(p->client);
    if (next < 0) {
        timer_remove(p);
    } else {
        /* never due again in the same pass: a timer that stays due cannot spin the loop */
        next = next > now ? next : now + 1e-4;
        if (p->wheel_bucket == NO_BUCKET || next != p->timer)
            schedule(p, next, 0);
    }
}

/* ---- the minimal client's players ---------------------------------------------------- */

static void mini_control(void *context, mc_player *m, const uint8_t *data, size_t length)
{
    static rm_message message;
    player_t *p = &lg.players[m->index];
    (void)context;
    if (rm_decode(data, length, &message) != 1)
        return;
    switch (message.type) {
    case RM_WELCOME:
        p->welcomed = 1;
        p->slot = message.slot;
        break;
    case RM_REFUSED:
        set_error(p, "refused", message.code);
        break;
    case RM_NOTICE:
        lg.notices++;
        set_error(p, "notice", message.code);
        break;
    default:
        break;
    }
}

static void mini_frame(void *context, mc_player *m, const uint8_t *data, size_t length, double now)
{
    player_t *p = &lg.players[m->index];
    const rf_frame *frame;
    int slot_length = -1, synthesized = 0;
    const uint8_t *slot_data = NULL;
    (void)context;
    if (p->failed)
        return;
    if (mc_decode_frame(m, data, length, &frame) != RF_OK) {
        set_error(p, "stream", "broken");
        return;
    }
    if (p->slot >= 0 && (uint32_t)p->slot < frame->slot_count) {
        slot_length = frame->length[p->slot];
        slot_data = frame->arena + frame->offset[p->slot];
        synthesized = frame->synthesized[p->slot >> 3] >> (p->slot & 7) & 1;
    }
    on_frame(p, frame->number, rf_frame_hash(frame), slot_length, slot_data, synthesized, now);
}

static const mc_sink mini_sink = {mini_control, mini_frame, NULL};

/* Timers are lazy: a player's entry moves only when its next deadline comes earlier, or
 * (forced) when the entry fired; one that fires early finds nothing due and is put back. */
static void serve_mini(player_t *p, double now, int forced)
{
    mc_player *m = &lg.minis[p->index];
    double next;
    pull_datagrams(p, now);
    if ((m->state == MC_CLOSED || m->state == MC_DISCONNECTING) && !p->failed) {
        char text[64];
        lg.disconnects++;
        set_error(p, mc_close_text(m, text, sizeof text), NULL);
    }
    next = mc_next_timeout(m);
    if (next < 0) {
        timer_remove(p);
        return;
    }
    next = next > now ? next : now + 1e-4;
    schedule(p, next, !forced);
}

static void mark_dirty(player_t *p)
{
    if (!p->dirty) {
        p->dirty = 1;
        lg.dirty[lg.dirty_count++] = p->index;
    }
}

static void serve_dirty(double now)
{
    uint32_t k;
    for (k = 0; k < lg.dirty_count; k++) {
        player_t *p = &lg.players[lg.dirty[k]];
        p->dirty = 0;
        if (lg.minimal)
            serve_mini(p, now, 0);
        else
            serve_player(p, now);
    }
    lg.dirty_count = 0;
}

/* ---- receiving ------------------------------------------------------------------------------ */

static struct {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_in from[BATCH];
    union {
        char bytes[CONTROL_SPACE];
        struct cmsghdr align;
    } control[BATCH];
    uint8_t buffers[BATCH][RECV_BUFFER];
} rx;

/* Reads what the socket holds (a bounded number of batches, so timers still run). */
static void drain_socket(socket_out_t *s)
{
    int rounds;
    for (rounds = 0; rounds < 16; rounds++) {
        int n, i;
        double now;
        static int ready;
        if (!ready) {
            for (i = 0; i < BATCH; i++) {
                rx.iov[i].iov_base = rx.buffers[i];
                rx.iov[i].iov_len = RECV_BUFFER;
                rx.msgs[i].msg_hdr.msg_name = &rx.from[i];
                rx.msgs[i].msg_hdr.msg_iov = &rx.iov[i];
                rx.msgs[i].msg_hdr.msg_iovlen = 1;
                rx.msgs[i].msg_hdr.msg_control = rx.control[i].bytes;
            }
            ready = 1;
        }
        for (i = 0; i < BATCH; i++) {       /* what recvmmsg changes */
            rx.msgs[i].msg_hdr.msg_namelen = sizeof rx.from[i];
            rx.msgs[i].msg_hdr.msg_controllen = CONTROL_SPACE;
            rx.msgs[i].msg_hdr.msg_flags = 0;
        }
        n = recvmmsg(s->fd, rx.msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        now = monotonic_now();
        if (lg.pass_first_rx < 0)
            lg.pass_first_rx = now;
        for (i = 0; i < n; i++) {
            struct msghdr *m = &rx.msgs[i].msg_hdr;
            struct cmsghdr *c;
            int64_t index = -1;
            for (c = CMSG_FIRSTHDR(m); c != NULL; c = CMSG_NXTHDR(m, c)) {
                if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
                    struct in_pktinfo info;
                    memcpy(&info, CMSG_DATA(c), sizeof info);
                    index = player_of_address(ntohl(info.ipi_addr.s_addr));
                } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
                    uint32_t dropped;
                    memcpy(&dropped, CMSG_DATA(c), sizeof dropped);
                    lg.kernel_drops += dropped - s->drops_seen;
                    s->drops_seen = dropped;
                }
            }
            if (index < 0 || rx.from[i].sin_port != lg.server.sin_port
                || rx.from[i].sin_addr.s_addr != lg.server.sin_addr.s_addr
                || (uint32_t)index % (uint32_t)lg.socket_count != (uint32_t)(s - lg.sockets)) {
                lg.stray_datagrams++;
                continue;
            }
            lg.datagrams_in++;
            lg.bytes_in += rx.msgs[i].msg_len;
            if (lg.minimal)
                mc_receive(&lg.minis[index], rx.buffers[i], rx.msgs[i].msg_len, now, &mini_sink);
            else
                relay_client_receive(lg.players[index].client, rx.buffers[i], rx.msgs[i].msg_len,
                                     now);
            mark_dirty(&lg.players[index]);
        }
        serve_dirty(now);
        if (n < BATCH)
            return;
    }
}

static void fire(player_t *p, double now)
{
    if (lg.minimal) {
        mc_handle_timeout(&lg.minis[p->index], now);
        serve_mini(p, now, 1);
    } else {
        relay_client_handle_timeout(p->client, now);
        serve_player(p, now);
    }
}

/* Runs the buckets up to now: due entries fire, early ones (lazy, or beyond the wheel) are put
 * back; the bucket of `now` itself stays current for what is not due yet. */
static void run_timers(double now)
{
    double at = (now - lg.wheel_origin) / WHEEL_TICK;
    uint32_t now_bucket = at <= (double)lg.wheel_cursor ? lg.wheel_cursor : (uint32_t)at;
    for (;;) {
        uint32_t b = lg.wheel_cursor, n, i, kept = 0;
        struct bucket *k = &lg.wheel[b % WHEEL];
        n = k->count;
        for (i = 0; i < n; i++) {
            player_t *p = &lg.players[k->items[i]];
            if (p->wheel_bucket != b)
                continue;                               /* stale */
            if (p->timer <= now) {
                if (now - p->timer > lg.timer_late_max)
                    lg.timer_late_max = now - p->timer;
                p->wheel_bucket = NO_BUCKET;
                fire(p, now);
            } else if (b == now_bucket && bucket_of(p->timer) == b) {
                k->items[kept++] = p->index;            /* later in this bucket */
            } else {
                p->wheel_bucket = NO_BUCKET;
                schedule(p, p->timer, 0);
            }
        }
        /* entries pushed into this bucket meanwhile follow the kept ones */
        memmove(k->items + kept, k->items + n, (k->count - n) * sizeof *k->items);
        k->count = kept + (k->count - n);
        if (b == now_bucket)
            return;
        lg.wheel_cursor++;
    }
}

/* ---- adding players ---------------------------------------------------------------------- */

static void add_players(uint32_t how_many)
{
    uint32_t k;
    if (lg.count + how_many > MAX_PLAYERS)
        die("at most %d players", MAX_PLAYERS);
    if (lg.count + how_many > lg.capacity) {
        uint32_t capacity = lg.capacity ? lg.capacity : 1024;
        while (capacity < lg.count + how_many)
            capacity *= 2;
        lg.players = realloc(lg.players, capacity * sizeof *lg.players);
        lg.dirty = realloc(lg.dirty, capacity * sizeof *lg.dirty);
        if (lg.minimal && !(lg.minis = realloc(lg.minis, capacity * sizeof *lg.minis)))
            die("out of memory for %u players", capacity);
        if (!lg.players || !lg.dirty)
            die("out of memory for %u players", capacity);
        lg.capacity = capacity;
    }
    for (k = 0; k < how_many; k++) {
        player_t *p = &lg.players[lg.count];
        uint32_t room = lg.count / ROOM_SIZE;
        memset(p, 0, sizeof *p);
        p->index = lg.count;
        p->address = player_address(p->index);
        p->slot = -1;
        p->wheel_bucket = NO_BUCKET;
        p->timer = -1;
        lg_sequence_init(&p->sequence);
        if (lg.minimal)
            mc_init(&lg.minis[p->index], p->index);
        else if ((p->client = relay_client_create(&lg.config)) == NULL)
            die("relay_client_create failed for player %u", p->index);
        if (room >= lg.room_count) {
            lg.rooms = realloc(lg.rooms, (room + 1) * sizeof *lg.rooms);
            if (!lg.rooms || !(lg.rooms[room] = malloc(sizeof(lg_room_ledger_t))))
                die("out of memory for rooms");
            lg_ledger_init(lg.rooms[room]);
            lg.room_count = room + 1;
        }
        lg.count++;
    }
}

/* Connects players that were added, at most --connect-rate a second, so that a large add
 * does not land on the relay as one burst of handshakes. */
static void connect_pending(double now)
{
    double burst = lg.connect_rate / 20 > 1 ? lg.connect_rate / 20 : 1;
    lg.connect_tokens += (now - lg.connect_refill_at) * lg.connect_rate;
    if (lg.connect_tokens > burst)
        lg.connect_tokens = burst;
    lg.connect_refill_at = now;
    while (lg.connected_upto < lg.count && lg.connect_tokens >= 1) {
        player_t *p = &lg.players[lg.connected_upto++];
        char room[96], name[16];
        lg.connect_tokens -= 1;
        snprintf(room, sizeof room, "%s-%u", lg.room_prefix, p->index / ROOM_SIZE);
        snprintf(name, sizeof name, "p%u", p->index % ROOM_SIZE);
        if (lg.minimal) {
            uint8_t join[MC_CONTROL_MAX];
            int length = rm_encode_join(join, sizeof join, room, name, 0);
            uint32_t connect_id;
            do {                            /* splitmix64: a non-zero id per attempt */
                uint64_t z = (lg.connect_seed += 0x9E3779B97F4A7C15ULL);
                z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
                z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
                connect_id = (uint32_t)(z ^ (z >> 31));
            } while (connect_id == 0);
            if (length < 0 || mc_connect(&lg.minis[p->index], connect_id, join, (size_t)length,
                                         now) != 0)
                set_error(p, "connect", "JOIN does not fit");
            p->connected = 1;
            serve_mini(p, now, 1);
            continue;
        }
        if (lg.tokens != NULL && p->index >= lg.token_count) {
            set_error(p, "connect", "no token left for this player (--tokens)");
        } else if (relay_client_connect(p->client, room, name, 0,
                                        lg.tokens != NULL ? lg.tokens[p->index] : NULL,
                                        now) != RELAY_OK) {
            set_error(p, "connect", "refused by the library");
        }
        p->connected = 1;
        serve_player(p, now);
    }
}

/* ---- figures ------------------------------------------------------------------------------- */

static void cpu_times(double *user, double *system)
{
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    *user = (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec * 1e-6;
    *system = (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec * 1e-6;
}

static long rss_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * sysconf(_SC_PAGESIZE);
}

static void collect(totals_t *t)
{
    uint32_t k;
    memset(t, 0, sizeof *t);
    for (k = 0; k < lg.count; k++) {
        const player_t *p = &lg.players[k];
        relay_client_stats_t stats;
        t->frames += p->sequence.frames;
        t->gaps += p->sequence.gaps;
        t->duplicates += p->sequence.duplicates;
        t->inputs_sent += p->inputs_sent;
        t->inputs_checked += p->inputs_checked;
        t->inputs_missing += p->inputs_missing;
        t->inputs_foreign += p->inputs_foreign;
        if (lg.minimal) {
            const mc_player *m = &lg.minis[k];
            t->catchup_blocks += m->blocks;
            t->block_frames += m->block_frames;
            t->records_refused += m->refused;
            t->transport_drops += m->drops;
            continue;
        }
        relay_client_get_stats(p->client, &stats);
        t->catchup_blocks += stats.blocks_received;
        t->live_frames_dropped += stats.live_frames_dropped;
    }
    for (k = 0; k < lg.room_count; k++) {
        t->room_mismatches += lg.rooms[k]->mismatches;
        t->rooms_compared += lg.rooms[k]->compared;
        t->frames_unverified += lg.rooms[k]->unverified;
    }
    t->disconnects = lg.disconnects;
    t->datagrams_in = lg.datagrams_in;
    t->datagrams_out = lg.datagrams_out;
    t->bytes_in = lg.bytes_in;
    t->bytes_out = lg.bytes_out;
    t->kernel_drops = lg.kernel_drops;
    t->send_failures = lg.send_failures;
    t->stray_datagrams = lg.stray_datagrams;
    t->notices = lg.notices;
    cpu_times(&t->cpu_user, &t->cpu_system);
    t->cpu = t->cpu_user + t->cpu_system;
}

typedef struct json {
    char *text;
    size_t length;
    FILE *out;
    int fields;
} json_t;

static void json_open(json_t *j)
{
    j->out = open_memstream(&j->text, &j->length);
    j->fields = 0;
    fputc('{', j->out);
}

static void json_key(json_t *j, const char *key)
{
    fprintf(j->out, "%s\"%s\": ", j->fields++ ? ", " : "", key);
}

static void json_u64(json_t *j, const char *key, uint64_t v)
{
    json_key(j, key);
    fprintf(j->out, "%llu", (unsigned long long)v);
}

static void json_f(json_t *j, const char *key, double v)
{
    json_key(j, key);
    fprintf(j->out, "%.6g", isfinite(v) ? v : 0.0);
}

static void json_bool(json_t *j, const char *key, int v)
{
    json_key(j, key);
    fputs(v ? "true" : "false", j->out);
}

static void json_str(json_t *j, const char *key, const char *v)
{
    json_key(j, key);
    fputc('"', j->out);
    for (; *v; v++) {
        if (*v == '"' || *v == '\\')
            fputc('\\', j->out);
        if ((unsigned char)*v >= 0x20)
            fputc(*v, j->out);
    }
    fputc('"', j->out);
}

static void json_close(json_t *j, FILE *to)
{
    fputc('}', j->out);
    fclose(j->out);
    fputs(j->text, to);
    fputc('\n', to);
    fflush(to);
    free(j->text);
}

static const char *io_description(void)
{
    static char text[200];
    snprintf(text, sizeof text, "C loadgen: %s per player, %d sockets, "
             "recvmmsg/sendmmsg x %d, IP_PKTINFO source 127.a.b.c per player",
             lg.minimal ? "minimal client (mc_player, open mode)"
                        : "clients/c sans-I/O core", lg.socket_count, BATCH);
    return text;
}

static void json_error_samples(json_t *j)
{
    const char *seen[ERROR_SAMPLES];
    int n = 0, i;
    uint32_t k;
    json_key(j, "error_samples");
    fputc('[', j->out);
    for (k = 0; k < lg.count && n < ERROR_SAMPLES; k++) {
        const player_t *p = &lg.players[k];
        int dup = 0;
        if (!p->failed)
            continue;
        for (i = 0; i < n; i++)
            dup |= strcmp(seen[i], p->error) == 0;
        if (dup)
            continue;
        fprintf(j->out, "%s\"%s\"", n ? ", " : "", p->error);
        seen[n++] = p->error;
    }
    fputc(']', j->out);
}

static void player_counts(uint64_t *welcomed, uint64_t *running, uint64_t *errors)
{
    uint32_t k;
    *welcomed = *running = *errors = 0;
    for (k = 0; k < lg.count; k++) {
        *welcomed += lg.players[k].welcomed;
        *running += lg.players[k].running && !lg.players[k].failed;
        *errors += lg.players[k].failed;
    }
}

static void json_memory(json_t *j)
{
    long rss = rss_bytes();
    json_u64(j, "rss_bytes", (uint64_t)rss);
    json_u64(j, "client_bytes_allocated",
             lg.minimal ? sizeof(mc_player) : relay_client_memory_size(&lg.config));
    json_u64(j, "player_bytes", sizeof(player_t) + (lg.minimal ? sizeof(mc_player) : 0));
    json_f(j, "rss_per_player", lg.count ? (double)(rss - lg.rss_before_players) / lg.count : 0.0);
}

static void json_totals(json_t *j, const totals_t *t)
{
    json_u64(j, "frames", t->frames);
    json_u64(j, "gaps", t->gaps);
    json_u64(j, "duplicates", t->duplicates);
    json_u64(j, "inputs_sent", t->inputs_sent);
    json_u64(j, "inputs_checked", t->inputs_checked);
    json_u64(j, "inputs_missing", t->inputs_missing);
    json_u64(j, "inputs_foreign", t->inputs_foreign);
    json_u64(j, "disconnects", t->disconnects);
    json_u64(j, "datagrams_in", t->datagrams_in);
    json_u64(j, "datagrams_out", t->datagrams_out);
    json_u64(j, "bytes_in", t->bytes_in);
    json_u64(j, "bytes_out", t->bytes_out);
    json_u64(j, "room_mismatches", t->room_mismatches);
    json_u64(j, "room_frames_compared", t->rooms_compared);
    json_u64(j, "frames_unverified", t->frames_unverified);
    json_u64(j, "kernel_drops", t->kernel_drops);
    json_u64(j, "send_failures", t->send_failures);
    json_u64(j, "stray_datagrams", t->stray_datagrams);
    json_u64(j, "catchup_blocks", t->catchup_blocks);
    json_u64(j, "live_frames_dropped", t->live_frames_dropped);
    json_u64(j, "notices", t->notices);
    json_u64(j, "block_frames", t->block_frames);
    json_u64(j, "records_refused", t->records_refused);
    json_u64(j, "transport_drops", t->transport_drops);
    json_f(j, "cpu", t->cpu);
    json_f(j, "cpu_user", t->cpu_user);
    json_f(j, "cpu_system", t->cpu_system);
}

static void json_counts(json_t *j)
{
    totals_t t;
    uint64_t welcomed, running, errors;
    collect(&t);
    player_counts(&welcomed, &running, &errors);
    json_u64(j, "players", lg.count);
    json_u64(j, "welcomed", welcomed);
    json_u64(j, "running", running);
    json_u64(j, "errors", errors);
    json_totals(j, &t);
    json_memory(j);
    json_str(j, "io", io_description());
    json_error_samples(j);
}

static void window_start(void)
{
    uint32_t k;
    collect(&lg.window_base);
    for (k = 0; k < lg.count; k++)
        lg.players[k].window_frames = lg.players[k].sequence.frames;
    lg_histogram_clear(&lg.latency);
    lg.reply_delay_max = lg.reply_delay_sum = lg.timer_late_max = 0;
    lg.reply_passes = 0;
    lg.window_started = monotonic_now();
}

typedef struct window_result {
    uint64_t lost_frames, running, errors;
    totals_t delta;
} window_result_t;

/* Figures since window_start, as benchmarks/loadgen.py's window_end has them, plus latency
 * percentiles, room mismatches and the loader's memory. */
static window_result_t window_end(json_t *j)
{
    window_result_t result;
    totals_t end;
    double seconds = monotonic_now() - lg.window_started;
    double expected = seconds * lg.tick_rate, worst = 0.0;
    uint64_t lost = 0, short_players = 0, welcomed;
    uint32_t k;
    collect(&end);
    for (k = 0; k < lg.count; k++) {
        double shortfall;
        uint64_t missed = lg_window_lost(expected, lg.players[k].sequence.frames
                                         - lg.players[k].window_frames, &shortfall);
        lost += missed;
        short_players += missed > 0;
        if (shortfall > worst)
            worst = shortfall;
    }
#define DELTA(field) result.delta.field = end.field - lg.window_base.field
    DELTA(frames); DELTA(gaps); DELTA(duplicates); DELTA(inputs_sent); DELTA(inputs_checked);
    DELTA(inputs_missing); DELTA(inputs_foreign); DELTA(disconnects); DELTA(datagrams_in); DELTA(datagrams_out);
    DELTA(bytes_in); DELTA(bytes_out); DELTA(room_mismatches); DELTA(rooms_compared);
    DELTA(frames_unverified); DELTA(kernel_drops); DELTA(send_failures); DELTA(stray_datagrams);
    DELTA(catchup_blocks); DELTA(live_frames_dropped); DELTA(notices);
    DELTA(block_frames); DELTA(records_refused); DELTA(transport_drops);
    DELTA(cpu); DELTA(cpu_user); DELTA(cpu_system);
#undef DELTA
    player_counts(&welcomed, &result.running, &result.errors);
    result.lost_frames = lost + result.delta.gaps;
    json_bool(j, "ok", 1);
    json_totals(j, &result.delta);
    json_f(j, "seconds", seconds);
    json_f(j, "expected_frames_per_player", expected);
    json_u64(j, "lost_frames", result.lost_frames);
    json_u64(j, "short_players", short_players);
    json_f(j, "worst_shortfall", round(worst * 10) / 10);
    json_u64(j, "players", lg.count);
    json_u64(j, "running", result.running);
    json_u64(j, "errors", result.errors);
    json_str(j, "io", io_description());
    json_error_samples(j);
    json_u64(j, "latency_samples", lg.latency.samples);
    json_f(j, "latency_p50_ms", lg_histogram_quantile(&lg.latency, 0.50) * 1e3);
    json_f(j, "latency_p90_ms", lg_histogram_quantile(&lg.latency, 0.90) * 1e3);
    json_f(j, "latency_p99_ms", lg_histogram_quantile(&lg.latency, 0.99) * 1e3);
    json_f(j, "latency_max_ms", lg.latency.max_seconds * 1e3);
    json_f(j, "cpu_share", seconds > 0 ? result.delta.cpu / seconds : 0.0);
    json_f(j, "reply_delay_max_ms", lg.reply_delay_max * 1e3);
    json_f(j, "reply_delay_mean_ms", lg.reply_passes ? lg.reply_delay_sum / lg.reply_passes * 1e3 : 0.0);
    json_f(j, "timer_late_max_ms", lg.timer_late_max * 1e3);
    json_memory(j);
    lg.window_started = -1;
    return result;
}

/* ---- the loop -------------------------------------------------------------------------------- */

static int all_settled(uint32_t first, uint32_t last)
{
    uint32_t k;
    for (k = first; k < last; k++)
        if (!lg.players[k].running && !lg.players[k].failed)
            return 0;
    return 1;
}

static int all_running(uint32_t first, uint32_t last)
{
    uint32_t k;
    for (k = first; k < last; k++)
        if (!lg.players[k].running || lg.players[k].failed)
            return 0;
    return 1;
}

/* One pass: wait for datagrams or the next timer (at most max_wait), then serve. */
static void pump(double max_wait, int stdin_fd, void (*on_stdin)(void))
{
    struct epoll_event events[MAX_SOCKETS + 1];
    double now = monotonic_now(), wait = max_wait;
    int n, i, timeout_ms;
    if (lg.connected_upto < lg.count)
        wait = wait < 0.005 ? wait : 0.005;
    if (wait > 0)
        wait = wheel_next(now, wait) - now;
    timeout_ms = wait <= 0 ? 0 : (int)ceil(wait * 1000);
    n = epoll_wait(lg.epoll_fd, events, MAX_SOCKETS + 1, timeout_ms);
    for (i = 0; i < n; i++) {
        int key = (int)events[i].data.u32;
        if (key == MAX_SOCKETS) {
            if (on_stdin)
                on_stdin();
            (void)stdin_fd;
        } else {
            drain_socket(&lg.sockets[key]);
        }
    }
    now = monotonic_now();
    run_timers(now);
    connect_pending(now);
    flush_all();
    if (lg.pass_first_rx >= 0) {
        double delay = monotonic_now() - lg.pass_first_rx;
        if (delay > lg.reply_delay_max)
            lg.reply_delay_max = delay;
        lg.reply_delay_sum += delay;
        lg.reply_passes++;
        lg.pass_first_rx = -1;
    }
}

/* ---- agent mode ------------------------------------------------------------------------------ */

static struct {
    char buffer[65536];
    size_t used;
    int quit;
    int add_pending;
    uint32_t add_first, add_last;
    double add_deadline;
} agent;

static const char *json_field(const char *line, const char *key)
{
    char quoted[64];
    const char *at;
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    at = strstr(line, quoted);
    if (!at)
        return NULL;
    at = strchr(at + strlen(quoted), ':');
    if (!at)
        return NULL;
    at++;
    while (*at == ' ')
        at++;
    return at;
}

static void agent_command(const char *line)
{
    const char *cmd = json_field(line, "cmd");
    json_t j;
    if (cmd == NULL) {
        json_open(&j);
        json_bool(&j, "ok", 0);
        json_str(&j, "error", "no cmd");
        json_close(&j, stdout);
    } else if (strncmp(cmd, "\"add\"", 5) == 0) {
        const char *players = json_field(line, "players");
        const char *timeout = json_field(line, "timeout");
        long count = players ? strtol(players, NULL, 10) : 0;
        if (count < 0 || count > MAX_PLAYERS - (long)lg.count)
            count = 0;
        agent.add_first = lg.count;
        add_players((uint32_t)count);
        agent.add_last = lg.count;
        agent.add_pending = 1;
        agent.add_deadline = monotonic_now() + (timeout ? strtod(timeout, NULL) : 15.0);
    } else if (strncmp(cmd, "\"window_start\"", 14) == 0) {
        window_start();
        json_open(&j);
        json_bool(&j, "ok", 1);
        json_counts(&j);
        json_close(&j, stdout);
    } else if (strncmp(cmd, "\"window_end\"", 12) == 0) {
        json_open(&j);
        if (lg.window_started < 0) {
            json_bool(&j, "ok", 0);
            json_str(&j, "error", "window_end without window_start");
        } else {
            window_end(&j);
        }
        json_close(&j, stdout);
    } else if (strncmp(cmd, "\"stats\"", 7) == 0) {
        json_open(&j);
        json_bool(&j, "ok", 1);
        json_counts(&j);
        json_close(&j, stdout);
    } else if (strncmp(cmd, "\"quit\"", 6) == 0) {
        agent.quit = 1;
    } else {
        json_open(&j);
        json_bool(&j, "ok", 0);
        json_str(&j, "error", "unknown command");
        json_close(&j, stdout);
    }
}

static void agent_read(void)
{
    ssize_t got = read(STDIN_FILENO, agent.buffer + agent.used, sizeof agent.buffer - 1 - agent.used);
    char *line, *end;
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        agent.quit = 1;                     /* the controller went away */
        return;
    }
    if (got < 0)
        return;
    agent.used += (size_t)got;
    agent.buffer[agent.used] = 0;
    line = agent.buffer;
    while ((end = strchr(line, '\n')) != NULL) {
        *end = 0;
        if (*line)
            agent_command(line);
        line = end + 1;
    }
    agent.used -= (size_t)(line - agent.buffer);
    memmove(agent.buffer, line, agent.used);
    if (agent.used == sizeof agent.buffer - 1)
        agent.used = 0;                     /* a line this long is not a command */
}

static void agent_check_add(void)
{
    double now = monotonic_now();
    json_t j;
    if (!agent.add_pending)
        return;
    if (!all_settled(agent.add_first, agent.add_last) && now < agent.add_deadline)
        return;
    agent.add_pending = 0;
    json_open(&j);
    json_bool(&j, "ok", all_running(agent.add_first, agent.add_last));
    json_u64(&j, "added", agent.add_last - agent.add_first);
    json_counts(&j);
    json_close(&j, stdout);
}

static int serve_agent(double deadline)
{
    struct epoll_event event = {EPOLLIN, {.u32 = MAX_SOCKETS}};
    json_t j;
    fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
    if (epoll_ctl(lg.epoll_fd, EPOLL_CTL_ADD, STDIN_FILENO, &event) != 0)
        die("epoll on stdin: %s", strerror(errno));
    json_open(&j);
    json_bool(&j, "ok", 1);
    json_bool(&j, "ready", 1);
    json_str(&j, "io", io_description());
    json_u64(&j, "pid", (uint64_t)getpid());
    json_close(&j, stdout);
    while (!agent.quit && monotonic_now() < deadline) {
        pump(0.05, STDIN_FILENO, agent_read);
        agent_check_add();
    }
    return 0;
}

/* ---- standalone --------------------------------------------------------------------------- */

static int run_standalone(uint32_t players, double seconds, int as_json, double deadline)
{
    json_t j;
    window_result_t result;
    double start_deadline, window_deadline;
    int started, ok;
    add_players(players);
    start_deadline = monotonic_now() + 15.0 + players / lg.connect_rate;
    if (start_deadline > deadline)
        start_deadline = deadline;
    while (!all_settled(0, lg.count) && monotonic_now() < start_deadline)
        pump(0.05, -1, NULL);
    started = all_running(0, lg.count);
    window_start();
    window_deadline = monotonic_now() + seconds;
    if (window_deadline > deadline)
        window_deadline = deadline;
    while (monotonic_now() < window_deadline)
        pump(window_deadline - monotonic_now(), -1, NULL);
    json_open(&j);
    result = window_end(&j);
    json_bool(&j, "all_running", started);
    ok = started && result.lost_frames == 0 && result.errors == 0 && result.delta.duplicates == 0
         && result.delta.room_mismatches == 0 && result.delta.inputs_foreign == 0;
    json_bool(&j, "checks_passed", ok);
    if (as_json) {
        json_close(&j, stdout);
    } else {
        json_close(&j, stderr);             /* every figure, for the record */
        printf("loadgen_c: %u players (%llu running), %.1f s\n", lg.count,
               (unsigned long long)result.running, seconds);
        printf("  frames %llu, lost %llu (gaps %llu), duplicates %llu, room mismatches %llu, "
               "inputs late %llu and foreign %llu of %llu checked\n",
               (unsigned long long)result.delta.frames, (unsigned long long)result.lost_frames,
               (unsigned long long)result.delta.gaps, (unsigned long long)result.delta.duplicates,
               (unsigned long long)result.delta.room_mismatches,
               (unsigned long long)result.delta.inputs_missing,
               (unsigned long long)result.delta.inputs_foreign,
               (unsigned long long)result.delta.inputs_checked);
        printf("  input-to-frame latency ms: p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
               lg_histogram_quantile(&lg.latency, 0.5) * 1e3,
               lg_histogram_quantile(&lg.latency, 0.9) * 1e3,
               lg_histogram_quantile(&lg.latency, 0.99) * 1e3, lg.latency.max_seconds * 1e3);
        printf("  loader CPU %.1f %% (user %.1f, system %.1f); %s\n",
               100 * result.delta.cpu / seconds, 100 * result.delta.cpu_user / seconds,
               100 * result.delta.cpu_system / seconds, ok ? "checks passed" : "CHECKS FAILED");
    }
    return ok ? 0 : 1;
}

/* ---- setup ------------------------------------------------------------------------------------ */

static void open_sockets(void)
{
    int k, on = 1, size = 8 << 20, pmtu = IP_PMTUDISC_DO;
    lg.epoll_fd = epoll_create1(0);
    if (lg.epoll_fd < 0)
        die("epoll_create1: %s", strerror(errno));
    for (k = 0; k < lg.socket_count; k++) {
        socket_out_t *s = &lg.sockets[k];
        struct sockaddr_in any = {.sin_family = AF_INET};
        struct epoll_event event = {EPOLLIN, {.u32 = (uint32_t)k}};
        int i;
        s->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s->fd < 0 || setsockopt(s->fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on) != 0)
            die("socket with IP_PKTINFO: %s", strerror(errno));
        setsockopt(s->fd, SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof on);
        /* DF set: an unconnected socket's datagrams then skip the kernel's shared IP id
         * generator (__ip_select_ident, 5 % of the loader's time without it). */
        setsockopt(s->fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
        /* A tick's frames for thousands of players land at once: a deep receive queue (FORCE
         * passes rmem_max when privileged; otherwise the plain option, capped by it). */
        if (setsockopt(s->fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
            setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
        if (setsockopt(s->fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
            setsockopt(s->fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
        if (bind(s->fd, (struct sockaddr *)&any, sizeof any) != 0)
            die("bind: %s", strerror(errno));
        if (epoll_ctl(lg.epoll_fd, EPOLL_CTL_ADD, s->fd, &event) != 0)
            die("epoll_ctl: %s", strerror(errno));
        s->buffers = malloc((size_t)BATCH * lg.config.mtu);
        if (!s->buffers)
            die("out of memory");
        for (i = 0; i < BATCH; i++) {
            struct msghdr *m = &s->msgs[i].msg_hdr;
            struct cmsghdr *c;
            memset(m, 0, sizeof *m);
            m->msg_name = &lg.server;
            m->msg_namelen = sizeof lg.server;
            m->msg_iov = &s->iov[i];
            m->msg_iovlen = 1;
            m->msg_control = s->control[i].bytes;
            m->msg_controllen = sizeof s->control[i].bytes;
            c = CMSG_FIRSTHDR(m);
            c->cmsg_level = IPPROTO_IP;
            c->cmsg_type = IP_PKTINFO;
            c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
        }
    }
}

static void close_all(void)
{
    double now = monotonic_now();
    uint32_t k;
    /* Tell the relay at once, so that a following measurement starts from a clean server. */
    for (k = 0; k < lg.connected_upto && lg.minimal; k++) {
        mc_disconnect(&lg.minis[k]);
        pull_datagrams(&lg.players[k], now);
    }
    for (k = 0; k < lg.connected_upto && !lg.minimal; k++) {
        if (relay_client_get_state(lg.players[k].client) != RELAY_STATE_IDLE) {
            relay_client_disconnect(lg.players[k].client, now);
            pull_datagrams(&lg.players[k], now);
        }
    }
    flush_all();
    for (k = 0; k < lg.count && !lg.minimal; k++)
        relay_client_destroy(lg.players[k].client);
}

static void parse_server(const char *text)
{
    char host[64];
    const char *colon = strrchr(text, ':');
    long port;
    if (!colon || (size_t)(colon - text) >= sizeof host)
        die("--server %s: expected HOST:PORT", text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = 0;
    if (strcmp(host, "localhost") == 0 || host[0] == 0)
        strcpy(host, "127.0.0.1");
    port = strtol(colon + 1, NULL, 10);
    lg.server.sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &lg.server.sin_addr) != 1 || port < 1 || port > 65535)
        die("--server %s: expected an IPv4 HOST:PORT", text);
    if ((ntohl(lg.server.sin_addr.s_addr) >> 24) != 127)
        die("--server %s: this load generator only targets loopback (127.0.0.0/8)", text);
    lg.server.sin_port = htons((uint16_t)port);
}

/* --tokens FILE: connect tokens ("rt1..." text), one per line, minted for rooms
 * PREFIX-<i / 8> and players p<i % 8> (benchmarks/capacity.py --security token writes it). */
static void read_tokens(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    uint32_t capacity = 0;
    if (f == NULL)
        die("--tokens %s: %s", path, strerror(errno));
    while (fgets(line, sizeof line, f) != NULL) {
        size_t n = strcspn(line, "\r\n");
        if (n == 0)
            continue;
        line[n] = 0;
        if (lg.token_count == capacity) {
            capacity = capacity ? 2 * capacity : 1024;
            if (!(lg.tokens = realloc(lg.tokens, capacity * sizeof *lg.tokens)))
                die("out of memory for %u tokens", capacity);
        }
        if (!(lg.tokens[lg.token_count++] = strdup(line)))
            die("out of memory for tokens");
    }
    fclose(f);
    if (lg.token_count == 0)
        die("--tokens %s: no token in it", path);
}

static void usage(void)
{
    fputs("usage: loadgen_c [--server HOST:PORT] [--players N] [--seconds S] [--json]\n"
          "                 [--agent] [--tick-rate HZ] [--input-delay FRAMES] [--sockets K]\n"
          "                 [--connect-rate PER_S] [--max-lifetime S]\n"
          "                 [--client minimal|library] [--room-prefix PREFIX]\n"
          "                 [--tokens FILE (token mode, library client: one token per line,\n"
          "                  player i takes line i; rooms PREFIX-<i / 8>, players p<i % 8>)]\n",
          stderr);
    exit(2);
}

int main(int argc, char **argv)
{
    uint32_t players = 64;
    double seconds = 10.0, deadline;
    int as_json = 0, agent_mode = 0, i, status;
    const char *room_prefix = NULL, *tokens_path = NULL;
    parse_server("127.0.0.1:7777");
    lg.tick_rate = 30;
    lg.input_delay = 2;
    lg.socket_count = 8;
    lg.connect_rate = 4000;
    lg.max_lifetime = 1800;
    lg.minimal = 1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) { as_json = 1; continue; }
        if (strcmp(a, "--agent") == 0) { agent_mode = 1; continue; }
        if (v == NULL)
            usage();
        i++;
        if (strcmp(a, "--server") == 0) parse_server(v);
        else if (strcmp(a, "--players") == 0) players = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--seconds") == 0) seconds = strtod(v, NULL);
        else if (strcmp(a, "--tick-rate") == 0) lg.tick_rate = atoi(v);
        else if (strcmp(a, "--input-delay") == 0) lg.input_delay = atoi(v);
        else if (strcmp(a, "--sockets") == 0) lg.socket_count = atoi(v);
        else if (strcmp(a, "--connect-rate") == 0) lg.connect_rate = strtod(v, NULL);
        else if (strcmp(a, "--max-lifetime") == 0) lg.max_lifetime = strtod(v, NULL);
        else if (strcmp(a, "--client") == 0 && strcmp(v, "minimal") == 0) lg.minimal = 1;
        else if (strcmp(a, "--client") == 0 && strcmp(v, "library") == 0) lg.minimal = 0;
        else if (strcmp(a, "--room-prefix") == 0) room_prefix = v;
        else if (strcmp(a, "--tokens") == 0) tokens_path = v;
        else usage();
    }
    if (tokens_path != NULL) {
        if (lg.minimal)
            die("--tokens needs --client library (the minimal client speaks open mode only)");
        read_tokens(tokens_path);
    }
    if (players < 1 || players > MAX_PLAYERS || lg.tick_rate < 1 || lg.input_delay < 1
        || lg.input_delay > SENT_RING / 2 || lg.socket_count < 1 || lg.socket_count > MAX_SOCKETS
        || !(lg.connect_rate >= 1))
        usage();
    if (seconds < 0.1)
        seconds = 0.1;
    if (seconds > 600)
        seconds = 600;
    if (!(lg.max_lifetime > 0) || lg.max_lifetime > 3600)
        lg.max_lifetime = 3600;
    deadline = monotonic_now() + lg.max_lifetime;
    if (room_prefix != NULL) {
        if (strlen(room_prefix) >= sizeof lg.room_prefix)
            die("--room-prefix longer than %zu bytes", sizeof lg.room_prefix - 1);
        snprintf(lg.room_prefix, sizeof lg.room_prefix, "%s", room_prefix);
    } else {
        snprintf(lg.room_prefix, sizeof lg.room_prefix, "capc%d-%ld", (int)getpid(),
                 (long)(time(NULL) % 100000));
    }

    /* Small buffers: a room of 8 with 16-byte inputs makes ~200-byte frames, and rooms start
     * full (no history to fetch), so the defaults' megabytes per client would only be address
     * space. Catch-up blocks of a few hundred frames still fit. */
    relay_client_default_config(&lg.config);
    lg.config.max_message_size = 4096;
    lg.config.reassembly_limit = 8192;
    lg.config.max_block_size = 65536;
    lg.config.max_history_size = 65536;
    lg.config.frame_buffer_bytes = 8192;
    lg.config.frame_buffer_count = 64;
    lg.config.send_queue = 64;
    lg.config.event_queue = 16;
    lg.config.max_input_size = 64;
    lg.config.input_delay = (uint32_t)lg.input_delay;
    if (relay_client_memory_size(&lg.config) == 0)
        die("invalid client config");

    if (lg.config.mtu < MC_MTU)
        die("mtu below the minimal client's %d", MC_MTU);
    lg.connect_seed = (uint64_t)getpid() << 32 ^ (uint64_t)(monotonic_now() * 1e9);
    lg.wheel_origin = monotonic_now();
    lg.pass_first_rx = -1;
    lg.window_started = -1;
    lg.connect_refill_at = monotonic_now();
    open_sockets();
    lg.rss_before_players = rss_bytes();
    status = agent_mode ? serve_agent(deadline)
                        : run_standalone(players, seconds, as_json, deadline);
    close_all();
    return status;
}
