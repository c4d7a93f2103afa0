"""Writes through the view: TIFF files in, Zarr chunks out, nothing ever lost.

No FUSE here: `zfuse.fs` calls these methods; blocking work runs through the
`run` coroutine function it passes in (a worker thread on a mount, a plain call
in tests). SEMANTICS.md is the user-facing statement of these rules.

- A path being written has one `FileState`, shared by every handle on it: an
  in-memory buffer, written at any offset. Without O_TRUNC it starts as the
  file's current bytes (our TIFF), so patching in place works.
- close() (flush) of a dirty chunk file classifies the buffer:
  * complete and valid: parsed, checked against the chunk's shape and dtype
    and stored through the array's codecs (a commit);
  * only the beginning of a TIFF (`incomplete_reason`): kept PENDING, not an
    error. It reads as written so far, can be reopened and finished, and
    commits when a close leaves it complete. Never completed, it is dropped
    after `pending_timeout` seconds (and at unmount), the reason journaled;
  * complete but wrong (dtype, shape, compression, not a TIFF): refused with
    EINVAL. The stored chunk is unchanged.
- unlink of a stored chunk hides it at once but deletes it from the store only
  after `replace_window` seconds (or at unmount). A file created at the same
  path meanwhile is a *replacement*: the stored chunk stays until the new file
  commits; a refused or abandoned replacement brings the old chunk back. So a
  tool that removes its destination before writing it (`mv` across
  filesystems, Bio-Formats `-overwrite`) can never cost the chunk.
- A name in an array directory that is not a chunk of the grid is a scratch
  file: it lives in this process only. Renaming it onto a chunk name commits
  it (the atomic-save pattern); scratch files never reach the store.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import trio

from zfuse import defaults
from zfuse.errors import (
    FileTooLargeError,
    InvalidTiffError,
    NotAllowedError,
    ReadOnlyError,
    RefusedAgainError,
)
from zfuse.stats import Stats
from zfuse.view.array_view import ArrayView
from zfuse.view.entry import META_NAME, Entry, Node
from zfuse.view.hierarchy import NAME_MAX
from zfuse.view.tiff_complete import EARLY_LOOKS, early_refusal, incomplete_reason, walk_tiff
from zfuse.view.tiff_input import decode_tiff, max_file_size

if TYPE_CHECKING:
    from zfuse.view.tree import View

__all__ = [
    "FileState", "Phase", "Released", "Writes", "RENAME_NOREPLACE", "NAME_MAX",
    "FileTooLargeError", "NotAllowedError", "ReadOnlyError",
]

log = logging.getLogger("zfuse.writes")

Run = Callable[..., Awaitable[Any]]
Path = tuple[str, ...]
SCRATCH_MAX_BYTES = 8 * 1024**3
# files whose own mtime (a write's, a utimes') is remembered: the latest ones; an older
# one shows the mount's start again (a conversion writing a million chunks, a walker
# touching every file, would otherwise grow this without end, ~150 bytes each)
MTIMES_KEPT = 100_000
RENAME_NOREPLACE = 1
REPLACE_WINDOW = defaults.REPLACE_WINDOW
PENDING_TIMEOUT = defaults.PENDING_TIMEOUT
CHECKED_AHEAD = 2  # chunks after a committed one whose existence the commit checks (local stores)
#: IFD entries a close() walks on the event loop (some 0.1 ms): a file with more is
#: walked in a worker thread (a hop there and back costs a cp about 0.15 ms per file)
INLINE_ENTRIES = 256
#: bytes that the commits of written files may hold at once while they decode and
#: encode (each counts its file, and its chunk three times: the decoded pages, the
#: chunk's values and the encoded chunk): bounded together, never by the machine
DECODE_BUDGET = 512 * 2**20


class MemoryBudget:
    """Bytes shared by concurrent holders; a holder waits until its bytes fit. One
    asking for more than the whole budget runs alone (it must be able to run)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._changed = trio.Condition()

    async def hold(self, nbytes: int) -> int:
        """Wait until `nbytes` (at most the total) fit; returns what was taken."""
        nbytes = min(max(nbytes, 0), self.total)
        async with self._changed:
            while self.used + nbytes > self.total:
                await self._changed.wait()
            self.used += nbytes
        return nbytes

    async def release(self, nbytes: int) -> None:
        with trio.CancelScope(shield=True):
            async with self._changed:
                self.used -= nbytes
                self._changed.notify_all()


class Phase(Enum):
    """Where a written file is in its life."""

    OPEN = "open"  # held by at least one handle
    PENDING = "pending"  # closed while still an incomplete TIFF: kept, reopenable, expires
    DETACHED = "detached"  # unlinked or replaced while open: readable by its handles, never stored


class Released(Enum):
    """What a release changed, for the caller's kernel cache invalidation."""

    NOTHING = 0
    COMMITTED = 1  # the path now reads as the stored chunk: drop cached data
    VANISHED = 2  # a never-stored file is gone: drop the directory entry
    PENDING = 3  # kept as an incomplete file: its size is the buffer's
    REVERTED = 4  # a refused replacement is dropped: the path reads the stored chunk again
    # stored by a flush or fsync, unchanged and its size not reported since: that commit
    # dropped cached data (the caller's `stored`), nothing more to drop (a `cp` is this)
    FLUSHED = 5


