"""Replay files: a match's frame stream, appended as the match runs.

``ReplayWriter`` appends each FRAME message the relay broadcasts (plus notable events) to one file
per match; ``ReplayReader`` reads it back, streaming; ``summarize`` / ``relay replay inspect FILE``
report what a file holds. Only msgpack and zlib are used, so a replay is easy to read from any
language.

File format (version 2)
=======================

A replay file is::

    magic     the 10 bytes b"RLREPLAY2\\n" (hex 52 4C 52 45 50 4C 41 59 32 0A); the digit before the
              newline is the format version
    stream    from offset 10 to the end of the file: exactly one zlib stream (RFC 1950: 2-byte
              zlib header, raw DEFLATE data (RFC 1951), 4-byte big-endian Adler-32 of the
              uncompressed data), as made by ``zlib.compressobj()`` with default parameters
              (level 6, 32 KiB window). Nothing follows the stream.

The uncompressed stream is a plain concatenation of msgpack objects ("records") with no length
prefixes or separators: decode one msgpack object after another until the data ends. Every
record is a msgpack map with string keys; strings use the msgpack str family (UTF-8), binary data
the bin family (``use_bin_type=True``). The key ``"t"`` names the record type:

    header  {"t": "header", "version": 2, "room": str, "tick_rate": int (frames per second),
             "started_at": float (unix time, seconds), "players": [str or nil, ...] (player name
             by slot when the match started), "relay_version": str}
            Always the first record, exactly once.
    frame   {"t": "frame", "n": int, "data": bin}
            ``data`` is the exact FRAME message the relay sent to clients: the compact layout of
            docs/RELAY_PROTOCOL.md section 7.1 (first byte C1), which may refer to the previous
            frame's inputs, so decode frames in order (``relay.protocol.FrameDecoder``). ``n``
            equals the frame number; frame records are consecutive, starting at 0.
    checksum {"t": "checksum", "n": int (the frame), "slot": int, "player": str, "value": int}
            A player's CHECKSUM as the relay kept it (the first per slot and frame, within
            ``rooms.checksum_window``), written when it arrives; ``value`` is the 64-bit
            integer the client sent. ``relay replay desync`` builds checksum histories from them.
    event   {"t": "event", "n": int (the frame it happened at), "kind": str, "detail": map}
            Things worth keeping next to the frames: "desync" (detail: frame, checksums by
            player, minority), admin actions, and "truncated" (see below).
    end     {"t": "end", "frames": int (frame records in the file), "reason": str (at most 64
             bytes of UTF-8), "ended_at": float (unix time)}
            Written by a clean close only; it is the last record.

Readers must ignore map keys they do not know and skip records whose ``"t"`` they do not know
(later versions may add both without changing the magic).

Version 1 differs only in its magic (``RLREPLAY1``), header version 1, frame data in the older
msgpack FRAME layout ``[30, number, inputs, events]``, and no checksum records; this module
reads both versions.

Sync points and crashes. The writer makes a zlib ``Z_SYNC_FLUSH`` after the header, after
every ``sync_every`` frames, when a frame is appended and the oldest data not yet flushed would
be older than ``flush_interval`` by the next frame, after each event and on ``flush()``. A
sync flush ends the current DEFLATE block and appends an empty stored block (the bytes
00 00 FF FF after byte alignment), so all data before that point can be decompressed without
anything that follows. ``close()`` writes the
end record and finishes the stream (``Z_FINISH``: final block plus the Adler-32). A file whose
writer crashed (or is still running) therefore ends somewhere after a sync point: inflate what is
there, decode complete records, and drop the incomplete record at the tail; there is no end
record and no Adler-32. A file is complete when it has an end record and the zlib stream ends
with a correct Adler-32.

Size cap (``max_bytes``). Once writing a frame could make the file larger than ``max_bytes``
(counting the room kept for the closing records), that frame and all later frames and events
are dropped, and one event ``{"t": "event", "n": first dropped frame, "kind": "truncated",
"detail": {"max_bytes": int, "bytes_written": int}}`` is written instead; the file still closes
cleanly with an end record whose "frames" counts the frames kept. The file never exceeds
``max_bytes`` unless the cap is too small for even the header and closing records (a few hundred
bytes), in which case the file holds just those.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generator, Iterator, Optional

import msgpack

from relay.exits import run_command
from relay.protocol import FRAME, Frame, FrameDecoder, ProtocolError

MAGIC = b"RLREPLAY2\n"
MAGIC_PREFIX = b"RLREPLAY"
FORMAT_VERSION = 2
READABLE_VERSIONS = {b"RLREPLAY1\n": 1, MAGIC: 2}

MAX_REASON_BYTES = 64
"""End reasons are cut to this many bytes of UTF-8 (keeps the closing records' size bounded)."""
MAX_RECORD_BYTES = 16 * 1024 * 1024
"""The writer refuses a single frame or event larger than this (packed)."""

_READ_CHUNK = 64 * 1024
_INFLATE_CHUNK = 256 * 1024           # bounded output per inflate step (no zip bombs in memory)
_UNPACK_BUFFER = MAX_RECORD_BYTES + 2 * _INFLATE_CHUNK
_WORST_INT = 2**64 - 1                 # packs as large as any msgpack integer


class ReplayError(ValueError):
    """A file that is missing, not a replay, of an unsupported version, or corrupt."""


def _pack(record: dict) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def _compressed_bound(raw: int) -> int:
    """Most bytes deflate can emit for ``raw`` input bytes up to and including one sync or
    finish flush (block headers, flush marker, Adler-32), with room to spare. Only applied to
    the data since the last sync point, so being generous costs next to nothing."""
    return raw + (raw >> 4) + 64


def _clip_reason(reason: str) -> str:
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a string, not {type(reason).__name__}")
    return reason.encode("utf-8", "replace")[:MAX_REASON_BYTES].decode("utf-8", "ignore")


# -- writing ----------------------------------------------------------------------------------

FSYNC_POLICIES = ("never", "interval", "always")

_fsync_pool: Optional[ThreadPoolExecutor] = None


def _background_fsync(fd: int) -> Future:
    """fsync a duplicate of ``fd`` in the replay fsync thread and close it: the writer may
    close its own descriptor meanwhile (never fsyncing a reused number). OSError if the
    descriptor cannot be duplicated."""
    global _fsync_pool
    if _fsync_pool is None:
        _fsync_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-fsync")
    duplicate = os.dup(fd)

    def sync() -> None:
        try:
            os.fsync(duplicate)
        finally:
            os.close(duplicate)

    try:
        return _fsync_pool.submit(sync)
    except BaseException:
        os.close(duplicate)
        raise


class ReplayWriter:
    """Appends one match to a new replay file (see the module docstring for the format).

    The file is created exclusively: an existing file is never overwritten (FileExistsError).
    Not thread-safe; calls are cheap (one msgpack pack and one zlib compress per record) except
    the periodic sync flush, which also writes to the OS.

    Durability: with ``flush_interval`` (seconds), appending a frame flushes when the oldest
    data not yet flushed would be older than that by the next frame (at ``tick_rate``), so a
    killed process loses at most ``flush_interval`` of the match (the kernel keeps what was
    written). ``fsync`` says when the data is forced to disk (power loss, kernel crash):
    "never"; "always" = at every flush and at close, in the calling thread (it waits for the
    disk); "interval" = at most every ``fsync_interval`` seconds and at close, in a background
    thread (nobody waits; a failure is counted in ``fsync_errors``).

    Usable as a context manager: leaving the block closes the writer with reason "ended", or
    "error" if an exception is propagating.
    """

    def __init__(self, path, *, room: str, tick_rate: int, players: list[Optional[str]],
                 relay_version: str, sync_every: int = 30, max_bytes: Optional[int] = None,
                 flush_interval: Optional[float] = None, fsync: str = "never",
                 fsync_interval: float = 1.0, clock=time.monotonic):
        if not isinstance(room, str):
            raise TypeError("room must be a string")
        if not isinstance(tick_rate, int) or isinstance(tick_rate, bool) or tick_rate < 1:
            raise ValueError(f"tick_rate must be a positive integer, not {tick_rate!r}")
        players = list(players)
        if not all(player is None or isinstance(player, str) for player in players):
            raise TypeError("players must be names (str) or None for an empty slot")
        if not isinstance(relay_version, str):
            raise TypeError("relay_version must be a string")
        if not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"sync_every must be a positive integer, not {sync_every!r}")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"max_bytes must be a positive integer or None, not {max_bytes!r}")

        if flush_interval is not None and not flush_interval >= 0:
            raise ValueError(f"flush_interval must be >= 0 or None, not {flush_interval!r}")
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")

        self.path = os.fspath(path)
        self.sync_every = sync_every
        self.flush_interval = flush_interval
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self._clock = clock
        # Flush when the oldest unflushed data is this old: waiting for the next frame would be
        # too late (with half a tick to spare for a tick that runs late).
        self._flush_age = None if flush_interval is None else flush_interval - 1.5 / tick_rate
        self._unflushed_since: Optional[float] = None
        self._last_fsync = clock()
        self._fsync_pending: Optional[Future] = None
        self.fsyncs = 0
        """fsyncs made or handed to the background thread."""
        self.fsync_errors = 0
        """fsyncs that failed (in the background thread: counted here, nothing raised)."""
        self.max_bytes = max_bytes
        self.header = {"t": "header", "version": FORMAT_VERSION, "room": room,
                       "tick_rate": tick_rate, "started_at": time.time(), "players": players,
                       "relay_version": relay_version}
        self._next = 0                 # the frame number append_frame expects next
        self._frames = 0               # frame records written
        self._since_sync = 0           # frames fed since the last sync flush
        self._pending_raw = 0          # uncompressed bytes fed since the last sync flush
        self._bytes_written = 0
        self._truncated = False
        self._closed = False
        self.dropped_frames = 0
        """Frames not written because of max_bytes."""
        self.dropped_events = 0
        """Events not written because of max_bytes."""
        # Room kept for the records that close a capped file: the "truncated" event and the end.
        truncated = _pack(self._truncated_record(_WORST_INT))
        end = _pack({"t": "end", "frames": _WORST_INT, "reason": "x" * MAX_REASON_BYTES,
                     "ended_at": time.time()})
        self._reserve = _compressed_bound(len(truncated)) + _compressed_bound(len(end))

        self._compressor = zlib.compressobj()
        self._file = open(self.path, "xb")
        try:
            self._emit(MAGIC)
            header = _pack(self.header)
            self._feed(header)
            if max_bytes is not None and not self._fits(0):
                # Too small a cap for anything but the header and the closing records.
                self._truncate()
            self.flush()
        except BaseException:
            self._fail()
            raise

    # -- public API -----------------------------------------------------------------------------

    @property
    def bytes_written(self) -> int:
        """Bytes handed to the file so far (the magic included); the file's size after a flush.
        Data the compressor still buffers is not counted until it comes out."""
        return self._bytes_written

    @property
    def frames(self) -> int:
        """Frame records written to the file (frames dropped by max_bytes are not counted)."""
        return self._frames

    @property
    def truncated(self) -> bool:
        """True once max_bytes stopped the file from growing."""
        return self._truncated

    @property
    def closed(self) -> bool:
        return self._closed

    def append_frame(self, number: int, data: bytes) -> None:
        """Append the FRAME message ``data`` for frame ``number``; frame numbers must run 0, 1,
        2, ... without gaps (ValueError otherwise, and nothing is written)."""
        self._check_open()
        if not isinstance(number, int) or isinstance(number, bool):
            raise TypeError(f"frame number must be an int, not {type(number).__name__}")
        if number != self._next:
            raise ValueError(f"replay frames must be consecutive: expected frame {self._next}, "
                             f"got {number}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"frame data must be bytes, not {type(data).__name__}")
        if self._truncated:
            self._next += 1
            self.dropped_frames += 1
            return
        record = self._record({"t": "frame", "n": number, "data": bytes(data)})
        if not self._make_room(len(record)):
            self._next += 1
            self.dropped_frames += 1
            return
        self._feed(record)
        self._next += 1
        self._frames += 1
        self._since_sync += 1
        if self._since_sync >= self.sync_every or (
                self._flush_age is not None and self._unflushed_since is not None
                and self._clock() - self._unflushed_since >= self._flush_age):
            self.flush()

    def append_event(self, frame: int, kind: str, detail: dict) -> None:
        """Record an event (desync report, admin action, ...) at ``frame``; ``detail`` must be
        msgpack-serializable (TypeError otherwise, and nothing is written). Events are flushed at
        once, so a crash right after one keeps it."""
        self._check_open()
        if not isinstance(frame, int) or isinstance(frame, bool) or frame < 0:
            raise ValueError(f"event frame must be a non-negative int, not {frame!r}")
        if not isinstance(kind, str) or not kind:
            raise ValueError("event kind must be a non-empty string")
        if not isinstance(detail, dict):
            raise TypeError(f"event detail must be a dict, not {type(detail).__name__}")
        if self._truncated:
            self.dropped_events += 1
            return
        record = self._record({"t": "event", "n": frame, "kind": kind, "detail": detail})
        if not self._make_room(len(record)):
            self.dropped_events += 1
            return
        self._feed(record)
        self.flush()

    def append_checksum(self, frame: int, slot: int, player: str, value: int) -> None:
        """Record a player's checksum for ``frame`` (synced with the frames, not at once)."""
        self._check_open()
        if not isinstance(frame, int) or isinstance(frame, bool) or frame < 0:
            raise ValueError(f"checksum frame must be a non-negative int, not {frame!r}")
        if not isinstance(value, int) or not -2**63 <= value < 2**64:
            raise ValueError(f"checksum value must be a 64-bit integer, not {value!r}")
        if self._truncated:
            self.dropped_events += 1
            return
        record = self._record({"t": "checksum", "n": frame, "slot": slot, "player": player,
                               "value": value})
        if not self._make_room(len(record)):
            self.dropped_events += 1
            return
        self._feed(record)

    def flush(self) -> None:
        """Make everything appended so far readable from the file: a zlib sync flush and a flush
        of the file object to the OS, then an fsync as the ``fsync`` policy says. Done
        automatically every ``sync_every`` frames and by ``flush_interval``. A no-op once
        closed."""
        if self._closed:
            return
        if self._pending_raw:
            self._emit(self._compressor.flush(zlib.Z_SYNC_FLUSH))
        self._pending_raw = 0
        self._since_sync = 0
        self._unflushed_since = None
        try:
            self._file.flush()
            if self.fsync == "always":
                self._sync_now()
        except OSError:
            self._fail()
            raise
        if self.fsync == "interval" and self._clock() - self._last_fsync >= self.fsync_interval:
            self._sync_in_background()

    def _sync_now(self) -> None:
        self.fsyncs += 1
        try:
            os.fsync(self._file.fileno())
        except OSError:
            self.fsync_errors += 1
            raise

    def _sync_in_background(self) -> None:
        pending = self._fsync_pending
        if pending is not None and not pending.done():
            return                      # a slow disk: one fsync in flight per file is enough
        self._last_fsync = self._clock()
        try:
            future = _background_fsync(self._file.fileno())
        except (OSError, RuntimeError):     # no descriptor to spare, interpreter shutting down
            self.fsync_errors += 1
            return
        self.fsyncs += 1
        self._fsync_pending = future
        future.add_done_callback(self._fsync_done)

    def _fsync_done(self, future: Future) -> None:
        if future.cancelled() or future.exception() is not None:
            self.fsync_errors += 1

    def close(self, reason: str = "ended") -> None:
        """Write the end record, finish the zlib stream and close the file. Idempotent: later
        calls do nothing. ``reason`` is cut to MAX_REASON_BYTES bytes of UTF-8."""
        if self._closed:
            return
        reason = _clip_reason(reason)
        self._closed = True
        try:
            self._feed(_pack({"t": "end", "frames": self._frames, "reason": reason,
                              "ended_at": time.time()}))
            self._emit(self._compressor.flush(zlib.Z_FINISH))
            self._pending_raw = 0
            if self.fsync != "never" and not self._file.closed:
                self._file.flush()
                if self.fsync == "always":
                    self._sync_now()
                else:
                    self._fsync_pending = None      # the last one is never skipped
                    self._sync_in_background()
        finally:
            self._file.close()      # a no-op if a failed write closed it already

    def __enter__(self) -> "ReplayWriter":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close("ended" if kind is None else "error")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"<ReplayWriter {self.path!r} {state} frames={self._frames} "
                f"bytes={self._bytes_written}{' truncated' if self._truncated else ''}>")

    # -- internals ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"replay writer for {self.path!r} is closed")

    @staticmethod
    def _record(record: dict) -> bytes:
        packed = _pack(record)          # raises TypeError before anything reaches the stream
        if len(packed) > MAX_RECORD_BYTES:
            raise ValueError(f"replay record of {len(packed)} bytes exceeds "
                             f"{MAX_RECORD_BYTES} bytes")
        return packed

    def _emit(self, data: bytes) -> None:
        if data:
            try:
                self._file.write(data)
            except OSError:
                self._fail()
                raise
            self._bytes_written += len(data)

    def _fail(self) -> None:
        """A write failed (disk full, ...): the stream has a hole, so stop writing for good;
        later appends raise ValueError (closed). The file reads back up to the last sync point."""
        self._closed = True
        try:
            self._file.close()
        except OSError:
            pass

    def _feed(self, record: bytes) -> None:
        if self._unflushed_since is None:
            self._unflushed_since = self._clock()
        self._pending_raw += len(record)
        self._emit(self._compressor.compress(record))

    def _fits(self, extra_raw: int) -> bool:
        """Whether ``extra_raw`` more uncompressed bytes surely fit under max_bytes, leaving
        room for the closing records."""
        return self.max_bytes is None or (self._bytes_written + _compressed_bound(self._pending_raw + extra_raw)
                + self._reserve <= self.max_bytes)

    def _make_room(self, size: int) -> bool:
        """True if a record of ``size`` bytes may be written; otherwise truncate the file."""
        if self.max_bytes is None or self._fits(size):
            return True
        if self._pending_raw:
            self.flush()                # exact accounting instead of the worst-case bound
            if self._fits(size):
                return True
        self._truncate()
        return False

    @staticmethod
    def _truncated_record(first_dropped: int, max_bytes: int = _WORST_INT,
                          bytes_written: int = _WORST_INT) -> dict:
        return {"t": "event", "n": first_dropped, "kind": "truncated",
                "detail": {"max_bytes": max_bytes, "bytes_written": bytes_written}}

    def _truncate(self) -> None:
        self._truncated = True
        assert self.max_bytes is not None       # only a capped writer truncates
        self._feed(_pack(self._truncated_record(self._next, self.max_bytes,
                                                self._bytes_written)))
        self.flush()


