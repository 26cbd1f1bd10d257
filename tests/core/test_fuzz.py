"""Fuzzing the datagram path: random and mutated datagrams never break an endpoint or a session.

Mutations start from the test vectors (tests/vectors/*.json) and from datagrams captured from
live simulated sessions, open and token mode: bit flips, byte and field substitutions (with the
live connection's own ids, so mutations get past the first checks), truncations, extensions and
splices. Invariants:

- no exception escapes ``receive``, ``datagrams_to_send``, ``handle_timeout``,
  ``next_timeout`` or ``next_event``;
- a server allocates nothing for unauthenticated datagrams and never answers one with more
  bytes than it received;
- two live sessions on one server endpoint keep delivering every message exactly once and in
  order while fuzz arrives from their own addresses and from foreign ones;
- memory stays bounded over a long stream of fuzz.

tests/fuzz/fuzz_endpoint.py does the same under atheris with coverage guidance.
"""
from __future__ import annotations

import json
import pathlib
import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from relay_core import Endpoint, EndpointConfig, MessageReceived
from relay_core.simlink import LinkedPair, LinkProfile
from relay_core.token import mint_token

VECTOR_DIR = pathlib.Path(__file__).resolve().parents[1] / "vectors"
UNIX = 1_900_000_000.0          # unix time at simulated time 0 (token expiry)
KEY_ID, KEY = 3, bytes(range(7, 39))
MODES = ["open", "token"]
SERVER = ("10.0.0.1", 7777)
CLIENTS = [("10.0.0.2", 40000), ("10.0.0.3", 40001)]


def server_config(mode, seed=11):
    keys = {KEY_ID: KEY} if mode == "token" else None
    return EndpointConfig(accept_connections=True, seed=seed, token_keys=keys)


def token_for(mode, player):
    return mint_token(KEY, KEY_ID, "fuzz", player, 3600.0, now=UNIX) if mode == "token" else None


# -- the seed corpus ------------------------------------------------------------------------------

def vector_datagrams():
    out = []
    for path in sorted(VECTOR_DIR.glob("*.json")):
        out += [bytes.fromhex(v["hex"]) for v in json.loads(path.read_text())["vectors"]]
    return out


def captured_session(mode, seed=21):
    """Every datagram of a simulated session using all of the protocol: handshake, every
    channel, fragments, a block transfer, loss (resends, acks with holes), disconnect."""
    seen = []
    profile = LinkProfile(loss=0.1, delay=0.005)
    # Its own seeds: the captured sessions' ids differ from the live ones fuzzed below (field
    # substitution plants those on purpose).
    pair = LinkedPair(server_config(mode, seed), EndpointConfig(seed=seed), profile, profile, seed=seed,
                      unix_offset=UNIX)
    for link in (pair.up, pair.down):
        original = link.send
        link.send = lambda data, now, original=original: (seen.append(data), original(data, now))
    pair.connect(token=token_for(mode, "capture"))
    for i in range(30):
        pair.client.send(pair.client_peer, i % 4, b"input %d" % i)
        pair.server.send(pair.server_peer, 1, b"frame %d" % i)
        if i % 10 == 0:
            pair.client.send(pair.client_peer, 0, bytes(range(256)) * 10)
        pair.run(0.016)
    pair.server.send_block(pair.server_peer, bytes(4000))
    pair.run(1.0)
    pair.client.disconnect(pair.client_peer)
    pair.run(0.05)
    return seen


CORPUS = vector_datagrams() + captured_session("open") + captured_session("token")
# Fields worth substituting: type, ids/session (4), seq/cookie time (8), ack (10), ack bits and
# the cookie MAC (12), send time (16), the first record (20), the token block (30).
FIELD_OFFSETS = (2, 3, 4, 8, 10, 12, 16, 20, 21, 22, 28, 30)


