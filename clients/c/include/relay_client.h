/*
 * relay_client.h - the C client library of the relay (docs/PROTOCOL.md, docs/RELAY_PROTOCOL.md).
 *
 * One relay_client_t is one game client: it connects to a relay, joins a room as a player or
 * spectator, sends one input per frame and hands the game every frame once, in order, from
 * frame 0 (live frames merged with history and catch-up blocks).
 *
 * Two layers on the same object:
 *   - the sans-I/O core: feed it datagrams with a time (relay_client_receive), ask it for
 *     datagrams to send (relay_client_next_datagram) and for its next timer
 *     (relay_client_next_timeout / relay_client_handle_timeout), poll its events and frames.
 *     No socket, no clock, and no allocation after relay_client_create: every buffer is sized
 *     by relay_client_config_t and allocated once.
 *   - the socket driver (relay_client_open + relay_client_update): a UDP socket (POSIX or
 *     Winsock) pumped by one call per game-loop iteration.
 *
 * Times are seconds on any monotonic clock, the same clock for every call on one client
 * (relay_client_time() reads one). Functions return 0 (or a pointer/length) on success and a
 * negative RELAY_E* code on a programmer error; network input never makes a call fail: a bad
 * datagram is counted (relay_client_stats_t.datagrams_dropped) and ignored.
 *
 * Threading: a client is not thread-safe; use it from one thread at a time. Different
 * clients are independent.
 */
#ifndef RELAY_CLIENT_H
#define RELAY_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(RELAY_CLIENT_SHARED)
#  if defined(RELAY_CLIENT_BUILDING)
#    define RELAY_API __declspec(dllexport)
#  else
#    define RELAY_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && defined(RELAY_CLIENT_BUILDING)
#  define RELAY_API __attribute__((visibility("default")))
#else
#  define RELAY_API
#endif

#define RELAY_CLIENT_VERSION_MAJOR 2
#define RELAY_CLIENT_VERSION_MINOR 0

/* ---- error codes (negative return values) ------------------------------------------------ */
#define RELAY_OK 0
#define RELAY_EINVAL (-1)      /* an argument is out of range (NULL, too long, bad config) */
#define RELAY_ESTATE (-2)      /* not possible in the client's current state */
#define RELAY_EFULL (-3)       /* a fixed queue is full; try again after the next update */
#define RELAY_ETOKEN (-4)      /* the connect token text does not decode */
#define RELAY_ENOMEM (-5)      /* the allocator failed (create only) */
#define RELAY_ESOCKET (-6)     /* driver: socket, bind, resolve or send failed */
#define RELAY_ESMALL (-7)      /* the caller's buffer is too small */
#define RELAY_NIL (-8)         /* relay_frame_input: the slot has no input in this frame */

/* ---- limits from the protocol -------------------------------------------------------------- */
#define RELAY_MAX_NAME 64          /* room and player names: 1..64 bytes of UTF-8 */
#define RELAY_MAX_SLOTS 256        /* slots in a frame */
#define RELAY_MAX_DATAGRAM 16384   /* the largest datagram the library builds (its mtu) */

/* ---- configuration ------------------------------------------------------------------------- */
typedef struct relay_client_config {
    /* Memory: every buffer is allocated in relay_client_create through these (NULL: malloc
     * and free). Nothing is allocated after create. */
    void *(*allocate)(void *context, size_t bytes);
    void (*release)(void *context, void *pointer);
    void *allocator_context;
    /* Randomness for connect ids (NULL: the OS source through the crypto backend). */
    void (*random_bytes)(void *context, uint8_t *out, size_t length);
    void *random_context;

    uint32_t mtu;                 /* largest datagram sent, bytes (1200; 576..16384) */
    uint32_t reserved;            /* explicit padding before the doubles; leave 0 */
    double connect_timeout;       /* handshake deadline, s (5) */
    double peer_timeout;          /* relay silent this long: disconnected "timeout", s (10) */
    double heartbeat_interval;    /* send a datagram at least this often, s (0.5) */
    double ack_delay;             /* longest an ack waits for data to ride on, s (1/30) */
    uint32_t max_message_size;    /* largest message (FRAME) reassembled, bytes (262144) */
    uint32_t reassembly_limit;    /* bytes held in out-of-order or partial messages (524288) */
    uint32_t max_block_size;      /* largest history block accepted, compressed bytes (8 MiB) */
    uint32_t max_history_size;    /* largest history block inflated, bytes (32 MiB) */
    uint32_t frame_buffer_bytes;  /* live frames held ahead of the game, bytes (1 MiB) */
    uint32_t frame_buffer_count;  /* live frames held ahead of the game, count (4096) */
    uint32_t input_delay;         /* frames between the newest frame and the input (2; >= 1) */
    int auto_input_delay;         /* adopt the relay's INPUT_DELAY advice (0) */
    uint32_t max_input_size;      /* largest input payload sent, bytes (256) */
    uint32_t send_queue;          /* messages queued per channel behind its window (1024) */
    uint32_t event_queue;         /* events held until polled (256) */
} relay_client_config_t;

