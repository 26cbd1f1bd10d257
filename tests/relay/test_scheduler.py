"""The tick scheduler: one clock for every room, no cumulative drift, lateness measured."""
import asyncio
import time

from relay.server.metrics import Metrics
from relay.server.scheduler import TickScheduler


def test_ticks_keep_their_schedule_without_drift():
    async def scenario():
        stamps = []
        metrics = Metrics(process=False, platform=False)
        scheduler = TickScheduler(100, lambda now: stamps.append(now), metrics)
        start = asyncio.get_running_loop().time()
        scheduler.start()
        await asyncio.sleep(1.0)
        await scheduler.stop()
        return start, stamps, metrics

    start, stamps, metrics = asyncio.run(scenario())
    assert 95 <= len(stamps) <= 101
    # Tick k fires at (or just after) start + k / rate: the error does not grow with k.
    errors = [stamp - (start + (k + 1) / 100) for k, stamp in enumerate(stamps)]
    assert min(errors) >= -0.002
    assert errors[-1] < 0.02
    exposition = metrics.render()[0].decode()
    assert f"relay_ticks_total {float(len(stamps))}" in exposition
    assert "relay_tick_lateness_seconds_count" in exposition


def test_a_stalled_process_skips_ticks_instead_of_bursting():
    async def scenario():
        stamps = []

        def on_tick(now):
            stamps.append(now)
            if len(stamps) == 3:
                time.sleep(0.3)         # 30 ticks' worth of stall at 100 Hz

        scheduler = TickScheduler(100, on_tick)
        scheduler.start()
        await asyncio.sleep(0.6)
        await scheduler.stop()
        return stamps, scheduler.skipped

    stamps, skipped = asyncio.run(scenario())
    gaps = [b - a for a, b in zip(stamps[3:], stamps[4:])]
    assert skipped >= 20
    assert min(gaps) > 0.003, "no burst of back-to-back catch-up ticks after the stall"


def test_a_failing_tick_does_not_stop_the_clock():
    async def scenario():
        count = 0

        def on_tick(now):
            nonlocal count
            count += 1
            raise RuntimeError("a room's bug")

        scheduler = TickScheduler(100, on_tick)
        scheduler.start()
        await asyncio.sleep(0.2)
        await scheduler.stop()
        return count

    assert asyncio.run(scenario()) >= 15


def test_the_stats_pass_runs_once_a_second_right_after_a_tick_and_never_fails_it():
    """The once-a-second pass (idle connections, metrics: ~3 ms at 2 000 players) runs inside
    the tick, after its frames went out, so it takes the gap before the next tick; on a timer of
    its own it made late whichever tick fell due while it ran. A failing pass is logged, and
    neither the tick nor the clock stops."""
    from relay.config import load_config
    from relay.server.daemon import RelayServer

    environ = {"RELAY_SERVER_UDP_PORT": "0", "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_ENABLED": "false",
               "RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_HTTP_HOST": "127.0.0.1"}

    async def scenario():
        server = RelayServer(load_config(environ=environ))
        passes, ticks = [], []
        in_tick = False
        tick, every_second = server.tick, server.every_second

        def counted_tick(now):
            nonlocal in_tick
            ticks.append(now)
            in_tick = True
            try:
                tick(now)
            finally:
                in_tick = False

        def counted_pass(now):
            passes.append((now, in_tick, ticks[-1] if ticks else None))
            if len(passes) == 2:
                raise OSError("disk gone")
            every_second(now)

        server.tick = counted_tick
        server.every_second = counted_pass
        await server.start()
        server._scheduler.on_tick = counted_tick
        try:
            await asyncio.sleep(3.6)
        finally:
            await server.stop()
        return passes, ticks, server

    passes, ticks, server = asyncio.run(scenario())
    assert 2 <= len(passes) <= 4, passes                # at about 1, 2 and 3 s
    assert all(during and now == last_tick for now, during, last_tick in passes), passes
    gaps = [b[0] - a[0] for a, b in zip(passes, passes[1:])]
    assert all(0.99 <= gap <= 1.5 for gap in gaps), gaps
    assert len(passes) >= 3 and len(ticks) >= 90       # the failing second pass stopped nothing
