"""Read-ahead across chunk files for sequential readers: `ReadAhead`.

A reader going through chunk files one by one (a legacy tool, `cat c/0/*`)
would otherwise wait for each chunk's decode (or its stored file's first read)
in turn. Opening a chunk cold schedules the next ones in C order; the window
slides as they are opened, so a scan never waits for a fresh batch; a re-read
(served by the kernel's page cache) asks nothing.

It owns the chunks in flight (`in_flight`) and those read ahead but not opened
yet (`unopened`, which tell a scan from a re-read). The jobs run on the threads
it is given (`spawn`): they report nothing back, so they need no event loop.
No FUSE.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from zfuse.fs.stored_files import ChunkKey, StoredFiles
from zfuse.fs.types import Spawn
from zfuse.stats import Stats

log = logging.getLogger("zfuse.fs")

READ_AHEAD = 4  # chunk files decoded ahead of a sequential reader
# chunks stored raw: stored files asked of the OS ahead of a sequential reader, in
# batches of half as many (one worker thread hop per batch, not per file)
STORED_AHEAD = 8
AHEAD_REMEMBERED = 16 * READ_AHEAD  # decoded-ahead chunks remembered until opened
# chunks of a remote store: fetched ahead of a sequential reader (not on threads: on
# zarr's event loop), as many as fit in FETCH_AHEAD_BYTES of decoded chunk, at most
# FETCH_AHEAD: at 20 ms a round trip, 4 in flight left a reader waiting on each wave
FETCH_AHEAD = 32
FETCH_AHEAD_BYTES = 64 << 20


class ReadAhead:
    """Chunks decoded (or their stored files asked of the OS) ahead of a reader."""

    def __init__(self, stats: Stats, spawn: Spawn | None, stored: StoredFiles) -> None:
        self.stats = stats
        self.spawn = spawn  # None: nothing is read ahead
        self.stored = stored
        self.in_flight: set[ChunkKey] = set()
        # chunks read ahead whose file is not opened yet: opening one means a scan goes
        # on (keep the window full), not a re-read (oldest first; bounded)
        self.unopened: collections.OrderedDict[ChunkKey, None] = collections.OrderedDict()

    def opened(self, arr: Any, coords: tuple[int, ...], opened_before: bool) -> None:
        """A chunk file was opened through the page cache: read the next ones ahead."""
        if arr.serves_stored:
            self._advise_ahead(arr, coords, opened_before)
        else:
            self._decode_ahead(arr, coords)

    def _decode_ahead(self, arr: Any, coords: tuple[int, ...]) -> None:
        """Keep the next chunks in C order decoding in the background while this one is
        read: decoding overlaps the transfer. Opening a file that was decoded ahead asks
        for the next one. A cached chunk opened otherwise is a re-read: nothing ahead."""
        if self.spawn is None or arr.layout is None:
            return
        if arr.cache.max_bytes < 4 * arr.layout.data_size:
            return  # no room to keep what is decoded ahead
        key = (arr.ident, coords)
        scanning = self._opened_ahead(key)
        cached = arr.is_cached(coords)
        if cached and not scanning:
            return
        if arr.fetches_remotely:
            # the store, not the decode, is what this reader waits for: the next chunks'
            # fetches start together (a shard's adjacent inner chunks in one request)
            window = max(READ_AHEAD, min(FETCH_AHEAD, FETCH_AHEAD_BYTES // max(1, arr.layout.data_size)))
            arr.fetch_ahead([coords, *arr.successors(coords, window)])
        if not cached and key not in self.in_flight:
            # this file's own chunk first, starting now rather than at its first read
            self.in_flight.add(key)
            self.spawn(self._decode, (arr, coords, key, False))
        for nxt in arr.successors(coords, READ_AHEAD):
            key = (arr.ident, nxt)
            if key in self.in_flight or arr.is_cached(nxt):
                continue
            self._started_unopened(key)
            self.spawn(self._decode, (arr, nxt, key, True))

    def _opened_ahead(self, key: ChunkKey) -> bool:
        """Whether the chunk file being opened was read ahead and not opened since: a
        scan goes on (keep the window full), not a re-read. It is opened now."""
        return self.unopened.pop(key, False) is None

    def _started_unopened(self, key: ChunkKey) -> None:
        """A chunk read ahead (in flight until its job ends) and remembered as not opened
        yet (`_opened_ahead`; the oldest forgotten beyond AHEAD_REMEMBERED)."""
        self.in_flight.add(key)
        self.unopened[key] = None
        while len(self.unopened) > AHEAD_REMEMBERED:
            self.unopened.popitem(last=False)

    def _advise_ahead(self, arr: Any, coords: tuple[int, ...], opened_before: bool) -> None:
        """For chunks stored raw: nothing to decode, so the next chunks' stored files are
        only asked of the OS (posix_fadvise WILLNEED) and checked to exist, in a worker
        thread, while this one is read. Their lookups then answer from memory, their
        opens need no thread and their reads find the page cache filled. The window
        slides as the decoded one does, but only once less than half of it is left (one
        thread hop per few files, not per file); a re-read asks nothing."""
        if self.spawn is None:
            return
        scanning = self._opened_ahead((arr.ident, coords))
        if opened_before and not scanning:
            return
        ahead = arr.successors(coords, STORED_AHEAD)
        names = self.stored.names
        batch = [c for c in ahead if (arr.ident, c) not in self.in_flight and (arr.ident, c) not in names]
        if scanning and len(ahead) - len(batch) >= STORED_AHEAD // 2:
            return  # still half a window or more ahead of the reader
        for nxt in batch:
            self._started_unopened((arr.ident, nxt))
        if batch:
            self.spawn(self._advise, (arr, batch))

    def _advise(self, job: tuple[Any, list[tuple[int, ...]]]) -> None:
        arr, batch = job
        for coords in batch:
            key = (arr.ident, coords)
            try:
                if arr.exists(coords) and arr.advise_ahead(coords):
                    self.stored.note_name(key)
                    self.stats.count("read_ahead")
            except Exception as e:  # the real open and read report it
                log.debug("read-ahead of %s failed: %s", coords, e)
            finally:
                self.in_flight.discard(key)

    def _decode(self, job: tuple[Any, tuple[int, ...], ChunkKey, bool]) -> None:
        arr, coords, key, ahead = job
        try:
            # the existence check too: the lookup that opens this file answers from memory
            if arr.exists(coords):
                arr.pixel_bytes(coords)
                if ahead:
                    self.stats.count("read_ahead")
        except Exception as e:  # the real read reports it, with its errno
            log.debug("read-ahead of %s failed: %s", coords, e)
        finally:
            self.in_flight.discard(key)
