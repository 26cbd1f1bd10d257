"""kill -9 of a relay in the middle of a match loses at most replay.flush_interval (100 ms,
3 frames at 30 Hz) of its replay (docs/SECURITY.md, "Replay durability").

Loopback only, bounded: two players, about 3 s of play."""
from __future__ import annotations

import asyncio
import os
import signal

from relay.client import RelayClient
from relay.replay import ReplayReader

from live_relay import Player
from relay_serve import RelayServe

TICK_RATE = 30
MAX_LOST_FRAMES = 3         # 100 ms at 30 Hz


def test_kill_9_loses_at_most_100_ms_of_the_replay(tmp_path):
    relay = RelayServe(tmp_path)          # replay defaults: flush_interval 0.1, fsync interval
    killed_at: list[int] = []

    async def play(player: Player, stop: asyncio.Event) -> None:
        for ahead in range(player.delay):
            player.send(player.client.welcome.next_frame + ahead)
        while not stop.is_set():
            frame = await player.client.next_frame_or_none(timeout=0.5)
            if frame is None:
                continue
            player.frames.append(frame)
            player.send(frame.number + player.delay)
            # SIGKILL half-way between two of the 30-frame sync points the writer also keeps
            # (the worst case of a writer that flushes by count only: 15+ frames lost).
            if frame.number >= 60 and frame.number % 30 == 15 and not stop.is_set():
                os.kill(relay.process.pid, signal.SIGKILL)
                stop.set()
                killed_at.append(frame.number)

    async def main() -> int:
        clients = [await RelayClient.connect("127.0.0.1", relay.udp_port, "m/kill", name,
                                             timeout=10) for name in ("a", "b")]
        players = [Player(client, name) for client, name in zip(clients, ("a", "b"))]
        try:
            await players[0].client.wait_for_state("running")
            stop = asyncio.Event()
            await asyncio.wait_for(asyncio.gather(*[play(p, stop) for p in players]), 20)
            return max(p.frames[-1].number for p in players if p.frames)
        finally:
            for player in players:
                await player.client.close(leave=False)

    try:
        last_received = asyncio.run(main())
    finally:
        relay.kill()
    assert relay.process.returncode == -signal.SIGKILL
    assert killed_at and last_received >= killed_at[0]
    [path] = relay.replays.glob("*.replay")
    reader = ReplayReader(path)
    numbers = [number for number, _ in reader.frames()]
    assert reader.header["room"] == "m/kill"
    assert not reader.complete                      # no end record: it was killed
    assert numbers == list(range(len(numbers)))
    lost = last_received - numbers[-1]
    print(f"\nkill -9 at frame {last_received}: the replay holds frames 0..{numbers[-1]}, "
          f"{lost} lost ({lost * 1000 / TICK_RATE:.0f} ms)")
    assert lost <= MAX_LOST_FRAMES, (f"the clients got frame {last_received}, the replay "
                                     f"holds up to {numbers[-1]}: {lost} frames lost")
