# The Endpoint's C-level layout, so that other compiled modules can cimport it.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

from relay_core.fragment cimport MemoryBudget
from relay_core.outbox cimport Outbox
from relay_core.peer cimport MessageSink, Peer, SharedSettings, STATE_CONNECTED
from relay_core.wire cimport CookiePacket, AcceptPacket, DROP_REASON_COUNT


cdef struct RateSlot:
    uint64_t key                        # the source's key; 0: empty
    double tokens
    double at


cdef struct AddressSlot:
    uint64_t key                        # the peer's address_key; 0: empty
    void* peer                          # borrowed: peers_by_address holds the reference


cdef struct DueEntry:
    double deadline
    int peer_id                         # ties broken by peer id, so the order is reproducible
    uint32_t cell                       # the peer's schedule cell
    void* peer                          # borrowed: read only while the entry is live
    uint64_t generation                 # live while its cell's generation is still this


cdef struct HeldDatagram:
    # A grouped peer's DATA, held until its group is run (Endpoint.run_group); its bytes follow
    # the record, and records lie 8-byte aligned one after another in the endpoint's buffer.
    Py_ssize_t next                     # offset of the group's next record; -1: the last
    double arrived                      # its arrival time, at which the core then takes it
    Py_ssize_t length
    int peer_id                         # the peer, found again by id when run (it may be gone)
    uint32_t session_id


