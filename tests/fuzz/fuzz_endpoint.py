"""Coverage-guided fuzzing of relay_core's datagram path with atheris (libFuzzer).

Each input picks a mode (open or token) and a target -- a fresh accepting server, a client in
the middle of connecting, two live sessions on one server endpoint (tests/core/test_fuzz.py's
Network), or the same with forgeries allowed (mutated datagrams carrying a live session id from
the peer's own address: in open mode they reach the record parser, where only "nothing raises,
nothing grows" can be asked; token mode must still deliver exactly once) -- and feeds it up to
eight datagrams: raw bytes, corpus datagrams (test vectors and captured sessions) with byte
substitutions, or corpus datagrams carrying the live session's id, from the peers' own addresses
and from foreign ones. The invariants are tests/core/test_fuzz.py's:
nothing raises, a fresh server allocates nothing and never answers with more bytes than it got,
live sessions keep delivering every message exactly once and in order.

Coverage: relay_core's Python modules (token, config, events, simlink) are instrumented; the
compiled core is driven through its API, and what it did -- drop reasons, refusals, reply
types, events -- is fed back as coverage too (each distinct outcome is a branch), so inputs
that make the core do something new are kept and mutated further.

    python tests/fuzz/fuzz_endpoint.py --seconds 20            # or --runs N
    nice -n 19 python tests/fuzz/fuzz_endpoint.py --seconds 1800 --keep-going --crash-dir crashes

Prints one JSON line at the end: inputs run, datagrams tried, crashes (an invariant broken or an
exception; each input saved under --crash-dir). Exit status 1 if there was a crash. Without
--keep-going the first crash stops the run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time
import traceback

import atheris

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "core"))   # tests/core: test_fuzz (corpus, Network)

with atheris.instrument_imports(include=["relay_core"]):
    import relay_core  # noqa: F401
    import relay_core.config  # noqa: F401
    import relay_core.events  # noqa: F401
    import relay_core.simlink  # noqa: F401
    import relay_core.token  # noqa: F401
    from relay_core import Endpoint, EndpointConfig
    from relay_core.wire import DROP_REASONS

import test_fuzz as shared  # noqa: E402

SOURCES = [shared.SERVER] + shared.CLIENTS + [("10.9.0.1", 5000), ("10.9.0.2", 1), ("::1", 7777, 0, 0)]
TARGETS = ("fresh_server", "connecting_client", "live", "forged")
# What the core did, per target and mode: drop reasons, reply packet types, events.
OUTCOMES = sorted(f"{target}:{mode}:{what}" for target in TARGETS for mode in shared.MODES
                  for what in (*DROP_REASONS, *(f"reply:{t}" for t in range(16)),
                               *(f"event:{name}" for name in ("PeerConnected", "PeerDisconnected",
                                                             "MessageReceived", "BlockReceived",
                                                             "BlockDelivered", "PeerMigrated"))))


def _outcome_branches():
    """A function with one branch per outcome: instrumented, so a new outcome is new coverage."""
    lines = ["def record_outcome(name):"]
    for i, name in enumerate(OUTCOMES):
        lines.append(f"    {'if' if i == 0 else 'elif'} name == {name!r}:\n        return {i}")
    lines.append("    return -1")
    scope = {}
    exec(compile("\n".join(lines), "<outcomes>", "exec"), scope)
    return atheris.instrument_func(scope["record_outcome"])


record_outcome = _outcome_branches()


class Stats:
    def __init__(self, args):
        self.args = args
        self.inputs = self.datagrams = self.crashes = 0
        self.crash_files = []
        self.started = time.monotonic()
        self.outcomes = set()

    def summary(self):
        elapsed = time.monotonic() - self.started
        return {"inputs": self.inputs, "datagrams": self.datagrams, "crashes": self.crashes,
                "crash_files": self.crash_files[:20], "seconds": round(elapsed, 1),
                "inputs_per_second": round(self.inputs / elapsed, 1) if elapsed else 0,
                "outcomes_seen": len(self.outcomes), "outcomes_possible": len(OUTCOMES)}

    def done(self):
        args = self.args
        return ((args.seconds and time.monotonic() - self.started >= args.seconds)
                or (args.runs and self.inputs >= args.runs))


def outcome(stats, where, what):
    name = f"{where}:{what}"
    record_outcome(name)
    stats.outcomes.add(name)


def observe(endpoint, drops_before, stats, where):
    for reason, count in endpoint.drops.items():
        if count > drops_before.get(reason, 0):
            outcome(stats, where, reason)


class Reader:
    """The input, read front to back (past its end: zeros), so a seed is easy to write:
    header (mode, target, count), then per datagram source, how, a 16-bit length or corpus
    index, and its bytes or mutations."""

    def __init__(self, raw):
        self.raw, self.pos = raw, 0

    def byte(self):
        self.pos += 1
        return self.raw[self.pos - 1] if self.pos <= len(self.raw) else 0

    def u16(self):
        return self.byte() | self.byte() << 8

    def take(self, n):
        out = self.raw[self.pos:self.pos + n]
        self.pos += n
        return out


def seed(mode, target, datagram):
    return bytes([mode, target, 0, 0, 0]) + (len(datagram) % 1501).to_bytes(2, "little") + datagram[:1500]


def feed(reader, corpus, ids):
    """The next (source index, datagram) from the input."""
    source = reader.byte() % len(SOURCES)
    how = reader.byte() % 4
    number = reader.u16()
    if how == 0 or not corpus:
        return source, reader.take(number % 1501)
    data = bytearray(corpus[number % len(corpus)])
    if how >= 2 and ids and len(data) >= 8:
        data[4:8] = ids[reader.byte() % len(ids)].to_bytes(4, "little")
    for _ in range(reader.byte() % 7):
        if data:
            data[reader.u16() % len(data)] = reader.byte()
    cut = reader.byte() % 3
    if cut == 1:
        del data[reader.u16() % (len(data) + 1):]
    elif cut == 2:
        data += reader.take(reader.byte() % 65)
    return source, bytes(data)


def one_input(raw, stats):
    reader = Reader(raw)
    mode = shared.MODES[reader.byte() % 2]
    target = TARGETS[reader.byte() % len(TARGETS)]
    count = 1 + reader.byte() % 8
    where = f"{target}:{mode}"
    if target == "fresh_server":
        server = Endpoint(shared.server_config(mode), shared.UNIX)
        for i in range(count):
            source, datagram = feed(reader, shared.CORPUS, ())
            address = SOURCES[source]
            drops = server.drops
            server.receive(datagram, address, 1.0 + i * 0.01)
            stats.datagrams += 1
            replies = shared.drain(server, 1.0 + i * 0.01)
            observe(server, drops, stats, where)
            for data, to in replies:
                outcome(stats, where, f"reply:{data[3] & 15 if len(data) > 3 else 0}")
            assert sum(len(d) for d, _ in replies) <= len(datagram), "amplification"
            assert all(to == address for _, to in replies), "reply to another address"
            assert server.peer_count == 0, "a peer allocated for an unauthenticated datagram"
        return
    if target == "connecting_client":
        client = Endpoint(EndpointConfig(seed=5), shared.UNIX)
        peer = client.connect(shared.SERVER, 0.0, shared.token_for(mode, "c"))
        for i in range(count):
            source, datagram = feed(reader, shared.CORPUS, ())
            drops = client.drops
            client.receive(datagram, SOURCES[source], i * 0.05)
            stats.datagrams += 1
            client.handle_timeout(i * 0.05)
            for _, to in client.datagrams_to_send(i * 0.05):
                assert to == shared.SERVER, "a client talked to someone other than its server"
            while (event := client.next_event()) is not None:
                outcome(stats, where, f"event:{type(event).__name__}")
            observe(client, drops, stats, where)
            assert client.peer_ids in ([peer], []), "a client grew peers"
        return
    net = shared.Network(mode)
    own = [d for sent in net.sent.values() for d in sent]
    ids = tuple(net.sessions.values())
    corpus = shared.CORPUS + own
    for _ in range(count):
        source, datagram = feed(reader, corpus, ids)
        to = ([shared.SERVER] + shared.CLIENTS)[reader.byte() % 3]
        address = SOURCES[source]
        if address == to or (target == "live" and net.is_forgery(address, datagram)):
            continue
        drops = {a: e.drops for a, e in net.endpoints.items()}
        net.send_round()
        net.step([(to, address, datagram)])
        stats.datagrams += 1
        for a, endpoint in net.endpoints.items():
            observe(endpoint, drops[a], stats, where)
        for _ in range(10):
            net.step()
    for _ in range(600):
        net.step()
    if target == "live":
        net.assert_exactly_once_in_order()
    else:
        # Forged: records carrying a live session id from the peer's own address (open mode
        # cannot tell them from the peer; token mode must). They reach the record parser; the
        # sessions may be disturbed in open mode, but nothing raises and nothing grows.
        assert net.server.peer_count <= 2, "peers grew"
        if mode == "token":
            net.assert_exactly_once_in_order()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long")
    parser.add_argument("--runs", type=int, default=0, help="stop after this many inputs")
    parser.add_argument("--keep-going", action="store_true", help="record crashes and go on")
    parser.add_argument("--crash-dir", default=None, help="where crashing inputs go (default: a temp dir)")
    args, libfuzzer_args = parser.parse_known_args()
    if not args.seconds and not args.runs:
        parser.error("give --seconds or --runs")
    crash_dir = pathlib.Path(args.crash_dir or tempfile.mkdtemp(prefix="relay-fuzz-crashes-"))
    crash_dir.mkdir(parents=True, exist_ok=True)
    # Seeds: every corpus datagram once, as a fresh-server input and as a live-session input.
    seeds = pathlib.Path(tempfile.mkdtemp(prefix="relay-fuzz-seeds-"))
    for i, datagram in enumerate(shared.CORPUS):
        for mode in (0, 1):
            for target in (0, 2):
                (seeds / f"{i}-{mode}-{target}").write_bytes(seed(mode, target, datagram))
    stats = Stats(args)

    def test_one_input(raw):
        if stats.done():
            print(json.dumps(stats.summary()), flush=True)
            os._exit(1 if stats.crashes else 0)
        stats.inputs += 1
        try:
            one_input(raw, stats)
        except Exception:
            stats.crashes += 1
            path = crash_dir / f"crash-{hashlib.sha1(raw).hexdigest()}"
            path.write_bytes(raw)
            stats.crash_files.append(str(path))
            sys.stderr.write(f"CRASH saved to {path}\n{traceback.format_exc()}\n")
            if not args.keep_going:
                print(json.dumps(stats.summary()), flush=True)
                os._exit(1)
        if stats.inputs % 5000 == 0:
            sys.stderr.write(f"progress {json.dumps(stats.summary())}\n")

    atheris.Setup([sys.argv[0], "-max_len=1600", "-len_control=0", *libfuzzer_args, str(seeds)], test_one_input)
    atheris.Fuzz()
    print(json.dumps(stats.summary()), flush=True)     # the input source ran out (-runs)
    return 1 if stats.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
