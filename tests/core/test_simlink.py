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


# --------------------------------------------------------------------------------------------
# Loss episodes: time-correlated, independent of how many datagrams are sent


def episode_decisions(spacing: float, seconds: float, seed="ep", mean=0.1, share=0.1):
    link = LossyLink(LinkProfile(episode_mean=mean, episode_share=share), seed)
    offer(link, int(seconds / spacing), spacing=spacing)
    return link


def test_episodes_cover_the_configured_share_with_the_configured_mean_duration():
    link = episode_decisions(0.005, 2000.0)
    episodes = [(s, e) for s, e in link.episodes.history if e <= 2000.0]
    durations = [e - s for s, e in episodes]
    # ~2000 episodes of mean 0.1 s: the mean's standard error is ~2.2 ms.
    assert 1700 <= len(durations) <= 2300, len(durations)
    assert 0.092 <= sum(durations) / len(durations) <= 0.108
    assert 0.09 <= sum(durations) / 2000.0 <= 0.11
    # Exponential: about e^-1 of them last longer than the mean.
    longer = sum(d > 0.1 for d in durations) / len(durations)
    assert 0.33 <= longer <= 0.41, longer
    decisions = link.counters.drop_decisions
    assert link.counters.dropped_episode == sum(decisions) == link.counters.dropped
    assert 0.09 <= sum(decisions) / len(decisions) <= 0.11
    # Every datagram inside an episode is lost, every one outside gets through.
    for i in range(0, len(decisions), 997):
        t = i * 0.005
        inside = any(s <= t < e for s, e in episodes)
        assert decisions[i] == inside, (i, t)


def test_episodes_last_a_time_not_a_number_of_datagrams():
    sparse = episode_decisions(0.030, 300.0, seed=5)
    dense = episode_decisions(0.003, 300.0, seed=5)
    # The same seed gives the same episodes whatever the send rate ...
    assert sparse.episodes.history[:50] == dense.episodes.history[:50]
    # ... so a sender 10x as fast loses ~10x as many datagrams per episode.
    per_episode = [link.counters.dropped_episode / len(link.episodes.history)
                   for link in (sparse, dense)]
    assert 7 <= per_episode[1] / per_episode[0] <= 13, per_episode


def test_episodes_are_deterministic_for_a_seed_and_leave_the_other_draws_alone():
    assert episode_decisions(0.01, 60.0).counters.drop_decisions == \
        episode_decisions(0.01, 60.0).counters.drop_decisions
    assert episode_decisions(0.01, 60.0).episodes.history != \
        episode_decisions(0.01, 60.0, seed="other").episodes.history
    plain = LossyLink(LinkProfile(loss=0.2), "s")
    both = LossyLink(LinkProfile(loss=0.2, episode_mean=0.1, episode_share=0.1), "s")
    offer(plain, 3000, spacing=0.01)
    offer(both, 3000, spacing=0.01)
    # The independent losses are the same datagrams: episodes only add drops.
    random_drops = {i for i, d in enumerate(plain.counters.drop_decisions) if d}
    all_drops = {i for i, d in enumerate(both.counters.drop_decisions) if d}
    assert random_drops <= all_drops and len(all_drops) > len(random_drops)


def test_episodes_with_one_seed_and_origin_coincide_and_can_be_turned_off():
    from relay_core.simlink import LossEpisodes
    a, b = LossEpisodes("x", origin=0.0), LossEpisodes("x", origin=0.0)
    ticks = [i * 0.001 for i in range(20000)]
    pattern = [a.is_down(t, 0.1, 0.1) for t in ticks]
    assert pattern == [b.is_down(t, 0.1, 0.1) for t in ticks]
    assert 0.02 <= sum(pattern) / len(pattern) <= 0.3 and a.history == b.history
    assert not any(a.is_down(30 + t, 0.0, 0.0) for t in ticks)
    assert all(a.is_down(60 + t, 0.1, 1.0) for t in ticks[:10])


def test_netem_settings_convert_episodes_and_reject_a_share_without_a_duration():
    profile = LinkSettings(episode_ms=100, episode_share=10).profile()
    assert profile.episode_mean == pytest.approx(0.1)
    assert profile.episode_share == pytest.approx(0.1)
    with pytest.raises(ValueError):
        LinkSettings(episode_share=10)
    with pytest.raises(ValueError):
        LinkSettings(episode_ms=100, episode_share=101)


def test_delays_record_queueing_and_one_way_delay():
    link = LossyLink(LinkProfile(delay=0.02, rate=80_000, queue_limit=100), "d")
    # 72 + 28 bytes at 80 kbit/s: 10 ms each on the wire; 5 sent at once queue behind each other.
    for i in range(5):
        link.send(bytes(72), 0.0)
    queueing = [q for q, _ in link.counters.delays]
    assert queueing == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert [d - q for q, d in link.counters.delays] == pytest.approx([0.02] * 5)
