"""The FRAME encoder and the canonical-INPUT decoder of the relay, compiled: the runtime
implementation of both (relay.protocol exports them; the room encodes one frame per tick and
every player's every input is decoded here).

``encode_frame`` writes the compact FRAME layout of docs/RELAY_PROTOCOL.md section 7.1;
relay/_frame_oracle.py holds an independent Python encoder that tests compare it with, byte for
byte (tests/relay/test_frame_codec.py). ``decode_input`` reads only the canonical msgpack encoding of
an INPUT (what every client library writes: ``[5, frame, bin payload, have]`` with the shortest
integer forms); any other encoding returns None and the message takes the general decoder,
relay.protocol.decode_client_message, which accepts or rejects it with a reason.
``parse_input`` is the same for C callers (relay.server.inputs, which routes INPUTs to rooms).
"""
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, int64_t
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from libc.string cimport memcmp, memcpy, memset

EVENT_KINDS = ("join", "leave", "timeout", "reconnect")
"""FRAME membership event kinds, by their code on the wire."""
cdef dict _EVENT_CODES = {kind: code for code, kind in enumerate(EVENT_KINDS)}

cdef enum:
    INPUT_TYPE = 5
    # relay.protocol's FRAME_MARKER and FLAG_* (the layout's constants, named there)
    FRAME_MARKER = 0xC1
    FLAG_SAME = 0x01
    FLAG_SYNTHESIZED = 0x02
    FLAG_EVENTS = 0x04
    BITMAP_BYTES_ON_STACK = 32          # 256 slots, rooms.capacity's ceiling
    VARINT_MAX_BYTES = 10               # a 64-bit value


# -- INPUT ------------------------------------------------------------------------------------

cdef inline Py_ssize_t _read_uint(const uint8_t* p, Py_ssize_t pos, Py_ssize_t n,
                                  int64_t* value) noexcept:
    """A non-negative msgpack integer below 2^32 in its shortest form; the next position, or -1."""
    cdef uint8_t tag
    if pos >= n:
        return -1
    tag = p[pos]
    if tag < 0x80:
        value[0] = tag
        return pos + 1
    if tag == 0xCC and pos + 2 <= n and p[pos + 1] >= 0x80:
        value[0] = p[pos + 1]
        return pos + 2
    if tag == 0xCD and pos + 3 <= n:
        value[0] = (<int64_t>p[pos + 1] << 8) | p[pos + 2]
        return pos + 3 if value[0] > 0xFF else -1
    if tag == 0xCE and pos + 5 <= n:
        value[0] = ((<int64_t>p[pos + 1] << 24) | (<int64_t>p[pos + 2] << 16)
                    | (<int64_t>p[pos + 3] << 8) | p[pos + 4])
        return pos + 5 if value[0] > 0xFFFF else -1
    return -1


cdef Py_ssize_t parse_input(const uint8_t* p, Py_ssize_t n, int64_t* frame, Py_ssize_t* start,
                            Py_ssize_t* length, int64_t* have) noexcept:
    """Fields of an INPUT in canonical msgpack: frame, the payload's offset and length, have.
    Returns 0, or -1 for anything else (valid or not, that is for relay.protocol)."""
    cdef Py_ssize_t pos
    cdef uint8_t tag
    if n < 5 or p[0] != 0x94 or p[1] != INPUT_TYPE:
        return -1
    pos = _read_uint(p, 2, n, frame)
    if pos < 0 or pos >= n:
        return -1
    tag = p[pos]
    if tag == 0xC4 and pos + 2 <= n:
        length[0] = p[pos + 1]
        pos += 2
    elif tag == 0xC5 and pos + 3 <= n:
        length[0] = (<Py_ssize_t>p[pos + 1] << 8) | p[pos + 2]
        pos += 3
    elif tag == 0xC6 and pos + 5 <= n:
        length[0] = ((<Py_ssize_t>p[pos + 1] << 24) | (<Py_ssize_t>p[pos + 2] << 16)
                     | (<Py_ssize_t>p[pos + 3] << 8) | p[pos + 4])
        pos += 5
    else:
        return -1
    if length[0] > n - pos:
        return -1
    start[0] = pos
    pos += length[0]
    if pos < n and p[pos] == 0xFF:          # -1: the client holds no frame yet
        have[0] = -1
        pos += 1
    else:
        pos = _read_uint(p, pos, n, have)
        if pos < 0:
            return -1
    return 0 if pos == n else -1


cpdef tuple decode_input(bytes data):
    """(frame, payload, have) of an INPUT message in canonical msgpack, else None (anything
    else, valid or not, is for relay.protocol.decode_client_message)."""
    if data is None:
        raise TypeError("data must be bytes, not None")
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t start, length
    cdef int64_t frame = 0, have = 0
    if parse_input(p, PyBytes_GET_SIZE(data), &frame, &start, &length, &have) < 0:
        return None
    return frame, PyBytes_FromStringAndSize(<const char*>p + start, length), have


