#!/usr/bin/env python3
"""Seed corpus for fuzz_client: deliveries the relay really makes, written by relay.protocol.

Each file is a sequence of (kind byte, u16 LE length, bytes): kind 0 a CONTROL message, 1 a
STREAM message (FRAME), 2 a history block, 3 a disconnect (see fuzz_client.c).
Usage: make_client_corpus.py OUTPUT_DIR"""
import pathlib
import random
import struct
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

from relay import protocol  # noqa: E402
from relay.protocol import Frame, Welcome  # noqa: E402


def delivery(kind: int, data: bytes) -> bytes:
    return struct.pack("<BH", kind, len(data)) + data


def frames(count: int, slots: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    inputs: list = [None] * slots
    previous, out = None, []
    for number in range(count):
        for slot in range(slots):
            if rng.random() < 0.3:
                inputs[slot] = None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 6))
        events = [["join", s, f"p{s}"] for s in range(slots)] if number == 0 else []
        if number == count // 2:
            events.append(["leave", 0, "p0"])
        synthesized = [s for s in range(slots) if inputs[s] is not None and rng.random() < 0.1]
        out.append(Frame(number, list(inputs), events, synthesized).encode(previous))
        previous = list(inputs)
    return out


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "client_corpus")
    out.mkdir(parents=True, exist_ok=True)
    stream = frames(40, 4, 1)
    welcome_running = Welcome("fuzz", "p1", 1, 30, "running", 20, 20).encode()
    welcome_waiting = Welcome("fuzz", "p1", 0, 30, "waiting", 0, 0).encode()
    control = [protocol.room_state("running", 0), protocol.input_delay(3, 80, 1, 150),
               protocol.desync(10, {"a": 1, "b": 2, "c": 2}, ["a"], "minority", [["b", "c"], ["a"]]),
               protocol.notice("malformed", "bad"), protocol.refused("room_full", "full"),
               protocol.room_state("ended", 40, "admin")]
    seeds = {
        "live": delivery(0, welcome_waiting) + delivery(0, control[0])
        + b"".join(delivery(1, f) for f in stream) + delivery(0, control[-1]),
        "late_join": delivery(0, welcome_running) + b"".join(delivery(1, f) for f in stream[20:])
        + delivery(2, protocol.encode_history(0, stream[:20])),
        "block_first": delivery(2, protocol.encode_history(0, stream[:25]))
        + delivery(0, welcome_running) + b"".join(delivery(1, f) for f in stream[20:]),
        "control": b"".join(delivery(0, m) for m in [welcome_waiting] + control),
        "disconnect": delivery(0, welcome_waiting) + delivery(1, stream[0]) + delivery(3, b""),
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)
    print(f"{len(seeds)} files in {out}")


if __name__ == "__main__":
    main()
