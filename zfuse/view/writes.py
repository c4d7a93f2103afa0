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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from zfuse.errors import InvalidTiffError, ZfuseError
from zfuse.stats import Stats
from zfuse.view.tiff_input import decode_tiff, max_file_size
from zfuse.view.tree import DIR, FILE, ArrayView, Entry, View

log = logging.getLogger("zfuse.writes")

Thread = Callable[..., Awaitable[Any]]
Path = tuple[str, ...]
SCRATCH_MAX_BYTES = 8 * 1024**3


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
    handles: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)

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
        arr, rest = self.view.array_at(path)
        if arr is None or not rest:
            raise NotAllowedError(errno.EPERM, "files can only be created inside array directories")
        if arr.layout is None:
            raise NotAllowedError(errno.EPERM, f"array {arr.source.name!r} has no TIFF view: {arr.unsupported}")
        coords = arr.coords_of(rest)
        if coords is None and _looks_like_chunk(arr, rest):
            raise NotAllowedError(errno.EINVAL, f"{'/'.join(rest)} is outside the chunk grid {arr.source.grid_shape}")
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
        if state is None:
            if entry is None or entry.array is None or entry.coords is None:
                raise NotAllowedError(errno.ENOENT, "no such chunk")
            return OpenFile(path, array=entry.array, coords=entry.coords)
        if flags & os.O_TRUNC and wants_write:
            state.buffer = bytearray()
            state.dirty = True
            state.mtime_ns = time.time_ns()
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
        if state.buffer is None:
            await thread(_loaded, state)
        buffer = state.buffer
        assert buffer is not None
        if off == len(buffer):
            buffer += buf  # the common sequential case: one copy
        else:
            if end > len(buffer):
                buffer.extend(bytes(end - len(buffer)))
            buffer[off:end] = buf
        state.dirty = True
        state.mtime_ns = time.time_ns()
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
            state.dirty = True
            state.mtime_ns = time.time_ns()
            if standalone and not state.scratch:
                # truncate(1) with no open file: the change must commit or fail now
                await self._commit(state, thread)
        finally:
            if standalone and not state.scratch:
                self.states.pop(path, None)

    async def flush(self, handle: OpenFile, thread: Thread) -> bool:
        state = handle.state
        if state is None or not state.dirty or state.scratch:
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

    async def _commit(self, state: FileState, thread: Thread) -> None:
        arr, coords = state.array, state.coords
        assert arr is not None and coords is not None and arr.layout is not None
        await self._store_tiff(arr, coords, bytes(state.buffer or b""), thread)
        state.dirty = False
        # Readers now see the stored chunk; the buffer is dropped so they get
        # our canonical TIFF of the new values.
        state.buffer = None
        self.mtimes[state.path] = state.mtime_ns

    async def _store_tiff(self, arr: ArrayView, coords: tuple[int, ...], data: bytes, thread: Thread) -> None:
        """Parse `data` as a TIFF of chunk `coords` and store it; errors name the chunk's key."""
        try:
            await thread(_commit_chunk, arr, coords, data)
        except InvalidTiffError as e:
            self.stats.count("rejected_writes")
            raise InvalidTiffError(f"{arr.source.name}/{arr.source.chunk_key(coords)}: {e}") from e
        self.stats.count("chunks_written")

    async def commit_all(self, thread: Thread) -> None:
        """On shutdown: commit what open files hold, if it parses (best effort, logged)."""
        for state in list(self.states.values()):
            if state.dirty and not state.scratch and state.buffer:
                try:
                    await self._commit(state, thread)
                except Exception as e:
                    log.error("at shutdown, %s not committed: %s", "/".join(state.path), e)

    def release(self, handle: OpenFile) -> None:
        state = handle.state
        if state is None:
            return
        state.handles -= 1
        if state.handles <= 0 and not (state.scratch or state.placeholder):
            self.states.pop(state.path, None)

    # -- namespace ---------------------------------------------------------------
    async def unlink(self, path: Path, thread: Thread) -> None:
        self._check_writable()
        state = self.states.get(path)
        if state is not None and state.scratch:
            del self.states[path]
            return
        arr, rest = self.view.array_at(path)
        coords = arr.coords_of(rest) if arr is not None and rest else None
        if arr is None or coords is None:
            raise NotAllowedError(errno.EPERM, "only chunk files and scratch files can be removed")
        if not arr.exists(coords):
            if state is not None:
                del self.states[path]
                return
            raise NotAllowedError(errno.ENOENT, "no such chunk")
        await thread(arr.source.delete_chunk, coords)
        arr.forget(coords)
        arr.remove_chunk(coords)
        self.states.pop(path, None)
        self.stats.count("chunks_deleted")

    async def rename(self, old: Path, new: Path, flags: int, thread: Thread) -> None:
        self._check_writable()
        if flags:
            raise NotAllowedError(errno.EINVAL, "rename flags are not supported")
        src = self.states.get(old)
        new_arr, new_coords = self._chunk_target(new)
        if src is not None and src.scratch:
            if new_coords is None:  # scratch -> scratch
                del self.states[old]
                src.path = new
                self.states[new] = src
                return
            await self._store_tiff(new_arr, new_coords, bytes(src.buffer or b""), thread)
            del self.states[old]
            return
        old_arr, old_rest = self.view.array_at(old)
        old_coords = old_arr.coords_of(old_rest) if old_arr is not None and old_rest else None
        if old_arr is None or old_coords is None or not old_arr.exists(old_coords):
            raise NotAllowedError(errno.ENOENT if old_arr else errno.EPERM, "no such chunk or scratch file")
        data = await thread(old_arr.read, old_coords, 0, old_arr.file_size(old_coords))
        if new_coords is None:  # chunk -> scratch: the chunk leaves the store
            self.states[new] = FileState(new, new_arr, None, buffer=bytearray(data), scratch=True)
        else:
            await thread(_commit_chunk, new_arr, new_coords, data)
        await thread(old_arr.source.delete_chunk, old_coords)
        old_arr.forget(old_coords)
        old_arr.remove_chunk(old_coords)

    async def mkdir(self, path: Path) -> Entry:
        self._check_writable()
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
    import re

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
