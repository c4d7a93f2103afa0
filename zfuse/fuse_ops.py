"""The FUSE adapter: each pyfuse3 request becomes one call into `zfuse.fs`.

This module only translates: it decodes arguments (bytes names, request
contexts, setattr fields), calls the `FileSystem`, and turns its result into a
pyfuse3 reply or its `FsError` into a `FUSEError`. Every policy lives in
`zfuse.fs`. Besides the daemon's start-up (`pyfuse3.init`/`main`), this is the
only module that imports pyfuse3.

Blocking work runs in worker threads (`trio.to_thread`, bounded by one
CapacityLimiter), so the event loop never blocks; answers already in memory
are served without a thread hop.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pyfuse3
import trio

from zfuse.fs import Attributes, FileSystem, FsError, OpenReply
from zfuse.stats import Stats
from zfuse.view.tree import View
from zfuse.workers import WorkerThreads

log = logging.getLogger("zfuse.fuse")
T = TypeVar("T")

READ_AHEAD_THREADS = 4  # chunks decoded or advised ahead of a reader (FileSystem.spawn_read_ahead)
# other background jobs (FileSystem.spawn: remote directories listed ahead, whole-image
# tiles pushed into the page cache): trio threads, so the unmount waits for them
BACKGROUND_THREADS = 4
LISTING_THREADS = 1  # listing local directories ahead of a recursive walker (FileSystem.spawn_listing)


class _Kernel:
    """Cache invalidations, in worker threads: they may block on the kernel, which may
    be waiting for this very event loop. The inodes waiting are a set, drained by at
    most INVALIDATORS threads: a reload invalidates every inode the kernel knows, and a
    task each (62,000 per reload, reloads in a loop) took the daemon to 2.6 GB and ended
    it; an inode asked for again while it waits is invalidated once."""

    INVALIDATORS = 4

    def __init__(self, ops: ZfuseOperations) -> None:
        self.ops = ops
        self._waiting: set[int] = set()
        self._draining = 0
        self._lock = threading.Lock()

    def invalidate_inode(self, ino: int) -> None:
        with self._lock:
            self._waiting.add(ino)
            if self._draining >= min(self.INVALIDATORS, len(self._waiting)):
                return
            self._draining += 1
        if not self.ops.spawn_thread(self._drain):  # (no nursery: starting up, shutting down)
            with self._lock:
                self._draining -= 1

    def _drain(self) -> None:
        counted = True
        try:
            while True:
                with self._lock:
                    if not self._waiting:
                        # (under the lock that saw it empty: an inode added after finds
                        # this drainer gone, and starts one)
                        self._draining -= 1
                        counted = False
                        return
                    ino = self._waiting.pop()
                self.invalidate_inode_here(ino)
        finally:
            if counted:  # (ended by an exception)
                with self._lock:
                    self._draining -= 1

    def invalidate_inode_here(self, ino: int) -> None:
        try:
            pyfuse3.invalidate_inode(ino)
        except OSError:
            pass

    def store(self, ino: int, offset: int, data: bytes) -> None:
        """Bytes into the file's page cache (called from a worker thread)."""
        try:
            pyfuse3.notify_store(ino, offset, data)
        except OSError:
            pass  # the kernel forgot the inode, or has no notify_store: reads ask us

    def invalidate_entry(self, parent_ino: int, name: str) -> None:
        try:
            pyfuse3.invalidate_entry_async(parent_ino, os.fsencode(name), ignore_enoent=True)
        except OSError:
            pass


def _entry_attributes(attrs: Attributes) -> pyfuse3.EntryAttributes:
    return _fill_attributes(pyfuse3.EntryAttributes(), attrs)


