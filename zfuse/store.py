"""Opening the store a mount reads, and the wrapper that measures and bounds it.

`open_store(source)` turns a path or URL into a zarr Store (local directories
get `AtomicLocalStore`, whose writes are atomic: temporary file, fsync,
swapped into place). `MeteredStore` wraps any store: it counts requests and bytes into
`Stats` (the mount's `.zfuse/stats`) and bounds every request by a timeout
so a hung server gives an error, never a hung `ls`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import re
import shutil
import stat
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, NoReturn

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from zfuse import defaults
from zfuse.errors import OutsideStoreError, StoreTimeoutError
from zfuse.stats import Stats
from zfuse.workers import WorkerThreads

log = logging.getLogger(__name__)

METADATA_NAMES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")


def _kind(key: str) -> str:
    return "metadata" if key.rsplit("/", 1)[-1] in METADATA_NAMES or key.endswith(".json") else "chunk"


# -- the store's directory: nothing outside it is read, listed or written -------------
#
# zfuse often runs as root with `-o allow_other`: a key must never reach a file outside
# the store (a chunk that is a symbolic link to /etc/shadow, a `suffix` of "/../.."),
# or any user of the mount reads what only root may. So every access of a local store
# validates the key (`check_key`) and opens its file relative to the store's root
# directory with openat2(RESOLVE_BENEATH): the kernel resolves the whole path, symbolic
# links included, in one step and refuses any step that leaves the root. There is no
# check-then-open window for a link swapped in between. Relative links that stay
# inside the store are followed. Without openat2 (Linux before 5.6, or a seccomp
# filter that hides it) paths are walked one directory at a time with O_NOFOLLOW:
# then no symbolic link is followed at all.


def check_key(key: str) -> None:
    """Refuse a key with a component that is empty, `.` or `..`, a leading `/`, or a NUL
    or backslash anywhere (OutsideStoreError): no key zarr writes has one, and each
    would name another file than the key says (`..` leaves the store)."""
    k = f"/{key}/"
    if "//" in k or "/./" in k or "/../" in k or "\x00" in key or "\\" in key:
        raise OutsideStoreError(f"store key {key!r}: a component that is empty, '.', '..' or absolute, "
                                "or a NUL or backslash, could leave the store: refused")


def _outside(key: str) -> OutsideStoreError:
    return OutsideStoreError(f"{key}: resolves outside the store (a symbolic link leading out of "
                             "it, or a loop of links): not followed")


def _load_openat2() -> Any:
    """The openat2 system call through ctypes (Python has no os.openat2), or None where
    the kernel does not have it."""
    if _LIBC is None:
        return None
    import ctypes

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    syscall = _LIBC.syscall
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    hows: dict[int, Any] = {}

    def openat2(dir_fd: int, path: bytes, flags: int) -> int:
        how = hows.get(flags)
        if how is None:  # one constant struct per flag set (the kernel only reads it)
            how = hows[flags] = OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        return syscall(_SYS_OPENAT2, dir_fd, path, ctypes.byref(how), ctypes.sizeof(how))

    probe = openat2(_AT_FDCWD, b".", os.O_PATH | os.O_CLOEXEC)
    if probe < 0:
        return None  # ENOSYS (old kernel) or EPERM (a seccomp filter): walk instead
    os.close(probe)
    return openat2


_SYS_OPENAT2 = 437  # the same on every architecture (system calls numbered after 5.1)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08


def open_beneath(root_fd: int, key: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of `key` (checked by `check_key`; "" is the root itself) opened
    relative to the directory `root_fd` without ever leaving it: a path that would
    (a symbolic link out of the store) raises OutsideStoreError; other failures the
    OSError an open gives (FileNotFoundError, ...). O_CLOEXEC is added."""
    path = os.fsencode(key) if key else b"."
    flags |= os.O_CLOEXEC
    if _openat2 is None:
        return _open_walking(root_fd, key, flags)
    for _ in range(64):
        fd = _openat2(root_fd, path, flags)
        if fd >= 0:
            return fd
        err = _get_errno()
        if err in (errno.EAGAIN, errno.EINTR):
            continue  # a rename or mount raced the lookup (RESOLVE_BENEATH): look up again
        if err in (errno.EXDEV, errno.ELOOP):
            raise _outside(key)
        raise OSError(err, os.strerror(err), key)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), key)


def _open_walking(root_fd: int, key: str, flags: int) -> int:
    """`open_beneath` without openat2: each directory of the path opened inside the one
    before, no symbolic link followed (any link is refused, also one staying inside)."""
    parts = key.split("/") if key else ["."]
    at = root_fd
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
            except NotADirectoryError:  # (O_PATH|O_NOFOLLOW opens a link itself: not a directory)
                if stat.S_ISLNK(os.stat(part, dir_fd=at, follow_symlinks=False).st_mode):
                    raise _outside(key) from None
                raise
            if at != root_fd:
                os.close(at)
            at = nxt
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=at)
        except OSError as e:
            if e.errno == errno.ELOOP or (flags & os.O_DIRECTORY and e.errno == errno.ENOTDIR
                                          and stat.S_ISLNK(os.stat(parts[-1], dir_fd=at, follow_symlinks=False).st_mode)):
                raise _outside(key) from None
            raise
        if flags & os.O_PATH and not flags & os.O_NOFOLLOW and stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)  # (O_PATH|O_NOFOLLOW opened the link itself: a caller that asked to follow it)
            raise _outside(key)
        return fd
    finally:
        if at != root_fd:
            os.close(at)


def _read_fd(fd: int, size: int) -> bytes:
    """The whole file behind `fd`, `size` bytes as fstat said (one read in the usual
    case: a short read of a regular file is its end; one that grew is read on)."""
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data
    parts = [data]
    while True:
        more = os.read(fd, 1 << 20)
        if not more:
            return b"".join(parts)
        parts.append(more)


# zfuse's temporary files (`_atomic_write`): ".NAME.XXXXXXXX.tmp", XXXXXXXX from
# TEMP_CHARS, as tempfile.mkstemp names them (which zfuse used before).
TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp", re.DOTALL)
# A leftover is removed only if older than the daemon by this much: a temporary file
# of another process writing the same store right now (its mtime follows its writes)
# is never taken for one.
LEFTOVER_AGE = 60.0
PROCESS_STARTED = time.time()