# -- FRAME ------------------------------------------------------------------------------------

cdef inline Py_ssize_t _varint_size(Py_ssize_t value) noexcept:
    cdef Py_ssize_t size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


cdef inline Py_ssize_t _put_varint(uint8_t* out, Py_ssize_t pos, Py_ssize_t value) noexcept:
    """``value`` (>= 0) as an unsigned LEB128 varint at out[pos]; the position after it."""
    while value >= 0x80:
        out[pos] = <uint8_t>((value & 0x7F) | 0x80)
        value >>= 7
        pos += 1
    out[pos] = <uint8_t>value
    return pos + 1


def put_varint(bytearray out not None, Py_ssize_t value):
    """Append ``value`` as an unsigned LEB128 varint (FRAME fields; also relay.server.history)."""
    cdef uint8_t encoded[VARINT_MAX_BYTES]
    if value < 0:
        raise ValueError(f"a varint is unsigned, got {value}")
    out += PyBytes_FromStringAndSize(<const char*>encoded, _put_varint(encoded, 0, value))


def join_with_lengths(list parts not None):
    """``parts`` (bytes) each prefixed with its length as a varint, concatenated in one bytes
    object (relay.server.history's spool chunks)."""
    cdef Py_ssize_t size = 0, pos = 0, length
    cdef object part
    for part in parts:
        if type(part) is not bytes:
            raise TypeError(f"parts must be bytes, not {type(part).__name__}")
        length = PyBytes_GET_SIZE(part)
        size += _varint_size(length) + length
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    for part in parts:
        length = PyBytes_GET_SIZE(part)
        pos = _put_varint(p, pos, length)
        memcpy(p + pos, PyBytes_AS_STRING(part), length)
        pos += length
    return out


def encode_frame(frame, previous=None):
    """The compact FRAME message of ``frame`` (a relay.protocol.Frame); ``previous`` is the
    previous frame's ``inputs`` (None: no "same as previous" references, a frame any decoder
    can read on its own). ValueError for a negative frame number or a synthesized slot
    without an input."""
    return encode_frame_of(frame.number, frame.inputs, frame.events, frame.synthesized, previous)


def encode_frame_of(Py_ssize_t number, frame_inputs, frame_events, list synthesized not None,
                    previous=None):
    """``encode_frame`` of a frame given by its fields, with no Frame object (a room's tick)."""
    # Private copies: the inputs are indexed unchecked, and comparing with ``previous`` may run
    # Python code (an item's __eq__) that changes the caller's lists in between.
    cdef list inputs = list(frame_inputs)
    cdef tuple earlier = () if previous is None else tuple(previous)
    cdef Py_ssize_t count = len(inputs), width = (count + 7) >> 3, slot
    cdef Py_ssize_t previous_count = min(len(earlier), count)
    cdef InputRef refs_here[2 * BITMAP_BYTES_ON_STACK * 8]
    cdef uint8_t synth_here[BITMAP_BYTES_ON_STACK]
    cdef InputRef* refs = refs_here
    cdef uint8_t* synth = synth_here
    cdef object payload
    if count > BITMAP_BYTES_ON_STACK * 8:
        refs = <InputRef*>PyMem_Malloc(2 * count * sizeof(InputRef))
        synth = <uint8_t*>PyMem_Calloc(1, width)
        if refs == NULL or synth == NULL:
            PyMem_Free(refs)
            PyMem_Free(synth)
            raise MemoryError()
    else:
        memset(synth, 0, width)
    try:
        for slot in range(count):
            payload = inputs[slot]
            if payload is not None and type(payload) is not bytes:  # a bytes-like input, read once
                payload = bytes(memoryview(payload))
                inputs[slot] = payload
            _ref(&refs[slot], payload)
        for slot in range(previous_count):
            payload = earlier[slot]
            if type(payload) is bytes or payload is None:
                _ref(&refs[count + slot], payload)
            elif inputs[slot] is not None and payload == inputs[slot]:
                refs[count + slot] = refs[slot]     # equal as Python compares them
            else:
                refs[count + slot].size = -1
        mark_synthesized(synth, synthesized, count, number)
        return encode_frame_refs(number, count, refs, refs + count, previous_count,
                                 synth if synthesized else NULL, list(frame_events))
    finally:
        if refs != refs_here:
            PyMem_Free(refs)
            PyMem_Free(synth)


cdef int mark_synthesized(uint8_t* bitmap, list synthesized, Py_ssize_t count,
                          Py_ssize_t number) except -1:
    """Set ``synthesized``'s slots in ``bitmap`` (zeroed, ``count`` bits); ValueError for a
    slot outside the frame (one without an input the encoder refuses)."""
    cdef Py_ssize_t slot
    for value in synthesized:
        slot = value
        if not 0 <= slot < count:
            raise ValueError(f"synthesized slot {slot} has no input in frame {number}")
        bitmap[slot >> 3] |= 1 << (slot & 7)
    return 0


