"""One log format for every logger: stdlib records (aiohttp, asyncio) render like the relay's
structlog events, and the HTTP access log (every Prometheus scrape) is at debug."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import urllib.request

import pytest
import structlog

from relay.config import load_config
from relay.logs import configure, get_logger
from relay.server import RelayServer

KEY_VALUE = re.compile(r"^ts='[^']+' level='(\w+)' event='([^']*)'")


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**saved)


def lines_for(level: str, fmt: str, emit) -> list[str]:
    stream = io.StringIO()
    configure(level, fmt, stream=stream)
    emit()
    return stream.getvalue().splitlines()


def test_stdlib_and_structlog_lines_share_the_text_format(restore_logging):
    def emit():
        get_logger("relay").info("from_structlog", room="a")
        logging.getLogger("aiohttp.server").warning("from stdlib %s", "args", extra={"peer": 7})

    first, second = lines_for("info", "text", emit)
    assert KEY_VALUE.match(first).groups() == ("info", "from_structlog")
    assert KEY_VALUE.match(second).groups() == ("warning", "from stdlib args")
    assert "logger='aiohttp.server'" in second and "peer=7" in second


def test_stdlib_lines_are_json_in_json_mode(restore_logging):
    def emit():
        get_logger("relay").info("from_structlog")
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("asyncio").exception("task failed")

    first, second = (json.loads(line) for line in lines_for("info", "json", emit))
    assert first["level"] == "info" and first["event"] == "from_structlog" and "ts" in first
    assert second["level"] == "error" and second["event"] == "task failed"
    assert second["logger"] == "asyncio" and "ValueError: bad" in second["exception"]


def test_stdlib_records_below_the_level_are_dropped(restore_logging):
    assert lines_for("warning", "text", lambda: logging.getLogger("x").info("quiet")) == []


def scrape_lines(level: str) -> list[str]:
    environ = {"RELAY_SERVER_UDP_PORT": "0", "RELAY_SERVER_HTTP_PORT": "0",
               "RELAY_REPLAY_ENABLED": "false"}

    async def scenario():
        server = RelayServer(load_config(environ=environ))
        await server.start()
        try:
            url = f"http://127.0.0.1:{server.http_port}/metrics"
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: urllib.request.urlopen(url, timeout=10).read())
        finally:
            await server.stop()

    return lines_for(level, "text", lambda: asyncio.run(scenario()))


def test_a_prometheus_scrape_logs_nothing_at_info(restore_logging):
    lines = scrape_lines("info")
    assert any("event='started'" in line for line in lines)
    assert not any("/metrics" in line for line in lines), lines
    assert all(KEY_VALUE.match(line) for line in lines), lines


def test_access_lines_at_debug_in_the_same_format(restore_logging):
    access = [line for line in scrape_lines("debug") if "event='http_request'" in line]
    assert len(access) == 1
    assert KEY_VALUE.match(access[0]).group(1) == "debug"
    assert "path='/metrics'" in access[0] and "status=200" in access[0]
