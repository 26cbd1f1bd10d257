"""Batched UDP syscalls (relay._batchio) and the driver built on them, over loopback."""
import asyncio
import errno
import socket
import time

import pytest

from relay import transport
from relay.transport import BatchedEndpointDriver, open_batched_driver
from relay_core import Endpoint, EndpointConfig

pytestmark = pytest.mark.skipif(not transport.BATCHED_IO,
                                reason="recvmmsg/sendmmsg: Linux with relay._batchio built")

if transport.BATCHED_IO:
    from relay._batchio import MAX_DATAGRAMS, BatchSocket, recv_batch, send_batch


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


HAS_IPV6 = _ipv6_loopback()
FAMILIES = [pytest.param((socket.AF_INET, "127.0.0.1"), id="ipv4"),
            pytest.param((socket.AF_INET6, "::1"), id="ipv6",
                         marks=pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback"))]


@pytest.fixture
def udp_pair(request):
    family, host = getattr(request, "param", (socket.AF_INET, "127.0.0.1"))
    socks = []
    for _ in range(2):
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        sock.setblocking(False)
        socks.append(sock)
    yield socks
    for sock in socks:
        sock.close()


def drain(fd, expected, max_datagrams=64, rounds=200):
    """Everything waiting on ``fd``, up to ``expected`` datagrams (bounded by ``rounds``)."""
    got = []
    for _ in range(rounds):
        batch = recv_batch(fd, max_datagrams)
        if not batch:
            if len(got) >= expected:
                break
            time.sleep(0.005)
            continue
        got.extend(batch)
    return got


# -- the syscall layer -------------------------------------------------------------------------

def test_nothing_waiting_is_an_empty_batch_not_an_error(udp_pair):
    receiver, _ = udp_pair
    assert recv_batch(receiver.fileno()) == []
    assert BatchSocket(receiver.fileno()).recv() == []
    assert send_batch(receiver.fileno(), []) == 0


@pytest.mark.parametrize("udp_pair", FAMILIES, indirect=True)
def test_a_batch_goes_out_and_comes_back_in_order_with_socket_style_addresses(udp_pair):
    receiver, sender = udp_pair
    payloads = [f"datagram {i}".encode() * (i + 1) for i in range(40)]
    target = receiver.getsockname()
    assert send_batch(sender.fileno(), [(p, target) for p in payloads]) == len(payloads)
    got = drain(receiver.fileno(), len(payloads))
    assert [data for data, _ in got] == payloads
    # Like Python's socket module (and uvloop): (ip, port) or (ip, port, flowinfo, scope_id).
    assert {addr for _, addr in got} == {sender.getsockname()}
    assert len({id(addr) for _, addr in got}) == 1, "one peer, one cached address tuple"
    # The received address round-trips: sending back to it reaches the sender.
    back = got[0][1]
    assert send_batch(receiver.fileno(), [(b"reply", back)]) == 1
    assert drain(sender.fileno(), 1) == [(b"reply", receiver.getsockname())]


@pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback")
@pytest.mark.parametrize("udp_pair", [FAMILIES[1]], indirect=True)
def test_ipv6_addresses_may_be_given_short_or_with_a_scope(udp_pair):
    receiver, sender = udp_pair
    host, port = receiver.getsockname()[:2]
    sent = send_batch(sender.fileno(), [(b"short", (host, port)), (b"long", (host, port, 0, 0)),
                                        (b"scoped", ("::1%1", port, 0, 0))])
    assert sent == 3
    assert [data for data, _ in drain(receiver.fileno(), 3)] == [b"short", b"long", b"scoped"]


@pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback")
def test_a_dual_stack_socket_reports_ipv4_peers_as_mapped_addresses():
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as receiver, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        receiver.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        receiver.bind(("::", 0))
        receiver.setblocking(False)
        sender.bind(("127.0.0.1", 0))
        sender.setblocking(False)
        port = receiver.getsockname()[1]
        assert send_batch(sender.fileno(), [(b"v4", ("127.0.0.1", port))]) == 1
        [(data, addr)] = drain(receiver.fileno(), 1)
        assert data == b"v4" and addr == ("::ffff:127.0.0.1", sender.getsockname()[1], 0, 0)
        # ... and an IPv4 address is fine to send to from it (the kernel maps it).
        assert send_batch(receiver.fileno(), [(b"back", addr), (b"plain", sender.getsockname())]) == 2
        assert [d for d, _ in drain(sender.fileno(), 2)] == [b"back", b"plain"]


def test_large_batches_are_split_and_read_in_order(udp_pair):
    receiver, sender = udp_pair
    target = receiver.getsockname()
    io = BatchSocket(receiver.fileno(), max_datagrams=MAX_DATAGRAMS)
    received = []
    for chunk in range(10):           # 150 per call: three sendmmsg chunks of at most 64
        datagrams = [(b"%d:%d" % (chunk, i), target) for i in range(150)]
        assert send_batch(sender.fileno(), datagrams) == 150
        for _ in range(100):
            batch = io.recv()
            received.extend(batch)
            if len(received) >= 150 * (chunk + 1):
                break
            time.sleep(0.002)
    assert [d for d, _ in received] == [b"%d:%d" % (c, i) for c in range(10) for i in range(150)]
    # A BatchSocket reads at most its own batch size, and as little as asked for.
    assert send_batch(sender.fileno(), [(bytes([i]), target) for i in range(100)]) == 100
    small = BatchSocket(receiver.fileno(), max_datagrams=8)
    assert len(small.recv()) == 8
    assert len(small.recv(3)) == 3
    assert len(drain(receiver.fileno(), 89)) == 89


def test_datagrams_longer_than_max_size_are_dropped_and_counted(udp_pair):
    receiver, sender = udp_pair
    target = receiver.getsockname()
    io = BatchSocket(receiver.fileno(), max_datagrams=8, max_size=100)
    sent = send_batch(sender.fileno(), [(b"a" * 100, target), (b"b" * 101, target), (b"c", target)])
    assert sent == 3
    time.sleep(0.01)
    assert [d for d, _ in io.recv()] == [b"a" * 100, b"c"]
    assert io.truncated == 1


def test_eagain_on_send_returns_how_many_went_and_the_rest_can_follow():
    # Loopback UDP never pushes back (the sender's buffer is freed at once), a datagram
    # socketpair does: the peer's queue is short. Address None: the connected peer.
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with left, right:
        left.setblocking(False)
        right.setblocking(False)
        io = BatchSocket(left.fileno())
        datagrams = [(b"%04d" % i, None) for i in range(2000)]
        first = io.send(datagrams)
        assert 0 < first < len(datagrams), "the queue should have filled up"
        assert io.last_sent_count == first and io.last_sent_bytes == 4 * first
        assert io.send(datagrams, first) == 0          # still full: nothing went, no error
        received = []
        position = first
        for _ in range(10_000):
            batch = recv_batch(right.fileno())
            received.extend(data for data, _ in batch)
            if position < len(datagrams):
                position += io.send(datagrams, position)
            elif not batch:
                break
        assert position == len(datagrams)
        assert received == [data for data, _ in datagrams]
        assert all(addr is None for _, addr in recv_batch(right.fileno()) or [(None, None)])


def test_unusable_addresses_raise_after_the_good_ones_went_and_say_where(udp_pair):
    receiver, sender = udp_pair
    target = receiver.getsockname()
    datagrams = [(b"1", target), (b"2", target), (b"3", ("not-an-ip", 9)), (b"4", target)]
    with pytest.raises(ValueError) as caught:
        send_batch(sender.fileno(), datagrams)
    assert caught.value.sent == 2
    io = BatchSocket(sender.fileno())
    assert io.send(datagrams, 3) == 1
    assert [d for d, _ in drain(receiver.fileno(), 3)] == [b"1", b"2", b"4"]
    for bad, kind in (((b"x", "127.0.0.1"), TypeError), ((b"x", ("127.0.0.1", 70000)), OverflowError),
                      (("str", target), TypeError), ((b"x", ("127.0.0.1", 1, 2)), TypeError)):
        with pytest.raises(kind) as caught:
            io.send([bad])
        assert caught.value.sent == 0


def test_kernel_errors_other_than_eagain_and_icmp_raise_oserror(udp_pair):
    receiver, sender = udp_pair
    # An IPv6 destination from an IPv4 socket.
    with pytest.raises(OSError) as caught:
        send_batch(sender.fileno(), [(b"ok", receiver.getsockname()), (b"x", ("::1", 9, 0, 0))])
    assert caught.value.errno in (errno.EAFNOSUPPORT, errno.EINVAL) and caught.value.sent == 1
    with pytest.raises(OSError) as caught:
        send_batch(sender.fileno(), [(b"x" * 70_000, receiver.getsockname())])
    assert caught.value.errno == errno.EMSGSIZE
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fd = closed.fileno()
    closed.close()
    with pytest.raises(OSError) as caught:
        recv_batch(fd)
    assert caught.value.errno == errno.EBADF


def test_icmp_errors_are_counted_losses_not_exceptions():
    # A connected UDP socket learns from ICMP that nobody listens; the error is reported
    # once by the next call on the socket, which carries on.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = probe.getsockname()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.setblocking(False)
        sock.connect(nobody)
        sock.setblocking(False)
        io = BatchSocket(sock.fileno())
        assert io.send([(b"ping", None)]) == 1
        time.sleep(0.05)
        assert io.recv() == []
        assert io.recv_errors == 1 and io.last_error == errno.ECONNREFUSED
        assert io.send([(b"again", None)]) == 1
        time.sleep(0.05)
        # The pending error surfaces on a send: counted, and the datagram goes anyway.
        assert io.send([(b"elsewhere", listener.getsockname())]) == 1
        assert io.send_errors == 1 and io.last_sent_count == 1
        assert drain(listener.fileno(), 1)[0][0] == b"elsewhere"


def test_caches_stay_bounded_under_many_source_addresses(udp_pair):
    receiver, _ = udp_pair
    io = BatchSocket(receiver.fileno())
    io.cache_limit = 8
    target = receiver.getsockname()
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(20)]
    try:
        for sender in senders:
            sender.bind(("127.0.0.1", 0))
            sender.sendto(b"x", target)
        got = []
        for _ in range(100):
            got.extend(io.recv())
            if len(got) == 20:
                break
            time.sleep(0.002)
        assert sorted(addr for _, addr in got) == sorted(s.getsockname() for s in senders)
        assert io.cache_sizes[0] <= 8
        assert io.send([(b"y", s.getsockname()) for s in senders]) == 20
        assert io.cache_sizes[1] <= 8
    finally:
        for sender in senders:
            sender.close()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        BatchSocket(0, max_datagrams=0)
    with pytest.raises(ValueError):
        BatchSocket(0, max_datagrams=MAX_DATAGRAMS + 1)
    with pytest.raises(ValueError):
        BatchSocket(0, max_size=0)
    with pytest.raises(ValueError):
        recv_batch(0, max_datagrams=0)


# -- the driver --------------------------------------------------------------------------------

def server_endpoint(**config):
    return Endpoint(EndpointConfig(accept_connections=True, **config))


class FakeIO:
    """Stands in for the driver's BatchSocket: takes at most ``budget`` datagrams per send."""

    def __init__(self, real, budget):
        self.real = real
        self.budget = budget
        self.sent = []
        self.max_datagrams, self.max_size = real.max_datagrams, real.max_size
        self.recv_errors = self.send_errors = self.truncated = self.last_error = 0
        self.last_sent_count = self.last_sent_bytes = 0

    def recv(self):
        return self.real.recv()

    def send(self, datagrams, start=0):
        taken = datagrams[start:start + self.budget]
        self.sent.extend(taken)
        self.last_sent_count = len(taken)
        self.last_sent_bytes = sum(len(d) for d, _ in taken)
        return len(taken)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 20))


