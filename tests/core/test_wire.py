"""Packet header and sequence arithmetic."""
import pytest
from hypothesis import given, strategies as st

from relay_core import decode_packet, encode_packet
from relay_core.wire import DATA_HEADER_BYTES, counter_from_seq, packet_nonce, seq_distance, seq_greater_than


def test_sequence_comparison_is_safe_across_the_wrap():
    assert seq_greater_than(1, 0)
    assert seq_greater_than(0, 65535)
    assert seq_greater_than(5, 65530)
    assert not seq_greater_than(65530, 5)
    assert not seq_greater_than(7, 7)
    assert seq_distance(2, 65534) == 4
    assert seq_distance(65534, 2) == -4


@given(st.integers(0, 65535), st.integers(1, 32767))
def test_a_sequence_is_newer_than_anything_up_to_half_the_space_behind_it(base, ahead):
    newer = (base + ahead) % 65536
    assert seq_greater_than(newer, base)
    assert not seq_greater_than(base, newer)
    assert seq_distance(newer, base) == ahead


@given(session=st.integers(1, 2**32 - 1), seq=st.integers(0, 65535), ack=st.integers(0, 65535),
       bits=st.integers(0, 2**32 - 1), send_time=st.integers(0, 65535), echo=st.integers(0, 65535))
def test_data_header_round_trips_every_field(session, seq, ack, bits, send_time, echo):
    packet = dict(type="data", session_id=session, seq=seq, ack=ack, ack_bits=bits,
                  send_time=send_time, echo_time=echo, records=[])
    datagram = encode_packet(packet)
    assert len(datagram) == DATA_HEADER_BYTES == 20
    assert datagram[:3] == b"RL\x01"
    assert decode_packet(datagram) == packet


def test_every_data_packet_carries_ack_and_bitfield(pair):
    pair.client.send(pair.client_peer, 0, b"hello")
    pair.run(0.05)
    sent = pair.server.datagrams_to_send(pair.now + 1.0)      # heartbeat after idle
    assert sent
    header = decode_packet(sent[0][0])
    assert header["type"] == "data"
    assert header["ack_bits"] & 1, "the newest client packet is acked in bit 0"


# -- packet protection: counter reconstruction and nonces (PROTOCOL.md 8.8) -------------------


@pytest.mark.parametrize("largest,seq,expected", [
    (None, 0, 0), (None, 65535, 65535),
    (0, 1, 1), (65534, 65535, 65535), (65535, 0, 65536), (65535, 5, 65541),
    (65536, 65535, 65535),                       # one behind, across the wrap, backwards
    (70000, 70000 & 0xFFFF, 70000),              # a duplicate of the largest
    (100000, (100000 - 32766) & 0xFFFF, 100000 - 32766),   # the oldest still reachable
    (100000, (100000 - 32767) & 0xFFFF, 100000 - 32767 + 65536),   # one older: read as new
    (100000, (100000 + 32769) & 0xFFFF, 100000 + 32769),   # the newest
    (2**40, (2**40 + 3) & 0xFFFF, 2**40 + 3),
])
def test_counter_is_rebuilt_from_seq_closest_to_the_next_expected(largest, seq, expected):
    assert counter_from_seq(largest, seq) == expected


def test_every_counter_within_half_the_window_is_rebuilt_exactly():
    for largest in (0, 1000, 65535, 65536, 131071, 10**9):
        for delta in list(range(-32766, 32770, 97)) + [-32766, 32769]:
            counter = largest + delta
            if counter >= 0:
                assert counter_from_seq(largest, counter & 0xFFFF) == counter, (largest, delta)


def test_nonce_layout_separates_packet_types_and_counters():
    assert packet_nonce(6, 0x0102030405060708) == bytes([6, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1])
    assert packet_nonce(6, 1) != packet_nonce(7, 1) != packet_nonce(6, 65537)
    assert len({packet_nonce(t, c) for t in (3, 4, 6, 7, 8, 9) for c in (0, 1, 65536, 2**63)}) == 24
