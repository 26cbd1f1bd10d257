"""relay.tools.netem: the user-space UDP link emulator, driven through real loopback sockets.

Each scenario runs on its own event loop (asyncio.Runner, so uvloop can be used too) and stays
small: a few hundred datagrams, delays of tens of milliseconds. The impairment decisions are
seeded, so rate checks are deterministic for a given seed; their bounds are still set to what
the binomial distribution allows, so a different seed would pass too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
import uvloop

from relay.tools.netem import LinkSettings, Netem, add_arguments, main, settings_from_args

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
LOCALHOST = "127.0.0.1"


def run(scenario, loop: str = "asyncio"):
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(asyncio.wait_for(scenario(), timeout=20))


class Recorder(asyncio.DatagramProtocol):
    """Records (payload, source, monotonic arrival time); echoes back if asked to."""

    def __init__(self, echo: bool = False):
        self.echo = echo
        self.received: list[tuple[bytes, tuple, float]] = []
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.received.append((data, addr, time.monotonic()))
        if self.echo:
            self.transport.sendto(data, addr)


async def udp_endpoint(echo: bool = False) -> Recorder:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_datagram_endpoint(lambda: Recorder(echo),
                                                      local_addr=(LOCALHOST, 0))
    return protocol


def address_of(protocol: Recorder) -> tuple[str, int]:
    return protocol.transport.get_extra_info("sockname")[:2]


async def wait_until(predicate, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


def payload(seq: int, size: int = 32) -> bytes:
    return struct.pack("!I", seq).ljust(size, b".")


def seq_of(data: bytes) -> int:
    return struct.unpack_from("!I", data)[0]


def settled(emulator: Netem) -> int:
    """Datagrams the emulator is done with in both directions (delivered or dropped)."""
    stats = emulator.stats()
    return stats["down"]["delivered"] + stats["up"]["dropped"] + stats["down"]["dropped"]


async def pump(client: Recorder, emulator: Netem, count: int, window: int = 64) -> None:
    """Send ``count`` datagrams, at most ``window`` unsettled at a time: a burst larger than the
    socket buffers would be dropped by the kernel and make the emulator's counts meaningless."""
    for seq in range(count):
        while seq - settled(emulator) >= window:
            await asyncio.sleep(0.0005)
        client.transport.sendto(payload(seq), emulator.listen_address)


class Setup:
    def __init__(self, emulator: Netem, server: Recorder, client: Recorder):
        self.emulator, self.server, self.client = emulator, server, client


async def echo_setup(**netem_args) -> Setup:
    server = await udp_endpoint(echo=True)
    emulator = Netem(listen=(LOCALHOST, 0), upstream=address_of(server), **netem_args)
    await emulator.start()
    client = await udp_endpoint()
    return Setup(emulator, server, client)


async def teardown(setup: Setup) -> None:
    await setup.emulator.stop()
    setup.server.transport.close()
    setup.client.transport.close()


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_unimpaired_link_echoes_everything_and_counts_it(loop):
    async def scenario():
        s = await echo_setup(seed=1)
        await pump(s.client, s.emulator, 300)
        await wait_until(lambda: len(s.client.received) == 300)
        stats = s.emulator.stats()
        await teardown(s)
        # Nothing impaired: order kept both ways, counts consistent.
        assert [seq_of(d) for d, _, _ in s.client.received] == list(range(300))
        assert [seq_of(d) for d, _, _ in s.server.received] == list(range(300))
        for direction in ("up", "down"):
            counters = stats[direction]
            assert counters["datagrams_in"] == counters["delivered"] == 300
            assert counters["bytes_in"] == counters["bytes_delivered"] == 300 * 32
            assert counters["dropped"] == counters["duplicated"] == counters["in_flight"] == 0
        assert stats["clients"] == stats["mappings_opened"] == 1
        assert stats["seed"] == 1
        assert s.client.received[0][1] == s.emulator.listen_address

    run(scenario, loop)


