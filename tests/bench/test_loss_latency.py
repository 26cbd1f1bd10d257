"""benchmarks/loss_latency.py and benchmarks/adapters: the statistics, the redundancy-limit model,
every protocol adapter on a clean loopback echo, and a short end-to-end run of the benchmark.

Nothing here compares latencies to a threshold (timing on a shared machine is not a test
signal): the smoke run checks that the benchmark completes, writes its files and that every
protocol delivered every message intact and in order. A protocol whose library (pyenet, kcp)
cannot be imported fails its test with the import error; it is never skipped.
"""
from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import adapters
from benchmarks.loss_latency import (
    Datagram, datagram_fates, evaluate_targets, percentile, redundancy_limit, summarize,
)

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------
# Statistics


def test_percentile_interpolates_between_order_statistics():
    values = [4.0, 1.0, 3.0, 2.0]                    # order does not matter
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 25) == pytest.approx(1.75)   # position 0.75
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile(list(range(1000)), 99) == pytest.approx(989.01)
    assert percentile([7.0], 99) == 7.0


def test_percentile_matches_numpy():
    import numpy                            # a cross-check; the exact cases are above
    values = [math.sin(i) * 100 + i for i in range(257)]
    for q in (1, 50, 95, 99, 99.9):
        assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)))


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summary_ignores_undelivered_and_handles_empty():
    summary = summarize([10.0, None, 20.0, 30.0, None])
    assert summary["count"] == 3
    assert summary["mean"] == pytest.approx(20.0)
    assert summary["p50"] == pytest.approx(20.0)
    assert summary["p95"] == pytest.approx(29.0)
    assert summary["p99"] == pytest.approx(29.8)
    assert summary["max"] == 30.0 and summary["min"] == 10.0
    empty = summarize([None, None])
    assert empty["count"] == 0 and empty["p99"] is None and empty["mean"] is None


# --------------------------------------------------------------------------------------------
# Redundancy limit


def test_redundancy_limit_on_a_hand_made_drop_pattern():
    up = [
        Datagram(0.000, True, None),        # carries message 0: dropped
        Datagram(0.030, True, None),        # next chance: dropped too
        Datagram(0.060, False, 0.100),      # first survivor in send order ...
        Datagram(0.070, False, 0.095),      # ... but this later one arrives first (jitter)
        Datagram(0.200, False, 0.240),      # message 1's datagram, gets through
    ]
    down = [
        Datagram(0.050, False, 0.090),      # sent before the server could have the message
        Datagram(0.096, True, None),        # first after A = 0.095: dropped
        Datagram(0.100, False, 0.150),
        Datagram(0.120, False, 0.140),      # earliest arrival after A
        Datagram(0.241, False, 0.281),      # carries message 1's echo
        Datagram(0.300, True, None),
    ]
    # message 0 at t=0, message 1 at t=0.2, message 2 at t=0.25 (no up datagram after it)
    limits = redundancy_limit([0.0, 0.2, 0.25], up, down)
    assert limits[0] == pytest.approx(0.140)
    assert limits[1] == pytest.approx(0.081)
    assert limits[2] is None


def test_redundancy_limit_without_loss_is_the_next_datagram_each_way():
    up = [Datagram(0.01 * i, False, 0.01 * i + 0.005) for i in range(10)]
    down = [Datagram(0.01 * i + 0.006, False, 0.01 * i + 0.016) for i in range(10)]
    limits = redundancy_limit([0.0, 0.031], up, down)
    # message at 0.031: next up datagram at 0.04 arrives 0.045; next down sent at 0.046
    # arrives 0.056
    assert limits[0] == pytest.approx(0.016)
    assert limits[1] == pytest.approx(0.056 - 0.031)


def test_redundancy_limit_when_every_later_down_datagram_is_lost():
    up = [Datagram(0.0, False, 0.01)]
    down = [Datagram(0.02, True, None), Datagram(0.03, True, None)]
    assert redundancy_limit([0.0], up, down) == [None]


