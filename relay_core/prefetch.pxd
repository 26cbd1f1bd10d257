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


cdef extern from "stdlib.h" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)
    void free(void* ptr)


cdef inline void* lines_alloc(size_t size) noexcept nogil:
    """``size`` bytes starting on a 64-byte line (NULL: out of memory), for a ring whose slots
    must each lie in one line: from PyMem_Malloc (16-byte aligned), a 64-byte slot spans two
    lines and every other 32-byte one does, one more wait for memory per visit. Free it with
    ``lines_free``."""
    cdef void* p = NULL
    if posix_memalign(&p, 64, size if size > 0 else 64) != 0:
        return NULL
    return p


cdef inline void lines_free(void* p) noexcept nogil:
    free(p)
