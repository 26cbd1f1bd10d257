/* wire.h - datagram codec (PROTOCOL 3-6): prefix, control packets, DATA header, records,
 * varints, 16-bit sequence arithmetic, drop-reason and reason-code names. */
#ifndef RC_WIRE_H
#define RC_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
    RC_PT_CONNECT_REQUEST = 1, RC_PT_CHALLENGE = 2, RC_PT_CONNECT_RESPONSE = 3, RC_PT_ACCEPT = 4,
    RC_PT_REFUSE = 5, RC_PT_DATA = 6, RC_PT_DISCONNECT = 7, RC_PT_PATH_CHALLENGE = 8,
    RC_PT_PATH_RESPONSE = 9
};

enum { RC_RK_MESSAGE = 0, RC_RK_FRAGMENT = 1, RC_RK_BLOCK_SLICE = 2, RC_RK_BLOCK_ACK = 3 };

/* Drop reasons, PROTOCOL 16, in relay_core.wire.DROP_REASONS order (0 = no drop). */
typedef enum rc_drop {
    RC_OK = 0, RC_DROP_TRUNCATED, RC_DROP_BAD_MAGIC, RC_DROP_BAD_VERSION, RC_DROP_UNKNOWN_TYPE,
    RC_DROP_BAD_LENGTH, RC_DROP_UNKNOWN_PEER, RC_DROP_WRONG_SESSION, RC_DROP_DUPLICATE_PACKET,
    RC_DROP_STALE_PACKET, RC_DROP_BAD_COOKIE, RC_DROP_EXPIRED_COOKIE, RC_DROP_NOT_ACCEPTING,
    RC_DROP_UNEXPECTED_PACKET, RC_DROP_MALFORMED_RECORD, RC_DROP_UNKNOWN_RECORD_KIND,
    RC_DROP_UNKNOWN_CHANNEL, RC_DROP_BAD_FRAGMENT, RC_DROP_MESSAGE_OUT_OF_WINDOW,
    RC_DROP_MESSAGE_TOO_LARGE, RC_DROP_REASSEMBLY_FULL, RC_DROP_BAD_BLOCK_SLICE,
    RC_DROP_BLOCK_TOO_LARGE, RC_DROP_AUTH_FAILED, RC_DROP_RATE_LIMITED, RC_DROP_BAD_TOKEN,
    RC_DROP_PATH_UNVALIDATED, RC_DROP_COUNT
} rc_drop;

#define RC_PREFIX_SIZE 4
#define RC_DATA_HEADER_SIZE 20
#define RC_TAG_SIZE 16
#define RC_CONNECT_REQUEST_SIZE 64
#define RC_CHALLENGE_SIZE 28
#define RC_CONNECT_RESPONSE_SIZE 30
#define RC_ACCEPT_SIZE 14
#define RC_ACCEPT_SECURE_SIZE 31
#define RC_REFUSE_SIZE 9
#define RC_DISCONNECT_SIZE 9
#define RC_DISCONNECT_SECURE_SIZE 27
#define RC_PATH_SIZE 16
#define RC_PATH_SECURE_SIZE 34
#define RC_TOKEN_BLOCK_HEADER 3
#define RC_MAX_VARINT 16383
#define RC_MAX_CHANNELS 32

/* Reason codes of DISCONNECT and REFUSE (PROTOCOL 17). */
enum {
    RC_REASON_CLOSED = 0, RC_REASON_SERVER_FULL = 1, RC_REASON_SHUTDOWN = 2, RC_REASON_KICKED = 3,
    RC_REASON_TIMEOUT = 4, RC_REASON_PROTOCOL_ERROR = 5, RC_REASON_REPLACED = 6,
    RC_REASON_RESEND_LIMIT = 7
};

const char *rc_drop_name(int drop);
/* Reason code name (PROTOCOL 17), or NULL for a code without one. */
const char *rc_reason_name(int code);
/* Writes "<prefix><name or number>" into out (NUL-terminated, truncated to cap). */
void rc_reason_text(char *out, size_t cap, const char *prefix, int code);

/* Sequence arithmetic (PROTOCOL 7). */
static inline int rc_seq_diff(uint16_t a, uint16_t b) { return (int16_t)(uint16_t)(a - b); }
static inline int rc_seq_newer(uint16_t a, uint16_t b) { return rc_seq_diff(a, b) > 0; }

static inline uint16_t rc_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rc_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void rc_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void rc_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

/* Varint of PROTOCOL 6.2: size of the shortest form, writer, reader (0 or a drop reason). */
size_t rc_varint_size(size_t value);
size_t rc_varint_write(uint8_t *out, size_t value);
int rc_varint_read(const uint8_t *p, size_t pos, size_t end, size_t *value, size_t *next);

