"""The filesystem layer: inodes, open files, `.zfuse/` and every file policy, no FUSE.

`zfuse.fuse_ops` translates each FUSE request into one call here and the
result or `FsError` into one reply; everything a request *decides* is decided
here, so it is tested with plain calls (tests/test_fs.py), no kernel.

What lives here:
- Inodes (kept in `zfuse.inodes.InodeTable`). An inode names a path until the
  kernel forgets it. An inode whose name was replaced (rename onto it) or
  unlinked stays valid: a process that looked the name up a moment before can
  still open and stat it, and sees the path's current file (never ENOENT for a
  name that always existed).
- Open files: one handle kind each (`zfuse.handles`: a byte snapshot, a write
  state's buffer read or written, a whole-image file, a chunk stored raw read
  from the stored file it opened, a decoded chunk), each owning what it reads
  and answering read, entry (fstat) and close. Here: which kind an open gets
  (`_open`), and when a handle changes kind (a chunk replaced or unlinked while
  open becomes a snapshot of its old bytes; a reload may turn a stored chunk
  into a decoded one).
- Who sees what while a chunk is being replaced: the writing process sees its
  own bytes (sizes included); every other process sees the stored chunk until
  the replacement commits, and readers open at that moment keep the old bytes.
  Handles on paths being written bypass the kernel page cache (direct I/O),
  which is what lets two processes see two versions of one file.
- Read-ahead: opening a chunk cold schedules the next chunks' decode (chunks
  stored raw: asks the OS to read their stored files ahead).
- Reload: a new view, with open files and write states moved onto it.
- `.zfuse/mount`: what the daemon says about itself (`mount_info`, given by the daemon).
- The error journal `.zfuse/errors`: every refusal, abandoned file and store
  error, one line each, readable by the mount's user.
"""

from __future__ import annotations

import collections
import errno
import functools
import json
import logging
import operator
import os
import stat as stat_mod
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import trio

from zfuse.errors import (
    CorruptDataError,
    NotAllowedError,
    ReadOnlyError,
    RefusedAgainError,
    ZfuseError,
    errno_for,
)
from zfuse.handles import (
    BufferHandle,
    ChunkHandle,
    DecodedChunkHandle,
    Handle,
    SnapshotHandle,
    StoredChunkHandle,
    WholeImageHandle,
    WriteHandle,
)
from zfuse.inodes import Inode, InodeTable
from zfuse.stats import Stats
from zfuse.store import forget_timeouts, timeouts_pending
from zfuse.view.array_view import stored_files_bound
from zfuse.view.tree import NEEDS_IO, DirReader, Entry, Node, View
from zfuse.view.whole_image import NAMES as IMAGE_NAMES
from zfuse.view.writes import (
    PENDING_TIMEOUT,
    REPLACE_WINDOW,
    Phase,
    Released,
    Writes,
)

log = logging.getLogger("zfuse.fs")

Path = tuple[str, ...]
T = TypeVar("T")
Run = Callable[..., Awaitable[Any]]

ROOT_INODE = 1
READ_AHEAD = 4  # chunk files decoded ahead of a sequential reader
# chunks stored raw: stored files asked of the OS ahead of a sequential reader, in
# batches of half as many (one worker thread hop per batch, not per file)
STORED_AHEAD = 8
AHEAD_REMEMBERED = 16 * READ_AHEAD  # decoded-ahead chunks remembered until opened
SPECIAL_DIR = ".zfuse"
STATS_FILE, ERRORS_FILE = "stats", "errors"
MOUNT_FILE = "mount"  # the daemon's pid, sources, reloads, log (JSON; read by zfuse status/reload)
ATTR_TIMEOUT = 5.0
# st_blksize: coreutils cp copies in buffers of st_blksize, so a chunk file's 1 MiB
# (the kernel's largest write request) writes a 512 KiB chunk in one request, not four.
# Other files keep 128 KiB: Python's buffered files read ahead by it, and a tile read
# of a whole-image file would fetch 1 MiB around each tile.
CHUNK_BLKSIZE = 1 << 20
BLKSIZE = 128 << 10
LIST_AHEAD = 8  # sibling directories listed ahead of a recursive walker (ls -R, find)
LIST_AHEAD_WAIT = 60.0  # seconds an opendir waits for its directory's read-ahead listing
PREPARED_KEPT = 2 * LIST_AHEAD  # directory readers made ahead, kept until opened
PREPARED_ENTRIES = 1000  # at most, per directory made ready ahead (bigger ones: listed ahead only)
WALKS_KEPT = 16  # parent directories whose subdirectory order is kept for walk detection
ERRORS_KEPT = 500
READER_GRACE = 2.0  # seconds a replacing writer waits for page-cache readers to close
STORED_NAMES_KEPT = 1 << 16  # chunks stored raw remembered as opened lately
STORED_VERSIONS_KEPT = 1 << 16  # chunk files whose cached stored file is remembered
STORED_FILES_KEPT = 128  # stored files kept open for re-opens within ATTR_TIMEOUT
QUIET_ERRNOS = (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY)  # answers, not failures


class FsError(Exception):
    """An operation failed with `errno` (already logged and counted)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.errno = code


class Kernel(Protocol):
    """What the filesystem asks of the kernel: forget cached data and names."""

    def invalidate_inode(self, ino: int) -> None: ...

    def invalidate_inode_here(self, ino: int) -> None:
        """`invalidate_inode` in the calling worker thread (it may wait on the kernel,
        which may wait on the event loop: never on the loop itself)."""
        ...

    def invalidate_entry(self, parent_ino: int, name: str) -> None: ...

    def store(self, ino: int, offset: int, data: bytes) -> None:
        """Put bytes into a file's page cache (whole-image tiles ahead of a region
        reader). Called from a worker thread. Optional: without it nothing is pushed."""


class Attributes(NamedTuple):
    """What `stat` shows of one file (a tuple: one is built per entry of every listing)."""

    ino: int
    mode: int
    size: int
    mtime_ns: int
    uid: int
    gid: int
    timeout: float  # attribute and entry cache seconds
    blksize: int  # the I/O size `stat` suggests: writers such as cp size their buffer by it

    @property
    def is_dir(self) -> bool:
        return stat_mod.S_ISDIR(self.mode)


@dataclass
class OpenReply:
    fh: int
    keep_cache: bool = False
    direct_io: bool = False
    # the kernel need not send FLUSH at close: set for read-only opens, whose close
    # has nothing to commit (one request less per `cat`; needs pyfuse3 with noflush)
    noflush: bool = False


@dataclass
class _DirHandle:
    path: Path
    reader: DirReader
    prepared: _Prepared | None = None  # made ahead in the listing thread (its reader is `reader`)


@dataclass
class _Prepared:
    """A directory listed ahead, ready for the walker's opendir, made in the listing
    thread (off the event loop): its names, and whether every entry is a stored chunk
    of one size (or a chunk directory), whose attributes are then one tuple for all
    (its names then also encoded as a reply carries them: readdir offers them as one
    run, and the reader is not read: made from the listing, `uniform`). Otherwise the
    reader holds the sorted snapshot."""

    reader: DirReader
    names: list[str]
    encoded: list[bytes]
    uniform: tuple[Node, int] | None
    version: Any = None  # the listing version a `uniform` one stands for

    @classmethod
    def of(cls, reader: DirReader) -> _Prepared:
        """From `reader`'s snapshot (taken)."""
        # C-level passes (map, sets), not a Python statement per entry
        entries = reader.at_hand(0) or []
        names = list(map(_FIRST, entries))
        found = list(map(_SECOND, entries))
        nodes, sizes = set(map(_FIRST, found)), set(map(_SECOND, found))
        uniform = None
        if len(sizes) == 1 and (nodes == {Node.KEYDIR} or (nodes == {Node.CHUNK} and None not in map(_FOURTH, found))):
            uniform = (nodes.pop(), sizes.pop())  # every entry a stored chunk of one size, or a chunk directory
        encoded = encode_names(names) if uniform is not None else []
        return cls(reader, names, encoded, uniform)

    @classmethod
    def uniform_of(cls, view: View, path: Path) -> _Prepared | None:
        """From the directory's listing in memory, with no Entry per name, when its
        entries share their attributes (`View.uniform_listing`); None otherwise."""
        listing = view.uniform_listing(path)
        if listing is None or len(listing[0]) > PREPARED_ENTRIES:
            return None
        names, node, size, version = listing
        return cls(view.dir_reader(path), names, encode_names(names), (node, size), version)

    def current(self, view: View) -> bool:
        """Whether it still shows what a listing in `view` now would."""
        if self.reader.view is not view:
            return False
        if self.version is not None:
            return self.version == view.listing_version(self.reader.path)
        return self.reader.current()


