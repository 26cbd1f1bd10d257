#!/usr/bin/env python3
"""Round-trip latency under loss: our redundant and reliable_ordered channels vs ENet and KCP.

The experiment of the reference thesis (section 6), on loopback through relay.tools.netem:

* a client sends an 80-byte message every 30 ms (1000 of them; ``--count``) carrying its send
  time; the server echoes it on the same reliable ordered stream; the client records each
  message's round trip as it is delivered, in order;
* links per direction: ``low`` = 5 ms + U(0, 10) ms one way, ``high`` = 30 ms + U(0, 20) ms
  (20 ms with 10-30 ms jitter); loss per direction 0, 2.5, 5, 7.5, 10, 12.5 %; the emulator's
  seed is the same for every protocol and every point;
* protocols side by side: ours ``redundant`` and ``reliable_ordered`` (relay_core), ENet
  (pyenet, reliable channel) and KCP (``kcp``: normal mode and fast mode 1,10,2,1), each behind an
  adapter of ``benchmarks/adapters``; by default all protocols of one link/loss point run
  concurrently in one event loop, each with its own emulator and ports (``--sequential`` runs
  them one after the other);
* per protocol x link x loss: mean, p50, p95, p99, max round trip, messages delivered, bytes on
  the wire (both directions, counted by the emulator) relative to payload bytes; the
  redundancy limit computed from the emulator's drop decisions in our redundant run; the
  targets printed PASS/FAIL.

``--scenario NAME`` (or ``all``) runs instead the named scenarios of issue #23 (``SCENARIOS``):
uniform loss, per-datagram Gilbert-Elliott bursts, time-correlated loss episodes, a long path,
an RTT jump and a congested bottleneck, on the issue's 10-30 ms link unless said otherwise, every
protocol but KCP normal side by side, pooled over ``--seeds`` (defaults per scenario, chosen with
``--ideal-stability``); each with the loss-trace limit of its own runs, its own figures (episode
recovery, datagram rates per window, time in the bottleneck) and the issue's targets as
informational PASS/FAIL lines. ``--quick`` is the CI size. Writes ``loss_scenarios.json`` and
``loss_scenarios.md``.

Writes ``loss_latency.json``, ``loss_latency.md`` and (with matplotlib) ``loss_latency_p99.png``,
``loss_latency_wire.png``, ``loss_latency_trace.png`` into ``--out`` (default
benchmarks/results/). Method and results: docs/BENCHMARKS.md, "Latency under loss".

Exit status: 0 when every protocol delivered every message intact and in order; 1 otherwise;
2 for a usage error or a protocol library that cannot be imported (the reason is printed).
The latency targets are reported, never turned into the exit status.

Run:  python3 benchmarks/loss_latency.py                      # full matrix (~10 minutes)
      python3 benchmarks/loss_latency.py --scenario all       # the scenarios (~13 minutes)
      python3 benchmarks/loss_latency.py --scenario bursts --quick
      python3 benchmarks/loss_latency.py --count 50 --loss 5 --link high
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import dataclasses
import gc
import json
import math
import os
import platform
import shlex
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:           # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks import adapters  # noqa: E402
from benchmarks.machine import cpu_model, usable_cores  # noqa: E402
from relay.tools.netem import LinkSettings, Netem  # noqa: E402

# --------------------------------------------------------------------------------------------
# The experiment's parameters


@dataclass(frozen=True)
class Link:
    name: str
    delay_ms: float
    """Base one-way delay given to the emulator."""
    jitter_ms: float
    """The emulator adds U(0, jitter) ms per datagram."""
    description: str


LINKS = {
    "low": Link("low", 5.0, 10.0, "5 ms one way with 0-10 ms jitter: 5 + U(0, 10) ms"),
    "high": Link("high", 30.0, 20.0,
                 "20 ms one way with 10-30 ms jitter: 20 + U(10, 30) = 30 + U(0, 20) ms"),
}
LOSSES = (0.0, 2.5, 5.0, 7.5, 10.0, 12.5)
DEFAULT_COUNT = 1000
DEFAULT_INTERVAL_MS = 30.0
DEFAULT_SIZE = 80
DEFAULT_SEED = 1
DEFAULT_DRAIN = 30.0
DEFAULT_ACK_DELAY = 0.005
DEFAULT_OUT = ROOT / "benchmarks" / "results"
TRACE_LOSS = 5.0
IP_UDP_OVERHEAD = 28
HEADER = struct.Struct("<Id")           # message number, client send time (loop seconds)

# --------------------------------------------------------------------------------------------
# Statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics (numpy's
    default, Hyndman-Fan type 7): position (n - 1) * q / 100 of the sorted values."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q={q!r}: 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def summarize(values: Iterable[Optional[float]]) -> dict[str, Any]:
    """count (of non-None values), mean, p50, p95, p99, max, min; None figures when empty."""
    present = [v for v in values if v is not None]
    out: dict[str, Any] = {"count": len(present)}
    if not present:
        out.update(mean=None, p50=None, p95=None, p99=None, max=None, min=None)
        return out
    out["mean"] = sum(present) / len(present)
    for q in (50, 95, 99):
        out[f"p{q}"] = percentile(present, q)
    out["max"] = max(present)
    out["min"] = min(present)
    return out


# --------------------------------------------------------------------------------------------
# The redundancy limit


@dataclass(frozen=True)
class Datagram:
    """One datagram of one direction: when it was sent, whether the emulator dropped it, and
    when it arrived (None if dropped or never seen)."""

    sent: float
    dropped: bool
    arrived: Optional[float]


def datagram_fates(sent: Sequence[tuple[float, bytes]], decisions: Sequence[bool],
                   arrived: Sequence[tuple[float, bytes]]) -> tuple[list[Datagram], dict]:
    """Join one direction's send log, the emulator's drop decisions and the receive log.

    The emulator decides in the order datagrams reach it, which on loopback from one socket is
    the order they were sent, so decision i belongs to sent datagram i. A survivor's arrival is
    found by its bytes (the oldest unclaimed arrival of identical bytes). A datagram with no
    decision (still in a socket buffer when the run stopped) counts as dropped. The second value
    reports how well the logs agree.
    """
    arrivals: dict[bytes, collections.deque] = collections.defaultdict(collections.deque)
    for when, data in arrived:
        arrivals[data].append(when)
    out = []
    unmatched = 0
    for index, (when, data) in enumerate(sent):
        dropped = decisions[index] if index < len(decisions) else True
        arrival = None
        if not dropped:
            queue = arrivals.get(data)
            if queue:
                arrival = queue.popleft()
            else:
                unmatched += 1
        out.append(Datagram(when, dropped, arrival))
    extra = sum(len(q) for q in arrivals.values())
    return out, {"sent": len(sent), "decisions": len(decisions),
                 "survivors_without_arrival": unmatched, "arrivals_without_send": extra}


def _suffix_earliest(datagrams: Sequence[Datagram]) -> list[float]:
    """earliest[k] = the earliest arrival among datagrams k.. that got through (inf if none)."""
    earliest = [math.inf] * (len(datagrams) + 1)
    for k in range(len(datagrams) - 1, -1, -1):
        d = datagrams[k]
        here = d.arrived if (not d.dropped and d.arrived is not None) else math.inf
        earliest[k] = min(here, earliest[k + 1])
    return earliest


def redundancy_limit(message_times: Sequence[float], up: Sequence[Datagram],
                     down: Sequence[Datagram]) -> list[Optional[float]]:
    """Per message, the shortest round trip any protocol could have had if every datagram it
    sent carried every unacknowledged message (the echo included), with the datagrams,
    send times, drop decisions and delays of the recorded run:

        A = earliest arrival at the server of an up datagram sent at or after the message's send
            time that the emulator did not drop;
        B = earliest arrival at the client of a down datagram sent at or after A that was not
            dropped;
        limit = B - send time.

    Arrival times are the measured ones, so the delays are those the emulator actually applied
    (base + drawn jitter, plus its timer lateness). Taking the earliest arrival rather than the
    first survivor in send order keeps this a lower bound when jitter reorders datagrams.
    ``up`` and ``down`` are in send order. None when no datagram could have carried it.
    """
    up_times = [d.sent for d in up]
    down_times = [d.sent for d in down]
    up_earliest = _suffix_earliest(up)
    down_earliest = _suffix_earliest(down)
    out: list[Optional[float]] = []
    for sent in message_times:
        at_server = up_earliest[bisect.bisect_left(up_times, sent)]
        if math.isinf(at_server):
            out.append(None)
            continue
        back = down_earliest[bisect.bisect_left(down_times, at_server)]
        out.append(None if math.isinf(back) else back - sent)
    return out


# --------------------------------------------------------------------------------------------
# One protocol at one link/loss point


@dataclass
class RunOptions:
    count: int = DEFAULT_COUNT
    interval: float = DEFAULT_INTERVAL_MS / 1000.0
    size: int = DEFAULT_SIZE
    seed: int = DEFAULT_SEED
    drain: float = DEFAULT_DRAIN
    ack_delay: float = DEFAULT_ACK_DELAY
    connect_timeout: float = 10.0
    ours_config: Optional[dict] = None
    """Further EndpointConfig fields for our endpoints (e.g. redundancy_budget)."""


def make_payload(number: int, sent: float, size: int) -> bytes:
    head = HEADER.pack(number, sent)
    filler = bytes((number + k) & 0xFF for k in range(size - HEADER.size))
    return head + filler


@dataclass(frozen=True)
class Phase:
    """A moment of a scenario's run: at ``at`` seconds after the first send, the emulator's
    settings change (None: unchanged) and its datagram counters are read, so the run is cut into
    windows whose datagram rates are reported."""

    at: float
    name: str
    up: Optional[LinkSettings] = None
    down: Optional[LinkSettings] = None


SAMPLE_SECONDS = 0.25
PEAK_SPAN_SECONDS = 1.0


def peak_rates(samples: Sequence[tuple[float, int, int]]) -> dict[str, Optional[float]]:
    """The highest datagram rate of the client (up) and the server (down) over any span of
    PEAK_SPAN_SECONDS between (time, up count, down count) samples; None if the samples do not
    cover one span. A brief burst of retransmissions shows here, diluted in a window's mean."""
    best: dict[str, Optional[float]] = {"client": None, "server": None}
    j = 0
    for i in range(len(samples)):
        while j < len(samples) and samples[j][0] - samples[i][0] < PEAK_SPAN_SECONDS - 1e-3:
            j += 1
        if j == len(samples):
            break
        span = samples[j][0] - samples[i][0]
        for key, index in (("client", 1), ("server", 2)):
            rate = (samples[j][index] - samples[i][index]) / span
            current = best[key]
            best[key] = rate if current is None else max(current, rate)
    return best


