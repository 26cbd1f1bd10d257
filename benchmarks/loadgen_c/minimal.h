/*
 * minimal.h - the load generator's own minimal relay client (--client minimal): exactly the
 * wire of docs/PROTOCOL.md and docs/RELAY_PROTOCOL.md that a lockstep bot needs, with all of a
 * player's connection state in one fixed-size struct (mc_player, about 1.3 KiB) that lives
 * in one contiguous array: no allocation per player, no clock, no socket (sans-I/O, like the
 * library's core).
 *
 * What it does (and what it does not):
 *  - open mode only (no connect token, nothing sealed); the library client keeps token mode;
 *  - handshake CONNECT_REQUEST / CHALLENGE / CONNECT_RESPONSE / ACCEPT (resent every 0.1 s,
 *    given up after 5 s), REFUSE, DISCONNECT both ways (three copies when it closes);
 *  - DATA header: seq, ack and a 64-packet received window (duplicates and stale packets
 *    dropped as PROTOCOL section 10 says), ack_bits, send_time and echo_time with the hold
 *    time, RTT samples (SRTT/RTTVAR) and the RTO of section 11.2 with the relay's ack delay;
 *    an ack-only DATA at most ack_delay (33 ms, announced) after a packet with records; a
 *    heartbeat after 0.5 s idle; the idle timeout (10 s);
 *  - channel 0 (CONTROL, reliable_ordered, window 16): sends one message, the JOIN, resent on
 *    its RTO (x1.5 backoff) until acknowledged; READY is not sent (rooms that start when full
 *    do not need it); receives in id order, duplicates accepted;
 *  - channel 1 (STREAM, redundant, window 64): INPUTs as messages; each datagram that carries a
 *    new INPUT also carries the earlier unacknowledged ones as redundant copies, newest first
 *    as many as fit (policy "always"); an RTO resend carries them oldest first; a datagram
 *    carries one contiguous range of ids, so the sent-packet record is two numbers;
 *    receives FRAMEs in id order, redundant copies deduplicated by message id;
 *  - a message ahead of the next expected id is refused (a reassembly budget of 0, PROTOCOL
 *    12.5 reassembly_full): the packet is then not acknowledged and the relay resends it; a
 *    FRAGMENT of the message it waits for is not supported (the player fails: "fragment");
 *  - blocks (history, catch-up, repair): slices are acknowledged (BLOCK_ACK, so that the relay
 *    is not left resending them) but the block is not reassembled: each is counted
 *    (blocks), and the frames it covers (read from its first slice) counted (block_frames);
 *    a frame that only came in a block is a gap in the player's frame sequence, i.e. lost.
 *
 * FRAMEs are decoded with clients/c/src/frame.c against the previous frame's inputs, which the
 * player keeps compactly (at most MC_SLOTS slots of at most MC_SLOT_BYTES bytes: wider frames
 * fail the player, never silently).
 */
#ifndef LG_MINIMAL_H
#define LG_MINIMAL_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"

#define MC_SENT_PACKETS 32        /* ack_bits span: older packets can never be acknowledged */
#define MC_INPUT_WINDOW 64        /* STREAM's window: INPUT ids in flight */
#define MC_INPUT_QUEUE 128        /* INPUTs held: in flight and waiting (powers of two) */
#define MC_SLOTS 8
#define MC_SLOT_BYTES 16
#define MC_MTU 1200
#define MC_CONTROL_MAX 72         /* the JOIN */
#define MC_ACK_DELAY 0.033        /* announced in CONNECT_RESPONSE: one tick at 30 Hz */
#define MC_CONTROL_WINDOW 16
#define MC_STREAM_WINDOW 64

enum { MC_IDLE = 0, MC_CONNECTING, MC_CHALLENGED, MC_CONNECTED, MC_DISCONNECTING, MC_CLOSED };

typedef struct mc_sent {
    uint16_t seq;
    uint16_t input_lo, input_hi;  /* the packet carried the unacknowledged INPUTs lo .. hi - 1 */
    uint8_t flags;                /* MC_SENT_VALID | MC_SENT_INPUTS | MC_SENT_CONTROL */
} mc_sent;

