"""Soak: a relay under player churn on a lossy link, watched for lost frames, leaks and errors.

Starts ``relay serve`` as its own process on loopback (its log captured to a file) and runs
``--rooms`` rooms from this process, every client through one ``relay.tools.netem`` emulator with
``--loss`` percent loss each way plus delay and jitter. In each room one anchor player stays for
the room's whole life; the others churn at random (seeded): new players join (late joiners get
the history first), players leave, vanish silently (their socket closes: the relay times them
out) and come back (reclaiming their slot, or refused once its grace has run out). After
``--room-seconds`` a room is ended through the admin API, every player still in it must have
received every frame up to the final one, and a new room takes its place. ``--mode token`` (the
default) runs the relay with connect tokens and sealed packets, the soak minting a fresh token
for every connection as a game backend would; ``--mode open`` without.

Checked: every client sees every frame of its room exactly once, in order, from frame 0 (across
its reconnects), byte-identical to what every other client of the room saw; a client still in
a room when it ends reaches the room's final frame. Measured from /proc: the server's RSS and
open file descriptors every ``--sample-seconds``, the RSS slope (least squares after a warm-up,
KiB/min) and the descriptors with no room open at the start and at the end. The server's log
is scanned for errors and exceptions.

Exit status 1 if a frame was lost, duplicated, reordered or differed between clients, a client
in a room was disconnected, the server logged an error or exception, or the server holds more
descriptors (or peers) at the end than at the start.

    python benchmarks/soak.py --seconds 60 --json soak.json            # token mode
    python benchmarks/soak.py --seconds 60 --mode open
    nice -n 19 python benchmarks/soak.py --seconds 3600 --rooms 3 --json soak_1h.json
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model, usable_cores  # noqa: E402
from relay.client import RelayClient, RelayError  # noqa: E402
from relay.tools.netem import LinkSettings, Netem  # noqa: E402
from relay_core.token import mint_token  # noqa: E402

# Join refusals a churning player may meet by design: its slot went to a newcomer after the
# reconnect grace, or every slot is held.
EXPECTED_REFUSALS = {"room_full", "slot_expired"}
INPUT_DELAY = 4         # frames: covers a 40-60 ms round trip plus a repair at 30 Hz
# Token mode: the relay's key; the soak plays the game backend and mints a token per connection.
KEY_ID, KEY = 1, bytes(range(1, 33))


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return 60.0 * sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def scan_log(path: Path) -> dict:
    """Errors and exceptions in the server's log (JSON lines; anything else that is not JSON,
    such as a bare traceback, counts as an error too)."""
    errors, warnings, lines = [], [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        lines += 1
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if re.search(r"level=(ERROR|CRITICAL)|Traceback|Exception", line):
                errors.append(line[:500])
            continue
        level = str(record.get("level", "")).lower()
        if level in ("error", "critical", "exception") or "exception" in record:
            errors.append(line[:500])
        elif level == "warning":
            warnings.append(line[:500])
    return {"lines": lines, "errors": errors, "warnings": warnings}


class RelayProcess:
    """``relay serve`` on loopback with its log going to a file."""

    def __init__(self, workdir: Path, args: argparse.Namespace):
        self.udp_port = free_port(socket.SOCK_DGRAM)
        self.http_port = free_port(socket.SOCK_STREAM)
        self.log_path = workdir / "relay.log"
        self.env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(self.udp_port),
                        RELAY_SERVER_HTTP_PORT=str(self.http_port), RELAY_SERVER_LOG_FORMAT="json",
                        RELAY_SERVER_LOG_LEVEL="info", RELAY_SERVER_DRAIN_TIMEOUT="0",
                        RELAY_ROOMS_CAPACITY=str(args.capacity), RELAY_ROOMS_START_PLAYERS="2",
                        RELAY_ROOMS_PLAYER_TIMEOUT=str(args.player_timeout),
                        RELAY_ROOMS_RECONNECT_GRACE=str(args.reconnect_grace),
                        RELAY_REPLAY_DIRECTORY=str(workdir / "replays"),
                        RELAY_SECURITY_MODE=args.mode,
                        # Every client comes through the one netem address: open mode's
                        # per-source caps would count them all as one source.
                        RELAY_SECURITY_MAX_SESSIONS_PER_SOURCE="0",
                        RELAY_SECURITY_MAX_ROOMS_PER_SOURCE="0")
        if args.mode == "token":
            self.env["RELAY_SECURITY_KEYS"] = f"{KEY_ID}:{base64.b64encode(KEY).decode()}"
        self.env.pop("RELAY_CONFIG", None)
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> None:
        self.log_file = open(self.log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=self.env,
                                        cwd=ROOT, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        # A Ctrl-C at the terminal stops the soak, which then
                                        # checks and stops the relay itself.
                                        start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url("/ready"), timeout=2).read()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    raise RuntimeError("relay serve did not start:\n" + self.log_path.read_text()[-3000:])
                time.sleep(0.1)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def get_json(self, path: str) -> dict:
        with urllib.request.urlopen(self.url(path), timeout=10) as response:
            return json.loads(response.read())

    def end_room(self, room: str) -> None:
        request = urllib.request.Request(self.url(f"/rooms/{room}"), method="DELETE")
        urllib.request.urlopen(request, timeout=10).read()

    def drops(self) -> dict:
        text = urllib.request.urlopen(self.url("/metrics"), timeout=10).read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^relay_dropped_datagrams_total\{reason="([^"]+)"\} (\S+)$', text, re.MULTILINE)
            if float(m.group(2))}

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.log_file.close()
        return code


@dataclass
class Tally:
    frames: int = 0
    frames_lost: int = 0
    """Frames a client in a room never got: gaps, and a shortfall at the room's end."""
    duplicates: int = 0
    out_of_order: int = 0
    mismatches: int = 0
    """Frames whose bytes differ from what another client of the room saw."""
    unexpected_disconnects: list = field(default_factory=list)
    client_errors: list = field(default_factory=list)
    refusals: dict = field(default_factory=dict)
    actions: dict = field(default_factory=dict)
    rooms_completed: int = 0
    players_checked_at_end: int = 0

    def count(self, table: dict, key: str) -> None:
        table[key] = table.get(key, 0) + 1