async def run_protocol(protocol: str, link: Link, loss: float, options: RunOptions,
                       settings: Optional[LinkSettings] = None,
                       phases: Sequence[Phase] = ()) -> dict[str, Any]:
    """Run the echo test for one protocol through its own emulator; return its results.

    ``settings`` (both directions) replaces the link/loss pair's; ``phases`` change them during
    the run and mark the windows of ``result["windows"]``."""
    loop = asyncio.get_running_loop()
    count = options.count
    rtts: list[Optional[float]] = [None] * count
    sent_payloads: list[Optional[bytes]] = [None] * count
    send_times: list[Optional[float]] = [None] * count
    state = {"next": 0, "delivered": 0, "order_errors": 0, "corrupt": 0, "duplicates": 0}
    all_done = loop.create_future()

    def on_echo(payload: bytes, now: float) -> None:
        try:
            number, sent = HEADER.unpack_from(payload)
        except struct.error:
            state["corrupt"] += 1
            return
        if not 0 <= number < count or payload != sent_payloads[number]:
            state["corrupt"] += 1
            return
        if rtts[number] is not None:
            state["duplicates"] += 1
            return
        if number != state["next"]:
            state["order_errors"] += 1
        state["next"] = number + 1
        rtts[number] = (now - sent) * 1000.0
        state["delivered"] += 1
        if state["delivered"] == count and not all_done.done():
            all_done.set_result(None)

    adapter = adapters.create(protocol, on_echo, ack_delay=options.ack_delay,
                              ours_config=options.ours_config)
    if settings is None:
        settings = LinkSettings(loss=loss, delay=link.delay_ms, jitter=link.jitter_ms)
    netem: Optional[Netem] = None
    marks: list[tuple[str, float, int, int]] = []   # (phase, loop time, datagrams up, down)
    phase_task: Optional[asyncio.Task] = None

    def mark(name: str) -> None:
        assert netem is not None
        counters = netem.stats()
        marks.append((name, loop.time(), counters["up"]["datagrams_in"],
                      counters["down"]["datagrams_in"]))

    samples: list[tuple[float, int, int]] = []     # every SAMPLE_SECONDS while phases run

    async def sample_rates(start: float) -> None:
        assert netem is not None
        tick = 0
        while True:
            await asyncio.sleep(max(0.0, start + tick * SAMPLE_SECONDS - loop.time()))
            counters = netem.stats()
            samples.append((loop.time(), counters["up"]["datagrams_in"],
                            counters["down"]["datagrams_in"]))
            tick += 1

    async def run_phases(start: float) -> None:
        assert netem is not None
        sampler = asyncio.create_task(sample_rates(start))
        try:
            await _apply_phases(start)
            await asyncio.Future()      # keep sampling until cancelled after the last send
        finally:
            sampler.cancel()

    async def _apply_phases(start: float) -> None:
        assert netem is not None
        for phase in phases:
            await asyncio.sleep(max(0.0, start + phase.at - loop.time()))
            if phase.up is not None:
                netem.set_up(phase.up)
            if phase.down is not None:
                netem.set_down(phase.down)
            mark(phase.name)

    errors: list[str] = []
    result: dict[str, Any] = {"protocol": protocol, "label": adapters.LABELS[protocol],
                              "link": link.name, "loss": loss, "count": count,
                              "settings": adapter.settings()}
    started = time.monotonic()
    stats: dict[str, Any] = {}
    up_decisions: list[bool] = []
    down_decisions: list[bool] = []
    link_delays: dict[str, list[tuple[float, float]]] = {}
    episodes: list[tuple[float, float]] = []
    clock_offset = 0.0
    log = None
    peer_stats = None
    first_send = last_send = None
    try:
        server_address = await adapter.start_server("127.0.0.1", 0)
        netem = Netem(listen=("127.0.0.1", 0), upstream=tuple(server_address), up=settings,
                      down=settings, seed=options.seed, record_decisions=True)
        await netem.start()
        try:
            await adapter.connect(*netem.listen_address, timeout=options.connect_timeout)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            errors.append(f"connect failed: {exc!r}")
        else:
            start = loop.time() + 0.05
            # The emulator's times are time.monotonic(); the loop's may be another clock.
            clock_offset = time.monotonic() - loop.time()
            if phases:
                phase_task = asyncio.create_task(run_phases(start))
            for number in range(count):
                delay = start + number * options.interval - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                now = loop.time()
                payload = make_payload(number, now, options.size)
                sent_payloads[number] = payload
                send_times[number] = now
                adapter.send(payload)
                if first_send is None:
                    first_send = now
                last_send = now
            if phase_task is not None:
                # Phases past the last send are not run: the windows cover the send span.
                phase_task.cancel()
                mark("end")
            try:
                await asyncio.wait_for(asyncio.shield(all_done), options.drain)
            except asyncio.TimeoutError:
                errors.append(f"{sum(r is None for r in rtts)} messages not echoed within "
                              f"{options.drain:g} s of the last send")
        # Snapshot before anything is closed: the counters cover exactly the run.
        stats = netem.stats()
        up_decisions = netem.drop_decisions("up")
        down_decisions = netem.drop_decisions("down")
        log = adapter.datagram_log()
        link_delays = {d: netem.delays(d) for d in ("up", "down")}
        episodes = [(a - clock_offset, b - clock_offset) for a, b in netem.episodes("up")]
        if hasattr(adapter, "peer_stats"):
            peer_stats = adapter.peer_stats()
    finally:
        if phase_task is not None:
            phase_task.cancel()
        await adapter.close()
        if netem is not None:
            await netem.stop()
    errors.extend(getattr(adapter, "errors", []))

    summary = summarize(rtts)
    delivered = summary["count"]
    payload_bytes = 2 * options.size * count
    wire = {}
    if stats:
        up, down = stats["up"], stats["down"]
        wire_bytes = up["bytes_in"] + down["bytes_in"]
        datagrams = up["datagrams_in"] + down["datagrams_in"]
        wire = {
            "bytes": wire_bytes,
            "bytes_up": up["bytes_in"],
            "bytes_down": down["bytes_in"],
            "datagrams": datagrams,
            "datagrams_up": up["datagrams_in"],
            "datagrams_down": down["datagrams_in"],
            "dropped_up": up["dropped"],
            "dropped_down": down["dropped"],
            "dropped_queue_up": up["dropped_queue"],
            "dropped_queue_down": down["dropped_queue"],
            "payload_bytes": payload_bytes,
            "ratio": wire_bytes / payload_bytes,
            "bytes_with_ip_udp": wire_bytes + IP_UDP_OVERHEAD * datagrams,
            "ratio_with_ip_udp": (wire_bytes + IP_UDP_OVERHEAD * datagrams) / payload_bytes,
        }
    result.update({
        "delivered": delivered,
        "order_errors": state["order_errors"],
        "corrupt": state["corrupt"],
        "duplicates": state["duplicates"],
        "errors": errors,
        "summary_ms": summary,
        "wire": wire,
        "netem_seed": options.seed,
        "send_span_s": (last_send - first_send) if first_send is not None else None,
        "wall_s": time.monotonic() - started,
        "rtts_ms": [None if r is None else round(r, 3) for r in rtts],
    })
    if peer_stats:
        result["peer_stats"] = peer_stats
    result["send_times"] = [None if t is None else round(t, 6) for t in send_times]
    if marks:
        result["windows"] = [
            {"phase": a[0], "until": b[0], "seconds": b[1] - a[1],
             "datagrams_up": b[2] - a[2], "datagrams_down": b[3] - a[3],
             "peak_per_s": peak_rates([x for x in samples if a[1] <= x[0] <= b[1]])}
            for a, b in zip(marks, marks[1:])]
    if settings.rate > 0:
        result["_delays"] = link_delays     # raw, for pooling over seeds; not written out
        result["delays_ms"] = {
            direction: {"queue": summarize([q * 1000.0 for q, _ in values]),
                        "one_way": summarize([d * 1000.0 for _, d in values])}
            for direction, values in link_delays.items()}
    if episodes and first_send is not None:
        result["episodes"] = [(round(a, 6), round(b, 6)) for a, b in episodes
                              if first_send <= b <= (last_send or b)]
    if log is not None and stats:
        up_fates, up_check = datagram_fates(log.up_sent, up_decisions, log.up_arrived)
        down_fates, down_check = datagram_fates(log.down_sent, down_decisions, log.down_arrived)
        message_times = [t for t in send_times if t is not None]
        limits = redundancy_limit(message_times, up_fates, down_fates)
        limits_ms = [None if v is None else v * 1000.0 for v in limits]
        # A lower bound must hold message by message; a violation means the logs are misjoined.
        below = sum(1 for r, v in zip(rtts, limits_ms)
                    if r is not None and v is not None and r < v - 0.001)
        result["limit"] = {
            "summary_ms": summarize(limits_ms),
            "messages_below_limit": below,
            "rtts_ms": [None if v is None else round(v, 3) for v in limits_ms],
            "log_check": {"up": up_check, "down": down_check},
        }
    return result


