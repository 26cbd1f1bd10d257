"""Token mode: the token handshake, sealed DATA/DISCONNECT, replay and forgery, and the
per-source handshake rate limit (docs/PROTOCOL.md sections 8.7-8.9)."""
from __future__ import annotations

import pytest

from relay_core import EndpointConfig, Endpoint, MessageReceived, PeerConnected, PeerDisconnected
from relay_core.simlink import LinkedPair, LinkProfile
from relay_core.token import generate_key, mint_token
from relay_core.wire import decode_packet, encode_packet

UNIX = 1_900_000_000.0          # unix time at simulated time 0
KEY = bytes(range(100, 132))
KEYS = {5: KEY}


def server_config(**overrides):
    return EndpointConfig(accept_connections=True, seed=1, token_keys=KEYS, **overrides)


def token(ttl=60.0, key=KEY, key_id=5, player="alice", now=UNIX):
    return mint_token(key, key_id, "arena", player, ttl, now=now, user_data=b"elo=1500")


def secure_pair(loss=0.0, seed=4, server=None, client=None, **link):
    profile = LinkProfile(loss=loss, **link)
    return LinkedPair(server or server_config(), client or EndpointConfig(seed=2),
                      up=profile, down=LinkProfile(loss=loss, **link), seed=seed, unix_offset=UNIX)


def connected_pair(**kw):
    pair = secure_pair(**kw)
    pair.connect(token=token())
    return pair


def payloads(events, peer_id=None):
    return [e.payload for e in events if isinstance(e, MessageReceived)]


def tap(link):
    """Record every datagram offered to a link."""
    seen = []
    original = link.send
    link.send = lambda data, now: (seen.append(data), original(data, now))
    return seen


def refusal(pair, tok):
    pair.client_peer = pair.client.connect(pair.SERVER_ADDRESS, pair.now, tok)
    pair.run_until(lambda: any(isinstance(e, PeerDisconnected) for e in pair.client_events), 2.0)
    return [e.reason for e in pair.client_events if isinstance(e, PeerDisconnected)][-1]


# -- handshake ----------------------------------------------------------------------------------

def test_token_handshake_gives_the_server_the_claims_and_seals_both_directions():
    pair = connected_pair()
    connected = [e for e in pair.server_events if isinstance(e, PeerConnected)]
    assert len(connected) == 1
    claims = connected[0].claims
    assert (claims.room, claims.player, claims.user_data) == ("arena", "alice", b"elo=1500")
    assert pair.server.peer_claims(pair.server_peer) == claims
    assert [e.claims for e in pair.client_events if isinstance(e, PeerConnected)] == [None]
    assert pair.server.session_info(pair.server_peer)["encrypted"]
    assert pair.client.session_info(pair.client_peer)["encrypted"]


def test_messages_arrive_exactly_once_and_in_order_at_ten_percent_loss():
    pair = connected_pair(loss=0.10, delay=0.01, jitter=0.01, seed=9)
    up = tap(pair.up)
    big = bytes(range(256)) * 20                 # fragmented: 5120 bytes
    expected_up = []
    for i in range(300):
        expected_up.append(b"input %d" % i)
        pair.client.send(pair.client_peer, 0, expected_up[-1])
        pair.server.send(pair.server_peer, 1, b"frame %d" % i)
        if i % 50 == 0:
            expected_up.append(big + bytes([i]))
            pair.client.send(pair.client_peer, 0, expected_up[-1])
        pair.run(0.016)
    pair.run(3.0)
    assert payloads(pair.server_events) == expected_up
    assert payloads(pair.client_events) == [b"frame %d" % i for i in range(300)]
    assert pair.up.counters.dropped > 20 and pair.down.counters.dropped > 20
    assert "auth_failed" not in pair.server.drops and "auth_failed" not in pair.client.drops
    # Nothing readable on the wire, and every datagram within the mtu.
    data = [d for d in up if d[3] == 6]
    assert data and all(b"input" not in d for d in data)
    assert max(len(d) for d in up) <= 1200


def test_sealed_session_size_limits_leave_room_for_the_tag():
    pair = connected_pair()
    seen = tap(pair.up)
    limit = pair.client.config.max_whole_message - 16
    with pytest.raises(ValueError):
        pair.client.send(pair.client_peer, 3, bytes(limit + 1))
    assert pair.client.send(pair.client_peer, 3, bytes(limit))
    assert pair.client.send(pair.client_peer, 0, bytes(50_000))
    pair.client.send_block(pair.client_peer, bytes(range(256)) * 100)
    pair.run(2.0)
    assert sorted(len(p) for p in payloads(pair.server_events)) == [limit, 50_000]
    assert max(len(d) for d in seen) == 1200


