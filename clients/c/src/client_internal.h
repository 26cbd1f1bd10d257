/*
 * client_internal.h - the relay client's state (client.c, driver.c) and the hooks the unit
 * tests use to drive the frame store without the transport. Not part of the public API.
 */
#ifndef RC_CLIENT_INTERNAL_H
#define RC_CLIENT_INTERNAL_H

#include "relay_client.h"
#include "conn.h"
#include "frame.h"
#include "token.h"

#define RC_MAX_SEGMENTS 8

/* A live frame in the ring: its number and where its bytes are. */
typedef struct rc_live_entry {
    uint32_t number;
    uint32_t length;
    size_t offset;
} rc_live_entry;

/* A run of consecutive frames of a history block, inflated in the history buffer as msgpack
 * bins: frames first .. end-1, the bin of frame `first` at byte `position`. */
typedef struct rc_segment {
    uint64_t first;
    uint64_t end;
    size_t position;
    size_t limit;
} rc_segment;

struct relay_client {
    relay_client_config_t config;
    rc_conn_config conn_config;
    rc_conn *conn;
    double now;                     /* the latest time given to any call */

    relay_client_state_t state;
    int connect_called;
    char room[RELAY_MAX_NAME + 1];
    char player[RELAY_MAX_NAME + 1];
    int spectator;
    int has_token;
    rc_token token;

    /* room */
    int welcomed;
    uint32_t live_from;             /* WELCOME.next_frame */
    int32_t slot;
    int room_state;
    uint32_t final_frames;
    int leave_pending;              /* LEAVE queued: DISCONNECT once it went out */
    int broken;                     /* the stream cannot go on (break_stream) */
    int undecodable;                /* ...because the next frame does not decode */

    /* frames */
    uint64_t next;                  /* the next frame the game takes */
    rf_frame decoded[2];            /* the current frame and the one before it */
    int current;                    /* index into decoded of the frame last taken */
    int have_frame;                 /* a frame was taken since connect */

    uint8_t *ring;                  /* live frames: bytes */
    size_t ring_capacity, ring_tail;
    rc_live_entry *live;            /* live frames: index ring, numbers increasing */
    uint32_t live_capacity, live_head, live_count;

    uint8_t *history;               /* inflated blocks */
    size_t history_capacity, history_used;
    rc_segment segments[RC_MAX_SEGMENTS];
    int segment_count;
    void *zmemory;

    relay_event_t *events;
    uint32_t event_capacity, event_head, event_count;

    /* inputs */
    uint32_t input_delay;
    int advice_valid;
    uint32_t advice;
    int64_t last_input_frame;
    uint8_t *scratch;               /* message encoding */
    size_t scratch_capacity;

    /* counters (the conn's are added in relay_client_get_stats) */
    uint64_t frames_received, frames_duplicate, blocks_received, datagrams_dropped,
        events_dropped, live_frames_dropped;

    /* tests: sees every message the client queues */
    void (*send_hook)(void *context, int channel, const uint8_t *data, size_t length);
    void *send_hook_context;

    /* socket driver (driver.c) */
    intptr_t socket_handle;
    int socket_open;
    uint8_t address[128];           /* struct sockaddr_storage of the relay */
    uint32_t address_length;
};

/* The conn's callbacks; the tests call them directly to inject what conn would deliver. */
void rc_client_on_connected(void *context);
void rc_client_on_message(void *context, int channel, const uint8_t *data, size_t length);
void rc_client_on_block(void *context, const uint8_t *data, size_t length);
void rc_client_on_disconnected(void *context, const char *reason);

void rc_client_set_send_hook(relay_client_t *client,
                             void (*hook)(void *context, int channel, const uint8_t *data,
                                          size_t length),
                             void *context);

/* driver.c: closes the socket if open (relay_client_destroy calls it). */
void rc_driver_close(relay_client_t *client);

#endif
