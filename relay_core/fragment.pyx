"""Fragmentation of reliable messages larger than one datagram, and capped reassembly.

A message that does not fit one datagram is cut into at most 255 fragments that share its
message id; the receiver holds them in a PartialMessage until every fragment has arrived. Every
byte a receive window holds (fragments, and whole messages waiting for an earlier one) is
charged to a per-peer MemoryBudget until it is delivered, so a peer cannot make the endpoint
buffer without bound by withholding one message. What is charged includes what holding the
bytes costs (object headers, fragment lists): a 1-byte fragment is not free. The per-peer
budget's parent is the endpoint's receive budget, shared by all peers and by block receive.
"""
from relay_core.wire cimport (
    DROP_BAD_FRAGMENT, DROP_MESSAGE_TOO_LARGE, DROP_REASSEMBLY_FULL, DROP_RECEIVE_MEMORY_FULL,
)

MAX_FRAGMENTS = 255


cpdef list split_message(bytes payload, Py_ssize_t fragment_size):
    if payload is None:
        raise TypeError("payload must be bytes, not None")
    if fragment_size < 1:
        # range() would refuse 0 with a message naming nothing; below 0 it would lose the payload.
        raise ValueError(f"fragment_size must be at least 1, got {fragment_size}")
    cdef Py_ssize_t n = len(payload)
    return [payload[i:i + fragment_size] for i in range(0, n, fragment_size)]


cdef int refusal(int admitted) noexcept:
    """The drop (as -(DropReason + 1)) for a refused MemoryBudget.admit."""
    if admitted == ADMIT_SHARED_LIMIT:
        return -(DROP_RECEIVE_MEMORY_FULL + 1)
    return -(DROP_REASSEMBLY_FULL + 1)


cdef class MemoryBudget:
    def __init__(self, Py_ssize_t limit, MemoryBudget parent=None):
        if limit < 0:
            raise ValueError(f"limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.used = 0
        self.parent = parent


cdef class PartialMessage:
    def __init__(self, int fragment_count):
        # RELAY_PROTOCOL 6.4: a fragmented message has 2..255 fragments.
        if not 2 <= fragment_count <= MAX_FRAGMENTS:
            raise ValueError(f"fragment_count must be 2..{MAX_FRAGMENTS}, got {fragment_count}")
        self.fragment_count = fragment_count
        self.fragments = [None] * fragment_count
        self.received = 0
        self.size = 0
        self.charged = 0

    cdef int add(self, int index, bytes data, MemoryBudget budget, Py_ssize_t max_message_size,
                 bint exempt):
        """0 when stored or already held, else -(DropReason + 1).

        ``exempt``: the message is the next one due for delivery; it is admitted beyond the
        peer's own budget (it is capped by max_message_size) so the peer's other held messages
        can never stall delivery. It must still fit the endpoint-wide parent budget.
        """
        cdef Py_ssize_t n = len(data)
        cdef Py_ssize_t cost = n + PIECE_OVERHEAD
        cdef int admitted
        if index < 0 or index >= self.fragment_count:
            return -(DROP_BAD_FRAGMENT + 1)
        if self.fragments[index] is not None:
            return 0
        if self.size + n > max_message_size:
            return -(DROP_MESSAGE_TOO_LARGE + 1)
        if self.received == 0:
            cost += PARTIAL_OVERHEAD + 8 * self.fragment_count
        admitted = budget.admit(cost, exempt)
        if admitted != ADMIT_OK:
            return refusal(admitted)
        self.fragments[index] = data
        self.received += 1
        self.size += n
        self.charged += cost
        budget.charge(cost)
        return 0

    cdef bytes assemble(self):
        """The whole message; ``charged`` stays charged until the channel takes it over."""
        cdef bytes whole = b"".join(self.fragments)
        self.fragments = [None] * self.fragment_count
        self.size = 0
        return whole

    cdef void release(self, MemoryBudget budget):
        budget.credit(self.charged)
        self.charged = 0
        self.size = 0
        self.fragments = [None] * self.fragment_count
        self.received = 0
