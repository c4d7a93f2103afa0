"""Writes through the view: TIFF files in, Zarr chunks out, nothing ever lost.

No FUSE here: the adapter calls these methods with a `thread` coroutine
function that runs blocking work in a worker thread.

Semantics (SEMANTICS.md is the user-facing statement):
- An open chunk file is an in-memory buffer shared by every handle on that
  path. Writes may land at any offset; reads on the path see the buffer.
- Without O_TRUNC the buffer starts as the file's current bytes (our TIFF),
  so patching pixel bytes in place works.
- flush (close) commits a dirty chunk buffer: it is parsed as a TIFF,
  checked against the chunk's shape and dtype, and written through the
  array's codecs. A file that does not parse fails close() and the stored
  chunk is unchanged.
- A name in an array directory that is not a chunk of the grid is a scratch
  file: it lives in this process only. Renaming it onto a chunk name commits
  it (the atomic-save pattern); scratch files never reach the store.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import trio

from zfuse.errors import InvalidTiffError, ZfuseError
from zfuse.stats import Stats
from zfuse.view.tiff_input import decode_tiff, max_file_size
from zfuse.view.tree import DIR, FILE, META_NAME, ArrayView, Entry, View

log = logging.getLogger("zfuse.writes")

Thread = Callable[..., Awaitable[Any]]
Path = tuple[str, ...]
SCRATCH_MAX_BYTES = 8 * 1024**3
NAME_MAX = 255
RENAME_NOREPLACE = 1


class Released(Enum):
    """What a release changed, for the adapter's kernel cache invalidation."""

    NOTHING = 0
    COMMITTED = 1  # the path now reads as the stored chunk: drop cached data
    VANISHED = 2  # a never-stored file is gone: drop the directory entry


class ReadOnlyError(ZfuseError):
    """A write on a read-only mount (EROFS)."""


class FileTooLargeError(ZfuseError):
    """A write past the size any TIFF of this chunk could need (EFBIG)."""


class NotAllowedError(ZfuseError, OSError):
    """An operation that makes no sense on the view (carries its errno)."""

    def __init__(self, code: int, message: str) -> None:
        OSError.__init__(self, code, message)


@dataclass
class FileState:
    """The content of one path while it is open for writing or is a scratch file."""

    path: Path
    array: ArrayView | None
    coords: tuple[int, ...] | None
    buffer: bytearray | None = None  # None: not loaded yet (the stored file's bytes)
    dirty: bool = False
    scratch: bool = False
    placeholder: bool = False  # an empty new chunk file, not stored until written
    detached: bool = False  # unlinked or replaced while open: never committed
    committed: bool = False  # stored at least once while open
    generation: int = 0  # bumped by every change: a commit only clears what it stored
    handles: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)
    commit_lock: trio.Lock = field(default_factory=trio.Lock)

    def changed(self) -> None:
        self.dirty = True
        self.generation += 1
        self.mtime_ns = time.time_ns()

    @property
    def limit(self) -> int:
        if self.array is not None and self.array.layout is not None:
            return max_file_size(self.array.layout)
        return SCRATCH_MAX_BYTES


class OpenFile:
    """One open file handle."""

    def __init__(
        self,
        path: Path,
        *,
        state: FileState | None = None,
        array: ArrayView | None = None,
        coords: tuple[int, ...] | None = None,
        content: bytes | None = None,
        writable: bool = False,
    ) -> None:
        self.path = path
        self.state = state
        self.array = array
        self.coords = coords
        self.content = content
        self.writable = writable
        self.inode = 0  # set by the adapter: fstat after unlink/rename finds the handle by it

    @classmethod
    def readonly_bytes(cls, path: Path, content: bytes) -> OpenFile:
        return cls(path, content=content)

    def entry(self) -> Entry:
        if self.state is not None and self.state.buffer is not None:
            return Entry(FILE, size=len(self.state.buffer), array=self.array, coords=self.coords, node="chunk")
        if self.content is not None:
            return Entry(FILE, size=len(self.content), node="meta")
        assert self.array is not None and self.coords is not None
        return Entry(FILE, size=self.array.file_size(self.coords), array=self.array, coords=self.coords, node="chunk")

    def read_cached(self, off: int, size: int) -> bytes | None:
        """Bytes from memory if they are there (no thread hop), else None."""
        if self.content is not None:
            return self.content[off : off + size]
        if self.state is not None and self.state.buffer is not None:
            return bytes(self.state.buffer[off : off + size])
        if self.state is None and self.array is not None and self.coords is not None:
            return self.array.read_cached(self.coords, off, size)
        return None

    def read(self, off: int, size: int) -> bytes:
        """Bytes at [off, off+size) (blocking: may decode the chunk)."""
        if self.state is not None:
            return bytes(_loaded(self.state)[off : off + size])
        assert self.array is not None and self.coords is not None
        return self.array.read(self.coords, off, size)