cdef class Endpoint:
    cdef readonly object config
    cdef dict peers_by_address
    # The same peers in C, by raw_address_key (open addressing, linear probing): receive_raw
    # finds a DATA packet's peer from the sockaddr recvmmsg wrote, with no Python object.
    cdef Outbox outbox                  # flush_in_place's DATA (zeroed with the object)
    cdef bint outbox_handed_out         # its DATA went to flush_in_place's caller: the next write starts it anew
    cdef bint flushes_in_place          # the caller takes DATA from the outbox (flush_in_place)
    # Grouped peers' DATA waiting for their group's run, in arrival order per group: one buffer
    # of HeldDatagram records, and each group's first and last record (offsets; -1: none).
    cdef uint8_t* held
    cdef Py_ssize_t held_used
    cdef Py_ssize_t held_capacity
    cdef Py_ssize_t* group_first
    cdef Py_ssize_t* group_last
    cdef int group_capacity
    cdef AddressSlot* address_slots
    cdef Py_ssize_t address_mask        # capacity - 1 (a power of two)
    cdef Py_ssize_t address_count
    cdef dict peers
    # The same peers in C, by peer id (open addressing, linear probing from id & mask; a
    # slot holds the Peer, borrowed from peers): send_many finds a room's players in a line or
    # two of slots, where the dict's lookup costs a cold index, entry and key object each.
    cdef void** id_slots
    cdef Py_ssize_t id_mask             # capacity - 1 (a power of two)
    cdef Py_ssize_t id_count
    cdef dict sessions                  # session_id -> connected peer (address migration)
    cdef list closing
    # Peers are visited only when something may be due: the ones touched since their last flush
    # (a datagram, a send) and the ones whose scheduled deadline has come. A server with many
    # idle peers then pays nothing per call for them.
    cdef list dirty                     # Peers, each once (its dirty flag says it is here)
    # A binary min-heap of (deadline, peer, cell, generation) in C: pushed on every visit, so
    # a heap of Python tuples cost a tuple and its comparisons per player per tick. Each peer
    # owns a cell, a generation counter in one compact array, bumped when the peer's entry is
    # superseded or the peer leaves: an entry whose generation its cell no longer holds is
    # dropped when it surfaces, judged without reading the (cold) peer it names.
    cdef DueEntry* due_heap
    cdef Py_ssize_t due_count
    cdef Py_ssize_t due_capacity
    cdef uint64_t* cell_generations
    cdef uint32_t* free_cells           # cells of peers that left, for the next peers
    cdef Py_ssize_t cell_count          # cells handed out (live or free)
    cdef Py_ssize_t cell_capacity
    cdef Py_ssize_t free_cell_count
    cdef Py_ssize_t left_since_sweep    # peers that left since the heap was last swept
    cdef list control_out              # handshake replies waiting for datagrams_to_send
    cdef object events
    cdef MessageSink message_sink      # None, or every peer's sink (set_message_sink)
    cdef uint64_t drop_counts[DROP_REASON_COUNT]
    cdef dict refusal_counts
    cdef int next_peer_id
    cdef bytes cookie_key
    cdef object rng
    cdef uint8_t* scratch
    cdef SharedSettings peer_settings   # what every peer reads of config, shared
    cdef uint32_t cookie_lifetime_ms
    cdef bint accept_connections
    cdef int max_peers
    cdef uint16_t ack_delay_ms          # announced in the handshake; the peer's RTO allows for it
    cdef MemoryBudget receive_budget    # everything held for all peers before delivery
    cdef MemoryBudget block_budget      # block receive buffers of all peers together (a child)
    cdef tuple size_limits              # per channel: (largest payload, what to suggest)
    cdef tuple unreliable_channels      # per channel: True when its limit is one datagram

    # token mode
    cdef object token_keys              # None: open mode
    cdef bint encrypt_packets
    cdef readonly double unix_offset    # unix time = now + unix_offset
    cdef dict used_tokens               # token_id -> expiry (unix): single use
    cdef list used_token_expiry         # heap of (expiry, token_id), to forget them once expired

    # per-source handshake rate limit (token bucket per source IP, least recently seen evicted)
    # A direct-mapped table of buckets in C, so admit_raw can charge them: a source whose slot
    # another takes over is forgotten (its next packet starts with a full bucket).
    cdef RateSlot* rate_slots
    cdef uint64_t rate_slot_mask
    cdef double handshake_rate          # 0: unlimited
    cdef double handshake_burst
    cdef Py_ssize_t handshake_sources
    # global handshake budget (all sources): a token bucket; requests seen before and left
    # unanswered (a client's resends) are remembered in a two-generation bit filter and may use
    # the reserve that fresh requests leave
    cdef double handshake_budget_rate   # 0: unlimited
    cdef double handshake_budget_burst
    cdef double handshake_budget_tokens
    cdef double handshake_budget_at
    cdef uint64_t* unanswered_filter    # NULL until first needed; 2 x UNANSWERED_WORDS
    cdef int unanswered_generation      # which half is current
    cdef double unanswered_rotated_at
    # Admission before any Python object (admit_raw, server only): counting filters of the
    # connected peers' addresses and session ids, so DATA from neither is dropped in C, and the
    # requests admit_raw let through in the batch being read (the budget charges them later).
    cdef uint16_t* known_addresses      # NULL for a client endpoint; KNOWN_SLOTS counters
    cdef uint16_t* known_sessions
    cdef Py_ssize_t raw_admitted_requests

    # open mode: connected peers per source (relay_core.sources), counted only with a limit
    cdef Py_ssize_t max_sessions_per_source     # 0: unlimited (always 0 in token mode)
    cdef dict source_sessions           # source -> its connected peers
    cdef dict peer_sources              # peer_id -> source, for the peers counted

    # address migration (server): validating a connected peer's new address
    cdef Py_ssize_t path_challenge_budget
    cdef double path_retry_interval
    cdef dict path_counts

    # traffic of peers already closed, so that totals over all peers never go down
    cdef uint64_t closed_resends
    cdef uint64_t closed_spurious_resends
    # Something may be due out now (see output_due); cleared by datagrams_to_send.
    cdef bint output_pending
    cdef uint64_t closed_redundant_bytes

    cdef void _receive(self, bytes datagram, object address, double now)
    cdef bint receive_raw(self, const uint8_t* p, Py_ssize_t n, const void* address, double now) except -1
    cdef int _on_peer_data(self, Peer peer, const uint8_t* p, Py_ssize_t n, double now) except -1
    cdef int _hold(self, Peer peer, const uint8_t* p, Py_ssize_t n, double now) except -1
    cdef int _run_group(self, int group) except -1
    cdef int _run_held(self) except -1
    cdef int _grow_groups(self, int group) except -1
    cdef Outbox* _writable_outbox(self) noexcept
    cdef int _index(self, Peer peer) except -1
    cdef int _grow_index(self) except -1
    cdef void _unindex(self, Peer peer) noexcept
    cdef void prefetch_slot(self, const void* address) noexcept
    cdef void prefetch_sender(self, const void* address, int level) noexcept
    cdef Peer _indexed(self, uint64_t key)
    cdef void* _indexed_borrowed(self, uint64_t key) noexcept
    cdef void _prefetch_recipients(self, list peer_ids, int channel)
    cdef int _id_index(self, Peer peer) except -1
    cdef int _grow_id_index(self) except -1
    cdef void _id_unindex(self, Peer peer) noexcept
    cdef Peer _by_id(self, int peer_id)
    cdef list flush_in_place(self, double now)
    cdef list _flush(self, double now, Outbox* box)
    cdef int _visit(self, Peer peer, double now, list out, Outbox* box) except -1
    cdef list _due_peers(self, double now)
    cdef void _schedule(self, Peer peer)
    cdef void _schedule_at(self, Peer peer, double deadline)
    cdef int _due_push(self, double deadline, Peer peer) except -1
    cdef Py_ssize_t _take_cell(self) except -1

    cdef inline bint _live(self, DueEntry* entry) noexcept:
        """Whether a heap entry is its peer's current one (its cell still holds its generation)."""
        return self.cell_generations[entry.cell] == entry.generation
    cdef void _retire(self, Peer peer)
    cdef void _sweep_heap(self)
    cdef void _due_sift_down(self, Py_ssize_t i) noexcept
    cdef DueEntry _due_pop(self) noexcept
    cdef void _due_shrink(self) noexcept
    cdef bytes _cookie_mac(self, object address, uint32_t connect_id, uint32_t cookie_time, bytes token)
    cdef bint _raw_cookie_is_bad(self, const uint8_t* p, Py_ssize_t n, const void* address) noexcept
    cdef int _admit_raw_reply(self, int ptype, const uint8_t* p, Py_ssize_t n, const void* address) noexcept
    cdef int admit_raw(self, const uint8_t* p, Py_ssize_t n, const void* address, double now) noexcept
    cdef void _know(self, object address, uint32_t session_id, int delta)
    cdef bint _over_handshake_rate(self, uint64_t source, double now) noexcept
    cdef bint _admit_request(self, uint64_t address, uint64_t source, uint32_t connect_id, double now) noexcept
    cdef bint _take_handshake_budget(self, double now, bint fresh) noexcept
    cdef bint _was_left_unanswered(self, uint64_t fingerprint, double now)
    cdef void _leave_unanswered(self, uint64_t fingerprint, double now)
    cdef void _refuse(self, uint32_t connect_id, str reason, object address)
    cdef void _on_connect_request(self, const uint8_t* p, Py_ssize_t n, bytes datagram,
                                  object address, double now)
    cdef void _on_connect_response(self, const uint8_t* p, Py_ssize_t n, bytes datagram,
                                   object address, double now)
    cdef void _forget_expired_tokens(self, double unix_now)
    cdef void _on_server_reply(self, int ptype, const uint8_t* p, Py_ssize_t n, bytes datagram,
                               object address, double now)
    cdef void _on_challenge(self, Peer peer, const CookiePacket* challenge, double now)
    cdef void _on_accept(self, Peer peer, const AcceptPacket* accept, bytes datagram, double now)
    cdef void _on_data_from_new_address(self, Peer peer, const uint8_t* p, Py_ssize_t n, bytes datagram,
                                        object address, double now)
    cdef void _challenge_path(self, Peer peer, object address, Py_ssize_t trigger_size, double now)
    cdef void _on_path_packet(self, int ptype, const uint8_t* p, Py_ssize_t n, bytes datagram,
                              object address, double now)
    cdef bint _run_timers(self, Peer peer, double now)
    cdef void _close(self, Peer peer, str reason, int code)
    cdef void _release_source(self, int peer_id)
    cdef int _new_peer_id(self)
    cdef uint32_t _random_u32(self)

    cdef inline void _touch(self, Peer peer):
        """The peer may have something to send: the next flush visits it."""
        if not peer.dirty:
            peer.dirty = True
            self.dirty.append(peer)

    cdef inline double _timer_deadline(self, Peer peer):
        """When the peer's timers (timeout, RTO expiries, mode changes) may next be due. For a
        connected peer its deadline when last scheduled will do: between flushes a timer can
        only move later (a receive pushes the timeout back, an ack retires a message's RTO);
        what makes one earlier is a send, and every flush reschedules. Every tick queues a
        frame for every player, and recomputing next_deadline() then says "now" for all of them."""
        if peer.state == STATE_CONNECTED:
            return peer.scheduled_deadline
        return peer.next_deadline()
