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
