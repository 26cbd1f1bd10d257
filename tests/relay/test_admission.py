"""Admission while reading (Endpoint.admit_raw through relay._batchio): what a server can tell
at a glance is dropped before any Python object exists, and nothing a real client sends is.

Over real loopback sockets, IPv4 and IPv6: the cookie the C path recomputes (over the repr()
of the address tuple, made from the sockaddr) is the one the server issued, so a client
connects; forged cookies, DATA from unknown addresses and requests over the budget are counted
drops that recv never returns."""
from __future__ import annotations

import json
import pathlib
import random
import socket
import time

import pytest

from relay_core import Endpoint, EndpointConfig
from test_batchio import HAS_IPV6
from relay_core.wire import encode_packet

_batchio = pytest.importorskip("relay._batchio")
if not _batchio.AVAILABLE:
    pytest.skip("recvmmsg/sendmmsg are Linux-only", allow_module_level=True)


FAMILIES = [(socket.AF_INET, "127.0.0.1")] + ([(socket.AF_INET6, "::1")] if HAS_IPV6 else [])


class Server:
    def __init__(self, family, host, **config):
        self.endpoint = Endpoint(EndpointConfig(accept_connections=True, **config))
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.io = _batchio.BatchSocket(self.sock.fileno())
        self.io.set_admission(self.endpoint)
        self.address = self.sock.getsockname()

    def pump(self, now, wait=0.02):
        """Reads what arrives within ``wait``; returns the datagrams recv handed over."""
        handed = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            batch = self.io.recv(-1, now)
            if batch:
                handed += batch
                self.endpoint.receive_batch(batch, now)
            time.sleep(0.001)
        _batchio.send_batch(self.sock.fileno(), self.endpoint.datagrams_to_send(now))
        return handed

    def close(self):
        self.sock.close()


def connect_client(server, client, sock, family):
    """Connect ``client`` (an Endpoint) to ``server`` over ``sock``, its socket, in steps of
    0.1 simulated seconds (at most 1): (the client's peer id, the time reached)."""
    peer = client.connect(server.address[:2] if family == socket.AF_INET else server.address, 0.0)
    now = 0.0
    while not client.is_connected(peer) and now < 1.0:
        for data, _ in client.datagrams_to_send(now):
            sock.sendto(data, server.address)
        server.pump(now)
        read_into(client, sock, now)
        now += 0.1
    assert client.is_connected(peer), server.endpoint.drops
    return peer, now


def read_into(client, sock, now):
    """Everything waiting on ``sock``, into ``client``."""
    try:
        while True:
            data, source = sock.recvfrom(2048)
            client.receive(data, source, now)
    except (TimeoutError, BlockingIOError):
        pass


@pytest.mark.parametrize("family,host", FAMILIES)
def test_a_client_connects_through_the_admission_and_forgeries_never_reach_python(family, host):
    server = Server(family, host)
    client = Endpoint(EndpointConfig(seed=3))
    rng = random.Random(1)
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock, socket.socket(family, socket.SOCK_DGRAM) as stranger:
            sock.bind((host, 0))
            sock.settimeout(0.05)
            peer, now = connect_client(server, client, sock, family)
            assert "bad_cookie" not in server.endpoint.drops

            # Forged cookies, and DATA from an address without a session: dropped while reading.
            # (DATA from the client's own address with a wrong session id is the Python path's:
            # the address is known.)
            for _ in range(50):
                forged = bytearray(encode_packet(dict(type="connect_response", connect_id=rng.getrandbits(32),
                                                      cookie_time=0, cookie_mac=rng.randbytes(16).hex(),
                                                      ack_delay_ms=5)))
                sock.sendto(bytes(forged), server.address)
                stranger.sendto(encode_packet(dict(type="data", session_id=rng.getrandbits(32) | 1, seq=0,
                                               ack=0, ack_bits=0, send_time=0, echo_time=0, records=[])),
                            server.address)
                sock.sendto(b"junk" * 5, server.address)
            handed = server.pump(now)
            assert handed == []
            drops = server.endpoint.drops
            assert drops["bad_cookie"] == 50 and drops["bad_magic"] == 50
            assert drops["unknown_peer"] == 50
            assert server.io.datagrams_read >= 150 + 2         # the forgeries and the handshake
            assert server.endpoint.peer_count == 1
    finally:
        server.close()


def test_requests_over_the_budget_are_refused_while_reading_and_a_resend_still_gets_in():
    server = Server(socket.AF_INET, "127.0.0.1", handshake_budget=10.0, handshake_rate=None)
    rng = random.Random(2)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client_sock:
            flood.bind(("127.0.0.1", 0))
            client_sock.bind(("127.0.0.1", 0))
            for _ in range(200):
                flood.sendto(encode_packet(dict(type="connect_request", connect_id=rng.getrandbits(32))),
                             server.address)
            handed = server.pump(0.0)
            # The burst (10) less the reserve fresh requests leave: 7 handed over, no more.
            assert len(handed) == 7
            assert server.endpoint.drops["handshake_budget"] == 193
            client = Endpoint(EndpointConfig(seed=4))
            peer = client.connect(server.address, 0.0)
            (request, _), = client.datagrams_to_send(0.0)
            client_sock.sendto(request, server.address)
            assert server.pump(0.0) == []                   # fresh: no room left
            client_sock.sendto(request, server.address)     # its resend uses the reserve
            assert len(server.pump(0.0)) == 1
            client_sock.settimeout(1.0)
            data, source = client_sock.recvfrom(2048)
            client.receive(data, source, 0.0)
            assert not client.is_connected(peer) and data[3] == 0x02    # a CHALLENGE
    finally:
        server.close()


# -- the C path counts every vector as the Python path does ---------------------------------------

def _vectors():
    directory = pathlib.Path(__file__).resolve().parents[1] / "vectors"
    for path in sorted(directory.glob("*.json")):
        for vector in json.loads(path.read_text())["vectors"]:
            if "server_drop" in vector:
                yield vector


@pytest.mark.parametrize("vector", list(_vectors()), ids=lambda v: v["name"])
def test_every_vector_read_through_the_admission_is_dropped_or_answered_as_the_python_path_does(vector):
    """tests/core/test_vectors.py's expectations (a server receiving each vector from an
    unknown address), with the datagram read from a real socket: admit_raw drops what it can
    under the same reason, and hands over the rest."""
    server = Server(socket.AF_INET, "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.sendto(bytes.fromhex(vector["hex"]), server.address)
            server.pump(0.0)
            expected = vector["server_drop"]
            assert server.endpoint.drops == ({expected: 1} if expected else {})
            assert server.endpoint.peer_count == 0
            sock.settimeout(0.2 if vector.get("server_reply") else 0.02)
            try:
                reply = sock.recv(2048)
            except (TimeoutError, BlockingIOError):
                reply = None
            assert (reply is not None) == bool(vector.get("server_reply")), reply
    finally:
        server.close()
