"""Spurious resends (issue #23, item 3): a resend counts as spurious when the acknowledgement
that frees its message is for a datagram sent before it, i.e. the message was only late."""
from __future__ import annotations

import dataclasses

from relay_core.simlink import LinkProfile
from conftest import make_pair, received

RELIABLE = 0


def stream(pair, count, interval, channel=RELIABLE):
    for i in range(count):
        pair.client.send(pair.client_peer, channel, b"m%d" % i)
        pair.run(interval)


def test_a_rtt_jump_makes_resends_that_are_all_spurious():
    """No loss at all: every resend after the delay jumps from 20 to 200 ms one way is one the
    original would have made unnecessary."""
    pair = make_pair(delay=0.02, seed=3)
    pair.connect()
    stream(pair, 30, 0.03)
    pair.up.profile = dataclasses.replace(pair.up.profile, delay=0.2)
    pair.down.profile = dataclasses.replace(pair.down.profile, delay=0.2)
    stream(pair, 30, 0.03)
    pair.run(3.0)
    stats = pair.client.peer_stats(pair.client_peer)
    assert len(received(pair.server_events, RELIABLE)) == 60
    assert stats.resends > 0
    assert stats.spurious_resends == stats.resends, stats
    assert pair.client.channel_snapshot(pair.client_peer, RELIABLE)["spurious_resends"] == stats.spurious_resends


def test_resends_of_lost_messages_are_not_spurious():
    """Loss on the way out only, a steady delay: every resend replaces a datagram that never
    arrived, and its own datagram is the one acknowledged."""
    pair = make_pair(delay=0.02, seed=5)
    pair.connect()
    pair.up.profile = LinkProfile(loss=0.3, delay=0.02)
    stream(pair, 100, 0.03)
    pair.run(5.0)
    stats = pair.client.peer_stats(pair.client_peer)
    assert len(received(pair.server_events, RELIABLE)) == 100
    assert stats.resends >= 10
    assert stats.spurious_resends == 0, stats

