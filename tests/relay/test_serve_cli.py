"""`relay serve` on a first run: busy or unusable addresses, listener flags and --set, the
replay directory checked at start, config errors naming their file."""
from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from relay import cli
from relay.cli import main
from relay.config import ConfigError, load_config
from relay.errors import ListenError
from relay.server import RelayServer

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--set", "replay.enabled=false"]


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def busy_udp():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def busy_tcp():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_busy_udp_port_is_one_line_naming_address_and_setting(busy_udp, capsys):
    assert main(["serve", "--udp-port", str(busy_udp), "--http-port", "0", *QUIET]) == cli.EXIT_LISTEN
    lines = error_lines(capsys)
    assert len(lines) == 1, lines
    assert f"127.0.0.1:{busy_udp}" in lines[0] and "UDP" in lines[0]
    assert "address already in use" in lines[0]
    assert "server.udp_port" in lines[0] and "RELAY_SERVER_UDP_PORT" in lines[0]
    assert "--udp-port" in lines[0]


def test_busy_http_port_is_one_line_naming_address_and_setting(busy_tcp, capsys):
    assert main(["serve", "--udp-port", "0", "--http-port", str(busy_tcp), *QUIET]) == cli.EXIT_LISTEN
    lines = error_lines(capsys)
    assert len(lines) == 1, lines
    assert f"127.0.0.1:{busy_tcp}" in lines[0] and "HTTP" in lines[0]
    assert "server.http_port" in lines[0] and "--http-port" in lines[0]


def test_address_not_on_this_machine_names_the_host_setting(capsys):
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
    assert main(["serve", "--udp-host", "192.0.2.1", "--set", "security.mode=open",
                 *QUIET]) == cli.EXIT_LISTEN
    lines = error_lines(capsys)
    assert len(lines) == 1 and "192.0.2.1:7777" in lines[0]
    assert "server.udp_host" in lines[0] and "--udp-host" in lines[0]


@pytest.mark.parametrize("number, cause", [(errno.EACCES, "permission denied"),
                                           (errno.EADDRINUSE, "already in use")])
def test_listen_error_names_the_port_setting(number, cause):
    message = str(ListenError("http", "::1", 80, OSError(number, os.strerror(number))))
    assert "[::1]:80" in message and cause in message
    assert "server.http_port" in message and "RELAY_SERVER_HTTP_PORT" in message
    assert "\n" not in message


def test_http_failure_leaves_nothing_running(busy_tcp):
    udp_port = free_port(socket.SOCK_DGRAM)
    config = load_config(environ={}, overrides=[
        ("server", "udp_port", str(udp_port), "test"), ("server", "http_port", str(busy_tcp), "test"),
        ("replay", "enabled", "false", "test")])

    async def scenario():
        server = RelayServer(config)
        with pytest.raises(ListenError) as caught:
            await server.start()
        assert caught.value.kind == "http" and caught.value.port == busy_tcp
        await asyncio.sleep(0.05)       # a transport closes on the next loop iteration
        assert server.driver is None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", udp_port))     # the relay let the UDP port go

    asyncio.run(scenario())


def test_serve_subprocess_busy_port_no_traceback(busy_udp):
    """The real entry point: exit status 3, one line, no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "relay.cli", "serve", "--udp-port", str(busy_udp), "--http-port", "0",
         *QUIET], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == cli.EXIT_LISTEN
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and str(busy_udp) in result.stderr


def test_flags_override_file_and_environment(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text("[server]\nudp_port = 7000\nhttp_port = 9000\ntick_rate = 20\n")
    parser_args = cli_args("--config", str(path), "--udp-port", "7001", "--set", "rooms.capacity=4",
                           "--set", "server.tick_rate=60")
    config = load_config(str(path), environ={"RELAY_SERVER_UDP_PORT": "7002",
                                             "RELAY_SERVER_HTTP_PORT": "9002"},
                         overrides=cli._overrides(parser_args))
    assert config.server.udp_port == 7001          # flag over environment over file
    assert config.server.http_port == 9002         # environment over file
    assert config.server.tick_rate == 60 and config.rooms.capacity == 4


def cli_args(*argv: str):
    import argparse

    parser = argparse.ArgumentParser()
    cli._add_serve(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize("argv, expected", [
    (["--udp-port", "seventy"], "server.udp_port='seventy': an integer (from --udp-port)"),
    (["--http-port", "70000"], "server.http_port=70000: allowed 0..65535 (from --http-port)"),
    (["--set", "rooms.capacity=0"], "rooms.capacity=0: allowed 1..256 (from --set rooms.capacity)"),
    (["--set", "rooms.colour=red"], "rooms.colour='red': unknown setting"),
    (["--set", "capacity=4"], "expected SECTION.KEY=VALUE"),
    (["--udp-host", "example.com"], "server.udp_host='example.com': an IPv4/IPv6 address"),
])
def test_bad_flags_are_the_usual_config_error(argv, expected, capsys):
    assert main(["serve", *argv]) == cli.EXIT_CONFIG
    lines = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("relay: invalid configuration: ")
    assert expected in lines[0]


def test_set_does_not_echo_a_secret(capsys):
    assert main(["serve", "--set", "security.admin_token=short"]) == cli.EXIT_CONFIG
    assert "short" not in capsys.readouterr().err


def test_config_errors_name_the_file(tmp_path, capsys):
    path = tmp_path / "relay.toml"
    path.write_text("[server]\nudp_port = 70000\n")
    with pytest.raises(ConfigError, match=rf"^{path}: server.udp_port=70000: allowed 0..65535$"):
        load_config(str(path), environ={})
    path.write_text("[rooms]\ncolour = 'red'\n")
    with pytest.raises(ConfigError, match=rf"^{path}: rooms.colour='red': unknown setting"):
        load_config(str(path), environ={})
    path.write_text("[rooms]\ncapacity = 4\nstart_players = 5\n")
    with pytest.raises(ConfigError, match=rf"^{path}: rooms.start_players=5: allowed 1..4$"):
        load_config(str(path), environ={})
    assert main(["serve", "--config", str(path)]) == cli.EXIT_CONFIG
    assert f"{path}: rooms.start_players=5" in capsys.readouterr().err


def test_unwritable_replay_directory_fails_at_start(tmp_path, capsys):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    target = blocker / "replays"
    assert main(["serve", "--udp-port", "0", "--http-port", "0",
                 "--set", f"replay.directory={target}"]) == cli.EXIT_CONFIG
    lines = error_lines(capsys)
    assert len(lines) == 1, lines
    assert str(target) in lines[0] and "replay.directory" in lines[0]
    assert "RELAY_REPLAY_DIRECTORY" in lines[0]


def test_replay_directory_is_created_and_checked(tmp_path):
    from relay.config import ReplaySettings
    from relay.server.recording import check_replay_directory

    target = tmp_path / "a" / "replays"
    assert check_replay_directory(ReplaySettings(directory=str(target))) == target
    assert target.is_dir() and list(target.iterdir()) == []       # the probe file is gone
    assert check_replay_directory(ReplaySettings(enabled=False, directory=str(target))) is None


def test_help_documents_flags_exit_status_and_precedence(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for text in ("--udp-port", "--http-port", "--udp-host", "--http-host", "--set",
                 "SECTION.KEY=VALUE", "Exit status", f"{cli.EXIT_LISTEN} cannot listen",
                 f"{cli.EXIT_CONFIG} invalid settings", "RELAY_SERVER_UDP_PORT", "replay.directory"):
        assert text in out, text