# -- disk budget ------------------------------------------------------------------------------

REPLAY_SUFFIX = ".replay"


@dataclass
class DiskUsage:
    """The *.replay files of a directory after enforce_disk_cap."""

    finished_bytes: int
    """Bytes of the files no writer of ours has open."""
    live_bytes: int
    """Bytes the open writers have written."""
    deleted: list = field(default_factory=list)
    """(path, bytes) of each file deleted, oldest first."""

    @property
    def total(self) -> int:
        return self.finished_bytes + self.live_bytes


def enforce_disk_cap(directory, max_disk_bytes: int, live: dict) -> DiskUsage:
    """Delete the oldest finished replays in ``directory`` (by modification time) until the
    *.replay files fit ``max_disk_bytes``. ``live`` maps the paths of replays being written to
    their bytes written; those are never deleted. Other files are neither counted nor touched.
    A file that cannot be deleted is skipped (it still counts)."""
    live = {os.path.abspath(path): size for path, size in live.items()}
    finished = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        if not entry.name.endswith(REPLAY_SUFFIX) or os.path.abspath(entry.path) in live:
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        finished.append((stat.st_mtime, entry.name, entry.path, stat.st_size))
    finished.sort()
    usage = DiskUsage(sum(item[3] for item in finished), sum(live.values()))
    for _mtime, _name, path, size in finished:
        if usage.total <= max_disk_bytes:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass                    # gone already: it no longer takes room
        except OSError:
            continue
        usage.finished_bytes -= size
        usage.deleted.append((path, size))
    return usage


