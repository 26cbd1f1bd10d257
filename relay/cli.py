"""The ``relay`` command line: serve, bot, token, netem, replay, info."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time

import relay
from relay.exits import EXIT_BROKEN_PIPE, run_command  # noqa: F401  (cli.EXIT_BROKEN_PIPE beside EXIT_CONFIG, EXIT_LISTEN)


def _info(_args: argparse.Namespace) -> int:
    import relay_core
    from relay_core import endpoint

    print(f"relay {relay.__version__}")
    print(f"relay_core compiled extension: {endpoint.__file__}")
    config = relay_core.EndpointConfig()
    print(f"default mtu: {config.mtu} bytes; core channel modes: "
          + ", ".join(channel.mode for channel in config.channels))
    return 0


async def _serve(config) -> int:
    from relay.config import describe
    from relay.logs import get_logger
    from relay.server import RelayServer

    server = RelayServer(config)
    await server.start()        # ListenError: one line from the caller, nothing logged before it
    get_logger("relay").info("config", **describe(config))
    loop = asyncio.get_running_loop()
    # SIGTERM (orchestrators): drain, let matches finish up to drain_timeout, then stop.
    # SIGINT (a person at a terminal), or a second SIGTERM: stop now.
    terminate, interrupt = asyncio.Event(), asyncio.Event()

    def on_sigterm() -> None:
        (interrupt if terminate.is_set() else terminate).set()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, interrupt.set)
    waiters = [loop.create_task(terminate.wait()), loop.create_task(interrupt.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if not interrupt.is_set():
        server.drain()
        drained = loop.create_task(server.drained.wait())
        await asyncio.wait([drained, waiters[1]], return_when=asyncio.FIRST_COMPLETED)
        drained.cancel()
    for waiter in waiters:
        waiter.cancel()
    try:
        await asyncio.wait_for(server.stop("shutdown"), config.server.shutdown_timeout)
    except asyncio.TimeoutError:
        server.log.error("shutdown_timed_out", seconds=config.server.shutdown_timeout)
        return 1
    return 0


EXIT_CONFIG = 2
"""`relay serve` exit status: invalid settings, or a replay directory it cannot write."""
EXIT_LISTEN = 3
"""`relay serve` exit status: a UDP or HTTP address it cannot listen on."""

SERVE_EPILOG = f"""\
Settings, later ones win: embedded defaults, the --config file, RELAY_<SECTION>_<KEY>
environment variables (e.g. RELAY_SERVER_UDP_PORT=7778), then these flags (--udp-port,
--set server.tick_rate=60, ...). Every value is checked the same way wherever it comes from.
The annotated reference of every setting is configs/relay.toml.

Replays go to replay.directory ("replays", relative to the working directory, by default); it
is created and checked for writing at start. Set replay.directory to an absolute path for a
service, or replay.enabled=false.

Exit status: 0 stopped cleanly (SIGTERM drains first, SIGINT stops at once); 1 the shutdown
took longer than server.shutdown_timeout; {EXIT_CONFIG} invalid settings or an unwritable replay
directory; {EXIT_LISTEN} cannot listen on the UDP or HTTP address (port in use, a port below
1024 without privileges, an address not on this machine). Errors are one line on stderr.
"""


def _add_serve(sub) -> None:
    serve = sub.add_parser(
        "serve", help="run the relay (embedded defaults, or --config FILE)",
        description="Run the relay: game traffic on UDP, metrics and the admin API on HTTP.",
        epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--config", metavar="FILE",
                       help="TOML settings file (default: $RELAY_CONFIG, else the embedded "
                            "defaults)")
    listen = serve.add_argument_group("listeners (override the file and the environment)")
    listen.add_argument("--udp-host", metavar="ADDRESS",
                        help="server.udp_host: address for game traffic (default 127.0.0.1; "
                             "0.0.0.0 for every interface, which needs token keys)")
    listen.add_argument("--udp-port", metavar="PORT",
                        help="server.udp_port: UDP port for game traffic (default 7777; 0: any "
                             "free port)")
    listen.add_argument("--http-host", metavar="ADDRESS",
                        help="server.http_host: address of metrics and the admin API "
                             "(default 127.0.0.1)")
    listen.add_argument("--http-port", metavar="PORT",
                        help="server.http_port: TCP port of metrics and the admin API "
                             "(default 9100; 0: any free port)")
    serve.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="any setting, e.g. --set rooms.capacity=4 --set "
                            "replay.directory=/var/lib/relay/replays (repeatable; values are "
                            "written as in RELAY_* variables)")
    serve.set_defaults(func=_serve_command)


def _overrides(args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """The command line's settings as load_config overrides, the flags last (they win)."""
    from relay.config import parse_override

    overrides = []
    for text in args.set:
        section, key, value = parse_override(text)
        overrides.append((section, key, value, f"--set {section}.{key}"))  # not the value: it may be a secret
    for name in ("udp_host", "udp_port", "http_host", "http_port"):
        value = getattr(args, name)
        if value is not None:
            overrides.append(("server", name, value, f"--{name.replace('_', '-')}"))
    return overrides


