/*
 * client.c - the relay client's sans-I/O core (relay_client.h): rooms, inputs, checksums,
 * events, and the frame store that merges live FRAMEs and history blocks by frame number so
 * the game takes every frame exactly once, in order, from frame 0 (RELAY_PROTOCOL 9.3).
 *
 * Memory: one allocation in relay_client_create, laid out by compute_layout():
 *   the client struct | conn | live ring bytes | live ring index | history buffer |
 *   two decoded-frame arenas | event queue | zlib memory | message scratch.
 *
 * The frame store:
 *   - live FRAMEs arrive in increasing order on STREAM; they go into a byte ring with an index
 *     ring (frame_buffer_bytes / frame_buffer_count). When either is full the new frame is
 *     dropped and counted: `have` then stops advancing, and the relay's catch-up block repairs
 *     the gap (RELAY_PROTOCOL 9.2). A frame below the newest one held is dropped too (the
 *     relay only sends live frames in order; after a reconnect they start above every frame
 *     of the old connection).
 *   - blocks are inflated into the history buffer (max_history_size) as up to RC_MAX_SEGMENTS
 *     runs of consecutive frames, read lazily with a cursor. A new block first discards the
 *     runs it covers and the frames already taken, compacts what is left to the front, and is
 *     inflated behind it: nothing still needed is lost. A block that does not fit is dropped
 *     (counted in datagrams_dropped).
 *   - frames are decoded when the game takes them, in order, against the previous frame's
 *     inputs (kept in the decoded arenas, so they survive reconnects).
 */
#include "client_internal.h"
#include "crypto.h"
#include "messages.h"
#include "wire.h"

#include <stdlib.h>
#include <string.h>

/* ---- configuration and memory ------------------------------------------------------------- */

uint32_t relay_client_version(void)
{
    return ((uint32_t)RELAY_CLIENT_VERSION_MAJOR << 16) | RELAY_CLIENT_VERSION_MINOR;
}

void relay_client_default_config(relay_client_config_t *config)
{
    rc_conn_config transport;          /* the transport's defaults are written once, in conn.c */
    if (config == NULL)
        return;
    rc_conn_default_config(&transport);
    memset(config, 0, sizeof *config);
    config->mtu = transport.mtu;
    config->connect_timeout = transport.connect_timeout;
    config->peer_timeout = transport.peer_timeout;
    config->heartbeat_interval = transport.heartbeat_interval;
    config->ack_delay = transport.ack_delay;
    config->max_message_size = transport.max_message_size;
    config->reassembly_limit = transport.reassembly_limit;
    config->max_block_size = transport.max_block_size;
    config->send_queue = transport.send_queue;
    config->max_history_size = 32u * 1024 * 1024;
    config->frame_buffer_bytes = 1024 * 1024;
    config->frame_buffer_count = 4096;
    config->input_delay = 2;
    config->auto_input_delay = 0;
    config->max_input_size = 256;
    config->event_queue = 256;
}

#define ALIGN16(x) (((x) + 15) & ~(size_t)15)
#define SCRATCH_EXTRA 256             /* INPUT header, or a JOIN with two 64-byte names */

typedef struct layout {
    size_t conn, ring, live, history, arena0, arena1, events, zmemory, scratch, total;
    size_t arena_size;
} layout;

static int conn_config_from(const relay_client_config_t *c, rc_conn_config *cc)
{
    rc_conn_default_config(cc);
    cc->mtu = c->mtu;
    cc->connect_timeout = c->connect_timeout;
    cc->peer_timeout = c->peer_timeout;
    cc->heartbeat_interval = c->heartbeat_interval;
    cc->ack_delay = c->ack_delay;
    cc->max_message_size = c->max_message_size;
    cc->reassembly_limit = c->reassembly_limit;
    cc->max_block_size = c->max_block_size;
    cc->send_queue = c->send_queue;
    cc->max_send_size = c->mtu - 25 - 16;
    return rc_conn_validate_config(cc);
}

static int valid_config(const relay_client_config_t *c)
{
    if ((c->allocate == NULL) != (c->release == NULL))
        return 0;
    if (c->mtu < 576 || c->mtu > RELAY_MAX_DATAGRAM)
        return 0;
    if (!(c->connect_timeout > 0) || !(c->peer_timeout > 0) || !(c->heartbeat_interval > 0)
        || !(c->ack_delay >= 0))
        return 0;
    if (c->max_message_size < 1024 || c->max_block_size < 1024 || c->max_history_size < 1024)
        return 0;
    if (c->frame_buffer_count < 1 || c->frame_buffer_bytes < c->max_message_size)
        return 0;
    if (c->input_delay < 1 || c->event_queue < 1 || c->send_queue < 1)
        return 0;
    if (c->max_input_size > 65535 || c->max_input_size + 32 > c->mtu - 25 - 16)
        return 0;
    return 1;
}

