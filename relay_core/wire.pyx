"""Wire format: packet prefix, DATA header, record codecs and handshake packets.

Every layout here is specified byte by byte in docs/PROTOCOL.md; tests/vectors/*.json tie the
two together, and no other module knows a byte offset. The cdef functions are what peer.pyx
and endpoint.pyx read and write datagrams with (one ``decode_*`` per control packet);
``decode_packet`` and ``encode_packet`` expose the same codecs to Python for test vectors and
tooling.
"""
from libc.string cimport memcpy, memset
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

from relay_core.aead import AeadError, open_, seal as aead_seal_bytes

DROP_REASONS = (
    "truncated", "bad_magic", "bad_version", "unknown_type", "bad_length", "unknown_peer",
    "wrong_session", "duplicate_packet", "stale_packet", "bad_cookie", "expired_cookie",
    "not_accepting", "unexpected_packet", "malformed_record", "unknown_record_kind",
    "unknown_channel", "bad_fragment", "message_out_of_window", "message_too_large",
    "reassembly_full", "bad_block_slice", "block_too_large", "auth_failed", "rate_limited",
    "bad_token", "path_unvalidated", "receive_memory_full", "handshake_budget",
)
assert len(DROP_REASONS) == DROP_REASON_COUNT

PACKET_TYPES = {
    PT_CONNECT_REQUEST: "connect_request", PT_CHALLENGE: "challenge",
    PT_CONNECT_RESPONSE: "connect_response", PT_ACCEPT: "accept", PT_REFUSE: "refuse",
    PT_DATA: "data", PT_DISCONNECT: "disconnect", PT_PATH_CHALLENGE: "path_challenge",
    PT_PATH_RESPONSE: "path_response",
}
_PACKET_TYPE_IDS = {name: code for code, name in PACKET_TYPES.items()}
RECORD_KINDS = {RK_MESSAGE: "message", RK_FRAGMENT: "fragment",
                RK_BLOCK_SLICE: "block_slice", RK_BLOCK_ACK: "block_ack"}

# Disconnect / refusal reason codes carried in REFUSE and DISCONNECT.
REASONS = {
    0: "closed", 1: "server_full", 2: "shutdown", 3: "kicked", 4: "timeout",
    5: "protocol_error", 6: "replaced", 7: "resend_limit", 8: "token_invalid", 9: "token_expired",
    10: "token_used", 11: "token_required", 12: "token_unsupported", 13: "source_session_limit",
}
REASON_CODES = {name: code for code, name in REASONS.items()}

# Sizes for Python code (relay_core.config derives its limits from them).
DATA_HEADER_BYTES = DATA_HEADER_SIZE
MESSAGE_OVERHEAD_BYTES = MESSAGE_RECORD_OVERHEAD
FRAGMENT_OVERHEAD_BYTES = FRAGMENT_RECORD_OVERHEAD
SLICE_OVERHEAD_BYTES = SLICE_RECORD_OVERHEAD
MAX_RECORD_LENGTH = MAX_VARINT_LENGTH
TAG_BYTES = TAG_SIZE


def counter_from_seq(largest, int seq):
    """The packet counter a receiver reconstructs from a 16-bit ``seq``, given the highest
    counter authenticated so far (None: nothing yet). See docs/PROTOCOL.md, "Packet protection"."""
    return reconstruct_counter(0 if largest is None else largest, largest is not None, <uint16_t>seq)


def packet_nonce(int packet_type, uint64_t counter):
    """The 12-byte AEAD nonce of a packet type and counter."""
    return make_nonce(packet_type, counter)


def seq_greater_than(int a, int b):
    """True when 16-bit sequence a is newer than b, across the 65535 -> 0 wrap."""
    return seq_greater(<uint16_t>a, <uint16_t>b)


def seq_distance(int a, int b):
    """Signed 16-bit distance a - b in [-32768, 32767]."""
    return seq_diff(<uint16_t>a, <uint16_t>b)


