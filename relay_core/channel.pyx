"""Channels: per-channel ordering and the four delivery modes.

Send side
  UnreliableSendChannel  unreliable and unreliable_sequenced: written once, never tracked.
  ReliableSendChannel    reliable_ordered: ARQ. A message is written when new, and again only
                         when its own RTO expires (RTO x1.5 per resend).
  RedundantSendChannel   redundant: as reliable_ordered, and datagrams also carry copies of the
                         newest unacked messages that fit the redundancy budget, so a lost
                         datagram is repaired by the next one. The peer's redundancy policy
                         decides when and how often (docs/PROTOCOL.md 12.4); a message whose
                         last carrier the peer's acks show lost is resent at once.

Receive side
  OrderedReceiveChannel     reliable_ordered and redundant: window of message ids, duplicate
                            suppression, fragment reassembly, in-order delivery.
  SequencedReceiveChannel   drops anything not newer than the newest delivered.
  UnreliableReceiveChannel  delivers as received.
"""
from collections import deque

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF, Py_CLEAR
from libc.string cimport memset
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

from relay_core.fragment cimport (
    ADMIT_OK, PIECE_OVERHEAD, STORAGE_OVERHEAD, STORAGE_SLOT, MemoryBudget, PartialMessage, refusal,
    split_message,
)
from relay_core.prefetch cimport lines_alloc, lines_free, relay_prefetch
from relay_core.seqbuf cimport SequenceBuffer
from relay_core.wire cimport (
    Record, RK_MESSAGE, RK_FRAGMENT, MESSAGE_RECORD_OVERHEAD, FRAGMENT_RECORD_OVERHEAD,
    DROP_BAD_FRAGMENT, DROP_MESSAGE_OUT_OF_WINDOW, seq_diff, seq_greater, varint_size,
    write_message_record, write_fragment_record,
)

MODES = {
    "reliable_ordered": MODE_RELIABLE_ORDERED,
    "redundant": MODE_REDUNDANT,
    "unreliable_sequenced": MODE_UNRELIABLE_SEQUENCED,
    "unreliable": MODE_UNRELIABLE,
}


cdef enum:
    # Window storage starts at this many ids and doubles on demand up to the channel's window
    # (a receiver holds nothing until a message arrives out of order).
    INITIAL_SEND_SLOTS = 8
    INITIAL_RECEIVE_SLOTS = 8


cdef inline Py_ssize_t message_record_size(Py_ssize_t length) noexcept:
    return 3 + varint_size(length) + length


cdef inline Py_ssize_t fragment_record_size(Py_ssize_t length) noexcept:
    return 5 + varint_size(length) + length


cdef int units_init(SentUnits* units, uint64_t capacity, uint64_t limit) except -1:
    """An empty ring of ``capacity`` units that may grow to ``limit`` (both powers of two;
    limit 0: capacity)."""
    if limit == 0:
        limit = capacity
    if capacity == 0 or (capacity & (capacity - 1)) != 0 or limit < capacity or (limit & (limit - 1)) != 0:
        raise ValueError("sent unit capacity and limit must be powers of two, capacity <= limit")
    units.ring = <SentUnit*>PyMem_Malloc(capacity * sizeof(SentUnit))
    if units.ring == NULL:
        raise MemoryError()
    units.capacity = capacity
    units.limit = limit
    units.head = 0
    units.floor = 0
    units.tail = 0
    return 0


cdef void units_release(SentUnits* units) noexcept:
    PyMem_Free(units.ring)
    units.ring = NULL
    units.capacity = 0


cdef void units_grow(SentUnits* units) noexcept:
    cdef uint64_t capacity = units.capacity * 2
    cdef SentUnit* ring = <SentUnit*>PyMem_Malloc(capacity * sizeof(SentUnit))
    cdef uint64_t u, first = units.head - units.capacity if units.head > units.capacity else 0
    if ring == NULL:
        return              # go on overwriting: late acks fall back to RTO repair
    if first < units.tail:
        first = units.tail
    for u in range(first, units.head):
        ring[u & (capacity - 1)] = units.ring[u & (units.capacity - 1)]
    PyMem_Free(units.ring)
    units.ring = ring
    units.capacity = capacity
    units.tail = first


