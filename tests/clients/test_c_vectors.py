"""Every vector of tests/vectors/{data,handshake,malformed,secure}.json through the C codec
(clients/c/src/wire.c, via clients/c/tests/vector_shim.c and ctypes).

What is checked: each valid vector decodes (``hex``) to exactly its ``decoded`` dict and encodes
from ``decoded`` back to ``encoded_hex`` or ``hex``; each malformed vector is rejected with its
``reason``; sealed vectors (``key``/``counter``) open and re-seal to the same bytes; the
handshake tags of the token-mode vectors are recomputed with the keys of secure.json; the token
text of secure.json decodes to its keys, room, player and private part.

What is not: ``server_drop`` and ``server_reply`` describe what an accepting relay_core server
does with a datagram (cookie checks, rate limits, unknown peers, replies). A client has no
server side: its codec can only decode and encode these packets, and how the client's state
machine treats them is covered by test_c_transport.py against the real server.
"""
from __future__ import annotations

import ctypes
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTOR_DIR = ROOT / "tests" / "vectors"
FILES = ("data", "handshake", "malformed", "secure")
REASON_CODES = {"closed": 0, "server_full": 1, "shutdown": 2, "kicked": 3, "timeout": 4,
                "protocol_error": 5, "replaced": 6, "resend_limit": 7, "token_invalid": 8,
                "token_expired": 9, "token_used": 10, "token_required": 11, "token_unsupported": 12,
                "source_session_limit": 13}
TYPES = {"connect_request": 1, "challenge": 2, "connect_response": 3, "accept": 4, "refuse": 5,
         "data": 6, "disconnect": 7, "path_challenge": 8, "path_response": 9}


def _documents():
    return {name: json.loads((VECTOR_DIR / f"{name}.json").read_text()) for name in FILES}


DOCS = _documents()
ALL = [(name, v) for name in FILES for v in DOCS[name]["vectors"]]
VALID = [(n, v) for n, v in ALL if "decoded" in v]
MALFORMED = [(n, v) for n, v in ALL if "reason" in v]
TOKEN = DOCS["secure"]["token"]


@pytest.fixture(scope="module")
def lib(c_build):
    lib = ctypes.CDLL(str(c_build / "librelay_client_testing.so"))
    assert lib.rcv_init() == 0
    c = ctypes
    lib.rcv_decode.argtypes = [c.c_char_p, c.c_size_t, c.c_char_p, c.c_longlong, c.c_char_p, c.c_size_t]
    lib.rcv_decode.restype = c.c_int
    for name in ("rcv_connect_request", "rcv_challenge", "rcv_connect_response", "rcv_accept",
                 "rcv_refuse", "rcv_disconnect", "rcv_path", "rcv_data_header", "rcv_message",
                 "rcv_fragment", "rcv_block_slice", "rcv_block_ack", "rcv_seal_data"):
        getattr(lib, name).restype = c.c_size_t
    lib.rcv_connect_request.argtypes = [c.c_char_p, c.c_uint32, c.c_char_p, c.c_size_t]
    lib.rcv_challenge.argtypes = [c.c_char_p, c.c_uint32, c.c_uint32, c.c_char_p]
    lib.rcv_connect_response.argtypes = [c.c_char_p, c.c_uint32, c.c_uint32, c.c_char_p, c.c_uint16,
                                         c.c_char_p, c.c_size_t, c.c_char_p]
    lib.rcv_accept.argtypes = [c.c_char_p, c.c_uint32, c.c_uint32, c.c_uint16, c.c_int, c.c_char_p]
    lib.rcv_refuse.argtypes = [c.c_char_p, c.c_uint32, c.c_int]
    lib.rcv_disconnect.argtypes = [c.c_char_p, c.c_uint32, c.c_int, c.c_char_p, c.c_ulonglong]
    lib.rcv_path.argtypes = [c.c_char_p, c.c_int, c.c_uint32, c.c_char_p, c.c_char_p, c.c_ulonglong]
    lib.rcv_data_header.argtypes = [c.c_char_p, c.c_uint32, c.c_int, c.c_int, c.c_uint32, c.c_int, c.c_int]
    lib.rcv_message.argtypes = [c.c_char_p, c.c_size_t, c.c_int, c.c_int, c.c_char_p, c.c_size_t]
    lib.rcv_fragment.argtypes = [c.c_char_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_int, c.c_char_p, c.c_size_t]
    lib.rcv_block_slice.argtypes = [c.c_char_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_uint32, c.c_char_p,
                                    c.c_size_t]
    lib.rcv_block_ack.argtypes = [c.c_char_p, c.c_size_t, c.c_int, c.c_int, c.c_char_p, c.c_size_t]
    lib.rcv_seal_data.argtypes = [c.c_char_p, c.c_size_t, c.c_char_p, c.c_ulonglong]
    lib.rcv_token.argtypes = [c.c_char_p, c.c_char_p, c.c_char_p, c.c_char_p, c.c_char_p, c.c_char_p,
                              c.POINTER(c.c_size_t)]
    lib.rcv_counter_from_seq.argtypes = [c.c_int, c.c_ulonglong, c.c_int]
    lib.rcv_counter_from_seq.restype = c.c_ulonglong
    return lib


