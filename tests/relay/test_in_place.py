"""In-place receive (Endpoint.receive_raw through relay._batchio): a connected peer's DATA is
handled in the recvmmsg buffer, with no bytes or address object; everything else still reaches
receive_batch as (bytes, address), and what either path delivers is the same.

Over real loopback sockets, IPv4 and IPv6."""
from __future__ import annotations

import contextlib
import socket
import time

import pytest

from relay_core import Endpoint, EndpointConfig, MessageReceived
from relay_core.wire import decode_packet, encode_packet
from test_admission import FAMILIES, Server, connect_client, read_into


def _sockets(stack, family, host, count):
    """``count`` bound client sockets, closed with ``stack``."""
    socks = [stack.enter_context(socket.socket(family, socket.SOCK_DGRAM)) for _ in range(count)]
    for sock in socks:
        sock.bind((host, 0))
        sock.settimeout(0.05)
    return socks


def _messages(endpoint):
    got = []
    while (event := endpoint.next_event()) is not None:
        if isinstance(event, MessageReceived):
            got.append((event.peer_id, event.payload))
    return got


@pytest.mark.parametrize("family,host", FAMILIES)
def test_connected_peers_data_is_taken_in_place_and_the_rest_is_handed_over(family, host):
    server = Server(family, host)
    server.io.set_admission(server.endpoint, in_place=True)
    try:
        with contextlib.ExitStack() as stack:
            a_sock, b_sock, other = _sockets(stack, family, host, 3)
            a, b = Endpoint(EndpointConfig(seed=3)), Endpoint(EndpointConfig(seed=4))
            a_peer, now = connect_client(server, a, a_sock, family)
            b_peer, now = connect_client(server, b, b_sock, family)
            _messages(server.endpoint)
            server_a = server.endpoint.indexed_peer(a_sock.getsockname())
            server_b = server.endpoint.indexed_peer(b_sock.getsockname())
            assert None not in (server_a, server_b) and server_a != server_b
            taken = server.io.taken_in_place

            for i in range(20):
                a.send(a_peer, 0, b"a%d" % i)
                b.send(b_peer, 0, b"b%d" % i)
                for client, sock in ((a, a_sock), (b, b_sock)):
                    for data, _ in client.datagrams_to_send(now):
                        sock.sendto(data, server.address)
                assert server.pump(now) == []           # nothing of theirs became a Python object
                for client, sock in ((a, a_sock), (b, b_sock)):
                    read_into(client, sock, now)
                now += 0.05
            got = _messages(server.endpoint)
            assert [p for peer, p in got if peer == server_a] == [b"a%d" % i for i in range(20)]
            assert [p for peer, p in got if peer == server_b] == [b"b%d" % i for i in range(20)]
            assert server.io.taken_in_place - taken >= 40

            # A's session id from another address (a migration, or a forgery) and a wrong session
            # id from A's own address take the Python path, which decides as before.
            a.send(a_peer, 0, b"moved")
            [(packet, _)] = a.datagrams_to_send(now)
            other.sendto(packet, server.address)
            header = decode_packet(packet)
            wrong = encode_packet(dict(header, session_id=header["session_id"] ^ 1, records=[]))
            a_sock.sendto(wrong, server.address)
            handed = server.pump(now)
            assert sorted(data for data, _ in handed) == sorted([packet, wrong])
            assert server.endpoint.drops.get("wrong_session") == 1
            assert _messages(server.endpoint) == [(server_a, b"moved")]   # delivered, path checked
    finally:
        server.close()


def test_in_place_needs_an_endpoint():
    from relay._batchio import BatchSocket
    with pytest.raises(ValueError, match="in_place needs an endpoint"):
        BatchSocket(-1).set_admission(None, in_place=True)