# -- reading ----------------------------------------------------------------------------------

class _Pass:
    """What one sequential read of the file found besides the frames."""

    def __init__(self) -> None:
        self.header: Optional[dict] = None
        self.events: list[dict] = []
        self.checksums: list[dict] = []
        self.end: Optional[dict] = None
        self.frames = 0
        self.raw_bytes = 0
        self.problem: Optional[str] = None


def _open(path: str):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise ReplayError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ReplayError(f"{path}: is a directory, not a replay file") from None
    except OSError as error:
        raise ReplayError(f"{path}: cannot open: {error.strerror or error}") from None


def _check_magic(path: str, magic: bytes) -> int:
    """The format version the magic names (ReplayError if it is not one this module reads)."""
    if magic in READABLE_VERSIONS:
        return READABLE_VERSIONS[magic]
    if not magic:
        raise ReplayError(f"{path}: empty file, not a replay")
    if magic.startswith(MAGIC_PREFIX) and len(magic) == len(MAGIC) and magic.endswith(b"\n"):
        version = magic[len(MAGIC_PREFIX):-1].decode("ascii", "replace")
        raise ReplayError(f"{path}: replay format version {version} is not supported "
                          f"(this relay reads versions 1 and {FORMAT_VERSION})")
    if MAGIC.startswith(magic):
        raise ReplayError(f"{path}: truncated replay file ({len(magic)} bytes, no header)")
    raise ReplayError(f"{path}: not a relay replay file (it starts with {magic[:10]!r}, "
                      f"expected {MAGIC!r})")


