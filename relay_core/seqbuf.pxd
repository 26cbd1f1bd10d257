from libc.stdint cimport uint16_t, uint32_t

cdef class SequenceBuffer:
    """Which 16-bit sequence numbers are stored: slot = seq % size, tag = the seq itself.

    Owners keep their per-entry data in parallel C arrays indexed by the returned slot.
    """
    cdef uint32_t* tags        # EMPTY_TAG or the sequence number held in the slot
    cdef readonly int size

    cdef inline int slot(self, uint16_t seq) noexcept nogil:
        return seq & (self.size - 1)        # size is a power of two: no division

    cdef inline bint contains(self, uint16_t seq) noexcept nogil:
        return self.tags[seq & (self.size - 1)] == seq

    cdef int insert(self, uint16_t seq) noexcept nogil
    cdef void remove(self, uint16_t seq) noexcept nogil
    cdef void remove_range(self, uint16_t first, uint16_t last) noexcept nogil
