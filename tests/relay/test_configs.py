"""Every file shipped in configs/ loads through the real config loader; configs/relay.toml
states exactly the built-in defaults."""
import dataclasses
import tomllib
from pathlib import Path

import pytest

from relay.config import load_config

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = sorted(CONFIGS_DIR.glob("*.toml"))


def test_the_shipped_configs_are_there():
    names = {path.name for path in CONFIGS}
    assert {"relay.toml", "moba-30hz.toml", "fighting-60hz.toml", "strategy-15hz.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_shipped_config_loads_and_validates(path):
    config = load_config(path, environ={})
    assert 10 <= config.server.tick_rate <= 120


def test_the_settings_file_holds_exactly_the_built_in_defaults():
    # configs/relay.toml is the reference of every default (OPERATIONS.md points to it): a
    # changed default must change it too.
    defaults = load_config(environ={})
    from_file = load_config(CONFIGS_DIR / "relay.toml", environ={})
    assert dataclasses.asdict(from_file) == dataclasses.asdict(defaults)
    # ... and names every setting, so that it documents them all.
    with open(CONFIGS_DIR / "relay.toml", "rb") as handle:
        document = tomllib.load(handle)
    assert {section: sorted(values) for section, values in document.items()} == {
        section: sorted(values) for section, values in dataclasses.asdict(defaults).items()}


def test_example_configs_say_what_they_promise():
    by_name = {path.name: load_config(path, environ={}) for path in CONFIGS}
    moba, fighting, strategy = by_name["moba-30hz.toml"], by_name["fighting-60hz.toml"], by_name["strategy-15hz.toml"]
    assert (moba.server.tick_rate, moba.rooms.capacity) == (30, 10)
    assert (fighting.server.tick_rate, fighting.rooms.capacity) == (60, 2)
    assert (strategy.server.tick_rate, strategy.rooms.capacity) == (15, 8)


def test_example_configs_serve_players_in_token_mode_once_given_keys(tmp_path):
    """The game examples listen beyond loopback, so they are token mode and will not start
    without keys; with a key file from the environment they can."""
    from relay.config import ConfigError

    keys = tmp_path / "keys.toml"
    keys.write_text('1 = "' + "A" * 43 + '="\n')
    for path in CONFIGS:
        if path.name == "relay.toml":
            continue
        config = load_config(path, environ={})
        assert config.server.udp_host == "0.0.0.0" and config.security_mode == "token", path.name
        with pytest.raises(ConfigError, match="token keys"):
            config.check_serve()
        load_config(path, environ={"RELAY_SECURITY_KEYS_FILE": str(keys)}).check_serve()
