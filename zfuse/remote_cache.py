"""A cache on local disk of what remote stores sent (`-o cache=DIR`), kept across mounts.

Each entry is one fetched object or byte range of one, under the version (ETag)
of the object it came from: an entry is served only for the version the caller
names, so a changed object is a miss, never stale bytes. Which version is
current is the store layer's business (`zfuse.store.MeteredStore`: a listing,
a HEAD, or the response of the GET or PUT itself); this module only keeps bytes.

An entry is one file `DIR/zfuse-cache-v1/XY/HASH`, HASH the SHA-256 of the
entry's identity (store, key, range). The file holds a header (magic, CRC32C,
lengths, the ETag and the identity itself) and then the bytes; a file whose
header, length, identity, ETag or checksum does not match is removed and
counts as a miss. A truncated or garbage file costs a refetch, never wrong bytes.

Several daemons may share one DIR at once: an entry is written to an O_EXCL
temporary file beside it and renamed into place, so a reader opens the old
file or the new one, whole. The directory is made 0700; one owned by another
user, or writable by group or others, is refused. Everything inside it is
opened relative to its descriptor with O_NOFOLLOW: a link planted inside never
leads out of it. The cache is bounded on disk (`limit` bytes): past it the
least recently used entries (oldest mtime; a hit touches its entry) are removed.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import os
import random
import stat
import struct
import threading
import time
from collections.abc import Callable

from zfuse import defaults

__all__ = ["CacheDirError", "DiskCache", "LAYOUT"]

LAYOUT = "zfuse-cache-v1"  # the subdirectory entries live in (a new layout gets a new name)
MAGIC = b"ZFCACHE1"
# magic, CRC32C of (etag, identity, payload), payload length, etag length, identity length
_HEADER = struct.Struct("<8sIQHI")
#: bytes of one entry at most: the largest object a remote store is read whole to, and
#: its names (bigger ones are never stored: `put`)
ENTRY_MAX = defaults.REMOTE_OBJECT_MAX + (1 << 20)
_MAX_ETAG = 1024
_MAX_IDENT = 64 * 1024
TEMP_PREFIX = ".tmp."
#: a temporary file older than this is a crashed writer's: an eviction scan removes it
TEMP_AGE = 3600.0
#: an eviction leaves the cache at this fraction of its limit (not one eviction per entry)
EVICT_TO = 0.9


class CacheDirError(ValueError):
    """A cache directory that cannot be used safely; the message says why."""


def _crc(*parts: bytes | memoryview) -> int:
    import crc32c  # (imported ahead, off the mount's path: see `_import_crc_ahead`)

    value = 0
    for part in parts:
        value = crc32c.crc32c(part, value)
    return value


def _import_crc_ahead() -> None:
    """Import crc32c in the background: its package looks up its own version in every
    installed package's metadata, 0.06 s warm and 0.3 s with a cold page cache, which
    a mount with a cache would otherwise wait for before it is live."""
    threading.Thread(target=importlib.import_module, args=("crc32c",), name="import-crc32c", daemon=True).start()


class DiskCache:
    """Byte entries on disk under (identity, etag), bounded by `limit` bytes with LRU eviction.

    `count(name, amount)` receives the counters (`disk_cache_hits`, `disk_cache_misses`,
    `disk_cache_bytes_read`, `disk_cache_stored`, `disk_cache_evicted`, `disk_cache_corrupt`).
    Thread-safe; every method does blocking file I/O (call it off any event loop
    that must not wait on a disk).
    """

    def __init__(self, directory: str, limit: int, count: Callable[[str, float], None] | None = None) -> None:
        if limit < 0:
            raise CacheDirError(f"cache limit {limit} is negative")
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.limit = limit
        self._count = count if count is not None else (lambda name, amount=1: None)
        self._fd = _open_cache_dir(self.directory)
        _import_crc_ahead()
        self._lock = threading.Lock()
        self._used: int | None = None  # bytes on disk as last scanned, plus what this process wrote since
        self._written_since_scan = 0

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __getstate__(self) -> dict[str, object]:
        # (zarr may copy a store: the copy opens the directory again)
        return {"directory": self.directory, "limit": self.limit}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(str(state["directory"]), int(state["limit"]))  # type: ignore[misc, call-overload]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- entries ---------------------------------------------------------------
    @staticmethod
    def name_of(identity: str) -> tuple[str, str]:
        """(subdirectory, file name) of an entry: from its identity's hash only, so no
        identity (a store key) can name a path of its own."""
        digest = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()
        return digest[:2], digest

    def get(self, identity: str, etag: str) -> bytes | None:
        """The bytes stored for `identity` at version `etag`, or None (absent, another
        version, or a damaged entry, which is removed)."""
        found = self._lookup(identity, etag)
        return None if found is None else found[1]

    def get_any(self, identity: str) -> tuple[str, bytes] | None:
        """(version, bytes) of `identity`'s entry whatever its version, or None: what to
        ask the store whether it is still current (If-None-Match) when the version is
        not known yet. Counted as neither hit nor miss until `served` says."""
        return self._lookup(identity, None)

    def served(self, nbytes: int) -> None:
        """A `get_any` entry was current after all: counted as a hit."""
        self._count("disk_cache_hits", 1)
        self._count("disk_cache_bytes_read", nbytes)

    def _lookup(self, identity: str, etag: str | None) -> tuple[str, bytes] | None:
        sub, name = self.name_of(identity)
        try:
            fd = self._open_in(sub, name, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self._count("disk_cache_misses", 1)
            return None
        try:
            st = os.fstat(fd)
            data = self._read_entry(fd, st, identity, etag)
            if data is _DAMAGED:
                self._drop_damaged(sub, name, st)
                self._count("disk_cache_misses", 1)
                return None
            if data is None:
                self._count("disk_cache_misses", 1)
                return None
            try:
                os.utime(fd)  # least recently used = oldest mtime
            except OSError:
                pass
        finally:
            os.close(fd)
        assert isinstance(data, tuple)
        if etag is not None:
            self.served(len(data[1]))
        return data

    def _read_entry(self, fd: int, st: os.stat_result, identity: str,
                    etag: str | None) -> tuple[str, bytes] | None | object:
        """(version, payload); None for another version (`etag`, unless None) or identity
        (a valid-looking entry, left); or _DAMAGED. The header is read and checked
        against the file's size first, then the entry's names, then the payload (a
        planted 2.5 GB file had been read whole, 30 s and 4.8 GB, before its header was
        looked at); an entry is at most ENTRY_MAX bytes."""
        if not stat.S_ISREG(st.st_mode) or st.st_size < _HEADER.size or st.st_size > min(self.limit, ENTRY_MAX):
            return _DAMAGED
        head = _pread_exact(fd, _HEADER.size, 0)
        if head is None:
            return _DAMAGED
        magic, crc, length, etag_len, ident_len = _HEADER.unpack(head)
        if (magic != MAGIC or etag_len > _MAX_ETAG or ident_len > _MAX_IDENT
                or _HEADER.size + etag_len + ident_len + length != st.st_size):
            return _DAMAGED
        names = _pread_exact(fd, etag_len + ident_len, _HEADER.size)
        if names is None:
            return _DAMAGED
        stored_etag, stored_ident = names[:etag_len], names[etag_len:]
        if stored_ident != identity.encode("utf-8", "surrogateescape"):
            return None  # (a hash collision: not ours)
        if etag is not None and stored_etag != etag.encode("utf-8", "surrogateescape"):
            return None  # an older (or newer) version: replaced by the next put
        payload = _pread_exact(fd, length, _HEADER.size + etag_len + ident_len)
        if payload is None or _crc(stored_etag, stored_ident, payload) != crc:
            return _DAMAGED
        return stored_etag.decode("utf-8", "surrogateescape"), payload

    def _drop_damaged(self, sub: str, name: str, st: os.stat_result) -> None:
        self._count("disk_cache_corrupt", 1)
        try:
            sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError:
            return
        try:
            # only the file that was read: another daemon may have renamed a good one in since
            now = os.stat(name, dir_fd=sub_fd, follow_symlinks=False)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(name, dir_fd=sub_fd)
        except OSError:
            pass
        finally:
            os.close(sub_fd)

    def put(self, identity: str, etag: str, data: bytes | memoryview) -> bool:
        """Store `data` for `identity` at version `etag` (replacing any other version);
        False if it is not kept (bigger than the limit, or the disk refused it)."""
        etag_b = etag.encode("utf-8", "surrogateescape")
        ident_b = identity.encode("utf-8", "surrogateescape")
        payload = memoryview(data).cast("B")
        size = _HEADER.size + len(etag_b) + len(ident_b) + payload.nbytes
        if size > min(self.limit, ENTRY_MAX) or len(etag_b) > _MAX_ETAG or len(ident_b) > _MAX_IDENT:
            return False
        header = _HEADER.pack(MAGIC, _crc(etag_b, ident_b, payload), payload.nbytes, len(etag_b), len(ident_b))
        sub, name = self.name_of(identity)
        try:
            sub_fd = self._subdir(sub)
        except OSError:
            return False
        try:
            tmp = self._write_temp(sub_fd, [header, etag_b, ident_b, payload])
            if tmp is None:
                return False
            try:
                os.rename(tmp, name, src_dir_fd=sub_fd, dst_dir_fd=sub_fd)  # atomic: old or new, whole
            except OSError:
                _unlink_quietly(sub_fd, tmp)
                return False
        finally:
            os.close(sub_fd)
        self._count("disk_cache_stored", 1)
        self._account(size)
        return True

    def discard(self, identity: str) -> None:
        """Remove `identity`'s entry, whatever its version (if any)."""
        sub, name = self.name_of(identity)
        try:
            sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError:
            return
        try:
            _unlink_quietly(sub_fd, name)
        finally:
            os.close(sub_fd)

    # -- the bound -------------------------------------------------------------
    def _account(self, size: int) -> None:
        with self._lock:
            self._written_since_scan += size
            # another daemon sharing the directory writes too: scan again after this
            # process alone wrote an eighth of the limit, so the bound holds for both
            rescan = self._used is None or self._written_since_scan > self.limit // 8
            if not rescan:
                assert self._used is not None
                self._used += size
                if self._used <= self.limit:
                    return
        self.evict()

    def used(self) -> int:
        """Bytes the entries take (a scan of the directory)."""
        return sum(size for _, _, _, size in self._scan())

    def evict(self) -> None:
        """Scan the directory; past the limit, remove the least recently used entries
        until the cache holds EVICT_TO of it. Removes crashed writers' temporary files."""
        with self._lock:
            entries = self._scan()
            used = sum(e[3] for e in entries)
            if used > self.limit:
                entries.sort()  # oldest mtime first
                target = int(self.limit * EVICT_TO)
                evicted = 0
                for _, sub, name, size in entries:
                    if used <= target:
                        break
                    if self._remove(sub, name):
                        evicted += 1
                    used -= size
                self._count("disk_cache_evicted", evicted)
            self._used = used
            self._written_since_scan = 0

    def _scan(self) -> list[tuple[float, str, str, int]]:
        """(mtime, subdirectory, name, size) of every entry; stale temporaries removed.
        Only names this module makes are looked at (two hex digits, then hex names)."""
        out = []
        now = time.time()
        for sub in _listdir(self._fd):
            if len(sub) != 2 or not _is_hex(sub):
                continue
            try:
                sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
            except OSError:
                continue
            try:
                for name in _listdir(sub_fd):
                    try:
                        st = os.stat(name, dir_fd=sub_fd, follow_symlinks=False)
                    except OSError:
                        continue
                    if name.startswith(TEMP_PREFIX):
                        if now - st.st_mtime > TEMP_AGE:
                            _unlink_quietly(sub_fd, name)
                        continue
                    if stat.S_ISREG(st.st_mode):
                        out.append((st.st_mtime, sub, name, st.st_size))
            finally:
                os.close(sub_fd)
        return out

    def _remove(self, sub: str, name: str) -> bool:
        try:
            sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError:
            return False
        try:
            os.unlink(name, dir_fd=sub_fd)
            return True
        except OSError:
            return False  # (another daemon evicted it first)
        finally:
            os.close(sub_fd)

    # -- files inside the directory only ----------------------------------------
    def _open_in(self, sub: str, name: str, flags: int) -> int:
        sub_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sub_fd)
        finally:
            os.close(sub_fd)

    def _subdir(self, sub: str) -> int:
        try:
            os.mkdir(sub, 0o700, dir_fd=self._fd)
        except FileExistsError:
            pass
        return os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)

    @staticmethod
    def _write_temp(sub_fd: int, parts: list[bytes | memoryview]) -> str | None:
        for _ in range(16):
            tmp = f"{TEMP_PREFIX}{random.getrandbits(64):016x}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=sub_fd)
            except FileExistsError:
                continue
            except OSError:
                return None
            try:
                for part in parts:
                    view = memoryview(part).cast("B")
                    while view:
                        view = view[os.write(fd, view):]
            except OSError:
                os.close(fd)
                _unlink_quietly(sub_fd, tmp)
                return None
            os.close(fd)
            return tmp
        return None


