"""Open files: one class per kind of handle, each owning what it reads.

An open file is one of:

| kind | what it reads | owns |
| --- | --- | --- |
| `SnapshotHandle` | fixed bytes: a metadata file, a `.zfuse/` file, a chunk replaced or unlinked while open | the bytes |
| `BufferHandle` | a write state's buffer: the writing process reading its own bytes, or a new chunk's | the state (shared with its writers) |
| `WriteHandle` | the same buffer, opened for writing (`write`, `flush`, `fsync`, commit at release) | the state, O_APPEND |
| `WholeImageHandle` | a whole-image file (`image.ome.tif`, `pyramid.ome.tif`) | its reader (a reload may put another in its place) |
| `StoredChunkHandle` | a chunk stored raw, by range from its stored file (`[read-9]`) | the stored file, kept open until `close` |
| `DecodedChunkHandle` | the decoded chunk, through the chunk cache | the array and coordinates (a reload moves them) |

Each answers `read_cached(off, size)` (bytes from memory, no thread hop, or
None), `read(off, size)` (blocking: may decode), `entry()` (what `fstat` of it
says) and `close()` (gives back what it holds). The filesystem (`zfuse.fs`)
chooses the kind at open, dispatches on the handle, and changes a handle's kind
by putting another object under its number: a chunk about to be replaced
becomes a snapshot of its old bytes, a stored chunk whose file a reload cannot
reopen becomes a decoded one. A read already under way on the old object ends
as it would have: a closed stored file answers None, and the read decodes.

No FUSE, no listing code, no filesystem policy here (tests/test_layers.py).
"""

from __future__ import annotations

import errno
from typing import Any

from zfuse.errors import NotAllowedError
from zfuse.inodes import Inode, Path
from zfuse.view.entry import Entry, Node
from zfuse.view.writes import FileState, Phase, read_state


class Handle:
    """One open file of some kind: its path and inode, and whether its reads go through
    the kernel's page cache (`page_cached`: counted per path while it is open)."""

    __slots__ = ("path", "inode", "page_cached")  # (one per open: attribute access in C)

    def __init__(self, path: Path, inode: Inode, page_cached: bool = False) -> None:
        self.path = path
        self.inode = inode
        self.page_cached = page_cached

    def entry(self) -> Entry:
        """What `fstat` of this open file says."""
        raise NotImplementedError

    def read_cached(self, off: int, size: int) -> bytes | None:
        """Bytes at [off, off+size) from memory if they are there (no thread hop), else None."""
        raise NotImplementedError

    def read(self, off: int, size: int) -> bytes:
        """Bytes at [off, off+size) (blocking: may decode)."""
        raise NotImplementedError

    def answers_detached(self) -> bool:
        """Whether this file answers `fstat` of its inode once the name is unlinked or
        replaced (it holds bytes the path no longer shows)."""
        return False

    def close(self) -> None:
        """Give back what it holds (at release)."""


