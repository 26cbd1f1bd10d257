#!/usr/bin/env python3
"""Figures of the C client library (clients/c): memory per client, allocations after create,
and frames per second through its whole receive path on one core, against the Python SDK's
decoding of the same frames in the same run.

The relay's own code (relay.protocol) writes a room of 8 players with 4-byte inputs that change
on 20 % of frames (held buttons), as compact FRAMEs, plus the WELCOME and ROOM_STATE a player
gets. clients/c/bench/bench_client.c plays the relay with the library's wire codec: it answers
the handshake, then for each frame hands the client one DATA datagram carrying the FRAME,
takes the frame with relay_client_next_frame, reads every slot's input and drains the client's
acks. Allocations are counted by interposing malloc for the whole process (zlib and libsodium
included), from just after relay_client_create to the end of the session.

The peer in the same run: the Python SDK's path for the same frames (relay.protocol.FrameDecoder,
which the SDK runs per frame), without its transport, so the ratio understates the C library's
lead.

Targets: 0 allocations after create; at least 10x the Python SDK's frames per second; at most
the documented memory of the default config (clients/README.md).

Run:  python3 benchmarks/c_client.py [--frames 200000] [--json out.json]
Figures are printed, never asserted on by tests.
"""
from __future__ import annotations

import argparse
import json
import random
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "clients"))
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model, usable_cores  # noqa: E402
from relay.protocol import Frame, FrameDecoder, Welcome, room_state  # noqa: E402

MEMORY_TARGET = 48 * 1024 * 1024      # default config, as clients/README.md documents it
SPEEDUP_TARGET = 10.0


def room_frames(count: int, players: int = 8, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    inputs = [rng.randbytes(4) for _ in range(players)]
    previous, frames = None, []
    for number in range(count):
        for slot in range(players):
            if rng.random() < 0.2:
                inputs[slot] = rng.randbytes(4)
        events = [["join", slot, f"p{slot}"] for slot in range(players)] if number == 0 else []
        frame = Frame(number, list(inputs), events)
        frames.append(frame.encode(previous))
        previous = list(inputs)
    return frames


def write_messages(path: Path, frames: list[bytes]) -> None:
    welcome = Welcome("bench", "p1", 0, 30, "waiting", 0, 0).encode()
    messages = [welcome, room_state("running", 0)] + frames
    with open(path, "wb") as out:
        out.write(struct.pack("<I", len(messages)))
        for message in messages:
            out.write(struct.pack("<I", len(message)) + message)


def python_frames_per_second(frames: list[bytes]) -> float:
    decoder = FrameDecoder()
    started = time.perf_counter()
    for data in frames:
        frame = decoder.decode(data)
        for payload in frame.inputs:
            if payload is not None:
                payload[0]
    return len(frames) / (time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)

    from native import build_c_library  # the same build the tests use
    build = build_c_library(ROOT / "clients" / "c" / "build-bench", "-DCMAKE_BUILD_TYPE=Release",
                            "-DRELAY_CLIENT_TESTS=OFF")
    frames = room_frames(args.frames)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frames.bin"
        write_messages(path, frames)
        result = subprocess.run([str(build / "bench_client"), str(path)], capture_output=True,
                                text=True, timeout=600)
    if result.returncode != 0:
        print(result.stdout, result.stderr, file=sys.stderr)
        return 1
    c = json.loads(result.stdout)
    python = python_frames_per_second(frames)
    ratio = c["frames_per_second"] / python
    figures = {"machine": {"cpu": cpu_model(), "cores": usable_cores(),
                           "python": sys.version.split()[0]},
               "c": c, "python_sdk_frames_per_second": round(python), "ratio": round(ratio, 1)}

    print(f"machine: {cpu_model()}, {usable_cores()} cores, CPython {sys.version.split()[0]}")
    print(f"frames: {c['frames']} (8 slots, 4-byte inputs, 20 % change per frame)")
    print(f"memory per client (default config): {c['memory_budget']} bytes budgeted, "
          f"{c['bytes_allocated']} allocated by create")
    print(f"allocations after create: {c['allocations_after_create']}")
    print(f"C client, full receive path: {c['frames_per_second']:,.0f} frames/s on one core")
    print(f"Python SDK, FRAME decoding only: {python:,.0f} frames/s  (C is {ratio:.1f}x)")
    checks = [
        ("allocations after create == 0", c["allocations_after_create"] == 0),
        (f"frames/s >= {SPEEDUP_TARGET:g}x the Python SDK's", ratio >= SPEEDUP_TARGET),
        (f"memory per client <= {MEMORY_TARGET // (1024 * 1024)} MiB at the default config",
         c["bytes_allocated"] <= MEMORY_TARGET),
        ("every frame taken, none dropped", c["frames_taken"] == c["frames"]
         and c["datagrams_dropped"] == 0),
    ]
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
