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
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from zfuse.stats import Stats
from zfuse.workers import WorkerThreads

METADATA_NAMES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")


def _kind(key: str) -> str:
    return "metadata" if key.rsplit("/", 1)[-1] in METADATA_NAMES or key.endswith(".json") else "chunk"


class AtomicLocalStore(LocalStore):
    """LocalStore whose whole-object writes are atomic: a crash leaves old or new, never torn.

    `durable` (the default): each object's data is on disk (fdatasync) before it
    replaces the old one, so a write that returned survives a power cut too.
    Without it, a write that returned survives the writing process (the object
    is in the filesystem), which is what zarr-python's own LocalStore promises;
    `os.sync()` then makes everything written so far durable.

    Listing walks directories with `os.scandir` (no stat per key): zarr's own
    `LocalStore.list_prefix` stats every entry, which dominates listing an
    array of 100,000 chunks.
    """

    def __init__(self, root: Any, *, read_only: bool = False, durable: bool = True) -> None:
        super().__init__(root, read_only=read_only)
        self.durable = durable

    def with_read_only(self, read_only: bool = False) -> AtomicLocalStore:
        return type(self)(self.root, read_only=read_only, durable=self.durable)

    @classmethod
    async def open(cls, root: Any, *, read_only: bool = False, mode: Any = None,
                   durable: bool = True) -> AtomicLocalStore:  # type: ignore[override]
        store = await super().open(root, read_only=read_only, mode=mode)
        store.durable = durable
        return store

    async def set(self, key: str, value: Buffer) -> None:
        await self._ensure_open()
        self._check_writable()
        path = Path(self.root) / key
        await asyncio.to_thread(_atomic_write, path, value.as_buffer_like(), self.durable)

    def set_sync(self, key: str, value: Buffer | list[Any]) -> None:
        """`set`, in the calling thread (zfuse's worker threads write chunks this way);
        `value` may be a list of bytes-like parts, stored one after another."""
        self._check_writable()
        data = value if isinstance(value, list) else value.as_buffer_like()
        _atomic_write(Path(self.root) / key, data, self.durable)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        await self._ensure_open()
        for key in await asyncio.to_thread(_walk_keys, str(self.root), prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        """Names in one directory, read with `os.scandir` in batches off the event loop:
        zarr's own walks the directory on its event loop, and reads it whole first."""
        await self._ensure_open()
        path = os.path.join(str(self.root), prefix) if prefix else str(self.root)
        try:
            entries = await asyncio.to_thread(os.scandir, path)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            while True:
                names = await asyncio.to_thread(_next_names, entries, LIST_DIR_BATCH)
                for name in names:
                    yield name
                if len(names) < LIST_DIR_BATCH:
                    return
        finally:
            entries.close()


LIST_DIR_BATCH = 1000
SMALL_DIR_BYTES = 256 * 1024  # a directory's st_size: roughly its names' bytes (ext4: ~5,000 names)


def _next_names(entries: Any, count: int) -> list[str]:
    names = []
    for entry in entries:
        names.append(entry.name)
        if len(names) == count:
            break
    return names


def _walk_keys(root: str, prefix: str) -> list[str]:
    """Every file key under `root` that starts with `prefix` (scandir; no stat per entry)."""
    base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    keys: list[str] = []
    stack = [base]
    while stack:
        rel = stack.pop()
        try:
            entries = os.scandir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=True):
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append(key)
                elif key.startswith(prefix):
                    keys.append(key)
    return keys


