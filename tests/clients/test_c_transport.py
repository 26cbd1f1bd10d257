"""The C transport (clients/c/src/conn.c) against the real relay_core server, in memory.

A C rc_conn (through the rct_* functions of clients/c/tests/vector_shim.c) and a Python
``relay_core.Endpoint`` configured as the relay configures it exchange datagrams over a
simulated link (fixed latency, seeded random loss) on a simulated clock; no sockets. Checked:
the handshake in open and token mode, messages both ways on both channels in order, a block and
a fragmented message from the server, exactly-once in-order delivery under loss, sealed traffic
and tampering, every way a connection ends, and address migration (PATH_CHALLENGE answered)."""
from __future__ import annotations

import ctypes
import heapq
import os
import random

import pytest

from relay.protocol import endpoint_channels
from relay_core import (
    Endpoint, EndpointConfig, MessageReceived, PeerConnected, PeerDisconnected, PeerMigrated,
    BlockDelivered,
)
from relay_core.token import mint_token

UNIX = 1_900_000_000.0
KEY = bytes(range(100, 132))
CLIENT_ADDRESS = ("10.0.0.2", 40000)
CONNECTED, CLOSED = 3, 0
EV_CONNECTED, EV_MESSAGE, EV_BLOCK, EV_DISCONNECTED = 1, 2, 3, 4


class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_double) for name in ("rtt", "rtt_variance", "rto", "loss")] + [
        (name, ctypes.c_uint64) for name in (
            "packets_sent", "packets_received", "bytes_sent", "bytes_received", "packets_acked",
            "packets_lost", "messages_sent", "messages_received", "resends", "redundant_bytes",
            "duplicate_messages", "datagrams_dropped")] + [
        ("burst_length", ctypes.c_double), ("redundancy_mode", ctypes.c_int)]


@pytest.fixture(scope="module")
def lib(c_build):
    lib = ctypes.CDLL(str(c_build / "librelay_client_testing.so"))
    c = ctypes
    lib.rct_new.argtypes = [c.c_double, c.c_uint32, c.c_uint32]
    lib.rct_new.restype = c.c_void_p
    lib.rct_free.argtypes = [c.c_void_p]
    lib.rct_connect.argtypes = [c.c_void_p, c.c_uint32, c.c_char_p, c.c_size_t, c.c_char_p, c.c_char_p, c.c_double]
    lib.rct_receive.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.c_double]
    lib.rct_next_datagram.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.c_double]
    lib.rct_next_datagram.restype = c.c_size_t
    lib.rct_next_timeout.argtypes = [c.c_void_p]
    lib.rct_next_timeout.restype = c.c_double
    lib.rct_handle_timeout.argtypes = [c.c_void_p, c.c_double]
    lib.rct_send.argtypes = [c.c_void_p, c.c_int, c.c_char_p, c.c_size_t]
    lib.rct_disconnect.argtypes = [c.c_void_p, c.c_int, c.c_double]
    for name in ("rct_state", "rct_sealed"):
        getattr(lib, name).argtypes = [c.c_void_p]
    lib.rct_pending.argtypes = [c.c_void_p, c.c_int]
    lib.rct_pending.restype = c.c_uint32
    lib.rct_stats.argtypes = [c.c_void_p, c.POINTER(Stats)]
    lib.rct_peek.argtypes = [c.c_void_p, c.POINTER(c.c_int), c.POINTER(c.c_int)]
    lib.rct_peek.restype = c.c_long
    lib.rct_pop.argtypes = [c.c_void_p, c.c_char_p]
    lib.rct_memory_size.restype = c.c_size_t
    return lib


def server_config(**overrides):
    return EndpointConfig(accept_connections=True, channels=endpoint_channels(), ack_delay=1 / 30,
                          redundancy_budget=1200, seed=7, **overrides)


