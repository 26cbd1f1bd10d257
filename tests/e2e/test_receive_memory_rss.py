"""M4 (issue 17) in RSS: 300 connections each parking never-completed fragments stay within
receive_memory_limit plus a fixed overhead, and the memory comes back when they leave.

The pattern runs in a fresh interpreter (benchmarks/fragment_memory.py) so that RSS is
the endpoint's and nothing else's. Before each figure the probe collects garbage and calls
glibc's malloc_trim(0): glibc keeps freed heap pages for reuse instead of returning them, so
without it RSS after a release says little about what is still held.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "fragment_memory.py"
MB = 1024 * 1024


def probe(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def test_m4_pattern_stays_within_the_receive_budget_and_memory_comes_back():
    limit = 64 * MB
    figures = probe("--peers", "300", "--receive-memory-limit", str(limit))
    # Without the endpoint-wide budget these 300 connections held ~1.66 MB each (~500 MB).
    assert figures["drops"].get("receive_memory_full", 0) > 0
    assert limit - 2 * MB < figures["parked_used"] <= limit
    # What is counted is what RSS shows, give or take a fixed overhead.
    assert figures["rss_parked"] - figures["rss_before"] <= limit + 16 * MB
    # Everything comes back when they leave: the budget to 0, RSS to near its baseline.
    assert figures["used_after"] == 0
    assert figures["rss_after"] - figures["rss_before"] <= 8 * MB
