# Compiles relay/server/room.py (Cython's pure Python mode): the room's fields, declared once, as C
# fields, and its per-input and per-tick paths as C methods. relay/server/room.py stays a plain Python
# module that runs the same uncompiled (tools/mutation.py mutates it so).
cimport cython

from relay.server.pending cimport PendingInputs
from relay.server.timing cimport InputTimes


cdef class Slot:
    cdef public Py_ssize_t index
    cdef public str player
    cdef public object peer_id          # None while the player is away
    cdef public bint ready
    cdef public object away_since


cdef class Room


cdef class Member:
    # What an input and the frame's fan-out read each tick first, together: with the object's
    # header, its first line or two.
    cdef public Room room
    cdef public object peer_id          # an int, kept as the object: a frame's recipients list it each tick
    cdef public object slot             # slot index, or None for a spectator
    cdef public bint spectator
    cdef public bint reported
    cdef public bint catching_up
    cdef public long long have
    cdef public long long last_sent
    cdef public object missing_from
    # Spectators, catching up and the player's name.
    cdef public long long next_live
    cdef public long long blocks_in_flight
    cdef public long long block_first
    cdef public long long block_end
    cdef public str player
    # the input-delay advice (players only; read at its reviews)
    cdef public object advised
    cdef public double advised_at
    cdef public double lowerable_since
    cdef public Py_ssize_t response_ms


cdef class Room:
    cdef public str room_id
    cdef public object settings
    cdef public Py_ssize_t max_input_bytes
    cdef readonly long long max_input_lead
    cdef public bint drop_late_inputs
    cdef public int tick_rate
    cdef public object capacity
    cdef public str start_policy
    cdef public object start_players
    cdef public str state
    cdef public double created_at
    cdef public object started_at
    cdef public object empty_since
    cdef public list slots
    cdef public dict members
    cdef public long long open_frame
    cdef public object history
    cdef readonly PendingInputs pending # inputs for the open frame and those after it
    cdef public list pending_events
    cdef public str missing_input_policy
    cdef public object neutral_input
    cdef public long long synthesized_inputs
    cdef public dict checksums
    cdef public object first_desync
    cdef public set reported_desyncs
    cdef public dict pending_desyncs
    cdef public object end_reason
    cdef public list actions
    cdef public list events
    cdef public bint broadcast_frames
    cdef public list frame_recipients
    cdef public bytes unsent_frame
    cdef public bint report_frames
    cdef public InputTimes input_times
    cdef public Py_ssize_t advice_phase
    cdef public int group               # the core's group its players' DATA is held in (-1: none)

    cpdef bytes tick(self, double now)

    @cython.locals(member=Member)
    cpdef str accept_input(self, int peer_id, long long frame, bytes payload, long long have,
                           double now)

    @cython.locals(outcome=str)
    cpdef str accept_member_input(self, Member member, long long frame, bytes payload,
                                  long long have, double now)

    @cython.locals(times=InputTimes, interval=double, response=double, slot=Py_ssize_t,
                   answered=Py_ssize_t, late=Py_ssize_t, percentile=double)
    cpdef _advise_input_delay(self, Member member, double now)

    @cython.locals(times=InputTimes, slot=Py_ssize_t)
    cdef void _time_input(self, Member member, long long frame, long long have, double now) except *

    @cython.locals(pending=PendingInputs, synthesized=list, index=Py_ssize_t, made_up=bint)
    cpdef list make_up_inputs(self)

    @cython.locals(slot=Slot)
    cdef bint _connected(self, Py_ssize_t index) except -1

    @cython.locals(broadcast=list, member=Member, review=bint)
    cpdef list fan_out(self, long long number, bytes data, double now, long long spectator_frame,
                       long long catchup_frames, long long advice_every)


# accept_input for C callers that hold a room as an object (relay.server.inputs): exported in the
# compiled module's __pyx_capi__.
@cython.locals(typed_room=Room)
cdef str accept_room_input(object room, int peer_id, long long frame, bytes payload, long long have,
                           double now)


# The same for a member handed over with its peer (Endpoint.bind_sink): None when it has left.
@cython.locals(typed_member=Member, typed_room=Room)
cdef str accept_bound_input(object member, long long frame, bytes payload, long long have,
                            double now)


# The lobby's tick over every room, one compiled pass (frames straight to the core).
@cython.locals(typed_room=Room, closed="long long", broadcast="long long",
               synthesized="long long", before="long long", unsettled=list, failed=list,
               frame=bytes)
cpdef tuple close_frames(list rooms, double now, object send_many, bint draining, list reports,
                         object run_group=*, object handle_events=*, object send_ready=*)