/* The library's version, (major << 16) | minor: a binding checks it against the header it was
 * written for (RELAY_CLIENT_VERSION_MAJOR) before anything else. */
RELAY_API uint32_t relay_client_version(void);

/* Fills every field with its default. */
RELAY_API void relay_client_default_config(relay_client_config_t *config);

/* Bytes relay_client_create allocates for this config (a memory budget for the game). */
RELAY_API size_t relay_client_memory_size(const relay_client_config_t *config);

/* NULL if the config is invalid or the allocator fails. */
RELAY_API struct relay_client *relay_client_create(const relay_client_config_t *config);
RELAY_API void relay_client_destroy(struct relay_client *client);

typedef struct relay_client relay_client_t;

/* ---- connecting and rooms ------------------------------------------------------------------ */

typedef enum relay_client_state {
    RELAY_STATE_IDLE = 0,         /* created, or the connection ended */
    RELAY_STATE_CONNECTING = 1,   /* handshake in progress */
    RELAY_STATE_CONNECTED = 2,    /* transport up, JOIN sent, no WELCOME yet */
    RELAY_STATE_JOINED = 3        /* WELCOME received: a member of the room */
} relay_client_state_t;

/* Starts the handshake and queues JOIN [room, player, spectator]. token: the connect token's
 * text ("rt1....") from the game backend for a relay in token mode, or NULL (open mode); with
 * a token, room and player may be NULL (the token's are used). Resets the frame stream: the
 * first frame the game gets is frame 0 of the room. */
RELAY_API int relay_client_connect(relay_client_t *client, const char *room, const char *player,
                                   int spectator, const char *token, double now);

/* A new connection (new connect id, as after a network change or crash) that JOINs the same
 * room with the same player name and reclaims its slot. The frame stream continues with no
 * gap and no duplicate. token: a fresh token in token mode (tokens are single-use), else NULL.
 * With the socket driver, relay_client_reopen() also moves to a new local port. */
RELAY_API int relay_client_reconnect(relay_client_t *client, const char *token, double now);

/* Sends READY (start policy "ready"). */
RELAY_API int relay_client_ready(relay_client_t *client);

/* Sends LEAVE, then closes the connection (DISCONNECT "closed"); the datagrams go out on the
 * next relay_client_next_datagram / relay_client_update calls. */
RELAY_API int relay_client_leave(relay_client_t *client, double now);

/* Closes the connection without LEAVE (the relay reports the player "leave"). */
RELAY_API int relay_client_disconnect(relay_client_t *client, double now);

RELAY_API relay_client_state_t relay_client_get_state(const relay_client_t *client);

/* ---- the sans-I/O core ----------------------------------------------------------------------- */

/* One datagram received from the relay (any address: the core does not look at addresses). */
RELAY_API void relay_client_receive(relay_client_t *client, const uint8_t *data, size_t length,
                                    double now);

/* Writes the next datagram due now into out and returns its length, 0 when nothing is due.
 * Call until it returns 0. cap must be at least the config's mtu (RELAY_ESMALL otherwise). */
RELAY_API int relay_client_next_datagram(relay_client_t *client, uint8_t *out, size_t cap,
                                         double now);

/* The time at which relay_client_handle_timeout should run next; a negative value: no timer. */
RELAY_API double relay_client_next_timeout(const relay_client_t *client);
RELAY_API void relay_client_handle_timeout(relay_client_t *client, double now);

/* ---- events ---------------------------------------------------------------------------------- */

typedef enum relay_event_type {
    RELAY_EVENT_NONE = 0,
    RELAY_EVENT_CONNECTED = 1,      /* handshake done; JOIN on its way */
    RELAY_EVENT_WELCOME = 2,        /* joined: slot, tick_rate, room_state, next_frame, history;
                                       code = room, text = player name */
    RELAY_EVENT_REFUSED = 3,        /* JOIN refused: code (e.g. "room_full"), text */
    RELAY_EVENT_ROOM_STATE = 4,     /* room_state, frame, code = reason ("" if none) */
    RELAY_EVENT_DESYNC = 5,         /* frame, code = verdict, text = minority "a,b" */
    RELAY_EVENT_NOTICE = 6,         /* code, text: something we sent was wrong */
    RELAY_EVENT_INPUT_DELAY = 7,    /* delay_frames, response_ms, late, inputs: the relay's advice */
    RELAY_EVENT_DISCONNECTED = 8    /* code = reason ("timeout", "refused:server_full",
                                       "remote:kicked", "connect_timeout", "local:closed") */
} relay_event_type_t;

