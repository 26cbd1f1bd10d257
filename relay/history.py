"""A room's closed frames, for late joiners, catch-up blocks and delayed spectators.

A match keeps every frame it has closed, and that grows without end: at 30 Hz, a room of 8 with
16-byte inputs adds ~5 KB a second, far more than a connected player may cost in memory over a
long match. ``FrameHistory`` keeps the newest frames as the very bytes objects that were sent
(live sends, the spectators' delayed frames) and moves older ones, in chunks, to an unnamed
temporary file; it keeps only each frame's end offset in memory (8 bytes a frame). Older frames
are read back with ``os.pread`` when a late joiner or a lagging client needs them -- rarely, and
from the page cache while the match is recent. If the file cannot be created or written, the
frames stay in memory instead (a full disk costs memory, never a frame).

It behaves as a read-only list of bytes with ``append``: ``len``, indexing, slicing, iteration,
equality with a list.
"""
from __future__ import annotations

import os
import tempfile
from array import array
from typing import Optional, Union

from relay.logs import get_logger

SPILL_FRAMES = 32
"""Frames moved to the file at a time."""


class FrameHistory:
    def __init__(self, keep: int = 64, directory: Optional[str] = None):
        self.keep = max(1, keep)
        """Newest frames kept in memory as bytes objects (at least this many)."""
        self.directory = directory
        self._ends = array("Q")             # end offset of every spilled frame in the spool
        self._recent: list[bytes] = []      # frames len(_ends) .. len(self) - 1
        self._file = None
        self._memory: Optional[bytearray] = None    # the spool when the file failed
        self._size = 0                      # bytes spooled

    def __len__(self) -> int:
        return len(self._ends) + len(self._recent)

    def append(self, data: bytes) -> None:
        self._recent.append(data)
        if len(self._recent) >= self.keep + SPILL_FRAMES:
            self._spill(SPILL_FRAMES)

    def _spill(self, count: int) -> None:
        frames = self._recent[:count]
        chunk = b"".join(frames)
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
                get_logger("relay.history").warning("history_spool_failed", error=str(error),
                                                    detail="frame history stays in memory")
                self._memory = bytearray(self._read(0, self._size)) if self._size else bytearray()
                self._close_file()
        if self._memory is not None:
            self._memory += chunk
        end = self._size
        for frame in frames:
            end += len(frame)
            self._ends.append(end)
        self._size = end
        del self._recent[:count]

    def _read(self, start: int, end: int) -> bytes:
        if self._memory is not None:
            return bytes(self._memory[start:end])
        data = os.pread(self._file.fileno(), end - start, start)
        if len(data) != end - start:
            raise OSError(f"frame history file is short ({len(data)} of {end - start} bytes)")
        return data

    def _spilled(self, first: int, stop: int) -> list[bytes]:
        """Spilled frames first..stop-1 with one read."""
        if first >= stop:
            return []
        ends = self._ends
        base = ends[first - 1] if first else 0
        data = self._read(base, ends[stop - 1])
        out, start = [], 0
        for index in range(first, stop):
            end = ends[index] - base
            out.append(data[start:end])
            start = end
        return out

    def __getitem__(self, index: Union[int, slice]):
        if isinstance(index, slice):
            first, stop, step = index.indices(len(self))
            if step != 1:
                return list(self)[index]
            spilled = len(self._ends)
            return (self._spilled(first, min(stop, spilled))
                    + self._recent[max(first - spilled, 0):max(stop - spilled, 0)])
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("frame history index out of range")
        spilled = len(self._ends)
        if index >= spilled:
            return self._recent[index - spilled]
        return self._spilled(index, index + 1)[0]

    def __iter__(self):
        spilled = len(self._ends)
        for start in range(0, spilled, 4096):
            yield from self._spilled(start, min(spilled, start + 4096))
        yield from list(self._recent)

    def __eq__(self, other) -> bool:
        if isinstance(other, FrameHistory):
            other = list(other)
        if not isinstance(other, list):
            return NotImplemented
        return len(other) == len(self) and list(self) == other

    __hash__ = None

    def __repr__(self) -> str:
        return (f"FrameHistory({len(self)} frames, {len(self._recent)} in memory, "
                f"{self._size} bytes spooled)")

    def memory_bytes(self) -> int:
        """Bytes this history holds in memory (frame objects, offsets, an in-memory spool)."""
        return (sum(len(frame) + 33 for frame in self._recent) + self._ends.itemsize * len(self._ends)
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
        self._ends = array("Q")
        self._recent = []
        self._size = 0

    def __del__(self):
        self._close_file()
