"""The lobby through its public API: client Endpoints exchange datagrams with the lobby's own
Endpoint in memory, the clock is a number, and what the lobby did is read from its reports and
counts -- no socket, no event loop, no server."""
from __future__ import annotations

import base64
import dataclasses

import pytest

from relay import protocol
from relay.client import client_config
from relay.config import RelayConfig
from relay.errors import Conflict, NotFound, RelayError, Unavailable
from relay.server.lobby import LOBBY_EVENTS, Lobby, room_options
from relay_core import Endpoint, MessageReceived
from relay_core.token import mint_token

SERVER = ("127.0.0.1", 7777)
TICK = 1 / 30


class Client:
    def __init__(self, index: int, now: float, host: str = "127.0.0.2", token=None):
        self.address = (host, 20000 + index)
        self.endpoint = Endpoint(client_config())
        self.peer = self.endpoint.connect(SERVER, now, token)
        self.control: list = []
        self.frames: list[int] = []

    def send(self, channel: int, data: bytes) -> None:
        assert self.endpoint.send(self.peer, channel, data)

    def join(self, room: str, player: str, spectator: bool = False) -> None:
        self.send(protocol.CONTROL, protocol.Join(room, player, spectator).encode())

    def take(self) -> None:
        while (event := self.endpoint.next_event()) is not None:
            if type(event) is MessageReceived:
                if event.channel == protocol.CONTROL:
                    self.control.append(protocol.decode_relay_message(event.payload))
                else:
                    self.frames.append(protocol.decode_frame(event.payload, None).number)

    def codes(self, kind: int) -> list[str]:
        """The codes of the REFUSED or NOTICE messages received (``[kind, code, text]``)."""
        return [m[1] for m in self.control if isinstance(m, list) and m[0] == kind]


class World:
    def __init__(self, security=None, **rooms):
        config = RelayConfig()
        config = dataclasses.replace(
            config, security=dataclasses.replace(config.security, handshake_rate=0, **(security or {})),
            rooms=dataclasses.replace(config.rooms, **rooms))
        self.lobby = Lobby(config)
        self.now = 0.0
        self.clients: list[Client] = []
        self.reports: list = []

    def client(self, host: str = "127.0.0.2", token=None) -> Client:
        client = Client(len(self.clients), self.now, host, token)
        self.clients.append(client)
        return client

    def exchange(self, seconds: float = 0.1, tick: bool = False) -> None:
        """Datagrams both ways every millisecond; the lobby's events handled as the server does."""
        end = self.now + seconds
        by_address = {c.address: c for c in self.clients}
        while self.now < end:
            batch = [(data, c.address) for c in self.clients
                     for data, _ in c.endpoint.datagrams_to_send(self.now)]
            self.lobby.endpoint.receive_batch(batch, self.now)
            self.lobby.handle_events(self.now)
            if tick and int(self.now / TICK) != int((self.now + 0.001) / TICK):
                self.lobby.tick(self.now)
            for data, address in self.lobby.endpoint.datagrams_to_send(self.now):
                if address in by_address:
                    by_address[address].endpoint.receive(data, SERVER, self.now)
            for client in self.clients:
                client.take()
            self.reports += self.lobby.take_reports()
            self.now += 0.001

    def kinds(self, room=None) -> list[str]:
        return [event.kind for r, event in self.reports if room is None or r is room]


def test_two_players_join_an_auto_created_room_and_receive_every_frame_in_order():
    world = World(start_players=2, capacity=2)
    ann, bob = world.client(), world.client()
    ann.join("arena", "ann")
    bob.join("arena", "bob")
    world.exchange(1.0, tick=True)
    room = world.lobby.rooms["arena"]
    assert room.state == "running" and set(world.lobby.peer_room.values()) == {"arena"}
    assert ["room_created", "joined", "joined", "started"] == [
        k for k in world.kinds(room) if k in ("room_created", "joined", "started")]
    assert ann.frames and ann.frames == list(range(len(ann.frames)))
    assert bob.frames[:len(ann.frames)] == ann.frames[:len(bob.frames)]
    assert world.lobby.counts["joins", "joined"] == 2
    assert world.lobby.counts["frames_closed", None] == room.open_frame


