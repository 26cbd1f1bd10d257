"""The capacity benchmark's parts work: the C echo echoes, the load generators play without
losing frames, the ENet peer relay serves a room, and the report has its structure.

The benchmarks run here as programs, as capacity.py runs them, and no figure is
compared with a threshold: only correctness (echoes, frames in order without loss) and shape.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
HAVE_CC = shutil.which(os.environ.get("CC", "cc")) is not None
HAVE_ENET = importlib.util.find_spec("enet") is not None


def free_port(kind=socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def relay_server(tmp_path):
    """``relay serve`` on loopback with rooms that start at 8 players."""
    udp, http = free_port(), free_port(socket.SOCK_STREAM)
    env = dict(child_env(), RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(udp),
               RELAY_SERVER_HTTP_PORT=str(http), RELAY_SERVER_LOG_LEVEL="warning",
               RELAY_ROOMS_START_PLAYERS="8", RELAY_REPLAY_ENABLED="false",
               RELAY_REPLAY_DIRECTORY=str(tmp_path), RELAY_SERVER_DRAIN_TIMEOUT="0")
    env.pop("RELAY_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/ready", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"relay serve did not start: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
    yield udp
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler (cc)")
def test_c_echo_compiles_and_echoes(tmp_path):
    binary = tmp_path / "udp_echo"
    subprocess.run([shutil.which(os.environ.get("CC", "cc")), "-O2", "-Wall", "-o", str(binary),
                    str(BENCH / "udp_echo.c")], check=True, timeout=120)
    server = subprocess.Popen([str(binary), "serve", "--port", "0", "--seconds", "20",
                               "--reply-size", "150"], stdout=subprocess.PIPE, text=True)
    try:
        ready = server.stdout.readline().split()
        assert ready[0] == "READY" and int(ready[1]) > 0
        load = subprocess.run([str(binary), "load", "--port", ready[1], "--sockets", "4",
                               "--window", "4", "--size", "48", "--seconds", "0.5",
                               "--warmup", "0.1"], capture_output=True, text=True, timeout=30)
        lines = load.stdout.strip().splitlines()
        assert lines[0] == "WINDOW"
        result = json.loads(lines[-1])
        assert result["echoes"] > 0
        assert result["lost"] == 0 and result["corrupt"] == 0
        assert result["size"] == 48
        # The C loader's address mix: 300 flows, each from its own 127.a.b.c, over 4 sockets;
        # every reply must come back to its flow's own address.
        load = subprocess.run([str(binary), "load", "--port", ready[1], "--sources", "300",
                               "--sockets", "4", "--size", "48", "--seconds", "0.5",
                               "--warmup", "0.1"], capture_output=True, text=True, timeout=30)
        result = json.loads(load.stdout.strip().splitlines()[-1])
        assert result["sources"] == 300 and result["sockets"] == 4 and result["window"] == 1
        assert result["echoes"] > 300
        assert result["lost"] == 0 and result["corrupt"] == 0
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=10)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["echoes"] > 0
    # Replies are --reply-size bytes whatever the request's size.
    assert summary["bytes_out"] == 150 * summary["echoes"]
    assert summary["bytes_in"] == 48 * summary["echoes"]


def test_loadgen_plays_a_room_without_losing_frames(relay_server):
    out = subprocess.run([sys.executable, str(BENCH / "loadgen.py"), "--server",
                          f"127.0.0.1:{relay_server}", "--players", "8", "--seconds", "1.5",
                          "--json"], capture_output=True, text=True, timeout=60, env=child_env(),
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr + out.stdout
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["all_running"] and result["players"] == 8 and result["running"] == 8
    assert result["errors"] == 0 and result["disconnects"] == 0
    assert result["lost_frames"] == 0 and result["gaps"] == 0 and result["duplicates"] == 0
    assert result["frames"] > 0 and result["inputs_sent"] > 0
    # Sampled frames carried the sending player's own input.
    assert result["inputs_checked"] > 0 and result["inputs_missing"] == 0


def test_loadgen_agent_protocol(relay_server):
    """The stdin/stdout protocol capacity.py drives: add, window_start, window_end, quit."""
    proc = subprocess.Popen([sys.executable, str(BENCH / "loadgen.py"), "--agent", "--server",
                             f"127.0.0.1:{relay_server}", "--max-lifetime", "60"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env(), cwd=ROOT)
    try:
        assert json.loads(proc.stdout.readline())["ready"]
        proc.stdin.write(json.dumps({"cmd": "add", "players": 8, "timeout": 15}) + "\n")
        proc.stdin.flush()
        added = json.loads(proc.stdout.readline())
        assert added["ok"] and added["running"] == 8
        for cmd in ("window_start", "window_end"):
            if cmd == "window_end":
                time.sleep(1.0)
            proc.stdin.write(json.dumps({"cmd": cmd}) + "\n")
            proc.stdin.flush()
            answer = json.loads(proc.stdout.readline())
            assert answer["ok"]
        assert answer["lost_frames"] == 0 and answer["frames"] > 0
        assert 0.9 < answer["seconds"] < 5
        proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        proc.stdin.flush()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not HAVE_ENET, reason="pyenet is not installed (pip install pyenet)")
def test_enet_relay_serves_a_room():
    server = subprocess.Popen([sys.executable, str(BENCH / "enet_relay.py"), "serve", "--port", "0",
                               "--seconds", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=child_env(), cwd=ROOT)
    try:
        port = json.loads(server.stdout.readline())["port"]
        load = subprocess.run([sys.executable, str(BENCH / "enet_relay.py"), "load", "--server",
                               f"127.0.0.1:{port}", "--players", "8", "--seconds", "1", "--json"],
                              capture_output=True, text=True, timeout=60, env=child_env(), cwd=ROOT)
        assert load.returncode == 0, load.stderr + load.stdout
        result = json.loads(load.stdout.strip().splitlines()[-1])
        assert result["all_running"] and result["running"] == 8
        assert result["lost_frames"] == 0 and result["gaps"] == 0 and result["errors"] == 0
        server.stdin.write("stats\n")
        server.stdin.flush()
        stats = json.loads(server.stdout.readline())
        assert stats["frames_closed"] > 0 and stats["inputs"] > 0 and stats["ticks"] > 0
        assert len(stats["lateness_cumulative"]) == len(stats["lateness_bounds"]) + 1
        assert stats["lateness_cumulative"][-1] == stats["ticks"]
        server.stdin.write("quit\n")
        server.stdin.flush()
        assert server.wait(timeout=10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler (cc)")
def test_quick_report_and_json_structure(tmp_path):
    out_json = tmp_path / "capacity.json"
    parts = "relay,echo,enet" if HAVE_ENET else "relay,echo"
    proc = subprocess.run([sys.executable, str(BENCH / "capacity.py"), "--quick", "--parts", parts,
                           "--json", str(out_json)], capture_output=True, text=True, timeout=150,
                          env=child_env(), cwd=ROOT)
    # 0: every target met, 1: a target failed (figures on a CI machine are not judged here).
    assert proc.returncode in (0, 1), proc.stderr + proc.stdout
    report = json.loads(out_json.read_text())
    assert {"machine", "settings", "ramps", "summary", "targets", "echo", "command"} <= set(report)
    assert report["settings"]["tick_rate"] == 30 and report["settings"]["room_size"] == 8
    relay = report["ramps"]["relay"]
    assert relay["steps"] and relay["error"] is None
    step_keys = {"players", "passed", "reasons", "p99_lateness_ms", "lost_frames", "server_cpu_share",
                 "loader_cpu_share", "datagrams_in_per_s", "datagrams_out_per_s", "bytes_in_per_s",
                 "bytes_out_per_s", "rss_per_player", "ccu_per_core", "server_user_share",
                 "server_system_share", "kernel_bound_ccu_per_core", "late_input_share",
                 "loader_bound"}
    for step in relay["steps"]:
        assert step_keys <= set(step)
        assert step["players"] % 8 == 0
        # The server's CPU splits into its own time and the kernel's; the kernel's alone
        # allows at least the CCU per core measured.
        assert abs(step["server_user_share"] + step["server_system_share"]
                   - step["server_cpu_share"]) < 0.001
        if step["server_system_share"] > 0:
            assert step["kernel_bound_ccu_per_core"] >= step["ccu_per_core"]
        assert step["lost_frames"] == 0           # frames are never lost at 8-16 players
        # 8-16 players are nothing for the load generator: no input reaches the relay late.
        assert not step["loader_bound"] and step["late_input_share"] == 0
    echo = report["echo"]
    assert "error" not in echo and echo["echoes_per_s"] > 0 and echo["lost"] == 0
    assert echo["ceiling_ccu_per_core"] > 0
    names = [t["target"] for t in report["targets"]]
    assert len(names) == 3 and any("echo" in n for n in names) and any("ENet" in n for n in names)
    assert all(t["result"] in ("PASS", "FAIL", "n/a") for t in report["targets"])
    if HAVE_ENET:
        assert report["ramps"]["enet"]["steps"]
    text = proc.stdout
    for heading in ("relay:", "echo (C, recvmmsg/sendmmsg", "targets:"):
        assert heading in text
    # The summary of the highest passing step, when one passed: on a shared machine a quick
    # step (30 ticks) can fail its lateness criterion on one late wake-up.
    if any(step["passed"] for step in relay["steps"]):
        assert "highest passing" in text and "the kernel's share alone caps CCU per core" in text
        assert "echo with the relay load's address mix" in text
        assert report["echo_address_mix"]["lost"] == 0 and report["echo_address_mix"]["corrupt"] == 0
    else:
        assert "highest passing: none (the first step failed)" in text
    assert any(word in text for word in ("PASS", "FAIL"))


def load_capacity_module():
    spec = importlib.util.spec_from_file_location("capacity_bench", BENCH / "capacity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module         # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("players, seconds, late, bound", [
    (1408, 8.0, 18, False),         # the seventh run's 1 408 step: 0.005 % late
    (1536, 8.0, 1886, True),        # its 1 536 step: 0.5 %, the loader at 90 % of its core
    (8, 2.0, 0, False),
    (8, 2.0, 1, True),              # one input in 480 is over 0.1 %
])
def test_a_step_whose_loader_falls_behind_is_flagged(players, seconds, late, bound):
    capacity = load_capacity_module()
    share, loader_bound = capacity.loader_lateness(late, players, seconds)
    assert loader_bound is bound
    assert share == pytest.approx(late / (players * 30 * seconds))


@pytest.mark.parametrize("argv", [["--security", "token"],
                                  ["--security", "token", "--loader", "python"],
                                  ["--security", "token", "--loader-client", "minimal"]])
def test_token_mode_needs_the_library_client(argv, capsys):
    """Only the C library's client speaks token mode: any other loader is refused up front
    (exit 2) rather than measuring a relay whose players cannot connect."""
    capacity = load_capacity_module()
    assert capacity.main(["--quick", "--parts", "relay"] + argv) == 2
    assert "needs --loader c --loader-client library" in capsys.readouterr().err


def test_the_sealed_target_compares_counts_measured_in_both_modes_without_loss():
    capacity = load_capacity_module()

    def points(*rows):
        return {"rows": [{"players": players, "server_us_per_player_tick": cost, "lost_frames": lost}
                         for players, cost, lost in rows]}

    open_ = points((1024, 8.0, 0), (2048, 8.0, 0), (4096, 9.0, 5))
    passed = capacity.sealed_target(open_, points((1024, 9.0, 0), (2048, 9.5, 0), (4096, 20.0, 0)))
    assert passed["result"] == "PASS" and passed["value"] == round(8.0 / 9.5, 3)
    assert "4096" not in passed["detail"]           # lost frames in open mode: not compared
    failed = capacity.sealed_target(open_, points((1024, 9.0, 0), (2048, 10.5, 0)))
    assert failed["result"] == "FAIL" and failed["value"] == round(8.0 / 10.5, 3)
    assert capacity.sealed_target(open_, points((1024, 9.0, 3)))["result"] == "n/a"


def test_both_security_modes_need_points(capsys):
    capacity = load_capacity_module()
    assert capacity.main(["--quick", "--parts", "relay", "--loader-client", "library",
                          "--security", "both"]) == 2
    assert "--security both compares at --points" in capsys.readouterr().err
