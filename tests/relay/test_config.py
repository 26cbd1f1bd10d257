"""Configuration: embedded defaults, a TOML file, RELAY_<SECTION>_<KEY> overrides, validation
messages that name the key, the value and what is allowed, and `relay serve` refusing to start
on a bad file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay.config import ConfigError, RelayConfig, describe, load_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "relay.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path=None, environ=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={} if environ is None else environ)
    return str(caught.value)


# -- defaults, file, environment ----------------------------------------------------------------

def test_embedded_defaults_are_valid():
    config = load_config(None, environ={})
    # Loopback by default: `relay serve` with no settings is open mode, reachable from here only.
    assert (config.server.udp_host, config.server.udp_port) == ("127.0.0.1", 7777)
    assert config.security_mode == "open"
    assert (config.server.http_host, config.server.http_port) == ("127.0.0.1", 9100)
    assert config.server.tick_rate == 30
    assert config.rooms.start_policy == "players" and config.rooms.capacity == 8
    RelayConfig().validate()                      # the dataclass defaults on their own


def test_defaults_ignore_the_process_environment_when_environ_is_given(monkeypatch):
    monkeypatch.setenv("RELAY_SERVER_TICK_RATE", "99")
    assert load_config(None, environ={}).server.tick_rate == 30
    assert load_config(None).server.tick_rate == 99   # environ=None reads os.environ


def test_toml_file_overrides_defaults(tmp_path):
    path = write(tmp_path, """
[server]
udp_port = 8000
tick_rate = 60
http_host = "::1"
shutdown_timeout = 2        # an integer is fine for a float setting

[rooms]
capacity = 4
start_players = 4
start_policy = "ready"
allow_late_join = false
empty_timeout = 12.5