typedef struct mc_player {
    uint32_t index;               /* the loader's player index (its inputs' bytes) */
    uint32_t connect_id, session_id;
    uint8_t state, close_kind, close_code, disconnects_left, received_any;
    uint8_t ack_pending, control_due, control_acked, stream_due, stream_resend;
    uint8_t challenge[24];        /* CHALLENGE bytes 4..27, copied into CONNECT_RESPONSE */
    uint16_t peer_ack_delay_ms;
    uint16_t next_seq;
    /* received DATA: newest seq, the 64 before it, the newest's send_time and arrival */
    uint16_t recv_ack, echo_send_time;
    uint64_t recv_bits;
    double echo_arrival;
    double handshake_due, connect_deadline, last_sent, last_admitted, ack_due;
    float srtt, rttvar;           /* seconds; srtt < 0: no sample yet */
    /* channel 0 out: the JOIN (id 0) */
    uint8_t control_length, control_resends, stream_resends, block_owed;
    uint8_t control[MC_CONTROL_MAX];
    double control_deadline, stream_deadline;     /* < 0: nothing unacknowledged */
    float control_rto, stream_rto;
    /* channel 1 out: INPUT ids input_acked .. input_next - 1 held (acked ones among them in
     * input_acked_bits, bit id % 64), input_unsent .. never written yet */
    uint16_t input_next, input_acked, input_unsent;
    uint64_t input_acked_bits;
    uint32_t input_frame[MC_INPUT_QUEUE];
    uint8_t input_behind[MC_INPUT_QUEUE];         /* frame - have */
    mc_sent sent[MC_SENT_PACKETS];
    /* channels in */
    uint16_t control_expected, stream_expected;
    /* blocks in: the block expected, its layout and the slices seen (up to 64) */
    uint16_t block_expected, block_slices, block_completed_slices;
    uint64_t block_seen;
    /* the previous frame's inputs (frame.c's `same` bits refer to them) */
    uint8_t prev_valid, prev_count;
    uint32_t prev_number;
    int8_t prev_length[MC_SLOTS];                 /* -1: nil */
    uint8_t prev_data[MC_SLOTS][MC_SLOT_BYTES];
    /* counts */
    uint32_t drops, refused, blocks, block_frames;
} mc_player;

/* Receive callbacks: a delivered message of channel 0 (CONTROL) or channel 1 (a FRAME). */
typedef struct mc_sink {
    void (*control)(void *context, mc_player *p, const uint8_t *data, size_t length);
    void (*frame)(void *context, mc_player *p, const uint8_t *data, size_t length, double now);
    void *context;
} mc_sink;

/* Sets p up for a connection: join_message is the encoded JOIN, queued on CONTROL. */
void mc_init(mc_player *p, uint32_t index);
int mc_connect(mc_player *p, uint32_t connect_id, const uint8_t *join_message, size_t length,
               double now);
/* Queues the INPUT for frame (payload lg_input_payload(index, frame); have: -1 or frame - 255
 * .. frame - 1): 0, or -1 when MC_INPUT_QUEUE are already held. Beyond MC_INPUT_WINDOW
 * unacknowledged ones an INPUT waits for acks (PROTOCOL 12.3). */
int mc_send_input(mc_player *p, uint32_t frame, int64_t have);
/* One received datagram from the relay. 0 if taken, else a drop reason (wire.h rc_drop). */
int mc_receive(mc_player *p, const uint8_t *data, size_t length, double now, const mc_sink *sink);
/* Runs the timers (resends, timeouts). */
void mc_handle_timeout(mc_player *p, double now);
/* The next datagram due now into out (at least MC_MTU bytes): its length, or 0. */
size_t mc_next_datagram(mc_player *p, uint8_t *out, double now);
/* When something is next due (< 0: never; <= now: now). */
double mc_next_timeout(const mc_player *p);
/* Starts the graceful disconnect (three DISCONNECTs) if connected; closed otherwise. */
void mc_disconnect(mc_player *p);
/* Why the connection closed ("refused:server_full", "remote:timeout", "connect_timeout",
 * "timeout", "resend_limit", "fragment", "block" ...), "" if it did not. */
const char *mc_close_text(const mc_player *p, char *out, size_t cap);

/* Decodes a FRAME against the player's previous frame (frame 0: the empty frame): RF_OK and
 * *out (valid until the next call), or an RF_ error (also when the frame is wider than the
 * compact store). */
int mc_decode_frame(mc_player *p, const uint8_t *data, size_t length, const rf_frame **out);

/* ---- the encoders and the decoder, apart (minimal_test.c checks them against tests/vectors) */

/* A DATA header for p as it would go now. */
void mc_fill_header(const mc_player *p, double now, uint8_t header[20]);
/* BLOCK_ACK for the block being received (or the last completed one): the record's size. */
size_t mc_write_block_ack(const mc_player *p, uint8_t *out);

/* A datagram decoded for inspection: the type (1..9) or -drop reason; DATA fields and up to
 * MC_PARSE_RECORDS records (rc_record, payloads pointing into the datagram). */
#define MC_PARSE_RECORDS 16
typedef struct mc_parsed {
    int type;
    uint32_t id;                  /* connect_id (handshake) or session_id */
    uint32_t session_id;          /* ACCEPT */
    uint16_t seq, ack, send_time, echo_time, ack_delay_ms;
    uint32_t ack_bits, cookie_time;
    uint8_t reason;
    int record_count;
    struct rc_record_view {
        int kind, channel;
        uint16_t msg_id, block_id, slice_index, slice_count, base;
        uint8_t fragment_index, fragment_count;
        uint32_t block_size;
        const uint8_t *payload;
        size_t length;
    } records[MC_PARSE_RECORDS];
} mc_parsed;
int mc_parse(const uint8_t *data, size_t length, mc_parsed *out);

#endif
