from cpython.ref cimport PyObject
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from relay_core.seqbuf cimport SequenceBuffer
from relay_core.fragment cimport MemoryBudget
from relay_core.wire cimport Record

cdef enum:
    # ReceiveChannel.on_record: the record's payload is the one message it delivers, left in the
    # packet for the caller to take (no bytes object made unless the caller needs one).
    RECORD_IN_PLACE = 1


cdef enum:
    MODE_RELIABLE_ORDERED = 0
    MODE_REDUNDANT = 1
    MODE_UNRELIABLE_SEQUENCED = 2
    MODE_UNRELIABLE = 3


cdef struct SentUnit:
    uint16_t msg_id
    uint8_t channel
    uint8_t fragment


cdef struct SentUnits:
    # Ring of (channel, message, fragment) units carried by each sent packet, held inside its
    # peer (an ack or a flush reaches the ring without an object in between).
    #
    # A sent packet remembers [start, start + count) in this ring. The ring starts small and
    # doubles, up to ``limit``, rather than overwrite units from ``floor`` on (the oldest packet
    # the peer may still ack); past the limit the oldest are overwritten, and an ack arriving for
    # a packet whose units are gone is ignored (its messages are repaired by RTO instead).
    SentUnit* ring
    uint64_t head
    uint64_t capacity
    uint64_t limit
    uint64_t floor
    uint64_t tail                       # units before this were left behind when the ring grew


cdef int units_init(SentUnits* units, uint64_t capacity, uint64_t limit) except -1
cdef void units_release(SentUnits* units) noexcept
cdef void units_grow(SentUnits* units) noexcept


cdef inline void units_add(SentUnits* units, int channel, uint16_t msg_id, int fragment) noexcept:
    if units.head - units.floor >= units.capacity and units.capacity < units.limit:
        units_grow(units)
    cdef SentUnit* unit = &units.ring[units.head & (units.capacity - 1)]
    unit.msg_id = msg_id
    unit.channel = <uint8_t>channel
    unit.fragment = <uint8_t>fragment
    units.head += 1


cdef inline bint units_hold(const SentUnits* units, uint64_t start) noexcept:
    """The units of a packet that started at ``start`` are all still in the ring."""
    return start >= units.tail and units.head - start <= units.capacity


cdef struct OutMessage:
    # Doubles first and small fields packed together: one per window slot per peer, 64 bytes,
    # one line each (the window comes from prefetch.lines_alloc).
    PyObject* payload           # owned: bytes, or the list of its fragments (bytes); NULL if free
    double first_sent           # < 0: never sent
    double deadline             # next RTO expiry
    double rto
    double written_at           # last write as new or resent (copies excluded)
    uint32_t stamp              # datagram stamp of the last write (no duplicate in one datagram)
    uint32_t record_size        # wire bytes of the whole-message record
    uint16_t fragments_unacked
    uint16_t resends
    uint16_t msg_id             # the id held in this slot, while in_use
    uint8_t in_use
    uint8_t needs_write         # never sent, or due for an RTO resend
    uint8_t fragment_count      # 1 = sent as one MESSAGE record
    uint8_t next_fragment       # write cursor within the current round
    uint8_t copies              # redundant copies written since the last (re)send
    uint8_t overdue             # RTO expired on a live stream: rides its next datagram as a copy


