"""Structured logging: one line per event, key=value text or JSON (structlog)."""
from __future__ import annotations

import logging
import sys
import time

import structlog


def _renderer(fmt: str):
    return (structlog.processors.JSONRenderer() if fmt == "json"
            else structlog.processors.KeyValueRenderer(key_order=["ts", "level", "event"]))


def _processors(fmt: str) -> list:
    return [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", key="ts"),
        structlog.processors.format_exc_info,
        _renderer(fmt),
    ]


def stdlib_formatter(fmt: str = "text") -> logging.Formatter:
    """A formatter that renders stdlib records (aiohttp, asyncio, the HTTP side) exactly as the
    relay's structlog events: same keys, same renderer, plus ``logger`` and the record's extras."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", key="ts"),
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _renderer(fmt),
        ])


class _CurrentStderr:
    """sys.stderr as it is when a line is written, not when logging was configured: whoever
    replaces it later (a test capturing output, a daemonizing wrapper) gets the lines, and a
    stream closed since is never written to."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "info", fmt: str = "text", stream=None) -> None:
    stream = stream if stream is not None else _CurrentStderr()
    structlog.configure(
        processors=_processors(fmt),
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries that use stdlib logging (aiohttp, asyncio) go to the same stream in the same
    # format, so one parser (or `grep event=`) reads every line.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(stdlib_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


def get_logger(name: str = "relay"):
    return structlog.get_logger(name)


LIMIT_LOG_INTERVAL = 10.0
"""Seconds between log lines about one kind of refusal or drop at a limit (each is counted)."""


class LimitLog:
    """Logs a repeated event (a cap hit, a flood of refusals) at most once per interval per
    kind, with how many happened since the last line, so a flood cannot flood the log."""

    def __init__(self, log, interval: float = LIMIT_LOG_INTERVAL):
        self.log = log
        self.interval = interval
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def __call__(self, event: str, kind: str, count: int = 1, **fields) -> None:
        self._count[kind] = self._count.get(kind, 0) + count
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) >= self.interval:
            self.log.warning(event, reason=kind, count=self._count.pop(kind), **fields)
            self._last[kind] = now


# Until someone configures structlog (the CLI does, with the configured level and format), the
# relay's events are rendered as relay's key=value lines at the default level (info):
# structlog's own default renders every logged exception with rich where rich is installed, at
# about a second each, which stalls the event loop of a server whose tick keeps failing.
if not structlog.is_configured():
    structlog.configure(processors=_processors("text"),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