static int compute_layout(const relay_client_config_t *c, rc_conn_config *cc, layout *l)
{
    size_t at;
    if (c == NULL || !valid_config(c) || conn_config_from(c, cc) != 0)
        return -1;
    at = ALIGN16(sizeof(struct relay_client));
    l->conn = at;
    at += ALIGN16(rc_conn_memory_size(cc));
    l->ring = at;
    at += ALIGN16(c->frame_buffer_bytes);
    l->live = at;
    at += ALIGN16((size_t)c->frame_buffer_count * sizeof(rc_live_entry));
    l->history = at;
    at += ALIGN16(c->max_history_size);
    /* Decoded inputs and events of one frame: as large as a FRAME message may be. */
    l->arena_size = c->max_message_size;
    l->arena0 = at;
    at += ALIGN16(l->arena_size);
    l->arena1 = at;
    at += ALIGN16(l->arena_size);
    l->events = at;
    at += ALIGN16((size_t)c->event_queue * sizeof(relay_event_t));
    l->zmemory = at;
    at += ALIGN16(RF_INFLATE_MEMORY);
    l->scratch = at;
    at += ALIGN16((size_t)c->max_input_size + SCRATCH_EXTRA);
    l->total = at;
    return 0;
}

size_t relay_client_memory_size(const relay_client_config_t *config)
{
    rc_conn_config cc;
    layout l;
    return compute_layout(config, &cc, &l) == 0 ? l.total : 0;
}

relay_client_t *relay_client_create(const relay_client_config_t *config)
{
    rc_conn_config cc;
    layout l;
    uint8_t *memory;
    relay_client_t *client;
    rc_conn_handler handler;

    if (compute_layout(config, &cc, &l) != 0)
        return NULL;
    if (config->random_bytes == NULL || config->allocate == NULL)
        if (rc_crypto_init() != 0)
            return NULL;
    memory = config->allocate ? (uint8_t *)config->allocate(config->allocator_context, l.total)
                              : (uint8_t *)malloc(l.total);
    if (memory == NULL)
        return NULL;
    memset(memory, 0, ALIGN16(sizeof(struct relay_client)));
    client = (relay_client_t *)memory;
    client->config = *config;
    client->conn_config = cc;
    handler.context = client;
    handler.on_connected = rc_client_on_connected;
    handler.on_message = rc_client_on_message;
    handler.on_block = rc_client_on_block;
    handler.on_disconnected = rc_client_on_disconnected;
    client->conn = rc_conn_init(memory + l.conn, &cc, &handler);
    if (client->conn == NULL) {
        if (config->release)
            config->release(config->allocator_context, memory);
        else
            free(memory);
        return NULL;
    }
    client->ring = memory + l.ring;
    client->ring_capacity = config->frame_buffer_bytes;
    client->live = (rc_live_entry *)(void *)(memory + l.live);
    client->live_capacity = config->frame_buffer_count;
    client->history = memory + l.history;
    client->history_capacity = config->max_history_size;
    rf_frame_init(&client->decoded[0], memory + l.arena0, l.arena_size);
    rf_frame_init(&client->decoded[1], memory + l.arena1, l.arena_size);
    client->events = (relay_event_t *)(void *)(memory + l.events);
    client->event_capacity = config->event_queue;
    client->zmemory = memory + l.zmemory;
    client->scratch = memory + l.scratch;
    client->scratch_capacity = (size_t)config->max_input_size + SCRATCH_EXTRA;
    client->input_delay = config->input_delay;
    client->last_input_frame = -1;
    client->slot = -1;
    client->state = RELAY_STATE_IDLE;
    client->socket_handle = -1;
    return client;
}

void relay_client_destroy(relay_client_t *client)
{
    if (client == NULL)
        return;
    rc_driver_close(client);
    if (client->config.release)
        client->config.release(client->config.allocator_context, client);
    else
        free(client);
}

void rc_client_set_send_hook(relay_client_t *client,
                             void (*hook)(void *context, int channel, const uint8_t *data,
                                          size_t length),
                             void *context)
{
    client->send_hook = hook;
    client->send_hook_context = context;
}

/* ---- events ---------------------------------------------------------------------------------- */

static relay_event_t *push_event(relay_client_t *client, int type)
{
    relay_event_t *event;
    if (client->event_count == client->event_capacity) {
        client->event_head = (client->event_head + 1) % client->event_capacity;
        client->event_count--;
        client->events_dropped++;
    }
    event = &client->events[(client->event_head + client->event_count) % client->event_capacity];
    client->event_count++;
    memset(event, 0, sizeof *event);
    event->type = type;
    event->slot = -1;
    return event;
}

int relay_client_poll_event(relay_client_t *client, relay_event_t *event)
{
    if (client == NULL || event == NULL)
        return RELAY_EINVAL;
    if (client->event_count == 0)
        return 0;
    *event = client->events[client->event_head];
    client->event_head = (client->event_head + 1) % client->event_capacity;
    client->event_count--;
    return 1;
}

