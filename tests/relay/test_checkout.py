"""Running from a source checkout: an unbuilt tree (or one shadowing a `pip install .`) fails
with a one-line hint; `relay bench` finds the benchmarks or says exactly what to run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import relay
from relay import cli

ROOT = Path(__file__).resolve().parents[2]


def unbuilt_checkout(tmp_path: Path) -> Path:
    """The repository's Python and Cython sources without the compiled modules."""
    checkout = tmp_path / "checkout"
    skip = shutil.ignore_patterns("*.so", "*.c", "__pycache__", "*.html")
    for package in ("relay", "relay_core"):
        shutil.copytree(ROOT / package, checkout / package, ignore=skip)
    return checkout


def python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=60)


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_an_unbuilt_checkout_says_how_to_build(tmp_path):
    checkout = unbuilt_checkout(tmp_path)
    result = python("import relay.client", checkout)
    assert result.returncode == 1
    line = last_line(result)
    assert line.startswith("ImportError: relay: the compiled modules of the source tree")
    assert str(checkout) in line and "relay_core.endpoint" in line
    assert "python setup.py build_ext --inplace" in line
    assert "No module named" not in result.stderr


def test_a_checkout_shadowing_an_installed_relay_says_so(tmp_path):
    # The installed copy: the built packages of this repository, on PYTHONPATH.
    site = tmp_path / "site"
    site.mkdir()
    for package in ("relay", "relay_core"):
        (site / package).symlink_to(ROOT / package)
    checkout = unbuilt_checkout(tmp_path)
    result = python("import relay.client", checkout, PYTHONPATH=str(site))
    assert result.returncode == 1
    line = last_line(result)
    assert f"the source tree {checkout} shadows the installed relay ({site})" in line
    assert "run from another directory" in line
    # From anywhere else the installed relay is the one imported.
    assert python("import relay.client", tmp_path, PYTHONPATH=str(site)).returncode == 0


def test_a_built_tree_imports():
    assert python("import relay.client, relay.server", ROOT).returncode == 0


@pytest.fixture
def installed_elsewhere(tmp_path, monkeypatch):
    """relay as if installed in site-packages: no benchmarks/ beside the package."""
    fake = tmp_path / "site-packages" / "relay" / "__init__.py"
    monkeypatch.setattr(relay, "__file__", str(fake))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_bench_without_benchmarks_prints_the_command(installed_elsewhere, capsys):
    assert cli.main(["bench", "loss"]) == 2
    err = capsys.readouterr().err
    assert "python benchmarks/loss_latency.py" in err and "\n" not in err.strip()
    with pytest.raises(SystemExit):
        cli.main(["bench", "capacity", "--help"])
    assert "python benchmarks/capacity.py --help" in " ".join(capsys.readouterr().out.split())


def test_installed_relay_run_in_a_checkout_finds_its_benchmarks(installed_elsewhere, capsys,
                                                                monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        cli.main(["bench", "loss", "--help"])
    out = capsys.readouterr().out
    assert "--count" in out and "--loss PCT" in out


def test_bench_help_forwards_the_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "loss", "--help"])
    assert "--count" in capsys.readouterr().out
