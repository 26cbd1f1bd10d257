# cython: cdivision=True
from cpython.object cimport PyObject


cdef class PendingInputs:
    # What an input touches, first: with the near block's slot, one object line and one slot
    # line (a list of rows and a list per row were four).
    cdef PyObject** near_slots          # near_frames x capacity payloads (owned), NULL = none yet
    cdef readonly long long first       # the oldest frame held: the room's open frame
    cdef readonly Py_ssize_t capacity   # slots per frame
    cdef readonly Py_ssize_t near_frames
    cdef readonly long long span        # frames held from the open one: max_input_lead + 1
    cdef dict far                       # frame -> list of payloads, for frames past the near block

    cdef inline PyObject** _row(self, long long frame) noexcept:
        return self.near_slots + (frame % self.near_frames) * self.capacity

    cdef int _check_slot(self, Py_ssize_t slot) except -1
    cpdef bint put(self, long long frame, Py_ssize_t slot, bytes payload) except -1
    cpdef list take(self, long long frame)
    cpdef void drop_slot(self, Py_ssize_t slot, long long first) except *
    cpdef dict buffered(self)