async def run_point(protocols: Sequence[str], link: Link, loss: float, options: RunOptions,
                    concurrent: bool) -> list[dict[str, Any]]:
    if concurrent:
        return list(await asyncio.gather(*(run_protocol(p, link, loss, options)
                                           for p in protocols)))
    return [await run_protocol(p, link, loss, options) for p in protocols]


# --------------------------------------------------------------------------------------------
# Targets


def _find(results: Sequence[dict], protocol: str, link: str, loss: float) -> Optional[dict]:
    for r in results:
        if r["protocol"] == protocol and r["link"] == link and r["loss"] == loss:
            return r
    return None


def _p(result: Optional[dict], key: str) -> Optional[float]:
    if result is None:
        return None
    return result["summary_ms"].get(key)


def evaluate_targets(results: Sequence[dict]) -> list[dict[str, Any]]:
    """The issue's targets, each PASS / FAIL / NOT RUN with the figures behind it."""
    targets = []

    def add(name: str, value: Optional[float], bound: Optional[float], detail: str,
            lower_is_better: bool = True) -> None:
        if value is None or bound is None:
            targets.append({"target": name, "status": "NOT RUN", "value": value, "bound": bound,
                            "detail": detail})
            return
        ok = value <= bound if lower_is_better else value >= bound
        targets.append({"target": name, "status": "PASS" if ok else "FAIL", "value": value,
                        "bound": bound, "margin": bound - value, "detail": detail})

    ours = _find(results, "ours-redundant", "high", 10.0)
    enet = _find(results, "enet", "high", 10.0)
    kcp_fast = _find(results, "kcp-fast", "high", 10.0)
    ours_p99 = _p(ours, "p99")
    enet_p99 = _p(enet, "p99")
    kcp_p99 = _p(kcp_fast, "p99")
    add("high 10%: ours redundant p99 <= 1/3 of ENet p99", ours_p99,
        None if enet_p99 is None else enet_p99 / 3,
        f"ours {_ms(ours_p99)}, ENet {_ms(enet_p99)}, ratio {_ratio(ours_p99, enet_p99)}")
    add("high 10%: ours redundant p99 <= 1/2 of KCP fast p99", ours_p99,
        None if kcp_p99 is None else kcp_p99 / 2,
        f"ours {_ms(ours_p99)}, KCP fast {_ms(kcp_p99)}, ratio {_ratio(ours_p99, kcp_p99)}")
    limit_p99 = ours["limit"]["summary_ms"]["p99"] if ours and "limit" in ours else None
    add("high 10%: ours redundant p99 <= 1.25 x redundancy limit p99", ours_p99,
        None if limit_p99 is None else 1.25 * limit_p99,
        f"ours {_ms(ours_p99)}, limit {_ms(limit_p99)}, ratio {_ratio(ours_p99, limit_p99)}")
    ours_bytes = ours["wire"].get("bytes") if ours and ours["wire"] else None
    enet_bytes = enet["wire"].get("bytes") if enet and enet["wire"] else None
    ours_full = ours["wire"].get("bytes_with_ip_udp") if ours and ours["wire"] else None
    enet_full = enet["wire"].get("bytes_with_ip_udp") if enet and enet["wire"] else None
    add("high 10%: ours redundant wire bytes <= 2 x ENet wire bytes", ours_bytes,
        None if enet_bytes is None else 2 * enet_bytes,
        f"UDP payload: ours {ours_bytes} B, ENet {enet_bytes} B, ratio "
        f"{_ratio(ours_bytes, enet_bytes)} (with 28 B IPv4+UDP headers per datagram: ratio "
        f"{_ratio(ours_full, enet_full)})")
    for link in LINKS:
        enet0 = _find(results, "enet", link, 0.0)
        for protocol in ("ours-redundant", "ours-reliable"):
            ours0 = _find(results, protocol, link, 0.0)
            if ours0 is None and enet0 is None:
                continue
            mean, enet_mean = _p(ours0, "mean"), _p(enet0, "mean")
            difference = None if mean is None or enet_mean is None else mean - enet_mean
            add(f"{link} 0%: {adapters.LABELS[protocol]} mean <= ENet mean + 2 ms", mean,
                None if enet_mean is None else enet_mean + 2.0,
                f"ours {_ms(mean)}, ENet {_ms(enet_mean)}, difference "
                f"{'n/a' if difference is None else f'{difference:+.2f} ms'}")
    return targets


