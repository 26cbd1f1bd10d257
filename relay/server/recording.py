"""Which matches are being recorded, and the replay directory's disk budget.

The server hands the recorder the room events it observes: a match's file opens when the room
starts (``replay.enabled``), takes every frame, checksum and desync, and closes when the room
ends. The file format is relay.replay's; this module only decides which files exist. A failing
disk ends a recording, never the match.

File names: ``<room>-<UTC start, ms>-<hash>.replay``, e.g.
``m_X-20261126T142233.123Z-55afcb6d.replay``: the room id with every character but
``A-Za-z0-9_.-`` replaced by ``_`` (cut to SLUG_LENGTH), then the first 8 hex digits of the
BLAKE2b hash of the exact room id, so rooms the slug confuses (``m/X``, ``m_X``) get different
files. A file is created exclusively: an existing one is never overwritten (``-2``, ``-3``, ...
are tried). The header holds the exact room id.
"""
from __future__ import annotations

import errno
import hashlib
import re
import tempfile
import time
from pathlib import Path

import relay
from relay.config import ReplaySettings
from relay.replay import ReplayWriter, enforce_disk_cap

_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]")
SLUG_LENGTH = 48
"""Characters of the room id kept in a replay's file name (the hash tells longer ids apart)."""
NAME_ATTEMPTS = 100


def replay_file_stem(room_id: str, started: float) -> str:
    """``<slug>-<UTC time>-<hash>``: readable, and unique per room id and millisecond."""
    slug = _UNSAFE_IN_NAME.sub("_", room_id)[:SLUG_LENGTH]
    digest = hashlib.blake2b(room_id.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    return f"{slug}-{stamp}.{int(started * 1000) % 1000:03d}Z-{digest}"


def check_replay_directory(settings: ReplaySettings) -> Path | None:
    """Create the replay directory if missing and prove it writable by writing a file there;
    the absolute path (None when replays are off). Raises OSError (the message names the path)
    at start-up, instead of the first match failing to record."""
    if not settings.enabled:
        return None
    directory = Path(settings.directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory")
    # Permission bits do not tell (root, ACLs, read-only mounts): try it.
    with tempfile.TemporaryFile(prefix=".relay-write-check-", dir=directory):
        pass
    return directory


class ReplayRecorder:
    def __init__(self, settings: ReplaySettings, tick_rate: int, metrics, log, limit_log):
        self.settings = settings
        self.tick_rate = tick_rate
        self.metrics = metrics
        self.log = log
        self.limit_log = limit_log
        self.writers: dict[str, ReplayWriter] = {}
        """room id -> the open recording of its match."""

    def open(self, room_id: str, players: list) -> None:
        settings = self.settings
        if not settings.enabled:
            return
        directory = Path(settings.directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if settings.max_disk_bytes and self._enforce_disk_cap() >= settings.max_disk_bytes:
                # Only the matches being recorded are left, and they fill the budget.
                self.metrics.replay_disk.labels(action="not_recorded").inc()
                self.limit_log("limit_reached", "replay_max_disk_bytes", room=room_id,
                               limit=settings.max_disk_bytes, detail="match not recorded")
                return
            stem = replay_file_stem(room_id, time.time())
            for attempt in range(1, NAME_ATTEMPTS + 1):
                suffix = "" if attempt == 1 else f"-{attempt}"
                try:
                    self.writers[room_id] = ReplayWriter(
                        directory / f"{stem}{suffix}.replay", room=room_id,
                        tick_rate=self.tick_rate, players=players,
                        relay_version=relay.__version__, max_bytes=settings.max_bytes,
                        flush_interval=settings.flush_interval, fsync=settings.fsync,
                        fsync_interval=settings.fsync_interval)
                    break
                except FileExistsError:
                    if attempt == NAME_ATTEMPTS:
                        raise
        except OSError as error:
            # Once per interval and kind, counted: a lasting fault (EMFILE, a read-only or full
            # disk) must not write a line per match.
            kind = errno.errorcode.get(error.errno or 0, type(error).__name__)
            self.limit_log("replay_open_failed", f"replay_open_{kind}", room=room_id,
                           error=str(error))

    def frame(self, room_id: str, number: int, data: bytes) -> None:
        writer = self.writers.get(room_id)
        if writer is None:
            return
        before = writer.bytes_written
        try:
            writer.append_frame(number, data)
        except (OSError, ValueError) as error:
            self._failed(room_id, error)
            return
        self.metrics.replay_bytes.inc(writer.bytes_written - before)

    def checksum(self, room_id: str, frame: int, slot: int, player: str, value: int) -> None:
        """Every player's checksum history goes into the replay (relay replay desync)."""
        writer = self.writers.get(room_id)
        if writer is not None:
            try:
                writer.append_checksum(frame, slot, player, value)
            except (OSError, ValueError) as error:
                self._failed(room_id, error)

    def event(self, room_id: str, frame: int, kind: str, detail: dict) -> None:
        writer = self.writers.get(room_id)
        if writer is not None:
            writer.append_event(frame, kind, detail)

    def _failed(self, room_id: str, error: Exception) -> None:
        # A full disk ends the replay, never the match.
        self.writers.pop(room_id, None)
        self.log.error("replay_write_failed", room=room_id, error=str(error))

    def close(self, room_id: str, reason: str) -> None:
        writer = self.writers.pop(room_id, None)
        if writer is not None:
            writer.close(reason)
            self.log.info("replay_closed", room=room_id, frames=writer.frames,
                          bytes=writer.bytes_written, truncated=writer.truncated)

    def close_all(self, reason: str) -> None:
        for room_id in list(self.writers):
            self.close(room_id, reason)

    def _enforce_disk_cap(self) -> int:
        """Delete the oldest finished replays past replay.max_disk_bytes; the bytes in use after."""
        settings = self.settings
        usage = enforce_disk_cap(settings.directory, settings.max_disk_bytes,
                                 {writer.path: writer.bytes_written for writer in self.writers.values()})
        for path, size in usage.deleted:
            self.metrics.replay_disk.labels(action="deleted").inc()
            self.log.info("replay_deleted", path=str(path), bytes=size,
                          reason="replay.max_disk_bytes", limit=settings.max_disk_bytes)
        return usage.total

    def check_disk(self) -> None:
        """Once a second: keep the replays within replay.max_disk_bytes. When the matches being
        recorded alone exceed it, the newest recordings stop (their files close cleanly and then
        count as finished, oldest deleted first)."""
        limit = self.settings.max_disk_bytes
        if not (limit and self.settings.enabled) or self._enforce_disk_cap() <= limit:
            return
        live = sum(writer.bytes_written for writer in self.writers.values())
        for room_id in reversed(list(self.writers)):      # newest first
            if live <= limit:
                break
            live -= self.writers[room_id].bytes_written
            self.close(room_id, "disk_cap")
            self.metrics.replay_disk.labels(action="stopped").inc()
            self.log.warning("limit_reached", reason="replay_max_disk_bytes", room=room_id,
                             limit=limit, detail="recording stopped")
        self._enforce_disk_cap()