class OldCopies:
    """The old bytes that readers of chunks replaced or removed while open hold (their
    `SnapshotHandle`s): one copy per version, shared, counted while held; at most
    `budget` bytes together (one reader on each of 200 chunks of 8 MiB, then `rm` of
    them all, held 1.5 GB)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self._refs: dict[int, list[Any]] = {}  # id(bytes) -> [bytes, readers]

    def admits(self, size: int) -> bool:
        return self.held + size <= self.budget

    def take(self, data: bytes) -> None:
        ref = self._refs.setdefault(id(data), [data, 0])
        if ref[1] == 0:
            self.held += len(data)
        ref[1] += 1

    def give_back(self, data: bytes) -> None:
        ref = self._refs.get(id(data))
        if ref is None:
            return
        ref[1] -= 1
        if ref[1] <= 0:
            del self._refs[id(data)]
            self.held -= len(data)


class SnapshotHandle(Handle):
    """Fixed bytes (`copies`: counted there while open)."""

    __slots__ = ("content", "copies")

    def __init__(self, path: Path, inode: Inode, content: bytes, page_cached: bool = False,
                 copies: OldCopies | None = None) -> None:
        super().__init__(path, inode, page_cached)
        self.content = content
        self.copies = copies
        if copies is not None:
            copies.take(content)

    def close(self) -> None:
        if self.copies is not None:
            self.copies.give_back(self.content)
            self.copies = None

    def entry(self) -> Entry:
        return Entry(Node.META, size=len(self.content))

    def read_cached(self, off: int, size: int) -> bytes:
        return self.content[off : off + size]

    read = read_cached

    def answers_detached(self) -> bool:
        return True


class StaleHandle(Handle):
    """A reader of a chunk replaced or removed while open, whose old bytes the daemon
    could not keep (`OldCopies` full): its reads fail with ESTALE, saying why; fstat
    still answers the size it had."""

    __slots__ = ("size", "why")

    def __init__(self, path: Path, inode: Inode, size: int, why: str, page_cached: bool = False) -> None:
        super().__init__(path, inode, page_cached)  # (a page-cache reader still counted until it closes)
        self.size = size
        self.why = why

    def entry(self) -> Entry:
        return Entry(Node.META, size=self.size)

    def read_cached(self, off: int, size: int) -> bytes | None:
        raise NotAllowedError(errno.ESTALE, self.why)

    read = read_cached

    def answers_detached(self) -> bool:
        return True


class BufferHandle(Handle):
    """A write state's buffer, read (the writer's own process, or a file only the daemon holds)."""

    __slots__ = ("state", "array", "coords")

    def __init__(self, path: Path, inode: Inode, state: FileState, array: Any, coords: tuple[int, ...] | None) -> None:
        super().__init__(path, inode)
        self.state = state
        self.array = array  # (the chunk at open: the size while the buffer is not loaded)
        self.coords = coords

    def entry(self) -> Entry:
        buffer = self.state.buffer
        if buffer is not None:
            return Entry(Node.CHUNK, size=len(buffer), array=self.array, coords=self.coords)
        assert self.array is not None and self.coords is not None
        return Entry(Node.CHUNK, size=self.array.file_size(self.coords), array=self.array, coords=self.coords)

    def read_cached(self, off: int, size: int) -> bytes | None:
        buffer = self.state.buffer
        return bytes(buffer[off : off + size]) if buffer is not None else None

    def read(self, off: int, size: int) -> bytes:
        return read_state(self.state, off, size)

    def answers_detached(self) -> bool:
        return self.state.phase is Phase.DETACHED


class WriteHandle(BufferHandle):
    """A write state's buffer, opened for writing: writes, flushes and its release go to
    the state (`zfuse.view.writes.Writes`)."""

    __slots__ = ("append",)

    def __init__(self, path: Path, inode: Inode, state: FileState, *, append: bool = False) -> None:
        super().__init__(path, inode, state, state.array, state.coords)
        self.append = append  # O_APPEND: writes go to the end


class WholeImageHandle(Handle):
    """A whole-image file: its reader (`WholeImage`: size, read_cached, read, pushes_after)."""

    __slots__ = ("reader",)

    def __init__(self, path: Path, inode: Inode, reader: Any) -> None:
        super().__init__(path, inode)
        self.reader = reader

    def entry(self) -> Entry:
        return Entry(Node.IMAGE, size=self.reader.size, reader=self.reader)

    def read_cached(self, off: int, size: int) -> bytes | None:
        return self.reader.read_cached(off, size)

    def read(self, off: int, size: int) -> bytes:
        return self.reader.read(off, size)


class ChunkHandle(Handle):
    """A chunk file as the store holds it (not being written by this process)."""

    __slots__ = ("array", "coords")

    def __init__(self, path: Path, inode: Inode, array: Any, coords: tuple[int, ...], page_cached: bool = False) -> None:
        super().__init__(path, inode, page_cached)
        self.array = array
        self.coords = coords

    def entry(self) -> Entry:
        return Entry(Node.CHUNK, size=self.array.file_size(self.coords), array=self.array, coords=self.coords)

    def read_cached(self, off: int, size: int) -> bytes | None:
        return self.array.read_cached(self.coords, off, size)

    def read(self, off: int, size: int) -> bytes:
        return self.array.read(self.coords, off, size)

    def answers_detached(self) -> bool:
        # an unlinked chunk is still stored until its replace window ends (then its
        # readers hold snapshots): its size is the chunk file's (fstat, and the kernel's
        # attribute checks before a read, failed with ENOENT meanwhile)
        return True


class DecodedChunkHandle(ChunkHandle):
    """The decoded chunk (through the chunk cache)."""

    __slots__ = ()


class StoredChunkHandle(ChunkHandle):
    """A chunk stored raw: the header, then the stored file's bytes by range, from the
    stored file it opened (`StoredChunkFile`, held open until `close`)."""

    __slots__ = ("stored",)

    def __init__(self, path: Path, inode: Inode, array: Any, coords: tuple[int, ...], stored: Any) -> None:
        super().__init__(path, inode, array, coords)
        self.stored = stored  # a reload puts the stored file as it is now in its place

    def read_cached(self, off: int, size: int) -> bytes | None:
        return self.stored.read_nowait(off, size)

    def read(self, off: int, size: int) -> bytes:
        for _ in range(3):  # (None: closed meanwhile, a reload put another in its place)
            data = self.stored.read(off, size)
            if data is not None:
                return data
        return super().read(off, size)  # (no longer this kind: the decoded chunk, same bytes)

    def close(self) -> None:
        self.stored.close()
