"""Every core of one box: several relays on one host, each on its own ports.

- deploy/systemd/relay-instance (the wrapper relay@.service starts) maps instance N to UDP
  7777 + N and HTTP 9100 + N, and refuses instance names and bases that are not numbers.
- deploy/systemd/relay@.service is relay.service plus the instance lines, and passes
  `systemd-analyze verify` and `security` (systemd itself cannot run here: no PID 1 systemd).
- deploy/compose/docker-compose.multi.yml runs relay-0 .. relay-N-1 on the same numbering, and
  deploy/prometheus/prometheus-multi.yml with its target files scrapes exactly those relays and
  passes a full `promtool check config` (target files included).
- Two `relay serve` processes started through the wrapper, as systemd would, play bots at the
  same time with 0 gaps, report their players on /health (what a backend picks an instance by)
  and exit 0 on SIGTERM.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml
from test_deploy import (
    COMPOSE, DEPLOY, ROOT, UNIT, _compose_path, _promtool, load_yaml, parse_unit, systemd_seconds,
)

from relay.config import load_config

WRAPPER = DEPLOY / "systemd" / "relay-instance"
TEMPLATE = DEPLOY / "systemd" / "relay@.service"
COMPOSE_MULTI = DEPLOY / "compose" / "docker-compose.multi.yml"
PROMETHEUS_MULTI = DEPLOY / "prometheus" / "prometheus-multi.yml"
TARGET_FILES = {"compose": DEPLOY / "prometheus" / "relay-targets.compose.yml",
                "systemd": DEPLOY / "prometheus" / "relay-targets.systemd.yml"}
UDP_BASE, HTTP_BASE = 7777, 9100


def instance_env(instance: str, **environ: str) -> subprocess.CompletedProcess:
    """The wrapper run as systemd runs it, with `env` for the relay: its environment out."""
    return subprocess.run(["sh", str(WRAPPER), instance, "env"], capture_output=True, text=True,
                          timeout=10, env={"PATH": os.environ["PATH"], **environ})


def ports_of(result: subprocess.CompletedProcess) -> tuple[int, int]:
    assert result.returncode == 0, result.stderr
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert "INSTANCE_UDP_PORT_BASE" not in env and "INSTANCE_HTTP_PORT_BASE" not in env
    return int(env["RELAY_SERVER_UDP_PORT"]), int(env["RELAY_SERVER_HTTP_PORT"])


# -- the port offset ---------------------------------------------------------------------------

@pytest.mark.parametrize("instance", [0, 1, 7, 63, 999])
def test_instance_n_listens_on_the_base_ports_plus_n(instance):
    assert ports_of(instance_env(str(instance))) == (UDP_BASE + instance, HTTP_BASE + instance)


def test_the_bases_move_the_ranges_and_win_over_relay_env():
    result = instance_env("3", INSTANCE_UDP_PORT_BASE="27000", INSTANCE_HTTP_PORT_BASE="19000",
                          RELAY_SERVER_UDP_PORT="1", RELAY_SERVER_HTTP_PORT="2")
    assert ports_of(result) == (27003, 19003)


@pytest.mark.parametrize("instance, environ", [
    ("07", {}), ("x", {}), ("", {}), ("-1", {}), ("1000", {}), ("1 ", {}), ("0x1", {}),
    ("1", {"INSTANCE_UDP_PORT_BASE": "abc"}), ("1", {"INSTANCE_HTTP_PORT_BASE": "9100x"}),
    ("1", {"INSTANCE_UDP_PORT_BASE": "65535"}),
])
def test_bad_instances_and_bases_exit_2_with_one_line(instance, environ):
    result = instance_env(instance, **environ)
    assert result.returncode == 2 and not result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relay-instance: "), result.stderr


def test_the_wrapper_is_executable_posix_sh():
    assert os.access(WRAPPER, os.X_OK)
    assert WRAPPER.read_text().startswith("#!/bin/sh\n")
    checker = shutil.which("checkbashisms") or shutil.which("shellcheck")
    if checker:
        args = [checker, str(WRAPPER)] if checker.endswith("checkbashisms") else [
            checker, "-s", "sh", str(WRAPPER)]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


# -- the template unit -------------------------------------------------------------------------

INSTANCE_KEYS = {
    ("Unit", "Description"), ("Service", "ExecStart"), ("Service", "WorkingDirectory"),
    ("Service", "Environment"), ("Service", "EnvironmentFile"), ("Service", "StateDirectory"),
    ("Service", "SyslogIdentifier"),
}
"""The only keys in which relay@.service may differ from relay.service."""


def test_template_is_the_single_unit_plus_the_instance_lines():
    single, template = parse_unit(UNIT), parse_unit(TEMPLATE)
    assert single.keys() == template.keys()
    for section in single:
        for key in single[section].keys() | template[section].keys():
            if (section, key) not in INSTANCE_KEYS:
                assert single[section].get(key) == template[section].get(key), (section, key)
    service = {key: values[-1] for key, values in template["Service"].items()}
    assert service["ExecStart"] == ("/opt/relay/relay-instance %i /opt/relay/venv/bin/relay serve "
                                    "--config /etc/relay/relay.toml")
    assert service["StateDirectory"] == "relay/%i"
    assert service["WorkingDirectory"] == "/var/lib/relay/%i"
    environment = dict(item.split("=", 1) for line in template["Service"]["Environment"]
                       for item in line.split())
    # One replay directory per instance (a relay's disk cap counts every replay in its directory).
    assert environment["RELAY_REPLAY_DIRECTORY"] == "/var/lib/relay/%i/replays"
    assert environment["RELAY_SECURITY_KEYS_FILE"] == "%d/relay-keys"
    assert "RELAY_SERVER_UDP_PORT" not in environment and "RELAY_SERVER_HTTP_PORT" not in environment
    assert template["Service"]["EnvironmentFile"] == ["-/etc/relay/relay.env",
                                                      "-/etc/relay/relay@%i.env"]
    assert systemd_seconds(service["TimeoutStopSec"]) == 45


def test_template_passes_systemd_analyze(tmp_path):
    """systemd-analyze verify loads relay@0.service from the template (unknown keys, bad values,
    specifiers, missing executables); systemd cannot run in this sandbox, so the unit is never
    started here and the port logic is tested through the wrapper directly."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian: apt-get install systemd)")
    relay = tmp_path / "relay"
    relay.write_text("#!/bin/sh\n")
    relay.chmod(0o755)
    text = (TEMPLATE.read_text().replace("/opt/relay/venv/bin/relay", str(relay))
            .replace("/opt/relay/relay-instance", str(WRAPPER)))
    (tmp_path / "relay@.service").write_text(text)
    instance = tmp_path / "relay@0.service"
    result = subprocess.run([analyze, "verify", str(instance)], capture_output=True, text=True,
                            timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "relay@" not in output, output
    security = subprocess.run([analyze, "security", "--offline=yes", "--threshold=30", str(instance)],
                              capture_output=True, text=True, timeout=60)
    assert security.returncode == 0, security.stdout[-2000:] + security.stderr


# -- compose with N relays, and Prometheus scraping them ---------------------------------------

def relay_services(compose: dict) -> dict[int, dict]:
    return {int(name.split("-")[1]): service for name, service in compose["services"].items()
            if name.startswith("relay-")}


def test_compose_multi_numbers_its_relays_like_the_systemd_instances():
    compose = load_yaml(COMPOSE_MULTI)
    relays = relay_services(compose)
    assert len(relays) >= 2 and sorted(relays) == list(range(len(relays)))
    single = load_yaml(COMPOSE)["services"]["relay"]
    volumes = set()
    for number, service in relays.items():
        assert service["ports"] == [f"{UDP_BASE + number}:7777/udp",
                                    f"127.0.0.1:{HTTP_BASE + number}:9100/tcp"], number
        assert service["image"] == single["image"]
        assert _compose_path(service["build"]["context"]) == ROOT
        assert service["stop_grace_period"] == single["stop_grace_period"]
        assert service["secrets"] == single["secrets"]
        (volume,) = service["volumes"]
        source, target = volume.split(":")
        assert target == service["environment"]["RELAY_REPLAY_DIRECTORY"]
        assert source in compose["volumes"]
        volumes.add(source)
        # The shared settings are the single relay's, but for each relay's share of the disk.
        shared = {key: value for key, value in service["environment"].items()
                  if key != "RELAY_REPLAY_MAX_DISK_BYTES"}
        assert shared == {key: value for key, value in single["environment"].items()
                          if key != "RELAY_REPLAY_MAX_DISK_BYTES"}
        assert int(service["environment"]["RELAY_REPLAY_MAX_DISK_BYTES"]) * len(relays) <= \
            int(single["environment"]["RELAY_REPLAY_MAX_DISK_BYTES"])
    assert len(volumes) == len(relays), "every relay needs its own replays volume"
    assert compose["secrets"] == load_yaml(COMPOSE)["secrets"]
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert _compose_path(source).exists(), f"{name}: {source} does not exist"


def test_compose_multi_prometheus_scrapes_every_relay():
    compose = load_yaml(COMPOSE_MULTI)
    mounts = {volume.split(":")[1]: _compose_path(volume.split(":")[0])
              for volume in compose["services"]["prometheus"]["volumes"] if volume.startswith(".")}
    assert mounts["/etc/prometheus/prometheus.yml"] == PROMETHEUS_MULTI.resolve()
    config = load_yaml(PROMETHEUS_MULTI)
    (relay_job,) = [job for job in config["scrape_configs"] if job["job_name"] == "relay"]
    (files,) = [sd["files"] for sd in relay_job["file_sd_configs"]]
    assert mounts[files[0]] == TARGET_FILES["compose"].resolve()
    for rule_file in config["rule_files"]:
        assert mounts[rule_file] == (DEPLOY / "prometheus" / "alerts.yml").resolve()
    targets = [target for group in load_yaml(TARGET_FILES["compose"]) for target in group["targets"]]
    assert targets == [f"relay-{number}:9100" for number in sorted(relay_services(compose))]


def test_systemd_targets_follow_the_instance_ports():
    targets = [target for group in load_yaml(TARGET_FILES["systemd"]) for target in group["targets"]]
    assert targets == [f"127.0.0.1:{HTTP_BASE + number}" for number in range(len(targets))]
    assert ports_of(instance_env(str(len(targets) - 1)))[1] == HTTP_BASE + len(targets) - 1


@pytest.mark.parametrize("variant", sorted(TARGET_FILES))
def test_promtool_check_config_multi(variant, tmp_path):
    """A full check (not --syntax-only): the rule file and the target file are read too."""
    promtool = _promtool()
    text = PROMETHEUS_MULTI.read_text().replace("/etc/prometheus/", f"{tmp_path}/")
    (tmp_path / "prometheus.yml").write_text(text)
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    shutil.copy(TARGET_FILES[variant], tmp_path / "relay-targets.yml")
    result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "relay-targets.yml" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_compose_multi_environment_is_valid(tmp_path):
    environ = {key: str(value) for key, value in
               relay_services(load_yaml(COMPOSE_MULTI))[0]["environment"].items()}
    environ["RELAY_REPLAY_DIRECTORY"] = str(tmp_path)
    (tmp_path / "keys").write_text(f'1 = "{"A" * 43}="\n')
    (tmp_path / "token").write_text("0123456789abcdef0123456789abcdef\n")
    environ["RELAY_SECURITY_KEYS_FILE"] = str(tmp_path / "keys")
    environ["RELAY_SECURITY_ADMIN_TOKEN_FILE"] = str(tmp_path / "token")
    config = load_config(environ=environ)
    assert config.security_mode == "token"
    config.check_serve()


# -- two relays on one host, played on at once -------------------------------------------------

def _free(kind: int, port: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_bases(count: int) -> tuple[int, int]:
    """UDP and HTTP bases with `count` consecutive free ports each (other jobs share the host)."""
    rng = random.Random()
    for _ in range(200):
        udp, http = rng.randrange(20000, 40000), rng.randrange(40000, 60000)
        if all(_free(socket.SOCK_DGRAM, udp + n) and _free(socket.SOCK_STREAM, http + n)
               for n in range(count)):
            return udp, http
    pytest.fail("no free port range found")


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, {}


def wait_ready(url: str, process: subprocess.Popen, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, f"relay exited {process.returncode} at start"
        try:
            if get_json(url + "/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{url}/ready did not answer 200 within {seconds} s")


def test_two_instances_play_at_once_and_stop_cleanly(tmp_path):
    udp_base, http_base = free_bases(2)
    python = [sys.executable, "-m", "relay.cli"]
    keys = tmp_path / "keys.toml"
    keys.write_text(subprocess.run(python + ["token", "keygen"], capture_output=True, text=True,
                                   check=True, timeout=30, cwd=ROOT).stdout)
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "INSTANCE_UDP_PORT_BASE": str(udp_base),
               "INSTANCE_HTTP_PORT_BASE": str(http_base), "RELAY_SECURITY_MODE": "token",
               "RELAY_SECURITY_KEYS_FILE": str(keys), "RELAY_SERVER_DRAIN_TIMEOUT": "3"}
    relays = {}
    try:
        for number in (0, 1):
            # One replay directory each, as relay@.service gives them.
            env = {**environ, "RELAY_REPLAY_DIRECTORY": str(tmp_path / str(number) / "replays")}
            relays[number] = subprocess.Popen(
                ["sh", str(WRAPPER), str(number), *python, "serve"], cwd=tmp_path, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        urls = {number: f"http://127.0.0.1:{http_base + number}" for number in relays}
        for number, process in relays.items():
            wait_ready(urls[number], process)

        bots = {number: subprocess.Popen(
            python + ["bot", "--server", f"127.0.0.1:{udp_base + number}", "--key-file", str(keys),
                      "--players", "2", "--seconds", "5", "--json"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for number in relays}
        # While they play, each relay's /health (open, no token) counts its own players: what a
        # game backend compares to pick an instance (docs/OPERATIONS.md).
        time.sleep(2.5)
        for number in relays:
            status, health = get_json(urls[number] + "/health")
            assert status == 200 and health["peers"] == 2 and health["rooms"] == 1, (number, health)
            assert health["draining"] is False
        for number, bot in bots.items():
            out, err = bot.communicate(timeout=30)
            assert bot.returncode == 0, f"instance {number}: bot exited {bot.returncode}: {err[-500:]}"
            report = json.loads(out.strip().splitlines()[-1])
            assert report["gaps"] == 0 and report["duplicates"] == 0 and report["mismatches"] == 0
            assert not report["errors"], report["errors"]
            assert report["frames_per_bot_min"] >= 100, report      # 5 s at 30 Hz
    finally:
        for process in relays.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        outputs = {}
        for number, process in relays.items():
            try:
                outputs[number], _ = process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                outputs[number], _ = process.communicate()
    for number, process in relays.items():
        assert process.returncode == 0, f"instance {number} exited {process.returncode}: " \
                                        f"{outputs[number][-1500:]}"
        assert f"{udp_base + number}" in outputs[number]          # its started line names its port
        assert list((tmp_path / str(number) / "replays").glob("*.replay")), number


def test_compose_multi_is_valid_yaml_with_merge_keys():
    """Compose resolves `<<: *relay`; so does PyYAML's safe loader, which the tests above use."""
    raw = yaml.safe_load(COMPOSE_MULTI.read_text())
    assert "x-relay" in raw and all("build" in service for service in relay_services(raw).values())
