"""relay_core.simlink's link model on its own: seeded decisions, burst loss, the rate-limited
bottleneck, duplication and reordering, in simulated time (no sockets, no clock)."""
from __future__ import annotations

import pytest

from relay.tools.netem import LinkSettings
from relay_core.simlink import IP_UDP_OVERHEAD_BYTES, Bottleneck, LinkProfile, LossyLink


def offer(link: LossyLink, count: int, spacing: float = 0.001, size: int = 32) -> None:
    for i in range(count):
        link.send(i.to_bytes(4, "big").ljust(size, b"."), i * spacing)


def run_lengths(decisions: list[bool]) -> list[int]:
    runs, current = [], 0
    for dropped in decisions + [False]:
        if dropped:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs


def test_same_seed_same_drops_and_other_seed_other_drops():
    def decisions(seed):
        link = LossyLink(LinkProfile(loss=0.1), seed)
        offer(link, 2000)
        return link.counters.drop_decisions

    first = decisions(1)
    assert decisions(1) == first
    assert decisions(2) != first
    assert 140 <= sum(first) <= 260  # 10 % of 2000: mean 200, sd 13.4
    assert len(first) == 2000


def test_loss_pattern_ignores_delay_duplication_and_reordering():
    plain = LossyLink(LinkProfile(loss=0.2), "seed")
    busy = LossyLink(LinkProfile(loss=0.2, delay=0.05, jitter=0.03, duplicate=0.3, reorder=0.2),
                     "seed")
    offer(plain, 500)
    offer(busy, 500)
    assert plain.counters.drop_decisions == busy.counters.drop_decisions


def test_a_higher_loss_rate_drops_a_superset():
    dropped = []
    for loss in (0.05, 0.1, 0.2):
        link = LossyLink(LinkProfile(loss=loss), 7)
        offer(link, 1000)
        dropped.append({i for i, d in enumerate(link.counters.drop_decisions) if d})
    assert dropped[0] < dropped[1] < dropped[2]


def test_burst_loss_comes_in_runs_of_the_configured_mean_length():
    link = LossyLink(LinkProfile(burst_enter=0.02, burst_exit=0.25, burst_loss=1.0), 3)
    offer(link, 20000)
    decisions = link.counters.drop_decisions
    runs = run_lengths(decisions)
    assert link.counters.dropped_burst == sum(decisions) == link.counters.dropped
    assert link.counters.dropped_loss == 0
    # Stays in the bad state are geometric with mean 1/burst_exit = 4 datagrams.
    mean = sum(runs) / len(runs)
    assert 3.3 <= mean <= 4.8, mean
    # Stationary share of the bad state: enter / (enter + exit) = 7.4 %.
    assert 0.055 <= sum(decisions) / len(decisions) <= 0.095
    # Independent loss at the same rate would almost never give a run of 15.
    assert max(runs) >= 15


def test_turning_bursts_off_leaves_the_bad_state():
    link = LossyLink(LinkProfile(burst_enter=1.0, burst_exit=0.0), 4)
    offer(link, 10)
    assert link.in_bad_state and link.counters.dropped_burst == 10
    link.profile = LinkProfile()
    offer(link, 10)
    assert not link.in_bad_state and link.counters.dropped == 10


def test_delay_jitter_and_arrival_order():
    link = LossyLink(LinkProfile(delay=0.02, jitter=0.01), 5)
    for i in range(200):
        link.send(bytes([i]), i * 0.001)
    assert link.arrivals(0.0199) == []
    assert link.next_arrival() >= 0.02
    arrived = []
    for tick in range(260):
        arrived += link.arrivals(tick * 0.001)
    assert sorted(arrived) == [bytes([i]) for i in range(200)]
    assert arrived != sorted(arrived)  # 10 ms of jitter at 1 ms spacing reorders
    assert link.in_flight == 0


