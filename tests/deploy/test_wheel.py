"""The image recipe, run as far as a machine without a Docker engine allows.

The Dockerfile's builder stage is replayed on the host: the files its COPY instructions take
from the build context (filtered through .dockerignore, so no in-tree .so/.c/build/ can leak
in) are copied into a clean directory, the project wheel is built there with
``pip wheel --no-deps``, the dependency wheels with ``pip wheel -r`` from pyproject.toml, and
the runtime stage's ``pip install --no-index --find-links WHEELS relay`` goes into a fresh venv.
That venv's ``relay serve`` must come up ready, serve /health and /metrics, record a replay
where RELAY_REPLAY_DIRECTORY says, and exit 0 on SIGTERM.

The wheel is built once per module (it compiles the Cython core: ~40 s on two cores).
"""
from __future__ import annotations

import importlib.machinery
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from test_dockerfile import DOCKERFILE, REPO, DockerIgnore, parse_dockerfile, shell_commands

BUILD_TIMEOUT = 600
DRAIN_S = 3
"""SIGTERM drains first: matches may go on this long (the server's default is 30 s). The bots'
room is still running then, so the drain ends it at this deadline."""


def _clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without what would point Python at another environment or leak
    RELAY_* settings into the server (pip's own settings stay: they say how to reach PyPI)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RELAY_")
           and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                         "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def _run(args, cwd, timeout=BUILD_TIMEOUT, **extra_env) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(**extra_env),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (f"{shlex.join(map(str, args))} exited {result.returncode}\n"
                                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def build_context_copy(destination: Path) -> Path:
    """Lay out what the builder stage's WORKDIR holds when it runs `pip wheel ... .`: each
    COPY (not --from) of the builder, taken from the repository through .dockerignore."""
    builder = parse_dockerfile(DOCKERFILE.read_text()).stage("builder")
    ignore = DockerIgnore.from_file()
    workdir = PurePosixPath("/")
    for instruction in builder.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = workdir / instruction.value
        if instruction.keyword != "COPY" or "from" in instruction.flags:
            continue
        words = instruction.exec_form() or shlex.split(instruction.value)
        sources, target = words[:-1], workdir / words[-1]
        relative = target.relative_to(workdir) if target.is_relative_to(workdir) else None
        assert relative is not None, f"COPY outside the WORKDIR {workdir}: {instruction}"
        for source in sources:
            origin = REPO / source
            assert origin.exists() and not ignore.excluded(source.rstrip("/")), instruction
            if origin.is_file():
                into = destination / relative
                into = into / origin.name if words[-1].endswith("/") or len(sources) > 1 else into
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into)
                continue
            for path in sorted(origin.rglob("*")):    # a directory: its contents, like COPY
                context_path = path.relative_to(REPO).as_posix()
                if path.is_dir() or ignore.excluded(context_path):
                    continue
                into = destination / relative / path.relative_to(origin)
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into)
    return destination


