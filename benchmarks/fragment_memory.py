"""The M4 pattern (issue 17): many connections each park never-completed fragments; RSS figures.

One server Endpoint, driven in memory in this process (no sockets). ``--peers`` open-mode
clients connect; the clients are then dropped, keeping only their sessions. Each connection then
parks, on both reliable channels (0 and 1): the message delivery waits for (id 0) with every
fragment but the last, as large as the mtu allows, and one 1-byte fragment (of 255) of every
other message id of the window, several records per datagram. Nothing ever completes. Then time
runs past ``peer_timeout`` and every connection times out.

Prints one JSON object: resident set size (RSS, from /proc/self/statm) before, while parked and
after they left, the endpoint's receive-memory figures and drops. Before the "after" figure the
process runs ``gc.collect()`` and glibc's ``malloc_trim(0)``: glibc keeps freed heap pages for
reuse rather than returning them (that is not a leak, but RSS cannot tell the difference), and
trimming makes RSS show what is really still held.

    python benchmarks/fragment_memory.py --peers 500    # also: benchmarks/attack.py --scenario fragments
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from relay_core import Endpoint, EndpointConfig, decode_packet, encode_packet  # noqa: E402

SERVER = ("10.0.0.1", 7777)
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass                            # not glibc: RSS is what it is


def server_config(args) -> EndpointConfig:
    extra = {}
    if args.receive_memory_limit is not None:
        extra["receive_memory_limit"] = args.receive_memory_limit
    return EndpointConfig(accept_connections=True, seed=1, max_peers=args.max_peers or args.peers,
                          handshake_rate=None, **extra)


def connect(server: Endpoint, count: int, now: float) -> list[tuple[tuple, int]]:
    """Open ``count`` sessions; returns (address, session id) of each, the clients discarded."""
    sessions = []
    for start in range(0, count, 50):
        clients = []
        for i in range(start, min(count, start + 50)):
            client = Endpoint(EndpointConfig(seed=1000 + i))
            clients.append((client, client.connect(SERVER, now), ("10.1.%d.%d" % (i // 250, i % 250 + 1), 4000)))
        for _ in range(6):
            for client, _, address in clients:
                for datagram, _ in client.datagrams_to_send(now):
                    server.receive(datagram, address, now)
            by_address = {address: client for client, _, address in clients}
            for datagram, to in server.datagrams_to_send(now):
                if to in by_address:
                    by_address[to].receive(datagram, SERVER, now)
        for client, peer, address in clients:
            assert client.is_connected(peer), "handshake did not finish"
            heartbeat = client.datagrams_to_send(now + 5.0)[0][0]
            sessions.append((address, decode_packet(heartbeat)["session_id"]))
    return sessions


def fragment(channel: int, msg_id: int, index: int, count: int, payload: bytes) -> dict:
    return dict(kind="fragment", channel=channel, msg_id=msg_id, fragment_index=index,
                fragment_count=count, payload=payload.hex())


def datagram(session: int, seq: int, records: list[dict]) -> bytes:
    return encode_packet(dict(type="data", session_id=session, seq=seq, ack=0, ack_bits=0,
                              send_time=0, echo_time=0, records=records))


def attack_records(config: EndpointConfig) -> list[list[dict]]:
    """The records of one connection's attack, grouped into datagrams."""
    big = config.fragment_size
    count = min(255, config.max_message_size // big)
    groups: list[list[dict]] = []
    for channel, spec in enumerate(config.channels):
        if spec.mode not in ("reliable_ordered", "redundant"):
            continue
        # The message delivery waits for: all fragments but the last.
        for index in range(count - 1):
            groups.append([fragment(channel, 0, index, count, bytes(big))])
        # One 1-byte fragment of every other message id in the window.
        small = [fragment(channel, msg_id, 0, 255, b"x") for msg_id in range(1, spec.window)]
        per_datagram = (config.mtu - 64) // 12
        groups.extend(small[i:i + per_datagram] for i in range(0, len(small), per_datagram))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=300)
    parser.add_argument("--max-peers", type=int, default=None)
    parser.add_argument("--receive-memory-limit", type=int, default=None)
    args = parser.parse_args()
    config = server_config(args)
    server = Endpoint(config)
    now = 0.0
    sessions = connect(server, args.peers, now)
    groups = attack_records(config)
    trim()
    before = rss()

    for address, session in sessions:
        for seq, records in enumerate(groups, start=100):
            server.receive(datagram(session, seq & 0xFFFF, records), address, now)
        server.datagrams_to_send(now)
    while server.next_event() is not None:
        pass
    memory = getattr(server, "receive_memory", None)
    parked_used = memory["used"] if memory else None
    trim()
    parked = rss()

    now += config.peer_timeout + 1.0
    server.handle_timeout(now)
    server.datagrams_to_send(now)
    while server.next_event() is not None:
        pass
    assert server.peer_count == 0
    trim()
    after = rss()
    memory = getattr(server, "receive_memory", None)
    print(json.dumps(dict(
        peers=args.peers, rss_before=before, rss_parked=parked, rss_after=after,
        per_peer=(parked - before) / args.peers, parked_used=parked_used,
        limit=memory["limit"] if memory else None, used_after=memory["used"] if memory else None,
        drops=server.drops)))


if __name__ == "__main__":
    main()