cdef int check_prefix(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """Packet type, or -(DropReason + 1) when the prefix is unusable."""
    if n < PREFIX_SIZE:
        return -(DROP_TRUNCATED + 1)
    if p[0] != MAGIC_0 or p[1] != MAGIC_1:
        return -(DROP_BAD_MAGIC + 1)
    if p[2] != PROTOCOL_VERSION:
        return -(DROP_BAD_VERSION + 1)
    if p[3] < PT_CONNECT_REQUEST or p[3] > PT_PATH_RESPONSE:
        return -(DROP_UNKNOWN_TYPE + 1)
    return p[3]


cdef void write_prefix(uint8_t* p, int packet_type) noexcept nogil:
    p[0] = MAGIC_0
    p[1] = MAGIC_1
    p[2] = PROTOCOL_VERSION
    p[3] = <uint8_t>packet_type


cdef void write_data_header(uint8_t* p, const DataHeader* h) noexcept nogil:
    write_prefix(p, PT_DATA)
    write_u32(p + 4, h.session_id)
    write_u16(p + 8, h.seq)
    write_u16(p + 10, h.ack)
    write_u32(p + 12, h.ack_bits)
    write_u16(p + 16, h.send_time)
    write_u16(p + 18, h.echo_time)


cdef void read_data_header(const uint8_t* p, DataHeader* h) noexcept nogil:
    h.session_id = read_u32(p + 4)
    h.seq = read_u16(p + 8)
    h.ack = read_u16(p + 10)
    h.ack_bits = read_u32(p + 12)
    h.send_time = read_u16(p + 16)
    h.echo_time = read_u16(p + 18)


cdef Py_ssize_t parse_record(const uint8_t* p, Py_ssize_t start, Py_ssize_t end, Record* r) noexcept nogil:
    """Parse one record at p[start:end]; returns the offset after it, or -(DropReason + 1).

    Only structure is checked here (lengths inside the datagram, field ranges); channel and
    window checks belong to the peer that owns the state.
    """
    cdef Py_ssize_t pos = start
    cdef Py_ssize_t length = 0
    cdef int used
    cdef uint8_t first = p[pos]
    r.kind = first >> 5
    r.channel = first & 0x1F
    pos += 1
    if r.kind == RK_MESSAGE or r.kind == RK_FRAGMENT:
        if end - pos < 2:
            return -(DROP_MALFORMED_RECORD + 1)
        r.msg_id = read_u16(p + pos)
        pos += 2
        r.fragment_index = 0
        r.fragment_count = 1
        if r.kind == RK_FRAGMENT:
            if end - pos < 2:
                return -(DROP_MALFORMED_RECORD + 1)
            r.fragment_index = p[pos]
            r.fragment_count = p[pos + 1]
            pos += 2
            if r.fragment_count < 2 or r.fragment_index >= r.fragment_count:
                return -(DROP_BAD_FRAGMENT + 1)
    elif r.kind == RK_BLOCK_SLICE:
        if end - pos < 10:
            return -(DROP_MALFORMED_RECORD + 1)
        r.block_id = read_u16(p + pos)
        r.slice_index = read_u16(p + pos + 2)
        r.slice_count = read_u16(p + pos + 4)
        r.block_size = read_u32(p + pos + 6)
        pos += 10
        if r.slice_count == 0 or r.slice_index >= r.slice_count:
            return -(DROP_BAD_BLOCK_SLICE + 1)
    elif r.kind == RK_BLOCK_ACK:
        if end - pos < 5:
            return -(DROP_MALFORMED_RECORD + 1)
        r.block_id = read_u16(p + pos)
        r.ack_base = read_u16(p + pos + 2)
        r.payload_length = p[pos + 4]
        r.payload_offset = pos + 5
        if r.payload_offset + r.payload_length > end:
            return -(DROP_MALFORMED_RECORD + 1)
        return r.payload_offset + r.payload_length
    else:
        return -(DROP_UNKNOWN_RECORD_KIND + 1)
    used = read_varint(p + pos, end - pos, &length)
    if used < 0:
        return -(DROP_MALFORMED_RECORD + 1)
    pos += used
    if length > end - pos:
        return -(DROP_MALFORMED_RECORD + 1)
    r.payload_offset = pos
    r.payload_length = length
    return pos + length


cdef Py_ssize_t write_message_record(uint8_t* p, int channel, uint16_t msg_id,
                                     const uint8_t* payload, Py_ssize_t length) noexcept nogil:
    cdef Py_ssize_t pos = 3
    p[0] = <uint8_t>((RK_MESSAGE << 5) | channel)
    write_u16(p + 1, msg_id)
    pos += write_varint(p + pos, length)
    memcpy(p + pos, payload, length)
    return pos + length


cdef Py_ssize_t write_fragment_record(uint8_t* p, int channel, uint16_t msg_id, int index, int count,
                                      const uint8_t* payload, Py_ssize_t length) noexcept nogil:
    cdef Py_ssize_t pos = 5
    p[0] = <uint8_t>((RK_FRAGMENT << 5) | channel)
    write_u16(p + 1, msg_id)
    p[3] = <uint8_t>index
    p[4] = <uint8_t>count
    pos += write_varint(p + pos, length)
    memcpy(p + pos, payload, length)
    return pos + length


cdef Py_ssize_t write_slice_record(uint8_t* p, uint16_t block_id, int index, int count,
                                   uint32_t block_size, const uint8_t* data, Py_ssize_t length) noexcept nogil:
    cdef Py_ssize_t pos = 11
    p[0] = <uint8_t>(RK_BLOCK_SLICE << 5)
    write_u16(p + 1, block_id)
    write_u16(p + 3, <uint16_t>index)
    write_u16(p + 5, <uint16_t>count)
    write_u32(p + 7, block_size)
    pos += write_varint(p + pos, length)
    memcpy(p + pos, data, length)
    return pos + length


cdef Py_ssize_t write_block_ack_record(uint8_t* p, uint16_t block_id, uint16_t base,
                                       const uint8_t* bitfield, Py_ssize_t bitfield_length) noexcept nogil:
    p[0] = <uint8_t>(RK_BLOCK_ACK << 5)
    write_u16(p + 1, block_id)
    write_u16(p + 3, base)
    p[5] = <uint8_t>bitfield_length
    memcpy(p + 6, bitfield, bitfield_length)
    return 6 + bitfield_length


cdef Py_ssize_t read_token_block(const uint8_t* p, Py_ssize_t n, Py_ssize_t offset, Py_ssize_t* length) noexcept nogil:
    """The token block at ``offset``: its format (0: none), with the private part's length in
    ``length``; or -(DropReason + 1) for an unknown format or a length past the datagram."""
    length[0] = 0
    if p[offset] == TOKEN_FORMAT_NONE:
        return TOKEN_FORMAT_NONE
    if p[offset] != TOKEN_FORMAT_V1 or n - offset < TOKEN_BLOCK_HEADER:
        return -(DROP_BAD_TOKEN + 1)
    length[0] = read_u16(p + offset + 1)
    if length[0] < MIN_TOKEN_SIZE or length[0] > MAX_TOKEN_SIZE or offset + TOKEN_BLOCK_HEADER + length[0] > n:
        return -(DROP_BAD_TOKEN + 1)
    return TOKEN_FORMAT_V1


# Where the token block starts in the handshake packets that carry one.
cdef enum:
    REQUEST_TOKEN_BLOCK = 8
    RESPONSE_TOKEN_BLOCK = CONNECT_RESPONSE_SIZE


cdef int decode_connect_request(const uint8_t* p, Py_ssize_t n, ConnectRequest* out) noexcept nogil:
    cdef int token_format
    if n < CONNECT_REQUEST_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    token_format = <int>read_token_block(p, n, REQUEST_TOKEN_BLOCK, &out.token_length)
    if token_format < 0:
        return token_format
    out.connect_id = read_u32(p + 4)
    out.token_format = token_format
    out.token_offset = REQUEST_TOKEN_BLOCK + TOKEN_BLOCK_HEADER
    return 0


cdef void _read_cookie(const uint8_t* p, CookiePacket* out) noexcept nogil:
    out.connect_id = read_u32(p + 4)
    out.cookie_time = read_u32(p + 8)
    memcpy(out.cookie_mac, p + 12, COOKIE_MAC_SIZE)
    out.ack_delay_ms = 0
    out.token_format = TOKEN_FORMAT_NONE
    out.token_offset = 0
    out.token_length = 0
    out.tag_offset = -1


cdef int decode_challenge(const uint8_t* p, Py_ssize_t n, CookiePacket* out) noexcept nogil:
    if n != CHALLENGE_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    _read_cookie(p, out)
    return 0


cdef int decode_connect_response(const uint8_t* p, Py_ssize_t n, CookiePacket* out) noexcept nogil:
    cdef int token_format
    cdef Py_ssize_t token_length = 0
    if n < CONNECT_RESPONSE_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    if n > CONNECT_RESPONSE_SIZE:
        # Token mode: the token block, then the tag, and nothing after it.
        token_format = <int>read_token_block(p, n, RESPONSE_TOKEN_BLOCK, &token_length)
        if token_format < 0:
            return token_format
        if (token_format == TOKEN_FORMAT_NONE
                or n != RESPONSE_TOKEN_BLOCK + TOKEN_BLOCK_HEADER + token_length + TAG_SIZE):
            return -(DROP_BAD_LENGTH + 1)
    _read_cookie(p, out)
    out.ack_delay_ms = read_u16(p + 28)
    if n > CONNECT_RESPONSE_SIZE:
        out.token_format = token_format
        out.token_offset = RESPONSE_TOKEN_BLOCK + TOKEN_BLOCK_HEADER
        out.token_length = token_length
        out.tag_offset = n - TAG_SIZE
    return 0


cdef int decode_accept(const uint8_t* p, Py_ssize_t n, AcceptPacket* out) noexcept nogil:
    if n != ACCEPT_SIZE and n != ACCEPT_SECURE_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    out.connect_id = read_u32(p + 4)
    out.session_id = read_u32(p + 8)
    out.ack_delay_ms = read_u16(p + 12)
    out.flags = p[ACCEPT_SIZE] if n == ACCEPT_SECURE_SIZE else -1
    out.tag_offset = ACCEPT_SIZE + 1 if n == ACCEPT_SECURE_SIZE else -1
    return 0


cdef int decode_refuse(const uint8_t* p, Py_ssize_t n, RefusePacket* out) noexcept nogil:
    if n != REFUSE_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    out.connect_id = read_u32(p + 4)
    out.reason = p[8]
    return 0


cdef void _read_session_packet(const uint8_t* p, bint sealed, SessionPacket* out) noexcept nogil:
    out.session_id = read_session_id(p)
    out.sealed = sealed
    out.seq = read_packet_seq(p) if sealed else 0
    out.reason = -1


cdef int decode_disconnect(const uint8_t* p, Py_ssize_t n, SessionPacket* out) noexcept nogil:
    if n != DISCONNECT_SIZE and n != DISCONNECT_SECURE_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    _read_session_packet(p, n == DISCONNECT_SECURE_SIZE, out)
    if not out.sealed:
        out.reason = p[8]
    return 0


cdef int decode_path_packet(const uint8_t* p, Py_ssize_t n, SessionPacket* out) noexcept nogil:
    if n != PATH_SIZE and n != PATH_SECURE_SIZE:
        return -(DROP_BAD_LENGTH + 1)
    _read_session_packet(p, n == PATH_SECURE_SIZE, out)
    if not out.sealed:
        memcpy(out.path_data, p + 8, PATH_DATA_SIZE)
    return 0


cdef void write_sealed_header(uint8_t* p, int packet_type, uint32_t session_id, uint16_t seq) noexcept nogil:
    """The clear start of a sealed DISCONNECT or PATH packet, its associated data."""
    write_prefix(p, packet_type)
    write_u32(p + 4, session_id)
    write_u16(p + 8, seq)


cdef void write_nonce(uint8_t* nonce, int packet_type, uint64_t counter) noexcept:
    # Packet type in byte 0 keeps the handshake, DATA and DISCONNECT nonces of one key apart.
    memset(nonce, 0, NONCE_SIZE)
    nonce[0] = <uint8_t>packet_type
    write_u32(nonce + 4, <uint32_t>(counter & 0xFFFFFFFF))
    write_u32(nonce + 8, <uint32_t>(counter >> 32))


cdef bytes make_nonce(int packet_type, uint64_t counter):
    cdef uint8_t nonce[NONCE_SIZE]
    write_nonce(nonce, packet_type, counter)
    return (<char*>nonce)[:NONCE_SIZE]


cdef bytes make_connect_request(uint32_t connect_id, bytes token):
    # Padded so that the CHALLENGE answering it is never larger (no amplification).
    cdef Py_ssize_t token_size = len(token) if token else 0
    cdef bytearray out = bytearray(max(CONNECT_REQUEST_SIZE, 8 + TOKEN_BLOCK_HEADER + token_size))
    cdef uint8_t* p = out
    write_prefix(p, PT_CONNECT_REQUEST)
    write_u32(p + 4, connect_id)
    if token:
        p[8] = TOKEN_FORMAT_V1
        write_u16(p + 9, <uint16_t>token_size)
        out[8 + TOKEN_BLOCK_HEADER:8 + TOKEN_BLOCK_HEADER + token_size] = token
    return bytes(out)


cdef bytearray _cookie_packet(int packet_type, Py_ssize_t size, uint32_t connect_id,
                              uint32_t cookie_time, bytes mac):
    if len(mac) != COOKIE_MAC_SIZE:
        raise ValueError(f"cookie mac must be {COOKIE_MAC_SIZE} bytes")
    cdef bytearray out = bytearray(size)
    cdef uint8_t* p = out
    write_prefix(p, packet_type)
    write_u32(p + 4, connect_id)
    write_u32(p + 8, cookie_time)
    out[12:28] = mac
    return out


cdef bytes make_challenge(uint32_t connect_id, uint32_t cookie_time, bytes mac):
    return bytes(_cookie_packet(PT_CHALLENGE, CHALLENGE_SIZE, connect_id, cookie_time, mac))


cdef bytes make_connect_response(uint32_t connect_id, uint32_t cookie_time, bytes mac, uint16_t ack_delay_ms,
                                 bytes token):
    """CONNECT_RESPONSE; with a token, its token block follows and the caller appends the tag."""
    cdef Py_ssize_t token_size = len(token) if token else 0
    cdef bytearray out = _cookie_packet(PT_CONNECT_RESPONSE,
                                        CONNECT_RESPONSE_SIZE + (TOKEN_BLOCK_HEADER + token_size if token else 0),
                                        connect_id, cookie_time, mac)
    cdef uint8_t* p = out
    write_u16(p + 28, ack_delay_ms)
    if token:
        p[30] = TOKEN_FORMAT_V1
        write_u16(p + 31, <uint16_t>token_size)
        out[33:33 + token_size] = token
    return bytes(out)


cdef bytes make_accept(uint32_t connect_id, uint32_t session_id, uint16_t ack_delay_ms, int flags):
    """ACCEPT; with flags >= 0 (token mode) the flags byte follows and the caller appends the tag."""
    cdef bytearray out = bytearray(ACCEPT_SIZE + (1 if flags >= 0 else 0))
    cdef uint8_t* p = out
    write_prefix(p, PT_ACCEPT)
    write_u32(p + 4, connect_id)
    write_u32(p + 8, session_id)
    write_u16(p + 12, ack_delay_ms)
    if flags >= 0:
        p[14] = <uint8_t>flags
    return bytes(out)


cdef bytes _reason_packet(int packet_type, uint32_t ident, int reason):
    cdef bytearray out = bytearray(REFUSE_SIZE)
    cdef uint8_t* p = out
    write_prefix(p, packet_type)
    write_u32(p + 4, ident)
    p[8] = <uint8_t>reason
    return bytes(out)


cdef bytes make_refuse(uint32_t connect_id, int reason):
    return _reason_packet(PT_REFUSE, connect_id, reason)


cdef bytes make_disconnect(uint32_t session_id, int reason):
    return _reason_packet(PT_DISCONNECT, session_id, reason)


cdef bytes make_path_packet(int packet_type, uint32_t session_id, bytes data):
    """PATH_CHALLENGE or PATH_RESPONSE of an open connection (sealed ones: Peer.seal_control)."""
    cdef bytearray out = bytearray(PATH_SIZE)
    cdef uint8_t* p = out
    if len(data) != PATH_DATA_SIZE:
        raise ValueError(f"path data must be {PATH_DATA_SIZE} bytes")
    write_prefix(p, packet_type)
    write_u32(p + 4, session_id)
    out[8:16] = data
    return bytes(out)


class DecodeError(ValueError):
    """Raised by decode_packet (the tooling decoder) with the drop reason as ``reason``."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def seal(bytes key, int packet_type, uint64_t counter, header, plaintext):
    """ChaCha20-Poly1305 of ``plaintext`` with ``header`` as associated data: ciphertext + tag."""
    return aead_seal_bytes(key, make_nonce(packet_type, counter), plaintext, header)


def unseal(bytes key, int packet_type, uint64_t counter, header, sealed):
    """Inverse of seal(); raises DecodeError("auth_failed") if the tag does not verify."""
    try:
        return open_(key, make_nonce(packet_type, counter), sealed, header)
    except AeadError:
        raise DecodeError("auth_failed") from None


def decode_packet(data, key=None, counter=None):
    """Decode one datagram into a dict (tooling and test vectors; not the hot path).

    Raises DecodeError(reason) with the same reason names the endpoint counts as drops. With
    ``key`` (the sender's 32-byte session key), a DATA packet or a sealed DISCONNECT is
    authenticated and decrypted first, with its packet ``counter`` (default: its seq).
    """
    cdef bytes raw = bytes(data)
    cdef const uint8_t[:] view = raw
    cdef Py_ssize_t n = view.shape[0]
    cdef const uint8_t* p = &view[0] if n else NULL
    cdef int ptype, status
    cdef DataHeader h
    cdef Record r
    cdef ConnectRequest request
    cdef CookiePacket cookie
    cdef AcceptPacket accept
    cdef RefusePacket refuse
    cdef SessionPacket session
    cdef Py_ssize_t pos, nxt
    if n == 0:
        raise DecodeError("truncated")
    ptype = check_prefix(p, n)
    if ptype < 0:
        raise DecodeError(DROP_REASONS[-ptype - 1])
    out = {"type": PACKET_TYPES[ptype]}
    if ptype == PT_DATA:
        if n < DATA_HEADER_SIZE:
            raise DecodeError("truncated")
        if key is not None:
            if n < DATA_HEADER_SIZE + TAG_SIZE:
                raise DecodeError("auth_failed")
            raw = raw[:DATA_HEADER_SIZE] + unseal(key, PT_DATA, read_packet_seq(p) if counter is None else counter,
                                                  raw[:DATA_HEADER_SIZE], raw[DATA_HEADER_SIZE:])
            view = raw
            n = view.shape[0]
            p = &view[0]
        read_data_header(p, &h)
        out.update(session_id=h.session_id, seq=h.seq, ack=h.ack, ack_bits=h.ack_bits,
                   send_time=h.send_time, echo_time=h.echo_time)
        records = []
        pos = DATA_HEADER_SIZE
        while pos < n:
            nxt = parse_record(p, pos, n, &r)
            if nxt < 0:
                raise DecodeError(DROP_REASONS[-nxt - 1])
            rec = {"kind": RECORD_KINDS[r.kind]}
            body = bytes(view[r.payload_offset:r.payload_offset + r.payload_length])
            if r.kind == RK_MESSAGE:
                rec.update(channel=r.channel, msg_id=r.msg_id, payload=body.hex())
            elif r.kind == RK_FRAGMENT:
                rec.update(channel=r.channel, msg_id=r.msg_id, fragment_index=r.fragment_index,
                           fragment_count=r.fragment_count, payload=body.hex())
            elif r.kind == RK_BLOCK_SLICE:
                rec.update(block_id=r.block_id, slice_index=r.slice_index,
                           slice_count=r.slice_count, block_size=r.block_size, payload=body.hex())
            else:
                rec.update(block_id=r.block_id, base=r.ack_base, bitfield=body.hex())
            records.append(rec)
            pos = nxt
        out["records"] = records
        return out
    if ptype == PT_CONNECT_REQUEST:
        status = decode_connect_request(p, n, &request)
        if status < 0:
            raise DecodeError(DROP_REASONS[-status - 1])
        out["connect_id"] = request.connect_id
        if request.token_format == TOKEN_FORMAT_V1:
            out["token"] = raw[request.token_offset:request.token_offset + request.token_length].hex()
        return out
    if ptype == PT_CHALLENGE or ptype == PT_CONNECT_RESPONSE:
        status = (decode_challenge(p, n, &cookie) if ptype == PT_CHALLENGE
                  else decode_connect_response(p, n, &cookie))
        if status < 0:
            raise DecodeError(DROP_REASONS[-status - 1])
        out.update(connect_id=cookie.connect_id, cookie_time=cookie.cookie_time,
                   cookie_mac=(<char*>cookie.cookie_mac)[:COOKIE_MAC_SIZE].hex())
        if ptype == PT_CONNECT_RESPONSE:
            out["ack_delay_ms"] = cookie.ack_delay_ms
            if cookie.token_format == TOKEN_FORMAT_V1:
                out["token"] = raw[cookie.token_offset:cookie.token_offset + cookie.token_length].hex()
                out["tag"] = raw[cookie.tag_offset:].hex()
        return out
    if ptype == PT_ACCEPT:
        status = decode_accept(p, n, &accept)
        if status < 0:
            raise DecodeError(DROP_REASONS[-status - 1])
        out.update(connect_id=accept.connect_id, session_id=accept.session_id,
                   ack_delay_ms=accept.ack_delay_ms)
        if accept.flags >= 0:
            out["flags"] = accept.flags
            out["tag"] = raw[accept.tag_offset:].hex()
        return out
    if ptype == PT_REFUSE:
        status = decode_refuse(p, n, &refuse)
        if status < 0:
            raise DecodeError(DROP_REASONS[-status - 1])
        out.update(connect_id=refuse.connect_id, reason=REASONS.get(refuse.reason, refuse.reason))
        return out
    status = (decode_disconnect(p, n, &session) if ptype == PT_DISCONNECT
              else decode_path_packet(p, n, &session))
    if status < 0:
        raise DecodeError(DROP_REASONS[-status - 1])
    out["session_id"] = session.session_id
    if not session.sealed:
        if ptype == PT_DISCONNECT:
            out["reason"] = REASONS.get(session.reason, session.reason)
        else:
            out["data"] = (<char*>session.path_data)[:PATH_DATA_SIZE].hex()
        return out
    out["seq"] = session.seq
    header, sealed = raw[:SEALED_CONTROL_HEADER], raw[SEALED_CONTROL_HEADER:]
    if ptype == PT_DISCONNECT:
        if key is None:
            out["sealed_reason"] = sealed.hex()
        else:
            reason = unseal(key, ptype, session.seq if counter is None else counter, header, sealed)[0]
            out["reason"] = REASONS.get(reason, reason)
    elif key is None:
        out["sealed_data"] = sealed.hex()
    else:
        out["data"] = unseal(key, ptype, session.seq if counter is None else counter, header, sealed).hex()
    return out


def _reason_code(value):
    return REASON_CODES[value] if isinstance(value, str) else int(value)


_FIELD_RANGES = {
    "connect_id": 0xFFFFFFFF, "session_id": 0xFFFFFFFF, "cookie_time": 0xFFFFFFFF,
    "ack_delay_ms": 0xFFFF, "seq": 0xFFFF, "ack": 0xFFFF, "ack_bits": 0xFFFFFFFF,
    "send_time": 0xFFFF, "echo_time": 0xFFFF, "channel": MAX_CHANNELS - 1, "msg_id": 0xFFFF,
    "fragment_index": 0xFF, "fragment_count": 0xFF, "block_id": 0xFFFF, "slice_index": 0xFFFF,
    "slice_count": 0xFFFF, "block_size": 0xFFFFFFFF, "base": 0xFFFF, "flags": 0xFF,
}


def _check_ranges(fields):
    for name, value in fields.items():
        limit = _FIELD_RANGES.get(name)
        if limit is not None and not 0 <= value <= limit:
            raise ValueError(f"{name}={value} does not fit its field (0..{limit})")


def _token_bytes(packet):
    token = bytes.fromhex(packet["token"])
    if not MIN_TOKEN_SIZE <= len(token) <= MAX_TOKEN_SIZE:
        raise ValueError(f"token of {len(token)} bytes: {MIN_TOKEN_SIZE}..{MAX_TOKEN_SIZE}")
    return token


def _tag_bytes(packet):
    tag = bytes.fromhex(packet["tag"])
    if len(tag) != TAG_SIZE:
        raise ValueError(f"tag must be {TAG_SIZE} bytes")
    return tag


def _sealed_control(int ptype, packet, key, counter, str sealed_field, Py_ssize_t size, plaintext):
    """A sealed DISCONNECT or PATH packet of a test vector: the clear header (prefix, session id,
    seq), then ``plaintext`` (``size`` bytes) sealed under ``key``, or without a key the vector's
    ciphertext from ``sealed_field``."""
    cdef bytearray buf = bytearray(SEALED_CONTROL_HEADER)
    write_sealed_header(buf, ptype, packet["session_id"], packet["seq"])
    if key is None:
        sealed = bytes.fromhex(packet[sealed_field])
        if len(sealed) != size + TAG_SIZE:
            raise ValueError(f"{sealed_field} must be {size + TAG_SIZE} bytes")
    else:
        sealed = seal(key, ptype, packet["seq"] if counter is None else counter, buf, plaintext)
    return bytes(buf) + sealed


def encode_packet(packet, key=None, counter=None):
    """Inverse of decode_packet: build a datagram from its decoded dict (with ``key`` and
    ``counter``, a sealed DATA or DISCONNECT packet).

    Raises ValueError for a field outside its wire range instead of writing bytes that would
    decode as something else."""
    _check_ranges(packet)
    for record in packet.get("records", ()):
        _check_ranges(record)
        if record.get("kind") == "block_ack" and len(record.get("bitfield", "")) > 128:
            raise ValueError("block_ack bitfield longer than 64 bytes")
    cdef int ptype = _PACKET_TYPE_IDS[packet["type"]]
    cdef DataHeader h
    cdef bytearray buf
    cdef uint8_t* p
    cdef Py_ssize_t pos
    cdef bytes body
    if ptype == PT_CONNECT_REQUEST:
        return make_connect_request(packet["connect_id"], _token_bytes(packet) if "token" in packet else None)
    if ptype == PT_CHALLENGE:
        return make_challenge(packet["connect_id"], packet["cookie_time"], bytes.fromhex(packet["cookie_mac"]))
    if ptype == PT_CONNECT_RESPONSE:
        if "token" in packet:
            return make_connect_response(packet["connect_id"], packet["cookie_time"],
                                         bytes.fromhex(packet["cookie_mac"]), packet["ack_delay_ms"],
                                         _token_bytes(packet)) + _tag_bytes(packet)
        return make_connect_response(packet["connect_id"], packet["cookie_time"],
                                     bytes.fromhex(packet["cookie_mac"]), packet["ack_delay_ms"], None)
    if ptype == PT_ACCEPT:
        if "flags" in packet:
            return make_accept(packet["connect_id"], packet["session_id"], packet["ack_delay_ms"],
                               packet["flags"]) + _tag_bytes(packet)
        return make_accept(packet["connect_id"], packet["session_id"], packet["ack_delay_ms"], -1)
    if ptype == PT_REFUSE:
        return make_refuse(packet["connect_id"], _reason_code(packet["reason"]))
    if ptype == PT_PATH_CHALLENGE or ptype == PT_PATH_RESPONSE:
        if "seq" not in packet:
            return make_path_packet(ptype, packet["session_id"], bytes.fromhex(packet["data"]))
        data = None
        if key is not None:
            data = bytes.fromhex(packet["data"])
            if len(data) != PATH_DATA_SIZE:
                raise ValueError(f"path data must be {PATH_DATA_SIZE} bytes")
        return _sealed_control(ptype, packet, key, counter, "sealed_data", PATH_DATA_SIZE, data)
    if ptype == PT_DISCONNECT:
        if "seq" not in packet:
            return make_disconnect(packet["session_id"], _reason_code(packet["reason"]))
        reason = None if key is None else bytes([_reason_code(packet["reason"])])
        return _sealed_control(PT_DISCONNECT, packet, key, counter, "sealed_reason", 1, reason)
    h.session_id = packet["session_id"]
    h.seq = packet["seq"]
    h.ack = packet["ack"]
    h.ack_bits = packet["ack_bits"]
    h.send_time = packet["send_time"]
    h.echo_time = packet["echo_time"]
    records = packet.get("records", [])
    buf = bytearray(DATA_HEADER_SIZE + sum(16 + len(r.get("payload", r.get("bitfield", ""))) // 2
                                           for r in records))
    p = buf
    write_data_header(p, &h)
    pos = DATA_HEADER_SIZE
    for rec in records:
        kind = rec["kind"]
        body = bytes.fromhex(rec.get("payload", rec.get("bitfield", "")))
        if len(body) > MAX_VARINT_LENGTH:
            raise ValueError("record payload longer than 16383 bytes")
        if kind == "message":
            pos += write_message_record(p + pos, rec["channel"], rec["msg_id"], body, len(body))
        elif kind == "fragment":
            pos += write_fragment_record(p + pos, rec["channel"], rec["msg_id"], rec["fragment_index"],
                                         rec["fragment_count"], body, len(body))
        elif kind == "block_slice":
            pos += write_slice_record(p + pos, rec["block_id"], rec["slice_index"], rec["slice_count"],
                                      rec["block_size"], body, len(body))
        elif kind == "block_ack":
            pos += write_block_ack_record(p + pos, rec["block_id"], rec["base"], body, len(body))
        else:
            raise ValueError(f"unknown record kind {kind!r}")
    if key is not None:
        return bytes(buf[:DATA_HEADER_SIZE]) + seal(key, PT_DATA, packet["seq"] if counter is None else counter,
                                                    buf[:DATA_HEADER_SIZE], buf[DATA_HEADER_SIZE:pos])
    return bytes(buf[:pos])
