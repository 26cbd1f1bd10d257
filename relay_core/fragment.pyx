"""Fragmentation of reliable messages larger than one datagram, and capped reassembly.

A message that does not fit one datagram is cut into at most 255 fragments that share its
message id; the receiver holds them in a PartialMessage until every fragment has arrived. Every
byte a receive window holds (fragments, and whole messages waiting for an earlier one) is
charged to a per-peer MemoryBudget until it is delivered, so a peer cannot make the endpoint
buffer without bound by withholding one message.
"""
from relay_core.wire cimport DROP_BAD_FRAGMENT, DROP_MESSAGE_TOO_LARGE, DROP_REASSEMBLY_FULL

MAX_FRAGMENTS = 255


cpdef list split_message(bytes payload, Py_ssize_t fragment_size):
    if payload is None:
        raise TypeError("payload must be bytes, not None")
    if fragment_size < 1:
        # range() would refuse 0 with a message naming nothing; below 0 it would lose the payload.
        raise ValueError(f"fragment_size must be at least 1, got {fragment_size}")
    cdef Py_ssize_t n = len(payload)
    return [payload[i:i + fragment_size] for i in range(0, n, fragment_size)]


cdef class MemoryBudget:
    def __init__(self, Py_ssize_t limit):
        if limit < 0:
            raise ValueError(f"limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.used = 0


cdef class PartialMessage:
    def __init__(self, int fragment_count):
        # RELAY_PROTOCOL 6.4: a fragmented message has 2..255 fragments.
        if not 2 <= fragment_count <= MAX_FRAGMENTS:
            raise ValueError(f"fragment_count must be 2..{MAX_FRAGMENTS}, got {fragment_count}")
        self.fragment_count = fragment_count
        self.fragments = [None] * fragment_count
        self.received = 0
        self.size = 0

    cdef int add(self, int index, bytes data, MemoryBudget budget, Py_ssize_t max_message_size,
                 bint exempt):
        """0 when stored or already held, else -(DropReason + 1).

        ``exempt``: the message is the next one due for delivery; it is admitted beyond the
        budget (it is capped by max_message_size) so a full budget can never stall delivery.
        """
        cdef Py_ssize_t n = len(data)
        if index < 0 or index >= self.fragment_count:
            return -(DROP_BAD_FRAGMENT + 1)
        if self.fragments[index] is not None:
            return 0
        if self.size + n > max_message_size:
            return -(DROP_MESSAGE_TOO_LARGE + 1)
        if not exempt and not budget.fits(n):
            return -(DROP_REASSEMBLY_FULL + 1)
        self.fragments[index] = data
        self.received += 1
        self.size += n
        budget.used += n
        return 0

    cdef bytes assemble(self):
        """The whole message; its bytes stay charged until the channel delivers it."""
        cdef bytes whole = b"".join(self.fragments)
        self.fragments = [None] * self.fragment_count
        self.size = 0
        return whole

    cdef void release(self, MemoryBudget budget):
        budget.used -= self.size
        self.size = 0
        self.fragments = [None] * self.fragment_count
        self.received = 0
