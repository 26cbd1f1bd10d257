"""Static checks as tests: ruff and mypy with the configuration in pyproject.toml pass, so that
`python -m pytest` alone catches a lint or type error. A missing tool fails, never skips."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_passes():
    result = run("ruff", "check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_passes(tmp_path):
    # A fresh cache: an incremental cache shared with other runs can report stale results.
    result = run("mypy", "--cache-dir", str(tmp_path / "mypy-cache"))
    assert result.returncode == 0, result.stdout + result.stderr
