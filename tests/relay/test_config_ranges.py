"""Every range check of relay/config.py at its edges: the boundary value is accepted and one
past it is refused with a ConfigError whose message starts with the key (issue #24). Values go
through load_config's environment overrides, the path `relay serve` uses."""
from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import pytest

from relay.config import ConfigError, load_config

CONFIG_SOURCE = (Path(__file__).resolve().parents[2] / "relay" / "config.py").read_text()

KEY_B64 = base64.b64encode(bytes(range(32))).decode()
MAX_KEY_ID = 2**32 - 1


def below(value):
    return value - 1 if isinstance(value, int) else math.nextafter(value, -math.inf)


def above(value):
    return value + 1 if isinstance(value, int) else math.nextafter(value, math.inf)


def env(settings: dict) -> dict:
    """{"rooms.capacity": 3} -> {"RELAY_ROOMS_CAPACITY": "3"}"""
    return {"RELAY_" + key.replace(".", "_").upper(): str(value) for key, value in settings.items()}


def load(settings: dict):
    return load_config(None, environ=env(settings))


# (key, boundary value, the value one past it, other settings the boundary needs)
RANGES = [
    ("server.udp_port", 0, -1, {}),
    ("server.udp_port", 65535, 65536, {}),
    ("server.http_port", 0, -1, {}),
    ("server.http_port", 65535, 65536, {}),
    ("server.tick_rate", 10, 9, {}),
    ("server.tick_rate", 120, 121, {}),
    ("server.drain_timeout", 0.0, below(0.0), {}),
    ("server.drain_timeout", 86400.0, above(86400.0), {}),
    ("server.shutdown_timeout", 0.1, below(0.1), {}),
    ("server.shutdown_timeout", 300.0, above(300.0), {}),
    ("server.max_peers", 1, 0, {}),
    ("server.max_peers", 1_000_000, 1_000_001, {}),
    ("server.join_timeout", 1.0, below(1.0), {}),
    ("server.join_timeout", 3600.0, above(3600.0), {}),
    ("server.mtu", 1072, 1071, {}),
    ("server.mtu", 16384, 16385, {}),
    ("server.max_pending_messages", 16, 15, {}),
    ("server.max_pending_messages", 1_000_000, 1_000_001, {}),
    ("server.reassembly_limit", 262144, 262143, {}),
    ("server.reassembly_limit", 2**32, 2**32 + 1, {}),
    ("server.block_memory_limit", 32 * 1024 * 1024, 32 * 1024 * 1024 - 1, {}),
    ("server.block_memory_limit", 2**40, 2**40 + 1, {}),
    ("server.receive_memory_limit", 32 * 1024 * 1024, 32 * 1024 * 1024 - 1, {}),
    ("server.receive_memory_limit", 2**40, 2**40 + 1, {}),
    ("server.http_max_connections", 1, 0, {}),
    ("server.http_max_connections", 1_000_000, 1_000_001, {}),
    ("server.http_header_timeout", 0.1, 0.099, {}),
    ("server.http_header_timeout", 3600.0, 3600.001, {}),
    ("server.http_body_timeout", 0.1, 0.099, {}),
    ("server.http_body_timeout", 3600.0, 3600.001, {}),
    ("rooms.max_rooms", 1, 0, {}),
    ("rooms.max_rooms", 1_000_000, 1_000_001, {}),
    ("rooms.capacity", 1, 0, {"rooms.start_players": 1}),
    ("rooms.capacity", 256, 257, {}),
    ("rooms.start_players", 1, 0, {}),
    ("rooms.start_players", 5, 6, {"rooms.capacity": 5}),
    ("rooms.empty_timeout", 0.0, below(0.0), {}),
    ("rooms.empty_timeout", 86400.0, above(86400.0), {}),
    ("rooms.max_input_bytes", 1, 0, {}),
    ("rooms.max_input_bytes", 4096, 4097, {}),
    ("rooms.max_input_lead", 1, 0, {}),
    ("rooms.max_input_lead", 10_000, 10_001, {}),
    ("rooms.player_timeout", 1.0, below(1.0), {}),
    ("rooms.player_timeout", 3600.0, above(3600.0), {}),
    ("rooms.reconnect_grace", 0.0, below(0.0), {}),
    ("rooms.reconnect_grace", 86400.0, above(86400.0), {}),
    ("rooms.spectator_delay", 0, -1, {}),
    ("rooms.spectator_delay", 100_000, 100_001, {}),
    ("rooms.max_spectators", 0, -1, {}),
    ("rooms.max_spectators", 10_000, 10_001, {}),
    ("rooms.catchup_frames", 2, 1, {}),
    ("rooms.catchup_frames", 1_000_000, 1_000_001, {}),
    ("rooms.checksum_window", 1, 0, {}),
    ("rooms.checksum_window", 1_000_000, 1_000_001, {}),
    ("rooms.input_delay_percentile", 50.0, below(50.0), {}),
    ("rooms.input_delay_percentile", 100.0, above(100.0), {}),
    ("rooms.input_delay_margin", 0.0, below(0.0), {}),
    ("rooms.input_delay_margin", 1.0, above(1.0), {}),
    ("rooms.input_delay_min", 1, 0, {}),
    ("rooms.input_delay_min", 1000, 1001, {"rooms.input_delay_max": 1000}),
    ("rooms.input_delay_max", 4, 3, {"rooms.input_delay_min": 4}),     # never below min
    ("rooms.input_delay_max", 1000, 1001, {}),
    ("rooms.input_delay_window", 10, 9, {}),
    ("rooms.input_delay_window", 10_000, 10_001, {}),
    ("rooms.input_delay_interval", 0.1, below(0.1), {}),
    ("rooms.input_delay_interval", 3600.0, above(3600.0), {}),
    ("replay.max_bytes", 1024, 1023, {}),
    ("replay.max_bytes", 2**40, 2**40 + 1, {"replay.max_disk_bytes": 0}),
    ("replay.max_disk_bytes", 256 * 1024 * 1024, 256 * 1024 * 1024 - 1, {}),  # >= max_bytes
    ("replay.max_disk_bytes", 2**50, 2**50 + 1, {}),
    ("replay.flush_interval", 0.0, -0.001, {}),
    ("replay.flush_interval", 60.0, 60.001, {}),
    ("replay.fsync_interval", 0.01, 0.009, {}),
    ("replay.fsync_interval", 3600.0, 3600.001, {}),
    ("security.mint_key_id", -1, -2, {}),
    ("security.mint_key_id", MAX_KEY_ID, MAX_KEY_ID + 1,
     {"security.keys": f"{MAX_KEY_ID}:{KEY_B64}"}),
    ("security.handshake_rate", 0.1, below(0.1), {}),
    ("security.handshake_rate", 1_000_000.0, above(1_000_000.0), {}),
    ("security.handshake_burst", 1, 0, {}),
    ("security.handshake_burst", 1_000_000, 1_000_001, {}),
    ("security.handshake_budget", 1.0, below(1.0), {}),
    ("security.handshake_budget", 10_000_000.0, above(10_000_000.0), {}),
    ("security.max_sessions_per_source", 0, -1, {}),
    ("security.max_sessions_per_source", 1_000_000, 1_000_001, {}),
    ("security.max_rooms_per_source", 0, -1, {}),
    ("security.max_rooms_per_source", 1_000_000, 1_000_001, {}),
    ("link.burst_threshold", 0.01, below(0.01), {}),
    ("link.burst_threshold", 0.99, above(0.99), {}),
    ("link.congestion_delay", 0.001, below(0.001), {}),
    ("link.congestion_delay", 10.0, above(10.0), {}),
    ("link.congestion_hold", 0.1, below(0.1), {}),
    ("link.congestion_hold", 600.0, above(600.0), {}),
    ("link.congested_copies", 0, -1, {}),
    ("link.congested_copies", 16, 17, {}),
    ("link.redundancy_copies", 1, 0, {}),
    ("link.redundancy_copies", 16, 17, {}),
    ("link.prompt_copies", 1, 0, {}),
    ("link.prompt_copies", 16, 17, {}),
    ("agones.port", 0, -1, {}),
    ("agones.port", 65535, 65536, {}),
    ("agones.health_interval", 0.01, below(0.01), {}),
    ("agones.health_interval", 300.0, above(300.0), {}),
    ("agones.request_timeout", 0.01, below(0.01), {}),
    ("agones.request_timeout", 60.0, above(60.0), {}),
    ("agones.max_retries", 0, -1, {}),
    ("agones.max_retries", 100, 101, {}),
    ("agones.backoff_initial", 0.001, below(0.001), {}),
    ("agones.backoff_initial", 60.0, above(60.0), {"agones.backoff_max": 600.0}),
    ("agones.backoff_max", 0.2, below(0.2), {}),                  # never below backoff_initial
    ("agones.backoff_max", 600.0, above(600.0), {}),
]