@st.composite
def mutated(draw, corpus=CORPUS, ids=()):
    """A corpus datagram with 1-5 mutations; ``ids`` are u32 values (live session and connect
    ids) a field substitution may plant."""
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(("flip", "byte", "field", "truncate", "extend", "splice", "repeat")))
        if op in ("flip", "byte") and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = data[i] ^ (1 << draw(st.integers(0, 7))) if op == "flip" else draw(st.integers(0, 255))
        elif op == "field":
            offset = draw(st.sampled_from(FIELD_OFFSETS))
            width = draw(st.sampled_from((1, 2, 4)))
            value = draw(st.sampled_from(ids) if ids and width == 4 and draw(st.booleans())
                         else st.sampled_from((0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFFFFFF))
                         | st.integers(0, 2 ** 32 - 1))
            if offset + width <= len(data):
                data[offset:offset + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "little")
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif op == "extend":
            data += draw(st.binary(min_size=1, max_size=64))
        elif op == "splice":
            other = draw(st.sampled_from(corpus))
            cut = draw(st.integers(0, len(data)))
            data[cut:] = other[draw(st.integers(0, len(other))):]
        elif op == "repeat" and data:
            start = draw(st.integers(0, len(data) - 1))
            data[start:start] = data[start:start + draw(st.integers(1, 16))] * draw(st.integers(1, 8))
    return bytes(data[:1500])


def fuzz_datagrams(corpus=CORPUS, ids=()):
    return st.one_of(st.binary(max_size=1500), st.binary(max_size=64).map(lambda b: b"RL\x01" + b),
                     mutated(corpus, ids))


addresses = st.one_of(st.sampled_from([SERVER] + CLIENTS),
                      st.tuples(st.sampled_from(["10.9.0.1", "10.9.0.2", "127.0.0.1", "::1"]),
                                st.integers(1, 65535)))


def drain(endpoint, now):
    """Every call a driver makes; returns what the endpoint sends."""
    endpoint.handle_timeout(now)
    out = endpoint.datagrams_to_send(now)
    endpoint.next_timeout()
    while endpoint.next_event() is not None:
        pass
    return out


# -- a fresh server and a connecting client ---------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=1000, deadline=None)
@given(datagrams=st.lists(st.tuples(fuzz_datagrams(), addresses), min_size=1, max_size=8))
def test_fresh_server_allocates_nothing_and_never_amplifies(mode, datagrams):
    server = Endpoint(server_config(mode), UNIX)
    now = 1.0
    for datagram, address in datagrams:
        server.receive(datagram, address, now)
        replies = drain(server, now)
        # Nothing but a CHALLENGE (or a REFUSE) can answer an unauthenticated datagram, and
        # it is never larger than what came in.
        assert sum(len(data) for data, _ in replies) <= len(datagram)
        assert all(to == address for _, to in replies)
        assert server.peer_count == 0
        now += 0.01


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=500, deadline=None)
@given(datagrams=st.lists(st.tuples(fuzz_datagrams(), addresses), min_size=1, max_size=8))
def test_connecting_client_survives_anything(mode, datagrams):
    client = Endpoint(EndpointConfig(seed=5), UNIX)
    peer = client.connect(SERVER, 0.0, token_for(mode, "c"))
    now = 0.0
    for datagram, address in datagrams:
        client.receive(datagram, address, now)
        for _, to in drain(client, now):
            assert to == SERVER            # a client only ever talks to its server
        assert client.peer_ids in ([peer], [])
        now += 0.05


# -- live sessions ------------------------------------------------------------------------------------

