# C-level wire constants and codec helpers shared by every core module.
# Layouts are specified in docs/PROTOCOL.md; all integers are little-endian.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int16_t, int32_t, int64_t

cdef enum:
    MAGIC_0 = 0x52          # 'R'
    MAGIC_1 = 0x4C          # 'L'
    PROTOCOL_VERSION = 1
    PREFIX_SIZE = 4

    # packet types (byte 3)
    PT_CONNECT_REQUEST = 1
    PT_CHALLENGE = 2
    PT_CONNECT_RESPONSE = 3
    PT_ACCEPT = 4
    PT_REFUSE = 5
    PT_DATA = 6
    PT_DISCONNECT = 7
    PT_PATH_CHALLENGE = 8
    PT_PATH_RESPONSE = 9

    CONNECT_REQUEST_SIZE = 64
    CHALLENGE_SIZE = 28
    CONNECT_RESPONSE_SIZE = 30
    ACCEPT_SIZE = 14
    REFUSE_SIZE = 9
    DISCONNECT_SIZE = 9
    COOKIE_MAC_SIZE = 16
    DATA_HEADER_SIZE = 20

    # token mode and packet protection (docs/PROTOCOL.md, "Connect tokens", "Packet protection")
    TAG_SIZE = 16                   # ChaCha20-Poly1305 tag
    NONCE_SIZE = 12
    TOKEN_FORMAT_NONE = 0
    TOKEN_FORMAT_V1 = 1
    TOKEN_BLOCK_HEADER = 3          # format u8, length u16
    MIN_TOKEN_SIZE = 127            # relay_core.token.MIN_PRIVATE_SIZE
    MAX_TOKEN_SIZE = 509            # relay_core.token.MAX_PRIVATE_SIZE
    ACCEPT_SECURE_SIZE = 31         # ACCEPT + flags u8 + tag
    DISCONNECT_SECURE_SIZE = 27     # prefix, session_id, seq u16, reason (sealed), tag
    ACCEPT_FLAG_ENCRYPTED = 1
    SEALED_CONTROL_HEADER = 10      # prefix, session_id, seq u16: associated data of sealed control packets
    PATH_DATA_SIZE = 8
    PATH_SIZE = 16                  # prefix, session_id, data
    PATH_SECURE_SIZE = 34           # prefix, session_id, seq u16, data (sealed), tag

    # record kinds inside a DATA packet (high 3 bits of the record's first byte)
    RK_MESSAGE = 0
    RK_FRAGMENT = 1
    RK_BLOCK_SLICE = 2
    RK_BLOCK_ACK = 3
    MAX_CHANNELS = 32

    # worst-case record header sizes, used to budget space before writing
    MESSAGE_RECORD_OVERHEAD = 5     # kind|ch, id u16, varint length (<= 2 bytes)
    FRAGMENT_RECORD_OVERHEAD = 7    # kind|ch, id u16, index u8, count u8, varint length
    SLICE_RECORD_OVERHEAD = 13      # kind, block u16, index u16, count u16, size u32, varint len
    MAX_VARINT_LENGTH = 16383       # two-byte LEB128 ceiling


cdef inline uint16_t read_u16(const uint8_t* p) noexcept nogil:
    return <uint16_t>(p[0] | (<uint16_t>p[1] << 8))

cdef inline uint32_t read_u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))

cdef inline void write_u16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = v >> 8

cdef inline void write_u32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24

cdef inline int varint_size(Py_ssize_t v) noexcept nogil:
    return 1 if v < 128 else 2

cdef inline int write_varint(uint8_t* p, Py_ssize_t v) noexcept nogil:
    """Two-byte-max LEB128; callers guarantee v <= MAX_VARINT_LENGTH."""
    if v < 128:
        p[0] = <uint8_t>v
        return 1
    p[0] = <uint8_t>((v & 0x7F) | 0x80)
    p[1] = <uint8_t>(v >> 7)
    return 2

cdef inline int read_varint(const uint8_t* p, Py_ssize_t avail, Py_ssize_t* out) noexcept nogil:
    """Returns bytes consumed, or -1 if truncated or longer than two bytes."""
    if avail < 1:
        return -1
    if p[0] < 128:
        out[0] = p[0]
        return 1
    if avail < 2 or p[1] >= 128:
        return -1
    out[0] = (p[0] & 0x7F) | (<Py_ssize_t>p[1] << 7)
    return 2