cdef class SendChannel:
    # What a queue, a write or an ack reads or writes on a clean stream, first: with the object's
    # header, one cache line (a server touches a player's channel in every pass of a tick).
    cdef readonly int channel_id
    cdef readonly int mode
    cdef uint16_t next_id
    cdef readonly int overdue           # messages waiting to ride the stream's next datagram
    cdef Py_ssize_t pending_count       # len(pending), read without touching the deque
    cdef readonly uint64_t messages_sent
    cdef readonly uint64_t redundant_bytes
    # What a lossy stream or a full window adds.
    cdef object pending                 # payloads not yet admitted to the window
    cdef int max_pending
    cdef readonly bint failed           # a message passed the resend or RTO limit
    cdef readonly uint64_t resends
    cdef readonly uint64_t fast_resends     # resends on an ack-gap loss signal (not RTO expiries)
    # Resends for nothing: the acknowledged datagram was sent before the message's last resend
    # (the message was late, or its ack was lost). All of its resends when that datagram was its
    # first send; else the last one (a lower bound).
    cdef readonly uint64_t spurious_resends

    cdef bint queue(self, bytes payload)
    cdef bint has_unsent(self)
    cdef Py_ssize_t write(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                          double now, double rto, uint32_t stamp)
    cdef Py_ssize_t write_redundant(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos,
                                    Py_ssize_t end, Py_ssize_t budget, uint32_t stamp,
                                    bint copies, int max_copies, int prompt_copies, double now,
                                    double late_after)
    cdef void on_ack(self, uint16_t msg_id, int fragment, double sent_at)
    cdef void on_lost(self, uint16_t msg_id, uint32_t stamp, double now)
    cdef void expire(self, double now, bint lateness_likely)
    cdef double next_deadline(self)
    cdef Py_ssize_t queued(self)
    cdef void prefetch_window(self) noexcept


cdef class UnreliableSendChannel(SendChannel):
    pass


cdef class ReliableSendChannel(SendChannel):
    # Message id i in flight is msgs[i & (capacity - 1)] (a power of two, grown up to window),
    # which names the id it holds: no separate table of ids, no list of payloads.
    cdef OutMessage* msgs
    cdef int capacity
    cdef int window
    cdef uint16_t oldest                # oldest unacked message id (== next_id when empty)
    # Set when an ack retired the message that may have held earliest_deadline: next_deadline
    # finds the true earliest among the rest before answering. Left stale, an acked message's
    # RTO woke the server once per message (a lockstep frame: once per player and tick) to find
    # nothing due.
    cdef uint8_t deadline_stale
    # The stream: when the latest new message was first sent, and the smoothed time between
    # datagrams that carried new ones (redundant channels: where an RTO resend can ride).
    cdef uint8_t rides_stream
    cdef int unsent                     # in-window messages with needs_write
    cdef double earliest_deadline
    cdef double last_new_at
    cdef double stream_interval
    # Fragmented messages and the limits of a lossy stream.
    cdef list fragment_acks             # None, or bytearray of per-fragment ack flags, by slot
    cdef int fragments_in_flight
    cdef int max_fragments_in_flight
    cdef Py_ssize_t fragment_size
    cdef Py_ssize_t whole_limit
    cdef int max_resends
    cdef double rto_limit

    cdef void admit(self)
    cdef bint _admits(self, bytes payload) except -1
    cdef void resize(self, int capacity) except *
    cdef void finish(self, OutMessage* m, int slot)

    cdef inline OutMessage* held(self, uint16_t msg_id) noexcept:
        """Message ``msg_id`` while it is in flight, else NULL."""
        cdef OutMessage* m = &self.msgs[msg_id & (self.capacity - 1)]
        return m if m.in_use and m.msg_id == msg_id else NULL


cdef class RedundantSendChannel(ReliableSendChannel):
    pass


cdef class ReceiveChannel:
    cdef readonly int channel_id
    cdef readonly uint64_t delivered
    cdef readonly uint64_t duplicates

    cdef int on_record(self, Record* r, const uint8_t* packet, list out)


cdef class OrderedReceiveChannel(ReceiveChannel):
    # What a message in order reads and writes, in the object's first cache line.
    cdef uint16_t next_expected
    cdef int window
    cdef SequenceBuffer slots           # None until something is held out of order
    cdef list held                      # bytes (complete) or PartialMessage per slot
    cdef Py_ssize_t* charged            # what a complete held message costs, charged to budget
    cdef Py_ssize_t storage_charged     # what slots, held and charged cost, charged to budget
    cdef MemoryBudget budget
    cdef Py_ssize_t max_message_size

    cdef int resize(self, int capacity, bint exempt) except -2
    cdef void _deliver(self, list out)


cdef class SequencedReceiveChannel(ReceiveChannel):
    cdef bint has_last
    cdef uint16_t last_id


cdef class UnreliableReceiveChannel(ReceiveChannel):
    pass