def _describe_position(state: _Pass) -> str:
    return f"after frame {state.frames - 1}" if state.frames else "before the first frame"


class _Inflater:
    """Streams the decompressed bytes of the zlib stream in ``file``, in bounded pieces."""

    def __init__(self, file):
        self.file = file
        self.inflater = zlib.decompressobj()
        self.error: Optional[zlib.error] = None

    @property
    def eof(self) -> bool:
        return self.inflater.eof

    def pieces(self) -> Iterator[bytes]:
        """Stops at the end of the stream, the end of the file, or corrupt data (``error``)."""
        while not self.inflater.eof:
            chunk = self.file.read(_READ_CHUNK)
            if not chunk:
                return
            backup = self.inflater.copy()
            delivered = 0
            data = chunk
            try:
                while data and not self.inflater.eof:
                    out = self.inflater.decompress(data, _INFLATE_CHUNK)
                    data = self.inflater.unconsumed_tail
                    if out:
                        delivered += len(out)
                        yield out
            except zlib.error as error:
                self.error = error
                # zlib drops the output of a call that fails: inflate the chunk again a byte at
                # a time to recover everything before the bad byte.
                self.inflater = backup
                for index in range(len(chunk)):
                    try:
                        out = self.inflater.decompress(chunk[index:index + 1])
                    except zlib.error:
                        return
                    if delivered >= len(out):
                        delivered -= len(out)
                    else:
                        yield out[delivered:]
                        delivered = 0
                return

    def trailing(self) -> int:
        """Bytes after the end of the stream (0 unless the file has extra data)."""
        return len(self.inflater.unused_data) + len(self.file.read(_READ_CHUNK))


