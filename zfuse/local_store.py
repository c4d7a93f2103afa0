"""The local store: a directory read, listed and written beneath itself only.

`AtomicLocalStore` is the zarr Store of a local directory (what `zfuse.store.open_store`
gives a path): every key is checked (`check_key`) and opened relative to the store's
directory, never outside it (`open_beneath`: openat2 with RESOLVE_BENEATH, or a walk
with O_NOFOLLOW); whole-object writes are atomic (`_atomic_write`: a temporary file,
fdatasync, swapped into place with renameat2 RENAME_EXCHANGE, the old data freed in the
background); listings leave out zfuse's temporary files and remove those a crashed
daemon left. Nothing of FUSE, the mount or remote stores.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from collections.abc import AsyncIterator, Iterable
from typing import Any

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore

from zfuse.errors import CorruptDataError, OutsideStoreError
from zfuse.ext.chunk_keys import METADATA_NAMES
from zfuse.ext.metadata_json import MAX_METADATA_BYTES, too_large_problem
from zfuse.ext.read_limits import chunk_read_limit
from zfuse.workers import WorkerThreads

log = logging.getLogger("zfuse.store")  # the name its lines always had



def key_kind(key: str) -> str:
    """A store key's kind, as the store's counters and refusals tell them apart:
    "metadata" (a metadata document) or "chunk" (anything else)."""
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


def _read_fd(fd: int, size: int, key: str, max_bytes: int | None = None) -> bytes:
    """The whole file behind `fd`, `size` bytes as fstat said (one read in the usual
    case: a short read of a regular file is its end; one that grew is read on, up to
    `max_bytes`)."""
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data
    parts, held = [data], len(data)
    while True:
        more = os.read(fd, 1 << 20)
        if not more:
            return b"".join(parts)
        held += len(more)
        if max_bytes is not None and held > max_bytes:
            raise _too_large(key, held, max_bytes)
        parts.append(more)


def _ident(st: os.stat_result) -> tuple[int, int]:
    """A file's identity: (device, inode)."""
    return st.st_dev, st.st_ino