@pytest.mark.parametrize("mtu", [1200, 4000])
def test_sealed_packets_of_any_mtu_open_whole(mtu):
    """A sealed packet is opened into a buffer on the stack up to 2048 bytes and into one of
    its own beyond: both deliver the same messages."""
    pair = secure_pair(server=server_config(mtu=mtu), client=EndpointConfig(seed=2, mtu=mtu))
    pair.connect(token=token())
    seen = tap(pair.up)
    sent = [bytes([i]) * (mtu - 200) for i in range(20)]
    for payload in sent:
        assert pair.client.send(pair.client_peer, 0, payload)
        pair.run(0.03)
    pair.run(1.0)
    assert payloads(pair.server_events) == sent
    assert max(len(d) for d in seen) > (2100 if mtu > 2048 else 900)     # past the stack buffer


def test_a_repeated_connect_response_gets_the_same_accept_not_token_used():
    pair = secure_pair()
    up, down = tap(pair.up), tap(pair.down)
    pair.connect(token=token())
    response = next(d for d in up if decode_packet(d)["type"] == "connect_response")
    accept = next(d for d in down if decode_packet(d)["type"] == "accept")
    pair.server.receive(response, pair.CLIENT_ADDRESS, pair.now)
    assert pair.server.datagrams_to_send(pair.now) == [(accept, pair.CLIENT_ADDRESS)]
    assert pair.server.peer_count == 1 and pair.server.refusals == {}


@pytest.mark.parametrize("case,reason", [
    ("expired", "token_expired"), ("used", "token_used"), ("tampered", "token_invalid"),
    ("wrong_key", "token_invalid"), ("unknown_key_id", "token_invalid"),
])
def test_bad_tokens_are_refused_with_a_reason_the_client_sees(case, reason):
    pair = secure_pair()
    tok = token()
    if case == "expired":
        tok = token(ttl=5.0, now=UNIX - 10)
    elif case == "used":
        pair.connect(token=tok)
        pair.client.disconnect(pair.client_peer)
        pair.run(0.1)
        pair.client_events.clear()
    elif case == "tampered":
        private = bytearray(tok.private)
        private[40] ^= 1
        tok = type(tok)(bytes(private), tok.client_key, tok.server_key, tok.room, tok.player, tok.expires)
    elif case == "wrong_key":
        tok = token(key=generate_key())
    else:
        tok = token(key_id=6)
    assert refusal(pair, tok) == "refused:" + reason
    assert pair.server.refusals == {reason: 1}
    assert pair.server.peer_count == 0


def test_mode_mismatch_is_refused_both_ways():
    pair = secure_pair()
    assert refusal(pair, None) == "refused:token_required"
    open_pair = secure_pair(server=EndpointConfig(accept_connections=True, seed=1))
    assert refusal(open_pair, token()) == "refused:token_unsupported"
    assert open_pair.server.refusals == {"token_unsupported": 1}


def test_a_token_seen_on_the_wire_cannot_be_spent_from_another_address():
    """The CONNECT_RESPONSE tag needs the client key, which never travels."""
    pair = secure_pair()
    up = tap(pair.up)
    tok = token()
    peer = pair.client.connect(pair.SERVER_ADDRESS, pair.now, tok)
    pair.step()
    request = up[0]
    thief = ("10.9.9.9", 5555)
    pair.server.receive(request, thief, pair.now)
    challenge = pair.server.datagrams_to_send(pair.now)[0][0]
    fields = decode_packet(challenge)
    forged = dict(fields, type="connect_response", ack_delay_ms=5, token=tok.private.hex(), tag="00" * 16)
    pair.server.receive(encode_packet(forged), thief, pair.now)
    assert pair.server.drops.get("auth_failed") == 1
    assert pair.server.datagrams_to_send(pair.now) == []
    pair.run_until(lambda: pair.client.is_connected(peer), 2.0)      # the owner still can