class SoakPlayer:
    """One player (across its reconnects): plays at the frame rate and checks the stream."""

    def __init__(self, name: str, room: "SoakRoom"):
        self.name = name
        self.room = room
        self.client: Optional[RelayClient] = None
        self.task: Optional[asyncio.Task] = None
        self.state = "new"          # active, left, vanished, retired
        self.expected = 0
        self.last_sent = -1

    async def join(self, timeout: float = 10.0) -> None:
        host, port = self.room.soak.netem.listen_address
        # Tokens are single-use: every connection, a reconnection too, gets a fresh one.
        token = (mint_token(KEY, KEY_ID, self.room.name, self.name, 60.0)
                 if self.room.soak.args.mode == "token" else None)
        if self.client is None:
            self.client = await RelayClient.connect(host, port, self.room.name, self.name,
                                                    timeout=timeout, token=token)
        else:
            await self.client.reconnect(timeout=timeout, token=token)
        self.state = "active"
        self.task = asyncio.get_running_loop().create_task(self._play())

    def _send(self, number: int) -> None:
        if number > self.last_sent:
            self.last_sent = number
            self.client.send_input(number, hashlib.blake2b(f"{self.name}:{number}".encode(),
                                                           digest_size=16).digest())

    async def _play(self) -> None:
        client, tally = self.client, self.room.soak.tally
        for ahead in range(INPUT_DELAY):
            self._send(client.next_frame + ahead)
        while True:
            frame = await client.next_frame_or_none()
            if frame is None:
                break
            if frame.number != self.expected:
                if frame.number < self.expected:
                    tally.duplicates += 1
                    continue
                tally.out_of_order += 1
                tally.frames_lost += frame.number - self.expected
            self.expected = frame.number + 1
            tally.frames += 1
            digest = hashlib.blake2b(frame.encode(), digest_size=16).digest()
            if self.room.ledger.setdefault(frame.number, digest) != digest:
                tally.mismatches += 1
            self._send(frame.number + INPUT_DELAY)
        if client.room_state != "ended" and self.state == "active":
            # The stream ended although nobody asked this player to go.
            tally.unexpected_disconnects.append(f"{self.room.name}/{self.name}: {client.error}")

    async def stop_playing(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            self.task = None

    async def leave(self) -> None:
        self.state = "left"
        await self.stop_playing()
        await self.client.close(leave=True)

    async def vanish(self) -> None:
        """Gone without a word: the socket closes, the relay has to time the player out."""
        self.state = "vanished"
        await self.stop_playing()
        self.client.driver.close()


class SoakRoom:
    """One room slot of the soak: a sequence of rooms (generations), each with churn."""

    def __init__(self, soak: "Soak", index: int):
        self.soak = soak
        self.index = index
        self.generation = 0
        self.rng = random.Random(soak.args.seed * 1000 + index)
        self.name = ""
        self.players: list[SoakPlayer] = []
        self.ledger: dict[int, bytes] = {}

    async def run(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < deadline - 5 and not self.soak.stopping.is_set():
            await self.run_generation(min(deadline, loop.time() + self.soak.args.room_seconds))

    async def run_generation(self, end_at: float) -> None:
        loop = asyncio.get_running_loop()
        tally = self.soak.tally
        self.name = f"soak-{self.index}-{self.generation}"
        self.generation += 1
        self.ledger = {}
        self.players = []
        self.next_name = 0
        for _ in range(2):          # the anchor and a second player start the room
            await self.add_player()
        try:
            stopping = self.soak.stopping
            while loop.time() < end_at and not stopping.is_set():
                pause = min(self.rng.expovariate(1.0 / self.soak.args.churn_interval),
                            max(0.0, end_at - loop.time()))
                try:
                    await asyncio.wait_for(stopping.wait(), pause)
                except asyncio.TimeoutError:
                    pass
                if loop.time() < end_at and not stopping.is_set():
                    await self.churn_once()
            await self.finish()
        finally:
            for player in self.players:
                await player.stop_playing()
                if player.client is not None and player.state == "active":
                    await player.client.close(leave=False)
        tally.rooms_completed += 1

    async def add_player(self) -> None:
        player = SoakPlayer(f"p{self.next_name}", self)
        self.next_name += 1
        self.players.append(player)
        await self.connect(player, "join")

    async def connect(self, player: SoakPlayer, action: str) -> None:
        tally = self.soak.tally
        tally.count(tally.actions, action)
        try:
            await player.join()
        except RelayError as error:
            if error.code in EXPECTED_REFUSALS:
                tally.count(tally.refusals, error.code)
            else:
                tally.client_errors.append(f"{self.name}/{player.name} {action}: {error}")
            player.state = "retired"
            if player.client is not None and player.client.driver is not None:
                player.client.driver.close()

    async def churn_once(self) -> None:
        anchor, *others = self.players
        active = [p for p in others if p.state == "active"]
        away = [p for p in others if p.state in ("left", "vanished")]
        choices = ["join"] if len(active) + len(away) < self.soak.args.capacity else []
        choices += ["leave", "vanish"] * bool(active) + ["reconnect", "reconnect"] * bool(away)
        if not choices:
            return
        action = self.rng.choice(choices)
        if action == "join":
            await self.add_player()
        elif action == "reconnect":
            await self.connect(self.rng.choice(away), "reconnect")
        else:
            player = self.rng.choice(active)
            self.soak.tally.count(self.soak.tally.actions, action)
            await (player.leave() if action == "leave" else player.vanish())

    async def finish(self) -> None:
        """End the room; everyone still in it must reach its final frame."""
        tally = self.soak.tally
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.soak.relay.end_room, self.name)
        for player in self.players:
            if player.state != "active":
                continue
            try:
                await asyncio.wait_for(asyncio.shield(player.task), timeout=15)
            except asyncio.TimeoutError:
                pass
            client = player.client
            tally.players_checked_at_end += 1
            if client.final_frames is None:
                tally.unexpected_disconnects.append(f"{self.name}/{player.name}: never saw the room end")
            elif player.expected < client.final_frames:
                tally.frames_lost += client.final_frames - player.expected
                tally.client_errors.append(f"{self.name}/{player.name}: stopped at frame "
                                           f"{player.expected} of {client.final_frames}")


class Soak:
    def __init__(self, args: argparse.Namespace, relay: RelayProcess):
        self.args = args
        self.relay = relay
        self.tally = Tally()
        self.samples: list[dict] = []
        self.netem: Optional[Netem] = None
        self.started = 0.0
        self.max_stall = 0.0
        self.stalls = 0
        self.stopping = asyncio.Event()
        """Set by SIGINT/SIGTERM: the rooms end now, are checked, and the soak reports."""

    def sample(self) -> dict:
        pid = self.relay.process.pid
        health = self.relay.get_json("/health")
        point = {"t": round(time.monotonic() - self.started, 1), "rss_kib": rss_kib(pid),
                 "fds": open_fds(pid), "peers": health["peers"], "rooms": health["rooms"]}
        self.samples.append(point)
        return point

    async def watch_loop(self) -> None:
        """How long this process's event loop (clients and link emulator) stalls: the relay is
        judged by timeouts that a starved client process would cause on its own."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.1)
            stall = loop.time() - before - 0.1
            self.max_stall = max(self.max_stall, stall)
            if stall > 1.0:
                self.stalls += 1

    async def sampler(self) -> None:
        """A sample every --sample-seconds on a fixed schedule from the start: the time a sample
        takes (a /health request, /proc reads) must not push later samples out of the run."""
        loop = asyncio.get_running_loop()
        first = loop.time()
        for index in itertools.count(1):
            point = await loop.run_in_executor(None, self.sample)
            if self.args.progress:
                print(f"[{point['t']:7.0f} s] rss {point['rss_kib']} KiB  fds {point['fds']}  "
                      f"peers {point['peers']}  rooms {point['rooms']}  frames {self.tally.frames}  "
                      f"lost {self.tally.frames_lost}  disconnects {len(self.tally.unexpected_disconnects)}  "
                      f"client stall max {self.max_stall:.2f} s", flush=True)
            await asyncio.sleep(max(0.0, first + index * self.args.sample_seconds - loop.time()))

    async def run(self) -> None:
        args = self.args
        loop = asyncio.get_running_loop()
        link = LinkSettings(loss=args.loss, delay=args.delay, jitter=args.jitter)
        self.netem = Netem(("127.0.0.1", 0), ("127.0.0.1", self.relay.udp_port), up=link, down=link,
                           seed=args.seed, idle_timeout=max(10.0, 2 * args.reconnect_grace))
        await self.netem.start()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stopping.set)
        self.started = time.monotonic()
        sampler = loop.create_task(self.sampler())
        watcher = loop.create_task(self.watch_loop())
        deadline = loop.time() + args.seconds
        try:
            rooms = [SoakRoom(self, index) for index in range(args.rooms)]
            await asyncio.gather(*[room.run(deadline) for room in rooms])
            sampler.cancel()
            # The end of the churn, whatever the schedule's phase: the point leaks show first.
            await loop.run_in_executor(None, self.sample)
        finally:
            sampler.cancel()
            watcher.cancel()
            await self.netem.stop()


def report(args, soak: Soak, baseline: dict, final: dict, log: dict, drops: dict, exit_code: int) -> dict:
    tally = soak.tally
    warmup = max(10.0, min(300.0, 0.1 * args.seconds))
    steady = [s for s in soak.samples if s["t"] >= warmup] or soak.samples
    rss = [s["rss_kib"] for s in soak.samples]
    fds = [s["fds"] for s in soak.samples]
    summary = {
        "seconds": args.seconds,
        "mode": args.mode,
        "rooms": args.rooms,
        "link": {"loss_percent": args.loss, "delay_ms": args.delay, "jitter_ms": args.jitter},
        "machine": {"cpu": cpu_model(), "cores": usable_cores(), "python": platform.python_version()},
        "rooms_completed": tally.rooms_completed,
        "churn_actions": tally.actions,
        "expected_refusals": tally.refusals,
        "frames_received": tally.frames,
        "frames_lost": tally.frames_lost,
        "duplicates": tally.duplicates,
        "out_of_order": tally.out_of_order,
        "mismatches": tally.mismatches,
        "players_checked_at_room_end": tally.players_checked_at_end,
        "unexpected_disconnects": tally.unexpected_disconnects,
        "client_loop": {"max_stall_s": round(soak.max_stall, 3), "stalls_over_1s": soak.stalls},
        "client_errors": tally.client_errors,
        "rss_kib": {"start": rss[0] if rss else 0, "end": rss[-1] if rss else 0,
                    "max": max(rss, default=0), "warmup_s": warmup,
                    "slope_kib_per_min": round(slope_per_minute(
                        [(s["t"], s["rss_kib"]) for s in steady]), 2)},
        "fds": {"idle_start": baseline["fds"], "idle_end": final["fds"], "min": min(fds, default=0),
                "max": max(fds, default=0),
                "slope_per_min": round(slope_per_minute([(s["t"], s["fds"]) for s in steady]), 3)},
        "peers_idle_end": final["peers"],
        "server_drops": drops,
        "server_log": {"lines": log["lines"], "errors": log["errors"][:20],
                       "error_count": len(log["errors"]), "warnings": log["warnings"][:20],
                       "warning_count": len(log["warnings"])},
        "server_exit_code": exit_code,
        "samples": soak.samples,
    }
    failures = []
    if tally.frames_lost or tally.duplicates or tally.out_of_order or tally.mismatches:
        failures.append("frames lost, duplicated, reordered or different between clients")
    if tally.unexpected_disconnects or tally.client_errors:
        failures.append("clients in a room were disconnected or failed")
    if log["errors"]:
        failures.append("the server logged errors")
    if final["fds"] > baseline["fds"]:
        failures.append(f"the server holds {final['fds'] - baseline['fds']} more descriptors than at the start")
    if final["peers"]:
        failures.append(f"{final['peers']} peers left on an idle server")
    if exit_code != 0:
        failures.append(f"relay serve exited with {exit_code}")
    if tally.rooms_completed == 0 or tally.frames == 0:
        failures.append("nothing was played")
    summary["failures"] = failures
    summary["ok"] = not failures
    return summary


def print_summary(s: dict) -> None:
    print(f"soak: {s['mode']} mode, {s['seconds']:g} s, {s['rooms']} room slots, {s['rooms_completed']} rooms played; "
          f"link {s['link']['loss_percent']:g} % loss each way, {s['link']['delay_ms']:g} ms "
          f"+ {s['link']['jitter_ms']:g} ms jitter")
    if s.get("stopped_early"):
        print(f"stopped early by a signal after {s['elapsed_s']:g} s")
    print(f"machine: {s['machine']['cpu']}, {s['machine']['cores']} cores, Python {s['machine']['python']}")
    print(f"churn: {s['churn_actions']}  refusals (by design): {s['expected_refusals']}")
    print(f"frames received {s['frames_received']}  lost {s['frames_lost']}  duplicates "
          f"{s['duplicates']}  out of order {s['out_of_order']}  mismatches {s['mismatches']}  "
          f"(players checked at room end: {s['players_checked_at_room_end']})")
    rss, fds = s["rss_kib"], s["fds"]
    print(f"server RSS KiB: start {rss['start']}  end {rss['end']}  max {rss['max']}  slope "
          f"{rss['slope_kib_per_min']} KiB/min (after {rss['warmup_s']:g} s warm-up)")
    print(f"server fds: idle at start {fds['idle_start']}  idle at end {fds['idle_end']}  range "
          f"{fds['min']}..{fds['max']}  slope {fds['slope_per_min']}/min; peers left {s['peers_idle_end']}")
    print(f"server log: {s['server_log']['lines']} lines, {s['server_log']['error_count']} errors, "
          f"{s['server_log']['warning_count']} warnings; drops {s['server_drops']}")
    print(f"soak process event loop: longest stall {s['client_loop']['max_stall_s']} s, "
          f"{s['client_loop']['stalls_over_1s']} stalls over 1 s (the clients' side, not the relay)")
    for line in s["unexpected_disconnects"] + s["client_errors"] + s["server_log"]["errors"]:
        print(f"  ! {line}")
    print("PASS" if s["ok"] else "FAIL: " + "; ".join(s["failures"]))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to churn (default 60)")
    parser.add_argument("--rooms", type=int, default=3, help="rooms played at the same time")
    parser.add_argument("--capacity", type=int, default=4, help="players per room")
    parser.add_argument("--room-seconds", type=float, default=60.0,
                        help="a room is ended and replaced after this long")
    parser.add_argument("--churn-interval", type=float, default=2.0,
                        help="mean seconds between churn actions in a room")
    # The relay's default player timeout: at low priority on a busy machine the soak's own
    # clients may stall for seconds, and a shorter timeout would count that against the relay.
    parser.add_argument("--player-timeout", type=float, default=10.0)
    parser.add_argument("--reconnect-grace", type=float, default=30.0)
    parser.add_argument("--loss", type=float, default=10.0, help="percent, each way")
    parser.add_argument("--delay", type=float, default=20.0, help="ms, each way")
    parser.add_argument("--jitter", type=float, default=10.0, help="ms, each way")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=("open", "token"), default="token",
                        help="relay security mode: token (connect tokens, sealed packets) or open")
    parser.add_argument("--json", help="write the full result (with every sample) here")
    parser.add_argument("--progress", action="store_true", help="print every sample")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (log, replays)")
    args = parser.parse_args(argv)
    if args.seconds < 15 or args.rooms < 1 or args.capacity < 2 or args.room_seconds < 5:
        parser.error("--seconds >= 15, --rooms >= 1, --capacity >= 2, --room-seconds >= 5")

    import uvloop

    workdir = Path(tempfile.mkdtemp(prefix="relay-soak-"))
    relay = RelayProcess(workdir, args)
    relay.start()
    exit_code = None
    try:
        time.sleep(1.0)
        baseline = {"fds": open_fds(relay.process.pid), "peers": relay.get_json("/health")["peers"]}
        soak = Soak(args, relay)
        uvloop.run(soak.run())
        # Clients that vanished are timed out by now at the latest; then the server is idle.
        time.sleep(args.player_timeout + 2.0)
        final = {"fds": open_fds(relay.process.pid), "peers": relay.get_json("/health")["peers"]}
        soak.samples.append({"t": round(time.monotonic() - soak.started, 1),
                             "rss_kib": rss_kib(relay.process.pid), "fds": final["fds"],
                             "peers": final["peers"], "rooms": relay.get_json("/health")["rooms"]})
        drops = relay.drops()
    finally:
        exit_code = relay.stop()
    summary = report(args, soak, baseline, final, scan_log(relay.log_path), drops, exit_code)
    summary["stopped_early"] = soak.stopping.is_set()
    summary["elapsed_s"] = soak.samples[-1]["t"] if soak.samples else 0.0
    summary["log"] = str(relay.log_path) if args.keep else None
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print_summary(summary)
    if not args.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