@dataclass
class FileState:
    """The content of one path while it is written, pending, or a scratch file."""

    path: Path
    array: ArrayView | None
    coords: tuple[int, ...] | None
    buffer: bytearray | None = None  # None: not loaded yet (the stored file's bytes)
    scratch: bool = False
    phase: Phase = Phase.OPEN
    dirty: bool = False
    committed: bool = False  # stored at least once while open
    # the buffer's size was reported after the last commit's start (that commit's cache
    # drop may precede it): the kernel may hold it as the size until the release drops it
    size_shown: bool = False
    generation: int = 0  # bumped by every change: a commit only clears what it stored
    handles: int = 0
    writers: set[int] = field(default_factory=set)  # processes that wrote it (see their bytes)
    # the threads that opened it for writing: asking again from one of them (cp's fstat
    # after its open) needs no look-up of its process
    writer_threads: set[int] = field(default_factory=set)
    incomplete: str | None = None  # why the last close left it pending
    # whether its first IFD has been looked at once written (`early_refusal`), and why
    # it can never be the chunk: every write after that fails, and so does the close
    ifd_checked: bool = False
    ifd_looks: int = 0
    refused: str | None = None
    mtime_ns: int = field(default_factory=time.time_ns)
    changed_at: float = 0.0  # the Writes clock: pending files expire from here
    # bytes its buffer was allowed to reach (`Writes._check_buffers`): counted from the
    # check on, before a load of the stored file lands (concurrent first writes all
    # passed the check before any load did)
    reserved: int = 0
    readers: int = 0  # handles reading its buffer without writing (`Writes.reader_opened`)
    commit_lock: trio.Lock = field(default_factory=trio.Lock)
    # set while its buffer is zero-filled in a worker thread (`Writes._grow`): other
    # changes of the buffer wait for it
    growing: trio.Event | None = None

    def start_over(self) -> None:
        """The file is emptied (O_TRUNC, a new create, truncated to 0): what its first
        IFD decided no longer holds, nor what its buffer was allowed before."""
        self.ifd_checked, self.ifd_looks, self.refused = False, 0, None
        self.reserved = 0

    def changed(self, now: float) -> None:
        self.dirty = True
        self.generation += 1
        self.mtime_ns = time.time_ns()
        self.changed_at = now

    @property
    def limit(self) -> int:
        return file_limit(self.array)

    def write_shapes(self, data: bytes | bytearray | memoryview) -> list[tuple[int, ...]]:
        """The shapes the file written may have (`ArrayView.written_shapes`)."""
        assert self.array is not None and self.coords is not None
        return self.array.written_shapes(self.coords, data)


def file_limit(array: ArrayView | None) -> int:
    """The most bytes a file written for one of `array`'s chunks may have, or a scratch
    file's (no array)."""
    if array is not None and array.layout is not None:
        return max_file_size(array.layout)
    return SCRATCH_MAX_BYTES


async def _growth_done(state: FileState) -> None:
    """Wait while the file's buffer is zero-filled in a worker thread (no checkpoint
    otherwise: writes stay in the order they came)."""
    while state.growing is not None:
        await state.growing.wait()


def _held_by(state: FileState) -> int:
    """Bytes a file's buffer holds, or may hold once a load under way lands."""
    return max(len(state.buffer) if state.buffer is not None else 0, state.reserved)


def _stored_size(state: FileState) -> int:
    """Bytes loading a file's stored chunk brings (its chunk file's size: metadata only;
    a chunk not stored brings nothing, counted all the same)."""
    if state.array is not None and state.coords is not None:
        return state.array.file_size(state.coords)
    return 0


def read_state(state: FileState, off: int, size: int) -> bytes:
    """Bytes of a file being written (blocking): its buffer's, or, not loaded yet, the
    stored chunk file's, read where it is (a read loads nothing: 20 files opened O_RDWR
    and read a byte each held 2.5 times the write buffers' budget, uncounted)."""
    if state.buffer is not None:
        return bytes(state.buffer[off : off + size])
    if state.array is not None and state.coords is not None and state.array.exists(state.coords):
        return bytes(state.array.read(state.coords, off, size))
    return b""


#: bytes a write or truncate may zero-fill on the event loop; more is filled in a worker
#: thread, ZERO_STEP at a time (the GIL let go between steps): a 1-byte write at 1 GiB
#: held every request of the mount for a second
GROW_INLINE = 1 << 20
ZERO_STEP = 16 << 20
_ZEROS = memoryview(bytes(ZERO_STEP))


def _zero_fill(buffer: bytearray, end: int) -> None:
    """Grow `buffer` with zeros to `end` bytes (blocking)."""
    while len(buffer) < end:
        buffer += _ZEROS[: min(ZERO_STEP, end - len(buffer))]


def load_buffer(state: FileState) -> bytearray:
    """The state's buffer, loading the stored file's bytes first if needed (blocking)."""
    if state.buffer is None:
        if state.array is not None and state.coords is not None and state.array.exists(state.coords):
            arr, coords = state.array, state.coords
            state.buffer = bytearray(arr.read(coords, 0, arr.file_size(coords)))
        else:
            state.buffer = bytearray()
    return state.buffer


async def _nothing(path: Path) -> None:
    return None


