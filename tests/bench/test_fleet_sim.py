"""benchmarks/fleet_sim.py: the shipped policy read from the manifests, the Agones rules it
models, and a small day that must PASS."""
from __future__ import annotations

import heapq

import pytest

from benchmarks import fleet_sim
from benchmarks.fleet_sim import ALLOCATED, READY, Fleet, Policy, shipped_policy, simulate


def policy(**overrides) -> Policy:
    values = dict(capacity=4, when_empty="ready", selectors=[(ALLOCATED, 1), (READY, 1)],
                  fullest_first=True, amount=1, buffer=2, min_capacity=4, max_capacity=400, sync=10)
    values.update(overrides)
    return Policy(**values)


def fleet_of(n: int, pol: Policy) -> Fleet:
    fleet = Fleet(pol, startup=0)
    fleet.replicas = n
    fleet.reconcile(0)
    fleet.timers(0)
    return fleet


def test_the_simulated_policy_is_the_shipped_one():
    p = shipped_policy()
    assert p.selectors == [("Allocated", 1), ("Ready", 1)] * 2     # this release, then any
    assert p.fullest_first and p.amount == 1 and p.when_empty == "ready"
    assert p.capacity == 128 and p.min_capacity >= p.capacity


def test_allocation_fills_the_fullest_allocated_relay_then_a_ready_one():
    fleet = fleet_of(3, policy())
    ends: list = []
    for match in range(5):
        assert fleet.allocate(0, ends, 60, match)
    counts = sorted((r.count for r in fleet.relays.values()), reverse=True)
    assert counts == [4, 1, 0]              # packed, not spread
    for match in range(5, 13):
        fleet.allocate(0, ends, 60, match)
    assert fleet.refused == 1               # 3 x 4 slots
    assert len(ends) == 12 and heapq.nsmallest(1, ends)[0][0] == 60


def test_counter_autoscaling_keeps_the_buffer_and_never_deletes_an_allocated_relay():
    fleet = fleet_of(1, policy(buffer=2))
    ends: list = []
    for match in range(3):
        fleet.allocate(0, ends, 60, match)
    fleet.autoscale()
    assert fleet.replicas == 2              # 1 free slot < buffer 2: one more relay
    fleet.reconcile(0)
    fleet.timers(0)
    fleet.replicas = 0                      # even if asked to go to nothing
    fleet.reconcile(0)
    assert [r.count for r in fleet.relays.values()] == [3]


def test_percentage_buffer_follows_agones():
    fleet = fleet_of(2, policy(buffer="50%", min_capacity=4))
    ends: list = []
    for match in range(4):
        fleet.allocate(0, ends, 60, match)
    fleet.autoscale()
    # 4 allocated at 50 %: capacity 8 wanted, 4 free -> the two relays there are enough
    assert fleet.replicas == 2
    fleet.allocate(0, ends, 60, 9)
    fleet.autoscale()
    assert fleet.replicas == 3              # 5 allocated: 10 wanted, 3 free < 5


def test_a_relay_that_goes_ready_while_an_allocation_lands_can_lose_matches():
    """The race the relay's rule leaves open is modelled, so "matches lost" can be non-zero."""
    fleet = fleet_of(2, policy(buffer=1))
    ends: list = []
    fleet.allocate(0, ends, 10, 0)
    (relay,) = [r for r in fleet.relays.values() if r.count]
    fleet.end(10, relay.ident)              # empty: decides at 11, Agones applies at 12
    fleet.timers(11)
    for other in list(fleet.relays.values()):
        if other is not relay:
            fleet.remove(other)
    fleet.allocate(11, ends, 600, 1)        # lands on the relay about to turn Ready
    fleet.timers(12)
    assert relay.state == READY and relay.count == 1
    fleet.replicas = 0
    fleet.reconcile(12)
    assert fleet.lost == 1


def test_a_small_day_passes():
    report = simulate(shipped_policy(), peak=600, hours=24, seed=3)
    assert report["result"] == "PASS", report
    assert report["allocations_refused"] == 0 and report["matches_lost"] == 0
    assert report["packing_bound"] <= report["relay_minutes"] <= 1.10 * report["packing_bound"]
    assert report["load"]["peak_rooms_held"] > 500


def test_the_cli_fails_a_policy_that_cannot_keep_up(capsys):
    # Relays that take 15 minutes to start while the morning ramp brings short matches: the
    # buffer runs dry and allocations are refused.
    assert fleet_sim.main(["--peak", "3000", "--hours", "3", "--startup", "900",
                           "--median-minutes", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "allocations refused 0," not in out


@pytest.mark.parametrize("argv", [["--hours", "0"], ["--peak", "0"], ["--trough", "2"]])
def test_bounded_arguments(argv):
    with pytest.raises(SystemExit):
        fleet_sim.main(argv)
