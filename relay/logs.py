"""Structured logging: one line per event, key=value text or JSON (structlog)."""
from __future__ import annotations

import logging
import sys

import structlog


def _processors(fmt: str) -> list:
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.processors.KeyValueRenderer(key_order=["ts", "level", "event"]))
    return [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", key="ts"),
        structlog.processors.format_exc_info,
        renderer,
    ]


def configure(level: str = "info", fmt: str = "text", stream=None) -> None:
    structlog.configure(
        processors=_processors(fmt),
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries that use stdlib logging (aiohttp) go to the same stream, one line per record.
    logging.basicConfig(level=getattr(logging, level.upper()), stream=stream or sys.stderr,
                        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s event=%(message)r",
                        force=True)


def get_logger(name: str = "relay"):
    return structlog.get_logger(name)


# Until someone configures structlog (the CLI does, with the configured level and format), the
# relay's events are rendered as relay's key=value lines at the default level (info):
# structlog's own default renders every logged exception with rich where rich is installed, at
# about a second each, which stalls the event loop of a server whose tick keeps failing.
if not structlog.is_configured():
    structlog.configure(processors=_processors("text"),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