def test_a_refused_join_is_answered_reported_and_counted_and_a_repeat_is_marked_repeated():
    world = World(auto_create=False)
    cy = world.client()
    cy.join("nowhere", "cy")
    world.exchange()
    cy.join("nowhere", "cy")
    world.exchange()
    assert cy.codes(protocol.REFUSED) == ["unknown_room", "unknown_room"]
    refused = [event.detail for _, event in world.reports if event.kind == "join_refused"]
    assert [(d["reason"], d["repeated"]) for d in refused] == [("unknown_room", False),
                                                               ("unknown_room", True)]
    assert world.lobby.counts["refusals", "unknown_room"] == 2
    assert world.lobby.counts["joins", "refused"] == 2


def test_a_malformed_message_is_dropped_counted_reported_and_noticed_once():
    world = World()
    dan = world.client()
    world.exchange()
    for _ in range(3):
        dan.send(protocol.CONTROL, b"\xc1")
    world.exchange()
    assert world.lobby.counts["drops", "malformed_message"] == 3
    assert world.kinds().count("message_dropped") == 3
    assert len(dan.codes(protocol.NOTICE)) == 1


def test_an_input_from_a_connection_in_no_room_is_refused_as_not_a_player():
    world = World()
    eve = world.client()
    eve.send(protocol.STREAM, protocol.Input(0, b"x", -1).encode())
    world.exchange()
    assert world.lobby.counts["inputs_refused", "not_a_player"] == 1
    assert eve.codes(protocol.NOTICE) == ["input_not_a_player"]


def test_admin_operations_change_rooms_and_refuse_with_relay_errors():
    world = World(start_policy="admin")
    lobby = world.lobby
    room = lobby.create_room("r", {"capacity": 3}, 0.0)
    assert (room.capacity, room.start_players) == (3, min(lobby.settings.start_players, 3))
    with pytest.raises(Conflict):
        lobby.create_room("r", {}, 0.0)
    with pytest.raises(NotFound):
        lobby.start_room("missing", 0.0)
    ann = world.client()
    ann.join("r", "ann")
    world.exchange()
    with pytest.raises(NotFound) as missing:
        lobby.kick("r", "nobody", world.now)
    assert missing.value.code == "player_not_found"
    lobby.start_room("r", world.now)
    with pytest.raises(Conflict):
        lobby.start_room("r", world.now)
    lobby.kick("r", "ann", world.now)
    world.exchange()
    assert "kicked" in world.kinds(room) and not lobby.peer_room
    lobby.end_room("r", "admin")
    world.exchange()
    assert "r" not in lobby.rooms and room.end_reason == "admin"


def test_too_many_rooms_and_bad_options_are_refused():
    world = World(max_rooms=1)
    world.lobby.create_room("one", {}, 0.0)
    with pytest.raises(Unavailable) as full:
        world.lobby.create_room("two", {}, 0.0)
    assert full.value.code == "too_many_rooms"
    with pytest.raises(RelayError) as bad:
        room_options(world.lobby.settings, 30, {"colour": "red"})
    assert bad.value.code == "bad_option" and "capacity, start_players, start_policy" in str(bad.value)
    with pytest.raises(RelayError, match="server-wide"):
        room_options(world.lobby.settings, 30, {"tick_rate": 60})
    assert room_options(world.lobby.settings, 30, {"tick_rate": 30, "capacity": 2}) == {
        "capacity": 2, "start_policy": world.lobby.settings.start_policy,
        "start_players": min(world.lobby.settings.start_players, 2)}


def test_draining_ends_idle_rooms_refuses_newcomers_and_reports_drained_when_the_last_room_goes():
    world = World(start_players=1, capacity=2)
    lobby = world.lobby
    lobby.create_room("idle", {}, 0.0)
    ann = world.client()
    ann.join("match", "ann")
    world.exchange(0.2, tick=True)
    lobby.begin_drain()
    assert list(lobby.rooms) == ["match"]
    bob = world.client()
    bob.join("match", "bob")
    world.exchange()
    assert bob.codes(protocol.REFUSED) == ["draining"]
    with pytest.raises(Unavailable):
        lobby.create_room("new", {}, world.now)
    assert "drained" not in world.kinds()
    lobby.end_all("drain_deadline")
    world.exchange()
    assert not lobby.rooms and world.kinds().count("drained") == 1