_DAMAGED = object()


def _open_cache_dir(directory: str) -> int:
    """A descriptor of DIR/LAYOUT, made 0700 if missing; refused (CacheDirError) when DIR
    or it is not a directory owned by this user and closed to group and others' writes."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise CacheDirError(f"cache directory {directory}: {e.strerror or e}") from None
    try:
        _check_private(top, directory)
        try:
            os.mkdir(LAYOUT, 0o700, dir_fd=top)
        except FileExistsError:
            pass
        try:
            fd = os.open(LAYOUT, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CacheDirError(f"cache directory {directory}: {LAYOUT} is not a directory "
                                    "(a symbolic link is never followed)") from None
            raise CacheDirError(f"cache directory {directory}/{LAYOUT}: {e.strerror or e}") from None
        try:
            _check_private(fd, f"{directory}/{LAYOUT}")
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(top)


def _check_private(fd: int, label: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise CacheDirError(f"cache directory {label} belongs to uid {st.st_uid}, not to this user "
                            f"({os.geteuid()}): refused (another user could plant entries)")
    if st.st_mode & 0o022:
        raise CacheDirError(f"cache directory {label} is writable by group or others "
                            f"(mode {stat.S_IMODE(st.st_mode):o}): refused; chmod go-w it")


def _pread_exact(fd: int, size: int, offset: int) -> bytes | None:
    """`size` bytes at `offset`; None if the file is shorter (it changed under the reader:
    damaged)."""
    out = bytearray(size)
    view = memoryview(out)
    done = 0
    while done < size:
        got = os.preadv(fd, [view[done : done + (1 << 30)]], offset + done)
        if got <= 0:
            return None
        done += got
    return bytes(out)


def _listdir(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
