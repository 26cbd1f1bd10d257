"""Packet header and sequence arithmetic."""
from hypothesis import given, strategies as st

from relay_core import decode_packet, encode_packet
from relay_core.wire import DATA_HEADER_BYTES, seq_distance, seq_greater_than


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