def test_open_batched_driver_binds_and_closes():
    async def scenario():
        driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0), lambda now: None)
        host, port = driver.transport.get_extra_info("sockname")
        assert host == "127.0.0.1" and port > 0
        assert not driver.transport.is_closing()
        driver.close()
        assert driver.transport.is_closing() and driver.closed.is_set()
        driver.close()                       # twice is fine
        driver.flush()                       # and a flush after close does nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
            again.bind(("127.0.0.1", port))  # the port is free again

    run(scenario())


def test_ipv4_datagrams_carry_dont_fragment_when_asked():
    """DF set (PROBE: the learned path MTU never fails a send), so the kernel picks no IP ID;
    a server asks for it while its datagrams fit IPv6's minimum MTU."""
    async def scenario(dont_fragment):
        driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0), lambda now: None,
                                           dont_fragment=dont_fragment)
        try:
            sock = driver.transport.get_extra_info("socket")
            return sock.getsockopt(socket.IPPROTO_IP, transport.IP_MTU_DISCOVER)
        finally:
            driver.close()

    assert run(scenario(True)) == transport.IP_PMTUDISC_PROBE
    assert run(scenario(False)) != transport.IP_PMTUDISC_PROBE
    assert transport.unfragmented(1200) and transport.unfragmented(1252)
    assert not transport.unfragmented(1253) and not transport.unfragmented(9000)


