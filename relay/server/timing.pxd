from libc.stdint cimport uint64_t


cdef enum:
    LATE_BITS_INLINE = 4        # words of late marks kept in the object: windows up to 256


cdef class InputTiming:
    # What record() touches, first: the late marks of a window up to 256 sit in these lines
    # (late_inline), so an input costs no cache line beyond the object and its response slot.
    cdef uint64_t* late_bits            # bit i: input i of the ring missed its frame
    cdef float* responses
    cdef readonly Py_ssize_t window
    cdef readonly Py_ssize_t samples
    cdef Py_ssize_t next_response
    cdef readonly Py_ssize_t late_count
    cdef readonly Py_ssize_t late_seen
    cdef Py_ssize_t next_late
    cdef uint64_t late_inline[LATE_BITS_INLINE]
    cdef public object advised
    cdef public double advised_at
    cdef public double lowerable_since  # since when a lower advice would do (-1: it would not)
    cdef public Py_ssize_t response_ms

    cpdef void record(self, bint late, double response)
    cpdef double percentile(self, double percent) except? -1.0


cdef class CloseTimes:
    cdef long long* numbers
    cdef double* closed_at

    cpdef int record(self, long long number, double now) except -1
    cpdef double since(self, long long number, double now)