@pytest.mark.parametrize("key, good, bad, extra", RANGES,
                         ids=[f"{row[0]}={row[1]!r}" for row in RANGES])
def test_range_boundary_is_accepted_and_one_past_it_refused_naming_the_key(key, good, bad, extra):
    section, name = key.split(".")
    config = load({**extra, key: good})
    assert getattr(getattr(config, section), name) == good
    with pytest.raises(ConfigError) as caught:
        load({**extra, key: bad})
    assert str(caught.value).startswith(f"{key}="), str(caught.value)


def test_the_table_covers_every_range_check_in_config_py():
    checked = set(re.findall(r'_check_range\("([a-z_]+\.[a-z_]+)"', CONFIG_SOURCE))
    checked |= {"security.handshake_rate",            # its own check: 0 or 0.1..1000000
                "security.handshake_budget"}          # 0 or 1..10000000
    assert len(checked) >= 40            # guards the pattern itself
    tabled = {row[0] for row in RANGES}
    assert checked - tabled == set(), "range checks without a boundary test"
    assert tabled - checked == set(), "rows for checks that no longer exist"
    for key in checked:               # both ends of each range
        assert sum(row[0] == key for row in RANGES) == 2, key


def test_handshake_rate_0_means_unlimited_and_is_accepted():
    assert load({"security.handshake_rate": 0.0}).security.handshake_rate == 0.0
    with pytest.raises(ConfigError, match=r"^security\.handshake_rate="):
        load({"security.handshake_rate": -0.1})