cdef int check_window(str name, int window) except -1:
    """Window slots are found by id % size, unchecked: a power of two a SequenceBuffer takes."""
    if not 1 <= window <= 32768 or window & (window - 1):
        raise ValueError(f"{name} must be a power of two in 1..32768, got {window}")
    return 0


cdef class SendChannel:
    def __init__(self, int channel_id, int mode, int max_pending):
        # Sent packets remember the channel in one byte (SentUnit.channel).
        if not 0 <= channel_id <= 255:
            raise ValueError(f"channel_id must be 0..255, got {channel_id}")
        self.channel_id = channel_id
        self.mode = mode
        self.max_pending = max_pending
        # Created on first use: most channels of most peers never queue behind their window, and
        # an empty deque costs ~600 bytes per channel per peer.
        self.pending = None
        self.pending_count = 0
        self.next_id = 0

    cdef bint queue(self, bytes payload):
        if self.pending is None:
            self.pending = deque()
        elif self.pending_count >= self.max_pending:
            return False
        self.pending.append(payload)
        self.pending_count += 1
        return True

    cdef Py_ssize_t queued(self):
        return self.pending_count

    cdef void prefetch_window(self) noexcept:
        """Ask for the window slots the next ack or write touches (nothing to ask for here)."""
        pass

    cdef bint has_unsent(self):
        return self.pending_count > 0

    cdef Py_ssize_t write(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                          double now, double rto, uint32_t stamp):
        return pos

    cdef Py_ssize_t write_redundant(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos,
                                    Py_ssize_t end, Py_ssize_t budget, uint32_t stamp,
                                    bint copies, int max_copies, int prompt_copies, double now,
                                    double late_after):
        return pos

    cdef void on_ack(self, uint16_t msg_id, int fragment, double sent_at):
        pass

    cdef void on_lost(self, uint16_t msg_id, uint32_t stamp, double now):
        pass

    cdef void expire(self, double now, bint lateness_likely):
        pass

    cdef double next_deadline(self):
        return -1.0


cdef class UnreliableSendChannel(SendChannel):
    """Each message is written into the next datagram with room for it, once."""

    cdef Py_ssize_t write(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                          double now, double rto, uint32_t stamp):
        cdef bytes payload
        cdef Py_ssize_t n
        while self.pending_count > 0:
            payload = self.pending[0]
            n = len(payload)
            if pos + message_record_size(n) > end:
                break
            self.pending.popleft()
            self.pending_count -= 1
            pos += write_message_record(buf + pos, self.channel_id, self.next_id, payload, n)
            self.next_id += 1
            self.messages_sent += 1
        return pos


