"""The relay daemon.

``RelayServer`` (daemon.py) is the asyncio shell: sockets, timers, HTTP, and the observers of
what happens (logs, metrics, Agones, replays). The socket-free ``Lobby`` (lobby.py) holds the
protocol core's Endpoint and the rooms (room.py, compiled through room.pxd), with the compiled
input router (inputs.pyx) and input timing (timing.pyx).
"""
from relay.server.daemon import RelayServer

__all__ = ["RelayServer"]
