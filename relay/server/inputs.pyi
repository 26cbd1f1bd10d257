"""Python-visible API of relay.server.inputs (compiled)."""
from collections.abc import Callable
from typing import Any

from relay.server.room import Member, Room
from relay_core.endpoint import Endpoint
from relay_core.events import Event
from relay_core.peer import MessageSink

class InputRouter(MessageSink):
    room_of_peer: dict[int, Room]
    outcomes: dict[str, int]
    refusals: list[tuple[int, str]]
    endpoint: Endpoint | None
    def __init__(self, endpoint: Endpoint | None = None) -> None: ...
    def seat(self, peer_id: int, room: Room, member: Member | None = None) -> None: ...
    def unseat(self, peer_id: int) -> None: ...
    def take(self, peer_id: int, payload: bytes, now: float) -> bool: ...
    def take_bound(self, peer_id: int, member: Any, payload: bytes, now: float) -> bool: ...
    def route(self, endpoint: Endpoint, on_other: Callable[[Event, float], object],
              on_refused: Callable[[int, str], object], now: float) -> int: ...
