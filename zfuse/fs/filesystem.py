"""`FileSystem`: every file operation on the mount, decided without FUSE.

`zfuse.fuse_ops` translates each FUSE request into one call here and the
result or `FsError` into one reply; everything a request *decides* is decided
here or in one of the parts it holds (`zfuse/fs/__init__.py` lists them), so it
is tested with plain calls (tests/test_fs.py), no kernel.

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
  Which reader reads through the page cache is counted by `page_readers`
  (`page_cache.py`); which stored file the cache holds, by `stored` (`stored_files.py`).
- Errors: each failure is logged once with its store key, counted and journaled
  (`.zfuse/errors`, `special.py`), and leaves as `FsError(errno)` (`operation`).
- Reload: a new view, with open files and write states moved onto it.
- Directory handles; listing ahead of walkers is `listing_ahead`'s, read-ahead
  across chunk files `read_ahead`'s, whole-image pages `image_pages`'.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat as stat_mod
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from zfuse import defaults
from zfuse.errors import (
    CorruptDataError,
    NotAllowedError,
    ReadOnlyError,
    RefusedAgainError,
    ZfuseError,
    errno_for,
)
from zfuse.fs.image_push import ImagePages
from zfuse.fs.listing_ahead import ListingAhead, Prepared
from zfuse.fs.page_cache import READER_GRACE, PageCacheReaders
from zfuse.fs.read_ahead import ReadAhead
from zfuse.fs.special import SPECIAL_DIR, ErrorJournal, SpecialFiles, is_special
from zfuse.fs.stored_files import StoredFiles
from zfuse.fs.types import (
    ATTR_TIMEOUT,
    BLKSIZE,
    CHUNK_BLKSIZE,
    ROOT_INODE,
    AcceptRun,
    Attributes,
    FsError,
    Kernel,
    OpenReply,
    Path,
    Run,
    Spawn,
    T,
    run_here,
)
from zfuse.handles import (
    BufferHandle,
    ChunkHandle,
    DecodedChunkHandle,
    Handle,
    OldCopies,
    SnapshotHandle,
    StaleHandle,
    StoredChunkHandle,
    WholeImageHandle,
    WriteHandle,
)
from zfuse.inodes import Inode, InodeTable
from zfuse.stats import Stats
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

QUIET_ERRNOS = (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY)  # answers, not failures


@dataclass
class _DirHandle:
    path: Path
    reader: DirReader
    prepared: Prepared | None = None  # made ahead in the listing thread (its reader is `reader`)


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


PENDING_PATHS_SHOWN = 20  # pending files `.zfuse/stats` names (`pending_paths`)


#: failures of one kind (operation, errno) logged in LOG_WINDOW_S at most; the rest are
#: counted in one line (every one is in .zfuse/errors, the last ERRORS_KEPT)
LOG_BURST = 20
LOG_WINDOW_S = 10.0
LOG_KINDS_KEPT = 1024

class FileSystem:
    """The mount's file operations over a `View`, decided without FUSE."""

    def __init__(
        self,
        view: View,
        *,
        read_only: bool = False,
        stats: Stats | None = None,
        run: Run = run_here,
        run_read: Run | None = None,
        kernel: Kernel | None = None,
        spawn: Spawn | None = None,
        spawn_listing: Spawn | None = None,
        spawn_read_ahead: Spawn | None = None,
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
        self.old_copies = OldCopies(defaults.OLD_COPIES_BYTES)  # readers' copies of replaced chunks
        self._keeping: set[int] = set()  # readers whose copy `_keep_readers` is making
        # (operation, errno) -> [window start, lines logged, lines not logged] (`_log_allowed`)
        self._log_windows: dict[tuple[str, int], list[float]] = {}
        self.durable = durable  # False: close() survives the daemon; fsync() reaches the disk
        self.read_only = read_only
        self.stats = stats or Stats()
        self.run = run  # blocking work, in a worker thread on a mount
        # a file's reads, in threads of their own on a mount: reads waiting on a slow store
        # leave the others (lookups, listings, opens) theirs
        self.run_read = run_read or run
        self.kernel = kernel
        self.spawn = spawn  # background blocking work (and read-ahead, without spawn_read_ahead); None: none
        self.reload = reload
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.started_ns = time.time_ns()
        self.journal_lines = ErrorJournal()
        self.special = SpecialFiles(self.stats, self.journal_lines, self._live_stats, mount_info)
        self.writes = Writes(
            view, read_only=read_only, stats=self.stats, run=run, clock=clock,
            replace_window=replace_window, pending_timeout=pending_timeout,
            journal=self.journal, before_replace=self._keep_readers, process=process,
        )
        self.inodes = InodeTable(Inode(ROOT_INODE, (), lookups=1))
        self.handles: dict[int, Handle] = {}
        self._dirs: dict[int, _DirHandle] = {}
        self._next_fh = 1
        # the parts, each owning its state (their modules say what each decides)
        self.listing_ahead = ListingAhead(self.stats, spawn_listing or spawn, spawn)
        self.stored = StoredFiles(run, clock)
        self.read_ahead = ReadAhead(self.stats, spawn_read_ahead or spawn, self.stored)
        self.page_readers = PageCacheReaders(reader_grace)
        self.image_pages = ImagePages(self.stats, kernel, spawn, self._invalidate)
        self._journal_problems(view)
        # each node kind's mode, and the kinds whose attributes the kernel must not cache
        # (live counters): `attributes` runs once per entry of every listing
        self._modes = {
            node: (stat_mod.S_IFDIR if node.is_dir else stat_mod.S_IFREG)
            | (0o555 if node.is_dir else 0o444)
            | (0 if read_only or node.read_only else 0o200)
            for node in Node
        }
        self._live_nodes = frozenset((Node.ZFUSE_DIR, Node.ZFUSE_FILE))

    @property
    def errors(self) -> Any:
        """The lines of `.zfuse/errors`."""
        return self.journal_lines.lines

    def _live_stats(self) -> dict[str, Any]:
        """What `.zfuse/stats` adds to the counters: the cache and the files being written."""
        cache = self.view.cache
        pending = [s for s in self.writes.states.values() if s.phase is Phase.PENDING]
        # (the files an unmount would drop, their bytes never stored: `zfuse umount` names them)
        dropped = sorted("/".join(s.path) for s in pending if s.buffer)
        return dict(cache_hits=cache.hits, cache_misses=cache.misses, cache_bytes=cache.used,
                    pending_files_now=len(pending), pending_paths=dropped[:PENDING_PATHS_SHOWN],
                    unlinked_not_yet_deleted=len(self.writes.removed))

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
        expected = isinstance(exc, (ZfuseError, OSError, TimeoutError, MemoryError))
        reason = str(exc) if expected else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and len(exc.args) == 2 and exc.strerror:
            reason = str(exc.strerror)  # (its words: the errno is named after them, once)
        if isinstance(exc, MemoryError):
            reason = f"the daemon ran out of memory in {op} ({exc or 'MemoryError'}); try again later"
        elif not str(exc):  # (aiohttp's TimeoutError says nothing): never an empty reason
            reason = f"{type(exc).__name__} (no message) in {op} of store key {key}"
        # (a path that is no chunk's has no store key of its own: not named as one)
        named = f" [store key {key}]" if key != where else ""
        if not expected or self._log_allowed(op, code):  # (a bug's traceback is always logged)
            log.error("%s %s%s: %s (%s)", op, where, named, reason,
                      errno.errorcode.get(code, code), exc_info=None if expected else exc)
        # (the store key there too: "flush: Permission denied" named no file of the store)
        said = f" [store key {key}]" if key != where and key not in reason else ""
        self.journal(path or (), f"{op}{said}: {reason} ({errno.errorcode.get(code, code)})")
        return FsError(code)

    def _log_allowed(self, op: str, code: int) -> bool:
        """Whether a failure of `op` with `code` is logged: at most LOG_BURST of a kind in
        LOG_WINDOW_S, then one line saying how many were not (one client's refused
        mkdirs wrote 9 GiB of log an hour; .zfuse/errors keeps the last of them all)."""
        now = self.clock()
        window = self._log_windows.get((op, code))
        if window is None or now - window[0] >= LOG_WINDOW_S:
            if window is not None:
                self._log_not_logged(op, code, window)
            if len(self._log_windows) >= LOG_KINDS_KEPT:
                self.log_not_logged(every=True)
            window = self._log_windows[(op, code)] = [now, 0, 0]
        if window[1] < LOG_BURST:
            window[1] += 1
            return True
        window[2] += 1
        return False

    def log_not_logged(self, every: bool = False) -> None:
        """Log how many failures the windows past (or, `every`: all of them, at shutdown)
        did not, and forget those windows (`tick` calls it: a burst that stops is said)."""
        now = self.clock()
        for (op, code), window in list(self._log_windows.items()):
            if every or now - window[0] >= LOG_WINDOW_S:
                self._log_not_logged(op, code, window)
                del self._log_windows[(op, code)]

    @staticmethod
    def _log_not_logged(op: str, code: int, window: list[float]) -> None:
        if window[2]:
            log.error("%d more failures of %s (%s) in %g s were not logged (see .zfuse/errors)",
                      window[2], op, errno.errorcode.get(code, code), LOG_WINDOW_S)

    def journal(self, path: Path, reason: str) -> None:
        """One line of `.zfuse/errors`: time, path, reason."""
        self.journal_lines.add(path, reason)

    def _journal_problems(self, view: View) -> None:
        """Arrays the view shows without chunk files, and why: in `.zfuse/errors` too (also
        those found later, as a remote store's groups are opened)."""
        def journal(problem: Any) -> None:
            self.journal(tuple(problem.path.split("/")) if problem.path else (), f"not shown: {problem.reason}")

        for problem in getattr(view, "problems", ()):
            journal(problem)
        watch = getattr(view, "watch_problems", None)
        if watch is not None:
            watch(journal)

    def store_key(self, path: Path) -> str:
        """The store key behind a path, for log lines (the chunk's key, or the path)."""
        arr, coords = self.view.chunk_at(path, memory_only=True)
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
    async def _entry(self, path: Path, pid: int | None = None) -> Entry | None:
        """What is at `path` for process `pid`: `.zfuse/`, written files, then the view."""
        if is_special(path):
            return self.special.entry(path)
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
        self.view.retry_failed(path)  # a reader looking the file up again asks a failing store again
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
        inode = self._get(ino)
        path = inode.path
        if inode.detached and size is not None and not fh:  # (as `_open`: not the file at its name now)
            raise FsError(errno.ESTALE)
        entry = await self._entry(path, pid)
        if entry is None:
            raise FsError(errno.ENOENT)
        if size is not None and entry.node.read_only:
            raise self._refusal(errno.EACCES, f"{'/'.join(path)} is read-only: not truncated")
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
        prepared = self.listing_ahead.take_prepared(path, self.view, not self.writes.states and not self.writes.made_dirs)
        if prepared is not None:
            return self._open_listed(self.view, path, prepared.reader, prepared)
        entry = await self._entry(path)
        if entry is None or not entry.node.is_dir:
            raise FsError(errno.ENOTDIR if entry else errno.ENOENT)
        view = self.view
        if entry.node is Node.ZFUSE_DIR:
            reader = DirReader(view, path, self.special.listing())
            reader.fetch(0)
            fh = self._allocate_fh()
            self._dirs[fh] = _DirHandle(path, reader)
            return fh
        # a small directory is one sorted snapshot (paging stays consistent); a big
        # one is read page by page in readdir. Files only the daemon holds come last.
        tail = self.writes.scratch_in(path)
        reader = view.dir_reader(path, tail)
        if (ahead := self.listing_ahead.scheduled.get(path)) is not None:
            # scheduled to be listed ahead: list it now if the listing thread has not
            # started it, else wait for that (never listed twice)
            self.stats.count("listing_ahead_caught_up")
            await self.run(self.listing_ahead.fetch, ahead, reader)
            prepared = self.listing_ahead.take_prepared(path, view, not tail)  # made by the listing thread meanwhile
            if prepared is not None:
                reader = prepared.reader
        elif view.needs_io(path, listing=True):
            await self.run(reader.fetch, 0)  # that key prefix only
        else:
            reader.fetch(0)
        return self._open_listed(view, path, reader, prepared)

    def _open_listed(self, view: View, path: Path, reader: DirReader, prepared: Prepared | None) -> int:
        """A directory handle on `reader`; a walker's next directories are listed ahead."""
        self.listing_ahead.opened(view, path)
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

    def _readdir_uniform(self, prepared: Prepared, start: int, accept: Callable[[str, int, Attributes, int], bool],
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
        if handle is not None and handle.prepared is not None:
            self.listing_ahead.let_go(handle)

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
        if inode.detached and wants_write:
            # unlinked or replaced since it was looked up: its name is another file's now
            # (a reopen through /proc/self/fd for writing wrote into that file). On ESTALE
            # the kernel looks a path up again; a reopen of the old file gets ESTALE.
            # (Read, it is the file at its name: [ns-2].)
            raise FsError(errno.ESTALE)
        entry = await self._entry(path, pid)
        if entry is not None and entry.node.is_dir:
            raise FsError(errno.EISDIR)
        if entry is not None and entry.node.read_only:
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
            unchanged = self.image_pages.opened(path, entry.reader.version)
            return OpenReply(self._new_handle(WholeImageHandle(path, inode, entry.reader)), keep_cache=unchanged)
        content = self.special.content(path[-1]) if entry.node is Node.ZFUSE_FILE else entry.content or b""
        return OpenReply(self._new_handle(SnapshotHandle(path, inode, content)), direct_io=entry.node is Node.ZFUSE_FILE)

    async def _open_for_writing(self, inode: Inode, entry: Entry | None, flags: int, pid: int | None) -> OpenReply:
        path = inode.path
        if flags & os.O_TRUNC and path not in self.writes.states:
            async with self.page_readers.truncating(path):
                state = await self.writes.open(path, entry, flags, pid)
        else:
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
        if coords is not None:  # a reader opening anew asks a failing store again
            arr.source.retry_failed(coords)
        opened_before = self.stored.known(arr, coords)
        state = self.writes.states.get(path)
        stored = None
        if state is None and arr.serves_stored is not False:
            view = self.view
            stored = await self.stored.open(path, arr, coords)
            if self.view is not view or inode.path != path or inode.detached:
                # reloaded meanwhile, or the file renamed or removed (its inode now another
                # name's: opened as it was, a chunk gone, it read zeros into that file's
                # page cache): open what the inode is now
                if stored is not None:
                    stored.close()
                return await self._open(inode.ino, flags, pid)
            state = self.writes.states.get(path)  # (what a request meanwhile changed)
        if state is not None or self.page_readers.bypassed(path):
            if stored is not None:
                stored.close()  # the decoded chunk, as for every file being written
            if state is not None and self.writes.sees_buffer(state, pid):
                self.writes.reader_opened(state)
                return OpenReply(self._new_handle(BufferHandle(path, inode, state, arr, coords)), direct_io=True)
            return OpenReply(self._new_handle(DecodedChunkHandle(path, inode, arr, coords)), direct_io=True)
        if stored is None:
            handle: ChunkHandle = DecodedChunkHandle(path, inode, arr, coords)
        else:
            handle = StoredChunkHandle(path, inode, arr, coords, stored)
        keep_cache = True  # unchanged chunks keep their page cache
        if stored is not None and not self.stored.cached_is(path, stored):
            # The stored file is not the one whose bytes the kernel may cache for this
            # path (replaced in the store, or not known): readers still open on it keep
            # that cache and this one reads around it; with none open it is dropped.
            if self.page_readers.any_open(path):
                return OpenReply(self._new_handle(handle), direct_io=True)
            self.stored.now_cached(path, stored)
            keep_cache = False
        if stored is not None:
            self.stored.keep(path, stored)
        handle.page_cached = True
        self.page_readers.opened(path)
        fh = self._new_handle(handle)
        self.read_ahead.opened(arr, coords, opened_before)
        return OpenReply(fh, keep_cache=keep_cache)

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
        image = handle if isinstance(handle, WholeImageHandle) else None
        pushed = False
        if data is None:
            self.stats.count("reads_in_threads")  # (not in memory or the page cache yet)
            if image is not None and image.reader.pushes_before_read:
                pushed = True
                self.image_pages.push_for_read(image.inode.ino, image.path, image.reader, off, size)
            data = await self.run_read(handle.read, off, size)
        self.stats.count("bytes_read", len(data))
        if image is not None and not pushed:
            self.image_pages.push_for_read(image.inode.ino, image.path, image.reader, off, len(data))
        return data

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
            self.page_readers.closed(handle.path)
            # the last reader of a replaced chunk's old bytes: the old bytes it may have
            # put in the kernel's page cache are dropped
            if isinstance(handle, SnapshotHandle) and self.page_readers.old_bytes_closed(handle.path):
                self._invalidate_path(handle.path)
        if not isinstance(handle, WriteHandle):
            if isinstance(handle, BufferHandle):
                self.writes.reader_closed(handle.state)
            return
        outcome = self.writes.release(handle.state)
        if outcome in (Released.COMMITTED, Released.PENDING, Released.REVERTED):
            self._invalidate_path(handle.path)  # new bytes or size: drop cached data
        elif outcome is Released.VANISHED:
            self._forget_name(handle.path)

    # -- namespace changes --------------------------------------------------
    def _refusal(self, code: int, message: str) -> ZfuseError:
        """What a refused change raises: EROFS on a read-only mount, else `code`."""
        if self.read_only:
            return ReadOnlyError(f"the mount is read-only: {message}")
        return NotAllowedError(code, message)

    def _refuse_special(self, *paths: Path) -> None:
        """`.zfuse/` is ours: nothing is created, renamed or removed there."""
        for path in paths:
            if is_special(path):
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
        handles become snapshots (reads meanwhile decode the same chunk). Readers of one
        version share one copy of it (the stored file each opened, or the chunk decoded
        now): a copy per descriptor took 150 readers of an 8 MiB chunk to 1.3 GB (and
        500 past 4 GB, failing the writer's close with ENOMEM)."""
        copies: dict[object, bytes] = {}
        for fh, handle in list(self.handles.items()):
            if handle.path != path or not isinstance(handle, ChunkHandle) or self.handles.get(fh) is not handle:
                continue
            if fh in self._keeping:  # (another keep of this path is making its copy)
                continue
            # (an unlinked chunk is no longer listed but still stored: it reads as it was)
            arr, coords = handle.array, handle.coords
            version: object = handle.stored.identity if isinstance(handle, StoredChunkHandle) else "decoded"
            size = handle.stored.size if isinstance(handle, StoredChunkHandle) else arr.file_size(coords)
            if version not in copies and not self.old_copies.admits(size):
                if isinstance(handle, StoredChunkHandle):
                    handle.stored.close()
                why = (f"{'/'.join(path)} was replaced or removed while open, and the daemon already holds "
                       f"{self.old_copies.held} bytes of such files' old bytes for their readers: reopen it")
                self.handles[fh] = StaleHandle(path, handle.inode, size, why, handle.page_cached)
                continue
            decoding = self.handles[fh] = DecodedChunkHandle(path, handle.inode, arr, coords, handle.page_cached)
            self._keeping.add(fh)
            try:
                data = await self._old_bytes(handle, version, copies)
            finally:
                self._keeping.discard(fh)
            if self.handles.get(fh) is decoding:  # (else closed meanwhile)
                self.handles[fh] = SnapshotHandle(path, handle.inode, data, decoding.page_cached, self.old_copies)
                if decoding.page_cached:
                    self.page_readers.reads_old_bytes(path)

    async def _old_bytes(self, handle: ChunkHandle, version: object, copies: dict[object, bytes]) -> bytes:
        """The bytes a reader of a chunk about to change opened (one copy per version)."""
        arr, coords = handle.array, handle.coords
        data = None
        if isinstance(handle, StoredChunkHandle):  # the bytes of the stored file it opened
            stored = handle.stored
            try:
                data = copies.get(version)
                if data is None:
                    data = copies[version] = bytes(await self.run(stored.read, 0, stored.size))
            except CorruptDataError as e:  # (replaced behind the mount's back): decoded
                log.debug("%s: %s", "/".join(handle.path), e)
            finally:
                stored.close()
        if data is None:
            data = copies.get("decoded")
            if data is None:
                data = copies["decoded"] = bytes(await self.run(arr.read, coords, 0, arr.file_size(coords)))
        return data

    async def _follow_rename(self, old: Path, new: Path) -> None:
        """Readers of `old` opened while it was being renamed (after its readers kept its
        bytes: `Writes.rename`, through `_keep_readers`) read
        the file the kernel moved to `new`, as its inode does: its values are there now
        (at `old`, a chunk no longer stored, they read the fill value)."""
        followers = [h for h in self.handles.values()
                     if h.path == old and type(h) is DecodedChunkHandle and not h.page_cached]
        if not followers:
            return
        entry = await self._entry(new)
        if entry is None or entry.node is not Node.CHUNK or entry.array is None or entry.coords is None:
            return
        for handle in followers:
            handle.path, handle.array, handle.coords = new, entry.array, entry.coords

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
        with self.page_readers.changing_files(old, new):
            # (readers of `old` keep its bytes in `writes.rename`, once it has checked the
            # rename and holds both paths: a refused rename leaves them as they were)
            await self.writes.rename(old, new, flags)
            await self._follow_rename(old, new)
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
        """Carry out what is due (deferred deletions, abandoned pending files, failures
        not logged said)."""
        self.log_not_logged()
        try:
            changed = await self.writes.expire()
        except Exception as e:
            raise self.fail(e, "expire", None) from None
        for path in changed:
            self._invalidate_path(path)
            self._forget_name(path)

    async def shutdown(self) -> None:
        self.log_not_logged(every=True)
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
        self.image_pages.reloaded()  # whole-image tiles being pushed are of the old view
        view = None
        if self.reload is not None:
            try:
                view = await self.run(self.reload)
                # what is rebound below (open files, pending writes) found from memory
                await self.run(view.open_paths, [h.path for h in self.handles.values()]
                               + self.writes.paths_held())
            except Exception as e:  # keep serving the old view rather than nothing
                log.error("reload failed, keeping the previous view: %s", e)
                self.journal((), f"reload failed, keeping the previous view: {e}")
                # as it was, listings and decoded chunks too (a store that is down would
                # otherwise fail every read the view answered from memory until then)
                return
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
                arr, coords = view.chunk_at(handle.path, memory_only=True)  # (opened above)
                if arr is None:  # (forgotten again since: more groups than members_kept)
                    try:
                        arr, coords = await self.run(view.chunk_at, handle.path)
                    except Exception as e:  # (the old array stays: as when the path is gone)
                        log.warning("%s: not rebound after the reload: %s", "/".join(handle.path), e)
                        continue
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
        entry = self.view.entry(handle.path, memory_only=True)  # (its groups opened by the reload)
        new = entry.reader if isinstance(entry, Entry) and entry.node is Node.IMAGE else None
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
        """The kernel keeps no bytes of `path` now (or the file changed through the mount)."""
        self.stored.forget(path)

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
