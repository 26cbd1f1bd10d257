"""`relay bot` options: --room (every bot in one named room), --rooms, --room-prefix."""
from __future__ import annotations

import argparse
import asyncio

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
