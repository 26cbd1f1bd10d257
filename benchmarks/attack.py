"""Handshake floods against a live relay while rooms play: what players and joining clients see.

Two scenarios, each in open and token mode, on loopback only, bounded in time:

* ``flood`` (issue #17, M1): benchmarks/flood.c (built with ``cc -O2``) sends forged
  CONNECT_REQUESTs, CONNECT_RESPONSEs with made-up cookies, and DATA, PATH_RESPONSEs and
  DISCONNECTs with random session ids from random 127.x.y.z sources at the highest rate one
  thread can send (``--rate 0``), while
  ``relay bot`` plays rooms and a joiner connects a new client every 0.2 s.
* ``lockout`` (M2): the flooder forges CONNECT_REQUESTs from the joiner's own IP (127.0.0.77,
  any port) at ``--lockout-rate`` (2 000/s, the rate that locked a client out before) while the
  joiner connects from that IP.
* ``slowloris`` (M3): a relay whose descriptor limit is 256 gets ``--slowloris-connections``
  (600) HTTP connections that send a request line and one header and never finish, while /health
  is probed; PASS needs every probe answered within 1 s.
* ``fragments`` (M4): benchmarks/fragment_memory.py, ``--fragment-peers`` (500) open-mode
  connections each parking never-completed fragments against the default receive budget (256
  MiB), in one process: PASS needs RSS to grow by at most the budget + 16 MiB and to come back
  within 8 MiB once they left.

Measured: the bots' late inputs (inputs that missed their frame) and frame checks, the joins'
time to connected (p50/p99/max) and failures, the relay's peers during the flood (no state for
forged packets), its drops by reason and its CPU, and the kernel's receive-buffer drops. PASS
needs: late inputs <= 1 %, join p99 <= 1 s and no failed join, no frame lost or mismatched,
never more peers than the players and one joiner. ``--small`` is the short run the test suite makes.

    python benchmarks/attack.py                       # every scenario, both modes (~1 min)
    python benchmarks/attack.py --scenario flood --mode open --seconds 20 --json out.json
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent
VICTIM_IP = "127.0.0.77"
KEY_ID, KEY = 1, bytes(range(40, 72))
LATE_TARGET, JOIN_P99_TARGET = 0.01, 1.0


def vector(name: str) -> bytes:
    for path in (ROOT / "tests" / "vectors").glob("*.json"):
        for item in json.loads(path.read_text())["vectors"]:
            if item["name"] == name:
                return bytes.fromhex(item["hex"])
    raise KeyError(name)


def flood_templates(mode: str, kinds: tuple[str, ...]) -> list[str]:
    """flood.c's --datagram arguments: a real packet and the byte range it randomizes."""
    secure = mode == "token"
    templates = {
        # connect id (a token-mode request keeps its token block, so it is not refused at once)
        "request": (vector("secure_connect_request" if secure else "connect_request"), 4, 4),
        # connect id, cookie time and cookie MAC
        "response": (vector("secure_connect_response" if secure else "connect_response"), 4, 24),
        # session id, sequence numbers, acks and times
        "data": (vector("data_heartbeat_first_packet") + bytes(16), 4, 16),
        # session id and path data: an answer to a challenge nobody sent
        "path": (vector("secure_path_response" if secure else "path_response"), 4, 12),
        # session id (and, sealed, the rest)
        "disconnect": (vector("secure_disconnect" if secure else "disconnect_closed"), 4, 4),
    }
    return [f"{templates[k][0].hex()}:{templates[k][1]}:{templates[k][2]}" for k in kinds]


def build_flooder(directory: pathlib.Path) -> pathlib.Path:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("attack.py: no C compiler (cc) on PATH")
    binary = directory / "flood"
    subprocess.run([compiler, "-O2", "-o", str(binary), str(HERE / "flood.c")], check=True)
    return binary


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Relay:
    """``relay serve`` in its own process (replays off, warnings only)."""

    def __init__(self, mode: str, workdir: pathlib.Path, fd_limit: int = 0):
        self.mode = mode
        self.udp_port, self.http_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(self.udp_port),
                   RELAY_SERVER_HTTP_PORT=str(self.http_port), RELAY_SERVER_LOG_LEVEL="warning",
                   RELAY_REPLAY_ENABLED="false", RELAY_SERVER_DRAIN_TIMEOUT="0", RELAY_SECURITY_MODE=mode)
        if mode == "token":
            env["RELAY_SECURITY_KEYS"] = f"{KEY_ID}:{base64.b64encode(KEY).decode()}"
        env.pop("RELAY_CONFIG", None)
        self.log = open(workdir / f"relay-{mode}.log", "w+")
        def limit_descriptors():
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        self.process = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=env, cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT,
                                        preexec_fn=limit_descriptors if fd_limit else None)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get("/ready")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    self.log.seek(0)
                    raise SystemExit(f"relay serve did not start:\n{self.log.read()[-2000:]}")
                time.sleep(0.1)

    def get(self, path: str) -> bytes:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10).read()

    def drops(self) -> dict:
        text = self.get("/metrics").decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("relay_dropped_datagrams_total{"):
                reason = line.split('reason="')[1].split('"')[0]
                value = float(line.rsplit(" ", 1)[1])
                if value:
                    out[reason] = int(value)
        return out

    def cpu_seconds(self) -> float:
        fields = pathlib.Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def receive_buffer_errors() -> int:
    lines = [line.split() for line in open("/proc/net/snmp") if line.startswith("Udp:")]
    return int(dict(zip(lines[0], lines[1]))["RcvbufErrors"])


