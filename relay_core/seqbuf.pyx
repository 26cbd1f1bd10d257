"""Sequence buffer: a fixed ring indexed by sequence number modulo its size.

Used for sent packets, received packets and per-channel message windows. The tag check makes
a stale entry from ``size`` sequence numbers ago read as absent, which is what keeps the buffers
correct across the 65535 -> 0 wrap. Sizes must divide 65536 (powers of two) so that the slot of
a sequence stays the same after the wrap.
"""
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport uint16_t, uint32_t

cdef uint32_t* tags_new(int size) except NULL:
    """``size`` empty slots (free them with PyMem_Free)."""
    cdef uint32_t* tags
    cdef int i
    if size <= 0 or size > 32768 or (size & (size - 1)) != 0:
        raise ValueError(f"sequence buffer size must be a power of two in 1..32768, got {size}")
    tags = <uint32_t*>PyMem_Malloc(size * sizeof(uint32_t))
    if tags == NULL:
        raise MemoryError()
    for i in range(size):
        tags[i] = EMPTY_TAG
    return tags


cdef void tags_remove_range(uint32_t* tags, int size, uint16_t first, uint16_t last) noexcept nogil:
    """Clear every slot for first..last inclusive (a forward jump skipped them)."""
    cdef uint32_t count = <uint16_t>(last - first) + 1
    cdef uint32_t i
    if count >= <uint32_t>size:
        for i in range(<uint32_t>size):
            tags[i] = EMPTY_TAG
        return
    for i in range(count):
        tags[<uint16_t>(first + i) & (size - 1)] = EMPTY_TAG


cdef class SequenceBuffer:
    def __cinit__(self, int size):
        self.tags = tags_new(size)
        self.size = size

    def __dealloc__(self):
        PyMem_Free(self.tags)

    cdef int insert(self, uint16_t seq) noexcept nogil:
        return tags_insert(self.tags, self.size, seq)

    cdef void remove(self, uint16_t seq) noexcept nogil:
        cdef int index = seq & (self.size - 1)
        if self.tags[index] == seq:
            self.tags[index] = EMPTY_TAG

    cdef void remove_range(self, uint16_t first, uint16_t last) noexcept nogil:
        tags_remove_range(self.tags, self.size, first, last)

    # Python-level access for tests and tooling.
    def __contains__(self, int seq):
        return self.contains(<uint16_t>seq)

    def add(self, int seq):
        return self.insert(<uint16_t>seq)

    def discard(self, int seq):
        self.remove(<uint16_t>seq)

    def discard_range(self, int first, int last):
        self.remove_range(<uint16_t>first, <uint16_t>last)
