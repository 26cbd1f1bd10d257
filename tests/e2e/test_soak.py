"""The soak benchmark (benchmarks/soak.py) runs 45 s of churn at 10 % loss per security mode
and passes.

The figures it prints (RSS slope, descriptors) are for docs/BENCHMARKS.md; this test asserts
only on correctness: no lost frame, no error in the server's log, no descriptor or peer left
behind, and that the churn it claims to do actually happened.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOAK = ROOT / "benchmarks" / "soak.py"


@pytest.mark.parametrize("mode", ["token", "open"])
def test_churn_at_ten_percent_loss_loses_no_frame_and_leaks_nothing(tmp_path, mode):
    out = tmp_path / "soak.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, str(SOAK), "--seconds", "45", "--rooms", "2",
                          "--room-seconds", "20", "--player-timeout", "3",
                          "--reconnect-grace", "8", "--mode", mode, "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.exists(), run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert run.returncode == (0 if result["ok"] else 1)
    assert result["ok"], run.stdout
    assert result["mode"] == mode
    # Every kind of churn happened, and rooms were ended and replaced.
    assert {"join", "leave", "vanish", "reconnect"} <= set(result["churn_actions"]), result["churn_actions"]
    assert result["rooms_completed"] >= 4
    assert result["players_checked_at_room_end"] >= 4
    assert result["frames_received"] > 2 * 30 * 40
    assert result["frames_lost"] == result["duplicates"] == result["mismatches"] == 0
    assert result["server_log"]["error_count"] == 0 and result["server_exit_code"] == 0
    assert result["fds"]["idle_end"] <= result["fds"]["idle_start"]
    assert result["peers_idle_end"] == 0
    assert len(result["samples"]) >= 10
    assert all(s["rss_kib"] > 0 and s["fds"] > 0 for s in result["samples"])