def _fill_attributes(out: pyfuse3.EntryAttributes, attrs: Attributes) -> pyfuse3.EntryAttributes:
    out.st_ino = attrs.ino
    out.st_mode = attrs.mode
    out.st_nlink = 2 if attrs.is_dir else 1
    out.st_size = attrs.size
    out.st_uid = attrs.uid
    out.st_gid = attrs.gid
    out.st_atime_ns = out.st_mtime_ns = out.st_ctime_ns = attrs.mtime_ns
    out.st_blksize = attrs.blksize
    out.st_blocks = (attrs.size + 511) >> 9
    out.attr_timeout = out.entry_timeout = attrs.timeout
    return out


# pyfuse3 3.5 does not pass libfuse's `noflush` open flag on; a pyfuse3 with
# docs/pyfuse3-noflush.patch applied does (measured in benchmarks/README.md)
HAS_NOFLUSH = hasattr(pyfuse3.FileInfo(), "noflush")


def _file_info(reply: OpenReply) -> pyfuse3.FileInfo:
    info = pyfuse3.FileInfo(fh=reply.fh, keep_cache=reply.keep_cache, direct_io=reply.direct_io)
    if reply.noflush and HAS_NOFLUSH:
        info.noflush = True
    return info


def _unexpected(ops: ZfuseOperations, name: str, args: Sequence[Any], exc: Exception) -> pyfuse3.FUSEError:
    """The reply to an exception that is not an FsError (a bug, or a value the reply
    cannot carry), logged with what the request was about.

    pyfuse3 takes the whole mount down on any exception but FUSEError ("Exceptions
    from Trio nursery", no traceback), so no request may let one escape: one
    array's bad value must cost that request only. A number the reply cannot hold
    (an `st_size` past 2**63 - 1) is EOVERFLOW, as stat(2) says; memory exhausted ENOMEM;
    the rest EIO."""
    code = errno.EOVERFLOW if isinstance(exc, OverflowError) else errno.ENOMEM if isinstance(
        exc, MemoryError) else errno.EIO
    log.error("%s(%s) on %s: unexpected error, answered %s", name, _shown(args), _about(ops, name, args),
              errno.errorcode[code], exc_info=exc)
    return pyfuse3.FUSEError(code)


def _shown(args: Sequence[Any]) -> str:
    return ", ".join(
        repr(os.fsdecode(a)) if isinstance(a, bytes) and len(a) < 256 else
        f"<{len(a)} bytes>" if isinstance(a, (bytes, bytearray)) else repr(a)
        for a in args if isinstance(a, (int, bytes, bytearray, str)))


def _about(ops: ZfuseOperations, name: str, args: Sequence[Any]) -> str:
    """The path a failed request was about, for its log line (best effort: never raises)."""
    try:
        fs = ops.fs
        if name in ("read", "write", "flush", "fsync", "release") and args:
            handle = fs.handles.get(args[0])
            path = handle.path if handle is not None else None
        elif name in ("readdir", "releasedir") and args:
            handle = fs._dirs.get(args[0])
            path = handle.path if handle is not None else None
        elif args and isinstance(args[0], int) and name != "statfs":
            path = fs.inodes.path_of(args[0])
            if path is not None and len(args) > 1 and isinstance(args[1], bytes):
                path = (*path, os.fsdecode(args[1]))
        else:
            path = None
    except Exception:
        path = None
    return "/" + "/".join(path) if path is not None else "an unknown path"


