"""How a relay command ends when its output's reader goes away (``relay replay inspect --json F |
head``): quietly, with the status of a command ended by SIGPIPE. Shared by ``relay`` (relay.cli)
and ``python -m relay.replay``."""
from __future__ import annotations

import argparse
import os
import signal
import sys

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""What a shell reports for a program ended by SIGPIPE, as `cat FILE | head` gives cat."""


def run_command(func, args: argparse.Namespace) -> int:
    """``func(args)``, quiet when stdout's reader goes away (``relay replay inspect --json F |
    head``): no BrokenPipeError traceback, the status of a command ended by SIGPIPE."""
    try:
        status = func(args)
        sys.stdout.flush()      # inside the try: a buffered write fails only here
        return status
    except BrokenPipeError:
        # Python ignores SIGPIPE, so the write raised; the interpreter's final flush would
        # fail again and print "Exception ignored": point stdout at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):     # stdout is no real file (tests)
            pass
        finally:
            os.close(devnull)
        return EXIT_BROKEN_PIPE