static void set_text(char *out, size_t cap, const char *text)
{
    size_t n = strlen(text);
    if (n > cap - 1)
        n = cap - 1;
    memcpy(out, text, n);
    out[n] = '\0';
}

/* ---- the live ring ------------------------------------------------------------------------- */

static rc_live_entry *live_at(const relay_client_t *client, uint32_t k)
{
    return &client->live[(client->live_head + k) % client->live_capacity];
}

/* Drops live frames the game has taken. */
static void live_trim(relay_client_t *client)
{
    while (client->live_count > 0 && live_at(client, 0)->number < client->next) {
        client->live_head = (client->live_head + 1) % client->live_capacity;
        client->live_count--;
    }
    if (client->live_count == 0) {
        client->live_head = 0;
        client->ring_tail = 0;
    }
}

/* Index k of frame number in the live ring, or -1. */
static int64_t live_find(const relay_client_t *client, uint64_t number)
{
    uint32_t low = 0, high = client->live_count;
    while (low < high) {
        uint32_t middle = low + (high - low) / 2;
        uint32_t value = live_at(client, middle)->number;
        if (value == number)
            return middle;
        if (value < number)
            low = middle + 1;
        else
            high = middle;
    }
    return -1;
}

/* Where length bytes go in the ring, or -1 if they do not fit. */
static int64_t ring_allocate(const relay_client_t *client, size_t length)
{
    size_t head, tail = client->ring_tail;
    if (client->live_count == 0)
        return length <= client->ring_capacity ? 0 : -1;
    head = live_at(client, 0)->offset;
    if (head < tail) {                       /* not wrapped: [head, tail) in use */
        if (client->ring_capacity - tail >= length)
            return (int64_t)tail;
        if (length <= head)
            return 0;
        return -1;
    }
    return head - tail >= length ? (int64_t)tail : -1;   /* wrapped: [tail, head) free */
}

/* ---- history segments ---------------------------------------------------------------------- */

static int segment_holds(const rc_segment *segment, uint64_t number)
{
    return segment->first <= number && number < segment->end;
}

static int held_in_segments(const relay_client_t *client, uint64_t number)
{
    int k;
    for (k = 0; k < client->segment_count; k++)
        if (segment_holds(&client->segments[k], number))
            return 1;
    return 0;
}

/* Moves a segment's cursor to frame number (>= first, < end). */
static int segment_seek(relay_client_t *client, rc_segment *segment, uint64_t number)
{
    while (segment->first < number) {
        const uint8_t *data;
        size_t length;
        if (rf_history_next(client->history, segment->limit, &segment->position, &data, &length))
            return -1;
        segment->first++;
    }
    return 0;
}

static void remove_segment(relay_client_t *client, int k)
{
    memmove(&client->segments[k], &client->segments[k + 1],
            (size_t)(client->segment_count - k - 1) * sizeof(rc_segment));
    client->segment_count--;
}

/* Drops segments whose frames were all taken, and with them history buffer space. */
static void segments_trim(relay_client_t *client)
{
    int k = 0;
    while (k < client->segment_count) {
        if (client->segments[k].end <= client->next)
            remove_segment(client, k);
        else
            k++;
    }
    if (client->segment_count == 0)
        client->history_used = 0;
}

static int frame_held(const relay_client_t *client, uint64_t number)
{
    return number >= client->next && (held_in_segments(client, number) || live_find(client, number) >= 0);
}

/* The bytes of frame `next`, or 0 if not held. */
static int find_next(relay_client_t *client, const uint8_t **data, size_t *length)
{
    int s;
    live_trim(client);
    segments_trim(client);
    if (client->live_count > 0 && live_at(client, 0)->number == client->next) {
        rc_live_entry *entry = live_at(client, 0);
        *data = client->ring + entry->offset;
        *length = entry->length;
        return 1;
    }
    for (s = 0; s < client->segment_count; s++) {
        rc_segment *segment = &client->segments[s];
        if (segment_holds(segment, client->next)) {
            if (segment_seek(client, segment, client->next) == 0) {
                size_t position = segment->position;
                if (rf_history_next(client->history, segment->limit, &position, data, length) == 0)
                    return 1;
            }
            return -1;     /* parsed at arrival, so this does not happen */
        }
    }
    return 0;
}

/* ---- receiving ----------------------------------------------------------------------------- */

/* The frame stream cannot go on (a frame that does not decode, a history block that does not
 * fit or does not parse): the game hears why at once, the relay gets
 * DISCONNECT(protocol_error), the frames already held can still be taken, and then
 * relay_client_next_frame returns RELAY_ESTATE. Frames are never skipped. */
