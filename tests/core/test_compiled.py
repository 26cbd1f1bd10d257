import importlib
import importlib.machinery

import pytest

CORE_MODULES = ["wire", "seqbuf", "rtt", "redundancy", "fragment", "channel", "block", "peer", "endpoint"]


@pytest.mark.parametrize("name", CORE_MODULES)
def test_core_module_is_a_compiled_extension(name):
    module = importlib.import_module(f"relay_core.{name}")
    assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module.__file__
    assert isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)


@pytest.mark.parametrize("name", ["relay.frames", "relay._batchio", "relay.server.timing", "relay.server.pending",
                                  "relay.server.inputs",
                                  "relay.server.room", "relay.server.history"])
def test_server_hot_paths_are_compiled_extensions(name):
    module = importlib.import_module(name)
    assert isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)


def test_the_room_is_compiled_with_its_c_fields_and_exports_accept_input():
    # relay/server/room.py through room.pxd (pure Python mode): the extension, not the source,
    # is what imports, and relay.server.inputs reaches accept_input as a C function.
    from relay.server import inputs, room

    assert "accept_room_input" in room.__pyx_capi__
    assert not hasattr(room.Room("r", __import__("relay.config").config.RelayConfig().rooms, 30, 0.0),
                       "__dict__")
    assert inputs.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_no_python_source_fallback_ships_for_compiled_modules():
    import relay_core
    import pathlib

    package = pathlib.Path(relay_core.__file__).parent
    for name in CORE_MODULES:
        assert not (package / f"{name}.py").exists(), f"{name}.py would shadow the extension"