typedef enum relay_room_state {
    RELAY_ROOM_NONE = 0,
    RELAY_ROOM_WAITING = 1,
    RELAY_ROOM_RUNNING = 2,
    RELAY_ROOM_ENDED = 3
} relay_room_state_t;

typedef struct relay_event {
    int32_t type;                   /* relay_event_type_t */
    int32_t room_state;             /* relay_room_state_t (WELCOME, ROOM_STATE) */
    int32_t slot;                   /* WELCOME: our slot, -1 for a spectator */
    int32_t spectator;              /* WELCOME */
    uint32_t tick_rate;             /* WELCOME */
    uint32_t next_frame;            /* WELCOME: first frame that comes live */
    uint32_t history;               /* WELCOME: frames 0..history-1 come as a block */
    uint32_t frame;                 /* ROOM_STATE (frames closed when "ended"), DESYNC */
    uint32_t delay_frames;          /* INPUT_DELAY */
    uint32_t response_ms;           /* INPUT_DELAY */
    uint32_t late;                  /* INPUT_DELAY */
    uint32_t inputs;                /* INPUT_DELAY */
    char code[64];                  /* NUL-terminated, truncated to fit */
    char text[256];                 /* NUL-terminated, truncated to fit */
} relay_event_t;

/* 1 and fills *event if an event was pending, 0 if none. Events come in the order they
 * happened. When the queue is full the oldest event is dropped (counted in stats). */
RELAY_API int relay_client_poll_event(relay_client_t *client, relay_event_t *event);

/* ---- frames ---------------------------------------------------------------------------------- */

typedef enum relay_frame_event_kind {
    RELAY_JOIN = 0, RELAY_LEAVE = 1, RELAY_TIMEOUT = 2, RELAY_RECONNECT = 3
} relay_frame_event_kind_t;

typedef struct relay_frame {
    uint32_t number;
    uint32_t slot_count;            /* slots in this frame; a slot past it is nil */
    uint32_t event_count;           /* membership events (relay_frame_event) */
} relay_frame_t;

typedef struct relay_frame_event {
    int32_t kind;                   /* relay_frame_event_kind_t */
    int32_t slot;
    uint32_t name_length;
    uint32_t reserved;              /* explicit padding: the same layout for every binding */
    const char *name;               /* not NUL-terminated; valid until the next frame */
} relay_frame_event_t;

/* The next frame in order: 1 and fills *frame, 0 if it has not arrived yet, or RELAY_ESTATE
 * if the stream is broken (a frame that does not decode: a DISCONNECTED event "bad_frame" is
 * queued, and every later call returns RELAY_ESTATE until the next connect).
 * The frame's inputs and events are read with the calls below until the next call. */
RELAY_API int relay_client_next_frame(relay_client_t *client, relay_frame_t *frame);

/* Slot's input in the current frame: its length (0.. bytes), and *data points at it;
 * RELAY_NIL when the slot has no input (nil), including slots past slot_count and before the
 * first frame; RELAY_EINVAL for a NULL client. */
RELAY_API int relay_frame_input(const relay_client_t *client, uint32_t slot, const uint8_t **data);
/* As relay_frame_input, copied into the caller's buffer (RELAY_ESMALL if cap is too small). */
RELAY_API int relay_frame_copy_input(const relay_client_t *client, uint32_t slot, uint8_t *out,
                                     size_t cap);
/* 1 if the relay made this slot's input up (missing input policy), else 0. */
RELAY_API int relay_frame_synthesized(const relay_client_t *client, uint32_t slot);
/* Membership event index (0..event_count-1) of the current frame: 0 and fills *event, or
 * RELAY_EINVAL for an index past event_count. */
RELAY_API int relay_frame_event(const relay_client_t *client, uint32_t index,
                                relay_frame_event_t *event);

/* ---- inputs, checksums ----------------------------------------------------------------------- */

/* Sends payload as our input for frame (last frame taken + input_delay), following the
 * relay's advice when auto_input_delay is set, so that every frame gets exactly one input:
 * at the start of play and after a rise of the delay it also covers the frames in between;
 * after a fall it sends nothing until the target passes the last frame sent. Returns the
 * number of frames it sent the input for (0 is normal after a fall). */
