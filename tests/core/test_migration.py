"""Address migration (docs/PROTOCOL.md section 8.10): a connected peer whose source address
changes keeps its session once it proves it receives at the new address; forgeries and replays
from other addresses get nothing, and what an unvalidated address receives is bounded."""
from __future__ import annotations

import pytest

from relay_core import EndpointConfig, MessageReceived
from relay_core.events import PeerMigrated
from relay_core.simlink import LinkedPair, LinkProfile
from relay_core.token import generate_key, mint_token
from relay_core.wire import decode_packet, encode_packet

UNIX = 1_900_000_000.0
KEY = bytes(range(32))
NEW_ADDRESS = ("10.0.0.2", 51234)          # same host, new NAT port
ATTACKER = ("203.0.113.9", 4444)


def make_pair(sealed, loss=0.0, seed=3):
    server = EndpointConfig(accept_connections=True, seed=seed, token_keys={1: KEY} if sealed else None)
    pair = LinkedPair(server, EndpointConfig(seed=seed + 1), up=LinkProfile(loss=loss, delay=0.01),
                      down=LinkProfile(loss=loss, delay=0.01), seed=seed, unix_offset=UNIX)
    pair.connect(token=mint_token(KEY, 1, "room", "p1", 60, now=UNIX) if sealed else None)
    return pair


def payloads(events):
    return [e.payload for e in events if isinstance(e, MessageReceived)]


def exchange(pair, ticks, start):
    for i in range(start, start + ticks):
        pair.client.send(pair.client_peer, 0, b"input %d" % i)
        pair.server.send(pair.server_peer, 0, b"frame %d" % i)
        pair.run(0.016)
    return start + ticks


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("loss", [0.0, 0.1])
def test_a_client_that_changes_address_keeps_its_session(sealed, loss):
    pair = make_pair(sealed, loss)
    old = pair.CLIENT_ADDRESS
    n = exchange(pair, 60, 0)
    pair.rebind_client(NEW_ADDRESS)
    n = exchange(pair, 120, n)
    pair.run(3.0)
    migrated = [e for e in pair.server_events if isinstance(e, PeerMigrated)]
    assert migrated == [PeerMigrated(pair.server_peer, old, NEW_ADDRESS)]
    assert pair.server.peer_address(pair.server_peer) == NEW_ADDRESS
    assert pair.server.is_connected(pair.server_peer) and pair.client.is_connected(pair.client_peer)
    # no gap, no duplicate, in either direction
    assert payloads(pair.server_events) == [b"input %d" % i for i in range(n)]
    assert payloads(pair.client_events) == [b"frame %d" % i for i in range(n)]
    stats = pair.server.path_stats
    assert stats["migrations"] == 1 and 1 <= stats["challenges_sent"] <= 5
    assert pair.server.session_info(pair.server_peer)["encrypted"] is sealed


def test_a_forged_packet_from_a_third_address_gets_no_reply_and_starts_nothing():
    pair = make_pair(sealed=True)
    up = []
    original = pair.up.send
    pair.up.send = lambda data, now: (up.append(data), original(data, now))
    exchange(pair, 10, 0)
    pair.run(0.1)                               # everything sent has arrived
    genuine = next(d for d in reversed(up) if d[3] == 6)
    before = pair.server.session_info(pair.server_peer)
    for i in range(20, len(genuine)):
        forged = bytearray(genuine)
        forged[i] ^= 0x80
        pair.server.receive(bytes(forged), ATTACKER, pair.now)
    assert pair.server.drops == {"auth_failed": len(genuine) - 20}
    assert pair.server.datagrams_to_send(pair.now) == [] or all(
        address == pair.CLIENT_ADDRESS for _, address in pair.server.datagrams_to_send(pair.now))
    assert pair.server.path_stats == {"challenges_sent": 0, "challenge_bytes": 0, "budget_spent": 0,
                                      "migrations": 0}
    assert pair.server.session_info(pair.server_peer) == before
    # a replay of a genuine packet from the attacker's address is a duplicate: no challenge either
    pair.server.receive(genuine, ATTACKER, pair.now)
    assert pair.server.path_stats["challenges_sent"] == 0
    assert pair.server.peer_address(pair.server_peer) == pair.CLIENT_ADDRESS