def test_eagain_leftovers_wait_in_order_then_go_when_the_socket_is_writable():
    async def scenario():
        sent, errors = [], []
        driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0), lambda now: None,
                                           on_sent=lambda count, size: sent.append((count, size)),
                                           on_error=errors.append)
        try:
            fake = driver.io = FakeIO(driver.io, budget=3)
            target = ("127.0.0.1", 9)
            first = [(b"a%d" % i, target) for i in range(10)]
            driver.send(first)
            assert driver.queued == 7 and sent == [(3, 6)]
            driver.send([(b"b", target)])      # behind the queue, not ahead of it
            assert driver.queued == 8 and len(fake.sent) == 3
            for _ in range(100):
                if not driver.queued:
                    break
                await asyncio.sleep(0.001)
            assert [d for d, _ in fake.sent] == [d for d, _ in first] + [b"b"]
            assert sum(count for count, _ in sent) == 11 and not errors and driver.dropped == 0
            assert not driver._writing
        finally:
            driver.close()

    run(scenario())


def test_a_full_send_queue_drops_and_counts_never_silently():
    async def scenario():
        errors = []
        driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0), lambda now: None,
                                           on_error=errors.append)
        driver.max_queue = 5
        driver.io = FakeIO(driver.io, budget=0)
        driver.send([(b"%d" % i, ("127.0.0.1", 9)) for i in range(8)])
        assert driver.queued == 5 and driver.dropped == 3
        assert errors and errors[-1].errno == errno.ENOBUFS
        driver.close()                       # what is still queued at close is counted too
        assert driver.dropped == 8

    run(scenario())


