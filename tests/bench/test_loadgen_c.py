"""The C load generator (benchmarks/loadgen_c): its frame checks catch bad streams, its minimal
client (minimal.c) decodes and encodes the wire's byte-exact examples, it plays rooms against a
real ``relay serve`` without losing frames with either client (--client minimal, the default,
and --client library), and it speaks capacity.py's agent protocol. Built as capacity.py builds
it; a missing compiler or library is a failure."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.capacity import (  # noqa: E402
    C_CLIENT, LOADGEN_C, build_loadgen, c_compiler, least_squares_slope)

VECTORS = ROOT / "tests" / "vectors"


def free_port(kind=socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def loadgen(tmp_path_factory) -> Path:
    return build_loadgen(tmp_path_factory.mktemp("loadgen_c"))


@pytest.fixture
def relay_server(tmp_path):
    """``relay serve`` on loopback as capacity.py starts it: rooms of 8 that start full,
    replays off, no per-source handshake limit."""
    yield from serve_relay(tmp_path, {})


def serve_relay(tmp_path, settings: dict):
    udp, http = free_port(), free_port(socket.SOCK_STREAM)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **settings,
           "RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": str(udp),
           "RELAY_SERVER_HTTP_HOST": "127.0.0.1", "RELAY_SERVER_HTTP_PORT": str(http),
           "RELAY_SERVER_TICK_RATE": "30", "RELAY_SERVER_LOG_LEVEL": "warning",
           "RELAY_SERVER_DRAIN_TIMEOUT": "0", "RELAY_ROOMS_CAPACITY": "8",
           "RELAY_ROOMS_START_PLAYERS": "8", "RELAY_SECURITY_HANDSHAKE_RATE": "0",
           "RELAY_REPLAY_ENABLED": "false", "RELAY_REPLAY_DIRECTORY": str(tmp_path)}
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


def test_frame_checks_catch_gaps_duplicates_mismatches_and_foreign_inputs(tmp_path):
    """checks_test.c feeds the checks streams with a gap, duplicates, a room member's different
    frame, another player's input and a short window, and expects each to be caught."""
    binary = tmp_path / "checks_test"
    subprocess.run([c_compiler(), "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary),
                    str(LOADGEN_C / "checks_test.c"), str(LOADGEN_C / "checks.c")],
                   check=True, capture_output=True, text=True, timeout=120)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "checks_test: ok"


def test_a_missing_compiler_is_an_error_not_a_skip(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="no C compiler"):
        c_compiler()


