from libc.stdint cimport uint8_t, int64_t

cdef Py_ssize_t parse_input(const uint8_t* p, Py_ssize_t n, int64_t* frame, Py_ssize_t* start,
                            Py_ssize_t* length, int64_t* have) noexcept


# One input of a frame being encoded: its bytes, or size -1 for none.
cdef struct InputRef:
    const uint8_t* data
    Py_ssize_t size

cdef bytes encode_frame_refs(Py_ssize_t number, Py_ssize_t count, const InputRef* inputs,
                             const InputRef* previous, Py_ssize_t previous_count,
                             const uint8_t* synthesized, list events)

# The bitmap of a frame's synthesized slots from their list (encode_frame_refs' argument).
cdef int mark_synthesized(uint8_t* bitmap, list synthesized, Py_ssize_t count,
                          Py_ssize_t number) except -1