class Harness:
    """One C client, one Python server, a link with latency and seeded loss each way."""

    def __init__(self, lib, config=None, loss=0.0, seed=1, latency=0.02, peer_timeout=0.0,
                 token=None, jitter=0.0, duplicate=0.0, max_block_size=0):
        self.lib = lib
        self.server = Endpoint(config or server_config(), unix_offset=UNIX)
        self.conn = lib.rct_new(peer_timeout, max_block_size, 0)
        assert self.conn
        self.rng = random.Random(seed)
        self.loss, self.latency, self.jitter, self.duplicate = loss, latency, jitter, duplicate
        self.now = 0.0
        self.address = CLIENT_ADDRESS
        self.up: list = []                  # (time, order, bytes, address)
        self.down: list = []
        self.order = 0
        self.buf = ctypes.create_string_buffer(2048)
        self.c_events: list = []
        self.s_events: list = []
        self.peer = None
        self.server_silent = False
        self.tamper_down = None              # callable(bytes) -> bytes
        self.sent_up: list = []
        if token is None:
            assert lib.rct_connect(self.conn, 0x1234567, None, 0, None, None, 0.0) == 0
        else:
            assert lib.rct_connect(self.conn, 0x1234567, token.private, len(token.private),
                                   token.client_key, token.server_key, 0.0) == 0

    def close(self):
        self.lib.rct_free(self.conn)

    def _lost(self):
        return self.loss > 0 and self.rng.random() < self.loss

    def _push(self, queue, data, address):
        """Queue a datagram with the link's latency and jitter (reordering); maybe twice."""
        for _ in range(2 if self.duplicate and self.rng.random() < self.duplicate else 1):
            self.order += 1
            delay = self.latency + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)
            heapq.heappush(queue, (self.now + delay, self.order, data, address))

    def step(self, dt=0.005):
        lib, now = self.lib, self.now
        lib.rct_handle_timeout(self.conn, now)
        for _ in range(500):
            n = lib.rct_next_datagram(self.conn, self.buf, len(self.buf), now)
            if n == 0:
                break
            data = self.buf.raw[:n]
            self.sent_up.append(data)
            if not self._lost():
                self._push(self.up, data, self.address)
        else:
            raise AssertionError("rc_conn_next_datagram never ran dry")
        while self.up and self.up[0][0] <= now:
            _, _, data, address = heapq.heappop(self.up)
            self.server.receive(data, address, now)
        self.server.handle_timeout(now)
        for data, _address in self.server.datagrams_to_send(now):
            if not self.server_silent and not self._lost():
                self._push(self.down, data, None)
        while self.down and self.down[0][0] <= now:
            _, _, data, _ = heapq.heappop(self.down)
            if self.tamper_down is not None:
                data = self.tamper_down(data)
            lib.rct_receive(self.conn, data, len(data), now)
        self._drain()
        self.now = round(now + dt, 6)

    def _drain(self):
        kind, channel = ctypes.c_int(), ctypes.c_int()
        while (length := self.lib.rct_peek(self.conn, ctypes.byref(kind), ctypes.byref(channel))) >= 0:
            out = ctypes.create_string_buffer(max(length, 1))
            self.lib.rct_pop(self.conn, out)
            self.c_events.append((kind.value, channel.value, out.raw[:length]))
        while (event := self.server.next_event()) is not None:
            if isinstance(event, PeerConnected):
                self.peer = event.peer_id
            self.s_events.append(event)

    def run(self, seconds, until=None, dt=0.005):
        end = self.now + seconds
        while self.now < end:
            self.step(dt)
            if until is not None and until():
                return True
        return until is None

    def connect(self):
        assert self.run(3.0, lambda: self.peer is not None and self.state() == CONNECTED)

    def state(self):
        return self.lib.rct_state(self.conn)

    def send(self, channel, payload):
        return self.lib.rct_send(self.conn, channel, payload, len(payload))

    def stats(self):
        s = Stats()
        self.lib.rct_stats(self.conn, ctypes.byref(s))
        return s

    def c_messages(self, channel):
        return [data for kind, ch, data in self.c_events if kind == EV_MESSAGE and ch == channel]

    def s_messages(self, channel):
        return [e.payload for e in self.s_events if isinstance(e, MessageReceived) and e.channel == channel]

    def c_reasons(self):
        return [data.decode() for kind, _, data in self.c_events if kind == EV_DISCONNECTED]

    def s_disconnects(self):
        return [e.reason for e in self.s_events if isinstance(e, PeerDisconnected)]


@pytest.fixture
def harness(lib):
    made = []

    def make(**kw):
        h = Harness(lib, **kw)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()


def payloads(tag, count):
    return [f"{tag}-{i}-".encode() + bytes([i % 251]) * (i % 90) for i in range(count)]


