"""The deploy files agree with each other, with the docs and with the relay's settings.

- One stop grace period: drain_timeout + shutdown_timeout (relay/config.py) + a 10 s margin,
  the same in the Dockerfile's comment, both compose files, both systemd units, both Kubernetes
  variants and the docs.
- One image tag: pyproject.toml's version (= relay.__version__) is the Dockerfile's VERSION
  default, the tag its header and the docs build, the compose files run and the kustomizations pull.
- docs/OPERATIONS.md's one-box snippet is deploy/systemd/README.md's install block.
- The compose steps (header and OPERATIONS.md) run from deploy/compose, make the keys through
  the image and write the secrets where the compose files read them.
- The Kubernetes /tmp emptyDir holds the history spool of rooms.max_rooms hour-long matches.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from test_deploy import (
    COMPOSE, DEPLOYMENT, FLEET, K8S, ROOT, UNIT, _containers, _env, load_yaml, parse_unit,
    systemd_seconds,
)

import relay
from relay.config import RoomSettings, ServerSettings

DOCKERFILE = ROOT / "Dockerfile"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
SYSTEMD_README = ROOT / "deploy" / "systemd" / "README.md"
K8S_README = K8S / "README.md"
TEMPLATE = ROOT / "deploy" / "systemd" / "relay@.service"
COMPOSE_FILES = [COMPOSE, ROOT / "deploy" / "compose" / "docker-compose.multi.yml"]

MARGIN = 10
"""Seconds of stop grace beyond drain + shutdown (holds the Deployment's 5 s preStop sleep)."""

SPOOL_BYTES_PER_ROOM_10_MIN = 2.5e6
"""History spool of a 30 Hz room of 8 with 16-byte inputs (docs/OPERATIONS.md, capacity)."""
LONGEST_MATCH_MINUTES = 60


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def grace() -> int:
    server = ServerSettings()
    return int(server.drain_timeout + server.shutdown_timeout + MARGIN)


# -- grace period ------------------------------------------------------------------------------

def test_one_stop_grace_period_everywhere():
    expected = grace()
    found: dict[str, float] = {}
    for path in (UNIT, TEMPLATE):
        found[path.name] = systemd_seconds(parse_unit(path)["Service"]["TimeoutStopSec"][-1])
    for path in COMPOSE_FILES:
        for name, service in load_yaml(path)["services"].items():
            if name.startswith("relay"):
                found[f"{path.name} {name}"] = systemd_seconds(service["stop_grace_period"])
    found["deployment.yaml"] = load_yaml(DEPLOYMENT)["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    found["fleet.yaml"] = load_yaml(FLEET)["spec"]["template"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    # Every number the prose names next to a grace-period setting.
    patterns = [r"--stop-timeout (\d+)", r"stop_grace_period: (\d+)s", r"TimeoutStopSec=(\d+)s",
                r"terminationGracePeriodSeconds:? (\d+)"]
    for path in (DOCKERFILE, OPERATIONS, SYSTEMD_README, K8S_README, UNIT, TEMPLATE):
        for pattern in patterns:
            for number in re.findall(pattern, path.read_text()):
                found[f"{path.relative_to(ROOT)}: {pattern}"] = int(number)
    assert len([key for key in found if key.startswith("Dockerfile")]) >= 3
    wrong = {where: value for where, value in found.items() if value != expected}
    assert not wrong, f"stop grace period must be {expected} s (drain + shutdown + {MARGIN}): {wrong}"


# -- image tag ---------------------------------------------------------------------------------

def test_one_image_tag_everywhere():
    tag = version()
    assert relay.__version__ == tag
    dockerfile = DOCKERFILE.read_text()
    assert re.search(rf"^ARG VERSION={re.escape(tag)}$", dockerfile, re.M)
    images: dict[str, str] = {}
    for path in COMPOSE_FILES:
        for name, service in load_yaml(path)["services"].items():
            if name.startswith("relay"):
                images[f"{path.name} {name}"] = service["image"]
    for variant in ("plain", "agones"):
        (entry,) = load_yaml(K8S / variant / "kustomization.yaml")["images"]
        images[f"{variant} kustomization"] = f"{entry.get('newName', entry['name'])}:{entry['newTag']}"
    for path in (DOCKERFILE, OPERATIONS, K8S_README, *COMPOSE_FILES,
                 *(K8S / variant / "kustomization.yaml" for variant in ("plain", "agones"))):
        for image in re.findall(r"(?:build|tag) -t (\S+)|docker run --rm (relay\S*)",
                                path.read_text()):
            images[f"{path.name}: {image}"] = next(part for part in image if part)
    wrong = {where: image for where, image in images.items() if image != f"relay:{tag}"}
    assert not wrong, f"the image is relay:{tag} (pyproject.toml's version): {wrong}"
    assert not re.search(r"build -t relay \.|build -t relay$", dockerfile + OPERATIONS.read_text(), re.M)


# -- docs vs deploy files ----------------------------------------------------------------------

def shell_block(text: str, after: str) -> list[str]:
    """The commands of the first ```sh block after the heading or text ``after`` (comments and
    blank lines dropped)."""
    start = text.index(after)
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block, f"no sh block after {after!r}"
    return [line.strip() for line in block.group(1).splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_one_box_snippet_is_the_systemd_readme_install():
    operations = shell_block(OPERATIONS.read_text(), "## One box (systemd)")
    readme = shell_block(SYSTEMD_README.read_text(), "## Install")
    assert operations == readme
    useradd = next(line for line in readme if "useradd" in line)
    assert "--system" in useradd and "--shell /usr/sbin/nologin" in useradd
    # The unit runs as User=relay and Group=relay with StateDirectory= under /var/lib/relay.
    service = {key: values[-1] for key, values in parse_unit(UNIT)["Service"].items()}
    assert useradd.endswith(f" {service['User']}") and service["Group"] == service["User"]
    assert "--home-dir /var/lib/relay" in useradd
    assert any(f"-g {service['Group']} configs/relay.toml /etc/relay/relay.toml" in line
               for line in readme), "relay.toml readable by the relay's group"


def test_compose_steps_run_from_deploy_compose_and_need_no_relay_on_the_host():
    header = "\n".join(line[2:] for line in COMPOSE.read_text().splitlines()
                       if line.startswith("#   "))
    for source, text in (("compose header", header),
                         ("OPERATIONS.md", "\n".join(shell_block(OPERATIONS.read_text(),
                                                                 "## Docker and Compose")))):
        commands = [line.split("#")[0].strip() for line in text.splitlines() if line.strip()]
        assert commands[0] == "cd deploy/compose", source
        compose_dir = COMPOSE.parent
        keygen = next(command for command in commands if "token keygen" in command)
        assert keygen.startswith(f"docker run --rm relay:{version()} token keygen > "), (source, keygen)
        written = {re.search(r"> (\S+)", command).group(1) for command in commands
                   if ">" in command and "secrets/" in command}
        expected = {str(Path(secret["file"]).relative_to(".")) if not secret["file"].startswith("./")
                    else secret["file"][2:] for secret in load_yaml(COMPOSE)["secrets"].values()}
        assert written == expected, (source, written, expected)
        for path in written:
            assert (compose_dir / path).parent.is_dir(), path
        build = next(command for command in commands if "build -t" in command)
        assert (compose_dir / build.split()[-1]).resolve() == ROOT, (source, build)
        assert any(re.search(r"chmod 0644 .*secrets/", command) for command in commands), source


# -- /tmp vs the history spool -----------------------------------------------------------------

def quantity_bytes(text: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", text).groups()
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[unit]
    return float(number) * scale


@pytest.mark.parametrize("variant", ["plain", "agones"])
def test_tmp_holds_the_history_spool_of_max_rooms(variant):
    if variant == "plain":
        pod = load_yaml(DEPLOYMENT)["spec"]["template"]["spec"]
        container = _containers(pod)["relay"]
    else:
        spec = load_yaml(FLEET)["spec"]["template"]["spec"]
        pod = spec["template"]["spec"]
        container = _containers(pod)[spec["container"]]
    max_rooms = int(_env(container).get("RELAY_ROOMS_MAX_ROOMS", RoomSettings().max_rooms))
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    tmp = volumes[mounts["/tmp"]]["emptyDir"]
    spool = max_rooms * SPOOL_BYTES_PER_ROOM_10_MIN * LONGEST_MATCH_MINUTES / 10
    assert quantity_bytes(tmp["sizeLimit"]) >= spool, (
        f"{variant}: /tmp {tmp['sizeLimit']} < {max_rooms} rooms x {spool / max_rooms / 1e6} MB")
    # The scheduler reserves the node disk the emptyDirs may fill.
    disk = sum(quantity_bytes(volume["emptyDir"]["sizeLimit"]) for volume in volumes.values()
               if "emptyDir" in volume)
    assert quantity_bytes(container["resources"]["requests"]["ephemeral-storage"]) >= disk
