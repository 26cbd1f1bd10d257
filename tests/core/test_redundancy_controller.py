"""The redundancy controller (docs/PROTOCOL.md 12.5; issue #23): what it reads from the acks and
the RTT, the mode it picks, and what that does to a stream on each of loss_latency's scenario
links (run in simulated time by benchmarks.echo_sim, on the same link model as the benchmark)."""
from __future__ import annotations

import random

import pytest

from benchmarks.echo_sim import percentile, run_echo
from benchmarks.loss_latency import SCENARIOS, episode_recoveries
from relay_core import ConfigError, EndpointConfig
from relay_core.redundancy import LinkModel


def judge(model: LinkModel, pattern) -> None:
    for lost in pattern:
        model.judged(bool(lost))


# -- the estimates, alone ----------------------------------------------------------------------

def test_independent_losses_are_lossy_and_runs_of_losses_are_bursty():
    rng = random.Random(7)
    independent = LinkModel()
    judge(independent, (rng.random() < 0.1 for _ in range(3000)))
    assert independent.update(0.0) == "lossy"
    assert 0.07 < independent.loss < 0.13 and independent.burst_length < 1.3

    bursty = LinkModel()
    # The same average loss in runs of three: every loss is followed by two more.
    judge(bursty, ([1, 1, 1] + [0] * 27) * 100)
    assert bursty.update(0.0) == "bursty"
    assert 2.5 < bursty.burst_length <= 3.0


def test_heavy_independent_loss_is_not_taken_for_bursts():
    rng = random.Random(8)
    model = LinkModel()
    judge(model, (rng.random() < 0.4 for _ in range(3000)))
    assert model.update(0.0) == "lossy"


def test_a_path_that_stops_losing_becomes_clean_after_loss_memory_datagrams():
    model = LinkModel(loss_memory=32)
    judge(model, [1, 0, 0, 1])
    judge(model, [0] * 31)
    assert model.update(0.0) == "lossy"
    model.judged(False)
    assert model.update(0.0) == "clean"
    model.judged(True)
    assert model.update(0.0) == "lossy"


def test_a_filling_queue_is_congestion_and_jitter_or_a_long_path_is_not():
    model = LinkModel(congestion_delay=0.05, congestion_hold=5.0)
    for k in range(50):                     # a 40 ms path with +-20 ms of jitter
        model.rtt(0.040 + (k % 5) * 0.01, 0.050, now=k * 0.03)
    assert model.update(1.5) != "congested" and model.min_rtt == pytest.approx(0.04)
    model.rtt(0.200, 0.070, now=1.6)        # one late sample: a spike, not a queue
    assert model.update(1.6) != "congested"
    model.rtt(0.045, 0.060, now=1.63)
    model.rtt(0.180, 0.080, now=1.66)       # samples in a row well above the floor
    model.rtt(0.190, 0.100, now=1.69)
    assert model.update(1.7) == "congested" and model.queue_delay == pytest.approx(0.15)
    assert model.update(1.69 + 4.9) == "congested"
    assert model.update(1.69 + 5.1) != "congested"      # held congestion_hold after the last sign

    long_path = LinkModel()
    for k in range(200):                    # 340 +- 20 ms, steady
        long_path.rtt(0.330 + (k % 3) * 0.01, 0.340, now=k * 0.03)
    assert long_path.update(6.0) != "congested" and long_path.min_rtt == pytest.approx(0.33)


def test_the_rtt_floor_follows_a_path_that_got_longer_within_two_windows():
    model = LinkModel(min_rtt_window=10.0)
    for k in range(100):
        model.rtt(0.040, 0.040, now=k * 0.1)
    for k in range(100, 320):
        model.rtt(0.300, 0.300, now=k * 0.1)
    assert model.min_rtt == pytest.approx(0.3)
    assert model.update(32.0) != "congested" or model.queue_delay < 0.05


@pytest.mark.parametrize("field,value", [
    ("burst_threshold", 0.0), ("burst_threshold", 1.0), ("congestion_delay", 0.0),
    ("congestion_hold", 0.0), ("min_rtt_window", -1.0), ("congested_copies", 17),
    ("congested_copies", -1), ("prompt_copies", 0), ("prompt_copies", 17),
])
def test_bad_controller_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        EndpointConfig(**{field: value}).validate()