def test_memory_is_one_modest_block(lib):
    size = lib.rct_memory_size()
    assert size < 8 * 1024 * 1024 + 1024 * 1024, size


def test_handshake_connects_both_sides(harness):
    h = harness()
    h.connect()
    assert h.c_events[0][0] == EV_CONNECTED
    assert isinstance(h.s_events[0], PeerConnected)
    assert h.lib.rct_sealed(h.conn) == 0
    # the connection stays up on heartbeats alone
    h.run(15.0)
    assert h.state() == CONNECTED and h.s_disconnects() == []


def test_messages_both_ways_on_both_channels_in_order(harness):
    h = harness()
    for i, p in enumerate(payloads("early", 5)):
        assert h.send(i % 2, p) == 0             # queued while connecting
    h.connect()
    up0, up1 = payloads("c0", 60), payloads("c1", 200)
    down0, down1 = payloads("s0", 60), payloads("s1", 200)
    for p in up0:
        assert h.send(0, p) == 0
    for p in up1:
        assert h.send(1, p) == 0
    for p in down0:
        assert h.server.send(h.peer, 0, p)
    for p in down1:
        assert h.server.send(h.peer, 1, p)
    early = payloads("early", 5)
    assert h.run(5.0, lambda: len(h.s_messages(1)) == 202 and len(h.c_messages(1)) == 200
                 and len(h.s_messages(0)) == 63 and len(h.c_messages(0)) == 60)
    assert h.s_messages(0) == early[0::2] + up0
    assert h.s_messages(1) == early[1::2] + up1
    assert h.c_messages(0) == down0 and h.c_messages(1) == down1
    h.run(1.0)
    assert h.lib.rct_pending(h.conn, 0) == 0 and h.lib.rct_pending(h.conn, 1) == 0
    s = h.stats()
    assert s.datagrams_dropped == 0 and s.rtt > 0.03 and s.messages_sent == 265
    assert dict(h.server.drops) == {} or set(h.server.drops) <= {"duplicate_packet"}, h.server.drops


def test_send_refuses_messages_over_max_send_size(harness):
    h = harness()
    assert h.send(0, b"x" * 1159) == 0
    assert h.send(0, b"x" * 1160) == -1
    assert h.send(2, b"x") == -1


def test_a_100_kb_block_arrives_intact(harness):
    h = harness()
    h.connect()
    data = os.urandom(100_000)
    assert h.server.send_block(h.peer, data)
    assert h.run(5.0, lambda: any(e[0] == EV_BLOCK for e in h.c_events))
    blocks = [d for k, _, d in h.c_events if k == EV_BLOCK]
    assert blocks == [data]
    assert h.run(2.0, lambda: any(isinstance(e, BlockDelivered) for e in h.s_events))
    # a second, empty one, then another
    assert h.server.send_block(h.peer, b"")
    assert h.server.send_block(h.peer, b"tail" * 1000)
    assert h.run(3.0, lambda: len([1 for k, _, _ in h.c_events if k == EV_BLOCK]) == 3)
    assert [d for k, _, d in h.c_events if k == EV_BLOCK][1:] == [b"", b"tail" * 1000]


def test_a_block_over_max_block_size_ends_the_connection_with_the_reason(harness):
    """Refused slices would be offered forever and the history never arrive: the client says
    why and closes (the relay hears protocol_error) instead of stalling."""
    h = harness(max_block_size=64 * 1024)
    h.connect()
    assert h.server.send_block(h.peer, os.urandom(100_000))
    assert h.run(3.0, lambda: "block_too_large" in h.c_reasons())
    assert h.run(2.0, lambda: "remote:protocol_error" in h.s_disconnects())


def test_a_large_fragmented_message_from_the_server_arrives(harness):
    h = harness()
    h.connect()
    big = os.urandom(200_000)
    mid = os.urandom(5000)
    assert h.server.send(h.peer, 0, big)
    assert h.server.send(h.peer, 1, mid)
    assert h.server.send(h.peer, 0, b"after")
    assert h.run(5.0, lambda: len(h.c_messages(0)) == 2 and len(h.c_messages(1)) == 1)
    assert h.c_messages(0) == [big, b"after"] and h.c_messages(1) == [mid]


