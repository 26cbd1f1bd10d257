from libc.stdint cimport uint8_t


cdef class InputTiming:
    cdef float* responses
    cdef uint8_t* late
    cdef readonly Py_ssize_t window
    cdef readonly Py_ssize_t samples
    cdef Py_ssize_t next_response
    cdef readonly Py_ssize_t late_count
    cdef readonly Py_ssize_t late_seen
    cdef Py_ssize_t next_late
    cdef public object advised
    cdef public double advised_at
    cdef public Py_ssize_t response_ms

    cpdef void record(self, bint late, double response)
    cpdef double percentile(self, double percent) except? -1.0


cdef class CloseTimes:
    cdef long long* numbers
    cdef double* closed_at

    cpdef int record(self, long long number, double now) except -1
    cpdef double since(self, long long number, double now)
