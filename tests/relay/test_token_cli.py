"""`relay token mint|keygen` and bots in token mode: what a game backend (or an operator
trying things out) does to let players into a token-mode relay."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relay.tools.bot import TokenMinter, run_bots
from relay.cli import main, parse_ttl
from relay.config import load_config, parse_keys, read_key_file
from relay.server import RelayServer
from relay_core.token import ConnectToken, TokenError, generate_key, open_token

REPO = Path(__file__).resolve().parents[2]
KEY_1, KEY_2 = generate_key(), generate_key()


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30), ("5m", 300), ("1h", 3600), ("2d", 172800), ("45", 45), ("2.5", 2.5),
    (" 10s ", 10), ("1.5m", 90),
])
def test_ttl_accepts_seconds_minutes_hours_days_and_plain_seconds(text, seconds):
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "-5s", "5 minutes", "1h30m", "s", "abc", "1e3"])
def test_ttl_refuses_what_it_cannot_read(text):
    with pytest.raises(ValueError, match="ttl"):
        parse_ttl(text)


def test_mint_prints_a_token_the_relay_key_opens(capsys):
    code, out, err = cli(capsys, "token", "mint", "--room", "arena", "--player", "alice",
                         "--ttl", "5m", "--key", f"3:{b64(KEY_1)}", "--user-data", "elo=1500")
    assert code == 0, err
    token = ConnectToken.decode(out.strip())
    claims = open_token({3: KEY_1}, token.private, time.time())
    assert (claims.room, claims.player, claims.user_data) == ("arena", "alice", b"elo=1500")
    assert 290 < claims.expires - time.time() <= 300
    with pytest.raises(TokenError):
        open_token({3: KEY_2}, token.private, time.time())   # another key cannot


def test_mint_json_names_expiry_room_player_and_key(capsys, tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(f'1 = "{b64(KEY_1)}"\n2 = "{b64(KEY_2)}"\n')
    code, out, err = cli(capsys, "token", "mint", "--room", "r", "--player", "p", "--ttl", "30",
                         "--key-file", str(keys), "--json")
    assert code == 0, err
    minted = json.loads(out)
    assert (minted["room"], minted["player"], minted["key_id"]) == ("r", "p", 2)  # highest id
    assert abs(minted["expires"] - (time.time() + 30)) < 5
    assert minted["expires_at"].endswith("Z")
    open_token({2: KEY_2}, ConnectToken.decode(minted["token"]).private, time.time())
    code, out, _ = cli(capsys, "token", "mint", "--room", "r", "--player", "p",
                       "--key-file", str(keys), "--key-id", "1", "--json")
    assert code == 0 and json.loads(out)["key_id"] == 1


def test_mint_reads_the_keys_from_relay_settings(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RELAY_SECURITY_KEYS", f"7:{b64(KEY_1)},8:{b64(KEY_2)}")
    monkeypatch.setenv("RELAY_SECURITY_MINT_KEY_ID", "7")
    config = tmp_path / "relay.toml"
    config.write_text("[server]\ntick_rate = 30\n")
    code, out, err = cli(capsys, "token", "mint", "--room", "r", "--player", "p",
                         "--config", str(config), "--json")
    assert code == 0, err
    assert json.loads(out)["key_id"] == 7                  # security.mint_key_id


@pytest.mark.parametrize("argv, message", [
    ([], "no token key"),
    (["--key", f"1:{b64(KEY_1)}", "--key-id", "9"], "--key-id 9"),
    (["--key", "1:bm90IGEga2V5"], "32 bytes"),
    (["--key", f"1:{b64(KEY_1)}", "--room", "x" * 65], "room"),
])
def test_mint_errors_exit_2_with_a_message(capsys, monkeypatch, argv, message):
    for name in list(os.environ):
        if name.startswith("RELAY_"):
            monkeypatch.delenv(name)
    base = ["token", "mint", "--room", "r", "--player", "p"]
    code, out, err = cli(capsys, *base, *argv)
    assert code == 2 and message in err and out == ""


def test_mint_refuses_a_bad_ttl(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["token", "mint", "--room", "r", "--player", "p", "--ttl", "soon"])
    assert caught.value.code == 2
    assert "ttl" in capsys.readouterr().err


def test_keygen_prints_a_key_file_line_and_an_env_pair(capsys, tmp_path):
    code, out, _ = cli(capsys, "token", "keygen")
    assert code == 0
    path = tmp_path / "keys.toml"
    path.write_text(out)
    [(key_id, key)] = read_key_file(str(path)).items()
    assert key_id == 1 and len(key) == 32
    # The next key goes after the highest id already in the file.
    code, out, _ = cli(capsys, "token", "keygen", "--key-file", str(path))
    with path.open("a") as handle:
        handle.write(out)
    assert sorted(read_key_file(str(path))) == [1, 2]
    code, out, _ = cli(capsys, "token", "keygen", "--env", "--id", "42")
    assert list(parse_keys(out.strip())) == [42]
    assert len({line for line in path.read_text().splitlines()}) == 2   # keys differ


# -- bots in token mode ----------------------------------------------------------------------

def test_bots_mint_their_own_tokens_against_a_token_mode_relay(tmp_path):
    environ = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
               "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_ENABLED": "false",
               "RELAY_SECURITY_MODE": "token", "RELAY_SECURITY_KEYS": f"1:{b64(KEY_1)}"}

    async def scenario():
        server = RelayServer(load_config(environ=environ))
        await server.start()
        try:
            host, port = server.udp_address
            summary = await run_bots(host, port, rooms=2, players=2, seconds=1.5,
                                     minter=TokenMinter(1, KEY_1))
            refused = await run_bots(host, port, rooms=1, players=1, seconds=0.5,
                                     start_timeout=2.0)               # no token
            return summary, refused
        finally:
            await server.stop()

    summary, refused = asyncio.run(scenario())
    assert summary["errors"] == [] and summary["frames_per_bot_min"] > 10
    assert summary["gaps"] == summary["duplicates"] == summary["mismatches"] == 0
    assert refused["errors"] and "token_required" in refused["errors"][0]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_relay_bot_command_with_a_key_plays_on_relay_serve_in_token_mode(tmp_path):
    port = _free_udp_port()
    key_file = tmp_path / "keys.toml"
    key_file.write_text(f'1 = "{b64(KEY_1)}"\n')
    key_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    server_env = dict(env, RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(port),
                      RELAY_SERVER_HTTP_PORT="0", RELAY_REPLAY_ENABLED="false",
                      RELAY_SECURITY_MODE="token", RELAY_SECURITY_KEYS_FILE=str(key_file))
    server = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=server_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            bot = subprocess.run(
                [sys.executable, "-m", "relay.cli", "bot", "--server", f"127.0.0.1:{port}",
                 "--players", "2", "--seconds", "1.5", "--key-file", str(key_file), "--json"],
                capture_output=True, text=True, timeout=60, env=env)
            summary = json.loads(bot.stdout)
            if bot.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)          # the relay may still be starting
        assert bot.returncode == 0, (summary, bot.stderr)
        assert summary["frames_per_bot_min"] > 10
    finally:
        server.terminate()
        server.wait(timeout=15)