def _serve_command(args: argparse.Namespace) -> int:
    from relay.config import ConfigError, load_config
    from relay.errors import ListenError
    from relay.logs import configure
    from relay.server.recording import check_replay_directory

    try:
        config = load_config(args.config or os.environ.get("RELAY_CONFIG"),
                             overrides=_overrides(args))
        config.check_serve()
    except ConfigError as error:
        print(f"relay: invalid configuration: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        replays = check_replay_directory(config.replay)
    except OSError as error:
        print(f"relay: replay.directory={config.replay.directory!r}: cannot write replays "
              f"there: {error.strerror or error}"
              f"{' (' + str(error.filename) + ')' if error.filename else ''}; set "
              f"replay.directory (RELAY_REPLAY_DIRECTORY, --set replay.directory=PATH) to a "
              f"writable directory, or replay.enabled=false", file=sys.stderr)
        return EXIT_CONFIG
    if replays is not None:
        config.replay.directory = str(replays)    # what the log shows: the absolute path
    configure(config.server.log_level, config.server.log_format)
    import uvloop

    try:
        return uvloop.run(_serve(config))
    except ListenError as error:
        print(f"relay: {error}", file=sys.stderr)
        return EXIT_LISTEN


# -- relay token --------------------------------------------------------------------------------

_TTL = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h|d)?\s*")
_TTL_UNITS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> float:
    """"30s", "5m", "1h", "1d" or plain seconds ("45", "2.5") -> seconds (> 0)."""
    match = _TTL.fullmatch(text)
    if match is None:
        raise ValueError(f"ttl {text!r}: a number of seconds, or a number with s, m, h or d "
                         f"(30s, 5m, 1h)")
    seconds = float(match.group(1)) * _TTL_UNITS[match.group(2)]
    if not seconds > 0:
        raise ValueError(f"ttl {text!r}: must be more than 0 seconds")
    return seconds


