"""Fleet simulation: the shipped Agones allocation and autoscaling policy over a simulated day.

A discrete simulation, one step per second, of relays in the Fleet of deploy/kubernetes/agones/
under the policy exactly as shipped, read from the manifests themselves:

* allocation (allocation.yaml): the selectors in order (gameServerState and Counter
  ``minAvailable``), the ``priorities`` order on the rooms Counter (Ascending: the fewest free
  slots first) and the Counter action (Increment ``amount``), applied atomically;
* autoscaling (fleetautoscaler.yaml): Agones' Counter policy (pkg/fleetautoscalers: the buffer as
  an absolute number or a percentage of the allocated count, minCapacity/maxCapacity limits,
  scale-down walking the GameServers in deletion order) every ``sync`` seconds; the
  GameServerSet then creates relays, or deletes the not-yet-Ready and Ready ones, never an
  Allocated one;
* the relay (fleet.yaml: Counter capacity, RELAY_ROOMS_MAX_ROOMS, RELAY_AGONES_WHEN_EMPTY): it
  frees a slot when a room ends; once it holds none it sees that on its watch a second later
  and calls Ready (or Shutdown), which Agones applies a second after that. An allocation landing
  in between leaves a Ready relay holding a room until the relay allocates itself again (two
  more seconds): a scale-down deleting it then loses those matches;
* a new relay is Ready ``--startup`` seconds after the autoscaler asked for it.

Matches arrive as a Poisson process whose rate makes the expected concurrency follow a diurnal
curve (trough ``--trough`` x peak at 04:00, ``--peak`` rooms at 16:00: rate = L/mean + dL/dt)
and last a log-normal time (median ``--median-minutes``, sigma ``--sigma``, clipped to 2..90
minutes). Two unmeasured warm-up hours at the trough's rate come first.

Reported over the day: relay-minutes (relays alive, sampled each minute) against the packing
bound (the sum over minutes of ceil(rooms held / max_rooms)), the worst minute (most relays over
the bound), idle room slots, allocations refused, matches lost to scale-down. PASS when
relay-minutes <= 1.10 x the bound, no allocation was refused and no match was lost; exit 1 on
FAIL. Node placement (Packed's node order) is not modelled: one node's view.

    python -m benchmarks.fleet_sim                 # a day at a 10 000-room peak (a few seconds)
    python -m benchmarks.fleet_sim --peak 500 --hours 6 --json
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
AGONES = ROOT / "deploy" / "kubernetes" / "agones"
TARGET_RATIO = 1.10
DAY = 86_400
WARMUP = 7_200
READY_DECISION = 1
"""Seconds from a room's end to the relay seeing on its watch that the GameServer holds none."""
APPLY = 1
"""Seconds for Agones to apply a state change the relay asked for."""

STARTING, READY, ALLOCATED, GONE = "Starting", "Ready", "Allocated", "Gone"


# -- the policy, as shipped -------------------------------------------------------------------

@dataclass
class Policy:
    capacity: int
    when_empty: str
    selectors: list[tuple[str, int]]
    """(gameServerState, rooms minAvailable) in order."""
    fullest_first: bool
    amount: int
    buffer: str | int
    min_capacity: int
    max_capacity: int
    sync: int


def _load(name: str) -> dict:
    return yaml.safe_load((AGONES / name).read_text())