def join_once(relay: Relay, local_ip: str, index: int, timeout: float = 3.0) -> float | None:
    """One transport-level join (handshake to PeerConnected) from ``local_ip``; seconds, or None."""
    from relay_core import Endpoint, EndpointConfig
    from relay_core.token import mint_token

    server = ("127.0.0.1", relay.udp_port)
    endpoint = Endpoint(EndpointConfig())
    token = mint_token(KEY, KEY_ID, f"join-{index}", "joiner", 60.0) if relay.mode == "token" else None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((local_ip, 0))
        sock.settimeout(0.005)
        start = time.monotonic()
        peer = endpoint.connect(server, 0.0, token)
        while (elapsed := time.monotonic() - start) < timeout:
            for data, to in endpoint.datagrams_to_send(elapsed):
                sock.sendto(data, to)
            try:
                data, source = sock.recvfrom(2048)
                endpoint.receive(data, source, time.monotonic() - start)
            except (TimeoutError, BlockingIOError):
                pass
            endpoint.handle_timeout(time.monotonic() - start)
            if endpoint.is_connected(peer):
                took = time.monotonic() - start
                endpoint.disconnect(peer)
                for data, to in endpoint.datagrams_to_send(took):
                    sock.sendto(data, to)
                return took
    return None


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def run_scenario(args, scenario: str, mode: str, flooder: pathlib.Path, workdir: pathlib.Path) -> dict:
    relay = Relay(mode, workdir)
    try:
        bot_seconds = args.seconds + 4.0
        bot_command = [sys.executable, "-m", "relay.cli", "bot", "--server", f"127.0.0.1:{relay.udp_port}",
                       "--rooms", str(args.rooms), "--players", str(args.players),
                       "--seconds", str(bot_seconds), "--json", "--room-prefix", f"attack-{scenario}"]
        if mode == "token":
            bot_command += ["--key", f"{KEY_ID}:{base64.b64encode(KEY).decode()}"]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        bots = subprocess.Popen(bot_command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        time.sleep(2.0)                         # the rooms start before the flood
        if scenario == "flood":
            flood_args = ["--sockets", "16"]
            for template in flood_templates(mode, ("request", "response", "data", "path", "disconnect")):
                flood_args += ["--datagram", template]
            rate = args.rate
            joiner_ip = "127.0.0.1"
        else:
            flood_args = ["--source-ip", VICTIM_IP, "--sockets", "32",
                          "--datagram", flood_templates(mode, ("request",))[0]]
            rate = args.lockout_rate
            joiner_ip = VICTIM_IP
        buffer_errors = receive_buffer_errors()
        cpu = relay.cpu_seconds()
        flood = subprocess.Popen([str(flooder), "--port", str(relay.udp_port), "--seconds", str(args.seconds),
                                  "--rate", str(rate), *flood_args], stdout=subprocess.PIPE, text=True)
        started = time.monotonic()
        joins: list[float] = []
        failed = 0
        index = 0
        time.sleep(0.5)                         # the flood is at full rate
        most_peers = 0
        while time.monotonic() - started < args.seconds - 0.5:
            most_peers = max(most_peers, json.loads(relay.get("/health"))["peers"])
            took = join_once(relay, joiner_ip, index)
            index += 1
            if took is None:
                failed += 1
            else:
                joins.append(took)
            time.sleep(0.2)
        flood_out, _ = flood.communicate(timeout=args.seconds + 30)
        cpu = relay.cpu_seconds() - cpu
        elapsed = time.monotonic() - started
        buffer_errors = receive_buffer_errors() - buffer_errors
        bots_out, bots_err = bots.communicate(timeout=bot_seconds + 60)
        drops = relay.drops()
    finally:
        relay.stop()
    flood_report = json.loads(flood_out)
    try:
        bot_report = json.loads(bots_out)
    except json.JSONDecodeError:
        bot_report = {"errors": [f"relay bot printed no report: {bots_err[-500:]}"]}
    result = {
        "scenario": scenario, "mode": mode, "flood": flood_report,
        "relay_cpu_share": round(cpu / elapsed, 3), "kernel_receive_buffer_drops": buffer_errors,
        "drops": drops, "most_peers": most_peers,
        "late_input_share": bot_report.get("late_input_share"),
        "inputs_missing": bot_report.get("inputs_missing"),
        "frame_problems": sum(bot_report.get(k, 0) for k in ("gaps", "duplicates", "mismatches")),
        "bot_errors": bot_report.get("errors", []),
        "joins": {"count": len(joins), "failed": failed,
                  "p50_ms": round(1000 * statistics.median(joins), 1) if joins else None,
                  "p99_ms": round(1000 * percentile(joins, 0.99), 1) if joins else None,
                  "max_ms": round(1000 * max(joins), 1) if joins else None},
    }
    late = result["late_input_share"]
    checks = {
        "late inputs <= 1 %": late is not None and late <= LATE_TARGET,
        "join p99 <= 1 s, none failed": bool(joins) and failed == 0 and percentile(joins, 0.99) <= JOIN_P99_TARGET,
        "no frame lost or mismatched": result["frame_problems"] == 0 and not result["bot_errors"],
        # The players, and at most the last joiner whose DISCONNECT the flood may have cost.
        "no state for forged packets": most_peers <= args.rooms * args.players + 1,
    }
    result["checks"] = checks
    result["pass"] = all(checks.values())
    return result


SLOWLORIS_HEAD = b"GET /health HTTP/1.1\r\nHost: relay\r\n"     # and never the blank line


async def slowloris(port: int, pid: int, connections: int, seconds: float) -> dict:
    """Opens ``connections`` half-open HTTP connections (one after another, as fast as they are
    accepted), probing /health every second meanwhile and after."""
    held = []
    probes: list[float | None] = []

    async def probe():
        started = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
            writer.write(b"GET /health HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
            response = await asyncio.wait_for(reader.read(), 2.0)
            writer.transport.abort()
            probes.append(time.monotonic() - started if response.startswith(b"HTTP/1.1 200") else None)
        except (OSError, asyncio.TimeoutError):
            probes.append(None)

    async def open_one():
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
            writer.write(SLOWLORIS_HEAD)
            held.append(writer)
        except (OSError, asyncio.TimeoutError):
            pass

    deadline = time.monotonic() + seconds
    next_probe = time.monotonic()
    opened = 0
    while time.monotonic() < deadline:
        if opened < connections:
            await asyncio.gather(*[open_one() for _ in range(min(50, connections - opened))])
            opened += 50
        if time.monotonic() >= next_probe:
            next_probe += 1.0
            await probe()
        await asyncio.sleep(0.05)
    await probe()
    fds = len(os.listdir(f"/proc/{pid}/fd"))              # while every connection is still held
    for writer in held:
        writer.transport.abort()
    return {"opened": len(held), "probes": probes, "fds": fds}


def run_slowloris(args, mode: str, workdir: pathlib.Path) -> dict:
    relay = Relay(mode, workdir, fd_limit=256)
    try:
        outcome = asyncio.run(slowloris(relay.http_port, relay.process.pid, args.slowloris_connections,
                                        args.seconds))
    finally:
        relay.stop()
    answered = [p for p in outcome["probes"] if p is not None]
    result = {"scenario": "slowloris", "mode": mode, "connections_opened": outcome["opened"],
              "probes": len(outcome["probes"]), "probes_answered": len(answered),
              "slowest_probe_ms": round(1000 * max(answered), 1) if answered else None,
              "relay_fds": outcome["fds"]}
    result["checks"] = {"every /health probe answered within 1 s":
                        len(answered) == len(outcome["probes"]) and max(answered, default=9) <= 1.0}
    result["pass"] = all(result["checks"].values())
    return result


MIB = 1 << 20


def run_fragments(args) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "fragment_memory.py"), "--peers", str(args.fragment_peers)],
                          capture_output=True, text=True, timeout=600, check=True, cwd=ROOT)
    figures = json.loads(done.stdout)
    grown, left = figures["rss_parked"] - figures["rss_before"], figures["rss_after"] - figures["rss_before"]
    result = {"scenario": "fragments", "mode": "open", "peers": figures["peers"],
              "rss_before_mib": round(figures["rss_before"] / MIB, 1),
              "rss_parked_mib": round(figures["rss_parked"] / MIB, 1),
              "rss_after_mib": round(figures["rss_after"] / MIB, 1),
              "counted_bytes": figures["parked_used"], "limit_bytes": figures["limit"],
              "drops": figures["drops"]}
    result["checks"] = {"RSS within the budget + 16 MiB": grown <= figures["limit"] + 16 * MIB,
                        "RSS back within 8 MiB once they left": left <= 8 * MIB and figures["used_after"] == 0}
    result["pass"] = all(result["checks"].values())
    return result


