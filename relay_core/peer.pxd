from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from relay_core.rtt cimport Rtt, RttLimits
from relay_core.redundancy cimport LinkSettings, LinkState, LINK_CLEAN
from relay_core.channel cimport ReceiveChannel, SendChannel, SentUnit, SentUnits
from relay_core.fragment cimport MemoryBudget
from relay_core.block cimport BlockSender, BlockReceiver
from relay_core.wire cimport DataHeader, SessionPacket
from relay_core.outbox cimport Outbox
from relay_core.prefetch cimport prefetch_lines, relay_prefetch

# The connection's states and what moves it between them; peer.TRANSITIONS says which
# (state, trigger) pairs are legal and where each leads (docs/PROTOCOL.md, section 9).
cdef enum:
    # Channels whose send and receive objects a peer reaches without its lists (channel_at): a
    # relay's two (CONTROL, STREAM); others take the lists.
    INLINE_CHANNELS = 2
    # Bytes of a channel object a datagram or a flush touches (its fields, not its window).
    CHANNEL_HOT_BYTES = 256
    # Bytes of the sink's object for the peer (the relay's room member) an input touches.
    SINK_CONTEXT_HOT_BYTES = 192


cdef enum PeerState:
    STATE_CONNECTING = 0        # client: sending CONNECT_REQUEST; server: checking its response
    STATE_CHALLENGED = 1        # client: sending CONNECT_RESPONSE with the server's cookie
    STATE_CONNECTED = 2
    STATE_DISCONNECTING = 3     # sending DISCONNECT, then closed
    STATE_CLOSED = 4

cdef enum PeerTrigger:
    TRIGGER_CHALLENGE = 0       # client: the server's CHALLENGE arrived
    TRIGGER_ACCEPT = 1          # client: the server's ACCEPT arrived
    TRIGGER_ADMIT = 2           # server: the client's CONNECT_RESPONSE was valid
    TRIGGER_DISCONNECT = 3      # we end a connection and tell the peer
    TRIGGER_DISCONNECT_SENT = 4 # ... and the DISCONNECTs went out
    TRIGGER_CLOSE = 5           # the connection ends with nothing sent


cdef struct SentPacket:
    double time
    uint64_t unit_start                 # its units in the ring: [unit_start, unit_start + unit_count)
    uint32_t stamp                      # the datagram stamp channels remember their last write by
    uint32_t tag                        # its seq, or 0xFFFFFFFF: an empty slot
    # A copy of its first unit (a relay's frame datagram carries one): its ack reads no ring.
    SentUnit first_unit
    uint16_t unit_count
    uint8_t acked


cdef struct PeerSettings:
    # What every peer of an endpoint reads and none changes (its EndpointConfig): one copy per
    # endpoint (SharedSettings), so that each peer's hot lines hold only its own state.
    double peer_timeout
    double heartbeat_interval
    double ack_delay
    double send_rate
    double token_capacity
    double copy_wait
    double reorder_tolerance
    Py_ssize_t redundancy_budget
    int mtu
    int max_datagrams
    int congested_copies
    int prompt_copies
    int redundancy_copies
    bint adaptive                       # redundancy_policy == "adaptive": the controller decides
    RttLimits rtt_limits
    LinkSettings link


cdef class SharedSettings:
    cdef PeerSettings s


cdef class MessageSink:
    cdef public int channel
    cpdef bint take(self, int peer_id, bytes payload, double now) except -1
    cpdef bint take_bound(self, int peer_id, object context, bytes payload, double now) except -1
    cdef int take_raw(self, int peer_id, const uint8_t* data, Py_ssize_t length,
                      double now) except -1
    cdef int take_bound_raw(self, int peer_id, object context, const uint8_t* data,
                            Py_ssize_t length, double now) except -1