RELAY_API int relay_client_send_input(relay_client_t *client, const uint8_t *payload,
                                      size_t length);

/* Sends payload as our input for one given frame (the caller manages the delay). */
RELAY_API int relay_client_send_input_for(relay_client_t *client, uint32_t frame,
                                          const uint8_t *payload, size_t length);

/* Reports a hash of the game state after applying frame (desync detection). */
RELAY_API int relay_client_report_checksum(relay_client_t *client, uint32_t frame,
                                           uint64_t value);

/* ---- state --------------------------------------------------------------------------------- */

/* The redundancy controller's reading of the path (docs/PROTOCOL.md 14.5), which sets how many
 * copies of each unacknowledged input ride later datagrams. */
typedef enum relay_link_mode {
    RELAY_LINK_CLEAN = 0,           /* no recent loss: each message sent once */
    RELAY_LINK_LOSSY = 1,           /* independent losses: a copy in the next datagram, more only
                                     * where an ack is overdue (a new connection starts here) */
    RELAY_LINK_BURSTY = 2,          /* losses in runs: every datagram carries every unacked
                                     * message */
    RELAY_LINK_CONGESTED = 3        /* the RTT stands above the path's floor: no copies */
} relay_link_mode_t;

typedef struct relay_client_stats {
    double rtt;                     /* smoothed round-trip time, s (0 before a sample) */
    double rtt_variance;
    double loss;                    /* 0..1, packets of ours judged lost */
    uint64_t packets_sent, packets_received, bytes_sent, bytes_received;
    uint64_t frames_received;       /* distinct frames stored (live or from blocks) */
    uint64_t frames_duplicate;      /* frames received again and ignored */
    uint64_t blocks_received;
    uint64_t datagrams_dropped;     /* malformed, unauthenticated, stale or duplicate datagrams */
    uint64_t events_dropped;        /* events lost to a full event queue */
    uint64_t live_frames_dropped;   /* live frames past frame_buffer_* (repaired by catch-up) */
    int32_t redundancy_mode;        /* relay_link_mode_t: how the input stream copies now */
    uint32_t reserved;              /* explicit padding: the same layout for every binding */
    double burst_length;            /* mean run of our datagrams lost together, as the acks
                                     * show it (1.0: losses independent of each other) */
} relay_client_stats_t;

RELAY_API void relay_client_get_stats(const relay_client_t *client, relay_client_stats_t *stats);
/* Next frame number the game will take. */
RELAY_API uint32_t relay_client_next_frame_number(const relay_client_t *client);
/* Highest frame H with every frame 0..H held (-1 before frame 0): INPUT's "have". */
RELAY_API int64_t relay_client_have(const relay_client_t *client);
RELAY_API uint32_t relay_client_input_delay(const relay_client_t *client);
RELAY_API int relay_client_set_input_delay(relay_client_t *client, uint32_t frames);
/* The room's state as last told (RELAY_ROOM_NONE before WELCOME); when RELAY_ROOM_ENDED,
 * relay_client_final_frames() is the number of frames the room produced. */
RELAY_API relay_room_state_t relay_client_room_state(const relay_client_t *client);
RELAY_API uint32_t relay_client_final_frames(const relay_client_t *client);
/* Our slot (-1: spectator or not joined). */
RELAY_API int32_t relay_client_slot(const relay_client_t *client);
/* 1 once the room has ended and every frame it produced was taken (players and spectators
 * alike), or the connection is gone with no frame left to take, or the stream broke: the game
 * can stop. */
RELAY_API int relay_client_finished(const relay_client_t *client);

/* ---- socket driver --------------------------------------------------------------------------- */

/* Monotonic clock, seconds. */
RELAY_API double relay_client_time(void);

/* Opens a non-blocking UDP socket towards host:port (IPv4 or IPv6, name or literal). */
RELAY_API int relay_client_open(relay_client_t *client, const char *host, uint16_t port);
/* Closes the socket and opens a new one (new local port) towards the same relay: what a
 * network change looks like. The connection survives (address migration). */
RELAY_API int relay_client_reopen(relay_client_t *client);
RELAY_API void relay_client_close(relay_client_t *client);
/* Receives every pending datagram, runs timers, sends everything due. Returns 0, or
 * RELAY_ESOCKET if no socket is open. */
RELAY_API int relay_client_update(relay_client_t *client, double now);
/* Blocks until a datagram arrives, the next timer is due, or timeout seconds pass. Returns 0,
 * or RELAY_ESOCKET if no socket is open. */
RELAY_API int relay_client_wait(relay_client_t *client, double timeout);

#ifdef __cplusplus
}
#endif
#endif /* RELAY_CLIENT_H */