def test_stop_closes_sockets_and_cancels_pending_deliveries():
    async def scenario():
        s = await echo_setup(up=LinkSettings(delay=500))
        listen = s.emulator.listen_address
        for seq in range(5):
            s.client.transport.sendto(payload(seq), listen)
        await wait_until(lambda: s.emulator.stats()["up"]["in_flight"] == 5)
        upstream_local = list(s.emulator.client_mappings().values())[0]
        await s.emulator.stop()
        stats = s.emulator.stats()
        assert stats["up"]["cancelled"] == 5 and stats["up"]["in_flight"] == 0
        assert stats["clients"] == 0
        await asyncio.sleep(0.05)
        assert s.server.received == []
        # Both ports are free again.
        for address in (listen, upstream_local):
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            probe.bind(address)
            probe.close()
        await s.emulator.stop()  # idempotent
        s.server.transport.close()
        s.client.transport.close()

    run(scenario)


async def loss_run(seed: int, count: int = 2000):
    s = await echo_setup(up=LinkSettings(loss=10), seed=seed, record_decisions=True)
    await pump(s.client, s.emulator, count)
    await wait_until(lambda: settled(s.emulator) == count)
    stats = s.emulator.stats()
    decisions = s.emulator.drop_decisions("up")
    received = sorted(seq_of(d) for d, _, _ in s.client.received)
    await teardown(s)
    return decisions, stats, received


def test_loss_rate_is_binomial_and_reproducible_per_seed():
    async def scenario():
        return [await loss_run(seed) for seed in (1, 1, 2)]

    (first, stats, received), (again, _, _), (other, _, _) = run(scenario)
    assert len(first) == stats["up"]["datagrams_in"] == 2000
    dropped = stats["up"]["dropped_loss"]
    # 10 % of 2000: mean 200, sd 13.4; +-4.5 sd.
    assert 140 <= dropped <= 260
    assert sum(first) == dropped == stats["up"]["dropped"]
    assert stats["down"]["dropped"] == 0
    # The drop decisions are exactly the datagrams that did not come back.
    assert received == [seq for seq, was_dropped in enumerate(first) if not was_dropped]
    assert again == first
    assert other != first and len(other) == 2000


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_delay_and_jitter_per_direction(loop):
    up_delay, up_jitter, down_delay, down_jitter = 20.0, 10.0, 10.0, 4.0
    count = 60

    async def scenario():
        s = await echo_setup(up=LinkSettings(delay=up_delay, jitter=up_jitter),
                             down=LinkSettings(delay=down_delay, jitter=down_jitter), seed=3)
        sent_at = {}
        for seq in range(count):
            sent_at[seq] = time.monotonic()
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
            await asyncio.sleep(0.003)
        await wait_until(lambda: len(s.client.received) == count)
        await teardown(s)
        at_server = {seq_of(d): t for d, _, t in s.server.received}
        at_client = {seq_of(d): t for d, _, t in s.client.received}
        up = sorted((at_server[i] - sent_at[i]) * 1000 for i in range(count))
        down = sorted((at_client[i] - at_server[i]) * 1000 for i in range(count))
        return up, down

    up, down = run(scenario, loop)
    for samples, delay, jitter in ((up, up_delay, up_jitter), (down, down_delay, down_jitter)):
        # Never early; late only by scheduling slack (generous for the tail on shared cores).
        assert samples[0] >= delay - 0.01, samples
        assert samples[int(len(samples) * 0.9)] <= delay + jitter + 4.0, samples
        assert samples[-1] <= delay + jitter + 25.0, samples
        # The jitter is spread over its range, not a constant offset.
        assert samples[0] <= delay + 0.3 * jitter + 2.0, samples
        assert samples[-1] >= delay + 0.7 * jitter, samples


def test_duplication_rate():
    async def scenario():
        s = await echo_setup(up=LinkSettings(duplicate=10), seed=4)
        await pump(s.client, s.emulator, 500)
        await wait_until(lambda: s.emulator.stats()["down"]["delivered"]
                         == 500 + s.emulator.stats()["up"]["duplicated"])
        stats = s.emulator.stats()
        await teardown(s)
        return stats, [seq_of(d) for d, _, _ in s.server.received]

    stats, at_server = run(scenario)
    duplicated = stats["up"]["duplicated"]
    assert 25 <= duplicated <= 80  # mean 50, sd 6.7
    assert stats["up"]["delivered"] == 500 + duplicated
    assert len(at_server) == 500 + duplicated
    assert set(at_server) == set(range(500))
    assert max(at_server.count(seq) for seq in set(at_server)) == 2


