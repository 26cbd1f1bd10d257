"""Headless bots: join rooms, play at the tick rate, verify the frame stream, measure latency.

Each bot sends a 16-byte input for frame N + input_delay whenever it receives frame N (the way a
lockstep client schedules its inputs), checks that frames arrive once, in order and without
gaps, and that every bot in a room sees byte-identical frames. Input-to-frame latency is the
time from sending the input for frame M to receiving frame M.

Against a token-mode relay, give the bots a key (--key, --key-file or --config): each bot then
mints its own connect token, as the game backend would for a player.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
from collections import Counter
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from relay.client import RelayClient, RelayError
from relay.protocol import MAX_NAME_LENGTH
from relay_core.token import ConnectToken, mint_token


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def _room_name(text: str) -> str:
    if not 1 <= len(text) <= MAX_NAME_LENGTH:
        raise argparse.ArgumentTypeError(f"a room name has 1..{MAX_NAME_LENGTH} characters")
    return text


SILENCE = 1.0
"""Seconds without a frame before the end of the run that count as the relay gone silent (a
running room sends a frame every tick)."""

LATE_HINT = 0.03
"""Share of inputs that missed their frame above which the summary suggests more input delay."""


@dataclass
class BotReport:
    room: str
    player: str
    frames: int = 0
    gaps: int = 0
    duplicates: int = 0
    mismatches: int = 0
    inputs_sent: int = 0
    inputs_missing: int = 0
    """Frames that closed without this bot's input although it had been sent."""
    latencies: list = field(default_factory=list)
    error: Optional[str] = None
    """Why this bot got fewer frames than asked (or could not play): the room ended early, a
    kick, a lost connection, a silent relay. Any error makes `relay bot` exit 1."""
    end_reason: Optional[str] = None
    """The room's end reason (drain, drain_deadline, admin, ...) if it ended during the run."""
    kicked: bool = False
    frames_expected: int = 0
    """Frames the room should have closed between this bot's start of play and the deadline."""
    input_delay: int = 0
    """The input delay in use at the end (the relay's advice with --auto-input-delay)."""
    advised_input_delay: Optional[int] = None


@dataclass(frozen=True)
class TokenMinter:
    """Mints each bot a connect token for its room and name, playing the game backend."""

    key_id: int
    key: bytes = field(repr=False)
    ttl: float = 30.0

    def __call__(self, room: str, player: str) -> ConnectToken:
        return mint_token(self.key, self.key_id, room, player, self.ttl)


class RoomLedger:
    """What the first bot saw for each frame of a room; later bots compare against it."""

    def __init__(self):
        self.digests: dict[int, bytes] = {}

    def check(self, number: int, digest: bytes) -> bool:
        known = self.digests.setdefault(number, digest)
        return known == digest