class Writes:
    """Open, pending and scratch files, commits and deferred deletions for one view."""

    def __init__(
        self,
        view: View,
        *,
        read_only: bool,
        stats: Stats,
        run: Run,
        clock: Callable[[], float] = time.monotonic,
        replace_window: float = REPLACE_WINDOW,
        pending_timeout: float = PENDING_TIMEOUT,
        journal: Callable[[Path, str], None] | None = None,
        before_replace: Callable[[Path], Awaitable[None]] = _nothing,
        process: Callable[[int], int] = lambda pid: pid,
        decode_budget: int = DECODE_BUDGET,
        buffer_budget: int = defaults.WRITE_BUFFERS,
    ) -> None:
        self.view = view
        self.read_only = read_only
        self.stats = stats
        self.run = run
        self.clock = clock
        self.replace_window = replace_window
        self.pending_timeout = pending_timeout
        self.journal = journal or (lambda path, reason: None)
        self.before_replace = before_replace  # readers of `path` keep its bytes
        # a request's thread id -> its process; asked only where the answer matters
        self.process = process
        self.decode_budget = MemoryBudget(decode_budget)
        self.buffer_budget = buffer_budget  # bytes all write buffers may hold together
        # at least the bytes all write buffers hold (`_check_buffers`)
        self._held_bound = 0
        self.states: dict[Path, FileState] = {}
        # unlinked or replaced while open (DETACHED), by id: still held, and written to,
        # by their handles until the last closes; counted with `states` (139 files filled
        # after their unlink held 3.25 GiB the budget never saw)
        self.detached: dict[int, FileState] = {}
        self.removed: dict[Path, float] = {}  # unlinked chunks still in the store: deadline
        self.made_dirs: set[Path] = set()
        self.mtimes: dict[Path, int] = {}
        # one change of a path's stored chunk at a time (`_changing`): [lock, users]
        self._path_locks: dict[Path, list[Any]] = {}

    @contextlib.asynccontextmanager
    async def _changing(self, *paths: Path) -> AsyncIterator[None]:
        """Hold `paths` while their stored chunks change (a commit, a rename, an unlink),
        taken in one order (no two holders wait on each other). A rename or unlink of a
        chunk whose commit is running waits for it and then wins: otherwise the commit,
        ending later, stored over the rename's chunk or brought back the unlinked one."""
        async with contextlib.AsyncExitStack() as held:
            for path in sorted(set(paths)):
                entry = self._path_locks.setdefault(path, [trio.Lock(), 0])
                entry[1] += 1
                held.callback(self._unused, path)
                await held.enter_async_context(entry[0])
            yield

    def _unused(self, path: Path) -> None:
        entry = self._path_locks[path]
        entry[1] -= 1
        if not entry[1]:
            del self._path_locks[path]  # (bounded by the changes under way)

    # -- lookups ------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError("the mount is read-only")

    def stored(self, state: FileState) -> bool:
        """Whether the store holds a chunk at the state's path (visible, not unlinked)."""
        return (
            state.array is not None
            and state.coords is not None
            and state.path not in self.removed
            and state.array.exists(state.coords)
        )

    def is_removed(self, path: Path) -> bool:
        """An unlinked chunk not yet deleted from the store: hidden from lookups and listings."""
        return path in self.removed and path not in self.states

    def sees_buffer(self, state: FileState, pid: int | None) -> bool:
        """Whether the requester `pid` (a thread id: its process is looked up only when it
        decides the answer) reads the state's buffer rather than the stored chunk.

        The writing process sees its own bytes (Bio-Formats and libtiff read back
        what they wrote, even through a second descriptor); every other process
        sees the stored chunk until the replacement commits. Where nothing is
        stored, the buffer is the file.
        """
        if state.scratch or not self.stored(state):
            return True
        # Even once committed: the stored chunk is what the path reads as after the
        # release, and a next `cp` may empty the buffer before that release arrives.
        return pid is not None and (pid in state.writer_threads or self.process(pid) in state.writers)

    def _add_writer(self, state: FileState, pid: int) -> None:
        state.writers.add(self.process(pid))
        state.writer_threads.add(pid)

    def entry_for(self, path: Path, pid: int | None) -> Entry | None:
        """The entry of a path with a state, as process `pid` sees it (None: no state)."""
        state = self.states.get(path)
        if state is None:
            if path in self.made_dirs:
                return Entry(Node.KEYDIR)
            return None
        if self.sees_buffer(state, pid):
            size = len(state.buffer) if state.buffer is not None else None
            if size is not None:
                state.size_shown = True  # the kernel may keep it: the release must drop it
        else:
            size = None
        if size is None:
            assert state.array is not None and state.coords is not None
            size = state.array.file_size(state.coords)
        return Entry(Node.CHUNK, size=size, array=state.array, coords=state.coords)

    def scratch_in(self, dir_path: Path) -> list[tuple[str, Entry]]:
        """Entries of `dir_path` that only the daemon holds (new files, scratch, made dirs)."""
        out = []
        for path, state in self.states.items():
            if path[:-1] == dir_path and (state.scratch or not self.stored(state)):
                out.append((path[-1], self.entry_for(path, None)))
        for path in self.made_dirs:
            if path[:-1] == dir_path:
                out.append((path[-1], Entry(Node.KEYDIR)))
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
        self._keep_mtime(path, mtime_ns)

    def _keep_mtime(self, path: Path, mtime_ns: int) -> None:
        """Remember `path`'s own mtime, as the latest (at most MTIMES_KEPT are)."""
        mtimes = self.mtimes
        mtimes.pop(path, None)
        mtimes[path] = mtime_ns
        if len(mtimes) > MTIMES_KEPT:
            del mtimes[next(iter(mtimes))]  # (the oldest: dicts keep insertion order)

    def chunk_target(self, path: Path) -> tuple[ArrayView, tuple[int, ...] | None]:
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
    async def open(self, path: Path, entry: Entry | None, flags: int, pid: int | None) -> FileState:
        """Open `path` for writing (an existing chunk or a file with a state). Waits for
        a rename or unlink of it under way (`_changing`): a writer opened meanwhile
        would be detached by it, and its bytes lost."""
        self._check_writable()
        if path not in self.states and entry is None:
            # The kernel still holds a dentry for a file that vanished (a refused
            # new file, dropped at release): recreate it, as O_CREAT would have.
            return await self.create(path, flags, pid)
        if path not in self.states and entry is not None and entry.array is not None and entry.coords is not None:
            await self._check_store_writable(entry.array, entry.coords)
        async with self._changing(path):
            return self._open(path, entry, flags, pid)

    async def _check_store_writable(self, arr: ArrayView, coords: tuple[int, ...] | None) -> None:
        """Refuse now (EACCES, EROFS, EPERM) a write or deletion of chunk `coords` that the store
        is known to refuse (`ChunkSource.write_refusal`: a local directory this process
        may not write), before a file is written whole only to fail at close(), or an
        `rm` says 0 and the chunk comes back."""
        if coords is None:
            return
        refusal = await self.run(arr.source.write_refusal, coords)
        if refusal is not None:
            raise NotAllowedError(refusal.errno or errno.EACCES, f"{arr.key_name(coords)}: {refusal.strerror}")

    async def _check_chunk_writable(self, path: Path) -> None:
        """`_check_store_writable` for the chunk at `path`, unless it is a scratch file
        (the daemon's own) or no chunk."""
        state = self.states.get(path)
        if state is None or not state.scratch:
            arr, coords = self.view.chunk_at(path)
            if arr is not None:
                await self._check_store_writable(arr, coords)

    def _open(self, path: Path, entry: Entry | None, flags: int, pid: int | None) -> FileState:
        state = self.states.get(path)
        if state is None:
            if path in self.removed:  # (unlinked while this open waited for the unlink)
                raise NotAllowedError(errno.ENOENT, "no such chunk: removed")
            if entry is None or entry.node is not Node.CHUNK or entry.array is None or entry.coords is None:
                raise NotAllowedError(errno.EACCES, "only chunk files can be written")
            self._check_files_held()
            state = FileState(path, entry.array, entry.coords, changed_at=self.clock())
            self.states[path] = state
        if state.phase is Phase.PENDING:
            state.phase = Phase.OPEN
        if flags & os.O_TRUNC:
            state.buffer = bytearray()
            state.changed(self.clock())
            state.start_over()
        if pid is not None:
            self._add_writer(state, pid)
        state.handles += 1
        return state

    async def create(self, path: Path, flags: int, pid: int | None) -> FileState:
        self._check_writable()
        if path not in self.states:
            await self._check_store_writable(*self.chunk_target(path))
        async with self._changing(path):  # (as `open`)
            return self._create(path, pid)

    def _create(self, path: Path, pid: int | None) -> FileState:
        arr, coords = self.chunk_target(path)
        state = self.states.get(path)
        if state is None:
            self._check_files_held()
            state = FileState(path, arr, coords, buffer=bytearray(), scratch=coords is None)
            state.changed(self.clock())
            state.dirty = coords is not None
            self.states[path] = state
        else:
            state.buffer = bytearray()
            state.changed(self.clock())
            state.dirty = not state.scratch
            state.phase = Phase.OPEN
            state.start_over()
        if pid is not None:
            self._add_writer(state, pid)
        state.handles += 1
        return state

    # -- data ---------------------------------------------------------------
    async def write(self, state: FileState, off: int, buf: bytes, *, append: bool = False) -> int:
        """Write at `off`; O_APPEND handles write at the end of the file, whatever offset
        the kernel computed from the size it had cached (another process's view)."""
        if state.refused is not None:
            raise RefusedAgainError(f"the file was refused at an earlier write: {state.refused}")
        if state.buffer is None:
            self._check_buffers(state, _stored_size(state))  # (what loading it brings)
        if append:
            off = len(await self.run(load_buffer, state))
        end = off + len(buf)
        if end > state.limit:
            raise FileTooLargeError(f"{len(buf)} bytes at offset {off} exceed the {state.limit}-byte limit")
        self._check_buffers(state, end)
        buffer = state.buffer
        if buffer is None:
            buffer = await self.run(load_buffer, state)
        await _growth_done(state)
        if state.buffer is not buffer:
            # an O_TRUNC open started the file over while this write waited: it came
            # before that open, and goes with the bytes that open threw away
            return len(buf)
        if append and off != len(buffer):  # (another write grew it meanwhile)
            return await self.write(state, len(buffer), buf)
        if off == len(buffer):
            buffer += buf  # the common sequential case: one copy
        else:
            if end > len(buffer):
                await self._grow(state, buffer, end)
                if state.buffer is not buffer:  # (as above)
                    return len(buf)
            buffer[off:end] = buf
        state.changed(self.clock())
        if not state.ifd_checked and not state.scratch and state.array is not None:
            self._check_first_ifd(state, buffer)
        return len(buf)

    def _check_files_held(self) -> None:
        """ENOSPC past `defaults.FILES_HELD_MAX` files held (each ~2 KB, even empty: a
        loop of `touch` grew the daemon until unmount)."""
        held = len(self.states) + len(self.detached)
        if held >= defaults.FILES_HELD_MAX:
            raise NotAllowedError(
                errno.ENOSPC, f"the daemon holds {held} files being written, pending or "
                "scratch on this mount: close, finish or remove some before making more")

    def _check_buffers(self, state: FileState, end: int) -> None:
        """ENOSPC if growing `state`'s buffer to `end` bytes would take the write buffers
        of all files past `buffer_budget`: many writers at once cannot exhaust the
        daemon, each file being bounded already (`FileState.limit`). The files' bytes are
        summed only when `_held_bound` (every growth allowed since the last sum added)
        says the budget may be reached: summing 10,000 files held on every growing
        write made writes 16 times slower."""
        grow = end - _held_by(state)
        if grow <= 0:
            return
        if self._held_bound + grow > self.buffer_budget:
            held = sum(map(_held_by, self.states.values())) + sum(map(_held_by, self.detached.values()))
            self._held_bound = held
            if held + grow > self.buffer_budget:
                raise NotAllowedError(
                    errno.ENOSPC, f"the files being written on this mount would hold more than "
                    f"{self.buffer_budget // 2**20} MiB in the daemon (now {held // 2**20} MiB): "
                    "close some (or remove scratch files) before writing more")
        self._held_bound += grow
        state.reserved = end

    async def _grow(self, state: FileState, buffer: bytearray, end: int) -> None:
        """Zero-fill `buffer` to `end` bytes: on the event loop up to GROW_INLINE, else in
        a worker thread while the file's other changes wait (`_growth_done`)."""
        if end - len(buffer) <= GROW_INLINE:
            buffer.extend(bytes(end - len(buffer)))
            return
        state.growing = done = trio.Event()
        try:
            await self.run(_zero_fill, buffer, end)
        finally:
            state.growing = None
            done.set()

    def _check_first_ifd(self, state: FileState, buffer: bytearray) -> None:
        """Refuse at this write a file whose first IFD, now written, can never be the chunk
        (some writers never report close()'s error: tifffile ignores it). One IFD read with
        numpy: bounded work, on the event loop like the write itself."""
        assert state.array is not None
        decided, looked, reason = early_refusal(buffer, state.write_shapes(buffer), state.array.source.dtype)
        state.ifd_looks += looked
        state.ifd_checked = decided or state.ifd_looks >= EARLY_LOOKS
        if reason is not None:
            state.refused = reason
            state.incomplete = None  # refused, not pending: the last close drops it
            self.stats.count("rejected_writes")
            assert state.coords is not None
            raise InvalidTiffError(f"{state.array.key_name(state.coords)}: {reason}")

    async def truncate(self, path: Path, size: int, state: FileState | None, pid: int | None) -> None:
        """truncate/ftruncate; without an open file (truncate(1)) it commits or fails now."""
        self._check_writable()
        state = state or self.states.get(path)
        standalone = state is None
        if state is None:
            arr, coords = self.chunk_target(path)
            if coords is not None and not arr.exists(coords):
                raise NotAllowedError(errno.ENOENT, "no such chunk")
            self._check_files_held()
            state = FileState(path, arr, coords, changed_at=self.clock())
            self.states[path] = state
        try:
            if size > state.limit:
                raise FileTooLargeError(f"size {size} exceeds the {state.limit}-byte limit")
            # (180 scratch files truncated to their limit held 4.3 GiB)
            self._check_buffers(state, max(size, _stored_size(state) if state.buffer is None else 0))
            if pid is not None:
                self._add_writer(state, pid)
            buffer = await self.run(load_buffer, state)
            await _growth_done(state)
            if state.buffer is not buffer:  # (an O_TRUNC open started it over meanwhile: this was before)
                return
            if size == len(buffer) and not state.dirty:
                return
            if size == 0:
                state.start_over()  # a new file from here
            if size < len(buffer):
                del buffer[size:]
                state.reserved = size
            else:
                await self._grow(state, buffer, size)
                if state.buffer is not buffer:  # (started over meanwhile: this truncate was before)
                    return
            state.changed(self.clock())
            if standalone and not state.scratch:
                # truncate(1) with no open file: the change must commit or fail now
                data = bytes(buffer)
                reason = await self.run(incomplete_reason, data, state.write_shapes(data), state.limit)
                if reason:
                    raise InvalidTiffError(f"truncating to {size} bytes leaves no complete TIFF: {reason}")
                await self._commit(state)
        finally:
            if standalone and not state.scratch:
                self.states.pop(path, None)

    async def flush(self, state: FileState, stored: Callable[[], None] | None = None) -> bool:
        """close() of a descriptor open for writing: commit if complete; pending if
        incomplete; InvalidTiffError if complete but not this chunk. True: committed.
        `stored` runs in the commit's worker thread once the chunk is stored: the
        caller drops the kernel's cached data of the path there (release relies on it),
        without a thread of its own."""
        if not state.dirty or state.scratch or state.phase is Phase.DETACHED:
            return False
        if state.refused is not None:
            raise RefusedAgainError(f"not stored: {state.refused}")
        # A snapshot (writes may land meanwhile), walked here if its IFDs are few
        # (INLINE_ENTRIES: what a thread hop per close would cost more than), else in a
        # worker thread: the event loop never walks more than that.
        data, generation = bytes(state.buffer or b""), state.generation
        shapes = state.write_shapes(data)
        walk = walk_tiff(data, shapes, state.limit, max_entries=INLINE_ENTRIES)
        if walk.deferred:
            walk = await self.run(walk_tiff, data, shapes, state.limit)
        reason = walk.incomplete
        if reason is not None:
            state.incomplete = reason
            return False
        state.incomplete = None
        await self._commit(state, stored, data, generation)
        return True

    async def fsync(self, state: FileState, stored: Callable[[], None] | None = None) -> bool:
        """fsync(): store the file if it is already complete; an incomplete file stays
        buffered and fsync succeeds (programs that sync mid-write must not fail)."""
        return await self.flush(state, stored)

    async def _commit(self, state: FileState, stored: Callable[[], None] | None = None,
                      data: bytes | None = None, generation: int | None = None) -> None:
        """Store the state's bytes (`data`, a snapshot taken at `generation`, or the
        buffer as it is once no other commit of the file runs)."""
        arr, coords = state.array, state.coords
        assert arr is not None and coords is not None and arr.layout is not None
        # One commit at a time per file; writes landing while it runs bump the
        # generation, so the file stays dirty and the next close stores them.
        async with state.commit_lock, self._changing(state.path):
            if state.phase is Phase.DETACHED:
                return  # unlinked or replaced while it waited: never stored (as on a disk)
            if data is None or generation is None:
                data, generation = bytes(state.buffer or b""), state.generation
            state.size_shown = False  # the commit's cache drop (`stored`) comes after this
            await self.before_replace(state.path)
            await self.store_tiff(arr, coords, data, stored)
            self.removed.pop(state.path, None)  # a replacement: nothing left to delete
            if state.generation == generation:
                state.dirty = False
            state.committed = True
        self._keep_mtime(state.path, state.mtime_ns)

    async def store_tiff(self, arr: ArrayView, coords: tuple[int, ...], data: bytes,
                         stored: Callable[[], None] | None = None) -> None:
        """Parse `data` as a TIFF of chunk `coords` and store it, then call `stored` (in
        the same worker thread); errors name the chunk's key."""
        chunk_bytes = arr.layout.data_size if arr.layout is not None else 0
        # the file, the decoded chunk and what encoding it takes; a chunk checked to read
        # back the same (`checks_written_values`) the stored one, encoded and decoded too
        copies = 6 if arr.source.checks_written_values else 3
        held = await self.decode_budget.hold(len(data) + copies * chunk_bytes)
        try:
            await self.run(_commit_chunk, arr, coords, data, stored)
        except InvalidTiffError as e:
            self.stats.count("rejected_writes")
            raise InvalidTiffError(f"{arr.key_name(coords)}: {e}") from e
        finally:
            await self.decode_budget.release(held)
        self.stats.count("chunks_written")

    def release(self, state: FileState) -> Released:
        """The last close of one handle: what became of the file."""
        state.handles -= 1
        if state.phase is Phase.DETACHED and state.handles + state.readers <= 0:
            self.detached.pop(id(state), None)  # (its bytes go with its last handle)
        if state.handles > 0 or state.scratch or state.phase is Phase.DETACHED:
            return Released.NOTHING
        if state.dirty and state.incomplete is not None:
            state.phase = Phase.PENDING
            state.changed_at = self.clock()
            self.stats.count("pending_files")
            # A writer that closes and reopens (Bio-Formats) completes it soon; one that
            # wrote all it meant to (fewer planes than the chunk) must hear why nothing
            # landed now, not when the file is dropped.
            reason = (f"closed incomplete, pending ({state.incomplete}): not stored until a write "
                      f"completes it; dropped after {self.pending_timeout:g} s, the stored chunk "
                      "unchanged")
            if state.buffer:  # an emptied file (ImageMagick opens with O_TRUNC first) says nothing
                log.warning("%s: %s", "/".join(state.path), reason)
                self.journal(state.path, reason)
            return Released.PENDING
        if state.dirty and not state.buffer and not self.stored(state) and not state.committed:
            # created and closed empty (`touch`, tools that create first and fill
            # later): an empty placeholder, listed, never expiring, not stored
            state.phase = Phase.PENDING
            return Released.PENDING
        if self.states.get(state.path) is state:
            del self.states[state.path]
        if state.dirty and not state.committed:
            # refused at close: the file goes, the stored chunk (if any) stays
            return self._reinstate(state.path)
        if state.committed and not state.dirty and not state.size_shown:
            return Released.FLUSHED
        if state.committed or self.stored(state):
            return Released.COMMITTED
        return Released.VANISHED

    def _reinstate(self, path: Path) -> Released:
        """A replacement that never committed: an unlinked old chunk comes back."""
        if self.removed.pop(path, None) is not None:
            arr, coords = self.view.chunk_at(path)
            if arr is not None and coords is not None:
                arr.add_chunk(coords)
                return Released.REVERTED
        arr, coords = self.view.chunk_at(path)
        if arr is not None and coords is not None and arr.exists(coords):
            return Released.REVERTED
        return Released.VANISHED

    # -- time -------------------------------------------------------------------
    async def expire(self, *, everything: bool = False) -> list[Path]:
        """Carry out what is due: deletions past the replace window, pending files past
        their timeout (or all of them, at unmount). Returns the paths that changed."""
        now = self.clock()
        changed: list[Path] = []
        for path, state in list(self.states.items()):
            if state.phase is not Phase.PENDING or state.handles:
                continue
            if not state.buffer and not self.stored(state) and path not in self.removed:
                continue  # an empty placeholder costs nothing: kept until unmount
            if not everything and now - state.changed_at < self.pending_timeout:
                continue
            del self.states[path]
            if state.buffer:
                self.stats.count("abandoned_writes")
                what = "the stored chunk is unchanged" if path in self.removed or self.stored(state) \
                    else "nothing was stored"
                when = "at unmount" if everything else f"after {self.pending_timeout:g} s"
                reason = f"incomplete file dropped {when} ({state.incomplete or 'never completed'}); {what}"
                log.warning("%s: %s", "/".join(path), reason)
                self.journal(path, reason)
            self._reinstate(path)
            changed.append(path)
        for path, deadline in list(self.removed.items()):
            if path in self.states or (not everything and now < deadline):
                continue
            arr, coords = self.view.chunk_at(path)
            if arr is None or coords is None:
                del self.removed[path]
                continue
            await self.before_replace(path)
            try:
                await self.run(arr.delete_stored, coords)
            except Exception as e:
                self.removed.pop(path, None)
                # the chunk is still stored: show it again rather than pretend
                arr.add_chunk(coords)
                self.stats.count("errors")
                log.error("deleting %s from the store failed, it is shown again: %s", arr.key_name(coords), e)
                self.journal(path, f"rm: deleting {arr.key_name(coords)} from the store failed, "
                             f"the chunk is shown again: {e}")
                changed.append(path)
                continue
            self.removed.pop(path, None)  # only now: `settle` waits for the store itself
            log.info("deleted %s from the store (unlinked, not replaced)", arr.key_name(coords))
            self.stats.count("chunks_deleted")
            changed.append(path)
        return changed

    def due_in(self) -> float | None:
        """Seconds from now (on this object's clock) until `expire` has something to do;
        None: nothing scheduled. Callers that sleep must use this, not subtract a
        deadline from another clock (trio's has another origin)."""
        due = self.next_deadline()
        return None if due is None else max(due - self.clock(), 0.0)

    def next_deadline(self) -> float | None:
        """When `expire` next has something to do (None: nothing scheduled)."""
        times = list(self.removed.values())
        times += [s.changed_at + self.pending_timeout for s in self.states.values()
                  if s.phase is Phase.PENDING and s.buffer]
        return min(times) if times else None

    async def shutdown(self) -> None:
        """At unmount: commit what open files hold if complete, drop what is pending,
        carry out deferred deletions (each logged; never raises)."""
        for state in list(self.states.values()):
            if state.dirty and not state.scratch and state.buffer and state.phase is not Phase.DETACHED:
                try:
                    if await self.flush(state):
                        continue
                except Exception as e:
                    self.journal(state.path, f"at unmount, not stored: {e}")
                    continue
                state.phase, state.handles = Phase.PENDING, 0
        try:
            await self.expire(everything=True)
        except Exception as e:
            log.error("at unmount, deferred deletions failed: %s", e)

    # -- namespace ---------------------------------------------------------------
    def _detach(self, path: Path) -> None:
        """The file at `path` is unlinked or replaced: its open handles keep their
        bytes but never commit (POSIX: an unlinked file's data goes nowhere)."""
        state = self.states.pop(path, None)
        if state is not None:
            state.phase = Phase.DETACHED
            state.dirty = False
            if state.handles + state.readers > 0:
                self.detached[id(state)] = state

    async def _keep_bytes(self, *paths: Path) -> None:
        """Before a path is unlinked or replaced: its open file's bytes, if not loaded yet,
        are loaded, so its handles read what they opened (read where it is stored, an
        unlinked chunk's file read as empty, one renamed over as the new file's)."""
        for path in paths:
            state = self.states.get(path)
            if state is not None and state.buffer is None and state.handles + state.readers > 0:
                self._held_bound += _stored_size(state)  # (held, not refused: counted all the same)
                await self.run(load_buffer, state)

    def reader_opened(self, state: FileState) -> None:
        state.readers += 1

    def reader_closed(self, state: FileState) -> None:
        """A handle reading a file's buffer closed: a detached file's bytes go with the
        last of its handles, readers' too (they were held uncounted)."""
        state.readers -= 1
        if state.phase is Phase.DETACHED and state.handles + state.readers <= 0:
            self.detached.pop(id(state), None)

    async def unlink(self, path: Path) -> None:
        self._check_writable()
        await self._check_chunk_writable(path)
        async with self._changing(path):
            await self._keep_bytes(path)
            self._unlink(path)

    def _unlink(self, path: Path) -> None:
        state = self.states.get(path)
        if state is not None and state.scratch:
            self._detach(path)
            return
        arr, coords = self.view.chunk_at(path)
        if arr is None or coords is None:
            raise NotAllowedError(errno.EPERM, "only chunk files and scratch files can be removed")
        stored = arr.exists(coords) and path not in self.removed
        if not stored and state is None:
            raise NotAllowedError(errno.ENOENT, "no such chunk")
        self._detach(path)
        if stored:
            # Hidden now; deleted from the store when the replace window closes, unless
            # a new file at this path commits first (then there is nothing to delete).
            self.removed[path] = self.clock() + self.replace_window
            arr.remove_chunk(coords)
        self.stats.count("unlinks")

    def exists(self, path: Path) -> bool:
        if path in self.states:
            return True
        if path in self.removed:
            return False
        entry = self.view.entry(path)
        return entry is not None and entry.node is Node.CHUNK

    async def rename(self, old: Path, new: Path, flags: int) -> None:
        self._check_writable()
        for path in (old, new):  # (a chunk renamed is deleted at its old name and written at the new)
            await self._check_chunk_writable(path)
        async with self._changing(old, new):
            await self._keep_bytes(old, new)
            await self._rename(old, new, flags)

    async def _rename(self, old: Path, new: Path, flags: int) -> None:
        if flags & ~RENAME_NOREPLACE:
            raise NotAllowedError(errno.EINVAL, "only the RENAME_NOREPLACE flag is supported")
        if flags & RENAME_NOREPLACE and self.exists(new):
            raise NotAllowedError(errno.EEXIST, "target exists (RENAME_NOREPLACE)")
        src = self.states.get(old)
        old_entry = self.view.entry(old)
        if src is None and old_entry is not None and old_entry.node.is_dir:
            raise NotAllowedError(errno.EPERM, "directories cannot be renamed")
        new_arr, new_coords = self.chunk_target(new)
        if src is not None and not (src.scratch and new_coords is None):  # (scratch -> scratch: moved whole)
            # bytes not stored yet (a chunk file written or pending, a scratch file still
            # open): a rename moves what is stored, and they would be lost while their
            # close() said 0
            if src.handles > 0 or (not src.scratch and (src.dirty or src.phase is Phase.PENDING)):
                raise NotAllowedError(errno.EBUSY, f"{'/'.join(old)} is open for writing or holds bytes "
                                      "not stored yet: close (or finish) it first")
        if src is not None and src.scratch:
            if new_coords is None:  # scratch -> scratch
                self._detach(new)
                del self.states[old]
                src.path = new
                self.states[new] = src
                return
            data = bytes(src.buffer or b"")
            reason = await self.run(incomplete_reason, data, new_arr.written_shapes(new_coords, data),
                                    file_limit(new_arr))
            if reason is not None:
                raise InvalidTiffError(f"{new_arr.key_name(new_coords)}: the file is incomplete ({reason})")
            await self.before_replace(new)
            await self.store_tiff(new_arr, new_coords, data)
            self.removed.pop(new, None)
            del self.states[old]
            self._detach(new)
            # the chunk has the renamed file's mtime, as on a disk (rsync sets it on its
            # temporary file, then renames it)
            self._keep_mtime(new, src.mtime_ns)
            return
        old_arr, old_coords = self.view.chunk_at(old)
        if old_arr is None or old_coords is None or not old_arr.exists(old_coords) or old in self.removed:
            raise NotAllowedError(errno.ENOENT if old_arr else errno.EPERM, "no such chunk or scratch file")
        if new_coords is None:
            # Taking a chunk out of the store into daemon memory (`mv x.tiff x.bak`)
            # would lose it at unmount: refuse, a copy does the job safely.
            raise NotAllowedError(errno.EPERM, "a chunk can only be renamed onto another chunk name; copy it instead")
        data = await self.run(old_arr.read, old_coords, 0, old_arr.file_size(old_coords))
        await self.before_replace(new)
        await self.store_tiff(new_arr, new_coords, data)
        self.removed.pop(new, None)
        self._detach(old)
        self._detach(new)
        await self.before_replace(old)
        await self.run(old_arr.delete_stored, old_coords)

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
        return Entry(Node.KEYDIR)

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
        if [e for e in self.view.list_dir(path) if (*path, e[0]) not in self.removed]:
            raise NotAllowedError(errno.ENOTEMPTY, "not empty")
        raise NotAllowedError(errno.EPERM, "groups and arrays cannot be removed")

    def paths_held(self) -> list[tuple[str, ...]]:
        """The paths `rebind` looks up: pending files and removed chunks."""
        return [state.path for state in self.states.values()] + list(self.removed)

    def rebind(self, view: View) -> None:
        """After a reload: point every state at its array in the new view."""
        self.view = view
        for state in self.states.values():
            if state.array is None or state.coords is None:
                continue
            arr, coords = view.chunk_at(state.path, memory_only=True)  # (opened by the reload)
            if arr is not None and arr.layout is not None and coords is not None:
                state.array, state.coords = arr, coords
        for path in self.removed:  # still hidden in the new view's listing
            arr, coords = view.chunk_at(path, memory_only=True)
            if arr is not None and coords is not None:
                arr.remove_chunk(coords)