def test_reordering_rate():
    count = 300

    async def scenario():
        s = await echo_setup(up=LinkSettings(reorder=10, reorder_delay=15), seed=5)
        for seq in range(count):
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
            await asyncio.sleep(0.001)
        await wait_until(lambda: len(s.server.received) == count)
        await teardown(s)
        return [seq_of(d) for d, _, _ in s.server.received]

    order = run(scenario)
    assert sorted(order) == list(range(count))
    highest, late = -1, 0
    for seq in order:
        if seq < highest:
            late += 1
        highest = max(highest, seq)
    assert 12 <= late <= 55, late  # mean 30, sd 5.2


def test_burst_loss_drops_in_runs():
    async def scenario():
        s = await echo_setup(up=LinkSettings(burst_enter=0.05, burst_exit=0.3, burst_loss=1.0),
                             seed=6, record_decisions=True)
        await pump(s.client, s.emulator, 1000)
        await wait_until(lambda: settled(s.emulator) == 1000)
        stats = s.emulator.stats()
        decisions = s.emulator.drop_decisions("up")
        await teardown(s)
        return stats, decisions

    stats, decisions = run(scenario)
    runs, current = [], 0
    for dropped in decisions + [False]:
        if dropped:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    assert stats["up"]["dropped_burst"] == sum(decisions) > 0
    assert stats["up"]["dropped_loss"] == 0
    # Bad-state stays last 1/0.3 = 3.3 datagrams on average; independent 14 % loss would give 1.2.
    assert sum(runs) / len(runs) > 1.5, runs


def test_rate_limit_paces_and_drops_when_the_queue_is_full():
    async def scenario():
        # 800 kbit/s: a 472-byte payload + 28 header bytes = 500 bytes takes 5 ms.
        s = await echo_setup(up=LinkSettings(rate=800, queue_limit=10), seed=7)
        for seq in range(20):
            s.client.transport.sendto(payload(seq, 472), s.emulator.listen_address)
        await wait_until(lambda: s.emulator.stats()["up"]["datagrams_in"] == 20)
        await wait_until(lambda: len(s.server.received) == 10)
        stats = s.emulator.stats()
        await teardown(s)
        return stats, s.server.received

    stats, at_server = run(scenario)
    assert stats["up"]["dropped_queue"] == 10
    assert [seq_of(d) for d, _, _ in at_server] == list(range(10))
    span_ms = (at_server[-1][2] - at_server[0][2]) * 1000
    assert span_ms >= 9 * 5 * 0.9, span_ms


def test_each_client_gets_its_own_upstream_port():
    async def scenario():
        s = await echo_setup()
        other = await udp_endpoint()
        for seq in range(3):
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
            other.transport.sendto(payload(100 + seq), s.emulator.listen_address)
        await wait_until(lambda: len(s.client.received) == 3 and len(other.received) == 3)
        mappings = s.emulator.client_mappings()
        await teardown(s)
        other.transport.close()
        return mappings, s, other

    mappings, s, other = run(scenario)
    sources = {addr for _, addr, _ in s.server.received}
    assert len(sources) == 2
    assert sources == set(mappings.values())
    assert set(mappings) == {address_of(s.client), address_of(other)}
    # Replies go back to the client that sent them.
    assert sorted(seq_of(d) for d, _, _ in s.client.received) == [0, 1, 2]
    assert sorted(seq_of(d) for d, _, _ in other.received) == [100, 101, 102]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_rebind_moves_a_client_to_a_new_source_port(loop):
    async def scenario():
        s = await echo_setup()
        for seq in range(3):
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
        await wait_until(lambda: len(s.client.received) == 3)
        before = s.emulator.client_mappings()[address_of(s.client)]
        moved = s.emulator.rebind()
        for seq in range(3, 6):
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
        await wait_until(lambda: len(s.client.received) == 6)
        after = s.emulator.client_mappings()[address_of(s.client)]
        stats = s.emulator.stats()
        await teardown(s)
        return s, before, after, moved, stats

    s, before, after, moved, stats = run(scenario, loop)
    assert before != after and moved == {before: after}
    sources = [addr for _, addr, _ in s.server.received]
    assert sources[:3] == [before] * 3 and sources[3:] == [after] * 3
    # The echoes from the new port still reach the same client, in order.
    assert [seq_of(d) for d, _, _ in s.client.received] == list(range(6))
    assert stats["rebinds"] == 1 and stats["mappings_opened"] == 1


