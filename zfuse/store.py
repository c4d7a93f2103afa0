"""Opening the store a mount reads, and the wrapper that measures and bounds it.

`open_store(source)` turns a path or URL into a zarr Store (local directories
get `AtomicLocalStore` of `zfuse.local_store`, whose writes are atomic: temporary file,
fsync, swapped into place; S3, and any remote store with `-o cache=`, also get their
objects with versions, `RemoteObjects` of `zfuse.remote_objects`). `MeteredStore` wraps
any store: it counts requests and bytes into `Stats` (the mount's `.zfuse/stats`) and
bounds every request by a timeout so a hung server gives an error, never a hung `ls`
(the keys that timed out or failed lately are its `StoreFailures`: their requests fail
at once for a while); over remote objects it keeps each object's version, for the disk
cache and for writes made on condition of the version read.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, NamedTuple, NoReturn

from zarr.abc.store import ByteRequest, RangeByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from zfuse import defaults
from zfuse.errors import (
    MetadataError,
    StoreServerError,
    StoreTimeoutError,
    ZfuseError,
    causes,
    source_label,
)
from zfuse.ext.metadata_json import MAX_METADATA_BYTES
from zfuse.ext.read_limits import chunk_read_limit
from zfuse.local_store import AtomicLocalStore, key_kind, next_names
from zfuse.remote_objects import (
    ABSENT,
    S3_PROTOCOLS,
    ObjectChangedError,
    RedirectRefusedError,
    RemoteObjects,
    ServerAnswers,
    WriteConflictError,
    bound_http_listings,
    follow_no_s3_redirects,
    get_http_object,
    get_http_range,
    http_head,
    http_status,
    request_answers,
    s3_redirect_refused,
)
from zfuse.source_paths import local_path
from zfuse.stats import Stats

log = logging.getLogger("zfuse.store")

# Remote stores (anything but a local directory) bound each request by this many seconds
# unless `-o timeout=S` says otherwise: aiohttp's own bound is 5 minutes, during which the
# reader sits in `D` state, deaf to SIGKILL.
DEFAULT_REMOTE_TIMEOUT = defaults.REMOTE_TIMEOUT
# After a request for a key timed out, or the server failed it (a 5xx after its client's
# retries), requests for the same key fail at once for this long (the read-ahead, zarr's
# and the kernel's repeated requests of one read() each waited out a whole timeout, or
# the retries of a server answering 500, one after another)...
FAILED_RECENTLY_S = 5.0
# ... and requests for it still under way give up with it (checked this often). A new
# open of the chunk file asks the store again (`StoreFailures.forget`).
SHARED_CHECK_S = 0.25
# a whole listing waits at most this many timeouts (and at least LISTING_MIN_S): each
# page is bounded by the timeout on its own (a directory of 400,000 chunks took 29 s)
LISTING_TIMEOUTS = 15
LISTING_MIN_S = 120.0
STORE_RETRY_S = 1.0  # a store found unreachable is asked again by a new open after this
FAILED_KEYS_KEPT = 1024
VERSIONS_KEPT = 1_000_000  # object versions a mount remembers (~150 bytes each)
SMALL_DIR_BYTES = 256 * 1024  # a directory's st_size: roughly its names' bytes (ext4: ~5,000 names)


class StoreFailures:
    """The keys of one store (its copies share them) whose requests timed out, or that
    the server failed, less than FAILED_RECENTLY_S ago: requests for such a key fail at
    once with the same reason, unless a reader asks again (`forget`: a chunk file looked
    up or opened anew). Touched from zarr's event loop and the filesystem's threads:
    single dict operations, atomic under the GIL."""

    def __init__(self) -> None:
        self._keys: dict[str, _Failure] = {}
        self._last = float("-inf")  # (monotonic) when a request last failed
        # the store itself unreachable (no connection at all): every key fails at once
        # for a while, not only the one asked (each new key cost the client's whole
        # retry cycle: `cat` of 8 files of a store gone took 61 s)
        self._down: _Failure | None = None

    def pending(self) -> bool:
        """Whether some key failed lately (cheap: every lookup of a failing store asks)."""
        down = self._down
        now = time.monotonic()
        return now - self._last < FAILED_RECENTLY_S or (down is not None and now - down.when < down.hold)

    def recent(self, key: str, since: float | None = None) -> _Failure | None:
        """The failure of a request for `key` less than FAILED_RECENTLY_S ago (and at or
        after `since`, if given), else None."""
        failure = self._keys.get(key)
        down = self._down
        if down is not None and time.monotonic() - down.when < down.hold and \
                (failure is None or down.when > failure.when):
            failure = down
        if failure is None:
            return None
        if time.monotonic() - failure.when >= failure.hold:
            self._keys.pop(key, None)
            return None
        return failure if since is None or failure.when >= since else None

    def note(self, key: str, error: StoreTimeoutError | StoreServerError) -> None:
        if len(self._keys) >= FAILED_KEYS_KEPT:
            now = time.monotonic()
            for k in [k for k, f in list(self._keys.items()) if now - f.when >= FAILED_RECENTLY_S]:
                self._keys.pop(k, None)
            if len(self._keys) >= FAILED_KEYS_KEPT:
                self._keys.clear()
        self._keys[key] = _Failure(time.monotonic(), error.args[-1], type(error), code=error.errno)
        self._last = time.monotonic()

    def note_down(self, error: StoreServerError, cost: float = 0.0) -> None:
        """The store could not be reached at all: every request fails at once with
        `error` for FAILED_RECENTLY_S (a reader opening a file anew asks again after
        STORE_RETRY_S: `forget`), or for as long as finding that out took (`cost`
        seconds): a store that drops connections silently costs each try the client's
        connect timeouts, and was asked again once a second, by every file opened."""
        self._down = _Failure(time.monotonic(), error.args[-1], type(error), whole_store=True, code=error.errno,
                              hold=max(FAILED_RECENTLY_S, cost), retry=max(STORE_RETRY_S, cost))
        self._last = time.monotonic()

    def forget(self, key: str) -> None:
        """Ask the store again for `key`, at once; and the store itself, if it was found
        unreachable more than STORE_RETRY_S ago (a reader opening one file after another
        of a store that is gone asks it once a second, not once a file: cat of 8 files
        took 30 s so, 4 s this way)."""
        self._keys.pop(key, None)
        self._ask_store_again()

    def forget_under(self, prefix: str) -> None:
        """Ask the store again, at once, for every key starting with `prefix` (an array's
        keys, where storage transformers map a chunk to keys of their own); the store
        itself as `forget` does."""
        for key in [k for k in list(self._keys) if k.startswith(prefix)]:
            self._keys.pop(key, None)
        self._ask_store_again()

    def _ask_store_again(self) -> None:
        down = self._down
        if down is not None and time.monotonic() - down.when >= down.retry:
            self._down = None


def is_remote(source: str) -> bool:
    """Whether a source is a URL (s3://, gs://, https://, ...), not a local directory."""
    return local_path(source) is None


def default_timeout(source: str, timeout: float | None) -> float | None:
    """The per-request bound of a source's store: `timeout` if given (0: none), else
    DEFAULT_REMOTE_TIMEOUT for a remote source and none for a local directory."""
    if timeout is not None:
        return timeout or None
    return DEFAULT_REMOTE_TIMEOUT if is_remote(source) else None


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
                 source: str | None = None, failures: StoreFailures | None = None) -> None:
        super().__init__(store)
        self.stats = stats or Stats()
        self.timeout = timeout or None  # (0: none)
        self.source = source_label(source) if source else _describe(store)
        self.failures = failures or StoreFailures()
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
        # an http(s) source's fsspec filesystem: its byte ranges are read by `get_http_range`
        fs = getattr(store, "fs", None)
        self._http_fs = fs if {"http", "https"} & set(getattr(fs, "protocol", ())) else None
        if isinstance(store, AtomicLocalStore):  # leftovers of a crashed writer, removed: counted
            stats_ = self.stats
            store.on_leftover = lambda key: stats_.count("leftovers_removed")

    def _with_store(self, store: Store) -> MeteredStore:
        copy = type(self)(store, self.stats, self.timeout, self.source, self.failures)
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
    def _shared_failure(self, op: str, failure: _Failure) -> StoreTimeoutError | StoreServerError:
        ago = time.monotonic() - failure.when
        which = "every request to the store" if failure.whole_store else f"{op} of the same key"
        message = f"{failure.reason} {ago:.1f} s ago: {which} fails at once for {FAILED_RECENTLY_S:g} s"
        if failure.kind is StoreServerError:
            return StoreServerError(message, failure.code)
        return StoreTimeoutError(message)

    async def _bounded(self, coro: Any, op: str = "request", key: str = "") -> Any:
        """Await a request of the wrapped store (`op` of `key`, for messages), bounded."""
        failure = self.failures.recent(key)
        if failure is not None:
            close = getattr(coro, "close", None)
            if close is not None:
                close()  # (never awaited)
            self.stats.count("store_failed_fast")
            raise self._shared_failure(op, failure)
        start = time.monotonic()
        answers = ServerAnswers()
        token = request_answers.set(answers)  # (the request's task inherits it)
        try:
            with self.stats.in_flight():
                if self.timeout is None:
                    try:
                        return await coro
                    except Exception as e:
                        self._raise_failed(e, op, key, start, answers)
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
                                self._raise_failed(e, op, key, start, answers)
                        failure = self.failures.recent(key, since=start)
                        if failure is not None:  # another request for this key failed meanwhile
                            _abandon(task)
                            self.stats.count("store_failed_fast")
                            raise self._shared_failure(op, failure)
                except asyncio.CancelledError:
                    _abandon(task)
                    raise
                _abandon(task)
                raise self._timed_out_now(op, key, start, answers)
        finally:
            request_answers.reset(token)
            if answers.failed:
                self.stats.count("store_failed_tries", answers.failed)

    def _timed_out_now(self, op: str, key: str, start: float, answers: ServerAnswers | None) -> StoreTimeoutError:
        """A request that got no answer within the timeout: counted, remembered for its
        key (`StoreFailures`), and the error saying so (and what the server answered
        to the tries that failed, if any did: a 503 for ever is no silence)."""
        assert self.timeout is not None
        self.stats.count("store_timeouts")
        elapsed = time.monotonic() - start
        # (more than the timeout when the event loop itself was held meanwhile)
        waited = f"{self.timeout:g} s" if elapsed < self.timeout + 1 else f"{elapsed:.0f} s (timeout {self.timeout:g} s)"
        answered = f": {answers}" if answers else ""
        error = StoreTimeoutError(f"store request {op} {key} timed out after {waited}{answered} ({self.source})")
        self.failures.note(key, error)
        return error

    def _raise_failed(self, exc: Exception, op: str, key: str, start: float, answers: ServerAnswers | None) -> NoReturn:
        """Raise what a failed request raises: the store's own timeout (aiohttp's, whose
        message is empty) as a StoreTimeoutError naming the request; a failure of the
        server's (a 5xx, a throttle or a lost connection, after its client's retries) as
        a StoreServerError naming the request and what the server answered, remembered
        for its key as a timeout is (a 500 for ever cost each read() its retries); anything
        else as it is. Counted either way (the end of a listing is no failure)."""
        if isinstance(exc, StopAsyncIteration):
            raise exc
        elapsed = time.monotonic() - start
        if isinstance(exc, TimeoutError) and not isinstance(exc, StoreTimeoutError) and \
                not _connection_failure(exc):
            self.stats.count("store_timeouts")
            detail = f": {exc}" if str(exc) else ""
            error = StoreTimeoutError(f"store request {op} {key} timed out after {elapsed:.1f} s "
                                      f"(the store's own timeout{detail}) ({self.source})")
            self.failures.note(key, error)
            raise error from exc
        self.stats.count("store_errors")
        refused = s3_redirect_refused(exc)
        if refused is not None:
            raise RedirectRefusedError(refused.errno, f"store request {op} {key}: {refused.strerror} "
                                       f"({self.source})") from exc
        if _server_failed(exc, answers):
            answered = f"; {answers}" if answers else ""
            server_error = StoreServerError(f"store request {op} {key} failed after {elapsed:.1f} s: "
                                            f"{_message_of(exc)}{answered} ({self.source})",
                                            exc.errno if isinstance(exc, OSError) and (exc.errno or 0) > 0 else None)
            if op.split(" ", 1)[0] in _READ_OPS:  # (a failed write is the writer's to retry; "get (N ranges)" reads)
                self.failures.note(key, server_error)
            if _unreachable(exc, answers):
                self.failures.note_down(server_error, elapsed)
            raise server_error from exc
        status = http_status(exc)
        if status is not None and ("An error occurred ()" in str(exc) or "An error occurred (None)" in str(exc)):
            # botocore found no S3 error in the answer (a proxy's HTML page): its message
            # names neither the status nor the key
            code = errno.EACCES if status in (401, 403) else errno.EIO
            raise OSError(code, f"store request {op} {key} failed: the server answered {status} with no "
                                f"S3 error in its body ({self.source})") from exc
        if status in (401, 403) and type(exc).__module__.startswith("aiohttp"):
            # an http(s) server's refusal: as S3's (EACCES), naming the request
            raise OSError(errno.EACCES, f"store request {op} {key} refused: the server answered {status} "
                                        f"({self.source})") from exc
        raise exc

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        kind = key_kind(key)
        if self.remote is not None and kind == "chunk" and (self.cache is not None or self.remote.s3):
            data = await self._get_versioned(key, byte_range)
            return None if data is None else prototype.buffer.from_bytes(data)
        self.stats.count(f"store_get_{kind}{'_ranged' if byte_range is not None else ''}")
        if self.remote is not None and self.remote.s3 and byte_range is None:
            # whole objects read to a bound (fsspec reads a body whole, however long)
            data, _ = await self._bounded(self.remote.get(key, None, limit=whole_object_limit(kind)), "get", key)
            result = None if data is None else prototype.buffer.from_bytes(data)
        elif self._http_fs is not None:
            # (not fsspec's read: it reads a body whole however long, and a server without
            # ranges sends the whole file, which it would hand back as the range)
            url = f"{self._store.path.rstrip('/')}/{key}"
            request = (get_http_object(self._http_fs, url, whole_object_limit(kind)) if byte_range is None
                       else get_http_range(self._http_fs, url, byte_range))
            data = await self._bounded(request, "get", key)
            result = None if data is None else prototype.buffer.from_bytes(data)
        else:
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

    async def _current_version(self, key: str) -> str | None:
        """`key`'s version as this mount knows it (a listing or an earlier request since
        the last reload), else one HEAD; None: no such object, or none to trust."""
        version = self._versions.get(key)
        if version is None:
            self.stats.count("store_head")
            assert self.remote is not None
            _, version = await self._bounded(self.remote.head(key), "head", key)
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
            data, version = await self._bounded(
                remote.get(key, byte_range, pin, on_bytes, limit=whole_object_limit(key_kind(key))), "get", key)
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

    def get_local(self, key: str, byte_range: tuple[int, int] | None = None,
                  max_bytes: int | None = None) -> bytes | None:
        """`get` of a local store, synchronously, counted the same way. The calling
        worker thread reads the file itself: `get` would hop onto zarr's event
        loop and from there to its executor, three thread switches per chunk.
        (A local read is not bounded by `timeout`; there is no server to hang.)
        `max_bytes`: see `AtomicLocalStore.read_key`."""
        assert isinstance(self._store, AtomicLocalStore)
        kind = key_kind(key)
        self.stats.count(f"store_get_{kind}{'_ranged' if byte_range is not None else ''}")
        result = self._store.read_key(key, byte_range, max_bytes)
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
                    names = next_names(entries, page)
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
        if self.remote is not None and self.cache is not None and key_kind(key) == "chunk":
            # one HEAD, as s3fs's exists makes, whose ETag the cache then serves by; none
            # where this mount knows the object's version (a listing, a read ahead)
            if self._versions.get(key):
                return True
            self.stats.count("store_exists")
            found, version = await self._bounded(self.remote.head(key), "exists", key)
            self._remember(key, version)
            return found  # (an object with no version to trust is there all the same)
        self.stats.count("store_exists")
        if self._http_fs is not None:  # (fsspec's answers False for any failure)
            url = f"{self._store.path.rstrip('/')}/{key}"
            found, _ = await self._bounded(http_head(self._http_fs, url), "exists", key)
            return found
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
            except Exception:
                # the PUT may have landed with its answer lost: the object is read anew
                await self._after_write(key, None)
                raise
            await self._after_write(key, version, data)
            return
        try:
            await self._bounded(self._store.set(key, value), "set", key)
        finally:
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
        failure = self.failures.recent(prefix)
        if failure is not None:  # (as `_bounded`: the same listing failed moments ago)
            self.stats.count("store_failed_fast")
            raise self._shared_failure(op, failure)
        # a whole listing is bounded too, if far more loosely than a page: a server whose
        # pages never end (each with a new continuation token) kept `ls` going for ever
        whole = None if self.timeout is None else max(LISTING_TIMEOUTS * self.timeout, LISTING_MIN_S)
        began = time.monotonic()
        try:
            while True:
                try:
                    key = await self._next_listed(it, op, prefix)
                except StopAsyncIteration:
                    return
                keys += 1
                if whole is not None and not keys % 1000 and time.monotonic() - began > whole:
                    self.stats.count("store_timeouts")
                    raise StoreTimeoutError(f"store listing {op} {prefix} still going after {whole:g} s and "
                                            f"{keys} keys: stopped ({self.source})")
                yield key
        finally:
            self.stats.count("store_list_keys", keys)
            close = getattr(it, "aclose", None)
            if close is not None:
                try:
                    await close()  # a listing read in pages may stop early: let the store clean up
                except RuntimeError:
                    pass  # still running the page given up on (timed out): cancelled, it ends itself

    async def _next_listed(self, it: AsyncIterator[str], op: str, prefix: str) -> str:
        """The next key of a listing, bounded by the timeout as `_bounded` bounds a
        request, but without a task of its own: most keys are at hand (the page holds
        them), and a task each cost 13 us a key, the event loop's time (a 3-million-name
        page took a minute)."""
        start = time.monotonic()
        answers = ServerAnswers()
        token = request_answers.set(answers)
        try:
            with self.stats.in_flight():
                if self.timeout is None:
                    try:
                        return await it.__anext__()
                    except Exception as e:
                        self._raise_failed(e, op, prefix, start, answers)
                deadline = asyncio.timeout(self.timeout)
                try:
                    async with deadline:
                        return await it.__anext__()
                except Exception as e:
                    if deadline.expired():
                        raise self._timed_out_now(op, prefix, start, answers) from None
                    self._raise_failed(e, op, prefix, start, answers)
        finally:
            request_answers.reset(token)

    def list(self) -> AsyncIterator[str]:
        return self._listing(self._store.list(), "list", "/")

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        if self.remote is not None and (self.remote.s3 or self.cache is not None):
            return self._listing(self._versioned_listing(self.remote.iter_prefix(prefix), ""),
                                 "list_prefix", prefix or "/")
        return self._listing(self._store.list_prefix(prefix), "list_prefix", prefix or "/")

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        if self.remote is not None and (self.remote.s3 or self.cache is not None):
            base = prefix.rstrip("/") + "/" if prefix.rstrip("/") else ""
            return self._listing(self._versioned_listing(self.remote.iter_dir(prefix), base),
                                 "list_dir", prefix or "/")
        return self._listing(self._store.list_dir(prefix), "list_dir", prefix or "/")

    async def _versioned_listing(self, listed: AsyncIterator[tuple[str, str | None]],
                                 base: str) -> AsyncIterator[str]:
        """The names of a listing that also gives each object's version (S3's page by
        page), the versions remembered where the cache serves by them (it then serves a
        listed chunk without asking for its version again)."""
        async for name, version in listed:
            if version is not None and self.cache is not None:
                self._remember(base + name, version)
            yield name


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


