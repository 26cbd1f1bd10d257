/*
 * conn.h - one relay_core connection, client side (docs/PROTOCOL.md): the transport layer
 * under the relay client (client.c). Sans-I/O: datagrams and times in, datagrams and
 * callbacks out. All memory comes from one block sized by rc_conn_memory_size() and handed
 * to rc_conn_init(); nothing is allocated afterwards.
 *
 * This is the contract between the transport files (wire, seqbuf, rtt, channel, fragment,
 * block, handshake, crypto, token, conn) and the relay layer (client.c).
 */
#ifndef RC_CONN_H
#define RC_CONN_H

#include <stddef.h>
#include <stdint.h>

#define RC_CHANNEL_COUNT 2          /* the relay's layout (RELAY_PROTOCOL 2.1) */
#define RC_CONTROL 0                /* reliable_ordered, window 16 */
#define RC_STREAM 1                 /* redundant, window 64 */

typedef struct rc_conn_config {
    uint32_t mtu;                   /* 1200 */
    double connect_timeout;         /* 5 */
    double connect_resend_interval; /* 0.1 */
    double peer_timeout;            /* 10 */
    double heartbeat_interval;      /* 0.5 */
    double ack_delay;               /* 1/30 */
    double rto_initial, rto_min, rto_max, rto_limit;   /* 0.2, 0.03, 1.0, 5.0 */
    uint32_t max_resends;           /* 20 */
    uint32_t max_message_size;      /* largest message reassembled (262144) */
    uint32_t reassembly_limit;      /* bytes held out of order / partial (524288) */
    uint32_t max_block_size;        /* largest block accepted (8 MiB) */
    uint32_t send_queue;            /* messages per channel waiting behind the window (1024) */
    uint32_t max_send_size;         /* largest message sent; never fragmented (<= mtu - 25 - 16) */
    /* redundancy (PROTOCOL 12.4, 14.5), defaults as relay_core's, budget 1200 as the Python SDK */
    uint32_t redundancy_budget;     /* 1200 */
    uint32_t redundancy_copies;     /* 4: lossy mode, most copies per (re)send */
    double redundancy_copy_wait;    /* 1.0: lossy mode, later copies wait this many SRTTs */
    uint32_t redundancy_loss_memory;/* 128: clean after this many judged received in a row */
    double reorder_tolerance;       /* 0.005 */
    double burst_threshold;         /* 0.2: bursty once loss after a loss exceeds loss by this */
    double congestion_delay;        /* 0.05: a sample this far over the RTT floor (and over the
                                     * floor itself) is high; two in a row: congested */
    double congestion_hold;         /* 5.0: congested this long after the last high sample */
    double min_rtt_window;          /* 10.0: the RTT floor spans this window and the previous one */
    uint32_t congested_copies;      /* 0: congested mode, most copies per (re)send (0: none) */
    uint32_t prompt_copies;         /* 1: copies sent at once, before an ack could be back */
    double send_rate;               /* pacing, bytes/s (2000000) */
    uint32_t send_buffer;           /* payload bytes held per channel for queued/unacked messages (32768) */
} rc_conn_config;

void rc_conn_default_config(rc_conn_config *config);
/* 0 if valid, else -1. */
int rc_conn_validate_config(const rc_conn_config *config);

typedef enum rc_conn_state {
    RC_CLOSED = 0, RC_CONNECTING = 1, RC_CHALLENGED = 2, RC_CONNECTED = 3, RC_DISCONNECTING = 4
} rc_conn_state;

/* Callbacks into the layer above, made from inside rc_conn_receive / rc_conn_handle_timeout /
 * rc_conn_next_datagram. Pointers passed are valid only for the duration of the call. */
typedef struct rc_conn_handler {
    void *context;
    void (*on_connected)(void *context);
    /* A message delivered by its channel: once each, in id order per channel. */
    void (*on_message)(void *context, int channel, const uint8_t *data, size_t length);
    /* Every slice of an incoming block has arrived. */
    void (*on_block)(void *context, const uint8_t *data, size_t length);
    /* The connection ended; reason as in PROTOCOL 9 ("timeout", "refused:server_full",
     * "remote:kicked", "connect_timeout", "resend_limit", "local:closed"). */
    void (*on_disconnected)(void *context, const char *reason);
} rc_conn_handler;

typedef struct rc_conn_stats {
    double rtt, rtt_variance, rto, loss;
    uint64_t packets_sent, packets_received, bytes_sent, bytes_received;
    uint64_t packets_acked, packets_lost, messages_sent, messages_received, resends;
    uint64_t redundant_bytes, duplicate_messages, datagrams_dropped;
    double burst_length;            /* mean run of lost datagrams the acks imply (PROTOCOL 14.5) */
    int redundancy_mode;            /* RC_LINK_* (link.h): 0 clean, 1 lossy, 2 bursty, 3 congested */
} rc_conn_stats;

typedef struct rc_conn rc_conn;

/* Bytes the connection needs for this config (struct included). */
size_t rc_conn_memory_size(const rc_conn_config *config);
/* memory: rc_conn_memory_size() bytes, suitably aligned (malloc's alignment), zeroed or not. */
rc_conn *rc_conn_init(void *memory, const rc_conn_config *config, const rc_conn_handler *handler);

/* Starts a handshake (PROTOCOL 8.1), dropping any previous connection state silently (no
 * DISCONNECT: call rc_conn_disconnect first for that). connect_id: random, non-zero.
 * token_private: the connect token's private part (127..509 bytes) with its client and server
 * keys for token mode, or NULL for open mode. Queued messages are discarded. */
int rc_conn_connect(rc_conn *conn, uint32_t connect_id, const uint8_t *token_private,
                    size_t token_length, const uint8_t client_key[32],
                    const uint8_t server_key[32], double now);

/* One datagram from the server. Never fails; bad input is counted in datagrams_dropped. */
void rc_conn_receive(rc_conn *conn, const uint8_t *data, size_t length, double now);

/* Writes the next datagram due into out (cap >= mtu) and returns its length, 0 if none. */
size_t rc_conn_next_datagram(rc_conn *conn, uint8_t *out, size_t cap, double now);

double rc_conn_next_timeout(const rc_conn *conn);    /* < 0: none */
void rc_conn_handle_timeout(rc_conn *conn, double now);

/* Queues a message on a channel (copied). Allowed while connecting too (sent once
 * connected). 0, or -1: too large (> max_send_size) or queue full, or closed. */
int rc_conn_send(rc_conn *conn, int channel, const uint8_t *data, size_t length);

/* DISCONNECT reason_code x3 on the next rc_conn_next_datagram calls (if connected), then
 * closed; on_disconnected("local:<name>") is called. Nothing is sent if not connected. */
void rc_conn_disconnect(rc_conn *conn, uint8_t reason_code, double now);

rc_conn_state rc_conn_get_state(const rc_conn *conn);
void rc_conn_get_stats(const rc_conn *conn, rc_conn_stats *stats);
/* Messages queued or unacknowledged on a channel. */
uint32_t rc_conn_pending(const rc_conn *conn, int channel);

/* The session id from ACCEPT (0 before), and whether DATA/DISCONNECT/PATH are sealed. */
uint32_t rc_conn_session_id(const rc_conn *conn);
int rc_conn_is_sealed(const rc_conn *conn);

#endif
