"""Who reads a chunk file through the kernel's page cache: `PageCacheReaders`.

A chunk file is read through the kernel's page cache unless its bytes differ
between processes. This part owns the counts that decide it:

- `open`: page-cache handles open per path. A writer truncating the chunk (cp's
  O_TRUNC) first lets them finish (`truncating`, bounded by a grace period): the
  kernel sets the file's size to 0 on O_TRUNC for every opener.
- `changing`: paths whose file changes under way: a writer truncating the chunk,
  from the start of its open until it returns (`truncating`), or a rename of it
  (`changing_files`); new readers bypass the page cache meanwhile. `waiting`: the event
  truncating writers wait on for the readers to close.
- `old_bytes`: page-cache readers still reading a replaced chunk's old bytes. What
  they read fills the kernel's page cache of the path, so new readers bypass it
  until the last of them closes; then the cache is dropped.

No FUSE: the kernel's caches are dropped by the caller (`FileSystem`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import trio

from zfuse.fs.types import Path

READER_GRACE = 2.0  # seconds a replacing writer waits for page-cache readers to close


class PageCacheReaders:
    """Counts of page-cache readers per path, and the writers waiting on them."""

    def __init__(self, grace: float = READER_GRACE) -> None:
        self.grace = grace
        self.open: dict[Path, int] = {}
        self.waiting: dict[Path, trio.Event] = {}
        self.changing: dict[Path, int] = {}
        self.old_bytes: dict[Path, int] = {}

    def any_open(self, path: Path) -> bool:
        return bool(self.open.get(path))

    def bypassed(self, path: Path) -> bool:
        """Whether new readers of `path` must bypass the page cache: its file is changing
        (a truncating open, a rename), or readers of replaced bytes are still open."""
        return path in self.changing or path in self.old_bytes

    def opened(self, path: Path) -> None:
        self.open[path] = self.open.get(path, 0) + 1

    def closed(self, path: Path) -> None:
        left = self.open.get(path, 1) - 1
        if left > 0:
            self.open[path] = left
            return
        self.open.pop(path, None)
        waiting = self.waiting.get(path)
        if waiting is not None:
            waiting.set()

    def reads_old_bytes(self, path: Path) -> None:
        """A page-cache reader of `path` now reads the bytes of a chunk since replaced."""
        self.old_bytes[path] = self.old_bytes.get(path, 0) + 1

    def old_bytes_closed(self, path: Path) -> bool:
        """A reader of old bytes closed (if `path` had any): True after the last one, when
        the old bytes it may have put in the kernel's page cache must be dropped."""
        left = self.old_bytes.get(path)
        if left is None:
            return False
        if left > 1:
            self.old_bytes[path] = left - 1
            return False
        del self.old_bytes[path]
        return True

    @contextlib.asynccontextmanager
    async def truncating(self, path: Path) -> AsyncIterator[None]:
        """Around the open of a writer truncating a chunk (`cp`): readers reading it
        through the page cache finish first (bounded by `grace`), as the kernel sets the
        file's size to 0 on O_TRUNC for every opener; and until the open returns, new
        readers get direct I/O and read the stored chunk (one opening while the
        writer's open was under way got the page cache, then an empty file)."""
        with self.changing_files(path):
            if self.any_open(path):
                event = self.waiting.setdefault(path, trio.Event())
                try:
                    with trio.move_on_after(self.grace):
                        await event.wait()
                finally:
                    if self.waiting.get(path) is event:
                        del self.waiting[path]
            yield

    @contextlib.contextmanager
    def changing_files(self, *paths: Path) -> Iterator[None]:
        """While the files of `paths` change (a rename, a truncating open): readers
        opening them get direct I/O. One opening `old` while it was renamed read, once
        the rename was done, the fill values of a chunk no longer there, into the page
        cache of the file the kernel had moved to `new`: every later reader of `new`
        read zeros."""
        for path in paths:
            self.changing[path] = self.changing.get(path, 0) + 1
        try:
            yield
        finally:
            for path in paths:
                left = self.changing[path] - 1
                if left:
                    self.changing[path] = left
                else:
                    del self.changing[path]
