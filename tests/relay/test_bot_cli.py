"""`relay bot` options: --room (every bot in one named room), --rooms, --room-prefix."""
from __future__ import annotations

import argparse
import asyncio
import socket

import pytest

from relay.tools import bot
from relay.cli import main
from relay.config import load_config
from relay.server import RelayServer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relay bot")
    bot.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults():
    args = parse()
    assert (args.rooms, args.players, args.seconds, args.room_prefix, args.room) == (1, 2, 10.0, "bots", None)


def test_room_names_one_room_for_all_bots():
    args = parse("--room", "lobby-1", "--players", "3")
    assert args.room == "lobby-1"
    assert bot.room_names(args.rooms, args.room_prefix, args.room) == ["lobby-1"]


def test_generated_room_names_use_the_prefix():
    names = bot.room_names(3, "soak")
    assert len(names) == 3 and len(set(names)) == 3
    assert all(name.startswith("soak-") for name in names)
    assert [name.rsplit("-", 1)[1] for name in names] == ["0", "1", "2"]


def test_room_excludes_room_prefix_and_several_rooms(capsys):
    with pytest.raises(SystemExit):
        parse("--room", "a", "--room-prefix", "b")
    with pytest.raises(SystemExit):
        parse("--room", "x" * 65)
    assert main(["bot", "--room", "a", "--rooms", "2"]) == 2
    assert "--room" in capsys.readouterr().err
    with pytest.raises(ValueError):
        bot.room_names(2, room="a")


def test_help_gives_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["bot", "--help"])
    out = capsys.readouterr().out
    for text in ("--room NAME", "(default 1)", "(default 2)", "(default 10.0)", "(default bots)"):
        assert text in out, text


def test_bots_join_the_named_room():
    environ = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
               "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_ENABLED": "false"}

    async def scenario():
        server = RelayServer(load_config(environ=environ))
        await server.start()
        try:
            host, port = server.udp_address
            summary = await bot.run_bots(host, port, rooms=1, players=3, seconds=1.0,
                                         room="lobby-7")
            room = server.rooms.get("lobby-7")
            return summary, sorted(server.rooms), [s.player for s in room.slots] if room else None
        finally:
            await server.stop()

    summary, rooms, players = asyncio.run(scenario())
    assert summary["errors"] == [] and summary["rooms"] == 1 and summary["bots"] == 3
    assert summary["frames_per_bot_min"] > 5 and summary["mismatches"] == 0
    assert rooms == ["lobby-7"]
    assert players == ["bot0", "bot1", "bot2"]


# -- honest results: a bot short of frames says why, and `relay bot` exits 1 ---------------------

BASE = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
        "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_ENABLED": "false"}


def play(seconds: float, action=None, after: float = 0.6, players: int = 2,
         bot_options: dict | None = None, **settings):
    """Bots in one room "r" of an in-process relay; ``action(server)`` runs ``after`` seconds in."""
    environ = {**BASE, **{f"RELAY_{key.upper()}": value for key, value in settings.items()}}

    async def scenario():
        server = RelayServer(load_config(environ=environ))
        await server.start()
        try:
            host, port = server.udp_address

            async def later():
                await asyncio.sleep(after)
                result = action(server)
                if asyncio.iscoroutine(result):
                    await result

            task = asyncio.ensure_future(later()) if action else None
            summary = await bot.run_bots(host, port, rooms=1, players=players, seconds=seconds,
                                         room="r", start_timeout=3.0, **(bot_options or {}))
            if task is not None:
                await task
            return summary
        finally:
            await server.stop()

    return asyncio.run(scenario())


def test_a_room_ended_by_a_drain_is_an_error_with_the_end_reason():
    summary = play(2.0, lambda server: server.drain(), server_drain_timeout="0")
    assert summary["short_bots"] == 2 and len(summary["errors"]) == 2
    assert all("ended early (drain_deadline" in error for error in summary["errors"])
    assert summary["end_reasons"] == {"drain_deadline": 2}
    assert "rooms ended: drain_deadline (2 bots)" in bot.format_summary(summary)


