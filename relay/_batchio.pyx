# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Batched UDP syscalls: Linux ``recvmmsg(2)`` / ``sendmmsg(2)`` on a non-blocking socket fd.

One syscall moves up to ``max_datagrams`` datagrams each way, so a server wake-up costs one
receive call and one send call instead of one Python callback and one ``sendto`` per datagram.

``BatchSocket(fd, max_datagrams=64, max_size=2048)`` holds the iovecs, message headers, address
slots and receive buffers, allocated once; its ``recv()`` and ``send(datagrams, start=0)`` are
the fast path. The module-level ``recv_batch(fd, ...)`` / ``send_batch(fd, datagrams)`` are
conveniences over a shared scratch instance.

Addresses are Python socket-style tuples: ``("ip", port)`` for IPv4 and
``("ip", port, flowinfo, scope_id)`` for IPv6 (hosts as ``inet_ntop`` spells them, like uvloop).
A datagram to send may have the address None (a connected socket's peer); a received datagram
from anything but IPv4/IPv6 has the address None.
Received addresses come from a bounded cache, so one peer's datagrams carry the same tuple
object; addresses to send to are packed once per tuple (also a bounded cache). Hosts must be
numeric (an IPv6 host may carry a ``%scope`` suffix).

Errors: EAGAIN ends a call (``recv`` returns what it has, ``send`` how many it consumed);
EINTR is retried; ICMP-style errors (ECONNREFUSED, ECONNRESET, EHOSTUNREACH, ENETUNREACH,
EHOSTDOWN, ENETDOWN) and ENOBUFS are what UDP loss looks like: counted in ``recv_errors`` /
``send_errors`` with ``last_error`` set, and the call goes on (a send tries the datagram that
failed once more, since a pending ICMP error is about an earlier one, then skips it).
Anything else raises OSError. An exception from ``send`` carries ``sent``: how many
datagrams (counted from ``start``) were consumed before the one that failed.

On a platform without recvmmsg/sendmmsg the module still imports: ``AVAILABLE`` is False and
every call raises OSError(ENOSYS).
"""
from relay_core.endpoint cimport Endpoint
from relay_core.outbox cimport OutDatagram
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

import os as _os
import socket as _socket

cdef extern from *:
    """
    #include <errno.h>
    #include <string.h>
    #include <sys/types.h>
    #include <sys/socket.h>
    #include <sys/uio.h>
    #include <netinet/in.h>
    #include <arpa/inet.h>
    #if defined(__linux__)
    #define RELAY_HAVE_MMSG 1
    static int relay_recvmmsg(int fd, struct mmsghdr *vec, unsigned int n) {
        return recvmmsg(fd, vec, n, MSG_DONTWAIT, NULL);
    }
    static int relay_sendmmsg(int fd, struct mmsghdr *vec, unsigned int n) {
        return sendmmsg(fd, vec, n, MSG_DONTWAIT);
    }
    #else
    #define RELAY_HAVE_MMSG 0
    struct mmsghdr { struct msghdr msg_hdr; unsigned int msg_len; };
    static int relay_recvmmsg(int fd, struct mmsghdr *vec, unsigned int n) {
        (void)fd; (void)vec; (void)n; errno = ENOSYS; return -1;
    }
    static int relay_sendmmsg(int fd, struct mmsghdr *vec, unsigned int n) {
        (void)fd; (void)vec; (void)n; errno = ENOSYS; return -1;
    }
    #endif
    #ifndef EHOSTDOWN
    #define EHOSTDOWN EHOSTUNREACH
    #endif
    """
    int RELAY_HAVE_MMSG
    int errno

    ctypedef unsigned int socklen_t
    ctypedef unsigned short sa_family_t

    struct iovec:
        void* iov_base
        size_t iov_len

    struct msghdr:
        void* msg_name
        socklen_t msg_namelen
        iovec* msg_iov
        size_t msg_iovlen
        void* msg_control
        size_t msg_controllen
        int msg_flags

    struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len

    struct sockaddr_storage:
        sa_family_t ss_family

    struct in_addr:
        uint32_t s_addr

    struct sockaddr_in:
        sa_family_t sin_family
        uint16_t sin_port
        in_addr sin_addr

    struct in6_addr:
        pass

    struct sockaddr_in6:
        sa_family_t sin6_family
        uint16_t sin6_port
        uint32_t sin6_flowinfo
        in6_addr sin6_addr
        uint32_t sin6_scope_id

    int AF_INET
    int AF_INET6
    int MSG_TRUNC
    int INET6_ADDRSTRLEN

    int EAGAIN
    int EWOULDBLOCK
    int EINTR
    int ENOSYS
    int ECONNREFUSED
    int ECONNRESET
    int EHOSTUNREACH
    int ENETUNREACH
    int EHOSTDOWN
    int ENETDOWN
    int ENOBUFS

    uint16_t htons(uint16_t) nogil
    uint16_t ntohs(uint16_t) nogil
    uint32_t htonl(uint32_t) nogil
    uint32_t ntohl(uint32_t) nogil
    const char* inet_ntop(int af, const void* src, char* dst, socklen_t size) nogil
    int inet_pton(int af, const char* src, void* dst) nogil

    int relay_recvmmsg(int fd, mmsghdr* vec, unsigned int n) nogil
    int relay_sendmmsg(int fd, mmsghdr* vec, unsigned int n) nogil


AVAILABLE = bool(RELAY_HAVE_MMSG)
"""True where recvmmsg/sendmmsg exist (Linux)."""

MAX_DATAGRAMS = 1024
"""The kernel's UIO_MAXIOV: no batch is larger."""

DEFAULT_CACHE_LIMIT = 4096
"""Entries per address cache; a full cache is cleared (spoofed sources cannot grow it)."""

DEF ADMISSION_ROUNDS = 32         # batches one recv may read and refuse whole before it returns


cdef inline bint _is_loss(int err) noexcept nogil:
    """Errors that mean "this datagram (or an earlier one) was lost", as UDP loses datagrams."""
    return (err == ECONNREFUSED or err == ECONNRESET or err == EHOSTUNREACH or err == ENETUNREACH
            or err == EHOSTDOWN or err == ENETDOWN or err == ENOBUFS)


cdef inline bint _is_again(int err) noexcept nogil:
    return err == EAGAIN or err == EWOULDBLOCK


cdef object _os_error(int err):
    return OSError(err, _os.strerror(err))


cdef object _pack_sockaddr(object address):
    """A socket-style address tuple as the bytes of a sockaddr_in / sockaddr_in6."""
    cdef sockaddr_in sin
    cdef sockaddr_in6 sin6
    cdef bytes encoded
    cdef long port, flowinfo = 0, scope = 0
    if not isinstance(address, tuple) or len(address) not in (2, 4):
        raise TypeError(f"an address is a (host, port) or (host, port, flowinfo, scope_id) "
                        f"tuple, not {address!r}")
    host = address[0]
    if not isinstance(host, str):
        raise TypeError(f"address host must be a str, not {type(host).__name__} in {address!r}")
    port = address[1]
    if not 0 <= port <= 0xFFFF:
        raise OverflowError(f"port must be 0-65535 in {address!r}")
    if ":" not in host:
        try:
            encoded = host.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"{host!r} is not a numeric IPv4 or IPv6 address") from None
        memset(&sin, 0, sizeof(sin))
        sin.sin_family = AF_INET
        sin.sin_port = htons(<uint16_t>port)
        if inet_pton(AF_INET, encoded, &sin.sin_addr) != 1:
            raise ValueError(f"{host!r} is not a numeric IPv4 or IPv6 address")
        return PyBytes_FromStringAndSize(<char*>&sin, sizeof(sin))
    if len(address) == 4:
        flowinfo = address[2]
        scope = address[3]
        if not 0 <= flowinfo <= 0xFFFFF:
            raise OverflowError(f"flowinfo must be 0-1048575 in {address!r}")
        if not 0 <= scope <= 0xFFFFFFFF:
            raise OverflowError(f"scope_id must be 0-4294967295 in {address!r}")
    if "%" in host:
        host, _, scope_name = host.partition("%")
        if scope == 0 and scope_name:
            scope = int(scope_name) if scope_name.isdigit() else _socket.if_nametoindex(scope_name)
    try:
        encoded = host.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"{host!r} is not a numeric IPv4 or IPv6 address") from None
    memset(&sin6, 0, sizeof(sin6))
    sin6.sin6_family = AF_INET6
    sin6.sin6_port = htons(<uint16_t>port)
    sin6.sin6_flowinfo = htonl(<uint32_t>flowinfo)
    sin6.sin6_scope_id = <uint32_t>scope
    if inet_pton(AF_INET6, encoded, &sin6.sin6_addr) != 1:
        raise ValueError(f"{address[0]!r} is not a numeric IPv4 or IPv6 address")
    return PyBytes_FromStringAndSize(<char*>&sin6, sizeof(sin6))