def runtime_requirements() -> list[str]:
    """What the builder's dependency layer feeds to `pip wheel -r`."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def _dockerfile_requirements(context: Path) -> str:
    """Run the builder's own `python -c ... > requirements.txt` step in the context copy."""
    builder = parse_dockerfile(DOCKERFILE.read_text()).stage("builder")
    [command] = [c for run in builder.all("RUN") for c in shell_commands(run)
                 if "tomllib" in c and ">" in c]
    words = shlex.split(command)
    words = words[:words.index(">")]
    assert words[:2] == ["python", "-c"], command
    return _run([sys.executable, "-c", words[2]], cwd=context).stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The builder stage: the project wheel (compiled) and its dependency wheels."""
    root = tmp_path_factory.mktemp("image-build")
    context = build_context_copy(root / "src")
    leaked = [p for p in context.rglob("*") if p.suffix in (".so", ".c") or p.name == "build"]
    assert not leaked, f"build artefacts in the build context: {leaked}"
    out = root / "wheels"
    requirements = root / "requirements.txt"
    requirements.write_text(_dockerfile_requirements(context))
    assert requirements.read_text().split() == runtime_requirements()
    _run([sys.executable, "-m", "pip", "wheel", "-w", out, "-r", requirements], cwd=root)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, "."], cwd=context)
    return out


@pytest.fixture(scope="module")
def venv(wheels, tmp_path_factory) -> Path:
    """The runtime stage: a fresh interpreter environment, the wheels installed offline."""
    root = tmp_path_factory.mktemp("runtime")
    _run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    python = root / "venv" / "bin" / "python"
    # Like the image: nothing but the built wheels (no pip configuration, no other links).
    _run([python, "-m", "pip", "install", "--no-index", "--find-links", wheels, "relay"], cwd=root,
         PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(wheels))
    _run([python, "-m", "pip", "check"], cwd=root)
    return root / "venv"


def project_wheel(wheels: Path) -> Path:
    [wheel] = wheels.glob("relay-*.whl")
    return wheel


def core_modules() -> list[str]:
    return sorted(p.stem for p in (REPO / "relay_core").glob("*.pyx"))


def test_the_project_wheel_is_a_platform_wheel_with_the_compiled_core(wheels):
    wheel = project_wheel(wheels)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name.startswith(f"relay-{version}-cp311-cp311-"), wheel.name
    assert not wheel.name.endswith("-none-any.whl"), "the core was not compiled"
    names = zipfile.ZipFile(wheel).namelist()
    for module in core_modules():
        assert any(n.startswith(f"relay_core/{module}.cpython-311") and n.endswith(".so")
                   for n in names), f"relay_core/{module} is not compiled into the wheel"
    assert "relay/cli.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "relay = relay.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_every_dependency_has_a_wheel_for_the_offline_install(wheels):
    names = {p.name.split("-")[0].lower().replace("_", "-") for p in wheels.glob("*.whl")}
    for requirement in runtime_requirements():
        name = requirement.split(";")[0]
        for separator in "<>=!~[ ":
            name = name.split(separator)[0]
        assert name.lower().replace("_", "-") in names, f"no wheel for {requirement}"


def test_installed_core_is_the_compiled_one_inside_the_venv(venv, tmp_path):
    python = venv / "bin" / "python"
    script = ("import importlib, json; print(json.dumps({m: importlib.import_module("
              "'relay_core.' + m).__file__ for m in %r}))" % core_modules())
    files = json.loads(_run([python, "-c", script], cwd=tmp_path).stdout)
    site = (venv / "lib").resolve()
    for module, file in files.items():
        path = Path(file).resolve()
        assert path.is_relative_to(site), f"relay_core.{module} imported from {file}"
        assert file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), file
    endpoint = _run([python, "-c", "import relay_core.endpoint as e; print(e.__file__)"],
                    cwd=tmp_path).stdout.strip()
    assert Path(endpoint).resolve() == Path(files["endpoint"]).resolve()
    info = _run([venv / "bin" / "relay", "info"], cwd=tmp_path).stdout
    assert "relay_core compiled extension: " + endpoint in info


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_relay_serve_from_the_installed_wheel(venv, tmp_path):
    udp_port, http_port = _free_port(socket.SOCK_DGRAM), _free_port(socket.SOCK_STREAM)
    replays = tmp_path / "volume" / "replays"       # not ./replays, the default: created by the server
    env = _clean_env(RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(udp_port),
                     RELAY_SERVER_HTTP_PORT=str(http_port), RELAY_REPLAY_DIRECTORY=str(replays),
                     RELAY_SERVER_LOG_FORMAT="json", RELAY_SERVER_DRAIN_TIMEOUT=str(DRAIN_S))
    base = f"http://127.0.0.1:{http_port}"
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        process = subprocess.Popen([str(venv / "bin" / "relay"), "serve"], cwd=tmp_path, env=env,
                                   stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, \
                f"relay serve exited {process.returncode}:\n{stderr.read_text()[-4000:]}"
            try:
                status, _ = _get(f"{base}/ready")
            except OSError:
                status = None
            if status == 200:
                break
            assert time.monotonic() < deadline, \
                f"/ready not 200 within 30 s (last {status}):\n{stderr.read_text()[-4000:]}"
            time.sleep(0.2)

        # The image's HEALTHCHECK one-liner, run with the venv's interpreter, passes.
        healthcheck = parse_dockerfile(DOCKERFILE.read_text()).final.last("HEALTHCHECK")
        probe = json.loads(healthcheck.value[3:].strip())
        assert probe[:2] == ["python", "-c"]
        subprocess.run([str(venv / "bin" / "python"), "-c", probe[2]], cwd=tmp_path,
                       env=dict(env, RELAY_SERVER_HTTP_PORT=str(http_port)), timeout=10,
                       check=True)

        status, body = _get(f"{base}/health")
        health = json.loads(body)
        assert status == 200 and health["status"] == "ok" and health["draining"] is False
        assert health["version"] == tomllib.loads(
            (REPO / "pyproject.toml").read_text())["project"]["version"]

        # A short bot game: a room runs, so a replay is written to RELAY_REPLAY_DIRECTORY.
        bot = _run([venv / "bin" / "relay", "bot", "--server", f"127.0.0.1:{udp_port}",
                    "--seconds", "1", "--json"], cwd=tmp_path, timeout=60)
        summary = json.loads(bot.stdout)
        assert summary["frames_received"] > 0 and not summary["errors"], summary

        status, body = _get(f"{base}/metrics")
        metrics = body.decode()
        assert status == 200 and "relay_ticks_total" in metrics
        ticks = [float(line.split()[-1]) for line in metrics.splitlines()
                 if line.startswith("relay_ticks_total")]
        assert ticks and ticks[0] > 0, "the tick loop is not running"

        # SIGTERM: draining (readiness, so the image's HEALTHCHECK, goes false), then exit 0.
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        statuses = []
        while process.poll() is None and time.monotonic() - sent < DRAIN_S:
            try:
                statuses.append(_get(f"{base}/ready")[0])
            except OSError:
                break
            if statuses[-1] == 503:
                break
            time.sleep(0.1)
        # With no match left to wait for the drain ends at once and the process exits; either
        # way readiness never answers 200 again after the signal has been handled.
        assert 503 in statuses or process.wait(timeout=5) == 0, \
            f"/ready did not turn 503 while draining: {statuses}"
        assert process.wait(timeout=15) == 0, stderr.read_text()[-4000:]
        assert time.monotonic() - sent < 15
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)

    events = [json.loads(line)["event"] for line in stderr.read_text().splitlines()
              if line.startswith("{")]
    assert "started" in events and "stopped" in events, events
    [replay] = replays.glob("*.replay")
    inspect = _run([venv / "bin" / "relay", "replay", "inspect", replay, "--json"], cwd=tmp_path)
    summary = json.loads(inspect.stdout)
    assert summary["complete"] and summary["end_reason"] and summary["frames"] > 0, summary
    assert not (tmp_path / "replays").exists(), "RELAY_REPLAY_DIRECTORY was not honoured"