def test_a_kicked_bot_is_an_error():
    summary = play(2.0, lambda server: server.kick("r", "bot1"))
    assert summary["kicked"] == ["r/bot1"]
    assert summary["errors"] == [summary["errors"][0]] and "r/bot1: kicked" in summary["errors"][0]
    assert "kicked: r/bot1" in bot.format_summary(summary)


def test_a_relay_that_disappears_is_an_error():
    async def vanish(server):
        # As if the process were killed: no more frames, nobody told.
        await server._scheduler.stop()
        server.driver.close()

    summary = play(2.5, vanish, after=0.8)
    assert summary["short_bots"] == 2
    assert all("stopped sending" in error and "127.0.0.1:" in error for error in summary["errors"])


def test_a_full_run_has_no_errors():
    summary = play(1.5)
    assert summary["errors"] == [] and summary["short_bots"] == 0 and summary["kicked"] == []
    assert summary["end_reasons"] == {}


def test_connect_failure_names_the_address():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]          # bound, silent: nothing answers there

        async def scenario():
            return await bot.run_bots("127.0.0.1", port, rooms=1, players=1, seconds=0.5,
                                      start_timeout=0.5)

        summary = asyncio.run(scenario())
    assert len(summary["errors"]) == 1
    assert f"cannot connect to 127.0.0.1:{port}" in summary["errors"][0]


def test_auto_input_delay_follows_the_relay_advice():
    advice = {"server_tick_rate": "60", "rooms_input_delay_min": "4", "rooms_input_delay_max": "4"}
    summary = play(2.0, **advice)
    assert summary["errors"] == [] and summary["gaps"] == 0
    assert summary["advised_input_delay"] == 4 and summary["input_delay"] == [2]
    summary = play(2.0, bot_options={"input_delay": 1, "auto_input_delay": True}, **advice)
    assert summary["errors"] == [] and summary["gaps"] == 0 and summary["mismatches"] == 0
    assert summary["input_delay"] == [4]


def test_late_inputs_get_a_hint():
    summary = {"late_input_share": 0.37, "advised_input_delay": 5}
    hint = bot.late_input_hint(summary, 2, auto=False)
    assert "37%" in hint and "--input-delay (now 2)" in hint and "--auto-input-delay" in hint
    assert "advised 5" in hint
    assert bot.late_input_hint({"late_input_share": 0.01}, 2, auto=False) is None
    report = bot.BotReport("r", "b", inputs_missing=3, latencies=[0.01] * 97)
    assert bot.late_share([report]) == 0.03


def test_every_option_has_help_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["bot", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    parser = argparse.ArgumentParser()
    bot.add_arguments(parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, action.dest
            assert "default" in action.help.lower(), action.dest
    for text in ("--auto-input-delay", "--start-timeout", "(default 10.0)"):
        assert text in out, text


def test_relay_bot_exits_1_when_the_relay_is_killed(capsys):
    """`relay bot` against a real `relay serve` killed mid-run: exit 1, the reason printed."""
    import json
    import subprocess
    import sys
    import threading
    from pathlib import Path

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    relay = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "serve", "--udp-port", str(port), "--http-port", "0",
         "--set", "replay.enabled=false"], cwd=Path(__file__).resolve().parents[2],
        stderr=subprocess.PIPE, text=True)
    try:
        for line in relay.stderr:          # wait until it listens
            if "event='started'" in line:
                break
        killer = threading.Timer(1.5, relay.kill)
        killer.start()
        assert main(["bot", "--server", f"127.0.0.1:{port}", "--seconds", "3.5", "--json"]) == 1
        killer.join()
    finally:
        relay.kill()
        relay.wait(timeout=10)
        relay.stderr.close()
    summary = json.loads(capsys.readouterr().out)
    assert summary["short_bots"] == 2
    assert all(f"127.0.0.1:{port}" in error for error in summary["errors"])