static void break_stream(relay_client_t *client, const char *code, const char *text)
{
    relay_event_t *event;
    if (client->broken)
        return;
    client->broken = 1;
    event = push_event(client, RELAY_EVENT_DISCONNECTED);
    set_text(event->code, sizeof event->code, code);
    set_text(event->text, sizeof event->text, text);
    if (client->state != RELAY_STATE_IDLE)
        rc_conn_disconnect(client->conn, RC_REASON_PROTOCOL_ERROR, client->now);
    client->state = RELAY_STATE_IDLE;
}

static void store_live(relay_client_t *client, const uint8_t *data, size_t length)
{
    uint32_t number;
    int64_t offset;
    rc_live_entry *entry;
    if (rf_frame_number(data, length, &number) != RF_OK) {
        /* its number unknown, the stream would wait for it forever */
        break_stream(client, "bad_frame", "a FRAME from the relay does not decode");
        return;
    }
    if (number < client->next || held_in_segments(client, number)) {
        client->frames_duplicate++;
        return;
    }
    live_trim(client);
    if (client->live_count > 0 && number <= live_at(client, client->live_count - 1)->number) {
        if (live_find(client, number) >= 0)
            client->frames_duplicate++;
        else
            client->live_frames_dropped++;     /* out of order: a block repairs it */
        return;
    }
    if (client->live_count == client->live_capacity || length > 0xFFFFFFFFu
        || (offset = ring_allocate(client, length)) < 0) {
        client->live_frames_dropped++;
        return;
    }
    memcpy(client->ring + offset, data, length);
    entry = live_at(client, client->live_count);
    entry->number = number;
    entry->length = (uint32_t)length;
    entry->offset = (size_t)offset;
    client->live_count++;
    client->ring_tail = (size_t)offset + length;
    client->frames_received++;
}

void rc_client_on_block(void *context, const uint8_t *data, size_t length)
{
    relay_client_t *client = (relay_client_t *)context;
    uint32_t first, count, parsed_first, parsed_count;
    uint64_t end, number, fresh = 0;
    size_t used = 0, produced, offset;
    int k, status;

    if (rf_history_peek(data, length, client->zmemory, &first, &count) != RF_OK) {
        break_stream(client, "bad_history", "a history block does not decode");
        return;
    }
    end = (uint64_t)first + count;
    live_trim(client);
    segments_trim(client);
    if (end <= client->next) {                         /* every frame already taken */
        client->blocks_received++;
        client->frames_duplicate += count;
        return;
    }
    /* Frames new to the store (counted before the runs it covers are dropped). */
    for (number = first > client->next ? first : client->next; number < end; number++)
        if (!frame_held(client, number))
            fresh++;
    /* Drop the runs this block covers (from the first frame still needed). */
    k = 0;
    while (k < client->segment_count) {
        rc_segment *segment = &client->segments[k];
        uint64_t needed = segment->first > client->next ? segment->first : client->next;
        if (first <= needed && segment->end <= end)
            remove_segment(client, k);
        else
            k++;
    }
    if (client->segment_count == RC_MAX_SEGMENTS) {
        break_stream(client, "history_too_large", "more separate runs of history frames than "
                     "the client keeps: take frames sooner");
        return;
    }
    /* Compact the rest to the front, frames already taken left out. */
    for (k = 0; k < client->segment_count; k++) {
        rc_segment *segment = &client->segments[k];
        size_t size;
        if (segment->first < client->next && segment_seek(client, segment, client->next) != 0) {
            remove_segment(client, k--);
            continue;
        }
        size = segment->limit - segment->position;
        memmove(client->history + used, client->history + segment->position, size);
        segment->position = used;
        segment->limit = used + size;
        used += size;
    }
    client->history_used = used;
    status = rf_history_inflate(data, length, client->zmemory, client->history + used,
                                client->history_capacity - used, &produced);
    if (status != RF_OK
        || rf_history_parse(client->history + used, produced, &parsed_first, &parsed_count,
                            &offset) != RF_OK
        || parsed_first != first || parsed_count != count) {
        if (status == RF_TOO_LARGE)
            break_stream(client, "history_too_large", "a history block inflates past "
                         "max_history_size: raise it (relay_client_config_t)");
        else
            break_stream(client, "bad_history", "a history block does not decode");
        return;
    }
    client->frames_received += fresh;
    client->frames_duplicate += count - fresh;
    client->blocks_received++;
    /* A block continuing the last run (the relay splits a long history into consecutive
     * blocks) extends it: its frames move down over the block's header, so a long history
     * takes one run however many blocks it came in. */
    if (client->segment_count > 0) {
        rc_segment *last = &client->segments[client->segment_count - 1];
        if (last->limit == used && first <= last->end && end > last->end) {
            size_t position = used + offset;
            for (number = first; number < last->end; number++) {
                const uint8_t *frame;
                size_t frame_length;
                if (rf_history_next(client->history, used + produced, &position, &frame,
                                    &frame_length) != RF_OK)
                    return;      /* parsed above: cannot happen */
            }
            memmove(client->history + used, client->history + position, used + produced - position);
            last->end = end;
            last->limit = used + (used + produced - position);
            client->history_used = last->limit;
            return;
        }
    }
    {
        rc_segment *segment = &client->segments[client->segment_count++];
        segment->first = first;
        segment->end = end;
        segment->position = used + offset;
        segment->limit = used + produced;
    }
    client->history_used = used + produced;
}