cdef class ReliableSendChannel(SendChannel):
    def __init__(self, int channel_id, int mode, int max_pending, int window,
                 Py_ssize_t fragment_size, Py_ssize_t whole_limit, int max_fragments_in_flight,
                 int max_resends, double rto_limit):
        SendChannel.__init__(self, channel_id, mode, max_pending)
        check_window("window", window)
        if fragment_size < 1:
            raise ValueError(f"fragment_size must be at least 1, got {fragment_size}")     # a divisor
        if whole_limit < 0:
            raise ValueError(f"whole_limit must be >= 0, got {whole_limit}")
        self.window = window
        # Storage for the ids in flight starts small and doubles up to the window when more are
        # outstanding: a player's stream has one or two frames unacked on a good link, and the
        # full window (88 bytes a slot with the receiver's side) is per player.
        self.msgs = NULL
        self.fragment_acks = None       # a list like payloads once a fragmented message is admitted
        self.resize(min(window, INITIAL_SEND_SLOTS))
        self.oldest = 0
        self.unsent = 0
        self.fragments_in_flight = 0
        self.max_fragments_in_flight = max_fragments_in_flight
        self.fragment_size = fragment_size
        self.whole_limit = whole_limit
        self.max_resends = max_resends
        self.rto_limit = rto_limit
        self.earliest_deadline = -1.0
        self.rides_stream = mode == MODE_REDUNDANT
        self.last_new_at = -1.0
        self.stream_interval = 0.0
        self.overdue = 0

    def __dealloc__(self):
        cdef int i
        if self.msgs != NULL:
            for i in range(self.capacity):
                Py_XDECREF(self.msgs[i].payload)
        lines_free(self.msgs)

    cdef void resize(self, int capacity) except *:
        """Storage for ``capacity`` ids (a power of two): every message in flight moves to its
        slot in the new ring, its payload reference with it."""
        # A slot per line: an ack reads and writes one line of the window, not two.
        cdef OutMessage* msgs = <OutMessage*>lines_alloc(capacity * sizeof(OutMessage))
        cdef list fragment_acks = None if self.fragment_acks is None else [None] * capacity
        cdef uint16_t msg_id = self.oldest
        cdef OutMessage* m
        cdef int new_slot
        if msgs == NULL:
            raise MemoryError()
        memset(msgs, 0, capacity * sizeof(OutMessage))
        if self.msgs != NULL:
            while msg_id != self.next_id:
                m = self.held(msg_id)
                if m != NULL:
                    new_slot = msg_id & (capacity - 1)
                    msgs[new_slot] = m[0]
                    if fragment_acks is not None:
                        fragment_acks[new_slot] = self.fragment_acks[msg_id & (self.capacity - 1)]
                msg_id += 1
            lines_free(self.msgs)
        self.msgs = msgs
        self.capacity = capacity
        self.fragment_acks = fragment_acks

    cdef Py_ssize_t queued(self):
        return self.pending_count + <uint16_t>(self.next_id - self.oldest)

    cdef void prefetch_window(self) noexcept:
        """Ask for the slots of the newest message (what the next ack most likely names), of
        the next one (what the next write fills) and of the oldest unacked."""
        cdef int mask = self.capacity - 1
        if self.msgs != NULL:
            relay_prefetch(&self.msgs[<uint16_t>(self.next_id - 1) & mask])
            relay_prefetch(&self.msgs[self.next_id & mask])
            relay_prefetch(&self.msgs[self.oldest & mask])

    cdef bint has_unsent(self):
        if self.unsent > 0:
            return True
        if self.pending_count > 0:
            self.admit()
            return self.unsent > 0
        return False

    cdef bint queue(self, bytes payload):
        """A message goes straight into the window when nothing waits before it and the window
        and fragment budget have room; otherwise behind it, up to ``max_pending``."""
        if self.pending_count == 0 and self._admits(payload):
            return True
        return SendChannel.queue(self, payload)

    cdef void admit(self):
        """Move queued payloads into the window while ids and fragment budget allow.

        The sender never uses a message id the receiver cannot buffer: at most ``window``
        ids are outstanding past the oldest unacked one.
        """
        while self.pending_count > 0 and self._admits(self.pending[0]):
            self.pending.popleft()
            self.pending_count -= 1

    cdef bint _admits(self, bytes payload) except -1:
        """Put ``payload`` into the window as the next message id, if the window and the
        fragment budget have room for it; False (nothing changed) if not."""
        cdef int slot, count
        cdef OutMessage* m
        if <uint16_t>(self.next_id - self.oldest) >= self.window:
            return False
        if len(payload) > self.whole_limit:
            count = (len(payload) + self.fragment_size - 1) // self.fragment_size
            if (self.fragments_in_flight > 0
                    and self.fragments_in_flight + count > self.max_fragments_in_flight):
                return False
        else:
            count = 1
        if <uint16_t>(self.next_id - self.oldest) >= self.capacity:
            self.resize(self.capacity * 2)
        slot = self.next_id & (self.capacity - 1)
        m = &self.msgs[slot]
        memset(m, 0, sizeof(OutMessage))
        m.msg_id = self.next_id
        m.in_use = True
        m.needs_write = True
        m.fragment_count = count
        m.fragments_unacked = count
        m.first_sent = -1.0
        if count == 1:
            stored = payload
            m.record_size = message_record_size(len(payload))
        else:
            stored = split_message(payload, self.fragment_size)
            if self.fragment_acks is None:
                self.fragment_acks = [None] * self.capacity
            self.fragment_acks[slot] = bytearray(count)
            self.fragments_in_flight += count
        Py_INCREF(stored)
        m.payload = <PyObject*>stored
        self.unsent += 1
        self.next_id += 1
        return True

    cdef void finish(self, OutMessage* m, int slot):
        """A write round of message m is complete: every unacked fragment went out."""
        m.needs_write = False
        m.next_fragment = 0
        self.unsent -= 1

    cdef Py_ssize_t write(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                          double now, double rto, uint32_t stamp):
        """Write new and RTO-due messages, oldest first; stop at the first that does not fit."""
        cdef uint16_t msg_id = self.oldest
        cdef int slot, frag
        cdef OutMessage* m
        cdef bytes payload
        cdef list fragments
        cdef bytearray acks
        cdef Py_ssize_t n
        if self.pending_count > 0:
            self.admit()
        while self.unsent > 0 and msg_id != self.next_id:
            slot = msg_id & (self.capacity - 1)
            m = self.held(msg_id)
            if m == NULL or not m.needs_write:
                msg_id += 1
                continue
            if m.fragment_count == 1:
                if pos + m.record_size > end:
                    return pos
                payload = <bytes>m.payload
                pos += write_message_record(buf + pos, self.channel_id, msg_id, payload, len(payload))
                units_add(units, self.channel_id, msg_id, 0)
            else:
                fragments = <list>m.payload
                acks = self.fragment_acks[slot]
                while m.next_fragment < m.fragment_count:
                    frag = m.next_fragment
                    if not acks[frag]:
                        payload = fragments[frag]
                        n = len(payload)
                        if pos + fragment_record_size(n) > end:
                            return pos
                        pos += write_fragment_record(buf + pos, self.channel_id, msg_id, frag,
                                                     m.fragment_count, payload, n)
                        units_add(units, self.channel_id, msg_id, frag)
                    m.next_fragment += 1
            m.stamp = stamp
            m.copies = 0
            m.written_at = now
            if m.overdue:
                m.overdue = False
                self.overdue -= 1
            if m.first_sent < 0.0:
                m.first_sent = now
                m.rto = rto
                m.deadline = now + rto
                self.messages_sent += 1
                if now > self.last_new_at:
                    if self.last_new_at >= 0.0:
                        self.stream_interval += (now - self.last_new_at - self.stream_interval) * 0.125
                    self.last_new_at = now
                if self.earliest_deadline < 0.0 or m.deadline < self.earliest_deadline:
                    self.earliest_deadline = m.deadline
            self.finish(m, slot)
            msg_id += 1
        return pos

    cdef void on_ack(self, uint16_t msg_id, int fragment, double sent_at):
        """``sent_at``: when the acknowledged datagram was sent."""
        cdef int slot = msg_id & (self.capacity - 1)
        cdef OutMessage* m = self.held(msg_id)
        cdef bytearray acks
        if m == NULL:
            return
        if m.fragment_count == 1 and m.resends > 0 and sent_at < m.written_at:
            # The first send got through: every resend was for nothing. A resend got through:
            # at least the last one was (how many came after it is not kept).
            self.spurious_resends += m.resends if sent_at <= m.first_sent else 1
        if m.fragment_count > 1:
            acks = self.fragment_acks[slot]
            if acks[fragment]:
                return
            acks[fragment] = 1
            self.fragments_in_flight -= 1
            m.fragments_unacked -= 1
            if m.fragments_unacked > 0:
                return
        if m.needs_write:
            self.unsent -= 1
        if m.overdue:
            self.overdue -= 1
        m.in_use = False
        Py_CLEAR(m.payload)
        if m.fragment_count > 1:
            self.fragment_acks[slot] = None
        while self.oldest != self.next_id and self.held(self.oldest) == NULL:
            self.oldest += 1
        if m.first_sent >= 0.0 and m.deadline <= self.earliest_deadline:
            self.deadline_stale = True

    cdef void expire(self, double now, bint lateness_likely):
        """RTO expiry: mark due messages for resend, back their RTO off by 1.5, flag failure.

        When ``lateness_likely`` (the peer's path shows no recent loss, or a filling queue) and
        the stream is live (a redundant channel whose new messages keep going out), a whole
        message is not resent in a datagram of its own: it is marked overdue and rides the
        stream's next datagram as a copy (Peer.flush), so a path whose RTT jumps is not sent
        extra datagrams for what is only late. If no datagram comes within two stream
        intervals, it is resent on its own after all. On a lossy path an expiry more likely
        means a loss, and a datagram of its own also gets past a burst sooner."""
        cdef uint16_t msg_id = self.oldest
        cdef OutMessage* m
        cdef double earliest = -1.0
        cdef bint live = (lateness_likely and self.rides_stream and self.last_new_at >= 0.0
                          and self.stream_interval > 0.0
                          and now - self.last_new_at <= 2.0 * self.stream_interval)
        while msg_id != self.next_id:
            m = self.held(msg_id)
            if m != NULL and m.first_sent >= 0.0:
                if now >= m.deadline and m.overdue:
                    # The stream stopped before a datagram could carry it: resend it now.
                    m.overdue = False
                    self.overdue -= 1
                    m.deadline = now + m.rto
                    if not m.needs_write:
                        m.needs_write = True
                        m.next_fragment = 0
                        self.unsent += 1
                elif now >= m.deadline:
                    m.resends += 1
                    self.resends += 1
                    m.rto *= 1.5
                    m.deadline = now + m.rto
                    if m.resends > self.max_resends or m.rto > self.rto_limit:
                        self.failed = True
                    if live and m.fragment_count == 1 and not m.needs_write:
                        m.overdue = True
                        self.overdue += 1
                        m.deadline = now + min(m.rto, 2.0 * self.stream_interval)
                    elif not m.needs_write:
                        m.needs_write = True
                        m.next_fragment = 0
                        self.unsent += 1
                if earliest < 0.0 or m.deadline < earliest:
                    earliest = m.deadline
            msg_id += 1
        self.earliest_deadline = earliest
        self.deadline_stale = False

    cdef double next_deadline(self):
        cdef uint16_t msg_id
        cdef OutMessage* m
        cdef double earliest = -1.0
        if self.deadline_stale:
            # The earliest RTO among the messages still in flight (expire's bookkeeping).
            msg_id = self.oldest
            while msg_id != self.next_id:
                m = self.held(msg_id)
                if m != NULL and m.first_sent >= 0.0 and (earliest < 0.0 or m.deadline < earliest):
                    earliest = m.deadline
                msg_id += 1
            self.earliest_deadline = earliest
            self.deadline_stale = False
        return self.earliest_deadline

    def snapshot(self):
        """State of the send window for tests and debugging (not a hot path)."""
        cdef uint16_t msg_id = self.oldest
        cdef OutMessage* m
        messages = []
        while msg_id != self.next_id:
            m = self.held(msg_id)
            if m != NULL:
                messages.append(dict(msg_id=msg_id, needs_write=m.needs_write, resends=m.resends,
                                     first_sent=m.first_sent, deadline=m.deadline, rto=m.rto,
                                     copies=m.copies))
            msg_id += 1
        return dict(oldest=self.oldest, next_id=self.next_id, unsent=self.unsent, slots=self.capacity,
                    pending=self.queued() - <uint16_t>(self.next_id - self.oldest), earliest_deadline=self.earliest_deadline,
                    resends=self.resends, fast_resends=self.fast_resends,
                    spurious_resends=self.spurious_resends,
                    redundant_bytes=self.redundant_bytes, messages=messages)


