"""The endpoint: many peers behind one transport address, the handshake, and the event queue.

Sans-I/O: the caller feeds datagrams with ``receive(data, address, now)``, sends what
``datagrams_to_send(now)`` returns, calls ``handle_timeout(now)`` at ``next_timeout()``, and
drains ``next_event()``. ``now`` is any monotonic clock in seconds chosen by the caller.

Handshake (docs/PROTOCOL.md, "Connection"): CONNECT_REQUEST -> CHALLENGE (a cookie bound to the
client's address, connect id and time) -> CONNECT_RESPONSE (echoes the cookie) -> ACCEPT (session
id). The server allocates nothing for a client until the cookie comes back, so a flood from
spoofed source addresses costs it one keyed hash per datagram and no memory; every reply to an
unauthenticated datagram is no larger than that datagram.

Token mode (``token_keys``): the client's CONNECT_REQUEST and CONNECT_RESPONSE carry a connect
token (relay_core.token); the server opens it only once the cookie has come back, refuses it if
expired or already used, and answers with an ACCEPT sealed with the token's server key. DATA and
DISCONNECT are then sealed with the token's session keys (``encrypt_packets``).

Address migration (server): DATA carrying a connected peer's session id from a new address is
handled for that peer (authenticated first when sealed) and, if genuine and new, makes the server
challenge the new address (PATH_CHALLENGE); the peer moves only once it answers from there.
"""
import heapq
import hmac
import random
import socket
import time
from collections import deque


from cpython.buffer cimport PyObject_CheckBuffer
from cpython.mem cimport PyMem_Calloc, PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.string cimport memcmp, memcpy, memset
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t

from relay_core.channel cimport SendChannel
from relay_core.fragment cimport MemoryBudget
from relay_core.prefetch cimport prefetch_lines, relay_prefetch
from relay_core.redundancy cimport LINK_MODES
from relay_core.peer cimport (
    CHANNEL_HOT_BYTES, INLINE_CHANNELS, MessageSink, Peer, STATE_CONNECTED, STATE_DISCONNECTING,
    TRIGGER_ACCEPT, TRIGGER_CHALLENGE,
    TRIGGER_DISCONNECT,
)
from relay_core.wire cimport (
    ConnectRequest, CookiePacket, AcceptPacket, RefusePacket, SessionPacket, check_prefix, read_session_id,
    write_u32,
    decode_connect_request, decode_challenge, decode_connect_response, decode_accept, decode_refuse,
    decode_disconnect, decode_path_packet, make_challenge, make_connect_response, make_accept, make_refuse,
    make_nonce,
    PT_CONNECT_REQUEST, PT_CHALLENGE, PT_CONNECT_RESPONSE, PT_ACCEPT, PT_REFUSE, PT_DATA,
    PT_DISCONNECT, DATA_HEADER_SIZE, COOKIE_MAC_SIZE, TAG_SIZE, TOKEN_FORMAT_NONE, ACCEPT_FLAG_ENCRYPTED,
    PT_PATH_CHALLENGE, PT_PATH_RESPONSE, PATH_SIZE, PATH_SECURE_SIZE, PATH_DATA_SIZE,
    DROP_REASON_COUNT, DROP_TRUNCATED, DROP_UNKNOWN_PEER, DROP_WRONG_SESSION,
    DROP_BAD_COOKIE, DROP_EXPIRED_COOKIE, DROP_NOT_ACCEPTING, DROP_UNEXPECTED_PACKET,
    DROP_DUPLICATE_PACKET, DROP_STALE_PACKET, DROP_AUTH_FAILED, DROP_RATE_LIMITED, DROP_BAD_LENGTH,
    DROP_PATH_UNVALIDATED, DROP_HANDSHAKE_BUDGET,
)

from relay_core.aead cimport blake2s_mac
from relay_core.aead import AeadError, open_ as aead_open_bytes, seal as aead_seal_bytes
from relay_core.config import EndpointConfig
from relay_core.events import PeerDisconnected, PeerMigrated, PeerStats
from relay_core.peer import STATE_NAMES
from relay_core.redundancy import MODE_NAMES
from relay_core.sources import source_key
from relay_core.token import ConnectToken, TokenError, open_token
from relay_core.wire import DROP_REASONS, REASONS, REASON_CODES


cdef extern from "<arpa/inet.h>" nogil:
    const char* inet_ntop(int family, const void* source, char* out, unsigned int size)
    uint16_t ntohs(uint16_t value)
    uint32_t ntohl(uint32_t value)

from libc.stdio cimport snprintf

cdef extern from "<netinet/in.h>" nogil:
    ctypedef unsigned short sa_family_t
    cdef enum:
        AF_INET
        AF_INET6
    cdef struct in_addr:
        uint32_t s_addr
    cdef struct sockaddr_in:
        sa_family_t sin_family
        uint16_t sin_port
        in_addr sin_addr
    cdef struct in6_addr:
        uint8_t s6_addr[16]
    cdef struct sockaddr_in6:
        sa_family_t sin6_family
        uint16_t sin6_port
        uint32_t sin6_flowinfo
        in6_addr sin6_addr
        uint32_t sin6_scope_id


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    # A 64-bit finalizer (splitmix64's): every input bit moves every output bit.
    x ^= x >> 30
    x *= 0xBF58476D1CE4E5B9ULL
    x ^= x >> 27
    x *= 0x94D049BB133111EBULL
    return x ^ (x >> 31)


cdef enum:
    # How far ahead a pass over peers asks for a peer's first line (the flush's list), and how
    # far ahead the receive path asks for a datagram's address-index slot (then, one datagram
    # ahead, for its peer).
    DUE_PREFETCH_AHEAD = 4
    # send_many asks for all its peers first when they are at most this many (a room).
    SEND_MANY_PREFETCH = 64
    # Grouped peers' DATA held at most (the records and their bytes): past it, everything held
    # is taken at once, so a flood from a player's address costs what it did before, no memory.
    MAX_HELD_BYTES = 4 << 20


cdef uint64_t raw_address_key(const void* address) noexcept nogil:
    """A key of a sockaddr_in/sockaddr_in6: family, port and IP (not an IPv6 scope or flow);
    address_key gives the same for its Python form. 0: another family."""
    cdef const sockaddr_in* sin = <const sockaddr_in*>address
    cdef const sockaddr_in6* sin6 = <const sockaddr_in6*>address
    cdef uint64_t high, low
    cdef int i
    if sin.sin_family == AF_INET:
        return mix64((<uint64_t>4 << 48) | (<uint64_t>sin.sin_port << 32) | sin.sin_addr.s_addr) | 1
    if sin.sin_family == AF_INET6:
        high = low = 0
        for i in range(8):
            high = (high << 8) | sin6.sin6_addr.s6_addr[i]
            low = (low << 8) | sin6.sin6_addr.s6_addr[8 + i]
        return mix64(mix64(high ^ ((<uint64_t>6 << 48) | (<uint64_t>sin6.sin6_port << 32))) ^ low) | 1
    return 0


cdef bint to_sockaddr(object address, sockaddr_in6* out):
    """Fills ``out`` (room for either family) with an address as the transport hands it over,
    (host, port) or (host, port, flowinfo, scope_id); False for anything else (such addresses
    are never admitted raw)."""
    cdef sockaddr_in* sin = <sockaddr_in*>out
    cdef bytes packed
    if type(address) is not tuple or len(address) not in (2, 4) or type(address[0]) is not str:
        return False
    try:
        port = socket.htons(int(address[1]))
        if len(address) == 2:
            packed = socket.inet_pton(socket.AF_INET, address[0])
            sin.sin_family = AF_INET
            sin.sin_port = port
            memcpy(&sin.sin_addr, <const char*>packed, 4)
        else:
            packed = socket.inet_pton(socket.AF_INET6, address[0].partition("%")[0])
            out.sin6_family = AF_INET6
            out.sin6_port = port
            memcpy(&out.sin6_addr, <const char*>packed, 16)
        return True
    except (OSError, ValueError, OverflowError, TypeError):
        return False


cdef inline bint same_address(const void* a, const void* b) noexcept nogil:
    """Whether two sockaddrs name the same family, IP and port (not an IPv6 scope or flow)."""
    cdef const sockaddr_in* x = <const sockaddr_in*>a
    cdef const sockaddr_in* y = <const sockaddr_in*>b
    if x.sin_family != y.sin_family or x.sin_port != y.sin_port:
        return False
    if x.sin_family == AF_INET:
        return x.sin_addr.s_addr == y.sin_addr.s_addr
    return memcmp(&(<const sockaddr_in6*>a).sin6_addr, &(<const sockaddr_in6*>b).sin6_addr, 16) == 0


cdef uint64_t address_key(object address):
    """raw_address_key of an address as the transport hands it over (0: not an IP address)."""
    cdef sockaddr_in6 storage
    return raw_address_key(&storage) if to_sockaddr(address, &storage) else 0


cdef uint64_t raw_rate_source(const void* address) noexcept nogil:
    """The handshake rate limit's source of a sockaddr: the IP (not the port, which a flooder
    picks freely); for IPv6 its /64, which one host or home network commonly owns whole, and
    an IPv4-mapped IPv6 address as its IPv4 address. Never 0; 0 for another family."""
    cdef const sockaddr_in* sin = <const sockaddr_in*>address
    cdef const sockaddr_in6* sin6 = <const sockaddr_in6*>address
    cdef const uint8_t* ip
    cdef uint64_t prefix = 0
    cdef int i
    if sin.sin_family == AF_INET:
        return mix64((<uint64_t>4 << 56) | sin.sin_addr.s_addr) | 1
    if sin.sin_family != AF_INET6:
        return 0
    ip = sin6.sin6_addr.s6_addr
    for i in range(10):
        if ip[i] != 0:
            break
    else:
        if ip[10] == 0xFF and ip[11] == 0xFF:
            return mix64((<uint64_t>4 << 56) | (<const uint32_t*>(ip + 12))[0]) | 1
    for i in range(8):
        prefix = (prefix << 8) | ip[i]
    return mix64(mix64(prefix) ^ (<uint64_t>6 << 56)) | 1


cdef uint64_t rate_source(object address):
    """raw_rate_source of an address as the transport hands it over (0: not an IP address):
    the source relay_core.sources.source_key names, as a 64-bit key."""
    cdef sockaddr_in6 storage
    return raw_rate_source(&storage) if to_sockaddr(address, &storage) else 0


cdef Py_ssize_t raw_address_repr(const void* address, char* out, Py_ssize_t size) noexcept nogil:
    """repr() of the tuple relay._batchio makes of a sockaddr, ("host", port) or ("host", port,
    flowinfo, scope_id), as ASCII in ``out``; its length, or 0 (another family, too long)."""
    cdef const sockaddr_in* sin = <const sockaddr_in*>address
    cdef const sockaddr_in6* sin6 = <const sockaddr_in6*>address
    cdef char host[64]
    cdef int length
    if sin.sin_family == AF_INET:
        if inet_ntop(AF_INET, &sin.sin_addr, host, sizeof(host)) == NULL:
            return 0
        length = snprintf(out, size, "('%s', %u)", host, <unsigned>ntohs(sin.sin_port))
    elif sin.sin_family == AF_INET6:
        if inet_ntop(AF_INET6, &sin6.sin6_addr, host, sizeof(host)) == NULL:
            return 0
        length = snprintf(out, size, "('%s', %u, %u, %u)", host, <unsigned>ntohs(sin6.sin6_port),
                          <unsigned>ntohl(sin6.sin6_flowinfo), <unsigned>sin6.sin6_scope_id)
    else:
        return 0
    return length if 0 < length < size else 0