cdef class Peer:
    # Hot: what every datagram received and every flush reads or writes, first and together, so
    # a peer costs as few cache lines per tick as the fields allow (a server touches thousands
    # of peers between two visits to one).
    cdef readonly int peer_id
    cdef readonly int state
    cdef readonly int reserve               # record bytes kept free in every DATA packet for the tag
    cdef int channel_count
    # >= 0: its DATA taken in place waits in the endpoint's group ``group`` until the group is
    # run (Endpoint.run_group: a relay room's players, handled in its tick's pass); -1: at once.
    cdef int group
    # Bit i: channel i may have work (a message queued, unsent or unacked). Set when a message is
    # queued on it (queue_on), cleared by next_deadline once it holds nothing: every pass over
    # the channels skips the idle ones (a relay's CONTROL channel, mostly) without touching them.
    cdef uint32_t busy_channels
    cdef SharedSettings settings            # its endpoint's (settings.s: fields at a fixed offset)
    cdef readonly uint32_t session_id
    cdef uint32_t redundant_mask            # bit i: channel i is redundant
    cdef uint8_t dirty                      # in the endpoint's list of peers to flush
    cdef uint8_t removed                    # out of the endpoint's peers
    cdef uint8_t sealed                     # DATA, DISCONNECT and PATH packets sealed (token mode)
    # False: neither block_in nor block_out has anything to do, so the per-packet paths need not
    # look at them. Set when a slice arrives or a block is queued (the only ways either gets
    # work); cleared once both are found idle.
    cdef uint8_t blocks_busy
    cdef uint8_t has_received

    # packet sequence numbers and acks
    cdef uint16_t next_seq
    cdef uint16_t latest_received
    cdef uint16_t highest_acked        # newest of our packets the peer has acked
    cdef uint16_t unacked_tail          # oldest of our packets that may still be acked
    cdef uint16_t gap_cursor            # oldest of our packets not yet judged by an ack gap
    cdef uint16_t latest_remote_send_time
    cdef uint16_t loss_cursor           # oldest of our packets the loss estimate has not judged
    cdef uint32_t received_bits
    cdef uint32_t stamp
    cdef int sent_size                  # sent_packet_buffer (a power of two)
    cdef int received_size
    cdef uint64_t address_key
    cdef Py_ssize_t schedule_cell           # its cell in the endpoint's schedule (-1: none yet)
    cdef public double scheduled_deadline    # next_deadline() when last scheduled (0.0: never)
    cdef public double queued_deadline       # its live entry in the endpoint's heap (-1.0: none)
    cdef uint64_t in_flight             # bit i: our packet next_seq - 1 - i is sent and not acked
    cdef uint64_t data_sent             # bit i: our packet next_seq - 1 - i is a DATA packet
    # loss estimate: packets that fell out of the ack window without being acked (every ack moves it)
    cdef readonly double loss
    cdef double latest_received_at
    cdef SentPacket* sent              # our DATA packets, slot seq % sent_size
    # Which of the peer's packets arrived, in the received window (seqbuf's tags: slot = seq %
    # received_size): a repeat beyond the 32 acked bits is still known for a duplicate.
    cdef uint32_t* received_tags
    cdef SentUnits units
    # Channel i's send object at [2 i], its receive object at [2 i + 1], for i < INLINE_CHANNELS
    # (borrowed from send_channels and recv_channels): one cache line, where each list costs two.
    cdef void* channel_at[2 * INLINE_CHANNELS]

    # timers
    cdef double last_send_at
    cdef double last_receive_at
    cdef double ack_due

    # pacing, copies, the RTT estimate and the redundancy controller (docs/PROTOCOL.md 11.5, 12.4, 12.5)
    cdef double tokens
    cdef double tokens_at
    cdef Rtt rtt

    # where messages go
    cdef public MessageSink sink            # takes this channel's messages before they become events
    cdef public object sink_context         # the sink's own object for this peer (Endpoint.bind_sink)
    cdef object events

    # counters a clean stream moves on every datagram
    cdef readonly uint64_t packets_sent
    cdef readonly uint64_t packets_received
    cdef readonly uint64_t bytes_sent
    cdef readonly uint64_t bytes_received
    cdef readonly uint64_t packets_acked
    cdef readonly uint64_t messages_received
    cdef readonly uint64_t send_counter     # counter of our next DATA/DISCONNECT; next_seq is its low 16 bits

    # the redundancy controller's link state (docs/PROTOCOL.md 12.5) and the address in C
    cdef LinkState link
    # The address in C, for the endpoint's address index (Endpoint._index): a sockaddr_in or
    # sockaddr_in6 (28 bytes), and its raw_address_key; 0: not in the index.
    cdef uint8_t raw_address[28]
    # Token mode and packet protection (docs/PROTOCOL.md, "Packet protection"), read by sealed
    # peers only: last, so an open peer's datagrams never touch them.
    cdef readonly bint has_recv_counter
    cdef readonly uint64_t recv_counter     # highest packet counter from the peer that authenticated
    cdef uint8_t send_key[32]               # the session's ChaCha20-Poly1305 keys (relay_core.aead):
    cdef uint8_t receive_key[32]            # ours to seal, the peer's to open

    # Cold: blocks (only once blocks_busy says they have work), losses, the handshake, token
    # claims, path validation, the loss estimate
    cdef readonly BlockSender block_out
    cdef BlockReceiver block_in
    cdef readonly uint64_t packets_lost
    cdef readonly uint64_t gap_losses           # packets judged lost by an ack gap
    cdef list send_channels             # every channel's; channel_at has the first ones
    cdef list recv_channels
    cdef readonly object address
    cdef readonly uint32_t connect_id
    cdef readonly object token              # client: the ConnectToken it connects with
    cdef readonly object claims             # server: TokenClaims of the connection's token
    cdef readonly bytes accept_packet       # server: the ACCEPT a repeated CONNECT_RESPONSE gets again
    cdef readonly bytes token_private       # server: the token this connection was accepted with

    # path validation (server): a new address the peer's packets arrive from, until it answers
    cdef readonly object path_address       # None: nothing being validated
    cdef readonly bytes path_data           # the challenge's 8 random bytes
    cdef readonly Py_ssize_t path_budget    # bytes of challenges we may still send there
    cdef readonly double path_sent_at

    # handshake (client side)
    cdef bytes cookie_packet
    cdef double created_at
    cdef double next_handshake_at
    cdef double connect_timeout
    cdef double connect_resend_interval
    cdef int disconnect_code

    cdef MemoryBudget reassembly

    cpdef int _transition(self, int trigger) except -1
    cpdef bint allows(self, int trigger)
    cdef int on_challenge(self, bytes connect_response, double now) except -1
    cdef int on_accept(self, uint32_t session_id, double now, double peer_ack_delay) except -1
    cdef int admit(self, uint32_t session_id, bytes accept_packet, object claims, bytes token,
                   double now, double peer_ack_delay) except -1
    cdef void _connected(self, uint32_t session_id, double now, double peer_ack_delay)
    cdef int begin_disconnect(self, int code) except -1
    cdef int close(self) except -1
    cdef void protect(self, bytes send_key, bytes receive_key)
    cdef int open_disconnect(self, const SessionPacket* packet, bytes datagram)
    cdef bytes seal_control(self, int packet_type, bytes plaintext)
    cdef object open_control(self, const SessionPacket* packet, bytes datagram, int packet_type)
    cdef bytes path_packet(self, int packet_type, bytes data)
    cdef void watch_path(self, object address, bytes data, Py_ssize_t budget)
    cdef void path_challenge_sent(self, Py_ssize_t size, double now)
    cdef void migrate(self, object address)
    cdef int on_data(self, const uint8_t* p, Py_ssize_t n, double now)
    cdef void process_acks(self, DataHeader* h, double now)
    cdef void packet_acked(self, uint16_t seq)
    cdef void detect_gaps(self, uint16_t newest, double now)
    cdef void on_packet_lost(self, SentPacket* packet, double now)
    cdef void keep_unacked_units(self) noexcept
    cdef int _check_channel(self, int channel) except -1

    cdef inline bint copies_on(self) noexcept:
        """Whether redundant channels write copies now: always under the "always" policy,
        under "adaptive" unless the controller's last word was "clean"."""
        return not self.settings.s.adaptive or self.link.mode != LINK_CLEAN

    cdef inline bint block_ack_owed(self):
        """block_in owes the peer a BLOCK_ACK."""
        return self.blocks_busy and self._blocks_still_busy() and self.block_in.ack_owed

    cdef inline bint block_sending(self):
        """block_out has a block in flight."""
        return self.blocks_busy and self._blocks_still_busy() and self.block_out.active()

    cdef inline bint _blocks_still_busy(self):
        if self.block_in.ack_owed or self.block_out.active():
            return True
        self.blocks_busy = False
        return False

    cdef inline SendChannel send_channel(self, int i):
        if i < INLINE_CHANNELS:
            return <SendChannel>self.channel_at[2 * i]
        return <SendChannel>self.send_channels[i]

    cdef inline bint queue_on(self, int channel, bytes payload):
        """Queue a message on send channel ``channel`` (the only way a channel gets work)."""
        self.busy_channels |= (<uint32_t>1) << channel
        return self.send_channel(channel).queue(payload)

    cdef inline bint channel_busy(self, int i) noexcept:
        return (self.busy_channels >> i) & 1

    cdef inline ReceiveChannel recv_channel(self, int i):
        if i < INLINE_CHANNELS:
            return <ReceiveChannel>self.channel_at[2 * i + 1]
        return <ReceiveChannel>self.recv_channels[i]

    cdef inline void prefetch(self) noexcept:
        """Ask for this peer's lines that a datagram or a flush reads or writes: everything
        before the cold section (a pass over peers calls it a few peers ahead). Its length is
        fixed: a length read from the peer would wait for the very line being asked for."""
        prefetch_lines(<void*>self, <char*>&self.receive_key[sizeof(self.receive_key)] - <char*><void*>self)

    cdef inline void prefetch_state(self) noexcept:
        """Ask for what the peer's own fields point to and the next datagram touches: its
        first two channels' objects, the slots of its packet rings in use and its sink's
        context. Reads the peer, so it goes after ``prefetch`` had time to bring it."""
        cdef int i
        for i in range(min(2, self.channel_count)):      # INLINE_CHANNELS >= 2
            prefetch_lines(self.channel_at[2 * i], CHANNEL_HOT_BYTES)
            relay_prefetch(self.channel_at[2 * i + 1])
        # The newest sent packet (what the next ack most likely names) and the next one's slot.
        relay_prefetch(&self.sent[<uint16_t>(self.next_seq - 1) & (self.sent_size - 1)])
        relay_prefetch(&self.sent[<uint16_t>(self.next_seq - 2) & (self.sent_size - 1)])
        relay_prefetch(&self.sent[self.next_seq & (self.sent_size - 1)])
        if self.sink_context is not None:
            prefetch_lines(<void*>self.sink_context, SINK_CONTEXT_HOT_BYTES)
        if self.units.ring != NULL:
            relay_prefetch(&self.units.ring[(self.units.head - 1) & (self.units.capacity - 1)])
            relay_prefetch(&self.units.ring[self.units.head & (self.units.capacity - 1)])

    cdef inline void prefetch_windows(self) noexcept:
        """Ask for the send windows' slots the next ack or flush touches. Reads the channel
        objects, so it goes after ``prefetch_state`` had time to bring them."""
        cdef int i
        for i in range(min(2, self.channel_count)):      # INLINE_CHANNELS >= 2
            (<SendChannel>self.channel_at[2 * i]).prefetch_window()

    cdef inline SentPacket* sent_packet(self, uint16_t seq) noexcept:
        """Our packet ``seq``, or NULL once a newer one has taken its slot."""
        cdef SentPacket* packet = &self.sent[seq & (self.sent_size - 1)]
        return packet if packet.tag == seq else NULL
    cdef bint _sink_takes(self, MessageSink sink, bytes payload, double now)
    cdef bint _sink_takes_raw(self, MessageSink sink, const uint8_t* data, Py_ssize_t length,
                              double now)
    cdef void record_received(self, uint16_t seq, uint16_t remote_send_time, double now)
    cdef bint wants_send(self, double now)
    cdef void refill(self, double now)
    cdef int flush(self, double now, uint8_t* buf, list out, Outbox* box) except -1
    cdef void flush_handshake(self, double now, list out)
    cdef bytes _disconnect_packet(self)
    cdef str check_timers(self, double now)
    cdef double next_deadline(self)
    cdef void release(self)
    cdef bint _more_to_send(self, double now)
    cdef bint window_open(self, double now)
    cdef double window_reopens(self)
    cdef bint must_send(self, double now)