cdef class BatchSocket:
    """Preallocated recvmmsg/sendmmsg state for one socket fd (the fd stays the caller's).

    Not for two threads at once: a call made while another thread is inside one raises
    RuntimeError (the GIL is released around the syscalls).
    """
    cdef readonly int fd
    cdef readonly int max_datagrams
    cdef readonly Py_ssize_t max_size
    cdef public Py_ssize_t cache_limit
    # Counters and the outcome of the last send().
    cdef readonly unsigned long long truncated      # longer than max_size: dropped on receipt
    cdef readonly unsigned long long recv_errors
    cdef readonly unsigned long long send_errors
    cdef readonly int last_error
    cdef readonly Py_ssize_t last_sent_count
    cdef readonly Py_ssize_t last_sent_bytes
    cdef char* rbuf
    cdef mmsghdr* rmsgs
    cdef iovec* riov
    cdef sockaddr_storage* raddrs
    cdef mmsghdr* smsgs
    cdef iovec* siov
    cdef sockaddr_storage* saddrs
    cdef PyObject** sheld
    cdef dict _recv_cache
    cdef dict _send_cache
    cdef bint _busy
    cdef Endpoint admission
    cdef readonly bint in_place                         # admission's receive_raw takes DATA here
    cdef readonly unsigned long long taken_in_place     # datagrams it took
    cdef readonly unsigned long long datagrams_read     # every datagram recv read, admitted or not
    cdef readonly unsigned long long bytes_read

    def __cinit__(self, int fd=-1, int max_datagrams=64, Py_ssize_t max_size=2048):
        if not 1 <= max_datagrams <= MAX_DATAGRAMS:
            raise ValueError(f"max_datagrams must be 1-{MAX_DATAGRAMS}, not {max_datagrams}")
        if not 1 <= max_size <= 65536:
            raise ValueError(f"max_size must be 1-65536, not {max_size}")
        self.fd = fd
        self.max_datagrams = max_datagrams
        self.max_size = max_size
        self.cache_limit = DEFAULT_CACHE_LIMIT
        self._recv_cache = {}
        self._send_cache = {}
        cdef Py_ssize_t n = max_datagrams
        self.smsgs = <mmsghdr*>PyMem_Calloc(n, sizeof(mmsghdr))
        self.siov = <iovec*>PyMem_Calloc(n, sizeof(iovec))
        self.saddrs = <sockaddr_storage*>PyMem_Calloc(n, sizeof(sockaddr_storage))
        self.sheld = <PyObject**>PyMem_Calloc(n, sizeof(PyObject*))
        if not (self.smsgs and self.siov and self.saddrs and self.sheld):
            raise MemoryError()
        cdef Py_ssize_t i
        for i in range(n):
            self.smsgs[i].msg_hdr.msg_name = &self.saddrs[i]
            self.smsgs[i].msg_hdr.msg_iov = &self.siov[i]
            self.smsgs[i].msg_hdr.msg_iovlen = 1

    cdef int _alloc_recv(self) except -1:
        """Receive buffers on first use: a send-only instance never holds them."""
        cdef Py_ssize_t i, n = self.max_datagrams
        self.rmsgs = <mmsghdr*>PyMem_Calloc(n, sizeof(mmsghdr))
        self.riov = <iovec*>PyMem_Calloc(n, sizeof(iovec))
        self.raddrs = <sockaddr_storage*>PyMem_Calloc(n, sizeof(sockaddr_storage))
        # Large enough to be mapped lazily: only the pages datagrams touch become resident.
        self.rbuf = <char*>PyMem_Calloc(n, self.max_size)
        if not (self.rmsgs and self.riov and self.raddrs and self.rbuf):
            raise MemoryError()
        for i in range(n):
            self.riov[i].iov_base = self.rbuf + i * self.max_size
            self.riov[i].iov_len = <size_t>self.max_size
            self.rmsgs[i].msg_hdr.msg_name = &self.raddrs[i]
            self.rmsgs[i].msg_hdr.msg_iov = &self.riov[i]
            self.rmsgs[i].msg_hdr.msg_iovlen = 1
        return 0

    def __dealloc__(self):
        PyMem_Free(self.smsgs)
        PyMem_Free(self.siov)
        PyMem_Free(self.saddrs)
        PyMem_Free(self.sheld)
        PyMem_Free(self.rmsgs)
        PyMem_Free(self.riov)
        PyMem_Free(self.raddrs)
        PyMem_Free(self.rbuf)

    cdef inline int _enter(self) except -1:
        if self._busy:
            raise RuntimeError("BatchSocket is in use by another thread")
        self._busy = True
        return 0

    # -- receiving ---------------------------------------------------------------------------

    cdef object _address(self, sockaddr_storage* storage):
        cdef sockaddr_in* sin = NULL
        cdef sockaddr_in6* sin6 = NULL
        cdef char text[64]
        cdef dict cache = self._recv_cache
        if storage.ss_family == AF_INET:
            sin = <sockaddr_in*>storage
            key = PyLong_FromUnsignedLongLong((<uint64_t>sin.sin_addr.s_addr << 16) | sin.sin_port)
        elif storage.ss_family == AF_INET6:
            sin6 = <sockaddr_in6*>storage
            key = PyBytes_FromStringAndSize(<char*>sin6, sizeof(sockaddr_in6))
        else:
            return None
        address = cache.get(key)
        if address is not None:
            return address
        if storage.ss_family == AF_INET:
            inet_ntop(AF_INET, &sin.sin_addr, text, sizeof(text))
            address = (text.decode("ascii"), ntohs(sin.sin_port))
        else:
            inet_ntop(AF_INET6, &sin6.sin6_addr, text, sizeof(text))
            address = (text.decode("ascii"), ntohs(sin6.sin6_port), ntohl(sin6.sin6_flowinfo),
                       sin6.sin6_scope_id)
        if len(cache) >= self.cache_limit:
            cache.clear()
        cache[key] = address
        return address

    cdef int _recvmmsg(self, int fd, unsigned int n) except -1:
        """One recvmmsg into the receive slots; the number read (0: EAGAIN)."""
        cdef int i, r = 0, err = 0, losses = 0
        cdef mmsghdr* msgs = self.rmsgs
        self._enter()
        try:
            for i in range(<int>n):
                msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage)
                msgs[i].msg_hdr.msg_flags = 0
                msgs[i].msg_len = 0
            while True:
                with nogil:
                    r = relay_recvmmsg(fd, msgs, n)
                    err = errno
                if r >= 0:
                    break
                if err == EINTR:
                    continue
                if _is_again(err):
                    return 0
                if _is_loss(err) and losses < 8:
                    # A pending ICMP error is reported once, then the queue reads normally.
                    losses += 1
                    self.recv_errors += 1
                    self.last_error = err
                    continue
                raise _os_error(err)
        finally:
            self._busy = False
        return r

    cdef list _recv(self, int fd, int max_datagrams, double now):
        cdef int i, r, rounds = 0, taken = 0
        cdef unsigned int n = <unsigned int>max_datagrams
        cdef mmsghdr* msgs
        cdef list out = []
        cdef Py_ssize_t size = self.max_size
        cdef Endpoint admission = self.admission
        if n == 0:
            return out
        if self.rbuf == NULL:
            self._alloc_recv()
        msgs = self.rmsgs
        while True:
            r = self._recvmmsg(fd, n)
            self.datagrams_read += r
            for i in range(r):
                if self.in_place:
                    # The peers are cold: while this datagram is handled, ask for the index slot
                    # four datagrams ahead, the peer's first line three ahead, and for a peer
                    # whose datagram is handled at once (not held for its room's pass: see
                    # Endpoint.bind_sink) its hot lines two ahead, what they point to one.
                    if i + 4 < r:
                        admission.prefetch_slot(&self.raddrs[i + 4])
                    if i + 3 < r:
                        admission.prefetch_sender(&self.raddrs[i + 3], 0)
                    if i + 2 < r:
                        admission.prefetch_sender(&self.raddrs[i + 2], 1)
                    if i + 1 < r:
                        admission.prefetch_sender(&self.raddrs[i + 1], 2)
                if msgs[i].msg_hdr.msg_flags & MSG_TRUNC:
                    self.truncated += 1
                    continue
                self.bytes_read += msgs[i].msg_len
                # A connected peer's DATA first: the address index finds it exactly, so the
                # admission filters (a random read of a 256 KB table) need not be asked.
                if self.in_place and admission.receive_raw(
                        <const uint8_t*>(self.rbuf + i * size), msgs[i].msg_len, &self.raddrs[i], now):
                    taken += 1
                    continue
                if admission is not None and not admission.admit_raw(
                        <const uint8_t*>(self.rbuf + i * size), msgs[i].msg_len, &self.raddrs[i], now):
                    continue
                out.append((PyBytes_FromStringAndSize(self.rbuf + i * size, msgs[i].msg_len),
                            self._address(&self.raddrs[i])))
            # All of a full batch refused (a flood): read on here, with no Python object made,
            # a bounded number of times so the event loop keeps its turn.
            rounds += 1
            if out or taken or r < <int>n or rounds >= ADMISSION_ROUNDS:
                self.taken_in_place += taken
                return out

    def recv(self, int max_datagrams=-1, double now=0.0):
        """Up to ``max_datagrams`` (default and at most: this instance's) waiting datagrams as
        [(bytes, address), ...]; [] when none is waiting (EAGAIN).

        With an admission endpoint (``set_admission``), each datagram read is first offered to
        its ``admit_raw`` at time ``now``, and what it refuses (counted in its drops) never
        becomes a Python object; when a whole batch is refused the next is read at once, up to
        ADMISSION_ROUNDS batches per call, so [] can then also mean "all refused". With
        ``in_place`` too, [] can also mean "all taken in place".
        ``datagrams_read`` and ``bytes_read`` count every datagram read, refused or not."""
        if max_datagrams < 0 or max_datagrams > self.max_datagrams:
            max_datagrams = self.max_datagrams
        return self._recv(self.fd, max_datagrams, now)

    def set_admission(self, endpoint, bint in_place=False):
        """A relay_core Endpoint (a server's) whose admit_raw filters what recv returns; None: none.

        ``in_place``: each datagram is first offered to the endpoint's receive_raw, which handles
        DATA from its connected peers right in the receive buffer; what it does not take goes to
        admit_raw, and recv returns only the rest (handshakes, new addresses, bad packets) for
        receive_batch. ``taken_in_place`` counts what receive_raw took."""
        if in_place and endpoint is None:
            raise ValueError("in_place needs an endpoint")
        self.admission = endpoint
        self.in_place = in_place

    # -- sending -----------------------------------------------------------------------------

    cdef int _fill_address(self, object address, int slot) except -1:
        cdef dict cache = self._send_cache
        if address is None:                 # a connected socket's peer
            self.smsgs[slot].msg_hdr.msg_namelen = 0
            return 0
        packed = cache.get(address)
        if packed is None:
            packed = _pack_sockaddr(address)
            if len(cache) >= self.cache_limit:
                cache.clear()
            cache[address] = packed
        memcpy(&self.saddrs[slot], PyBytes_AS_STRING(packed), PyBytes_GET_SIZE(packed))
        self.smsgs[slot].msg_hdr.msg_namelen = <socklen_t>PyBytes_GET_SIZE(packed)
        return 0

    cdef Py_ssize_t _sendmmsg(self, int fd, Py_ssize_t k, Py_ssize_t pos, Py_ssize_t* retried,
                              Py_ssize_t* count, Py_ssize_t* nbytes, bint* again, int* error):
        """sendmmsg of the k send slots filled (datagram ``pos`` of the caller's in slot 0);
        returns how many were consumed (sent, or lost to an ICMP-style error). Stops early on
        EAGAIN (``again``) or another error (``error``: its errno)."""
        cdef Py_ssize_t done = 0, j
        cdef int r = 0, err = 0
        while done < k:
            with nogil:
                r = relay_sendmmsg(fd, self.smsgs + done, <unsigned int>(k - done))
                err = errno
            if r > 0:
                for j in range(done, done + r):
                    nbytes[0] += self.smsgs[j].msg_len
                count[0] += r
                done += r
                continue
            if r == 0 or _is_again(err):
                again[0] = True
                break
            if err == EINTR:
                continue
            if _is_loss(err):
                self.send_errors += 1
                self.last_error = err
                if retried[0] != pos + done:
                    # Most likely an earlier datagram's ICMP error, reported (and cleared) now:
                    # this one goes again, once.
                    retried[0] = pos + done
                    continue
                done += 1           # it fails itself: lost, go on with the rest
                continue
            error[0] = err
            break
        return done

    cdef Py_ssize_t _send(self, int fd, object datagrams, Py_ssize_t start) except -1:
        """Returns how many datagrams from ``start`` were consumed (sent, or lost to an
        ICMP-style error); fewer than there are means EAGAIN."""
        cdef Py_ssize_t total, pos, k, cap = self.max_datagrams, done, j
        cdef Py_ssize_t count = 0, nbytes = 0, retried = -1
        cdef int r = 0, err = 0
        cdef bint again = False
        cdef object data, address
        cdef object failure
        # Indexed unchecked below, so a private snapshot: the caller's list may change during
        # the call (an address's __hash__ runs Python code; another thread runs while the GIL
        # is released around sendmmsg). Of a list, only what is to be sent is copied.
        if type(datagrams) is list:
            total = len(datagrams)
            if start < 0 or start > total:
                raise IndexError(f"start {start} outside 0-{total}")
            datagrams = (<list>datagrams)[start:]
            start = 0
        elif type(datagrams) is not tuple:
            datagrams = list(datagrams)
        total = len(datagrams)
        if start < 0 or start > total:
            raise IndexError(f"start {start} outside 0-{total}")
        self.last_sent_count = 0
        self.last_sent_bytes = 0
        self._enter()
        pos = start
        try:
            while pos < total and not again:
                # Fill the headers for the next chunk; stop before a datagram that is unusable.
                k = 0
                failure = None
                while k < cap and pos + k < total:
                    try:
                        data, address = datagrams[pos + k]
                        if type(data) is not bytes:
                            if not isinstance(data, (bytearray, memoryview)):
                                raise TypeError(f"datagram payload must be bytes, not "
                                                f"{type(data).__name__}")
                            data = bytes(data)
                        self._fill_address(address, <int>k)
                    except Exception as exc:
                        failure = exc
                        break
                    Py_INCREF(data)
                    self.sheld[k] = <PyObject*>data
                    self.siov[k].iov_base = PyBytes_AS_STRING(data)
                    self.siov[k].iov_len = <size_t>PyBytes_GET_SIZE(data)
                    k += 1
                err = 0
                try:
                    done = self._sendmmsg(fd, k, pos, &retried, &count, &nbytes, &again, &err)
                    if err:
                        failure = _os_error(err)
                finally:
                    for j in range(k):
                        Py_DECREF(<object>self.sheld[j])
                        self.sheld[j] = NULL
                pos += done
                if failure is not None and not again:
                    failure.sent = pos - start
                    raise failure
        finally:
            self._busy = False
            self.last_sent_count = count
            self.last_sent_bytes = nbytes
        return pos - start

    def send(self, datagrams, Py_ssize_t start=0):
        """Send ``datagrams[start:]`` ([(bytes, address), ...]). Returns how many were consumed
        (sent, or lost to an ICMP-style error counted in ``send_errors``); fewer than offered
        means the socket buffer is full (EAGAIN): resend the rest later. ``last_sent_count`` and
        ``last_sent_bytes`` say what actually went. Errors carry ``sent`` (see the module)."""
        return self._send(self.fd, datagrams, start)

    # -- sending an endpoint's outbox (in place) ------------------------------------------------

    def flush_in_place(self, double now):
        """The admission endpoint's flush_in_place (``in_place`` set): its DATA waits in its
        outbox for ``send_outbox``; returns the rest as (bytes, address), to be sent first."""
        if not self.in_place:
            raise RuntimeError("flush_in_place needs set_admission(endpoint, in_place=True)")
        return self.admission.flush_in_place(now)

    @property
    def outbox_count(self):
        """Datagrams in the admission endpoint's outbox (the last flush_in_place's DATA)."""
        return self.admission.outbox.count if self.in_place else 0

    @property
    def outbox_written(self):
        """Datagrams the admission endpoint wrote into its outbox since its last flush_in_place
        (send_many with ``now``), not yet handed out by one: 0 when there are none."""
        return (self.admission.outbox.count
                if self.in_place and not self.admission.outbox_handed_out else 0)

    def send_outbox(self, Py_ssize_t start=0):
        """``send`` for the outbox's datagrams from ``start``, straight from its buffer; the same
        return value, counters and errors."""
        cdef Py_ssize_t total = self.outbox_count, pos = start, k, done, retried = -1
        cdef Py_ssize_t count = 0, nbytes = 0, cap = self.max_datagrams
        cdef bint again = False
        cdef int err = 0
        cdef OutDatagram* item
        if start < 0 or start > total:
            raise IndexError(f"start {start} outside 0-{total}")
        self.last_sent_count = 0
        self.last_sent_bytes = 0
        self._enter()
        try:
            while pos < total and not again and not err:
                k = 0
                while k < cap and pos + k < total:
                    item = &self.admission.outbox.items[pos + k]
                    memcpy(&self.saddrs[k], item.address, sizeof(item.address))
                    self.smsgs[k].msg_hdr.msg_namelen = <socklen_t>(
                        sizeof(sockaddr_in) if (<sockaddr_in*>item.address).sin_family == AF_INET
                        else sizeof(sockaddr_in6))
                    self.siov[k].iov_base = self.admission.outbox.data + item.offset
                    self.siov[k].iov_len = <size_t>item.length
                    k += 1
                done = self._sendmmsg(self.fd, k, pos, &retried, &count, &nbytes, &again, &err)
                pos += done
        finally:
            self._busy = False
            self.last_sent_count = count
            self.last_sent_bytes = nbytes
        if err:
            failure = _os_error(err)
            failure.sent = pos - start
            raise failure
        return pos - start

    def outbox_datagrams(self, Py_ssize_t start=0):
        """The outbox's datagrams from ``start`` as [(bytes, address), ...]: what send_outbox
        could not send now, for a queue."""
        cdef Py_ssize_t i, total = self.outbox_count
        cdef OutDatagram* item
        cdef list out = []
        for i in range(max(start, 0), total):
            item = &self.admission.outbox.items[i]
            out.append((PyBytes_FromStringAndSize(<char*>self.admission.outbox.data + item.offset,
                                                  item.length),
                        self._address(<sockaddr_storage*>item.address)))
        return out

    def clear_caches(self):
        self._recv_cache.clear()
        self._send_cache.clear()

    @property
    def cache_sizes(self):
        """(received-address cache entries, send-address cache entries)."""
        return len(self._recv_cache), len(self._send_cache)