def test_an_address_that_never_answers_gets_only_a_bounded_trickle_of_challenges():
    """The client's packets arrive from a new address whose return path is broken: the server
    keeps the session on the old address, delivers the inputs, and sends the new address
    challenges only, spaced out, within path_challenge_budget bytes."""
    server_config = EndpointConfig(accept_connections=True, seed=3, token_keys={1: KEY},
                                   path_challenge_budget=200)
    pair = LinkedPair(server_config, EndpointConfig(seed=4), seed=3, unix_offset=UNIX)
    pair.connect(token=mint_token(KEY, 1, "room", "p1", 60, now=UNIX))
    server, client = pair.server, pair.client
    budget = server.config.path_challenge_budget
    sent_to_new, sent_to_old = [], 0
    now = pair.now
    for i in range(200):                        # 3.3 seconds of 60 Hz inputs (acks never return:
                                                # stay inside the 256-message window)
        now += 1 / 60
        client.send(pair.client_peer, 0, b"input %d" % i)
        server.send(pair.server_peer, 0, b"frame %d" % i)
        for data, _ in client.datagrams_to_send(now):
            server.receive(data, NEW_ADDRESS, now)
        for data, address in server.datagrams_to_send(now):
            if address == NEW_ADDRESS:
                sent_to_new.append((now, data))
            else:
                sent_to_old += 1                 # the old path: lost as well
    assert sent_to_new, "validation was attempted"
    assert all(decode_packet(d)["type"] == "path_challenge" for _, d in sent_to_new)
    assert sum(len(d) for _, d in sent_to_new) <= budget and len(sent_to_new) == budget // 34
    times = [t for t, _ in sent_to_new]
    assert all(b - a >= server.config.connect_resend_interval - 1e-9 for a, b in zip(times, times[1:]))
    assert server.path_stats["budget_spent"] > 0
    assert server.peer_address(pair.server_peer) == pair.CLIENT_ADDRESS and sent_to_old > 0
    delivered = [e.payload for e in iter(server.next_event, None) if isinstance(e, MessageReceived)]
    assert delivered == [b"input %d" % i for i in range(200)]


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "open"])
def test_a_path_response_that_answers_nothing_is_dropped(sealed):
    pair = make_pair(sealed)
    info = pair.server.session_info(pair.server_peer)
    session = int.from_bytes(next(iter([d for d, _ in pair.client.datagrams_to_send(pair.now + 1)]))[4:8], "little")
    response = dict(type="path_response", session_id=session, data="0102030405060708")
    if sealed:
        key = next(e.claims for e in pair.server_events if hasattr(e, "claims") and e.claims).client_key
        response["seq"] = 40000
        datagram = encode_packet(response, key=key, counter=40000)
    else:
        datagram = encode_packet(response)
    pair.server.receive(datagram, ATTACKER, pair.now)
    assert pair.server.drops == {"path_unvalidated": 1}
    if sealed:                                  # and one sealed with a key it does not know
        pair.server.receive(encode_packet(response, key=generate_key(), counter=40000), ATTACKER, pair.now)
        assert pair.server.drops == {"path_unvalidated": 1, "auth_failed": 1}
    assert pair.server.peer_address(pair.server_peer) == pair.CLIENT_ADDRESS
    assert info["encrypted"] is sealed


def test_open_mode_challenge_is_never_larger_than_the_packet_that_caused_it():
    pair = make_pair(sealed=False)
    session = int.from_bytes(pair.client.datagrams_to_send(pair.now + 1)[0][0][4:8], "little")
    tiny = encode_packet(dict(type="data", session_id=session, seq=30000, ack=0, ack_bits=0,
                              send_time=0, echo_time=0))
    pair.server.receive(tiny, ATTACKER, pair.now)
    replies = pair.server.datagrams_to_send(pair.now)
    to_attacker = [d for d, a in replies if a == ATTACKER]
    assert [len(d) for d in to_attacker] == [16] and len(tiny) == 20
    # open mode: the session id alone lets anyone who sees it take the session (documented)
    challenge = decode_packet(to_attacker[0])
    pair.server.receive(encode_packet(dict(challenge, type="path_response")), ATTACKER, pair.now)
    assert pair.server.peer_address(pair.server_peer) == ATTACKER


def test_client_answers_a_challenge_only_from_its_server():
    pair = make_pair(sealed=False)
    session = int.from_bytes(pair.client.datagrams_to_send(pair.now + 1)[0][0][4:8], "little")
    challenge = encode_packet(dict(type="path_challenge", session_id=session, data="00" * 8))
    pair.client.receive(challenge, ATTACKER, pair.now)
    assert pair.client.drops == {"unknown_peer": 1}
    pair.client.receive(challenge, pair.SERVER_ADDRESS, pair.now)
    replies = pair.client.datagrams_to_send(pair.now)
    assert [(decode_packet(d)["type"], a) for d, a in replies if d[3] == 9] == [
        ("path_response", pair.SERVER_ADDRESS)]
    pair.server.receive(challenge, pair.CLIENT_ADDRESS, pair.now)     # servers do not answer
    assert pair.server.drops == {"unexpected_packet": 1}
