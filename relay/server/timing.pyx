# cython: cdivision=True
"""Per-room timing behind the input-delay advice, over one C table.

Every player's every input is timed against the close of the frame it names as held. A room's
``InputTimes`` has a row per recent frame: when it closed, and per slot a mark byte and the
response time of the player's answer to it (4 bytes), so an input reads the close time and
writes its answer in the same line, one its room's other players' inputs share.
"""
from cpython.mem cimport PyMem_Malloc, PyMem_Calloc, PyMem_Free
from libc.math cimport ceil
from libc.stdint cimport uint8_t
from libc.string cimport memset

cdef enum:
    # Response times a percentile sorts on the stack (the default window is 150); more on the heap.
    SELECT_ON_STACK = 1024
    # A percentile this close to the top is read in one pass that keeps the largest few (the
    # default 99th of 150 samples is the second largest), with no copy and no selection.
    TOP_IN_ONE_PASS = 16
    # A cell's mark: the player answered the row's frame; and one of its inputs doing so was late.
    MARK_TIMED = 1
    MARK_LATE = 2
    # Where a row's marks start: after its frame number and close time.
    MARKS_AT = sizeof(long long) + sizeof(double)


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


cdef double _top(const double* values, Py_ssize_t n, Py_ssize_t m) noexcept:
    """The m-th largest of values[0:n] (1 <= m <= TOP_IN_ONE_PASS, m <= n): one pass keeping the
    m largest seen so far in descending order."""
    cdef double top[TOP_IN_ONE_PASS]
    cdef Py_ssize_t i, j, held = 0
    cdef double value
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


cdef class InputTimes:
    """A room's recent frames, a row each (the last ``window``): when the frame closed and, per
    slot, the response time of the player's answer to it (an input naming it as ``have``: the
    client sent it on holding that frame), the time from the close to the input's arrival.

    A cell keeps the slowest response among the player's inputs answering that frame (one,
    unless it sent several at once) and whether any of them was late (arrived after the
    frame it was for had closed). A row is reused for the frame ``window`` later.
    """
    def __cinit__(self, Py_ssize_t slots, Py_ssize_t window):
        cdef Py_ssize_t row
        if slots < 1:
            raise ValueError(f"input times need at least 1 slot, got {slots}")
        if window < 1:
            raise ValueError(f"input times window must be at least 1, got {window}")
        self.slots = slots
        self.window = window
        # [frame: long long][closed at: double][marks: slots bytes, padded to 4]
        # [responses: slots floats], 8-aligned
        self.responses_at = sizeof(long long) + sizeof(double) + ((slots + 3) & ~3)
        self.row_bytes = (self.responses_at + slots * sizeof(float) + 7) & ~7
        self.table = <char*>PyMem_Calloc(window, self.row_bytes)
        if self.table == NULL:
            raise MemoryError()
        for row in range(window):
            (<long long*>(self.table + row * self.row_bytes))[0] = -1

    def __dealloc__(self):
        PyMem_Free(self.table)

    cdef int _check_slot(self, Py_ssize_t slot) except -1:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not in 0..{self.slots - 1}")     # a C index
        return 0

    cpdef void close(self, long long frame, double now) except *:
        """Frame ``frame`` closed at ``now``: its row, answered by no one yet."""
        cdef char* row
        if frame < 0:
            raise ValueError(f"frame must be >= 0, got {frame}")     # its row: frame % window
        row = self._row(frame)
        (<long long*>row)[0] = frame
        (<double*>(row + sizeof(long long)))[0] = now
        memset(row + MARKS_AT, 0, self.slots)

    cpdef double answer(self, Py_ssize_t slot, long long answered, bint late, double now) except? -2.0:
        """An input of slot ``slot`` arriving at ``now`` answers frame ``answered``; ``late``: it
        arrived after the frame it was for had closed. Its response time (at least 0), or -1.0
        when that frame's close is not held (never closed, or older than the window): then the
        input is not timed."""
        cdef char* row
        cdef uint8_t* mark
        cdef float* held
        cdef double response
        self._check_slot(slot)
        if answered < 0:
            return -1.0
        row = self._row(answered)
        if (<long long*>row)[0] != answered:
            return -1.0
        response = max(0.0, now - (<double*>(row + sizeof(long long)))[0])
        mark = <uint8_t*>row + MARKS_AT + slot
        held = <float*>(row + self.responses_at) + slot
        if not (mark[0] & MARK_TIMED) or response > held[0]:
            held[0] = <float>response
        mark[0] |= MARK_TIMED | (MARK_LATE if late else 0)
        return response

    cpdef void clear_slot(self, Py_ssize_t slot) except *:
        """Forget the slot's answers (a new player takes it)."""
        cdef Py_ssize_t row
        self._check_slot(slot)
        for row in range(self.window):
            (<uint8_t*>self.table + row * self.row_bytes + MARKS_AT)[slot] = 0

    cpdef tuple review(self, Py_ssize_t slot, long long newest, double percent):
        """(answered, late, percentile) of the slot over frames newest - window + 1 .. newest:
        how many of them it answered, in how many with a late input, and the nearest-rank
        ``percent`` percentile of its response times (0.0 when it answered none)."""
        cdef Py_ssize_t row, samples = 0, late = 0, rank
        cdef long long first = newest - self.window + 1
        cdef uint8_t mark
        cdef const char* at = self.table
        cdef Py_ssize_t mark_at = MARKS_AT + slot
        cdef Py_ssize_t response_at = self.responses_at + slot * sizeof(float)
        cdef double value = 0.0
        cdef double values_here[SELECT_ON_STACK]
        cdef double* values = values_here
        self._check_slot(slot)
        if self.window > SELECT_ON_STACK:
            values = <double*>PyMem_Malloc(self.window * sizeof(double))
            if values == NULL:
                raise MemoryError()
        try:
            for row in range(self.window):
                mark = (<const uint8_t*>at)[mark_at]
                # the row's frame in first .. newest, as one unsigned comparison
                if mark & MARK_TIMED and (<unsigned long long>((<const long long*>at)[0] - first)
                                          < <unsigned long long>self.window):
                    values[samples] = (<const float*>(at + response_at))[0]
                    samples += 1
                    late += (mark & MARK_LATE) != 0
                at += self.row_bytes
            if samples:
                rank = <Py_ssize_t>ceil(percent / 100.0 * samples)
                rank = min(max(rank, 1), samples)
                if samples - rank < TOP_IN_ONE_PASS:
                    value = _top(values, samples, samples - rank + 1)
                else:
                    value = _select(values, samples, rank - 1)
        finally:
            if values != values_here:
                PyMem_Free(values)
        return samples, late, value