async def run_bot(host: str, port: int, room: str, player: str, ledger: RoomLedger,
                  deadline: float, input_delay: int, start_timeout: float,
                  minter: Optional[TokenMinter] = None,
                  auto_input_delay: bool = False) -> BotReport:
    report = BotReport(room, player, input_delay=input_delay)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        client = await RelayClient.connect(host, port, room, player, timeout=start_timeout,
                                           token=minter(room, player) if minter else None,
                                           input_delay=input_delay,
                                           auto_input_delay=auto_input_delay)
    except RelayError as error:
        hint = (" (nothing answered: is `relay serve` running there, and is this its UDP port?)"
                if error.code in ("timeout", "disconnected") else "")
        report.error = f"cannot connect to {address}: {error}{hint}"
        return report
    loop = asyncio.get_running_loop()
    # connect() returns once welcomed, and a bot joins as a player: it has a slot.
    assert client.welcome is not None and client.welcome.slot is not None
    slot = client.welcome.slot
    tick_rate = client.welcome.tick_rate
    sent_at: dict[int, tuple[float, bytes]] = {}
    expected = 0
    last_sent = -1

    def send(frame_number: int) -> None:
        nonlocal last_sent
        if frame_number <= last_sent:
            return      # replaying history: those frames are closed already
        last_sent = frame_number
        payload = struct.pack("<IIQ", slot, frame_number, hash((player, frame_number)) & (2**64 - 1))
        if client.send_input(frame_number, payload):
            sent_at[frame_number] = (loop.time(), payload)
            report.inputs_sent += 1

    def send_up_to(target: int) -> None:
        # Every frame gets one input: after a rise of the delay, the frames skipped over too;
        # after a fall, nothing until the target passes the last frame sent.
        for frame_number in range(last_sent + 1, target + 1):
            send(frame_number)

    def delay() -> int:
        advised = client.advised_input_delay
        report.advised_input_delay = advised
        if auto_input_delay and advised is not None:
            report.input_delay = advised
        return report.input_delay

    ended = False
    try:
        try:
            await client.wait_for_state("running", timeout=start_timeout)
        except asyncio.TimeoutError:
            if client.room_state != "ended" and client.error is None:
                report.error = (f"the room did not start within {start_timeout:g} s (state "
                                f"{client.room_state}: not enough players joined?)")
                return report
        assert client.welcome is not None
        start = client.welcome.next_frame
        playing_since = last_frame_at = loop.time()
        report.frames_expected = max(0, int((deadline - playing_since) * tick_rate))
        send_up_to(start + delay() - 1)
        while loop.time() < deadline:
            frame = await client.next_frame_or_none(timeout=max(0.01, deadline - loop.time()))
            if frame is None:
                ended = True
                break
            now = last_frame_at = loop.time()
            if frame.number != expected:
                if frame.number < expected:
                    report.duplicates += 1
                    continue
                report.gaps += frame.number - expected
            expected = frame.number + 1
            report.frames += 1
            digest = hashlib.blake2b(repr((frame.inputs, frame.events)).encode(), digest_size=16).digest()
            if not ledger.check(frame.number, digest):
                report.mismatches += 1
            pending = sent_at.pop(frame.number, None)
            if pending is not None:
                if slot < len(frame.inputs) and frame.inputs[slot] == pending[1]:
                    report.latencies.append(now - pending[0])
                else:
                    report.inputs_missing += 1
            send_up_to(frame.number + delay())
    except asyncio.TimeoutError:
        pass
    except RelayError as error:
        report.error = str(error)
    finally:
        await client.close()
    if report.error is None:
        report.error = _shortfall(client, report, ended, loop.time() - last_frame_at, deadline,
                                  loop.time(), address)
    return report


def _shortfall(client: RelayClient, report: BotReport, ended: bool, silent: float,
               deadline: float, now: float, address: str) -> Optional[str]:
    """Why the bot got fewer frames than asked, or None if it played to the end."""
    got = f"{report.frames} frames of ~{report.frames_expected}"
    if client.room_state == "ended":
        report.end_reason = client.end_reason
        if ended and now < deadline - 0.05:
            return (f"the room ended early ({client.end_reason or 'no reason given'}, after "
                    f"frame {client.final_frames}): {got}")
        return None
    error = client.error
    if ended and error is not None:
        # "disconnected: remote:kicked" -- who ended the connection, and why.
        reason = str(error).removeprefix("disconnected: ").rpartition(":")[2]
        if reason == "kicked":
            report.kicked = True
            return f"kicked by the relay: {got}"
        if reason == "timeout":
            return (f"the relay at {address} stopped answering (connection timed out): {got}")
        return f"connection lost ({error}): {got}"
    if silent > SILENCE:
        return (f"no frame in the last {silent:.1f} s: the relay at {address} stopped sending "
                f"(killed, overloaded or unreachable): {got}")
    # Frames still in flight at the deadline, and a slow start, are not a shortfall.
    if report.frames < 0.8 * report.frames_expected - 3:
        return f"{got}: the relay fell behind its tick rate, or the link is losing frames"
    return None


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def late_share(reports: list[BotReport]) -> float:
    """Of the inputs whose frame came, the share that missed it (arrived after it closed)."""
    missing = sum(r.inputs_missing for r in reports)
    resolved = missing + sum(len(r.latencies) for r in reports)
    return missing / resolved if resolved else 0.0