cdef inline bint copy_due(OutMessage* m, uint32_t stamp, bint copies, int max_copies,
                          int prompt_copies, double now, double late_after) noexcept:
    """Whether this datagram (``stamp``) should carry a copy of m (RedundantSendChannel)."""
    if not (m.in_use and m.fragment_count == 1 and m.first_sent >= 0.0 and m.stamp != stamp):
        return False
    if m.overdue:
        return True
    if not copies:
        return False
    return max_copies == 0 or (m.copies < max_copies
                               and (m.copies < prompt_copies or now - m.written_at >= late_after))


cdef class RedundantSendChannel(ReliableSendChannel):
    cdef Py_ssize_t write_redundant(self, SentUnits* units, uint8_t* buf, Py_ssize_t pos,
                                    Py_ssize_t end, Py_ssize_t budget, uint32_t stamp,
                                    bint copies, int max_copies, int prompt_copies, double now,
                                    double late_after):
        """Piggyback the newest already-sent, unacked messages that fit ``budget``: copies (when
        ``copies``), and overdue messages (their RTO resend riding the stream, see ``expire``).

        The window is chosen newest first (the newest are the ones a just-lost datagram carried)
        and written oldest first. With ``max_copies`` > 0 (policy adaptive) a message that has
        had that many copies since its last send is skipped; after its first copy, a message
        waits until ``late_after`` seconds (SRTT + the peer's ack delay) have passed since its
        last send, by when
        the ack of a send that arrived is usually back, so a further copy goes mostly where
        it is needed; and a copy restarts its RTO, since the copy is now its latest carrier,
        whose loss the ack gap reports. max_copies 0: every datagram, and the RTO runs from the
        last send (policy always). Fragmented messages are left to RTO: they cannot ride along.
        """
        cdef int count = <uint16_t>(self.next_id - self.oldest)
        cdef int i, start = count
        cdef uint16_t msg_id
        cdef Py_ssize_t total = 0
        cdef Py_ssize_t limit = min(budget, end - pos)
        cdef OutMessage* m
        cdef bytes payload
        i = count - 1
        while i >= 0:
            msg_id = <uint16_t>(self.oldest + i)
            m = self.held(msg_id)
            if m != NULL and copy_due(m, stamp, copies, max_copies, prompt_copies, now, late_after):
                if total + m.record_size > limit:
                    break
                total += m.record_size
                start = i
            i -= 1
        for i in range(start, count):
            msg_id = <uint16_t>(self.oldest + i)
            m = self.held(msg_id)
            if m != NULL and copy_due(m, stamp, copies, max_copies, prompt_copies, now, late_after):
                payload = <bytes>m.payload
                pos += write_message_record(buf + pos, self.channel_id, msg_id, payload, len(payload))
                units_add(units, self.channel_id, msg_id, 0)
                m.stamp = stamp
                if m.overdue:
                    # Its RTO resend, riding along: the RTO runs from here, copies start over.
                    m.overdue = False
                    self.overdue -= 1
                    m.written_at = now
                    m.copies = 0
                    m.deadline = now + m.rto
                    continue
                if m.copies < 255:
                    m.copies += 1
                if max_copies > 0 and m.deadline < now + m.rto:
                    m.deadline = now + m.rto
                self.redundant_bytes += m.record_size
        return pos

    cdef void on_lost(self, uint16_t msg_id, uint32_t stamp, double now):
        """The peer's acks show the datagram with ``stamp`` lost: resend the message now if that
        datagram was its latest carrier (a later copy may still arrive; its own loss will tell).

        Only whole messages: a fragmented one keeps its RTO. The RTO restarts without backoff
        (the path evidently works), and the resend counts towards ``max_resends``.
        """
        cdef OutMessage* m = self.held(msg_id)
        if m == NULL or m.fragment_count != 1:
            return
        if m.needs_write or m.stamp != stamp:
            return
        m.needs_write = True
        m.next_fragment = 0
        self.unsent += 1
        m.resends += 1
        self.fast_resends += 1
        if m.resends > self.max_resends:
            self.failed = True
        m.deadline = now + m.rto
        if self.earliest_deadline < 0.0 or m.deadline < self.earliest_deadline:
            self.earliest_deadline = m.deadline