def test_rebind_of_an_unknown_client_is_an_error():
    async def scenario():
        s = await echo_setup()
        try:
            with pytest.raises(KeyError):
                s.emulator.rebind(("127.0.0.1", 1))
        finally:
            await teardown(s)

    run(scenario)


def test_idle_mapping_expires_and_its_socket_closes():
    async def scenario():
        s = await echo_setup(idle_timeout=0.2)
        s.client.transport.sendto(payload(1), s.emulator.listen_address)
        await wait_until(lambda: len(s.client.received) == 1)
        (old_upstream,) = s.emulator.client_mappings().values()
        await wait_until(lambda: s.emulator.stats()["clients"] == 0, timeout=2.0)
        stats = s.emulator.stats()
        assert stats["mappings_expired"] == 1
        await asyncio.sleep(0.01)  # the transport closes on the next loop iteration
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(old_upstream)  # fails with EADDRINUSE if the socket were still open
        probe.close()
        # The client talks again: a fresh mapping, traffic flows.
        s.client.transport.sendto(payload(2), s.emulator.listen_address)
        await wait_until(lambda: len(s.client.received) == 2)
        assert s.emulator.stats()["mappings_opened"] == 2
        await teardown(s)

    run(scenario)


def test_set_up_changes_impairments_at_runtime():
    async def scenario():
        s = await echo_setup(seed=8)

        async def send_batch(first: int) -> int:
            before = len(s.client.received)
            in_before = s.emulator.stats()["up"]["datagrams_in"]
            for seq in range(first, first + 50):
                s.client.transport.sendto(payload(seq), s.emulator.listen_address)
                await asyncio.sleep(0)
            await wait_until(lambda: s.emulator.stats()["up"]["datagrams_in"] == in_before + 50)
            await asyncio.sleep(0.03)
            return len(s.client.received) - before

        assert await send_batch(0) == 50
        s.emulator.set_up(LinkSettings(loss=100))
        assert s.emulator.up.loss == 100
        assert await send_batch(50) == 0
        assert s.emulator.stats()["up"]["dropped_loss"] == 50
        s.emulator.set_up(LinkSettings())
        assert await send_batch(100) == 50
        await teardown(s)

    run(scenario)


def test_link_settings_validate_their_ranges():
    for bad in (dict(loss=150), dict(loss=-1), dict(delay=-5), dict(burst_enter=2.0),
                dict(duplicate=101), dict(queue_limit=0), dict(rate=float("nan"))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LinkSettings(**bad)
    with pytest.raises(ValueError, match="idle_timeout"):
        Netem(listen=(LOCALHOST, 0), upstream=(LOCALHOST, 9), idle_timeout=0)


# --- command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_cli_runs_for_duration_and_prints_stats(loop, capsys):
    argv = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--duration", "0.2",
            "--loop", loop, "--loss", "5", "--seed", "9"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    stats = json.loads(lines[-1])
    assert stats["final"] is True and stats["seed"] == 9
    assert stats["up"]["datagrams_in"] == 0
    assert stats["settings"]["up"]["loss"] == stats["settings"]["down"]["loss"] == 5


@pytest.mark.parametrize("argv, flag", [
    (["--loss", "150"], "--loss"),
    (["--up-loss", "-1"], "--up-loss"),
    (["--delay", "-3"], "--delay"),
    (["--burst-enter", "1.5"], "--burst-enter"),
    (["--jitter", "abc"], "--jitter"),
    (["--listen", "nonsense"], "--listen"),
    (["--listen", "::1:5000"], "--listen"),
    (["--upstream", "127.0.0.1:0"], "--upstream"),
    (["--upstream", "127.0.0.1:70000"], "--upstream"),
    (["--rebind-every", "0"], "--rebind-every"),
])
def test_cli_rejects_bad_arguments_with_exit_2(argv, flag, capsys):
    base = {"--listen": "127.0.0.1:0", "--upstream": "127.0.0.1:9"}
    for name, value in zip(argv[::2], argv[1::2]):
        base[name] = value
    with pytest.raises(SystemExit) as exit_info:
        main([item for pair in base.items() for item in pair] + ["--duration", "0.1"])
    assert exit_info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_cli_per_direction_overrides():
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # as `relay netem` mounts it
    args = parser.parse_args(["--listen", "[::1]:0", "--upstream", "localhost:7777",
                              "--loss", "5", "--up-loss", "20", "--down-delay", "30",
                              "--jitter", "4", "--rate", "256", "--down-rate", "1000"])
    assert args.listen == ("::1", 0) and args.upstream == ("localhost", 7777)
    up, down = settings_from_args(args)
    assert (up.loss, up.delay, up.jitter, up.rate) == (20, 0, 4, 256)
    assert (down.loss, down.delay, down.jitter, down.rate) == (5, 30, 4, 1000)


def test_cli_loss_episodes(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9",
                              "--episode-ms", "100", "--episode-share", "10",
                              "--down-episode-share", "0"])
    up, down = settings_from_args(args)
    assert (up.episode_ms, up.episode_share) == (100, 10)
    assert (down.episode_ms, down.episode_share) == (100, 0)
    assert main(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--duration", "0.1",
                 "--episode-share", "10"]) == 2
    assert "episode_ms" in capsys.readouterr().err