@pytest.mark.parametrize("loss,seed", [(0.1, 3), (0.2, 11)])
def test_exactly_once_in_order_under_random_loss(harness, loss, seed):
    h = harness(loss=loss, seed=seed)
    h.connect()
    up0, up1, down0, down1 = (payloads(t, n) for t, n in (("c0", 80), ("c1", 400), ("s0", 80), ("s1", 400)))
    big = os.urandom(30_000)
    i = 0
    # a game-like stream: a few messages every tick on each side
    while i < 400:
        for _ in range(4):
            if i < 400:
                assert h.send(1, up1[i]) == 0
                assert h.server.send(h.peer, 1, down1[i])
                if i < 80:
                    assert h.send(0, up0[i]) == 0
                    assert h.server.send(h.peer, 0, down0[i])
                i += 1
        if i == 200:
            assert h.server.send(h.peer, 0, big)
        h.step(0.01)
    assert h.run(30.0, lambda: len(h.s_messages(1)) >= 400 and len(h.c_messages(1)) >= 400
                 and len(h.s_messages(0)) >= 80 and len(h.c_messages(0)) >= 81)
    h.run(1.0)
    assert h.s_messages(0) == up0 and h.s_messages(1) == up1
    assert h.c_messages(1) == down1
    assert h.c_messages(0) == down0 + [big]
    s = h.stats()
    assert s.packets_lost > 0 and s.loss > 0 and s.redundant_bytes > 0
    assert h.state() == CONNECTED
    unexpected = {k: v for k, v in dict(h.server.drops).items() if v and k not in ("duplicate_packet", "stale_packet")}
    assert unexpected == {}


def test_reordering_and_duplicating_link_still_delivers_once_in_order(harness):
    h = harness(loss=0.05, seed=5, latency=0.01, jitter=0.04, duplicate=0.1)
    h.connect()
    up, down = payloads("u", 300), payloads("d", 300)
    big = os.urandom(50_000)
    for i in range(300):
        assert h.send(i % 2, up[i]) == 0
        assert h.server.send(h.peer, i % 2, down[i])
        if i == 100:
            assert h.server.send(h.peer, 1, big)
        h.step(0.005)
    assert h.run(20.0, lambda: len(h.s_messages(0)) + len(h.s_messages(1)) == 300
                 and len(h.c_messages(0)) + len(h.c_messages(1)) == 301)
    h.run(1.0)
    assert h.s_messages(0) == up[0::2] and h.s_messages(1) == up[1::2]
    assert h.c_messages(0) == down[0::2]
    assert h.c_messages(1) == down[1:101:2] + [big] + down[101::2]
    assert h.stats().datagrams_dropped > 0          # the network duplicates


def test_token_mode_seals_both_ways_and_drops_tampering(harness):
    tok = mint_token(KEY, 5, "arena", "alice", 60.0, now=UNIX, user_data=b"x")
    h = harness(config=server_config(token_keys={5: KEY}), token=tok)
    h.connect()
    assert h.lib.rct_sealed(h.conn) == 1
    claims = h.s_events[0].claims
    assert claims.room == "arena" and claims.player == "alice"
    for p in payloads("c", 30):
        h.send(1, p)
    for p in payloads("s", 30):
        h.server.send(h.peer, 1, p)
    h.server.send(h.peer, 0, os.urandom(4000))
    assert h.run(3.0, lambda: len(h.s_messages(1)) == 30 and len(h.c_messages(1)) == 30
                 and len(h.c_messages(0)) == 1)
    assert h.s_messages(1) == payloads("c", 30) and h.c_messages(1) == payloads("s", 30)
    # every client datagram after the handshake is sealed: nothing readable in clear
    assert not any(b"c-1-" in d for d in h.sent_up)
    # a tampered datagram from the server is dropped, nothing delivered twice or wrongly
    dropped = h.stats().datagrams_dropped

    def flip(data):
        if data[3] == 6 and len(data) > 40:
            data = bytearray(data)
            data[30] ^= 0x40
            return bytes(data)
        return data
    h.tamper_down = flip
    h.server.send(h.peer, 1, b"tampered-away")
    h.run(0.3)
    assert h.stats().datagrams_dropped > dropped
    assert b"tampered-away" not in h.c_messages(1)
    h.tamper_down = None
    assert h.run(3.0, lambda: b"tampered-away" in h.c_messages(1))
    assert h.c_messages(1).count(b"tampered-away") == 1
    # a tampered client datagram is auth_failed at the server
    forged = bytearray(h.sent_up[-1])
    forged[-1] ^= 1
    before = h.server.drops.get("auth_failed", 0)
    h.server.receive(bytes(forged), CLIENT_ADDRESS, h.now)
    assert h.server.drops.get("auth_failed", 0) == before + 1
    # a sealed disconnect from the server ends it
    h.server.disconnect(h.peer, "kicked")
    assert h.run(1.0, lambda: h.c_reasons() == ["remote:kicked"])


