"""Address migration end to end: players behind the link emulator get a new source port
mid-match (a NAT rebinding, or a phone moving from Wi-Fi to 4G) and keep their session and
slot without rejoining — no frame gap, no duplicate, counted and logged by the relay."""
from __future__ import annotations

import asyncio
import base64

import pytest
import structlog

from relay.client import RelayClient
from relay.config import load_config
from relay.tools.netem import LinkSettings, Netem
from relay.server import RelayServer
from relay_core.token import generate_key, mint_token

KEY = generate_key()
LINK = LinkSettings(loss=5, delay=10, jitter=5)


def server_config(tmp_path, token_mode: bool):
    environ = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
               "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_ENABLED": "false",
               "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays"),
               "RELAY_ROOMS_START_PLAYERS": "3", "RELAY_ROOMS_PLAYER_TIMEOUT": "3"}
    if token_mode:
        environ.update({"RELAY_SECURITY_MODE": "token",
                        "RELAY_SECURITY_KEYS": f"1:{base64.b64encode(KEY).decode()}"})
    return load_config(environ=environ)


async def play(client: RelayClient, name: str, frames: list, until: int) -> None:
    """Input on every frame, 4 frames ahead; records every frame number seen."""
    for ahead in range(4):
        client.send_input(client.welcome.next_frame + ahead, name.encode())
    while not frames or frames[-1] < until:
        frame = await client.next_frame_or_none(timeout=5)
        assert frame is not None, f"{name}: the stream ended after {len(frames)} frames"
        frames.append(frame.number)
        client.send_input(frame.number + 4, name.encode())


@pytest.mark.parametrize("token_mode", [False, True], ids=["open", "sealed"])
def test_players_keep_their_slot_across_source_port_changes(tmp_path, token_mode):
    async def scenario():
        server = RelayServer(server_config(tmp_path, token_mode))
        await server.start()
        emulators, clients = [], []
        try:
            for seed in range(3):
                netem = Netem(("127.0.0.1", 0), server.udp_address, up=LINK, down=LINK, seed=seed)
                await netem.start()
                emulators.append(netem)
            for i, netem in enumerate(emulators):
                kwargs = ({"token": mint_token(KEY, 1, "m", f"p{i}", 30.0)} if token_mode
                          else {"room": "m", "player": f"p{i}"})
                clients.append(await RelayClient.connect(*netem.listen_address, timeout=10,
                                                         **kwargs))
            await clients[0].wait_for_state("running")
            slots_before = [client.welcome.slot for client in clients]
            frames = [[] for _ in clients]
            games = [asyncio.create_task(play(c, f"p{i}", frames[i], 150))
                     for i, c in enumerate(clients)]

            # Two rebinds during the match: p0 alone, then everyone at once.
            while len(frames[0]) < 40:
                await asyncio.sleep(0.01)
            first = emulators[0].rebind()
            while len(frames[0]) < 90:
                await asyncio.sleep(0.01)
            for netem in emulators:
                netem.rebind()
            await asyncio.wait_for(asyncio.gather(*games), timeout=30)
            return server, clients, frames, slots_before, first
        finally:
            for client in clients:
                await client.close()
            for netem in emulators:
                await netem.stop()
            await server.stop()

    with structlog.testing.capture_logs() as logs:
        server, clients, frames, slots_before, first = asyncio.run(scenario())

    old_port, new_port = next(iter(first.items()))
    assert old_port != new_port
    for numbers in frames:
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), \
            "a frame was skipped or repeated across the migration"
    assert [client.welcome.slot for client in clients] == slots_before
    # One migration for the first rebind, three for the second.
    assert server.metrics.migrations._value.get() == 4
    moved = [entry for entry in logs if entry["event"] == "peer_migrated"]
    assert len(moved) == 4 and {entry["room"] for entry in moved} == {"m"}
    assert any(entry["new_address"] == str(new_port) for entry in moved)
    # Nobody rejoined: three joins, no reconnects, no timeouts.
    assert not [entry for entry in logs if entry["event"] in ("timed_out", "reconnected", "left")]
