"""Compiled hot paths of the relay server: INPUT messages from the core to the rooms, the
FRAME encoder, and the per-player input timing behind the input-delay advice.

Every player sends an INPUT every frame, so this is the server's per-player-per-tick receive
work. ``InputRouter`` is the core's message sink for the STREAM channel: a well-formed INPUT
from a player in a room goes straight to the room's ``accept_input`` as the core delivers it,
with no event object, and its outcome is counted in a dict (the server turns the counts into
metrics once per tick). Whatever the core queued as events instead (when other events were
waiting, so that order holds) goes the same way through ``InputRouter.route``. Everything else --
control messages, connects and disconnects, malformed or unusual INPUTs -- goes to the server's
``on_other(event, now)``, so every path gives the same result for the same message
(tests/test_fastpath.py).

``decode_input`` reads only the canonical msgpack encoding of an INPUT (what every client
library writes: ``[5, frame, bin payload, have]`` with the shortest integer forms); any other
encoding returns None and the message takes the general decoder in relay.protocol, which
accepts or rejects it with a reason.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, int64_t
from cpython.mem cimport PyMem_Malloc, PyMem_Calloc, PyMem_Free
from cpython.object cimport PyObject_GetItem
from libc.math cimport ceil
from libc.string cimport memcpy

from relay_core.events import MessageReceived
from relay_core.peer cimport MessageSink

cdef enum:
    INPUT_TYPE = 5
    STREAM_CHANNEL = 1


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


cdef Py_ssize_t _parse_input(const uint8_t* p, Py_ssize_t n, int64_t* frame, Py_ssize_t* start,
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
    if _parse_input(p, PyBytes_GET_SIZE(data), &frame, &start, &length, &have) < 0:
        return None
    return frame, PyBytes_FromStringAndSize(<const char*>p + start, length), have


cdef object _protocol_encode(frame, previous):
    # Imported here: relay.protocol imports this module.
    from relay.protocol import encode_frame
    return encode_frame(frame, previous)


cdef inline Py_ssize_t _varint_size(Py_ssize_t value) noexcept:
    cdef Py_ssize_t size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


cdef inline Py_ssize_t _put_varint(uint8_t* out, Py_ssize_t pos, Py_ssize_t value) noexcept:
    while value >= 0x80:
        out[pos] = <uint8_t>((value & 0x7F) | 0x80)
        value >>= 7
        pos += 1
    out[pos] = <uint8_t>value
    return pos + 1


def encode_frame(frame, previous=None):
    """relay.protocol.encode_frame compiled, byte for byte (tests/test_fastpath.py): the room
    encodes one frame per tick. Frames with membership events take the Python encoder."""
    if frame.events:
        return _protocol_encode(frame, previous)
    # Private copies: the inputs are indexed unchecked and sized in one pass, written in the
    # next, and comparing with ``previous`` may run Python code (an item's __eq__) that
    # changes the caller's lists in between.
    cdef list inputs = list(frame.inputs)
    cdef list synthesized = frame.synthesized
    cdef Py_ssize_t count = len(inputs), width = (count + 7) >> 3
    cdef Py_ssize_t slot, size, pos, length, previous_count
    cdef Py_ssize_t number = frame.number
    cdef bint any_same = False
    cdef bytearray present, same, synth
    cdef object payload
    if number < 0:
        raise ValueError(f"frame.number must be >= 0, got {number}")
    previous = () if previous is None else tuple(previous)
    previous_count = len(previous)
    present = bytearray(width)
    same = bytearray(width)
    synth = bytearray(width)
    size = 1 + _varint_size(number) + 1 + _varint_size(count)
    for slot in range(count):
        payload = inputs[slot]
        if payload is None:
            continue
        if type(payload) is not bytes:
            return _protocol_encode(frame, previous)
        present[slot >> 3] |= 1 << (slot & 7)
        if slot < previous_count and previous[slot] == payload:
            same[slot >> 3] |= 1 << (slot & 7)
            any_same = True
        else:
            length = PyBytes_GET_SIZE(payload)
            size += _varint_size(length) + length
    for value in synthesized:
        slot = value
        if not 0 <= slot < count or inputs[slot] is None:
            raise ValueError(f"synthesized slot {slot} has no input in frame {frame.number}")
        synth[slot >> 3] |= 1 << (slot & 7)
    size += width * (1 + (1 if any_same else 0) + (1 if synthesized else 0))
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    cdef const uint8_t* src
    p[0] = 0xC1
    pos = _put_varint(p, 1, number)
    p[pos] = (0x01 if any_same else 0) | (0x02 if synthesized else 0)
    pos = _put_varint(p, pos + 1, count)
    for slot in range(width):
        p[pos + slot] = present[slot]
    pos += width
    if any_same:
        for slot in range(width):
            p[pos + slot] = same[slot]
        pos += width
    if synthesized:
        for slot in range(width):
            p[pos + slot] = synth[slot]
        pos += width
    for slot in range(count):
        payload = inputs[slot]
        if payload is None or same[slot >> 3] & (1 << (slot & 7)):
            continue
        length = PyBytes_GET_SIZE(payload)
        pos = _put_varint(p, pos, length)
        src = <const uint8_t*>PyBytes_AS_STRING(payload)
        memcpy(p + pos, src, length)
        pos += length
    return out



cdef double _select(double* values, Py_ssize_t n, Py_ssize_t k) noexcept:
    """The k-th smallest of values[0:n] (0-based), reordering them: Hoare's selection, O(n) on
    average (a full sort of every player's window twice a second showed in profiles)."""
    cdef Py_ssize_t lo = 0, hi = n - 1, i, j
    cdef double pivot, swap
    while lo < hi:
        pivot = values[(lo + hi) >> 1]
        i, j = lo, hi
        while i <= j:
            while values[i] < pivot:
                i += 1
            while values[j] > pivot:
                j -= 1
            if i <= j:
                swap = values[i]
                values[i] = values[j]
                values[j] = swap
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return values[k]


cdef class InputTiming:
    """One player's recent input response times and the input delay advised from them.

    Every player's every input passes through ``record``, so the rings are C arrays: the last
    ``window`` response times (seconds from the close of the frame the client said it held to
    the arrival of the input) and, per recent input, whether it missed its frame.
    """
    cdef float* responses                   # seconds; 4 bytes a sample (a window per player)
    cdef uint8_t* late
    cdef readonly Py_ssize_t window
    cdef readonly Py_ssize_t samples        # response times held (up to window)
    cdef Py_ssize_t next_response
    cdef readonly Py_ssize_t late_count     # inputs in the late ring that missed their frame
    cdef readonly Py_ssize_t late_seen      # inputs in the late ring (up to window)
    cdef Py_ssize_t next_late
    cdef public object advised              # frames last advised, or None
    cdef public double advised_at
    cdef public Py_ssize_t response_ms

    def __cinit__(self, Py_ssize_t window):
        if window < 1:
            raise ValueError("input timing window must be at least 1")
        self.window = window
        self.responses = <float*>PyMem_Malloc(window * sizeof(float))
        self.late = <uint8_t*>PyMem_Calloc(window, 1)
        if self.responses == NULL or self.late == NULL:
            raise MemoryError()
        self.advised = None

    def __dealloc__(self):
        PyMem_Free(self.responses)
        PyMem_Free(self.late)

    cpdef void record(self, bint late, double response):
        """One input: whether it arrived after its frame closed, and its response time
        (negative: the input says nothing about the link)."""
        cdef Py_ssize_t index = self.next_late
        self.late_count += late - self.late[index]
        self.late[index] = late
        self.next_late = index + 1 if index + 1 < self.window else 0
        if self.late_seen < self.window:
            self.late_seen += 1
        if response >= 0.0:
            self.responses[self.next_response] = <float>response
            self.next_response = self.next_response + 1 if self.next_response + 1 < self.window else 0
            if self.samples < self.window:
                self.samples += 1

    def percentile(self, double percent):
        """Nearest-rank percentile of the response times held (0.0 when there are none)."""
        cdef Py_ssize_t rank, i
        cdef double value
        cdef double* ordered
        if self.samples == 0:
            return 0.0
        ordered = <double*>PyMem_Malloc(self.samples * sizeof(double))
        if ordered == NULL:
            raise MemoryError()
        for i in range(self.samples):
            ordered[i] = self.responses[i]
        rank = <Py_ssize_t>ceil(percent / 100.0 * self.samples)
        value = _select(ordered, self.samples, min(max(rank, 1), self.samples) - 1)
        PyMem_Free(ordered)
        return value


cdef enum:
    # Close times kept for timing inputs (16 bytes a frame, per room): a client whose newest
    # frame is older than this is far behind (past the default catchup_frames of 150 it gets a
    # catch-up block), and its inputs say nothing about its link.
    CLOSE_TIMES_KEPT = 256


cdef str WAITING = "waiting"
cdef str RUNNING = "running"
cdef str ACCEPTED = "accepted"
cdef str LATE = "late"


cdef class Slot:
    """A player's seat in a room: its input index in every frame, kept while the player is
    away (left or timed out) so that it can reconnect."""
    cdef public Py_ssize_t index
    cdef public str player
    cdef public object peer_id          # None while the player is away
    cdef public bint ready
    cdef public object away_since       # when the player went away, or None

    def __init__(self, Py_ssize_t index, str player, peer_id, bint ready=False, away_since=None):
        self.index = index
        self.player = player
        self.peer_id = peer_id
        self.ready = ready
        self.away_since = away_since

    def __repr__(self):
        return (f"Slot(index={self.index}, player={self.player!r}, peer_id={self.peer_id!r}, "
                f"ready={self.ready}, away_since={self.away_since!r})")


cdef class Member:
    """A connected client in a room: a player (``slot`` is its index) or a spectator.

    Compiled with C fields: the tick's fan-out and every input read and write them for every
    player, and a Python object's attribute lookups were a visible share of that.
    """
    cdef public int peer_id
    cdef public str player
    cdef public object slot             # slot index, or None for a spectator
    cdef public bint spectator
    cdef public long long have          # highest frame held with every frame before it
    cdef public long long next_live     # first frame it receives on the STREAM channel
    cdef public bint catching_up        # a history or catch-up block is in flight
    cdef public long long blocks_in_flight
    cdef public long long block_first
    cdef public long long block_end     # the client holds everything up to here once delivered
    cdef public long long last_sent     # last frame queued for it on the STREAM channel
    cdef public object missing_from     # a frame from here on could not be queued: repair, or None
    cdef public bint reported           # it has reported ``have`` at least once
    cdef public InputTiming timing      # players only: input response times and advice sent

    def __init__(self, int peer_id, str player, slot, bint spectator, long long have=-1,
                 long long next_live=0, bint catching_up=False, long long blocks_in_flight=0,
                 long long block_first=0, long long block_end=-1, long long last_sent=-1,
                 missing_from=None, bint reported=False, InputTiming timing=None):
        self.peer_id = peer_id
        self.player = player
        self.slot = slot
        self.spectator = spectator
        self.have = have
        self.next_live = next_live
        self.catching_up = catching_up
        self.blocks_in_flight = blocks_in_flight
        self.block_first = block_first
        self.block_end = block_end
        self.last_sent = last_sent
        self.missing_from = missing_from
        self.reported = reported
        self.timing = timing

    def __repr__(self):
        return (f"Member(peer_id={self.peer_id}, player={self.player!r}, slot={self.slot!r}, "
                f"spectator={self.spectator}, have={self.have}, last_sent={self.last_sent})")


cdef class RoomCore:
    """The per-input half of a room, compiled: relay.room.Room subclasses it.

    Every player's every input goes through ``accept_input`` (from ``route_events``, or
    ``Room.on_input_fields``), so what it reads is held in C fields: the room's state, its open
    frame, the inputs waiting for their frames, its members, the input limits (copied from the
    room's settings, which do not change during a match) and when recent frames closed.
    """
    cdef public str state
    cdef public long long open_frame
    cdef public dict members                # peer id -> relay.room.Member
    cdef public dict pending_inputs         # frame -> {slot: payload}
    cdef public Py_ssize_t max_input_bytes
    cdef public long long max_input_lead
    cdef public bint drop_late_inputs       # late_input_policy == "drop"
    cdef public list slots                  # relay.room.Slot per slot index
    cdef public list last_inputs            # inputs of the last closed frame
    cdef public str missing_input_policy    # none, repeat or neutral
    cdef public object neutral_input
    cdef public long long synthesized_inputs
    cdef public bint broadcast_frames       # one broadcast Action per frame, not a send each
    cdef long long* closed_numbers          # slot n % CLOSE_TIMES_KEPT: frame n, or -1
    cdef double* closed_at

    def __cinit__(self, *args, **kwargs):
        cdef Py_ssize_t i
        self.closed_numbers = <long long*>PyMem_Malloc(CLOSE_TIMES_KEPT * sizeof(long long))
        self.closed_at = <double*>PyMem_Calloc(CLOSE_TIMES_KEPT, sizeof(double))
        if self.closed_numbers == NULL or self.closed_at == NULL:
            raise MemoryError()
        for i in range(CLOSE_TIMES_KEPT):
            self.closed_numbers[i] = -1
        self.state = WAITING
        self.members = {}
        self.pending_inputs = {}
        self.slots = []
        self.last_inputs = []
        self.missing_input_policy = "none"

    def __dealloc__(self):
        PyMem_Free(self.closed_numbers)
        PyMem_Free(self.closed_at)

    def record_close(self, long long number, double now):
        """Frame ``number`` closed at ``now`` (inputs naming it as held are timed from then)."""
        if number < 0:
            raise ValueError(f"number must be >= 0, got {number}")     # its slot: number % KEPT
        self.closed_numbers[number % CLOSE_TIMES_KEPT] = number
        self.closed_at[number % CLOSE_TIMES_KEPT] = now

    def collect_inputs(self, long long number):
        """Frame ``number``'s input per slot from those received for it, a connected player's
        missing one made up by missing_input_policy: (inputs, synthesized slot indexes)."""
        cdef dict received = self.pending_inputs.pop(number, None)
        cdef list previous = self.last_inputs
        cdef list inputs = [], synthesized = []
        cdef str policy = self.missing_input_policy
        cdef bint make_up = policy != "none"
        cdef bint repeat = policy == "repeat"
        cdef Py_ssize_t index
        cdef Slot slot
        for slot in self.slots:
            if slot is None:
                raise TypeError("slots must hold Slot objects, not None")
            index = slot.index
            value = received.get(index) if received is not None else None
            if value is None and make_up and slot.peer_id is not None:
                if repeat:
                    value = previous[index] if 0 <= index < len(previous) else None
                else:
                    value = self.neutral_input
                if value is not None:
                    synthesized.append(index)
            inputs.append(value)
        self.synthesized_inputs += len(synthesized)
        return inputs, synthesized

    def fan_out(self, long long number, bytes data, double now, long long spectator_frame,
                long long catchup_frames, long long advice_every):
        """Frame ``number`` (``data``) to every member: players get it now (their ids are
        returned for one broadcast when broadcast_frames, else a send each through
        ``_send_stream``), spectators frame ``spectator_frame`` once they are that far. On the
        way: a member that lost frames or is far behind is caught up (``_maybe_catch_up``),
        and every ``advice_every`` frames a player's input delay is reviewed
        (``_advise_input_delay``)."""
        cdef list broadcast = [] if self.broadcast_frames else None
        cdef Member member
        if advice_every < 1:
            raise ValueError(f"advice_every must be at least 1, got {advice_every}")   # a divisor
        for member in self.members.values():
            if member is None:
                raise TypeError("members must hold Member objects, not None")
            if not member.catching_up and (member.missing_from is not None or (
                    member.reported and number - <long long>member.have > catchup_frames)):
                self._maybe_catch_up(member)
            if member.spectator:
                if spectator_frame >= <long long>member.next_live:
                    member.last_sent = spectator_frame
                    # PyObject_GetItem, not the unchecked list fast path: history is the
                    # subclass's attribute, and a list there must not be read past its end.
                    self._send_stream(member.peer_id, PyObject_GetItem(self.history, spectator_frame))
            else:
                member.last_sent = number
                if broadcast is None:
                    self._send_stream(member.peer_id, data)
                else:
                    broadcast.append(member.peer_id)
                if (member.timing is not None
                        and (number + <long long>member.slot) % advice_every == 0):
                    self._advise_input_delay(member, now)
        return broadcast

    def on_input_fields(self, int peer_id, long long frame, bytes payload not None, long long have,
                        now=None):
        """Buffer one input; returns the outcome: accepted, late, duplicate, or
        refused:<reason>. ``now`` (the arrival time) times the input for the input-delay
        advice."""
        return self.accept_input(peer_id, frame, payload, have, -1.0 if now is None else now)

    cdef str accept_input(self, int peer_id, long long frame, bytes payload, long long have,
                          double now):
        cdef Member member = self.members.get(peer_id)
        cdef object slot
        cdef dict inputs
        cdef str outcome = ACCEPTED
        if member is None:
            return "refused:not_a_player"
        slot = member.slot
        if slot is None:
            return "refused:not_a_player"
        if have > member.have:
            member.have = have
        member.reported = True
        if self.state != RUNNING:
            return "refused:not_running"
        if now >= 0.0:
            self._time_input(member, frame, have, now)
        if len(payload) > self.max_input_bytes:
            return "refused:too_large"
        if frame < self.open_frame:
            if self.drop_late_inputs:
                return "refused:late_dropped"
            frame, outcome = self.open_frame, LATE
        elif frame > self.open_frame + self.max_input_lead:
            return "refused:too_far_ahead"
        inputs = self.pending_inputs.get(frame)
        if inputs is None:
            inputs = {}
            self.pending_inputs[frame] = inputs
        if slot in inputs:
            return "duplicate" if outcome is ACCEPTED else "refused:late_dropped"
        inputs[slot] = payload
        return outcome

    cdef void _time_input(self, Member member, long long frame, long long have, double now) except *:
        """How long after frame ``have`` closed this input arrived: the input was sent for frame
        have + d when the client held frame ``have``, so d must exceed this time in frames for it
        to be on time. Inputs sent while catching up say nothing about the link."""
        cdef InputTiming timing = member.timing
        cdef double response = -1.0
        cdef Py_ssize_t index
        if timing is None:
            return
        if 0 <= have < self.open_frame and not member.catching_up:
            index = have % CLOSE_TIMES_KEPT
            if self.closed_numbers[index] == have:
                response = max(0.0, now - self.closed_at[index])
        timing.record(frame < self.open_frame, response)


cdef class InputRouter(MessageSink):
    """Canonical INPUTs on STREAM from players in a room, straight into the room's
    ``accept_input``: as the core delivers them (installed with ``Endpoint.set_message_sink``:
    no event object, no queue) and from the event queue (``route``).

    Outcomes are counted in ``outcomes`` (outcome -> count; the server publishes and clears it
    every tick). A refusal taken during the core's receive waits in ``refusals`` until the next
    ``route``, which reports it first: it came before anything in the queue.
    """
    cdef public dict peer_room          # peer id -> room id
    cdef public dict rooms              # room id -> relay.room.Room
    cdef public dict outcomes
    cdef public list refusals           # (peer id, reason)

    def __init__(self, dict peer_room, dict rooms):
        self.channel = STREAM_CHANNEL
        self.peer_room = peer_room
        self.rooms = rooms
        self.outcomes = {}
        self.refusals = []

    cdef int _accept(self, int peer_id, bytes data, double now, object on_refused) except -1:
        """1 when ``data`` is a canonical INPUT from a player in a room (the room has had it),
        else 0 (it is for the general path). A refusal goes to ``on_refused``, or waits in
        ``refusals`` when that is None."""
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t start, length
        cdef int64_t frame = 0, have = 0
        cdef str outcome
        if _parse_input(p, PyBytes_GET_SIZE(data), &frame, &start, &length, &have) < 0:
            return 0
        room_id = self.peer_room.get(peer_id)
        room = self.rooms.get(room_id) if room_id is not None else None
        if room is None:
            return 0
        outcome = (<RoomCore?>room).accept_input(
            peer_id, frame, PyBytes_FromStringAndSize(<const char*>p + start, length), have, now)
        if outcome.startswith("refused:"):
            if on_refused is None:
                self.refusals.append((peer_id, outcome[8:]))
            else:
                on_refused(peer_id, outcome[8:])
        else:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return 1

    cpdef bint take(self, int peer_id, bytes payload, double now) except -1:
        if payload is None:
            raise TypeError("payload must be bytes, not None")
        return self._accept(peer_id, payload, now, None) == 1

    def route(self, endpoint, object on_other, object on_refused, double now):
        """Report the refusals taken since the last call to ``on_refused(peer_id, reason)``,
        then drain ``endpoint``'s events in order: INPUTs as ``take`` handles them, everything
        else to ``on_other(event, now)``. Returns the number of inputs handled from the queue."""
        cdef Py_ssize_t handled = 0
        if self.refusals:
            refusals, self.refusals = self.refusals, []
            for peer_id, reason in refusals:
                on_refused(peer_id, reason)
        next_event = endpoint.next_event
        while True:
            event = next_event()
            if event is None:
                break
            if (type(event) is MessageReceived and (<int>event.channel) == STREAM_CHANNEL
                    and type(event.payload) is bytes
                    and self._accept(event.peer_id, event.payload, now, on_refused)):
                handled += 1
                continue
            on_other(event, now)
        return handled