def _fuse_errors(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """FsError -> FUSEError; anything else (a bug) -> EIO (EOVERFLOW for a number the
    reply cannot hold), logged with the path. pyfuse3 takes the mount down on any
    exception but FUSEError."""

    @functools.wraps(fn)
    async def call(self: ZfuseOperations, *args: Any) -> T:
        try:
            return await fn(self, *args)
        except FsError as e:
            raise pyfuse3.FUSEError(e.errno) from None
        except pyfuse3.FUSEError:
            raise
        except Exception as e:
            try:
                error = _unexpected(self, fn.__name__, args, e)
            except Exception:  # (logging it failed too, memory exhausted: still answered)
                error = pyfuse3.FUSEError(errno.ENOMEM if isinstance(e, MemoryError) else errno.EIO)
            raise error from e

    return call


class ZfuseOperations(pyfuse3.Operations):
    """pyfuse3 operations over a `FileSystem`."""

    # Off: with it the kernel trusts its own size of a regular file over the daemon's
    # for as long as it keeps the inode (fuse_get_cache_mask), and a committed chunk
    # reads as zfuse's TIFF, whose size is not the written file's: the view would be
    # cut short. (It would merge a copy's 64 KiB writes into fewer requests.)
    enable_writeback_cache = False
    supports_dot_lookup = True

    def __init__(
        self,
        view: View,
        *,
        read_only: bool = False,
        max_threads: int = 8,
        stats: Stats | None = None,
        replace_window: float | None = None,
        pending_timeout: float | None = None,
        durable: bool = True,
        reload: Callable[[], View] | None = None,
        mount_info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        # file reads in threads of their own, and as many for the rest (lookups, listings,
        # opens, writes): eight reads waiting on a slow store held every thread, and `ls`
        # of another directory waited 11 s
        self.limiter = trio.CapacityLimiter(max_threads)
        self.read_limiter = trio.CapacityLimiter(max_threads)  # (FileSystem.run_read)
        self.background_limiter = trio.CapacityLimiter(BACKGROUND_THREADS)
        self.nursery: trio.Nursery | None = None
        timing = {k: v for k, v in (("replace_window", replace_window),
                                    ("pending_timeout", pending_timeout)) if v is not None}
        self.fs = FileSystem(
            view, read_only=read_only, stats=stats, run=self._thread, run_read=self._read_thread, kernel=_Kernel(self),
            spawn=self._spawn_background, spawn_listing=WorkerThreads(LISTING_THREADS, "list-ahead").submit,
            spawn_read_ahead=WorkerThreads(READ_AHEAD_THREADS, "read-ahead").submit,
            durable=durable, reload=reload, mount_info=mount_info, **timing,
        )

    @property
    def view(self) -> View:
        return self.fs.view

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def _read_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.read_limiter)

    def spawn_thread(self, fn: Callable[[], None]) -> bool:
        """Run `fn` in a worker thread, in the background; False if nothing was started."""
        if self.nursery is None:
            return False
        self.nursery.start_soon(trio.to_thread.run_sync, fn)
        return True

    def _spawn_background(self, fn: Callable[[Any], None], arg: Any) -> None:
        if self.nursery is not None:
            self.nursery.start_soon(
                functools.partial(trio.to_thread.run_sync, fn, arg, limiter=self.background_limiter)
            )

    # -- lookup and attributes ---------------------------------------------
    @_fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return _entry_attributes(await self.fs.lookup(parent_inode, os.fsdecode(name), _pid(ctx)))

    @_fuse_errors
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return _entry_attributes(await self.fs.getattr(inode, _pid(ctx)))

    @_fuse_errors
    async def setattr(
        self, inode: int, attr: pyfuse3.EntryAttributes, fields: Any, fh: int | None, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        attrs = await self.fs.setattr(
            inode,
            attr.st_size if fields.update_size else None,
            attr.st_mtime_ns if fields.update_mtime else None,
            bool(fields.update_mode or fields.update_uid or fields.update_gid),
            fh,
            _pid(ctx),
        )
        return _entry_attributes(attrs)

    def forget(self, inode_list: list[tuple[int, int]]) -> None:
        self.fs.forget(inode_list)

    @_fuse_errors
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        info = self.fs.statfs()
        st = pyfuse3.StatvfsData()
        st.f_bsize = st.f_frsize = info["bsize"]
        st.f_blocks = st.f_bfree = st.f_bavail = 0
        st.f_files = info["files"]
        st.f_ffree = st.f_favail = 0
        st.f_namemax = info["namemax"]
        return st

    # -- directories --------------------------------------------------------
    @_fuse_errors
    async def opendir(self, inode: int, ctx: Any) -> int:
        return await self.fs.opendir(inode)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # readdir_reply copies the attributes into the reply buffer, so one
        # EntryAttributes serves every entry: refilled only when the entry's attributes
        # are not the ones filled last (entries of one kind and size share them)
        reply, out = pyfuse3.readdir_reply, pyfuse3.EntryAttributes()
        filled: list[Attributes | None] = [None]

        def accept(name: str, ino: int, attrs: Attributes, next_id: int) -> bool:
            if attrs is not filled[0]:
                _fill_attributes(out, attrs)
                filled[0] = attrs
            out.st_ino = ino
            return reply(token, name.encode("utf-8", "surrogateescape"), out, next_id)

        def accept_run(names: Sequence[bytes], inos: Sequence[int], attrs: Attributes, offset: int) -> int:
            # the hot loop of `ls -lR` (a chunk directory listed ahead): per entry only
            # its inode number and the reply
            _fill_attributes(out, attrs)
            filled[0] = attrs
            for taken, (name, ino) in enumerate(zip(names, inos, strict=True)):
                out.st_ino = ino
                offset += 1
                if not reply(token, name, out, offset):
                    return taken
            return len(names)

        try:
            await self.fs.readdir(fh, start_id, accept, accept_run)
        except FsError as e:
            raise pyfuse3.FUSEError(e.errno) from None
        except Exception as e:  # e.g. an entry's attributes the reply cannot hold
            raise _unexpected(self, "readdir", (fh, start_id), e) from e

    @_fuse_errors
    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    # -- files -----------------------------------------------------------------
    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return _file_info(await self.fs.open(inode, flags, _pid(ctx)))

    @_fuse_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        reply, attrs = await self.fs.create(parent_inode, os.fsdecode(name), flags, _pid(ctx))
        return _file_info(reply), _entry_attributes(attrs)

    @_fuse_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await self.fs.read(fh, off, size)

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @_fuse_errors
    async def flush(self, fh: int) -> None:
        await self.fs.flush(fh)

    @_fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh)

    @_fuse_errors
    async def release(self, fh: int) -> None:
        self.fs.release(fh)

    # -- namespace changes --------------------------------------------------
    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.unlink(parent_inode, os.fsdecode(name))

    @_fuse_errors
    async def rename(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int, ctx: Any
    ) -> None:
        await self.fs.rename(parent_old, os.fsdecode(name_old), parent_new, os.fsdecode(name_new), flags)

    @_fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return _entry_attributes(await self.fs.mkdir(parent_inode, os.fsdecode(name)))

    @_fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.rmdir(parent_inode, os.fsdecode(name))

    @_fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        raise self.fs.refuse_link()

    @_fuse_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise self.fs.refuse_link()

    @_fuse_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        raise self.fs.refuse_link()


def _pid(ctx: Any) -> int | None:
    return getattr(ctx, "pid", None)


def log_operations(ops: ZfuseOperations) -> None:
    """-v: log every FUSE operation of `ops` (name, arguments, outcome) at DEBUG level.
    The one object's methods are wrapped (pyfuse3 calls them through it); the class
    and every other instance stay as they are."""
    import inspect

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def logged(*args: Any) -> Any:
            shown = ", ".join(
                repr(os.fsdecode(a)) if isinstance(a, bytes) and len(a) < 256 else
                f"<{len(a)} bytes>" if isinstance(a, (bytes, bytearray)) else repr(a)
                for a in args
                if not isinstance(a, (pyfuse3.RequestContext, pyfuse3.ReaddirToken))
            )
            try:
                result = await fn(*args)
            except pyfuse3.FUSEError as e:
                log.debug("%s(%s) -> %s", name, shown, errno.errorcode.get(e.errno, e.errno))
                raise
            log.debug("%s(%s) -> ok", name, shown)
            return result

        return logged

    for name, fn in list(vars(ZfuseOperations).items()):
        if inspect.iscoroutinefunction(fn) and not name.startswith("_"):
            setattr(ops, name, wrap(name, getattr(ops, name)))