class AtomicLocalStore(LocalStore):
    """LocalStore whose whole-object writes are atomic: a crash leaves old or new, never torn.

    `durable` (the default): each object's data is on disk (fdatasync) before it
    replaces the old one, so a write that returned survives a power cut too.
    Without it, a write that returned survives the writing process (the object
    is in the filesystem), which is what zarr-python's own LocalStore promises;
    `os.sync()` then makes everything written so far durable.

    Every key is opened inside the store's directory and nowhere else (`open_beneath`):
    a key with a `..` or empty component, or a symbolic link leading out of the
    store, raises OutsideStoreError (EIO on the mount, naming the key). A link that
    leads out from a directory is never listed through.

    Listing walks directories with `os.scandir` (no stat per key): zarr's own
    `LocalStore.list_prefix` stats every entry, which dominates listing an
    array of 100,000 chunks. Listings leave out zfuse's temporary files, and remove
    those a crashed daemon left (`sweep_leftovers`).
    """

    def __init__(self, root: Any, *, read_only: bool = False, durable: bool = True) -> None:
        super().__init__(root, read_only=read_only)
        self.durable = durable
        self._init_root()
        self.on_leftover: Any = None  # called with each leftover removed (key): counts it

    def _init_root(self) -> None:
        self._root_fd: int | None = None
        self._root_lock = threading.Lock()
        # the descriptors this store opened, closed when it goes (`clear` opens anew)
        self._root_fds: list[int] = []
        weakref.finalize(self, _close_all, self._root_fds)

    def with_read_only(self, read_only: bool = False) -> AtomicLocalStore:
        return type(self)(self.root, read_only=read_only, durable=self.durable)

    def __getstate__(self) -> dict[str, Any]:
        # a copy opens the directory again (a descriptor and a lock do not travel)
        state = dict(self.__dict__)
        for name in ("_root_fd", "_root_lock", "_root_fds", "on_leftover"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_root()
        self.on_leftover = None

    async def clear(self) -> None:
        await super().clear()
        with self._root_lock:  # the directory was made anew: open it anew
            _close_all(self._root_fds)
            self._root_fd = None

    @classmethod
    async def open(cls, root: Any, *, read_only: bool = False, mode: Any = None,
                   durable: bool = True) -> AtomicLocalStore:  # type: ignore[override]
        store = await super().open(root, read_only=read_only, mode=mode)
        store.durable = durable
        return store

    # -- the root directory and keys inside it --------------------------------------
    def root_fd(self) -> int:
        """A descriptor of the store's directory (O_PATH; opened once, closed with the
        store): every key is opened relative to it."""
        fd = self._root_fd
        if fd is None:
            with self._root_lock:
                fd = self._root_fd
                if fd is None:
                    if not self.read_only:
                        os.makedirs(self.root, exist_ok=True)  # (zarr's LocalStore makes it on open)
                    fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    self._root_fds.append(fd)
                    self._root_fd = fd
        return fd

    def open_key(self, key: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of `key`'s file, inside the store only (see the class docstring)."""
        check_key(key)
        return open_beneath(self.root_fd(), key, flags)

    def read_key(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes | None:
        """A stored object's bytes (or [start, end) of them); None if absent or a directory
        (what zarr's LocalStore answers). Not a regular file (a FIFO would block the
        reader forever, a device is not the store's): OutsideStoreError."""
        try:
            fd = self.open_key(key, os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISDIR(st.st_mode):
                    return None
                raise OutsideStoreError(f"{key}: not a regular file (a FIFO, socket or device): not read")
            if byte_range is None:
                return _read_fd(fd, st.st_size)
            start, end = byte_range
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)

    def stat_key(self, key: str) -> os.stat_result | None:
        """`key`'s stat (links inside the store followed); None if absent."""
        try:
            fd = self.open_key(key, os.O_PATH)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def is_file_key(self, key: str) -> bool:
        """Whether `key` is an object of the store. A name in the store that is a link
        leading out of it counts (its read then fails, naming it); a key under a
        directory that leads out does not (that directory is not the store's)."""
        try:
            st = self.stat_key(key)
        except OutsideStoreError:
            head = key.rpartition("/")[0]
            try:
                self.stat_key(head)
            except OutsideStoreError:
                return False
            return True
        return st is not None and stat.S_ISREG(st.st_mode)

    def _read_request(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        if byte_range is None:
            return self.read_key(key)
        if isinstance(byte_range, RangeByteRequest):
            return self.read_key(key, (byte_range.start, byte_range.end))
        st = self.stat_key(key)
        if st is None or not stat.S_ISREG(st.st_mode):
            return self.read_key(key)  # None, or the refusal
        if isinstance(byte_range, OffsetByteRequest):
            return self.read_key(key, (byte_range.offset, max(byte_range.offset, st.st_size)))
        if isinstance(byte_range, SuffixByteRequest):
            return self.read_key(key, (max(0, st.st_size - byte_range.suffix), st.st_size))
        raise TypeError(f"Unexpected byte_range, got {byte_range}.")

    # -- zarr's Store interface, inside the store only -----------------------------
    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if prototype is None:
            from zarr.core.buffer import default_buffer_prototype

            prototype = default_buffer_prototype()
        await self._ensure_open()
        data = await asyncio.to_thread(self._read_metadata_or_data, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    def _read_metadata_or_data(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        """`_read_request`; a metadata document that leads out of the store is absent
        (logged): its node is not the store's, and it must not take the hierarchy's
        other nodes down with it. A chunk that does fails its read (EIO, naming it)."""
        try:
            return self._read_request(key, byte_range)
        except OutsideStoreError as e:
            if _kind(key) != "metadata":
                raise
            log.warning("not shown: %s", e)
            return None

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        if prototype is None:
            from zarr.core.buffer import default_buffer_prototype

            prototype = default_buffer_prototype()
        data = self._read_metadata_or_data(key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(self.is_file_key, key)

    async def getsize(self, key: str) -> int:
        st = await asyncio.to_thread(self.stat_key, key)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), key)
        return st.st_size

    async def set(self, key: str, value: Buffer) -> None:
        await self._ensure_open()
        self._check_writable()
        await asyncio.to_thread(self._write, key, value.as_buffer_like(), False)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        await self._ensure_open()
        self._check_writable()
        try:
            await asyncio.to_thread(self._write, key, value.as_buffer_like(), True)
        except FileExistsError:
            pass

    def set_sync(self, key: str, value: Buffer | list[Any]) -> None:
        """`set`, in the calling thread (zfuse's worker threads write chunks this way);
        `value` may be a list of bytes-like parts, stored one after another."""
        self._check_writable()
        data = value if isinstance(value, list) else value.as_buffer_like()
        self._write(key, data, False)

    def _write(self, key: str, data: Any, exclusive: bool) -> None:
        dir_fd, name = self._parent(key, create=True)
        try:
            _atomic_write(dir_fd, name, data, self.durable, exclusive=exclusive, label=key)
        finally:
            if dir_fd != self._root_fd:
                os.close(dir_fd)

    def _parent(self, key: str, create: bool) -> tuple[int, str]:
        """A descriptor of `key`'s directory inside the store (the root's own, not to be
        closed, for a key at the top) and its last component; with `create`, missing
        directories are made, each inside the one before (never through a link)."""
        check_key(key)
        root = self.root_fd()
        head, _, name = key.rpartition("/")
        if not head:
            return root, name
        try:
            return open_beneath(root, head, os.O_PATH | os.O_DIRECTORY), name
        except FileNotFoundError:
            if not create:
                raise
        at = root
        try:
            for part in head.split("/"):
                try:
                    os.mkdir(part, dir_fd=at)
                except FileExistsError:
                    pass
                nxt = open_beneath(at, part, os.O_PATH | os.O_DIRECTORY)
                if at != root:
                    os.close(at)
                at = nxt
        except BaseException:
            if at != root:
                os.close(at)
            raise
        return at, name

    async def delete(self, key: str) -> None:
        self._check_writable()
        await asyncio.to_thread(self._delete, key, False)

    def delete_sync(self, key: str) -> None:
        self._check_writable()
        self._delete(key, False)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        await asyncio.to_thread(self._delete, prefix.rstrip("/"), True)

    def _delete(self, key: str, directory_only: bool) -> None:
        """Remove `key` (a directory: all of it, as zarr's LocalStore does), inside the
        store only: the last component is unlinked, never followed."""
        if not key:
            return  # (the root itself is not deleted)
        try:
            dir_fd, name = self._parent(key, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: never follows a link
            elif directory_only:
                raise ValueError(f"delete_dir was passed a prefix={key!r} that is a file")
            else:
                os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        finally:
            if dir_fd != self._root_fd:
                os.close(dir_fd)

    async def list(self) -> AsyncIterator[str]:  # type: ignore[override]
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        await self._ensure_open()
        for key in await asyncio.to_thread(self._walk_keys, prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        """Names in one directory, read with `os.scandir` in batches off the event loop:
        zarr's own walks the directory on its event loop, and reads it whole first."""
        await self._ensure_open()
        fd = await asyncio.to_thread(self.open_dir, prefix)
        if fd is None:
            return
        try:
            entries = await asyncio.to_thread(os.scandir, fd)
            try:
                while True:
                    names = await asyncio.to_thread(_next_names, entries, LIST_DIR_BATCH)
                    names = self.sweep_leftovers(fd, prefix, names)
                    for name in names:
                        yield name
                    if len(names) < LIST_DIR_BATCH:
                        return
            finally:
                entries.close()
        finally:
            os.close(fd)

    def open_dir(self, prefix: str) -> int | None:
        """A descriptor of the directory `prefix` (a key prefix, "" or ending in "/")
        to list, or None: absent, not a directory, or leading out of the store (logged:
        the directory is shown empty)."""
        key = prefix.rstrip("/")
        try:
            if key:
                check_key(key)
            return open_beneath(self.root_fd(), key, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OutsideStoreError as e:
            log.warning("not listed: %s", e)
            return None

    def _walk_keys(self, prefix: str) -> list[str]:
        """Every file key that starts with `prefix` (scandir; no stat per entry but for
        links, which are listed through only when they stay inside the store)."""
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        keys: list[str] = []
        stack = [base]
        while stack:
            rel = stack.pop()
            fd = self.open_dir(rel)
            if fd is None:
                continue
            try:
                with os.scandir(fd) as entries:
                    found = [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in entries]
            finally:
                os.close(fd)
            swept = set(self.sweep_leftovers(None, rel + "/" if rel else "", [n for n, _, _ in found]))
            for name, is_dir, is_link in found:
                if name not in swept:
                    continue
                key = f"{rel}/{name}" if rel else name
                if is_link:  # where it leads, looked up inside the store only
                    try:
                        st = self.stat_key(key)
                    except OutsideStoreError:
                        st = None
                        log.warning("not listed: %s", _outside(key))
                    if st is None:
                        continue
                    is_dir = stat.S_ISDIR(st.st_mode)
                if is_dir:
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append(key)
                elif key.startswith(prefix):
                    keys.append(key)
        return keys

    # -- leftovers of a crashed daemon -----------------------------------------------
    def sweep_leftovers(self, dir_fd: int | None, prefix: str, names: list[str]) -> list[str]:
        """`names` of the directory `prefix` without zfuse's temporary files, and those
        a crashed writer left (named exactly as `_atomic_write` names them, regular
        files, last written LEFTOVER_AGE before this process started) removed, each
        logged. Cheap when there are none: one pass in C finds whether any name
        starts with a dot."""
        if not names or min(names)[:1] > ".":
            return names
        temps = [n for n in names if n[:1] == "." and TEMP_NAME.fullmatch(n)]
        if not temps:
            return names
        for name in temps:
            self._remove_leftover(dir_fd, prefix + name)
        drop = set(temps)
        return [n for n in names if n not in drop]

    def _remove_leftover(self, dir_fd: int | None, key: str) -> None:
        if self.read_only:
            log.warning("%s: a temporary file left by an interrupted write (a read-only mount "
                        "does not remove it): not shown", key)
            return
        own = dir_fd is None
        try:
            if own:
                dir_fd, name = self._parent(key, create=False)
            else:
                name = key.rpartition("/")[2]
            assert dir_fd is not None
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime > PROCESS_STARTED - LEFTOVER_AGE:
                return  # not a file zfuse wrote, or maybe another writer's, now: left alone
            os.unlink(name, dir_fd=dir_fd)
        except (OSError, OutsideStoreError) as e:
            log.warning("%s: a temporary file left by an interrupted write, not removed: %s", key, e)
            return
        finally:
            if own and dir_fd is not None and dir_fd != self._root_fd:
                os.close(dir_fd)
        log.warning("%s: removed a temporary file left by an interrupted write "
                    "(a daemon that stopped while storing a chunk)", key)
        if self.on_leftover is not None:
            self.on_leftover(key)


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


LIST_DIR_BATCH = 1000
SMALL_DIR_BYTES = 256 * 1024  # a directory's st_size: roughly its names' bytes (ext4: ~5,000 names)


def _next_names(entries: Any, count: int) -> list[str]:
    names = []
    for entry in entries:
        names.append(entry.name)
        if len(names) == count:
            break
    return names


def _atomic_write(dir_fd: int, name: str, data: Any, durable: bool = True, *, exclusive: bool = False,
                  label: str = "") -> None:
    """Write `data` (a bytes-like object, or a list of them written one after another) to
    `name` in the directory `dir_fd` through a temporary file in the same directory that
    then takes its place; `durable`: fdatasync before that; `exclusive`: not over an
    existing object (FileExistsError).

    The new file swaps names with the old one (`renameat2(RENAME_EXCHANGE)`), and the
    old one is unlinked at once but freed in a background thread. A plain rename
    over the old file frees the old blocks in the writer's call, and on ext4 that
    took half of a 512 KiB chunk's write. Where the swap is not supported (or there
    is no old file) it is an ordinary rename. Every name is relative to `dir_fd`: the
    directory was found inside the store once, and no later step looks it up again.
    """
    fd, tmp = _create_temp(dir_fd, name)
    try:
        try:
            for part in data if isinstance(data, list) else [data]:
                view = memoryview(part).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            if durable:
                os.fdatasync(fd)  # data (and its size) on disk before the rename
            else:
                # What ext4 does at a rename over an existing file (auto_da_alloc), and
                # not at a swap: start writing the data now, so a journal commit of the
                # swap waits for it and a power cut leaves the old object or the new
                # one, not an empty one. (Asynchronous: close() does not wait for it.)
                _start_writeback(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dir_fd)
        elif _exchange(dir_fd, tmp, name, label):
            _free_in_background(dir_fd, tmp, name, label)  # `tmp` now names the old object
        else:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


def _create_temp(dir_fd: int, name: str) -> tuple[int, str]:
    """A new temporary file ".NAME.XXXXXXXX.tmp" (TEMP_NAME) in `dir_fd`, mode 0600, as
    tempfile.mkstemp makes it (which takes no directory descriptor)."""
    for _ in range(100):
        tmp = f".{name}.{''.join(random.choices(TEMP_CHARS, k=8))}.tmp"
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o600, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", name)


def _load_libc() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
        return libc, ctypes.get_errno
    except (OSError, AttributeError):  # not glibc/Linux: plain renames, no writeback hint
        return None, None


_LIBC, _get_errno = _load_libc()
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_SYNC_FILE_RANGE_WRITE = 2
# filesystems (by st_dev) that refused a swap: renamed plainly from then on
_no_exchange: set[int] = set()
_openat2 = _load_openat2()


def _exchange(dir_fd: int, tmp: str, name: str, label: str = "") -> bool:
    """Swap the names `tmp` and `name` (in `dir_fd`) atomically; False (nothing done) if
    `name` does not exist or its filesystem cannot swap names."""
    if _LIBC is None or (_no_exchange and os.fstat(dir_fd).st_dev in _no_exchange):
        return False
    if _LIBC.renameat2(dir_fd, os.fsencode(tmp), dir_fd, os.fsencode(name), _RENAME_EXCHANGE) == 0:
        return True
    err = _get_errno()
    if err == errno.ENOENT:
        return False  # a new object
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        _no_exchange.add(os.fstat(dir_fd).st_dev)
        return False
    raise OSError(err, os.strerror(err), label or name)


def _start_writeback(fd: int) -> None:
    if _LIBC is not None:
        _LIBC.sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: its failure changes nothing


# Closing the last descriptor of an unlinked file frees its blocks, which is slow: the
# writer need not wait for it. At most FREEING_WAITING wait (each an open descriptor);
# beyond that the writer closes its own.
_freeing = WorkerThreads(1, "free-replaced")
FREEING_WAITING = 64


def _free_in_background(dir_fd: int, old: str, name: str, label: str = "") -> None:
    """Unlink `old` (in `dir_fd`), the old object just swapped away from `name`, now (no
    stray name is left behind) and free its data later. Had `name` been a directory,
    the swap is undone and IsADirectoryError raised (what a rename onto it answers)."""
    try:
        fd = os.open(old, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        os.unlink(old, dir_fd=dir_fd)  # (a symlink, or unreadable: unlinked here, as a rename would)
        return
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            _exchange(dir_fd, old, name, label)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), label or name)
        os.unlink(old, dir_fd=dir_fd)
    except BaseException:
        os.close(fd)
        raise
    if _freeing.waiting() >= FREEING_WAITING:
        os.close(fd)
    else:
        _freeing.submit(os.close, fd)


# Remote stores (anything but a local directory) bound each request by this many seconds
# unless `-o timeout=S` says otherwise: aiohttp's own bound is 5 minutes, during which the
# reader sits in `D` state, deaf to SIGKILL.
DEFAULT_REMOTE_TIMEOUT = defaults.REMOTE_TIMEOUT
# After a request for a key timed out, requests for the same key fail at once for this
# long (the read-ahead, zarr's and the kernel's repeated requests of one read() each
# waited out a whole timeout, one after another)...
FAILED_RECENTLY_S = 5.0
# ... and requests for it still under way give up with it (checked this often). A new
# open of the chunk file asks the store again (`forget_timeouts`).
SHARED_CHECK_S = 0.25
FAILED_KEYS_KEPT = 1024
_metered_stores: weakref.WeakValueDictionary[int, MeteredStore] = weakref.WeakValueDictionary()  # (stores are unhashable)


def timeouts_pending() -> bool:
    """Whether some store of this process remembers a recent timeout (cheap: lookups ask)."""
    now = time.monotonic()
    return any(now - store._last_timeout < FAILED_RECENTLY_S for store in list(_metered_stores.values()))


def forget_timeouts(key: str) -> None:
    """Ask the store again for `key` (a key, or its end: a chunk's key in its array), at
    once: a chunk file looked up or opened anew after a request for it timed out (a
    reader retrying)."""
    for store in list(_metered_stores.values()):
        if store._timed_out:
            for k in [k for k in list(store._timed_out) if k == key or k.endswith("/" + key)]:
                store._timed_out.pop(k, None)


def is_remote(source: str) -> bool:
    """Whether a source is a URL (s3://, gs://, https://, ...), not a local directory."""
    return "://" in source and not source.startswith("file://")


def default_timeout(source: str, timeout: float | None) -> float | None:
    """The per-request bound of a source's store: `timeout` if given (0: none), else
    DEFAULT_REMOTE_TIMEOUT for a remote source and none for a local directory."""
    if timeout is not None:
        return timeout or None
    return DEFAULT_REMOTE_TIMEOUT if is_remote(source) else None


def source_label(source: str) -> str:
    """A source as log lines show it: a URL without credentials."""
    if "://" not in source:
        return source
    import urllib.parse

    parts = urllib.parse.urlsplit(source)
    if parts.username or parts.password:
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return parts._replace(netloc=host).geturl()
    return source


class MeteredStore(WrapperStore[Store]):
    """Counts store requests/bytes and bounds each request by `timeout` seconds.

    A request that times out raises StoreTimeoutError naming the request, its key, the
    wait and `source`. For FAILED_RECENTLY_S after that, requests for the same key fail
    at once with the same reason, and those for it already under way give up with it:
    one read() of a hung chunk waits one timeout, not one per request made for it.
    Counted: `store_timeouts`, `store_failed_fast` (refused at once for a recent
    timeout), `store_errors` (any other failure); requests under way in the Stats'
    `store_requests_in_flight` and `store_oldest_request_s`.
    """

    def __init__(self, store: Store, stats: Stats | None = None, timeout: float | None = None,
                 source: str | None = None) -> None:
        super().__init__(store)
        self.stats = stats or Stats()
        self.timeout = timeout or None  # (0: none)
        self.source = source_label(source) if source else _describe(store)
        # key -> (monotonic time its request timed out, the reason)
        self._timed_out: dict[str, tuple[float, str]] = {}
        self._last_timeout = float("-inf")  # (monotonic) when a request last timed out
        _metered_stores[id(self)] = self
        # a remote store's objects with their versions (ETags): the disk cache and
        # conditional writes need them; None for local stores and other kinds
        self.remote: RemoteObjects | None = getattr(store, "zfuse_remote", None)
        self.cache: Any = None  # DiskCache of `-o cache=DIR`
        # key -> the version (ETag, or size) this mount last saw the object at: from a
        # listing, a HEAD, or the GET or PUT itself. Made anew at each reload (a new store)
        self._versions: dict[str, str] = {}
        # key -> the version of the first whole read of it since its last write: what a
        # read-modify-write (a shard, a concat-parts part) read, so the write that follows
        # is made on condition that the object is still that version (If-Match; ABSENT:
        # If-None-Match). A later read never replaces it: a condition older than what the
        # writer read fails once more and is retried, one newer would lose an update.
        self._write_versions: dict[str, str] = {}
        if self.remote is not None and self.remote.cache_dir is not None:
            from zfuse.remote_cache import DiskCache

            self.cache = DiskCache(self.remote.cache_dir, self.remote.cache_limit, self.stats.count)
        if isinstance(store, AtomicLocalStore):  # leftovers of a crashed writer, removed: counted
            stats_ = self.stats
            store.on_leftover = lambda key: stats_.count("leftovers_removed")

    def _with_store(self, store: Store) -> MeteredStore:
        copy = type(self)(store, self.stats, self.timeout, self.source)
        if self.remote is not None and copy.remote is None:
            # (zarr's read-only copy of the store: the same objects, versions and cache;
            # a version learnt by one, e.g. an exists() HEAD, serves the other's reads)
            copy.remote, copy.cache = self.remote, self.cache
            copy._versions, copy._write_versions = self._versions, self._write_versions
        return copy

    @classmethod
    async def open(  # type: ignore[override]
        cls, store_cls: type[Store], *args: Any, stats: Stats | None = None,
        timeout: float | None = None, source: str | None = None,  # noqa: ASYNC109 - bounds each request, not opening
        **kwargs: Any,
    ) -> MeteredStore:
        """Open `store_cls(*args, **kwargs)` and meter it (zarr's WrapperStore.open, plus ours)."""
        return cls(await store_cls.open(*args, **kwargs), stats, timeout, source)

    # -- bounding requests ------------------------------------------------------
    def _failed_recently(self, key: str, since: float | None = None) -> tuple[float, str] | None:
        """(when, reason) of the timeout of a request for `key` less than FAILED_RECENTLY_S
        ago (and at or after `since`, if given), else None."""
        memo = self._timed_out.get(key)
        if memo is None:
            return None
        if time.monotonic() - memo[0] >= FAILED_RECENTLY_S:
            self._timed_out.pop(key, None)
            return None
        return memo if since is None or memo[0] >= since else None

    def _note_timeout(self, key: str, reason: str) -> None:
        if len(self._timed_out) >= FAILED_KEYS_KEPT:
            now = time.monotonic()
            for k in [k for k, (t, _) in list(self._timed_out.items()) if now - t >= FAILED_RECENTLY_S]:
                self._timed_out.pop(k, None)
            if len(self._timed_out) >= FAILED_KEYS_KEPT:
                self._timed_out.clear()
        self._timed_out[key] = (time.monotonic(), reason)
        self._last_timeout = time.monotonic()

    def _shared_failure(self, op: str, key: str, memo: tuple[float, str]) -> StoreTimeoutError:
        ago = time.monotonic() - memo[0]
        return StoreTimeoutError(f"{memo[1]} {ago:.1f} s ago: {op} of the same key fails at once "
                                 f"for {FAILED_RECENTLY_S:g} s")

    async def _bounded(self, coro: Any, op: str = "request", key: str = "") -> Any:
        """Await a request of the wrapped store (`op` of `key`, for messages), bounded."""
        memo = self._failed_recently(key)
        if memo is not None:
            close = getattr(coro, "close", None)
            if close is not None:
                close()  # (never awaited)
            self.stats.count("store_failed_fast")
            raise self._shared_failure(op, key, memo)
        start = time.monotonic()
        with self.stats.in_flight():
            if self.timeout is None:
                try:
                    return await coro
                except Exception as e:
                    self._raise_failed(e, op, key, start)
            task = asyncio.ensure_future(coro)
            deadline = start + self.timeout
            try:
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    done, _ = await asyncio.wait({task}, timeout=min(remaining, SHARED_CHECK_S))
                    if done:
                        try:
                            return task.result()
                        except Exception as e:
                            self._raise_failed(e, op, key, start)
                    memo = self._failed_recently(key, since=start)
                    if memo is not None:  # another request for this key timed out meanwhile
                        _abandon(task)
                        self.stats.count("store_failed_fast")
                        raise self._shared_failure(op, key, memo)
            except asyncio.CancelledError:
                _abandon(task)
                raise
            _abandon(task)
            self.stats.count("store_timeouts")
            reason = f"store request {op} {key} timed out after {self.timeout:g} s ({self.source})"
            self._note_timeout(key, reason)
            raise StoreTimeoutError(reason)

    def _raise_failed(self, exc: Exception, op: str, key: str, start: float) -> NoReturn:
        """Raise what a failed request raises: the store's own timeout (aiohttp's, whose
        message is empty) as a StoreTimeoutError naming the request; anything else as
        it is. Counted either way (the end of a listing is no failure)."""
        if isinstance(exc, StopAsyncIteration):
            raise exc
        if isinstance(exc, TimeoutError) and not isinstance(exc, StoreTimeoutError):
            self.stats.count("store_timeouts")
            detail = f": {exc}" if str(exc) else ""
            reason = (f"store request {op} {key} timed out after {time.monotonic() - start:.1f} s "
                      f"(the store's own timeout{detail}) ({self.source})")
            self._note_timeout(key, reason)
            raise StoreTimeoutError(reason) from exc
        self.stats.count("store_errors")
        raise exc

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        kind = _kind(key)
        if self.remote is not None and kind == "chunk" and (self.cache is not None or self.remote.s3):
            data = await self._get_versioned(key, byte_range)
            return None if data is None else prototype.buffer.from_bytes(data)
        self.stats.count(f"store_get_{kind}{'_ranged' if byte_range is not None else ''}")
        result = await self._bounded(self._store.get(key, prototype, byte_range), "get", key)
        if result is not None:
            self.stats.count(f"store_bytes_{kind}", len(result))
        return result

    # -- remote objects by version: the disk cache, conditional writes ------------
    def _remember(self, key: str, version: str | None) -> None:
        if version is None:
            self._versions.pop(key, None)
            return
        if len(self._versions) >= VERSIONS_KEPT and key not in self._versions:
            self._versions.clear()  # (bounded: later reads ask the store again)
        self._versions[key] = version

    def settle_conditions(self) -> None:
        """`RemoteObjects.settle_conditions` of the remote store this wraps, if any."""
        if self.remote is not None:
            self.remote.settle_conditions()

    def forget_version(self, key: str) -> None:
        """Read `key` afresh: its next read is pinned to no version and learns the
        store's current one (a reader recovering from ObjectChangedError: the object
        changed, and what gave it its byte ranges is read again)."""
        self._remember(key, None)

    def version_of(self, key: str) -> str | None:
        """The version (ETag) this mount last saw `key` at, or None (unknown or absent)."""
        return self._versions.get(key)

    async def _current_version(self, key: str) -> str | None:
        """`key`'s version as this mount knows it (a listing or an earlier request since
        the last reload), else one HEAD; None: no such object."""
        version = self._versions.get(key)
        if version is None:
            self.stats.count("store_head")
            assert self.remote is not None
            version = await self._bounded(self.remote.head(key), "head", key)
            self._remember(key, version)
        return version

    async def get_pieces(self, key: str, pieces: list[tuple[int, int]],
                         on_piece: Callable[[int, bytes], None] | None = None) -> list[bytes | None]:
        """Byte ranges `pieces` (start, end; ascending, lying close together) of remote
        chunk object `key` (a shard's inner chunks), each kept in the disk cache as its
        own entry (with `-o cache=`), so a remount finds each however they were fetched
        together: those the cache holds for the version this mount knows are served
        from it, the rest come in one ranged request spanning them. None for a piece not
        had (the object is gone or shorter: each read then asks for its own and reports
        why). `on_piece(i, bytes)`: called for each piece had as soon as it is, while
        the rest of the request's body still arrives."""
        remote = self.remote
        assert remote is not None
        found: list[bytes | None] = [None] * len(pieces)
        version = self._versions.get(key)
        cache = self.cache
        if cache is not None and version is not None:
            identities = [remote.identity(key, RangeByteRequest(a, b)) for a, b in pieces]
            found = await asyncio.to_thread(lambda: [cache.get(i, version) for i in identities])
        missing = [i for i, data in enumerate(found) if data is None]
        if on_piece is not None:
            for i, data in enumerate(found):
                if data is not None:
                    on_piece(i, data)
        if not missing:
            return found
        start, end = pieces[missing[0]][0], pieces[missing[-1]][1]
        stream = None if on_piece is None else _PieceStream(start, [(i, *pieces[i]) for i in missing], on_piece)
        data = await self._get_versioned(key, RangeByteRequest(start, end), cached=False,
                                         on_bytes=None if stream is None else stream.arrived)
        if data is None or len(data) != end - start:
            return found
        view = memoryview(data)
        for i in missing:
            a, b = pieces[i]
            found[i] = view[a - start : b - start]  # type: ignore[call-overload]
        version = self._versions.get(key)
        if cache is not None and version is not None:
            entries = [(remote.identity(key, RangeByteRequest(*pieces[i])), found[i]) for i in missing]
            await asyncio.to_thread(lambda: [cache.put(i, version, d) for i, d in entries])
        return found

    async def _get_versioned(self, key: str, byte_range: ByteRequest | None, cached: bool = True,
                             on_bytes: Callable[[bytes], None] | None = None) -> bytes | None:
        """A remote chunk object (or range of it) with its version: from the disk cache
        when it holds the bytes of the version current for this mount, else one GET
        whose response names its version (kept, and cached). `cached=False`: neither
        looked up in the cache nor put there (`get_pieces` keeps the pieces; it alone
        passes `on_bytes`, `RemoteObjects.get`'s)."""
        remote = self.remote
        assert remote is not None
        identity = remote.identity(key, byte_range)
        revalidate = None
        if self.cache is not None and cached:
            if self._versions.get(key) is None and not remote.s3:
                await self._current_version(key)  # (no conditional GET through fsspec: one HEAD)
            version = self._versions.get(key)
            if version is not None:
                # a local file, read in a thread: the fetches ahead of a reader read
                # several side by side (zarr's event loop is one thread)
                data = await asyncio.to_thread(self.cache.get, identity, version)
                if data is not None:
                    self._read_for_write(key, byte_range, version)
                    return data
            else:
                # the version is not known yet (no listing, no HEAD): the entry the cache
                # holds, if any, is served if the store says it is current (If-None-Match:
                # one request, no bytes sent), else the GET brings the new version
                revalidate = await asyncio.to_thread(self.cache.get_any, identity)
                if revalidate is not None:
                    cached_version, cached = revalidate
                    try:
                        self.stats.count("store_get_revalidate")
                        current = await self._bounded(remote.not_modified(key, byte_range, cached_version),
                                                      "get", key)
                    except ObjectChangedError:
                        current = False
                    if current:
                        self.cache.served(len(cached))
                        self._remember(key, cached_version)
                        self._read_for_write(key, byte_range, cached_version)
                        return cached
        self.stats.count(f"store_get_chunk{'_ranged' if byte_range is not None else ''}")
        known = self._versions.get(key)
        # a byte range is read from the version the mount knows (whose shard index gave the
        # range): of another version the bytes would decode as garbage, or as wrong pixels
        pin = known if byte_range is not None and known else None
        try:
            data, version = await self._bounded(remote.get(key, byte_range, pin, on_bytes), "get", key)
        except ObjectChangedError:
            self.stats.count("store_changed_objects")
            raise
        if data is None:
            self._remember(key, None)
            self._read_for_write(key, byte_range, ABSENT)
            return None
        # (a store that names no version with the bytes: the one a listing or HEAD gave)
        version = version or known
        self._remember(key, version)
        self._read_for_write(key, byte_range, version)
        self.stats.count("store_bytes_chunk", len(data))
        if self.cache is not None and cached and version is not None:
            await asyncio.to_thread(self.cache.put, identity, version, data)
        return data

    def _read_for_write(self, key: str, byte_range: ByteRequest | None, version: str | None) -> None:
        if byte_range is None and version is not None and self.remote is not None and self.remote.conditional:
            if len(self._write_versions) >= VERSIONS_KEPT and key not in self._write_versions:
                self._write_versions.clear()
            self._write_versions.setdefault(key, version)

    def _wrote(self, key: str, version: str | None, data: Any = None) -> None:
        """After a write through this mount: the new version is the one this mount knows
        (None: unknown, asked again), and the cache holds the bytes written under it."""
        self._remember(key, version)
        if self.cache is not None and self.remote is not None:
            identity = self.remote.identity(key, None)
            if version is not None and data is not None:
                self.cache.put(identity, version, data)
            else:
                self.cache.discard(identity)

    @property
    def local_root(self) -> str | None:
        """The directory of the local store this wraps directly, else None."""
        return str(self._store.root) if type(self._store) is AtomicLocalStore else None

    @property
    def local_store(self) -> AtomicLocalStore | None:
        """zfuse's local store this wraps directly, else None (its `open_key` opens
        stored files inside the store only)."""
        return self._store if type(self._store) is AtomicLocalStore else None

    def get_local(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes | None:
        """`get` of a local store, synchronously, counted the same way. The calling
        worker thread reads the file itself: `get` would hop onto zarr's event
        loop and from there to its executor, three thread switches per chunk.
        (A local read is not bounded by `timeout`; there is no server to hang.)"""
        assert isinstance(self._store, AtomicLocalStore)
        kind = _kind(key)
        self.stats.count(f"store_get_{kind}{'_ranged' if byte_range is not None else ''}")
        result = self._store.read_key(key, byte_range)
        if result is not None:
            self.stats.count(f"store_bytes_{kind}", len(result))
        return result

    def exists_local(self, key: str) -> bool:
        """`exists` of a local store, synchronously, counted the same way (as `get_local`)."""
        assert isinstance(self._store, AtomicLocalStore)
        self.stats.count("store_exists")
        return self._store.is_file_key(key)

    def list_dir_local(self, prefix: str, page: int) -> Iterator[list[str]]:
        """`list_dir` of a local store in the calling worker thread, `page` names at a
        time, counted the same way: `list_dir` would hop onto zarr's event loop and
        from there to its executor for the scandir and again for each batch, four
        thread switches per directory (1000 of them in `ls -lR` of 100,000 chunks).
        The directory is opened inside the store only (`AtomicLocalStore.open_dir`)."""
        store = self._store
        assert isinstance(store, AtomicLocalStore)
        self.stats.count("store_list")
        keys = 0
        fd = store.open_dir(prefix)
        if fd is None:
            self.stats.count("store_list_keys", 0)
            return
        try:
            # a directory whose entries fill less than SMALL_DIR_BYTES is read whole
            # with os.listdir, several times cheaper than a DirEntry per name
            if os.fstat(fd).st_size <= SMALL_DIR_BYTES:
                names = store.sweep_leftovers(fd, prefix, os.listdir(fd))
                keys = len(names)
                if keys <= page:  # the usual chunk directory: one page, no copy
                    yield names
                    return
                for i in range(0, len(names), page):
                    yield names[i : i + page]
                return
            with os.scandir(fd) as entries:
                while True:
                    names = _next_names(entries, page)
                    got = len(names)
                    names = store.sweep_leftovers(fd, prefix, names)
                    keys += len(names)
                    if names:
                        yield names
                    if got < page:
                        return
        finally:
            os.close(fd)
            self.stats.count("store_list_keys", keys)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        self.stats.count("store_get_partial", len(key_ranges))
        keys = sorted({k for k, _ in key_ranges})
        results = await self._bounded(self._store.get_partial_values(prototype, key_ranges),
                                      f"get ({len(key_ranges)} ranges)", ",".join(keys))
        self.stats.count("store_bytes_chunk", sum(len(r) for r in results if r is not None))
        return results

    async def exists(self, key: str) -> bool:
        if self.remote is not None and self.cache is not None and _kind(key) == "chunk":
            # one HEAD, as s3fs's exists makes, whose ETag the cache then serves by; none
            # where this mount knows the object's version (a listing, a read ahead)
            if self._versions.get(key):
                return True
            self.stats.count("store_exists")
            version = await self._bounded(self.remote.head(key), "exists", key)
            self._remember(key, version)
            return version is not None
        self.stats.count("store_exists")
        return await self._bounded(self._store.exists(key), "exists", key)

    @property
    def local_writer(self) -> bool:
        """Whether `set_local` can write: this wraps zfuse's own local store directly."""
        return type(self._store) is AtomicLocalStore and not self._store.read_only

    def set_local(self, key: str, value: Buffer | list[Any]) -> None:
        """`set` of zfuse's local store, synchronously, counted the same way: the
        calling worker thread writes the file itself, instead of hopping onto zarr's
        event loop and from there to its executor (the mirror of `get_local`).
        `value` may be a list of bytes-like parts (a shard: no joined copy)."""
        assert isinstance(self._store, AtomicLocalStore)
        self.stats.count("store_set")
        size = sum(memoryview(v).nbytes for v in value) if isinstance(value, list) else len(value)
        self.stats.count("store_bytes_written", size)
        self._store.set_sync(key, value)

    async def set(self, key: str, value: Buffer) -> None:
        self.stats.count("store_set")
        self.stats.count("store_bytes_written", len(value))
        if self.remote is not None and self.remote.can_put:
            data = value.to_bytes()
            condition = self._write_versions.pop(key, None) if self.remote.conditional else None
            try:
                version = await self._bounded(self.remote.put(key, data, condition), "set", key)
            except WriteConflictError:
                self.stats.count("store_write_conflicts")
                await self._after_write(key, None)  # read it anew: another writer's version
                raise
            await self._after_write(key, version, data)
            return
        await self._bounded(self._store.set(key, value), "set", key)
        await self._after_write(key, None)

    async def delete(self, key: str) -> None:
        self.stats.count("store_delete")
        self._write_versions.pop(key, None)
        await self._bounded(self._store.delete(key), "delete", key)
        await self._after_write(key, None)

    async def _after_write(self, key: str, version: str | None, data: bytes | None = None) -> None:
        if self.cache is not None:
            await asyncio.to_thread(self._wrote, key, version, data)
        elif self.remote is not None:
            self._remember(key, version)

    async def _listing(self, it: AsyncIterator[str], op: str, prefix: str) -> AsyncIterator[str]:
        """The keys of a listing, each page bounded by the timeout (a hung listing fails
        as a hung get does: StoreTimeoutError naming the listing and its prefix)."""
        self.stats.count("store_list")
        keys = 0
        try:
            while True:
                try:
                    key = await self._bounded(it.__anext__(), op, prefix)
                except StopAsyncIteration:
                    return
                keys += 1
                yield key
        finally:
            self.stats.count("store_list_keys", keys)
            close = getattr(it, "aclose", None)
            if close is not None:
                try:
                    await close()  # a listing read in pages may stop early: let the store clean up
                except RuntimeError:
                    pass  # still running the page given up on (timed out): cancelled, it ends itself

    def list(self) -> AsyncIterator[str]:
        return self._listing(self._store.list(), "list", "/")

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        if self.remote is not None and self.cache is not None:
            return self._listing(self._versioned_listing(self.remote.list_prefix(prefix), ""),
                                 "list_prefix", prefix or "/")
        return self._listing(self._store.list_prefix(prefix), "list_prefix", prefix or "/")

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        if self.remote is not None and self.cache is not None:
            base = prefix.rstrip("/") + "/" if prefix.rstrip("/") else ""
            return self._listing(self._versioned_listing(self.remote.list_dir(prefix), base),
                                 "list_dir", prefix or "/")
        return self._listing(self._store.list_dir(prefix), "list_dir", prefix or "/")

    async def _versioned_listing(self, listed: Any, base: str) -> AsyncIterator[str]:
        """The names of a listing that also gave each object's version, remembered: the
        cache then serves a listed chunk without asking for its version again."""
        for name, version in await listed:
            if version is not None:
                self._remember(base + name, version)
            yield name


def _abandon(task: Any) -> None:
    """Cancel a request given up on, without waiting for it (a hung one may not end
    soon); its outcome is collected, never reported."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def _describe(store: Store) -> str:
    """A store as messages name it: its root directory, URL or type."""
    for attr in ("root", "path", "url"):
        value = getattr(store, attr, None)
        if value:
            return str(value)
    inner = getattr(store, "_store", None)
    return _describe(inner) if inner is not None and inner is not store else type(store).__name__


def open_store(source: str, *, read_only: bool, storage_options: dict[str, Any] | None = None,
               durable: bool = True) -> Store:
    """A zarr Store for a local path or a URL (s3://, gs://, https://, ...)."""
    if "://" in source and not source.startswith("file://"):
        from zarr.storage import FsspecStore

        protocol = source.split("://", 1)[0].lower()
        if protocol in ("http", "https"):
            read_only = True
        options = dict(storage_options or {})
        cache_dir = options.pop(CACHE_OPTION, None)
        cache_limit = options.pop(CACHE_LIMIT_OPTION, defaults.DISK_CACHE_BYTES)
        last_writer_wins = options.pop(LAST_WRITER_WINS_OPTION, False)
        options = fsspec_options(protocol, options)
        store = FsspecStore.from_url(source, storage_options=options, read_only=read_only)
        if cache_dir is not None or protocol in S3_PROTOCOLS:
            remote = RemoteObjects(store, protocol, cache_dir, int(cache_limit))
            if remote.can_put:
                # the probe runs while the mount opens the metadata (settle_conditions)
                remote.start_conditions_probe(source, bool(last_writer_wins))
            # (read by MeteredStore, which wraps every store a mount reads)
            store.zfuse_remote = remote  # type: ignore[attr-defined]
        return store
    path = source.removeprefix("file://")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or directory: {path}")
    return AtomicLocalStore(path, read_only=read_only, durable=durable)


def fsspec_options(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """The mount's generic options (endpoint_url, region, profile, anon) in the spelling
    the protocol's fsspec filesystem understands; anything else passes through unchanged.

    Credentials are not options: s3fs/gcsfs find them the usual way (environment,
    config files, instance metadata), or `profile=` picks an AWS profile.
    """
    opts = dict(options)
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    endpoint = opts.pop("endpoint_url", None) or client_kwargs.pop("endpoint_url", None)
    region = opts.pop("region", None) or client_kwargs.pop("region_name", None)
    if protocol in ("s3", "s3a"):
        # s3fs hands client_kwargs to botocore's create_client: that is where
        # endpoint_url and region_name take effect.
        if endpoint:
            client_kwargs["endpoint_url"] = endpoint
        if region:
            client_kwargs["region_name"] = region
        if client_kwargs:
            opts["client_kwargs"] = client_kwargs
        # zfuse lists once and refreshes on metadata_ttl/SIGHUP itself; s3fs's own
        # listing cache would answer exists()/info() for new keys from a stale listing.
        opts.setdefault("use_listings_cache", False)
        # One GET per whole-object read: with max_concurrency > 1 s3fs first HEADs every
        # object to decide whether to split the download, doubling requests per chunk.
        opts.setdefault("max_concurrency", 1)
    elif protocol in ("gs", "gcs"):
        if endpoint:
            opts["endpoint_url"] = endpoint
        if opts.pop("anon", False):
            opts["token"] = "anon"  # gcsfs spells anonymous access this way
        opts.pop("profile", None)
    elif protocol in ("http", "https"):
        for key in ("anon", "profile"):
            opts.pop(key, None)
    else:
        if endpoint:
            opts["endpoint_url"] = endpoint
        if client_kwargs:
            opts["client_kwargs"] = client_kwargs
    return opts


# -- remote objects with their versions ------------------------------------------------
#
# The disk cache (`-o cache=DIR`) and conditional writes need each object's version
# (its ETag), which zarr's FsspecStore never returns. `RemoteObjects` asks for it with
# the same requests FsspecStore makes (one GET per read, one LIST per listing, one PUT
# per write), reading the ETag off each response; on S3 through s3fs's own client.

S3_PROTOCOLS = ("s3", "s3a")
# the keys `-o cache=DIR,cache_limit=SIZE` put in the storage options (taken out again
# by `open_store`: fsspec never sees them)
CACHE_OPTION = "zfuse_cache"
CACHE_LIMIT_OPTION = "zfuse_cache_limit"
LAST_WRITER_WINS_OPTION = "zfuse_last_writer_wins"
ABSENT = ""  # the version of no object: a write on condition that there is none (If-None-Match: *)
VERSIONS_KEPT = 1_000_000  # object versions a mount remembers (~150 bytes each)
SINGLE_PUT_MAX = 5 * 2**30  # S3's largest PutObject; bigger objects go through s3fs (multipart)


def _version_of(info: dict[str, Any]) -> str | None:
    """An object's version from its listing or HEAD entry: the ETag where the store gives
    one (S3, HTTP), else GCS's generation or md5, else its size (`size:N`)."""
    for name in ("ETag", "etag", "generation", "md5Hash"):
        value = info.get(name)
        if value:
            return str(value)
    size = info.get("size")
    return None if size is None else f"size:{size}"


STREAM_PART = 256 << 10  # bytes of a response body read at a time when its parts are handed on


def _answers_range(response: dict[str, Any], byte_range: ByteRequest | None) -> bool:
    """Whether a GET's response holds exactly the bytes of `byte_range` (a 206 with its
    Content-Range), so its body's parts can be handed on as they come: a server that
    sends the whole object instead would have them taken for the range's bytes."""
    if not isinstance(byte_range, RangeByteRequest):
        return False
    expected = f"bytes {byte_range.start}-{byte_range.end - 1}/"
    return str(response.get("ContentRange") or "").startswith(expected) and \
        response.get("ContentLength") == byte_range.end - byte_range.start


class _PieceStream:
    """Pieces (index, start, end; ascending) of one response body starting at byte
    `start` of its object, each handed to `on_piece(index, bytes)` as soon as the
    body parts that arrived (`arrived`) cover it."""

    def __init__(self, start: int, pieces: list[tuple[int, int, int]], on_piece: Callable[[int, bytes], None]) -> None:
        self.base = start  # the object offset of buffer[0]
        self.pieces = pieces
        self.on_piece = on_piece
        self.buffer = bytearray()
        self.next = 0  # the first piece not handed on yet

    def arrived(self, part: bytes) -> None:
        self.buffer += part
        covered = self.base + len(self.buffer)
        pieces = self.pieces
        while self.next < len(pieces) and pieces[self.next][2] <= covered:
            i, a, b = pieces[self.next]
            self.on_piece(i, bytes(self.buffer[a - self.base:b - self.base]))
            self.next += 1
            # (the bytes before the next piece are no piece's: dropped)
            keep_from = min(pieces[self.next][1], covered) if self.next < len(pieces) else covered
            del self.buffer[:keep_from - self.base]
            self.base = keep_from


def _http_range(byte_range: ByteRequest | None) -> str | None:
    if byte_range is None:
        return None
    if isinstance(byte_range, RangeByteRequest):
        return f"bytes={byte_range.start}-{byte_range.end - 1}" if byte_range.end > byte_range.start else None
    if isinstance(byte_range, OffsetByteRequest):
        return f"bytes={byte_range.offset}-"
    if isinstance(byte_range, SuffixByteRequest):
        return f"bytes=-{byte_range.suffix}"
    raise TypeError(f"Unexpected byte_range, got {byte_range}.")


class RemoteObjects:
    """A remote FsspecStore's objects with their versions (see above). Reads of any
    fsspec store; `can_put` (S3, writable) says whether `put` writes with PutObject and
    returns the new ETag. `cache_dir`/`cache_limit`: the mount's disk cache, if any."""

    def __init__(self, store: Any, protocol: str, cache_dir: str | None, cache_limit: int) -> None:
        self.store = store
        self.fs = store.fs
        self.root = str(store.path).rstrip("/")
        self.s3 = protocol in S3_PROTOCOLS
        self.can_put = self.s3 and not store.read_only
        # writes carry conditions (If-Match/If-None-Match): the store was found to honour
        # them (`settle_conditions`, after the probe `start_conditions_probe` started)
        self._conditional = False
        self._conditions_probe: Any = None  # the probe under way (a concurrent Future, ...), if any
        self.probe_cleanup: Any = None  # the probe object's deletion (a concurrent Future)
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        client_kwargs = getattr(self.fs, "client_kwargs", None) or {}
        endpoint = client_kwargs.get("endpoint_url") or getattr(self.fs, "endpoint_url", None) or ""
        # what a cache entry belongs to: the server and the object (never credentials)
        self._identity_base = f"{protocol}|{endpoint}|{self.root}/"

    @property
    def conditional(self) -> bool:
        """Whether writes carry conditions. Asked before the probe has decided (not
        settled yet): yes, the safe answer (a store that ignores them loses nothing)."""
        return self._conditional or self._conditions_probe is not None

    @conditional.setter
    def conditional(self, value: bool) -> None:
        self._conditional = value

    def start_conditions_probe(self, source: str, last_writer_wins: bool) -> None:
        """Find out, in the background on zarr's event loop, whether the store honours
        conditional writes (`conditions_honoured`): a mount opens the source's metadata
        meanwhile, and waits for both (`settle_conditions`), so the probe's round trips
        are not added to the metadata's."""
        from zfuse.ext.zarr_private import event_loop

        place = self._probe_place()
        if place in _probed:
            self._conditional = _decide_conditions(_probed[place], source, last_writer_wins)
            return
        self._conditions_probe = (asyncio.run_coroutine_threadsafe(_probe(self), event_loop()),
                                  place, source, last_writer_wins)

    def settle_conditions(self) -> None:
        """Wait for the probe `start_conditions_probe` started and apply its answer:
        ConditionsIgnoredError for a store that ignores conditions (unless the mount
        accepts that: `last_writer_wins`). A probe that failed decides nothing: writes
        stay conditional, and fail as the store answers them."""
        probe = self._conditions_probe
        if probe is None:
            return
        future, place, source, last_writer_wins = probe
        try:
            honoured = future.result(timeout=defaults.REMOTE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - any failure: undecided, logged
            log.warning("%s: could not find whether the store honours conditional writes (%s): "
                        "writes are made conditional", source_label(source), e)
            self._conditions_probe, self._conditional = None, True
            return
        _probed[place] = honoured
        self._conditions_probe = None
        self._conditional = _decide_conditions(honoured, source, last_writer_wins)

    def _probe_place(self) -> tuple[str, str]:
        return (self._identity_base, self.fs.split_path(self.path(""))[0])

    def path(self, key: str) -> str:
        return f"{self.root}/{key}".rstrip("/") if self.root else key

    def identity(self, key: str, byte_range: ByteRequest | None) -> str:
        """What a cached byte range is of: server, object and range (the version apart)."""
        return f"{self._identity_base}{key}\n{_http_range(byte_range) or 'all'}"

    async def head(self, key: str) -> str | None:
        """`key`'s current version, or None if there is no such object."""
        try:
            info = await self.fs._info(self.path(key))
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        return _version_of(info)

    async def get(self, key: str, byte_range: ByteRequest | None,
                  if_match: str | None = None,
                  on_bytes: Callable[[bytes], None] | None = None) -> tuple[bytes | None, str | None]:
        """(bytes, the version they are of); (None, None) if absent. Stores other than
        S3 give no version with the bytes: (bytes, None). `if_match`: the bytes must be
        of that version (S3: If-Match), else ObjectChangedError. `on_bytes`: called with
        each part of the body as it arrives, in order (all of it at once, off S3), once
        the response is known to be of the right version."""
        if not self.s3:
            from zarr.core.buffer import default_buffer_prototype

            buf = await self.store.get(key, default_buffer_prototype(), byte_range)
            if buf is None:
                return None, None
            data = buf.to_bytes()
            if on_bytes is not None and isinstance(byte_range, RangeByteRequest) and \
                    len(data) == byte_range.end - byte_range.start:
                on_bytes(data)  # (only bytes of the right length: a server may ignore a Range)
            return data, None
        bucket, name, _ = self.fs.split_path(self.path(key))
        extra = {}
        http_range = _http_range(byte_range)
        if http_range is not None:
            extra["Range"] = http_range
        elif byte_range is not None:
            return b"", None  # an empty range
        if if_match:
            extra["IfMatch"] = if_match
        try:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=name, **extra)
        except FileNotFoundError:
            if if_match:
                raise ObjectChangedError(key) from None  # (deleted since)
            return None, None
        except OSError as e:
            if if_match and _precondition_failed(e):
                raise ObjectChangedError(key) from e
            if "InvalidRange" in str(e) or "not satisfiable" in str(e):
                return b"", None  # (what FsspecStore answers for a range past the end)
            raise
        body = response["Body"]
        version = response.get("ETag")
        if on_bytes is not None and http_range is not None and not _answers_range(response, byte_range):
            on_bytes = None  # (a server that ignored the Range: its caller finds the length wrong)
        try:
            if if_match and version and version != if_match:
                raise ObjectChangedError(key)  # (a store that ignores If-Match on reads)
            if on_bytes is None:
                data = await body.read()
            else:
                # the body part by part: a shard's inner chunks are handed on as they come
                # (decoded while the rest arrives), not when the last byte has
                parts = []
                while part := await body.read(STREAM_PART):
                    parts.append(part)
                    on_bytes(part)
                data = b"".join(parts)
        finally:
            body.close()
        return data, version

    async def put(self, key: str, data: bytes, condition: str | None = None) -> str | None:
        """Store `data` as `key` (S3 PutObject); the new object's version. `condition`: the
        version the object must still be (its ETag; ABSENT: none may exist), else
        WriteConflictError and nothing written; None: unconditional."""
        if len(data) > SINGLE_PUT_MAX and condition is None:
            from zarr.core.buffer import default_buffer_prototype

            await self.store.set(key, default_buffer_prototype().buffer.from_bytes(data))
            return None
        bucket, name, _ = self.fs.split_path(self.path(key))
        extra = {} if condition is None else {"IfNoneMatch": "*"} if condition == ABSENT else {"IfMatch": condition}
        try:
            response = await self.fs._call_s3("put_object", Bucket=bucket, Key=name, Body=data, **extra)
        except OSError as e:
            if condition is not None and _precondition_failed(e):
                raise WriteConflictError(key) from e
            raise
        return response.get("ETag")

    async def not_modified(self, key: str, byte_range: ByteRequest | None, version: str) -> bool:
        """Whether `key` is still `version` (S3: a GET with If-None-Match answered 304 Not
        Modified, no bytes sent). False: it is another version, or absent."""
        bucket, name, _ = self.fs.split_path(self.path(key))
        extra = {"IfNoneMatch": version}
        http_range = _http_range(byte_range)
        if http_range is not None:
            extra["Range"] = http_range
        try:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=name, **extra)
        except FileNotFoundError:
            return False
        except OSError as e:
            if _status(e) == 304 or "Not Modified" in str(e):
                return True
            raise
        response["Body"].close()  # (another version: its bytes are fetched by the GET that follows)
        return False

    async def delete(self, key: str) -> None:
        bucket, name, _ = self.fs.split_path(self.path(key))
        await self.fs._call_s3("delete_object", Bucket=bucket, Key=name)

    async def list_dir(self, prefix: str) -> list[tuple[str, str | None]]:
        """(name, version) of a directory's entries, as FsspecStore.list_dir names them
        (one listing; subdirectories have no version)."""
        path = f"{self.root}/{prefix.rstrip('/')}" if self.root else prefix.rstrip("/")
        try:
            entries = await self.fs._ls(path, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            name = entry["name"].replace(path + "/", "").removeprefix(self.root).removeprefix("/")
            out.append((name, None if entry.get("type") == "directory" else _version_of(entry)))
        return out

    async def list_prefix(self, prefix: str) -> list[tuple[str, str | None]]:
        """(key, version) of every object whose key starts with `prefix` (FsspecStore's listing)."""
        found = await self.fs._find(f"{self.root}/{prefix}", detail=True, maxdepth=None, withdirs=False)
        return [(name.removeprefix(f"{self.root}/"), _version_of(info)) for name, info in found.items()]


class WriteConflictError(OSError):
    """Another writer changed an object between this mount's read of it and its write
    (the store refused the conditional write): nothing was written. ESTALE, as NFS
    answers for a file changed on the server; the write path redoes a shard's or
    part's read-modify-write from the new version, and fails close() with it when
    that keeps losing."""

    def __init__(self, key: str) -> None:
        super().__init__(errno.ESTALE, f"{key}: changed by another writer since it was read "
                         "(the store refused the conditional write)")


class ObjectChangedError(OSError):
    """A byte range of an object that changed (another writer) since this mount read
    its version (and the shard index that gave the range): not read, since bytes of the
    new version at the old offsets are no chunk. ESTALE until the mount is reloaded
    (metadata_ttl, SIGHUP), which reads the new version's index."""

    def __init__(self, key: str) -> None:
        super().__init__(errno.ESTALE, f"{key}: changed on the store since this mount read it "
                         "(another writer): reload the mount (SIGHUP, zfuse reload, metadata_ttl) "
                         "to read the new version")


class ConditionsIgnoredError(ValueError):
    """A store that accepts conditional writes it does not check, mounted read-write
    without `-o last_writer_wins`."""


def _status(exc: BaseException | None) -> int | None:
    """The HTTP status of a failed S3 request (the botocore error s3fs translated)."""
    for _ in range(8):
        if exc is None:
            return None
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            return (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        exc = exc.__cause__ or exc.__context__
    return None


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a failed request was S3's answer to a condition that does not hold (412
    PreconditionFailed, or 409 ConditionalRequestConflict: a race between two of them)."""
    seen = 0
    while exc is not None and seen < 8:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if error.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        if isinstance(exc, FileExistsError):  # (s3fs's translation of a failed If-None-Match)
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return False


# (endpoint, bucket) -> whether it honours conditions: each is probed once per process
_probed: dict[tuple[str, str], bool] = {}
PROBE_PREFIX = defaults.CONDITIONS_PROBE_PREFIX


def conditions_honoured(remote: RemoteObjects, source: str, last_writer_wins: bool) -> bool:
    """Whether writes to `remote` carry conditions, probed now (see
    `RemoteObjects.start_conditions_probe`, which a mount uses instead: in the
    background). Found by a probe the first time a bucket is mounted read-write (a
    probe object written twice with If-None-Match: *, once with If-Match of a wrong
    ETag, then deleted). A store that honours them: True. One that ignores them: with
    `last_writer_wins` False and a warning logged (two hosts writing one shard can lose
    an update); without it ConditionsIgnoredError. A probe that fails outright (no
    permission to write, a hung server) decides nothing: writes are then conditional,
    and fail as the store answers them."""
    remote.start_conditions_probe(source, last_writer_wins)
    remote.settle_conditions()
    return remote.conditional


def _decide_conditions(honoured: bool, source: str, last_writer_wins: bool) -> bool:
    if honoured:
        return True
    if not last_writer_wins:
        raise ConditionsIgnoredError(
            f"{source_label(source)}: the store ignores conditional writes (If-Match, If-None-Match): "
            "two hosts writing one shard or part could silently lose an update. Mount it with "
            "-o ro, or with -o last_writer_wins to accept that (SEMANTICS [remote-3])")
    log.warning("%s: the store ignores conditional writes: mounted with last_writer_wins, two hosts "
                "writing one shard or part can lose an update", source_label(source))
    return False


async def _probe(remote: RemoteObjects) -> bool:
    key = PROBE_PREFIX + "".join(random.choices(TEMP_CHARS[:36], k=12))
    try:
        etag = await remote.put(key, b"zfuse probe 1", ABSENT)
        # both must be refused: over an existing object (If-None-Match), on a wrong ETag
        # (If-Match); asked at once (one round trip: a mount waits for the probe)
        answers = await asyncio.gather(remote.put(key, b"zfuse probe 2", ABSENT),
                                       remote.put(key, b"zfuse probe 3", '"00000000000000000000000000000000"'),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, WriteConflictError):
                raise answer
        return etag is not None and all(isinstance(a, WriteConflictError) for a in answers)
    finally:
        # deleted after the answer, not before it: the mount does not wait for this
        remote.probe_cleanup = asyncio.run_coroutine_threadsafe(_remove_probe(remote, key),
                                                                asyncio.get_running_loop())


async def _remove_probe(remote: RemoteObjects, key: str) -> None:
    try:
        await remote.delete(key)
    except Exception as e:  # noqa: BLE001 - logged: a probe object left behind
        log.warning("%s: could not remove the probe object: %s", remote.path(key), e)
