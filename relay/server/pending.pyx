# cython: language_level=3
# cython: cdivision=True
"""A room's inputs for the frames not yet closed, by frame and slot, over one C block.

Every player's every input is written here and read back when its frame closes, in a pass over
thousands of players that leaves each room cold: an input costs the cache lines it touches. The
next ``NEAR_FRAMES`` frames from the open one (any input delay a client is advised, by default)
sit in one block, frame n's slots at row n modulo its height, so an input touches this object's
line and its slot's. Inputs sent further ahead (up to ``max_input_lead`` frames) wait in a dict
of rows and move into the block as their frame comes near.
"""
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF

cdef enum:
    # Frames from the open one held in the block: a client advised up to 15 frames of input
    # delay (half a second at 30 Hz) never leaves it.
    NEAR_FRAMES = 16


cdef class PendingInputs:
    """Payloads (bytes) waiting for their frame to close: ``put`` one for (frame, slot),
    ``take`` the open frame's row when it closes (the next frame becomes the open one)."""

    def __cinit__(self, Py_ssize_t capacity, long long span):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if span < 1:
            raise ValueError(f"span must be at least 1 frame, got {span}")
        self.capacity = capacity
        self.span = span
        self.near_frames = min(span, <long long>NEAR_FRAMES)
        self.first = 0
        self.far = {}
        self.near_slots = <PyObject**>PyMem_Calloc(self.near_frames * capacity, sizeof(PyObject*))
        if self.near_slots == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.near_slots != NULL:
            for i in range(self.near_frames * self.capacity):
                Py_XDECREF(self.near_slots[i])
            PyMem_Free(self.near_slots)

    cdef int _check_slot(self, Py_ssize_t slot) except -1:
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} is outside 0 to {self.capacity - 1}")
        return 0

    cpdef bint put(self, long long frame, Py_ssize_t slot, bytes payload) except -1:
        """Hold ``payload`` for (frame, slot); False (nothing changes) if that slot already holds
        one. ValueError for a frame outside first .. first + span - 1, IndexError for a slot
        outside the capacity."""
        cdef PyObject** row
        cdef list far_row
        if payload is None:
            raise TypeError("payload must be bytes, not None")
        if not self.first <= frame < self.first + self.span:
            raise ValueError(f"frame {frame} is outside the frames held, {self.first} to "
                             f"{self.first + self.span - 1}")
        self._check_slot(slot)
        if frame < self.first + self.near_frames:
            row = self._row(frame)
            if row[slot] != NULL:
                return False
            Py_INCREF(payload)
            row[slot] = <PyObject*>payload
            return True
        far_row = self.far.get(frame)
        if far_row is None:
            far_row = [None] * self.capacity
            self.far[frame] = far_row
        elif far_row[slot] is not None:
            return False
        far_row[slot] = payload
        return True

    cpdef list take(self, long long frame):
        """The payloads held for ``frame``, which must be the oldest held (the room's open
        frame), by slot (None where none came), or None if none came at all; the frame after
        it becomes the oldest."""
        cdef PyObject** row
        cdef Py_ssize_t slot
        cdef bint held = False
        cdef list taken = None
        cdef list coming
        cdef object payload
        if frame != self.first:
            raise ValueError(f"frame {frame} is not the oldest held, {self.first}")
        row = self._row(frame)
        for slot in range(self.capacity):
            if row[slot] != NULL:
                held = True
                break
        if held:
            taken = PyList_New(self.capacity)
            for slot in range(self.capacity):
                # The row's references move into the list; the list owns None where none came.
                if row[slot] == NULL:
                    Py_INCREF(None)
                    PyList_SET_ITEM(taken, slot, None)
                else:
                    PyList_SET_ITEM(taken, slot, <object>row[slot])
                    row[slot] = NULL
        self.first = frame + 1
        # The frame that just came near takes the row freed (frame + near_frames is congruent to
        # frame modulo near_frames).
        if self.far:
            coming = self.far.pop(frame + self.near_frames, None)
            if coming is not None:
                for slot in range(self.capacity):
                    payload = coming[slot]
                    if payload is not None:
                        Py_INCREF(payload)
                        row[slot] = <PyObject*>payload
        return taken

    cpdef void drop_slot(self, Py_ssize_t slot, long long first) except *:
        """Forget what ``slot`` holds for frame ``first`` and later."""
        cdef long long frame
        cdef PyObject** row
        self._check_slot(slot)
        for frame in range(max(first, self.first), self.first + self.near_frames):
            row = self._row(frame)
            Py_XDECREF(row[slot])
            row[slot] = NULL
        for frame, far_row in self.far.items():
            if frame >= first:
                far_row[slot] = None

    cpdef dict buffered(self):
        """frame -> slot -> payload, for every frame holding at least one."""
        cdef dict held = {}
        cdef long long frame
        cdef Py_ssize_t slot
        cdef PyObject** row
        cdef dict by_slot
        for frame in range(self.first, self.first + self.near_frames):
            row = self._row(frame)
            by_slot = {slot: <object>row[slot] for slot in range(self.capacity) if row[slot] != NULL}
            if by_slot:
                held[frame] = by_slot
        for frame in sorted(self.far):
            by_slot = {slot: payload for slot, payload in enumerate(self.far[frame]) if payload is not None}
            if by_slot:
                held[frame] = by_slot
        return held
