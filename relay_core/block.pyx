"""Block transfer: one large payload (a late joiner's frame history, a snapshot) in slices.

The sender cuts a block into at most 65535 equal slices (slice_size = ceil(size / count), the
last one shorter), keeps up to ``window`` slices in flight past the first unacked one, and
resends a slice only when it has been unacked for a resend interval. The receiver answers with
BLOCK_ACK records: ``base`` (every slice below it has arrived) and a bitfield for the slices from
base on. Slices travel as records inside ordinary DATA packets, after the channel traffic and
only while the pacing budget allows, so a block never stalls live frames.
"""
from collections import deque

from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.string cimport memcpy, memset
from libc.stdint cimport uint8_t, uint16_t, uint32_t

from relay_core.fragment cimport ADMIT_OK, ADMIT_SHARED_LIMIT, BLOCK_OVERHEAD, MemoryBudget, refusal
from relay_core.wire cimport (
    Record, DROP_BAD_BLOCK_SLICE, DROP_BLOCK_TOO_LARGE, seq_diff, varint_size,
    write_slice_record, write_block_ack_record,
)

MAX_ACK_BITFIELD_BYTES = 64     # one BLOCK_ACK describes base .. base + 511
MAX_SLICES = 65535
MAX_WINDOW = MAX_ACK_BITFIELD_BYTES * 8
MAX_SLICE_SIZE = 16383          # a slice's length is a record varint of at most 2 bytes
MAX_BLOCK_SIZE = 0xFFFFFFFF     # block_size is a u32 on the wire


cdef inline int slice_length(Py_ssize_t block_size, int slice_size, int index) noexcept:
    cdef Py_ssize_t start = <Py_ssize_t>index * slice_size
    return <int>min(<Py_ssize_t>slice_size, block_size - start)