def make_send_channel(int channel_id, str mode, *, int window, int max_pending,
                      Py_ssize_t fragment_size, Py_ssize_t whole_limit, int max_fragments_in_flight,
                      int max_resends, double rto_limit):
    cdef int code = MODES[mode]
    if code == MODE_REDUNDANT:
        return RedundantSendChannel(channel_id, code, max_pending, window, fragment_size,
                                    whole_limit, max_fragments_in_flight, max_resends, rto_limit)
    if code == MODE_RELIABLE_ORDERED:
        return ReliableSendChannel(channel_id, code, max_pending, window, fragment_size,
                                   whole_limit, max_fragments_in_flight, max_resends, rto_limit)
    return UnreliableSendChannel(channel_id, code, max_pending)


cdef class ReceiveChannel:
    def __init__(self, int channel_id):
        self.channel_id = channel_id

    def storage_slots(self):
        """Message ids this channel has storage for (out-of-order arrivals), for tests."""
        return 0

    cdef int on_record(self, Record* r, const uint8_t* packet, list out):
        """Accept one MESSAGE/FRAGMENT record; append deliverable payloads to ``out`` in order.

        Returns 0; RECORD_IN_PLACE when the record's own payload is the one message it delivers
        (nothing appended: the caller takes it from ``packet``); or -(DropReason + 1) when the
        record is refused (the packet is then not acked, so the sender will offer it again).
        """
        return 0