def test_max_disk_bytes_0_means_no_cap_and_1_is_refused():
    assert load({"replay.max_disk_bytes": 0}).replay.max_disk_bytes == 0
    with pytest.raises(ConfigError, match=r"^replay\.max_disk_bytes="):
        load({"replay.max_disk_bytes": 1})


def test_mint_key_id_within_range_must_name_a_key():
    with pytest.raises(ConfigError, match=r"^security\.mint_key_id=5: no key"):
        load({"security.mint_key_id": 5, "security.keys": f"4:{KEY_B64}"})


@pytest.mark.parametrize("key, value", [
    ("rooms.player_timeout", 0.0), ("server.max_peers", 0), ("rooms.input_delay_max", 0),
])
def test_the_settings_mutation_testing_found_unchecked_are_refused(key, value):
    with pytest.raises(ConfigError) as caught:
        load({key: value})
    assert str(caught.value).startswith(f"{key}=")


def test_input_delay_max_below_input_delay_min_is_refused():
    assert load({"rooms.input_delay_min": 5, "rooms.input_delay_max": 5}).rooms.input_delay_max == 5
    with pytest.raises(ConfigError, match=r"^rooms\.input_delay_max=4: allowed 5\.\.1000"):
        load({"rooms.input_delay_min": 5, "rooms.input_delay_max": 4})


# -- rooms.neutral_input ---------------------------------------------------------------------

