"""CI builds the container image and smoke-tests it: tools/ci_image.sh, run by .ci/run.

The build itself (minutes) runs in .ci/run, not here; these tests keep the wiring honest: .ci/run
installs podman, runc and mmdebstrap and runs the script, the script is valid bash, and a host
without podman fails with one line instead of skipping.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from test_deploy import ROOT

SCRIPT = ROOT / "tools" / "ci_image.sh"
CI = ROOT / ".ci" / "run"


def test_ci_installs_the_container_tools_and_runs_the_image_smoke_test():
    text = CI.read_text()
    packages = re.search(r'^APT_PACKAGES="([^"]*)"', text, re.M).group(1).split()
    assert {"podman", "runc", "mmdebstrap"} <= set(packages)
    commands = [line.strip() for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert "tools/ci_image.sh" in commands, "CI must run the image smoke test"
    assert commands.index("tools/ci_image.sh") > commands.index("python -m pytest -q")


def test_script_is_executable_valid_bash():
    assert os.access(SCRIPT, os.X_OK)
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        result = subprocess.run([shellcheck, "-S", "warning", str(SCRIPT)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stdout


def test_script_follows_the_recipe_that_works_without_a_registry():
    text = SCRIPT.read_text()
    for needle in ("CONTAINERS_CONF", "default_ulimits = []", 'cgroup_manager = "cgroupfs"',
                   "--isolation chroot", "--pull=never", "--build-arg PYTHON_IMAGE=",
                   "--runtime runc run", "--network=host", "stand-in for python:3.11-slim",
                   "podman image exists", "RELAY_SECURITY_KEYS_FILE", "RELAY_SECURITY_ADMIN_TOKEN_FILE",
                   "--signal TERM", "podman wait"):
        assert needle in text, needle


def test_a_host_without_podman_fails_with_one_line(tmp_path: Path):
    """Only the few tools the script needs before its first check are on PATH: no podman."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "date", "id", "mktemp", "rm"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    result = subprocess.run([shutil.which("bash"), str(SCRIPT)], capture_output=True, text=True,
                            timeout=60, env={"PATH": str(bin_dir)})
    assert result.returncode == 1, result.stdout + result.stderr
    failures = [line for line in result.stderr.splitlines() if line.startswith("ci_image: FAIL")]
    assert len(failures) == 1, result.stderr
    assert "podman not installed" in failures[0] or "run as root" in failures[0], failures[0]
