# cython: language_level=3
# cython: cdivision=True
"""A room's inputs for the frames not yet closed, by frame and slot, in C rows; the open
frame's FRAME is encoded straight from its row.

Every player's every input is written here and read back when its frame closes, in a pass over
thousands of players that leaves each room cold: an input costs the cache lines it touches. The
next ``NEAR_FRAMES`` frames from the open one (any input delay a client is advised, by default)
have a row each, frame n's at row n modulo their number: per slot, where its payload sits in
the row's byte buffer and how long it is. The payloads are copied in as they arrive (no object
per input) and the row is encoded in place when its frame closes (relay.frames'
``encode_frame_refs``); the row then becomes the previous frame's, which the next frame is
encoded against ("same as previous") and the "repeat" missing-input policy copies from.
Inputs sent further ahead (up to ``max_input_lead`` frames) wait in a dict of rows of bytes and
move into their row as their frame comes near.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcpy, memset

from relay.frames cimport encode_frame_refs, mark_synthesized

cdef enum:
    # Frames from the open one with a row: a client advised up to 15 frames of input delay
    # (half a second at 30 Hz) never leaves them.
    NEAR_FRAMES = 16
    # A row's first buffer, per slot: a typical input (16 bytes) and its neighbours' fit.
    FIRST_BYTES_PER_SLOT = 24
    # Slots whose references for an encoding sit on the stack (rooms.capacity's ceiling).
    REFS_ON_STACK = 256
    SYNTH_BYTES_ON_STACK = 32           # REFS_ON_STACK bits


cdef class PendingInputs:
    """Payloads waiting for their frame to close: ``put`` one for (frame, slot); when the open
    frame closes, ``missing`` names its slots with none, ``repeat`` copies the previous frame's
    into one, and ``close`` encodes it (the next frame becomes the open one)."""

    def __cinit__(self, Py_ssize_t capacity, long long span):
        cdef Py_ssize_t i
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if span < 1:
            raise ValueError(f"span must be at least 1 frame, got {span}")
        self.capacity = capacity
        self.span = span
        self.near_frames = min(span, <long long>NEAR_FRAMES)
        self.first = 0
        self.far = {}
        # near_frames rows and the previous frame's, the last
        self.cells = <Cell*>PyMem_Malloc((self.near_frames + 1) * capacity * sizeof(Cell))
        self.rows = <Row*>PyMem_Calloc(self.near_frames + 1, sizeof(Row))
        if self.cells == NULL or self.rows == NULL:
            raise MemoryError()
        for i in range((self.near_frames + 1) * capacity):
            self.cells[i].size = -1

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.rows != NULL:
            for i in range(self.near_frames + 1):
                PyMem_Free(self.rows[i].data)
            PyMem_Free(self.rows)
        PyMem_Free(self.cells)

    cdef int _check_slot(self, Py_ssize_t slot) except -1:
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} is outside 0 to {self.capacity - 1}")
        return 0

    cdef int _check_frame(self, long long frame) except -1:
        if not self.first <= frame < self.first + self.span:
            raise ValueError(f"frame {frame} is outside the frames held, {self.first} to "
                             f"{self.first + self.span - 1}")
        return 0

    cdef int _store(self, Py_ssize_t row, Py_ssize_t slot, const uint8_t* data,
                    Py_ssize_t size) except -1:
        """Copy ``size`` bytes at ``data`` into ``row`` as ``slot``'s payload."""
        cdef Row* target = &self.rows[row]
        cdef Cell* cell = &self.cells[row * self.capacity + slot]
        cdef Py_ssize_t wanted = target.used + size, grown
        cdef uint8_t* data_grown
        if wanted > target.allocated or target.data == NULL:    # a payload's data is never NULL
            grown = max(wanted, 2 * <Py_ssize_t>target.allocated,
                        self.capacity * FIRST_BYTES_PER_SLOT)
            data_grown = <uint8_t*>PyMem_Realloc(target.data, grown)
            if data_grown == NULL:
                raise MemoryError()
            target.data = data_grown
            target.allocated = <uint32_t>grown
        if size:
            memcpy(target.data + target.used, data, size)
        cell.offset = target.used
        cell.size = <int>size
        target.used = <uint32_t>wanted
        return 0

    cdef int put_raw(self, long long frame, Py_ssize_t slot, const uint8_t* data,
                     Py_ssize_t size) except -1:
        """``put`` of the ``size`` bytes at ``data``: 1 if held, 0 for a duplicate."""
        cdef Py_ssize_t row
        cdef list far_row
        self._check_frame(frame)
        self._check_slot(slot)
        if frame < self.first + self.near_frames:
            row = self._row(frame)
            if self.cells[row * self.capacity + slot].size >= 0:
                return 0
            self._store(row, slot, data, size)
            return 1
        far_row = self.far.get(frame)
        if far_row is None:
            far_row = [None] * self.capacity
            self.far[frame] = far_row
        elif far_row[slot] is not None:
            return 0
        far_row[slot] = PyBytes_FromStringAndSize(<const char*>data, size)
        return 1

    cpdef bint put(self, long long frame, Py_ssize_t slot, bytes payload) except -1:
        """Hold ``payload`` for (frame, slot); False (nothing changes) if that slot already holds
        one. ValueError for a frame outside first .. first + span - 1, IndexError for a slot
        outside the capacity."""
        if payload is None:
            raise TypeError("payload must be bytes, not None")
        return self.put_raw(frame, slot, <const uint8_t*>PyBytes_AS_STRING(payload),
                            PyBytes_GET_SIZE(payload)) == 1

    cpdef object missing(self, Py_ssize_t count):
        """The open frame's slots below ``count`` with no input (a list), or an empty tuple
        (all have one)."""
        cdef Cell* cells = self.cells + self._row(self.first) * self.capacity
        cdef Py_ssize_t slot
        cdef list slots = None
        for slot in range(min(count, self.capacity)):
            if cells[slot].size < 0:
                if slots is None:
                    slots = []
                slots.append(slot)
        return () if slots is None else slots

    cpdef bint repeat(self, Py_ssize_t slot) except -1:
        """Give ``slot`` of the open frame the previous frame's input for it: False (nothing
        changes) if the previous frame had none or the slot has one."""
        cdef Py_ssize_t row = self._row(self.first)
        cdef Cell earlier
        self._check_slot(slot)
        earlier = self.cells[self.near_frames * self.capacity + slot]
        if earlier.size < 0 or self.cells[row * self.capacity + slot].size >= 0:
            return False
        self._store(row, slot, self.rows[self.near_frames].data + earlier.offset, earlier.size)
        return True

    cpdef bytes close(self, long long frame, Py_ssize_t count, list synthesized, list events):
        """Encode ``frame``, which must be the open one (the oldest held), with its first
        ``count`` slots (at most the capacity), against the previous frame, with ``synthesized`` (slot indexes made up, each holding an input; None: none)
        and ``events`` (kind, slot, player); it becomes the previous frame and the frame after it
        the open one. Nothing changes if the encoding fails (ValueError)."""
        cdef Py_ssize_t capacity = self.capacity, slot, row, previous_row = self.near_frames
        cdef InputRef refs_here[2 * REFS_ON_STACK]
        cdef uint8_t synth_here[SYNTH_BYTES_ON_STACK]
        cdef InputRef* refs = refs_here
        cdef uint8_t* synth = synth_here
        cdef Py_ssize_t width = (capacity + 7) >> 3
        cdef Row emptied
        cdef bytes out
        if frame != self.first:
            raise ValueError(f"frame {frame} is not the oldest held, {self.first}")
        if not 0 <= count <= capacity:
            raise ValueError(f"count {count} is outside 0 to {capacity}")
        row = self._row(frame)
        if capacity > REFS_ON_STACK:
            refs = <InputRef*>PyMem_Malloc(2 * capacity * sizeof(InputRef))
            synth = <uint8_t*>PyMem_Malloc(width)
            if refs == NULL or synth == NULL:
                PyMem_Free(refs)
                PyMem_Free(synth)
                raise MemoryError()
        try:
            self._refs(row, refs)
            self._refs(previous_row, refs + capacity)
            if synthesized:
                memset(synth, 0, width)
                mark_synthesized(synth, synthesized, count, frame)
            out = encode_frame_refs(frame, count, refs, refs + capacity, count,
                                    synth if synthesized else NULL, events if events else None)
        finally:
            if refs != refs_here:
                PyMem_Free(refs)
                PyMem_Free(synth)
        # The closed row becomes the previous frame's (buffers swapped, not copied) and the
        # previous frame's buffer is the emptied row's, for frame + near_frames.
        emptied = self.rows[previous_row]
        self.rows[previous_row] = self.rows[row]
        emptied.used = 0
        self.rows[row] = emptied
        memcpy(self.cells + previous_row * capacity, self.cells + row * capacity,
               capacity * sizeof(Cell))
        for slot in range(capacity):
            self.cells[row * capacity + slot].size = -1
        self.first = frame + 1
        if self.far:
            self._come_near(frame + self.near_frames, row)
        return out

    cdef void _refs(self, Py_ssize_t row, InputRef* refs) noexcept:
        cdef Cell* cells = self.cells + row * self.capacity
        cdef const uint8_t* data = self.rows[row].data
        cdef Py_ssize_t slot
        for slot in range(self.capacity):
            refs[slot].size = cells[slot].size
            refs[slot].data = data + cells[slot].offset if cells[slot].size >= 0 else NULL

    cdef int _come_near(self, long long frame, Py_ssize_t row) except -1:
        """The far row of ``frame``, if any, into ``row`` (its frame has just come near)."""
        cdef list coming = self.far.pop(frame, None)
        cdef Py_ssize_t slot
        if coming is None:
            return 0
        for slot in range(self.capacity):
            payload = coming[slot]
            if payload is not None:
                self._store(row, slot, <const uint8_t*>PyBytes_AS_STRING(payload),
                            PyBytes_GET_SIZE(payload))
        return 0

    cpdef void drop_slot(self, Py_ssize_t slot, long long first) except *:
        """Forget what ``slot`` holds for frame ``first`` and later (the bytes stay in their
        row's buffer until the row is emptied)."""
        cdef long long frame
        self._check_slot(slot)
        for frame in range(max(first, self.first), self.first + self.near_frames):
            self.cells[self._row(frame) * self.capacity + slot].size = -1
        for frame, far_row in self.far.items():
            if frame >= first:
                far_row[slot] = None

    cdef object _payload(self, Py_ssize_t row, Py_ssize_t slot):
        cdef Cell cell = self.cells[row * self.capacity + slot]
        if cell.size < 0:
            return None
        return PyBytes_FromStringAndSize(<const char*>self.rows[row].data + cell.offset,
                                         cell.size)

    cpdef dict buffered(self):
        """frame -> slot -> payload, for every frame holding at least one."""
        cdef dict held = {}
        cdef long long frame
        cdef Py_ssize_t slot
        cdef dict by_slot
        for frame in range(self.first, self.first + self.near_frames):
            by_slot = {}
            for slot in range(self.capacity):
                payload = self._payload(self._row(frame), slot)
                if payload is not None:
                    by_slot[slot] = payload
            if by_slot:
                held[frame] = by_slot
        for frame in sorted(self.far):
            by_slot = {slot: payload for slot, payload in enumerate(self.far[frame]) if payload is not None}
            if by_slot:
                held[frame] = by_slot
        return held

    cpdef list previous(self):
        """The last closed frame's inputs by slot (None where it had none; all None before the
        first frame closes)."""
        return [self._payload(self.near_frames, slot) for slot in range(self.capacity)]