cdef class BlockSender:
    def __init__(self, int slice_size, int window, int max_queued):
        # slice_size is a divisor (a C division by zero kills the process) and the slice
        # count of a block must fit its u16 field; the window is what one BLOCK_ACK can ack.
        if not 1 <= slice_size <= MAX_SLICE_SIZE:
            raise ValueError(f"slice_size must be 1..{MAX_SLICE_SIZE}, got {slice_size}")
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window must be 1..{MAX_WINDOW} slices, got {window}")
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.queue = None           # a deque once a block waits behind another
        self.max_queued = max_queued
        self.slice_size = slice_size
        self.window = window
        self.data = None
        self.block_id = 0
        self.acked = NULL
        self.last_sent = NULL

    def __dealloc__(self):
        PyMem_Free(self.acked)
        PyMem_Free(self.last_sent)

    def enqueue(self, bytes data not None):
        """Queue a block; False when max_queued blocks are already waiting. Raises ValueError
        for a block of more than 65535 slices or 2**32 - 1 bytes (its header could not say so)."""
        cdef Py_ssize_t n = len(data)
        if n > <Py_ssize_t>MAX_SLICES * self.slice_size or n > MAX_BLOCK_SIZE:
            raise ValueError(f"data of {n} bytes needs more than {MAX_SLICES} slices of "
                             f"{self.slice_size} bytes (or exceeds {MAX_BLOCK_SIZE} bytes)")
        if self.queue is None:
            self.queue = deque()
        elif len(self.queue) >= self.max_queued:
            return False
        self.queue.append(data)
        if self.data is None:
            self.start_next()
        return True

    @property
    def pending_blocks(self):
        return (len(self.queue) if self.queue else 0) + (1 if self.data is not None else 0)

    cdef bint active(self):
        return self.data is not None

    cdef void start_next(self):
        cdef Py_ssize_t n
        cdef int i
        PyMem_Free(self.acked)
        PyMem_Free(self.last_sent)
        self.acked = NULL
        self.last_sent = NULL
        self.data = None
        if not self.queue:
            return
        self.data = self.queue.popleft()
        n = len(self.data)
        self.slice_count = max(1, <int>((n + self.slice_size - 1) // self.slice_size))
        self.base = 0
        self.acked_count = 0
        self.acked = <uint8_t*>PyMem_Malloc(self.slice_count)
        self.last_sent = <double*>PyMem_Malloc(self.slice_count * sizeof(double))
        if self.acked == NULL or self.last_sent == NULL:
            PyMem_Free(self.acked)
            PyMem_Free(self.last_sent)
            self.acked = NULL
            self.last_sent = NULL
            self.data = None            # never an active block without its tables
            raise MemoryError()
        memset(self.acked, 0, self.slice_count)
        for i in range(self.slice_count):
            self.last_sent[i] = -1.0

    cdef int current_slice_size(self) noexcept:
        # Even slices: the receiver derives the same size from block_size and slice_count.
        cdef Py_ssize_t n = len(self.data)
        return <int>((n + self.slice_count - 1) // self.slice_count) if n else 0

    cdef bint has_due(self, double now, double interval):
        cdef int i, stop
        if self.data is None:
            return False
        stop = min(self.slice_count, self.base + self.window)
        for i in range(self.base, stop):
            if not self.acked[i] and (self.last_sent[i] < 0.0 or now - self.last_sent[i] >= interval):
                return True
        return False

    cdef double next_resend(self, double interval):
        """When the earliest sent, unacked slice in the window becomes due again; -1: none."""
        cdef int i, stop
        cdef double earliest = -1.0
        if self.data is None:
            return -1.0
        stop = min(self.slice_count, self.base + self.window)
        for i in range(self.base, stop):
            if not self.acked[i] and self.last_sent[i] >= 0.0:
                if earliest < 0.0 or self.last_sent[i] + interval < earliest:
                    earliest = self.last_sent[i] + interval
        return earliest

    cdef bint has_unsent(self):
        """A slice in the window has never been sent."""
        cdef int i, stop
        if self.data is None:
            return False
        stop = min(self.slice_count, self.base + self.window)
        for i in range(self.base, stop):
            if not self.acked[i] and self.last_sent[i] < 0.0:
                return True
        return False

    cdef Py_ssize_t write(self, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, double now, double interval):
        cdef int i, stop, length
        cdef int size = self.current_slice_size() if self.data is not None else 0
        cdef Py_ssize_t block_size
        cdef const uint8_t* data
        if self.data is None:
            return pos
        data = <const uint8_t*><const char*>self.data
        block_size = len(self.data)
        stop = min(self.slice_count, self.base + self.window)
        for i in range(self.base, stop):
            if self.acked[i] or (self.last_sent[i] >= 0.0 and now - self.last_sent[i] < interval):
                continue
            length = slice_length(block_size, size, i)
            if pos + 11 + varint_size(length) + length > end:
                break
            pos += write_slice_record(buf + pos, self.block_id, i, self.slice_count,
                                      <uint32_t>block_size, data + <Py_ssize_t>i * size, length)
            if self.last_sent[i] >= 0.0:
                self.slices_resent += 1
            self.slices_sent += 1
            self.last_sent[i] = now
        return pos

    cdef int on_ack(self, Record* r, const uint8_t* p):
        """Apply a BLOCK_ACK; 1 when it completes the current block, else 0 (or -drop)."""
        cdef int i, index, base = r.ack_base
        cdef const uint8_t* bits = p + r.payload_offset
        if self.data is None or r.block_id != self.block_id:
            return 0
        if base > self.slice_count:
            return -(DROP_BAD_BLOCK_SLICE + 1)
        for i in range(self.base, base):
            if not self.acked[i]:
                self.acked[i] = 1
                self.acked_count += 1
        for i in range(r.payload_length * 8):
            index = base + i
            if index >= self.slice_count:
                break
            if (bits[i >> 3] >> (i & 7)) & 1 and not self.acked[index]:
                self.acked[index] = 1
                self.acked_count += 1
        while self.base < self.slice_count and self.acked[self.base]:
            self.base += 1
        if self.acked_count == self.slice_count:
            self.block_id += 1
            self.start_next()
            return 1
        return 0


cdef class BlockReceiver:
    def __init__(self, Py_ssize_t max_block_size, MemoryBudget budget not None):
        # Compared as a u32 with a slice's block_size: a negative one would admit anything.
        if not 0 <= max_block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"max_block_size must be 0..{MAX_BLOCK_SIZE}, got {max_block_size}")
        self.max_block_size = max_block_size
        self.budget = budget
        self.expected = 0
        self.buffer = None
        self.ack_owed = False
        self.has_completed = False

    cdef int on_slice(self, Record* r, const uint8_t* p, list completed):
        """Store one slice; a finished block is appended to ``completed`` as (block_id, bytes)."""
        cdef int distance = seq_diff(r.block_id, self.expected)
        cdef int index = r.slice_index
        cdef int slice_size, expected_length, admitted
        cdef Py_ssize_t cost
        if distance < 0:
            # The sender has not seen our final ack yet: say again that it is complete.
            if self.has_completed and r.block_id == self.completed_id:
                self.ack_owed = True
            return 0
        if distance > 0:
            return -(DROP_BAD_BLOCK_SLICE + 1)
        if self.buffer is None:
            if r.block_size > <uint32_t>self.max_block_size:
                return -(DROP_BLOCK_TOO_LARGE + 1)
            # Not acked when it does not fit, so the sender tries again: block_memory_limit
            # counts block bytes; the endpoint's receive budget (the parent) also counts the
            # per-slice flags and the two objects.
            cost = <Py_ssize_t>r.block_size + r.slice_count + BLOCK_OVERHEAD
            admitted = self.budget.admit(r.block_size, False)
            if admitted == ADMIT_OK and self.budget.parent is not None \
                    and not self.budget.parent.fits(cost):
                admitted = ADMIT_SHARED_LIMIT
            if admitted != ADMIT_OK:
                return refusal(admitted)
            slice_size = <int>((r.block_size + r.slice_count - 1) // r.slice_count) if r.block_size else 0
            if r.block_size == 0:
                if r.slice_count != 1:
                    return -(DROP_BAD_BLOCK_SLICE + 1)
            elif <Py_ssize_t>(r.slice_count - 1) * slice_size >= r.block_size:
                return -(DROP_BAD_BLOCK_SLICE + 1)
            self.buffer = bytearray(r.block_size)
            self.charged = cost
            self.budget.charge(r.block_size)
            if self.budget.parent is not None:
                self.budget.parent.charge(cost - r.block_size)
            self.received = bytearray(r.slice_count)
            self.block_size = r.block_size
            self.slice_count = r.slice_count
            self.slice_size = slice_size
            self.received_count = 0
            self.base = 0
        elif r.block_size != self.block_size or r.slice_count != self.slice_count:
            return -(DROP_BAD_BLOCK_SLICE + 1)
        expected_length = slice_length(self.block_size, self.slice_size, index)
        if r.payload_length != expected_length:
            return -(DROP_BAD_BLOCK_SLICE + 1)
        self.ack_owed = True
        if self.received[index]:
            return 0
        cdef uint8_t* dst = self.buffer
        memcpy(dst + <Py_ssize_t>index * self.slice_size, p + r.payload_offset, expected_length)
        self.received[index] = 1
        self.received_count += 1
        while self.base < self.slice_count and self.received[self.base]:
            self.base += 1
        if self.received_count == self.slice_count:
            completed.append((self.expected, bytes(self.buffer)))
            self.has_completed = True
            self.completed_id = self.expected
            self.completed_count = self.slice_count
            self.release()
            self.expected += 1
        return 0

    cdef void release(self):
        if self.charged:
            self.budget.credit(self.block_size)
            if self.budget.parent is not None:
                self.budget.parent.credit(self.charged - self.block_size)
        self.charged = 0
        self.buffer = None
        self.received = None

    cdef Py_ssize_t write_ack(self, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end):
        cdef uint8_t bits[64]     # MAX_ACK_BITFIELD_BYTES
        cdef int i, span, nbytes
        if not self.ack_owed:
            return pos
        if self.buffer is None:
            if pos + 6 > end:
                return pos
            self.ack_owed = False
            return pos + write_block_ack_record(buf + pos, self.completed_id,
                                                <uint16_t>self.completed_count, bits, 0)
        span = min(self.slice_count - self.base, MAX_ACK_BITFIELD_BYTES * 8)
        nbytes = (span + 7) // 8
        if pos + 6 + nbytes > end:
            return pos
        memset(bits, 0, MAX_ACK_BITFIELD_BYTES)
        for i in range(span):
            if self.received[self.base + i]:
                bits[i >> 3] |= <uint8_t>(1 << (i & 7))
        self.ack_owed = False
        return pos + write_block_ack_record(buf + pos, self.expected, <uint16_t>self.base, bits, nbytes)
