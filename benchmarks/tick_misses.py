"""The relay's memory traffic per player-tick, counted in a cache model: the same on every run.

Past a few hundred players the server's user time is mostly waits for memory (docs/BENCHMARKS.md,
"What limits it"), and timing it on a shared machine (capacity.py, tick_cost.py) moves by
+-10 % between runs of the same code: a change of a few percent cannot be seen. This benchmark
counts the cause instead. tick_cost.py's harness (a RelayServer and its simulated players in one
process, in-memory datagrams) runs under valgrind's callgrind with its cache simulator, and only
the server's calls of the measured ticks are counted (receive, events, tick, flush; the players'
own work still passes through the simulated caches, as the kernel's and other peers' work does
in a real server). Figures, per player-tick: instructions, first-level data misses and
last-level misses (reads and writes) by module and by function, deterministic for a tree.

The model: 32 KiB 8-way first-level caches and a last-level cache of ``--ll-kib`` (1 MiB, 16-way,
64-byte lines), whatever the host has. 512 players keep ~5 MiB of state, which 1 MiB cannot hold,
as 2 048 players' ~20 MiB do not stay in a real machine's caches between two visits. Software
prefetches are not simulated (valgrind ignores them): a miss counted here is a line the server
needs, whether or not a prefetch hides its latency in the real run. The collector is off while
counting (its passes would say more about the players' garbage than the server's layout).

    python benchmarks/tick_misses.py [--players 512] [--ticks 40] [--ll-kib 1024] [--json out.json]

Needs valgrind (with its headers, valgrind/callgrind.h) and a C compiler; about a minute and a
half at the defaults.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Optional

if __package__ in (None, ""):           # run as a file: import benchmarks as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVENTS = ("Ir", "D1mr", "D1mw", "DLmr", "DLmw")
ROW = re.compile(r"^\s*([\d,.]+)(?:\s+\([^)]*\))?\s+([\d,.]+)(?:\s+\([^)]*\))?\s+([\d,.]+)"
                 r"(?:\s+\([^)]*\))?\s+([\d,.]+)(?:\s+\([^)]*\))?\s+([\d,.]+)(?:\s+\([^)]*\))?"
                 r"\s+(.*?)\s*$")
# Two client requests, compiled on the spot: collection on and off around the server's calls.
TOGGLE_SOURCE = """#include <valgrind/callgrind.h>
void relay_toggle_collect(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def build_toggle(directory: str) -> str:
    source = os.path.join(directory, "toggle.c")
    library = os.path.join(directory, "toggle.so")
    with open(source, "w") as f:
        f.write(TOGGLE_SOURCE)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("tick_misses: no C compiler (cc or gcc) on PATH")
    done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", library, source],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("tick_misses: could not build the collection toggle (valgrind's headers, "
                         f"valgrind/callgrind.h, come with Debian's valgrind package):\n{done.stderr}")
    return library


def child(library: str, players: int, ticks: int, warmup: int, path: str) -> int:
    """Runs under callgrind: tick_cost's harness, counting only the server's calls."""
    import ctypes

    from benchmarks.tick_cost import Harness
    from relay.logs import configure as configure_logs
    from relay.server.daemon import GC_THRESHOLD

    toggle = ctypes.CDLL(library).relay_toggle_collect
    configure_logs("warning")
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    harness = Harness(players, in_place=path == "in-place")
    for _ in range(warmup):
        harness.tick(False)
    gc.collect()
    gc.disable()
    harness.server_calls_begin = harness.server_calls_end = toggle
    frames_before = sum(p.frames for p in harness.players)
    for _ in range(ticks):
        harness.tick(True)
    frames = sum(p.frames for p in harness.players) - frames_before
    print(json.dumps({"player_ticks": harness.player_ticks, "frames": frames}))
    return 0


def readable(function: str) -> str:
    """``Peer.flush`` for Cython's ``__pyx_f_10relay_core_4peer_4Peer_flush``: the last of the
    length-prefixed names (the class, or the module of a plain function) and the function's own
    (a Python wrapper's index dropped)."""
    found = re.match(r"__pyx_(?:f|pw|pf)_(.*)$", function)
    if found is None:
        return function
    rest, names = found.group(1), []
    while True:
        length = re.match(r"\d+", rest)
        if length is None:
            break
        size, start = int(length.group()), len(length.group())
        name, after = rest[start:start + size], rest[start + size:]
        if len(name) < size or not (after == "" or after.startswith("_")):
            break
        names.append(name)
        rest = after[1:]
    rest = re.sub(r"^\d+", "", rest)
    return ".".join(names[-1:] + [rest]) if rest else ".".join(names[-2:])


def module_of(obj: str) -> str:
    """A short name for the shared object a function is in."""
    path = os.path.realpath(obj)
    if path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO).split(".")[0].replace(os.sep, ".")
    name = os.path.basename(path)
    if name.startswith("libpython"):
        return "python"
    return name.split(".so")[0]


