"""benchmarks/tick_cost.py runs a relay in one process: every simulated player gets every
frame, and each phase of the server's work is timed (shape only, no figure is judged)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tick_cost_smoke_run_delivers_every_frame_and_times_each_phase(tmp_path):
    out = tmp_path / "tick.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tick_cost.py"), "--players", "24",
         "--ticks", "20", "--warmup", "30", "--repeat", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    best = json.loads(out.read_text())["best"]
    assert best["players"] == 24 and best["ticks"] == 20
    assert best["frames_received"] == best["frames_expected"] == 24 * 20
    phases = best["us_per_player_tick"]
    assert all(phases[name] > 0 for name in ("receive", "events", "tick", "flush"))
    assert abs(phases["total"] - sum(phases[name] for name in ("receive", "events", "tick", "flush"))) < 1e-6
    assert "us/player-tick" in result.stdout


def test_tick_cost_in_place_takes_the_players_datagrams_as_relay_serve_does(tmp_path):
    """--in-place: the datagrams go through a loopback socket and the server takes its players'
    DATA in the receive buffer (BatchSocket, Endpoint.receive_raw) and writes its own into the
    outbox; every frame still reaches every player."""
    out = tmp_path / "tick.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tick_cost.py"), "--players", "24",
         "--ticks", "20", "--warmup", "30", "--repeat", "1", "--in-place", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    best = json.loads(out.read_text())["best"]
    assert best["frames_received"] == best["frames_expected"] == 24 * 20
    assert best["datagrams_in_place"] >= 24 * 20          # at least an INPUT a player-tick
    assert "the kernel's receive included" in result.stdout


def test_tick_cost_refuses_a_room_smaller_than_one_room():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tick_cost.py"),
                             "--players", "4"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2 and "--players at least 8" in result.stderr