cdef inline uint64_t request_fingerprint(uint64_t address_key, uint32_t connect_id) noexcept nogil:
    return mix64(address_key ^ (<uint64_t>connect_id * 0x9E3779B97F4A7C15ULL))


DEF VERIFIED_KEY_TAG = 0x5645524946494544     # keeps an address's bucket apart from its IP's
DEF RESEND_KEY_TAG = 0x524553454E445321       # an IP's bucket for resends, apart from its first
DEF ADDRESS_SLOTS_MIN = 64           # the address index's first capacity; it doubles at half full
DEF KNOWN_SLOTS = 131072              # counters per filter (256 KB): few false hits up to ~10 k peers
DEF UNANSWERED_WORDS = 65536         # 2^22 bits per generation: ~1 % false hits at 130 k/s
DEF UNANSWERED_GENERATION = 0.25     # seconds; a request is remembered 0.25-0.5 s (resends: 0.1 s)
DEF FRESH_RESERVE = 0.25             # share of the handshake budget's burst only resends may use


cdef inline bint due_before(DueEntry* a, DueEntry* b) noexcept:
    return a.deadline < b.deadline or (a.deadline == b.deadline and a.peer_id < b.peer_id)


cdef inline uint32_t time_ms32(double now) noexcept:
    return <uint32_t>(<int64_t>(now * 1000.0) & 0xFFFFFFFF)


cdef inline bytes as_datagram(object data):
    """A received datagram as bytes; anything but bytes or a buffer is a misuse (bytes(5)
    would make five zero bytes of it, bytes(None) is no datagram)."""
    if type(data) is bytes:
        return <bytes>data
    if PyObject_CheckBuffer(data):
        return bytes(data)
    raise TypeError(f"data must be bytes or a buffer, not {type(data).__name__}")


cdef inline bint stays_past_hole(Py_ssize_t home, Py_ssize_t i, Py_ssize_t j) noexcept:
    """Backward-shift deletion in a linear-probing table (the address and id indexes): the
    entry at j, whose home slot is ``home``, stays if its home lies cyclically in (i, j], as the
    hole at i is then not on its probe path; otherwise it moves into the hole."""
    return (home <= j and (home > i or i > j)) or (home > j and home > i and i > j)