/* Prefix and size rules of PROTOCOL 3: the packet type (1..9), or -drop. CONNECT_RESPONSE
 * token-size and token-block checks included (rc_drop: bad_length / bad_token). */
int rc_wire_check(const uint8_t *p, size_t n);
void rc_wire_prefix(uint8_t *p, int type);

/* Token block at offset pos: 0 (format 0), 1 (format 1, *length set), or -drop (bad_token). */
int rc_wire_token_block(const uint8_t *p, size_t n, size_t pos, size_t *length);

typedef struct rc_data_header {
    uint32_t session_id;
    uint16_t seq, ack;
    uint32_t ack_bits;
    uint16_t send_time, echo_time;
} rc_data_header;

void rc_data_header_read(const uint8_t *p, rc_data_header *h);
void rc_data_header_write(uint8_t *p, const rc_data_header *h);

typedef struct rc_record {
    int kind;
    int channel;                /* MESSAGE, FRAGMENT */
    uint16_t msg_id;
    uint8_t fragment_index, fragment_count;
    uint16_t block_id, slice_index, slice_count, base;
    uint32_t block_size;
    const uint8_t *payload;     /* payload, slice data or BLOCK_ACK bitfield */
    size_t length;
} rc_record;

/* Parses the record at pos (< end). 0 and *next, or a drop reason. */
int rc_record_parse(const uint8_t *p, size_t pos, size_t end, rc_record *r, size_t *next);

size_t rc_message_record_size(size_t length);
size_t rc_message_record_write(uint8_t *out, int channel, uint16_t msg_id,
                               const uint8_t *data, size_t length);
size_t rc_fragment_record_write(uint8_t *out, int channel, uint16_t msg_id, uint8_t index,
                                uint8_t count, const uint8_t *data, size_t length);
size_t rc_block_slice_record_write(uint8_t *out, uint16_t block_id, uint16_t index,
                                   uint16_t count, uint32_t block_size,
                                   const uint8_t *data, size_t length);
/* bitfield_length <= 255 */
size_t rc_block_ack_record_write(uint8_t *out, uint16_t block_id, uint16_t base,
                                 const uint8_t *bitfield, size_t bitfield_length);

/* Control packets; each returns the datagram size. */
size_t rc_write_connect_request(uint8_t *out, uint32_t connect_id, const uint8_t *token,
                                size_t token_length);
size_t rc_write_challenge(uint8_t *out, uint32_t connect_id, uint32_t cookie_time,
                          const uint8_t mac[16]);
/* Open form (30 bytes); the token form adds the token block, tag_key seals the tag. */
size_t rc_write_connect_response(uint8_t *out, const uint8_t challenge_body[24],
                                 uint16_t ack_delay_ms, const uint8_t *token, size_t token_length,
                                 const uint8_t *client_key);
/* tag_key NULL: 14-byte ACCEPT; else 31 bytes with flags and a tag under tag_key. */
size_t rc_write_accept(uint8_t *out, uint32_t connect_id, uint32_t session_id,
                       uint16_t ack_delay_ms, int flags, const uint8_t *tag_key);
size_t rc_write_refuse(uint8_t *out, uint32_t connect_id, uint8_t reason);
size_t rc_write_disconnect(uint8_t *out, uint32_t session_id, uint8_t reason);
size_t rc_write_path(uint8_t *out, int type, uint32_t session_id, const uint8_t data[8]);

/* Sealed forms (PROTOCOL 8.8). counter: the sender's packet counter (seq = its low bits). */
void rc_nonce(uint8_t nonce[12], int type, uint64_t counter);
size_t rc_write_disconnect_sealed(uint8_t *out, uint32_t session_id, uint8_t reason,
                                  uint64_t counter, const uint8_t key[32]);
size_t rc_write_path_sealed(uint8_t *out, int type, uint32_t session_id, const uint8_t data[8],
                            uint64_t counter, const uint8_t key[32]);
/* DATA at out[0..length) (header + records): seals in place, returns length + 16. */
size_t rc_seal_data(uint8_t *out, size_t length, uint64_t counter, const uint8_t key[32]);
/* Opens sealed DATA/DISCONNECT/PATH in[0..n) into out (n - 16 bytes: clear header + plain).
 * 0 or -1. header: 20 (DATA) or 10 (DISCONNECT, PATH). */
int rc_open_packet(uint8_t *out, const uint8_t *in, size_t n, size_t header, int type,
                   uint64_t counter, const uint8_t key[32]);
/* Counter reconstruction (PROTOCOL 8.8.2); have_largest 0: counter = seq. */
uint64_t rc_counter_from_seq(int have_largest, uint64_t largest, uint16_t seq);

#endif