def test_a_datagram_the_kernel_refuses_is_reported_and_the_rest_go():
    async def scenario():
        errors = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            peer.setblocking(False)
            target = peer.getsockname()
            driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0),
                                               lambda now: None, on_error=errors.append)
            try:
                driver.send([(b"1", target), (b"x" * 70_000, target), (b"2", ("bad", 1)),
                             (b"3", target)])
                assert driver.send_failed == 2 and len(errors) == 2
                assert [d for d, _ in drain(peer.fileno(), 2)] == [b"1", b"3"]
                driver.transport.sendto(b"4", target)
                assert [d for d, _ in drain(peer.fileno(), 1)] == [b"4"]
            finally:
                driver.close()

    run(scenario())


def test_datagrams_reach_the_endpoint_batched_and_the_answers_go_out():
    """A client Endpoint on a plain socket connects through the batched driver's socket."""
    async def scenario():
        received, flushes = [], []
        server = server_endpoint()
        driver = await open_batched_driver(server, ("127.0.0.1", 0),
                                           lambda now: flushes.append(now),
                                           on_received=received.append)
        client = Endpoint(EndpointConfig())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            address = driver.transport.get_extra_info("sockname")
            peer = client.connect(address, loop.time())
            try:
                for _ in range(200):
                    for data, addr in client.datagrams_to_send(loop.time()):
                        sock.sendto(data, addr)
                    await asyncio.sleep(0.005)
                    for data, addr in recv_batch(sock.fileno()):
                        client.receive(data, addr, loop.time())
                    if client.is_connected(peer) and server.peer_count == 1:
                        break
                assert client.is_connected(peer) and server.peer_count == 1
                assert received and flushes
                [server_peer] = server.peer_ids
                assert server.peer_address(server_peer) == sock.getsockname()
            finally:
                driver.close()

    run(scenario())