static int room_state_of(int state)
{
    return state;       /* RM_STATE_* and relay_room_state_t share their values */
}

static void on_relay_message(relay_client_t *client, const uint8_t *data, size_t length)
{
    rm_message m;
    relay_event_t *event;
    int status = rm_decode(data, length, &m);
    if (status < 0) {
        client->datagrams_dropped++;
        return;
    }
    if (status == 0)
        return;                                   /* a type we do not know: ignored */
    switch (m.type) {
    case RM_WELCOME:
        client->welcomed = 1;
        client->live_from = m.next_frame;
        client->slot = m.slot;
        client->room_state = room_state_of(m.state);
        if (m.spectator)
            client->spectator = 1;
        client->state = RELAY_STATE_JOINED;
        event = push_event(client, RELAY_EVENT_WELCOME);
        event->room_state = client->room_state;
        event->slot = m.slot;
        event->spectator = m.spectator;
        event->tick_rate = m.tick_rate;
        event->next_frame = m.next_frame;
        event->history = m.history;
        set_text(event->code, sizeof event->code, m.room);
        set_text(event->text, sizeof event->text, m.player);
        break;
    case RM_REFUSED:
        event = push_event(client, RELAY_EVENT_REFUSED);
        set_text(event->code, sizeof event->code, m.code);
        set_text(event->text, sizeof event->text, m.text);
        break;
    case RM_ROOM_STATE:
        client->room_state = room_state_of(m.state);
        if (m.state == RM_STATE_ENDED) {
            client->final_frames = m.frame;
            if (client->state == RELAY_STATE_JOINED)
                client->state = RELAY_STATE_CONNECTED;     /* no longer in a room */
        }
        event = push_event(client, RELAY_EVENT_ROOM_STATE);
        event->room_state = client->room_state;
        event->frame = m.frame;
        set_text(event->code, sizeof event->code, m.code);
        break;
    case RM_DESYNC:
        event = push_event(client, RELAY_EVENT_DESYNC);
        event->frame = m.frame;
        set_text(event->code, sizeof event->code, m.code);
        set_text(event->text, sizeof event->text, m.text);
        break;
    case RM_NOTICE:
        event = push_event(client, RELAY_EVENT_NOTICE);
        set_text(event->code, sizeof event->code, m.code);
        set_text(event->text, sizeof event->text, m.text);
        break;
    case RM_INPUT_DELAY:
        if (m.delay_frames >= 1) {
            client->advice_valid = 1;
            client->advice = m.delay_frames;
        }
        event = push_event(client, RELAY_EVENT_INPUT_DELAY);
        event->delay_frames = m.delay_frames;
        event->response_ms = m.response_ms;
        event->late = m.late;
        event->inputs = m.inputs;
        break;
    default:
        break;
    }
}

void rc_client_on_message(void *context, int channel, const uint8_t *data, size_t length)
{
    relay_client_t *client = (relay_client_t *)context;
    (void)channel;
    if (length == 0) {
        client->datagrams_dropped++;
        return;
    }
    if (data[0] == RM_FRAME_MARKER)
        store_live(client, data, length);
    else
        on_relay_message(client, data, length);
}

void rc_client_on_connected(void *context)
{
    relay_client_t *client = (relay_client_t *)context;
    if (client->state == RELAY_STATE_CONNECTING)
        client->state = RELAY_STATE_CONNECTED;
    push_event(client, RELAY_EVENT_CONNECTED);
}

void rc_client_on_disconnected(void *context, const char *reason)
{
    relay_client_t *client = (relay_client_t *)context;
    relay_event_t *event;
    client->state = RELAY_STATE_IDLE;
    client->leave_pending = 0;
    if (client->broken)
        return;                 /* break_stream reported why */
    event = push_event(client, RELAY_EVENT_DISCONNECTED);
    set_text(event->code, sizeof event->code, reason ? reason : "");
}

/* ---- connecting ---------------------------------------------------------------------------- */

static int valid_name(const char *name)
{
    size_t n;
    if (name == NULL)
        return 0;
    n = strlen(name);
    return n >= 1 && n <= RELAY_MAX_NAME;
}

static int queue(relay_client_t *client, int channel, int length)
{
    if (length < 0)
        return RELAY_EINVAL;
    if (client->send_hook)
        client->send_hook(client->send_hook_context, channel, client->scratch, (size_t)length);
    return rc_conn_send(client->conn, channel, client->scratch, (size_t)length) == 0 ? RELAY_OK
                                                                                    : RELAY_EFULL;
}

