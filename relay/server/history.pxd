# Compiles relay/server/history.py (Cython's pure Python mode): a room appends a frame to its
# history every tick from compiled code, so the append is a C call rather than a Python frame.
# relay/server/history.py stays a plain Python module that runs the same uncompiled.

cdef class FrameHistory:
    cdef public Py_ssize_t keep
    cdef public object directory
    cdef public object _chunk_ends
    cdef public list _recent
    cdef public object _file
    cdef public object _memory
    cdef public long long _size
    cdef public Py_ssize_t _spill_at
    cdef public long long spool_failures

    cpdef append(self, data)