class Network:
    """One server endpoint and two clients on in-memory links (1 ms per hop, seeded ``loss``),
    with numbered messages flowing both ways on the reliable ordered (0) and redundant (1)
    channels."""

    def __init__(self, mode, loss=0.0):
        self.mode = mode
        self.loss = loss
        self.rng = random.Random(7)
        self.now = 0.0
        self.server = Endpoint(server_config(mode), UNIX)
        self.clients = [Endpoint(EndpointConfig(seed=30 + i), UNIX) for i in range(2)]
        self.endpoints = {SERVER: self.server, CLIENTS[0]: self.clients[0], CLIENTS[1]: self.clients[1]}
        self.client_peers = [c.connect(SERVER, 0.0, token_for(mode, f"p{i}"))
                             for i, c in enumerate(self.clients)]
        self.inbox = []                     # (to, from, datagram), delivered on the next step
        self.sent = {address: [] for address in self.endpoints}
        self.next_expected = {}             # (receiver, channel, client index) -> next number
        self.violations = []
        self.foreign_replies = []
        self.sequence = 0
        self.step_until(lambda: self.server.peer_count == 2
                        and all(c.is_connected(p) for c, p in zip(self.clients, self.client_peers)))
        self.server_peers = {self.server.peer_address(p): p for p in self.server.peer_ids}
        self.send_round()
        for _ in range(20):
            self.step()
        # The session id is bytes 4..8 of a DATA packet (type 6), sealed or not.
        self.sessions = {address: next(int.from_bytes(d[4:8], "little") for d in self.sent[address]
                                       if d[:4] == b"RL\x01\x06") for address in CLIENTS}

    def step(self, fuzz=()):
        self.now += 0.001
        inbox, self.inbox = self.inbox, []
        for to, source, datagram in list(inbox) + list(fuzz):
            self.endpoints[to].receive(datagram, source, self.now)
        for address, endpoint in self.endpoints.items():
            endpoint.handle_timeout(self.now)
            for datagram, to in endpoint.datagrams_to_send(self.now):
                self.sent[address].append(datagram)
                if self.loss and self.rng.random() < self.loss:
                    continue
                if to in self.endpoints:
                    self.inbox.append((to, address, datagram))
                else:
                    self.foreign_replies.append((to, datagram))
            endpoint.next_timeout()
            while (event := endpoint.next_event()) is not None:
                if isinstance(event, MessageReceived):
                    self.check(address, event.channel, event.payload)

    def step_until(self, done, limit=5000):
        for _ in range(limit):
            if done():
                return
            self.step()
        raise AssertionError("condition not met")

    def send_round(self):
        """One numbered message each way per client and channel."""
        n = self.sequence
        self.sequence += 1
        for i, (client, peer) in enumerate(zip(self.clients, self.client_peers)):
            client.send(peer, 0, b"up %d %d" % (i, n))
            self.server.send(self.server_peers[CLIENTS[i]], 0, b"down %d %d" % (i, n))
            self.server.send(self.server_peers[CLIENTS[i]], 1, b"frame %d %d" % (i, n))

    def check(self, receiver, channel, payload):
        """Counted as it arrives, so a long run keeps no history."""
        kind = {(True, 0): b"up", (False, 0): b"down", (False, 1): b"frame"}.get((receiver == SERVER, channel))
        parts = payload.split(b" ")
        if kind is None or len(parts) != 3 or parts[0] != kind:
            self.violations.append((receiver, channel, payload))
            return
        i, n = int(parts[1]), int(parts[2])
        if receiver != SERVER and CLIENTS[i] != receiver:
            self.violations.append((receiver, channel, payload))
            return
        key = (receiver, channel, i)
        expected = self.next_expected.get(key, 0)
        if n != expected:
            self.violations.append((receiver, channel, payload, expected))
        self.next_expected[key] = max(expected, n + 1)

    def assert_exactly_once_in_order(self):
        assert self.violations == []
        for i, address in enumerate(CLIENTS):
            for key in ((SERVER, 0, i), (address, 0, i), (address, 1, i)):
                assert self.next_expected.get(key, 0) == self.sequence, key
        assert self.server.peer_count == 2
        assert all(c.is_connected(p) for c, p in zip(self.clients, self.client_peers))

    def is_forgery(self, source, datagram):
        """Open mode authenticates a session by its id alone: a datagram from anywhere that
        carries a live session id and is not a byte-exact replay is indistinguishable from the
        peer itself, so the exactly-once invariant cannot hold for it (that is what token
        mode's AEAD is for; tests/core/test_malformed.py checks open mode survives such input)."""
        if self.mode != "open" or len(datagram) < 8:
            return False
        live = set(self.sessions.values())
        if int.from_bytes(datagram[4:8], "little") not in live:
            return False
        return not any(datagram in sent for sent in self.sent.values())


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_live_sessions_deliver_every_message_once_in_order_under_fuzz(mode, data):
    # Seeded: the draws below do not depend on history. Lossy half the time, so resends,
    # redundant copies and acks with holes meet the fuzz too.
    net = Network(mode, loss=data.draw(st.sampled_from([0.0, 0.1])))
    for _ in range(5):
        net.send_round()
        for _ in range(16):
            net.step()
    own = [d for sent in net.sent.values() for d in sent]     # this session's own datagrams
    ids = tuple(net.sessions.values())
    targets = st.sampled_from([SERVER] + CLIENTS)
    fuzz = data.draw(st.lists(st.tuples(targets, addresses, fuzz_datagrams(CORPUS + own, ids)),
                              min_size=1, max_size=30))
    for round_ in range(0, len(fuzz), 3):
        net.send_round()
        batch = [(to, source, datagram) for to, source, datagram in fuzz[round_:round_ + 3]
                 if source != to and not net.is_forgery(source, datagram)]
        net.step(batch)
        for _ in range(15):
            net.step()
    net.loss = 0.0                          # the last repairs get through
    for _ in range(2000):
        net.step()
    net.assert_exactly_once_in_order()