# -- what it does to a stream, per scenario (simulated time, deterministic) ----------------------

def scenario_run(name: str, seed: int = 1, count: int = 1000, **ours):
    scenario = SCENARIOS[name]
    phases = [(fraction, new) for fraction, _, new in scenario.phases]
    return run_echo(scenario.settings, count, seed, scenario.size, phases=phases, ours=ours)


def p99(run) -> float:
    return percentile(run.delivered, 99)


def limit_p99(run) -> float:
    return percentile([v for v in run.limit if v is not None], 99)


def test_uniform_loss_is_lossy_and_reaches_its_trace_limit():
    run = scenario_run("uniform")
    assert len(run.delivered) == 1000
    assert run.peer_stats["server"]["redundancy_mode"] == "lossy"
    assert p99(run) <= 1.1 * limit_p99(run)


def test_bursts_make_both_ends_bursty_and_copy_until_acked():
    runs = [scenario_run("bursts", seed) for seed in (1, 2)]
    for run in runs:
        assert len(run.delivered) == 1000
        assert run.peer_stats["client"]["burst_length"] > 1.5     # 3 on average; an EWMA
    assert {run.peer_stats["client"]["redundancy_mode"] for run in runs} == {"bursty"}
    # The adaptive copies alone (bursty mode never chosen) leave a longer tail.
    lossy_only = [scenario_run("bursts", seed, burst_threshold=0.99) for seed in (1, 2)]
    pooled = lambda rs: percentile([v for r in rs for v in r.delivered], 99)  # noqa: E731
    assert pooled(runs) < 0.85 * pooled(lossy_only)


def test_after_a_loss_episode_bursty_copies_deliver_what_it_held_back_sooner():
    def recoveries(**ours):
        runs = [scenario_run("episodes", seed, **ours) for seed in (1, 2)]
        assert all(len(run.delivered) == 1000 and run.episodes for run in runs)
        return [v for run in runs for v in episode_recoveries(run.episodes, run.send_times, run.rtts)]
    bursty = recoveries()
    lossy_only = recoveries(burst_threshold=0.99)       # bursty mode never chosen
    assert len(bursty) == len(lossy_only) > 20
    assert min(bursty) >= 0.0
    # Every unacked message rides the first datagram after the episode (60.8 ms against 70.1
    # on these seeds, where an ARQ needs a round trip more).
    assert sum(bursty) / len(bursty) < 0.95 * sum(lossy_only) / len(lossy_only)


def test_a_long_steady_path_keeps_its_copies():
    run = scenario_run("long_path")
    server = run.peer_stats["server"]
    assert server["redundancy_mode"] == "lossy" and server["min_rtt"] > 0.3
    # Every message copied at least once: the copy budget is not cut for a long RTT.
    assert server["redundant_bytes"] >= 0.9 * 1000 * 300
    assert p99(run) < 2.5 * limit_p99(run)


def test_a_congested_bottleneck_is_detected_and_copies_stop_filling_it():
    run = scenario_run("congested")
    assert len(run.delivered) == 1000
    for side in ("client", "server"):
        assert run.peer_stats[side]["redundancy_mode"] == "congested"
    copying = scenario_run("congested", congestion_delay=10.0)     # never congested
    assert p99(run) < 0.5 * p99(copying)
    assert run.bytes_up + run.bytes_down < copying.bytes_up + copying.bytes_down


def test_an_rtt_jump_sends_no_extra_datagrams_for_what_is_only_late():
    scenario = SCENARIOS["rtt_jump"]
    phases = [(fraction, new) for fraction, _, new in scenario.phases]
    jump = run_echo(scenario.settings, 600, 1, scenario.size, phases=phases)
    baseline = run_echo(scenario.settings, 600, 1, scenario.size)
    span = 600 * 0.030
    during = lambda run: sum(span / 3 <= t < 2 * span / 3 for t in run.server_sends)  # noqa: E731
    assert len(jump.delivered) == 600
    assert during(jump) <= 1.05 * during(baseline)
    assert jump.datagrams_up <= 1.05 * baseline.datagrams_up
    # The client's RTO did expire (the messages were late), and those resends rode the stream.
    assert jump.peer_stats["client"]["resends"] > 0