def _ttl_argument(text: str) -> float:
    try:
        return parse_ttl(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _token_mint(args: argparse.Namespace) -> int:
    from relay.config import ConfigError, minting_keys
    from relay_core.token import mint_token

    try:
        keys, key_id = minting_keys(args.key, args.key_file, args.config)
    except ConfigError as error:
        print(f"relay token mint: {error}", file=sys.stderr)
        return 2
    if args.key_id is not None:
        if args.key_id not in keys:
            print(f"relay token mint: --key-id {args.key_id}: no such key (ids: "
                  f"{', '.join(map(str, sorted(keys)))})", file=sys.stderr)
            return 2
        key_id = args.key_id
    user_data = args.user_data.encode("utf-8") if args.user_data else b""
    try:
        token = mint_token(keys[key_id], key_id, args.room, args.player, args.ttl,
                           user_data=user_data)
    except ValueError as error:          # names too long, user data too large
        print(f"relay token mint: {error}", file=sys.stderr)
        return 2
    text = token.encode()
    if args.json:
        print(json.dumps({
            "token": text, "room": token.room, "player": token.player, "key_id": key_id,
            "expires": token.expires,
            "expires_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(token.expires)),
        }))
    else:
        print(text)
    return 0


def _token_keygen(args: argparse.Namespace) -> int:
    import base64

    from relay.config import ConfigError, read_key_file
    from relay_core.token import generate_key

    key_id = args.id
    if key_id is None:
        key_id = 1
        if args.key_file and os.path.exists(args.key_file):
            try:
                key_id = max(read_key_file(args.key_file), default=0) + 1
            except ConfigError as error:
                print(f"relay token keygen: {error}", file=sys.stderr)
                return 2
    text = base64.b64encode(generate_key()).decode("ascii")
    print(f"{key_id}:{text}" if args.env else f'{key_id} = "{text}"')
    return 0


def _add_token(sub) -> None:
    token = sub.add_parser("token", help="connect tokens: mint one (as a game backend would), "
                                         "or generate a key")
    token_sub = token.add_subparsers(dest="token", required=True)
    mint = token_sub.add_parser(
        "mint", help="print a connect token for one player joining one room",
        description="Mint a single-use connect token with a relay key. Keys come from --key / "
                    "--key-file, else from the relay settings (--config, RELAY_SECURITY_KEYS, "
                    "RELAY_SECURITY_KEYS_FILE).")
    mint.add_argument("--room", required=True)
    mint.add_argument("--player", required=True)
    mint.add_argument("--ttl", type=_ttl_argument, default=30.0,
                      help="validity: 30s, 5m, 1h or plain seconds (default 30s)")
    mint.add_argument("--key-id", type=int, help="key to mint with (default: "
                                                 "security.mint_key_id, else the highest id)")
    mint.add_argument("--user-data", help="opaque text the relay receives with the token")
    mint.add_argument("--config", help="relay TOML settings holding the keys")
    mint.add_argument("--key", action="append", metavar="ID:BASE64KEY", help="a key (repeatable)")
    mint.add_argument("--key-file", help='TOML file of ID = "BASE64KEY" lines')
    mint.add_argument("--json", action="store_true",
                      help="print the token with its room, player, key id and expiry as JSON")
    mint.set_defaults(func=_token_mint)
    keygen = token_sub.add_parser(
        "keygen", help="print a new random key as a key-file line",
        description='Print a new 32-byte key as an ID = "BASE64KEY" line for a key file '
                    "(--env: ID:BASE64KEY for RELAY_SECURITY_KEYS). Keys are secrets: give them "
                    "to the relays and the backend only.")
    keygen.add_argument("--id", type=int, help="key id (default: 1, or one above the highest "
                                              "in --key-file)")
    keygen.add_argument("--key-file", help="existing key file to pick the next id from")
    keygen.add_argument("--env", action="store_true", help="print ID:BASE64KEY")
    keygen.set_defaults(func=_token_keygen)


BENCHMARKS = {
    # relay bench NAME: (script in benchmarks/, what it measures)
    "loss": ("loss_latency", "latency under loss against ENet and KCP"),
    "capacity": ("capacity", "players per core against a C echo and an ENet relay"),
}


def _bench_dirs() -> list:
    """Where benchmarks/ may be: beside the relay package (a checkout, an editable install),
    else the working directory when it is a relay checkout (the installed `relay` run there)."""
    from pathlib import Path

    beside = Path(relay.__file__).resolve().parent.parent
    here = Path.cwd()
    return [beside] + ([here] if here != beside and (here / "relay_core").is_dir() else [])


def _bench_module(name: str):
    """A benchmark script from a source tree's benchmarks/ (they do not ship in the wheel);
    None if there is none."""
    import importlib.util

    for root in _bench_dirs():
        path = root / "benchmarks" / f"{name}.py"
        if path.exists():
            break
    else:
        return None
    # The scripts put their checkout first on sys.path; import the compiled core now, from
    # wherever relay came from, so an unbuilt checkout's relay_core does not shadow it.
    import relay_core  # noqa: F401

    spec = importlib.util.spec_from_file_location(f"relay_bench_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module         # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _no_bench_text(name: str, script: str) -> str:
    return (f"the benchmarks are not installed with the relay package: they run from a source "
            f"checkout (git clone, then `pip install -e .` or `python setup.py build_ext "
            f"--inplace`). There run: python benchmarks/{script}.py --help (or, from the "
            f"checkout, relay bench {name} --help)")


def _add_bench(sub, load: bool) -> None:
    bench = sub.add_parser("bench", help="benchmarks: loss (latency under loss vs ENet/KCP), "
                                         "capacity (players per core); from a source checkout")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    if not load:
        # Importing the benchmark scripts is left to `relay bench ...` itself.
        bench.set_defaults(func=lambda args: 2)
        return
    for name, (script, text) in BENCHMARKS.items():
        module = _bench_module(script)
        if module is None:
            # --help says what to run instead of showing no options.
            parser = bench_sub.add_parser(name, help=text, description=_no_bench_text(name, script))
            parser.set_defaults(func=lambda args, name=name, script=script: _no_bench(name, script))
        else:
            parser = bench_sub.add_parser(name, help=text, description=(module.__doc__ or "").strip().split("\n")[0])
            module.add_arguments(parser)
            parser.set_defaults(func=module.run)


def _no_bench(name: str, script: str) -> int:
    print(f"relay bench {name}: {_no_bench_text(name, script)}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay", description="Frame-sync (lockstep) relay server")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_serve(sub)

    from relay import replay

    from relay.tools import bot, netem
    bot_parser = sub.add_parser("bot", help="headless bots that play and verify a room")
    bot.add_arguments(bot_parser)
    bot_parser.set_defaults(func=bot.run_from_args)

    _add_token(sub)

    netem_parser = sub.add_parser("netem", help="user-space UDP link emulator (loss, delay, jitter)")
    netem.add_arguments(netem_parser)
    netem_parser.set_defaults(func=netem.run)

    replay_parser = sub.add_parser("replay", help="inspect replay files")
    replay.add_arguments(replay_parser)         # its subcommands set func

    if argv is None:
        argv = sys.argv[1:]
    _add_bench(sub, load=argv[:1] == ["bench"])
    sub.add_parser("info", help="print the version and the compiled core in use").set_defaults(func=_info)
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
