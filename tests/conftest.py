import importlib.machinery
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from relay_core import endpoint  # noqa: E402

# The tests are about the compiled core; a pure-Python stand-in must never pass for it.
if not endpoint.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
    raise pytest.UsageError(
        f"relay_core.endpoint was imported from {endpoint.__file__}, not a compiled extension; "
        "build it with `pip install -e .`"
    )


from relay_core import EndpointConfig, MessageReceived  # noqa: E402
from relay_core.simlink import LinkedPair, LinkProfile  # noqa: E402


def received(events, channel=None):
    """Payloads of MessageReceived events, optionally for one channel, in delivery order."""
    return [e.payload for e in events
            if isinstance(e, MessageReceived) and (channel is None or e.channel == channel)]


@pytest.fixture
def pair():
    """A connected server/client pair over a perfect 1 ms-tick in-memory link."""
    linked = LinkedPair(seed=7)
    linked.connect()
    return linked


def make_pair(loss=0.0, delay=0.0, jitter=0.0, duplicate=0.0, reorder=0.0, seed=0, **config):
    server = EndpointConfig(accept_connections=True, seed=seed, **config)
    client = EndpointConfig(seed=seed + 1, **config)
    profile = dict(loss=loss, delay=delay, jitter=jitter, duplicate=duplicate, reorder=reorder)
    linked = LinkedPair(server, client, LinkProfile(**profile), LinkProfile(**profile), seed=seed)
    return linked


from hypothesis import settings  # noqa: E402

# CI explores the same examples on every run (a red build must be reproducible); local runs
# keep drawing new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


SLOW_LAYERS = frozenset({"e2e", "deploy", "bench", "clients"})
"""Test folders whose every test is slow: real relay processes and sockets, clients in other
languages, floods, soak, packaging and deployment, benchmark smoke runs."""
SLOW_FILES = frozenset({
    "test_http.py", "test_netem.py", "test_bot_cli.py", "test_token_cli.py",    # real sockets
    "test_serve_cli.py", "test_checkout.py", "test_logs.py",                    # processes, sockets
    "test_fuzz.py", "test_relay_fuzz.py",                                        # fuzzing budgets
})
"""Slow files in the fast layers (core, relay)."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name in SLOW_LAYERS or item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def c_build():
    """The C client library (clients/c), built once per session (tests/clients/native.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "clients"))
    from native import build_c_library
    return build_c_library()
