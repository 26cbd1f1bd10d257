"""Static checks of the container recipe: Dockerfile and .dockerignore at the repository root.

No Docker engine or hadolint is needed: a small parser below reads the Dockerfile the way the
builder does (parser directives, comments, backslash continuations, instruction flags, global
ARGs in FROM) and the tests assert the image's contract (two stages, wheels built in the
builder and installed without compilers in the runtime stage, a non-root user, the ports, the
readiness health check, ``relay serve``) plus the hadolint rules a reviewer would expect.
``tests/deploy/test_wheel.py`` reuses the parser and the .dockerignore matcher to run the same build.
"""
from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

KNOWN_INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}
COMPILER_PACKAGE = re.compile(
    r"^(gcc|g\+\+|cc|clang|build-essential|make|cmake|cpp|libc6?-dev|python3?(\.\d+)?-dev|"
    r"cython3?|setuptools|wheel)([<>=!~\[;].*)?$", re.IGNORECASE)


# -- the parser ------------------------------------------------------------------------------

@dataclass
class Instruction:
    keyword: str            # upper case: RUN, COPY, ...
    flags: dict[str, str]   # leading --name=value options (FROM, COPY, ADD, RUN, HEALTHCHECK)
    value: str              # the rest, continuation lines joined
    line: int               # first line, 1-based

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form CMD/ENTRYPOINT/RUN/SHELL/VOLUME, else None."""
        if not self.value.startswith("["):
            return None
        try:
            parsed = json.loads(self.value)
        except json.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed) else None

    def pairs(self) -> dict[str, str]:
        """KEY=VALUE pairs of ENV/LABEL/ARG (and the legacy ``ENV KEY value`` form)."""
        words = shlex.split(self.value)
        if self.keyword == "ENV" and words and "=" not in words[0]:
            return {words[0]: " ".join(words[1:])}
        result = {}
        for word in words:
            key, sep, val = word.partition("=")
            result[key] = val if sep else None
        return result

    def __str__(self) -> str:
        flags = " ".join(f"--{k}={v}" for k, v in self.flags.items())
        return f"line {self.line}: {self.keyword} {flags + ' ' if flags else ''}{self.value}"


@dataclass
class Stage:
    index: int
    image: str              # FROM's image with global ARG defaults substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            values.update(instruction.pairs())
        return values


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


_FLAG = re.compile(r"--([a-z][a-z-]*)(?:=(\S*))?\s+")
_FLAGGED = {"FROM", "COPY", "ADD", "RUN", "HEALTHCHECK"}


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text): parser directives, comments and blank lines
    dropped, continuation lines (ending in a backslash) joined; a comment line inside a
    continued instruction is skipped, as the builder does."""
    result = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if not current:
            start = number
        if raw.rstrip().endswith("\\"):
            current.append(raw.rstrip()[:-1])
            continue
        current.append(raw)
        result.append((start, "".join(current).strip()))
        current = []
    if current:
        result.append((start, "".join(current).strip()))
    return result


