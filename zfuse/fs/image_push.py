"""Whole-image files in the kernel's page cache: `ImagePages`.

A whole-image file (`image.ome.tif`, `pyramid.ome.tif`) keeps its page cache
between opens until its array changes (Bio-Formats reopens it dozens of
times): `opened` says whether an open must drop it. With each read, the tiles a
region reader needs next are put into the page cache ahead of it (the file
decides which: `WholeImage.pushes_after`), so its next reads are no FUSE round
trips. A reload makes every push in flight stale (`reloaded`).

It owns the version each file was last opened at and the reload epoch. No FUSE:
pages go through `Kernel.store`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from zfuse.fs.types import Kernel, Path, Spawn
from zfuse.stats import Stats

log = logging.getLogger("zfuse.fs")

#: whole-image files whose last opened version is remembered (past it all are
#: forgotten: an open of a file not remembered drops its cached pages, which is safe)
VERSIONS_KEPT = 16384


class ImagePages:
    """Which whole-image bytes the kernel caches, and the tiles pushed into it."""

    def __init__(self, stats: Stats, kernel: Kernel | None, spawn: Spawn | None,
                 invalidate: Callable[[int], None]) -> None:
        self.stats = stats
        self.kernel = kernel
        self.spawn = spawn
        self.invalidate = invalidate  # drops an inode's cached pages (on the event loop)
        self.versions: dict[Path, Any] = {}  # the version each file was last opened at
        self.epoch = 0  # reloads so far (tiles pushed before one are stale)

    def opened(self, path: Path, version: Any) -> bool:
        """A whole-image file is opened at `version`: whether the kernel may keep the
        pages it caches of it (the array did not change since the last open)."""
        unchanged = self.versions.get(path) == version
        if len(self.versions) >= VERSIONS_KEPT and path not in self.versions:
            self.versions.clear()  # (a walker opening every image of a crafted store)
        self.versions[path] = version
        return unchanged

    def reloaded(self) -> None:
        self.epoch += 1

    def push_for_read(self, ino: int, path: Path, reader: Any, off: int, size: int) -> None:
        """For a read of [off, off+size): push the tiles the reader needs next, in the
        background (asked after the read, or before it where `reader.pushes_before_read`)."""
        if self.spawn is None or getattr(self.kernel, "store", None) is None:
            return
        spans = reader.pushes_after(off, size)
        if spans:
            self.spawn(self._push_spans, (ino, path, reader, self.epoch, spans))

    def _push_spans(self, job: tuple[int, Path, Any, int, list[tuple[int, int]]]) -> None:
        """One after another, nearest first: the disk serves the reader's own reads in between."""
        ino, path, reader, epoch, spans = job
        for start, length in spans:
            self._push_range(ino, path, reader, epoch, start, length)

    def _push_range(self, ino: int, path: Path, reader: Any, epoch: int, start: int, length: int) -> None:
        """Read one range of a whole-image file and store it in the kernel's page cache,
        unless the kernel asked for it meanwhile or the file's bytes changed."""

        def current() -> bool:
            """The bytes the kernel caches for this file are still `reader`'s (no reload,
            no reopen after a change: see `opened`)."""
            return epoch == self.epoch and self.versions.get(path) == reader.version

        try:
            if not reader.push_wanted(start) or not current():
                return
            data = reader.read(start, length)
            if not current():
                return
            self.kernel.store(ino, start, data)  # type: ignore[union-attr]
            if not current():  # changed while storing: drop what may be old bytes
                trio.from_thread.run_sync(self.invalidate, ino)
                return
            self.stats.count("image_tiles_pushed")
        except Exception as e:  # the reader's own read reports it, with its errno
            log.debug("%s: pushing bytes %d+%d failed: %s", "/".join(path), start, length, e)