def test_a_forged_accept_in_token_mode_is_dropped(harness, lib):
    tok = mint_token(KEY, 5, "arena", "alice", 60.0, now=UNIX)
    h = harness(config=server_config(token_keys={5: KEY}), token=tok)
    h.tamper_down = lambda d: d[:14] if d[3] == 4 else d      # strip flags + tag from ACCEPT
    h.run(1.0)
    assert h.state() != CONNECTED and h.stats().datagrams_dropped > 0
    h.tamper_down = None
    h.connect()


def test_open_server_refuses_a_token(harness):
    tok = mint_token(KEY, 5, "arena", "alice", 60.0, now=UNIX)
    h = harness(token=tok)
    assert h.run(1.0, lambda: h.c_reasons() != [])
    assert h.c_reasons() == ["refused:token_unsupported"] and h.state() == CLOSED


def test_server_disconnect_is_reported_as_remote_closed(harness):
    h = harness()
    h.connect()
    h.server.disconnect(h.peer)
    assert h.run(1.0, lambda: h.c_reasons() != [])
    assert h.c_reasons() == ["remote:closed"] and h.state() == CLOSED


def test_a_silent_server_times_out(harness):
    h = harness(peer_timeout=2.0)
    h.connect()
    start = h.now
    h.server_silent = True
    assert h.run(3.0, lambda: h.c_reasons() != [])
    assert h.c_reasons() == ["timeout"]
    assert 1.9 <= h.now - start <= 2.2
    h.run(0.2)
    assert h.state() == CLOSED
    assert h.s_disconnects() == ["remote:timeout"]


def test_connect_timeout_without_a_server(harness):
    h = harness()
    h.server_silent = True
    assert h.run(6.0, lambda: h.c_reasons() != [])
    assert h.c_reasons() == ["connect_timeout"] and 4.99 <= h.now <= 5.1


def test_client_disconnect_reaches_the_server(harness):
    h = harness()
    h.connect()
    h.lib.rct_disconnect(h.conn, 0, h.now)
    h._drain()
    assert h.c_reasons() == ["local:closed"]
    assert h.run(1.0, lambda: h.s_disconnects() != [])
    assert h.s_disconnects() == ["remote:closed"] and h.state() == CLOSED
    assert sum(1 for d in h.sent_up if d[3] == 7) == 3


@pytest.mark.parametrize("sealed", [False, True])
def test_path_challenge_is_answered_and_the_server_migrates(harness, sealed):
    if sealed:
        tok = mint_token(KEY, 5, "arena", "alice", 60.0, now=UNIX)
        h = harness(config=server_config(token_keys={5: KEY}), token=tok)
    else:
        h = harness()
    h.connect()
    for p in payloads("before", 20):
        h.send(1, p)
    h.run(0.5)
    h.address = ("10.0.0.3", 50000)               # the NAT rebinds
    for p in payloads("after", 20):
        h.send(1, p)
        h.server.send(h.peer, 1, p)
    assert h.run(2.0, lambda: any(isinstance(e, PeerMigrated) for e in h.s_events))
    migrated = [e for e in h.s_events if isinstance(e, PeerMigrated)]
    assert migrated[0].new_address == ("10.0.0.3", 50000)
    assert any(d[3] == 9 for d in h.sent_up)       # PATH_RESPONSE
    assert h.run(2.0, lambda: len(h.s_messages(1)) == 40 and len(h.c_messages(1)) == 20)
    assert h.s_messages(1) == payloads("before", 20) + payloads("after", 20)
    assert h.c_messages(1) == payloads("after", 20)
    assert h.server.peer_address(h.peer) == ("10.0.0.3", 50000)
    assert h.state() == CONNECTED
