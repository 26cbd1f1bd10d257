"""The loss benchmark's echo stream in simulated time: our protocol over ``relay_core.simlink``.

``benchmarks/loss_latency.py`` runs every protocol through ``relay netem`` on real sockets, in
real time: a scenario with its seeds takes minutes. This runs only ours, on the same link model
(the scenario's ``LinkSettings``), with a simulated clock: thousands of messages in seconds, the
same result for the same seed. It is the tool for tuning the redundancy controller and the
ground the controller's tests stand on; the real-socket benchmark stays the judge.

The exchange is loss_latency's: the client sends a ``size``-byte message every ``interval`` on
one redundant channel, the server echoes each the moment it arrives, the client notes each
echo's round trip. Both endpoints send as soon as they have something (the drivers' flush on
send and on receive) and run their timers when due.

    python -m benchmarks.echo_sim --scenario bursts --seeds 8
    python -m benchmarks.echo_sim --scenario long_path --ours redundancy_budget=2048
"""
from __future__ import annotations

import argparse
import ast
import math
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loss_latency import Datagram, episode_recoveries, redundancy_limit  # noqa: E402
from relay.tools.netem import LinkSettings  # noqa: E402
from relay_core import ChannelConfig, Endpoint, EndpointConfig, MessageReceived, PeerConnected  # noqa: E402
from relay_core.simlink import LossyLink  # noqa: E402

SERVER = ("10.0.0.1", 7777)
CLIENT = ("10.0.0.2", 40000)
HEADER = struct.Struct("!Id")           # message index, client send time
STEP_LIMIT = 0.001                      # the longest the clock jumps without looking (s)


@dataclass
class EchoRun:
    """One simulated run: round trips (ms, None = never echoed) and what went over the wire."""

    rtts: list[Optional[float]]
    send_times: list[float]
    size: int
    bytes_up: int = 0                   # UDP payload bytes (as loss_latency's wire figures)
    bytes_down: int = 0
    datagrams_up: int = 0
    datagrams_down: int = 0
    server_sends: list[float] = field(default_factory=list)     # when each server datagram left
    queue_ms: list[float] = field(default_factory=list)
    """Time each delivered datagram (both ways) spent in the bottleneck: queue + serialisation."""
    limit: list[Optional[float]] = field(default_factory=list)
    """Per message, the loss-trace limit of this run's own datagrams (loss_latency's
    ``redundancy_limit``), ms."""
    trace: list[tuple[float, dict, dict]] = field(default_factory=list)
    """With ``trace_every``: (time, client PeerStats fields, server PeerStats fields)."""
    peer_stats: dict[str, Any] = field(default_factory=dict)
    episodes: list[tuple[float, float]] = field(default_factory=list)
    """The link's loss episodes (start, end), seconds from the first send (both ways alike)."""

    @property
    def delivered(self) -> list[float]:
        return [v for v in self.rtts if v is not None]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _config(overrides: dict[str, Any], seed: int, server: bool) -> EndpointConfig:
    base = EndpointConfig(channels=(ChannelConfig("redundant"),), ack_delay=0.005)
    return base.replace(accept_connections=server, seed=seed, **overrides)