def test_an_unsealed_or_forged_accept_is_dropped_by_the_client():
    pair = secure_pair()
    down = tap(pair.down)
    pair.connect(token=token())
    accept = decode_packet(next(d for d in down if decode_packet(d)["type"] == "accept"))
    client = Endpoint(EndpointConfig(seed=8))
    tok = token(player="bob")
    peer = client.connect(pair.SERVER_ADDRESS, 0.0, tok)
    request = client.datagrams_to_send(0.0)[0][0]
    server = Endpoint(server_config(), UNIX)
    server.receive(request, ("10.0.0.3", 1), 0.0)
    client.receive(server.datagrams_to_send(0.0)[0][0], pair.SERVER_ADDRESS, 0.0)
    connect_id = decode_packet(request)["connect_id"]
    plain = dict(type="accept", connect_id=connect_id, session_id=7, ack_delay_ms=5)
    client.receive(encode_packet(plain), pair.SERVER_ADDRESS, 0.0)
    client.receive(encode_packet(dict(plain, flags=1, tag=accept["tag"])), pair.SERVER_ADDRESS, 0.0)
    assert client.drops == {"auth_failed": 2}
    assert not client.is_connected(peer)


# -- sealed packets -----------------------------------------------------------------------------

def test_tampering_any_byte_of_a_data_packet_is_auth_failed_and_changes_nothing():
    pair = connected_pair()
    up = tap(pair.up)
    pair.client.send(pair.client_peer, 0, b"the real one")
    pair.run(0.05)
    packet = next(d for d in up if d[3] == 6 and len(d) > 36)      # DATA with a record
    pair.client.send(pair.client_peer, 0, b"later")
    before_stats = pair.server.peer_stats(pair.server_peer)
    before_info = pair.server.session_info(pair.server_peer)
    before_events = len(pair.server_events)
    expected = {}
    for i in range(len(packet)):
        tampered = bytearray(packet)
        tampered[i] ^= 0x01
        pair.server.receive(bytes(tampered), pair.CLIENT_ADDRESS, pair.now)
        reason = ("bad_magic" if i < 2 else "bad_version" if i == 2 else "bad_length" if i == 3
                  else "wrong_session" if i < 8 else "auth_failed")
        expected[reason] = expected.get(reason, 0) + 1
    assert pair.server.drops == expected
    assert expected["auth_failed"] == len(packet) - 8
    after = pair.server.peer_stats(pair.server_peer)
    assert (after.packets_received, after.bytes_received, after.rtt) == (
        before_stats.packets_received, before_stats.bytes_received, before_stats.rtt)
    assert pair.server.session_info(pair.server_peer) == before_info
    assert pair.server.datagrams_to_send(pair.now) == []       # never answered
    pair.run(0.2)
    assert payloads(pair.server_events[before_events:]) == [b"later"]


def test_a_replayed_packet_is_dropped_after_authentication_and_not_delivered_twice():
    pair = connected_pair()
    up = tap(pair.up)
    pair.client.send(pair.client_peer, 3, b"fire!")            # unreliable: no message-level dedup
    pair.run(0.05)
    old = next(d for d in up if d[3] == 6 and len(d) > 36)
    for _ in range(100):
        pair.client.send(pair.client_peer, 3, b"tick")
        pair.run(0.01)
    for _ in range(3):
        pair.server.receive(old, pair.CLIENT_ADDRESS, pair.now)
    assert payloads(pair.server_events).count(b"fire!") == 1
    assert "auth_failed" not in pair.server.drops
    assert pair.server.drops.get("duplicate_packet", 0) + pair.server.drops.get("stale_packet", 0) == 3


def test_a_packet_sealed_with_another_key_is_auth_failed():
    pair = connected_pair()
    up = tap(pair.up)
    pair.run(0.6)                                              # a heartbeat or two
    session_id = int.from_bytes(up[-1][4:8], "little")
    info = pair.server.session_info(pair.server_peer)
    for key in (generate_key(), token().client_key):
        forged = encode_packet(dict(type="data", session_id=session_id, seq=(info["receive_counter"] + 1) & 0xFFFF,
                                    ack=0, ack_bits=0, send_time=0, echo_time=0,
                                    records=[dict(kind="message", channel=3, msg_id=99, payload=b"evil".hex())]),
                               key=key)
        pair.server.receive(forged, pair.CLIENT_ADDRESS, pair.now)
    assert pair.server.drops == {"auth_failed": 2}
    assert pair.server.session_info(pair.server_peer) == info
    assert payloads(pair.server_events) == []


