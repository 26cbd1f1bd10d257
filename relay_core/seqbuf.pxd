from libc.stdint cimport uint16_t, uint32_t

cdef enum:
    EMPTY_TAG = 0xFFFFFFFF      # a slot that holds no sequence number


# The ring's tags as a bare C array, for an owner that keeps it inline (the peer's received
# packets): slot = seq % size, size a power of two. SequenceBuffer wraps one.
cdef uint32_t* tags_new(int size) except NULL
cdef void tags_remove_range(uint32_t* tags, int size, uint16_t first, uint16_t last) noexcept nogil

cdef inline bint tags_contain(const uint32_t* tags, int size, uint16_t seq) noexcept nogil:
    return tags[seq & (size - 1)] == seq

cdef inline int tags_insert(uint32_t* tags, int size, uint16_t seq) noexcept nogil:
    cdef int index = seq & (size - 1)
    tags[index] = seq
    return index


cdef class SequenceBuffer:
    """Which 16-bit sequence numbers are stored: slot = seq % size, tag = the seq itself.

    Owners keep their per-entry data in parallel C arrays indexed by the returned slot.
    """
    cdef uint32_t* tags        # EMPTY_TAG or the sequence number held in the slot
    cdef readonly int size

    cdef inline int slot(self, uint16_t seq) noexcept nogil:
        return seq & (self.size - 1)        # size is a power of two: no division

    cdef inline bint contains(self, uint16_t seq) noexcept nogil:
        return tags_contain(self.tags, self.size, seq)

    cdef int insert(self, uint16_t seq) noexcept nogil
    cdef void remove(self, uint16_t seq) noexcept nogil
    cdef void remove_range(self, uint16_t first, uint16_t last) noexcept nogil
