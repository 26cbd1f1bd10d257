# What a receive buffer costs beyond its payload bytes (CPython object headers, list slots,
# allocator rounding); charged with the payload so that many tiny pieces cost what they hold.
cdef enum:
    PIECE_OVERHEAD = 64             # one held bytes object (a fragment or a whole message)
    PARTIAL_OVERHEAD = 160          # a PartialMessage and its fragment list, plus 8 per fragment
    STORAGE_OVERHEAD = 160          # a receive window's storage, plus STORAGE_SLOT per slot
    STORAGE_SLOT = 20
    BLOCK_OVERHEAD = 160            # a block's buffers, plus one byte per slice

# MemoryBudget.admit results
cdef enum:
    ADMIT_OK = 0
    ADMIT_OWN_LIMIT = 1             # this budget's own limit (per peer, or block memory)
    ADMIT_SHARED_LIMIT = 2          # the endpoint-wide parent's limit


cdef class MemoryBudget:
    """Bytes that may be held in receive buffers; shared by everything charged to it.

    With a ``parent`` (the endpoint-wide receive budget) every charge also counts there, and
    a charge must fit both limits."""
    cdef readonly Py_ssize_t used
    cdef readonly Py_ssize_t limit
    cdef readonly MemoryBudget parent

    cdef inline bint fits(self, Py_ssize_t n) noexcept:
        return self.admit(n, False) == ADMIT_OK

    cdef inline int admit(self, Py_ssize_t n, bint exempt) noexcept:
        """ADMIT_OK when ``n`` more bytes may be held; ``exempt`` skips this budget's own
        limit (never the parent's)."""
        if not exempt and self.used + n > self.limit:
            return ADMIT_OWN_LIMIT
        if self.parent is not None and self.parent.used + n > self.parent.limit:
            return ADMIT_SHARED_LIMIT
        return ADMIT_OK

    cdef inline void charge(self, Py_ssize_t n) noexcept:
        self.used += n
        if self.parent is not None:
            self.parent.used += n

    cdef inline void credit(self, Py_ssize_t n) noexcept:
        self.used -= n
        if self.parent is not None:
            self.parent.used -= n


cdef int refusal(int admitted) noexcept


cdef class PartialMessage:
    """Fragments of one message received so far."""
    cdef list fragments
    cdef readonly int fragment_count
    cdef readonly int received
    cdef readonly Py_ssize_t size             # payload bytes held
    cdef readonly Py_ssize_t charged          # what is charged for them, overhead included

    cdef int add(self, int index, bytes data, MemoryBudget budget, Py_ssize_t max_message_size,
                 bint exempt)
    cdef bytes assemble(self)
    cdef void release(self, MemoryBudget budget)


cpdef list split_message(bytes payload, Py_ssize_t fragment_size)
