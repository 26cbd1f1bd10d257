"""Per-player and per-room timing behind the input-delay advice, over C arrays.

Every player's every input passes through ``InputTiming.record`` and looks up when the frame it
names as held closed (``CloseTimes.since``), so both keep raw C rings: 4 bytes a response time
and 1 bit a late mark per player (``window`` of each), 16 bytes a frame per room.
"""
from cpython.mem cimport PyMem_Malloc, PyMem_Calloc, PyMem_Free
from libc.math cimport ceil
from libc.stdint cimport uint64_t

cdef enum:
    # Close times kept for timing inputs (16 bytes a frame, per room): a client whose newest
    # frame is older than this is far behind (past the default catchup_frames of 150 it gets a
    # catch-up block), and its inputs say nothing about its link.
    CLOSE_TIMES_KEPT = 256
    # Response times a percentile sorts on the stack (the default window is 150); more on the heap.
    SELECT_ON_STACK = 1024
    # A percentile this close to the top is read in one pass that keeps the largest few (the
    # default 99th of 150 samples is the second largest), with no copy and no selection.
    TOP_IN_ONE_PASS = 16


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


cdef double _top(const float* values, Py_ssize_t n, Py_ssize_t m) noexcept:
    """The m-th largest of values[0:n] (1 <= m <= TOP_IN_ONE_PASS, m <= n): one pass keeping the
    m largest seen so far in descending order."""
    cdef float top[TOP_IN_ONE_PASS]
    cdef Py_ssize_t i, j, held = 0
    cdef float value
    for i in range(n):
        value = values[i]
        if held == m:
            if value <= top[m - 1]:
                continue
            j = m - 1
        else:
            j = held
            held += 1
        while j > 0 and top[j - 1] < value:
            top[j] = top[j - 1]
            j -= 1
        top[j] = value
    return top[m - 1]


cdef class InputTiming:
    """One player's recent input response times and the input delay advised from them.

    Every player's every input passes through ``record``, so the rings are C arrays: the last
    ``window`` response times (seconds from the close of the frame the client said it held to
    the arrival of the input) and, per recent input, whether it missed its frame.
    """
    def __cinit__(self, Py_ssize_t window):
        if window < 1:
            raise ValueError("input timing window must be at least 1")
        self.window = window
        self.responses = <float*>PyMem_Malloc(window * sizeof(float))
        if window <= 64 * LATE_BITS_INLINE:
            self.late_bits = self.late_inline       # zeroed with the object
        else:
            self.late_bits = <uint64_t*>PyMem_Calloc((window + 63) // 64, sizeof(uint64_t))
        if self.responses == NULL or self.late_bits == NULL:
            raise MemoryError()
        self.advised = None
        self.lowerable_since = -1.0

    def __dealloc__(self):
        PyMem_Free(self.responses)
        if self.late_bits != self.late_inline:
            PyMem_Free(self.late_bits)

    cpdef void record(self, bint late, double response):
        """One input: whether it arrived after its frame closed, and its response time
        (negative: the input says nothing about the link)."""
        cdef Py_ssize_t index = self.next_late
        cdef uint64_t bit = (<uint64_t>1) << (index & 63)
        cdef uint64_t* word = &self.late_bits[index >> 6]
        self.late_count += late - ((word[0] & bit) != 0)
        if late:
            word[0] |= bit
        else:
            word[0] &= ~bit
        self.next_late = index + 1 if index + 1 < self.window else 0
        if self.late_seen < self.window:
            self.late_seen += 1
        if response >= 0.0:
            self.responses[self.next_response] = <float>response
            self.next_response = self.next_response + 1 if self.next_response + 1 < self.window else 0
            if self.samples < self.window:
                self.samples += 1

    cpdef double percentile(self, double percent) except? -1.0:
        """Nearest-rank percentile of the response times held (0.0 when there are none)."""
        cdef Py_ssize_t rank, i
        cdef double value
        cdef double ordered_here[SELECT_ON_STACK]
        cdef double* ordered = ordered_here
        if self.samples == 0:
            return 0.0
        rank = <Py_ssize_t>ceil(percent / 100.0 * self.samples)
        rank = min(max(rank, 1), self.samples)
        if self.samples - rank < TOP_IN_ONE_PASS:
            return _top(self.responses, self.samples, self.samples - rank + 1)
        if self.samples > SELECT_ON_STACK:
            ordered = <double*>PyMem_Malloc(self.samples * sizeof(double))
            if ordered == NULL:
                raise MemoryError()
        for i in range(self.samples):
            ordered[i] = self.responses[i]
        value = _select(ordered, self.samples, rank - 1)
        if ordered != ordered_here:
            PyMem_Free(ordered)
        return value


cdef class CloseTimes:
    """When a room's recent frames closed: frame n in slot n % CLOSE_TIMES_KEPT."""

    def __cinit__(self):
        cdef Py_ssize_t i
        self.numbers = <long long*>PyMem_Malloc(CLOSE_TIMES_KEPT * sizeof(long long))
        self.closed_at = <double*>PyMem_Calloc(CLOSE_TIMES_KEPT, sizeof(double))
        if self.numbers == NULL or self.closed_at == NULL:
            raise MemoryError()
        for i in range(CLOSE_TIMES_KEPT):
            self.numbers[i] = -1

    def __dealloc__(self):
        PyMem_Free(self.numbers)
        PyMem_Free(self.closed_at)

    cpdef int record(self, long long number, double now) except -1:
        """Frame ``number`` closed at ``now``."""
        if number < 0:
            raise ValueError(f"number must be >= 0, got {number}")     # its slot: number % KEPT
        self.numbers[number % CLOSE_TIMES_KEPT] = number
        self.closed_at[number % CLOSE_TIMES_KEPT] = now
        return 0

    cpdef double since(self, long long number, double now):
        """Seconds from the close of frame ``number`` to ``now`` (at least 0), or -1.0 when that
        close is not kept (never recorded, or too old)."""
        cdef Py_ssize_t index
        if number < 0:
            return -1.0
        index = number % CLOSE_TIMES_KEPT
        if self.numbers[index] != number:
            return -1.0
        return max(0.0, now - self.closed_at[index])
