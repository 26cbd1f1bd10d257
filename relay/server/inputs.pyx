"""INPUT messages from the core straight into their rooms, compiled.

Every player sends an INPUT every frame, so this is the server's per-player-per-tick receive
work. ``InputRouter`` is the core's message sink for the STREAM channel: a canonical INPUT (see
relay.frames.decode_input) from a peer seated in a room goes to the room's ``accept_input`` as
the core delivers it, with no event object, and its outcome is counted in a dict (the server
turns the counts into metrics once per tick). Whatever the core queued as events instead (when
other events were waiting, so that order holds) goes the same way through ``route``.
Everything else -- control messages, connects and disconnects, non-canonical or malformed
INPUTs, INPUTs from peers in no room -- goes to the lobby's ``on_other(event, now)``, whose
general path gives the same result for the same message (tests/relay/test_inputs.py).

The router owns the peer -> room mapping the lobby keeps up to date (``seat``, ``unseat``). A
seated player's peer is also bound to its room member (``Endpoint.bind_sink``), so the core hands
the member over with each input and no lookup by peer id is made, in the router or in the room.
The compiled relay.server.room exports its input paths as C functions (``accept_bound_input``,
``accept_room_input``), which the router calls with no Python call per input; relay.server.room
running uncompiled (tools/mutation.py mutates its source) is called as Python.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport uint8_t, int64_t

from relay.server import room as room_module
from relay_core.events import MessageReceived
from relay_core.peer cimport MessageSink
from relay.frames cimport parse_input

cdef enum:
    STREAM_CHANNEL = 1

ctypedef str (*AcceptRoomInput)(object room, int peer_id, long long frame, bytes payload,
                                long long have, double now)
ctypedef str (*AcceptBoundInput)(object member, long long frame, bytes payload, long long have,
                                 double now)
# The capsules' names are the C signatures relay/server/room.pxd declares: a mismatch fails the
# import.
cdef const char* ACCEPT_ROOM_INPUT_SIGNATURE = (
    b"PyObject *(PyObject *, int, PY_LONG_LONG, PyObject *, PY_LONG_LONG, double)")
cdef const char* ACCEPT_BOUND_INPUT_SIGNATURE = (
    b"PyObject *(PyObject *, PY_LONG_LONG, PyObject *, PY_LONG_LONG, double)")


cdef void* _compiled(str name, const char* signature) except? NULL:
    capi = getattr(room_module, "__pyx_capi__", None)
    if capi is None:            # relay.server.room is running as Python
        return NULL
    return PyCapsule_GetPointer(capi[name], signature)


cdef AcceptRoomInput accept_room_input = <AcceptRoomInput>_compiled(
    "accept_room_input", ACCEPT_ROOM_INPUT_SIGNATURE)
cdef AcceptBoundInput accept_bound_input = <AcceptBoundInput>_compiled(
    "accept_bound_input", ACCEPT_BOUND_INPUT_SIGNATURE)


cdef class InputRouter(MessageSink):
    """Canonical INPUTs on STREAM from peers in a room, into the room's ``accept_input``: as
    the core delivers them (installed with ``Endpoint.set_message_sink``: no event object, no
    queue) and from the event queue (``route``).

    Outcomes are counted in ``outcomes`` (outcome -> count; the server publishes and clears it
    every tick): a run of equal outcomes (nearly every input is "accepted") is counted in C and
    goes into the dict when another outcome comes or the dict is read. A refusal taken during the core's receive waits in ``refusals`` until the next
    ``route``, which reports it first: it came before anything in the queue.
    """
    cdef public dict room_of_peer       # peer id -> relay.server.room.Room
    cdef dict _outcomes
    cdef str run_outcome                # the latest outcome, run_count times since the dict had it
    cdef Py_ssize_t run_count
    cdef public list refusals           # (peer id, reason)
    cdef public object endpoint         # binds a seated player's peer to its member (bind_sink)

    def __init__(self, endpoint=None):
        self.channel = STREAM_CHANNEL
        self.room_of_peer = {}
        self._outcomes = {}
        self.refusals = []
        self.endpoint = endpoint

    @property
    def outcomes(self):
        """outcome -> count, up to the latest input."""
        self._fold_run()
        return self._outcomes

    @outcomes.setter
    def outcomes(self, dict value not None):
        self._fold_run()
        self._outcomes = value

    cdef int _fold_run(self) except -1:
        if self.run_count:
            self._outcomes[self.run_outcome] = self._outcomes.get(self.run_outcome, 0) + self.run_count
            self.run_count = 0
        return 0

    def seat(self, int peer_id, room not None, member=None):
        """Inputs from ``peer_id`` go to ``room`` from now on; a player's ``member`` (its
        relay.server.room.Member) is bound to its peer, so they find it with no lookup."""
        self.room_of_peer[peer_id] = room
        if self.endpoint is not None:
            if member is not None and member.slot is not None:
                # A player's DATA also waits for its room's turn in the tick (Room.group).
                self.endpoint.bind_sink(peer_id, member, room.group)
            else:
                self.endpoint.bind_sink(peer_id, None)

    def unseat(self, int peer_id):
        """``peer_id`` is in no room (any more); nothing if it was in none."""
        if self.room_of_peer.pop(peer_id, None) is not None and self.endpoint is not None:
            self.endpoint.bind_sink(peer_id, None)

    cpdef bint take_bound(self, int peer_id, object member, bytes payload, double now) except -1:
        if payload is None:
            raise TypeError("payload must be bytes, not None")
        return self._accept(peer_id, member, <const uint8_t*>PyBytes_AS_STRING(payload),
                            PyBytes_GET_SIZE(payload), now, None) == 1

    cdef int take_raw(self, int peer_id, const uint8_t* data, Py_ssize_t length,
                      double now) except -1:
        return self._accept(peer_id, None, data, length, now, None)

    cdef int take_bound_raw(self, int peer_id, object member, const uint8_t* data,
                            Py_ssize_t length, double now) except -1:
        return self._accept(peer_id, member, data, length, now, None)

    cdef int _accept(self, int peer_id, object member, const uint8_t* p, Py_ssize_t size,
                     double now, object on_refused) except -1:
        """1 when the ``size`` bytes at ``p`` are a canonical INPUT from a peer in a room (the
        room has had it), else 0 (it is for the general path). ``member``: the peer's bound
        room member, or None (the room is looked up). A refusal goes to ``on_refused``, or
        waits in ``refusals`` when that is None."""
        cdef Py_ssize_t start, length
        cdef int64_t frame = 0, have = 0
        cdef str outcome = None
        if parse_input(p, size, &frame, &start, &length, &have) < 0:
            return 0
        payload = PyBytes_FromStringAndSize(<const char*>p + start, length)
        if member is not None:
            if accept_bound_input != NULL:
                outcome = accept_bound_input(member, frame, payload, have, now)
            elif member.room is not None:
                outcome = member.room.accept_member_input(member, frame, payload, have, now)
        if outcome is None:         # not bound, or the member has left its room
            room = self.room_of_peer.get(peer_id)
            if room is None:
                return 0
            if accept_room_input != NULL:
                outcome = accept_room_input(room, peer_id, frame, payload, have, now)
            else:
                outcome = room.accept_input(peer_id, frame, payload, have, now)
        if outcome.startswith("refused:"):
            if on_refused is None:
                self.refusals.append((peer_id, outcome[8:]))
            else:
                on_refused(peer_id, outcome[8:])
        else:
            if outcome is not self.run_outcome:
                self._fold_run()
                self.run_outcome = outcome
            self.run_count += 1
        return 1

    cpdef bint take(self, int peer_id, bytes payload, double now) except -1:
        if payload is None:
            raise TypeError("payload must be bytes, not None")
        return self._accept(peer_id, None, <const uint8_t*>PyBytes_AS_STRING(payload),
                            PyBytes_GET_SIZE(payload), now, None) == 1

    def route(self, endpoint, object on_other, object on_refused, double now):
        """Report the refusals taken since the last call to ``on_refused(peer_id, reason)``,
        then drain ``endpoint``'s events in order: INPUTs as ``take`` handles them, everything
        else to ``on_other(event, now)``. Returns the number of inputs handled from the queue."""
        cdef Py_ssize_t handled = 0
        if self.refusals:
            refusals, self.refusals = self.refusals, []
            for peer_id, reason in refusals:
                on_refused(peer_id, reason)
        next_event = endpoint.next_event
        while True:
            event = next_event()
            if event is None:
                break
            payload = event.payload if type(event) is MessageReceived else None
            if (payload is not None and (<int>event.channel) == STREAM_CHANNEL
                    and type(payload) is bytes
                    and self._accept(event.peer_id, None, <const uint8_t*>PyBytes_AS_STRING(payload),
                                     PyBytes_GET_SIZE(payload), now, on_refused)):
                handled += 1
                continue
            on_other(event, now)
        return handled