def shipped_policy() -> Policy:
    fleet = _load("fleet.yaml")
    template = fleet["spec"]["template"]["spec"]
    capacity = int(template["counters"]["rooms"]["capacity"])
    (container,) = [c for c in template["template"]["spec"]["containers"]
                    if c["name"] == template["container"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    if int(env["RELAY_ROOMS_MAX_ROOMS"]) != capacity:
        raise SystemExit("fleet.yaml: the rooms Counter's capacity is not RELAY_ROOMS_MAX_ROOMS")
    allocation = _load("allocation.yaml")["spec"]
    selectors = [(s.get("gameServerState", READY), int(s["counters"]["rooms"]["minAvailable"]))
                 for s in allocation["selectors"]]
    (priority,) = [p for p in allocation["priorities"] if p["key"] == "rooms"]
    action = allocation["counters"]["rooms"]
    if action.get("action") != "Increment":
        raise SystemExit("allocation.yaml: the rooms Counter action is not Increment")
    autoscaler = _load("fleetautoscaler.yaml")["spec"]
    counter = autoscaler["policy"]["counter"]
    if autoscaler["policy"]["type"] != "Counter" or counter["key"] != "rooms":
        raise SystemExit("fleetautoscaler.yaml: not a Counter policy on rooms")
    return Policy(capacity=capacity, when_empty=env.get("RELAY_AGONES_WHEN_EMPTY", "ready"),
                  selectors=selectors, fullest_first=priority.get("order", "Ascending") == "Ascending",
                  amount=int(action.get("amount", 1)), buffer=counter["bufferSize"],
                  min_capacity=int(counter.get("minCapacity", 0)),
                  max_capacity=int(counter["maxCapacity"]),
                  sync=int(autoscaler["sync"]["fixedInterval"]["seconds"]))


# -- the fleet --------------------------------------------------------------------------------

@dataclass
class Relay:
    ident: int
    state: str
    capacity: int
    count: int = 0
    ready_at: int = 0
    decide_at: Optional[int] = None
    """When the relay, holding no room, decides (Ready or Shutdown)."""
    apply_at: Optional[int] = None
    """When Agones applies the state change asked for (``applying``)."""
    applying: Optional[str] = None
    matches: list[int] = field(default_factory=list)


class Fleet:
    def __init__(self, policy: Policy, startup: int):
        self.policy = policy
        self.startup = startup
        self.relays: dict[int, Relay] = {}
        self.next_id = 0
        self.replicas = 0
        self.heap: list[tuple[int, int, int]] = []
        """(-count or count, id, count) of Allocated relays with free slots, checked lazily."""
        self.ready: dict[int, Relay] = {}
        self.refused = 0
        self.lost = 0
        self.scale_events = 0

    # GameServerSet: create to reach the replicas, delete the not-yet-Ready then Ready ones.
    def reconcile(self, now: int) -> None:
        alive = [r for r in self.relays.values() if r.state != GONE]
        if len(alive) < self.replicas:
            for _ in range(self.replicas - len(alive)):
                relay = Relay(self.next_id, STARTING, self.policy.capacity, ready_at=now + self.startup)
                self.relays[relay.ident] = relay
                self.next_id += 1
        elif len(alive) > self.replicas:
            excess = len(alive) - self.replicas
            for relay in sorted(alive, key=lambda r: (r.state != STARTING, r.state != READY, r.ident)):
                if excess == 0 or relay.state == ALLOCATED:
                    break
                if relay.count:
                    self.lost += relay.count       # a Ready relay still holding rooms (the race)
                self.remove(relay)
                excess -= 1

    def remove(self, relay: Relay) -> None:
        relay.state = GONE
        self.ready.pop(relay.ident, None)
        del self.relays[relay.ident]

    def _key(self, relay: Relay) -> tuple[int, int, int]:
        return (-relay.count if self.policy.fullest_first else relay.count, relay.ident, relay.count)

    def _offer(self, relay: Relay) -> None:
        if relay.state == ALLOCATED and relay.capacity - relay.count >= 1:
            heapq.heappush(self.heap, self._key(relay))

    def allocate(self, now: int, ends: list, duration: int, match: int) -> bool:
        for state, min_available in self.policy.selectors:
            relay = self._pick(state, max(min_available, self.policy.amount))
            if relay is not None:
                relay.count += self.policy.amount
                if relay.state == READY:
                    self.ready.pop(relay.ident, None)
                relay.state = ALLOCATED
                relay.decide_at = None
                heapq.heappush(ends, (now + duration, match, relay.ident))
                self._offer(relay)
                return True
        self.refused += 1
        return False

    def _pick(self, state: str, need: int) -> Optional[Relay]:
        if state == READY:
            for ready in self.ready.values():
                if ready.capacity - ready.count >= need:
                    return ready
            return None
        while self.heap:
            _key, ident, count = self.heap[0]
            relay = self.relays.get(ident)
            if relay is None or relay.state != ALLOCATED or relay.count != count:
                heapq.heappop(self.heap)
                continue
            if relay.capacity - relay.count >= need:
                return relay
            heapq.heappop(self.heap)
        return None

    def end(self, now: int, ident: int) -> None:
        relay = self.relays.get(ident)
        if relay is None:
            return          # lost with its relay
        relay.count -= 1
        if relay.count == 0:
            relay.decide_at = now + READY_DECISION
        self._offer(relay)

    def timers(self, now: int) -> None:
        for relay in list(self.relays.values()):
            if relay.state == STARTING and now >= relay.ready_at:
                relay.state = READY
                self.ready[relay.ident] = relay
            if relay.decide_at is not None and now >= relay.decide_at:
                relay.decide_at = None
                if relay.count == 0 and relay.state == ALLOCATED:
                    relay.applying = "Shutdown" if self.policy.when_empty == "shutdown" else READY
                    relay.apply_at = now + APPLY
            if relay.apply_at is not None and now >= relay.apply_at:
                target, relay.applying, relay.apply_at = relay.applying, None, None
                if target == "Shutdown":
                    self.lost += relay.count
                    self.remove(relay)
                    continue
                if target == READY:
                    relay.state = READY
                    self.ready[relay.ident] = relay
                    if relay.count:
                        # The race: an allocation came after the relay's decision. The relay
                        # sees a room while Ready and allocates itself again.
                        relay.applying, relay.apply_at = ALLOCATED, now + READY_DECISION + APPLY
                elif target == ALLOCATED and relay.state == READY:
                    self.ready.pop(relay.ident, None)
                    relay.state = ALLOCATED
                    self._offer(relay)

    # FleetAutoscaler, Counter policy (Agones pkg/fleetautoscalers applyCounterOrListPolicy).
    def autoscale(self) -> None:
        p = self.policy
        alive = [r for r in self.relays.values() if r.state != GONE]
        replicas = len(alive)
        agg_count = sum(r.count for r in alive)
        agg_capacity = sum(r.capacity for r in alive)
        allocated = sum(r.count for r in alive if r.state == ALLOCATED)
        if isinstance(p.buffer, str) and p.buffer.endswith("%"):
            percent = int(p.buffer[:-1])
            if allocated <= 0 and p.capacity >= p.min_capacity:
                self._scale(1)
                return
            buffer = math.ceil(allocated * 100 / (100 - percent)) - allocated
        else:
            buffer = int(p.buffer)
        if agg_capacity < p.min_capacity:
            self._scale(replicas + math.ceil((p.min_capacity - agg_capacity) / p.capacity))
            return
        available = agg_capacity - agg_count
        if available < buffer:
            extra = math.ceil((buffer - available) / p.capacity)
            if agg_capacity + extra * p.capacity > p.max_capacity:
                extra = (p.max_capacity - agg_capacity) // p.capacity
            self._scale(replicas + extra)
        elif available > buffer:
            if agg_capacity == p.min_capacity:
                self._scale(replicas)
                return
            order = sorted(alive, key=lambda r: (r.state != STARTING, r.state != READY,
                                                 -(r.capacity - r.count), r.ident))
            for relay in order:
                replicas -= 1
                agg_count -= relay.count
                agg_capacity -= relay.capacity
                available = agg_capacity - agg_count
                if available < buffer or agg_capacity < p.min_capacity:
                    replicas += 1
                    break
                if available == buffer or agg_capacity == p.min_capacity:
                    break
            self._scale(max(1, replicas))
        else:
            self._scale(replicas)

    def _scale(self, replicas: int) -> None:
        if replicas != self.replicas:
            self.scale_events += 1
        self.replicas = replicas


# -- the load ---------------------------------------------------------------------------------

def concurrency(t: float, peak: float, trough: float) -> float:
    """Expected rooms at second t of the day: the trough at 04:00, the peak at 16:00."""
    phase = 2 * math.pi * (t - 4 * 3600) / DAY
    return peak * (trough + (1 - trough) * (1 - math.cos(phase)) / 2)


def poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:            # normal approximation: exact enough, and bounded work per second
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, product = math.exp(-lam), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def simulate(policy: Policy, *, peak: int = 10_000, trough: float = 0.15, hours: float = 24,
             median_minutes: float = 15.0, sigma: float = 0.5, startup: int = 30,
             seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    mean_seconds = median_minutes * 60 * math.exp(sigma ** 2 / 2)
    fleet = Fleet(policy, startup)
    fleet.replicas = max(1, math.ceil(policy.min_capacity / policy.capacity))
    ends: list[tuple[int, int, int]] = []
    end_time = int(hours * 3600)
    samples = []
    matches = 0
    refused_warmup = lost_warmup = 0
    for now in range(-WARMUP, end_time):
        if now == 0:
            refused_warmup, lost_warmup = fleet.refused, fleet.lost
            fleet.refused = fleet.lost = 0
        t = max(now, 0)
        level = concurrency(t, peak, trough)
        slope = (concurrency(t + 1, peak, trough) - level) if now >= 0 else 0.0
        rate = max(0.0, level / mean_seconds + slope)
        while ends and ends[0][0] <= now:
            _, _match, ident = heapq.heappop(ends)
            fleet.end(now, ident)
        fleet.timers(now)
        for _ in range(poisson(rng, rate)):
            minutes = min(90.0, max(2.0, rng.lognormvariate(math.log(median_minutes), sigma)))
            fleet.allocate(now, ends, int(minutes * 60), matches)
            matches += 1
        if now % policy.sync == 0:
            fleet.autoscale()
        fleet.reconcile(now)
        if now >= 0 and now % 60 == 0:
            held = sum(r.count for r in fleet.relays.values())
            relays = len(fleet.relays)
            samples.append((now, held, relays, math.ceil(held / policy.capacity)))
    relay_minutes = sum(s[2] for s in samples)
    bound = sum(s[3] for s in samples)
    worst = max(samples, key=lambda s: (s[2] - s[3], s[0]))
    idle = [s[2] * policy.capacity - s[1] for s in samples]
    peak_sample = max(samples, key=lambda s: s[1])
    ratio = relay_minutes / bound if bound else float("inf")
    passed = ratio <= TARGET_RATIO and fleet.refused == 0 and fleet.lost == 0
    return {
        "policy": {"max_rooms": policy.capacity, "when_empty": policy.when_empty,
                   "selectors": [list(s) for s in policy.selectors],
                   "fullest_first": policy.fullest_first, "buffer": policy.buffer,
                   "min_capacity": policy.min_capacity, "max_capacity": policy.max_capacity,
                   "sync_s": policy.sync},
        "load": {"peak_rooms": peak, "trough": trough, "hours": hours,
                 "median_minutes": median_minutes, "sigma": sigma, "startup_s": startup,
                 "seed": seed, "matches": matches, "peak_rooms_held": peak_sample[1]},
        "relay_minutes": relay_minutes, "packing_bound": bound, "ratio": round(ratio, 4),
        "worst_minute": {"minute": worst[0] // 60, "rooms": worst[1], "relays": worst[2],
                         "bound": worst[3]},
        "idle_slots": {"mean": round(sum(idle) / len(idle), 1), "max": max(idle),
                       "at_peak": peak_sample[2] * policy.capacity - peak_sample[1]},
        "relays_at_peak": peak_sample[2],
        "allocations_refused": fleet.refused, "matches_lost": fleet.lost,
        "warmup": {"refused": refused_warmup, "lost": lost_warmup},
        "target": f"relay-minutes <= {TARGET_RATIO:.2f} x bound, 0 refused, 0 lost",
        "result": "PASS" if passed else "FAIL",
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak", type=int, default=10_000, help="concurrent rooms at the peak")
    parser.add_argument("--trough", type=float, default=0.15, help="the trough, x peak")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (max 48)")
    parser.add_argument("--median-minutes", type=float, default=15.0)
    parser.add_argument("--sigma", type=float, default=0.5)
    parser.add_argument("--startup", type=int, default=30, help="seconds to a Ready relay")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--when-empty", choices=("ready", "shutdown"),
                        help="override fleet.yaml's RELAY_AGONES_WHEN_EMPTY (to compare)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if not 0 < args.hours <= 48 or not 0 < args.peak <= 100_000 or not 0 <= args.trough <= 1:
        parser.error("--hours in (0, 48], --peak in 1..100000, --trough in [0, 1]")
    policy = shipped_policy()
    if args.when_empty:
        policy.when_empty = args.when_empty
    report = simulate(policy, peak=args.peak, trough=args.trough, hours=args.hours,
                      median_minutes=args.median_minutes, sigma=args.sigma,
                      startup=args.startup, seed=args.seed)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        p, load = report["policy"], report["load"]
        print(f"policy: {p['max_rooms']} rooms/relay, buffer {p['buffer']}, sync {p['sync_s']} s, "
              f"when_empty {p['when_empty']}, fullest first {p['fullest_first']}")
        print(f"load: {load['matches']} matches over {load['hours']} h, peak "
              f"{load['peak_rooms_held']} rooms held, relay start-up {load['startup_s']} s")
        print(f"relay-minutes {report['relay_minutes']}  packing bound {report['packing_bound']}"
              f"  ratio {report['ratio']:.3f}")
        w = report["worst_minute"]
        print(f"worst minute: {w['minute']} ({w['relays']} relays for {w['rooms']} rooms, "
              f"bound {w['bound']})")
        print(f"idle slots: mean {report['idle_slots']['mean']}, max {report['idle_slots']['max']},"
              f" at peak {report['idle_slots']['at_peak']}")
        print(f"allocations refused {report['allocations_refused']}, matches lost "
              f"{report['matches_lost']}")
        print(f"{report['result']} ({report['target']})")
    return 0 if report["result"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