def _ms(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "n/a" if a is None or not b else f"{a / b:.3f}"


# --------------------------------------------------------------------------------------------
# Reporting


def machine_info(loop_name: str) -> dict[str, Any]:
    cpu = cpu_model()
    usable = usable_cores()
    versions = {}
    from importlib.metadata import PackageNotFoundError, version
    for package in ("relay", "pyenet", "kcp", "matplotlib", "uvloop"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "platform": platform.platform(), "event_loop": loop_name, "versions": versions,
            "loadavg": load}


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown_report(meta: dict, results: Sequence[dict], targets: Sequence[dict],
                    checks: Sequence[dict]) -> str:
    lines = []
    m = meta["machine"]
    lines.append("## Latency under loss: results")
    lines.append("")
    lines.append(f"- command: `{meta['command']}`")
    lines.append(f"- machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
                 f"{m['python']}, {m['platform']}, event loop {m['event_loop']}")
    lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    lines.append(f"- {meta['count']} messages of {meta['size']} bytes every "
                 f"{meta['interval_ms']:g} ms per run; emulator seed {meta['seed']}; "
                 f"protocols {'concurrently' if meta['concurrent'] else 'one at a time'} at "
                 f"each point; wall time {meta['wall_s']:.0f} s, CPU "
                 f"{meta['cpu_s']:.0f} s ({100 * meta['cpu_s'] / meta['wall_s']:.0f} % of one core)")
    lines.append("- round trips in ms; wire = UDP payload bytes both directions as counted by "
                 "the emulator (handshake included), / payload = wire / (2 x count x size)")
    lines.append("")
    links = [name for name in LINKS if any(r["link"] == name for r in results)]
    protocols = [p for p in adapters.PROTOCOLS if any(r["protocol"] == p for r in results)]
    losses = sorted({r["loss"] for r in results})
    for link in links:
        lines.append(f"### {link} link ({LINKS[link].description})")
        lines.append("")
        lines.append("| loss % | protocol | delivered | mean | p50 | p95 | p99 | max | "
                     "wire KiB | / payload | limit p99 |")
        lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for loss in losses:
            for protocol in protocols:
                r = _find(results, protocol, link, loss)
                if r is None:
                    continue
                s = r["summary_ms"]
                w = r["wire"]
                limit = r.get("limit", {}).get("summary_ms", {}).get("p99")
                lines.append(
                    f"| {loss:g} | {r['label']} | {r['delivered']}/{r['count']} | "
                    f"{_fmt(s['mean'])} | {_fmt(s['p50'])} | {_fmt(s['p95'])} | "
                    f"{_fmt(s['p99'])} | {_fmt(s['max'])} | "
                    f"{_fmt(w.get('bytes', 0) / 1024 if w else None)} | "
                    f"{_fmt(w.get('ratio') if w else None, 2)} | {_fmt(limit)} |")
        lines.append("")
    if "high" in links:
        lines.append("### Headline: high link, p99 round trip (ms) and wire / payload")
        lines.append("")
        lines.append("| loss % | " + " | ".join(adapters.LABELS[p] for p in protocols)
                     + " | redundancy limit p99 |")
        lines.append("|---:|" + "---:|" * (len(protocols) + 1))
        for loss in losses:
            cells = []
            for protocol in protocols:
                r = _find(results, protocol, "high", loss)
                if r is None:
                    cells.append("—")
                    continue
                ratio = r["wire"].get("ratio") if r["wire"] else None
                cells.append(f"{_fmt(r['summary_ms']['p99'])} ({_fmt(ratio, 2)}x)")
            ours = _find(results, "ours-redundant", "high", loss)
            limit = ours.get("limit", {}).get("summary_ms", {}).get("p99") if ours else None
            lines.append(f"| {loss:g} | " + " | ".join(cells) + f" | {_fmt(limit)} |")
        lines.append("")
    lines.append("### Targets")
    lines.append("")
    lines.append("| target | result | figures |")
    lines.append("|---|---|---|")
    for t in targets:
        lines.append(f"| {t['target']} | **{t['status']}** | {t['detail']} |")
    lines.append("")
    for check in checks:
        lines.append(f"### Concurrent vs sequential ({check['link']} link, "
                     f"{check['loss']:g} % loss)")
        lines.append("")
        lines.append("| protocol | mean conc. | mean seq. | p50 conc. | p50 seq. | p99 conc. | "
                     "p99 seq. |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for row in check["rows"]:
            lines.append(f"| {row['label']} | {_fmt(row['concurrent']['mean'])} | "
                         f"{_fmt(row['sequential']['mean'])} | {_fmt(row['concurrent']['p50'])}"
                         f" | {_fmt(row['sequential']['p50'])} | {_fmt(row['concurrent']['p99'])}"
                         f" | {_fmt(row['sequential']['p99'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _pyplot():
    """(matplotlib, pyplot, ticker) on the file-only Agg backend; ImportError without it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    return matplotlib, plt, ticker


def _log_ticks(axis, ticker) -> None:
    """Plain-number ticks at 1, 2 and 5 per decade on a log axis, no minor labels."""
    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def write_plots(out: Path, results: Sequence[dict]) -> list[str]:
    """PNG plots if matplotlib is installed; returns the files written (or a note why not)."""
    try:
        matplotlib, plt, ticker = _pyplot()
    except ImportError as exc:
        return [f"(no plots: matplotlib not importable: {exc})"]
    written = []
    links = [name for name in LINKS if any(r["link"] == name for r in results)]
    protocols = [p for p in adapters.PROTOCOLS if any(r["protocol"] == p for r in results)]
    styles = {"ours-redundant": ("tab:green", "o"), "ours-reliable": ("tab:olive", "s"),
              "enet": ("tab:red", "^"), "kcp-fast": ("tab:blue", "D"),
              "kcp-normal": ("tab:purple", "v")}

    def by_loss(protocol: str, link: str, getter):
        rows = sorted((r for r in results if r["protocol"] == protocol and r["link"] == link),
                      key=lambda r: r["loss"])
        return [r["loss"] for r in rows], [getter(r) for r in rows]

    for kind, ylabel, getter, filename in (
            ("p99", "p99 round trip (ms)", lambda r: r["summary_ms"]["p99"],
             "loss_latency_p99.png"),
            ("wire", "wire bytes / payload bytes",
             lambda r: r["wire"].get("ratio") if r["wire"] else None,
             "loss_latency_wire.png")):
        fig, axes = plt.subplots(1, len(links), figsize=(6.5 * len(links), 4.5), squeeze=False)
        for ax, link in zip(axes[0], links):
            for protocol in protocols:
                xs, ys = by_loss(protocol, link, getter)
                color, marker = styles[protocol]
                ax.plot(xs, [math.nan if y is None else y for y in ys], marker=marker,
                        color=color, label=adapters.LABELS[protocol])
            if kind == "p99":
                xs, ys = by_loss("ours-redundant", link,
                                 lambda r: r.get("limit", {}).get("summary_ms", {}).get("p99"))
                if any(y is not None for y in ys):
                    ax.plot(xs, [math.nan if y is None else y for y in ys], linestyle="--",
                            color="black", label="redundancy limit")
                ax.set_yscale("log")
                _log_ticks(ax.yaxis, ticker)
            ax.set_title(f"{link} link: {LINKS[link].description}", fontsize=9)
            ax.set_xlabel("loss per direction (%)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / filename, dpi=110)
        plt.close(fig)
        written.append(filename)

    # Per-message trace at the loss closest to 5 %, every protocol, one row per protocol.
    losses = sorted({r["loss"] for r in results})
    trace_loss = min(losses, key=lambda v: abs(v - TRACE_LOSS))
    fig, axes = plt.subplots(len(protocols), len(links),
                             figsize=(7.5 * len(links), 1.9 * len(protocols) + 0.6),
                             squeeze=False, sharex=True, sharey=True)
    for column, link in enumerate(links):
        for row, protocol in enumerate(protocols):
            ax = axes[row][column]
            r = _find(results, protocol, link, trace_loss)
            if r is None:
                continue
            values = r["rtts_ms"]
            xs = range(len(values))
            color, _ = styles[protocol]
            ax.plot(xs, [math.nan if v is None else v for v in values], linewidth=0.7,
                    color=color)
            if protocol == "ours-redundant" and "limit" in r:
                ax.plot(xs, [math.nan if v is None else v for v in r["limit"]["rtts_ms"]],
                        linewidth=0.5, color="black", alpha=0.5, label="limit")
                ax.legend(fontsize=7, loc="upper right")
            s = r["summary_ms"]
            ax.set_title(f"{link}, {trace_loss:g} %: {r['label']}  (mean {_fmt(s['mean'])}, "
                         f"p99 {_fmt(s['p99'])}, max {_fmt(s['max'])} ms)", fontsize=8)
            ax.set_ylabel("RTT ms", fontsize=8)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.grid(True, which="both", alpha=0.3)
        axes[-1][column].set_xlabel("message number")
    fig.tight_layout()
    fig.savefig(out / "loss_latency_trace.png", dpi=110)
    plt.close(fig)
    written.append("loss_latency_trace.png")
    return written


SCENARIO_STYLES = {"ours-redundant": ("tab:green", "-"), "ours-reliable": ("tab:olive", "-."),
                   "enet": ("tab:red", ":"), "kcp-fast": ("tab:blue", "--"),
                   "kcp-normal": ("tab:purple", ":")}


def write_scenario_plots(out: Path, results: Sequence[dict]) -> list[str]:
    """The scenarios' figures as SVG (matplotlib): a latency CDF per scenario, every protocol
    and ours' loss-trace limit (``loss_scenarios_cdf.svg``), and bytes on the wire per payload
    byte per scenario and protocol (``loss_scenarios_wire.svg``). Returns the files written (or
    a note why not)."""
    try:
        matplotlib, plt, ticker = _pyplot()
    except ImportError as exc:
        return [f"(no plots: matplotlib not importable: {exc})"]
    matplotlib.rcParams["svg.hashsalt"] = "loss_latency"      # the same file for the same data
    matplotlib.rcParams["svg.fonttype"] = "none"              # text as text: a smaller file
    written = []
    columns = 3
    rows = (len(results) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, result in zip(axes.flat, results):
        curves = []
        for protocol, pooled in result["pooled"].items():
            values = sorted(v for r in result["runs"] if r["protocol"] == protocol
                            and r["variant"] == "scenario" for v in r["rtts_ms"] if v is not None)
            curves.append((pooled["label"], values, *SCENARIO_STYLES.get(protocol, ("gray", "-"))))
        limits = sorted(v for r in result["runs"] if r["protocol"] == "ours-redundant"
                        and r["variant"] == "scenario" and "limit" in r
                        for v in r["limit"]["rtts_ms"] if v is not None)
        if limits:
            curves.append(("loss-trace limit", limits, "black", (0, (2, 2))))
        for label, values, color, style in curves:
            if not values:
                continue
            # The top 10 % is what the axes show; a few hundred points of it draw the curve.
            n = len(values)
            first = max(0, int(0.9 * n) - 1)
            ranks = list(range(first, n, max(1, (n - first) // 400))) + [n - 1]
            ax.plot([values[k] for k in ranks], [(k + 1) / n for k in ranks], color=color,
                    linestyle=style, linewidth=1.3, label=label)
        ax.set_xscale("log")
        _log_ticks(ax.xaxis, ticker)
        ax.set_ylim(0.9, 1.0005)
        ax.axhline(0.99, color="gray", linewidth=0.6, alpha=0.6)
        ax.set_title(result["scenario"], fontsize=10)
        ax.set_xlabel("round trip (ms, log)", fontsize=8)
        ax.set_ylabel("share of messages (top 10 %)", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Loss scenarios: round-trip CDF, pooled over seeds (line at p99)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "loss_scenarios_cdf.svg", metadata={"Date": None})
    plt.close(fig)
    written.append("loss_scenarios_cdf.svg")

    protocols = list(dict.fromkeys(p for result in results for p in result["pooled"]))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / max(1, len(protocols))
    for k, protocol in enumerate(protocols):
        xs, ys = [], []
        for i, result in enumerate(results):
            pooled = result["pooled"].get(protocol)
            if pooled and pooled.get("wire_ratio") is not None:
                xs.append(i + (k - (len(protocols) - 1) / 2) * width)
                ys.append(pooled["wire_ratio"])
        color = SCENARIO_STYLES.get(protocol, ("gray", "-"))[0]
        ax.bar(xs, ys, width=width, color=color, label=adapters.LABELS.get(protocol, protocol))
    ax.set_xticks(range(len(results)), [r["scenario"] for r in results])
    ax.set_ylabel("UDP bytes both ways / payload bytes")
    ax.set_title("Bytes on the wire per payload byte, per scenario and protocol", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss_scenarios_wire.svg", metadata={"Date": None})
    plt.close(fig)
    written.append("loss_scenarios_wire.svg")
    return written


def concurrency_comparison(concurrent: Sequence[dict], sequential: Sequence[dict],
                           rerun: str) -> dict:
    """Mean, p50 and p99 of one point run both ways; ``rerun`` names the extra run
    ("sequential" or "concurrent"), whose full results are kept under ``rerun_results``."""
    rows = []
    for c in concurrent:
        s = next(r for r in sequential if r["protocol"] == c["protocol"])
        rows.append({"protocol": c["protocol"], "label": c["label"],
                     "concurrent": {k: c["summary_ms"][k] for k in ("mean", "p50", "p99")},
                     "sequential": {k: s["summary_ms"][k] for k in ("mean", "p50", "p99")}})
    return {"link": concurrent[0]["link"], "loss": concurrent[0]["loss"], "rows": rows,
            "rerun": rerun,
            "rerun_results": list(sequential if rerun == "sequential" else concurrent)}


def print_point(results: Sequence[dict]) -> None:
    for r in results:
        s = r["summary_ms"]
        w = r["wire"]
        limit = r.get("limit", {}).get("summary_ms", {}).get("p99")
        extra = f"  limit p99 {_fmt(limit)}" if limit is not None else ""
        problems = ""
        if r["errors"] or r["order_errors"] or r["corrupt"] or r["duplicates"]:
            problems = f"  PROBLEM: {r['errors']} order={r['order_errors']} " \
                       f"corrupt={r['corrupt']} dup={r['duplicates']}"
        where = f"{r['scenario']:>9}" if "scenario" in r else f"{r['link']:>4} {r['loss']:>4g}%"
        print(f"  {where} {r['label']:<24} "
              f"{r['delivered']:>4}/{r['count']:<4} mean {_fmt(s['mean']):>6} "
              f"p50 {_fmt(s['p50']):>6} p95 {_fmt(s['p95']):>6} p99 {_fmt(s['p99']):>7} "
              f"max {_fmt(s['max']):>7}  wire x{_fmt(w.get('ratio') if w else None, 2)}"
              f"{extra}{problems}", flush=True)


# --------------------------------------------------------------------------------------------
# Scenarios (issue #23): named links, every protocol side by side, pooled over seeds

SCENARIO_LOSS = 10.0
SCENARIO_PROTOCOLS = ("ours-redundant", "ours-reliable", "enet", "kcp-fast")
"""KCP normal is left out by default: on the long path its tail outlasts any sensible drain
(seconds per message), and it is never the comparison a target uses; --protocol adds it."""
BURST_MEAN_DATAGRAMS = 3.0
QUICK_COUNT = 100
QUICK_DRAIN = 10.0
CONGESTED_QUEUE_BOUND_MS = 50.0
"""The congested scenario's "queueing delay bounded" target: ours' p99 time in the bottleneck
(queue + serialisation), below which the queue is not standing: under two message intervals."""


def burst_settings(loss_pct: float, mean_burst: float, **link: Any) -> LinkSettings:
    """Gilbert-Elliott bursts that lose every datagram of the bad state, with mean length
    ``mean_burst`` datagrams and long-run loss ``loss_pct``: a stay in the bad state lasts
    1 / burst_exit datagrams on average, and the bad state's share of datagrams is
    enter / (enter + exit), so burst_exit = 1 / mean_burst and
    burst_enter = burst_exit * p / (1 - p) with p = loss_pct / 100."""
    p = loss_pct / 100.0
    if not 0.0 < p < 1.0 or mean_burst < 1.0:
        raise ValueError(f"loss {loss_pct!r} % must be in (0, 100), mean burst {mean_burst!r} >= 1")
    burst_exit = 1.0 / mean_burst
    return LinkSettings(burst_enter=burst_exit * p / (1.0 - p), burst_exit=burst_exit,
                        burst_loss=1.0, **link)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    settings: LinkSettings
    """Both directions, from the start of the run."""
    seeds: int
    """Default number of emulator seeds pooled (--seeds overrides)."""
    size: int = DEFAULT_SIZE
    phases: tuple[tuple[float, str, Optional[LinkSettings]], ...] = ()
    """(fraction of the send span, window name, new settings for both directions or None)."""
    baseline: bool = False
    """Also run every seed with the phases' windows but without their setting changes."""
    quick_count: int = QUICK_COUNT


_HIGH = {"delay": 10.0, "jitter": 20.0}   # the "10-30 ms one way" link: 10 + U(0, 20) ms
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("uniform", "10 + U(0, 20) ms one way, 10 % independent loss each way",
             LinkSettings(loss=SCENARIO_LOSS, **_HIGH), seeds=2),
    Scenario("bursts", "10 + U(0, 20) ms one way, Gilbert-Elliott bursts per datagram: mean burst 3 "
             "datagrams, 10 % average loss each way (burst_exit 1/3, burst_enter 1/27)",
             burst_settings(SCENARIO_LOSS, BURST_MEAN_DATAGRAMS, **_HIGH), seeds=8),
    Scenario("episodes", "10 + U(0, 20) ms one way, loss episodes: down (every datagram lost, both "
             "directions together) for exponential periods of mean 100 ms, 10 % of the time",
             LinkSettings(episode_ms=100.0, episode_share=SCENARIO_LOSS, **_HIGH), seeds=8),
    Scenario("long_path", "160 + U(0, 20) ms one way (170 +- 10), 10 % independent loss each way, "
             "300-byte messages", LinkSettings(loss=SCENARIO_LOSS, delay=160.0, jitter=20.0),
             seeds=2, size=300),
    Scenario("rtt_jump", "20 ms one way, no loss; 200 ms one way during the middle third of the "
             "run (round trip 40 -> 400 -> 40 ms); a baseline run without the jump",
             LinkSettings(delay=20.0), seeds=1,
             phases=((0.0, "before", None), (1 / 3, "during", LinkSettings(delay=200.0)),
                     (2 / 3, "after", LinkSettings(delay=20.0))),
             baseline=True, quick_count=150),
    Scenario("congested", "10 + U(0, 20) ms one way, 5 % independent loss, and a 64 kbit/s bottleneck "
             "each way (IP/UDP headers counted) with a 10-datagram drop-tail queue",
             LinkSettings(loss=5.0, rate=64.0, queue_limit=10, **_HIGH), seeds=2),
)}


def simulate_ideal(settings: LinkSettings, count: int, seed: int,
                   interval: float = DEFAULT_INTERVAL_MS / 1000.0) -> list[Optional[float]]:
    """The issue's ideal protocol on the link model alone, in simulated time: the client sends
    one datagram per message, the server answers every datagram the moment it arrives, every
    datagram carries everything not yet delivered. Returns each message's round trip in ms
    (``redundancy_limit`` over the simulated trace). No sockets: thousands of seeds in seconds,
    to check the limit of real runs and how many messages a stable p99 needs."""
    from relay_core.simlink import LossyLink

    def trace(link: LossyLink, times: Sequence[float]) -> list[Datagram]:
        for k, t in enumerate(times):
            link.send(k.to_bytes(4, "big"), t)
        link.discard_in_flight()
        # The model records a delay for each survivor, in offer order.
        delays = iter(link.counters.delays)
        return [Datagram(t, True, None) if dropped else Datagram(t, False, t + next(delays)[1])
                for t, dropped in zip(times, link.counters.drop_decisions)]

    up = LossyLink(settings.profile(), f"ideal/{seed}/up", episode_seed=f"ideal/{seed}/ep")
    down = LossyLink(settings.profile(), f"ideal/{seed}/down", episode_seed=f"ideal/{seed}/ep")
    up.episodes.origin = down.episodes.origin = 0.0
    times = [k * interval for k in range(count)]
    up_fates = trace(up, times)
    answers = sorted(d.arrived for d in up_fates if d.arrived is not None)
    down_fates = trace(down, answers)
    return [None if v is None else v * 1000.0
            for v in redundancy_limit(times, up_fates, down_fates)]


def ideal_stability(seeds: int = 60, count: int = DEFAULT_COUNT,
                    groups: Sequence[int] = (1, 2, 8)) -> list[str]:
    """How much the ideal protocol's p99 moves between seeds, per scenario with loss: the spread
    of the p99 of one run and of pools of ``groups`` runs (disjoint seed groups), and the p99
    over all ``seeds`` runs. What the scenarios' default --seeds were chosen from."""
    lines = [f"ideal protocol, {seeds} seeds x {count} messages, p99 ms: min-max (sd) over "
             "disjoint groups of pooled runs"]
    for scenario in SCENARIOS.values():
        if scenario.phases or scenario.settings.rate:
            continue
        runs = [[v for v in simulate_ideal(scenario.settings, count, seed) if v is not None]
                for seed in range(seeds)]
        cells = []
        for group in groups:
            p99s = [percentile([v for r in runs[i:i + group] for v in r], 99)
                    for i in range(0, seeds - group + 1, group)]
            mean = sum(p99s) / len(p99s)
            sd = math.sqrt(sum((v - mean) ** 2 for v in p99s) / len(p99s))
            cells.append(f"x{group}: {min(p99s):.0f}-{max(p99s):.0f} ({sd:.0f})")
        overall = percentile([v for r in runs for v in r], 99)
        lines.append(f"  {scenario.name:<10} " + ", ".join(cells) + f"; all: {overall:.0f}")
    return lines


def episode_recoveries(episodes: Sequence[Sequence[float]], send_times: Sequence[Optional[float]],
                       rtts_ms: Sequence[Optional[float]]) -> list[float]:
    """Per loss episode (start, end), in ms: the time from its end until every message sent
    before the end and not yet delivered at the end has been delivered. Episodes that held
    nothing back are left out (none while messages are sent every 30 ms and episodes last
    longer)."""
    deliveries = [(t, t + r / 1000.0) for t, r in zip(send_times, rtts_ms)
                  if t is not None and r is not None]
    out = []
    for _, end in episodes:
        held = [d for t, d in deliveries if t < end < d]
        if held:
            out.append((max(held) - end) * 1000.0)
    return out


def pool(results: Sequence[dict]) -> dict[str, Any]:
    """One protocol's runs of a scenario over its seeds: every figure over all messages."""
    rtts = [v for r in results for v in r["rtts_ms"]]
    wire = sum(r["wire"].get("bytes", 0) for r in results if r["wire"])
    payload = sum(r["wire"].get("payload_bytes", 0) for r in results if r["wire"])
    out: dict[str, Any] = {
        "protocol": results[0]["protocol"], "label": results[0]["label"],
        "runs": len(results), "count": sum(r["count"] for r in results),
        "delivered": sum(r["delivered"] for r in results),
        "summary_ms": summarize(rtts),
        "seed_p99_ms": [r["summary_ms"]["p99"] for r in results],
        "wire_bytes": wire, "wire_ratio": wire / payload if payload else None,
    }
    limited = [r for r in results if "limit" in r]
    if limited:
        out["limit"] = {
            "summary_ms": summarize([v for r in limited for v in r["limit"]["rtts_ms"]]),
            "seed_p99_ms": [r["limit"]["summary_ms"]["p99"] for r in limited],
            "messages_below_limit": sum(r["limit"]["messages_below_limit"] for r in limited)}
    if any("episodes" in r for r in results):
        recoveries = [v for r in results for v in episode_recoveries(
            r.get("episodes", ()), r["send_times"], r["rtts_ms"])]
        out["episode_recovery_ms"] = summarize(recoveries)
        if limited:
            out["limit"]["episode_recovery_ms"] = summarize([v for r in limited for v in (
                episode_recoveries(r.get("episodes", ()), r["send_times"],
                                   r["limit"]["rtts_ms"]))])
    if any("_delays" in r for r in results):
        out["delays_ms"] = {}
        for direction in ("up", "down"):
            values = [v for r in results for v in r.get("_delays", {}).get(direction, ())]
            out["delays_ms"][direction] = {
                "queue": summarize([q * 1000.0 for q, _ in values]),
                "one_way": summarize([d * 1000.0 for _, d in values])}
        values = [q * 1000.0 for r in results for d in r.get("_delays", {}).values()
                  for q, _ in d]
        out["delays_ms"]["queue_both"] = summarize(values)
    return out


def window_rates(results: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Datagrams per second sent by the client (up) and the server (down) per window, summed
    over the runs given; plus the datagram counts."""
    totals: dict[str, dict[str, float]] = {}
    for r in results:
        for w in r.get("windows", ()):
            t = totals.setdefault(w["phase"], {"seconds": 0.0, "datagrams_up": 0,
                                               "datagrams_down": 0, "client_peak_per_s": None,
                                               "server_peak_per_s": None})
            for side in ("client", "server"):
                peak = w.get("peak_per_s", {}).get(side)
                if peak is not None:
                    t[f"{side}_peak_per_s"] = max(peak, t[f"{side}_peak_per_s"] or 0.0)
            t["seconds"] += w["seconds"]
            t["datagrams_up"] += w["datagrams_up"]
            t["datagrams_down"] += w["datagrams_down"]
    for t in totals.values():
        t["client_per_s"] = t["datagrams_up"] / t["seconds"] if t["seconds"] else math.nan
        t["server_per_s"] = t["datagrams_down"] / t["seconds"] if t["seconds"] else math.nan
    return totals


def jump_figures(jump: Sequence[dict], baseline: Sequence[dict]) -> dict[str, Any]:
    """rtt_jump: the rates per window of the jump runs and the baseline, and the datagrams the
    jump added during its window (both directions, and the server's alone)."""
    with_jump, without = window_rates(jump), window_rates(baseline)
    out: dict[str, Any] = {"jump": with_jump, "baseline": without}
    during, base = with_jump.get("during"), without.get("during")
    if during and base:
        base_total = base["datagrams_up"] + base["datagrams_down"]
        extra = during["datagrams_up"] + during["datagrams_down"] - base_total
        out["extra_datagrams"] = extra
        out["extra_share"] = extra / base_total if base_total else None
        out["extra_server_datagrams"] = during["datagrams_down"] - base["datagrams_down"]
    return out


def scenario_targets(name: str, pooled: dict[str, dict], jump: Optional[dict[str, dict]] = None,
                     baseline: Optional[dict[str, dict]] = None) -> list[dict[str, Any]]:
    """Issue #23's targets for a scenario, applied to ours redundant: informational."""
    targets: list[dict[str, Any]] = []
    ours, kcp, enet = (pooled.get(p) for p in ("ours-redundant", "kcp-fast", "enet"))

    def add(text: str, value: Optional[float], reference: Optional[float], bound: float,
            what: str) -> None:
        if value is None or not reference:
            targets.append({"target": f"{name}: {text} <= {bound:g}", "status": "NOT RUN",
                            "ratio": None, "detail": what})
            return
        ratio = value / reference
        targets.append({"target": f"{name}: {text} <= {bound:g}",
                        "status": "PASS" if ratio <= bound else "FAIL", "ratio": ratio,
                        "detail": f"{what}: {value:.1f} / {reference:.1f} = {ratio:.2f}"})

    def p99(entry: Optional[dict]) -> Optional[float]:
        return None if entry is None else entry["summary_ms"]["p99"]

    limit = ours.get("limit", {}).get("summary_ms", {}).get("p99") if ours else None
    if name == "uniform":
        add("ours p99 / KCP fast p99", p99(ours), p99(kcp), 0.5, "p99 ms")
    if name in ("uniform", "episodes", "long_path"):
        add("ours p99 / limit p99", p99(ours), limit, 1.25, "p99 ms")
    if name == "bursts":
        add("ours pooled p99 / KCP fast pooled p99", p99(ours), p99(kcp), 0.6, "p99 ms")
    if name == "episodes":
        mine = ours.get("episode_recovery_ms", {}).get("mean") if ours else None
        theirs = kcp.get("episode_recovery_ms", {}).get("mean") if kcp else None
        add("ours / KCP fast mean time from an episode's end to delivering what it held",
            mine, theirs, 0.5, "ms")
    if name == "rtt_jump" and jump is not None:
        figures = jump.get("ours-redundant", {})
        share = figures.get("extra_share")
        targets.append({
            "target": f"{name}: extra datagrams during the jump / baseline's <= 0.05",
            "status": "NOT RUN" if share is None else ("PASS" if share <= 0.05 else "FAIL"),
            "ratio": share,
            "detail": "n/a" if share is None else
            f"{figures['extra_datagrams']:+d} datagrams ({share:+.1%}), the server's "
            f"{figures['extra_server_datagrams']:+d}"})
        if baseline:
            mean = baseline.get("ours-redundant", {}).get("summary_ms", {}).get("mean")
            enet_mean = baseline.get("enet", {}).get("summary_ms", {}).get("mean")
            ok = None if mean is None or enet_mean is None else mean <= enet_mean + 2.0
            targets.append({
                "target": f"{name}: baseline (0 % loss) ours mean <= ENet mean + 2 ms",
                "status": "NOT RUN" if ok is None else ("PASS" if ok else "FAIL"),
                "ratio": None, "detail": f"{_ms(mean)} vs {_ms(enet_mean)}"})
    if name == "congested":
        queue = ours.get("delays_ms", {}).get("queue_both", {}).get("p99") if ours else None
        add(f"ours p99 queueing delay / {CONGESTED_QUEUE_BOUND_MS:g} ms", queue,
            CONGESTED_QUEUE_BOUND_MS, 1.0, "ms")
        add("ours p99 / KCP fast p99", p99(ours), p99(kcp), 1.0, "p99 ms")
    wire = ours.get("wire_bytes") if ours else None
    enet_wire = enet.get("wire_bytes") if enet else None
    add("ours wire bytes / ENet wire bytes", wire, enet_wire, 2.0, "bytes")
    return targets


async def run_scenario(scenario: Scenario, protocols: Sequence[str], options: RunOptions,
                       seeds: Sequence[int]) -> dict[str, Any]:
    """Every protocol side by side (concurrently, each with its own emulator) for each seed;
    the baseline variant, if any, after the seed's scenario run."""
    span = (options.count - 1) * options.interval
    phases = [Phase(at * span, label, setting, setting) for at, label, setting in scenario.phases]
    marks_only = [Phase(p.at, p.name) for p in phases]
    runs: list[dict] = []
    for index, seed in enumerate(seeds):
        seeded = dataclasses.replace(options, seed=seed)
        variants = [("scenario", phases)] + ([("baseline", marks_only)] if scenario.baseline
                                             else [])
        for variant, these in variants:
            settings = scenario.settings
            label = "" if variant == "scenario" else f" {variant}"
            print(f"  [{scenario.name} seed {seed} ({index + 1}/{len(seeds)}){label}]",
                  flush=True)
            point = await asyncio.gather(*(run_protocol(p, LINKS["high"], settings.loss, seeded,
                                                        settings, these) for p in protocols))
            for r in point:
                r.update(scenario=scenario.name, variant=variant, link=scenario.name)
            print_point(point)
            runs.extend(point)
    out: dict[str, Any] = {"scenario": scenario.name, "description": scenario.description,
                           "settings": dataclasses.asdict(scenario.settings),
                           "size": options.size, "count": options.count, "seeds": list(seeds),
                           "runs": runs}
    by_variant: dict[str, dict[str, dict]] = {}
    for variant in ("scenario", "baseline"):
        for protocol in protocols:
            mine = [r for r in runs if r["variant"] == variant and r["protocol"] == protocol]
            if mine:
                by_variant.setdefault(variant, {})[protocol] = pool(mine)
    out["pooled"] = by_variant.get("scenario", {})
    jump = None
    if scenario.baseline:
        out["baseline_pooled"] = by_variant.get("baseline", {})
        jump = {p: jump_figures([r for r in runs if r["protocol"] == p
                                 and r["variant"] == "scenario"],
                                [r for r in runs if r["protocol"] == p
                                 and r["variant"] == "baseline"]) for p in protocols}
        out["rates"] = jump
    out["targets"] = scenario_targets(scenario.name, out["pooled"], jump,
                                      out.get("baseline_pooled"))
    for r in runs:
        r.pop("_delays", None)
    return out


def scenario_lines(result: dict[str, Any]) -> list[str]:
    """The scenario's figures as markdown (also printed)."""
    lines = [f"### {result['scenario']}: {result['description']}", ""]
    lines.append(f"{result['count']} messages of {result['size']} B every 30 ms per run, seeds "
                 f"{', '.join(map(str, result['seeds']))} pooled; round trips in ms; wire = UDP "
                 "payload bytes both directions / payload bytes")
    lines.append("")
    lines.append("| protocol | delivered | mean | p50 | p95 | p99 | max | p99 per seed | wire |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---|---:|")

    def row(label: str, delivered: str, s: dict, seeds: Sequence[Optional[float]],
            wire: Optional[float]) -> str:
        spread = ", ".join(_fmt(v, 0) for v in seeds)
        return (f"| {label} | {delivered} | {_fmt(s['mean'])} | {_fmt(s['p50'])} | "
                f"{_fmt(s['p95'])} | {_fmt(s['p99'])} | {_fmt(s['max'])} | {spread} | "
                f"{_fmt(wire, 2)} |")

    for p in result["pooled"].values():
        lines.append(row(p["label"], f"{p['delivered']}/{p['count']}", p["summary_ms"],
                         p["seed_p99_ms"], p["wire_ratio"]))
    ours = result["pooled"].get("ours-redundant")
    if ours and "limit" in ours:
        lim = ours["limit"]
        lines.append(row("loss-trace limit", "—", lim["summary_ms"], lim["seed_p99_ms"], None))
    lines.append("")
    if any("episode_recovery_ms" in p for p in result["pooled"].values()):
        lines.append("Time from an episode's end until everything it held back was delivered:")
        lines.append("")
        lines.append("| protocol | episodes | mean | p50 | p99 | max |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        entries = [(p["label"], p["episode_recovery_ms"]) for p in result["pooled"].values()
                   if "episode_recovery_ms" in p]
        if ours and "episode_recovery_ms" in ours.get("limit", {}):
            entries.append(("loss-trace limit", ours["limit"]["episode_recovery_ms"]))
        for label, e in entries:
            lines.append(f"| {label} | {e['count']} | {_fmt(e['mean'])} | {_fmt(e['p50'])} | "
                         f"{_fmt(e['p99'])} | {_fmt(e['max'])} |")
        lines.append("")
    if any("delays_ms" in p for p in result["pooled"].values()):
        lines.append("Time in the bottleneck (queue + serialisation) and one-way delay as the "
                     "emulator applied them, ms:")
        lines.append("")
        lines.append("| protocol | queue up p50 / p99 | queue down p50 / p99 | one way up p50 / "
                     "p99 | one way down p50 / p99 | queue drops up / down |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for protocol, p in result["pooled"].items():
            d = p.get("delays_ms")
            if not d:
                continue
            drops = [sum(r["wire"].get(f"dropped_{x}", 0) for r in result["runs"]
                         if r["protocol"] == protocol and r["variant"] == "scenario")
                     for x in ("queue_up", "queue_down")]
            cells = [f"{_fmt(d[x][k]['p50'])} / {_fmt(d[x][k]['p99'])}"
                     for k in ("queue", "one_way") for x in ("up", "down")]
            lines.append(f"| {p['label']} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} "
                         f"| {drops[0]} / {drops[1]} |")
        lines.append("")
    if "rates" in result:
        lines.append("Datagrams per second sent by the client / the server, per window "
                     "(jump run; baseline run without the jump), and what the jump added "
                     "during its window:")
        lines.append("")
        lines.append("| protocol | before | during | after | baseline during | extra during "
                     "the jump | server's peak 1 s rate: before / during / after (baseline "
                     "during) |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for protocol, figures in result["rates"].items():
            def rate(w: Optional[dict]) -> str:
                return "—" if not w else f"{w['client_per_s']:.1f} / {w['server_per_s']:.1f}"
            j, b = figures["jump"], figures["baseline"]
            share = figures.get("extra_share")
            extra = "—" if share is None else \
                f"{figures['extra_datagrams']:+d} ({share:+.1%}; server {figures['extra_server_datagrams']:+d})"
            def peak(w: Optional[dict]) -> str:
                return _fmt(w.get("server_peak_per_s") if w else None, 0)
            peaks = " / ".join(peak(j.get(k)) for k in ("before", "during", "after"))
            lines.append(f"| {adapters.LABELS[protocol]} | {rate(j.get('before'))} | "
                         f"{rate(j.get('during'))} | {rate(j.get('after'))} | "
                         f"{rate(b.get('during'))} | {extra} | {peaks} "
                         f"({peak(b.get('during'))}) |")
        lines.append("")
    lines.append("Targets (issue #23, for ours redundant; informational):")
    lines.append("")
    for t in result["targets"]:
        lines.append(f"- **{t['status']}** {t['target']}: {t['detail']}")
    lines.append("")
    return lines


async def _main_scenarios(args: argparse.Namespace, protocols: list[str],
                          names: list[str], options: RunOptions, machine: dict) -> int:
    gc.collect()
    gc.freeze()
    started = time.monotonic()
    cpu_started = time.process_time()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results = []
    for name in names:
        scenario = SCENARIOS[name]
        count = args.count if args.count is not None else \
            (scenario.quick_count if args.quick else DEFAULT_COUNT)
        size = args.size if args.size is not None else scenario.size
        seeds_wanted = args.seeds or (1 if args.quick else scenario.seeds)
        seeds = [args.seed + k for k in range(seeds_wanted)]
        these = dataclasses.replace(options, count=count, size=size)
        print(f"scenario {name}: {scenario.description}; {count} x {size} B, seeds "
              f"{', '.join(map(str, seeds))}", flush=True)
        scenario_started = time.monotonic()
        result = await run_scenario(scenario, protocols, these, seeds)
        result["wall_s"] = time.monotonic() - scenario_started
        for line in scenario_lines(result):
            print(line)
        print(flush=True)
        results.append(result)
    wall = time.monotonic() - started
    cpu = time.process_time() - cpu_started
    meta = {
        "command": " ".join(shlex.quote(a) for a in (getattr(args, "argv", None) or sys.argv)),
        "machine": machine, "interval_ms": options.interval * 1000.0,
        "drain_s": options.drain, "ack_delay_s": options.ack_delay,
        "ours_config": options.ours_config, "wall_s": wall, "cpu_s": cpu,
        "started": started_at, "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "percentiles": "linear interpolation between order statistics (numpy default), "
                       "over every message of every seed",
    }
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "loss_scenarios.json", "w") as f:
        json.dump({"meta": meta, "scenarios": results}, f, indent=1)
    m = machine
    lines = ["## Loss scenarios: results", "",
             f"- command: `{meta['command']}`",
             f"- machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
             f"{m['python']}, {m['platform']}, event loop {m['event_loop']}; load at start "
             f"{m['loadavg']}",
             f"- {started_at} to {meta['finished']}; wall time {wall:.0f} s, CPU {cpu:.0f} s",
             ""]
    for result in results:
        lines.extend(scenario_lines(result))
    (out / "loss_scenarios.md").write_text("\n".join(lines) + "\n")
    if not args.no_plots:
        figures = args.figures or out
        figures.mkdir(parents=True, exist_ok=True)
        print(f"figures in {figures}: {', '.join(write_scenario_plots(figures, results))}")
    print("Targets (informational, not the exit status):")
    for result in results:
        for t in result["targets"]:
            print(f"  {t['status']:<7} {t['target']}: {t['detail']}")
    print(f"wall time {wall:.0f} s, CPU {cpu:.0f} s; wrote loss_scenarios.json, "
          f"loss_scenarios.md in {out}")
    failures = [r for result in results for r in result["runs"]
                if r["errors"] or r["order_errors"] or r["corrupt"] or r["duplicates"]
                or r["delivered"] != r["count"]]
    for r in failures:
        print(f"FAILED: {r['label']} {r['scenario']} seed {r['netem_seed']} {r['variant']}: "
              f"delivered {r['delivered']}/{r['count']}, order errors {r['order_errors']}, "
              f"corrupt {r['corrupt']}, duplicates {r['duplicates']}, {r['errors']}",
              file=sys.stderr)
    return 1 if failures else 0


# --------------------------------------------------------------------------------------------
# Command line


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _loss(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"a percentage 0..100, got {text}")
    return value


def _point(text: str) -> tuple[str, float]:
    link, colon, loss = text.partition(":")
    if not colon or link not in LINKS:
        raise argparse.ArgumentTypeError(f"expected LINK:LOSS with LINK in "
                                         f"{', '.join(LINKS)}, e.g. high:10; got {text!r}")
    return link, _loss(loss)


def _config_item(text: str) -> tuple[str, Any]:
    import ast
    import dataclasses

    from relay_core import EndpointConfig

    name, equals, value = text.partition("=")
    if not equals or name not in {f.name for f in dataclasses.fields(EndpointConfig)}:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD an EndpointConfig "
                                         f"field, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value          # a bare word: a string (redundancy_policy=always)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags (for ``relay bench loss`` or this script's own parser)."""
    parser.add_argument("--scenario", action="append", choices=[*SCENARIOS, "all"],
                        dest="scenarios",
                        help="run a named scenario instead of the loss matrix; repeat for "
                             "several, 'all' for every one (see docs/BENCHMARKS.md)")
    parser.add_argument("--seeds", type=_positive_int, default=None, metavar="N",
                        help="scenarios: emulator seeds --seed, --seed + 1, ... pooled (default "
                             "per scenario: " + ", ".join(f"{s.name} {s.seeds}"
                                                          for s in SCENARIOS.values()) + ")")
    parser.add_argument("--quick", action="store_true",
                        help=f"scenarios: CI size, one seed of {QUICK_COUNT} messages "
                             f"(rtt_jump {SCENARIOS['rtt_jump'].quick_count}), --drain "
                             f"{QUICK_DRAIN:g}")
    parser.add_argument("--ideal-stability", action="store_true",
                        help="only simulate the ideal protocol on each scenario's link model "
                             "(no sockets, seconds) and print how its p99 varies between seeds")
    parser.add_argument("--count", type=_positive_int, default=None,
                        help=f"messages per run (default {DEFAULT_COUNT})")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_MS, metavar="MS",
                        help=f"ms between messages (default {DEFAULT_INTERVAL_MS:g})")
    parser.add_argument("--size", type=int, default=None,
                        help=f"message bytes, at least {HEADER.size} (default {DEFAULT_SIZE}; "
                             "long_path 300)")
    parser.add_argument("--link", action="append", choices=sorted(LINKS),
                        help="link profile; repeat for several (default: low and high)")
    parser.add_argument("--loss", action="append", type=_loss, metavar="PCT",
                        help="loss per direction in %%; repeat for several "
                             f"(default: {', '.join(f'{v:g}' for v in LOSSES)})")
    parser.add_argument("--protocol", action="append", choices=adapters.PROTOCOLS,
                        dest="protocols", help="protocol; repeat for several (default: all; "
                        "scenarios: all but kcp-normal)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"emulator seed, the same for every protocol (default {DEFAULT_SEED})")
    parser.add_argument("--drain", type=float, default=None, metavar="SECONDS",
                        help="wait this long after the last send for missing echoes "
                             f"(default {DEFAULT_DRAIN:g}; --quick {QUICK_DRAIN:g})")
    parser.add_argument("--ack-delay", type=float, default=DEFAULT_ACK_DELAY, metavar="SECONDS",
                        help=f"our endpoints' ack_delay (default {DEFAULT_ACK_DELAY:g})")
    parser.add_argument("--redundancy-budget", type=int, default=None, metavar="BYTES",
                        help="our endpoints' redundancy_budget (default: the EndpointConfig "
                             "default, 1024): bytes of piggybacked copies per datagram")
    parser.add_argument("--ours", action="append", type=_config_item, metavar="FIELD=VALUE",
                        help="a further EndpointConfig field for our endpoints, VALUE a Python "
                             "literal; repeat for several, e.g. --ours redundancy_policy='always'")
    parser.add_argument("--sequential", action="store_true",
                        help="run the protocols of a point one after another, not concurrently")
    parser.add_argument("--check-concurrency", action="append", type=_point, metavar="LINK:LOSS",
                        help="also rerun this point the other way (sequential when the run is "
                             "concurrent) and compare; repeat for several, e.g. high:10")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help="where the JSON, markdown and PNG files go "
                             "(default benchmarks/results/)")
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")
    parser.add_argument("--figures", type=Path, default=None, metavar="DIR",
                        help="where the plots go (default: --out); docs/figures holds the ones "
                             "docs/BENCHMARKS.md shows")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="event loop (default asyncio: its timers never fire early)")


async def _main(args: argparse.Namespace, protocols: list[str], links: list[Link],
                losses: list[float], options: RunOptions, machine: dict) -> int:
    gc.collect()
    gc.freeze()     # what exists now is never scanned again: shorter collector pauses
    started = time.monotonic()
    cpu_started = time.process_time()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results: list[dict] = []
    checks: list[dict] = []
    wanted_checks = set(args.check_concurrency or ())
    total = len(links) * len(losses)
    index = 0
    for link in links:
        for loss in losses:
            index += 1
            print(f"[{index}/{total}] {link.name} link, {loss:g} % loss "
                  f"({'sequential' if args.sequential else 'concurrent'})", flush=True)
            point = await run_point(protocols, link, loss, options,
                                    concurrent=not args.sequential)
            print_point(point)
            results.extend(point)
            if (link.name, loss) in wanted_checks and len(protocols) > 1:
                print(f"  concurrency check: the same point with "
                      f"{'concurrent' if args.sequential else 'sequential'} protocols",
                      flush=True)
                other = await run_point(protocols, link, loss, options,
                                        concurrent=args.sequential)
                print_point(other)
                concurrent, sequential = (other, point) if args.sequential else (point, other)
                checks.append(concurrency_comparison(
                    concurrent, sequential, "concurrent" if args.sequential else "sequential"))
    wall = time.monotonic() - started
    for link_name, loss in sorted(wanted_checks - {(c["link"], c["loss"]) for c in checks}):
        print(f"warning: --check-concurrency {link_name}:{loss:g} is not a point of this run",
              file=sys.stderr)
    cpu = time.process_time() - cpu_started

    targets = evaluate_targets(results)
    meta = {
        "command": " ".join(shlex.quote(a) for a in (getattr(args, "argv", None) or sys.argv)),
        "machine": machine, "count": options.count, "size": options.size,
        "interval_ms": options.interval * 1000.0, "seed": options.seed,
        "drain_s": options.drain, "ack_delay_s": options.ack_delay,
        "ours_config": options.ours_config,
        "concurrent": not args.sequential, "wall_s": wall, "cpu_s": cpu,
        "started": started_at, "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "links": {name: {"delay_ms": link.delay_ms, "jitter_ms": link.jitter_ms,
                         "description": link.description} for name, link in LINKS.items()},
        "percentiles": "linear interpolation between order statistics (numpy default)",
    }
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "loss_latency.json", "w") as f:
        json.dump({"meta": meta, "results": results, "targets": targets,
                   "concurrency_checks": checks}, f, indent=1)
    markdown = markdown_report(meta, results, targets, checks)
    (out / "loss_latency.md").write_text(markdown)
    written = ["loss_latency.json", "loss_latency.md"]
    if not args.no_plots:
        figures = args.figures or out
        figures.mkdir(parents=True, exist_ok=True)
        written += [str(figures / name) if figures != out else name
                    for name in write_plots(figures, results)]

    print()
    print("Targets:")
    for t in targets:
        print(f"  {t['status']:<7} {t['target']}: {t['detail']}")
    for check in checks:
        print(f"Concurrent vs sequential at {check['link']} {check['loss']:g} %:")
        for row in check["rows"]:
            c, s = row["concurrent"], row["sequential"]
            print(f"  {row['label']:<24} mean {_fmt(c['mean'])} vs {_fmt(s['mean'])}, "
                  f"p50 {_fmt(c['p50'])} vs {_fmt(s['p50'])}, p99 {_fmt(c['p99'])} vs "
                  f"{_fmt(s['p99'])}")
    print(f"wall time {wall:.0f} s, CPU {cpu:.0f} s ({100 * cpu / wall:.0f} % of one core); "
          f"wrote {', '.join(written)} in {out}")

    failures = [r for r in results
                if r["errors"] or r["order_errors"] or r["corrupt"] or r["duplicates"]
                or r["delivered"] != r["count"]]
    for r in failures:
        print(f"FAILED: {r['label']} {r['link']} {r['loss']:g} %: delivered "
              f"{r['delivered']}/{r['count']}, order errors {r['order_errors']}, corrupt "
              f"{r['corrupt']}, duplicates {r['duplicates']}, {r['errors']}", file=sys.stderr)
    return 1 if failures else 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark for flags parsed with ``add_arguments``; returns the exit status."""
    if getattr(args, "ideal_stability", False):
        for line in ideal_stability():
            print(line)
        return 0
    scenarios = list(dict.fromkeys(getattr(args, "scenarios", None) or ()))
    if "all" in scenarios:
        scenarios = list(SCENARIOS)
    protocols = list(dict.fromkeys(args.protocols or (SCENARIO_PROTOCOLS if scenarios
                                                      else adapters.PROTOCOLS)))
    if args.drain is None:
        args.drain = QUICK_DRAIN if getattr(args, "quick", False) else DEFAULT_DRAIN
    if scenarios and (args.link or args.loss is not None or args.check_concurrency
                      or args.sequential):
        print("error: --scenario runs its own links; leave out --link, --loss, --sequential "
              "and --check-concurrency", file=sys.stderr)
        return 2
    if not scenarios and (getattr(args, "quick", False) or getattr(args, "seeds", None)):
        print("error: --quick and --seeds apply to --scenario runs", file=sys.stderr)
        return 2
    size = args.size if args.size is not None else DEFAULT_SIZE
    links = [LINKS[name] for name in dict.fromkeys(args.link or list(LINKS))]
    losses = list(dict.fromkeys(args.loss if args.loss is not None else LOSSES))
    if size < HEADER.size:
        print(f"error: --size must be at least {HEADER.size}", file=sys.stderr)
        return 2
    if args.interval <= 0 or args.drain <= 0 or args.ack_delay < 0:
        print("error: --interval and --drain must be > 0, --ack-delay >= 0", file=sys.stderr)
        return 2
    missing = {p: reason for p in protocols if (reason := adapters.unavailable(p))}
    if missing:
        for protocol, reason in missing.items():
            print(f"error: {reason}", file=sys.stderr)
        print("install them (pip install pyenet kcp) or leave those protocols out with "
              "--protocol", file=sys.stderr)
        return 2
    machine = machine_info(args.loop)
    print(f"machine: {machine['cpu']}, {machine['cores']} cores "
          f"({machine['usable_cores']} usable), {machine['python']}, {machine['platform']}, "
          f"loop {args.loop}, load {machine['loadavg']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()))
    count = args.count if args.count is not None else DEFAULT_COUNT
    if scenarios:
        print(f"protocols: {', '.join(protocols)}; scenarios: {', '.join(scenarios)}; every "
              f"{args.interval:g} ms; first seed {args.seed}", flush=True)
    else:
        print(f"protocols: {', '.join(protocols)}; links: "
              f"{', '.join(link.name for link in links)}; loss %: "
              f"{', '.join(f'{v:g}' for v in losses)}; {count} x {size} B every "
              f"{args.interval:g} ms; seed {args.seed}", flush=True)
    ours = dict(getattr(args, "ours", None) or ())
    if args.redundancy_budget is not None:
        ours["redundancy_budget"] = args.redundancy_budget
    options = RunOptions(count=count, interval=args.interval / 1000.0, size=size,
                         seed=args.seed, drain=args.drain, ack_delay=args.ack_delay,
                         ours_config=ours or None)
    if args.loop == "uvloop":
        import uvloop
        factory = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        if scenarios:
            return runner.run(_main_scenarios(args, protocols, scenarios, options, machine))
        return runner.run(_main(args, protocols, links, losses, options, machine))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="loss_latency",
        description="Round-trip latency of a 30 ms echo stream under loss: ours (redundant, "
                    "reliable_ordered) vs ENet vs KCP, through relay.tools.netem on loopback.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = ["python3", "benchmarks/loss_latency.py",
                 *(sys.argv[1:] if argv is None else argv)]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