cdef class Endpoint:
    # Fields and C-level methods are declared in endpoint.pxd.

    def __init__(self, config=None, unix_offset=None):
        if config is not None and not isinstance(config, EndpointConfig):
            raise TypeError(f"config must be a relay_core.EndpointConfig, got {type(config).__name__}")
        self.config = (config if config is not None else EndpointConfig()).validate()
        if not isinstance(self.config, EndpointConfig):
            raise TypeError(f"config.validate() must return an EndpointConfig, got {type(self.config).__name__}")
        self.peers_by_address = {}
        self.address_slots = <AddressSlot*>PyMem_Calloc(ADDRESS_SLOTS_MIN, sizeof(AddressSlot))
        if self.address_slots == NULL:
            raise MemoryError()
        self.address_mask = ADDRESS_SLOTS_MIN - 1
        self.address_count = 0
        self.id_slots = <void**>PyMem_Calloc(ADDRESS_SLOTS_MIN, sizeof(void*))
        if self.id_slots == NULL:
            raise MemoryError()
        self.id_mask = ADDRESS_SLOTS_MIN - 1
        self.id_count = 0
        self.peers = {}
        self.sessions = {}
        self.closing = []
        self.dirty = []
        self.control_out = []
        self.events = deque()
        self.refusal_counts = {}
        self.next_peer_id = 1
        self.rng = random.Random(self.config.seed) if self.config.seed is not None else random.SystemRandom()
        self.cookie_key = bytes(self.rng.getrandbits(8) for _ in range(32))
        self.cookie_lifetime_ms = <uint32_t>(self.config.cookie_lifetime * 1000.0)
        self.accept_connections = self.config.accept_connections
        self.max_peers = self.config.max_peers
        # Everything peers make us hold before delivery, all peers together; every peer's
        # reassembly budget and the block budget are its children (a charge counts in both).
        self.receive_budget = MemoryBudget(self.config.receive_memory_limit)
        self.block_budget = MemoryBudget(self.config.block_memory_limit, self.receive_budget)
        self.ack_delay_ms = <uint16_t>min(65535, round(self.config.ack_delay * 1000.0))
        self.size_limits = tuple(
            (self.config.max_whole_message, "exceeds one datagram")
            if channel.mode in ("unreliable", "unreliable_sequenced")
            else (self.config.max_message_size, "exceeds max_message_size; use send_block()")
            for channel in self.config.channels)
        self.unreliable_channels = tuple(channel.mode in ("unreliable", "unreliable_sequenced")
                                         for channel in self.config.channels)
        self.token_keys = dict(self.config.token_keys) if self.config.token_keys is not None else None
        self.encrypt_packets = self.config.encrypt_packets
        # The one place the core reads a clock: token expiry is unix time, the caller's is not.
        self.unix_offset = time.time() - time.monotonic() if unix_offset is None else unix_offset
        self.used_tokens = {}
        self.used_token_expiry = []
        self.handshake_rate = self.config.handshake_rate or 0.0
        self.handshake_burst = self.config.handshake_burst
        self.handshake_sources = self.config.handshake_sources
        self.rate_slot_mask = 1
        while self.rate_slot_mask < <uint64_t>self.handshake_sources:
            self.rate_slot_mask <<= 1
        self.rate_slots = NULL
        if self.accept_connections and self.handshake_rate > 0.0:
            self.rate_slots = <RateSlot*>PyMem_Calloc(self.rate_slot_mask, sizeof(RateSlot))
            if self.rate_slots == NULL:
                raise MemoryError()
        self.rate_slot_mask -= 1
        self.handshake_budget_rate = self.config.handshake_budget or 0.0
        # A tenth of a second's worth at once: a burst of joins (a rolling restart) is answered
        # at once, a sustained flood only at the rate.
        self.handshake_budget_burst = max(10.0, self.handshake_budget_rate * 0.1)
        self.handshake_budget_tokens = self.handshake_budget_burst
        self.handshake_budget_at = -1e300         # full at the first handshake
        self.unanswered_filter = NULL
        self.known_addresses = self.known_sessions = NULL
        if self.accept_connections:
            self.known_addresses = <uint16_t*>PyMem_Calloc(KNOWN_SLOTS, sizeof(uint16_t))
            self.known_sessions = <uint16_t*>PyMem_Calloc(KNOWN_SLOTS, sizeof(uint16_t))
            if self.known_addresses == NULL or self.known_sessions == NULL:
                raise MemoryError()
        self.path_challenge_budget = self.config.path_challenge_budget
        self.max_sessions_per_source = self.config.max_sessions_per_source if self.token_keys is None else 0
        self.source_sessions = {}
        self.peer_sources = {}
        self.path_retry_interval = self.config.connect_resend_interval
        self.path_counts = {"challenges_sent": 0, "challenge_bytes": 0, "budget_spent": 0,
                            "migrations": 0}
        self.peer_settings = SharedSettings(self.config)
        self.scratch = <uint8_t*>PyMem_Malloc(self.config.mtu)
        if self.scratch == NULL:
            raise MemoryError()
        cdef int i
        for i in range(DROP_REASON_COUNT):
            self.drop_counts[i] = 0

    def __dealloc__(self):
        PyMem_Free(self.held)
        PyMem_Free(self.group_first)
        PyMem_Free(self.group_last)
        PyMem_Free(self.outbox.data)
        PyMem_Free(self.outbox.items)
        PyMem_Free(self.address_slots)
        PyMem_Free(self.id_slots)
        PyMem_Free(self.scratch)
        PyMem_Free(self.unanswered_filter)
        PyMem_Free(self.known_addresses)
        PyMem_Free(self.known_sessions)
        PyMem_Free(self.rate_slots)
        PyMem_Free(self.due_heap)
        PyMem_Free(self.cell_generations)
        PyMem_Free(self.free_cells)

    # -- public API ------------------------------------------------------------------------

    def connect(self, address, double now, token=None):
        """Start connecting to a server at ``address``; returns the peer id.

        ``token`` (a ConnectToken from the game backend) is required by a server in token mode.
        Messages sent before the handshake completes are queued and go out once connected.
        A PeerConnected or PeerDisconnected("connect_timeout" / "refused:...") event follows.
        """
        if address in self.peers_by_address:
            raise ValueError(f"a peer at {address!r} already exists")
        if token is not None and not isinstance(token, ConnectToken):
            raise TypeError(f"token must be a relay_core.token.ConnectToken, got {type(token).__name__}")
        peer = Peer(self._new_peer_id(), address, self.config, self.events, now, self._random_u32(),
                    self.block_budget, TAG_SIZE if token is not None else 0, token,
                    self.peer_settings)
        peer.sink = self.message_sink
        self.peers_by_address[address] = peer
        self._index(peer)
        self._know(address, 0, 1)
        self.peers[peer.peer_id] = peer
        self._id_index(peer)
        self._touch(peer)
        self.output_pending = True
        return peer.peer_id

    def send(self, int peer_id, int channel, bytes payload):
        """Queue ``payload`` on ``channel`` for a peer.

        Returns False when the peer is gone or the channel's queue is full (``max_pending``).
        Raises ValueError for a channel that does not exist or a payload too large for the
        channel's mode; those are programming errors, not network conditions.
        """
        cdef Peer peer = self.peers.get(peer_id)
        if not 0 <= channel < len(self.size_limits):
            raise ValueError(f"channel {channel} does not exist (0..{len(self.size_limits) - 1})")
        limit, advice = self.size_limits[channel]
        if peer is not None and self.unreliable_channels[channel]:
            limit -= peer.reserve           # the datagram also carries the AEAD tag
        if len(payload) > limit:
            raise ValueError(f"message of {len(payload)} bytes on channel {channel} {advice} "
                             f"({limit} bytes)")
        if peer is None or peer.state >= STATE_DISCONNECTING:
            return False
        self._touch(peer)
        self.output_pending = True
        return peer.queue_message(channel, payload)

    def send_many(self, peer_ids, int channel, bytes payload, double now=-1.0):
        """``send`` of one payload to many peers (a room's frame to its members) in one call.

        Peers that are gone or closing are skipped, as ``send`` would refuse them. Returns the
        ids of connected peers whose channel queue was full (``max_pending``), in order.
        With ``now`` (>= 0), each peer is also flushed at ``now`` right after its message is
        queued, while its state is in cache: what it has to send goes out with the next
        datagrams_to_send or flush_in_place, which do not visit it again.
        """
        cdef Peer peer
        cdef list refused = []
        cdef Outbox* box = NULL
        if now >= 0.0 and self.flushes_in_place:
            box = self._writable_outbox()
        if not 0 <= channel < len(self.size_limits):
            raise ValueError(f"channel {channel} does not exist (0..{len(self.size_limits) - 1})")
        limit, advice = self.size_limits[channel]
        cdef Py_ssize_t largest = limit
        cdef Py_ssize_t size = len(payload)
        cdef bint unreliable = self.unreliable_channels[channel]
        if size > largest:
            raise ValueError(f"message of {size} bytes on channel {channel} {advice} ({largest} bytes)")
        if type(peer_ids) is list and len(<list>peer_ids) <= SEND_MANY_PREFETCH:
            self._prefetch_recipients(<list>peer_ids, channel)
        for peer_id in peer_ids:
            try:
                peer = self._by_id(peer_id)
            except (TypeError, OverflowError):
                peer = self.peers.get(peer_id)      # not a C int: whatever the dict says (None)
            if peer is None or peer.state >= STATE_DISCONNECTING:
                continue
            if unreliable and size > largest - peer.reserve:
                raise ValueError(f"message of {size} bytes on channel {channel} {advice} "
                                 f"({largest - peer.reserve} bytes)")
            if not peer.queue_on(channel, payload) and peer.state == STATE_CONNECTED:
                refused.append(peer_id)
            if now >= 0.0:
                peer.dirty = False      # its entry in the dirty list, if any, is passed over
                self._visit(peer, now, self.control_out, box)
                self.output_pending = True
            else:
                self._touch(peer)
                self.output_pending = True
        return refused

    cdef void _prefetch_recipients(self, list peer_ids, int channel):
        """Every peer of a room is cold when its frame is queued: ask for all of them before the
        first is touched, so their waits for memory overlap instead of adding up -- first each
        peer's lines, then (once they are there) its channel's. The peers found are borrowed
        from the id index and only read; an id that is not a C int is left to send_many."""
        cdef Py_ssize_t i, count = len(peer_ids)
        cdef void* found
        cdef void* probable[SEND_MANY_PREFETCH]
        cdef int ids[SEND_MANY_PREFETCH]
        cdef object item
        for i in range(count):
            probable[i] = NULL
            item = peer_ids[i]
            if type(item) is int and -0x80000000 <= item <= 0x7FFFFFFF:
                ids[i] = item
                found = self.id_slots[ids[i] & self.id_mask]
                if found != NULL:
                    (<Peer>found).prefetch()
                    probable[i] = found
        if channel >= INLINE_CHANNELS:
            return
        for i in range(count):
            found = probable[i]
            if (found != NULL and (<Peer>found).peer_id == ids[i]
                    and channel < (<Peer>found).channel_count):
                prefetch_lines((<Peer>found).channel_at[2 * channel], CHANNEL_HOT_BYTES)

    def send_block(self, int peer_id, bytes data):
        """Queue a large payload for block transfer; False if the peer is gone or too many
        blocks are queued. A BlockDelivered event follows once the peer has all of it."""
        cdef Peer peer = self.peers.get(peer_id)
        if len(data) > self.config.max_block_size:
            raise ValueError(f"block of {len(data)} bytes exceeds max_block_size ({self.config.max_block_size})")
        if peer is None or peer.state >= STATE_DISCONNECTING:
            return False
        self._touch(peer)
        self.output_pending = True
        peer.blocks_busy = True
        return peer.block_out.enqueue(data)

    def disconnect(self, int peer_id, str reason="closed"):
        """Close a connection gracefully: the peer receives DISCONNECT with ``reason``.

        A PeerDisconnected(reason="local:<reason>") event is queued at once.
        """
        if reason not in REASON_CODES:
            raise ValueError(f"unknown reason {reason!r}; allowed: {', '.join(REASON_CODES)}")
        self._run_held()        # what arrived before the call is taken before the DISCONNECT
        cdef Peer peer = self.peers.get(peer_id)
        if peer is None:
            return False
        self._close(peer, "local:" + reason, REASON_CODES[reason])
        return True

    def receive(self, data, address, double now):
        """Process one datagram from ``address``. Never raises for bad input: a datagram that
        cannot be used is counted in ``drops`` under its reason. (``data`` that is not bytes or
        a buffer at all is a programming error: TypeError.)"""
        self._receive(as_datagram(data), address, now)

    def receive_batch(self, list datagrams, double now):
        """``receive`` for each (data, address) of a list (a recvmmsg batch) in one call;
        returns the number of bytes received.

        Established sessions first: the batch's DATA (and everything else) is taken in order,
        its handshakes after it, cookie-carrying CONNECT_RESPONSEs before new CONNECT_REQUESTs,
        so a flood of forged handshakes delays no player's input and spends the handshake
        budget on clients that proved their address first."""
        cdef Py_ssize_t size = 0, index = 0
        cdef tuple item
        cdef bytes datagram
        cdef int ptype
        cdef list responses = None, requests = None
        for item in datagrams:
            # Checked once per datagram, not per byte: the indexing below is unchecked.
            if item is None or len(item) != 2:
                raise ValueError(f"datagrams[{index}] must be a (data, address) tuple, got {item!r:.80}")
            datagram = as_datagram(item[0])
            size += len(datagram)
            ptype = check_prefix(<const uint8_t*><const char*>datagram, len(datagram))
            if ptype == PT_CONNECT_RESPONSE:
                if responses is None:
                    responses = []
                responses.append((datagram, item[1]))
            elif ptype == PT_CONNECT_REQUEST:
                if requests is None:
                    requests = []
                requests.append((datagram, item[1]))
            else:
                self._receive(datagram, item[1], now)
            index += 1
        if responses is not None:
            for item in responses:
                self._receive(<bytes>item[0], item[1], now)
        if requests is not None:
            for item in requests:
                self._receive(<bytes>item[0], item[1], now)
        self.raw_admitted_requests = 0      # all taken (a count left over would skip a charge)
        return size

    cdef void _receive(self, bytes datagram, object address, double now):
        cdef Py_ssize_t n = len(datagram)
        cdef const uint8_t* p = <const uint8_t*><const char*>datagram
        cdef int ptype, rc
        cdef Peer peer
        ptype = check_prefix(p, n)
        if ptype < 0:
            self.drop_counts[-ptype - 1] += 1
            return
        if ptype == PT_DATA:
            if n < DATA_HEADER_SIZE:
                self.drop_counts[DROP_TRUNCATED] += 1
                return
            peer = self.peers_by_address.get(address)
            if peer is None or peer.state != STATE_CONNECTED or read_session_id(p) != peer.session_id:
                if peer is None and self.accept_connections:
                    # Maybe a connected peer whose address changed (NAT rebinding, new network).
                    migrating = self.sessions.get(read_session_id(p))
                    if migrating is not None and (<Peer>migrating).state == STATE_CONNECTED:
                        self._run_held()        # its datagrams from the old address first
                        self._on_data_from_new_address(migrating, p, n, datagram, address, now)
                        self.output_pending = True
                        return
                if peer is None or peer.state != STATE_CONNECTED:
                    self.drop_counts[DROP_UNKNOWN_PEER] += 1
                else:
                    self.drop_counts[DROP_WRONG_SESSION] += 1
                return
            if peer.group >= 0:
                self._hold(peer, p, n, now)
            else:
                self._on_peer_data(peer, p, n, now)
            return
        if ptype == PT_CONNECT_REQUEST:
            self._on_connect_request(p, n, datagram, address, now)
            return
        if ptype == PT_CONNECT_RESPONSE:
            self._on_connect_response(p, n, datagram, address, now)
        else:
            # Path checks and DISCONNECTs may move or end a connection: what a grouped peer
            # sent before them is taken first.
            self._run_held()
            if ptype == PT_PATH_CHALLENGE or ptype == PT_PATH_RESPONSE:
                self._on_path_packet(ptype, p, n, datagram, address, now)
            else:
                self._on_server_reply(ptype, p, n, datagram, address, now)
        peer = self.peers_by_address.get(address)
        if peer is not None:
            self._touch(peer)
        self.output_pending = True          # handshakes and path checks: rare, answered at once

    cdef int _on_peer_data(self, Peer peer, const uint8_t* p, Py_ssize_t n, double now) except -1:
        """DATA from a connected peer at its own address, session id checked."""
        cdef int rc = peer.on_data(p, n, now)
        self._touch(peer)
        if rc < 0:
            self.drop_counts[-rc - 1] += 1
        elif not self.output_pending:
            # An ack that opens the window, a loss to repair, an ack or heartbeat due, a
            # timer expired (see _timer_deadline): out now.
            if peer.wants_send(now) or 0.0 <= peer.scheduled_deadline <= now:
                self.output_pending = True
        return 0

    cdef bint receive_raw(self, const uint8_t* p, Py_ssize_t n, const void* address,
                          double now) except -1:
        """Handle in place, if it is one, a DATA packet from a connected peer's own address
        (``address`` a sockaddr_in or sockaddr_in6, ``p`` a receive buffer): the common case,
        with no Python object made for the datagram or its address. False: anything else (a
        handshake, a new address, a bad packet), which the caller hands to receive_batch as
        (bytes, address) after the rest of its batch -- the order receive_batch keeps anyway."""
        cdef Peer peer
        if n < DATA_HEADER_SIZE or check_prefix(p, n) != PT_DATA:
            return False
        peer = self._indexed(raw_address_key(address))
        if (peer is None or peer.state != STATE_CONNECTED or read_session_id(p) != peer.session_id
                or not same_address(peer.raw_address, address)):
            return False
        if peer.group >= 0:
            self._hold(peer, p, n, now)
        else:
            self._on_peer_data(peer, p, n, now)
        return True

    # -- grouped peers: DATA held for its group's run -------------------------------------------
    #
    # A relay room's players each send a datagram a tick and get one back. Handled as it
    # arrives, each player's state is brought into the cache once for its datagram and again,
    # after thousands of other players, for its room's frame and its flush. Held until its
    # room's turn in the tick (run_group), the datagram is handled, the frame queued and the
    # player flushed (send_many with ``now``) one right after the other, while its state is in
    # cache. A held datagram is taken as of its arrival time, so RTT samples and input timing
    # are as before; whatever may observe or change a peer otherwise (a flush, due timers, a
    # disconnect, a path check, a packet from a new address) first takes everything held.

    cdef int _hold(self, Peer peer, const uint8_t* p, Py_ssize_t n, double now) except -1:
        cdef Py_ssize_t size = (sizeof(HeldDatagram) + n + 7) & ~(<Py_ssize_t>7)
        cdef Py_ssize_t at, capacity
        cdef uint8_t* grown
        cdef HeldDatagram* record
        cdef int group = peer.group
        if self.held_used + size > MAX_HELD_BYTES:
            self._run_held()
        at = self.held_used
        if at + size > self.held_capacity:
            capacity = max(65536, 2 * self.held_capacity, at + size)
            grown = <uint8_t*>PyMem_Realloc(self.held, capacity)
            if grown == NULL:
                raise MemoryError()
            self.held = grown
            self.held_capacity = capacity
        record = <HeldDatagram*>(self.held + at)
        record.next = -1
        record.arrived = now
        record.length = n
        record.peer_id = peer.peer_id
        record.session_id = peer.session_id
        memcpy(self.held + at + sizeof(HeldDatagram), p, n)
        self.held_used = at + size
        if self.group_last[group] < 0:
            self.group_first[group] = at
        else:
            (<HeldDatagram*>(self.held + self.group_last[group])).next = at
        self.group_last[group] = at
        return 0

    def run_group(self, int group):
        """Take the DATA held for ``group`` (bind_sink), each as of its arrival, in arrival
        order. Returns whether events are waiting (next_event) once it is done."""
        if 0 <= group < self.group_capacity and self.group_first[group] >= 0:
            self._run_group(group)
        return len(self.events) > 0

    cdef int _run_group(self, int group) except -1:
        cdef Py_ssize_t at = self.group_first[group]
        cdef HeldDatagram* record
        cdef void* found
        cdef Peer peer
        self.group_first[group] = -1
        self.group_last[group] = -1
        # The group's peers at once (a room's players), so that their waits for memory overlap.
        cdef Py_ssize_t ahead = at
        while ahead >= 0:
            record = <HeldDatagram*>(self.held + ahead)
            found = self.id_slots[record.peer_id & self.id_mask]
            if found != NULL:
                (<Peer>found).prefetch()
            ahead = record.next
        while at >= 0:
            record = <HeldDatagram*>(self.held + at)
            at = record.next
            peer = self._by_id(record.peer_id)
            if peer is None or peer.state != STATE_CONNECTED or peer.session_id != record.session_id:
                continue            # gone, or a new connection with the id since
            self._on_peer_data(peer, <const uint8_t*>record + sizeof(HeldDatagram), record.length,
                               record.arrived)
        return 0

    cdef int _run_held(self) except -1:
        """Take everything held, group by group."""
        cdef int group
        if self.held_used == 0:
            return 0
        for group in range(self.group_capacity):
            if self.group_first[group] >= 0:
                self._run_group(group)
        self.held_used = 0
        return 0

    cdef int _grow_groups(self, int group) except -1:
        cdef int i, capacity = max(64, 2 * group + 2)
        cdef Py_ssize_t* first = <Py_ssize_t*>PyMem_Realloc(self.group_first, capacity * sizeof(Py_ssize_t))
        if first == NULL:
            raise MemoryError()
        self.group_first = first
        cdef Py_ssize_t* last = <Py_ssize_t*>PyMem_Realloc(self.group_last, capacity * sizeof(Py_ssize_t))
        if last == NULL:
            raise MemoryError()
        self.group_last = last
        for i in range(self.group_capacity, capacity):
            self.group_first[i] = -1
            self.group_last[i] = -1
        self.group_capacity = capacity
        return 0

    # -- the address index ------------------------------------------------------------------

    cdef int _index(self, Peer peer) except -1:
        """Put the peer into the address index (it must be in peers_by_address). An address that
        is not an IP address, or whose key another peer holds (IPv6 addresses that differ only in
        their scope), stays out: its DATA takes the Python path."""
        cdef sockaddr_in6* raw = <sockaddr_in6*>peer.raw_address
        cdef uint64_t key
        cdef Py_ssize_t i
        peer.address_key = 0
        memset(raw, 0, sizeof(sockaddr_in6))
        if not to_sockaddr(peer.address, raw):
            return 0
        key = raw_address_key(raw)
        if key == 0 or self._indexed(key) is not None:
            return 0
        if 2 * (self.address_count + 1) > self.address_mask + 1:
            self._grow_index()
        i = <Py_ssize_t>(key & <uint64_t>self.address_mask)
        while self.address_slots[i].key != 0:
            i = (i + 1) & self.address_mask
        self.address_slots[i].key = key
        self.address_slots[i].peer = <void*>peer
        self.address_count += 1
        peer.address_key = key
        return 0

    cdef int _grow_index(self) except -1:
        cdef AddressSlot* old = self.address_slots
        cdef Py_ssize_t old_size = self.address_mask + 1, size = old_size * 2, i, j
        cdef AddressSlot* slots = <AddressSlot*>PyMem_Calloc(size, sizeof(AddressSlot))
        if slots == NULL:
            raise MemoryError()
        for i in range(old_size):
            if old[i].key != 0:
                j = <Py_ssize_t>(old[i].key & <uint64_t>(size - 1))
                while slots[j].key != 0:
                    j = (j + 1) & (size - 1)
                slots[j] = old[i]
        self.address_slots = slots
        self.address_mask = size - 1
        PyMem_Free(old)
        return 0

    cdef void prefetch_slot(self, const void* address) noexcept:
        """Ask for the address-index slot a datagram from ``address`` will be looked up in."""
        cdef uint64_t key = raw_address_key(address)
        if key != 0 and self.address_slots != NULL:
            relay_prefetch(&self.address_slots[key & <uint64_t>self.address_mask])

    cdef void prefetch_sender(self, const void* address, int level) noexcept:
        """Ask for the memory of the connected peer at ``address``, if any, one level at a time,
        each after the one before had time to arrive (the first after ``prefetch_slot``): 0 its
        first line and its address (what receive_raw reads), then for a peer in no group (whose
        datagram is handled at once, not held) 1 its hot lines, 2 what its fields point to
        (channels, packet rings, its sink's context). The peer is borrowed
        from the index, not referenced: a reference would write the peer's first line, a wait
        for memory at the very stage meant to ask for it."""
        cdef void* peer = self._indexed_borrowed(raw_address_key(address))
        if peer == NULL:
            return
        if level == 0:
            # What receive_raw reads: the peer's first line and its address. A grouped peer's
            # datagram is only held: the rest of it is asked for when its group runs.
            relay_prefetch(peer)
            relay_prefetch(<void*>(<Peer>peer).raw_address)
        elif (<Peer>peer).group >= 0:
            return
        elif level == 1:
            (<Peer>peer).prefetch()
        else:
            (<Peer>peer).prefetch_state()

    cdef Peer _indexed(self, uint64_t key):
        """The indexed peer with this key, or None."""
        cdef void* peer = self._indexed_borrowed(key)
        return None if peer == NULL else <Peer>peer

    cdef void* _indexed_borrowed(self, uint64_t key) noexcept:
        """The indexed peer with this key (borrowed: peers_by_address holds it), or NULL."""
        cdef Py_ssize_t i = <Py_ssize_t>(key & <uint64_t>self.address_mask)
        if key == 0:
            return NULL
        while self.address_slots[i].key != 0:
            if self.address_slots[i].key == key:
                return self.address_slots[i].peer
            i = (i + 1) & self.address_mask
        return NULL

    cdef void _unindex(self, Peer peer) noexcept:
        """Take the peer out of the address index (if it is in it), shifting back the entries
        probed past its slot, so no lookup needs a tombstone."""
        cdef Py_ssize_t i, j, home
        cdef Py_ssize_t mask = self.address_mask
        if peer.address_key == 0:
            return
        i = <Py_ssize_t>(peer.address_key & <uint64_t>mask)
        while self.address_slots[i].peer != <void*>peer:
            if self.address_slots[i].key == 0:
                peer.address_key = 0
                return
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            if self.address_slots[j].key == 0:
                break
            home = <Py_ssize_t>(self.address_slots[j].key & <uint64_t>mask)
            if stays_past_hole(home, i, j):
                continue
            self.address_slots[i] = self.address_slots[j]
            i = j
        self.address_slots[i].key = 0
        self.address_slots[i].peer = NULL
        self.address_count -= 1
        peer.address_key = 0

    # -- the id index -----------------------------------------------------------------------

    cdef int _id_index(self, Peer peer) except -1:
        """Put a peer that has just entered ``peers`` into the id index."""
        cdef Py_ssize_t i
        if 2 * (self.id_count + 1) > self.id_mask + 1:
            self._grow_id_index()
        i = peer.peer_id & self.id_mask
        while self.id_slots[i] != NULL:
            i = (i + 1) & self.id_mask
        self.id_slots[i] = <void*>peer
        self.id_count += 1
        return 0

    cdef int _grow_id_index(self) except -1:
        cdef void** old = self.id_slots
        cdef Py_ssize_t old_size = self.id_mask + 1, size = old_size * 2, i, j
        cdef void** slots = <void**>PyMem_Calloc(size, sizeof(void*))
        if slots == NULL:
            raise MemoryError()
        for i in range(old_size):
            if old[i] != NULL:
                j = (<Peer>old[i]).peer_id & (size - 1)
                while slots[j] != NULL:
                    j = (j + 1) & (size - 1)
                slots[j] = old[i]
        self.id_slots = slots
        self.id_mask = size - 1
        PyMem_Free(old)
        return 0

    cdef Peer _by_id(self, int peer_id):
        """The peer with this id, or None (what ``peers.get`` answers, from C slots)."""
        cdef Py_ssize_t i = peer_id & self.id_mask
        while self.id_slots[i] != NULL:
            if (<Peer>self.id_slots[i]).peer_id == peer_id:
                return <Peer>self.id_slots[i]
            i = (i + 1) & self.id_mask
        return None

    cdef void _id_unindex(self, Peer peer) noexcept:
        """Take a peer that has just left ``peers`` out of the id index, shifting back the
        entries probed past its slot (no tombstones), as ``_unindex`` does."""
        cdef Py_ssize_t i, j, home
        cdef Py_ssize_t mask = self.id_mask
        i = peer.peer_id & mask
        while self.id_slots[i] != <void*>peer:
            if self.id_slots[i] == NULL:
                return
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            if self.id_slots[j] == NULL:
                break
            home = (<Peer>self.id_slots[j]).peer_id & mask
            if stays_past_hole(home, i, j):
                continue
            self.id_slots[i] = self.id_slots[j]
            i = j
        self.id_slots[i] = NULL
        self.id_count -= 1

    @property
    def output_due(self):
        """Whether ``datagrams_to_send`` may have something to send right now: a reply, a
        closing peer, a send, block or connect queued, or a received datagram that left its peer
        with something due (an ack that opens the window, a loss to repair, an ack or heartbeat
        due, an expired timer).

        False means every peer touched since the last ``datagrams_to_send`` has work only later.
        A caller may then skip the call, but must make it within its own bound (the relay
        server: every tick), because those peers' new deadlines enter ``next_timeout`` only when
        ``datagrams_to_send`` visits them."""
        return self.output_pending or bool(self.control_out) or bool(self.closing)

    def datagrams_to_send(self, double now):
        """Everything due at ``now``, as a list of (bytes, address). Runs due timers first."""
        return self._flush(now, NULL)

    cdef list flush_in_place(self, double now):
        """datagrams_to_send, with the DATA of peers in the address index written into the
        outbox (``outbox``: its datagrams and their sockaddrs, valid until the next call) for
        sendmmsg to take from there; returns the rest (handshake replies, DISCONNECTs, peers at
        other addresses) as (bytes, address), which go out first."""
        cdef Outbox* box = self._writable_outbox()
        self.flushes_in_place = True
        cdef list out = self._flush(now, box)
        self.outbox_handed_out = True
        return out

    cdef Outbox* _writable_outbox(self) noexcept:
        """The outbox to write DATA into: emptied first if its DATA went to flush_in_place's
        caller since, else kept (send_many with ``now`` wrote in it since that flush)."""
        if self.outbox_handed_out:
            self.outbox.used = 0
            self.outbox.count = 0
            self.outbox_handed_out = False
        return &self.outbox

    cdef list _flush(self, double now, Outbox* box):
        self._run_held()
        cdef list out = self.control_out
        cdef Peer peer
        self.control_out = []
        self.output_pending = False
        for peer in self.closing:
            peer.flush(now, self.scratch, out, box)
        self.closing.clear()
        cdef list due = self._due_peers(now)
        cdef Py_ssize_t i, count = len(due)
        for i in range(count):
            # Each peer is cold by now: ask for the memory of the next ones while visiting this,
            # each level once the one it points from had time to arrive.
            if i + 3 < count:
                (<Peer>due[i + 3]).prefetch()
            if i + 2 < count:
                (<Peer>due[i + 2]).prefetch_state()
            if i + 1 < count:
                (<Peer>due[i + 1]).prefetch_windows()
            self._visit(<Peer>due[i], now, out, box)
        return out


    cdef int _visit(self, Peer peer, double now, list out, Outbox* box) except -1:
        """Run the peer's due timers, then flush it and schedule its next visit."""
        if 0.0 <= self._timer_deadline(peer) <= now and self._run_timers(peer, now):
            peer.flush(now, self.scratch, out, box)     # the DISCONNECT it just queued
            return 0
        peer.flush(now, self.scratch, out, box)
        self._schedule(peer)
        return 0

    def handle_timeout(self, double now):
        """Run every timer due at ``now`` (timeouts, RTO expiries, mode changes)."""
        cdef Peer peer
        self._run_held()
        for peer in self._due_peers(now):
            if 0.0 <= self._timer_deadline(peer) <= now and self._run_timers(peer, now):
                continue
            self._touch(peer)        # the next datagrams_to_send flushes it
            self.output_pending = True

    def next_timeout(self):
        """The earliest time something is due, or None when there is nothing to wait for."""
        cdef Peer peer
        if self.control_out or self.closing or self.dirty:
            return 0.0
        while self.due_count:
            if self._live(&self.due_heap[0]):
                return self.due_heap[0].deadline
            self._due_pop()                     # superseded, or the peer is gone
        return None

    cdef list _due_peers(self, double now):
        """Peers touched since their last flush, and peers whose scheduled deadline has come,
        each once, in that order. A list of Peers with a flag each, not a set of ids: no
        hashing and no lookup per player per tick."""
        cdef list peers = self.dirty
        cdef DueEntry entry
        cdef Peer peer
        cdef double deadline
        self.dirty = []
        while self.due_count and self.due_heap[0].deadline <= now:
            entry = self._due_pop()
            if not self._live(&entry):
                continue                        # superseded, or the peer is gone
            peer = <Peer>entry.peer
            peer.queued_deadline = -1.0
            if not peer.dirty:
                deadline = peer.next_deadline()
                if deadline > now:
                    # What was due is gone (an ack retired the message whose RTO it was): no
                    # visit, only a new entry for what is due next.
                    self._schedule_at(peer, deadline)
                    continue
                peer.dirty = True
                peers.append(peer)
        # One pass clears the flags and drops closed peers (removed from self.peers, flushed
        # through self.closing) in place, asking a few peers ahead for each one's first line:
        # no second list, so no reference taken and dropped per peer.
        cdef Py_ssize_t i, kept = 0, count = len(peers)
        for i in range(count):
            if i + DUE_PREFETCH_AHEAD < count:
                relay_prefetch(<void*>peers[i + DUE_PREFETCH_AHEAD])
            peer = <Peer>peers[i]
            if not peer.dirty:
                continue                # flushed since it was listed (send_many with now)
            peer.dirty = False
            if peer.state < STATE_DISCONNECTING:
                if kept != i:
                    peers[kept] = peer
                kept += 1
        if kept != count:
            del peers[kept:]
        return peers

    cdef void _schedule(self, Peer peer):
        self._schedule_at(peer, peer.next_deadline())

    cdef void _schedule_at(self, Peer peer, double deadline):
        """_schedule with the peer's next_deadline() already at hand."""
        peer.scheduled_deadline = deadline
        if deadline < 0.0 or deadline == peer.queued_deadline or peer.removed:
            # Nothing is due (a live entry's visit, early at worst, reschedules it), or the live
            # entry is for this very time.
            return
        # A live entry for an earlier time is superseded: left in place, it would wake the loop
        # between ticks to revisit, cold, every peer whose RTO an ack retired since its flush.
        # Superseded entries are dropped as they surface (next_timeout, right after the flush
        # that superseded them), or swept once they are many.
        if peer.schedule_cell < 0:
            peer.schedule_cell = self._take_cell()
        self.cell_generations[peer.schedule_cell] += 1
        peer.queued_deadline = deadline
        self._due_push(deadline, peer)
        if self.due_count > 2 * len(self.peers) + 1024:
            self._sweep_heap()

    cdef int _due_push(self, double deadline, Peer peer) except -1:
        cdef Py_ssize_t i, parent, capacity
        cdef DueEntry* grown
        cdef DueEntry entry
        if self.due_count == self.due_capacity:
            capacity = max(256, 2 * self.due_capacity)
            grown = <DueEntry*>PyMem_Realloc(self.due_heap, capacity * sizeof(DueEntry))
            if grown == NULL:
                raise MemoryError()
            self.due_heap = grown
            self.due_capacity = capacity
        entry.deadline = deadline
        entry.peer_id = peer.peer_id
        entry.peer = <void*>peer
        entry.cell = <uint32_t>peer.schedule_cell
        entry.generation = self.cell_generations[peer.schedule_cell]
        i = self.due_count
        self.due_count += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not due_before(&entry, &self.due_heap[parent]):
                break
            self.due_heap[i] = self.due_heap[parent]
            i = parent
        self.due_heap[i] = entry
        return 0

    cdef Py_ssize_t _take_cell(self) except -1:
        """A schedule cell for a peer: one a departed peer left, or a new one. A cell's
        generation only grows, so no entry of its former peer is ever live again."""
        cdef Py_ssize_t capacity
        cdef uint64_t* generations
        cdef uint32_t* free_cells
        if self.free_cell_count:
            self.free_cell_count -= 1
            return self.free_cells[self.free_cell_count]
        if self.cell_count == self.cell_capacity:
            capacity = max(256, 2 * self.cell_capacity)
            generations = <uint64_t*>PyMem_Realloc(self.cell_generations, capacity * sizeof(uint64_t))
            if generations == NULL:
                raise MemoryError()
            self.cell_generations = generations
            free_cells = <uint32_t*>PyMem_Realloc(self.free_cells, capacity * sizeof(uint32_t))
            if free_cells == NULL:
                raise MemoryError()
            self.free_cells = free_cells
            self.cell_capacity = capacity
        self.cell_generations[self.cell_count] = 0
        self.cell_count += 1
        return self.cell_count - 1

    cdef void _retire(self, Peer peer):
        """A peer leaves ``peers``: its heap entries are void from now on (its cell moves on a
        generation and goes to the next peer). Once departed peers are a good share of the
        heap, their entries go at once."""
        peer.removed = True
        peer.sink_context = None        # it delivers nothing more; its context may be large
        if peer.schedule_cell >= 0:
            self.cell_generations[peer.schedule_cell] += 1
            self.free_cells[self.free_cell_count] = <uint32_t>peer.schedule_cell
            self.free_cell_count += 1
            peer.schedule_cell = -1
            self.left_since_sweep += 1
            if self.left_since_sweep >= 64 + self.due_count // 8:
                self._sweep_heap()

    cdef void _sweep_heap(self):
        """Keep only the live entries (a present peer's current one)."""
        cdef Py_ssize_t i, kept = 0
        for i in range(self.due_count):
            if self._live(&self.due_heap[i]):
                self.due_heap[kept] = self.due_heap[i]
                kept += 1
        self.due_count = kept
        for i in range(kept // 2 - 1, -1, -1):
            self._due_sift_down(i)
        self.left_since_sweep = 0

    cdef void _due_sift_down(self, Py_ssize_t i) noexcept:
        cdef DueEntry entry = self.due_heap[i]
        cdef Py_ssize_t child, n = self.due_count
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and due_before(&self.due_heap[child + 1], &self.due_heap[child]):
                child += 1
            if not due_before(&self.due_heap[child], &entry):
                break
            self.due_heap[i] = self.due_heap[child]
            i = child
        self.due_heap[i] = entry

    cdef DueEntry _due_pop(self) noexcept:
        """Remove and return the earliest entry (the heap must not be empty)."""
        cdef DueEntry top = self.due_heap[0]
        self.due_count -= 1
        if self.due_count:
            self.due_heap[0] = self.due_heap[self.due_count]
            self._due_sift_down(0)
        if self.due_capacity > 4096 and self.due_count < self.due_capacity // 8:
            self._due_shrink()
        return top

    cdef void _due_shrink(self) noexcept:
        cdef Py_ssize_t capacity = self.due_capacity // 2
        cdef DueEntry* smaller = <DueEntry*>PyMem_Realloc(self.due_heap, capacity * sizeof(DueEntry))
        if smaller != NULL:
            self.due_heap = smaller
            self.due_capacity = capacity

    def bind_sink(self, int peer_id, context, int group=-1):
        """Hand ``context`` with each of this peer's messages to the sink's ``take_bound``
        (``None``: to ``take`` again), and hold its DATA for ``run_group(group)`` (-1: take it
        as it arrives). The owner runs every group at least once per tick: anything else that
        flushes the endpoint or runs its timers takes what is held first. False when there is
        no such peer."""
        if group < -1:
            raise ValueError(f"group must be -1 or a group number, got {group}")
        cdef Peer peer = self.peers.get(peer_id)
        if peer is None:
            return False
        if group != peer.group:
            self._run_held()            # what it sent so far is taken under its old group
            if group >= self.group_capacity:
                self._grow_groups(group)
            peer.group = group
        peer.sink_context = context
        return True

    def set_message_sink(self, sink):
        """Hand one channel's messages to ``sink`` (a relay_core.MessageSink) as they are
        delivered, instead of queueing them as MessageReceived events, whenever the event queue
        is empty; what the sink declines is queued as usual. ``None`` removes it."""
        if sink is not None:
            if not isinstance(sink, MessageSink):
                raise TypeError(f"sink must be a relay_core.MessageSink, got {type(sink).__name__}")
            if not 0 <= (<MessageSink>sink).channel < len(self.config.channels):
                raise ValueError(f"sink channel {(<MessageSink>sink).channel} is not configured")
        self.message_sink = sink
        for peer in self.peers.values():
            (<Peer>peer).sink = sink

    def next_event(self):
        """The oldest undelivered event, or None."""
        return self.events.popleft() if self.events else None

    def traffic_totals(self):
        """Totals over every peer this endpoint has had, the closed ones included (so they
        only grow): ``resends``, ``spurious_resends`` and ``redundant_bytes``. One pass in C,
        for periodic metrics."""
        cdef uint64_t resends = self.closed_resends, redundant = self.closed_redundant_bytes
        cdef uint64_t spurious = self.closed_spurious_resends
        cdef Peer peer
        cdef SendChannel channel
        for peer in self.peers.values():
            for channel in peer.send_channels:
                resends += channel.resends
                spurious += channel.spurious_resends
                redundant += channel.redundant_bytes
        return {"resends": resends, "spurious_resends": spurious, "redundant_bytes": redundant}

    def redundancy_counts(self):
        """Connected peers by redundancy mode (PeerStats.redundancy_mode: the controller's four,
        and "always" for that policy), for periodic metrics."""
        cdef Py_ssize_t counts[LINK_MODES + 1]
        cdef Peer peer
        cdef int i
        for i in range(LINK_MODES + 1):
            counts[i] = 0
        for peer in self.peers.values():
            if peer.state == STATE_CONNECTED:
                counts[peer.link.mode if peer.settings.s.adaptive else LINK_MODES] += 1
        out = {name: counts[i] for i, name in enumerate(MODE_NAMES)}
        out["always"] = counts[LINK_MODES]
        return out

    def link_samples(self):
        """(smoothed RTTs of the connected peers that have a sample, mean loss estimate over
        the connected peers): what the periodic RTT and loss metrics need, without a PeerStats
        per peer."""
        cdef list rtts = []
        cdef double loss = 0.0
        cdef Py_ssize_t connected = 0
        cdef Peer peer
        for peer in self.peers.values():
            if peer.state != STATE_CONNECTED:
                continue
            connected += 1
            loss += peer.loss
            if peer.rtt.has_sample and peer.rtt.srtt > 0.0:
                rtts.append(peer.rtt.srtt)
        return rtts, (loss / connected if connected else 0.0)

    def peer_stats(self, int peer_id):
        cdef Peer peer = self.peers[peer_id]
        return PeerStats(**peer.stats_fields())

    def channel_snapshot(self, int peer_id, int channel):
        """A reliable channel's send window, for tests and debugging."""
        cdef Peer peer = self.peers[peer_id]
        if not 0 <= channel < len(self.size_limits):
            raise IndexError(f"channel {channel} does not exist (0..{len(self.size_limits) - 1})")
        return peer.channel_snapshot(channel)

    def indexed_peer(self, address):
        """The id of the peer whose DATA from ``address`` receive_raw would take in place (the
        address index's entry for it), or None: for tests and diagnostics."""
        cdef Peer peer = self._indexed(address_key(address))
        return peer.peer_id if peer is not None else None

    def peer_address(self, int peer_id):
        return (<Peer>self.peers[peer_id]).address

    def peer_state(self, int peer_id):
        """A peer's connection state (docs/PROTOCOL.md, section 9): "connecting", "challenged"
        or "connected". A closed peer has left the endpoint: KeyError, as for any unknown id."""
        return STATE_NAMES[(<Peer>self.peers[peer_id]).state]

    def is_connected(self, int peer_id):
        cdef Peer peer = self.peers.get(peer_id)
        return peer is not None and peer.state == STATE_CONNECTED

    def peer_claims(self, int peer_id):
        """Server in token mode: the TokenClaims the peer connected with (None otherwise)."""
        return (<Peer>self.peers[peer_id]).claims

    def session_info(self, int peer_id):
        """Packet protection state of a connection, for tests and debugging."""
        cdef Peer peer = self.peers[peer_id]
        return {"encrypted": bool(peer.sealed), "send_counter": peer.send_counter,
                "receive_counter": peer.recv_counter if peer.has_recv_counter else None,
                "tag_reserve": peer.reserve}

    @property
    def peer_ids(self):
        return list(self.peers)

    @property
    def schedule_sizes(self):
        """The flush schedule's size: heap entries (live or superseded), schedule cells handed
        out, and the free ones among them (left by departed peers, for the next ones)."""
        return {"entries": self.due_count, "cells": self.cell_count,
                "free_cells": self.free_cell_count}

    @property
    def peer_count(self):
        return len(self.peers)

    @property
    def receive_memory(self):
        """Bytes held for peers before delivery (fragments, out-of-order messages, block
        buffers, with their bookkeeping) against ``receive_memory_limit``; ``blocks`` is the
        block bytes among them, against ``block_memory_limit``."""
        return {"used": self.receive_budget.used, "limit": self.receive_budget.limit,
                "blocks": self.block_budget.used, "blocks_limit": self.block_budget.limit}

    @property
    def drops(self):
        """Dropped datagrams (or datagram tails) by reason; only non-zero reasons appear."""
        return {DROP_REASONS[i]: self.drop_counts[i] for i in range(DROP_REASON_COUNT)
                if self.drop_counts[i]}

    @property
    def path_stats(self):
        """Address migration (server): PATH_CHALLENGEs sent and their bytes, challenges not sent
        because a new address's budget was spent, and completed migrations."""
        return dict(self.path_counts)

    @property
    def refusals(self):
        """Connections refused by this server, by reason."""
        return dict(self.refusal_counts)

    # -- handshake -------------------------------------------------------------------------

    cdef bytes _cookie_mac(self, object address, uint32_t connect_id, uint32_t cookie_time, bytes token):
        # The token is bound into the cookie: the CONNECT_RESPONSE must carry the same one.
        cdef bytes head = (repr(address).encode() + connect_id.to_bytes(4, "little")
                           + cookie_time.to_bytes(4, "little"))
        cdef uint8_t mac[COOKIE_MAC_SIZE]
        blake2s_mac(mac, COOKIE_MAC_SIZE, <const uint8_t*><const char*>self.cookie_key, len(self.cookie_key),
                    <const uint8_t*><const char*>head, len(head), <const uint8_t*><const char*>token, len(token))
        return (<char*>mac)[:COOKIE_MAC_SIZE]

    cdef bint _raw_cookie_is_bad(self, const uint8_t* p, Py_ssize_t n, const void* address) noexcept:
        """Whether a CONNECT_RESPONSE read from ``address`` (a sockaddr) carries a cookie this
        endpoint did not make: the same MAC as _cookie_mac, over the repr() the transport's
        address tuple would have. False when it cannot tell (the Python path decides)."""
        cdef CookiePacket response
        cdef char head[128]
        cdef uint8_t mac[COOKIE_MAC_SIZE]
        cdef Py_ssize_t length
        cdef uint8_t difference = 0
        cdef int i
        if decode_connect_response(p, n, &response) < 0:
            return False
        length = raw_address_repr(address, head, sizeof(head) - 8)
        if length <= 0:
            return False
        write_u32(<uint8_t*>head + length, response.connect_id)
        write_u32(<uint8_t*>head + length + 4, response.cookie_time)
        blake2s_mac(mac, COOKIE_MAC_SIZE, <const uint8_t*><const char*>self.cookie_key, 32,
                    <const uint8_t*>head, length + 8, p + response.token_offset, response.token_length)
        for i in range(COOKIE_MAC_SIZE):
            difference |= mac[i] ^ response.cookie_mac[i]
        return difference != 0

    cdef bint _over_handshake_rate(self, uint64_t source, double now) noexcept:
        """Charge one handshake packet to ``source``'s bucket (a rate_source, or an address_key
        for cookie-verified responses); True when it is empty (counted as rate_limited)."""
        cdef RateSlot* slot
        if self.rate_slots == NULL or source == 0:
            return False
        slot = &self.rate_slots[mix64(source) & self.rate_slot_mask]
        if slot.key != source:
            slot.key = source
            slot.tokens = self.handshake_burst
        elif now > slot.at:
            slot.tokens = min(self.handshake_burst, slot.tokens + (now - slot.at) * self.handshake_rate)
        slot.at = now
        if slot.tokens >= 1.0:
            slot.tokens -= 1.0
            return False
        self.drop_counts[DROP_RATE_LIMITED] += 1
        return True

    cdef void _know(self, object address, uint32_t session_id, int delta):
        """Counts an address (not None) and a session id (not 0) in or out of the filters that
        admit_raw consults. A counter that saturates stays there: a false "known" only sends a
        datagram the Python way."""
        cdef uint16_t* slot
        if self.known_addresses == NULL:
            return
        if address is not None:
            slot = &self.known_addresses[address_key(address) % KNOWN_SLOTS]
            if slot[0] != 0xFFFF and (delta > 0 or slot[0] > 0):
                slot[0] += delta
        if session_id != 0:
            slot = &self.known_sessions[mix64(session_id) % KNOWN_SLOTS]
            if slot[0] != 0xFFFF and (delta > 0 or slot[0] > 0):
                slot[0] += delta

    cdef int admit_raw(self, const uint8_t* p, Py_ssize_t n, const void* address, double now) noexcept:
        """Whether a datagram just read (``address`` a sockaddr_in or sockaddr_in6) is worth its
        Python objects: 0 when it is dropped here, counted under its reason. Only certain cases
        are: a bad prefix, DATA whose address and session id are both unknown (a false hit of
        the filters lets one through, to be dropped the usual way), and a fresh CONNECT_REQUEST
        the handshake budget has no room for, or from a source over its rate (remembered, so
        its resend is not fresh). A request let through is charged here, and receive_batch does
        not charge it again. A client endpoint admits everything."""
        cdef int ptype
        cdef uint64_t key
        cdef ConnectRequest request
        if self.known_addresses == NULL:
            return 1
        ptype = check_prefix(p, n)
        if ptype < 0:
            self.drop_counts[-ptype - 1] += 1
            return 0
        if ptype == PT_DATA:
            if n < DATA_HEADER_SIZE:
                return 1
            key = raw_address_key(address)
            if (key != 0 and self.known_addresses[key % KNOWN_SLOTS] == 0
                    and self.known_sessions[mix64(read_session_id(p)) % KNOWN_SLOTS] == 0):
                self.drop_counts[DROP_UNKNOWN_PEER] += 1
                return 0
            return 1
        if ptype == PT_CONNECT_RESPONSE and self.accept_connections:
            if self._raw_cookie_is_bad(p, n, address):
                self.drop_counts[DROP_BAD_COOKIE] += 1
                return 0
            return 1
        if ptype != PT_CONNECT_REQUEST:
            return self._admit_raw_reply(ptype, p, n, address)
        if not self.accept_connections:
            return 1
        key = raw_address_key(address)
        if key == 0 or decode_connect_request(p, n, &request) < 0:
            return 1
        if not self._admit_request(key, raw_rate_source(address), request.connect_id, now):
            return 0
        self.raw_admitted_requests += 1         # charged: receive_batch does not charge it again
        return 1

    cdef int _admit_raw_reply(self, int ptype, const uint8_t* p, Py_ssize_t n, const void* address) noexcept:
        """admit_raw for the other packet types (CHALLENGE, ACCEPT, REFUSE and DISCONNECT, and
        PATH_CHALLENGE / PATH_RESPONSE): a malformed one, or one for a peer neither filter knows,
        is dropped here under the reason the Python path would count."""
        cdef CookiePacket cookie
        cdef AcceptPacket accept
        cdef RefusePacket refuse
        cdef SessionPacket session
        cdef int status
        cdef uint64_t key = raw_address_key(address)
        cdef bint known
        if key == 0:
            return 1
        if ptype == PT_PATH_CHALLENGE or ptype == PT_PATH_RESPONSE:
            status = decode_path_packet(p, n, &session)
        elif ptype == PT_CHALLENGE:
            status = decode_challenge(p, n, &cookie)
        elif ptype == PT_ACCEPT:
            status = decode_accept(p, n, &accept)
        elif ptype == PT_REFUSE:
            status = decode_refuse(p, n, &refuse)
        elif ptype == PT_DISCONNECT:
            status = decode_disconnect(p, n, &session)
        else:
            return 1
        if status < 0:
            self.drop_counts[-status - 1] += 1
            return 0
        if ptype == PT_PATH_RESPONSE:       # its peer is found by session id (it comes from a new address)
            known = self.known_sessions[mix64(session.session_id) % KNOWN_SLOTS] != 0
        else:
            known = self.known_addresses[key % KNOWN_SLOTS] != 0
        if not known:
            self.drop_counts[DROP_UNKNOWN_PEER] += 1
            return 0
        return 1

    cdef bint _admit_request(self, uint64_t address, uint64_t source, uint32_t connect_id, double now) noexcept:
        """Whether a CONNECT_REQUEST may be answered: charged to its source's bucket and the
        handshake budget (a refusal is counted and remembered). A resend of a request left
        unanswered (same address, same connect id) is charged to a second bucket of its source
        that only resends draw on, and may use the budget's reserve: whoever forges the
        client's IP with requests of its own (new ports, new connect ids) empties the first
        bucket, not the second, and the client's resend is answered."""
        cdef uint64_t fingerprint = request_fingerprint(address, connect_id)
        cdef bint resend = self._was_left_unanswered(fingerprint, now)
        if (self._over_handshake_rate(source ^ RESEND_KEY_TAG if resend else source, now)
                or not self._take_handshake_budget(now, not resend)):
            self._leave_unanswered(fingerprint, now)
            return False
        return True

    cdef bint _take_handshake_budget(self, double now, bint fresh) noexcept:
        """One answer from the global handshake budget; a fresh request may not take the last
        FRESH_RESERVE of the burst, which is kept for resends and verified responses."""
        if self.handshake_budget_rate <= 0.0:
            return True
        if now > self.handshake_budget_at:
            self.handshake_budget_tokens = min(
                self.handshake_budget_burst,
                self.handshake_budget_tokens + (now - self.handshake_budget_at) * self.handshake_budget_rate)
            self.handshake_budget_at = now
        if self.handshake_budget_tokens - 1.0 < (FRESH_RESERVE * self.handshake_budget_burst if fresh else 0.0):
            self.drop_counts[DROP_HANDSHAKE_BUDGET] += 1
            return False
        self.handshake_budget_tokens -= 1.0
        return True

    cdef bint _was_left_unanswered(self, uint64_t fingerprint, double now):
        """Whether a request with this fingerprint was dropped unanswered 0.25-0.5 s ago or
        less: a client's resend, which a forger from random sources or ports does not make."""
        cdef uint64_t bit
        cdef uint64_t* current
        if self.unanswered_filter == NULL:
            return False
        if now - self.unanswered_rotated_at >= UNANSWERED_GENERATION:
            # The older half is forgotten and becomes the current one.
            self.unanswered_generation ^= 1
            memset(self.unanswered_filter + self.unanswered_generation * UNANSWERED_WORDS, 0,
                   UNANSWERED_WORDS * sizeof(uint64_t))
            if now - self.unanswered_rotated_at >= 2 * UNANSWERED_GENERATION:
                memset(self.unanswered_filter, 0, 2 * UNANSWERED_WORDS * sizeof(uint64_t))
            self.unanswered_rotated_at = now
        bit = <uint64_t>fingerprint % (UNANSWERED_WORDS * 64)
        current = self.unanswered_filter
        return ((current[bit >> 6] | current[UNANSWERED_WORDS + (bit >> 6)]) >> (bit & 63)) & 1

    cdef void _leave_unanswered(self, uint64_t fingerprint, double now):
        cdef uint64_t bit
        if self.unanswered_filter == NULL:
            self.unanswered_filter = <uint64_t*>PyMem_Calloc(2 * UNANSWERED_WORDS, sizeof(uint64_t))
            if self.unanswered_filter == NULL:
                return              # out of memory: resends are then just fresh requests
            self.unanswered_rotated_at = now
        bit = <uint64_t>fingerprint % (UNANSWERED_WORDS * 64)
        self.unanswered_filter[self.unanswered_generation * UNANSWERED_WORDS + (bit >> 6)] |= (
            <uint64_t>1) << (bit & 63)

    cdef void _refuse(self, uint32_t connect_id, str reason, object address):
        self.refusal_counts[reason] = self.refusal_counts.get(reason, 0) + 1
        self.control_out.append((make_refuse(connect_id, REASON_CODES[reason]), address))

    cdef void _on_connect_request(self, const uint8_t* p, Py_ssize_t n, bytes datagram, object address,
                                  double now):
        cdef ConnectRequest request
        cdef uint32_t connect_id, cookie_time
        cdef int status
        if not self.accept_connections:
            self.drop_counts[DROP_NOT_ACCEPTING] += 1
            return
        status = decode_connect_request(p, n, &request)
        if status < 0:
            self.drop_counts[-status - 1] += 1
            return
        connect_id = request.connect_id
        if self.raw_admitted_requests > 0:
            self.raw_admitted_requests -= 1     # admit_raw charged it when it was read
        elif not self._admit_request(address_key(address), rate_source(address), connect_id, now):
            return
        # A mode mismatch is answered at once (REFUSE is 9 bytes, smaller than any request).
        if request.token_format == TOKEN_FORMAT_NONE and self.token_keys is not None:
            self._refuse(connect_id, "token_required", address)
            return
        if request.token_format != TOKEN_FORMAT_NONE and self.token_keys is None:
            self._refuse(connect_id, "token_unsupported", address)
            return
        token = datagram[request.token_offset:request.token_offset + request.token_length]
        cookie_time = time_ms32(now)
        self.control_out.append((make_challenge(connect_id, cookie_time,
                                                self._cookie_mac(address, connect_id, cookie_time, token)),
                                 address))

    cdef void _on_connect_response(self, const uint8_t* p, Py_ssize_t n, bytes datagram, object address,
                                   double now):
        cdef CookiePacket response
        cdef uint32_t connect_id, cookie_time, session_id
        cdef int status
        cdef double unix_now
        cdef Peer peer, existing
        if not self.accept_connections:
            self.drop_counts[DROP_NOT_ACCEPTING] += 1
            return
        status = decode_connect_response(p, n, &response)
        if status < 0:
            self.drop_counts[-status - 1] += 1
            return
        connect_id = response.connect_id
        cookie_time = response.cookie_time
        token = datagram[response.token_offset:response.token_offset + response.token_length]
        mac = (<char*>response.cookie_mac)[:COOKIE_MAC_SIZE]
        if not hmac.compare_digest(mac, self._cookie_mac(address, connect_id, cookie_time, token)):
            self.drop_counts[DROP_BAD_COOKIE] += 1
            return
        if <uint32_t>(time_ms32(now) - cookie_time) > self.cookie_lifetime_ms:
            self.drop_counts[DROP_EXPIRED_COOKIE] += 1
            return
        # Verified: the sender receives at this address. Its bucket is the address's own (IP and
        # port), which no one forging the IP can drain; the global budget still bounds them all.
        if (self._over_handshake_rate(address_key(address) ^ VERIFIED_KEY_TAG, now)
                or not self._take_handshake_budget(now, False)):
            return
        if not token and self.token_keys is not None:
            self._refuse(connect_id, "token_required", address)
            return
        if token and self.token_keys is None:
            self._refuse(connect_id, "token_unsupported", address)
            return
        existing = self.peers_by_address.get(address)
        if existing is not None and existing.connect_id == connect_id and existing.token_private == (token or None):
            # Our ACCEPT was lost and the client asks again: same answer, no new peer. (Its
            # token is already used -- by this very connection.)
            self.control_out.append((existing.accept_packet, address))
            return
        claims = None
        if token:
            # Only now, with the return route verified, is the token worth decrypting.
            unix_now = now + self.unix_offset
            try:
                claims = open_token(self.token_keys, token, unix_now)
            except TokenError as error:
                self._refuse(connect_id, error.reason, address)
                return
            # The tag proves the sender holds the token's client key: someone who merely saw
            # the token on the wire cannot spend it.
            try:
                aead_open_bytes(claims.client_key, make_nonce(PT_CONNECT_RESPONSE, connect_id),
                                datagram[response.tag_offset:], datagram[:response.tag_offset])
            except AeadError:
                self.drop_counts[DROP_AUTH_FAILED] += 1
                return
            self._forget_expired_tokens(unix_now)
            if claims.token_id in self.used_tokens:
                self._refuse(connect_id, "token_used", address)
                return
        if existing is not None:
            # The client at this address restarted: the old session is over. No DISCONNECT:
            # it would go to the new client, and the reply must stay smaller than the request.
            self._close(existing, "replaced", -1)
        if len(self.peers) >= self.max_peers:
            self._refuse(connect_id, "server_full", address)        # the token stays unused
            return
        source = None
        if self.max_sessions_per_source > 0:
            # Open mode: one source must not hold every peer slot with bare connections.
            source = source_key(address)
            if self.source_sessions.get(source, 0) >= self.max_sessions_per_source:
                self._refuse(connect_id, "source_session_limit", address)
                return
        encrypted = claims is not None and self.encrypt_packets
        peer = Peer(self._new_peer_id(), address, self.config, self.events, now, connect_id,
                    self.block_budget, TAG_SIZE if encrypted else 0, None, self.peer_settings)
        peer.sink = self.message_sink
        session_id = self._random_u32()
        while session_id in self.sessions:          # the session id alone finds a migrating peer
            session_id = self._random_u32()
        if claims is None:
            accept = make_accept(connect_id, session_id, self.ack_delay_ms, -1)
        else:
            self.used_tokens[claims.token_id] = claims.expires
            heapq.heappush(self.used_token_expiry, (claims.expires, claims.token_id))
            accept = make_accept(connect_id, session_id, self.ack_delay_ms,
                                 ACCEPT_FLAG_ENCRYPTED if encrypted else 0)
            accept += aead_seal_bytes(claims.server_key, make_nonce(PT_ACCEPT, connect_id), b"", accept)
            if encrypted:
                peer.protect(claims.server_key, claims.client_key)
        self.peers_by_address[address] = peer
        self._index(peer)
        self.peers[peer.peer_id] = peer
        self._id_index(peer)
        self.sessions[session_id] = peer
        self._know(address, session_id, 1)
        if source is not None:
            self.peer_sources[peer.peer_id] = source
            self.source_sessions[source] = self.source_sessions.get(source, 0) + 1
        peer.admit(session_id, accept, claims, token or None, now, response.ack_delay_ms / 1000.0)
        self.control_out.append((accept, address))

    cdef void _forget_expired_tokens(self, double unix_now):
        # An expired token is refused as expired anyway; its id need not be remembered.
        while self.used_token_expiry and self.used_token_expiry[0][0] <= unix_now:
            self.used_tokens.pop(heapq.heappop(self.used_token_expiry)[1], None)

    cdef void _on_server_reply(self, int ptype, const uint8_t* p, Py_ssize_t n, bytes datagram,
                               object address, double now):
        """CHALLENGE, ACCEPT, REFUSE (to a connecting client) and DISCONNECT (either side)."""
        cdef Peer peer = self.peers_by_address.get(address)
        cdef CookiePacket challenge
        cdef AcceptPacket accept
        cdef RefusePacket refuse
        cdef SessionPacket disconnect
        cdef int status
        if ptype == PT_CHALLENGE:
            status = decode_challenge(p, n, &challenge)
        elif ptype == PT_ACCEPT:
            status = decode_accept(p, n, &accept)
        elif ptype == PT_REFUSE:
            status = decode_refuse(p, n, &refuse)
        else:
            status = decode_disconnect(p, n, &disconnect)
        if status < 0:
            self.drop_counts[-status - 1] += 1
            return
        if peer is None:
            self.drop_counts[DROP_UNKNOWN_PEER] += 1
            return
        if ptype == PT_DISCONNECT:
            if peer.state != STATE_CONNECTED or disconnect.session_id != peer.session_id:
                self.drop_counts[DROP_WRONG_SESSION] += 1
                return
            status = peer.open_disconnect(&disconnect, datagram)
            if status < 0:
                self.drop_counts[-status - 1] += 1
                return
            self._close(peer, "remote:" + REASONS.get(status, str(status)), -1)
            return
        if ptype == PT_CHALLENGE:
            self._on_challenge(peer, &challenge, now)
        elif ptype == PT_ACCEPT:
            self._on_accept(peer, &accept, datagram, now)
        elif refuse.connect_id != peer.connect_id or peer.state == STATE_CONNECTED:
            self.drop_counts[DROP_UNEXPECTED_PACKET] += 1
        else:
            self._close(peer, "refused:" + REASONS.get(refuse.reason, str(refuse.reason)), -1)

    cdef void _on_challenge(self, Peer peer, const CookiePacket* challenge, double now):
        if challenge.connect_id != peer.connect_id or not peer.allows(TRIGGER_CHALLENGE):
            self.drop_counts[DROP_UNEXPECTED_PACKET] += 1
            return
        token = peer.token
        response = make_connect_response(peer.connect_id, challenge.cookie_time,
                                         (<char*>challenge.cookie_mac)[:COOKIE_MAC_SIZE], self.ack_delay_ms,
                                         token.private if token is not None else None)
        if token is not None:
            response += aead_seal_bytes(token.client_key, make_nonce(PT_CONNECT_RESPONSE, peer.connect_id),
                                        b"", response)
        peer.on_challenge(response, now)

    cdef void _on_accept(self, Peer peer, const AcceptPacket* accept, bytes datagram, double now):
        if accept.connect_id != peer.connect_id:
            self.drop_counts[DROP_UNEXPECTED_PACKET] += 1
            return
        if peer.state == STATE_CONNECTED:
            self.drop_counts[DROP_DUPLICATE_PACKET] += 1    # a repeat of our ACCEPT
            return
        if not peer.allows(TRIGGER_ACCEPT) or accept.session_id == 0:
            self.drop_counts[DROP_UNEXPECTED_PACKET] += 1
            return
        token = peer.token
        if token is None and accept.flags >= 0:
            self.drop_counts[DROP_UNEXPECTED_PACKET] += 1
            return
        if token is not None:
            # Only the holder of the token key could open our token and learn this key.
            if accept.flags < 0:
                self.drop_counts[DROP_AUTH_FAILED] += 1
                return
            try:
                aead_open_bytes(token.server_key, make_nonce(PT_ACCEPT, peer.connect_id),
                                datagram[accept.tag_offset:], datagram[:accept.tag_offset])
            except AeadError:
                self.drop_counts[DROP_AUTH_FAILED] += 1
                return
            if accept.flags & ACCEPT_FLAG_ENCRYPTED:
                peer.protect(token.client_key, token.server_key)
        self.sessions[accept.session_id] = peer
        self._know(None, accept.session_id, 1)
        peer.on_accept(accept.session_id, now, accept.ack_delay_ms / 1000.0)

    # -- address migration -----------------------------------------------------------------

    cdef void _on_data_from_new_address(self, Peer peer, const uint8_t* p, Py_ssize_t n, bytes datagram,
                                        object address, double now):
        """DATA with a connected peer's session id from an address that is not the peer's.

        The packet is handled like any other (authenticated first in a sealed session, so a
        forgery changes nothing and gets no reply); its content is delivered so that no input is
        lost while the path is checked. A genuine new packet -- not a replay -- then starts or
        continues validation of that address. Replies keep going to the old address until the
        peer answers a PATH_CHALLENGE from the new one.
        """
        cdef bint had_counter = peer.has_recv_counter
        cdef uint64_t counter_before = peer.recv_counter
        cdef int rc = peer.on_data(p, n, now)
        self._touch(peer)
        if rc < 0:
            self.drop_counts[-rc - 1] += 1
            if rc == -(DROP_AUTH_FAILED + 1) or rc == -(DROP_DUPLICATE_PACKET + 1) or rc == -(DROP_STALE_PACKET + 1):
                return
        if peer.sealed and had_counter and peer.recv_counter <= counter_before:
            return          # authentic but older than the newest: a reordered or replayed copy
        self._challenge_path(peer, address, n, now)

    cdef void _challenge_path(self, Peer peer, object address, Py_ssize_t trigger_size, double now):
        if peer.path_address != address:
            # A new candidate (the newest address wins): fresh data and a fresh budget.
            peer.watch_path(address, bytes(self.rng.getrandbits(8) for _ in range(PATH_DATA_SIZE)),
                            self.path_challenge_budget)
        if now - peer.path_sent_at < self.path_retry_interval:
            return
        size = PATH_SECURE_SIZE if peer.sealed else PATH_SIZE
        # Never more bytes towards an unverified address than the packet that caused them,
        # and no more than the budget in all.
        if size > trigger_size or size > peer.path_budget:
            self.path_counts["budget_spent"] += 1
            return
        packet = peer.path_packet(PT_PATH_CHALLENGE, peer.path_data)
        peer.path_challenge_sent(size, now)
        self.path_counts["challenges_sent"] += 1
        self.path_counts["challenge_bytes"] += size
        self.control_out.append((packet, address))

    cdef void _on_path_packet(self, int ptype, const uint8_t* p, Py_ssize_t n, bytes datagram,
                              object address, double now):
        """PATH_CHALLENGE (at a client, from its server) and PATH_RESPONSE (at a server)."""
        cdef SessionPacket packet
        cdef Peer peer
        cdef int status = decode_path_packet(p, n, &packet)
        if status < 0:
            self.drop_counts[-status - 1] += 1
            return
        if ptype == PT_PATH_CHALLENGE:
            peer = self.peers_by_address.get(address)
        else:
            peer = self.sessions.get(packet.session_id)
        if peer is None or peer.state != STATE_CONNECTED:
            self.drop_counts[DROP_UNKNOWN_PEER] += 1
            return
        if packet.session_id != peer.session_id:
            self.drop_counts[DROP_WRONG_SESSION] += 1
            return
        if (ptype == PT_PATH_CHALLENGE) == self.accept_connections:
            self.drop_counts[DROP_UNEXPECTED_PACKET] += 1     # servers challenge, clients answer
            return
        if not peer.sealed:
            data = (<char*>packet.path_data)[:PATH_DATA_SIZE] if not packet.sealed else None
        else:
            data = peer.open_control(&packet, datagram, ptype) if packet.sealed else None
        if data is None:
            self.drop_counts[DROP_AUTH_FAILED if peer.sealed else DROP_BAD_LENGTH] += 1
            return
        if ptype == PT_PATH_CHALLENGE:
            # Answer from wherever we are now; the server learns our address from it.
            self.control_out.append((peer.path_packet(PT_PATH_RESPONSE, data), peer.address))
            self._touch(peer)
            return
        if (peer.path_address is None or address != peer.path_address
                or not hmac.compare_digest(data, peer.path_data)):
            self.drop_counts[DROP_PATH_UNVALIDATED] += 1
            return
        if address in self.peers_by_address:
            self.drop_counts[DROP_PATH_UNVALIDATED] += 1      # taken by a new connection meanwhile
            return
        source = self.peer_sources.get(peer.peer_id)
        if source is not None:
            moved_to = source_key(address)
            if moved_to != source:
                # Else moving sessions away would let one source open any number of them.
                if self.source_sessions.get(moved_to, 0) >= self.max_sessions_per_source:
                    self.drop_counts[DROP_PATH_UNVALIDATED] += 1
                    return
                self._release_source(peer.peer_id)
                self.peer_sources[peer.peer_id] = moved_to
                self.source_sessions[moved_to] = self.source_sessions.get(moved_to, 0) + 1
        old = peer.address
        del self.peers_by_address[old]
        self._unindex(peer)
        self._know(old, 0, -1)
        peer.migrate(address)
        self.peers_by_address[address] = peer
        self._index(peer)
        self._know(address, 0, 1)
        self.path_counts["migrations"] += 1
        self.events.append(PeerMigrated(peer.peer_id, old, address))
        self._touch(peer)

    # -- internals -------------------------------------------------------------------------

    cdef bint _run_timers(self, Peer peer, double now):
        """True when the peer was closed by a timer."""
        reason = peer.check_timers(now)
        if reason is None:
            return False
        self._close(peer, reason, REASON_CODES.get(reason, -1))
        return True

    cdef void _close(self, Peer peer, str reason, int code):
        """Remove a peer now; with code >= 0 a DISCONNECT goes out in the next flush."""
        cdef SendChannel channel
        if self.peers.pop(peer.peer_id, None) is not None:
            self._id_unindex(peer)
            self._retire(peer)
            for channel in peer.send_channels:
                self.closed_resends += channel.resends
                self.closed_spurious_resends += channel.spurious_resends
                self.closed_redundant_bytes += channel.redundant_bytes
        if self.peers_by_address.pop(peer.address, None) is not None:
            self._unindex(peer)
            self._know(peer.address, 0, -1)
        if self.sessions.get(peer.session_id) is peer:
            del self.sessions[peer.session_id]
            self._know(None, peer.session_id, -1)
        self._release_source(peer.peer_id)
        peer.release()
        self.events.append(PeerDisconnected(peer.peer_id, peer.address, reason))
        if code >= 0 and peer.allows(TRIGGER_DISCONNECT):
            peer.begin_disconnect(code)
            self.closing.append(peer)
        else:
            peer.close()

    cdef void _release_source(self, int peer_id):
        source = self.peer_sources.pop(peer_id, None)
        if source is None:
            return
        remaining = self.source_sessions[source] - 1
        if remaining:
            self.source_sessions[source] = remaining
        else:
            del self.source_sessions[source]       # forgotten, so the dict stays as small as the peers

    cdef int _new_peer_id(self):
        cdef int peer_id = self.next_peer_id
        self.next_peer_id += 1
        return peer_id

    cdef uint32_t _random_u32(self):
        cdef uint32_t value = 0
        while value == 0:
            value = self.rng.getrandbits(32)
        return value
