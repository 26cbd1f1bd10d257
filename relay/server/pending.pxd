# cython: cdivision=True
from libc.stdint cimport uint8_t, uint32_t

from relay.frames cimport InputRef


cdef struct Cell:                       # one slot of one frame's row
    uint32_t offset                     # its payload's place in the row's buffer
    int size                            # its length; -1: no input

cdef struct Row:                        # one frame's payloads, back to back
    uint8_t* data
    uint32_t used
    uint32_t allocated


cdef class PendingInputs:
    # What an input touches, first: this object's line, its cell's (a row's cells share one
    # line in rooms of 8) and its row's buffer.
    cdef Cell* cells                    # (near_frames + 1) x capacity: the near rows, then the previous frame's
    cdef Row* rows                      # their buffers, in the same order
    cdef readonly long long first       # the oldest frame held: the room's open frame
    cdef readonly Py_ssize_t capacity   # slots per frame
    cdef readonly Py_ssize_t near_frames
    cdef readonly long long span        # frames held from the open one: max_input_lead + 1
    cdef dict far                       # frame -> list of payloads, for frames past the near rows

    cdef inline Py_ssize_t _row(self, long long frame) noexcept:
        return frame % self.near_frames

    cdef int _check_slot(self, Py_ssize_t slot) except -1
    cdef int _check_frame(self, long long frame) except -1
    cdef int _store(self, Py_ssize_t row, Py_ssize_t slot, const uint8_t* data,
                    Py_ssize_t size) except -1
    cdef int put_raw(self, long long frame, Py_ssize_t slot, const uint8_t* data,
                     Py_ssize_t size) except -1
    cpdef bint put(self, long long frame, Py_ssize_t slot, bytes payload) except -1
    cpdef object missing(self, Py_ssize_t count)
    cpdef bint repeat(self, Py_ssize_t slot) except -1
    cpdef bytes close(self, long long frame, Py_ssize_t count, list synthesized, list events)
    cdef void _refs(self, Py_ssize_t row, InputRef* refs) noexcept
    cdef int _come_near(self, long long frame, Py_ssize_t row) except -1
    cpdef void drop_slot(self, Py_ssize_t slot, long long first) except *
    cdef object _payload(self, Py_ssize_t row, Py_ssize_t slot)
    cpdef dict buffered(self)
    cpdef list previous(self)
