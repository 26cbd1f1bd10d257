"""The C# binding (clients/csharp): it compiles with mono's mcs at Unity's language level, its
structs have the C header's layout, and its bot plays a real relay.

A missing mcs, mono or gcc is a failure, not a skip: the binding is part of the product."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from relay_process import RelayProcess, fnv1a

ROOT = Path(__file__).resolve().parents[2]
CSHARP = ROOT / "clients" / "csharp"
HEADER_DIR = ROOT / "clients" / "c" / "include"

LAYOUTS = {
    "relay_event_t": ["type", "room_state", "slot", "spectator", "tick_rate", "next_frame",
                      "history", "frame", "delay_frames", "response_ms", "late", "inputs",
                      "code", "text"],
    "relay_client_stats_t": ["rtt", "rtt_variance", "loss", "packets_sent", "packets_received",
                             "bytes_sent", "bytes_received", "frames_received",
                             "frames_duplicate", "blocks_received", "datagrams_dropped",
                             "events_dropped", "live_frames_dropped", "redundancy_mode",
                             "reserved", "burst_length"],
    "relay_frame_t": ["number", "slot_count", "event_count"],
    "relay_frame_event_t": ["kind", "slot", "name_length", "name"],
    "relay_client_config_t": ["allocate", "release", "allocator_context", "random_bytes",
                              "random_context", "mtu", "connect_timeout", "peer_timeout",
                              "heartbeat_interval", "ack_delay", "max_message_size",
                              "reassembly_limit", "max_block_size", "max_history_size",
                              "frame_buffer_bytes", "frame_buffer_count", "input_delay",
                              "auto_input_delay", "max_input_size", "send_queue", "event_queue"],
}


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed (apt-get install mono-mcs mono-runtime gcc)")
    return path


@pytest.fixture(scope="module")
def csharp_build(tmp_path_factory) -> Path:
    require("mcs")
    require("mono")
    out = tmp_path_factory.mktemp("csharp")
    result = subprocess.run(["sh", str(CSHARP / "build.sh"), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_binding_and_bot_compile_with_warnings_as_errors(csharp_build):
    assert (csharp_build / "Relay.Client.dll").stat().st_size > 0
    assert (csharp_build / "Bot.exe").stat().st_size > 0


def test_unity_package_files():
    manifest = json.loads((CSHARP / "package.json").read_text())
    assert manifest["name"] == "com.relay.client"
    assert manifest["unity"] == "2021.3"
    for key in ("version", "displayName", "description"):
        assert manifest[key]
    asmdef = json.loads((CSHARP / "Runtime" / "Relay.Client.asmdef").read_text())
    assert asmdef["allowUnsafeCode"] is True
    native = (CSHARP / "Runtime" / "Native.cs").read_text()
    assert 'const string Library = "relay_client"' in native
    assert "#if UNITY_IOS && !UNITY_EDITOR" in native and '"__Internal"' in native
    assert (CSHARP / "Runtime" / "Plugins" / "README.md").exists()
    tracked = subprocess.run(["git", "ls-files", "--", "clients/csharp/Runtime/Plugins"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    committed = [p for p in tracked if Path(p).suffix in (".so", ".dll", ".dylib", ".a", ".bundle")]
    assert committed == [], "native binaries must not be committed"
    # A git-URL package is read-only: Unity ignores any asset without a .meta file.
    files = subprocess.run(["git", "ls-files", "--others", "--cached", "--exclude-standard", "--",
                            "clients/csharp"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assets = {Path(f).relative_to("clients/csharp") for f in files if not f.endswith(".meta")}
    # Unity skips hidden folders and those ending in "~" (Tests~).
    assets = {a for a in assets if not any(p.endswith("~") or p.startswith(".") for p in a.parts)}
    assets |= {parent for a in assets for parent in a.parents if parent != Path(".")}
    missing = sorted(str(a) for a in assets if a.name != ".gitignore"
                     and not (CSHARP / a.parent / (a.name + ".meta")).exists())
    assert missing == [], f"no .meta (run clients/csharp/gen_meta.py): {missing}"


def test_every_header_function_is_imported():
    header = (HEADER_DIR / "relay_client.h").read_text()
    native = (CSHARP / "Runtime" / "Native.cs").read_text()
    functions = set(re.findall(r"RELAY_API[^;(]*?\b(relay_\w+)\s*\(", header))
    assert len(functions) > 30
    missing = [name for name in sorted(functions) if f" {name}(" not in native]
    assert not missing, f"not imported in Native.cs: {missing}"


def c_layouts(tmp_path: Path) -> dict:
    require("gcc")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "relay_client.h"',
             'int main(void) {', '    printf("{");']
    for index, (type_name, fields) in enumerate(LAYOUTS.items()):
        parts = ['\\"size\\": %zu'] + [f'\\"{f}\\": %zu' for f in fields]
        args = [f"sizeof({type_name})"] + [f"offsetof({type_name}, {f})" for f in fields]
        sep = ", " if index else ""
        lines.append(f'    printf("{sep}\\"{type_name}\\": {{{", ".join(parts)}}}", {", ".join(args)});')
    lines += ['    printf("}\\n");', '    return 0;', '}']
    source = tmp_path / "layouts.c"
    source.write_text("\n".join(lines) + "\n")
    binary = tmp_path / "layouts"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", f"-I{HEADER_DIR}", str(source), "-o",
                    str(binary)], check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(binary)], check=True, capture_output=True,
                                     text=True).stdout)


def test_struct_layouts_match_the_c_header(csharp_build, tmp_path):
    expected = c_layouts(tmp_path)
    result = subprocess.run(["mono", str(csharp_build / "Bot.exe"), "--selftest"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    actual = json.loads(result.stdout)
    assert set(actual) == set(LAYOUTS)
    for type_name in LAYOUTS:
        assert actual[type_name] == expected[type_name], type_name


# ---- against a scripted stand-in of the library (clients/csharp/Tests~/relay_client_stub.c) ----

@pytest.fixture(scope="module")
def stub_library(csharp_build, tmp_path_factory) -> Path:
    require("gcc")
    out = tmp_path_factory.mktemp("stub")
    subprocess.run(["gcc", "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
                    "-shared", "-fPIC", f"-I{HEADER_DIR}", str(CSHARP / "Tests~" / "relay_client_stub.c"),
                    "-o", str(out / "librelay_client.so")], check=True, capture_output=True, text=True)
    return out


def run_mono(exe: Path, library_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=f"{library_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return subprocess.run(["mono", str(exe), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_binding_surface_against_the_scripted_library(csharp_build, stub_library):
    exe = csharp_build / "ApiCheck.exe"
    subprocess.run(["mcs", "-nologo", "-langversion:7.2", "-warnaserror",
                    f"-r:{csharp_build / 'Relay.Client.dll'}", f"-out:{exe}",
                    str(CSHARP / "Tests~" / "ApiCheck.cs")], check=True, capture_output=True, text=True)
    result = run_mono(exe, stub_library)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def stub_stream_hash(frames: int) -> str:
    """The bot's hash of the stub's scripted frames, computed independently."""
    value = 0xcbf29ce484222325
    for n in range(frames):
        data = struct.pack("<II", n, 3)
        for payload in (bytes([n & 0xFF, ord("a")]), None if n % 3 == 0 else b"\x01\x02\x03", b""):
            data += b"\xff" if payload is None else struct.pack("<BH", 1, len(payload)) + payload
        events = {0: [(0, 0, "alice"), (0, 1, "b\u00f6b")], 7: [(1, 0, "alice")]}.get(n, [])
        data += struct.pack("<I", len(events))
        for kind, slot, name in events:
            raw = name.encode()
            data += struct.pack("<BIB", kind, slot, len(raw)) + raw
        value = fnv1a(data, value)
    return f"{value:016x}"


def test_bot_hash_and_zero_allocation_against_the_scripted_library(csharp_build, stub_library):
    result = run_mono(csharp_build / "Bot.exe", stub_library, "--server", "127.0.0.1:7777",
                      "--room", "r\u00e9", "--player", "p", "--input-delay", "3", "--seconds", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip())
    assert report["errors"] == []
    assert (report["frames"], report["first"], report["last"]) == (300, 0, 299)
    assert report["final_frames"] == 300 and report["end_reason"] == "admin"
    assert report["slot"] == 1 and report["inputs_sent"] > 100 and report["input_delay"] == 3
    assert report["hash"] == stub_stream_hash(300)
    assert report["gc_counter"] == "allocated_bytes_for_current_thread"
    assert report["gc_frames_measured"] == 270 and report["gc_bytes_per_frame"] == 0


# ---- against a real relay -------------------------------------------------------------------

def relay_command() -> list:
    return [sys.executable, "-m", "relay.cli"]


@pytest.fixture
def relay_server(tmp_path):
    """A relay in open mode; yields (udp port, http base)."""
    relay = RelayProcess(tmp_path)
    yield relay.udp_port, relay.base
    relay.close()


@pytest.fixture
def token_relay(tmp_path):
    """A relay in token mode; yields (udp port, http base, key as ID:BASE64)."""
    key = subprocess.run(relay_command() + ["token", "keygen", "--env"], check=True,
                         capture_output=True, text=True).stdout.strip()
    relay = RelayProcess(tmp_path, RELAY_SECURITY_MODE="token", RELAY_SECURITY_KEYS=key)
    yield relay.udp_port, relay.base, key
    relay.close()


def mint(key: str, room: str, player: str) -> str:
    return subprocess.run(relay_command() + ["token", "mint", "--room", room, "--player", player,
                                             "--key", key], check=True, capture_output=True,
                          text=True).stdout.strip()


def start_bot(csharp_build: Path, c_build: Path, port: int, room: str, player: str, *extra: str):
    env = dict(os.environ, LD_LIBRARY_PATH=f"{c_build}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return subprocess.Popen(["mono", str(csharp_build / "Bot.exe"), "--server", f"127.0.0.1:{port}",
                             "--room", room, "--player", player, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_bot(process) -> dict:
    stdout, stderr = process.communicate(timeout=60)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, (stdout, stderr)
    report = json.loads(lines[0])
    report["_exit"] = process.returncode
    report["_stderr"] = stderr
    return report


def test_two_csharp_bots_and_a_spectator_play_a_room_to_its_end(csharp_build, c_build, relay_server):
    port, base = relay_server
    assert (c_build / "librelay_client.so").exists()
    room = f"cs-{os.getpid()}"
    bots = [start_bot(csharp_build, c_build, port, room, name, "--seconds", "30")
            for name in ("alice", "bob")]
    time.sleep(1.0)
    watcher = start_bot(csharp_build, c_build, port, room, "watcher", "--seconds", "30", "--spectator")
    time.sleep(5.0)
    request = urllib.request.Request(f"{base}/rooms/{room}", method="DELETE")
    urllib.request.urlopen(request, timeout=5).read()
    reports = [finish_bot(p) for p in bots + [watcher]]
    details = json.dumps(reports, indent=1)
    for report in reports:
        assert report["_exit"] == 0, details
        assert report["errors"] == [], details
        assert report["end_reason"] == "admin", details
        assert report["frames"] > 30, details
        assert report["first"] == 0 and report["last"] == report["frames"] - 1, details
        assert report["gaps"] == 0 and report["duplicates"] == 0, details
        # The per-frame path allocates nothing in the steady state.
        assert report["gc_frames_measured"] > 0, details
        assert report["gc_bytes_per_frame"] == 0, details
    players, spectator = reports[:2], reports[2]
    for report in players:
        assert report["final_frames"] == report["frames"], details
    # Both players took the room's whole stream: byte-identical frames.
    assert players[0]["hash"] == players[1]["hash"], details
    # The spectator lags by rooms.spectator_delay and gets no frames after the end.
    assert spectator["frames"] <= spectator["final_frames"] == players[0]["final_frames"], details
    assert spectator["inputs_sent"] == 0, details
    assert sorted(r["slot"] for r in reports) == [-1, 0, 1], details


def test_a_csharp_bot_reconnects_from_a_new_port_without_gap_or_duplicate(csharp_build, c_build,
                                                                             relay_server):
    port, base = relay_server
    room = f"cs-re-{os.getpid()}"
    steady = start_bot(csharp_build, c_build, port, room, "alice", "--seconds", "30")
    moving = start_bot(csharp_build, c_build, port, room, "bob", "--seconds", "30",
                       "--reconnect-at", "2.5")
    time.sleep(6.0)
    request = urllib.request.Request(f"{base}/rooms/{room}", method="DELETE")
    urllib.request.urlopen(request, timeout=5).read()
    reports = [finish_bot(steady), finish_bot(moving)]
    details = json.dumps(reports, indent=1)
    for report in reports:
        assert report["_exit"] == 0 and report["errors"] == [], details
        assert report["end_reason"] == "admin", details
        assert report["gaps"] == 0 and report["duplicates"] == 0, details
        assert report["frames"] == report["final_frames"] > 100, details
        assert report["gc_bytes_per_frame"] == 0, details
    assert reports[0]["hash"] == reports[1]["hash"], details


def test_csharp_bots_in_token_mode_including_a_reconnect_with_a_fresh_token(csharp_build, c_build,
                                                                            token_relay):
    port, base, key = token_relay
    room = f"cs-tok-{os.getpid()}"
    first = start_bot(csharp_build, c_build, port, room, "alice", "--seconds", "30",
                      "--token", mint(key, room, "alice"))
    # Room and player come from the token alone here.
    env = dict(os.environ, LD_LIBRARY_PATH=f"{c_build}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    second = subprocess.Popen(["mono", str(csharp_build / "Bot.exe"), "--server", f"127.0.0.1:{port}",
                               "--token", mint(key, room, "bob"), "--seconds", "30",
                               "--reconnect-at", "2.5", "--reconnect-token", mint(key, room, "bob")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6.0)
    request = urllib.request.Request(f"{base}/rooms/{room}", method="DELETE")
    urllib.request.urlopen(request, timeout=5).read()
    reports = [finish_bot(first), finish_bot(second)]
    details = json.dumps(reports, indent=1)
    for report in reports:
        assert report["_exit"] == 0 and report["errors"] == [], details
        assert report["end_reason"] == "admin", details
        assert report["gaps"] == 0 and report["duplicates"] == 0, details
        assert report["frames"] == report["final_frames"] > 100, details
    assert reports[0]["hash"] == reports[1]["hash"], details


def test_a_token_refused_by_an_open_relay_is_reported_with_exit_1(csharp_build, c_build, relay_server):
    port, _ = relay_server
    bot = start_bot(csharp_build, c_build, port, "r", "p", "--seconds", "5", "--token", "rt1.not-a-token")
    report = finish_bot(bot)
    assert report["_exit"] == 1 and report["frames"] == 0, report
    assert report["errors"], report


def test_a_csharp_bot_and_the_c_relay_player_see_the_same_stream(csharp_build, c_build, relay_server):
    """Same input rule, same checksums (a mismatch would be a DESYNC error), same frame hash."""
    port, base = relay_server
    player = c_build / "relay_player"
    assert player.exists(), "clients/c did not build examples/relay_player.c"
    room = f"cs-c-{os.getpid()}"
    c_side = subprocess.Popen([str(player), "--server", f"127.0.0.1:{port}", "--room", room,
                               "--player", "c-player", "--seconds", "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cs_side = start_bot(csharp_build, c_build, port, room, "c#-player", "--seconds", "30",
                        "--rebind-at", "2", "--leave")
    time.sleep(6.0)
    request = urllib.request.Request(f"{base}/rooms/{room}", method="DELETE")
    urllib.request.urlopen(request, timeout=5).read()
    reports = [finish_bot(c_side), finish_bot(cs_side)]
    details = json.dumps(reports, indent=1)
    for report in reports:
        assert report["_exit"] == 0 and report["errors"] == [], details
        assert report["end_reason"] == "admin", details
        assert report["gaps"] == 0 and report["duplicates"] == 0, details
        assert report["frames"] == report["final_frames"] > 100, details
    assert reports[0]["hash"] == reports[1]["hash"], details
    assert sorted(r["slot"] for r in reports) == [0, 1], details
    # The C# line carries every field of the C one.
    assert set(reports[0]) <= set(reports[1]), details
