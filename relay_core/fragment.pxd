cdef class ReassemblyBudget:
    """Bytes a peer may hold in partially received fragmented messages."""
    cdef readonly Py_ssize_t used
    cdef readonly Py_ssize_t limit


cdef class PartialMessage:
    """Fragments of one message received so far."""
    cdef list fragments
    cdef readonly int fragment_count
    cdef readonly int received
    cdef readonly Py_ssize_t size

    cdef int add(self, int index, bytes data, ReassemblyBudget budget, Py_ssize_t max_message_size)
    cdef bytes assemble(self, ReassemblyBudget budget)
    cdef void release(self, ReassemblyBudget budget)


cpdef list split_message(bytes payload, Py_ssize_t fragment_size)