def substitute(value: str, variables: dict[str, str | None]) -> str:
    """${NAME}, ${NAME:-default} and $NAME from the given variables (unset -> empty)."""
    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        found = variables.get(name)
        return found if found else (default or "")
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", replace, value)


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for line, content in logical_lines(text):
        keyword, _, rest = content.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        flags: dict[str, str] = {}
        if keyword in _FLAGGED:
            while (match := _FLAG.match(rest + " ")) is not None:
                flags[match.group(1)] = match.group(2) or ""
                rest = (rest + " ")[match.end():].strip()
        instruction = Instruction(keyword, flags, rest, line)
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(len(stages), substitute(words[0], global_args), name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before the first FROM ({instruction})"
            global_args.update(instruction.pairs())
        if stages:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def shell_commands(instruction: Instruction) -> list[str]:
    """The simple commands of a RUN (or shell-form CMD), split at ``&&``, ``||``, ``;``, ``|``."""
    script = instruction.value
    exec_form = instruction.exec_form()
    if exec_form is not None:
        script = " ".join(exec_form[2:]) if exec_form[:2] in (["sh", "-c"], ["/bin/sh", "-c"]) \
            else shlex.join(exec_form)
    return [part.strip() for part in split_shell(script) if part.strip()]


def split_shell(script: str) -> list[str]:
    """Split at ``&&``, ``||``, ``;``, ``|`` outside quotes (a Python one-liner's ``;`` stays)."""
    parts, current, quote, i = [], [], None, 0
    while i < len(script):
        char = script[i]
        if quote:
            if char == "\\" and quote == '"' and i + 1 < len(script):
                current.append(script[i:i + 2])
                i += 2
                continue
            if char == quote:
                quote = None
            current.append(char)
        elif char == "\\" and i + 1 < len(script):
            current.append(script[i:i + 2])
            i += 2
            continue
        elif char in "'\"":
            quote = char
            current.append(char)
        elif script.startswith(("&&", "||"), i):
            parts.append("".join(current))
            current = []
            i += 2
            continue
        elif char in ";|\n":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


def command_words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def install_targets(command: str) -> tuple[str, list[str]] | None:
    """('apt'|'pip', the packages named) for an ``apt-get install`` or ``pip install`` command."""
    words = command_words(command)
    for index, word in enumerate(words):
        if word in ("apt-get", "apt") and "install" in words[index + 1:]:
            args = words[words.index("install", index) + 1:]
            return "apt", [a for a in args if not a.startswith("-")]
        if (word.endswith("pip") or word.endswith("pip3") or word == "pip") \
                and words[index + 1:index + 2] in (["install"], ["wheel"]):
            args, names, skip = words[index + 2:], [], False
            for arg in args:
                if skip:
                    skip = False
                elif arg in ("-r", "-c", "-w", "--find-links", "-f", "--index-url", "-i",
                             "--wheel-dir", "--requirement", "--constraint", "--target", "-t"):
                    skip = True
                elif not arg.startswith("-"):
                    names.append(arg)
            return "pip", names
        if word == "-m" and words[index + 1:index + 2] == ["pip"]:
            return install_targets(" ".join(["pip"] + words[index + 2:]))
    return None


# -- .dockerignore ---------------------------------------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex over '/'-separated context paths (Go filepath.Match
    plus '**', as Docker matches it: from the context root, '*' never crosses '/')."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = pattern[i + 1:end]
                out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
                i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out) + r"\Z")


