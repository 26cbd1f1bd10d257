"""A real relay in this process on loopback, and lockstep players of the client SDK: the
helpers the end-to-end tests of every layer share (tests/ is on sys.path: conftest.py)."""
import contextlib
import hashlib

from relay.client import RelayClient
from relay.config import load_config
from relay.tools.netem import LinkSettings
from relay.server import RelayServer

BAD_LINK = LinkSettings(loss=10, delay=20, jitter=10)


def server_config(tmp_path, **rooms):
    environ = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
               "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays")}
    environ.update({f"RELAY_ROOMS_{key.upper()}": str(value) for key, value in rooms.items()})
    return load_config(environ=environ)


class Player:
    """A bot-like player: inputs N + delay on frame N, remembers every frame it saw."""

    def __init__(self, client: RelayClient, name: str, input_delay: int = 2):
        self.client = client
        self.name = name
        self.delay = input_delay
        self.frames: list = []
        self.last_sent = -1

    def send(self, frame_number: int) -> None:
        if frame_number > self.last_sent:
            self.last_sent = frame_number
            self.client.send_input(frame_number, f"{self.name}:{frame_number}".encode())

    async def play_until(self, last_frame: int, timeout: float) -> None:
        for ahead in range(self.delay):
            self.send(self.client.welcome.next_frame + ahead)
        while not self.frames or self.frames[-1].number < last_frame:
            frame = await self.client.next_frame_or_none(timeout=timeout)
            assert frame is not None, f"{self.name}: stream ended at {len(self.frames)} frames"
            self.frames.append(frame)
            self.send(frame.number + self.delay)


def digest(frames):
    return [hashlib.blake2b(f.encode(), digest_size=8).hexdigest() for f in frames]


async def running_server(tmp_path, **rooms):
    server = RelayServer(server_config(tmp_path, **rooms))
    await server.start()
    return server


@contextlib.asynccontextmanager
async def running_room(tmp_path, room, names, **rooms):
    """A relay with one running room of directly connected players."""
    server = await running_server(tmp_path, **rooms)
    host, port = server.udp_address
    players = []
    try:
        for name in names:
            players.append(Player(await RelayClient.connect(host, port, room, name), name))
        await players[0].client.wait_for_state("running")
        yield server, players
    finally:
        for player in players:
            await player.client.close()
        await server.stop()