def test_reordered_datagrams_are_held_back_by_reorder_delay():
    link = LossyLink(LinkProfile(reorder=0.1, reorder_delay=0.05), 6)
    hold_backs = []
    for i in range(1100):
        if i < 1000:
            link.send(i.to_bytes(2, "big"), i * 0.001)
        for datagram in link.arrivals(i * 0.001):
            hold_backs.append(i - int.from_bytes(datagram, "big"))
    assert len(hold_backs) == 1000
    late = [held for held in hold_backs if held]
    assert 60 <= len(late) <= 140  # mean 100, sd 9.5
    assert set(late) <= {50, 51}  # 50 ms on a 1 ms grid; 51 where float sums round up


def test_duplicates_arrive_once_more_with_their_own_jitter():
    link = LossyLink(LinkProfile(duplicate=0.1, delay=0.01), 8)
    offer(link, 1000)
    arrived = link.arrivals(10.0)
    assert 60 <= link.counters.duplicated <= 140
    assert len(arrived) == 1000 + link.counters.duplicated
    assert max(arrived.count(d) for d in set(arrived)) == 2


def test_rate_paces_datagrams_and_drops_past_the_queue_limit():
    # 800 kbit/s: 472 payload + 28 header bytes = 500 bytes = 4000 bits take 5 ms each.
    assert IP_UDP_OVERHEAD_BYTES == 28
    link = LossyLink(LinkProfile(rate=800_000, queue_limit=10), 9)
    for i in range(20):
        link.send(bytes([i]) * 472, 0.0)
    assert link.counters.dropped_queue == 10
    assert link.counters.drop_decisions == [False] * 10 + [True] * 10
    times = []
    while (due := link.next_arrival()) is not None:
        times.append(due)
        link.arrivals(due)
    assert times == pytest.approx([0.005 * (i + 1) for i in range(10)])
    # The queue has drained by then: room for more.
    link.send(b"x" * 472, times[-1])
    assert link.counters.dropped_queue == 10


def test_rate_sustains_the_configured_throughput():
    link = LossyLink(LinkProfile(rate=100_000, queue_limit=1_000_000), 10)
    size = 97  # 125 bytes with headers = 1000 bits: 100 datagrams per second
    for i in range(1000):
        link.send(b"." * size, i * 0.001)  # offered at 1000/s, ten times the rate
    last = None
    for _ in range(1001):
        if (due := link.next_arrival()) is None:
            break
        last = due
        link.arrivals(due)
    assert last == pytest.approx(10.0)


def test_each_route_has_its_own_bottleneck():
    link = LossyLink(LinkProfile(rate=8_000 * 8, queue_limit=100), 11)  # 8 kB/s
    first, second = Bottleneck(), Bottleneck()
    link.send(b"." * 972, 0.0, "first", first)    # 1000 bytes with headers: 125 ms
    link.send(b"." * 972, 0.0, "second", second)
    link.send(b"." * 972, 0.0, "first", first)
    assert link.routed_arrivals(0.125) == [(b"." * 972, "first"), (b"." * 972, "second")]
    assert link.routed_arrivals(0.25) == [(b"." * 972, "first")]


def test_decision_limit_bounds_what_is_recorded():
    link = LossyLink(LinkProfile(loss=0.5), 12, decision_limit=10)
    offer(link, 30)
    assert len(link.counters.drop_decisions) == 10
    assert link.counters.decisions_omitted == 20
    silent = LossyLink(LinkProfile(loss=0.5), 12, decision_limit=0)
    offer(silent, 30)
    assert silent.counters.drop_decisions == [] and silent.counters.dropped > 0


def test_discard_in_flight():
    link = LossyLink(LinkProfile(delay=1.0), 13)
    offer(link, 5)
    assert link.discard_in_flight() == 5
    assert link.in_flight == 0 and link.next_arrival() is None


def test_netem_settings_convert_to_the_model_units():
    settings = LinkSettings(loss=10, burst_enter=0.1, burst_exit=0.5, burst_loss=0.9, delay=20,
                            jitter=5, reorder=2, reorder_delay=30, duplicate=1, rate=256,
                            queue_limit=7)
    assert settings.profile() == LinkProfile(
        loss=0.1, burst_enter=0.1, burst_exit=0.5, burst_loss=0.9, delay=0.02, jitter=0.005,
        reorder=0.02, reorder_delay=0.03, duplicate=0.01, rate=256_000, queue_limit=7)
    assert LinkSettings().profile() == LinkProfile()
