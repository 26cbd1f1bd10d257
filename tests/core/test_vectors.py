"""Test vectors (tests/vectors/*.json) against the compiled codec and endpoint, and
docs/PROTOCOL.md against the code, so neither can drift from the other unnoticed.

Vector files hold {"description": ..., "vectors": [...]}. A valid vector has ``hex`` and
``decoded`` (what ``decode_packet`` returns, payloads as hex) and, when re-encoding does not give
the same bytes back (a field a receiver ignores), ``encoded_hex``. A malformed vector has ``hex``
and ``reason`` (``DecodeError.reason``). Every vector has ``server_drop``: the drop reason a
fresh accepting server counts for it (null: none), and optionally ``server_reply``: the type of
the one datagram it answers with. A sealed vector (token mode) also has ``key`` and ``counter``,
which decode_packet and encode_packet take to open and seal it.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re

import pytest

from relay_core import (
    ChannelConfig, Endpoint, EndpointConfig, PeerStats, MessageReceived, events as events_module,
)
from relay_core.simlink import LinkedPair, LinkProfile
from relay_core.token import mint_token, open_token
from relay_core.wire import DROP_REASONS, PACKET_TYPES, REASONS, RECORD_KINDS, DecodeError, decode_packet, encode_packet

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTOR_DIR = ROOT / "tests" / "vectors"
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
CLIENT_ADDRESS = ("127.0.0.1", 9)


def _load():
    vectors = []
    for path in sorted(VECTOR_DIR.glob("*.json")):
        document = json.loads(path.read_text())
        assert document["description"], path
        for vector in document["vectors"]:
            vectors.append((path.stem, vector))
    return vectors


ALL = _load()
VALID = [v for _, v in ALL if "decoded" in v]
MALFORMED = [v for _, v in ALL if "reason" in v]


def _ids(vectors):
    return [v["name"] for v in vectors]


def _keys(vector):
    if "key" not in vector:
        return {}
    return {"key": bytes.fromhex(vector["key"]), "counter": vector["counter"]}


def test_vector_files_are_well_formed():
    assert {"handshake", "data", "malformed", "secure"} <= {stem for stem, _ in ALL}
    names = [v["name"] for _, v in ALL]
    assert len(names) == len(set(names)), "vector names must be unique"
    for _, vector in ALL:
        assert ("decoded" in vector) != ("reason" in vector), vector["name"]
        assert "server_drop" in vector, vector["name"]
        bytes.fromhex(vector["hex"])


# -- codec, both directions ---------------------------------------------------------------------

@pytest.mark.parametrize("vector", VALID, ids=_ids(VALID))
def test_decode(vector):
    assert decode_packet(bytes.fromhex(vector["hex"]), **_keys(vector)) == vector["decoded"]


@pytest.mark.parametrize("vector", VALID, ids=_ids(VALID))
def test_encode(vector):
    expected = bytes.fromhex(vector.get("encoded_hex", vector["hex"]))
    assert encode_packet(vector["decoded"], **_keys(vector)) == expected


@pytest.mark.parametrize("vector", [v for v in VALID if "encoded_hex" in v],
                         ids=_ids([v for v in VALID if "encoded_hex" in v]))
def test_canonical_encoding_decodes_to_the_same_meaning(vector):
    assert vector["encoded_hex"] != vector["hex"]
    assert decode_packet(bytes.fromhex(vector["encoded_hex"])) == vector["decoded"]


@pytest.mark.parametrize("vector", MALFORMED, ids=_ids(MALFORMED))
def test_malformed_raises_decode_error(vector):
    assert vector["reason"] in DROP_REASONS
    with pytest.raises(DecodeError) as caught:
        decode_packet(bytes.fromhex(vector["hex"]))
    assert caught.value.reason == vector["reason"]


def test_vectors_cover_the_protocol():
    packet_types = {v["decoded"]["type"] for v in VALID}
    assert packet_types == set(PACKET_TYPES.values())
    records = [r for v in VALID for r in v["decoded"].get("records", [])]
    assert {r["kind"] for r in records} == set(RECORD_KINDS.values())
    assert any(len(r.get("payload", "")) // 2 >= 128 for r in records), "a two-byte varint length"
    assert any(len(v["decoded"].get("records", [])) >= 4 for v in VALID), "several records in one packet"
    data = [v["decoded"] for v in VALID if v["decoded"]["type"] == "data"]
    assert any(d["seq"] >= 65534 for d in data) and any(d["ack"] >= 65530 for d in data), "near the wrap"
    assert any(d["seq"] == 0 and d["ack"] > d["seq"] for d in data), "just past the wrap"
    assert {v["reason"] for v in MALFORMED} == {
        "truncated", "bad_magic", "bad_version", "unknown_type", "bad_length", "malformed_record",
        "unknown_record_kind", "bad_fragment", "bad_block_slice", "bad_token",
    }
    secure = {v["decoded"]["type"] for v in VALID if "token" in v["decoded"] or "tag" in v["decoded"] or "key" in v}
    assert {"connect_request", "connect_response", "accept", "data", "disconnect"} <= secure


# -- the endpoint never raises, and drops or answers as listed ------------------------------------

@pytest.mark.parametrize("vector", [v for _, v in ALL], ids=[v["name"] for _, v in ALL])
def test_server_endpoint_handles_vector(vector):
    datagram = bytes.fromhex(vector["hex"])
    server = Endpoint(EndpointConfig(accept_connections=True))
    server.receive(datagram, CLIENT_ADDRESS, 0.0)
    replies = server.datagrams_to_send(0.0)
    server.handle_timeout(0.0)
    assert server.next_event() is None
    assert server.peer_count == 0
    expected_drop = vector["server_drop"]
    assert server.drops == ({expected_drop: 1} if expected_drop else {})
    expected_reply = vector.get("server_reply")
    assert [decode_packet(data)["type"] for data, _ in replies] == ([expected_reply] if expected_reply else [])
    assert all(address == CLIENT_ADDRESS for _, address in replies)
    # No amplification: a reply to an unauthenticated datagram is never larger than it.
    assert sum(len(data) for data, _ in replies) <= len(datagram)


@pytest.mark.parametrize("vector", [v for _, v in ALL], ids=[v["name"] for _, v in ALL])
def test_connected_endpoints_never_raise(vector):
    """The same datagrams aimed at live connections, from the right address on both sides."""
    pair = LinkedPair(seed=3)
    pair.connect()
    datagram = bytes.fromhex(vector["hex"])
    pair.server.receive(datagram, pair.CLIENT_ADDRESS, pair.now)
    pair.client.receive(datagram, pair.SERVER_ADDRESS, pair.now)
    pair.client.send(pair.client_peer, 0, b"still here")
    pair.run(0.05)
    # None of the vectors carries this connection's ids, so each side drops it (or, for a
    # CONNECT_REQUEST, the server answers statelessly) and the connection carries on.
    assert sum(pair.server.drops.values()) >= 1 or vector.get("server_reply") in ("challenge", "refuse")
    assert sum(pair.client.drops.values()) >= 1
    assert pair.server.is_connected(pair.server_peer) and pair.client.is_connected(pair.client_peer)
    assert [e.payload for e in pair.server_events if isinstance(e, MessageReceived)] == [b"still here"]


# -- token mode: the secure vectors are what seeded endpoints produce ----------------------------

def test_secure_vectors_are_reproduced_by_the_token_and_seeded_endpoints():
    document = json.loads((VECTOR_DIR / "secure.json").read_text())
    t, e = document["token"], document["endpoints"]
    counter = iter(range(1000))
    token = mint_token(bytes.fromhex(t["server_key"]), t["key_id"], t["room"], t["player"], t["ttl"],
                       now=t["now"], user_data=bytes.fromhex(t["user_data"]),
                       random_bytes=lambda n: bytes(next(counter) & 0xFF for _ in range(n)))
    assert token.private.hex() == t["private"] and token.encode() == t["text"]
    assert token.client_key.hex() == t["client_key"] and token.server_key.hex() == t["server_key_session"]
    claims = open_token({t["key_id"]: bytes.fromhex(t["server_key"])}, token.private, t["now"] + 1)
    assert (claims.room, claims.player, claims.user_data) == (t["room"], t["player"], b"team=red")

    hexes = {v["name"]: v["hex"] for v in document["vectors"]}
    keys = {t["key_id"]: bytes.fromhex(t["server_key"])}
    server = Endpoint(EndpointConfig(accept_connections=True, seed=e["server_seed"], token_keys=keys),
                      unix_offset=e["unix_offset"])
    client = Endpoint(EndpointConfig(seed=e["client_seed"]), unix_offset=e["unix_offset"])
    client_address, server_address = tuple(e["client_address"]), tuple(e["server_address"])
    peer = client.connect(server_address, 0.0, token)
    exchange = []
    for sender, receiver, to in ((client, server, client_address), (server, client, server_address)) * 2:
        (datagram, _), = sender.datagrams_to_send(0.0)
        exchange.append(datagram.hex())
        receiver.receive(datagram, to, 0.0)
    assert exchange == [hexes["secure_connect_request"], hexes["secure_challenge"],
                        hexes["secure_connect_response"], hexes["secure_accept"]]
    assert client.is_connected(peer)
    client.send(peer, 0, b"hello")
    (datagram, _), = client.datagrams_to_send(e["data_now"])
    assert datagram.hex() == hexes["secure_data"]
    server.receive(datagram, client_address, e["data_now"])
    assert [ev.payload for ev in iter(server.next_event, None) if isinstance(ev, MessageReceived)] == [b"hello"]


# -- live traffic goes through the same codec ---------------------------------------------------

def test_live_traffic_decodes_and_round_trips():
    """Every datagram two endpoints exchange (handshake, every channel, fragments, blocks,
    loss, disconnect) decodes, and encodes back to the same bytes."""
    pair = LinkedPair(up=LinkProfile(loss=0.1, delay=0.01), down=LinkProfile(loss=0.1, delay=0.01), seed=5)
    seen = []
    for link in (pair.up, pair.down):
        original = link.send
        link.send = lambda data, now, original=original: (seen.append(data), original(data, now))
    pair.connect()
    big = bytes(range(256)) * 12                       # 3072 bytes: three fragments
    for i in range(40):
        pair.client.send(pair.client_peer, i % 4, b"input %d" % i)
        pair.server.send(pair.server_peer, 1, b"frame %d" % i)
        if i % 10 == 0:
            pair.client.send(pair.client_peer, 0, big)
        pair.run(0.016)
    pair.server.send_block(pair.server_peer, bytes(5000))
    pair.run(2.0)
    pair.client.disconnect(pair.client_peer)
    pair.run(0.1)
    kinds, types = set(), set()
    for data in seen:
        decoded = decode_packet(data)
        types.add(decoded["type"])
        kinds.update(r["kind"] for r in decoded.get("records", []))
        if decoded["type"] == "connect_request":
            assert encode_packet(decoded) == data[:64] and len(data) == 64
        else:
            assert encode_packet(decoded) == data
    assert {"connect_request", "challenge", "connect_response", "accept", "data", "disconnect"} <= types
    assert kinds == set(RECORD_KINDS.values())


# -- the spec names everything the code has -----------------------------------------------------

@pytest.fixture(scope="module")
def spec():
    return PROTOCOL.read_text()


@pytest.mark.parametrize("reason", DROP_REASONS)
def test_drop_reason_is_specified(spec, reason):
    assert re.search(rf"^\| `{reason}` \|", spec, re.MULTILINE), f"drop reason {reason} missing from the table"


@pytest.mark.parametrize("code,name", sorted(REASONS.items()))
def test_reason_code_is_specified(spec, code, name):
    assert re.search(rf"^\| {code} \| `{name}` \|", spec, re.MULTILINE), f"reason code {code} {name}"


CONFIG_FIELDS = [f.name for f in dataclasses.fields(EndpointConfig)]
CHANNEL_FIELDS = [f.name for f in dataclasses.fields(ChannelConfig)]


@pytest.mark.parametrize("name", CONFIG_FIELDS + CHANNEL_FIELDS)
def test_config_field_is_specified_with_its_default(spec, name):
    assert re.search(rf"^\| `{name}` \|", spec, re.MULTILINE), f"{name} missing from docs/PROTOCOL.md"
    if name == "channels":
        return
    # The configuration tables give each default as a Python literal in backticks.
    row = re.search(rf"^\| `{name}` \| `([^`]*)` \|", spec, re.MULTILINE)
    assert row, f"no configuration row with a literal default for {name}"
    owner = EndpointConfig() if name in CONFIG_FIELDS else ChannelConfig()
    assert ast.literal_eval(row.group(1)) == getattr(owner, name), f"default of {name}"


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(PeerStats)])
def test_stats_field_is_specified(spec, name):
    assert re.search(rf"^\|[^\n]*`{name}`[^\n]*\|", spec, re.MULTILINE), f"PeerStats.{name}"


@pytest.mark.parametrize("name", ["PeerConnected", "PeerDisconnected", "PeerMigrated", "MessageReceived",
                                  "BlockReceived", "BlockDelivered"])
def test_event_is_specified(spec, name):
    assert hasattr(events_module, name)
    assert f"| `{name}` |" in spec


def test_default_channels_are_as_specified():
    modes = [c.mode for c in EndpointConfig().channels]
    assert modes == ["reliable_ordered", "redundant", "unreliable_sequenced", "unreliable"]
    assert all(c.window == 256 for c in EndpointConfig().channels)


def test_derived_sizes_are_as_specified():
    config = EndpointConfig()
    assert config.fragment_size == config.mtu - 27 == 1173
    assert config.max_whole_message == min(config.mtu - 25, 16383) == 1175
    assert config.slice_size == min(1024, config.mtu - 33)


def test_spec_example_runs(spec):
    match = re.search(r"<!-- example: in-memory -->\n```python\n(.*?)```", spec, re.DOTALL)
    assert match, "the in-memory example is missing from docs/PROTOCOL.md"
    exec(compile(match.group(1), "PROTOCOL.md example", "exec"), {"MessageReceived": MessageReceived})