[replay]
enabled = false
directory = "/var/lib/relay/replays"
""")
    config = load_config(path, environ={})
    assert config.server.udp_port == 8000 and config.server.tick_rate == 60
    assert config.server.http_host == "::1"
    assert config.server.shutdown_timeout == 2.0 and isinstance(config.server.shutdown_timeout, float)
    assert config.rooms.capacity == 4 and config.rooms.start_players == 4
    assert config.rooms.start_policy == "ready" and config.rooms.allow_late_join is False
    assert config.rooms.empty_timeout == 12.5
    assert config.replay.enabled is False and config.replay.directory == "/var/lib/relay/replays"
    # settings the file does not name keep their defaults
    assert config.server.udp_host == "127.0.0.1" and config.rooms.max_input_bytes == 256
    assert describe(config)["server"]["tick_rate"] == 60


def test_environment_variable_overrides_a_default():
    config = load_config(None, environ={"RELAY_SERVER_TICK_RATE": "60",
                                        "RELAY_ROOMS_START_POLICY": "admin",
                                        "RELAY_ROOMS_MAX_INPUT_BYTES": "512",
                                        "RELAY_ROOMS_ALLOW_LATE_JOIN": "no",
                                        "RELAY_ROOMS_EMPTY_TIMEOUT": "7.5",
                                        "RELAY_REPLAY_ENABLED": "true"})
    assert config.server.tick_rate == 60
    assert config.rooms.start_policy == "admin"
    assert config.rooms.max_input_bytes == 512
    assert config.rooms.allow_late_join is False
    assert config.rooms.empty_timeout == 7.5
    assert config.replay.enabled is True


def test_environment_beats_the_file(tmp_path):
    path = write(tmp_path, "[server]\ntick_rate = 20\nudp_port = 8000\n")
    config = load_config(path, environ={"RELAY_SERVER_TICK_RATE": "60"})
    assert config.server.tick_rate == 60
    assert config.server.udp_port == 8000          # the file still applies where env is silent


def test_environment_can_repair_an_out_of_range_file_value(tmp_path):
    # validation happens once, after every source was applied
    path = write(tmp_path, "[server]\ntick_rate = 500\n")
    assert load_config(path, environ={"RELAY_SERVER_TICK_RATE": "60"}).server.tick_rate == 60


def test_unrelated_environment_variables_are_ignored():
    config = load_config(None, environ={"RELAY_CONFIG": "/nowhere.toml", "RELAY_OTHER_THING": "x",
                                        "PATH": "/bin", "relay_server_tick_rate": "500"})
    assert config.server.tick_rate == 30


# -- invalid values -----------------------------------------------------------------------------

def test_tick_rate_out_of_range_names_key_value_and_range(tmp_path):
    message = error_of(write(tmp_path, "[server]\ntick_rate = 500\n"))
    assert "server.tick_rate" in message and "500" in message and "10..120" in message


@pytest.mark.parametrize("key, value, allowed", [
    ("server.udp_port", "70000", "0..65535"),
    ("server.mtu", "576", "1072..16384"),
    ("server.join_timeout", "0.5", "1.0..3600.0"),
    ("rooms.capacity", "0", "1..256"),
    ("rooms.max_input_bytes", "5000", "1..4096"),
    ("rooms.catchup_frames", "1", "2..1000000"),
    ("replay.max_bytes", "10", "1024..1099511627776"),
])
def test_out_of_range_values_name_key_value_and_range(tmp_path, key, value, allowed):
    section, name = key.split(".")
    message = error_of(write(tmp_path, f"[{section}]\n{name} = {value}\n"))
    assert key in message and value in message and allowed in message


def test_unknown_key_is_refused_and_the_allowed_keys_listed(tmp_path):
    message = error_of(write(tmp_path, "[server]\ntick_rte = 60\n"))
    assert "server.tick_rte" in message and "unknown setting" in message
    assert "tick_rate" in message and "udp_port" in message


def test_unknown_section_is_refused_and_the_allowed_sections_listed(tmp_path):
    message = error_of(write(tmp_path, "[serverr]\ntick_rate = 60\n"))
    assert "serverr" in message and "unknown section" in message
    for section in ("server", "rooms", "replay"):
        assert section in message


def test_top_level_value_outside_a_section_is_refused(tmp_path):
    message = error_of(write(tmp_path, "tick_rate = 60\n"))
    assert "tick_rate" in message and "table" in message


@pytest.mark.parametrize("line, key, shown, expected", [
    ('tick_rate = "fast"', "server.tick_rate", "'fast'", "integer"),
    ("tick_rate = 30.5", "server.tick_rate", "30.5", "integer"),
    ("tick_rate = true", "server.tick_rate", "True", "integer"),
    ("shutdown_timeout = \"soon\"", "server.shutdown_timeout", "'soon'", "number"),
    ("udp_host = 7", "server.udp_host", "7", "string"),
])
def test_wrong_type_names_key_value_and_expected_type(tmp_path, line, key, shown, expected):
    message = error_of(write(tmp_path, f"[server]\n{line}\n"))
    assert key in message and shown in message and expected in message


def test_wrong_type_for_a_boolean_names_key_value_and_expected(tmp_path):
    message = error_of(write(tmp_path, "[rooms]\nallow_late_join = 1\n"))
    assert "rooms.allow_late_join" in message and "1" in message and "true or false" in message


def test_quoted_number_in_toml_is_refused_as_the_wrong_type(tmp_path):
    message = error_of(write(tmp_path, '[server]\ntick_rate = "60"\n'))
    assert "server.tick_rate" in message and "integer" in message


@pytest.mark.parametrize("host", ["example.com", "999.1.1.1", "", "0.0.0.0:7777"])
def test_bad_host_names_key_value_and_what_is_allowed(tmp_path, host):
    message = error_of(write(tmp_path, f'[server]\nudp_host = "{host}"\n'))
    assert "server.udp_host" in message and repr(host) in message
    assert "IPv4/IPv6 address or 'localhost'" in message


@pytest.mark.parametrize("host", ["localhost", "::", "10.1.2.3", "fe80::1"])
def test_good_hosts_are_accepted(tmp_path, host):
    config = load_config(write(tmp_path, f'[server]\nhttp_host = "{host}"\n'), environ={})
    assert config.server.http_host == host


def test_start_players_above_capacity_names_both_limits(tmp_path):
    message = error_of(write(tmp_path, "[rooms]\ncapacity = 4\nstart_players = 5\n"))
    assert "rooms.start_players" in message and "5" in message and "1..4" in message


@pytest.mark.parametrize("line, key, allowed", [
    ('start_policy = "auto"', "rooms.start_policy", "players, ready, admin"),
    ('late_input_policy = "queue"', "rooms.late_input_policy", "next, drop"),
])
def test_bad_enum_value_names_key_value_and_choices(tmp_path, line, key, allowed):
    message = error_of(write(tmp_path, f"[rooms]\n{line}\n"))
    value = line.split('"')[1]
    assert key in message and repr(value) in message and allowed in message


def test_bad_log_level_names_the_choices(tmp_path):
    message = error_of(write(tmp_path, '[server]\nlog_level = "verbose"\n'))
    assert "server.log_level" in message and "'verbose'" in message
    assert "debug, info, warning, error" in message


def test_missing_config_file_is_a_config_error_naming_the_path(tmp_path):
    path = tmp_path / "absent.toml"
    message = error_of(path)
    assert str(path) in message and "cannot read" in message


def test_directory_as_config_file_is_a_config_error(tmp_path):
    message = error_of(tmp_path)
    assert str(tmp_path) in message and "cannot read" in message


def test_invalid_toml_is_a_config_error_naming_the_file(tmp_path):
    path = write(tmp_path, "[server\ntick_rate = = 60\n")
    message = error_of(path)
    assert str(path) in message and "not valid TOML" in message


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[server]\n# caf\xe9\ntick_rate = 30\n'.encode("latin-1"))
    message = error_of(path)
    assert str(path) in message


def test_environment_type_error_names_the_variable():
    message = error_of(environ={"RELAY_SERVER_TICK_RATE": "fast"})
    assert "server.tick_rate" in message and "'fast'" in message and "integer" in message
    assert "RELAY_SERVER_TICK_RATE" in message


def test_environment_unknown_setting_names_the_variable():
    message = error_of(environ={"RELAY_ROOMS_CAPACITI": "4"})
    assert "rooms.capaciti" in message and "RELAY_ROOMS_CAPACITI" in message


@pytest.mark.parametrize("name, value", [("RELAY_SERVER_TICK_RATE", "500"),
                                         ("RELAY_ROOMS_START_POLICY", "auto")])
def test_environment_value_out_of_range_names_the_variable(name, value):
    message = error_of(environ={name: value})
    assert value in message
    assert name in message


# -- relay serve --------------------------------------------------------------------------------

def _serve(config_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return subprocess.run([sys.executable, "-m", "relay.cli", "serve", "--config", str(config_path)],
                          capture_output=True, timeout=30, cwd=REPO, env=env, text=True)


def test_relay_serve_with_a_bad_config_exits_2_naming_the_key(tmp_path):
    result = _serve(write(tmp_path, "[server]\ntick_rate = 500\n", name="bad.toml"))
    assert result.returncode == 2, result.stderr
    assert "server.tick_rate" in result.stderr and "500" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_relay_serve_with_a_missing_config_exits_2(tmp_path):
    path = tmp_path / "absent.toml"
    result = _serve(path)
    assert result.returncode == 2, result.stderr
    assert str(path) in result.stderr and "Traceback" not in result.stderr


def test_a_room_whose_full_frame_cannot_fit_one_message_is_refused():
    with pytest.raises(ConfigError, match="capacity=256 x rooms.max_input_bytes=4096"):
        load_config(environ={"RELAY_ROOMS_CAPACITY": "256", "RELAY_ROOMS_MAX_INPUT_BYTES": "4096"})


# -- [security] ---------------------------------------------------------------------------------

KEY_A = "A" * 43 + "="                         # 32 zero bytes, standard base64
KEY_B = "_" * 43                               # 32 0xff bytes, URL-safe and unpadded


@pytest.mark.parametrize("host, mode", [("127.0.0.1", "open"), ("::1", "open"),
                                        ("localhost", "open"), ("0.0.0.0", "token"),
                                        ("::", "token"), ("10.1.2.3", "token")])
def test_auto_mode_is_open_on_loopback_only(host, mode):
    config = load_config(environ={"RELAY_SERVER_UDP_HOST": host})
    assert config.security.mode == "auto" and config.security_mode == mode


def test_keys_from_inline_setting_environment_and_key_file_merge_by_id(tmp_path):
    key_file = write(tmp_path, f'2 = "{KEY_B}"\n', name="keys.toml")
    config = load_config(write(tmp_path, f'[security]\nmode = "token"\nkeys_file = "{key_file}"\n'),
                         environ={"RELAY_SECURITY_KEYS": f"1:{KEY_A}"})
    assert config.security.load_keys() == {1: bytes(32), 2: b"\xff" * 32}
    assert config.security.mint_key() == (2, b"\xff" * 32)        # the highest id by default
    config = load_config(environ={"RELAY_SECURITY_KEYS": f"1:{KEY_A}, 2:{KEY_B}",
                                  "RELAY_SECURITY_MINT_KEY_ID": "1"})
    assert config.security.mint_key() == (1, bytes(32))


@pytest.mark.parametrize("keys, expected", [
    ("1:not*base64", "not base64"),
    (f"1:{'A' * 20}", "32 bytes"),
    (f"1:{KEY_A},1:{KEY_B}", "appears twice"),
    (f"x:{KEY_A}", "key id 'x'"),
    (f"4294967296:{KEY_A}", "0..4294967295"),
    (KEY_A, "ID:BASE64KEY"),
])
def test_bad_keys_are_refused_naming_the_variable_without_echoing_the_key(keys, expected):
    message = error_of(environ={"RELAY_SECURITY_KEYS": keys})
    assert expected in message and "RELAY_SECURITY_KEYS" in message
    assert KEY_A[:8] not in message and KEY_B[:8] not in message


def test_bad_key_files_are_refused_naming_the_file(tmp_path):
    missing = tmp_path / "absent.toml"
    assert "cannot read" in error_of(environ={"RELAY_SECURITY_KEYS_FILE": str(missing)})
    broken = write(tmp_path, "1 = \n", name="broken.toml")
    assert "not valid TOML" in error_of(environ={"RELAY_SECURITY_KEYS_FILE": str(broken)})
    duplicated = write(tmp_path, f'1 = "{KEY_A}"\n01 = "{KEY_B}"\n', name="dup.toml")
    assert "appears twice" in error_of(environ={"RELAY_SECURITY_KEYS_FILE": str(duplicated)})
    clash = write(tmp_path, f'1 = "{KEY_B}"\n', name="clash.toml")
    message = error_of(environ={"RELAY_SECURITY_KEYS_FILE": str(clash),
                                "RELAY_SECURITY_KEYS": f"1:{KEY_A}"})
    assert "also in security.keys" in message and str(clash) in message


def test_mint_key_id_must_name_a_key():
    message = error_of(environ={"RELAY_SECURITY_KEYS": f"1:{KEY_A}", "RELAY_SECURITY_MINT_KEY_ID": "5"})
    assert "security.mint_key_id=5" in message and "ids: 1" in message


def test_admin_token_from_setting_or_file_and_its_checks(tmp_path):
    token_file = write(tmp_path, "  0123456789abcdef0123\n", name="admin-token")
    config = load_config(environ={"RELAY_SECURITY_ADMIN_TOKEN_FILE": str(token_file)})
    assert config.security.load_admin_token() == "0123456789abcdef0123"
    assert "at least 16" in error_of(environ={"RELAY_SECURITY_ADMIN_TOKEN": "short"})
    assert "at least 16" in error_of(environ={"RELAY_SECURITY_ADMIN_TOKEN": "with a space 0123456789"})
    message = error_of(environ={"RELAY_SECURITY_ADMIN_TOKEN": "0123456789abcdef0123",
                                "RELAY_SECURITY_ADMIN_TOKEN_FILE": str(token_file)})
    assert "keep one" in message


def test_an_unreadable_admin_token_file_is_one_line_naming_the_file_and_the_reason(tmp_path):
    missing = tmp_path / "no-such-token"
    message = error_of(environ={"RELAY_SECURITY_ADMIN_TOKEN_FILE": str(missing)})
    assert message == (f"security.admin_token_file={str(missing)!r}: cannot read it: "
                       f"No such file or directory (from environment variable "
                       f"RELAY_SECURITY_ADMIN_TOKEN_FILE)")
    binary = write(tmp_path, "", name="binary-token")
    binary.write_bytes(b"\xff\xfe not text")
    message = error_of(environ={"RELAY_SECURITY_ADMIN_TOKEN_FILE": str(binary)})
    assert message.startswith(f"security.admin_token_file={str(binary)!r}: cannot read it: ")
    assert "can't decode byte 0xff" in message and "\n" not in message


def test_describe_never_shows_a_secret():
    config = load_config(environ={"RELAY_SECURITY_KEYS": f"1:{KEY_B}",
                                  "RELAY_SECURITY_ADMIN_TOKEN": "0123456789abcdef0123"})
    described = repr(describe(config))
    assert KEY_B not in described and "0123456789abcdef0123" not in described
    assert describe(config)["security"]["keys"] == "<set>"
    assert describe(load_config(environ={}))["security"]["keys"] == ""


def test_serving_needs_keys_in_token_mode_and_an_admin_token_beyond_loopback():
    load_config(environ={}).check_serve()                        # loopback, open: fine
    with pytest.raises(ConfigError, match="RELAY_SECURITY_KEYS"):
        load_config(environ={"RELAY_SERVER_UDP_HOST": "0.0.0.0"}).check_serve()
    with pytest.raises(ConfigError, match="RELAY_SECURITY_KEYS"):
        load_config(environ={"RELAY_SECURITY_MODE": "token"}).check_serve()
    load_config(environ={"RELAY_SERVER_UDP_HOST": "0.0.0.0", "RELAY_SECURITY_MODE": "open"}).check_serve()
    with pytest.raises(ConfigError, match="RELAY_SECURITY_ADMIN_TOKEN"):
        load_config(environ={"RELAY_SERVER_HTTP_HOST": "0.0.0.0"}).check_serve()
    config = load_config(environ={"RELAY_SERVER_HTTP_HOST": "0.0.0.0",
                                  "RELAY_SECURITY_ADMIN_TOKEN": "0123456789abcdef0123"})
    config.check_serve()
    assert config.admin_auth_required


def test_the_admin_api_needs_a_token_beyond_loopback_or_once_one_is_set():
    assert not load_config(environ={}).admin_auth_required
    assert load_config(environ={"RELAY_SERVER_HTTP_HOST": "0.0.0.0"}).admin_auth_required
    # On loopback too, a configured token is demanded (set one, and it is checked).
    assert load_config(environ={"RELAY_SECURITY_ADMIN_TOKEN": "0123456789abcdef0123"}
                       ).admin_auth_required


@pytest.mark.parametrize("name, value, allowed", [
    ("RELAY_SECURITY_MODE", "closed", "auto, open, token"),
    ("RELAY_SECURITY_HANDSHAKE_BURST", "0", "1..1000000"),
    ("RELAY_SECURITY_HANDSHAKE_RATE", "-1", "0 (unlimited) or 0.1..1000000.0"),
])
def test_bad_security_values_name_the_variable_and_what_is_allowed(name, value, allowed):
    message = error_of(environ={name: value})
    assert name in message and allowed in message


# -- the command-line tools' keys (relay token mint, relay bot) ------------------------------

def test_minting_keys_come_from_key_texts_and_a_key_file_else_from_the_settings(tmp_path):
    from relay.config import minting_keys

    key_file = write(tmp_path, f'7 = "{KEY_B}"\n', name="keys.toml")
    keys, mint_id = minting_keys([f"1:{KEY_A}", f"3:{KEY_A}"], None, None)
    assert sorted(keys) == [1, 3] and mint_id == 3                 # the newest id mints
    keys, mint_id = minting_keys([f"1:{KEY_A}"], str(key_file), None)
    assert sorted(keys) == [1, 7] and mint_id == 7
    keys, mint_id = minting_keys(None, str(key_file), None)
    assert sorted(keys) == [7] and mint_id == 7
    with pytest.raises(ConfigError, match="^key id 7 is in both --key and --key-file$"):
        minting_keys([f"7:{KEY_A}"], str(key_file), None)
    settings = write(tmp_path, f'[security]\nkeys = "2:{KEY_A} 5:{KEY_B}"\nmint_key_id = 2\n')
    keys, mint_id = minting_keys(None, None, str(settings))
    assert sorted(keys) == [2, 5] and mint_id == 2                 # the settings' mint_key_id
    with pytest.raises(ConfigError, match="^no token key: pass --key"):
        minting_keys([], None, str(write(tmp_path, "", name="empty.toml")))
