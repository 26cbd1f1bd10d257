cdef class InputTimes:
    # A room's table, row r for the frame answered tags[r] (-1: none): per slot a mark byte
    # and a response time. One row holds all the room's players, so the inputs of one tick
    # write one or two lines between them (a ring per player cost each input two cold lines).
    cdef char* table
    cdef readonly Py_ssize_t slots
    cdef readonly Py_ssize_t window
    cdef Py_ssize_t row_bytes
    cdef Py_ssize_t responses_at        # offset of the response times in a row

    cdef inline char* _row(self, long long answered) noexcept:
        return self.table + (answered % self.window) * self.row_bytes

    cdef int _check_slot(self, Py_ssize_t slot) except -1

    cpdef void record(self, Py_ssize_t slot, long long answered, bint late, double response) except *
    cpdef void clear_slot(self, Py_ssize_t slot) except *
    cpdef tuple review(self, Py_ssize_t slot, long long newest, double percent)


cdef class CloseTimes:
    cdef long long* numbers
    cdef double* closed_at

    cpdef int record(self, long long number, double now) except -1
    cpdef double since(self, long long number, double now)
