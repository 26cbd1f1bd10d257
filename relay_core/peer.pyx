"""One connection: packet sequence and acks, RTT, channels, blocks, timers and pacing.

The Endpoint owns peers and routes datagrams to them; a Peer never sees a socket or a clock, only
the ``now`` it is handed. Datagram layout and record codecs live in wire.pyx; this module decides
what goes into each datagram and what an incoming one means.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free
from libc.string cimport memcpy, memset

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

from types import MappingProxyType


from relay_core.aead cimport AEAD_KEY_SIZE, AEAD_NONCE_SIZE, aead_open, aead_seal
from relay_core.seqbuf cimport tags_new, tags_contain, tags_insert, tags_remove_range
from relay_core.rtt cimport Rtt, rtt_add_sample, rtt_init
from relay_core.redundancy cimport (
    LinkState, link_init, link_judged, link_rtt, link_settings, link_update, link_burst_length,
    LINK_CLEAN, LINK_LOSSY, LINK_BURSTY, LINK_CONGESTED,
)
from relay_core.fragment cimport MemoryBudget
from relay_core.outbox cimport Outbox, outbox_commit, outbox_reserve
from relay_core.prefetch cimport lines_alloc, lines_free
from relay_core.block cimport BlockSender, BlockReceiver
from relay_core.channel cimport (
    SentUnits, SentUnit, units_init, units_release, units_hold, SendChannel, ReceiveChannel,
    OrderedReceiveChannel, MODE_REDUNDANT, RECORD_IN_PLACE,
)
from relay_core.wire cimport (
    DataHeader, Record, read_data_header, write_data_header, parse_record, seq_diff,
    make_connect_request, make_disconnect, make_path_packet, write_nonce, reconstruct_counter,
    time_ms16, read_packet_seq, write_sealed_header, SessionPacket,
    DATA_HEADER_SIZE, RK_MESSAGE, RK_FRAGMENT, RK_BLOCK_SLICE, RK_BLOCK_ACK, TAG_SIZE, PT_DATA,
    PT_DISCONNECT, SEALED_CONTROL_HEADER,
    DROP_DUPLICATE_PACKET, DROP_STALE_PACKET, DROP_UNKNOWN_CHANNEL, DROP_AUTH_FAILED, DROP_BAD_LENGTH,
)

from relay_core.channel import make_send_channel, make_receive_channel
from relay_core.redundancy import MODE_NAMES
from relay_core.events import BlockDelivered, BlockReceived, MessageReceived, PeerConnected

STATE_NAMES = ("connecting", "challenged", "connected", "disconnecting", "closed")
TRIGGER_NAMES = ("challenge", "accept", "admit", "disconnect", "disconnect_sent", "close")

# The whole connection state machine, (state, trigger) -> new state; any other pair is
# refused (Peer._transition raises, Peer.allows says no). docs/PROTOCOL.md, section 9.
TRANSITIONS = MappingProxyType({
    (STATE_CONNECTING, TRIGGER_CHALLENGE): STATE_CHALLENGED,
    (STATE_CHALLENGED, TRIGGER_ACCEPT): STATE_CONNECTED,
    (STATE_CONNECTING, TRIGGER_ADMIT): STATE_CONNECTED,         # a server's peer is born here
    (STATE_CONNECTED, TRIGGER_DISCONNECT): STATE_DISCONNECTING,
    (STATE_DISCONNECTING, TRIGGER_DISCONNECT_SENT): STATE_CLOSED,
    (STATE_CONNECTING, TRIGGER_CLOSE): STATE_CLOSED,
    (STATE_CHALLENGED, TRIGGER_CLOSE): STATE_CLOSED,
    (STATE_CONNECTED, TRIGGER_CLOSE): STATE_CLOSED,
})


class PeerStateError(RuntimeError):
    """A transition the state machine does not have was asked for."""


def _trigger_name(int trigger):
    return TRIGGER_NAMES[trigger] if 0 <= trigger < len(TRIGGER_NAMES) else f"trigger {trigger}"

# Copies of a DISCONNECT sent back to back: it is not acked, so one lost copy must not matter.
DISCONNECT_COPIES = 3
# Bytes the IP and UDP headers add to every datagram; counted against the pacing budget.
cdef int IP_UDP_OVERHEAD = 28
# Weight of one packet in the loss EWMA.
cdef double LOSS_ALPHA = 0.05
# An ack names the newest packet and the 31 before it, so at most this many packets can be in
# flight and still be acked. Past it a peer sends at most ACK_WINDOW packets per smoothed RTT
# (a burst waits for acks; a steady stream on a very slow path is paced, and its small messages
# then share datagrams).
cdef int ACK_WINDOW = 32
cdef uint32_t NO_PACKET = 0xFFFFFFFF     # the tag of an empty SentPacket slot (seqs are 16-bit)
# Units the ring starts with: a few packets' worth while acks come back.
cdef int INITIAL_SENT_UNITS = 32


# Where a channel puts the messages one record completes, until on_data hands them on: one list
# for every peer (deliveries never nest), so no peer has a list of its own to bring into cache.
cdef list DELIVERED = []

cdef enum:
    # A sealed DATA packet up to this size is opened into a buffer on the stack (any mtu up to
    # 2048 bytes); a larger one into a bytes object.
    OPENED_ON_STACK = 2048


cdef class MessageSink:
    """Takes one channel's messages as they are delivered, before they become events.

    ``Endpoint.set_message_sink`` installs it. For a message delivered in order on ``channel``
    the core calls ``take(peer_id, payload, now)`` instead of queueing a MessageReceived, but
    only while the event queue is empty, so the sink never sees a message ahead of an earlier
    event. ``take`` returns True when it has handled the message and False to let it become an
    event as usual; if it raises, the message becomes an event too. A server that consumes one
    message kind per player per tick (inputs) skips an event object and a queue round trip for
    each. Subclass in Cython for speed; a Python subclass works too.

    A peer bound to an object of the sink's (``Endpoint.bind_sink``) has its messages go to
    ``take_bound(peer_id, context, payload, now)`` instead, with that object as ``context``:
    what the sink would otherwise look up by peer id for every message (a server's room
    member) comes with the peer the core has already found.
    """

    def __init__(self, int channel):
        self.channel = channel

    cpdef bint take(self, int peer_id, bytes payload, double now) except -1:
        return False

    cpdef bint take_bound(self, int peer_id, object context, bytes payload, double now) except -1:
        return self.take(peer_id, payload, now)

    cdef int take_raw(self, int peer_id, const uint8_t* data, Py_ssize_t length,
                      double now) except -1:
        """``take`` for a message still in the receive buffer (``length`` bytes at ``data``,
        valid only during the call): 1 taken, 0 not. A Cython sink overrides it to read the
        message there; by default it is ``take`` of a copy."""
        return self.take(peer_id, PyBytes_FromStringAndSize(<const char*>data, length), now)

    cdef int take_bound_raw(self, int peer_id, object context, const uint8_t* data,
                            Py_ssize_t length, double now) except -1:
        """``take_bound`` for a message still in the receive buffer, as ``take_raw``."""
        return self.take_bound(peer_id, context, PyBytes_FromStringAndSize(<const char*>data, length),
                               now)


# A packet is also judged lost once the peer acks one this many packets newer (and sent after
# the fixed reorder tolerance): the time window alone, 4 x RTTVAR, is wide on a jittery path.
cdef int REORDER_PACKETS = 3

cdef class SharedSettings:
    """The settings of an endpoint's peers, from its EndpointConfig: built once per endpoint
    and shared by its peers (each peer built without one gets its own)."""

    def __init__(self, object config):
        self.s.peer_timeout = config.peer_timeout
        self.s.heartbeat_interval = config.heartbeat_interval
        self.s.ack_delay = config.ack_delay
        self.s.send_rate = config.send_rate
        self.s.token_capacity = max(config.send_rate * 0.05, 4.0 * config.mtu)
        self.s.copy_wait = config.redundancy_copy_wait
        self.s.reorder_tolerance = config.reorder_tolerance
        self.s.redundancy_budget = config.redundancy_budget
        self.s.mtu = config.mtu
        self.s.max_datagrams = config.max_datagrams_per_flush
        self.s.congested_copies = config.congested_copies
        self.s.prompt_copies = config.prompt_copies
        self.s.redundancy_copies = config.redundancy_copies
        self.s.adaptive = config.redundancy_policy == "adaptive"
        self.s.rtt_limits.rto_min = config.rto_min
        self.s.rtt_limits.rto_max = config.rto_max
        link_settings(&self.s.link, config.redundancy_loss_memory, config.burst_threshold,
                      config.congestion_delay, config.congestion_hold, config.min_rtt_window)


cdef class Peer:
    def __init__(self, int peer_id, object address, object config, object events, double now,
                 uint32_t connect_id, MemoryBudget block_budget not None, int reserve=0,
                 object token=None, SharedSettings settings=None):
        cdef int n, i
        self.settings = SharedSettings(config) if settings is None else settings
        self.peer_id = peer_id
        self.group = -1
        self.queued_deadline = -1.0
        self.schedule_cell = -1
        # Sizes are fixed when the channels are built, before a client knows whether the server
        # will encrypt: a client with a token always keeps room for the tag.
        self.reserve = reserve
        self.token = token
        self.address = address
        self.events = events
        self.connect_id = connect_id
        self.state = STATE_CONNECTING
        self.created_at = now
        self.next_handshake_at = now
        self.connect_timeout = config.connect_timeout
        self.connect_resend_interval = config.connect_resend_interval
        self.disconnect_code = 0

        self.received_tags = tags_new(config.received_packet_window)
        self.received_size = config.received_packet_window
        # One record per packet in one array: an ack reads one cache line, not five.
        n = config.sent_packet_buffer
        # Slots are found by seq & (n - 1), unchecked: n must be a power of two.
        if not 1 <= n <= 32768 or n & (n - 1):
            raise ValueError(f"config.sent_packet_buffer must be a power of two in 1..32768, got {n}")
        self.sent_size = n
        self.sent = <SentPacket*>lines_alloc(n * sizeof(SentPacket))     # no record across two lines
        if self.sent == NULL:
            raise MemoryError()
        memset(self.sent, 0, n * sizeof(SentPacket))
        for i in range(n):
            self.sent[i].tag = NO_PACKET
        self.highest_acked = 0xFFFF     # "packet -1": nothing acked yet, first seq is 0
        # Small while few packets await their ack; grows to sent_unit_capacity when needed.
        units_init(&self.units, min(INITIAL_SENT_UNITS, config.sent_unit_capacity),
                   config.sent_unit_capacity)
        self.unacked_tail = 0
        self.loss = 0.0
        self.loss_cursor = 0
        self.gap_cursor = 0
        link_init(&self.link, now)

        # The handshake replaces this with the ack delay the peer announces.
        rtt_init(&self.rtt, &self.settings.s.rtt_limits, config.rto_initial, config.ack_delay)
        # Everything this peer holds counts against its own cap and, through the parent,
        # against the endpoint's receive budget (the block budget's parent).
        self.reassembly = MemoryBudget(config.reassembly_limit, block_budget.parent)
        self.send_channels = []
        self.recv_channels = []
        for index, channel in enumerate(config.channels):
            sender = make_send_channel(
                index, channel.mode, window=channel.window, max_pending=channel.max_pending,
                fragment_size=config.fragment_size - reserve,
                whole_limit=config.max_whole_message - reserve,
                max_fragments_in_flight=config.max_fragments_in_flight,
                max_resends=config.max_resends, rto_limit=config.rto_limit)
            receiver = make_receive_channel(
                index, channel.mode, window=channel.window, budget=self.reassembly,
                max_message_size=config.max_message_size)
            self.send_channels.append(sender)
            self.recv_channels.append(receiver)
            if (<SendChannel>sender).mode == MODE_REDUNDANT:
                self.redundant_mask |= 1u << index
            if index < INLINE_CHANNELS:
                self.channel_at[2 * index] = <void*>sender
                self.channel_at[2 * index + 1] = <void*>receiver
        self.channel_count = len(self.send_channels)
        self.block_out = BlockSender(config.session_slice_size(reserve), config.block_window,
                                     config.max_queued_blocks)
        self.block_in = BlockReceiver(config.max_block_size, block_budget)

        self.last_send_at = now
        self.last_receive_at = now
        self.ack_due = -1.0
        self.tokens = self.settings.s.token_capacity
        self.tokens_at = now

    def __dealloc__(self):
        lines_free(self.sent)
        PyMem_Free(self.received_tags)
        units_release(&self.units)

    # -- lifecycle -------------------------------------------------------------------------

    cpdef int _transition(self, int trigger) except -1:
        """Move to the state TRANSITIONS names for ``trigger``; an illegal trigger is a bug in
        the caller and changes nothing."""
        new_state = TRANSITIONS.get((self.state, trigger))
        if new_state is None:
            raise PeerStateError(f"peer {self.peer_id}: {_trigger_name(trigger)} is not allowed "
                                 f"when {STATE_NAMES[self.state]}")
        self.state = new_state
        return 0

    cpdef bint allows(self, int trigger):
        """Whether ``trigger`` is legal now: the endpoint drops a packet that is not."""
        return (self.state, trigger) in TRANSITIONS

    cdef int on_challenge(self, bytes connect_response, double now) except -1:
        """Client: answer the server's CHALLENGE with ``connect_response`` from now on."""
        self._transition(TRIGGER_CHALLENGE)
        self.cookie_packet = connect_response
        self.next_handshake_at = now
        return 0

    cdef int on_accept(self, uint32_t session_id, double now, double peer_ack_delay) except -1:
        """Client: the server's ACCEPT names the session."""
        self._transition(TRIGGER_ACCEPT)
        self._connected(session_id, now, peer_ack_delay)
        return 0

    cdef int admit(self, uint32_t session_id, bytes accept_packet, object claims, bytes token,
                   double now, double peer_ack_delay) except -1:
        """Server: a valid CONNECT_RESPONSE (with ``token`` and its ``claims`` in token mode)
        made this connection; ``accept_packet`` answers it, now and if it is repeated."""
        self._transition(TRIGGER_ADMIT)
        self.accept_packet = accept_packet
        self.claims = claims
        self.token_private = token
        self._connected(session_id, now, peer_ack_delay)
        return 0

    cdef void _connected(self, uint32_t session_id, double now, double peer_ack_delay):
        self.session_id = session_id
        self.rtt.peer_ack_delay = peer_ack_delay
        self.last_receive_at = now
        self.last_send_at = now
        self.events.append(PeerConnected(self.peer_id, self.address, self.claims))

    cdef int begin_disconnect(self, int code) except -1:
        """End a connected session: the next flush sends DISCONNECT(code), then it is closed."""
        self._transition(TRIGGER_DISCONNECT)
        self.disconnect_code = code
        return 0

    cdef int close(self) except -1:
        """End the connection with nothing more sent."""
        self._transition(TRIGGER_CLOSE)
        return 0

    cdef void protect(self, bytes send_key, bytes receive_key):
        """Seal what we send and open what we receive from now on (the keys of a connect token:
        32 bytes each, checked when the token was opened)."""
        if len(send_key) != AEAD_KEY_SIZE or len(receive_key) != AEAD_KEY_SIZE:
            raise ValueError("session keys must be 32 bytes")
        memcpy(self.send_key, <const char*>send_key, AEAD_KEY_SIZE)
        memcpy(self.receive_key, <const char*>receive_key, AEAD_KEY_SIZE)
        self.sealed = True

    cdef int open_disconnect(self, const SessionPacket* packet, bytes datagram):
        """The reason code of a DISCONNECT for this session, or -(DropReason + 1)."""
        if not self.sealed:
            return packet.reason if not packet.sealed else -(DROP_BAD_LENGTH + 1)
        if not packet.sealed:
            return -(DROP_AUTH_FAILED + 1)
        reason = self.open_control(packet, datagram, PT_DISCONNECT)
        return -(DROP_AUTH_FAILED + 1) if reason is None else reason[0]

    cdef bytes seal_control(self, int packet_type, bytes plaintext):
        """A sealed DISCONNECT or PATH packet: prefix, session_id and seq in clear, then the
        sealed plaintext. Uses up one packet counter, like a DATA packet."""
        cdef uint8_t nonce[AEAD_NONCE_SIZE]
        cdef bytes packet = PyBytes_FromStringAndSize(NULL, SEALED_CONTROL_HEADER + len(plaintext) + TAG_SIZE)
        cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(packet)
        write_sealed_header(out, packet_type, self.session_id, <uint16_t>self.send_counter)
        write_nonce(nonce, packet_type, self.send_counter)
        aead_seal(out + SEALED_CONTROL_HEADER, <const uint8_t*><const char*>plaintext, len(plaintext),
                  out, SEALED_CONTROL_HEADER, nonce, self.send_key)
        self.send_counter += 1
        self.next_seq += 1
        self.in_flight <<= 1                # a seq no DATA packet of ours carries
        self.data_sent <<= 1
        return packet

    cdef object open_control(self, const SessionPacket* packet, bytes datagram, int packet_type):
        """The plaintext of a sealed control packet of this session, or None if it does not
        authenticate."""
        cdef uint64_t counter = reconstruct_counter(self.recv_counter, self.has_recv_counter, packet.seq)
        cdef uint8_t nonce[AEAD_NONCE_SIZE]
        cdef Py_ssize_t n = len(datagram)
        cdef const uint8_t* p = <const uint8_t*><const char*>datagram
        if n < SEALED_CONTROL_HEADER + TAG_SIZE:
            return None
        cdef bytes plaintext = PyBytes_FromStringAndSize(NULL, n - SEALED_CONTROL_HEADER - TAG_SIZE)
        write_nonce(nonce, packet_type, counter)
        if aead_open(<uint8_t*>PyBytes_AS_STRING(plaintext), p + SEALED_CONTROL_HEADER,
                     n - SEALED_CONTROL_HEADER, p, SEALED_CONTROL_HEADER, nonce, self.receive_key) != 0:
            return None
        if not self.has_recv_counter or counter > self.recv_counter:
            self.recv_counter = counter
            self.has_recv_counter = True
        return plaintext

    cdef bytes path_packet(self, int packet_type, bytes data):
        if not self.sealed:
            return make_path_packet(packet_type, self.session_id, data)
        return self.seal_control(packet_type, data)

    cdef void watch_path(self, object address, bytes data, Py_ssize_t budget):
        """Server: validate ``address`` (the newest one wins) with a challenge carrying
        ``data``, sending at most ``budget`` bytes there."""
        self.path_address = address
        self.path_data = data
        self.path_budget = budget
        self.path_sent_at = -1e300

    cdef void path_challenge_sent(self, Py_ssize_t size, double now):
        self.path_budget -= size
        self.path_sent_at = now

    cdef void migrate(self, object address):
        """Server: the peer answered from ``address``; everything goes there from now on."""
        self.address = address
        self.path_address = None
        self.path_data = None

    cdef void release(self):
        """Give back memory charged to shared budgets; the peer is being removed."""
        for channel in self.recv_channels:
            if isinstance(channel, OrderedReceiveChannel):
                channel.release()
        self.block_in.release()

    # -- receiving -------------------------------------------------------------------------

    cdef int on_data(self, const uint8_t* p, Py_ssize_t n, double now):
        """Handle a DATA packet whose session id matched; 0 or -(DropReason + 1). ``p`` may be a
        receive buffer: nothing keeps a pointer into it past the call."""
        cdef DataHeader h
        cdef Record r
        cdef Py_ssize_t pos = DATA_HEADER_SIZE
        cdef int status = 0, rc, distance
        cdef bint has_records = False
        cdef uint64_t counter
        cdef MessageSink sink
        cdef uint8_t nonce[AEAD_NONCE_SIZE]
        cdef bytes opened
        cdef uint8_t* out
        cdef uint8_t opened_here[OPENED_ON_STACK]
        cdef list delivered = DELIVERED
        # Shared by every peer and emptied after each use: emptied here too, so nothing a call
        # that raised part-way left in it can reach this peer's sink.
        delivered.clear()
        if self.sealed:
            # Authenticate before anything else: a forged or altered packet changes no state
            # (acks, RTT, the received-packet buffer, the idle timer) and is never answered.
            if n < DATA_HEADER_SIZE + TAG_SIZE:
                return -(DROP_AUTH_FAILED + 1)
            counter = reconstruct_counter(self.recv_counter, self.has_recv_counter, read_packet_seq(p))
            write_nonce(nonce, PT_DATA, counter)
            # The header (in clear) and the opened records, in one buffer: the channels take
            # their messages from it.
            if n - TAG_SIZE <= OPENED_ON_STACK:
                out = opened_here
            else:
                opened = PyBytes_FromStringAndSize(NULL, n - TAG_SIZE)
                out = <uint8_t*>PyBytes_AS_STRING(opened)
            if aead_open(out + DATA_HEADER_SIZE, p + DATA_HEADER_SIZE, n - DATA_HEADER_SIZE,
                         p, DATA_HEADER_SIZE, nonce, self.receive_key) != 0:
                return -(DROP_AUTH_FAILED + 1)
            memcpy(out, p, DATA_HEADER_SIZE)
            if not self.has_recv_counter or counter > self.recv_counter:
                self.recv_counter = counter
                self.has_recv_counter = True
            p = out
            n -= TAG_SIZE
        read_data_header(p, &h)
        if self.has_received:
            distance = seq_diff(h.seq, self.latest_received)
            if distance <= 0:
                if -distance >= self.received_size:
                    return -(DROP_STALE_PACKET + 1)
                if tags_contain(self.received_tags, self.received_size, h.seq):
                    return -(DROP_DUPLICATE_PACKET + 1)
        self.last_receive_at = now
        self.packets_received += 1
        self.bytes_received += n
        self.process_acks(&h, now)
        while pos < n:
            pos = parse_record(p, pos, n, &r)
            if pos < 0:
                status = <int>pos
                break
            # A BLOCK_ACK needs no ack of its own (it is repeated while slices keep coming).
            has_records = has_records or r.kind != RK_BLOCK_ACK
            if r.kind == RK_MESSAGE or r.kind == RK_FRAGMENT:
                if r.channel >= self.channel_count:
                    status = -(DROP_UNKNOWN_CHANNEL + 1)
                    break
                rc = self.recv_channel(r.channel).on_record(&r, p, delivered)
                if rc == RECORD_IN_PLACE:
                    # One message, still in the packet: a sink that takes it there (an INPUT
                    # parsed in place) spares a bytes object made and freed per message.
                    rc = 0
                    sink = self.sink
                    if sink is None or r.channel != sink.channel or self.events \
                            or not self._sink_takes_raw(sink, p + r.payload_offset,
                                                        r.payload_length, now):
                        self.events.append(MessageReceived(
                            self.peer_id, r.channel, PyBytes_FromStringAndSize(
                                <const char*>p + r.payload_offset, r.payload_length)))
                    self.messages_received += 1
                elif delivered:
                    sink = self.sink
                    for payload in delivered:
                        if sink is None or r.channel != sink.channel or self.events \
                                or not self._sink_takes(sink, payload, now):
                            self.events.append(MessageReceived(self.peer_id, r.channel, payload))
                    self.messages_received += len(delivered)
                    delivered.clear()
            elif r.kind == RK_BLOCK_SLICE:
                self.blocks_busy = True
                rc = self.block_in.on_slice(&r, p, delivered)
                if delivered:
                    block_id, data = delivered.pop()
                    self.events.append(BlockReceived(self.peer_id, block_id, data))
            else:
                rc = self.block_out.on_ack(&r, p)
                if rc == 1:
                    self.events.append(BlockDelivered(self.peer_id, <uint16_t>(self.block_out.block_id - 1)))
                    rc = 0
            if rc < 0:
                status = rc
                break
        # A packet with a refused record is not acked: the sender will offer its records again
        # (everything already accepted is then a harmless duplicate).
        if status == 0:
            self.record_received(h.seq, h.send_time, now)
            if has_records and self.ack_due < 0.0:
                self.ack_due = now + self.settings.s.ack_delay
        return status

    cdef bint _sink_takes(self, MessageSink sink, bytes payload, double now):
        try:
            if self.sink_context is None:
                return sink.take(self.peer_id, payload, now)
            return sink.take_bound(self.peer_id, self.sink_context, payload, now)
        except Exception:
            return False            # the message goes on as an event; nothing is lost

    cdef bint _sink_takes_raw(self, MessageSink sink, const uint8_t* data, Py_ssize_t length,
                              double now):
        try:
            if self.sink_context is None:
                return sink.take_raw(self.peer_id, data, length, now) == 1
            return sink.take_bound_raw(self.peer_id, self.sink_context, data, length, now) == 1
        except Exception:
            return False            # the message goes on as an event; nothing is lost

    cdef void record_received(self, uint16_t seq, uint16_t remote_send_time, double now):
        cdef int distance
        if not self.has_received:
            self.has_received = True
            self.latest_received = seq
            self.received_bits = 1
        else:
            distance = seq_diff(seq, self.latest_received)
            if distance > 0:
                if distance > 1:
                    tags_remove_range(self.received_tags, self.received_size,
                                      <uint16_t>(self.latest_received + 1), <uint16_t>(seq - 1))
                self.received_bits = 1 if distance >= 32 else (self.received_bits << distance) | 1
                self.latest_received = seq
            elif -distance < 32:
                self.received_bits |= (<uint32_t>1) << (-distance)
        tags_insert(self.received_tags, self.received_size, seq)
        if seq == self.latest_received:
            self.latest_remote_send_time = remote_send_time
            self.latest_received_at = now

    cdef void process_acks(self, DataHeader* h, double now):
        cdef int i, behind
        cdef bint judged, acked
        cdef uint64_t newly
        cdef double sample
        cdef SentPacket* packet
        if h.ack_bits == 0 or self.sent_packet(h.ack) == NULL:
            return
        if seq_diff(h.ack, self.highest_acked) > 0:
            self.highest_acked = h.ack
        # Ack bit i names our packet ack - i, which is bit behind + i of in_flight.
        behind = seq_diff(<uint16_t>(self.next_seq - 1), h.ack)
        if 0 <= behind <= 32:
            # Only packets still in flight are news: usually just the newest one.
            newly = self.in_flight & ((<uint64_t>h.ack_bits) << behind)
            self.in_flight &= ~newly
            while newly:
                i = __builtin_ctzll(newly)
                newly &= newly - 1
                self.packet_acked(<uint16_t>(self.next_seq - 1 - i))
        else:
            for i in range(32):
                if (h.ack_bits >> i) & 1:
                    if 0 <= behind + i < 64:
                        self.in_flight &= ~((<uint64_t>1) << (behind + i))
                    self.packet_acked(<uint16_t>(h.ack - i))
        if h.ack_bits & 1:
            # echo_time is our send_time plus the time the peer held our packet (PROTOCOL.md).
            sample = (<uint16_t>(time_ms16(now) - h.echo_time)) / 1000.0
            if sample < 60.0:
                rtt_add_sample(&self.rtt, &self.settings.s.rtt_limits, sample)
                link_rtt(&self.link, &self.settings.s.link, sample, self.rtt.srtt, now)
            if self.settings.s.adaptive:
                self.detect_gaps(h.ack, now)
        # Packets 32 or more behind the newest ack can never be acked again: count them. Those
        # of the last 64 (all of them, acking every datagram; sent_packet_buffer >= 64 holds
        # them still) are judged by the bit masks, with no read of their cold SentPacket slots.
        if seq_diff(h.ack, self.loss_cursor) > self.sent_size + 32:
            self.loss_cursor = <uint16_t>(h.ack - self.sent_size - 32)
        while seq_diff(h.ack, self.loss_cursor) >= 32 and seq_diff(self.next_seq, self.loss_cursor) > 0:
            behind = seq_diff(<uint16_t>(self.next_seq - 1), self.loss_cursor)
            if behind < 64:
                judged = (self.data_sent >> behind) & 1
                acked = not ((self.in_flight >> behind) & 1)
            else:
                packet = self.sent_packet(self.loss_cursor)
                judged = packet != NULL
                acked = judged and packet.acked
            if judged:
                if acked:
                    self.loss -= LOSS_ALPHA * self.loss
                else:
                    self.loss += LOSS_ALPHA * (1.0 - self.loss)
                    self.packets_lost += 1
            self.loss_cursor += 1

    cdef void packet_acked(self, uint16_t seq):
        """Our packet ``seq`` arrived: each message unit it carried is acked to its channel."""
        cdef uint64_t u, start
        cdef SentUnit* unit
        cdef SentUnits* units = &self.units
        cdef SentPacket* packet = self.sent_packet(seq)
        if packet == NULL or packet.acked:
            return
        packet.acked = 1
        self.packets_acked += 1
        start = packet.unit_start
        # Units overwritten by newer packets are repaired by RTO instead.
        if not units_hold(units, start):
            return
        for u in range(start, start + packet.unit_count):
            unit = &packet.first_unit if u == start else &units.ring[u & (units.capacity - 1)]
            self.send_channel(unit.channel).on_ack(unit.msg_id, unit.fragment, packet.time)

    cdef void detect_gaps(self, uint16_t newest, double now):
        """The peer holds ``newest``: judge every older packet of ours sent more than the
        reorder window before it. One the peer has not acked by now arrived after ``newest`` or
        never, and arriving after a packet sent that much later is beyond the path's jitter."""
        cdef SentPacket* packet
        cdef double newest_sent = self.sent_packet(newest).time     # process_acks checked it
        cdef double window = max(self.settings.s.reorder_tolerance, 4.0 * self.rtt.rttvar)
        if seq_diff(newest, self.gap_cursor) > self.sent_size:
            self.gap_cursor = <uint16_t>(newest - self.sent_size)
        while seq_diff(newest, self.gap_cursor) > 0:
            packet = self.sent_packet(self.gap_cursor)
            if packet != NULL:
                if newest_sent - packet.time <= window and (
                        seq_diff(newest, self.gap_cursor) < REORDER_PACKETS
                        or newest_sent - packet.time <= self.settings.s.reorder_tolerance):
                    return
                link_judged(&self.link, &self.settings.s.link, not packet.acked)
                if not packet.acked:
                    self.on_packet_lost(packet, now)
            self.gap_cursor += 1

    cdef void on_packet_lost(self, SentPacket* packet, double now):
        """Copies start (or go on), and the redundant channels resend what only it carried."""
        cdef uint64_t u, start = packet.unit_start
        cdef uint64_t count = packet.unit_count
        cdef SentUnits* units = &self.units
        cdef SentUnit* unit
        self.gap_losses += 1
        if not units_hold(units, start):
            return
        for u in range(start, start + count):
            unit = &units.ring[u & (units.capacity - 1)]
            self.send_channel(unit.channel).on_lost(unit.msg_id, packet.stamp, now)

    # -- sending ---------------------------------------------------------------------------

    cdef void keep_unacked_units(self) noexcept:
        """Point the unit ring's floor at the oldest packet still in the sent buffer and not
        acked: the ring grows rather than overwrite what an ack may still need."""
        cdef uint16_t seq = self.unacked_tail
        cdef SentPacket* packet = NULL
        if seq_diff(self.next_seq, seq) > self.sent_size:
            seq = <uint16_t>(self.next_seq - self.sent_size)
        while seq != self.next_seq:
            packet = self.sent_packet(seq)
            if packet != NULL and not packet.acked:
                break
            seq += 1
        self.unacked_tail = seq
        self.units.floor = packet.unit_start if seq != self.next_seq else self.units.head

    cdef void refill(self, double now):
        if now > self.tokens_at:
            self.tokens = min(self.settings.s.token_capacity, self.tokens + (now - self.tokens_at) * self.settings.s.send_rate)
            self.tokens_at = now

    cdef bint window_open(self, double now):
        return (seq_diff(self.next_seq, self.highest_acked) <= ACK_WINDOW
                or now >= self.window_reopens())

    cdef double window_reopens(self):
        cdef double rtt = self.rtt.srtt if self.rtt.has_sample else self.rtt.rto
        return self.last_send_at + max(rtt, 0.001) / ACK_WINDOW

    cdef bint must_send(self, double now):
        """An ack, block ack or heartbeat is due: a datagram goes out even past the window."""
        return ((self.ack_due >= 0.0 and now >= self.ack_due) or self.block_ack_owed()
                or now - self.last_send_at >= self.settings.s.heartbeat_interval)

    cdef bint wants_send(self, double now):
        cdef int i
        if self.state != STATE_CONNECTED:
            return self.state != STATE_CLOSED
        if self.must_send(now):
            return True
        if not self.window_open(now):
            return False
        for i in range(self.channel_count):
            if self.channel_busy(i) and self.send_channel(i).has_unsent():
                return True
        if self.block_sending():
            self.refill(now)
            if self.tokens > 0 and self.block_out.has_due(now, self.rtt.rto):
                return True
        return False

    cdef int flush(self, double now, uint8_t* buf, list out, Outbox* box) except -1:
        """Append this peer's datagrams for ``now`` to ``out`` as (bytes, address); its DATA goes
        into ``box`` instead when there is one and the peer's address is a sockaddr (in the
        endpoint's address index). ``buf``: scratch of at least mtu bytes."""
        cdef int k, i
        cdef SentPacket* packet
        cdef Py_ssize_t pos, end = self.settings.s.mtu - self.reserve
        cdef DataHeader h
        cdef bytes datagram
        cdef SendChannel channel
        cdef uint64_t units_start
        cdef double held
        cdef bint carries_messages
        cdef uint8_t nonce[AEAD_NONCE_SIZE]
        cdef uint8_t* sealed_out
        cdef uint8_t* scratch = buf
        cdef bint in_box = box != NULL and self.address_key != 0
        cdef Py_ssize_t budget = self.settings.s.redundancy_budget
        # always: every unacked message in every datagram. adaptive: as the controller's mode
        # says (PROTOCOL.md 12.5): none on a clean path; on a lossy one a bounded number per
        # message, the first in the next datagram and the others only where an ack is overdue;
        # on a bursty one every datagram until acked, as always; on a congested one fewer.
        cdef int mode = (link_update(&self.link, &self.settings.s.link, now) if self.settings.s.adaptive
                         else LINK_BURSTY)
        cdef int prompt_copies = self.settings.s.prompt_copies
        cdef bint copies = mode != LINK_CLEAN and (mode != LINK_CONGESTED or self.settings.s.congested_copies > 0)
        cdef int max_copies = (self.settings.s.redundancy_copies if mode == LINK_LOSSY else
                               self.settings.s.congested_copies if mode == LINK_CONGESTED else 0)
        # When the ack of a send that arrived is due back: SRTT excludes the peer's ack hold.
        cdef double late_copy = (self.settings.s.copy_wait * self.rtt.srtt + self.rtt.peer_ack_delay
                                 if self.rtt.has_sample else self.settings.s.copy_wait * self.rtt.rto)
        if self.state != STATE_CONNECTED:
            self.flush_handshake(now, out)
            return 0
        if not self.wants_send(now):
            return 0
        self.refill(now)
        for k in range(self.settings.s.max_datagrams):
            # Written where it goes out from, unless it is sealed afterwards.
            buf = outbox_reserve(box, self.settings.s.mtu) if in_box and not self.sealed else scratch
            self.stamp += 1
            self.keep_unacked_units()
            units_start = self.units.head
            pos = DATA_HEADER_SIZE
            for i in range(self.channel_count):
                if self.channel_busy(i):
                    pos = self.send_channel(i).write(&self.units, buf, pos, end, now, self.rtt.rto, self.stamp)
            carries_messages = pos > DATA_HEADER_SIZE
            if self.blocks_busy:
                pos = self.block_in.write_ack(buf, pos, end)
            # Discretionary bytes only while the pacing budget lasts. Copies ride only with new or
            # resent messages: on an ack-only datagram they would make the peer ack back, and so on.
            if self.tokens > 0:
                if carries_messages:
                    for i in range(self.channel_count):
                        if not ((self.redundant_mask & self.busy_channels) >> i) & 1:
                            continue
                        channel = self.send_channel(i)
                        if copies or channel.overdue:
                            pos = channel.write_redundant(&self.units, buf, pos, end, budget, self.stamp,
                                                          copies, max_copies, prompt_copies, now,
                                                          late_copy)
                if self.block_sending():
                    pos = self.block_out.write(buf, pos, end, now, self.rtt.rto)
            h.session_id = self.session_id
            h.seq = self.next_seq
            h.ack = self.latest_received
            h.ack_bits = self.received_bits
            h.send_time = time_ms16(now)
            held = min((now - self.latest_received_at) * 1000.0, 60000.0) if self.has_received else 0.0
            h.echo_time = <uint16_t>(self.latest_remote_send_time + <uint16_t>held)
            write_data_header(buf, &h)
            packet = &self.sent[self.next_seq & (self.sent_size - 1)]
            packet.tag = self.next_seq
            packet.time = now
            packet.acked = 0
            packet.unit_start = units_start
            packet.unit_count = <uint16_t>(self.units.head - units_start)
            if packet.unit_count:
                packet.first_unit = self.units.ring[units_start & (self.units.capacity - 1)]
            packet.stamp = self.stamp
            self.in_flight = (self.in_flight << 1) | 1
            self.data_sent = (self.data_sent << 1) | 1
            if not self.sealed:
                if in_box:
                    outbox_commit(box, pos, self.raw_address)
                else:
                    out.append((PyBytes_FromStringAndSize(<char*>buf, pos), self.address))
            else:
                # The header in clear, authenticated with the sealed records after it.
                if in_box:
                    sealed_out = outbox_reserve(box, pos + TAG_SIZE)
                else:
                    datagram = PyBytes_FromStringAndSize(NULL, pos + TAG_SIZE)
                    sealed_out = <uint8_t*>PyBytes_AS_STRING(datagram)
                memcpy(sealed_out, buf, DATA_HEADER_SIZE)
                write_nonce(nonce, PT_DATA, self.send_counter)
                aead_seal(sealed_out + DATA_HEADER_SIZE, buf + DATA_HEADER_SIZE, pos - DATA_HEADER_SIZE,
                          buf, DATA_HEADER_SIZE, nonce, self.send_key)
                pos += TAG_SIZE
                if in_box:
                    outbox_commit(box, pos, self.raw_address)
                else:
                    out.append((datagram, self.address))
            self.next_seq += 1
            self.send_counter += 1
            self.packets_sent += 1
            self.bytes_sent += pos
            self.tokens -= pos + IP_UDP_OVERHEAD
            self.last_send_at = now
            self.ack_due = -1.0
            # A burst stops at the ack window and resumes as acks arrive (or the pace allows).
            if seq_diff(self.next_seq, self.highest_acked) > ACK_WINDOW or not self._more_to_send(now):
                break
        return 0

    cdef bint _more_to_send(self, double now):
        cdef int i
        for i in range(self.channel_count):
            if self.channel_busy(i) and self.send_channel(i).has_unsent():
                return True
        if self.block_ack_owed():
            return True
        return self.tokens > 0 and self.block_sending() and self.block_out.has_due(now, self.rtt.rto)

    cdef void flush_handshake(self, double now, list out):
        cdef int i
        if self.state == STATE_DISCONNECTING:
            packet = self._disconnect_packet()
            for i in range(DISCONNECT_COPIES):
                out.append((packet, self.address))
            self.bytes_sent += DISCONNECT_COPIES * len(packet)
            self.packets_sent += DISCONNECT_COPIES
            self._transition(TRIGGER_DISCONNECT_SENT)
            return
        if self.state == STATE_CLOSED or now < self.next_handshake_at:
            return
        if self.state == STATE_CONNECTING:
            packet = make_connect_request(self.connect_id, self.token.private if self.token is not None else None)
        else:
            packet = self.cookie_packet
        out.append((packet, self.address))
        self.bytes_sent += len(packet)
        self.packets_sent += 1
        self.next_handshake_at = now + self.connect_resend_interval

    cdef bytes _disconnect_packet(self):
        if not self.sealed:
            return make_disconnect(self.session_id, self.disconnect_code)
        # Sealed with the next packet counter; the copies are identical bytes.
        return self.seal_control(PT_DISCONNECT, bytes([self.disconnect_code]))

    # -- timers ----------------------------------------------------------------------------

    cdef str check_timers(self, double now):
        """Run expiries; returns a disconnect reason when the peer must go, else None."""
        cdef SendChannel channel
        cdef double deadline
        cdef int mode, i
        if self.state == STATE_CONNECTING or self.state == STATE_CHALLENGED:
            return "connect_timeout" if now - self.created_at >= self.connect_timeout else None
        if self.state != STATE_CONNECTED:
            return None
        if now - self.last_receive_at >= self.settings.s.peer_timeout:
            return "timeout"
        # An expiry on a path without recent loss, or with a filling queue, is more likely a
        # late ack than a lost message (the "always" policy has no such view: it resends).
        mode = link_update(&self.link, &self.settings.s.link, now) if self.settings.s.adaptive else LINK_LOSSY
        for i in range(self.channel_count):
            if not self.channel_busy(i):
                continue
            channel = self.send_channel(i)
            deadline = channel.next_deadline()
            if deadline >= 0.0 and now >= deadline:
                channel.expire(now, mode == LINK_CLEAN or mode == LINK_CONGESTED)
            if channel.failed:      # by RTO expiries, or by ack-gap resends (on_lost)
                return "resend_limit"
        return None

    cdef double next_deadline(self):
        """Earliest time at which check_timers or flush has work; 0.0 means now."""
        cdef double deadline, d, ready, token_ready
        cdef SendChannel channel
        cdef int i
        if self.state == STATE_DISCONNECTING:
            return 0.0
        if self.state == STATE_CLOSED:
            return -1.0
        if self.state != STATE_CONNECTED:
            return min(self.next_handshake_at, self.created_at + self.connect_timeout)
        if self.block_ack_owed():
            return 0.0
        deadline = min(self.last_receive_at + self.settings.s.peer_timeout, self.last_send_at + self.settings.s.heartbeat_interval)
        if self.ack_due >= 0.0:
            deadline = min(deadline, self.ack_due)
        # Work waiting only for the ack window is due when the window reopens; acks that open
        # it sooner arrive through receive(), after which the caller flushes anyway.
        ready = 0.0 if seq_diff(self.next_seq, self.highest_acked) <= ACK_WINDOW else self.window_reopens()
        for i in range(self.channel_count):
            if not self.channel_busy(i):
                continue
            channel = self.send_channel(i)
            if channel.queued() == 0 and not channel.failed:
                # Nothing queued, unsent or unacked: idle until queue_on gives it a message.
                self.busy_channels &= ~((<uint32_t>1) << i)
                continue
            if channel.has_unsent():
                deadline = min(deadline, ready)
            d = channel.next_deadline()
            if d >= 0.0:
                deadline = min(deadline, d)
        if self.block_sending():
            d = self.block_out.next_resend(self.rtt.rto)
            if self.block_out.has_unsent():
                # Unsent slices go as soon as the window and the pacing budget allow.
                token_ready = self.tokens_at + max(0.0, -self.tokens) / self.settings.s.send_rate
                d = max(ready, token_ready) if d < 0.0 else min(d, max(ready, token_ready))
            if d >= 0.0:
                deadline = min(deadline, d)
        return deadline

    # -- Python-level access ---------------------------------------------------------------

    cdef int _check_channel(self, int channel) except -1:
        # send_channels and recv_channels are indexed unchecked (boundscheck=False).
        if not 0 <= channel < self.channel_count:
            raise IndexError(f"channel {channel} does not exist (0..{self.channel_count - 1})")
        return 0

    def channel_snapshot(self, int channel):
        self._check_channel(channel)
        snapshot = self.send_channels[channel].snapshot()
        snapshot["receive_slots"] = self.recv_channels[channel].storage_slots()
        snapshot["sent_unit_capacity"] = self.units.capacity
        return snapshot

    def queue_message(self, int channel, bytes payload not None):
        self._check_channel(channel)
        return self.queue_on(channel, payload)

    def stats_fields(self):
        cdef SendChannel channel
        cdef ReceiveChannel receiver
        messages_sent = resends = spurious = redundant = queued = duplicates = 0
        for channel in self.send_channels:
            messages_sent += channel.messages_sent
            resends += channel.resends
            spurious += channel.spurious_resends
            redundant += channel.redundant_bytes
            queued += channel.queued()
        for receiver in self.recv_channels:
            duplicates += receiver.duplicates
        return dict(
            rtt=self.rtt.srtt, rtt_variance=self.rtt.rttvar, rto=self.rtt.rto, loss=self.loss,
            redundancy_mode=MODE_NAMES[self.link.mode] if self.settings.s.adaptive else "always",
            burst_length=link_burst_length(&self.link),
            min_rtt=max(self.link.min_rtt, 0.0), queue_delay=max(self.link.queue_delay, 0.0),
            packets_sent=self.packets_sent,
            packets_received=self.packets_received, bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received, packets_acked=self.packets_acked,
            packets_lost=self.packets_lost, messages_sent=messages_sent,
            messages_received=self.messages_received, resends=resends, spurious_resends=spurious,
            redundant_bytes=redundant, copying=self.copies_on(),
            duplicate_messages=duplicates, block_slices_sent=self.block_out.slices_sent,
            block_slices_resent=self.block_out.slices_resent, queued_messages=queued,
        )