def _read_records(file, state: _Pass) -> Generator[Any, None, None]:
    """Yield the records of the zlib stream that follows the magic, streaming. Stops quietly at
    a truncated tail or at corrupt data, saying why in ``state.problem``."""
    inflater = _Inflater(file)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=_UNPACK_BUFFER)
    for piece in inflater.pieces():
        state.raw_bytes += len(piece)
        try:
            unpacker.feed(piece)
            yield from unpacker
        except Exception as error:  # msgpack raises several unrelated types for bad data
            state.problem = (f"corrupt record {_describe_position(state)}: "
                             f"{type(error).__name__}: {error}")
            return
    if inflater.error is not None:
        state.problem = f"corrupt compressed data {_describe_position(state)}: {inflater.error}"
    elif not inflater.eof:
        partial = state.raw_bytes - unpacker.tell()
        tail = f", {partial} bytes of an incomplete record dropped" if partial else ""
        state.problem = (f"not closed cleanly: the file ends {_describe_position(state)} "
                         f"(writer crashed or still running{tail})")
    elif state.raw_bytes != unpacker.tell():
        state.problem = "corrupt replay: the compressed stream ends inside a record"
    elif inflater.trailing():
        state.problem = "unexpected data after the end of the compressed stream"


class ReplayReader:
    """Reads a replay file (see the module docstring for the format).

    The constructor checks the magic and reads the header; ``frames()`` streams the frames
    (every call reads the file again, holding one chunk at a time). ``events()``, ``end``,
    ``complete``, ``problem``, ``frame_count`` and ``raw_bytes`` need a read of the whole file:
    done on first use, or for free when a ``frames()`` iteration runs to the end.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        state = _Pass()
        with _open(self.path) as file:
            self.version = _check_magic(self.path, file.read(len(MAGIC)))
            records = _read_records(file, state)
            try:
                first = next(records, None)
            finally:
                records.close()
        if first is None:
            why = state.problem or "no records"
            if why.startswith("not closed"):
                why = "the file ends before the header record is complete"
            raise ReplayError(f"{self.path}: not a readable replay: {why}")
        self.header: dict = self._check_header(first)
        self._scan: Optional[_Pass] = None

    def _check_header(self, record: Any) -> dict:
        if not isinstance(record, dict) or record.get("t") != "header":
            raise ReplayError(f"{self.path}: corrupt replay: the first record is not a header")
        version = record.get("version")
        if version != self.version:
            raise ReplayError(f"{self.path}: replay header version {version!r} does not match "
                              f"the file's magic (version {self.version})")
        expected: dict[str, type | tuple[type, ...]] = {
            "room": str, "tick_rate": int, "players": list, "started_at": (int, float), "relay_version": str}
        for key, kind in expected.items():
            if not isinstance(record.get(key), kind):
                raise ReplayError(f"{self.path}: corrupt replay header: {key!r} is missing or "
                                  f"has the wrong type")
        if record["tick_rate"] < 1:
            raise ReplayError(f"{self.path}: corrupt replay header: tick_rate "
                              f"{record['tick_rate']} is not positive")
        return record

    def _walk(self, state: _Pass) -> Iterator[tuple[int, bytes]]:
        """One read of the file: yields frames, collects everything else into ``state``."""
        with _open(self.path) as file:
            _check_magic(self.path, file.read(len(MAGIC)))
            for record in _read_records(file, state):
                kind = record.get("t") if isinstance(record, dict) else None
                if state.header is None:
                    if kind != "header":
                        state.problem = "corrupt replay: the first record is not a header"
                        return
                    state.header = record
                elif state.end is not None:
                    continue            # nothing belongs after the end record; keep verifying
                elif kind == "frame":
                    number, data = record.get("n"), record.get("data")
                    if number != state.frames or not isinstance(data, bytes):
                        state.problem = (f"corrupt frame record {_describe_position(state)} "
                                         f"(n={number!r})")
                        return
                    state.frames += 1
                    yield number, data
                elif kind == "event":
                    if not isinstance(record.get("kind"), str):
                        state.problem = f"corrupt event record {_describe_position(state)}"
                        return
                    state.events.append(record)
                elif kind == "checksum":
                    if not (isinstance(record.get("n"), int) and isinstance(record.get("value"), int)
                            and isinstance(record.get("player"), str)):
                        state.problem = f"corrupt checksum record {_describe_position(state)}"
                        return
                    state.checksums.append(record)
                elif kind == "end":
                    state.end = record
                elif not isinstance(kind, str):
                    state.problem = f"corrupt record {_describe_position(state)}: not a typed map"
                    return
                # else: a record type from a later version; skipped

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """Yield ``(frame number, FRAME message bytes)`` in order, streaming. Stops without an
        exception at a truncated or corrupt tail (``problem`` then says why)."""
        state = _Pass()
        yield from self._walk(state)
        if self._scan is None:
            self._scan = state

    def _scanned(self) -> _Pass:
        if self._scan is None:
            state = _Pass()
            for _ in self._walk(state):
                pass
            self._scan = state
        return self._scan

    def events(self) -> list[dict]:
        """The event records (maps with "t", "n", "kind", "detail"), in file order."""
        return list(self._scanned().events)

    def checksums(self) -> list[dict]:
        """The checksum records (maps with "t", "n", "slot", "player", "value"), in file order."""
        return list(self._scanned().checksums)

    def decoded_frames(self) -> Iterator[Frame]:
        """The frames decoded in order, as a live client sees them; stops at the first frame
        that does not decode (ProtocolError)."""
        decode = FrameDecoder().decode if self.version >= 2 else _decode_v1_frame
        for _number, data in self.frames():
            yield decode(data)

    @property
    def end(self) -> Optional[dict]:
        """The end record, or None if the file was not closed cleanly."""
        return self._scanned().end

    @property
    def problem(self) -> Optional[str]:
        """Why the file is not complete (truncated tail, corrupt data), or None."""
        state = self._scanned()
        if state.problem is None and state.end is None:
            return "the stream ends without an end record"
        return state.problem

    @property
    def complete(self) -> bool:
        """True if the file was closed cleanly and reads back intact (checksum included)."""
        state = self._scanned()
        return state.end is not None and state.problem is None

    @property
    def frame_count(self) -> int:
        """Readable frame records in the file."""
        return self._scanned().frames

    @property
    def raw_bytes(self) -> int:
        """Uncompressed size of the readable records."""
        return self._scanned().raw_bytes


def _decode_v1_frame(data: bytes) -> Frame:
    """A version-1 replay's frame: the msgpack FRAME ``[30, number, inputs, events]``."""
    try:
        kind, number, inputs, events = msgpack.unpackb(data, raw=False)[:4]
    except Exception as error:   # msgpack raises several unrelated types for bad input
        raise ProtocolError("malformed", f"bad version-1 frame: {error}") from None
    if kind != FRAME or not isinstance(number, int) or not isinstance(inputs, list):
        raise ProtocolError("malformed", "bad version-1 frame")
    return Frame(number, inputs, list(events))


