from libc.stdint cimport uint8_t, int64_t

cdef Py_ssize_t parse_input(const uint8_t* p, Py_ssize_t n, int64_t* frame, Py_ssize_t* start,
                            Py_ssize_t* length, int64_t* have) noexcept