_FIRST, _SECOND, _FOURTH = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)


def encode_names(names: list[str]) -> list[bytes]:
    """Names as a readdir reply carries them (UTF-8, undecodable bytes restored), in one
    encode of all of them: a quarter of the cost of one per name. A name never holds
    NUL, so splitting at NUL gives the names back."""
    if not names:
        return []
    return "\0".join(names).encode("utf-8", "surrogateescape").split(b"\0")
# readdir's offer of a run of entries sharing one set of attributes (names encoded,
# inode numbers, the attributes, the offset before the first): how many were taken
AcceptRun = Callable[[Sequence[bytes], Sequence[int], Attributes, int], int]


@dataclass
class _Walk:
    """The subdirectories of one listed directory, in listing order, and the
    position of the one opened last: opening the next one after it is a walk."""

    names: list[str]
    position: dict[str, int]
    last: int = -2
    ahead: int = -1  # position of the last one listed ahead


def process_of(tid: int) -> int:
    """The process (thread group) a FUSE request's thread id belongs to (on the event
    loop for every write open: one unbuffered read, 13 µs instead of 34 µs through a
    buffered file read line by line)."""
    try:
        fd = os.open(f"/proc/{tid}/status", os.O_RDONLY)
        try:
            head = os.read(fd, 1024)  # Name (at most 64 bytes), Umask, State, Tgid
        finally:
            os.close(fd)
        at = head.index(b"\nTgid:") + 6
        return int(head[at : head.index(b"\n", at)])
    except (OSError, ValueError):
        return tid