def test_connections_that_join_nothing_are_closed_after_the_timeout():
    world = World()
    world.client()
    world.exchange()
    world.lobby.close_roomless(world.now, timeout=5.0)
    assert world.lobby.endpoint.peer_count == 1
    world.lobby.close_roomless(world.now + 5.0, timeout=5.0)
    world.reports += world.lobby.take_reports()
    assert world.lobby.counts["refusals", "join_timeout"] == 1
    assert [e.detail for _, e in world.reports if e.kind == "connections_closed"] == [
        {"reason": "join_timeout", "count": 1}]


def test_a_disconnect_leaves_the_room_and_is_reported_with_its_room():
    world = World(start_players=1)
    ann = world.client()
    ann.join("arena", "ann")
    world.exchange(0.2, tick=True)
    room = world.lobby.rooms["arena"]
    ann.endpoint.disconnect(ann.peer)
    world.exchange()
    assert ("peer_disconnected", room) in [(e.kind, r) for r, e in world.reports]
    assert "left" in world.kinds(room) and not world.lobby.peer_room


def test_every_report_kind_is_a_room_event_or_a_declared_lobby_event():
    world = World(start_players=1)
    ann = world.client()
    ann.join("arena", "ann")
    world.exchange(0.3, tick=True)
    lobby_kinds = {e.kind for r, e in world.reports if r is None}
    assert lobby_kinds <= set(LOBBY_EVENTS)


def test_open_mode_caps_the_rooms_one_source_creates_until_one_ends():
    world = World(security={"max_rooms_per_source": 2}, start_players=8)
    lobby = world.lobby
    lobby.create_room("hall", {}, 0.0)              # the admin API's rooms do not count
    first = [world.client() for _ in range(3)]      # one source (127.0.0.2), three ports
    for index, client in enumerate(first):
        client.join(f"mine{index}", "p")
    world.exchange()
    assert sorted(lobby.rooms) == ["hall", "mine0", "mine1"]
    assert first[2].codes(protocol.REFUSED) == ["source_room_limit"]
    assert lobby.counts["refusals", "source_room_limit"] == 1
    refused = [e.detail for _, e in world.reports if e.kind == "join_refused"]
    assert "security.max_rooms_per_source" in refused[0]["detail"]
    # Joining a room that exists creates nothing: not limited.
    first[2].join("hall", "p")
    world.exchange()
    assert len(lobby.rooms["hall"].members) == 1
    assert first[2].codes(protocol.REFUSED) == ["source_room_limit"]
    # Another source creates rooms as before.
    other = world.client(host="127.0.0.3")
    other.join("theirs", "q")
    world.exchange()
    assert "theirs" in lobby.rooms and not other.codes(protocol.REFUSED)
    # A room that ends frees its place.
    lobby.end_room("mine0", "admin")
    late = world.client()
    late.join("mine3", "p")
    world.exchange()
    assert "mine3" in lobby.rooms and not late.codes(protocol.REFUSED)
    assert lobby.rooms_by_source == {"127.0.0.2": 2, "127.0.0.3": 1}


def test_rooms_that_end_empty_free_their_source():
    world = World(security={"max_rooms_per_source": 1}, start_players=8, empty_timeout=1.0)
    lobby = world.lobby
    ann = world.client()
    ann.join("a", "ann")
    world.exchange()
    ann.endpoint.disconnect(ann.peer)
    world.exchange(1.5, tick=True)
    assert "a" not in lobby.rooms and lobby.rooms_by_source == {}
    bob = world.client()
    bob.join("b", "bob")
    world.exchange()
    assert "b" in lobby.rooms


def test_rooms_per_source_0_is_unlimited():
    world = World(security={"max_rooms_per_source": 0})
    clients = [world.client() for _ in range(20)]
    for index, client in enumerate(clients):
        client.join(f"r{index}", "p")
    world.exchange()
    assert len(world.lobby.rooms) == 20


def test_token_mode_does_not_cap_rooms_per_source():
    key = bytes(range(32))
    world = World(security={"mode": "token", "keys": f"1:{base64.b64encode(key).decode()}",
                            "max_rooms_per_source": 1})
    unix = world.lobby.endpoint.unix_offset + world.now
    clients = [world.client(token=mint_token(key, 1, f"r{i}", "p", 60, now=unix)) for i in range(3)]
    for index, client in enumerate(clients):
        client.join(f"r{index}", "p")
    world.exchange()
    assert sorted(world.lobby.rooms) == ["r0", "r1", "r2"]