# -- summaries and the command line -----------------------------------------------------------

def summarize(path) -> dict:
    """Figures about one replay file (JSON-serializable). Reads the file once, streaming;
    raises ReplayError for a missing or unreadable file."""
    path = os.fspath(path)
    reader = ReplayReader(path)
    header = reader.header
    players = list(header["players"])
    inputs: list[int] = []
    joined: dict[int, str] = {}
    late_joiners: list[dict] = []
    late_seen: set[tuple[int, str]] = set()
    membership: Counter = Counter()
    frames = 0
    first = last = None
    bad_frames = 0
    decoder = FrameDecoder()
    synthesized: Counter = Counter()
    for number, data in reader.frames():
        frames += 1
        if first is None:
            first = number
        last = number
        try:
            if reader.version >= 2:
                # A frame that does not decode breaks the chain of "same as previous"
                # references: decode the next ones relative to what is known.
                decoder.next_number = number
                frame = decoder.decode(data)
            else:
                frame = _decode_v1_frame(data)
        except ProtocolError:
            bad_frames += 1
            continue
        if frame.number != number:
            bad_frames += 1
            continue
        if len(frame.inputs) > len(inputs):
            inputs.extend([0] * (len(frame.inputs) - len(inputs)))
        for slot, value in enumerate(frame.inputs):
            if value is not None:
                inputs[slot] += 1
        for slot in frame.synthesized:
            synthesized[slot] += 1
        for event in frame.events:
            if isinstance(event, list) and event and isinstance(event[0], str):
                membership[event[0]] += 1
                if (len(event) >= 3 and isinstance(event[1], int) and isinstance(event[2], str)
                        and event[0] in ("join", "reconnect")):
                    who = (event[1], event[2])
                    joined.setdefault(*who)
                    # The header lists who was there at the start; a name joining a slot
                    # the header does not give it came later (a late joiner, or a new player
                    # in a slot whose owner's grace ran out).
                    if (event[0] == "join" and who[0] >= 0
                            and (who[0] >= len(players) or players[who[0]] != who[1])
                            and who not in late_seen):
                        late_seen.add(who)
                        late_joiners.append({"slot": who[0], "player": who[1], "frame": number})
    slots = max(len(players), len(inputs))
    late_joiners = [entry for entry in late_joiners if entry["slot"] < slots]
    inputs.extend([0] * (slots - len(inputs)))
    per_slot = []
    for slot in range(slots):
        name = players[slot] if slot < len(players) else None
        per_slot.append({"slot": slot, "player": name if name is not None else joined.get(slot),
                         "inputs": inputs[slot], "synthesized": synthesized[slot]})
    events = Counter(event["kind"] for event in reader.events())
    end = reader.end
    file_bytes = os.path.getsize(path)
    tick_rate = header["tick_rate"]
    return {
        "file": path,
        "format_version": header["version"],
        "room": header["room"],
        "tick_rate": tick_rate,
        # Every slot's player: the header's (there at the start), else who joined it later.
        "players": [entry["player"] for entry in per_slot],
        "late_joiners": late_joiners,
        "relay_version": header["relay_version"],
        "started_at": header["started_at"],
        "ended_at": end.get("ended_at") if end else None,
        "frames": frames,
        "first_frame": first,
        "last_frame": last,
        "duration_s": frames / tick_rate,
        "complete": reader.complete,
        "end_reason": end.get("reason") if end else None,
        "problem": reader.problem,
        "truncated": "truncated" in events,
        "events": dict(sorted(events.items())),
        "membership": dict(sorted(membership.items())),
        "inputs_per_player": per_slot,
        "checksums": len(reader.checksums()),
        "bad_frames": bad_frames,
        "file_bytes": file_bytes,
        "raw_bytes": reader.raw_bytes,
        "compression_ratio": reader.raw_bytes / file_bytes if file_bytes else 0.0,
    }