@pytest.mark.parametrize("text", ["zz", "0", "0g", "00 f", "é0", "0x00", "000"])
def test_neutral_input_that_is_not_hex_bytes_is_a_config_error_naming_the_key(text):
    with pytest.raises(ConfigError) as caught:
        load({"rooms.neutral_input": text})
    assert str(caught.value).startswith("rooms.neutral_input=")


def test_neutral_input_of_max_input_bytes_is_accepted_and_one_byte_more_refused():
    rooms = load({"rooms.max_input_bytes": 4, "rooms.neutral_input": "00ff00ff",
                  "rooms.missing_input_policy": "neutral"}).rooms
    assert rooms.neutral_input_bytes == b"\x00\xff\x00\xff"
    with pytest.raises(ConfigError, match=r"^rooms\.neutral_input=.*rooms\.max_input_bytes=4"):
        load({"rooms.max_input_bytes": 4, "rooms.neutral_input": "00ff00ff00"})


def test_neutral_policy_without_a_neutral_input_is_refused():
    with pytest.raises(ConfigError, match=r"^rooms\.neutral_input="):
        load({"rooms.missing_input_policy": "neutral"})
    assert load({"rooms.missing_input_policy": "neutral",
                 "rooms.neutral_input": "00"}).rooms.neutral_input_bytes == b"\x00"


# -- a full frame must fit one 256 KiB (262144-byte) message ---------------------------------

def test_a_full_frame_of_exactly_256_kib_fits_and_one_input_byte_more_does_not():
    # capacity x (max_input_bytes + 5) + 64 bytes: 64 x (4090 + 5) + 64 == 262144
    rooms = load({"rooms.capacity": 64, "rooms.max_input_bytes": 4090}).rooms
    assert rooms.capacity * (rooms.max_input_bytes + 5) + 64 == 262144
    with pytest.raises(ConfigError) as caught:
        load({"rooms.capacity": 64, "rooms.max_input_bytes": 4091})
    message = str(caught.value)
    assert message.startswith("rooms.capacity=64") and "rooms.max_input_bytes=4091" in message
    assert "256 KiB" in message


def test_the_largest_room_fits_with_inputs_of_1018_bytes_not_1019():
    assert load({"rooms.capacity": 256, "rooms.max_input_bytes": 1018}).rooms.capacity == 256
    with pytest.raises(ConfigError, match=r"^rooms\.capacity=256"):
        load({"rooms.capacity": 256, "rooms.max_input_bytes": 1019})