def _looks_like_chunk(arr: ArrayView, rest: Path) -> bool:
    """A `.tiff` name shaped like a chunk key but outside the grid (an error, not scratch)."""
    name = "/".join(rest)
    if not name.endswith(".tiff"):
        return False
    key = name[: -len(".tiff")]
    origin = arr.source.chunk_key(tuple(0 for _ in arr.source.shape))
    shape_of = re.sub(r"\d+", "0", key)
    return shape_of == origin


def _commit_chunk(arr: ArrayView, coords: tuple[int, ...], data: bytes,
                  stored: Callable[[], None] | None = None) -> None:
    """Parse a written TIFF and store its values as chunk `coords`, then call `stored`
    (blocking)."""
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
    arr.store_values(coords, values, lossy=arr.options.lossy_writes)
    if stored is not None:
        try:
            stored()
        except Exception as e:  # the chunk is stored: a failed cache drop is not a failed close
            log.warning("%s: stored, but dropping cached data failed: %s", arr.key_name(coords), e)
    _check_ahead(arr, coords)


def _check_ahead(arr: ArrayView, coords: tuple[int, ...]) -> None:
    """A writer going through the chunk files in order (`cp` in a loop, a script per
    chunk) looks up the next file next. Where that lookup would cost a thread hop for
    one stat of a local file (or a shard index already in memory), the commit's worker
    thread answers it now, so the lookup answers from memory: the mirror of the
    read-ahead's existence checks. Other stores are not asked ahead."""
    try:
        for nxt in arr.successors(coords, CHECKED_AHEAD):
            if arr.known(nxt) is None and arr.source.exists_is_local(nxt):
                arr.exists(nxt)
    except Exception as e:  # the lookup itself asks again and reports it
        log.debug("checking chunks after %s failed: %s", coords, e)