def run_echo(settings: LinkSettings, count: int = 1000, seed: int = 1, size: int = 80,
             interval: float = 0.030, drain: float = 10.0,
             phases: Sequence[tuple[float, Optional[LinkSettings]]] = (),
             ours: Optional[dict[str, Any]] = None, trace_every: float = 0.0) -> EchoRun:
    """One run of ``count`` messages over ``settings`` both ways. ``phases``: (fraction of the
    send span, settings from then on, or None for ``settings``)."""
    if size < HEADER.size:
        raise ValueError(f"size {size} below the {HEADER.size}-byte message header")
    ours = dict(ours or {})
    server = Endpoint(_config(ours, seed * 2 + 1, True))
    client = Endpoint(_config(ours, seed * 2 + 2, False))
    up = LossyLink(settings.profile(), f"sim/{seed}/up", episode_seed=f"sim/{seed}/episodes")
    down = LossyLink(settings.profile(), f"sim/{seed}/down", episode_seed=f"sim/{seed}/episodes")
    sent_at: dict[int, list[float]] = {id(up): [], id(down): []}
    up.episodes.origin = down.episodes.origin = 0.0
    run = EchoRun(rtts=[None] * count, send_times=[], size=size)
    now = 0.0
    peer = client.connect(SERVER, now)
    connected = False
    start = None
    pending_phases = sorted(phases, key=lambda p: p[0])
    padding = bytes(size - HEADER.size)
    end_of_sends = math.inf

    def pump(endpoint: Endpoint, link: LossyLink, is_server: bool) -> None:
        nonlocal connected
        endpoint.handle_timeout(now)
        while True:
            event = endpoint.next_event()
            if event is None:
                break
            if type(event) is MessageReceived:
                if is_server:
                    endpoint.send(event.peer_id, 0, event.payload)
                else:
                    index, message_sent = HEADER.unpack_from(event.payload)
                    if run.rtts[index] is None:
                        run.rtts[index] = (now - message_sent) * 1000.0
            elif type(event) is PeerConnected and not is_server:
                connected = True
        for datagram, _address in endpoint.datagrams_to_send(now):
            link.send(datagram, now)
            sent_at[id(link)].append(now)
            if is_server:
                run.bytes_down += len(datagram)
                run.datagrams_down += 1
                if start is not None:
                    run.server_sends.append(now - start)
            else:
                run.bytes_up += len(datagram)
                run.datagrams_up += 1

    def stats(endpoint: Endpoint) -> dict:
        for peer_id in endpoint.peer_ids:
            snapshot = endpoint.peer_stats(peer_id)
            return {name: getattr(snapshot, name) for name in snapshot.__dataclass_fields__}
        return {}

    next_trace = 0.0
    sent = 0
    next_send = math.inf
    horizon = 600.0 + count * interval
    while now < horizon:
        for datagram in up.arrivals(now):
            server.receive(datagram, CLIENT, now)
        for datagram in down.arrivals(now):
            client.receive(datagram, SERVER, now)
        if connected and start is None:
            start = now
            next_send = now
            end_of_sends = start + (count - 1) * interval
            # Counters of the handshake are not the stream's.
            run.bytes_up = run.bytes_down = run.datagrams_up = run.datagrams_down = 0
        while pending_phases and start is not None \
                and now >= start + pending_phases[0][0] * count * interval:
            new = pending_phases.pop(0)[1] or settings
            up.profile = down.profile = new.profile()
        if sent < count and now >= next_send:
            client.send(peer, 0, HEADER.pack(sent, now) + padding)
            run.send_times.append(now - start)
            sent += 1
            next_send = start + sent * interval if sent < count else math.inf
        pump(server, down, True)
        pump(client, up, False)
        if trace_every and start is not None and now - start >= next_trace:
            run.trace.append((now - start, stats(client), stats(server)))
            next_trace += trace_every
        if sent == count and (all(v is not None for v in run.rtts) or now > end_of_sends + drain):
            break
        candidates = [next_send, now + STEP_LIMIT]
        for link in (up, down):
            arrival = link.next_arrival()
            if arrival is not None:
                candidates.append(arrival)
        for endpoint in (server, client):
            deadline = endpoint.next_timeout()
            if deadline is not None:
                candidates.append(deadline)
        now = max(now + 1e-6, min(candidates))
    run.peer_stats = {"client": stats(client), "server": stats(server)}
    run.queue_ms = [queued * 1000.0 for link in (up, down) for queued, _ in link.counters.delays]
    if start is not None:
        run.episodes = [(a - start, b - start) for a, b in up.episodes.history]
        fates = [_fates(link, sent_at[id(link)]) for link in (up, down)]
        message_times = [start + t for t in run.send_times]
        run.limit = [None if v is None else v * 1000.0
                     for v in redundancy_limit(message_times, fates[0], fates[1])]
    return run


