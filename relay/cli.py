"""The ``relay`` command line: serve, bot, netem, replay, info."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import relay


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
    from relay.server import RelayServer

    server = RelayServer(config)
    await server.start()
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


def _serve_command(args: argparse.Namespace) -> int:
    from relay.config import ConfigError, describe, load_config
    from relay.logs import configure, get_logger

    try:
        config = load_config(args.config or os.environ.get("RELAY_CONFIG"))
    except ConfigError as error:
        print(f"relay: invalid configuration: {error}", file=sys.stderr)
        return 2
    configure(config.server.log_level, config.server.log_format)
    get_logger("relay").info("config", **{section: values for section, values in describe(config).items()})
    import uvloop

    return uvloop.run(_serve(config))


def _bench_module(name: str):
    """A benchmark script from the source tree's benchmarks/ (they do not ship in the wheel)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"relay_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module         # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _add_bench(sub, load: bool) -> None:
    bench = sub.add_parser("bench", help="benchmarks: loss (latency under loss vs ENet/KCP), "
                                         "capacity (players per core); from a source checkout")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    if not load:
        # Importing the benchmark scripts is left to `relay bench ...` itself.
        bench.set_defaults(func=lambda args: 2)
        return
    for name, script, text in (("loss", "loss_latency", "latency under loss against ENet and KCP"),
                               ("capacity", "capacity", "players per core against a C echo and an ENet relay")):
        parser = bench_sub.add_parser(name, help=text)
        module = _bench_module(script)
        if module is None:
            parser.set_defaults(func=lambda args, script=script: _no_bench(script))
        else:
            module.add_arguments(parser)
            parser.set_defaults(func=module.run)


def _no_bench(script: str) -> int:
    print(f"relay bench: benchmarks/{script}.py is not here; the benchmarks ship with the "
          f"source tree, not the wheel", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay", description="Frame-sync (lockstep) relay server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the relay (embedded defaults, or --config FILE)")
    serve.add_argument("--config", help="TOML settings file (default: embedded defaults; "
                                        "RELAY_<SECTION>_<KEY> variables override single settings)")
    serve.set_defaults(func=_serve_command)

    from relay import bot, netem, replay

    bot_parser = sub.add_parser("bot", help="headless bots that play and verify a room")
    bot.add_arguments(bot_parser)
    bot_parser.set_defaults(func=bot.run_from_args)

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
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