async def _run_here(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class _AheadJob:
    """A directory scheduled to be listed ahead. Whoever takes it first lists it: the
    listing thread, or the walker's own opendir when the thread has not got to it yet
    (under CPU load the listing thread can fall behind; the opendir then does not wait
    for the directories queued before). `done` is held until the listing ends."""

    __slots__ = ("view", "path", "done", "taken")

    def __init__(self, view: View, path: Path) -> None:
        self.view = view
        self.path = path
        self.done = threading.Lock()  # a Lock, not an Event: a tenth of the cost to make
        self.done.acquire()
        self.taken = False


_TAKE = threading.Lock()  # guards `_AheadJob.taken` (held for one test-and-set)


def _let_go(_: object) -> None:
    """A background job that only frees its argument, in the thread that runs it."""


def _take(job: _AheadJob) -> bool:
    """Whether the caller is the one to list `job`'s directory."""
    with _TAKE:
        mine, job.taken = not job.taken, True
    return mine


def operation(path_of: Callable[..., Path | None]) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Every public operation: any failure is logged once with its store key,
    counted, journaled, and leaves as FsError(errno)."""

    def wrap(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def run(self: FileSystem, *args: Any) -> T:
            try:
                return await fn(self, *args)
            except FsError:
                raise
            except Exception as e:
                try:
                    path = path_of(self, *args)
                except Exception:
                    path = None
                raise self.fail(e, fn.__name__, path) from None

        return run

    return wrap


def _by_inode(self: FileSystem, ino: int, *rest: Any) -> Path | None:
    return self.inodes.path_of(ino)


def _by_child(self: FileSystem, parent: int, name: str, *rest: Any) -> Path | None:
    path = self.inodes.path_of(parent)
    return (*path, name) if path is not None else None


def _by_handle(self: FileSystem, fh: int, *rest: Any) -> Path | None:
    handle = self.handles.get(fh)
    return handle.path if handle else None


def _padded_json(value: dict[str, Any]) -> bytes:
    """JSON padded to a 1 KiB multiple: the size `stat` reports stays the size `read` gets."""
    text = json.dumps(value, indent=2, sort_keys=True)
    return (text + " " * (-(len(text) + 1) % 1024) + "\n").encode()


class FileSystem:
    """The mount's file operations over a `View`, decided without FUSE."""

    def __init__(
        self,
        view: View,
        *,
        read_only: bool = False,
        stats: Stats | None = None,
        run: Run = _run_here,
        kernel: Kernel | None = None,
        spawn: Callable[[Callable[..., Any], Any], None] | None = None,
        spawn_listing: Callable[[Callable[..., Any], Any], None] | None = None,
        spawn_read_ahead: Callable[[Callable[..., Any], Any], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        uid: int | None = None,
        gid: int | None = None,
        replace_window: float = REPLACE_WINDOW,
        pending_timeout: float = PENDING_TIMEOUT,
        process: Callable[[int], int] = process_of,
        reload: Callable[[], View] | None = None,
        reader_grace: float = READER_GRACE,
        durable: bool = True,
        mount_info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.view = view
        self.clock = clock
        self.durable = durable  # False: close() survives the daemon; fsync() reaches the disk
        self.reader_grace = reader_grace
        self._cached_readers: dict[Path, int] = {}  # open page-cache handles per path
        self._readers_gone: dict[Path, trio.Event] = {}  # replacing writers waiting on them
        # page-cache readers still reading a replaced chunk's old bytes, per path: what they
        # read fills the kernel's page cache of the path, so new readers bypass it until the
        # last of them closes, and then it is dropped
        self._old_bytes_cached: dict[Path, int] = {}
        self._image_versions: dict[Path, Any] = {}  # whole-image files: the version last opened
        self._image_epoch = 0  # reloads so far (whole-image tiles pushed before one are stale)
        self.read_only = read_only
        self.stats = stats or Stats()
        self.run = run  # blocking work, in a worker thread on a mount
        self.kernel = kernel
        self.spawn = spawn  # background blocking work (and read-ahead, without spawn_read_ahead); None: none
        # directories of local stores listed ahead: short jobs holding the GIL, best on
        # one thread of their own (threads listing at once only take turns at the GIL,
        # with each other and the event loop); remote stores' listings, long waits that
        # overlap well, go to `spawn`
        self.spawn_listing = spawn_listing or spawn
        # chunks decoded or advised ahead of a reader: jobs that report nothing back, so
        # best on threads of their own (`zfuse.workers.WorkerThreads`): a trio thread job costs the
        # event loop a task and a wake-up per chunk, on the core the reader needs
        self.spawn_read_ahead = spawn_read_ahead or spawn
        self.reload = reload
        # what `.zfuse/mount` shows (the daemon's; without it there is no such file)
        self.mount_info = mount_info
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.started_ns = time.time_ns()
        self.errors: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        self.writes = Writes(
            view, read_only=read_only, stats=self.stats, run=run, clock=clock,
            replace_window=replace_window, pending_timeout=pending_timeout,
            journal=self.journal, before_replace=self._keep_readers, process=process,
        )
        self.inodes = InodeTable(Inode(ROOT_INODE, (), lookups=1))
        self.handles: dict[int, Handle] = {}
        self._dirs: dict[int, _DirHandle] = {}
        self._next_fh = 1
        self._reading_ahead: set[Any] = set()
        # chunks stored raw whose stored file was opened lately (by a reader or read
        # ahead): the name is cached, so opening it again on the event loop waits on no disk
        self._stored_names: set[Any] = set()
        # per path, the stored file (device, inode, size, mtime) whose bytes the kernel's
        # page cache of the chunk file may hold: a reader opening another one (replaced
        # in the store) must not get those
        self._stored_versions: dict[Path, tuple[int, ...]] = {}
        # per path, the stored file an open saw lately and when (`_kept_stored`)
        self._stored_kept: collections.OrderedDict[Path, tuple[Any, float]] = collections.OrderedDict()
        # chunks decoded ahead whose file is not opened yet: opening one means a scan
        # goes on (keep the window full), not a re-read (oldest first; bounded)
        self._ahead_unopened: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self._walks: collections.OrderedDict[Path, _Walk] = collections.OrderedDict()
        self._listing_ahead: dict[Path, _AheadJob] = {}  # scheduled to be listed ahead, not done yet
        # readers of directories listed ahead, their sorted snapshot made in the listing
        # thread: an opendir takes one if it is still current (oldest first; bounded)
        self._prepared: collections.OrderedDict[Path, _Prepared] = collections.OrderedDict()
        self._journal_problems(view)
        # each node kind's mode, and the kinds whose attributes the kernel must not cache
        # (live counters): `attributes` runs once per entry of every listing
        read_only_nodes = (Node.ZFUSE_DIR, Node.ZFUSE_FILE, Node.META, Node.IMAGE)
        self._modes = {
            node: (stat_mod.S_IFDIR if node.is_dir else stat_mod.S_IFREG)
            | (0o555 if node.is_dir else 0o444)
            | (0 if read_only or node in read_only_nodes else 0o200)
            for node in Node
        }
        self._live_nodes = frozenset((Node.ZFUSE_DIR, Node.ZFUSE_FILE))

    # -- errors -------------------------------------------------------------
    def fail(self, exc: BaseException, op: str, path: Path | None) -> FsError:
        """Log an error once (naming the store key), count and journal it."""
        code = errno_for(exc)
        where = "/".join(path) if path else "/"
        key = self.store_key(path) if path else where
        if isinstance(exc, RefusedAgainError) or (isinstance(exc, NotAllowedError) and code in QUIET_ERRNOS):
            log.debug("%s %s: %s", op, where, exc)
            return FsError(code)
        self.stats.count("errors")
        expected = isinstance(exc, (ZfuseError, OSError, TimeoutError))
        reason = str(exc) if expected else f"{type(exc).__name__}: {exc}"
        if not str(exc):  # (aiohttp's TimeoutError says nothing): never an empty reason
            reason = f"{type(exc).__name__} (no message) in {op} of store key {key}"
        log.error("%s %s [store key %s]: %s (%s)", op, where, key, reason,
                  errno.errorcode.get(code, code), exc_info=None if expected else exc)
        self.journal(path or (), f"{op}: {reason} ({errno.errorcode.get(code, code)})")
        return FsError(code)

    def journal(self, path: Path, reason: str) -> None:
        """One line of `.zfuse/errors`: time, path, reason."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        reason = " ".join(reason.split())  # one line per entry
        self.errors.append(f"{stamp}\t{'/'.join(path) or '/'}\t{reason}")

    def _journal_problems(self, view: View) -> None:
        """Arrays the view shows without chunk files, and why: in `.zfuse/errors` too."""
        for problem in getattr(view, "problems", ()):
            self.journal(tuple(problem.path.split("/")) if problem.path else (), f"not shown: {problem.reason}")

    def store_key(self, path: Path) -> str:
        """The store key behind a path, for log lines (the chunk's key, or the path)."""
        arr, coords = self.view.chunk_at(path)
        if arr is None or coords is None:
            return "/".join(path) or "/"
        return arr.key_name(coords)

    # -- inodes ---------------------------------------------------------------
    def _inode(self, path: Path) -> Inode:
        return self.inodes.new(path)

    def _get(self, ino: int) -> Inode:
        inode = self.inodes.get(ino)
        if inode is None:
            raise FsError(errno.ENOENT)
        return inode

    def _child(self, parent: int, name: str) -> Path:
        base = self._get(parent).path
        if name == ".":
            return base
        if name == "..":
            return base[:-1]
        return (*base, name)

    def remember(self, ino: int) -> None:
        """The kernel took a reference to `ino` (a lookup reply or a readdirplus entry)."""
        self.inodes.remember(ino)

    def forget(self, items: list[tuple[int, int]]) -> None:
        """The kernel dropped references; inodes it no longer knows are freed."""
        for ino, count in items:
            if ino == ROOT_INODE:
                continue
            gone = self.inodes.forget(ino, count)
            if gone is not None:
                self._forget_stored(gone)  # (its page cache goes with it)

    def _detach_inode(self, path: Path) -> None:
        """`path` now names another file (or none): its inode keeps working by number."""
        inode = self.inodes.take_path(path)
        if inode is not None:
            inode.detached = True
            self._invalidate(inode.ino)

    # -- entries --------------------------------------------------------------
    def _special_entry(self, path: Path) -> Entry | None:
        if path == (SPECIAL_DIR,):
            return Entry(Node.ZFUSE_DIR)
        if path[:1] == (SPECIAL_DIR,) and len(path) == 2 and path[1] in (STATS_FILE, ERRORS_FILE):
            return Entry(Node.ZFUSE_FILE, size=len(self._special_bytes(path[1])))
        if path == (SPECIAL_DIR, MOUNT_FILE) and self.mount_info is not None:
            return Entry(Node.ZFUSE_FILE, size=len(self._special_bytes(MOUNT_FILE)))
        return None

    def _special_bytes(self, name: str) -> bytes:
        if name == ERRORS_FILE:
            return ("\n".join(self.errors) + "\n").encode() if self.errors else b""
        if name == MOUNT_FILE and self.mount_info is not None:
            return _padded_json(self.mount_info())
        snapshot = self.stats.snapshot()
        cache = self.view.cache
        snapshot.update(cache_hits=cache.hits, cache_misses=cache.misses, cache_bytes=cache.used,
                        pending_files_now=sum(s.phase is Phase.PENDING for s in self.writes.states.values()),
                        unlinked_not_yet_deleted=len(self.writes.removed))
        return _padded_json(snapshot)

    async def _entry(self, path: Path, pid: int | None = None) -> Entry | None:
        """What is at `path` for process `pid`: `.zfuse/`, written files, then the view."""
        special = self._special_entry(path)
        if special is not None:
            return special
        if path in self.writes.states or path in self.writes.made_dirs:
            return self.writes.entry_for(path, pid)
        if self.writes.is_removed(path):
            return None
        view = self.view  # one view for the whole request, even if a reload swaps it
        entry = view.entry(path, memory_only=True)
        if entry is NEEDS_IO:  # one existence check (or shard index), in a worker thread
            return await self.run(view.entry, path)
        return entry

    def attributes(self, path: Path, entry: Entry, ino: int | None = None) -> Attributes:
        # hot: called once per entry of every readdir (100,000 for `ls -lR` of a big array)
        if ino is None:
            ino = self._inode(path).ino
        node = entry.node
        writes = self.writes
        mtime = (writes.mtime_ns(path) if writes.touched else None) or self.started_ns
        # never cached: live counters, files being written, and names only the daemon
        # holds (scratch, placeholders), which a rename or release can take away
        live = node in self._live_nodes or (node is Node.CHUNK and entry.coords is None) \
            or (writes.states and path in writes.states)
        return Attributes(ino, self._modes[node], entry.size, mtime, self.uid, self.gid, 0 if live else ATTR_TIMEOUT,
                          CHUNK_BLKSIZE if node is Node.CHUNK else BLKSIZE)

    # -- lookup and attributes ---------------------------------------------
    @operation(_by_child)
    async def lookup(self, parent: int, name: str, pid: int | None = None) -> Attributes:
        path = self._child(parent, name)
        if timeouts_pending():  # a reader looking the file up again asks a timed-out store again
            forget_timeouts(self.store_key(path))
        entry = await self._entry(path, pid)
        if entry is None:
            raise FsError(errno.ENOENT)
        attrs = self.attributes(path, entry)
        self.remember(attrs.ino)
        return attrs

    @operation(_by_inode)
    async def getattr(self, ino: int, pid: int | None = None) -> Attributes:
        inode = self._get(ino)
        if inode.detached:
            # unlinked or replaced: an open file answers for itself (fstat)
            for handle in self.handles.values():
                if handle.inode is inode and handle.answers_detached():
                    return self.attributes(handle.path, handle.entry(), ino)
        entry = await self._entry(inode.path, pid)
        if entry is None:
            raise FsError(errno.ENOENT)
        return self.attributes(inode.path, entry, ino)

    @operation(_by_inode)
    async def setattr(
        self, ino: int, size: int | None = None, mtime_ns: int | None = None,
        owner_or_mode: bool = False, fh: int | None = None, pid: int | None = None,
    ) -> Attributes:
        path = self._get(ino).path
        entry = await self._entry(path, pid)
        if entry is None:
            raise FsError(errno.ENOENT)
        if size is not None and entry.node in (Node.META, Node.ZFUSE_DIR, Node.ZFUSE_FILE, Node.IMAGE):
            raise FsError(errno.EROFS if self.read_only else errno.EACCES)
        if size is not None:
            handle = self.handles.get(fh) if fh else None
            state = handle.state if isinstance(handle, WriteHandle) else None
            await self.writes.truncate(path, size, state, pid)
            self._invalidate(ino)
        elif owner_or_mode and self.read_only:
            raise ReadOnlyError("the mount is read-only")
        if mtime_ns is not None:
            if self.read_only:
                raise ReadOnlyError("the mount is read-only")
            self.writes.touch(path, mtime_ns)
        # chmod/chown are accepted and ignored: cp -p and rsync -a must not fail
        return await self.getattr(ino, pid)

    def statfs(self) -> dict[str, int]:
        return {"bsize": 128 * 1024, "files": len(self.inodes), "namemax": 255}

    # -- directories --------------------------------------------------------
    @operation(_by_inode)
    async def opendir(self, ino: int) -> int:
        path = self._get(ino).path
        # a chunk directory listed ahead, still as listed (nothing changed in its array,
        # nothing written): its names sorted (or its snapshot) in the listing thread
        prepared = self._take_prepared(path, self.view, not self.writes.states and not self.writes.made_dirs)
        if prepared is not None:
            return self._open_listed(self.view, path, prepared.reader, prepared)
        entry = await self._entry(path)
        if entry is None or not entry.node.is_dir:
            raise FsError(errno.ENOTDIR if entry else errno.ENOENT)
        view = self.view
        if entry.node is Node.ZFUSE_DIR:
            specials = [(name, special) for name in (ERRORS_FILE, MOUNT_FILE, STATS_FILE)
                        if (special := self._special_entry((SPECIAL_DIR, name))) is not None]
            reader = DirReader(view, path, specials)
            reader.fetch(0)
            fh = self._allocate_fh()
            self._dirs[fh] = _DirHandle(path, reader)
            return fh
        # a small directory is one sorted snapshot (paging stays consistent); a big
        # one is read page by page in readdir. Files only the daemon holds come last.
        tail = self.writes.scratch_in(path)
        reader = view.dir_reader(path, tail)
        if (ahead := self._listing_ahead.get(path)) is not None:
            # scheduled to be listed ahead: list it now if the listing thread has not
            # started it, else wait for that (never listed twice)
            self.stats.count("listing_ahead_caught_up")
            await self.run(self._fetch_ahead_job, ahead, reader)
            prepared = self._take_prepared(path, view, not tail)  # made by the listing thread meanwhile
            if prepared is not None:
                reader = prepared.reader
        elif view.needs_io(path, listing=True):
            await self.run(reader.fetch, 0)  # that key prefix only
        else:
            reader.fetch(0)
        return self._open_listed(view, path, reader, prepared)

    def _take_prepared(self, path: Path, view: View, usable: bool) -> _Prepared | None:
        """The directory the listing thread made ready for `path` (taken either way), if
        `usable` and it still shows what a listing in `view` now would."""
        prepared = self._prepared.pop(path, None) if self._prepared else None
        if prepared is None or not usable or not prepared.current(view):
            return None
        return prepared

    def _open_listed(self, view: View, path: Path, reader: DirReader, prepared: _Prepared | None) -> int:
        """A directory handle on `reader`; a walker's next directories are listed ahead."""
        self._list_ahead(view, path)
        fh = self._allocate_fh()
        self._dirs[fh] = _DirHandle(path, reader, prepared)
        return fh

    async def readdir(self, fh: int, start: int, accept: Callable[[str, int, Attributes, int], bool],
                      accept_run: AcceptRun | None = None) -> None:
        """Offer entries from `start` to `accept(name, ino, attrs, next_offset)` until it
        returns False (buffer full). Entries with the same attributes but the inode
        number share one `attrs` whose own `ino` is 0 (every stored chunk of a directory
        and every chunk directory): a listing builds no tuple per entry, and the FUSE
        adapter fills its reply's attributes once per run of such entries. With
        `accept_run(names, inos, attrs, offset)` (names encoded; it returns how many it
        took), a directory listed ahead whose entries all share their attributes is
        offered as one run: no call per entry."""
        handle = self._dirs[fh]
        prepared, writes = handle.prepared, self.writes
        if prepared is not None and prepared.uniform is not None and not writes.touched and not writes.removed:
            self._readdir_uniform(prepared, start, accept, accept_run)
            return
        i = start
        while True:
            batch = handle.reader.at_hand(i)
            if batch is None:
                try:
                    await self.run(handle.reader.fetch, i)
                except Exception as e:
                    raise self.fail(e, "readdir", handle.path) from None
                continue
            if not batch:
                return
            # hot: once per entry of every listing (no awaits in this loop). Nothing
            # written yet: a stored chunk or a chunk directory has the mount's mtime and
            # cached attributes (`attributes`)
            base, inodes, removed = handle.path, self.inodes, writes.removed
            plain = not writes.touched
            chunk, keydir, shared_node, shared_size, shared = Node.CHUNK, Node.KEYDIR, None, -1, None
            for name, entry in batch:
                path = (*base, name)
                i += 1
                if removed and writes.is_removed(path):
                    continue  # unlinked, its store deletion still pending
                ino, known = inodes.number(path)
                node = entry.node
                if plain and (node is keydir or node is chunk and entry.coords is not None):
                    if node is not shared_node or entry.size != shared_size:
                        shared_node, shared_size = node, entry.size
                        shared = self._shared_attributes(node, shared_size)
                    attrs = shared
                else:
                    attrs = self.attributes(path, entry, ino)
                if not accept(name, ino, attrs, i):  # type: ignore[arg-type]
                    return
                inodes.referenced(path, ino, known)  # one kernel reference per readdirplus entry

    def _readdir_uniform(self, prepared: _Prepared, start: int, accept: Callable[[str, int, Attributes, int], bool],
                         accept_run: AcceptRun | None) -> None:
        """readdir of a directory listed ahead whose entries all have one set of
        attributes (a chunk directory), while nothing is written or removed. Its entries
        are numbered as one run of inodes (`InodeTable.run_first`): no Inode object, no
        dict entry per entry, and with `accept_run` no call per entry either."""
        # the hot path of `ls -lR`: 100,000 entries
        attrs = self._shared_attributes(*prepared.uniform)  # type: ignore[misc]
        parent, names, inodes = prepared.reader.path, prepared.names, self.inodes
        first = inodes.run_first(parent, names)
        if first is None:  # some are inodes of their own already: entry by entry
            i = start
            for name in names[start:]:
                path = (*parent, name)
                ino, known = inodes.number(path)
                i += 1
                if not accept(name, ino, attrs, i):
                    return
                inodes.referenced(path, ino, known)  # one kernel reference per readdirplus entry
            return
        if accept_run is not None:
            taken = accept_run(prepared.encoded[start:], range(first + start, first + len(names)), attrs, start)
        else:
            taken = 0
            for name in names[start:]:
                if not accept(name, first + start + taken, attrs, start + taken + 1):
                    break
                taken += 1
        inodes.add_run(parent, names, first, start, start + taken)

    def _shared_attributes(self, node: Node, size: int) -> Attributes:
        """Attributes of every stored chunk of `size` (or chunk directory) but the inode
        number (0), while nothing is written: the mount's mtime, cached by the kernel."""
        # tuple.__new__: a NamedTuple's own __new__ is a Python function
        return tuple.__new__(Attributes, (0, self._modes[node], size, self.started_ns, self.uid, self.gid,
                                          ATTR_TIMEOUT, CHUNK_BLKSIZE if node is Node.CHUNK else BLKSIZE))

    def releasedir(self, fh: int) -> None:
        handle = self._dirs.pop(fh, None)
        if handle is not None and handle.prepared is not None and self.spawn_listing is not None:
            # a directory listed ahead holds a few hundred objects (its names, encoded
            # names, or its snapshot): freed in the listing thread, off the walker's path
            self.spawn_listing(_let_go, handle)

    def _list_ahead(self, view: View, path: Path) -> None:
        """Directory read-ahead. When a listed directory's subdirectories are opened
        one after another in listing order (the second in a row), the next
        `LIST_AHEAD` are listed in the background, so a recursive walk finds each
        directory in memory instead of waiting for a listing per directory. A single
        `ls` of one directory lists that directory only."""
        if self.spawn_listing is None or not path:
            return
        parent = path[:-1]
        walk = self._walks.get(parent)
        if walk is None:
            # in the order a walker sorting by name visits them (as readdir gave them)
            names = view.listed_subdirs(parent, DirReader.SNAPSHOT_MAX)
            if names is None:
                return  # not listed: nobody is walking it
            walk = self._walks[parent] = _Walk(names, {name: i for i, name in enumerate(names)})
            while len(self._walks) > WALKS_KEPT:
                self._walks.popitem(last=False)
        self._walks.move_to_end(parent)
        i = walk.position.get(path[-1])
        if i is None:
            return
        walking, walk.last = walk.last == i - 1, i
        if not walking:
            walk.ahead = i  # a new start: what lies ahead of it is looked at afresh
            return
        start = max(i + 1, walk.ahead + 1)  # the ones before were scheduled already
        walk.ahead = max(walk.ahead, i + LIST_AHEAD)
        for name in walk.names[start : i + 1 + LIST_AHEAD]:
            nxt = (*parent, name)
            if nxt in self._listing_ahead or not view.needs_io(nxt, listing=True):
                continue
            job = self._listing_ahead[nxt] = _AheadJob(view, nxt)
            spawn = self.spawn_listing if view.lists_locally(nxt) else self.spawn
            spawn(self._list_dir_ahead, job)

    def _fetch_ahead_job(self, job: _AheadJob, reader: DirReader) -> None:
        """Opendir of a directory scheduled to be listed ahead (worker thread): list it
        here if nobody has started to, else wait until that listing is done (then from
        memory, unless it failed, was evicted, or has not finished in `LIST_AHEAD_WAIT`
        seconds: then `reader` lists it itself)."""
        if _take(job):
            try:
                reader.fetch(0)
            finally:
                self._ahead_done(job)
            return
        if job.done.acquire(timeout=LIST_AHEAD_WAIT):
            job.done.release()
        reader.fetch(0)

    def _ahead_done(self, job: _AheadJob) -> None:
        if self._listing_ahead.get(job.path) is job:
            del self._listing_ahead[job.path]
        job.done.release()

    def _list_dir_ahead(self, job: _AheadJob) -> None:
        if not _take(job):
            return  # the walker got there first and listed it itself
        view, path = job.view, job.path
        try:
            if view.list_ahead(path):
                self.stats.count("listing_read_ahead")
            # what the walker's opendir will want, sorted here: a chunk directory's names,
            # else the reader's snapshot (if the listing is kept in memory: never a
            # second listing)
            if not view.needs_io(path, listing=True):
                prepared = _Prepared.uniform_of(view, path)  # a chunk directory: names only
                if prepared is None:
                    reader = view.dir_reader(path)
                    reader.fetch(0)
                    # small enough to be one snapshot, and for its prepared names to be few
                    if reader.current() and len(reader.at_hand(0) or ()) <= PREPARED_ENTRIES:
                        prepared = _Prepared.of(reader)
                if prepared is not None:
                    self._prepared[path] = prepared
                    while len(self._prepared) > PREPARED_KEPT:
                        self._prepared.pop(next(iter(self._prepared)), None)
        except Exception as e:  # the walker's own opendir lists it again and reports it
            log.debug("listing %s ahead failed: %s", "/".join(path), e)
        finally:
            self._ahead_done(job)

    # -- files -----------------------------------------------------------------
    def _allocate_fh(self) -> int:
        """File and directory handles share one numbering."""
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _new_handle(self, handle: Handle) -> int:
        fh = self._allocate_fh()
        self.handles[fh] = handle
        return fh

    @operation(_by_inode)
    async def open(self, ino: int, flags: int, pid: int | None = None) -> OpenReply:
        reply = await self._open(ino, flags, pid)
        reply.noflush = not flags & (os.O_WRONLY | os.O_RDWR)
        return reply

    async def _open(self, ino: int, flags: int, pid: int | None) -> OpenReply:
        """Which kind of handle an open gets (`zfuse.handles`): decided by what is at the
        path, whether it is opened for writing, and (chunk files) who reads it how."""
        inode = self._get(ino)
        path = inode.path
        wants_write = bool(flags & (os.O_WRONLY | os.O_RDWR))
        entry = await self._entry(path, pid)
        if entry is not None and entry.node.is_dir:
            raise FsError(errno.EISDIR)
        if entry is not None and entry.node in (Node.ZFUSE_FILE, Node.META, Node.IMAGE):
            if wants_write:
                raise self._refusal(errno.EACCES, f"{'/'.join(path)} is read-only")
            return self._open_read_only(inode, entry)
        if wants_write:
            return await self._open_for_writing(inode, entry, flags, pid)
        if entry is None or entry.node is not Node.CHUNK:
            raise FsError(errno.ENOENT)
        return await self._open_chunk(inode, entry, flags, pid)

    def _open_read_only(self, inode: Inode, entry: Entry) -> OpenReply:
        """A whole-image file, or a snapshot of a metadata or `.zfuse/` file."""
        path = inode.path
        if entry.node is Node.IMAGE:
            # the kernel keeps its page cache of the file until the array changes
            # (Bio-Formats reopens it dozens of times)
            changed = self._image_versions.get(path) != entry.reader.version
            self._image_versions[path] = entry.reader.version
            return OpenReply(self._new_handle(WholeImageHandle(path, inode, entry.reader)), keep_cache=not changed)
        content = self._special_bytes(path[-1]) if entry.node is Node.ZFUSE_FILE else entry.content or b""
        return OpenReply(self._new_handle(SnapshotHandle(path, inode, content)), direct_io=entry.node is Node.ZFUSE_FILE)

    async def _open_for_writing(self, inode: Inode, entry: Entry | None, flags: int, pid: int | None) -> OpenReply:
        path = inode.path
        if flags & os.O_TRUNC and path not in self.writes.states and self._cached_readers.get(path):
            await self._wait_for_cached_readers(path)
        state = await self.writes.open(path, entry, flags, pid)
        handle = WriteHandle(path, inode, state, append=bool(flags & os.O_APPEND))
        # a file whose bytes differ from what other processes see bypasses the page
        # cache; an untouched chunk opened to patch in place keeps it (mmap works)
        direct = state.dirty or state.scratch or bool(flags & os.O_TRUNC)
        return OpenReply(self._new_handle(handle), direct_io=direct)

    async def _open_chunk(self, inode: Inode, entry: Entry, flags: int, pid: int | None) -> OpenReply:
        """A chunk file opened for reading: the writer's buffer (to its own process), the
        stored file (a chunk stored raw) or the decoded chunk; through the kernel's page
        cache unless the path's bytes differ between processes (being written, or old
        bytes still read), with the next chunks read ahead."""
        path = inode.path
        arr, coords = entry.array, entry.coords
        if coords is not None and timeouts_pending():  # a reader opening anew asks a timed-out store again
            forget_timeouts(arr.key_name(coords))
        opened_before = (id(arr), coords) in self._stored_names
        state = self.writes.states.get(path)
        stored = None
        if state is None and arr.serves_stored is not False:
            view = self.view
            stored = self._kept_stored(path, arr)
            if stored is None:
                stored = await self._open_stored(arr, coords)
            if self.view is not view:  # reloaded meanwhile: open the file of the new view
                if stored is not None:
                    stored.close()
                return await self._open(inode.ino, flags, pid)
            state = self.writes.states.get(path)  # (what a request meanwhile changed)
        if state is not None or path in self._readers_gone or path in self._old_bytes_cached:
            if stored is not None:
                stored.close()  # the decoded chunk, as for every file being written
            if state is not None and self.writes.sees_buffer(state, pid):
                return OpenReply(self._new_handle(BufferHandle(path, inode, state, arr, coords)), direct_io=True)
            return OpenReply(self._new_handle(DecodedChunkHandle(path, inode, arr, coords)), direct_io=True)
        if stored is None:
            handle: ChunkHandle = DecodedChunkHandle(path, inode, arr, coords)
        else:
            handle = StoredChunkHandle(path, inode, arr, coords, stored)
        keep_cache = True  # unchanged chunks keep their page cache
        if stored is not None and self._stored_versions.get(path) != stored.identity:
            # The stored file is not the one whose bytes the kernel may cache for this
            # path (replaced in the store, or not known): readers still open on it keep
            # that cache and this one reads around it; with none open it is dropped.
            if self._cached_readers.get(path):
                return OpenReply(self._new_handle(handle), direct_io=True)
            if len(self._stored_versions) >= STORED_VERSIONS_KEPT:
                self._stored_versions.clear()  # (unknown means "drop the cache": safe)
            self._stored_versions[path] = stored.identity
            keep_cache = False
        if stored is not None and path not in self._stored_kept:
            self._keep_stored(path, stored)
        handle.page_cached = True
        self._cached_readers[path] = self._cached_readers.get(path, 0) + 1
        fh = self._new_handle(handle)
        if arr.serves_stored:
            self._advise_ahead(arr, coords, opened_before)
        else:
            self._read_ahead(arr, coords)
        return OpenReply(fh, keep_cache=keep_cache)

    def _kept_stored(self, path: Path, arr: Any) -> Any:
        """The stored file an open of `path` less than ATTR_TIMEOUT ago opened, if it is
        still kept open and is the one the kernel caches bytes of: a re-open within the
        attribute timeout takes the stored file as unchanged (as the kernel takes the
        file's size), so a warm re-read costs no system call. None otherwise."""
        kept = self._stored_kept.get(path)
        if kept is None:
            return None
        stored, seen_at = kept
        if (stored.array is not arr or self.clock() - seen_at >= ATTR_TIMEOUT
                or self._stored_versions.get(path) != stored.identity):
            self._drop_kept_stored(path)
            return None
        self._stored_kept.move_to_end(path)
        return stored.retain()

    def _keep_stored(self, path: Path, stored: Any) -> None:
        """Keep a stored file just opened for the re-opens of the next ATTR_TIMEOUT s (the
        most recent STORED_FILES_KEPT, and at most a quarter of the descriptors open chunk
        files may hold: the rest is for open files)."""
        kept = min(STORED_FILES_KEPT, stored_files_bound() // 4)
        if not kept or stored.retain() is None:
            return
        self._stored_kept[path] = (stored, self.clock())
        while len(self._stored_kept) > kept:
            _, (oldest, _) = self._stored_kept.popitem(last=False)
            oldest.close()

    def _drop_kept_stored(self, path: Path) -> None:
        """(From worker threads too.)"""
        kept = self._stored_kept.pop(path, None)
        if kept is not None:
            kept[0].close()

    async def _open_stored(self, arr: Any, coords: tuple[int, ...]) -> Any:
        """The chunk's StoredChunkFile if it is stored raw, else None (read decoded).
        Opened on the event loop when its name was looked up lately (read ahead, or
        opened before: no disk to wait for), else in a worker thread, which also asks
        the OS to start reading it."""
        key = (id(arr), coords)
        if arr.serves_stored and key in self._stored_names:
            stored = arr.open_stored(coords)
        else:
            stored = await self.run(arr.open_stored, coords, True)
        if stored is not None:
            self._note_stored_name(key)
        return stored

    def _note_stored_name(self, key: Any) -> None:
        """(From worker threads too: a set's add and clear are atomic.)"""
        if len(self._stored_names) >= STORED_NAMES_KEPT:
            self._stored_names.clear()  # forgetting costs a thread hop per open, no more
        self._stored_names.add(key)

    @operation(_by_child)
    async def create(self, parent: int, name: str, flags: int, pid: int | None = None) -> tuple[OpenReply, Attributes]:
        path = self._child(parent, name)
        self._refuse_special(path)
        await self._refuse_image(path, "create")
        state = await self.writes.create(path, flags, pid)
        inode = self._inode(path)
        handle = WriteHandle(path, inode, state)
        attrs = self.attributes(path, handle.entry(), inode.ino)
        self.remember(inode.ino)
        return OpenReply(self._new_handle(handle), direct_io=True), attrs

    @operation(_by_handle)
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.handles[fh]
        data = handle.read_cached(off, size)
        if data is None:
            self.stats.count("reads_in_threads")  # (not in memory or the page cache yet)
            data = await self.run(handle.read, off, size)
        self.stats.count("bytes_read", len(data))
        if isinstance(handle, WholeImageHandle):
            self._push_image_tiles(handle, off, len(data))
        return data

    def _push_image_tiles(self, handle: WholeImageHandle, off: int, size: int) -> None:
        """Whole-image files: after a read, store the tiles a region reader needs next
        in the kernel's page cache (the file decides which: WholeImage.pushes_after),
        so its next reads are no FUSE round trips. In the background, after the reply."""
        if self.spawn is None or getattr(self.kernel, "store", None) is None:
            return
        spans = handle.reader.pushes_after(off, size)
        if spans:
            self.spawn(self._push_image_spans, (handle.inode.ino, handle.path, handle.reader, self._image_epoch, spans))

    def _push_image_spans(self, job: tuple[int, Path, Any, int, list[tuple[int, int]]]) -> None:
        """One after another, nearest first: the disk serves the reader's own reads in between."""
        ino, path, reader, epoch, spans = job
        for start, length in spans:
            self._push_image_range(ino, path, reader, epoch, start, length)

    def _push_image_range(self, ino: int, path: Path, reader: Any, epoch: int, start: int, length: int) -> None:
        """Read one range of a whole-image file and store it in the kernel's page cache,
        unless the kernel asked for it meanwhile or the file's bytes changed."""

        def current() -> bool:
            """The bytes the kernel caches for this file are still `reader`'s (no reload,
            no reopen after a change: see _open)."""
            return epoch == self._image_epoch and self._image_versions.get(path) == reader.version

        try:
            if not reader.push_wanted(start) or not current():
                return
            data = reader.read(start, length)
            if not current():
                return
            self.kernel.store(ino, start, data)  # type: ignore[union-attr]
            if not current():  # changed while storing: drop what may be old bytes
                trio.from_thread.run_sync(self._invalidate, ino)
                return
            self.stats.count("image_tiles_pushed")
        except Exception as e:  # the reader's own read reports it, with its errno
            log.debug("%s: pushing bytes %d+%d failed: %s", "/".join(path), start, length, e)

    @operation(_by_handle)
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.handles[fh]
        if not isinstance(handle, WriteHandle):
            raise NotAllowedError(errno.EBADF, "file not open for writing")
        return await self.writes.write(handle.state, off, buf, append=handle.append)

    @operation(_by_handle)
    async def flush(self, fh: int) -> None:
        if self.read_only:
            # Nothing on a read-only mount commits at close. ENOSYS makes the kernel
            # stop sending FLUSH for the whole mount (close() still succeeds): one
            # request less per close, what the per-open noflush reply does where
            # pyfuse3 passes it on. A read-write mount needs FLUSH, its commit point.
            self.stats.count("flush_requests")
            raise FsError(errno.ENOSYS)
        handle = self.handles[fh]
        if isinstance(handle, WriteHandle):
            await self.writes.flush(handle.state, self._invalidation_of(handle.path))

    @operation(_by_handle)
    async def fsync(self, fh: int) -> None:
        handle = self.handles[fh]
        if isinstance(handle, WriteHandle):
            await self.writes.fsync(handle.state, self._invalidation_of(handle.path))
        if not self.durable:
            await self.run(os.sync)  # what was stored without fdatasync reaches the disk

    def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is None:
            return
        handle.close()
        if handle.page_cached:
            left = self._cached_readers.get(handle.path, 1) - 1
            if left > 0:
                self._cached_readers[handle.path] = left
            else:
                self._cached_readers.pop(handle.path, None)
                waiting = self._readers_gone.get(handle.path)
                if waiting is not None:
                    waiting.set()
            if isinstance(handle, SnapshotHandle) and handle.path in self._old_bytes_cached:
                self._release_old_bytes(handle.path)
        if not isinstance(handle, WriteHandle):
            return
        outcome = self.writes.release(handle.state)
        if outcome in (Released.COMMITTED, Released.PENDING, Released.REVERTED):
            self._invalidate_path(handle.path)  # new bytes or size: drop cached data
        elif outcome is Released.VANISHED:
            self._forget_name(handle.path)

    def _release_old_bytes(self, path: Path) -> None:
        """A page-cache reader of a replaced chunk's old bytes closed: after the last one,
        the old bytes it may have put in the kernel's page cache are dropped."""
        left = self._old_bytes_cached[path] - 1
        if left > 0:
            self._old_bytes_cached[path] = left
        else:
            del self._old_bytes_cached[path]
            self._invalidate_path(path)

    async def _wait_for_cached_readers(self, path: Path) -> None:
        """Before `cp` truncates a chunk, let readers that read it through the page cache
        finish (bounded by `reader_grace`): the kernel sets the file's size to 0 on
        O_TRUNC for every opener, so such a reader would see a short file. Readers
        opening meanwhile get direct I/O and read the stored chunk."""
        event = self._readers_gone.setdefault(path, trio.Event())
        try:
            with trio.move_on_after(self.reader_grace):
                await event.wait()
        finally:
            if self._readers_gone.get(path) is event:
                del self._readers_gone[path]

    # -- read-ahead across files --------------------------------------------
    def _read_ahead(self, arr: Any, coords: tuple[int, ...]) -> None:
        """Keep the next chunks in C order decoding in the background while this one is read.

        A reader going through chunk files one by one otherwise waits for each
        decode in turn; with read-ahead, decoding overlaps the transfer. The
        window slides: opening a file that was decoded ahead asks for the next
        one, so a scan never waits for a fresh batch. A cached chunk opened
        otherwise is a re-read, served by the kernel's page cache: nothing ahead.
        """
        if self.spawn_read_ahead is None or arr.layout is None:
            return
        if arr.cache.max_bytes < 4 * arr.layout.data_size:
            return  # no room to keep what is decoded ahead
        key = (id(arr), coords)
        scanning = self._opened_ahead(key)
        cached = arr.is_cached(coords)
        if cached and not scanning:
            return
        if not cached and key not in self._reading_ahead:
            # this file's own chunk first, starting now rather than at its first read
            self._reading_ahead.add(key)
            self.spawn_read_ahead(self._decode_ahead, (arr, coords, key, False))
        for nxt in arr.successors(coords, READ_AHEAD):
            key = (id(arr), nxt)
            if key in self._reading_ahead or arr.is_cached(nxt):
                continue
            self._reading_ahead_unopened(key)
            self.spawn_read_ahead(self._decode_ahead, (arr, nxt, key, True))

    def _opened_ahead(self, key: Any) -> bool:
        """Whether the chunk file being opened was read ahead and not opened since: a
        scan goes on (keep the window full), not a re-read. It is opened now."""
        return self._ahead_unopened.pop(key, False) is None

    def _reading_ahead_unopened(self, key: Any) -> None:
        """A chunk read ahead (in flight until its job ends) and remembered as not opened
        yet (`_opened_ahead`; the oldest forgotten beyond AHEAD_REMEMBERED)."""
        self._reading_ahead.add(key)
        self._ahead_unopened[key] = None
        while len(self._ahead_unopened) > AHEAD_REMEMBERED:
            self._ahead_unopened.popitem(last=False)

    def _advise_ahead(self, arr: Any, coords: tuple[int, ...], opened_before: bool) -> None:
        """`_read_ahead` for chunks stored raw: nothing to decode, so the next chunks'
        stored files are only asked of the OS (posix_fadvise WILLNEED) and checked to
        exist, in a worker thread, while this one is read. Their lookups then answer
        from memory, their opens need no thread and their reads find the page cache
        filled. The window slides as `_read_ahead`'s does, but only once less than
        half of it is left (one thread hop per few files, not per file); a re-read
        asks nothing."""
        if self.spawn_read_ahead is None:
            return
        scanning = self._opened_ahead((id(arr), coords))
        if opened_before and not scanning:
            return
        ahead = arr.successors(coords, STORED_AHEAD)
        batch = [c for c in ahead if (id(arr), c) not in self._reading_ahead and (id(arr), c) not in self._stored_names]
        if scanning and len(ahead) - len(batch) >= STORED_AHEAD // 2:
            return  # still half a window or more ahead of the reader
        for nxt in batch:
            self._reading_ahead_unopened((id(arr), nxt))
        if batch:
            self.spawn_read_ahead(self._advise_stored, (arr, batch))

    def _advise_stored(self, job: tuple[Any, list[tuple[int, ...]]]) -> None:
        arr, batch = job
        for coords in batch:
            key = (id(arr), coords)
            try:
                if arr.exists(coords) and arr.advise_ahead(coords):
                    self._note_stored_name(key)
                    self.stats.count("read_ahead")
            except Exception as e:  # the real open and read report it
                log.debug("read-ahead of %s failed: %s", coords, e)
            finally:
                self._reading_ahead.discard(key)

    def _decode_ahead(self, job: tuple[Any, tuple[int, ...], Any, bool]) -> None:
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
            self._reading_ahead.discard(key)

    # -- namespace changes --------------------------------------------------
    def _refusal(self, code: int, message: str) -> ZfuseError:
        """What a refused change raises: EROFS on a read-only mount, else `code`."""
        if self.read_only:
            return ReadOnlyError(f"the mount is read-only: {message}")
        return NotAllowedError(code, message)

    def _refuse_special(self, *paths: Path) -> None:
        """`.zfuse/` is ours: nothing is created, renamed or removed there."""
        for path in paths:
            if path[:1] == (SPECIAL_DIR,):
                raise self._refusal(errno.EPERM, f"{SPECIAL_DIR}/ is zfuse's own")

    async def _refuse_image(self, path: Path, op: str) -> None:
        """Whole-image files are read-only views: EROFS (-o ro) or EACCES."""
        if path[-1:] and path[-1] in IMAGE_NAMES:
            entry = await self._entry(path)
            if entry is not None and entry.node is Node.IMAGE:
                raise self._refusal(errno.EACCES, f"{op} refused: {'/'.join(path)} is a read-only "
                                                  "whole-image view of the array; write chunk files instead")

    async def _keep_readers(self, path: Path) -> None:
        """Readers of a chunk about to be replaced or deleted keep its current bytes: their
        handles become snapshots (reads meanwhile decode the same chunk)."""
        for fh, handle in list(self.handles.items()):
            if handle.path != path or not isinstance(handle, ChunkHandle) or self.handles.get(fh) is not handle:
                continue
            # (an unlinked chunk is no longer listed but still stored: it reads as it was)
            arr, coords = handle.array, handle.coords
            decoding = self.handles[fh] = DecodedChunkHandle(path, handle.inode, arr, coords, handle.page_cached)
            data = None
            if isinstance(handle, StoredChunkHandle):  # the bytes of the stored file it opened
                stored = handle.stored
                try:
                    data = await self.run(stored.read, 0, stored.size)
                except CorruptDataError as e:  # (replaced behind the mount's back): decoded
                    log.debug("%s: %s", "/".join(path), e)
                finally:
                    stored.close()
            if data is None:
                data = await self.run(arr.read, coords, 0, arr.file_size(coords))
            if self.handles.get(fh) is decoding:  # (else closed meanwhile)
                self.handles[fh] = SnapshotHandle(path, handle.inode, bytes(data), decoding.page_cached)
                if decoding.page_cached:
                    self._old_bytes_cached[path] = self._old_bytes_cached.get(path, 0) + 1

    @operation(_by_child)
    async def unlink(self, parent: int, name: str) -> None:
        path = self._child(parent, name)
        self._refuse_special(path)
        await self._refuse_image(path, "unlink")
        await self.writes.unlink(path)
        self._detach_inode(path)

    @operation(_by_child)
    async def rename(self, parent_old: int, old_name: str, parent_new: int, new_name: str, flags: int) -> None:
        old, new = self._child(parent_old, old_name), self._child(parent_new, new_name)
        self._refuse_special(old, new)
        await self._refuse_image(old, "rename")
        await self._refuse_image(new, "rename onto")
        await self._keep_readers(old)
        await self.writes.rename(old, new, flags)
        self._forget_stored(old)
        # the kernel moved the inode of `old` to `new`; the one that was at `new` is
        # detached but stays valid for whoever looked it up a moment ago
        self._detach_inode(new)
        inode = self.inodes.take_path(old)
        if inode is not None:
            self.inodes.set_path(inode, new)
            self._invalidate(inode.ino)

    @operation(_by_child)
    async def mkdir(self, parent: int, name: str) -> Attributes:
        path = self._child(parent, name)
        self._refuse_special(path)
        entry = await self.writes.mkdir(path)
        attrs = self.attributes(path, entry)
        self.remember(attrs.ino)
        return attrs

    @operation(_by_child)
    async def rmdir(self, parent: int, name: str) -> None:
        path = self._child(parent, name)
        self._refuse_special(path)
        await self.writes.rmdir(path)

    def refuse_link(self) -> FsError:
        """symlink, link, mknod: the view has only directories and TIFF files."""
        return FsError(errno.EROFS if self.read_only else errno.EPERM)

    # -- time, reload, shutdown -----------------------------------------------
    async def tick(self) -> None:
        """Carry out what is due (deferred deletions, abandoned pending files)."""
        try:
            changed = await self.writes.expire()
        except Exception as e:
            raise self.fail(e, "expire", None) from None
        for path in changed:
            self._invalidate_path(path)
            self._forget_name(path)

    async def shutdown(self) -> None:
        await self.writes.shutdown()

    async def refresh(self) -> None:
        """Reload metadata; forget listings, shard indexes, decoded chunks and the
        kernel's caches (SIGHUP, metadata_ttl).

        With a `reload` callable the source is opened again and a new view built
        (arrays added, removed or resized are seen). Open files move to the new
        view too: what they read afterwards is the store as it is now, never old
        byte ranges applied to rewritten objects.
        """
        old = self.view
        self._image_epoch += 1  # whole-image tiles being pushed are of the old view
        view = None
        if self.reload is not None:
            try:
                view = await self.run(self.reload)
            except Exception as e:  # keep serving the old view rather than nothing
                log.error("reload failed, keeping the previous view: %s", e)
                self.journal((), f"reload failed, keeping the previous view: {e}")
        if view is None:
            await self.run(old.refresh)
            for fh, handle in list(self.handles.items()):
                if isinstance(handle, StoredChunkHandle) and self.handles.get(fh) is handle:
                    await self._reopen_stored(fh, handle, handle.array, handle.coords)  # the store as it is now
        else:
            old.cache.clear()  # the old view is dropped; the swap happens here, between requests
            self.view = view
            self.writes.rebind(view)
            self._journal_problems(view)
            for fh, handle in list(self.handles.items()):  # (awaits below: requests go on)
                if self.handles.get(fh) is not handle:
                    continue  # closed, or of another kind now
                if isinstance(handle, WholeImageHandle):
                    await self._rebind_image(handle)
                    continue
                if not isinstance(handle, ChunkHandle):
                    continue
                arr, coords = view.chunk_at(handle.path)
                if arr is not None and arr.layout is not None and coords is not None:
                    handle.array, handle.coords = arr, coords
                    if isinstance(handle, StoredChunkHandle):  # the store as it is now: reopened
                        await self._reopen_stored(fh, handle, arr, coords)
        for ino in self.inodes.inos():
            if ino != ROOT_INODE:
                self._invalidate(ino)

    async def _reopen_stored(self, fh: int, handle: StoredChunkHandle, arr: Any, coords: tuple[int, ...]) -> None:
        """A reload: an open chunk stored raw reads the stored file as it is now (or is
        decoded, if it is no longer stored raw); the kernel's cache of it is dropped."""
        old = handle.stored
        try:
            new = await self.run(arr.open_stored, coords)
        except Exception as e:  # read decoded: that read reports what is wrong
            log.debug("reload: %s: %s", "/".join(handle.path), e)
            new = None
        if self.handles.get(fh) is not handle or handle.stored is not old:  # closed or snapshot meanwhile
            if new is not None:
                new.close()
            return
        if new is None:  # no longer stored raw: decoded
            self.handles[fh] = DecodedChunkHandle(handle.path, handle.inode, arr, coords, handle.page_cached)
        else:
            handle.stored = new
        old.close()  # (the kernel's caches are dropped at the end of the reload)

    async def _rebind_image(self, handle: WholeImageHandle) -> None:
        """An open whole-image file follows a reload if its byte layout is unchanged;
        otherwise its reads fail (EIO, logged): the reader must reopen it."""
        entry = self.view.entry(handle.path)
        new = entry.reader if entry is not None and entry.node is Node.IMAGE else None
        try:
            same = new is not None and await self.run(handle.reader.same_layout, new)
        except Exception as e:
            log.warning("reload: %s: %s", "/".join(handle.path), e)
            same = False
        if same:
            handle.reader = new
        else:
            handle.reader.invalidate(f"{'/'.join(handle.path)} changed on reload (the store "
                                     "changed): reopen the file")

    # -- kernel cache invalidation --------------------------------------------
    def _invalidate(self, ino: int) -> None:
        path = self.inodes.path_of(ino)
        if path is not None:
            self._forget_stored(path)
        if self.kernel is not None:
            self.kernel.invalidate_inode(ino)

    def _forget_stored(self, path: Path) -> None:
        """The kernel keeps no bytes of `path` now (or the file changed through the mount):
        no stored file is remembered as what it caches or kept for its re-opens."""
        self._stored_versions.pop(path, None)
        if path in self._stored_kept:
            self._drop_kept_stored(path)

    def _invalidate_path(self, path: Path) -> None:
        self._forget_stored(path)
        ino = self.inodes.ino_of(path)
        if ino is not None:
            self._invalidate(ino)

    def _invalidation_of(self, path: Path) -> Callable[[], None] | None:
        """What drops the kernel's cached data of `path` from a worker thread: a commit
        calls it in its own thread once the chunk is stored (a thread of its own per
        commit was ~10 % of the daemon's CPU in a `cp` loop)."""
        self._forget_stored(path)
        ino = self.inodes.ino_of(path)
        if ino is None or self.kernel is None:
            return None
        return functools.partial(self._invalidate_here, path, ino)

    def _invalidate_here(self, path: Path, ino: int) -> None:
        """(In a commit's worker thread, once the chunk is stored: a reader that opened the
        old stored file meanwhile recorded it as what the kernel caches; no longer.)"""
        self._forget_stored(path)
        self.kernel.invalidate_inode_here(ino)  # type: ignore[union-attr]

    def _forget_name(self, path: Path) -> None:
        """A name that no longer resolves: the kernel must not keep its dentry."""
        parent = self.inodes.ino_of(path[:-1])
        if parent is not None and self.kernel is not None:
            self.kernel.invalidate_entry(parent, path[-1])