def test_neutral_policy_read_from_a_file_needs_a_neutral_input(tmp_path):
    # Values parsed from TOML are fresh strings, not the interned literals of the other tests.
    path = tmp_path / "relay.toml"
    path.write_text('[rooms]\nmissing_input_policy = "neutral"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^rooms\.neutral_input=''"):
        load_config(path, environ={})
    path.write_text('[rooms]\nmissing_input_policy = "neutral"\nneutral_input = "0a"\n',
                    encoding="utf-8")
    assert load_config(path, environ={}).rooms.neutral_input_bytes == b"\x0a"


def test_a_full_frame_one_byte_past_256_kib_is_refused():
    # 137 x (1908 + 5) + 64 == 262145: one byte too many (and 137 x 1913 has bit 6 set, so a
    # check that or-ed the framing in instead of adding it would let it through).
    assert 137 * (1908 + 5) + 64 == 262144 + 1
    with pytest.raises(ConfigError, match=r"^rooms\.capacity=137 x rooms\.max_input_bytes=1908"):
        load({"rooms.capacity": 137, "rooms.max_input_bytes": 1908})
    assert load({"rooms.capacity": 137, "rooms.max_input_bytes": 1907}).rooms.capacity == 137


# -- hosts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["relay.example.com", "a", "zzz", "0.0.0.0.0", "localhost "])
def test_a_listen_host_that_is_not_an_address_or_localhost_is_refused(host):
    with pytest.raises(ConfigError, match=r"^server\.udp_host=.*an IPv4/IPv6 address or 'localhost'"):
        load({"server.udp_host": host})


def test_only_loopback_addresses_and_localhost_count_as_loopback(tmp_path):
    from relay.config import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    for host in ("0.0.0.0", "::", "10.0.0.1", "relay.example.com", "mmm", "zzz", "a"):
        assert not is_loopback(host), host
    # A host read from a file is a fresh string: still localhost.
    path = tmp_path / "relay.toml"
    path.write_text('[server]\nudp_host = "localhost"\n[security]\nmode = "auto"\n')
    config = load_config(path, environ={})
    assert config.security_mode == "open" and is_loopback(config.server.udp_host)


def test_security_mode_auto_read_from_a_file_resolves_by_the_listen_address(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text('[security]\nmode = "auto"\n')
    assert load_config(path, environ={}).security_mode == "open"
    path.write_text('[server]\nudp_host = "0.0.0.0"\n[security]\nmode = "auto"\n')
    assert load_config(path, environ={}).security_mode == "token"


@pytest.mark.parametrize("host", ["", "a b", " x", "x\t"])
def test_an_agones_sidecar_host_that_is_empty_or_has_spaces_is_refused(host):
    with pytest.raises(ConfigError, match=r"^agones\.host=.*a host name or address"):
        load({"agones.host": host})


# -- token keys ------------------------------------------------------------------------------

KEY_32 = base64.b64encode(bytes(range(32))).decode().rstrip("=")


def test_key_ids_0_and_2_32_minus_1_are_valid_and_0_can_be_the_mint_key():
    security = load({"security.keys": f"0:{KEY_B64} {MAX_KEY_ID}:{KEY_B64}",
                     "security.mint_key_id": 0}).security
    assert sorted(security.load_keys()) == [0, MAX_KEY_ID]
    assert security.mint_key() == (0, bytes(range(32)))
    with pytest.raises(ConfigError, match=r"^security\.mint_key_id=0"):
        load({"security.keys": f"5:{KEY_B64}", "security.mint_key_id": 0})


@pytest.mark.parametrize("text, why", [
    (KEY_32[:20] + "!" + KEY_32[20:], "not base64 text"),      # 43 good characters and junk
    (KEY_32[:20] + "*" + KEY_32[20:] + "=", "not base64 text"),  # junk a lax decoder would skip
    (base64.b64encode(bytes(33)).decode(), "33 bytes"),
    (base64.b64encode(bytes(31)).decode(), "31 bytes"),
])
def test_a_key_that_is_not_exactly_32_bytes_of_clean_base64_is_refused(text, why):
    with pytest.raises(ConfigError, match=why):
        load({"security.keys": f"1:{text}"})


# -- admin token -----------------------------------------------------------------------------

def test_an_admin_token_of_16_printable_ascii_characters_is_the_shortest_accepted():
    assert load({"security.admin_token": "x" * 16}).security.load_admin_token() == "x" * 16
    for token in ("x" * 15, "é" * 16, "x" * 15 + "\x7f", "x" * 8 + "\u00a0" + "x" * 8):
        with pytest.raises(ConfigError, match="at least 16 printable ASCII characters"):
            load({"security.admin_token": token}).security.load_admin_token()


# -- the environment -------------------------------------------------------------------------

def test_other_programs_relay_variables_are_skipped_and_the_rest_still_applied():
    environ = {"RELAY_FOO_BAR": "1", "RELAY_OTHER": "x", "RELAY_SERVER_TICK_RATE": "60"}
    assert load_config(None, environ=environ).server.tick_rate == 60


def test_a_number_that_does_not_parse_is_a_config_error_naming_the_variable():
    for name, value, expected in (("RELAY_SERVER_DRAIN_TIMEOUT", "soon", "a number"),
                                  ("RELAY_SERVER_UDP_PORT", "7e3", "an integer"),
                                  ("RELAY_ROOMS_AUTO_CREATE", "maybe", "true or false")):
        with pytest.raises(ConfigError, match=rf": {expected} \(from environment variable {name}\)$"):
            load_config(None, environ={name: value})
