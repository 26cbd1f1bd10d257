"""Interop: the C client (clients/c/examples/relay_player.c), the C# bot (clients/csharp) and
the Python SDK play in one room of a real `relay serve`, with `relay bot` players beside them,
and every one of them sees the identical frame stream, hashed the same way, from frame 0 to
the room's last frame: a late joiner (history block), a player that reconnects mid-match and a
spectator included; once more through `relay netem` at 10 % loss, and once in token mode.

Each scenario: the room is created with the `admin` start policy, started once the first
clients are in, ended by the admin API after a fixed time; every client runs until it has
taken every frame the room produced (relay_client_finished), then prints one JSON line.
"""
import asyncio
import base64
import json
import os
import subprocess
import sys
import time

import pytest

from native import ROOT, build_c_library
from relay_process import FNV_OFFSET, RelayProcess, fnv1a, frame_bytes, free_port

from relay.client import RelayClient
from relay_core.token import mint_token

CSHARP = ROOT / "clients" / "csharp"
TOKEN_KEY = bytes(range(32))


@pytest.fixture(scope="module")
def native_clients():
    """The C player and the C# bot, built once for the module."""
    build = build_c_library()
    player = build / "relay_player"
    assert player.exists(), "relay_player was not built"
    result = subprocess.run(["bash", str(CSHARP / "build.sh")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    bot = CSHARP / "build" / "Bot.exe"
    assert bot.exists()
    return {"c": player, "csharp": bot, "lib": build}


async def sdk_player(host, port, room, player, token=None, input_delay=2) -> dict:
    """The Python SDK as a fourth client: plays and hashes every frame, like relay_player."""
    client = await RelayClient.connect(host, port, room, player, token=token,
                                       input_delay=input_delay, timeout=10)
    state, frames, last = FNV_OFFSET, 0, -1
    try:
        await client.wait_for_state("running", timeout=30)
        client.send_next_input(player.encode()[:4] + b"\x00")
        async for frame in client.frames():
            assert frame.number == last + 1, "gap or duplicate in the SDK's stream"
            last = frame.number
            state = fnv1a(frame_bytes(frame), state)
            frames += 1
            client.send_next_input(bytes([frame.number & 0xFF]) + player.encode()[:3])
    finally:
        await client.close()
    return {"player": player, "frames": frames, "gaps": 0, "duplicates": 0,
            "hash": f"{state:016x}", "final_frames": client.final_frames, "errors": []}


async def run_process(args, env=None, delay=0.0) -> dict:
    await asyncio.sleep(delay)
    process = await asyncio.create_subprocess_exec(
        *map(str, args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    lines = [line for line in stdout.decode().splitlines() if line.startswith("{")]
    assert lines, f"{args[0]} printed no JSON (exit {process.returncode}): {stderr.decode()[-2000:]}"
    result = json.loads(lines[-1])
    result["exit"] = process.returncode
    result["stderr"] = stderr.decode()[-2000:]
    return result


async def wait_for_players(relay: RelayProcess, room: str, count: int, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = await asyncio.to_thread(relay.http, "GET", f"/rooms/{room}")
            if sum(1 for p in info["players"] if p["connected"]) >= count:
                return
        except Exception:
            pass
        assert time.monotonic() < deadline, f"fewer than {count} players joined {room}"
        await asyncio.sleep(0.1)


def play_match(relay: RelayProcess, native: dict, port: int, *, tokens=None, reconnect=True,
               late_join=True, bots=2, seconds=10.0) -> list[dict]:
    """One room: C, C#, SDK and `relay bot` players from the start, a late C joiner, a C
    player that reconnects; the admin ends the room after ``seconds`` of play."""
    room = "interop"
    relay.http("POST", "/rooms", {"room": room, "start_policy": "admin"})
    server = f"127.0.0.1:{port}"
    mono_env = dict(os.environ, LD_LIBRARY_PATH=str(native["lib"]))
    tokens = tokens or {}

    def token_args(player):
        return ["--token", tokens[player]] if player in tokens else []

    async def scenario():
        clients = [
            run_process([native["c"], "--server", server, "--room", room, "--player", "c1",
                         "--seconds", 80, *token_args("c1")]),
            run_process(["mono", native["csharp"], "--server", server, "--room", room,
                         "--player", "cs1", "--seconds", 80, *token_args("cs1")], env=mono_env),
            sdk_player("127.0.0.1", port, room, "py1", token=tokens.get("py1")),
        ]
        if not tokens:      # a spectator (delayed frames, the tail sent when the room ends)
            clients.append(run_process([native["c"], "--server", server, "--room", room,
                                        "--player", "watcher", "--spectator", "--seconds", 80]))
        if reconnect:
            clients.append(run_process([native["c"], "--server", server, "--room", room,
                                        "--player", "c2", "--seconds", 80,
                                        "--reconnect-at", 5, *token_args("c2")]))
        if bots:
            bot_args = [sys.executable, "-m", "relay.cli", "bot", "--server", server, "--room",
                        room, "--players", bots, "--seconds", seconds - 2, "--json"]
            if tokens:
                bot_args += ["--key", f"1:{base64.b64encode(TOKEN_KEY).decode()}"]
            bot_task = asyncio.ensure_future(run_process(bot_args))
        tasks = [asyncio.ensure_future(c) for c in clients]
        await wait_for_players(relay, room, len(clients) + bots - (0 if tokens else 1))
        await asyncio.to_thread(relay.http, "POST", f"/rooms/{room}/start")
        if late_join:
            tasks.append(asyncio.ensure_future(run_process(
                [native["c"], "--server", server, "--room", room, "--player", "late",
                 "--seconds", 80, *token_args("late")], delay=3.0)))
        await asyncio.sleep(seconds)
        await asyncio.to_thread(relay.http, "DELETE", f"/rooms/{room}")
        results = await asyncio.gather(*tasks)
        if bots:
            bot = await bot_task
            assert bot["exit"] == 0 and not bot["errors"], bot
            assert bot["gaps"] == 0 and bot["duplicates"] == 0 and bot["mismatches"] == 0, bot
        return results

    return asyncio.run(scenario())


def check_identical_streams(results: list[dict]):
    for result in results:
        assert result.get("exit", 0) == 0 and not result["errors"], result
        assert result["gaps"] == 0 and result["duplicates"] == 0, result
        assert result["frames"] == result["final_frames"] > 0, result
    hashes = {r["player"]: r["hash"] for r in results}
    assert len(set(hashes.values())) == 1, hashes
    print(f"interop: {len(results)} clients, {results[0]['frames']} frames each, "
          f"0 mismatches, hash {results[0]['hash']}: "
          + ", ".join(f"{r['player']} {r['frames']}" for r in results))


def test_c_csharp_and_python_clients_see_the_identical_stream(tmp_path, native_clients):
    relay = RelayProcess(tmp_path, RELAY_REPLAY_ENABLED="false")
    try:
        results = play_match(relay, native_clients, relay.udp_port)
    finally:
        relay.close()
    check_identical_streams(results)
    assert {r["player"] for r in results} == {"c1", "cs1", "py1", "watcher", "c2", "late"}
    assert min(r["frames"] for r in results) >= 200           # >= 10 s at 30 Hz of play


def test_identical_streams_through_netem_at_10_percent_loss(tmp_path, native_clients):
    relay = RelayProcess(tmp_path, RELAY_REPLAY_ENABLED="false")
    netem_port = free_port()
    netem = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "netem", "--listen", f"127.0.0.1:{netem_port}",
         "--upstream", f"127.0.0.1:{relay.udp_port}", "--loss", "10", "--delay", "10",
         "--seed", "15", "--duration", "120"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        results = play_match(relay, native_clients, netem_port)
    finally:
        netem.terminate()
        netem.wait(timeout=10)
        relay.close()
    check_identical_streams(results)


def test_identical_streams_in_token_mode(tmp_path, native_clients):
    key = base64.b64encode(TOKEN_KEY).decode()
    relay = RelayProcess(tmp_path, RELAY_REPLAY_ENABLED="false", RELAY_SECURITY_MODE="token",
                         RELAY_SECURITY_KEYS=f"1:{key}")
    tokens = {player: mint_token(TOKEN_KEY, 1, "interop", player, 120).encode()
              for player in ("cs1", "py1", "late")}
    # as a game backend without Python would: the CLI's token text, straight to the C client
    minted = subprocess.run([sys.executable, "-m", "relay.cli", "token", "mint", "--room",
                             "interop", "--player", "c1", "--ttl", "120", "--key", f"1:{key}"],
                            capture_output=True, text=True, check=True)
    tokens["c1"] = minted.stdout.strip()
    assert tokens["c1"].startswith("rt1.")
    try:
        results = play_match(relay, native_clients, relay.udp_port, tokens=tokens,
                             reconnect=False)
    finally:
        relay.close()
    check_identical_streams(results)