class _Failure(NamedTuple):
    """A request for a key that timed out or that the server failed: when, why, and the
    error that said so (what requests for the key raise for FAILED_RECENTLY_S)."""

    when: float  # (monotonic)
    reason: str
    kind: type[StoreTimeoutError] | type[StoreServerError]
    whole_store: bool = False  # (the store unreachable: every key, not only this one)
    code: int | None = None  # a server failure's errno
    hold: float = FAILED_RECENTLY_S  # seconds requests fail at once after it
    retry: float = STORE_RETRY_S  # (the store unreachable) seconds before a new open asks again


_READ_OPS = frozenset({"get", "head", "exists", "get_partial_values", "list", "list_dir", "list_prefix"})


def _server_failed(exc: BaseException, answers: ServerAnswers | None) -> bool:
    """Whether a request failed on the server's side: it answered 5xx (or 429), or the
    connection failed, on the last try. Not an answer that means something (no such
    object, a condition that failed, bytes refused as corrupt) and no bug of ours."""
    if isinstance(exc, (ZfuseError, FileNotFoundError, FileExistsError, PermissionError,
                        ObjectChangedError, WriteConflictError)):
        return False
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status == 429
    return bool(answers) or isinstance(exc, ConnectionError) or _connection_failure(exc) or _answer_lost(exc)