@pytest.mark.parametrize("family,host", FAMILIES)
def test_connected_peers_data_goes_out_from_the_outbox(family, host):
    server = Server(family, host)
    server.io.set_admission(server.endpoint, in_place=True)
    try:
        with contextlib.ExitStack() as stack:
            a_sock, b_sock = _sockets(stack, family, host, 2)
            a, b = Endpoint(EndpointConfig(seed=3)), Endpoint(EndpointConfig(seed=4))
            a_peer, now = connect_client(server, a, a_sock, family)
            b_peer, now = connect_client(server, b, b_sock, family)
            _messages(a)
            _messages(b)
            server_a = server.endpoint.indexed_peer(a_sock.getsockname())
            server_b = server.endpoint.indexed_peer(b_sock.getsockname())
            server.endpoint.send(server_a, 0, b"to a")
            server.endpoint.send(server_b, 0, b"to b")
            assert server.io.flush_in_place(now) == []      # nothing for the Python path
            assert server.io.outbox_count == 2
            copies = server.io.outbox_datagrams(0)
            assert sorted(to for _, to in copies) == sorted([a_sock.getsockname(), b_sock.getsockname()])
            assert server.io.outbox_datagrams(1) == copies[1:]
            assert server.io.send_outbox(0) == 2
            assert server.io.last_sent_count == 2
            assert server.io.last_sent_bytes == sum(len(data) for data, _ in copies)
            received = {}
            for sock in (a_sock, b_sock):
                data, _ = sock.recvfrom(2048)
                received[sock.getsockname()] = data
            assert received == {to: data for data, to in copies}
            a.receive(received[a_sock.getsockname()], server.address, now)
            b.receive(received[b_sock.getsockname()], server.address, now)
            assert _messages(a) == [(a_peer, b"to a")] and _messages(b) == [(b_peer, b"to b")]
            with pytest.raises(IndexError):
                server.io.send_outbox(3)
    finally:
        server.close()



@pytest.mark.parametrize("family,host", FAMILIES)
def test_a_grouped_peers_data_waits_for_its_group_and_its_flush_goes_out_from_the_outbox(family, host):
    """The relay's tick pass over a room: DATA taken in place from its players is held until
    run_group, then send_many(..., now) writes each player's datagram into the outbox at once,
    and the flush_in_place that follows keeps it there (one datagram per player, not two)."""
    server = Server(family, host)
    server.io.set_admission(server.endpoint, in_place=True)
    try:
        with contextlib.ExitStack() as stack:
            a_sock, b_sock = _sockets(stack, family, host, 2)
            a, b = Endpoint(EndpointConfig(seed=3)), Endpoint(EndpointConfig(seed=4))
            a_peer, now = connect_client(server, a, a_sock, family)
            b_peer, now = connect_client(server, b, b_sock, family)
            _messages(a)
            _messages(b)
            _messages(server.endpoint)
            server.io.flush_in_place(now)           # the outbox handed out once, as the driver does
            server_a = server.endpoint.indexed_peer(a_sock.getsockname())
            server_b = server.endpoint.indexed_peer(b_sock.getsockname())
            for peer in (server_a, server_b):
                assert server.endpoint.bind_sink(peer, None, 0)
            taken = server.io.taken_in_place
            for client, peer, sock in ((a, a_peer, a_sock), (b, b_peer, b_sock)):
                client.send(peer, 0, b"input")
                for data, _ in client.datagrams_to_send(now):
                    sock.sendto(data, server.address)
            deadline = time.monotonic() + 1.0
            while server.io.taken_in_place - taken < 2 and time.monotonic() < deadline:
                assert server.io.recv(-1, now) == []            # read, no flush (pump flushes)
                time.sleep(0.001)
            assert server.io.taken_in_place - taken == 2
            assert _messages(server.endpoint) == []             # held
            assert server.endpoint.run_group(0)
            assert sorted(_messages(server.endpoint)) == sorted([(server_a, b"input"), (server_b, b"input")])
            assert server.io.outbox_written == 0                # the last flush's, handed out
            assert server.endpoint.send_many([server_a, server_b], 0, b"frame", now) == []
            assert server.io.outbox_count == 2                  # written in the room's turn
            assert server.io.outbox_written == 2                # what a driver's send_ready sends
            assert server.io.flush_in_place(now) == []
            assert server.io.outbox_count == 2                  # kept, and no second datagram
            assert server.io.outbox_written == 0                # handed out
            assert server.io.send_outbox(0) == 2
            for client, peer, sock in ((a, a_peer, a_sock), (b, b_peer, b_sock)):
                data, _ = sock.recvfrom(2048)
                client.receive(data, server.address, now)
                assert _messages(client) == [(peer, b"frame")]
            assert server.io.flush_in_place(now) == [] and server.io.outbox_count == 0
    finally:
        server.close()