def print_result(result: dict) -> None:
    if result["scenario"] == "fragments":
        print(f"fragments open   {result['peers']} connections parking fragments: RSS {result['rss_before_mib']} -> "
              f"{result['rss_parked_mib']} MiB parked ({result['counted_bytes']} of {result['limit_bytes']} "
              f"bytes counted) -> {result['rss_after_mib']} MiB after they left  "
              f"{'PASS' if result['pass'] else 'FAIL'}")
        for name, ok in result["checks"].items():
            if not ok:
                print(f"    FAIL: {name}")
        return
    if result["scenario"] == "slowloris":
        print(f"slowloris {result['mode']:6} {result['connections_opened']} half-open HTTP connections, "
              f"RLIMIT_NOFILE 256: /health {result['probes_answered']}/{result['probes']} answered, slowest "
              f"{result['slowest_probe_ms']} ms; the relay holds {result['relay_fds']} descriptors  "
              f"{'PASS' if result['pass'] else 'FAIL'}")
        return
    joins, flood = result["joins"], result["flood"]
    late = result["late_input_share"]
    print(f"{result['scenario']:8} {result['mode']:6} flood {flood['rate'] / 1000:7.1f} k/s  "
          f"relay cpu {100 * result['relay_cpu_share']:5.1f} %  "
          f"kernel drops {result['kernel_receive_buffer_drops']:>9}  "
          f"late inputs {'-' if late is None else f'{100 * late:5.2f} %'}  "
          f"joins {joins['count']} (failed {joins['failed']}) p50 {joins['p50_ms']} ms p99 {joins['p99_ms']} ms  "
          f"peers at most {result['most_peers']}  {'PASS' if result['pass'] else 'FAIL'}")
    for name, ok in result["checks"].items():
        if not ok:
            print(f"    FAIL: {name}")
    print(f"    drops: {result['drops']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("flood", "lockout", "slowloris", "fragments", "all"), default="all")
    parser.add_argument("--mode", choices=("open", "token", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=10.0, help="flood duration per run (default 10)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="flood datagrams per second; 0: as fast as one thread sends (default)")
    parser.add_argument("--lockout-rate", type=float, default=2000.0,
                        help="forged requests per second from the joiner's IP (default 2000)")
    parser.add_argument("--slowloris-connections", type=int, default=600,
                        help="half-open HTTP connections (default 600; the relay's descriptor limit is 256)")
    parser.add_argument("--fragment-peers", type=int, default=500,
                        help="connections of the fragments scenario (default 500)")
    parser.add_argument("--rooms", type=int, default=2)
    parser.add_argument("--players", type=int, default=4)
    parser.add_argument("--small", action="store_true", help="a short run (4 s per scenario and mode)")
    parser.add_argument("--json", help="write every result here")
    args = parser.parse_args(argv)
    if args.small:
        args.seconds = 4.0
        args.fragment_peers = min(args.fragment_peers, 100)
    if not 2.0 <= args.seconds <= 300.0 or args.rate < 0 or args.lockout_rate <= 0:
        parser.error("--seconds 2..300, --rate >= 0, --lockout-rate > 0")
    scenarios = ("flood", "lockout", "slowloris", "fragments") if args.scenario == "all" else (args.scenario,)
    modes = ("open", "token") if args.mode == "both" else (args.mode,)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="relay-attack-"))
    results = []
    try:
        flooder = build_flooder(workdir)
        for scenario in scenarios:
            for mode in modes:
                if scenario in ("slowloris", "fragments"):
                    if mode != modes[0]:
                        continue            # the same in either mode (fragments: open mode's worst case)
                    result = run_slowloris(args, mode, workdir) if scenario == "slowloris" else run_fragments(args)
                else:
                    result = run_scenario(args, scenario, mode, flooder, workdir)
                print_result(result)
                results.append(result)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ok = all(r["pass"] for r in results)
    print("PASS" if ok else "FAIL")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