def test_a_busy_socket_is_read_by_a_timer_and_watched_again_once_quiet():
    """Under steady traffic a read_interval driver reads every interval without watching and
    unwatching the socket each time (two epoll_ctl calls an interval); once traffic stops it
    watches the socket again, and the next datagram is read at once."""
    async def scenario():
        loop = asyncio.get_running_loop()
        watches = []
        add_reader = loop.add_reader
        loop.add_reader = lambda fd, callback: (watches.append(loop.time()), add_reader(fd, callback))
        driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0), lambda now: None,
                                           read_interval=0.005)
        address = driver.transport.get_extra_info("sockname")
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                watches.clear()
                for _ in range(60):             # ~0.18 s of a datagram every 3 ms
                    sock.sendto(b"x" * 20, address)
                    await asyncio.sleep(0.003)
                busy_watches = len(watches)
                await asyncio.sleep(0.05)       # quiet: the socket is watched again
                assert driver._read_paused is None and len(watches) == busy_watches + 1
                before = driver.datagrams_received       # junk too: the endpoint refuses it
                sock.sendto(b"y" * 20, address)
                for _ in range(100):
                    await asyncio.sleep(0.001)
                    if driver.datagrams_received > before:
                        break
                assert driver.datagrams_received == before + 1
            # Busy: about one pass per 5 ms; watched again at most a few times, not per pass.
            assert driver.datagrams_received == 61
            assert busy_watches <= 3, busy_watches
        finally:
            driver.close()

    run(scenario())


def test_a_big_send_goes_out_unwatched_and_the_watch_comes_back():
    """From UNWATCHED_SEND datagrams a send unwatches the socket (no write-space wake-up per
    datagram) and watches it again after, so what arrived meanwhile is read at once; a small
    send leaves the watch alone, and a driver closed mid-send is not watched again."""
    async def scenario():
        loop = asyncio.get_running_loop()
        calls = []
        add_reader, remove_reader = loop.add_reader, loop.remove_reader
        loop.add_reader = lambda fd, cb: (calls.append("watch"), add_reader(fd, cb))
        loop.remove_reader = lambda fd: (calls.append("unwatch"), remove_reader(fd))
        driver = await open_batched_driver(server_endpoint(), ("127.0.0.1", 0), lambda now: None)
        address = driver.transport.get_extra_info("sockname")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            peer.setblocking(False)
            target = peer.getsockname()
            try:
                calls.clear()
                driver.send([(b"s", target)] * (transport.UNWATCHED_SEND - 1))
                assert calls == []
                big = [(b"%d" % i, target) for i in range(transport.UNWATCHED_SEND)]
                driver.send(big)
                assert calls == ["unwatch", "watch"]
                got = drain(peer.fileno(), 2 * transport.UNWATCHED_SEND - 1)
                assert [d for d, _ in got[transport.UNWATCHED_SEND - 1:]] == [d for d, _ in big]
                before = driver.datagrams_received
                peer.sendto(b"junk", address)            # read by the watch, not by read_now
                for _ in range(100):
                    await asyncio.sleep(0.001)
                    if driver.datagrams_received > before:
                        break
                assert driver.datagrams_received == before + 1
                calls.clear()
                driver.on_sent = lambda count, size: driver.close()
                driver.send(big)
                assert calls == ["unwatch", "unwatch"] and driver.closed.is_set()
            finally:
                driver.close()

    run(scenario())


