"""The example game client (examples/lockstep_client.py) against an in-process relay."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
import zlib
from pathlib import Path

from relay.config import load_config
from relay.server import RelayServer

ROOT = Path(__file__).resolve().parents[2]
TICK_RATE = 60


def _load_example():
    spec = importlib.util.spec_from_file_location("lockstep_client",
                                                  ROOT / "examples" / "lockstep_client.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


example = _load_example()


def _config(tmp_path: Path):
    return load_config(environ={
        "RELAY_SERVER_UDP_HOST": "127.0.0.1",
        "RELAY_SERVER_UDP_PORT": "0",
        "RELAY_SERVER_HTTP_HOST": "127.0.0.1",
        "RELAY_SERVER_HTTP_PORT": "0",
        "RELAY_SERVER_TICK_RATE": str(TICK_RATE),
        "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays"),
    })


def _play(tmp_path: Path, players: list[dict], deadline: float = 60.0):
    """Run a relay and one example client per entry of ``players`` (keyword arguments of
    ``run()``, plus an optional ``start_after`` in seconds); returns (results, desyncs counted
    by the relay)."""

    async def main():
        server = RelayServer(_config(tmp_path))
        await server.start()
        try:
            host, port = server.udp_address

            async def player(options: dict):
                options = dict(options)
                await asyncio.sleep(options.pop("start_after", 0.0))
                return await example.run(host, port, **options)

            results = await asyncio.wait_for(asyncio.gather(*(player(p) for p in players)),
                                             deadline)
            desyncs = server.metrics.registry.get_sample_value("relay_desyncs_total")
        finally:
            await asyncio.wait_for(server.stop("test over"), 10)
        return results, desyncs

    return asyncio.run(main())


def _spawn(slot: int, player: str) -> tuple[int, int]:
    world = example.World()
    world.apply(example.Frame(0, [None] * (slot + 1), [["join", slot, player]]))
    dot = world.dots[slot]
    return dot.x, dot.y


def test_two_players_end_in_the_same_state(tmp_path):
    frames = 120
    results, relay_desyncs = _play(tmp_path, [
        dict(room="duel", player="alice", frames=frames),
        dict(room="duel", player="bob", frames=frames),
    ])
    alice, bob = results
    for result in results:
        assert result.error is None, result.error
        assert result.frames == frames
        assert result.desyncs == []
        assert result.inputs_sent >= frames
        assert sorted(result.checksums) == [29, 59, 89, 119]
    assert {alice.slot, bob.slot} == {0, 1}
    assert alice.state == bob.state
    assert alice.checksums == bob.checksums
    assert relay_desyncs == 0
    last_frame, dots = alice.state
    assert last_frame == frames - 1
    assert [(slot, player) for slot, player, *_ in dots] == sorted(
        [(alice.slot, "alice"), (bob.slot, "bob")])
    # The inputs really travelled: every dot walked away from where it spawned.
    for slot, player, x, y, active in dots:
        assert active
        assert (x, y) != _spawn(slot, player)


def test_late_joiner_catches_up_from_the_history(tmp_path):
    frames = 150
    results, relay_desyncs = _play(tmp_path, [
        dict(room="late", player="alice", frames=frames),
        dict(room="late", player="bob", frames=frames),
        dict(room="late", player="carol", frames=frames, start_after=0.8),
    ])
    alice, bob, carol = results
    for result in results:
        assert result.error is None, result.error
        assert result.frames == frames
        assert result.desyncs == []
    assert carol.slot == 2
    assert alice.live_from == bob.live_from == 0
    assert carol.live_from > 0          # frames 0 .. live_from-1 came as the history block
    assert alice.state == bob.state == carol.state
    assert alice.checksums == bob.checksums == carol.checksums
    assert [player for _, player, *_ in carol.state[1]] == ["alice", "bob", "carol"]
    assert relay_desyncs == 0


def test_a_diverging_player_is_reported(tmp_path):
    # Not what a game wants, but it shows that the equality above is checked by the relay too.
    frames = 90
    results, relay_desyncs = _play(tmp_path, [
        dict(room="cheat", player="alice", frames=frames),
        dict(room="cheat", player="bob", frames=frames, perturb_at=40),
    ])
    alice, bob = results
    assert alice.checksums[29] == bob.checksums[29]
    assert alice.checksums[59] != bob.checksums[59]
    for result in results:
        assert result.error is None, result.error
        desync_frames = [desync[0] for desync in result.desyncs]
        assert 59 in desync_frames and 29 not in desync_frames
        frame, checksums, minority, verdict, groups = result.desyncs[desync_frames.index(59)]
        assert checksums == {"alice": alice.checksums[59], "bob": bob.checksums[59]}
        assert minority == [] and verdict == "undecided"   # one against one: nobody is the minority
    assert relay_desyncs >= 1


def _doc_examples() -> dict[str, tuple[bytes, int | None]]:
    """The hex dumps of docs/RELAY_PROTOCOL.md marked ``<!-- example: NAME -->``: the bytes of
    each line's leading hex column (the comment is separated by two or more spaces), and the
    total the dump states ("NN bytes"), if any."""
    import re

    text = (ROOT / "docs" / "RELAY_PROTOCOL.md").read_text()
    examples = {}
    for match in re.finditer(r"<!-- example: ([\w-]+) -->\n```\n(.*?)```", text, re.S):
        data, total = bytearray(), None
        for line in match.group(2).splitlines():
            column = re.split(r"\s{2,}", line.strip())[0]
            if re.fullmatch(r"[0-9A-F]{2}( [0-9A-F]{2})*", column):
                data += bytes.fromhex(column)
            elif re.fullmatch(r"\d+ bytes", line.strip()):
                total = int(line.split()[0])
        examples[match.group(1)] = (bytes(data), total)
    return examples


def test_protocol_doc_worked_examples():
    from relay import protocol
    from relay_core import decode_packet

    examples = _doc_examples()
    assert set(examples) == {"frame", "frame-next", "input", "input-datagram", "history"}
    frame = protocol.Frame(1000, [b"\x01\xff", None, b"\x00\x01"], [["join", 2, "carol"]]).encode()
    message = protocol.Input(1002, b"\x01\xff", 1000).encode()
    assert examples["frame"] == (frame, 21)
    following = protocol.Frame(1001, [b"\x01\xff", b"\x00\x00", b"\x00\x02"], [], [1])
    assert examples["frame-next"] == (following.encode([b"\x01\xff", None, b"\x00\x01"]), 14)
    assert protocol.decode_frame(examples["frame-next"][0],
                                 [b"\x01\xff", None, b"\x00\x01"]) == following
    assert examples["input"] == (message, 12)
    assert protocol.decode_relay_message(frame) == protocol.Frame(
        1000, [b"\x01\xff", None, b"\x00\x01"], [["join", 2, "carol"]])
    assert protocol.decode_client_message(message) == protocol.Input(1002, b"\x01\xff", 1000)

    datagram, total = examples["input-datagram"]
    assert total == len(datagram) == 36
    assert decode_packet(datagram) == {
        "type": "data", "session_id": 0x1A2B3C4D, "seq": 1234, "ack": 1240,
        "ack_bits": 0xFFFFFFFF, "send_time": 0x5000, "echo_time": 0x4FD0,
        "records": [{"kind": "message", "channel": 1, "msg_id": 1003, "payload": message.hex()}],
    }

    history, _ = examples["history"]
    assert history == protocol.pack(1000, [frame])
    assert protocol.decode_history(zlib.compress(history)) == (1000, [frame])

    text = " ".join((ROOT / "docs" / "RELAY_PROTOCOL.md").read_text().split())
    for message in (protocol.Join("lobby-1", "alice", False).encode(),
                    protocol.room_state("running", 0),
                    protocol.Checksum(59, 0xB905CBAEA759424B).encode()):
        assert f"`{message.hex(' ').upper()}`" in text


def test_two_players_with_connect_tokens(tmp_path):
    """Against a token-mode relay the example joins with the token alone (it names the room and
    the player); without one the relay refuses it as the SDK reports: token_required."""
    import base64

    import pytest

    from relay.client import RelayError
    from relay_core.token import generate_key, mint_token

    key = generate_key()

    async def main():
        config = load_config(environ={
            "RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
            "RELAY_SERVER_HTTP_HOST": "127.0.0.1", "RELAY_SERVER_HTTP_PORT": "0",
            "RELAY_SERVER_TICK_RATE": str(TICK_RATE),
            "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays"),
            "RELAY_SECURITY_MODE": "token",
            "RELAY_SECURITY_KEYS": f"1:{base64.b64encode(key).decode()}",
        })
        server = RelayServer(config)
        await server.start()
        try:
            host, port = server.udp_address
            with pytest.raises(RelayError) as refused:
                await example.run(host, port, "tokens", "mallory", 10, timeout=5)
            tokens = [mint_token(key, 1, room="tokens", player=name, ttl=60).encode()
                      for name in ("alice", "bob")]
            results = await asyncio.wait_for(asyncio.gather(
                *(example.run(host, port, None, None, 60, token=token) for token in tokens)), 60)
        finally:
            await asyncio.wait_for(server.stop("test over"), 10)
        return refused.value, results

    refused, (alice, bob) = asyncio.run(main())
    assert refused.code == "token_required"
    assert (alice.player, bob.player) == ("alice", "bob")
    for result in (alice, bob):
        assert result.error is None, result.error
        assert result.frames == 60 and result.desyncs == []
    assert alice.state == bob.state and alice.checksums == bob.checksums


def test_another_machine_recipe_of_the_examples_readme(tmp_path):
    """examples/README.md's "Another machine" recipe as commands, with 127.0.0.1 for the relay
    machine's address: a key from `relay token keygen`, `relay serve` in token mode with it, one
    `relay token mint` per player, and the example client run with --token alone."""
    import subprocess

    sys.path.insert(0, str(ROOT / "tests" / "clients"))
    from relay_process import RelayProcess

    relay = [sys.executable, "-m", "relay.cli"]
    keys = tmp_path / "keys.toml"
    keys.write_text(subprocess.run(relay + ["token", "keygen"], check=True, cwd=ROOT,
                                   capture_output=True, text=True).stdout)
    server = RelayProcess(tmp_path, RELAY_SECURITY_MODE="token",
                          RELAY_SECURITY_KEYS_FILE=str(keys))
    try:
        tokens = [subprocess.run(relay + ["token", "mint", "--room", "demo", "--player", name,
                                          "--ttl", "5m", "--key-file", str(keys)],
                                 check=True, cwd=ROOT, capture_output=True, text=True).stdout.strip()
                  for name in ("alice", "bob")]
        players = [subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "lockstep_client.py"),
             f"127.0.0.1:{server.udp_port}", "--token", token, "--frames", "60"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for token in tokens]
        outputs = [player.communicate(timeout=60)[0] for player in players]
    finally:
        server.close()
    for player, output in zip(players, outputs):
        assert player.returncode == 0, output
    alice, bob = ([line.split("] ", 1)[1] for line in output.splitlines() if "checksum" in line]
                  for output in outputs)
    assert outputs[0].startswith("[alice] joined room demo") and outputs[1].startswith("[bob] joined")
    assert alice[:2] == bob[:2] and len(alice) == 3     # frames 29 and 59, then the summary
    assert alice[2].startswith("done: 60 frames") and alice[2] == bob[2]
