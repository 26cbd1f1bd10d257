"""A room's closed frames, for late joiners, catch-up blocks and delayed spectators.

A match keeps every frame it has closed, and that grows without end: at 30 Hz, a room of 8 with
16-byte inputs adds ~5 KB a second, far more than a connected player may cost in memory over a
long match. ``FrameHistory`` keeps the newest frames as the very bytes objects that were sent
(live sends, the spectators' delayed frames) and moves older ones, in chunks of SPILL_FRAMES, to
an unnamed temporary file, each frame prefixed with its length (a LEB128 varint: one byte for a
frame under 128 bytes). Memory keeps only each chunk's end offset: 8 bytes per 32 frames, ~27 KB
for an hour of a 30 Hz room, where an offset per frame (8 bytes a frame) grew a room of 8 by
~30 bytes a second per player: more than a player's whole connection state in ten minutes. Older
frames are read back with ``os.pread`` a chunk at a time when a late joiner or a lagging client
needs them -- rarely, and from the page cache while the match is recent. If the file cannot be
created or written, the frames stay in memory instead (a full disk costs memory, never a frame):
what the file already holds is read back into memory and the file is closed. If that read-back
fails too, the file is kept (it is the only copy of the frames spooled so far, which a later read
may still reach), nothing more is spooled for a while, and the new frames stay in memory as
they are; the spool is tried again every SPILL_FRAMES frames. ``spool_failures`` counts the
failed spills.

It behaves as a read-only list of bytes with ``append``: ``len``, indexing, slicing, iteration,
equality with a list.
"""
from __future__ import annotations

import os
import sys
import tempfile
from array import array
from typing import IO, Optional, Union

from relay.logs import get_logger
from relay.frames import join_with_lengths
from relay.protocol import get_varint

SPILL_FRAMES = 32
"""Frames moved to the file at a time: one chunk, one offset in memory."""

MAX_FRAME_SIZE = 1 << 32
"""Bound on a spooled frame's length prefix (far above any frame a channel can carry)."""


_FRAME_OVERHEAD = sys.getsizeof(b"") + 8
"""Bytes a frame kept in memory costs beyond its payload: the bytes object's header (33 in
CPython) and the list's reference to it."""