static int start_connection(relay_client_t *client, double now)
{
    uint32_t connect_id = 0;
    int status;
    while (connect_id == 0) {
        uint8_t bytes[4];
        if (client->config.random_bytes)
            client->config.random_bytes(client->config.random_context, bytes, sizeof bytes);
        else
            rc_random_bytes(bytes, sizeof bytes);
        connect_id = (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16
                     | (uint32_t)bytes[3] << 24;
    }
    client->now = now;
    if (client->has_token)
        status = rc_conn_connect(client->conn, connect_id, client->token.private_part,
                                 client->token.private_length, client->token.client_key,
                                 client->token.server_key, now);
    else
        status = rc_conn_connect(client->conn, connect_id, NULL, 0, NULL, NULL, now);
    if (status != 0)
        return RELAY_ESTATE;
    client->state = RELAY_STATE_CONNECTING;
    client->connect_called = 1;
    client->welcomed = 0;
    client->leave_pending = 0;
    client->slot = -1;
    return queue(client, RC_CONTROL,
                 rm_encode_join(client->scratch, client->scratch_capacity, client->room,
                                client->player, client->spectator));
}

int relay_client_connect(relay_client_t *client, const char *room, const char *player,
                         int spectator, const char *token, double now)
{
    if (client == NULL)
        return RELAY_EINVAL;
    if (token != NULL) {
        if (rc_token_decode(token, &client->token) != 0)
            return RELAY_ETOKEN;
        client->has_token = 1;
        if (room == NULL)
            room = client->token.room;
        if (player == NULL)
            player = client->token.player;
    } else {
        client->has_token = 0;
    }
    if (!valid_name(room) || !valid_name(player))
        return RELAY_EINVAL;
    memmove(client->room, room, strlen(room) + 1);
    memmove(client->player, player, strlen(player) + 1);
    client->spectator = spectator ? 1 : 0;
    /* a new frame stream */
    client->next = 0;
    client->current = 0;
    client->have_frame = 0;
    client->decoded[0].slot_count = 0;
    client->decoded[0].event_count = 0;
    client->decoded[1].slot_count = 0;
    client->decoded[1].event_count = 0;
    client->live_head = client->live_count = 0;
    client->ring_tail = 0;
    client->segment_count = 0;
    client->history_used = 0;
    client->room_state = RELAY_ROOM_NONE;
    client->final_frames = 0;
    client->broken = 0;
    client->undecodable = 0;
    client->last_input_frame = -1;
    client->advice_valid = 0;
    return start_connection(client, now);
}

int relay_client_reconnect(relay_client_t *client, const char *token, double now)
{
    if (client == NULL)
        return RELAY_EINVAL;
    if (!client->connect_called)
        return RELAY_ESTATE;
    if (token != NULL) {
        rc_token decoded;
        if (rc_token_decode(token, &decoded) != 0)
            return RELAY_ETOKEN;
        client->token = decoded;
        client->has_token = 1;
    }
    return start_connection(client, now);
}

static int connected(const relay_client_t *client)
{
    return client->state == RELAY_STATE_CONNECTED || client->state == RELAY_STATE_JOINED;
}

int relay_client_ready(relay_client_t *client)
{
    if (client == NULL)
        return RELAY_EINVAL;
    if (!connected(client))
        return RELAY_ESTATE;
    return queue(client, RC_CONTROL, rm_encode_ready(client->scratch, client->scratch_capacity));
}

int relay_client_leave(relay_client_t *client, double now)
{
    if (client == NULL)
        return RELAY_EINVAL;
    client->now = now;
    if (!connected(client)) {
        if (client->state == RELAY_STATE_CONNECTING)
            rc_conn_disconnect(client->conn, 0, now);
        return client->state == RELAY_STATE_IDLE ? RELAY_ESTATE : RELAY_OK;
    }
    queue(client, RC_CONTROL, rm_encode_leave(client->scratch, client->scratch_capacity));
    client->leave_pending = 1;   /* DISCONNECT once the LEAVE is out (next_datagram) */
    return RELAY_OK;
}

int relay_client_disconnect(relay_client_t *client, double now)
{
    if (client == NULL)
        return RELAY_EINVAL;
    client->now = now;
    if (client->state == RELAY_STATE_IDLE)
        return RELAY_ESTATE;
    client->leave_pending = 0;
    rc_conn_disconnect(client->conn, 0, now);    /* reason 0: closed */
    return RELAY_OK;
}

relay_client_state_t relay_client_get_state(const relay_client_t *client)
{
    return client ? client->state : RELAY_STATE_IDLE;
}

/* ---- sans-I/O pumping ---------------------------------------------------------------------- */

void relay_client_receive(relay_client_t *client, const uint8_t *data, size_t length, double now)
{
    if (client == NULL || (data == NULL && length > 0))
        return;
    client->now = now;
    rc_conn_receive(client->conn, data, length, now);
}

int relay_client_next_datagram(relay_client_t *client, uint8_t *out, size_t cap, double now)
{
    size_t length;
    if (client == NULL || out == NULL)
        return RELAY_EINVAL;
    if (cap < client->config.mtu)
        return RELAY_ESMALL;
    client->now = now;
    length = rc_conn_next_datagram(client->conn, out, cap, now);
    if (length == 0 && client->leave_pending) {
        client->leave_pending = 0;
        rc_conn_disconnect(client->conn, 0, now);
        length = rc_conn_next_datagram(client->conn, out, cap, now);
    }
    return (int)length;
}

double relay_client_next_timeout(const relay_client_t *client)
{
    if (client == NULL)
        return -1.0;
    if (client->leave_pending)
        return client->now;
    return rc_conn_next_timeout(client->conn);
}

void relay_client_handle_timeout(relay_client_t *client, double now)
{
    if (client == NULL)
        return;
    client->now = now;
    rc_conn_handle_timeout(client->conn, now);
}

/* ---- frames -------------------------------------------------------------------------------- */

int relay_client_next_frame(relay_client_t *client, relay_frame_t *frame)
{
    const uint8_t *data;
    size_t length;
    uint32_t number;
    int found, status, other;
    rf_frame *out;

    if (client == NULL || frame == NULL)
        return RELAY_EINVAL;
    if (client->undecodable)
        return RELAY_ESTATE;
    found = find_next(client, &data, &length);
    if (found == 0)
        return client->broken ? RELAY_ESTATE : 0;
    other = client->current ^ 1;
    out = &client->decoded[other];
    status = found < 0 ? RF_MALFORMED : rf_frame_number(data, length, &number);
    if (status == RF_OK && number != client->next)
        status = RF_MALFORMED;
    if (status == RF_OK)
        status = rf_decode(data, length, &client->decoded[client->current], out);
    if (status != RF_OK) {
        break_stream(client, "bad_frame", "a frame does not decode: the stream cannot go on");
        client->undecodable = 1;
        return RELAY_ESTATE;
    }
    client->current = other;
    client->have_frame = 1;
    client->next++;
    live_trim(client);
    frame->number = out->number;
    frame->slot_count = out->slot_count;
    frame->event_count = out->event_count;
    return 1;
}

static const rf_frame *current_frame(const relay_client_t *client)
{
    return client->have_frame ? &client->decoded[client->current] : NULL;
}

int relay_frame_input(const relay_client_t *client, uint32_t slot, const uint8_t **data)
{
    const rf_frame *f;
    if (client == NULL)
        return RELAY_EINVAL;
    f = current_frame(client);
    if (data)
        *data = NULL;
    if (f == NULL || slot >= f->slot_count || f->length[slot] < 0)
        return RELAY_NIL;
    if (data)
        *data = f->arena + f->offset[slot];
    return f->length[slot];
}

int relay_frame_copy_input(const relay_client_t *client, uint32_t slot, uint8_t *out, size_t cap)
{
    const uint8_t *data;
    int length = relay_frame_input(client, slot, &data);
    if (length < 0)
        return length;
    if ((size_t)length > cap || (out == NULL && length > 0))
        return RELAY_ESMALL;
    if (length)
        memcpy(out, data, (size_t)length);
    return length;
}

int relay_frame_synthesized(const relay_client_t *client, uint32_t slot)
{
    const rf_frame *f = client ? current_frame(client) : NULL;
    if (f == NULL || slot >= f->slot_count)
        return 0;
    return f->synthesized[slot >> 3] >> (slot & 7) & 1;
}

int relay_frame_event(const relay_client_t *client, uint32_t index, relay_frame_event_t *event)
{
    const rf_frame *f;
    int kind, slot;
    const char *name;
    uint32_t name_length;
    if (client == NULL || event == NULL)
        return RELAY_EINVAL;
    f = current_frame(client);
    if (f == NULL || rf_frame_event(f, index, &kind, &slot, &name, &name_length) != 0)
        return RELAY_EINVAL;
    event->kind = kind;
    event->slot = slot;
    event->name = name;
    event->name_length = name_length;
    return RELAY_OK;
}

/* ---- inputs, checksums --------------------------------------------------------------------- */

int64_t relay_client_have(const relay_client_t *client)
{
    uint64_t f;
    int progressed = 1;
    if (client == NULL)
        return -1;
    f = client->next;
    while (progressed) {
        int k;
        int64_t index;
        progressed = 0;
        for (k = 0; k < client->segment_count; k++) {
            const rc_segment *segment = &client->segments[k];
            if (segment_holds(segment, f)) {
                f = segment->end;
                progressed = 1;
            }
        }
        index = live_find(client, f);
        if (index >= 0) {
            uint32_t i = (uint32_t)index;
            while (i + 1 < client->live_count
                   && live_at(client, i + 1)->number == live_at(client, i)->number + 1)
                i++;
            f = (uint64_t)live_at(client, i)->number + 1;
            progressed = 1;
        }
    }
    return (int64_t)f - 1;
}

int relay_client_send_input_for(relay_client_t *client, uint32_t frame, const uint8_t *payload,
                                 size_t length)
{
    int status;
    if (client == NULL || (payload == NULL && length > 0) || length > client->config.max_input_size)
        return RELAY_EINVAL;
    if (!connected(client))
        return RELAY_ESTATE;
    status = queue(client, RC_STREAM,
                   rm_encode_input(client->scratch, client->scratch_capacity, frame,
                                   payload ? payload : (const uint8_t *)"", length,
                                   relay_client_have(client)));
    if (status == RELAY_OK && (int64_t)frame > client->last_input_frame)
        client->last_input_frame = frame;
    return status;
}

int relay_client_send_input(relay_client_t *client, const uint8_t *payload, size_t length)
{
    int64_t base, target, frame, live_from;
    int sent = 0;
    if (client == NULL || (payload == NULL && length > 0) || length > client->config.max_input_size)
        return RELAY_EINVAL;
    if (!connected(client))
        return RELAY_ESTATE;
    if (client->config.auto_input_delay && client->advice_valid)
        client->input_delay = client->advice;
    /* Frames before the first live one are history: closed, no input reaches them. */
    live_from = client->welcomed ? (int64_t)client->live_from : 0;
    base = ((int64_t)client->next > live_from ? (int64_t)client->next : live_from) - 1;
    target = base + client->input_delay;
    frame = client->last_input_frame + 1 > base + 1 ? client->last_input_frame + 1 : base + 1;
    for (; frame <= target && frame <= 0xFFFFFFFF; frame++) {
        int status = relay_client_send_input_for(client, (uint32_t)frame, payload, length);
        if (status != RELAY_OK)
            return sent > 0 ? sent : status;
        sent++;
    }
    return sent;
}

int relay_client_report_checksum(relay_client_t *client, uint32_t frame, uint64_t value)
{
    if (client == NULL)
        return RELAY_EINVAL;
    if (!connected(client))
        return RELAY_ESTATE;
    return queue(client, RC_CONTROL,
                 rm_encode_checksum(client->scratch, client->scratch_capacity, frame, value));
}

/* ---- state --------------------------------------------------------------------------------- */

void relay_client_get_stats(const relay_client_t *client, relay_client_stats_t *stats)
{
    rc_conn_stats conn;
    if (client == NULL || stats == NULL)
        return;
    memset(stats, 0, sizeof *stats);
    rc_conn_get_stats(client->conn, &conn);
    stats->rtt = conn.rtt;
    stats->rtt_variance = conn.rtt_variance;
    stats->loss = conn.loss;
    stats->packets_sent = conn.packets_sent;
    stats->packets_received = conn.packets_received;
    stats->bytes_sent = conn.bytes_sent;
    stats->bytes_received = conn.bytes_received;
    stats->frames_received = client->frames_received;
    stats->frames_duplicate = client->frames_duplicate;
    stats->blocks_received = client->blocks_received;
    stats->datagrams_dropped = conn.datagrams_dropped + client->datagrams_dropped;
    stats->events_dropped = client->events_dropped;
    stats->live_frames_dropped = client->live_frames_dropped;
    stats->redundancy_mode = conn.redundancy_mode;
    stats->burst_length = conn.burst_length;
}

uint32_t relay_client_next_frame_number(const relay_client_t *client)
{
    return client ? (uint32_t)client->next : 0;
}

uint32_t relay_client_input_delay(const relay_client_t *client)
{
    return client ? client->input_delay : 0;
}

int relay_client_set_input_delay(relay_client_t *client, uint32_t frames)
{
    if (client == NULL || frames < 1)
        return RELAY_EINVAL;
    client->input_delay = frames;
    return RELAY_OK;
}

relay_room_state_t relay_client_room_state(const relay_client_t *client)
{
    return client ? (relay_room_state_t)client->room_state : RELAY_ROOM_NONE;
}

uint32_t relay_client_final_frames(const relay_client_t *client)
{
    return client ? client->final_frames : 0;
}

int32_t relay_client_slot(const relay_client_t *client)
{
    return client && client->welcomed ? client->slot : -1;
}

int relay_client_finished(const relay_client_t *client)
{
    if (client == NULL || !client->connect_called)
        return 0;
    if (client->broken)                 /* what is held can still be taken */
        return client->undecodable || !frame_held(client, client->next);
    /* Players and spectators alike receive every frame 0..final-1: the relay sends a
     * spectator the frames its delay still held back when the room ends (RELAY_PROTOCOL 11). */
    if (client->room_state == RELAY_ROOM_ENDED && client->next >= client->final_frames)
        return 1;
    if (client->state == RELAY_STATE_IDLE)
        return !frame_held(client, client->next);
    return 0;
}
