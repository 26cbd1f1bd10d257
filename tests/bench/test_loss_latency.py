"""benchmarks/loss_latency.py and benchmarks/adapters: the statistics, the redundancy-limit model,
every protocol adapter on a clean loopback echo, a short end-to-end run of the benchmark, the
scenarios' parts (burst parameters, the ideal protocol, episode recovery, rates per window,
targets) and a --quick run of every scenario.

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
    SCENARIOS, Datagram, LinkSettings, burst_settings, datagram_fates, episode_recoveries,
    evaluate_targets, jump_figures, peak_rates, percentile, redundancy_limit, scenario_targets,
    simulate_ideal, summarize,
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
# Scenarios: their parameters and figures


def test_burst_settings_give_the_asked_loss_and_mean_burst():
    from relay_core.simlink import LossyLink
    settings = burst_settings(10.0, 3.0)
    assert settings.burst_exit == pytest.approx(1 / 3)
    assert settings.burst_enter == pytest.approx(1 / 27)
    assert settings.burst_loss == 1.0 and settings.loss == 0.0
    link = LossyLink(settings.profile(), "bursts")
    for k in range(60000):
        link.send(b"x", k * 0.03)
    decisions = link.counters.drop_decisions
    runs, current = [], 0
    for dropped in decisions + [False]:
        if dropped:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    assert 0.09 <= sum(decisions) / len(decisions) <= 0.11
    assert 2.8 <= sum(runs) / len(runs) <= 3.2
    with pytest.raises(ValueError):
        burst_settings(0.0, 3.0)


def test_ideal_protocol_without_loss_takes_one_delay_each_way():
    rtts = simulate_ideal(LinkSettings(delay=25.0), 50, seed=1)
    assert rtts == pytest.approx([50.0] * 50)


def test_ideal_protocol_waits_for_the_next_datagram_after_an_episode():
    settings = LinkSettings(delay=10.0, episode_ms=100.0, episode_share=10.0)
    rtts = simulate_ideal(settings, 2000, seed=3)
    assert all(r is not None and r >= 20.0 - 1e-9 for r in rtts[:-10])
    # Messages sent during an episode wait for it to end: some take several intervals more.
    assert max(r for r in rtts if r is not None) > 100.0
    assert sum(abs(r - 20.0) < 1e-6 for r in rtts if r is not None) > 0.8 * len(rtts)


def test_episode_recovery_is_from_the_end_to_the_last_held_message():
    send = [0.00, 0.03, 0.06, 0.09, 0.12]
    rtts = [20.0, 150.0, 110.0, 60.0, 20.0]    # deliveries at .02, .18, .17, .15, .14
    # an episode 0.025-0.10 holds messages 1, 2 and 3 (sent before its end, delivered after)
    assert episode_recoveries([(0.025, 0.10)], send, rtts) == pytest.approx([80.0])
    # an episode that ends when nothing is outstanding holds nothing back
    assert episode_recoveries([(0.19, 0.20)], send, rtts) == []


def _run(protocol, windows):
    return {"protocol": protocol, "windows": [
        {"phase": phase, "until": "x", "seconds": seconds, "datagrams_up": up,
         "datagrams_down": down} for phase, seconds, up, down in windows]}


def test_jump_figures_count_what_the_jump_added():
    jump = [_run("p", [("before", 10.0, 330, 330), ("during", 10.0, 330, 400),
                       ("after", 10.0, 330, 330)])]
    base = [_run("p", [("before", 10.0, 330, 330), ("during", 10.0, 330, 330),
                       ("after", 10.0, 330, 330)])]
    figures = jump_figures(jump, base)
    assert figures["jump"]["during"]["server_per_s"] == pytest.approx(40.0)
    assert figures["jump"]["before"]["client_per_s"] == pytest.approx(33.0)
    assert figures["extra_datagrams"] == 70 and figures["extra_server_datagrams"] == 70
    assert figures["extra_share"] == pytest.approx(70 / 660)
    targets = scenario_targets("rtt_jump", {}, {"ours-redundant": figures})
    assert targets[0]["status"] == "FAIL"       # +10.6 % > 5 %


def test_peak_rates_find_the_busiest_second():
    # every 0.25 s: the client sends 10 datagrams per sample, the server 8, plus 20 at once at 1.5 s
    samples = [(0.25 * i, 10 * i, 8 * i + (20 if i >= 6 else 0)) for i in range(12)]
    assert peak_rates(samples) == {"client": pytest.approx(40.0), "server": pytest.approx(52.0)}
    assert peak_rates(samples[:3]) == {"client": None, "server": None}   # under a second


def test_scenario_targets_compare_with_kcp_fast_and_the_limit():
    def entry(p99, wire, limit=None):
        out = {"summary_ms": {"p99": p99, "mean": p99 / 2}, "wire_bytes": wire}
        if limit is not None:
            out["limit"] = {"summary_ms": {"p99": limit}}
        return out
    pooled = {"ours-redundant": entry(110.0, 300, limit=100.0), "kcp-fast": entry(200.0, 200),
              "enet": entry(800.0, 100)}
    by_name = {t["target"]: t for t in scenario_targets("uniform", pooled)}
    assert [t["status"] for t in by_name.values()] == ["FAIL", "PASS", "FAIL"]
    assert by_name["uniform: ours p99 / KCP fast p99 <= 0.5"]["ratio"] == pytest.approx(0.55)
    assert all(t["status"] == "NOT RUN" for t in scenario_targets("bursts", {}))


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


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_quick_scenario_run(tmp_path, name):
    out = tmp_path / "results"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "loss_latency.py"), "--scenario", name,
         "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "Targets (issue #23" in completed.stdout
    data = json.loads((out / "loss_scenarios.json").read_text())
    [result] = data["scenarios"]
    assert result["scenario"] == name and result["seeds"] == [1]
    pooled = result["pooled"]
    assert sorted(pooled) == sorted(("ours-redundant", "ours-reliable", "enet", "kcp-fast"))
    for entry in pooled.values():
        assert entry["delivered"] == entry["count"] == SCENARIOS[name].quick_count
        assert entry["wire_ratio"] > 1.0
        s = entry["summary_ms"]
        assert 0 < s["p50"] <= s["p95"] <= s["p99"] <= s["max"]
    for run in result["runs"]:
        assert run["order_errors"] == run["corrupt"] == run["duplicates"] == 0, run
    ours = pooled["ours-redundant"]
    assert ours["limit"]["messages_below_limit"] == 0
    assert ours["limit"]["summary_ms"]["p99"] <= ours["summary_ms"]["p99"] + 0.001
    assert {t["status"] for t in result["targets"]} <= {"PASS", "FAIL"}
    if name == "long_path":
        assert result["size"] == 300
    if name == "episodes":
        assert ours["episode_recovery_ms"]["count"] >= 1
        assert sum(r["wire"]["dropped_up"] for r in result["runs"]) > 0
    if name == "congested":
        assert ours["delays_ms"]["up"]["queue"]["p99"] > 0
    if name == "rtt_jump":
        rates = result["rates"]["ours-redundant"]
        assert set(rates["jump"]) == set(rates["baseline"]) == {"before", "during", "after"}
        during = [r for r in result["runs"] if r["variant"] == "scenario"]
        # during the jump the round trip is ~400 ms, before it ~40
        assert max(max(r["rtts_ms"]) for r in during) > 380
    assert (out / "loss_scenarios.md").read_text().count("|") > 20