# aiohttp's: an answer cut short (the connection closed before its Content-Length, a
# malformed chunked body), a connection lost mid-answer
_LOST_ANSWERS = frozenset({"ClientPayloadError", "ServerDisconnectedError"})


def _answer_lost(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is an answer the server cut short: a
    failure of the server's, not a bug of zfuse's (it was logged as one, traceback and all)."""
    return any(c.__name__ in _LOST_ANSWERS for cause in causes(exc) for c in type(cause).__mro__)


# (botocore's, for S3; aiohttp's, for http(s) stores, whose connection failures are no
# builtin ConnectionError)
_CONNECTION_FAILURES = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                                  "ConnectionRefusedError", "ConnectionTimeoutError"})


def _connection_failure(exc: BaseException) -> bool:
    """Whether `exc` is one of those or a kind of one (aiohttp's ClientConnectorDNSError,
    its SSL and certificate failures are ClientConnectorErrors)."""
    return any(c.__name__ in _CONNECTION_FAILURES for c in type(exc).__mro__)


def _unreachable(exc: BaseException, answers: ServerAnswers | None) -> bool:
    """Whether a failed request never reached a server: no HTTP answer, and its tries
    failed to connect (not a connection lost mid-answer, which one key's object may cause)."""
    if http_status(exc) is not None:
        return False
    if answers:
        return not answers.answer and answers.exception in _CONNECTION_FAILURES
    return isinstance(exc, ConnectionRefusedError) or _connection_failure(exc)


def _message_of(exc: BaseException) -> str:
    """An error's own words (an OSError's without its "[Errno N]"), or its type's name."""
    words = exc.args[-1] if isinstance(exc, OSError) and len(exc.args) == 2 else str(exc)
    return str(words) or type(exc).__name__


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


# the keys `-o cache=DIR,cache_limit=SIZE` put in the storage options (taken out again
# by `open_store`: fsspec never sees them)
CACHE_OPTION = "zfuse_cache"
CACHE_LIMIT_OPTION = "zfuse_cache_limit"
LAST_WRITER_WINS_OPTION = "zfuse_last_writer_wins"


def open_store(source: str, *, read_only: bool, storage_options: dict[str, Any] | None = None,
               durable: bool = True) -> Store:
    """A zarr Store for a local path or a URL (s3://, gs://, https://, ...)."""
    if is_remote(source):
        from zarr.storage import FsspecStore

        protocol = source.split("://", 1)[0].lower()
        if protocol in ("http", "https"):
            read_only = True
        options = dict(storage_options or {})
        cache_dir = options.pop(CACHE_OPTION, None)
        cache_limit = options.pop(CACHE_LIMIT_OPTION, defaults.DISK_CACHE_BYTES)
        last_writer_wins = options.pop(LAST_WRITER_WINS_OPTION, False)
        _check_package(protocol)
        if not read_only and protocol not in S3_PROTOCOLS:
            _unconditional_writes(source, bool(last_writer_wins))
        options = fsspec_options(protocol, options)
        store = FsspecStore.from_url(source, storage_options=options, read_only=read_only)
        if protocol in ("http", "https"):
            bound_http_listings(store.fs)
        if cache_dir is not None or protocol in S3_PROTOCOLS:
            remote = RemoteObjects(store, protocol, cache_dir, int(cache_limit))
            if remote.can_put:
                # the probe runs while the mount opens the metadata (settle_conditions)
                remote.start_conditions_probe(source, bool(last_writer_wins))
            # (read by MeteredStore, which wraps every store a mount reads)
            store.zfuse_remote = remote  # type: ignore[attr-defined]
        return store
    path = local_path(source) or source
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or directory: {path}")
    if not os.path.isdir(path):
        # (zarr would try to make it a directory: "File exists"; a concat description
        # naming another description, or a TIFF given as a store, said only that)
        from zfuse.ext.concat import is_concat_description

        nested = (" (a concat description file is a source only on its own, not inside another "
                  "concatenation)") if is_concat_description(path) else ""
        raise MetadataError(f"{path}: not a directory, so no Zarr store{nested}")
    return AtomicLocalStore(path, read_only=read_only, durable=durable)


#: the package each remote protocol's fsspec filesystem comes from, and zfuse's extra
#: that installs it (`pip install 'zfuse[remote]'`; `make setup` installs them)
_PACKAGES = {"s3": ("s3fs", "remote"), "s3a": ("s3fs", "remote"), "http": ("aiohttp", "remote"),
             "https": ("aiohttp", "remote"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
             "az": ("adlfs", "az"), "abfs": ("adlfs", "az")}


def _check_package(protocol: str) -> None:
    """A MetadataError naming what to install when the protocol's package is missing
    (fsspec's own ImportError names no way to get it into zfuse's environment)."""
    package, extra = _PACKAGES.get(protocol, (None, None))
    if package is None:
        return
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise MetadataError(f"{protocol}:// sources need the Python package {package}, not installed in "
                            f"zfuse's environment ({sys.executable}): pip install 'zfuse[{extra}]' "
                            f"(or {package} itself)")


def _unconditional_writes(source: str, last_writer_wins: bool) -> None:
    """Object stores other than S3 are written without conditions (zfuse's conditional
    writes are S3's If-Match): refused read-write unless `-o last_writer_wins` accepts
    that, as an S3 store that ignores conditions is (SEMANTICS [remote-3])."""
    from zfuse.remote_objects import ConditionsIgnoredError

    if not last_writer_wins:
        raise ConditionsIgnoredError(
            f"{source_label(source)}: zfuse writes this kind of store without conditions (its "
            "conditional writes are S3's If-Match): two hosts writing one shard or part could "
            "silently lose an update. Mount it with -o ro, or with -o last_writer_wins to accept "
            "that (SEMANTICS [remote-3])")
    log.warning("%s: written without conditions (mounted with last_writer_wins): two hosts writing one "
                "shard or part can lose an update", source_label(source))


def whole_object_limit(kind: str) -> int:
    """Bytes a remote object of `kind` (`key_kind`) is read whole to at most: a metadata
    document one past the largest zfuse reads (so that it says why), a chunk what its
    reader says it can be stored in."""
    if kind != "chunk":
        return MAX_METADATA_BYTES + 1
    limit = chunk_read_limit.get()
    return defaults.REMOTE_OBJECT_MAX if limit is None else limit


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
        follow_no_s3_redirects()  # (for every client made with these options)
        # One GET per whole-object read: with max_concurrency > 1 s3fs first HEADs every
        # object to decide whether to split the download, doubling requests per chunk.
        opts.setdefault("max_concurrency", 1)
        # botocore's standard retries (3 tries, AWS's recommended mode) rather than its
        # legacy 5 with backoffs of up to 8 s: a request the server fails, or a store gone,
        # says so in seconds, well within the timeout
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 3, "mode": "standard"})
        # a store that drops connections silently is found unreachable within the timeout
        # (botocore waits 60 s for a connection: every key cost the whole timeout)
        config.setdefault("connect_timeout", defaults.CONNECT_TIMEOUT)
        opts["config_kwargs"] = config
    elif protocol in ("gs", "gcs"):
        if endpoint:
            opts["endpoint_url"] = endpoint
        if opts.pop("anon", False):
            opts["token"] = "anon"  # gcsfs spells anonymous access this way
        opts.pop("profile", None)
    elif protocol in ("http", "https"):
        for key in ("anon", "profile"):
            opts.pop(key, None)
        # bodies as stored, never decompressed on the way (a 6 MB gzip body of zeros is
        # gigabytes): what a server encodes anyway is decoded within the read's bound
        # (`remote_objects.get_http_object`), or refused
        opts["headers"] = {"Accept-Encoding": "identity", **(opts.get("headers") or {})}
        for key in ("endpoint_url", "region_name"):  # (s3's: no meaning for a URL)
            client_kwargs.pop(key, None)
        client_kwargs.setdefault("auto_decompress", False)
        # no redirect followed by fsspec's own requests (exists, info): a store's server
        # could send them to any host or port (zfuse's reads follow those within the
        # server only: `remote_objects._get_same_origin`)
        opts["allow_redirects"] = False
        # as S3's: a server dropping connections silently is found unreachable (aiohttp's
        # total stays its own 5 minutes; each request is bounded by the mount's timeout)
        import aiohttp  # (fsspec's http needs it anyway; not imported for other stores)

        client_kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=300, sock_connect=defaults.CONNECT_TIMEOUT))
        opts["client_kwargs"] = client_kwargs
    else:
        if endpoint:
            opts["endpoint_url"] = endpoint
        if client_kwargs:
            opts["client_kwargs"] = client_kwargs
    return opts