# 16-bit sequence arithmetic, safe across the 65535 -> 0 wrap (RFC 1982 style).
cdef inline int32_t seq_diff(uint16_t a, uint16_t b) noexcept nogil:
    """Signed distance a - b in [-32768, 32767]."""
    return <int32_t>(<int16_t>(<uint16_t>(a - b)))

cdef inline bint seq_greater(uint16_t a, uint16_t b) noexcept nogil:
    return seq_diff(a, b) > 0

# Fields every DATA packet, and every packet of an established session, has at the same offset.
cdef inline uint32_t read_session_id(const uint8_t* p) noexcept nogil:
    """The session_id of a DATA, DISCONNECT or PATH packet (the caller checked its length)."""
    return read_u32(p + 4)

cdef inline uint16_t read_packet_seq(const uint8_t* p) noexcept nogil:
    """The seq of a DATA packet or a sealed DISCONNECT / PATH packet: the low 16 bits of
    its packet counter."""
    return read_u16(p + 8)

cdef inline uint16_t time_ms16(double now) noexcept nogil:
    return <uint16_t>(<int64_t>(now * 1000.0) & 0xFFFF)

cdef inline uint64_t reconstruct_counter(uint64_t largest, bint has_largest, uint16_t seq) noexcept nogil:
    """The 64-bit packet counter whose low 16 bits are ``seq``, closest to the one expected
    after ``largest`` (the highest authenticated so far): RFC 9000 appendix A.3 with a 16-bit
    truncated packet number. Before anything was authenticated the counter is seq itself."""
    cdef uint64_t expected, candidate
    if not has_largest:
        return seq
    expected = largest + 1
    candidate = (expected & ~(<uint64_t>0xFFFF)) | seq
    if candidate + 0x8000 <= expected and candidate < (<uint64_t>1 << 63):
        return candidate + 0x10000
    if candidate > expected + 0x8000 and candidate >= 0x10000:
        return candidate - 0x10000
    return candidate



# Reasons a datagram (or the rest of it) is dropped; names in wire.DROP_REASONS.
cdef enum:  # DropReason
    DROP_TRUNCATED = 0
    DROP_BAD_MAGIC
    DROP_BAD_VERSION
    DROP_UNKNOWN_TYPE
    DROP_BAD_LENGTH
    DROP_UNKNOWN_PEER
    DROP_WRONG_SESSION
    DROP_DUPLICATE_PACKET
    DROP_STALE_PACKET
    DROP_BAD_COOKIE
    DROP_EXPIRED_COOKIE
    DROP_NOT_ACCEPTING
    DROP_UNEXPECTED_PACKET
    DROP_MALFORMED_RECORD
    DROP_UNKNOWN_RECORD_KIND
    DROP_UNKNOWN_CHANNEL
    DROP_BAD_FRAGMENT
    DROP_MESSAGE_OUT_OF_WINDOW
    DROP_MESSAGE_TOO_LARGE
    DROP_REASSEMBLY_FULL
    DROP_BAD_BLOCK_SLICE
    DROP_BLOCK_TOO_LARGE
    DROP_AUTH_FAILED
    DROP_RATE_LIMITED
    DROP_BAD_TOKEN
    DROP_PATH_UNVALIDATED
    DROP_RECEIVE_MEMORY_FULL
    DROP_HANDSHAKE_BUDGET
    DROP_REASON_COUNT


cdef struct DataHeader:
    uint32_t session_id
    uint16_t seq
    uint16_t ack
    uint32_t ack_bits
    uint16_t send_time
    uint16_t echo_time


cdef struct Record:
    int kind
    int channel
    uint16_t msg_id
    int fragment_index
    int fragment_count
    uint16_t block_id
    int slice_index
    int slice_count
    uint32_t block_size
    uint16_t ack_base
    Py_ssize_t payload_offset   # offset of payload / bitfield within the datagram
    Py_ssize_t payload_length


# Control packets decoded: decode_* fill one of these from a datagram whose prefix names its
# type, and return 0, or -(DropReason + 1) for a length or token block that does not fit.
cdef struct ConnectRequest:
    uint32_t connect_id
    int token_format                # TOKEN_FORMAT_NONE or TOKEN_FORMAT_V1
    Py_ssize_t token_offset         # the token's private part: [token_offset, + token_length)
    Py_ssize_t token_length


