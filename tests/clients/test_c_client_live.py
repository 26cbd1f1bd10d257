"""The C client (clients/c/examples/relay_player.c) against a real relay: two players in one
room for about 5 s, the room ended by the admin API; both exit 0 with every frame 0..N-1 once,
the same hash, and that hash is the one computed here from the relay's replay of the room
(relay.client.replay_frames), per the definition in relay_player.c."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from relay.client import replay_frames
from relay_process import RelayProcess, frames_hash

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def relay_server(tmp_path):
    relay = RelayProcess(tmp_path)
    yield relay.udp_port, relay.http_port, relay.replays
    relay.close()


def test_two_c_players(c_build, relay_server):
    udp, http, replays = relay_server
    player = c_build / "relay_player"
    players = [subprocess.Popen([str(player), "--server", f"127.0.0.1:{udp}", "--room", "c-live",
                                 "--player", name, "--seconds", "30", "--leave"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in ("alice", "bob")]
    time.sleep(5)
    request = urllib.request.Request(f"http://127.0.0.1:{http}/rooms/c-live", method="DELETE")
    urllib.request.urlopen(request, timeout=5).read()
    results = []
    for process in players:
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, (out, err[-3000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["errors"] == []
        assert result["gaps"] == 0 and result["duplicates"] == 0
        assert result["end_reason"] == "admin"
        assert result["frames"] == result["final_frames"] > 60
        assert result["first"] == 0 and result["last"] == result["frames"] - 1
    assert results[0]["hash"] == results[1]["hash"]
    assert {r["slot"] for r in results} == {0, 1}
    # the hash is the replay's, computed by Python from relay.client frames
    files = list(replays.glob("c-live-*.replay"))
    assert len(files) == 1
    frames = list(replay_frames(files[0]))
    assert len(frames) == results[0]["frames"]
    assert frames_hash(frames) == results[0]["hash"]


def test_reconnect_rebind_late_join_spectator(c_build, relay_server):
    """alice reconnects (new connection, history from 0 again), bob moves to a new local port,
    carol joins late (history block) and a spectator watches: the players end with the same
    frames as the replay; the spectator with a prefix of them."""
    udp, http, replays = relay_server
    player = c_build / "relay_player"

    def start(name, *extra):
        return subprocess.Popen([str(player), "--server", f"127.0.0.1:{udp}", "--room", "c-mix",
                                 "--player", name, "--seconds", "40", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    processes = [start("alice", "--reconnect-at", "2", "--auto-input-delay"),
                 start("bob", "--rebind-at", "2", "--leave")]
    time.sleep(3)
    processes += [start("carol"), start("watcher", "--spectator")]
    time.sleep(5)
    request = urllib.request.Request(f"http://127.0.0.1:{http}/rooms/c-mix", method="DELETE")
    urllib.request.urlopen(request, timeout=5).read()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, (out, err[-3000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    frames = list(replay_frames(next(replays.glob("c-mix-*.replay"))))
    for result in results:
        assert result["errors"] == [] and result["gaps"] == 0 and result["duplicates"] == 0
        assert result["first"] == 0
        assert frames_hash(frames[:result["frames"]]) == result["hash"]
    for result in results[:3]:
        assert result["frames"] == result["final_frames"] == len(frames)
    assert results[0]["blocks_received"] >= 1 and results[2]["blocks_received"] >= 1
    assert results[3]["slot"] == -1 and results[3]["frames"] > 0