def _time(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    try:
        return datetime.fromtimestamp(value, timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return repr(value)


def _counts(counts: dict) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in counts.items()) or "none"


def format_summary(summary: dict) -> str:
    """The summary as text for people (``relay replay inspect FILE``)."""
    frames = summary["frames"]
    span = f" ({summary['first_frame']}..{summary['last_frame']})" if frames else ""
    if summary["complete"]:
        status = f"complete, ended: {summary['end_reason']}"
    else:
        status = f"INCOMPLETE: {summary['problem']}"
    if summary["truncated"]:
        status += " (truncated by the size cap)"
    inputs = ", ".join(f"{entry['slot']}:{entry['player'] or '-'} {entry['inputs']}"
                       for entry in summary["inputs_per_player"]) or "none"
    joined_at = {entry["slot"]: entry["frame"] for entry in reversed(summary["late_joiners"])}
    players = ", ".join(f"{slot}:{name or '-'}"
                        + (f" (joined at frame {joined_at[slot]})" if slot in joined_at else "")
                        for slot, name in enumerate(summary["players"])) or "none"
    later = [f"{entry['slot']}:{entry['player']} at frame {entry['frame']}"
             for entry in summary["late_joiners"]
             if summary["players"][entry["slot"]] != entry["player"]]
    if later:       # a slot that changed hands: its later players too
        players += "; later " + ", ".join(later)
    lines = [
        ("file", summary["file"]),
        ("room", f"{summary['room']} (relay {summary['relay_version']}, "
                 f"replay format {summary['format_version']})"),
        ("started", _time(summary["started_at"])),
        ("ended", _time(summary["ended_at"])),
        ("players", players),
        ("frames", f"{frames}{span}, {summary['duration_s']:.1f} s at {summary['tick_rate']} Hz"),
        ("status", status),
        ("inputs", inputs),
        ("events", _counts(summary["events"])),
        ("membership", _counts(summary["membership"])),
        ("size", f"{summary['file_bytes']:,} bytes ({summary['raw_bytes']:,} uncompressed, "
                 f"ratio {summary['compression_ratio']:.1f}x)"),
    ]
    if summary["bad_frames"]:
        lines.append(("warning", f"{summary['bad_frames']} frame records do not hold a valid "
                                 f"FRAME message"))
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


def _inspect(args: argparse.Namespace) -> int:
    try:
        summary = summarize(args.file)
    except ReplayError as error:
        print(f"relay replay: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    return 0


# -- desync bundles ---------------------------------------------------------------------------

BUNDLE_FORMAT = "relay-desync-bundle"
BUNDLE_VERSION = 1


def desync_bundle(path, frame: int, radius: int = 30, from_start: bool = False) -> dict:
    """What a game team needs to reproduce a divergence at ``frame``: the decoded frames
    ``frame - radius .. frame + radius`` (from 0 with ``from_start``), every player's checksum
    history, the verdict at ``frame`` and at the first diverging frame, and the desync events.
    Inputs are bytes; ``bundle_json`` turns them into hex. Raises ReplayError for a missing or
    unreadable file or a frame the file does not hold."""
    from relay.server.room import desync_verdict

    if not isinstance(frame, int) or frame < 0:
        raise ValueError(f"frame must be a non-negative integer, not {frame!r}")
    if not isinstance(radius, int) or radius < 0:
        raise ValueError(f"radius must be a non-negative integer, not {radius!r}")
    reader = ReplayReader(path)
    first = 0 if from_start else max(0, frame - radius)
    last = frame + radius
    frames = []
    previous_inputs: list = []
    held = 0
    try:
        for decoded in reader.decoded_frames():
            held = decoded.number + 1
            if decoded.number == first - 1:
                previous_inputs = decoded.inputs
            if decoded.number > last:
                break
            if decoded.number >= first:
                frames.append({"n": decoded.number, "inputs": decoded.inputs,
                               "synthesized": decoded.synthesized, "events": decoded.events})
    except ProtocolError as error:
        raise ReplayError(f"{reader.path}: frame {held} does not decode: {error}") from None
    if frame >= held:
        raise ReplayError(f"{reader.path}: frame {frame} is not in the replay (it holds frames "
                          f"0..{held - 1})" if held else f"{reader.path}: the replay holds no frames")
    history: dict[str, list[list[int]]] = {}
    by_frame: dict[int, dict[str, int]] = {}
    for record in reader.checksums():
        history.setdefault(record["player"], []).append([record["n"], record["value"]])
        by_frame.setdefault(record["n"], {}).setdefault(record["player"], record["value"])
    for values in history.values():
        values.sort()
    diverging = sorted(n for n, values in by_frame.items() if len(set(values.values())) > 1)
    first_diverging = diverging[0] if diverging else None
    agreeing = [n for n, values in by_frame.items() if len(values) > 1
                and len(set(values.values())) == 1
                and (first_diverging is None or n < first_diverging)]

    def verdict_at(number: Optional[int]) -> Optional[dict]:
        if number is None or number not in by_frame:
            return None
        verdict, groups, minority = desync_verdict(by_frame[number])
        return {"frame": number, "checksums": by_frame[number], "verdict": verdict,
                "groups": groups, "minority": minority}

    header = reader.header
    return {
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
        "source": reader.path, "room": header["room"], "tick_rate": header["tick_rate"],
        "players": header["players"], "relay_version": header["relay_version"],
        "replay_version": reader.version, "frame": frame,
        "first_frame": first, "last_frame": frames[-1]["n"],
        "previous_inputs": previous_inputs,
        "frames": frames,
        "checksums": dict(sorted(history.items())),
        "at_frame": verdict_at(frame),
        "first_diverging_frame": first_diverging,
        "last_agreeing_frame": max(agreeing) if agreeing else None,
        "at_first_diverging_frame": verdict_at(first_diverging),
        "desyncs": [{"n": event["n"], **event.get("detail", {})} for event in reader.events()
                    if event["kind"] == "desync"],
    }


def _hex_bytes(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, list):
        return [_hex_bytes(item) for item in value]
    if isinstance(value, dict):
        return {key: _hex_bytes(item) for key, item in value.items()}
    return value


def bundle_json(bundle: dict) -> str:
    """The bundle as JSON: inputs as lowercase hex strings (null for no input), map keys as
    strings."""
    return json.dumps(_hex_bytes(bundle), indent=1)


def _desync(args: argparse.Namespace) -> int:
    try:
        bundle = desync_bundle(args.file, args.frame, args.radius, args.from_start)
    except (ReplayError, ValueError) as error:
        print(f"relay replay: error: {error}", file=sys.stderr)
        return 1
    output = args.output
    form = args.format or ("msgpack" if output and output.endswith((".msgpack", ".mpk"))
                           else "json")
    data = msgpack.packb(bundle, use_bin_type=True) if form == "msgpack" else \
        (bundle_json(bundle) + "\n").encode()
    if output is None or output == "-":
        if form == "msgpack":
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data.decode())
        return 0
    try:
        with open(output, "wb") as handle:
            handle.write(data)
    except OSError as error:
        print(f"relay replay: error: cannot write {output}: {error.strerror or error}",
              file=sys.stderr)
        return 1
    at = bundle["at_frame"]
    first = bundle["at_first_diverging_frame"]
    print(f"wrote {output}: frames {bundle['first_frame']}..{bundle['last_frame']}, checksums of "
          f"{len(bundle['checksums'])} players; at frame {args.frame}: "
          f"{at['verdict'] + ' ' + str(at['minority']) if at else 'no checksums'}; first diverging "
          f"frame: {bundle['first_diverging_frame']}"
          f"{' (' + first['verdict'] + ' ' + str(first['minority']) + ')' if first else ''}",
          file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the replay subcommands to ``parser`` (the project CLI mounts it as ``relay replay``).
    Each subcommand sets ``func``: call ``args.func(args)`` for the exit status."""
    sub = parser.add_subparsers(dest="replay_command", required=True, metavar="COMMAND")
    inspect = sub.add_parser("inspect", help="summarize a replay file",
                             description="Print what a replay file holds: room, players, "
                                         "frames, duration, events, inputs per player, size.")
    inspect.add_argument("file", metavar="FILE", help="the replay file")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.set_defaults(func=_inspect)
    desync = sub.add_parser("desync", help="extract a desync bundle around a frame",
                            description="Write the frames around FRAME (decoded inputs, "
                                        "synthesized marks, events), every player's checksum "
                                        "history and the verdict at FRAME and at the first "
                                        "diverging frame, for reproducing a desync.")
    desync.add_argument("file", metavar="FILE", help="the replay file")
    desync.add_argument("--frame", type=int, required=True, metavar="N",
                        help="the frame to centre on (e.g. the DESYNC's frame)")
    desync.add_argument("--radius", type=int, default=30, metavar="K",
                        help="frames before and after N to include (default 30)")
    desync.add_argument("--from-start", action="store_true",
                        help="include every frame from 0 (to replay the whole match up to N+K)")
    desync.add_argument("-o", "--output", metavar="FILE",
                        help="write here (.json, or .msgpack/.mpk for msgpack); default stdout")
    desync.add_argument("--format", choices=("json", "msgpack"),
                        help="override the format chosen from the file name")
    desync.set_defaults(func=_desync)


def main(argv: Optional[list[str]] = None) -> int:
    """``relay replay inspect FILE [--json]`` or ``relay replay desync FILE --frame N``: 0 on
    success, 1 for a missing or bad file."""
    parser = argparse.ArgumentParser(prog="relay replay", description="Replay files")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
