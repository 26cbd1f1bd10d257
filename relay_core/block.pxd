from libc.stdint cimport uint8_t, uint16_t, uint32_t
from relay_core.fragment cimport MemoryBudget
from relay_core.wire cimport Record

cdef class BlockSender:
    cdef object queue                   # blocks waiting behind the current one
    cdef int max_queued
    cdef readonly int slice_size
    cdef readonly int window            # slices in flight past the first unacked one
    cdef bytes data                     # current block, or None
    cdef readonly uint16_t block_id     # id of the current (or next) block
    cdef int slice_count
    cdef int base                       # every slice below base is acked
    cdef int acked_count
    cdef uint8_t* acked
    cdef double* last_sent
    cdef readonly unsigned long long slices_sent
    cdef readonly unsigned long long slices_resent

    cdef bint active(self)
    cdef bint has_due(self, double now, double interval)
    cdef double next_resend(self, double interval)
    cdef bint has_unsent(self)
    cdef Py_ssize_t write(self, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, double now, double interval)
    cdef int on_ack(self, Record* r, const uint8_t* p)
    cdef void start_next(self)
    cdef int current_slice_size(self) noexcept


cdef class BlockReceiver:
    cdef uint16_t expected              # id of the block being received
    cdef Py_ssize_t max_block_size
    cdef MemoryBudget budget            # shared by every peer of the endpoint
    cdef bytearray buffer
    cdef Py_ssize_t charged             # what buffer and received cost, charged to budget
    cdef uint32_t block_size
    cdef int slice_count
    cdef int slice_size
    cdef int received_count
    cdef int base
    cdef bytearray received
    cdef readonly bint ack_owed
    cdef bint has_completed
    cdef uint16_t completed_id
    cdef int completed_count

    cdef int on_slice(self, Record* r, const uint8_t* p, list completed)
    cdef Py_ssize_t write_ack(self, uint8_t* buf, Py_ssize_t pos, Py_ssize_t end)
    cdef void release(self)