cdef inline bytes record_payload(Record* r, const uint8_t* packet):
    """The record's payload, copied out of ``packet`` (the DATA packet it came in, opened):
    the packet may be a receive buffer the next datagram overwrites."""
    return PyBytes_FromStringAndSize(<const char*>packet + r.payload_offset, r.payload_length)


cdef class OrderedReceiveChannel(ReceiveChannel):
    def __init__(self, int channel_id, int window, MemoryBudget budget not None,
                 Py_ssize_t max_message_size):
        ReceiveChannel.__init__(self, channel_id)
        check_window("window", window)
        self.window = window
        # No storage until a message arrives ahead of the one delivery waits for.
        self.slots = None
        self.held = None
        self.charged = NULL
        self.next_expected = 0
        self.budget = budget
        self.max_message_size = max_message_size

    def __dealloc__(self):
        PyMem_Free(self.charged)

    def storage_slots(self):
        return 0 if self.slots is None else self.slots.size

    cdef int resize(self, int capacity, bint exempt) except -2:
        """Storage for ``capacity`` ids (a power of two) past next_expected; what is held moves
        to its slot in the new ring. The storage is charged to the budget: 0, or
        -(DropReason + 1) when the budget cannot take it (nothing changes then)."""
        cdef Py_ssize_t cost = STORAGE_OVERHEAD + STORAGE_SLOT * capacity
        cdef int admitted = self.budget.admit(cost - self.storage_charged, exempt)
        if admitted != ADMIT_OK:
            return refusal(admitted)
        cdef SequenceBuffer slots = SequenceBuffer(capacity)
        cdef list held = [None] * capacity
        cdef Py_ssize_t* charged = <Py_ssize_t*>PyMem_Malloc(capacity * sizeof(Py_ssize_t))
        cdef uint16_t msg_id = self.next_expected
        cdef int i, old_slot, new_slot
        if charged == NULL:
            raise MemoryError()
        memset(charged, 0, capacity * sizeof(Py_ssize_t))
        if self.slots is not None:
            for i in range(self.slots.size):
                if self.slots.contains(msg_id):
                    old_slot = self.slots.slot(msg_id)
                    new_slot = slots.insert(msg_id)
                    held[new_slot] = self.held[old_slot]
                    charged[new_slot] = self.charged[old_slot]
                msg_id += 1
        PyMem_Free(self.charged)
        self.slots = slots
        self.held = held
        self.charged = charged
        self.budget.charge(cost - self.storage_charged)
        self.storage_charged = cost
        return 0

    cdef int on_record(self, Record* r, const uint8_t* packet, list out):
        cdef int distance = seq_diff(r.msg_id, self.next_expected)
        cdef int slot, status, capacity, admitted
        cdef Py_ssize_t cost
        cdef object entry
        cdef PartialMessage partial
        cdef bytes whole
        cdef bint exempt = distance == 0     # the message delivery waits for: never refused
        if distance < 0:
            self.duplicates += 1
            return 0
        if distance >= self.window:
            return -(DROP_MESSAGE_OUT_OF_WINDOW + 1)
        if self.slots is None or distance >= self.slots.size:
            if exempt and r.kind != RK_FRAGMENT:
                # In order with nothing held: the common case needs no storage.
                self.next_expected += 1
                self.delivered += 1
                return RECORD_IN_PLACE
            capacity = INITIAL_RECEIVE_SLOTS if self.slots is None else self.slots.size
            while capacity <= distance:
                capacity *= 2
            status = self.resize(min(capacity, self.window), exempt)
            if status < 0:
                return status
        slot = self.slots.slot(r.msg_id)
        if self.slots.contains(r.msg_id):
            entry = self.held[slot]
            if type(entry) is bytes:
                self.duplicates += 1
                return 0
            if r.kind != RK_FRAGMENT:
                return -(DROP_BAD_FRAGMENT + 1)
            partial = <PartialMessage>entry
            if partial.fragment_count != r.fragment_count:
                return -(DROP_BAD_FRAGMENT + 1)
        elif r.kind == RK_FRAGMENT:
            partial = PartialMessage(r.fragment_count)
            self.slots.insert(r.msg_id)
            self.held[slot] = partial
        else:
            if exempt:
                out.append(record_payload(r, packet))
                self.next_expected += 1
                self.delivered += 1
                self._deliver(out)
                return 0
            cost = r.payload_length + PIECE_OVERHEAD
            admitted = self.budget.admit(cost, False)
            if admitted != ADMIT_OK:
                return refusal(admitted)
            self.slots.insert(r.msg_id)
            self.held[slot] = record_payload(r, packet)
            self.charged[slot] = cost
            self.budget.charge(cost)
            return 0
        status = partial.add(r.fragment_index, record_payload(r, packet), self.budget,
                             self.max_message_size, exempt)
        if status < 0:
            if partial.received == 0:
                self.slots.remove(r.msg_id)
                self.held[slot] = None
            return status
        if partial.received == partial.fragment_count:
            # One bytes object replaces the fragments: charge what it costs, return the rest.
            whole = partial.assemble()
            cost = len(whole) + PIECE_OVERHEAD
            self.budget.credit(partial.charged - cost)
            partial.charged = 0
            self.charged[slot] = cost
            self.held[slot] = whole
            self._deliver(out)
        return 0

    cdef void _deliver(self, list out):
        cdef int slot
        cdef object entry
        if self.slots is None:
            return
        while self.slots.contains(self.next_expected):
            slot = self.slots.slot(self.next_expected)
            entry = self.held[slot]
            if type(entry) is not bytes:
                return
            out.append(entry)
            self.budget.credit(self.charged[slot])
            self.charged[slot] = 0
            self.held[slot] = None
            self.slots.remove(self.next_expected)
            self.next_expected += 1
            self.delivered += 1

    def release(self):
        """Return the memory this window holds to the budget (the peer is going away); the
        storage goes too. Calling it again does nothing."""
        cdef int slot
        if self.slots is None:
            return
        for slot in range(self.slots.size):
            entry = self.held[slot]
            if isinstance(entry, PartialMessage):
                (<PartialMessage>entry).release(self.budget)
            self.budget.credit(self.charged[slot])
            self.charged[slot] = 0
        self.budget.credit(self.storage_charged)
        self.storage_charged = 0
        PyMem_Free(self.charged)
        self.charged = NULL
        self.slots = None
        self.held = None


