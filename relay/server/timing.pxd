cdef class InputTimes:
    # A room's table, a row per recent frame (its number, -1: none, and when it closed), and in
    # it per slot a mark byte and a response time. One row holds all the room's players, so the
    # inputs of one tick read and write one or two lines between them (a ring per player and a
    # room's separate close times cost each input three cold lines).
    cdef char* table
    cdef readonly Py_ssize_t slots
    cdef readonly Py_ssize_t window
    cdef Py_ssize_t row_bytes
    cdef Py_ssize_t responses_at        # offset of the response times in a row

    cdef inline char* _row(self, long long answered) noexcept:
        return self.table + (answered % self.window) * self.row_bytes

    cdef int _check_slot(self, Py_ssize_t slot) except -1

    cpdef void close(self, long long frame, double now) except *
    cpdef double answer(self, Py_ssize_t slot, long long answered, bint late, double now) except? -2.0
    cpdef void clear_slot(self, Py_ssize_t slot) except *
    cpdef tuple review(self, Py_ssize_t slot, long long newest, double percent)