cdef BatchSocket _recv_scratch = None
cdef BatchSocket _send_scratch = None


cdef BatchSocket _recv_scratch_for(int max_datagrams, Py_ssize_t max_size):
    """A shared instance with room for the request, or a fresh one while it is in use."""
    global _recv_scratch
    cdef BatchSocket scratch = _recv_scratch
    if scratch is not None and not scratch._busy and scratch.max_datagrams >= max_datagrams \
            and scratch.max_size == max_size:
        return scratch
    scratch = BatchSocket(-1, max_datagrams, max_size)
    if _recv_scratch is None or not _recv_scratch._busy:
        _recv_scratch = scratch
    return scratch


cdef BatchSocket _send_scratch_for():
    global _send_scratch
    cdef BatchSocket scratch = _send_scratch
    if scratch is not None and not scratch._busy:
        return scratch
    scratch = BatchSocket(-1, 64)
    if _send_scratch is None:
        _send_scratch = scratch
    return scratch


def recv_batch(int fd, int max_datagrams=64, int max_size=2048):
    """Up to ``max_datagrams`` datagrams waiting on the non-blocking UDP socket ``fd`` as
    [(bytes, address), ...]; [] on EAGAIN. Datagrams longer than ``max_size`` are dropped."""
    if not 1 <= max_datagrams <= MAX_DATAGRAMS:
        raise ValueError(f"max_datagrams must be 1-{MAX_DATAGRAMS}, not {max_datagrams}")
    return _recv_scratch_for(max_datagrams, max_size)._recv(fd, max_datagrams, 0.0)


def send_batch(int fd, datagrams):
    """Send [(bytes, address), ...] on the non-blocking UDP socket ``fd`` with as few
    sendmmsg calls as it takes; returns how many were consumed (all of them unless the socket
    buffer filled up: EAGAIN; the caller keeps the rest)."""
    return _send_scratch_for()._send(fd, datagrams, 0)