cdef class SequencedReceiveChannel(ReceiveChannel):
    cdef int on_record(self, Record* r, const uint8_t* packet, list out):
        if r.kind != RK_MESSAGE:
            return -(DROP_BAD_FRAGMENT + 1)
        if self.has_last and not seq_greater(r.msg_id, self.last_id):
            self.duplicates += 1
            return 0
        self.has_last = True
        self.last_id = r.msg_id
        self.delivered += 1
        return RECORD_IN_PLACE


cdef class UnreliableReceiveChannel(ReceiveChannel):
    cdef int on_record(self, Record* r, const uint8_t* packet, list out):
        if r.kind != RK_MESSAGE:
            return -(DROP_BAD_FRAGMENT + 1)
        self.delivered += 1
        return RECORD_IN_PLACE


def make_receive_channel(int channel_id, str mode, *, int window, MemoryBudget budget,
                         Py_ssize_t max_message_size):
    cdef int code = MODES[mode]
    if code == MODE_RELIABLE_ORDERED or code == MODE_REDUNDANT:
        return OrderedReceiveChannel(channel_id, window, budget, max_message_size)
    if code == MODE_UNRELIABLE_SEQUENCED:
        return SequencedReceiveChannel(channel_id)
    return UnreliableReceiveChannel(channel_id)