def test_datagram_fates_joins_logs_by_order_and_bytes():
    sent = [(0.0, b"a"), (0.1, b"b"), (0.2, b"a"), (0.3, b"c"), (0.4, b"d")]
    decisions = [False, True, False, False]          # "d" had no decision yet: counts dropped
    arrived = [(0.35, b"c"), (0.05, b"a"), (0.25, b"a")]
    fates, check = datagram_fates(sent, decisions, arrived)
    assert fates == [Datagram(0.0, False, 0.05), Datagram(0.1, True, None),
                     Datagram(0.2, False, 0.25), Datagram(0.3, False, 0.35),
                     Datagram(0.4, True, None)]
    assert check == {"sent": 5, "decisions": 4, "survivors_without_arrival": 0,
                     "arrivals_without_send": 0}


def test_targets_report_not_run_for_missing_points():
    targets = evaluate_targets([])
    assert targets and all(t["status"] == "NOT RUN" for t in targets)


# --------------------------------------------------------------------------------------------
# Adapters


async def _echo_twenty(protocol: str) -> list[bytes]:
    loop = asyncio.get_running_loop()
    received: list[bytes] = []
    done = loop.create_future()

    def on_echo(payload: bytes, now: float) -> None:
        received.append(payload)
        if len(received) == 20 and not done.done():
            done.set_result(None)

    adapter = adapters.create(protocol, on_echo)
    try:
        host, port = await adapter.start_server("127.0.0.1", 0)
        await adapter.connect(host, port, timeout=5.0)
        for number in range(20):
            adapter.send(number.to_bytes(4, "little") + bytes(range(76)))
            await asyncio.sleep(0.002)
        await asyncio.wait_for(done, 5.0)
        await asyncio.sleep(0.02)           # nothing more may arrive
    finally:
        await adapter.close()
    assert not getattr(adapter, "errors", []), adapter.errors
    return received


@pytest.mark.parametrize("protocol", adapters.PROTOCOLS)
def test_adapter_echoes_twenty_messages_in_order(protocol):
    reason = adapters.unavailable(protocol)
    if reason is not None:
        pytest.fail(reason)     # a missing pyenet / kcp is a failure, not a skip
    received = asyncio.run(asyncio.wait_for(_echo_twenty(protocol), 15))
    assert received == [n.to_bytes(4, "little") + bytes(range(76)) for n in range(20)]


def test_adapter_unavailable_names_the_reason():
    assert adapters.unavailable("no-such-protocol").startswith("unknown protocol")
    for protocol in adapters.PROTOCOLS:
        assert adapters.unavailable(protocol) is None, adapters.unavailable(protocol)


# --------------------------------------------------------------------------------------------
# Smoke run of the benchmark itself


def test_smoke_run_all_protocols(tmp_path):
    out = tmp_path / "results"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "loss_latency.py"), "--count", "50",
         "--loss", "5", "--link", "high", "--drain", "15", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "machine:" in completed.stdout.splitlines()[0]
    data = json.loads((out / "loss_latency.json").read_text())
    markdown = (out / "loss_latency.md").read_text()
    results = data["results"]
    assert sorted(r["protocol"] for r in results) == sorted(adapters.PROTOCOLS)
    for r in results:
        assert (r["link"], r["loss"], r["count"]) == ("high", 5.0, 50)
        assert r["delivered"] == 50, r
        assert r["order_errors"] == r["corrupt"] == r["duplicates"] == 0, r
        assert not r["errors"], r
        assert all(v is not None and v > 0 for v in r["rtts_ms"])
        assert r["wire"]["bytes"] > r["wire"]["payload_bytes"] == 2 * 80 * 50
        assert r["label"] in markdown
    ours = next(r for r in results if r["protocol"] == "ours-redundant")
    assert ours["limit"]["messages_below_limit"] == 0
    assert ours["limit"]["summary_ms"]["count"] == 50
    assert {t["status"] for t in data["targets"]} <= {"PASS", "FAIL", "NOT RUN"}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        for name in ("loss_latency_p99.png", "loss_latency_wire.png", "loss_latency_trace.png"):
            assert (out / name).stat().st_size > 1000