cdef inline void _ref(InputRef* ref, object payload) noexcept:
    if payload is None:
        ref.size = -1
    else:
        ref.data = <const uint8_t*>PyBytes_AS_STRING(payload)
        ref.size = PyBytes_GET_SIZE(payload)


cdef inline bint _same(const InputRef* a, const InputRef* b) noexcept:
    return a.size == b.size and memcmp(a.data, b.data, a.size) == 0


cdef bytes encode_frame_refs(Py_ssize_t number, Py_ssize_t count, const InputRef* inputs,
                             const InputRef* previous, Py_ssize_t previous_count,
                             const uint8_t* synthesized, list events):
    """The FRAME of frame ``number``: slot i's input at ``inputs[i]`` (size -1: none), the
    previous frame's at ``previous[i]`` for i < previous_count (inputs equal to it are sent as
    "same"), ``synthesized`` a bitmap of the slots made up (NULL: none; each must have an
    input) and ``events`` (kind, slot, player) tuples. The one FRAME encoder: ``encode_frame_of``
    and a room's rows (relay.server.pending) both call it."""
    cdef Py_ssize_t width = (count + 7) >> 3
    cdef uint8_t bitmaps_here[2 * BITMAP_BYTES_ON_STACK]
    cdef uint8_t* bitmaps = bitmaps_here
    if number < 0:
        raise ValueError(f"frame.number must be >= 0, got {number}")
    if width > BITMAP_BYTES_ON_STACK:
        bitmaps = <uint8_t*>PyMem_Calloc(2, width)
        if bitmaps == NULL:
            raise MemoryError()
    else:
        memset(bitmaps, 0, 2 * width)
    try:
        return _encode_frame(number, count, width, inputs, previous, previous_count,
                             synthesized, events, bitmaps, bitmaps + width)
    finally:
        if bitmaps != bitmaps_here:
            PyMem_Free(bitmaps)


cdef bytes _encode_frame(Py_ssize_t number, Py_ssize_t count, Py_ssize_t width,
                         const InputRef* inputs, const InputRef* previous,
                         Py_ssize_t previous_count, const uint8_t* synth, list events,
                         uint8_t* present, uint8_t* same):
    cdef Py_ssize_t slot, size, pos, length, code, event_slot
    cdef bint any_same = False, any_synth = False
    cdef list encoded_events = None         # (code, slot, player name in UTF-8) per event
    cdef bytes name
    size = 1 + _varint_size(number) + 1 + _varint_size(count)
    for slot in range(count):
        if inputs[slot].size < 0:
            if synth != NULL and synth[slot >> 3] & (1 << (slot & 7)):
                raise ValueError(f"synthesized slot {slot} has no input in frame {number}")
            continue
        present[slot >> 3] |= 1 << (slot & 7)
        if slot < previous_count and _same(&previous[slot], &inputs[slot]):
            same[slot >> 3] |= 1 << (slot & 7)
            any_same = True
        else:
            length = inputs[slot].size
            size += _varint_size(length) + length
    if synth != NULL:
        for slot in range(width):
            if synth[slot]:
                any_synth = True
                break
    size += width * (1 + (1 if any_same else 0) + (1 if any_synth else 0))
    if events:
        encoded_events = []
        size += _varint_size(len(events))
        for kind, event_slot, player in events:
            code = _EVENT_CODES[kind]
            if event_slot < 0:
                raise ValueError(f"event slot must be >= 0, got {event_slot}")
            name = player.encode()
            encoded_events.append((code, event_slot, name))
            size += 1 + _varint_size(event_slot) + _varint_size(len(name)) + len(name)
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    p[0] = FRAME_MARKER
    pos = _put_varint(p, 1, number)
    p[pos] = ((FLAG_SAME if any_same else 0) | (FLAG_SYNTHESIZED if any_synth else 0)
              | (FLAG_EVENTS if events else 0))
    pos = _put_varint(p, pos + 1, count)
    memcpy(p + pos, present, width)
    pos += width
    if any_same:
        memcpy(p + pos, same, width)
        pos += width
    if any_synth:
        memcpy(p + pos, synth, width)
        pos += width
    for slot in range(count):
        length = inputs[slot].size
        if length < 0 or same[slot >> 3] & (1 << (slot & 7)):
            continue
        pos = _put_varint(p, pos, length)
        memcpy(p + pos, inputs[slot].data, length)
        pos += length
    if events:
        pos = _put_varint(p, pos, len(events))
        for code, event_slot, name in encoded_events:
            p[pos] = <uint8_t>code
            pos = _put_varint(p, pos + 1, event_slot)
            pos = _put_varint(p, pos, len(name))
            memcpy(p + pos, PyBytes_AS_STRING(name), len(name))
            pos += len(name)
    return out