def _too_large(key: str, size: int, max_bytes: int) -> CorruptDataError:
    if key_kind(key) == "metadata":
        return CorruptDataError(f"{too_large_problem(key, size)}: not read")
    return CorruptDataError(f"{key}: stored object of {size} bytes or more, past the {max_bytes} "
                            "that what it holds can be stored in: not read")


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

    def open_file_key(self, key: str) -> tuple[int, os.stat_result]:
        """A read-only descriptor of `key`'s regular file, inside the store only, and its
        stat. Opened non-blocking (a FIFO would block the opener for ever); a FIFO,
        socket or device (a socket fails open(2) with ENXIO): OutsideStoreError; a
        directory: IsADirectoryError; absent: FileNotFoundError (or NotADirectoryError)."""
        not_regular = f"{key}: not a regular file (a FIFO, socket or device): not read"
        try:
            fd = self.open_key(key, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:
                raise OutsideStoreError(not_regular) from e
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), key)
            raise OutsideStoreError(not_regular)
        return fd, st

    def read_key(self, key: str, byte_range: tuple[int, int] | None = None,
                 max_bytes: int | None = None) -> bytes | None:
        """A stored object's bytes (or [start, end) of them, as far as the file goes);
        None if absent or a directory (what zarr's LocalStore answers). Not a regular
        file (`open_file_key`): OutsideStoreError. Whole, larger than `max_bytes` (a
        crafted sparse file of a terabyte): CorruptDataError, nothing read."""
        try:
            fd, st = self.open_file_key(key)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            if byte_range is None:
                if max_bytes is not None and st.st_size > max_bytes:
                    raise _too_large(key, st.st_size, max_bytes)
                return _read_fd(fd, st.st_size, key, max_bytes)
            # clamped to the file: a crafted shard index's 2**40-byte piece is not allocated
            # (its reader finds it short), nor is an offset past 2**63 passed to pread
            start = max(0, byte_range[0])
            length = min(byte_range[1], st.st_size) - start
            return os.pread(fd, length, start) if length > 0 else b""
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

    def write_refusal(self, key: str) -> OSError | None:
        """Why writing or deleting `key` would fail for this process, found before
        anything is changed (a mount of a store it may not write had hidden a chunk at
        `rm`, said 0, and restored it when the delete failed 30 s later); None when
        nothing stands in the way that permissions tell. The directory asked is `key`'s,
        or the nearest one above it that exists (the write makes the rest): EACCES when
        this process may not write it, or may not replace another owner's file in it
        (the sticky bit), EROFS on a read-only filesystem, EPERM for an immutable or
        append-only directory or file (`chattr`)."""
        check_key(key)
        parts = key.split("/")
        for depth in range(len(parts) - 1, -1, -1):
            head = "/".join(parts[:depth])
            try:
                fd = open_beneath(self.root_fd(), head, os.O_PATH | os.O_DIRECTORY) if head else None
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OutsideStoreError:
                return None  # (a directory leading out of the store: the write itself refuses it)
            try:
                return self._directory_refusal(fd if fd is not None else self.root_fd(), head, parts[-1]
                                               if depth == len(parts) - 1 else None)
            finally:
                if fd is not None:
                    os.close(fd)
        return None

    def _directory_refusal(self, dir_fd: int, head: str, name: str | None) -> OSError | None:
        where = os.path.join(str(self.root), head) if head else str(self.root)
        if os.access(".", os.W_OK | os.X_OK, dir_fd=dir_fd, effective_ids=os.access in os.supports_effective_ids):
            # the inode flags no permission overrides (chattr +i, +a): an immutable
            # directory takes no new name, an append-only one no rename onto or out of
            # it (a directory above, where the write only makes a new directory, is
            # refused for immutable alone); such a file is never replaced
            for at, what in ((".", where), *(((name, f"{where}/{name}"),) if name is not None else ())):
                flag = _fixed_flag(dir_fd, at)
                if flag is not None and (name is not None or flag == "immutable"):
                    return OSError(errno.EPERM, f"{what} is {flag} (chattr): it cannot be replaced or removed")
            st = os.fstat(dir_fd)
            uid = os.geteuid()
            if name is None or not st.st_mode & stat.S_ISVTX or uid in (0, st.st_uid):
                return None
            try:
                owner = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid
            except FileNotFoundError:
                return None
            if owner == uid:
                return None
            return OSError(errno.EACCES, f"{where} is a sticky directory and {name} there belongs to uid "
                                         f"{owner}: uid {uid} may not replace or remove it")
        if os.fstatvfs(dir_fd).f_flag & os.ST_RDONLY:
            return OSError(errno.EROFS, f"{where} is on a read-only filesystem: the store cannot be written "
                                        "(mount with -o ro)")
        return OSError(errno.EACCES, f"{where} is not writable by uid {os.geteuid()}: the store cannot be "
                                     "written there (mount with -o ro, or ask its owner)")

    def is_file_key(self, key: str) -> bool:
        """Whether `key` is an object of the store. A name in the store that is a link
        leading out of it counts (its read then fails, naming it), and so does a FIFO,
        socket or device (listed as any name is; its read fails: "not a regular file");
        a key under a directory that leads out does not (that directory is not the
        store's), nor does a directory."""
        try:
            st = self.stat_key(key)
        except OutsideStoreError:
            head = key.rpartition("/")[0]
            try:
                self.stat_key(head)
            except OutsideStoreError:
                return False
            return True
        return st is not None and not stat.S_ISDIR(st.st_mode)

    def _read_request(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        if byte_range is None:
            # a chunk object read whole: no further than its reader says it can hold; a
            # metadata document no further than zfuse reads one (a sparse 1 GiB member's
            # zarr.json had been read whole, 4 GB, before its size was looked at)
            limit = chunk_read_limit.get() if key_kind(key) == "chunk" else MAX_METADATA_BYTES
            return self.read_key(key, max_bytes=limit)
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
            if key_kind(key) != "metadata":
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
                    links: list[str] = []
                    names = await asyncio.to_thread(next_names, entries, LIST_DIR_BATCH, links)
                    names = self.sweep_leftovers(fd, prefix, names)
                    if links:
                        names = await asyncio.to_thread(self._without_cycles, fd, prefix, names, links)
                    for name in names:
                        yield name
                    if len(names) < LIST_DIR_BATCH:
                        return
            finally:
                entries.close()
        finally:
            os.close(fd)

    def _without_cycles(self, dir_fd: int, prefix: str, names: list[str], links: list[str]) -> list[str]:
        """`names` without the `links` among them that lead to the directory listed or one
        above it (logged): two links to the store's root (`a -> .`, `b -> .`) make a
        hierarchy of 2**64 directories at the depth shown, which no walk finishes."""
        key = prefix.strip("/")
        here = _ident(os.fstat(dir_fd))
        above = {here} | self._above(key)
        drop = set()
        for name in links:
            link = f"{key}/{name}" if key else name
            try:
                st = self.stat_key(link)
            except OutsideStoreError:
                continue  # (leading out: refused where it is read)
            if st is not None and stat.S_ISDIR(st.st_mode) and _ident(st) in above:
                log.warning("%s: a link to %s: not listed (a cycle)", link,
                            "the directory it is in" if _ident(st) == here else "a directory above it")
                drop.add(name)
        return [n for n in names if n not in drop] if drop else names

    def _above(self, key: str) -> set[tuple[int, int]]:
        """Identities (`_ident`) of the directories `key` lies in: the store's root and
        each proper prefix of it (links inside followed); none for the root itself."""
        if not key:
            return set()
        parts = key.split("/")
        found = {_ident(os.fstat(self.root_fd()))}
        for depth in range(1, len(parts)):
            st = self.stat_key("/".join(parts[:depth]))
            if st is not None:
                found.add(_ident(st))
        return found

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
        # each directory with those it lies in (by identity), from the store's root: a
        # link to one of them loops
        stack: list[tuple[str, frozenset[tuple[int, int]]]] = [(base, frozenset(self._above(base)))]
        linked_dirs = 0
        while stack:
            rel, above = stack.pop()
            fd = self.open_dir(rel)
            if fd is None:
                continue
            try:
                here = _ident(os.fstat(fd))
                if here in above:
                    log.warning("not listed: %s: a link to a directory it lies in (a loop)", rel)
                    continue
                above = above | {here}
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
                        linked_dirs += 1
                        if linked_dirs > LINKED_DIRS_WALKED_MAX:
                            # (two links to the next directory, level after level: no loop,
                            # and 2**n paths)
                            if linked_dirs == LINKED_DIRS_WALKED_MAX + 1:
                                log.warning("not listed: %s and any further directory reached through a link: "
                                            "more than %d in one walk", key, LINKED_DIRS_WALKED_MAX)
                            continue
                if is_dir:
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append((key, above))
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
#: directories one walk of keys enters through links, at most (links to directories are
#: rare in a store; chains of them double the paths at each level)
LINKED_DIRS_WALKED_MAX = 10_000


def next_names(entries: Any, count: int, links: list[str] | None = None) -> list[str]:
    """The next `count` names of a directory's `os.scandir` iterator (fewer: its end);
    the symbolic links among them added to `links` (d_type: no stat), if given."""
    names = []
    for entry in entries:
        names.append(entry.name)
        if links is not None and entry.is_symlink():
            links.append(entry.name)
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
            _keep_owner_and_mode(fd, dir_fd, name)
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


_FS_IOC_GETFLAGS = 0x80086601  # (Linux, 64-bit: _IOR('f', 1, long))
_FIXED_FLAGS = {0x10: "immutable", 0x20: "append-only"}  # FS_IMMUTABLE_FL, FS_APPEND_FL


def _fixed_flag(dir_fd: int, name: str) -> str | None:
    """"immutable" or "append-only" when `name` in `dir_fd` ("." for the directory itself)
    has that inode flag; None otherwise, or when the filesystem keeps no such flags."""
    import fcntl

    try:  # (a regular file or directory only: opening a device may do something)
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return None
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        flags = int.from_bytes(fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8)), "little")
    except OSError:
        return None
    finally:
        os.close(fd)
    return next((said for bit, said in _FIXED_FLAGS.items() if flags & bit), None)


def _keep_owner_and_mode(fd: int, dir_fd: int, name: str) -> None:
    """The new object `fd` gets the mode and owner of the one it replaces, as a file
    rewritten in place keeps them (a root daemon's writes made a user's chunks 0600 and
    root's: the user could no longer read them); a new object the mode the umask gives."""
    try:
        old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(old.st_mode):
        return
    # best effort: a filesystem without modes or owners, an unmapped owner in a user namespace
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
    except OSError:
        # not root: the new object is the daemon's user's, as any file it writes, but
        # keeps its group where the user is in it (a shared store's group had been lost)
        with contextlib.suppress(OSError):
            os.fchown(fd, -1, old.st_gid)


def _create_temp(dir_fd: int, name: str) -> tuple[int, str]:
    """A new temporary file ".NAME.XXXXXXXX.tmp" (TEMP_NAME) in `dir_fd`, readable as any
    new file is (0666 less the umask: zarr-python's writes make the same)."""
    for _ in range(100):
        tmp = f".{name}.{''.join(random.choices(TEMP_CHARS, k=8))}.tmp"
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o666, dir_fd=dir_fd), tmp
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

