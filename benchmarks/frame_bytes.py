#!/usr/bin/env python3
"""Bytes on the wire per player per second, downstream, for a room of 8 players.

The real relay room (``relay.server.room.Room``) and the relay's own endpoint configuration
(``relay.server.lobby.endpoint_config``) drive 8 client endpoints (``relay.client.client_config``)
through ``relay_core.simlink.LossyLink`` in simulated time, on a 1 ms grid: 30 Hz ticks, 4-byte
inputs, each client sends its input for frame N + delay when it has decoded frame N, as the SDK
does. Every datagram the relay sends to a player is counted with 28 bytes of IPv4 + UDP header
and taken apart with ``relay_core.decode_packet``:

  ip/udp        28 bytes per datagram
  data header   the core's 20-byte DATA header of datagrams that carry records
  ack-only      whole datagrams (headers included) that carry no record
  frames, first the FRAME records (record header + message) the first time each is sent
  frames, again copies of a FRAME already sent: redundant piggybacks and resends
  control       CONTROL channel records (e.g. INPUT_DELAY advice)
  aead tag      the 16-byte tag of every sealed DATA datagram (token mode)

Links: ``LossyLink`` each way, "core" = 20 ms + U(0, 10) ms one way (the core benchmark's lossy
link) and "high" = 30 ms + U(0, 20) ms (the loss benchmark's
"high" profile), each with 0 % and 10 % independent loss each way. Under the "always"
redundancy policy the one-way delay decides how many unacknowledged frames every datagram
repeats (RTT / tick interval); under "adaptive" the loss does. Two input models: "held" (each player's input changes on
20 % of frames and repeats otherwise, like held buttons and sticks) and "random" (every input
new every frame: the worst case for "same as previous"). The targets (at most 3 KB/s at 0 % and
5 KB/s at 10 % loss, per player, downstream, headers included) are checked for the held model;
1 KB = 1000 bytes; PASS/FAIL is printed for both links.

Each point runs with both redundancy policies of the core ("adaptive", the default, and
"always") unless --policy picks one, and both in open mode and sealed: token mode with
encrypt_packets, every client connecting with a minted connect token, every DATA datagram
sealed with ChaCha20-Poly1305 for real (the benchmark opens them with the token's server key to
take them apart). --security picks one.

Figures are printed, never asserted on by tests.
Run:  python3 benchmarks/frame_bytes.py [--seconds 20] [--players 8] [--delay 3] [--seed 1]
          [--link core|high|both] [--policy adaptive|always|both] [--security open|sealed|both]
          [--model held|random|both] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import msgpack  # noqa: E402

from benchmarks.machine import cpu_model, usable_cores  # noqa: E402
from relay import protocol  # noqa: E402
from relay.client import client_config  # noqa: E402
from relay.config import load_config  # noqa: E402
from relay.protocol import CONTROL, STREAM, FrameDecoder, Input, Join  # noqa: E402
from relay.server.room import Room  # noqa: E402
from relay.server.lobby import endpoint_config  # noqa: E402
from relay_core import (  # noqa: E402
    Endpoint, MessageReceived, PeerConnected, decode_packet,
)
from relay_core.token import generate_key, mint_token  # noqa: E402
from relay_core.wire import counter_from_seq  # noqa: E402
from relay_core.simlink import LinkProfile, LossyLink  # noqa: E402

IP_UDP = 28
DATA_HEADER = 20
AEAD_TAG = 16
TICK_RATE = 30
INPUT_BYTES = 4
STEP = 0.001
WARMUP = 2.0
TARGETS = {0.0: 3000.0, 0.10: 5000.0}
LINKS = {"core": (0.020, 0.010), "high": (0.030, 0.020)}
SERVER_ADDRESS = ("10.0.0.1", 7777)
CATEGORIES = ("ip/udp", "data header", "ack-only", "frames, first", "frames, again", "control",
              "aead tag", "other")
KEY_ID = 1


@dataclass
class Tally:
    bytes: Counter = field(default_factory=Counter)
    datagrams: int = 0
    ack_only: int = 0
    frame_records: int = 0
    frame_copies: int = 0


class SimClient:
    """A player: decodes frames in order and answers frame N with its input for N + delay."""

    def __init__(self, index: int, delay: int, model: str, rng: random.Random, policy: str,
                 unix_offset: float):
        self.index = index
        self.address = ("10.0.1.%d" % (index + 1), 40000 + index)
        self.endpoint = Endpoint(client_config(seed=1000 + index, redundancy_policy=policy),
                                 unix_offset)
        self.delay = delay
        self.model = model
        self.rng = rng
        self.peer = None
        self.decoder = FrameDecoder()
        self.buffer: dict[int, bytes] = {}
        self.last_sent = -1
        self.current = rng.randbytes(INPUT_BYTES)
        self.frames = 0

    def payload(self) -> bytes:
        if self.model == "random" or self.rng.random() < 0.2:
            self.current = self.rng.randbytes(INPUT_BYTES)
        return self.current

    def send_up_to(self, frame: int) -> None:
        while self.last_sent < frame:
            self.last_sent += 1
            have = self.decoder.next_number - 1
            self.endpoint.send(self.peer, STREAM, Input(self.last_sent, self.payload(), have).encode())

    def on_message(self, channel: int, data: bytes) -> None:
        if channel == STREAM:
            self.buffer[protocol.frame_number(data)] = data
            while self.decoder.next_number in self.buffer:
                frame = self.decoder.decode(self.buffer.pop(self.decoder.next_number))
                self.frames += 1
                self.send_up_to(frame.number + self.delay)
        else:
            message = protocol.decode_relay_message(data)
            if isinstance(message, list) and message[0] == protocol.ROOM_STATE and message[1] == "running":
                self.send_up_to(message[2] + self.delay - 1)


def run(seconds: float, players: int, loss: float, model: str, delay: int, seed: int,
        link: str = "core", policy: str = "adaptive", sealed: bool = False) -> dict:
    config = load_config(environ={})
    settings = config.rooms
    settings.capacity = players
    settings.start_players = players
    unix_offset = time.time()           # simulated time 0 is now, for the tokens' expiry
    key = generate_key() if sealed else None
    server_config = endpoint_config(config).replace(
        redundancy_policy=policy, token_keys={KEY_ID: key} if sealed else None)
    server = Endpoint(server_config, unix_offset)
    room = Room("bench", settings, TICK_RATE, 0.0)
    base, jitter = LINKS[link]
    profile = LinkProfile(loss=loss, delay=base, jitter=jitter)
    clients = [SimClient(i, delay, model, random.Random(seed * 100 + i), policy, unix_offset)
               for i in range(players)]
    tokens = {c.address: mint_token(key, KEY_ID, "bench", f"p{c.index}", 3600.0, now=unix_offset)
              for c in clients} if sealed else {}
    counters: dict[tuple, int] = {}     # per player: highest packet counter opened so far
    down = {c.address: LossyLink(profile, seed * 1000 + 2 * i) for i, c in enumerate(clients)}
    up = {c.address: LossyLink(profile, seed * 1000 + 2 * i + 1) for i, c in enumerate(clients)}
    by_address = {c.address: c for c in clients}
    peer_client: dict[int, SimClient] = {}
    tallies = {c.address: Tally() for c in clients}
    sent_frame_ids: dict[tuple, set] = {c.address: set() for c in clients}
    frame_sizes: list[int] = []
    legacy_sizes: list[int] = []
    now = 0.0
    for c in clients:
        c.peer = c.endpoint.connect(SERVER_ADDRESS, now, tokens.get(c.address))
        c.endpoint.send(c.peer, CONTROL, Join("bench", f"p{c.index}").encode())
    next_tick = None
    started_at = None
    end = None
    measuring_from = None

    def carry_out() -> None:
        for action in room.take_actions():
            if action.kind == "send":
                server.send(action.peer_id, action.channel, action.data)
            elif action.kind == "block":
                server.send_block(action.peer_id, action.data)
        room.take_events()

    def open_packet(address, datagram: bytes) -> dict:
        """Decode a datagram the relay sends to ``address`` (opening it in a sealed run)."""
        if not sealed or datagram[3] != 6:     # clear: handshake replies, open mode
            return decode_packet(datagram)
        counter = counter_from_seq(counters.get(address), int.from_bytes(datagram[8:10], "little"))
        counters[address] = max(counter, counters.get(address, counter))
        return decode_packet(datagram, tokens[address].server_key, counter)

    def count(address, datagram: bytes) -> None:
        tally = tallies[address]
        tally.datagrams += 1
        tally.bytes["ip/udp"] += IP_UDP
        packet = open_packet(address, datagram)
        records = packet.get("records", [])
        tag = AEAD_TAG if sealed and datagram[3] == 6 else 0        # DATA: sealed
        tally.bytes["aead tag"] += tag
        if not records:
            tally.ack_only += 1
            tally.bytes["ack-only"] += len(datagram) - tag
            tally.bytes["ip/udp"] -= IP_UDP
            tally.bytes["ack-only"] += IP_UDP
            return
        tally.bytes["data header"] += DATA_HEADER
        used = DATA_HEADER
        for record in records:
            payload = bytes.fromhex(record.get("payload", ""))
            size = 3 + (1 if len(payload) < 128 else 2) + len(payload) \
                if record["kind"] == "message" else None
            if size is None:
                continue
            used += size
            if record["channel"] == STREAM:
                tally.frame_records += 1
                if record["msg_id"] in sent_frame_ids[address]:
                    tally.frame_copies += 1
                    tally.bytes["frames, again"] += size
                else:
                    sent_frame_ids[address].add(record["msg_id"])
                    tally.bytes["frames, first"] += size
            else:
                tally.bytes["control"] += size
        tally.bytes["other"] += len(datagram) - tag - used

    while end is None or now < end:
        now = round(now + STEP, 6)
        for address, path in up.items():
            for datagram in path.arrivals(now):
                server.receive(datagram, address, now)
        for address, path in down.items():
            for datagram in path.arrivals(now):
                by_address[address].endpoint.receive(datagram, SERVER_ADDRESS, now)
        while (event := server.next_event()) is not None:
            if type(event) is PeerConnected:
                peer_client[event.peer_id] = by_address[tuple(event.address)]
            elif type(event) is MessageReceived:
                message = protocol.decode_client_message(event.payload)
                if isinstance(message, Join):
                    room.join(event.peer_id, message.player, False, now)
                elif isinstance(message, Input):
                    room.on_input(event.peer_id, message, now)
        carry_out()
        if started_at is None and room.state == "running":
            started_at = now
            next_tick = now + 1.0 / TICK_RATE
            measuring_from = now + WARMUP
            end = measuring_from + seconds
        if next_tick is not None and now >= next_tick - 1e-9:
            data = room.tick(now)
            frame_sizes.append(len(data))
            frame = room.pending.previous()[:len(room.slots)]    # the frame just closed
            legacy_sizes.append(len(msgpack.packb([30, room.open_frame - 1, frame, []],
                                                  use_bin_type=True)))
            carry_out()
            next_tick += 1.0 / TICK_RATE
        server.handle_timeout(now)
        for datagram, address in server.datagrams_to_send(now):
            address = tuple(address)
            if measuring_from is not None and now >= measuring_from:
                count(address, datagram)
            elif address in sent_frame_ids:
                # Frames sent before the window still count as "already sent" inside it.
                for record in open_packet(address, datagram).get("records", []):
                    if record["kind"] == "message" and record["channel"] == STREAM:
                        sent_frame_ids[address].add(record["msg_id"])
            down[address].send(datagram, now)
        for c in clients:
            while (event := c.endpoint.next_event()) is not None:
                if type(event) is MessageReceived:
                    c.on_message(event.channel, event.payload)
            c.endpoint.handle_timeout(now)
            for datagram, _ in c.endpoint.datagrams_to_send(now):
                up[c.address].send(datagram, now)
        if now > 60 and started_at is None:
            raise RuntimeError("the room did not start")

    per_player = [sum(t.bytes.values()) / seconds for t in tallies.values()]
    total = Counter()
    for tally in tallies.values():
        total.update(tally.bytes)
    datagrams = sum(t.datagrams for t in tallies.values())
    n = len(tallies)
    rate = sum(per_player) / n
    datagram_rate = datagrams / n / seconds
    records = sum(t.frame_records for t in tallies.values())
    copies = sum(t.frame_copies for t in tallies.values())
    return {
        "link": link, "loss": loss, "model": model, "policy": policy,
        "security": "sealed" if sealed else "open", "seconds": seconds, "players": players,
        "delay": delay, "bytes_per_s": rate, "bytes_per_s_max": max(per_player),
        "datagrams_per_s": datagram_rate,
        "ack_only_per_s": sum(t.ack_only for t in tallies.values()) / n / seconds,
        "frame_records_per_datagram": records / max(1, datagrams),
        "frame_copies_per_s": copies / n / seconds,
        "breakdown": {k: total[k] / n / seconds for k in CATEGORIES},
        "frame_bytes_mean": sum(frame_sizes) / len(frame_sizes),
        "frame_bytes_v1_mean": sum(legacy_sizes) / len(legacy_sizes),
        "frames_decoded_min": min(c.frames for c in clients),
        "target": TARGETS.get(loss),
    }


def report(result: dict) -> list[str]:
    lines = [f"link {result['link']}, loss {result['loss']:.0%}, inputs {result['model']}, "
             f"policy {result['policy']}, {result['security']}: "
             f"{result['bytes_per_s'] / 1000:.2f} KB/s per player downstream "
             f"(max {result['bytes_per_s_max'] / 1000:.2f}), {result['datagrams_per_s']:.1f} datagrams/s, "
             f"{result['ack_only_per_s']:.1f} ack-only/s, "
             f"{result['frame_records_per_datagram']:.2f} frame records per datagram"]
    lines.append("    " + ", ".join(f"{name} {value:.0f}" for name, value in
                                    result["breakdown"].items()) + "  (B/s)")
    lines.append(f"    FRAME message: {result['frame_bytes_mean']:.1f} bytes mean "
                 f"(msgpack v1 layout: {result['frame_bytes_v1_mean']:.1f}); every client decoded "
                 f"at least {result['frames_decoded_min']} frames in order")
    target = result["target"]
    if target is not None and result["model"] == "held":
        verdict = "PASS" if result["bytes_per_s"] <= target else "FAIL"
        margin = result["bytes_per_s"] - target
        lines.append(f"    target <= {target / 1000:.0f} KB/s: {verdict} "
                     f"({'over' if margin > 0 else 'under'} by {abs(margin):.0f} B/s)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured simulated seconds")
    parser.add_argument("--players", type=int, default=8)
    parser.add_argument("--delay", type=int, default=3, help="clients' input delay, frames")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--link", choices=("core", "high", "both"), default="both")
    parser.add_argument("--policy", choices=("adaptive", "always", "both"), default="both",
                        help="the core's redundancy_policy at both ends (default: both)")
    parser.add_argument("--security", choices=("open", "sealed", "both"), default="both",
                        help="open mode, or token mode with sealed DATA packets (default: both)")
    parser.add_argument("--model", choices=("held", "random", "both"), default="both",
                        help="input model (default: both)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_model()}, {usable_cores()} cores, Python {sys.version.split()[0]}")
    print(f"room: {args.players} players, {INPUT_BYTES}-byte inputs, {TICK_RATE} Hz, input delay "
          f"{args.delay}; simlink LossyLink, core = 20 ms + U(0, 10) ms, high = 30 ms + "
          f"U(0, 20) ms one way; {args.seconds:g} simulated s after {WARMUP:g} s warm-up")
    results = []
    links = ("core", "high") if args.link == "both" else (args.link,)
    policies = ("adaptive", "always") if args.policy == "both" else (args.policy,)
    securities = (False, True) if args.security == "both" else (args.security == "sealed",)
    models = ("held", "random") if args.model == "both" else (args.model,)
    for link in links:
        for loss in (0.0, 0.10):
            for model in models:
                for policy in policies:
                    for sealed in securities:
                        delay = args.delay + (1 if link == "high" else 0)
                        result = run(args.seconds, args.players, loss, model, delay, args.seed,
                                     link, policy, sealed)
                        results.append(result)
                        print("\n".join(report(result)), flush=True)
    print("\nsummary, held inputs: KB/s per player downstream, headers included (redundant copies "
          "and resends of frames in B/s)")
    for r in results:
        if r["model"] == "held":
            verdict = "PASS" if r["bytes_per_s"] <= r["target"] else "FAIL"
            print(f"  {r['link']:>4} {r['loss']:>4.0%} {r['policy']:<8} {r['security']:<6} "
                  f"{r['bytes_per_s'] / 1000:5.2f} ({r['breakdown']['frames, again']:4.0f}) "
                  f"target <= {r['target'] / 1000:.0f}: {verdict}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"results": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
