"""Rough per-player cost of a running relay: CPU, memory and bandwidth at a given load.

Starts `relay serve` as its own process on loopback, runs `relay bot` load against it from this
process (rooms of --players bots for --seconds), and reads the server's CPU time and RSS from
/proc and its byte counters from /metrics. Prints figures only; this is a planning aid, not the
capacity benchmark (which pins processes to cores and ramps the load).

    python benchmarks/relay_load.py --rooms 16 --players 4 --seconds 15 --tick-rate 30
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import socket
import subprocess
import sys
import time
import urllib.request

if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from relay.tools.bot import run_bots  # noqa: E402


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def scrape(http_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    values = {}
    for name in ("relay_sent_bytes_total", "relay_received_bytes_total",
                 "relay_datagrams_sent_total", "relay_datagrams_received_total"):
        match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        values[name] = float(match.group(1)) if match else 0.0
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rooms", type=int, default=16)
    parser.add_argument("--players", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--tick-rate", type=int, default=30)
    args = parser.parse_args()

    udp, http = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
    env = dict(os.environ, RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(udp),
               RELAY_SERVER_HTTP_PORT=str(http), RELAY_SERVER_TICK_RATE=str(args.tick_rate),
               RELAY_REPLAY_ENABLED="false", RELAY_SERVER_LOG_LEVEL="warning",
               RELAY_SERVER_DRAIN_TIMEOUT="0",
               # All bots connect from 127.0.0.1: no per-source handshake rate limit, and no
               # open mode per-source caps on connections and rooms.
               RELAY_SECURITY_HANDSHAKE_RATE="0", RELAY_SECURITY_MAX_SESSIONS_PER_SOURCE="0",
               RELAY_SECURITY_MAX_ROOMS_PER_SOURCE="0")
    server = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                scrape(http)
                break
            except OSError:
                time.sleep(0.1)
        idle_rss = proc_rss_bytes(server.pid)
        before_cpu, before = proc_cpu_seconds(server.pid), scrape(http)
        started = time.monotonic()
        summary = asyncio.run(run_bots("127.0.0.1", udp, args.rooms, args.players, args.seconds,
                                       room_prefix="load"))
        wall = time.monotonic() - started
        cpu, after = proc_cpu_seconds(server.pid) - before_cpu, scrape(http)
        loaded_rss = proc_rss_bytes(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=15)

    players = args.rooms * args.players
    sent = after["relay_sent_bytes_total"] - before["relay_sent_bytes_total"]
    received = after["relay_received_bytes_total"] - before["relay_received_bytes_total"]
    print(f"relay_load: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()} (bots share the machine with the server; "
          f"relay serve with no per-source handshake, connection or room limit: every bot is on "
          f"127.0.0.1)")
    print(f"  load            {args.rooms} rooms x {args.players} players = {players} players, "
          f"{args.tick_rate} Hz, {wall:.1f} s")
    print(f"  frames          {summary['frames_received']} received, gaps {summary['gaps']}, "
          f"duplicates {summary['duplicates']}, mismatches {summary['mismatches']}")
    print(f"  server CPU      {100 * cpu / wall:.1f} % of one core; "
          f"{1e6 * cpu / (players * args.tick_rate * wall):.1f} us per player-tick")
    print(f"  server RSS      {loaded_rss / 2**20:.1f} MiB loaded, {idle_rss / 2**20:.1f} MiB idle: "
          f"{(loaded_rss - idle_rss) / players / 1024:.0f} KiB per player")
    print(f"  bandwidth       per player: {sent / players / wall:.0f} B/s down, "
          f"{received / players / wall:.0f} B/s up (UDP payload)")
    print(f"  latency         input-to-frame p50 {summary['latency_ms']['p50']} ms, "
          f"p99 {summary['latency_ms']['p99']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
