#!/usr/bin/env python3
"""Seed corpus for fuzz_receive: one file per test vector (tests/vectors/*.json).

Each file is a mode byte (0 open, 1 sealed) followed by the vector's datagram bytes; a second
file per valid DATA vector joins it with the other DATA vectors using the target's separator
(FF FE), so a run sees several datagrams. Usage: make_corpus.py OUTPUT_DIR"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
SEPARATOR = b"\xff\xfe"


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    out.mkdir(parents=True, exist_ok=True)
    datas = []
    for path in sorted((ROOT / "tests" / "vectors").glob("*.json")):
        for vector in json.loads(path.read_text())["vectors"]:
            raw = bytes.fromhex(vector["hex"])
            for mode in (0, 1):
                (out / f"{vector['name']}_{mode}").write_bytes(bytes([mode]) + raw)
            if raw[:4] == b"RL\x01\x06" and "decoded" in vector and "key" not in vector:
                datas.append(raw)
    for mode in (0, 1):
        (out / f"all_data_{mode}").write_bytes(bytes([mode]) + SEPARATOR.join(datas))
    print(f"{len(list(out.iterdir()))} files in {out}")


if __name__ == "__main__":
    main()
