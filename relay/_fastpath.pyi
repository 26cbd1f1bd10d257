"""Python-visible API of relay._fastpath (compiled)."""
from collections.abc import Callable, Iterable
from typing import Any

from relay_core.endpoint import Endpoint
from relay_core.events import Event
from relay_core.peer import MessageSink

def decode_input(data: bytes) -> tuple[int, bytes, int] | None: ...
def encode_frame(frame: Any, previous: Iterable[Any] | None = None) -> bytes: ...

class InputTiming:
    @property
    def window(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def late_count(self) -> int: ...
    @property
    def late_seen(self) -> int: ...
    advised: int | None
    advised_at: float
    response_ms: int
    def __init__(self, window: int) -> None: ...
    def record(self, late: bool, response: float) -> None: ...
    def percentile(self, percent: float) -> float: ...

class Slot:
    index: int
    player: str
    peer_id: int | None
    ready: bool
    away_since: float | None
    def __init__(self, index: int, player: str, peer_id: int | None, ready: bool = False,
                 away_since: float | None = None) -> None: ...

class Member:
    peer_id: int
    player: str
    slot: int | None
    spectator: bool
    have: int
    next_live: int
    catching_up: bool
    blocks_in_flight: int
    block_first: int
    block_end: int
    last_sent: int
    missing_from: int | None
    reported: bool
    timing: InputTiming | None
    def __init__(self, peer_id: int, player: str, slot: int | None, spectator: bool, have: int = -1,
                 next_live: int = 0, catching_up: bool = False, blocks_in_flight: int = 0,
                 block_first: int = 0, block_end: int = -1, last_sent: int = -1,
                 missing_from: int | None = None, reported: bool = False,
                 timing: InputTiming | None = None) -> None: ...

class RoomCore:
    """Subclassed by relay.room.Room, which provides what fan_out calls back: ``history``
    (indexable by frame), ``_send_stream``, ``_maybe_catch_up`` and ``_advise_input_delay``."""
    state: str
    open_frame: int
    members: dict[int, Member]
    pending_inputs: dict[int, dict[int, bytes]]
    max_input_bytes: int
    max_input_lead: int
    drop_late_inputs: bool
    slots: list[Slot]
    last_inputs: list[Any]
    missing_input_policy: str
    neutral_input: bytes | None
    synthesized_inputs: int
    broadcast_frames: bool
    def record_close(self, number: int, now: float) -> None: ...
    def collect_inputs(self, number: int) -> tuple[list[bytes | None], list[int]]: ...
    def fan_out(self, number: int, data: bytes, now: float, spectator_frame: int, catchup_frames: int,
                advice_every: int) -> list[int] | None: ...
    def on_input_fields(self, peer_id: int, frame: int, payload: bytes, have: int,
                        now: float | None = None) -> str: ...

class InputRouter(MessageSink):
    peer_room: dict[int, str]
    rooms: dict[str, Any]               # room id -> relay.room.Room (a RoomCore)
    outcomes: dict[str, int]
    refusals: list[tuple[int, str]]
    def __init__(self, peer_room: dict[int, str], rooms: dict[str, Any]) -> None: ...
    def route(self, endpoint: Endpoint, on_other: Callable[[Event, float], object],
              on_refused: Callable[[int, str], object], now: float) -> int: ...