def _atomic_write(path: Path, data: Any, durable: bool = True) -> None:
    """Write `data` (a bytes-like object, or a list of them written one after another) to
    `path` through a temporary file in the same directory that then takes its place;
    `durable`: fdatasync before that.

    The new file swaps names with the old one (`renameat2(RENAME_EXCHANGE)`), and the
    old one is unlinked at once but freed in a background thread. A plain rename
    over the old file frees the old blocks in the writer's call, and on ext4 that
    took half of a 512 KiB chunk's write. Where the swap is not supported (or there
    is no old file) it is an ordinary rename.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except FileNotFoundError:  # a new key directory (the common case needs no mkdir)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
        if _exchange(tmp, path):
            _free_in_background(tmp, path)  # `tmp` now names the old object
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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


def _exchange(tmp: str, path: Path) -> bool:
    """Swap the names `tmp` and `path` atomically; False (nothing done) if `path` does not
    exist or its filesystem cannot swap names."""
    if _LIBC is None or (_no_exchange and os.stat(tmp).st_dev in _no_exchange):
        return False
    if _LIBC.renameat2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE) == 0:
        return True
    err = _get_errno()
    if err == errno.ENOENT:
        return False  # a new object
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        _no_exchange.add(os.stat(tmp).st_dev)
        return False
    raise OSError(err, os.strerror(err), str(path))


def _start_writeback(fd: int) -> None:
    if _LIBC is not None:
        _LIBC.sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: its failure changes nothing


# Closing the last descriptor of an unlinked file frees its blocks, which is slow: the
# writer need not wait for it. At most FREEING_WAITING wait (each an open descriptor);
# beyond that the writer closes its own.
_freeing = WorkerThreads(1, "free-replaced")
FREEING_WAITING = 64


def _free_in_background(name: str, path: Path) -> None:
    """Unlink `name`, the old object just swapped away from `path`, now (no stray name
    is left behind) and free its data later. Had `path` been a directory, the swap is
    undone and IsADirectoryError raised (what a rename onto it answers)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        os.unlink(name)  # (a symlink, or unreadable: unlinked here, as a rename would)
        return
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            _exchange(name, path)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        os.unlink(name)
    except BaseException:
        os.close(fd)
        raise
    if _freeing.waiting() >= FREEING_WAITING:
        os.close(fd)
    else:
        _freeing.submit(os.close, fd)


def read_local_file(path: str, byte_range: tuple[int, int] | None = None) -> bytes | None:
    """A stored object's bytes (or [start, end) of them) read directly; None if absent
    (what zarr's LocalStore answers for a missing key or a directory)."""
    try:
        with open(path, "rb", buffering=0) as f:
            if byte_range is None:
                return f.read()
            start, end = byte_range
            return os.pread(f.fileno(), end - start, start)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