def test_the_timer_waits_for_its_deadline_instead_of_spinning_on_a_millisecond_clock():
    import uvloop

    class Due:
        """An endpoint with one thing due at a fractional time and nothing else."""

        def __init__(self, deadline):
            self.deadline = deadline
            self.flushed_at = []

        def datagrams_to_send(self, now):
            self.flushed_at.append(now)
            if now >= self.deadline:
                self.deadline = None
            return []

        def next_timeout(self):
            return self.deadline

    async def scenario():
        loop = asyncio.get_running_loop()
        endpoint = Due(loop.time() + 0.0104)
        driver = await open_batched_driver(endpoint, ("127.0.0.1", 0), lambda now: None)
        try:
            driver.flush()
            await asyncio.sleep(0.05)
            assert endpoint.deadline is None, "the deadline never came"
            # One flush by hand, one when due: none before the deadline, on any loop.
            assert len(endpoint.flushed_at) == 2, endpoint.flushed_at
        finally:
            driver.close()

    run(scenario())
    uvloop.run(asyncio.wait_for(scenario(), 20))


@pytest.mark.slow
def test_the_relay_server_runs_on_the_batched_driver(tmp_path):
    from live_relay import running_room

    async def scenario():
        async with running_room(tmp_path, "b", ["a", "b"]) as (server, (a, b)):
            assert isinstance(server.driver, BatchedEndpointDriver)
            assert server.driver.io.in_place            # its players' DATA in the batch buffers
            sock = server.driver.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_IP, transport.IP_MTU_DISCOVER) \
                == transport.IP_PMTUDISC_PROBE          # the default mtu 1200 goes with DF
            await asyncio.gather(a.play_until(60, 5), b.play_until(60, 5))
            assert [f.number for f in a.frames] == list(range(len(a.frames)))
            metrics = server.metrics.render()[0].decode()
            for name in ("relay_datagrams_sent_total", "relay_datagrams_received_total"):
                value = float(next(line.split()[1] for line in metrics.splitlines()
                                   if line.startswith(name + " ")))
                assert value > 60, name
            assert server.driver.dropped == 0 and server.driver.send_failed == 0
            assert server.driver.io.taken_in_place > 60

    asyncio.run(scenario())


def test_send_ready_sends_what_was_flushed_so_far_and_the_flush_only_the_rest():
    """The relay's rooms' pass flushes players into the outbox (send_many with ``now``) and
    calls send_ready every few rooms: each datagram leaves once, the early ones at once."""
    async def scenario():
        server = server_endpoint()
        driver = await open_batched_driver(server, ("127.0.0.1", 0), lambda now: None)
        driver.io.set_admission(server, in_place=True)
        loop = asyncio.get_running_loop()
        address = driver.transport.get_extra_info("sockname")
        clients, socks = [], []
        try:
            for i in range(2):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("127.0.0.1", 0))
                sock.setblocking(False)
                client = Endpoint(EndpointConfig(seed=10 + i))
                clients.append((client, client.connect(address, loop.time())))
                socks.append(sock)
            for _ in range(200):
                for (client, _), sock in zip(clients, socks):
                    for data, addr in client.datagrams_to_send(loop.time()):
                        sock.sendto(data, addr)
                await asyncio.sleep(0.005)
                for (client, _), sock in zip(clients, socks):
                    for data, addr in recv_batch(sock.fileno()):
                        client.receive(data, addr, loop.time())
                if server.peer_count == 2 and all(c.is_connected(p) for c, p in clients):
                    break
            first, second = sorted(server.peer_ids)
            driver.flush()
            await asyncio.sleep(0.01)
            for sock in socks:
                recv_batch(sock.fileno())               # whatever the handshake left
            sent = driver.datagrams_sent
            driver.send_ready()                         # nothing written since the flush
            assert driver.datagrams_sent == sent
            server.send_many([first], 0, b"early", loop.time())
            driver.send_ready()
            assert driver.datagrams_sent == sent + 1    # the first room's, at once
            server.send_many([second], 0, b"late", loop.time())
            driver.flush()
            assert driver.datagrams_sent == sent + 2    # the rest, and nothing twice
            await asyncio.sleep(0.01)
            got = [len(recv_batch(sock.fileno())) for sock in socks]
            assert got == [1, 1]
        finally:
            driver.close()
            for sock in socks:
                sock.close()

    run(scenario())
