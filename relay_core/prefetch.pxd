# Software prefetch for the server's passes over thousands of peers: between two visits to one
# peer the server touches every other, so each visit starts cold; a pass that knows which peer
# comes next asks for its memory while it works on the current one.
cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define relay_prefetch(address) __builtin_prefetch((const void *)(address), 1, 3)
    #else
    #define relay_prefetch(address) ((void)(address))
    #endif
    """
    void relay_prefetch(const void* address) noexcept nogil


cdef inline void prefetch_lines(const void* start, Py_ssize_t size) noexcept nogil:
    """Every 64-byte line of [start, start + size), for writing."""
    cdef const char* p = <const char*>start
    cdef Py_ssize_t offset = 0
    while offset < size:
        relay_prefetch(p + offset)
        offset += 64