def _fates(link: LossyLink, times: list[float]) -> list[Datagram]:
    """Each datagram the link was offered: sent, dropped, arrival (the model's own delays)."""
    delays = iter(link.counters.delays)
    return [Datagram(t, True, None) if dropped else Datagram(t, False, t + next(delays)[1])
            for t, dropped in zip(times, link.counters.drop_decisions)]


def summarize(runs: Sequence[EchoRun]) -> dict[str, float]:
    """Pooled over runs: delivery, mean / p50 / p99 / max round trip (ms), bytes per payload
    byte both ways (UDP payloads, as loss_latency's "wire") and the server's datagrams per second."""
    pooled = [v for run in runs for v in run.delivered]
    total = sum(len(run.rtts) for run in runs)
    wire = sum(run.bytes_up + run.bytes_down for run in runs)
    span = sum(max(run.send_times[-1], 1e-9) for run in runs if run.send_times)
    payload = sum(2 * len(run.rtts) * run.size for run in runs)
    limits = [v for run in runs for v in run.limit if v is not None]
    recoveries = [v for run in runs for v in episode_recoveries(run.episodes, run.send_times, run.rtts)]
    queued = [v for run in runs for v in run.queue_ms]
    return {"delivered": len(pooled), "messages": total, "limit_p99": percentile(limits, 99),
            "queue_p99": percentile(queued, 99),
            "recovery_mean": sum(recoveries) / len(recoveries) if recoveries else math.nan,
            "mean": sum(pooled) / len(pooled) if pooled else math.nan,
            "p50": percentile(pooled, 50), "p99": percentile(pooled, 99),
            "max": max(pooled) if pooled else math.nan,
            "datagrams_down_per_s": sum(r.datagrams_down for r in runs) / span if span else math.nan,
            "wire_bytes": wire, "wire_per_payload_byte": wire / payload if payload else math.nan}


def main(argv: Optional[list[str]] = None) -> int:
    from benchmarks.loss_latency import SCENARIOS

    parser = argparse.ArgumentParser(prog="echo_sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", choices=[*SCENARIOS, "all"], required=True)
    parser.add_argument("--seeds", type=int, default=None, help="seeds pooled (default: the scenario's)")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--ours", action="append", default=[], metavar="FIELD=VALUE",
                        help="an EndpointConfig field, VALUE a Python literal; repeatable")
    args = parser.parse_args(argv)
    ours: dict[str, Any] = {}
    for item in args.ours:
        name, _, value = item.partition("=")
        ours[name] = ast.literal_eval(value)
    names = list(SCENARIOS) if "all" in args.scenario else args.scenario
    for name in names:
        scenario = SCENARIOS[name]
        seeds = args.seeds or scenario.seeds
        phases = [(fraction, new) for fraction, _, new in scenario.phases]
        runs = [run_echo(scenario.settings, args.count, seed, scenario.size, phases=phases, ours=ours)
                for seed in range(1, seeds + 1)]
        s = summarize(runs)
        print(f"{name:>10}: {s['delivered']}/{s['messages']} mean {s['mean']:.1f} p50 {s['p50']:.1f} "
              f"p99 {s['p99']:.1f} (limit {s['limit_p99']:.1f}) max {s['max']:.1f} ms; "
              f"wire {s['wire_per_payload_byte']:.2f} per payload byte; "
              f"server {s['datagrams_down_per_s']:.1f} datagrams/s"
              + (f"; bottleneck p99 {s['queue_p99']:.1f} ms" if scenario.settings.rate else "")
              + (f"; after an episode {s['recovery_mean']:.1f} ms" if scenario.settings.episode_ms else ""),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