def _loaded(state: FileState) -> bytearray:
    """The state's buffer, loading the stored file's bytes first if needed (blocking)."""
    if state.buffer is None:
        if state.array is not None and state.coords is not None and state.array.exists(state.coords):
            arr, coords = state.array, state.coords
            state.buffer = bytearray(arr.read(coords, 0, arr.file_size(coords)))
        else:
            state.buffer = bytearray()
    return state.buffer


class Writes:
    """Open files, scratch files and commits for one view."""

    def __init__(self, view: View, *, read_only: bool, stats: Stats) -> None:
        self.view = view
        self.read_only = read_only
        self.stats = stats
        self.states: dict[Path, FileState] = {}
        self.made_dirs: set[Path] = set()
        self.mtimes: dict[Path, int] = {}

    # -- lookups ------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError("the mount is read-only")

    def pending_entry(self, path: Path) -> Entry | None:
        state = self.states.get(path)
        if state is not None and (state.scratch or not self._stored(state)):
            return Entry(FILE, size=len(state.buffer or b""), array=state.array, coords=state.coords, node="chunk")
        if path in self.made_dirs:
            return Entry(DIR, node="keydir")
        return None

    def _stored(self, state: FileState) -> bool:
        return state.array is not None and state.coords is not None and state.array.exists(state.coords)

    def open_file_for(self, path: Path) -> OpenFile | None:
        state = self.states.get(path)
        if state is None or state.buffer is None:
            return None
        return OpenFile(path, state=state, array=state.array, coords=state.coords, writable=True)

    def scratch_in(self, dir_path: Path) -> list[tuple[str, Entry]]:
        out = []
        for path in self.states:
            if path[:-1] == dir_path:
                entry = self.pending_entry(path)
                if entry is not None:
                    out.append((path[-1], entry))
        for path in self.made_dirs:
            if path[:-1] == dir_path:
                out.append((path[-1], Entry(DIR, node="keydir")))
        return sorted(out, key=lambda item: item[0])

    @property
    def touched(self) -> bool:
        """Whether any path has its own mtime (else every path has the mount's)."""
        return bool(self.states or self.mtimes)

    def mtime_ns(self, path: Path) -> int | None:
        state = self.states.get(path)
        if state is not None:
            return state.mtime_ns
        return self.mtimes.get(path)

    def touch(self, path: Path, mtime_ns: int) -> None:
        state = self.states.get(path)
        if state is not None:
            state.mtime_ns = mtime_ns
        self.mtimes[path] = mtime_ns

    def _chunk_target(self, path: Path) -> tuple[ArrayView, tuple[int, ...] | None]:
        """The array a path is in, and the chunk it names (None: a scratch name)."""
        if len(os.fsencode(path[-1])) > NAME_MAX:
            raise NotAllowedError(errno.ENAMETOOLONG, f"name longer than {NAME_MAX} bytes")
        arr, rest = self.view.array_at(path)
        if arr is None or not rest:
            raise NotAllowedError(errno.EPERM, "files can only be created inside array directories")
        if rest == (META_NAME,):
            raise NotAllowedError(errno.EPERM, f"{META_NAME} is the view's metadata and cannot be replaced")
        if arr.layout is None:
            raise NotAllowedError(errno.EPERM, f"array {arr.source.name!r} has no TIFF view: {arr.unsupported}")
        coords = arr.coords_of(rest)
        if coords is None and _looks_like_chunk(arr, rest):
            raise NotAllowedError(
                errno.EINVAL,
                f"{'/'.join(rest)} is not a chunk of the grid {arr.source.grid_shape} "
                f"(chunk names look like {arr.source.chunk_key(tuple(0 for _ in arr.source.shape))}.tiff)",
            )
        return arr, coords

    # -- open/create ----------------------------------------------------------
    async def open(self, path: Path, entry: Entry | None, flags: int, thread: Thread) -> OpenFile:
        wants_write = bool(flags & (os.O_WRONLY | os.O_RDWR))
        state = self.states.get(path)
        if state is None and entry is not None and entry.node == "chunk" and wants_write:
            self._check_writable()
            assert entry.array is not None and entry.coords is not None
            state = FileState(path, entry.array, entry.coords)
            self.states[path] = state
        elif wants_write:
            self._check_writable()
        if state is None and entry is None and wants_write:
            # The kernel still holds a dentry for a file that vanished (a refused
            # new file, dropped at release): an open for writing recreates it, as
            # the caller's O_CREAT would have.
            return await self.create(path, flags, thread)
        if state is None:
            if entry is None or entry.array is None or entry.coords is None:
                raise NotAllowedError(errno.ENOENT, "no such chunk")
            return OpenFile(path, array=entry.array, coords=entry.coords)
        if flags & os.O_TRUNC and wants_write:
            state.buffer = bytearray()
            state.changed()
        state.handles += 1
        return OpenFile(path, state=state, array=state.array, coords=state.coords, writable=wants_write)

    async def create(self, path: Path, flags: int, thread: Thread) -> OpenFile:
        self._check_writable()
        arr, coords = self._chunk_target(path)
        state = self.states.get(path)
        if state is None:
            state = FileState(path, arr, coords, buffer=bytearray(), dirty=coords is not None, scratch=coords is None)
            self.states[path] = state
        else:
            state.buffer = bytearray()
            state.changed()
            state.dirty = not state.scratch
        state.handles += 1
        return OpenFile(path, state=state, array=arr, coords=coords, writable=True)

    # -- data ---------------------------------------------------------------
    async def write(self, handle: OpenFile, off: int, buf: bytes, thread: Thread) -> int:
        state = handle.state
        if state is None or not handle.writable:
            raise NotAllowedError(errno.EBADF, "file not open for writing")
        end = off + len(buf)
        if end > state.limit:
            raise FileTooLargeError(f"{len(buf)} bytes at offset {off} exceed the {state.limit}-byte limit")
        buffer = state.buffer
        if buffer is None:
            buffer = await thread(_loaded, state)
        if off == len(buffer):
            buffer += buf  # the common sequential case: one copy
        else:
            if end > len(buffer):
                buffer.extend(bytes(end - len(buffer)))
            buffer[off:end] = buf
        state.changed()
        return len(buf)

    async def truncate(self, path: Path, size: int, handle: OpenFile | None, thread: Thread) -> None:
        self._check_writable()
        state = self.states.get(path)
        standalone = state is None
        if state is None:
            arr, coords = self._chunk_target(path)
            state = FileState(path, arr, coords)
            self.states[path] = state
        if size > state.limit:
            raise FileTooLargeError(f"size {size} exceeds the {state.limit}-byte limit")
        try:
            buffer = await thread(_loaded, state)
            if size == len(buffer) and not state.dirty:
                return
            if size < len(buffer):
                del buffer[size:]
            else:
                buffer.extend(bytes(size - len(buffer)))
            state.changed()
            if standalone and not state.scratch:
                # truncate(1) with no open file: the change must commit or fail now
                await self._commit(state, thread)
        finally:
            if standalone and not state.scratch:
                self.states.pop(path, None)

    async def flush(self, handle: OpenFile, thread: Thread) -> bool:
        """close() of a descriptor open for writing: commit (errors fail the close)."""
        state = handle.state
        if state is None or not handle.writable or not state.dirty or state.scratch or state.detached:
            return False
        if not state.buffer and not self._stored(state):
            # Created and closed with nothing written (`touch`, or tools that
            # create a file first and write it later): an empty placeholder that
            # stays in the daemon, listed, until a TIFF is written into it.
            state.placeholder = True
            return False
        await self._commit(state, thread)
        state.placeholder = False
        return True

    async def fsync(self, handle: OpenFile, thread: Thread) -> bool:
        """fsync(): store what the file holds if it is already a complete TIFF.

        A file still being written (not yet a TIFF) stays buffered and fsync
        succeeds: programs that sync mid-write must not fail; close() stores it
        or reports why not.
        """
        try:
            return await self.flush(handle, thread)
        except InvalidTiffError:
            return False

    async def _commit(self, state: FileState, thread: Thread) -> None:
        arr, coords = state.array, state.coords
        assert arr is not None and coords is not None and arr.layout is not None
        # One commit at a time per file; writes landing while it runs bump the
        # generation, so the file stays dirty and the next close stores them.
        async with state.commit_lock:
            generation = state.generation
            await self._store_tiff(arr, coords, bytes(state.buffer or b""), thread)
            if state.generation == generation:
                state.dirty = False
            state.committed = True
        # The writer's own bytes stay readable until the last handle closes;
        # then the path reads as our TIFF of the stored values.
        self.mtimes[state.path] = state.mtime_ns

    async def _store_tiff(self, arr: ArrayView, coords: tuple[int, ...], data: bytes, thread: Thread) -> None:
        """Parse `data` as a TIFF of chunk `coords` and store it; errors name the chunk's key."""
        try:
            await thread(_commit_chunk, arr, coords, data)
        except InvalidTiffError as e:
            self.stats.count("rejected_writes")
            key = arr.source.chunk_key(coords)
            raise InvalidTiffError(f"{arr.source.name}/{key}: {e}" if arr.source.name else f"{key}: {e}") from e
        self.stats.count("chunks_written")

    async def commit_all(self, thread: Thread) -> None:
        """On shutdown: commit what open files hold, if it parses (best effort, logged)."""
        for state in list(self.states.values()):
            if state.dirty and not state.scratch and state.buffer:
                try:
                    await self._commit(state, thread)
                except Exception as e:
                    log.error("at shutdown, %s not committed: %s", "/".join(state.path), e)

    def release(self, handle: OpenFile) -> Released:
        state = handle.state
        if state is None:
            return Released.NOTHING
        state.handles -= 1
        if state.handles > 0 or state.scratch or state.placeholder or state.detached:
            return Released.NOTHING
        if self.states.get(state.path) is state:
            del self.states[state.path]
        if state.committed or self._stored(state):
            return Released.COMMITTED
        return Released.VANISHED

    # -- namespace ---------------------------------------------------------------
    def _detach(self, path: Path) -> None:
        """The file at `path` is unlinked or replaced: its open handles keep their
        bytes but never commit (POSIX: an unlinked file's data goes nowhere)."""
        state = self.states.pop(path, None)
        if state is not None:
            state.detached = True
            state.dirty = False

    async def unlink(self, path: Path, thread: Thread) -> None:
        self._check_writable()
        state = self.states.get(path)
        if state is not None and state.scratch:
            self._detach(path)
            return
        arr, rest = self.view.array_at(path)
        coords = arr.coords_of(rest) if arr is not None and rest else None
        if arr is None or coords is None:
            raise NotAllowedError(errno.EPERM, "only chunk files and scratch files can be removed")
        if not arr.exists(coords):
            if state is not None:
                self._detach(path)
                return
            raise NotAllowedError(errno.ENOENT, "no such chunk")
        self._detach(path)
        await thread(arr.source.delete_chunk, coords)
        arr.forget(coords)
        arr.remove_chunk(coords)
        self.stats.count("chunks_deleted")

    def _exists(self, path: Path) -> bool:
        if path in self.states and self.pending_entry(path) is not None:
            return True
        entry = self.view.entry(path)
        return entry is not None and entry.node == "chunk"

    async def rename(self, old: Path, new: Path, flags: int, thread: Thread) -> None:
        self._check_writable()
        if flags & ~RENAME_NOREPLACE:
            raise NotAllowedError(errno.EINVAL, "only the RENAME_NOREPLACE flag is supported")
        if flags & RENAME_NOREPLACE and self._exists(new):
            raise NotAllowedError(errno.EEXIST, "target exists (RENAME_NOREPLACE)")
        src = self.states.get(old)
        old_entry = self.view.entry(old)
        if src is None and old_entry is not None and old_entry.kind == DIR:
            raise NotAllowedError(errno.EPERM, "directories cannot be renamed")
        new_arr, new_coords = self._chunk_target(new)
        if src is not None and src.scratch:
            if new_coords is None:  # scratch -> scratch
                self._detach(new)
                del self.states[old]
                src.path = new
                self.states[new] = src
                return
            await self._store_tiff(new_arr, new_coords, bytes(src.buffer or b""), thread)
            del self.states[old]
            self._detach(new)
            return
        old_arr, old_rest = self.view.array_at(old)
        old_coords = old_arr.coords_of(old_rest) if old_arr is not None and old_rest else None
        if old_arr is None or old_coords is None or not old_arr.exists(old_coords):
            raise NotAllowedError(errno.ENOENT if old_arr else errno.EPERM, "no such chunk or scratch file")
        if new_coords is None:
            # Taking a chunk out of the store into daemon memory (`mv x.tiff x.bak`)
            # would lose it at unmount: refuse, a copy does the job safely.
            raise NotAllowedError(errno.EPERM, "a chunk can only be renamed onto another chunk name; copy it instead")
        data = await thread(old_arr.read, old_coords, 0, old_arr.file_size(old_coords))
        await self._store_tiff(new_arr, new_coords, data, thread)
        self._detach(old)
        self._detach(new)
        await thread(old_arr.source.delete_chunk, old_coords)
        old_arr.forget(old_coords)
        old_arr.remove_chunk(old_coords)

    async def mkdir(self, path: Path) -> Entry:
        self._check_writable()
        if len(os.fsencode(path[-1])) > NAME_MAX:
            raise NotAllowedError(errno.ENAMETOOLONG, f"name longer than {NAME_MAX} bytes")
        arr, rest = self.view.array_at(path)
        if arr is None or not rest or not arr.is_key_prefix(rest):
            raise NotAllowedError(errno.EPERM, "only chunk key directories can be made")
        if self.view.entry(path) is not None or path in self.made_dirs:
            raise NotAllowedError(errno.EEXIST, "exists")
        self.made_dirs.add(path)
        return Entry(DIR, node="keydir")

    async def rmdir(self, path: Path) -> None:
        self._check_writable()
        if path in self.made_dirs:
            if any(p[: len(path)] == path for p in self.states):
                raise NotAllowedError(errno.ENOTEMPTY, "not empty")
            self.made_dirs.discard(path)
            return
        entry = self.view.entry(path)
        if entry is None:
            raise NotAllowedError(errno.ENOENT, "no such directory")
        if self.view.list_dir(path):
            raise NotAllowedError(errno.ENOTEMPTY, "not empty")
        raise NotAllowedError(errno.EPERM, "groups and arrays cannot be removed")


def _looks_like_chunk(arr: ArrayView, rest: Path) -> bool:
    """A `.tiff` name shaped like a chunk key but outside the grid (an error, not scratch)."""
    name = "/".join(rest)
    if not name.endswith(".tiff"):
        return False
    key = name[: -len(".tiff")]
    origin = arr.source.chunk_key(tuple(0 for _ in arr.source.shape))
    shape_of = re.sub(r"\d+", "0", key)
    return shape_of == origin


def _commit_chunk(arr: ArrayView, coords: tuple[int, ...], data: bytes) -> None:
    """Parse a written TIFF and store its values as chunk `coords` (blocking)."""
    assert arr.layout is not None
    source = arr.source
    region = source.chunk_region(coords)
    cropped = tuple(r.stop - r.start for r in region)
    values = decode_tiff(
        data,
        chunk_shape=tuple(source.chunk_shape),
        dtype=source.dtype,
        cropped_shape=cropped if cropped != tuple(source.chunk_shape) else None,
        layout=arr.layout,
    )
    source.write_chunk(coords, values)
    arr.forget(coords)
    arr.add_chunk(coords)