def _keys(vector):
    if "key" not in vector:
        return None, -1
    return bytes.fromhex(vector["key"]), vector["counter"]


def decode(lib, data: bytes, key=None, counter=-1):
    out = ctypes.create_string_buffer(1 << 17)
    rc = lib.rcv_decode(data, len(data), key, counter, out, len(out))
    assert rc >= 0, "JSON buffer overflow"
    text = out.value.decode()
    return (json.loads(text), None) if rc == 0 else (None, text)


def encode(lib, packet: dict, key=None, counter=0) -> bytes:
    buf = ctypes.create_string_buffer(70000)
    kind = packet["type"]
    h = bytes.fromhex
    if kind == "connect_request":
        token = h(packet["token"]) if "token" in packet else None
        n = lib.rcv_connect_request(buf, packet["connect_id"], token, len(token or b""))
    elif kind == "challenge":
        n = lib.rcv_challenge(buf, packet["connect_id"], packet["cookie_time"], h(packet["cookie_mac"]))
    elif kind == "connect_response":
        token = h(packet["token"]) if "token" in packet else None
        # the tag is recomputed under the token's client key (the only key that makes it)
        n = lib.rcv_connect_response(buf, packet["connect_id"], packet["cookie_time"],
                                     h(packet["cookie_mac"]), packet["ack_delay_ms"], token,
                                     len(token or b""), h(TOKEN["client_key"]) if token else None)
    elif kind == "accept":
        tagged = "tag" in packet
        n = lib.rcv_accept(buf, packet["connect_id"], packet["session_id"], packet["ack_delay_ms"],
                           packet.get("flags", 0), h(TOKEN["server_key_session"]) if tagged else None)
    elif kind == "refuse":
        reason = packet["reason"]
        n = lib.rcv_refuse(buf, packet["connect_id"], REASON_CODES.get(reason, reason))
    elif kind == "disconnect":
        reason = packet["reason"]
        n = lib.rcv_disconnect(buf, packet["session_id"], REASON_CODES.get(reason, reason), key,
                               counter if key else 0)
    elif kind in ("path_challenge", "path_response"):
        n = lib.rcv_path(buf, TYPES[kind], packet["session_id"], h(packet["data"]), key,
                         counter if key else 0)
    else:
        n = lib.rcv_data_header(buf, packet["session_id"], packet["seq"], packet["ack"],
                                packet["ack_bits"], packet["send_time"], packet["echo_time"])
        for r in packet["records"]:
            if r["kind"] == "message":
                p = h(r["payload"])
                n = lib.rcv_message(buf, n, r["channel"], r["msg_id"], p, len(p))
            elif r["kind"] == "fragment":
                p = h(r["payload"])
                n = lib.rcv_fragment(buf, n, r["channel"], r["msg_id"], r["fragment_index"],
                                     r["fragment_count"], p, len(p))
            elif r["kind"] == "block_slice":
                p = h(r["payload"])
                n = lib.rcv_block_slice(buf, n, r["block_id"], r["slice_index"], r["slice_count"],
                                        r["block_size"], p, len(p))
            else:
                p = h(r["bitfield"])
                n = lib.rcv_block_ack(buf, n, r["block_id"], r["base"], p, len(p))
        if key is not None:
            n = lib.rcv_seal_data(buf, n, key, counter)
    return buf.raw[:n]


