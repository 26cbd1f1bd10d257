import importlib.machinery
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import relay_core  # noqa: E402
from relay_core import endpoint  # noqa: E402

# The tests are about the compiled core; a pure-Python stand-in must never pass for it.
if not endpoint.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
    raise pytest.UsageError(
        f"relay_core.endpoint was imported from {endpoint.__file__}, not a compiled extension; "
        "build it with `pip install -e .`"
    )