def test_minimal_client_against_the_wire_vectors(tmp_path):
    """minimal_test.c decodes every packet of tests/vectors (handshake, DATA with every record
    kind, the malformed ones with their drop reason) with the minimal client's parser, answers
    CHALLENGE and ACCEPT as a client, re-encodes DATA headers from ack state, and checks its
    steady-state loop and the FRAME / INPUT examples of docs/RELAY_PROTOCOL.md section 15."""
    binary = tmp_path / "minimal_test"
    subprocess.run([c_compiler(), "-O2", "-std=gnu99", "-Wall", "-Wextra", "-Werror",
                    "-DRELAY_CLIENT_BUILDING", f"-I{C_CLIENT / 'include'}", f"-I{C_CLIENT / 'src'}",
                    f"-I{LOADGEN_C}", "-o", str(binary), str(LOADGEN_C / "minimal_test.c"),
                    str(LOADGEN_C / "minimal.c"), str(LOADGEN_C / "checks.c"),
                    *map(str, sorted((C_CLIENT / "src").glob("*.c"))), "-lsodium", "-lz", "-lm"],
                   check=True, capture_output=True, text=True, timeout=300)
    vectors = [v for name in ("handshake", "data", "malformed")
               for v in json.loads((VECTORS / f"{name}.json").read_text())["vectors"]]
    feed = "".join(f"{v['name']} {v['hex']}\n" for v in vectors)
    result = subprocess.run([str(binary)], input=feed, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "minimal_test: ok"
    outputs = [json.loads(line) for line in lines[:-1]]
    assert [o["name"] for o in outputs] == [v["name"] for v in vectors]
    join = "9401a76c6f6262792d31a5616c696365c2"         # [1, "lobby-1", "alice", false]
    reencoded = 0
    for vector, out in zip(vectors, outputs):
        decoded = vector.get("decoded")
        if decoded is None:
            assert out.get("drop") == vector["reason"], (vector["name"], out)
            continue
        fields = {k: v for k, v in out.items()
                  if k not in ("name", "response", "first_data", "reencoded")}
        assert len(fields) >= 2 and fields == {k: decoded[k] for k in fields}, (vector["name"], out)
        if decoded["type"] == "challenge":
            # CONNECT_RESPONSE: the CHALLENGE's bytes 4..27, then our ack delay, 33 ms
            assert out["response"] == "524c0103" + vector["hex"][8:56] + "2100"
        if decoded["type"] == "accept":
            # the first DATA: seq 0, nothing to ack, the JOIN as message 0 of CONTROL
            data = out["first_data"]
            assert data[:16] == "524c0106" + vector["hex"][16:24]
            assert data[16:32] == "00" * 8 and data[40:] == "000000" + "11" + join
        if "reencoded" in out:
            expected = vector["hex"]
            if vector["name"] == "data_non_minimal_varint":
                expected = expected.replace("8300616263", "03616263")   # senders: shortest form
            assert out["reencoded"] == expected, vector["name"]
            reencoded += 1
    assert reencoded >= 8


@pytest.mark.parametrize("client", ["minimal", "library"])
def test_standalone_plays_rooms_without_loss(loadgen, relay_server, client):
    out = subprocess.run([str(loadgen), "--server", f"127.0.0.1:{relay_server}", "--players", "64",
                          "--seconds", "3", "--json", "--max-lifetime", "60", "--client", client],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr + out.stdout
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert ("minimal client" in result["io"]) == (client == "minimal")
    if client == "minimal":
        # compact: one mc_player per player, no block, nothing refused or dropped
        assert result["client_bytes_allocated"] <= 2048 and result["player_bytes"] <= 4096
        assert result["catchup_blocks"] == 0 and result["transport_drops"] == 0
    assert result["all_running"] and result["checks_passed"]
    assert result["players"] == 64 and result["running"] == 64 and result["errors"] == 0
    assert result["lost_frames"] == 0 and result["gaps"] == 0 and result["duplicates"] == 0
    # Every frame was compared between the members of its room, and every input found.
    assert result["room_mismatches"] == 0 and result["room_frames_compared"] > 0
    # On a busy machine an input may reach the relay after its frame closed (the relay makes
    # it up): counted as missing, never as another's bytes.
    assert result["inputs_checked"] > 0 and result["inputs_foreign"] == 0
    assert result["inputs_missing"] < result["inputs_checked"] / 10
    assert 2.9 < result["seconds"] < 4 and result["frames"] >= 64 * 85
    latency = [result[f"latency_{q}_ms"] for q in ("p50", "p90", "p99", "max")]
    assert result["latency_samples"] > 0
    assert 0 < latency[0] <= latency[1] <= latency[2] <= latency[3] < 1000
    assert result["cpu"] > 0 and result["rss_per_player"] > 0


def test_library_players_connect_with_tokens_to_a_token_mode_relay(loadgen, tmp_path):
    """--tokens: player i connects with line i; every session packet is sealed; a player
    without a token of its own fails by name instead of connecting in the clear."""
    import base64

    from relay_core.token import generate_key, mint_token

    key = generate_key()
    keys = tmp_path / "keys.toml"
    keys.write_text(f'1 = "{base64.b64encode(key).decode()}"\n')
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("".join(mint_token(key, 1, f"tok-{i // 8}", f"p{i % 8}", 600.0).encode() + "\n"
                              for i in range(16)))
    server = serve_relay(tmp_path, {"RELAY_SECURITY_MODE": "token",
                                    "RELAY_SECURITY_KEYS_FILE": str(keys)})
    udp = next(server)
    try:
        def run(players: int):
            out = subprocess.run([str(loadgen), "--server", f"127.0.0.1:{udp}", "--players",
                                  str(players), "--seconds", "2", "--json", "--max-lifetime", "60",
                                  "--client", "library", "--room-prefix", "tok",
                                  "--tokens", str(tokens)],
                                 capture_output=True, text=True, timeout=90)
            return out, json.loads(out.stdout.strip().splitlines()[-1])

        out, result = run(16)
        assert out.returncode == 0, out.stderr + out.stdout
        assert result["running"] == 16 and result["errors"] == 0 and result["lost_frames"] == 0
        assert result["room_mismatches"] == 0 and result["frames"] >= 16 * 55
        # The tokens are spent: the same ones again are refused (token_used), never let in.
        out, result = run(8)
        assert out.returncode == 1 and result["running"] == 0 and result["errors"] == 8
    finally:
        next(server, None)
    with pytest.raises(subprocess.CalledProcessError):      # open-mode-only client
        subprocess.run([str(loadgen), "--client", "minimal", "--tokens", str(tokens)],
                       capture_output=True, check=True, timeout=30)


def test_agent_protocol_as_capacity_drives_it(loadgen, relay_server):
    proc = subprocess.Popen([str(loadgen), "--agent", "--server", f"127.0.0.1:{relay_server}",
                             "--max-lifetime", "60"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    def ask(message: dict) -> dict:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["ready"] and hello["pid"] == proc.pid and "IP_PKTINFO" in hello["io"]
        added = ask({"cmd": "add", "players": 16, "timeout": 15})
        assert added["ok"] and added["added"] == 16 and added["running"] == 16
        assert ask({"cmd": "bogus"})["ok"] is False
        assert ask({"cmd": "window_start"})["ok"]
        time.sleep(1.0)
        window = ask({"cmd": "window_end"})
        # The keys capacity.py's measure_step reads, and the C loader's own.
        for key in ("lost_frames", "short_players", "gaps", "disconnects", "errors", "running",
                    "error_samples", "worst_shortfall", "cpu", "io", "latency_p99_ms",
                    "room_mismatches"):
            assert key in window, key
        assert window["ok"] and window["lost_frames"] == 0 and window["room_mismatches"] == 0
        assert window["frames"] > 0 and 0.9 < window["seconds"] < 5
        assert ask({"cmd": "window_end"})["ok"] is False        # no window open
        stats = ask({"cmd": "stats"})
        assert stats["ok"] and stats["players"] == 16
        proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        proc.stdin.flush()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_refuses_a_server_off_loopback(loadgen):
    out = subprocess.run([str(loadgen), "--server", "192.0.2.1:7777", "--players", "8",
                          "--seconds", "1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "loopback" in out.stderr


def test_cost_growth_slope():
    assert least_squares_slope([1.0, 2.0, 4.0], [2.0, 3.0, 5.0]) == pytest.approx(1.0)
    assert least_squares_slope([1.0], [2.0]) is None


def test_capacity_points_mode_reports_cost_growth(tmp_path):
    """capacity.py --points with the C loader: a row per count, the slope, the JSON."""
    out_json = tmp_path / "points.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "capacity.py"), "--quick",
                           "--parts", "relay", "--points", "8,16", "--add-step", "8",
                           "--json", str(out_json)], capture_output=True, text=True, timeout=150,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out_json.read_text())
    assert report["settings"]["loader"] == "c" and report["settings"]["points"] == [8, 16]
    points = report["points"]
    assert points["error"] is None and [r["players"] for r in points["rows"]] == [8, 16]
    for row in points["rows"]:
        assert row["lost_frames"] == 0 and row["latency_p99_ms"] > 0
        assert row["server_us_per_player_tick"] == pytest.approx(
            row["server_user_us_per_player_tick"] + row["server_system_us_per_player_tick"],
            abs=0.002)
    assert points["slope_points"] == [8, 16]
    assert isinstance(points["slope_us_per_player_tick_per_1000_players"], float)
    assert "relay cost growth" in proc.stdout and "slope:" in proc.stdout
