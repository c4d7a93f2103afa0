"""The FUSE adapter: POSIX calls onto the view. The only module that imports pyfuse3.

Each handler turns one FUSE request into calls on `zfuse.view` and its result
or error into one reply. Store I/O and decoding run in worker threads
(`trio.to_thread`, bounded by a CapacityLimiter) so the event loop never
blocks; answers that are already in memory (sizes, listings, cached chunk
bytes) are served without a thread hop.

Errors: every exception leaving a handler is mapped to an errno here
(`errno_for`) and logged once with the store key involved; pyfuse3 would take
the mount down on anything but FUSEError.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyfuse3
import trio

from zfuse.errors import CorruptDataError, InvalidTiffError, MetadataError, ZfuseError
from zfuse.stats import Stats
from zfuse.view.tree import DIR, Entry, View
from zfuse.view.whole_image import NAMES as IMAGE_NAMES
from zfuse.view.writes import (
    FileTooLargeError,
    NotAllowedError,
    OpenFile,
    ReadOnlyError,
    Released,
    Writes,
)

log = logging.getLogger("zfuse.fuse")
T = TypeVar("T")

READ_AHEAD = 4  # chunk files decoded ahead of a sequential reader
STATS_DIR = ".zfuse"
STATS_FILE = "stats"
ATTR_TIMEOUT = 5.0


def enable_operation_log() -> None:
    """-v: log every FUSE operation (name, arguments, outcome) at DEBUG level."""
    import functools
    import inspect

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def logged(self: Any, *args: Any) -> Any:
            shown = ", ".join(
                repr(os.fsdecode(a)) if isinstance(a, bytes) and len(a) < 256 else
                f"<{len(a)} bytes>" if isinstance(a, (bytes, bytearray)) else repr(a)
                for a in args
                if not isinstance(a, (pyfuse3.RequestContext, pyfuse3.ReaddirToken))
            )
            try:
                result = await fn(self, *args)
            except pyfuse3.FUSEError as e:
                log.debug("%s(%s) -> %s", name, shown, errno.errorcode.get(e.errno, e.errno))
                raise
            log.debug("%s(%s) -> ok", name, shown)
            return result

        return logged

    for name, fn in list(vars(ZfuseOperations).items()):
        if inspect.iscoroutinefunction(fn) and not name.startswith("_"):
            setattr(ZfuseOperations, name, wrap(name, fn))


def errno_for(exc: BaseException) -> int:
    """The one table from exceptions to errno values."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, ReadOnlyError):
        return errno.EROFS
    if isinstance(exc, FileTooLargeError):
        return errno.EFBIG
    if isinstance(exc, InvalidTiffError):
        return errno.EINVAL
    if isinstance(exc, (CorruptDataError, MetadataError)):
        return errno.EIO
    if isinstance(exc, FileNotFoundError):
        return errno.ENOENT
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    if isinstance(exc, (TimeoutError, trio.TooSlowError)):
        return errno.EIO
    return errno.EIO


@dataclass
class _DirHandle:
    path: tuple[str, ...]
    entries: list[tuple[str, Entry]]


class _ImageHandle:
    """An open whole-image file: read-only; reads go to its `WholeImage` reader.
    Duck-types the parts of `OpenFile` the adapter touches (no state, no array)."""

    state = None
    array = None
    coords = None
    content = None
    writable = False

    def __init__(self, path: tuple[str, ...], reader: Any) -> None:
        self.path = path
        self.reader = reader
        self.inode = 0

    def entry(self) -> Entry:
        return Entry("file", size=self.reader.size, node="image", reader=self.reader)

    def read_cached(self, off: int, size: int) -> bytes | None:
        return self.reader.read_cached(off, size)

    def read(self, off: int, size: int) -> bytes:
        return self.reader.read(off, size)


