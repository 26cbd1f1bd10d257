"""Server settings: embedded defaults, an optional TOML file, then RELAY_<SECTION>_<KEY> overrides.

Every setting is validated; an invalid one raises ConfigError naming the key, the value given
and what is allowed, and `relay serve` exits non-zero with that message.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from relay.agones import AgonesSettings

ENV_PREFIX = "RELAY_"


class ConfigError(ValueError):
    """An invalid setting; the message names the key, the value and what is allowed."""


def _check_host(key: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if value != "localhost":
            raise ConfigError(f"{key}={value!r}: an IPv4/IPv6 address or 'localhost'") from None


def _check_range(key: str, value, low, high) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key}={value!r}: allowed {low}..{high}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: allowed {', '.join(choices)}")


@dataclass
class ServerSettings:
    udp_host: str = "0.0.0.0"
    """Address the game traffic (UDP) listens on."""
    udp_port: int = 7777
    http_host: str = "127.0.0.1"
    """Address of the metrics and admin API (HTTP)."""
    http_port: int = 9100
    tick_rate: int = 30
    """Frames closed per second, for every room (10..120)."""
    log_format: str = "text"
    """text: key=value lines; json: one JSON object per line."""
    log_level: str = "info"
    drain_timeout: float = 30.0
    """SIGTERM or POST /admin/drain: running matches may finish for this long before they are
    ended with reason drain_deadline, seconds (0: end them at once)."""
    shutdown_timeout: float = 5.0
    """Longest the final shutdown (after draining) may take before the process exits anyway, seconds."""
    max_peers: int = 4096
    """Connected clients (players and spectators) across all rooms."""
    mtu: int = 1200

    def validate(self) -> None:
        _check_host("server.udp_host", self.udp_host)
        _check_host("server.http_host", self.http_host)
        _check_range("server.udp_port", self.udp_port, 0, 65535)
        _check_range("server.http_port", self.http_port, 0, 65535)
        _check_range("server.tick_rate", self.tick_rate, 10, 120)
        _check_choice("server.log_format", self.log_format, ("text", "json"))
        _check_choice("server.log_level", self.log_level, ("debug", "info", "warning", "error"))
        _check_range("server.drain_timeout", self.drain_timeout, 0.0, 86400.0)
        _check_range("server.shutdown_timeout", self.shutdown_timeout, 0.1, 300.0)
        _check_range("server.max_peers", self.max_peers, 1, 1_000_000)
        _check_range("server.mtu", self.mtu, 576, 16384)


@dataclass
class RoomSettings:
    auto_create: bool = True
    """Create a room on the first JOIN that names it (otherwise only the admin API creates rooms)."""
    max_rooms: int = 1000
    capacity: int = 8
    """Players per room (spectators do not count)."""
    start_policy: str = "players"
    """players: start when start_players have joined; ready: when that many joined and all
    sent READY; admin: only POST /rooms/{room}/start."""
    start_players: int = 2
    empty_timeout: float = 30.0
    """A room with nobody connected for this long ends, seconds."""
    allow_late_join: bool = True
    """New players may join a running room (they receive the frame history first)."""
    max_input_bytes: int = 256
    late_input_policy: str = "next"
    """An input for a frame already closed: next = put it in the open frame if the player has
    none there yet; drop = discard it. Either way it is counted."""
    max_input_lead: int = 120
    """Inputs more than this many frames ahead of the open frame are refused."""
    player_timeout: float = 10.0
    """A player silent this long is timed out; the room goes on without it, seconds."""
    reconnect_grace: float = 60.0
    """A timed-out or disconnected player may reclaim its slot within this time, seconds."""
    spectator_delay: int = 90
    """Frames spectators lag behind the live stream."""
    max_spectators: int = 16
    catchup_frames: int = 150
    """A client this many frames behind gets the missing frames as one block."""
    checksum_window: int = 600
    """Frames of checksum history kept for desync detection."""

    def validate(self) -> None:
        _check_range("rooms.max_rooms", self.max_rooms, 1, 1_000_000)
        _check_range("rooms.capacity", self.capacity, 1, 256)
        _check_choice("rooms.start_policy", self.start_policy, ("players", "ready", "admin"))
        _check_range("rooms.start_players", self.start_players, 1, self.capacity)
        _check_range("rooms.empty_timeout", self.empty_timeout, 0.0, 86400.0)
        _check_range("rooms.max_input_bytes", self.max_input_bytes, 1, 4096)
        _check_choice("rooms.late_input_policy", self.late_input_policy, ("next", "drop"))
        _check_range("rooms.max_input_lead", self.max_input_lead, 1, 10_000)
        _check_range("rooms.player_timeout", self.player_timeout, 1.0, 3600.0)
        _check_range("rooms.reconnect_grace", self.reconnect_grace, 0.0, 86400.0)
        _check_range("rooms.spectator_delay", self.spectator_delay, 0, 100_000)
        _check_range("rooms.max_spectators", self.max_spectators, 0, 10_000)
        _check_range("rooms.catchup_frames", self.catchup_frames, 2, 1_000_000)
        _check_range("rooms.checksum_window", self.checksum_window, 1, 1_000_000)
        # Every frame must fit one reliable message of the core (256 KiB): inputs plus framing.
        worst_frame = self.capacity * (self.max_input_bytes + 5) + 64
        if worst_frame > 256 * 1024:
            raise ConfigError(f"rooms.capacity={self.capacity} x rooms.max_input_bytes="
                              f"{self.max_input_bytes}: a full frame ({worst_frame} bytes) must fit "
                              f"256 KiB; lower one of them")


@dataclass
class ReplaySettings:
    enabled: bool = True
    directory: str = "replays"
    """Where replay files go; created if missing."""
    max_bytes: int = 256 * 1024 * 1024
    """Compressed size at which one replay stops growing (counted and logged)."""

    def validate(self) -> None:
        if not self.directory:
            raise ConfigError("replay.directory='': a directory path")
        _check_range("replay.max_bytes", self.max_bytes, 1024, 2**40)


@dataclass
class RelayConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    rooms: RoomSettings = field(default_factory=RoomSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    agones: AgonesSettings = field(default_factory=AgonesSettings)

    def validate(self) -> "RelayConfig":
        self.server.validate()
        self.rooms.validate()
        self.replay.validate()
        self.agones.validate()
        return self


SECTIONS = {f.name: f.type for f in dataclasses.fields(RelayConfig)}


def _coerce(key: str, raw: Any, kind: type, from_env: bool) -> Any:
    """Convert a TOML or environment value to the field's type, or explain what is expected.

    Environment variables are always strings, so only they are parsed; in TOML a quoted number
    is a mistake worth reporting."""
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if from_env and raw.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return raw.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}={raw!r}: true or false")
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if from_env:
            try:
                return int(raw)
            except ValueError:
                pass
        raise ConfigError(f"{key}={raw!r}: an integer")
    if kind is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if from_env:
            try:
                return float(raw)
            except ValueError:
                pass
        raise ConfigError(f"{key}={raw!r}: a number")
    if not isinstance(raw, str):
        raise ConfigError(f"{key}={raw!r}: a string")
    return raw


def _field_types(section_type: type) -> dict[str, type]:
    names = {"bool": bool, "int": int, "float": float, "str": str}
    return {f.name: names[f.type] if isinstance(f.type, str) else f.type
            for f in dataclasses.fields(section_type)}


def _apply(config: RelayConfig, section: str, key: str, raw: Any, from_env: bool = False) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"[{section}]: unknown section; allowed {', '.join(SECTIONS)}")
    target = getattr(config, section)
    types = _field_types(type(target))
    if key not in types:
        raise ConfigError(f"{section}.{key}={raw!r}: unknown setting; allowed {', '.join(types)}")
    setattr(target, key, _coerce(f"{section}.{key}", raw, types[key], from_env))


def load_config(path: Optional[str | Path] = None,
                environ: Optional[Mapping[str, str]] = None) -> RelayConfig:
    """Defaults, then the TOML file (if any), then RELAY_<SECTION>_<KEY> variables; validated."""
    config = RelayConfig()
    if path is not None:
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from None
        for section, values in document.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{section}: expected a [{section}] table")
            for key, raw in values.items():
                _apply(config, section, key, raw)
    from_env: dict[str, str] = {}
    for name, raw in (os.environ if environ is None else environ).items():
        if not name.startswith(ENV_PREFIX) or name in ("RELAY_CONFIG",):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        section, _, key = rest.partition("_")
        if section not in SECTIONS:
            continue        # another program's RELAY_* variable
        try:
            _apply(config, section, key, raw, from_env=True)
        except ConfigError as error:
            raise ConfigError(f"{error} (from environment variable {name})") from None
        from_env[f"{section}.{key}"] = name
    try:
        return config.validate()
    except ConfigError as error:
        key = str(error).split("=", 1)[0]
        if key in from_env:
            raise ConfigError(f"{error} (from environment variable {from_env[key]})") from None
        raise


def describe(config: RelayConfig) -> dict:
    """The effective settings as a plain dict (logged at start-up)."""
    return dataclasses.asdict(config)