# -- memory over a long stream ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_long_fuzz_stream_leaves_memory_and_peer_count_bounded(mode):
    net = Network(mode)
    rng = random.Random(99)
    own = [d for sent in net.sent.values() for d in sent]
    pool = CORPUS + own
    sources = [SERVER] + CLIENTS + [(f"10.8.{i}.{j}", 1000 + j) for i in range(4) for j in range(8)]

    def fuzz_datagram():
        data = bytearray(rng.choice(pool))
        for _ in range(rng.randint(1, 4)):
            if data and rng.random() < 0.6:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif rng.random() < 0.5:
                del data[rng.randrange(len(data) + 1):]
            else:
                data += rng.randbytes(rng.randint(1, 32))
        return bytes(data)

    def burst(count):
        for _ in range(count // 50):
            net.send_round()
            batch = []
            for _ in range(50):
                to = rng.choice([SERVER] + CLIENTS)
                source = rng.choice([s for s in sources if s != to])
                datagram = fuzz_datagram() if rng.random() < 0.8 else rng.randbytes(rng.randint(0, 300))
                if not net.is_forgery(source, datagram):
                    batch.append((to, source, datagram))
            net.step(batch)
            for _ in range(10):
                net.step()
            net.foreign_replies.clear()
            for sent in net.sent.values():
                del sent[:-64]              # the harness's own record, not the endpoints'

    burst(2000)                             # warm-up: caches, hash tables, rate-limit buckets
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    burst(60000)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert growth < 256 * 1024, growth
    assert net.server.peer_count == 2
    assert sum(sum(e.drops.values()) for e in net.endpoints.values()) > 40000
    for _ in range(1000):
        net.step()
    net.assert_exactly_once_in_order()


# -- the coverage-guided harness ----------------------------------------------------------------------

def test_atheris_harness_runs_clean_for_a_short_budget():
    """tests/fuzz/fuzz_endpoint.py (atheris) for ~20 s: no crash, and the outcome feedback works
    (inputs reach many distinct drop reasons, replies and events)."""
    import subprocess
    import sys

    harness = pathlib.Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_endpoint.py"
    run = subprocess.run([sys.executable, str(harness), "--seconds", "20", "-seed=1"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["crashes"] == 0
    assert summary["inputs"] > 1000 and summary["datagrams"] > summary["inputs"]
    assert summary["outcomes_seen"] >= 30, summary
