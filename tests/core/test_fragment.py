"""Fragmentation and reassembly of reliable messages larger than the MTU, with caps."""
import pytest

from relay_core import decode_packet, encode_packet
from conftest import make_pair, received


@pytest.mark.parametrize("channel", [0, 1])
def test_large_messages_arrive_whole_and_in_order_under_loss(channel):
    pair = make_pair(loss=0.1, delay=0.02, seed=21)
    pair.connect()
    messages = [bytes([i]) * size for i, size in enumerate([5000, 1200, 17, 60000, 1173, 1174, 2])]
    for message in messages:
        pair.client.send(pair.client_peer, channel, message)
    pair.run(10)
    assert received(pair.server_events, channel) == messages


def test_fragmented_datagrams_respect_the_mtu():
    pair = make_pair(seed=3, mtu=600, max_message_size=100000)
    pair.connect()
    pair.client.send(pair.client_peer, 0, bytes(range(256)) * 40)
    sizes = []
    for _ in range(200):
        pair.now += 0.001
        for datagram, _ in pair.client.datagrams_to_send(pair.now):
            sizes.append(len(datagram))
            pair.server.receive(datagram, pair.CLIENT_ADDRESS, pair.now)
        for datagram, _ in pair.server.datagrams_to_send(pair.now):
            pair.client.receive(datagram, pair.SERVER_ADDRESS, pair.now)
        while (event := pair.server.next_event()) is not None:
            pair.server_events.append(event)
    assert max(sizes) <= 600
    assert received(pair.server_events, 0) == [bytes(range(256)) * 40]


def test_message_larger_than_the_cap_is_refused_at_send():
    pair = make_pair(seed=3, max_message_size=10000, reassembly_limit=20000)
    pair.connect()
    with pytest.raises(ValueError, match="max_message_size"):
        pair.client.send(pair.client_peer, 0, bytes(10001))


def forged_fragment(pair, seq, msg_id, index, count, payload, session):
    return encode_packet(dict(type="data", session_id=session, seq=seq, ack=0, ack_bits=0,
                              send_time=0, echo_time=0,
                              records=[dict(kind="fragment", channel=0, msg_id=msg_id,
                                            fragment_index=index, fragment_count=count,
                                            payload=payload.hex())]))


def session_of(pair):
    datagram = pair.server.datagrams_to_send(pair.now + 5.0)[0][0]     # a heartbeat
    return decode_packet(datagram)["session_id"]


def test_reassembly_memory_is_capped_per_peer():
    config = dict(max_message_size=4000, reassembly_limit=6000)
    pair = make_pair(seed=4, **config)
    pair.connect()
    session = session_of(pair)
    # Three incomplete 4-fragment messages of 1000-byte fragments: 3 x 3 x 1000 > 6000.
    seq = 100
    for msg_id in range(3):
        for index in range(3):
            pair.server.receive(forged_fragment(pair, seq, msg_id, index, 4, bytes(1000), session),
                                pair.CLIENT_ADDRESS, pair.now)
            seq += 1
    assert pair.server.drops.get("reassembly_full", 0) >= 1
    # The session is intact and the cap leaves room once messages complete.
    pair.client.send(pair.client_peer, 1, b"still alive")
    pair.run(0.5)
    assert received(pair.server_events, 1) == [b"still alive"]


def test_a_reassembled_message_beyond_max_message_size_is_dropped():
    pair = make_pair(seed=4, max_message_size=2500, reassembly_limit=100000)
    pair.connect()
    session = session_of(pair)
    for index in range(3):
        pair.server.receive(forged_fragment(pair, 50 + index, 0, index, 3, bytes(1000), session),
                            pair.CLIENT_ADDRESS, pair.now)
    assert pair.server.drops.get("message_too_large") == 1
    assert received(pair.server_events) == []


def test_fragments_in_flight_are_capped():
    pair = make_pair(seed=5, max_fragments_in_flight=255, rto_limit=100.0, max_resends=1000,
                     peer_timeout=50.0)
    pair.connect()
    pair.down.profile.loss = 1.0            # no acks come back: nothing leaves flight
    for _ in range(3):
        pair.client.send(pair.client_peer, 0, bytes(100 * 1173))     # 100 fragments each
    fragments = set()
    for _ in range(10000):
        pair.now += 0.001
        pair.client.handle_timeout(pair.now)
        for datagram, _ in pair.client.datagrams_to_send(pair.now):
            for record in decode_packet(datagram)["records"]:
                fragments.add((record["msg_id"], record["fragment_index"]))
    # Messages 0 and 1 (200 fragments) went out in full; message 2 would pass the cap of 255.
    assert len(fragments) == 200
    assert {msg_id for msg_id, _ in fragments} == {0, 1}


def test_messages_held_behind_a_missing_one_are_charged_to_the_budget():
    pair = make_pair(seed=6, max_message_size=4000, reassembly_limit=8000)
    pair.connect()
    session = session_of(pair)

    def message(seq, msg_id, size):
        return encode_packet(dict(type="data", session_id=session, seq=seq, ack=0, ack_bits=0,
                                  send_time=0, echo_time=0, records=[dict(
                                      kind="message", channel=0, msg_id=msg_id,
                                      payload=bytes([msg_id]).hex() * size)]))

    # Message 0 is withheld; 1..100 of 1000 bytes each would park 100 kB behind it.
    for msg_id in range(1, 101):
        pair.server.receive(message(200 + msg_id, msg_id, 1000), pair.CLIENT_ADDRESS, pair.now)
    assert pair.server.drops["reassembly_full"] >= 90
    assert received(pair.server_events) == []
    # The withheld message is never refused for the budget, and releases what waited for it.
    pair.server.receive(message(400, 0, 1000), pair.CLIENT_ADDRESS, pair.now)
    pair.run(0.01)
    delivered = received(pair.server_events, 0)
    assert 1 + 7 <= len(delivered) <= 1 + 8
    assert [m[0] for m in delivered] == list(range(len(delivered)))
