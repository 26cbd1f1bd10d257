"""The ``relay`` command line."""
from __future__ import annotations

import argparse
import sys

import relay
import relay_core


def _info(_args: argparse.Namespace) -> int:
    from relay_core import endpoint

    print(f"relay {relay.__version__}")
    print(f"relay_core compiled extension: {endpoint.__file__}")
    config = relay_core.EndpointConfig()
    print(f"default mtu: {config.mtu} bytes; channels: "
          + ", ".join(channel.mode for channel in config.channels))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay", description="Frame-sync relay server")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print the version and the compiled core in use").set_defaults(func=_info)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