def summarize(reports: list[BotReport], seconds: float) -> dict:
    latencies = [value for report in reports for value in report.latencies]
    return {
        "bots": len(reports),
        "rooms": len({report.room for report in reports}),
        "seconds": seconds,
        "frames_received": sum(r.frames for r in reports),
        "frames_per_bot_min": min((r.frames for r in reports), default=0),
        "gaps": sum(r.gaps for r in reports),
        "duplicates": sum(r.duplicates for r in reports),
        "mismatches": sum(r.mismatches for r in reports),
        "inputs_sent": sum(r.inputs_sent for r in reports),
        "inputs_missing": sum(r.inputs_missing for r in reports),
        "errors": [f"{r.room}/{r.player}: {r.error}" for r in reports if r.error],
        "short_bots": sum(1 for r in reports if r.error),
        "end_reasons": dict(sorted(Counter(r.end_reason for r in reports if r.end_reason).items())),
        "kicked": [f"{r.room}/{r.player}" for r in reports if r.kicked],
        "input_delay": sorted({r.input_delay for r in reports if r.inputs_sent}),
        "advised_input_delay": max((r.advised_input_delay for r in reports
                                    if r.advised_input_delay is not None), default=None),
        "late_input_share": round(late_share(reports), 4),
        "latency_ms": {
            "p50": round(1000 * percentile(latencies, 0.50), 2),
            "p95": round(1000 * percentile(latencies, 0.95), 2),
            "p99": round(1000 * percentile(latencies, 0.99), 2),
            "max": round(1000 * max(latencies, default=0.0), 2),
            "mean": round(1000 * statistics.fmean(latencies), 2) if latencies else 0.0,
            "samples": len(latencies),
        },
    }


def room_names(rooms: int, room_prefix: str = "bots", room: Optional[str] = None) -> list[str]:
    """The rooms the bots join: ``room`` alone if given (``rooms`` must then be 1), else
    ``rooms`` fresh names ``{room_prefix}-{run id}-{index}`` (the run id keeps two runs apart)."""
    if room is not None:
        if rooms != 1:
            raise ValueError("--room names one room: it cannot be combined with --rooms > 1")
        return [room]
    run_id = f"{int(time.time() * 1000) % 10**8}"
    return [f"{room_prefix}-{run_id}-{r}" for r in range(rooms)]