cdef struct CookiePacket:           # CHALLENGE and CONNECT_RESPONSE
    uint32_t connect_id
    uint32_t cookie_time
    uint8_t cookie_mac[COOKIE_MAC_SIZE]
    uint16_t ack_delay_ms           # CONNECT_RESPONSE only
    int token_format                # CONNECT_RESPONSE in token mode: TOKEN_FORMAT_V1
    Py_ssize_t token_offset
    Py_ssize_t token_length
    Py_ssize_t tag_offset           # token mode: the tag, after the bytes it covers; else -1


cdef struct AcceptPacket:
    uint32_t connect_id
    uint32_t session_id
    uint16_t ack_delay_ms
    int flags                       # token mode; -1 in open mode
    Py_ssize_t tag_offset           # token mode; else -1


cdef struct RefusePacket:
    uint32_t connect_id
    int reason


cdef struct SessionPacket:          # DISCONNECT, PATH_CHALLENGE, PATH_RESPONSE
    uint32_t session_id
    bint sealed                     # seq, then the body sealed from SEALED_CONTROL_HEADER on
    uint16_t seq                    # sealed only
    int reason                      # open DISCONNECT only; else -1
    uint8_t path_data[PATH_DATA_SIZE]   # open PATH only


cdef int check_prefix(const uint8_t* p, Py_ssize_t n) noexcept nogil
cdef void write_prefix(uint8_t* p, int packet_type) noexcept nogil
cdef void write_data_header(uint8_t* p, const DataHeader* h) noexcept nogil
cdef void read_data_header(const uint8_t* p, DataHeader* h) noexcept nogil
cdef Py_ssize_t parse_record(const uint8_t* p, Py_ssize_t start, Py_ssize_t end, Record* r) noexcept nogil
cdef Py_ssize_t write_message_record(uint8_t* p, int channel, uint16_t msg_id,
                                     const uint8_t* payload, Py_ssize_t length) noexcept nogil
cdef Py_ssize_t write_fragment_record(uint8_t* p, int channel, uint16_t msg_id, int index, int count,
                                      const uint8_t* payload, Py_ssize_t length) noexcept nogil
cdef Py_ssize_t write_slice_record(uint8_t* p, uint16_t block_id, int index, int count,
                                   uint32_t block_size, const uint8_t* data, Py_ssize_t length) noexcept nogil
cdef Py_ssize_t write_block_ack_record(uint8_t* p, uint16_t block_id, uint16_t base,
                                       const uint8_t* bitfield, Py_ssize_t bitfield_length) noexcept nogil

cdef Py_ssize_t read_token_block(const uint8_t* p, Py_ssize_t n, Py_ssize_t offset, Py_ssize_t* length) noexcept nogil
cdef int decode_connect_request(const uint8_t* p, Py_ssize_t n, ConnectRequest* out) noexcept nogil
cdef int decode_challenge(const uint8_t* p, Py_ssize_t n, CookiePacket* out) noexcept nogil
cdef int decode_connect_response(const uint8_t* p, Py_ssize_t n, CookiePacket* out) noexcept nogil
cdef int decode_accept(const uint8_t* p, Py_ssize_t n, AcceptPacket* out) noexcept nogil
cdef int decode_refuse(const uint8_t* p, Py_ssize_t n, RefusePacket* out) noexcept nogil
cdef int decode_disconnect(const uint8_t* p, Py_ssize_t n, SessionPacket* out) noexcept nogil
cdef int decode_path_packet(const uint8_t* p, Py_ssize_t n, SessionPacket* out) noexcept nogil
cdef void write_sealed_header(uint8_t* p, int packet_type, uint32_t session_id, uint16_t seq) noexcept nogil
cdef bytes make_nonce(int packet_type, uint64_t counter)
cdef void write_nonce(uint8_t* nonce, int packet_type, uint64_t counter) noexcept
cdef bytes make_connect_request(uint32_t connect_id, bytes token)
cdef bytes make_challenge(uint32_t connect_id, uint32_t cookie_time, bytes mac)
cdef bytes make_connect_response(uint32_t connect_id, uint32_t cookie_time, bytes mac, uint16_t ack_delay_ms,
                                 bytes token)
cdef bytes make_accept(uint32_t connect_id, uint32_t session_id, uint16_t ack_delay_ms, int flags)
cdef bytes make_refuse(uint32_t connect_id, int reason)
cdef bytes make_disconnect(uint32_t session_id, int reason)
cdef bytes make_path_packet(int packet_type, uint32_t session_id, bytes data)