class MeteredStore(WrapperStore[Store]):
    """Counts store requests/bytes and bounds each request by `timeout` seconds."""

    def __init__(self, store: Store, stats: Stats | None = None, timeout: float | None = None) -> None:
        super().__init__(store)
        self.stats = stats or Stats()
        self.timeout = timeout

    def _with_store(self, store: Store) -> MeteredStore:
        return type(self)(store, self.stats, self.timeout)

    @classmethod
    async def open(  # type: ignore[override]
        cls, store_cls: type[Store], *args: Any, stats: Stats | None = None,
        timeout: float | None = None, **kwargs: Any,  # noqa: ASYNC109 - bounds each request, not opening
    ) -> MeteredStore:
        """Open `store_cls(*args, **kwargs)` and meter it (zarr's WrapperStore.open, plus ours)."""
        return cls(await store_cls.open(*args, **kwargs), stats, timeout)

    async def _bounded(self, coro: Any) -> Any:
        if self.timeout is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, self.timeout)
        except TimeoutError:
            self.stats.count("store_timeouts")
            raise TimeoutError(f"store request timed out after {self.timeout}s") from None

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        kind = _kind(key)
        self.stats.count(f"store_get_{kind}{'_ranged' if byte_range is not None else ''}")
        result = await self._bounded(self._store.get(key, prototype, byte_range))
        if result is not None:
            self.stats.count(f"store_bytes_{kind}", len(result))
        return result

    @property
    def local_root(self) -> str | None:
        """The directory of the local store this wraps directly, else None."""
        return str(self._store.root) if type(self._store) in (LocalStore, AtomicLocalStore) else None

    def get_local(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes | None:
        """`get` of a local store, synchronously, counted the same way. The calling
        worker thread reads the file itself: `get` would hop onto zarr's event
        loop and from there to its executor, three thread switches per chunk.
        (A local read is not bounded by `timeout`; there is no server to hang.)"""
        root = self.local_root
        assert root is not None
        kind = _kind(key)
        self.stats.count(f"store_get_{kind}{'_ranged' if byte_range is not None else ''}")
        result = read_local_file(os.path.join(root, key), byte_range)
        if result is not None:
            self.stats.count(f"store_bytes_{kind}", len(result))
        return result

    def exists_local(self, key: str) -> bool:
        """`exists` of a local store, synchronously, counted the same way (as `get_local`)."""
        root = self.local_root
        assert root is not None
        self.stats.count("store_exists")
        return os.path.isfile(os.path.join(root, key))

    def list_dir_local(self, prefix: str, page: int) -> Iterator[list[str]]:
        """`list_dir` of a local store in the calling worker thread, `page` names at a
        time, counted the same way: `list_dir` would hop onto zarr's event loop and
        from there to its executor for the scandir and again for each batch, four
        thread switches per directory (1000 of them in `ls -lR` of 100,000 chunks)."""
        root = self.local_root
        assert root is not None
        self.stats.count("store_list")
        path = os.path.join(root, prefix) if prefix else root
        keys = 0
        try:
            try:
                # a directory whose entries fill less than SMALL_DIR_BYTES is read whole
                # with os.listdir, several times cheaper than a DirEntry per name
                if os.stat(path).st_size <= SMALL_DIR_BYTES:
                    names = os.listdir(path)
                    keys = len(names)
                    if keys <= page:  # the usual chunk directory: one page, no copy
                        yield names
                        return
                    for i in range(0, len(names), page):
                        yield names[i : i + page]
                    return
                entries = os.scandir(path)
            except (FileNotFoundError, NotADirectoryError):
                return
            with entries:
                while True:
                    names = _next_names(entries, page)
                    keys += len(names)
                    if names:
                        yield names
                    if len(names) < page:
                        return
        finally:
            self.stats.count("store_list_keys", keys)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        self.stats.count("store_get_partial", len(key_ranges))
        results = await self._bounded(self._store.get_partial_values(prototype, key_ranges))
        self.stats.count("store_bytes_chunk", sum(len(r) for r in results if r is not None))
        return results

    async def exists(self, key: str) -> bool:
        self.stats.count("store_exists")
        return await self._bounded(self._store.exists(key))

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
        await self._bounded(self._store.set(key, value))

    async def delete(self, key: str) -> None:
        self.stats.count("store_delete")
        await self._bounded(self._store.delete(key))

    async def _listing(self, it: AsyncIterator[str]) -> AsyncIterator[str]:
        self.stats.count("store_list")
        keys = 0
        try:
            async for key in it:
                keys += 1
                yield key
        finally:
            self.stats.count("store_list_keys", keys)
            close = getattr(it, "aclose", None)
            if close is not None:
                await close()  # a listing read in pages may stop early: let the store clean up

    def list(self) -> AsyncIterator[str]:
        return self._listing(self._store.list())

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        return self._listing(self._store.list_prefix(prefix))

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        return self._listing(self._store.list_dir(prefix))


def open_store(source: str, *, read_only: bool, storage_options: dict[str, Any] | None = None,
               durable: bool = True) -> Store:
    """A zarr Store for a local path or a URL (s3://, gs://, https://, ...)."""
    if "://" in source and not source.startswith("file://"):
        from zarr.storage import FsspecStore

        protocol = source.split("://", 1)[0].lower()
        if protocol in ("http", "https"):
            read_only = True
        options = fsspec_options(protocol, storage_options or {})
        return FsspecStore.from_url(source, storage_options=options, read_only=read_only)
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