class ZfuseOperations(pyfuse3.Operations):
    """pyfuse3 operations over a `View` (reads) and `Writes` (writes)."""

    enable_writeback_cache = False
    supports_dot_lookup = True

    def __init__(
        self,
        view: View,
        *,
        read_only: bool = False,
        max_threads: int = 8,
        stats: Stats | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> None:
        super().__init__()
        self.view = view
        self.stats = stats or Stats()
        self.writes = Writes(view, read_only=read_only, stats=self.stats)
        self.read_only = read_only
        self.limiter = trio.CapacityLimiter(max_threads)
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.started_ns = time.time_ns()
        self._dir_modes = {True: stat.S_IFDIR | 0o755, False: stat.S_IFDIR | 0o555}
        self._file_modes = {True: stat.S_IFREG | 0o644, False: stat.S_IFREG | 0o444}
        self._inode_of: dict[tuple[str, ...], int] = {(): pyfuse3.ROOT_INODE}
        self._path_of: dict[int, tuple[str, ...]] = {pyfuse3.ROOT_INODE: ()}
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._dirs: dict[int, _DirHandle] = {}
        self._files: dict[int, OpenFile] = {}
        self._next_fh = 1
        self.nursery: trio.Nursery | None = None
        self.reload: Callable[[], View] | None = None
        self.ahead_limiter = trio.CapacityLimiter(READ_AHEAD)
        self._reading_ahead: set[Any] = set()
        self._image_versions: dict[tuple[str, ...], Any] = {}

    # -- helpers ----------------------------------------------------------
    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    def _inode(self, path: tuple[str, ...]) -> int:
        inode = self._inode_of.get(path)
        if inode is None:
            inode = self._next_inode
            self._next_inode += 1
            self._inode_of[path] = inode
            self._path_of[inode] = path
        return inode

    def _path(self, inode: int) -> tuple[str, ...]:
        try:
            return self._path_of[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _fail(self, exc: BaseException, op: str, path: tuple[str, ...]) -> pyfuse3.FUSEError:
        """Log an error once, count it, and turn it into the FUSEError to raise."""
        if isinstance(exc, pyfuse3.FUSEError):
            return exc
        code = errno_for(exc)
        self.stats.count("errors")
        expected = isinstance(exc, (ZfuseError, OSError, TimeoutError, trio.TooSlowError))
        log.error("%s %s [store key %s]: %s (%s)", op, "/".join(path) or "/", self._store_key(path),
                  exc if expected else f"{type(exc).__name__}: {exc}", errno.errorcode.get(code, code),
                  exc_info=None if expected else exc)  # a bug: keep its traceback
        return pyfuse3.FUSEError(code)

    def _store_key(self, path: tuple[str, ...]) -> str:
        """The store key behind a path, for log lines (the chunk's key, or the path)."""
        arr, rest = self.view.array_at(path)
        coords = arr.coords_of(rest) if arr is not None and rest else None
        if arr is None or coords is None:
            return "/".join(path) or "/"
        prefix = f"{arr.source.name}/" if arr.source.name else ""
        return prefix + arr.source.chunk_key(coords)

    def _stats_entry(self, path: tuple[str, ...]) -> Entry | None:
        if path == (STATS_DIR,):
            return Entry(DIR, node="stats")
        if path == (STATS_DIR, STATS_FILE):
            return Entry("file", size=len(self._stats_bytes()), node="stats")
        return None

    def _stats_bytes(self) -> bytes:
        snapshot = self.stats.snapshot()
        cache = self.view.cache
        snapshot.update(cache_hits=cache.hits, cache_misses=cache.misses, cache_bytes=cache.used)
        return (json.dumps(snapshot, indent=2, sort_keys=True) + "\n").encode()

    async def _entry(self, path: tuple[str, ...]) -> Entry | None:
        """What is at `path`: open files and scratch files first, then the view."""
        special = self._stats_entry(path)
        if special is not None:
            return special
        scratch = self.writes.pending_entry(path)
        if scratch is not None:
            return scratch
        # the array directory itself needs no listing: only paths inside it do
        view = await self._listed_view(path, inside_only=True)
        return view.entry(path)

    async def _listed_view(self, path: tuple[str, ...], *, inside_only: bool = False) -> View:
        """The current view, with the array at `path` listed. Callers use this one view
        for the whole request even if a reload swaps `self.view` meanwhile."""
        view = self.view
        arr, rest = view.array_at(path)
        if inside_only and not rest:
            return view
        while arr is not None and not arr.listed:
            await self._thread(arr.ensure_listed)
        return view

    def _attrs(self, path: tuple[str, ...], entry: Entry, inode: int | None = None) -> pyfuse3.EntryAttributes:
        # hot: called once per entry of every readdir (100,000 for `ls -lR` of a big array)
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = self._inode_of.get(path) or self._inode(path) if inode is None else inode
        node = entry.node
        writable = not self.read_only and node != "stats" and node != "meta" and node != "image"
        if entry.kind == DIR:
            attrs.st_mode = self._dir_modes[writable]
            attrs.st_nlink = 2
        else:
            attrs.st_mode = self._file_modes[writable]
            attrs.st_nlink = 1
        size = entry.size
        attrs.st_size = size
        attrs.st_uid = self.uid
        attrs.st_gid = self.gid
        mtime = (self.writes.mtime_ns(path) if self.writes.touched else None) or self.started_ns
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = mtime
        attrs.st_blksize = 131072
        attrs.st_blocks = (size + 511) >> 9
        attrs.attr_timeout = attrs.entry_timeout = 0 if node == "stats" else ATTR_TIMEOUT
        return attrs

    # -- lookup and attributes ---------------------------------------------
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        parent = self._path(parent_inode)
        name_s = os.fsdecode(name)
        if name_s == ".":
            path = parent
        elif name_s == "..":
            path = parent[:-1]
        else:
            path = (*parent, name_s)
        try:
            entry = await self._entry(path)
        except Exception as e:
            raise self._fail(e, "lookup", path) from None
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(path, entry)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        if inode not in self._path_of:
            # unlinked or replaced while open: fstat on the open file still works
            for handle in self._files.values():
                if handle.inode == inode:
                    return self._attrs(handle.path, handle.entry(), inode)
            raise pyfuse3.FUSEError(errno.ENOENT)
        path = self._path(inode)
        open_file = self.writes.open_file_for(path)
        if open_file is not None:
            return self._attrs(path, open_file.entry())
        try:
            entry = await self._entry(path)
        except Exception as e:
            raise self._fail(e, "getattr", path) from None
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(path, entry)

    async def setattr(
        self, inode: int, attr: pyfuse3.EntryAttributes, fields: Any, fh: int | None, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        try:
            entry = await self._entry(path)
            if entry is None and self.writes.open_file_for(path) is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if fields.update_size and entry is not None and entry.node in ("meta", "stats"):
                raise pyfuse3.FUSEError(errno.EROFS if self.read_only else errno.EACCES)
            if fields.update_size:
                await self._refuse_image(path, "truncate")
            if fields.update_size:
                await self.writes.truncate(path, attr.st_size, self._files.get(fh) if fh else None, self._thread)
                await self._invalidate(path)
            elif (fields.update_mode or fields.update_uid or fields.update_gid) and self.read_only:
                raise pyfuse3.FUSEError(errno.EROFS)
            if fields.update_mtime:
                self.writes.touch(path, attr.st_mtime_ns)
            # chmod/chown are accepted and ignored: cp -p and rsync -a must not fail
        except Exception as e:
            raise self._fail(e, "setattr", path) from None
        return await self.getattr(inode, ctx)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = st.f_frsize = 128 * 1024
        st.f_blocks = st.f_bfree = st.f_bavail = 0
        st.f_files = len(self._inode_of)
        st.f_ffree = st.f_favail = 0
        st.f_namemax = 255
        return st

    # -- directories --------------------------------------------------------
    async def opendir(self, inode: int, ctx: Any) -> int:
        path = self._path(inode)
        try:
            entry = await self._entry(path)
            if entry is None or entry.kind != DIR:
                raise pyfuse3.FUSEError(errno.ENOTDIR if entry else errno.ENOENT)
            if entry.node == "stats":
                entries = [(STATS_FILE, self._stats_entry((STATS_DIR, STATS_FILE)))]
            else:
                view = await self._listed_view(path)
                entries = view.list_dir(path) + self.writes.scratch_in(path)
        except Exception as e:
            raise self._fail(e, "opendir", path) from None
        fh = self._next_fh
        self._next_fh += 1
        self._dirs[fh] = _DirHandle(path, entries)  # a snapshot: paging stays consistent
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        handle = self._dirs[fh]
        for i in range(start_id, len(handle.entries)):
            name, entry = handle.entries[i]
            path = (*handle.path, name)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(path, entry), i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        path = self._path(inode)
        try:
            entry = await self._entry(path)
            wants_write = bool(flags & (os.O_WRONLY | os.O_RDWR))
            if entry is None and self.writes.open_file_for(path) is None and not wants_write:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if entry is not None and entry.kind == DIR:
                raise pyfuse3.FUSEError(errno.EISDIR)
            if entry is not None and entry.node == "image":
                if wants_write:
                    await self._refuse_image(path, "open for writing")
                handle: Any = _ImageHandle(path, entry.reader)
            elif entry is not None and entry.node in ("stats", "meta"):
                if flags & (os.O_WRONLY | os.O_RDWR):
                    raise pyfuse3.FUSEError(errno.EROFS if self.read_only else errno.EACCES)
                content = self._stats_bytes() if entry.node == "stats" else entry.content or b""
                handle = OpenFile.readonly_bytes(path, content)
            else:
                handle = await self.writes.open(path, entry, flags, self._thread)
        except Exception as e:
            raise self._fail(e, "open", path) from None
        fh = self._next_fh
        self._next_fh += 1
        self._files[fh] = handle
        handle.inode = inode
        if handle.state is None and handle.array is not None and handle.coords is not None:
            self._read_ahead(handle.array, handle.coords)
        # Unchanged chunks keep their kernel page cache across opens; writers
        # don't; the live stats file is never cached; a whole-image file keeps
        # it while its version (file object, writes to its chunks) is unchanged.
        live = entry is not None and entry.node == "stats"
        changed = False
        if entry is not None and entry.node == "image":
            changed = self._image_versions.get(path) != entry.reader.version
            self._image_versions[path] = entry.reader.version
        return pyfuse3.FileInfo(fh=fh, keep_cache=not (handle.writable or live or changed), direct_io=live)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = (*self._path(parent_inode), os.fsdecode(name))
        try:
            self._refuse_special(path)
            await self._refuse_image(path, "create")
            handle = await self.writes.create(path, flags, self._thread)
        except Exception as e:
            raise self._fail(e, "create", path) from None
        fh = self._next_fh
        self._next_fh += 1
        self._files[fh] = handle
        attrs = self._attrs(path, handle.entry())
        handle.inode = attrs.st_ino
        return pyfuse3.FileInfo(fh=fh), attrs

    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._files[fh]
        try:
            data = handle.read_cached(off, size)
            if data is None:
                data = await self._thread(handle.read, off, size)
        except Exception as e:
            raise self._fail(e, "read", handle.path) from None
        self.stats.count("bytes_read", len(data))
        return data

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._files[fh]
        try:
            return await self.writes.write(handle, off, buf, self._thread)
        except Exception as e:
            raise self._fail(e, "write", handle.path) from None

    async def flush(self, fh: int) -> None:
        handle = self._files[fh]
        try:
            committed = await self.writes.flush(handle, self._thread)
        except Exception as e:
            raise self._fail(e, "flush", handle.path) from None
        if committed:
            await self._invalidate(handle.path)

    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._files[fh]
        try:
            committed = await self.writes.fsync(handle, self._thread)
        except Exception as e:
            raise self._fail(e, "fsync", handle.path) from None
        if committed:
            await self._invalidate(handle.path)

    async def release(self, fh: int) -> None:
        handle = self._files.pop(fh, None)
        if handle is None:
            return
        outcome = self.writes.release(handle)
        if outcome is Released.COMMITTED:
            await self._invalidate(handle.path)  # now our TIFF of the stored values
        elif outcome is Released.VANISHED:
            # a never-stored file is gone: the kernel must not keep its dentry
            parent = self._inode_of.get(handle.path[:-1])
            if parent is not None:
                try:
                    pyfuse3.invalidate_entry_async(parent, os.fsencode(handle.path[-1]), ignore_enoent=True)
                except OSError:
                    pass

    # -- read-ahead across files --------------------------------------------
    def _read_ahead(self, arr: Any, coords: tuple[int, ...]) -> None:
        """Decode the next chunks in C order in the background while this one is read.

        A reader going through chunk files one by one otherwise waits for each
        decode in turn; with read-ahead, decoding overlaps the transfer.
        """
        if self.nursery is None or arr.layout is None:
            return
        if arr.cache.max_bytes < 4 * arr.layout.data_size:
            return  # no room to keep what is decoded ahead
        if arr.is_cached(coords):
            return  # a re-read, not a cold scan: the kernel's page cache serves it
        for nxt in arr.successors(coords, READ_AHEAD):
            key = (id(arr), nxt)
            if key in self._reading_ahead or arr.is_cached(nxt):
                continue
            self._reading_ahead.add(key)
            self.nursery.start_soon(self._decode_ahead, arr, nxt, key)

    async def _decode_ahead(self, arr: Any, coords: tuple[int, ...], key: Any) -> None:
        try:
            await trio.to_thread.run_sync(arr.pixel_bytes, coords, limiter=self.ahead_limiter)
            self.stats.count("read_ahead")
        except Exception as e:  # the real read reports it, with its errno
            log.debug("read-ahead of %s failed: %s", coords, e)
        finally:
            self._reading_ahead.discard(key)

    # -- namespace changes --------------------------------------------------
    def _refuse_special(self, *paths: tuple[str, ...]) -> None:
        """The stats directory is ours: nothing is created, renamed or removed there."""
        for path in paths:
            if path[:1] == (STATS_DIR,):
                raise pyfuse3.FUSEError(errno.EROFS if self.read_only else errno.EPERM)

    async def _refuse_image(self, path: tuple[str, ...], op: str) -> None:
        """Whole-image files are read-only views: EROFS (-o ro) or EACCES, logged by `_fail`."""
        if path[-1:] and path[-1] in IMAGE_NAMES:
            entry = (await self._listed_view(path, inside_only=True)).entry(path)
            if entry is not None and entry.node == "image":
                code = errno.EROFS if self.read_only else errno.EACCES
                raise NotAllowedError(code, f"{op} refused: {'/'.join(path)} is a read-only "
                                            "whole-image view of the array; write chunk files instead")

    async def _keep_readers(self, path: tuple[str, ...]) -> None:
        """Readers of a chunk about to be unlinked or replaced keep its current bytes."""
        for handle in list(self._files.values()):
            if handle.path == path and handle.state is None and handle.content is None:
                arr, coords = handle.array, handle.coords
                if arr is not None and coords is not None and arr.exists(coords):
                    handle.content = await self._thread(arr.read, coords, 0, arr.file_size(coords))

    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        path = (*self._path(parent_inode), os.fsdecode(name))
        try:
            self._refuse_special(path)
            await self._refuse_image(path, "unlink")
            await self._keep_readers(path)
            await self.writes.unlink(path, self._thread)
        except Exception as e:
            raise self._fail(e, "unlink", path) from None
        self._forget_path(path)

    async def rename(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int, ctx: Any
    ) -> None:
        old = (*self._path(parent_old), os.fsdecode(name_old))
        new = (*self._path(parent_new), os.fsdecode(name_new))
        try:
            self._refuse_special(old, new)
            await self._refuse_image(old, "rename")
            await self._refuse_image(new, "rename onto")
            await self._keep_readers(old)
            await self._keep_readers(new)
            await self.writes.rename(old, new, flags, self._thread)
        except Exception as e:
            raise self._fail(e, "rename", new) from None
        self._moved(old, new)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        path = (*self._path(parent_inode), os.fsdecode(name))
        try:
            self._refuse_special(path)
            entry = await self.writes.mkdir(path)
        except Exception as e:
            raise self._fail(e, "mkdir", path) from None
        return self._attrs(path, entry)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        path = (*self._path(parent_inode), os.fsdecode(name))
        try:
            await self.writes.rmdir(path)
        except Exception as e:
            raise self._fail(e, "rmdir", path) from None

    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS if self.read_only else errno.EPERM)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS if self.read_only else errno.EPERM)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS if self.read_only else errno.EPERM)

    # -- cache invalidation --------------------------------------------------
    async def refresh(self) -> None:
        """Reload metadata; forget listings, shard indexes, decoded chunks and the
        kernel's caches (SIGHUP, metadata_ttl).

        With a `reload` callable the source is opened again and a new view built
        (arrays added, removed or resized are seen). Open files move to the new
        view too: what they read afterwards is the store as it is now, never old
        byte ranges applied to rewritten objects.
        """
        old = self.view
        view = None
        if self.reload is not None:
            try:
                view = await trio.to_thread.run_sync(self.reload)
            except Exception as e:  # keep serving the old view rather than nothing
                log.error("reload failed, keeping the previous view: %s", e)
        if view is None:
            await trio.to_thread.run_sync(old.refresh)
        else:
            old.cache.clear()  # the old view is dropped; the swap happens on the event loop
            self.view = self.writes.view = view
            for handle in self._files.values():
                self._rebind(handle)
            for state in self.writes.states.values():
                self._rebind(state)
        for handle in list(self._files.values()):
            if isinstance(handle, _ImageHandle):
                await self._rebind_image(handle)
        await trio.to_thread.run_sync(self._invalidate_all)

    async def _rebind_image(self, handle: _ImageHandle) -> None:
        """An open whole-image file follows a reload if its bytes layout is unchanged;
        otherwise its reads fail (EIO, logged): the reader must reopen it."""
        entry = self.view.entry(handle.path)
        new = entry.reader if entry is not None and entry.node == "image" else None
        try:
            same = new is not None and await self._thread(handle.reader.same_layout, new)
        except Exception as e:
            log.warning("reload: %s: %s", "/".join(handle.path), e)
            same = False
        if same:
            handle.reader = new
        else:
            handle.reader.invalidate(f"{'/'.join(handle.path)} changed on reload (the store "
                                     "changed): reopen the file")

    def _rebind(self, holder: Any) -> None:
        """Point an open file (or write state) at its array in the current view."""
        if getattr(holder, "array", None) is None or getattr(holder, "content", None) is not None:
            return
        arr, rest = self.view.array_at(holder.path)
        coords = arr.coords_of(rest) if arr is not None and arr.layout is not None and rest else None
        if arr is not None and coords is not None and holder.coords is not None:
            holder.array, holder.coords = arr, coords

    def _invalidate_all(self) -> None:
        for inode in list(self._path_of):
            if inode != pyfuse3.ROOT_INODE:
                try:
                    pyfuse3.invalidate_inode(inode)
                except OSError:
                    pass

    def _forget_path(self, path: tuple[str, ...]) -> None:
        """Drop the inode of a path that changed identity (unlinked/renamed)."""
        inode = self._inode_of.pop(path, None)
        if inode is not None:
            self._path_of.pop(inode, None)
            self._spawn_invalidate(inode)

    def _moved(self, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """After rename the kernel's inode of `old` lives at `new`; the one at `new` is gone."""
        replaced = self._inode_of.pop(new, None)
        if replaced is not None:
            self._path_of.pop(replaced, None)
            self._spawn_invalidate(replaced)
        inode = self._inode_of.pop(old, None)
        if inode is not None:
            self._inode_of[new] = inode
            self._path_of[inode] = new
            self._spawn_invalidate(inode)

    async def _invalidate(self, path: tuple[str, ...]) -> None:
        inode = self._inode_of.get(path)
        if inode is not None:
            self._spawn_invalidate(inode)

    def _spawn_invalidate(self, inode: int) -> None:
        # invalidate_inode may block on the kernel: never from the event loop itself.
        def invalidate() -> None:
            try:
                pyfuse3.invalidate_inode(inode)
            except OSError:
                pass

        if self.nursery is not None:
            self.nursery.start_soon(trio.to_thread.run_sync, invalidate)
