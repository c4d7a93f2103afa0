"""Chunks served from their stored files, as the filesystem sees them: `StoredFiles`.

A chunk stored raw (no codec but bytes) is read straight from its stored file
(`zfuse.view.array_view.StoredChunkFile`, opened by the array view). This part
owns what the filesystem remembers of those files between opens:

- `names`: chunks whose stored file was opened lately (by a reader or read ahead).
  Its name is in the OS's cache, so opening it again on the event loop waits on no
  disk (`open` decides where it opens).
- `versions`: per path, the stored file (device, inode, size, mtime) whose bytes the
  kernel's page cache of the chunk file may hold. A reader opening another one
  (replaced in the store) must not get those.
- `kept`: per path, the stored file an open saw lately and when. A re-open within
  the attribute timeout takes it as unchanged (as the kernel takes the file's
  size): a warm re-read costs no system call.

No FUSE; the view decides what is stored raw, `FileSystem` which handle reads it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from zfuse.fs.types import ATTR_TIMEOUT, Path, Run
from zfuse.view.array_view import stored_files_bound

STORED_NAMES_KEPT = 1 << 16  # chunks stored raw remembered as opened lately
STORED_VERSIONS_KEPT = 1 << 16  # chunk files whose cached stored file is remembered
STORED_FILES_KEPT = 128  # stored files kept open for re-opens within ATTR_TIMEOUT

ChunkKey = tuple[int, tuple[int, ...]]  # (id of the array view, chunk coordinates)


class StoredFiles:
    """What is remembered of the stored files chunk files were served from."""

    def __init__(self, run: Run, clock: Callable[[], float]) -> None:
        self.run = run
        self.clock = clock
        self.names: set[ChunkKey] = set()
        self.versions: dict[Path, tuple[int, ...]] = {}
        self.kept: collections.OrderedDict[Path, tuple[Any, float]] = collections.OrderedDict()

    def known(self, arr: Any, coords: tuple[int, ...]) -> bool:
        """Whether the chunk's stored file was opened lately (its name is cached)."""
        return (arr.ident, coords) in self.names

    def note_name(self, key: ChunkKey) -> None:
        """(From worker threads too: a set's add and clear are atomic.)"""
        if len(self.names) >= STORED_NAMES_KEPT:
            self.names.clear()  # forgetting costs a thread hop per open, no more
        self.names.add(key)

    async def open(self, path: Path, arr: Any, coords: tuple[int, ...]) -> Any:
        """The chunk's StoredChunkFile if it is stored raw, else None (read decoded):
        the one kept for `path`, if still current; else opened on the event loop when
        its name was looked up lately (read ahead, or opened before: no disk to wait
        for), else in a worker thread, which also asks the OS to start reading it."""
        stored = self._kept(path, arr)
        if stored is not None:
            return stored
        key = (arr.ident, coords)
        if arr.serves_stored and key in self.names:
            stored = arr.open_stored(coords)
        else:
            stored = await self.run(arr.open_stored, coords, True)
        if stored is not None:
            self.note_name(key)
        return stored

    def _kept(self, path: Path, arr: Any) -> Any:
        """The stored file an open of `path` less than ATTR_TIMEOUT ago opened, if it is
        still kept open and is the one the kernel caches bytes of. None otherwise."""
        kept = self.kept.get(path)
        if kept is None:
            return None
        stored, seen_at = kept
        if (stored.array is not arr or self.clock() - seen_at >= ATTR_TIMEOUT
                or self.versions.get(path) != stored.identity):
            self._drop_kept(path)
            return None
        self.kept.move_to_end(path)
        return stored.retain()

    def cached_is(self, path: Path, stored: Any) -> bool:
        """Whether `stored` is the stored file whose bytes the kernel may cache for `path`."""
        return self.versions.get(path) == stored.identity

    def now_cached(self, path: Path, stored: Any) -> None:
        """The kernel's page cache of `path` is dropped and will hold `stored`'s bytes;
        `stored` is kept for the re-opens of the next ATTR_TIMEOUT s."""
        if len(self.versions) >= STORED_VERSIONS_KEPT:
            self.versions.clear()  # (unknown means "drop the cache": safe)
        self.versions[path] = stored.identity

    def keep(self, path: Path, stored: Any) -> None:
        """Keep a stored file just opened for the re-opens of the next ATTR_TIMEOUT s (the
        most recent STORED_FILES_KEPT, and at most a quarter of the descriptors open chunk
        files may hold: the rest is for open files)."""
        if path in self.kept:
            return
        kept = min(STORED_FILES_KEPT, stored_files_bound() // 4)
        if not kept or stored.retain() is None:
            return
        self.kept[path] = (stored, self.clock())
        while len(self.kept) > kept:
            _, (oldest, _) = self.kept.popitem(last=False)
            oldest.close()

    def _drop_kept(self, path: Path) -> None:
        """(From worker threads too.)"""
        kept = self.kept.pop(path, None)
        if kept is not None:
            kept[0].close()

    def forget(self, path: Path) -> None:
        """The kernel keeps no bytes of `path` now (or the file changed through the mount):
        no stored file is remembered as what it caches or kept for its re-opens."""
        self.versions.pop(path, None)
        if path in self.kept:
            self._drop_kept(path)
