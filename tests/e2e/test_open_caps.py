"""Issue #17 L1 on a real ``relay serve`` in open mode: one source that opens many connections
or creates many rooms is capped (security.max_sessions_per_source, max_rooms_per_source);
another source still connects and creates a room. Every client socket is bound to its own
127.x.y.z address, which the relay sees as a distinct source."""
from __future__ import annotations

import asyncio
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from relay import protocol
from relay.client import client_config
from relay.config import SecuritySettings
from relay.transport import open_driver
from relay_core import Endpoint, MessageReceived, PeerConnected, PeerDisconnected

from relay_serve import RelayServe

# The documented defaults: a relay started with no settings is capped.
SESSIONS = SecuritySettings.max_sessions_per_source
ROOMS = SecuritySettings.max_rooms_per_source


async def attempt(source: str, port: int, room: str | None = None, player: str = "p",
                  timeout: float = 5.0) -> tuple[str, object]:
    """Connect from ``source`` (and JOIN ``room``): ("connected" | "welcome" | "refused:<code>"
    | "disconnected:<reason>", the driver, left open so that the connection stays)."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future = loop.create_future()
    endpoint = Endpoint(client_config())

    def on_events(now: float) -> None:
        while (event := endpoint.next_event()) is not None:
            result = None
            if isinstance(event, PeerConnected) and room is None:
                result = "connected"
            elif isinstance(event, PeerDisconnected):
                result = "disconnected:" + event.reason
            elif isinstance(event, MessageReceived) and event.channel == protocol.CONTROL:
                message = protocol.decode_relay_message(event.payload)
                if isinstance(message, protocol.Welcome):
                    result = "welcome"
                elif message[0] == protocol.REFUSED:
                    result = "refused:" + message[1]
            if result is not None and not outcome.done():
                outcome.set_result(result)

    driver = await open_driver(endpoint, (source, 0), on_events)
    peer = endpoint.connect(("127.0.0.1", port), driver.now())
    if room is not None:
        endpoint.send(peer, protocol.CONTROL, protocol.Join(room, player, False).encode())
    driver.flush()
    return await asyncio.wait_for(outcome, timeout), driver


def metric(relay: RelayServe, name: str, **labels) -> float:
    url = f"http://127.0.0.1:{relay.http_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise KeyError(f"{name}{labels}")


def test_one_source_cannot_take_every_session_or_room_in_open_mode(tmp_path):
    relay = RelayServe(tmp_path, RELAY_SECURITY_MODE="open", RELAY_ROOMS_START_POLICY="admin",
                       RELAY_REPLAY_ENABLED="false")
    try:
        async def scenario():
            drivers = []
            try:
                await play(drivers)
            finally:
                for driver in drivers:
                    driver.close()

        async def play(drivers):
            # Bare handshakes: completed connections that never join.
            bare = [await attempt("127.61.0.1", relay.udp_port) for _ in range(SESSIONS + 3)]
            drivers.extend(driver for _, driver in bare)
            assert [outcome for outcome, _ in bare] == (
                ["connected"] * SESSIONS + ["disconnected:refused:source_session_limit"] * 3)
            # Rooms: each JOIN of a new name would create one.
            made = [await attempt("127.61.0.2", relay.udp_port, f"spam{i}") for i in range(ROOMS + 2)]
            drivers.extend(driver for _, driver in made)
            assert [outcome for outcome, _ in made] == (
                ["welcome"] * ROOMS + ["refused:source_room_limit"] * 2)
            # Anyone else: connects, creates a room, and joins one the flooder made.
            for index, room in enumerate(("match", "spam0")):
                outcome, driver = await attempt("127.61.0.3", relay.udp_port, room, f"alice{index}")
                drivers.append(driver)
                assert outcome == "welcome", room
            # The connections are still up (a blocking call would stall their heartbeats).
            loop = asyncio.get_running_loop()
            health = await loop.run_in_executor(None, relay.get, "/health")
            rooms = (await loop.run_in_executor(None, relay.get, "/rooms"))["rooms"]
            assert health["peers"] == SESSIONS + (ROOMS + 2) + 2
            assert sorted(room["room"] for room in rooms) == sorted(
                ["match"] + [f"spam{i}" for i in range(ROOMS)])

        asyncio.run(asyncio.wait_for(scenario(), 30))
        # Counted by reason; the core's refusals reach /metrics once a second.
        expected = {("relay_handshake_refusals_total", "source_session_limit"): 3,
                    ("relay_join_refusals_total", "source_room_limit"): 2}
        deadline = time.monotonic() + 5
        while (seen := {key: metric(relay, key[0], reason=key[1]) for key in expected}) != expected:
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
    finally:
        relay.stop()