def parse_annotate(text: str) -> tuple[list[int], list[tuple[list[int], str, str]]]:
    """callgrind_annotate's table: the totals, and (counts, function, module) per row. A row
    without its object (callgrind_annotate names it once per function) takes it from another row
    of the same function."""
    totals: Optional[list[int]] = None
    rows: list[tuple[list[int], str, Optional[str]]] = []
    for line in text.splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        counts = [0 if v == "." else int(v.replace(",", "")) for v in match.groups()[:5]]
        where = match.group(6)
        if where == "PROGRAM TOTALS":
            totals = counts
            continue
        obj = None
        found = re.match(r"^(.*?)\s+\[(.*)\]$", where)
        if found:
            where, obj = found.group(1), found.group(2)
        function = where.rsplit(":", 1)[-1]
        rows.append((counts, function, obj))
    if totals is None:
        raise ValueError("no PROGRAM TOTALS in callgrind_annotate's output")
    objects = {function: obj for _, function, obj in rows if obj}
    return totals, [(counts, function, module_of(objects[function]) if function in objects
                     else "other") for counts, function, _ in rows]


def summarize(totals: list[int], rows: list, player_ticks: int, top: int) -> dict:
    per = lambda value: value / player_ticks      # noqa: E731
    modules: Counter = Counter()
    functions: Counter = Counter()
    function_module = {}
    for counts, function, module in rows:
        misses = counts[3] + counts[4]
        modules[module] += misses
        functions[function] += misses
        function_module[function] = module
    return {
        "instructions": per(totals[0]),
        "d1_misses": per(totals[1] + totals[2]),
        "ll_misses": per(totals[3] + totals[4]),
        "ll_read_misses": per(totals[3]),
        "ll_write_misses": per(totals[4]),
        "ll_misses_by_module": {m: per(v) for m, v in modules.most_common() if v},
        "ll_misses_by_function": [(function_module[f], f, per(v))
                                  for f, v in functions.most_common(top) if v],
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=512, help="players, in rooms of 8 (default 512)")
    parser.add_argument("--ticks", type=int, default=40, help="counted ticks (default 40)")
    parser.add_argument("--warmup", type=int, default=20, help="ticks before counting (default 20)")
    parser.add_argument("--ll-kib", type=int, default=1024,
                        help="the simulated last-level cache, KiB (a power of two; default 1024)")
    parser.add_argument("--top", type=int, default=20, help="functions listed (default 20)")
    parser.add_argument("--path", choices=("in-place", "memory"), default="in-place",
                        help="in-place (default): the players' datagrams through a loopback "
                             "socket, taken as relay serve takes them (recvmmsg, receive_raw, "
                             "the outbox); memory: receive_batch and datagrams_to_send, a bytes "
                             "object and an address tuple per datagram (the figures before "
                             "2026-11-28, night)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--keep", metavar="PATH",
                        help="keep callgrind's output there (for callgrind_annotate)")
    parser.add_argument("--child", nargs=5, metavar=("LIBRARY", "PLAYERS", "TICKS", "WARMUP", "PATH"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        library, players, ticks, warmup, path = args.child
        return child(library, int(players), int(ticks), int(warmup), path)
    if args.players < 8 or args.ticks < 1 or args.warmup < 1:
        parser.error("--players at least 8, --ticks and --warmup at least 1")
    if args.ll_kib < 64 or args.ll_kib & (args.ll_kib - 1):
        parser.error("--ll-kib must be a power of two, at least 64")
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not on PATH (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="tick_misses.") as directory:
        library = build_toggle(directory)
        output = args.keep or os.path.join(directory, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--collect-atstart=no",
                   "--I1=32768,8,64", "--D1=32768,8,64", f"--LL={args.ll_kib * 1024},16,64",
                   f"--callgrind-out-file={output}", sys.executable, os.path.abspath(__file__),
                   "--child", library, str(args.players), str(args.ticks), str(args.warmup),
                   args.path]
        env = dict(os.environ, PYTHONHASHSEED="0")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
        if run.returncode != 0:
            sys.stderr.write(run.stderr[-4000:])
            raise SystemExit(f"tick_misses: the run under callgrind failed ({run.returncode})")
        result = json.loads(run.stdout.strip().splitlines()[-1])
        annotated = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100",
             "--show=" + ",".join(EVENTS), output], capture_output=True, text=True, check=True)
    totals, rows = parse_annotate(annotated.stdout)
    summary = summarize(totals, rows, result["player_ticks"], args.top)
    expected = args.players * args.ticks
    print(f"tick misses: {args.players} players, {args.ticks} ticks after {args.warmup}, server "
          f"calls only, datagrams {args.path} (simulated D1 32 KiB, LL {args.ll_kib} KiB; "
          f"frames short {expected - result['frames']})")
    print(f"  per player-tick: {summary['instructions']:,.0f} instructions, "
          f"{summary['d1_misses']:.1f} D1 misses, {summary['ll_misses']:.1f} LL misses "
          f"({summary['ll_read_misses']:.1f} reads, {summary['ll_write_misses']:.1f} writes)")
    print("  LL misses per player-tick by module:")
    for module, value in summary["ll_misses_by_module"].items():
        if value >= 0.05:
            print(f"    {value:6.2f}  {module}")
    print(f"  LL misses per player-tick, top {args.top} functions:")
    for module, function, value in summary["ll_misses_by_function"]:
        print(f"    {value:6.2f}  {module}: {readable(function)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary, players=args.players, ticks=args.ticks, warmup=args.warmup,
                           path=args.path,
                           ll_kib=args.ll_kib, player_ticks=result["player_ticks"]), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