def test_an_unsealed_disconnect_cannot_end_a_sealed_session_but_the_real_one_does():
    pair = connected_pair()
    session_id = pair.client.session_info(pair.client_peer)
    up = tap(pair.up)
    pair.run(0.6)
    sid = int.from_bytes(up[-1][4:8], "little")
    pair.server.receive(encode_packet(dict(type="disconnect", session_id=sid, reason="kicked")),
                        pair.CLIENT_ADDRESS, pair.now)
    assert pair.server.drops == {"auth_failed": 1} and pair.server.is_connected(pair.server_peer)
    pair.client.disconnect(pair.client_peer, "shutdown")
    pair.run(0.05)
    goodbye = [d for d in up if d[3] == 7]
    assert len(goodbye) == 3 and len(set(goodbye)) == 1 and len(goodbye[0]) == 27
    assert decode_packet(goodbye[0], key=pair_keys(pair)[0])["reason"] == "shutdown"
    assert [e.reason for e in pair.server_events if isinstance(e, PeerDisconnected)] == ["remote:shutdown"]
    assert session_id["encrypted"]


def pair_keys(pair):
    claims = next(e.claims for e in pair.server_events if isinstance(e, PeerConnected))
    return claims.client_key, claims.server_key


def test_counters_keep_increasing_across_the_sequence_wrap():
    """70 000 packets one way: seq wraps, the 64-bit counter (and so the nonce) never repeats."""
    server = Endpoint(server_config(), UNIX)
    client = Endpoint(EndpointConfig(seed=2), UNIX)
    client_address, server_address = ("10.0.0.2", 1), ("10.0.0.1", 2)
    peer = client.connect(server_address, 0.0, token())
    now = 0.0
    for _ in range(6):
        for data, _ in client.datagrams_to_send(now):
            server.receive(data, client_address, now)
        for data, _ in server.datagrams_to_send(now):
            client.receive(data, server_address, now)
    server_peer = server.peer_ids[0]
    assert client.is_connected(peer)
    counters, seqs, delivered = [], set(), 0
    for i in range(70_000):
        now += 0.0005
        client.send(peer, 3, i.to_bytes(4, "little"))
        for data, _ in client.datagrams_to_send(now):
            seqs.add(int.from_bytes(data[8:10], "little"))
            server.receive(data, client_address, now)
            counters.append(server.session_info(server_peer)["receive_counter"])
        if i % 16 == 0:                                         # keep the ack window open
            for data, _ in server.datagrams_to_send(now):
                client.receive(data, server_address, now)
        while (event := server.next_event()) is not None:
            delivered += isinstance(event, MessageReceived)
    assert all(b > a for a, b in zip(counters, counters[1:])), "counters strictly increase"
    assert counters[-1] >= 70_000 - 1 and len(seqs) == 65536
    assert delivered == 70_000
    assert server.drops == {}


# -- encrypt_packets=False ----------------------------------------------------------------------

def test_tokens_without_packet_encryption():
    pair = secure_pair(server=server_config(encrypt_packets=False))
    up = tap(pair.up)
    pair.connect(token=token())
    assert not pair.server.session_info(pair.server_peer)["encrypted"]
    assert not pair.client.session_info(pair.client_peer)["encrypted"]
    pair.client.send(pair.client_peer, 0, b"in the clear")
    pair.server.send(pair.server_peer, 0, b"back")
    pair.run(0.2)
    assert payloads(pair.server_events) == [b"in the clear"]
    assert payloads(pair.client_events) == [b"back"]
    assert any(b"in the clear" in d for d in up)
    assert next(e for e in pair.server_events if isinstance(e, PeerConnected)).claims.player == "alice"


# -- handshake rate limit -----------------------------------------------------------------------

def test_a_handshake_flood_from_one_ip_is_rate_limited_and_others_still_connect():
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_rate=10.0,
                                     handshake_burst=20), UNIX)
    request = encode_packet(dict(type="connect_request", connect_id=77))
    replies = 0
    for i in range(1000):                          # 1000 packets in 1 s, from many ports
        server.receive(request, ("192.0.2.1", 1000 + i), i * 0.001)
        replies += len(server.datagrams_to_send(i * 0.001))
    assert replies == 20 + 10 - 1 or replies in range(28, 31)
    assert server.drops == {"rate_limited": 1000 - replies}
    # another source is not affected
    client = Endpoint(EndpointConfig(seed=3))
    peer = client.connect(("10.0.0.1", 7777), 1.0)
    now = 1.0
    while not client.is_connected(peer) and now < 2.0:
        for data, _ in client.datagrams_to_send(now):
            server.receive(data, ("192.0.2.2", 4000), now)
        for data, _ in server.datagrams_to_send(now):
            client.receive(data, ("10.0.0.1", 7777), now)
        now += 0.01
    assert client.is_connected(peer)