def test_every_vector_file_is_replayed():
    assert len(VALID) + len(MALFORMED) == len(ALL)
    assert {name for name, _ in VALID} == set(FILES) - {"malformed"}
    assert len(MALFORMED) > 40


@pytest.mark.parametrize("vector", [v for _, v in VALID], ids=[v["name"] for _, v in VALID])
def test_decode(lib, vector):
    key, counter = _keys(vector)
    decoded, reason = decode(lib, bytes.fromhex(vector["hex"]), key, counter)
    assert reason is None
    assert decoded == vector["decoded"]


@pytest.mark.parametrize("vector", [v for _, v in VALID], ids=[v["name"] for _, v in VALID])
def test_encode(lib, vector):
    key, counter = _keys(vector)
    expected = bytes.fromhex(vector.get("encoded_hex", vector["hex"]))
    assert encode(lib, vector["decoded"], key, counter).hex() == expected.hex()


@pytest.mark.parametrize("vector", [v for _, v in MALFORMED], ids=[v["name"] for _, v in MALFORMED])
def test_malformed(lib, vector):
    decoded, reason = decode(lib, bytes.fromhex(vector["hex"]))
    assert decoded is None
    assert reason == vector["reason"]


SEALED = [v for _, v in VALID if "key" in v]


@pytest.mark.parametrize("vector", SEALED, ids=[v["name"] for v in SEALED])
def test_sealed_vector_fails_with_another_key_or_counter(lib, vector):
    data = bytes.fromhex(vector["hex"])
    key, counter = _keys(vector)
    assert decode(lib, data, bytes(32), counter)[1] == "auth_failed"
    assert decode(lib, data, key, counter + 1)[1] == "auth_failed"
    tampered = bytearray(data)
    tampered[-1] ^= 1
    assert decode(lib, bytes(tampered), key, counter)[1] == "auth_failed"


def test_sealed_vectors_without_key_show_the_clear_fields(lib):
    for vector in SEALED:
        if vector["decoded"]["type"] in ("disconnect", "path_challenge", "path_response"):
            decoded, _ = decode(lib, bytes.fromhex(vector["hex"]))
            assert decoded["session_id"] == vector["decoded"]["session_id"]
            assert decoded["seq"] == vector["decoded"]["seq"]
            assert ("sealed_reason" in decoded) or ("sealed_data" in decoded)


def test_token_text_decodes(lib):
    c = ctypes
    ck, sk = c.create_string_buffer(32), c.create_string_buffer(32)
    room, player = c.create_string_buffer(65), c.create_string_buffer(65)
    private, length = c.create_string_buffer(509), c.c_size_t()
    assert lib.rcv_token(TOKEN["text"].encode(), ck, sk, room, player, private, c.byref(length)) == 0
    assert ck.raw.hex() == TOKEN["client_key"]
    assert sk.raw.hex() == TOKEN["server_key_session"]
    assert room.value.decode() == TOKEN["room"]
    assert player.value.decode() == TOKEN["player"]
    assert private.raw[:length.value].hex() == TOKEN["private"]
    # the private part is what the handshake vectors carry
    request = next(v for v in DOCS["secure"]["vectors"] if v["name"] == "secure_connect_request")
    assert request["decoded"]["token"] == TOKEN["private"]
    for bad in ("rt2." + TOKEN["text"][4:], TOKEN["text"][:-40], TOKEN["text"] + "!", "rt1."):
        assert lib.rcv_token(bad.encode(), ck, sk, room, player, private, c.byref(length)) == -1


def test_counter_reconstruction(lib):
    f = lib.rcv_counter_from_seq
    assert f(0, 0, 5) == 5
    assert f(1, 0xFFFF, 0) == 0x10000
    assert f(1, 0x10005, 0xFFF0) == 0xFFF0
    assert f(1, 0x1FFFF, 3) == 0x20003
    assert f(1, 100, 100 + 0x8000) == 100 + 0x8000