class DockerIgnore:
    def __init__(self, text: str):
        self.rules: list[tuple[bool, re.Pattern, str]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line[1:].strip() if negate else line
            pattern = str(PurePosixPath("/" + pattern)).lstrip("/") or "."
            self.rules.append((negate, _pattern_regex(pattern), line))

    @classmethod
    def from_file(cls, path: Path = DOCKERIGNORE) -> "DockerIgnore":
        return cls(path.read_text())

    @property
    def patterns(self) -> list[str]:
        return [line for _, _, line in self.rules]

    def excluded(self, path: str) -> bool:
        """Whether a context path (relative, '/'-separated) is left out of the build context:
        the last rule matching it or one of its parent directories decides."""
        parts = PurePosixPath(path).parts
        candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        result = False
        for negate, regex, _ in self.rules:
            if any(regex.match(candidate) for candidate in candidates):
                result = not negate
        return result


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    assert DOCKERFILE.is_file(), "no Dockerfile at the repository root"
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def builder(dockerfile) -> Stage:
    return dockerfile.stage("builder")


@pytest.fixture(scope="module")
def final(dockerfile) -> Stage:
    return dockerfile.final


@pytest.fixture(scope="module")
def ignore() -> DockerIgnore:
    assert DOCKERIGNORE.is_file(), "no .dockerignore at the repository root"
    return DockerIgnore.from_file()


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


# -- the parser itself -----------------------------------------------------------------------

def test_parser_joins_continuations_skips_comments_and_reads_flags():
    parsed = parse_dockerfile(
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.11.9-slim\n"
        "FROM ${BASE} AS builder\n"
        "RUN apt-get update \\\n"
        "    # a comment inside the instruction\n"
        "    && apt-get install -y --no-install-recommends gcc \\\n"
        "    && rm -rf /var/lib/apt/lists/*\n"
        "\n"
        "from $BASE\n"
        "COPY --from=builder --chown=1:1 /wheels /tmp/wheels\n"
        "HEALTHCHECK --interval=5s CMD [\"python\", \"-c\", \"print(1)\"]\n"
        "ENV A=1 B=\"two words\"\n"
        "ENV LEGACY some value\n"
        "CMD [\"serve\"]\n")
    assert [s.name for s in parsed.stages] == ["builder", None]
    assert [s.image for s in parsed.stages] == ["python:3.11.9-slim"] * 2
    run = parsed.stages[0].last("RUN")
    assert run.line == 4
    assert shell_commands(run) == ["apt-get update",
                                   "apt-get install -y --no-install-recommends gcc",
                                   "rm -rf /var/lib/apt/lists/*"]
    assert install_targets(shell_commands(run)[1]) == ("apt", ["gcc"])
    copy = parsed.final.last("COPY")
    assert copy.flags == {"from": "builder", "chown": "1:1"} and copy.value == "/wheels /tmp/wheels"
    assert parsed.final.last("HEALTHCHECK").flags == {"interval": "5s"}
    assert parsed.final.env() == {"A": "1", "B": "two words", "LEGACY": "some value"}
    assert parsed.final.last("CMD").exec_form() == ["serve"]
    assert install_targets("python -m pip install --no-index -f /w relay") == ("pip", ["relay"])
    assert split_shell("""python -c "a; b | c" > f && x || y; z | w 'q;r'""") == [
        'python -c "a; b | c" > f ', " x ", " y", " z ", " w 'q;r'"]


def test_dockerignore_matcher_follows_docker_semantics():
    ignore = DockerIgnore("*.so\n**/*.c\nbuild\n!build/keep\n/docs/*.md\n")
    assert ignore.excluded("a.so") and not ignore.excluded("pkg/a.so")    # root only
    assert ignore.excluded("a.c") and ignore.excluded("pkg/deep/a.c")
    assert ignore.excluded("build/lib/x.o") and not ignore.excluded("build/keep")
    assert ignore.excluded("docs/a.md") and not ignore.excluded("docs/sub/a.md")
    assert not ignore.excluded("src/build.py")


# -- structure -------------------------------------------------------------------------------

def test_only_known_instructions(dockerfile):
    for stage in dockerfile.stages:
        for instruction in stage.instructions:
            assert instruction.keyword in KNOWN_INSTRUCTIONS, str(instruction)
            assert instruction.keyword != "MAINTAINER", "MAINTAINER is deprecated: use LABEL"


def test_multi_stage_with_builder_and_final_stage(dockerfile):
    assert len(dockerfile.stages) >= 2
    names = [s.name for s in dockerfile.stages if s.name]
    assert len(names) == len(set(names)), "stage names must be unique"
    assert dockerfile.stages[0].name == "builder"
    assert dockerfile.final is not dockerfile.stage("builder")


def test_base_images_pinned_and_the_same_in_both_stages(dockerfile):
    stage_names = {s.name for s in dockerfile.stages if s.name}
    bases = []
    for stage in dockerfile.stages:
        if stage.image in stage_names:
            continue
        assert "$" not in stage.image, f"unresolved variable in FROM {stage.image}"
        repository, _, tag = stage.image.partition("@")[0].rpartition(":")
        assert repository and tag, f"{stage.image}: pin a tag"
        assert tag != "latest", f"{stage.image}: 'latest' is not a pin"
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{stage.image}: pin the patch release"
        bases.append(stage.image)
    assert len(set(bases)) == 1, f"builder and runtime use different bases: {bases}"
    repository, _, tag = bases[0].partition("@")[0].rpartition(":")
    assert repository.endswith("python") and tag.startswith("3.11.") and "slim" in tag


# -- the builder stage -----------------------------------------------------------------------

def builder_copies(stage: Stage) -> list[tuple[list[str], str]]:
    """(sources, destination) of the builder's COPY instructions from the build context."""
    copies = []
    for instruction in stage.all("COPY"):
        if "from" in instruction.flags:
            continue
        words = instruction.exec_form() or shlex.split(instruction.value)
        copies.append((words[:-1], words[-1]))
    return copies


def test_builder_builds_the_project_wheel_and_the_dependency_wheels(builder):
    commands = [c for run in builder.all("RUN") for c in shell_commands(run)]
    wheel_builds = [command_words(c) for c in commands if re.search(r"\bpip wheel\b", c)]
    project = [w for w in wheel_builds if "--no-deps" in w and w[-1] == "."]
    assert project, "the builder must `pip wheel --no-deps -w /wheels .` the project"
    assert project[0][project[0].index("-w") + 1] == "/wheels"
    dependencies = [w for w in wheel_builds if "--no-deps" not in w]
    assert dependencies, "the builder must also build the dependency wheels"
    assert dependencies[0][dependencies[0].index("-w") + 1] == "/wheels"


def test_builder_copies_everything_the_build_needs_and_nothing_ignored(builder, ignore):
    copied = [source.rstrip("/") for sources, _ in builder_copies(builder) for source in sources]
    needed = {"pyproject.toml", "setup.py", "relay", "relay_core"}
    readme = pyproject()["project"].get("readme")
    if isinstance(readme, str):
        needed.add(readme)
    assert needed <= set(copied), f"missing from the builder's COPY: {needed - set(copied)}"
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignore.excluded(source), f"COPY {source}: excluded by .dockerignore"
    # Dependency wheels are built from pyproject.toml alone, before the sources are copied.
    first_copy = builder.all("COPY")[0]
    assert shlex.split(first_copy.value)[:-1] == ["pyproject.toml"], \
        "copy pyproject.toml alone first, so the dependency layer survives source changes"


# -- the runtime stage -----------------------------------------------------------------------

def test_final_stage_installs_the_built_wheels_offline(final, builder):
    copies = [c for c in final.all("COPY") if c.flags.get("from") == "builder"]
    assert copies, "the final stage must COPY --from=builder the wheels"
    source, destination = shlex.split(copies[0].value)
    assert source.rstrip("/") == "/wheels"
    installs = [command_words(c) for run in final.all("RUN") for c in shell_commands(run)
                if install_targets(c) and install_targets(c)[0] == "pip"]
    assert installs, "the final stage must pip install the wheels"
    words = installs[0]
    assert "--no-index" in words
    links = words[words.index("--find-links") + 1] if "--find-links" in words \
        else words[words.index("-f") + 1]
    assert links.rstrip("/") == destination.rstrip("/")
    assert install_targets(shlex.join(words))[1] == [pyproject()["project"]["name"]]


def test_final_stage_has_no_compilers(final):
    for run in final.all("RUN"):
        for command in shell_commands(run):
            target = install_targets(command)
            if target is None:
                continue
            kind, packages = target
            for package in packages:
                assert not COMPILER_PACKAGE.match(package), \
                    f"{kind} installs {package} in the final stage ({run})"
    for instruction in final.all("COPY"):
        assert "gcc" not in instruction.value and "/usr/lib/gcc" not in instruction.value


def test_final_stage_runs_as_a_non_root_user_that_exists(final):
    user = final.last("USER")
    assert user is not None, "the final stage must set USER"
    name = user.value.split(":")[0]
    assert name not in ("root", "0", ""), f"runs as root: {user}"
    assert final.instructions.index(user) < final.instructions.index(final.last("ENTRYPOINT"))
    created = " ".join(run.value for run in final.all("RUN"))
    if name.isdigit():
        assert re.search(rf"--uid\s+{name}\b", created), f"no user with uid {name} is created"
    else:
        assert re.search(rf"useradd\b.*\b{re.escape(name)}\b", created), f"no user {name} created"


def test_exposes_game_udp_and_http_tcp(final):
    ports = set()
    for expose in final.all("EXPOSE"):
        for port in expose.value.split():
            ports.add(port if "/" in port else f"{port}/tcp")
    assert {"7777/udp", "9100/tcp"} <= ports, ports


def test_environment_is_valid_relay_config_for_a_container(final):
    """The RELAY_* variables are real settings (a typo fails here, not at `docker run`), the
    HTTP side listens beyond loopback, replays go to a volume the user can write, and the
    default ports match EXPOSE."""
    from relay.config import load_config

    from relay.config import ConfigError

    env = final.env()
    config = load_config(environ={k: v for k, v in env.items() if k.startswith("RELAY_")})
    assert config.server.http_host == "0.0.0.0"
    assert config.server.udp_host == "0.0.0.0"
    # Serving players means token mode, with secrets given at `docker run`, never baked in.
    assert config.security_mode == "token"
    assert not any(key.startswith("RELAY_SECURITY_") for key in env), "no secrets in the image"
    with pytest.raises(ConfigError, match="token keys"):
        config.check_serve()
    exposed = " ".join(e.value for e in final.all("EXPOSE"))
    assert f"{config.server.udp_port}/udp" in exposed
    assert str(config.server.http_port) in exposed

    replays = config.replay.directory
    assert replays.startswith("/"), "the replay directory must be absolute inside the image"
    volumes = []
    for volume in final.all("VOLUME"):
        volumes += volume.exec_form() or volume.value.split()
    assert any(replays == v or replays.startswith(v.rstrip("/") + "/") for v in volumes), \
        f"replays go to {replays}, which is not under a VOLUME {volumes}"
    made = [run for run in final.all("RUN") if replays in run.value
            and re.search(r"(chown|install\s+-d.*-o)\s", run.value)]
    assert made, f"{replays} must be created and owned by the runtime user"


def test_workdir_is_absolute_and_writable_replays_live_under_it(final):
    workdirs = final.all("WORKDIR")
    assert workdirs, "set a WORKDIR in the final stage"
    workdir = workdirs[-1].value
    env = final.env()
    assert env.get("RELAY_REPLAY_DIRECTORY", "").startswith(workdir.rstrip("/") + "/")


def test_healthcheck_probes_ready_with_the_stdlib(final):
    checks = final.all("HEALTHCHECK")
    assert len(checks) == 1, "one HEALTHCHECK in the final stage"
    check = checks[0]
    assert check.value.upper().startswith("CMD"), "HEALTHCHECK must run a command, not NONE"
    command = check.value[3:].strip()
    assert "/ready" in command and ("127.0.0.1" in command or "localhost" in command)
    assert "9100" in command
    assert "urllib.request" in command and "timeout=" in command
    assert not re.search(r"\b(curl|wget)\b", command), "slim images have neither curl nor wget"
    exec_form = json.loads(command) if command.startswith("[") else None
    if exec_form:
        assert exec_form[0] in ("python", "python3", "/usr/local/bin/python")
        compile(exec_form[2], "<healthcheck>", "exec")     # the one-liner is valid Python
    timeout = check.flags.get("timeout")
    assert timeout, "set --timeout on the HEALTHCHECK"


def test_entrypoint_and_cmd_run_relay_serve_in_exec_form(final):
    entrypoint, cmd = final.last("ENTRYPOINT"), final.last("CMD")
    assert len(final.all("ENTRYPOINT")) == 1 and len(final.all("CMD")) == 1
    assert entrypoint.exec_form() is not None, "ENTRYPOINT in JSON form (signals reach relay)"
    assert cmd.exec_form() is not None, "CMD in JSON form"
    assert entrypoint.exec_form() + cmd.exec_form() == ["relay", "serve"]
    stop = final.last("STOPSIGNAL")
    assert stop is not None and stop.value in ("SIGTERM", "15")


def test_oci_labels(final):
    labels: dict[str, str] = {}
    for label in final.all("LABEL"):
        labels.update(label.pairs())
    for key in ("title", "description", "version", "licenses", "revision"):
        assert f"org.opencontainers.image.{key}" in labels, key
    assert labels["org.opencontainers.image.licenses"] == pyproject()["project"]["license"]["text"]
    version_args: dict[str, str | None] = {}
    for arg in final.all("ARG"):
        version_args.update(arg.pairs())
    version = substitute(labels["org.opencontainers.image.version"], version_args)
    assert version == pyproject()["project"]["version"], \
        "the image version label defaults to pyproject.toml's version"


# -- lint rules (hadolint's, as far as they apply) -------------------------------------------

def all_runs(dockerfile):
    return [run for stage in dockerfile.stages for run in stage.all("RUN")]


def test_apt_get_installs_are_lean_and_clean_the_lists(dockerfile):
    """DL3009, DL3014, DL3015, DL3027."""
    for run in all_runs(dockerfile):
        commands = shell_commands(run)
        for command in commands:
            words = command_words(command)
            assert "apt" not in words[:1], f"use apt-get, not apt ({run})"
            if "apt-get" in words and "install" in words:
                assert "--no-install-recommends" in words, f"--no-install-recommends ({run})"
                assert "-y" in words or "--yes" in words or "-qy" in words, f"-y ({run})"
                assert any(re.match(r"rm -rf /var/lib/apt/lists(/\*)?$", c) for c in commands), \
                    f"clean /var/lib/apt/lists in the same RUN ({run})"
            if "apt-get" in words and "upgrade" in words:
                pytest.fail(f"no apt-get upgrade in images ({run})")


def test_pip_runs_without_a_cache(dockerfile):
    """DL3042 (for pip install and pip wheel alike)."""
    seen = 0
    for run in all_runs(dockerfile):
        for command in shell_commands(run):
            if re.search(r"\bpip3? (install|wheel)\b", command):
                seen += 1
                assert "--no-cache-dir" in command_words(command), f"--no-cache-dir ({run})"
    assert seen >= 3


def test_no_add_for_local_files(dockerfile):
    """DL3020: COPY, not ADD, for files from the context."""
    for stage in dockerfile.stages:
        for add in stage.all("ADD"):
            sources = (add.exec_form() or shlex.split(add.value))[:-1]
            for source in sources:
                assert re.match(r"https?://|git@", source), f"use COPY for {source} ({add})"


def test_copy_from_names_an_earlier_stage(dockerfile):
    """DL3022/DL3023: --from points at an earlier stage, not at itself."""
    used = False
    for stage in dockerfile.stages:
        earlier = {s.name for s in dockerfile.stages[:stage.index] if s.name} \
            | {str(i) for i in range(stage.index)}
        for copy in stage.all("COPY"):
            if "from" in copy.flags:
                assert copy.flags["from"] in earlier, str(copy)
                used = used or copy.flags["from"] == "builder"
    assert used, "COPY --from=builder must carry the wheels into the final stage"


def test_workdirs_are_absolute(dockerfile):
    """DL3000."""
    for stage in dockerfile.stages:
        for workdir in stage.all("WORKDIR"):
            assert workdir.value.startswith("/"), str(workdir)


def test_no_sudo_no_cd_and_pipes_fail(dockerfile):
    """DL3004 (sudo), DL3003 (cd: use WORKDIR), DL4006 (pipefail before a pipe)."""
    shell = {stage.index: stage.last("SHELL") for stage in dockerfile.stages}
    for stage in dockerfile.stages:
        for run in stage.all("RUN"):
            for command in shell_commands(run):
                first = command_words(command)[:1]
                assert first != ["sudo"], str(run)
                assert first != ["cd"], f"use WORKDIR instead of cd ({run})"
            if re.search(r"[^|]\|[^|]", run.value):
                assert "pipefail" in run.value or (shell[stage.index] and
                                                   "pipefail" in shell[stage.index].value), \
                    f"set -o pipefail before a pipe ({run})"


def test_copy_destinations_of_several_sources_are_directories(dockerfile):
    """DL3021."""
    for stage in dockerfile.stages:
        for copy in stage.all("COPY"):
            words = copy.exec_form() or shlex.split(copy.value)
            if len(words) > 2:
                assert words[-1].endswith("/"), str(copy)


def test_one_cmd_one_entrypoint_one_healthcheck_per_stage(dockerfile):
    """DL4003, DL4004, DL3012."""
    for stage in dockerfile.stages:
        for keyword in ("CMD", "ENTRYPOINT", "HEALTHCHECK"):
            assert len(stage.all(keyword)) <= 1, f"{keyword} more than once in stage {stage.index}"


def test_exposed_ports_are_valid(dockerfile):
    """DL3011."""
    for stage in dockerfile.stages:
        for expose in stage.all("EXPOSE"):
            for port in expose.value.split():
                number, _, protocol = port.partition("/")
                assert 0 < int(number) <= 65535 and protocol in ("", "tcp", "udp"), port


# -- .dockerignore ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    ".git/HEAD", ".git", ".venv/bin/python", ".venv",
    "relay_core/endpoint.cpython-311-x86_64-linux-gnu.so", "relay_core/endpoint.c",
    "build/lib.linux-x86_64-cpython-311/relay_core/wire.cpython-311-x86_64-linux-gnu.so",
    "dist/relay-0.1.0.tar.gz", "relay.egg-info/PKG-INFO",
    "relay/__pycache__/cli.cpython-311.pyc", "tests/__pycache__/conftest.cpython-311.pyc",
    ".pytest_cache/v/cache/lastfailed", ".hypothesis/examples/x", "replays/room-1.replay",
])
def test_dockerignore_excludes(ignore, path):
    assert ignore.excluded(path), f".dockerignore lets {path} into the build context"


def test_dockerignore_keeps_the_sources(ignore):
    kept = ["pyproject.toml", "setup.py", "README.md"]
    kept += [str(p.relative_to(REPO)) for p in sorted((REPO / "relay_core").glob("*.p*"))
             if p.suffix in (".pyx", ".pxd", ".py")]
    kept += [str(p.relative_to(REPO)) for p in sorted((REPO / "relay").glob("*.py"))]
    assert any(k.endswith(".pyx") for k in kept)
    for path in kept:
        assert not ignore.excluded(path), f".dockerignore drops {path}, which the build needs"
