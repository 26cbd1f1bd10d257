"""One tick loop for every room: drift-free on the monotonic clock, lateness measured."""
from __future__ import annotations

import asyncio
from typing import Callable, Optional

from relay.logs import get_logger

# Further behind than this many ticks (a stalled process), the schedule is re-anchored instead
# of firing the missed ticks back to back.
MAX_CATCH_UP_TICKS = 5


class TickScheduler:
    """Calls ``on_tick(now)`` at ``rate`` Hz. Tick k is due at start + k / rate, so timer and
    callback latency never accumulate; each tick's lateness goes into the metrics histogram."""

    def __init__(self, rate: int, on_tick: Callable[[float], None], metrics=None):
        self.rate = rate
        self.interval = 1.0 / rate
        self.on_tick = on_tick
        self.metrics = metrics
        self.ticks = 0
        self.skipped = 0
        self.log = get_logger("relay.server.scheduler")
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        k = 0
        while True:
            k += 1
            due = start + k * self.interval
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            lateness = now - due
            if lateness > MAX_CATCH_UP_TICKS * self.interval:
                missed = int(lateness / self.interval)
                self.skipped += missed
                self.log.warning("ticks_skipped", missed=missed, lateness_ms=round(lateness * 1000, 1))
                start += missed * self.interval
                due += missed * self.interval
                lateness = now - due
            if self.metrics is not None:
                self.metrics.ticks.inc()
                self.metrics.tick_lateness.observe(max(0.0, lateness))
            self.ticks += 1
            try:
                self.on_tick(now)
            except Exception:
                # One room's bug must not stop every room's clock.
                self.log.exception("tick_failed", tick=k)
