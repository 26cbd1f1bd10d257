cdef class MemoryBudget:
    """Bytes that may be held in receive buffers; shared by everything charged to it."""
    cdef readonly Py_ssize_t used
    cdef readonly Py_ssize_t limit

    cdef inline bint fits(self, Py_ssize_t n) noexcept:
        return self.used + n <= self.limit


cdef class PartialMessage:
    """Fragments of one message received so far."""
    cdef list fragments
    cdef readonly int fragment_count
    cdef readonly int received
    cdef readonly Py_ssize_t size

    cdef int add(self, int index, bytes data, MemoryBudget budget, Py_ssize_t max_message_size,
                 bint exempt)
    cdef bytes assemble(self)
    cdef void release(self, MemoryBudget budget)


cpdef list split_message(bytes payload, Py_ssize_t fragment_size)