class FrameHistory:
    def __init__(self, keep: int, directory: Optional[str] = None):
        self.keep = max(1, keep)
        """Newest frames kept in memory as bytes objects (at least this many)."""
        self.directory = directory
        self._chunk_ends = array("Q")       # spool offset after each spilled chunk
        self._recent: list[bytes] = []      # frames self._spilled_count() .. len(self) - 1
        self._file: Optional[IO[bytes]] = None
        self._memory: Optional[bytearray] = None    # the spool when the file failed
        self._size = 0                      # bytes spooled
        self._spill_at = self.keep + SPILL_FRAMES   # len(self._recent) that triggers a spill
        self.spool_failures = 0
        """Spills that could not be written (each logged, throttled)."""

    def __len__(self) -> int:
        return self._spilled_count() + len(self._recent)

    def _spilled_count(self) -> int:
        return len(self._chunk_ends) * SPILL_FRAMES

    def append(self, data: bytes) -> None:
        self._recent.append(data)
        if len(self._recent) >= self._spill_at:
            self._spill()

    def _spill(self) -> None:
        chunk = join_with_lengths(self._recent[:SPILL_FRAMES])
        if self._memory is None:
            try:
                if self._file is None:
                    # Unbuffered: frames go through os.pwrite/pread, and a buffer
                    # would cost every room ~4 KB.
                    self._file = tempfile.TemporaryFile(prefix="relay-history-", dir=self.directory,
                                                        buffering=0)
                written = os.pwrite(self._file.fileno(), chunk, self._size)
                if written != len(chunk):
                    raise OSError(f"short write ({written} of {len(chunk)} bytes)")
            except OSError as error:
                self.spool_failures += 1
                try:
                    held = self._read(0, self._size) if self._size else b""
                except OSError as read_error:
                    # Neither written nor read back: the file is the only copy of what it
                    # holds, so it stays open; this chunk stays in memory (nothing accepted is
                    # dropped) and the spill is tried again SPILL_FRAMES frames later.
                    self._spill_at = len(self._recent) + SPILL_FRAMES
                    self._log_failure(error, read_error=str(read_error),
                                      detail="spool unreadable: new frames stay in memory")
                    return
                self._log_failure(error, detail="frame history stays in memory")
                self._memory = bytearray(held)
                self._close_file()
        if self._memory is not None:
            self._memory += chunk
        self._size += len(chunk)
        self._chunk_ends.append(self._size)
        del self._recent[:SPILL_FRAMES]
        self._spill_at = self.keep + SPILL_FRAMES     # frames held back by a failure go next

    def _log_failure(self, error: OSError, **fields) -> None:
        # Every failure is counted; a disk that keeps failing is logged at 1, 2, 4, 8, ...
        if self.spool_failures & (self.spool_failures - 1) == 0:
            get_logger("relay.server.history").warning("history_spool_failed", error=str(error),
                                                failures=self.spool_failures, **fields)

    def _read(self, start: int, end: int) -> bytes:
        if self._memory is not None:
            return bytes(self._memory[start:end])
        assert self._file is not None       # spilled frames are in the file or in _memory
        data = os.pread(self._file.fileno(), end - start, start)
        if len(data) != end - start:
            raise OSError(f"frame history file is short ({len(data)} of {end - start} bytes)")
        return data

    def _spilled(self, first: int, stop: int) -> list[bytes]:
        """Spilled frames first..stop-1 with one read of the chunks that hold them."""
        if first >= stop:
            return []
        ends = self._chunk_ends
        chunk = first // SPILL_FRAMES
        data = self._read(ends[chunk - 1] if chunk else 0, ends[(stop - 1) // SPILL_FRAMES])
        out, pos = [], 0
        for index in range(chunk * SPILL_FRAMES, stop):
            size, pos = get_varint(data, pos, MAX_FRAME_SIZE)
            if index >= first:
                out.append(data[pos:pos + size])
            pos += size
        return out

    def __getitem__(self, index: Union[int, slice]):
        if isinstance(index, slice):
            first, stop, step = index.indices(len(self))
            if step != 1:
                return list(self)[index]
            spilled = self._spilled_count()
            return (self._spilled(first, min(stop, spilled))
                    + self._recent[max(first - spilled, 0):max(stop - spilled, 0)])
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("frame history index out of range")
        spilled = self._spilled_count()
        if index >= spilled:
            return self._recent[index - spilled]
        return self._spilled(index, index + 1)[0]

    def __iter__(self):
        spilled = self._spilled_count()
        for start in range(0, spilled, 4096):
            yield from self._spilled(start, min(spilled, start + 4096))
        yield from list(self._recent)

    def __eq__(self, other) -> bool:
        if isinstance(other, FrameHistory):
            other = list(other)
        if not isinstance(other, list):
            return NotImplemented
        return len(other) == len(self) and list(self) == other

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, like list

    def __repr__(self) -> str:
        return (f"FrameHistory({len(self)} frames, {len(self._recent)} in memory, "
                f"{self._size} bytes spooled)")

    def memory_bytes(self) -> int:
        """Bytes this history holds in memory (frame objects and the references to them,
        offsets, an in-memory spool)."""
        return (sum(len(frame) + _FRAME_OVERHEAD for frame in self._recent)
                + self._chunk_ends.itemsize * len(self._chunk_ends)
                + (len(self._memory) if self._memory is not None else 0))

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def close(self) -> None:
        """Forget everything (the room is gone); the file goes with it."""
        self._close_file()
        self._memory = None
        self._chunk_ends = array("Q")
        self._recent = []
        self._size = 0
        self._spill_at = self.keep + SPILL_FRAMES

    def __del__(self):
        self._close_file()
