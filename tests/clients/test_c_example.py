"""The documented game loop (clients/c/examples/relay_example.c, quoted in clients/README.md)
plays a match: two copies in one room of a real relay take the same 90 frames and end with the
same simulation state."""
import re
import subprocess

from relay_process import RelayProcess


def test_two_example_clients_play_a_match_and_agree(c_build, tmp_path):
    relay = RelayProcess(tmp_path, RELAY_REPLAY_ENABLED="false")
    try:
        players = [subprocess.Popen([str(c_build / "relay_example"), "127.0.0.1",
                                     str(relay.udp_port), "example", name, "90"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for name in ("alice", "bob")]
        outputs = [process.communicate(timeout=60) for process in players]
    finally:
        relay.close()
    states = []
    for process, (stdout, stderr) in zip(players, outputs):
        assert process.returncode == 0, stderr
        match = re.fullmatch(r"stopped at frame (\d+), state ([0-9a-f]{16})\n", stdout)
        assert match, stdout
        assert match.group(1) == "90"
        states.append(match.group(2))
    assert states[0] == states[1]