async def run_bots(host: str, port: int, rooms: int, players: int, seconds: float,
                   input_delay: int = 2, room_prefix: str = "bots", start_timeout: float = 10.0,
                   minter: Optional[TokenMinter] = None, room: Optional[str] = None,
                   auto_input_delay: bool = False) -> dict:
    """``players`` bots in each of ``rooms`` fresh rooms, or all of them in the room named
    ``room``; they play for ``seconds`` and the summary says what they saw."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    tasks = []
    for name in room_names(rooms, room_prefix, room):
        ledger = RoomLedger()
        for p in range(players):
            tasks.append(run_bot(host, port, name, f"bot{p}", ledger, deadline, input_delay,
                                 start_timeout, minter, auto_input_delay))
    reports = await asyncio.gather(*tasks)
    return summarize(list(reports), seconds)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", type=_host_port, default=("127.0.0.1", 7777),
                        help="relay UDP address, HOST:PORT (default 127.0.0.1:7777)")
    parser.add_argument("--rooms", type=int, default=1,
                        help="number of rooms, each a new one named PREFIX-RUNID-INDEX "
                             "(default %(default)s)")
    parser.add_argument("--players", type=int, default=2,
                        help="bots per room, named bot0, bot1, ... (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long the bots play (default %(default)s)")
    parser.add_argument("--input-delay", type=int, default=2,
                        help="frames between receiving frame N and the frame an input is for "
                             "(default %(default)s); raise it when many inputs arrive late")
    parser.add_argument("--auto-input-delay", action="store_true",
                        help="follow the relay's input-delay advice (INPUT_DELAY, measured per "
                             "player) from --input-delay on, as a game client would (default off)")
    parser.add_argument("--start-timeout", type=float, default=10.0,
                        help="seconds to connect and for the room to start (default %(default)s)")
    names = parser.add_mutually_exclusive_group()
    names.add_argument("--room-prefix", default="bots",
                       help="prefix of the generated room names (default %(default)s)")
    names.add_argument("--room", metavar="NAME", type=_room_name,
                       help="all --players bots join the room NAME (the relay creates it "
                            "if rooms.auto_create allows); only with --rooms 1. Default: "
                            "--rooms new rooms")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object (default: text)")
    tokens = parser.add_argument_group(
        "token mode", "give a key and every bot mints its own connect token (as a game backend "
                      "would); the relay must have the same key")
    tokens.add_argument("--key", action="append", metavar="ID:BASE64KEY",
                        help="a key (repeatable; default: none, open mode)")
    tokens.add_argument("--key-file", help='TOML file of ID = "BASE64KEY" lines (default: none)')
    tokens.add_argument("--config", help="relay TOML settings holding the keys ([security]) "
                                          "(default: none)")
    tokens.add_argument("--key-id", type=int, help="key to mint with (default: the highest id, "
                                                   "or security.mint_key_id)")
    tokens.add_argument("--token-ttl", type=float, default=30.0,
                        help="seconds each token stays valid (default 30)")


def late_input_hint(summary: dict, input_delay: int, auto: bool) -> Optional[str]:
    """A suggestion when more than LATE_HINT of the inputs missed their frame."""
    share = summary["late_input_share"]
    if share <= LATE_HINT:
        return None
    advised = summary.get("advised_input_delay")
    advice = f" (the relay advised {advised})" if advised is not None else ""
    if auto:
        return (f"{share:.0%} of inputs arrived after their frame closed even with "
                f"--auto-input-delay{advice}: the link is slow or lossy")
    return (f"{share:.0%} of inputs arrived after their frame closed: raise --input-delay "
            f"(now {input_delay}){advice}, or pass --auto-input-delay")


def format_summary(summary: dict) -> str:
    latency = summary["latency_ms"]
    lines = [
        f"bots {summary['bots']} in {summary['rooms']} room(s), {summary['seconds']:g} s",
        f"frames received {summary['frames_received']} (min per bot {summary['frames_per_bot_min']})",
        f"gaps {summary['gaps']}  duplicates {summary['duplicates']}  mismatches {summary['mismatches']}",
        f"inputs sent {summary['inputs_sent']}  missing from their frame {summary['inputs_missing']}"
        f" ({summary['late_input_share']:.1%})",
        f"input-to-frame latency ms: p50 {latency['p50']}  p95 {latency['p95']}  "
        f"p99 {latency['p99']}  max {latency['max']}  ({latency['samples']} samples)",
    ]
    if summary["end_reasons"]:
        lines.append("rooms ended: " + ", ".join(f"{reason} ({count} bots)" for reason, count
                                                 in summary["end_reasons"].items()))
    if summary["kicked"]:
        lines.append("kicked: " + ", ".join(summary["kicked"]))
    lines += [f"error: {error}" for error in summary["errors"]]
    if summary.get("hint"):
        lines.append(f"hint: {summary['hint']}")
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    if (args.rooms < 1 or args.players < 1 or args.seconds <= 0 or args.input_delay < 1
            or args.start_timeout <= 0):
        print("relay bot: --rooms, --players, --input-delay must be >= 1, --seconds and "
              "--start-timeout > 0",
              file=sys.stderr)
        return 2
    if args.room is not None and args.rooms != 1:
        print("relay bot: --room names one room: use it without --rooms (or with --rooms 1)",
              file=sys.stderr)
        return 2
    minter = None
    if args.key or args.key_file or args.config:
        from relay.config import ConfigError, minting_keys

        try:
            keys, key_id = minting_keys(args.key, args.key_file, args.config)
        except ConfigError as error:
            print(f"relay bot: {error}", file=sys.stderr)
            return 2
        key_id = key_id if args.key_id is None else args.key_id
        if key_id not in keys or not args.token_ttl > 0:
            print(f"relay bot: --key-id {key_id}: no such key" if key_id not in keys
                  else "relay bot: --token-ttl must be > 0", file=sys.stderr)
            return 2
        minter = TokenMinter(key_id, keys[key_id], args.token_ttl)
    import uvloop

    host, port = args.server
    summary = uvloop.run(run_bots(host, port, args.rooms, args.players, args.seconds,
                                  args.input_delay, args.room_prefix, args.start_timeout,
                                  minter=minter, room=args.room,
                                  auto_input_delay=args.auto_input_delay))
    summary["hint"] = late_input_hint(summary, args.input_delay, args.auto_input_delay)
    print(json.dumps(summary) if args.json else format_summary(summary))
    # Any bot short of frames (room ended early, kicked, relay gone) is a failure.
    ok = not (summary["gaps"] or summary["duplicates"] or summary["mismatches"] or summary["errors"])
    return 0 if ok else 1