def test_default_limits_never_slow_a_normal_client_on_a_lossy_link():
    for seed in range(5):
        pair = secure_pair(loss=0.3, seed=seed)
        pair.connect(token=token(player=f"p{seed}"))
        assert "rate_limited" not in pair.server.drops


def test_the_rate_table_is_bounded_and_a_source_whose_slot_is_taken_is_forgotten():
    # One slot: every source shares it, and the newest takes it over.
    server = Endpoint(EndpointConfig(accept_connections=True, seed=1, handshake_rate=1.0,
                                     handshake_burst=1, handshake_sources=1), UNIX)
    ids = iter(range(100, 200))                    # new connect ids: no request is a resend

    def request(source, now):
        server.receive(encode_packet(dict(type="connect_request", connect_id=next(ids))), source, now)

    a, b = ("192.0.2.1", 1), ("192.0.2.2", 1)
    request(a, 0.0)
    request((a[0], 2), 0.0)                        # the same IP, another port: over its budget
    assert server.drops == {"rate_limited": 1}
    request(b, 0.0)                                # b takes the slot: a is forgotten
    request(a, 0.0)                                # ...so a starts again with a full bucket
    assert server.drops == {"rate_limited": 1}
    request(a, 0.5)                                # a is remembered: half a packet refilled
    assert server.drops == {"rate_limited": 2}
    assert len(server.datagrams_to_send(0.5)) == 3


@pytest.mark.parametrize("field,value,message", [
    ("token_keys", {}, "token_keys"), ("token_keys", {1: b"short"}, "32 bytes"),
    ("token_keys", {-1: bytes(32)}, "key id"), ("token_keys", {"a": bytes(32)}, "key id"),
    ("handshake_rate", 0.0, "handshake_rate"), ("handshake_rate", float("inf"), "handshake_rate"),
    ("handshake_burst", 0, "handshake_burst"), ("handshake_sources", 0, "handshake_sources"),
    ("encrypt_packets", 1, "encrypt_packets"), ("path_challenge_budget", -1, "path_challenge_budget"),
])
def test_config_validation_names_the_field(field, value, message):
    from relay_core import ConfigError
    with pytest.raises(ConfigError, match=message):
        EndpointConfig(accept_connections=True, **{field: value}).validate()


def test_token_keys_need_a_server():
    from relay_core import ConfigError
    with pytest.raises(ConfigError, match="accept_connections"):
        EndpointConfig(token_keys=KEYS).validate()


def test_mutated_packets_of_every_kind_never_raise_and_the_session_survives():
    """Random corruption, truncation and extension of every packet type a sealed session
    carries (handshake, DATA, DISCONNECT, PATH), fed to both ends from known and unknown
    addresses: counted drops only, and the session keeps delivering."""
    import random

    seen = []
    pair = secure_pair()
    for link in (pair.up, pair.down):
        original = link.send
        link.send = lambda data, now, original=original: (seen.append(data), original(data, now))
    pair.connect(token=token())
    pair.client.send(pair.client_peer, 0, b"x" * 3000)
    pair.run(0.3)
    # another server (other cookie key): its handshake must not replace this session
    other = secure_pair(seed=7, server=EndpointConfig(accept_connections=True, seed=9, token_keys=KEYS))
    other_up = tap(other.up)
    other.connect(token=token(player="bob"))
    other.client.disconnect(other.client_peer)
    other.run(0.05)
    samples = seen + other_up + [encode_packet(dict(type="path_challenge", session_id=1, seq=0,
                                                    sealed_data="00" * 24))]
    rng = random.Random(1)
    for _ in range(3000):
        data = bytearray(rng.choice(samples))
        action = rng.randrange(4)
        if action == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif action == 1:
            del data[rng.randrange(len(data) + 1):]
        elif action == 2:
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        address = rng.choice([pair.CLIENT_ADDRESS, pair.SERVER_ADDRESS, ("10.7.7.7", 1)])
        pair.server.receive(bytes(data), address, pair.now)
        pair.client.receive(bytes(data), address, pair.now)
    before = len(payloads(pair.server_events))
    pair.client.send(pair.client_peer, 0, b"still here")
    pair.run(0.5)
    assert pair.server.is_connected(pair.server_peer) and pair.client.is_connected(pair.client_peer)
    assert payloads(pair.server_events)[before:] == [b"still here"]
