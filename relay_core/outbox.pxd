# Datagrams written in place for sendmmsg (Endpoint.flush_in_place): one growing buffer and one
# entry per datagram with its destination as a sockaddr, reused every flush, so the server's
# DATA never becomes a bytes object and an address tuple. A C struct with inline helpers only:
# nothing to import at run time.
from cpython.mem cimport PyMem_Realloc
from libc.stdint cimport uint8_t
from libc.string cimport memcpy


cdef struct OutDatagram:
    Py_ssize_t offset                   # in Outbox.data
    Py_ssize_t length
    uint8_t address[28]                 # a sockaddr_in or sockaddr_in6 (Peer.raw_address)


cdef struct Outbox:
    uint8_t* data
    Py_ssize_t used
    Py_ssize_t capacity
    OutDatagram* items
    Py_ssize_t count
    Py_ssize_t item_capacity


cdef inline uint8_t* outbox_reserve(Outbox* box, Py_ssize_t size) except NULL:
    """Room for one more datagram of up to ``size`` bytes: where to write it. Valid until the next
    reserve (the buffer may move)."""
    cdef Py_ssize_t capacity
    cdef void* grown
    if box.used + size > box.capacity:
        capacity = max(2 * box.capacity, box.used + size, 16384)
        grown = PyMem_Realloc(box.data, capacity)
        if grown == NULL:
            raise MemoryError()
        box.data = <uint8_t*>grown
        box.capacity = capacity
    if box.count == box.item_capacity:
        capacity = max(2 * box.item_capacity, 64)
        grown = PyMem_Realloc(box.items, capacity * sizeof(OutDatagram))
        if grown == NULL:
            raise MemoryError()
        box.items = <OutDatagram*>grown
        box.item_capacity = capacity
    return box.data + box.used


cdef inline void outbox_commit(Outbox* box, Py_ssize_t length, const uint8_t* address) noexcept:
    """The datagram written at the last reserve is ``length`` bytes long, for ``address``."""
    cdef OutDatagram* item = &box.items[box.count]
    item.offset = box.used
    item.length = length
    memcpy(item.address, address, 28)
    box.used += length
    box.count += 1