def test_episodes_take_both_directions_down_together():
    async def scenario():
        settings = LinkSettings(episode_ms=20, episode_share=30)
        s = await echo_setup(up=settings, down=settings, seed=4, record_decisions=True)
        for seq in range(200):          # 0.6 s: tens of episodes of 20 ms
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
            await asyncio.sleep(0.003)
        await wait_until(lambda: settled(s.emulator) == 200)
        stats = s.emulator.stats()
        episodes = (s.emulator.episodes("up"), s.emulator.episodes("down"))
        await teardown(s)
        return stats, episodes

    stats, (up, down) = run(scenario)
    # One schedule for both directions (generated as far as each direction was asked).
    shorter = min(len(up), len(down))
    assert shorter >= 3 and up[:shorter] == down[:shorter]
    assert stats["up"]["dropped_episode"] == stats["up"]["dropped"] > 0
    assert stats["down"]["dropped"] == stats["down"]["dropped_episode"]
    assert 0.1 <= stats["up"]["dropped"] / 200 <= 0.55


def test_module_entry_point_relays_and_stops_on_sigterm():
    upstream = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    upstream.bind((LOCALHOST, 0))
    upstream.settimeout(5)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.settimeout(5)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    process = subprocess.Popen(
        [sys.executable, "-m", "relay.tools.netem", "--listen", "127.0.0.1:0",
         "--upstream", f"127.0.0.1:{upstream.getsockname()[1]}", "--delay", "20",
         "--report-seconds", "0.1", "--seed", "1"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = process.stderr.readline()
        assert "listening on 127.0.0.1:" in banner, banner
        listen_port = int(banner.split("listening on 127.0.0.1:")[1].split(",")[0])
        started = time.monotonic()
        client.sendto(b"ping", (LOCALHOST, listen_port))
        data, mapped = upstream.recvfrom(100)
        assert data == b"ping" and time.monotonic() - started >= 0.02
        upstream.sendto(b"pong", mapped)
        assert client.recvfrom(100) == (b"pong", (LOCALHOST, listen_port))
        time.sleep(0.25)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        upstream.close()
        client.close()
    assert process.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) >= 2 and not lines[0]["final"] and lines[-1]["final"]
    assert lines[-1]["up"]["delivered"] == lines[-1]["down"]["delivered"] == 1


def test_cli_reports_a_busy_listen_port_with_exit_1(capsys):
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind((LOCALHOST, 0))
    try:
        port = taken.getsockname()[1]
        status = main(["--listen", f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9",
                       "--duration", "0.1"])
    finally:
        taken.close()
    assert status == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_client_limit_and_decision_limit():
    async def scenario():
        s = await echo_setup(max_clients=1, record_decisions=True, decision_limit=10)
        other = await udp_endpoint()
        for seq in range(20):
            s.client.transport.sendto(payload(seq), s.emulator.listen_address)
            other.transport.sendto(payload(seq), s.emulator.listen_address)
            await asyncio.sleep(0)
        await wait_until(lambda: len(s.client.received) == 20)
        await asyncio.sleep(0.02)
        stats = s.emulator.stats()
        assert other.received == []
        assert stats["clients"] == 1 and stats["clients_rejected"] == 20
        assert stats["up"]["decisions_recorded"] == 10 and stats["up"]["decisions_omitted"] == 10
        assert s.emulator.drop_decisions("up") == [False] * 10
        other.transport.close()
        await teardown(s)

    run(scenario)
