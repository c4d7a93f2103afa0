"""One array's chunk-key directories, listed from its store: `ChunkListing`.

A mount lists an array one chunk-key directory at a time (`ChunkSource.iter_chunk_dir`).
For a `ZarrChunkSource` this part answers it from the store: a local directory in
the calling thread, a remote one by delimited LISTs, paged. Unsharded, the view's
directories are the store's; sharded, a shard name stands for the inner chunks it
covers, and the listed shards' indexes say which exist.

It owns what listings keep: a remote store directory of shards listed once for
every view directory it holds (`_store_dirs`: shared, bounded), a small remote
array listed whole for a walker (`_flat_listing`, its shards' indexes read beside
that listing), and each shard's chunk map as bytes (`_chunk_map_bytes`). The key
geometry, the store and the shard indexes are the array's (`ListedArray`,
`ShardIndexes`). Listings run in worker threads; store I/O on zarr's event loop.
No FUSE.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import math
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import numpy as np
from zarr.core.sync import sync

from zfuse.ext import zarr_private
from zfuse.ext.chunk_keys import Coords
from zfuse.view.shard_indexes import ShardIndexes

log = logging.getLogger("zfuse.view")
LIST_PAGE = 1000  # names taken from a store listing at a time (S3 returns 1000 per LIST page)
LEAF_INDEX_MAX = 4096  # chunks along the last axis up to which listings decode names by a dict
DirPage = list[tuple[str, Coords | None]]  # (key name, chunk coords) or (directory name, None)
CHUNK_MAPS_KEPT = 64  # shards whose chunk map is kept as bytes for listings (one byte per inner chunk)
CHUNK_MAPS_BYTES = 16 * 1024 * 1024  # and at most this many bytes of them
SHARD_DIRS_KEPT = 64  # remote store directories of shards kept listed (`_shard_dir_names`)
SHARD_DIR_NAMES = 100_000  # at most, names kept per such directory
LIST_WAIT = 60.0  # seconds a listing waits for the same directory's listing under way
# a remote array of at most this many storage objects (one LIST page of S3) is listed
# whole, in one request, when a walker lists a directory above its chunks
FLAT_LISTING_OBJECTS = 1000
FLAT_LISTING_KEYS = 2 * FLAT_LISTING_OBJECTS  # keys read at most (strays too) before giving up
INDEXES_ALONGSIDE = 64  # shard indexes read along with a listed directory's, at most
_FLAT = "\0flat"  # `_store_dirs` key of the whole array's listing (no store directory's name)


class _SharedListing:
    """One store directory's listing (or with `children`, the whole array's), made by
    the first view directory to ask for it."""

    __slots__ = ("children", "done", "names", "shards")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.names: list[str] | None = None
        # the whole array's listing: store directory ("c/0/") -> the names it holds
        self.children: dict[str, list[str]] | None = None
        # and, of a sharded array, the shards it lists
        self.shards: list[Any] = []


def _directories_of(keys: list[str]) -> dict[str, list[str]]:
    """What a flat listing's keys (relative to the array) make of each directory above
    them: ``{"": ["c", "zarr.json"], "c/": ["0"], "c/0/": ["0", "1"]}``, names sorted."""
    held: dict[str, set[str]] = {}
    for key in keys:
        start = 0
        while True:
            cut = key.find("/", start)
            held.setdefault(key[:start], set()).add(key[start:] if cut < 0 else key[start:cut])
            if cut < 0:
                break
            start = cut + 1
    return {head: sorted(names) for head, names in held.items()}


def canonical_int(name: str) -> bool:
    """Whether a chunk-key name is a coordinate as keys write it (``7``, not ``07``)."""
    # ASCII only: str.isdigit and int() also take other scripts' digits ("١", "１"); at
    # most 20 digits (2**64 has 20): int() refuses a name of more than 4,300, and one
    # such listed key failed its whole directory
    return len(name) <= 20 and name.isascii() and name.isdigit() and (name == "0" or name[0] != "0")


async def _take(aiter: AsyncIterator[str], count: int) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        try:
            out.append(await aiter.__anext__())
        except StopAsyncIteration:
            break
    return out


def _pages(aiter: AsyncIterator[str], size: int = LIST_PAGE) -> Iterator[list[str]]:
    """An async listing consumed `size` names at a time from a worker thread: the
    caller can answer from the first page while later ones are still unread."""
    try:
        while True:
            page = sync(_take(aiter, size))
            if page:
                yield page
            if len(page) < size:
                return
    finally:
        close = getattr(aiter, "aclose", None)
        if close is not None:
            try:
                sync(close())
            except Exception as e:  # closing a half-read listing must not mask why it stopped
                log.debug("closing a store listing failed: %s", e)


class ListedArray(Protocol):
    """What a `ChunkListing` uses of its array (the `ZarrChunkSource` holding it): the
    store and prefix it lists, the grid and key geometry its names are decoded with,
    and what its store stack is (local, remote, caching)."""

    store: Any
    prefix: str
    shape: tuple[int, ...]
    sharding: Any  # None: not sharded
    chunks_per_shard: tuple[int, ...]  # (sharded arrays only)
    standard_keys: tuple[str, str] | None  # (key head, separator) of the default and v2 key encodings
    access: Any  # `remote`: a store whose requests each wait a round trip
    caches_ranges: bool  # a remote store keeping what it fetched on disk (`-o cache=DIR`)

    @property
    def grid_shape(self) -> tuple[int, ...]: ...

    @property
    def storage_grid(self) -> tuple[int, ...]: ...

    def dir_coords(self, parts: tuple[str, ...]) -> Coords | None: ...

    def key_layout(self) -> tuple[tuple[str, ...], dict[int, int]]: ...

    def decode_key(self, key: str) -> Coords | None: ...

    def chunk_key(self, coords: Coords) -> str: ...

    def in_grid(self, coords: Coords) -> bool: ...

    def listing_store(self) -> Any: ...  # the local store listed in this thread, or None


class ChunkListing:
    """The chunk-key directories of one array (a `ZarrChunkSource`), listed from its store."""

    def __init__(self, array: ListedArray, indexes: ShardIndexes) -> None:
        self._array = array
        self._indexes = indexes
        # id(index's offsets array) -> (a weak reference to that array, the chunk map as
        # bytes): kept for listings without keeping the index alive past its own cache
        self._chunk_maps: dict[int, tuple[weakref.ref[Any], bytes]] = {}
        self._chunk_maps_bytes = 0
        # a remote store's directories listed, shared by the view directories that lie in
        # one (`_shard_dir_names`: a shard row's), or the whole array's (`_flat_listing`)
        self._store_dirs: collections.OrderedDict[str, _SharedListing] = collections.OrderedDict()
        self._store_dirs_guard = threading.Lock()

    def iter_chunk_dir(self, parts: tuple[str, ...]) -> Iterator[DirPage]:
        """One delimited listing of the store directory behind `parts`, paged.

        Unsharded, the view's directories are the store's. Sharded, directory
        names hold inner-chunk coordinates: the store directory is the one of the
        shards covering them; a shard name there stands for the inner names it
        covers, and at the last level the indexes of the listed shards (only
        those) say which inner chunks exist.
        """
        array = self._array
        fixed = array.dir_coords(parts)
        if fixed is None:
            return
        origin, axis_at = array.key_layout()
        per_object = array.chunks_per_shard if array.sharding is not None else (1,) * len(array.shape)
        store_parts = [
            str(int(name) // per_object[axis_at[depth]]) if depth in axis_at else name
            for depth, name in enumerate(parts)
        ]
        head = "".join(p + "/" for p in store_parts)
        depth = len(parts)
        leaf = depth == len(origin) - 1
        local = array.listing_store()
        if local is None and not leaf and depth not in axis_at:
            # a component every chunk key has (v3's `c`): shown with no request, as `entry`
            # shows it even before a chunk is stored (a reader's readdir of the array,
            # GDAL's, costs no round trip; a walker lists the array at `c/`, whole)
            yield [(origin[depth], None)]
            return
        flat = None if local is not None else self._flat_listing(first=not leaf)
        if local is not None:
            pages = local.list_dir_local(array.prefix + head, LIST_PAGE)
        elif flat is not None:
            assert flat.children is not None
            pages = iter([flat.children.get(head, [])])
        elif array.sharding is not None:
            pages = self._shard_dir_names(head)
        else:
            pages = _pages(array.store.list_dir(array.prefix + head))
        for names in pages:
            if local is None:
                # http(s) listings mark directories "name/"; a key that is both an object and
                # a prefix (`c/0/1` and `c/0/1/...`, a leftover) is one name, not two
                names = list(dict.fromkeys(name.rstrip("/") for name in names))
            if not leaf:
                yield self._subdirs(depth, names, per_object)
            elif array.sharding is None:
                yield self._stored_chunks(head, names, fixed)
            else:
                # a walker of the whole array: the indexes of the other shards are read
                # alongside this directory's (one round trip, not one per shard row)
                also = functools.partial(self._shards_ahead, flat) if flat is not None else None
                yield self._inner_chunks(head, names, fixed, also)

    def forget_store_dirs(self) -> None:
        """Drop the store directories kept listed (a write may have made a new shard object)."""
        with self._store_dirs_guard:
            self._store_dirs.clear()

    def invalidate(self) -> None:
        """Forget everything kept (after external changes): store directories, chunk maps."""
        self.forget_store_dirs()
        self._chunk_maps.clear()
        self._chunk_maps_bytes = 0

    # -- store directories listed once ------------------------------------
    def _shard_dir_names(self, head: str) -> Iterator[list[str]]:
        """A remote store directory of shards, listed once for every view directory it
        holds inner chunks of (a shard row covers several: each listing its store
        directory again cost a LIST each), in pages. Kept until `invalidate` or a write
        through the mount (a new shard object), for the SHARD_DIRS_KEPT directories
        listed last, each of at most SHARD_DIR_NAMES names (a bigger one is listed per
        view directory, as before)."""
        array = self._array
        with self._store_dirs_guard:
            shared = self._store_dirs.get(head)
            mine = shared is None
            if mine:
                shared = self._store_dirs[head] = _SharedListing()
                while len(self._store_dirs) > SHARD_DIRS_KEPT:
                    self._store_dirs.popitem(last=False)
            else:
                self._store_dirs.move_to_end(head)
        assert shared is not None
        if mine:
            names: list[str] = []
            pages = _pages(array.store.list_dir(array.prefix + head))
            try:
                for page in pages:
                    names += page
                    if len(names) > SHARD_DIR_NAMES:
                        break
            except BaseException:
                self._unshare(head, shared)
                raise
            if len(names) > SHARD_DIR_NAMES:  # too big to keep: the rest of this one listing
                self._unshare(head, shared)
                for at in range(0, len(names), LIST_PAGE):
                    yield names[at : at + LIST_PAGE]
                yield from pages
                return
            shared.names = names
            shared.done.set()
        elif not shared.done.wait(LIST_WAIT) or shared.names is None:
            yield from _pages(array.store.list_dir(array.prefix + head))
            return
        names = shared.names
        for at in range(0, len(names), LIST_PAGE):
            yield names[at : at + LIST_PAGE]
        if not names:
            yield []

    def _flat_listing(self, first: bool) -> _SharedListing | None:
        """The whole array's store directories from one listing of its prefix, for a
        remote array of at most FLAT_LISTING_OBJECTS storage objects (one LIST page, where
        each directory would cost one: a walk of 8 chunk rows made 9 LISTs in 6 round
        trips). Made when `first` (a directory above the chunks: a walker, who lists
        those below next), used by every directory listed after it until `invalidate` or
        a write through the mount; None: list the directory itself (a big or other
        array, or no flat listing and not `first`: `ls` of one chunk directory stays one
        delimited LIST of that directory)."""
        array = self._array
        if not array.access.remote or math.prod(array.storage_grid) > FLAT_LISTING_OBJECTS:
            return None
        with self._store_dirs_guard:
            shared = self._store_dirs.get(_FLAT)
            mine = shared is None and first
            if mine:
                shared = self._store_dirs[_FLAT] = _SharedListing()
        if shared is None:
            return None
        if mine:
            self._read_indexes_beside_listing()
            keys: list[str] = []
            n = len(array.prefix)
            try:
                for page in _pages(array.store.list_prefix(array.prefix)):
                    keys += (key[n:] for key in page)
                    if len(keys) > FLAT_LISTING_KEYS:
                        break  # (stray objects: each directory is listed by itself)
            except BaseException:
                self._unshare(_FLAT, shared)
                raise
            if len(keys) <= FLAT_LISTING_KEYS:
                shared.children = _directories_of(keys)
                if array.sharding is not None:
                    # in grid order: the order a walker lists their directories in
                    shared.shards = sorted(shard for shard in map(self._shard_of, keys) if shard is not None)
            shared.done.set()  # (too many keys: kept as None, each directory lists itself)
        elif not shared.done.wait(LIST_WAIT):
            return None
        return shared if shared.children is not None else None

    def _read_indexes_beside_listing(self) -> None:
        """A sharded array of at most INDEXES_ALONGSIDE shards listed whole for a walker:
        every shard's index is read beside the listing, not after it (the chunk
        directories listed next show inner chunks, which their indexes say), so the
        walk costs one round trip, not two. A shard not stored costs a request answered
        "not found". Nothing waits for these reads: the directories join them. Not with
        `-o cache=`: there the listing's versions let the cache answer each index after
        it, with no request at all."""
        array = self._array
        if array.sharding is None or math.prod(array.storage_grid) > INDEXES_ALONGSIDE or array.caches_ranges:
            return
        shards = list(itertools.product(*(range(n) for n in array.storage_grid)))
        future = asyncio.run_coroutine_threadsafe(self._indexes.load(shards), zarr_private.event_loop())
        future.add_done_callback(lambda done: done.cancelled() or done.exception())  # (retrieved: the reads report)

    def _shards_ahead(self, flat: _SharedListing, reading: set[Coords]) -> list[Coords]:
        """Up to INDEXES_ALONGSIDE shards of the whole array's listing whose indexes no
        directory listing has read yet, besides those `reading` (being read now), taken
        off it with those: each shard is taken once."""
        with self._store_dirs_guard:
            rest = [shard for shard in flat.shards if shard not in reading]
            out, flat.shards = rest[:INDEXES_ALONGSIDE], rest[INDEXES_ALONGSIDE:]
        return out

    def _unshare(self, head: str, shared: _SharedListing) -> None:
        """The listing `shared` is not kept: the view directories waiting for it list
        the store directory themselves."""
        with self._store_dirs_guard:
            if self._store_dirs.get(head) is shared:
                del self._store_dirs[head]
        shared.done.set()

    # -- names listed -> the view directory's entries ---------------------
    @functools.cached_property
    def _leaf_index(self) -> dict[str, int] | None:
        """Chunk file name -> last coordinate, for every name a chunk directory may hold,
        when names are the last coordinate alone and there are few (else None)."""
        grid = self._array.grid_shape
        if not self._leaf_names_are_ints() or grid[-1] > LEAF_INDEX_MAX:
            return None
        return {str(i): i for i in range(grid[-1])}

    def _leaf_names_are_ints(self) -> bool:
        """Whether a chunk file's name in its directory is its last coordinate alone
        (``/``-separated default and v2 keys): listings then decode names with int()."""
        standard = self._array.standard_keys
        return standard is not None and standard[1] == "/" and len(self._array.grid_shape) > 0  # 0-d: key "c"

    def _subdirs(self, depth: int, names: list[str], per_object: tuple[int, ...]) -> DirPage:
        origin, axis_at = self._array.key_layout()
        axis = axis_at.get(depth)
        if axis is None:
            return [(name, None) for name in names if name == origin[depth]]
        span, grid = per_object[axis], self._array.grid_shape[axis]
        out: DirPage = []
        for name in names:
            if canonical_int(name) and int(name) * span < grid:
                first = int(name) * span
                out.extend((str(i), None) for i in range(first, min(first + span, grid)))
        return out

    def _stored_chunks(self, head: str, names: list[str], fixed: Coords) -> DirPage:
        array = self._array
        out: DirPage = []
        index = self._leaf_index
        if index is not None:
            # C-level passes: a listing of a chunk directory is every entry of `ls -lR`
            found = list(map(index.get, names))
            if None not in found:  # every name a chunk of the grid (the usual case)
                n = len(names)
                return list(zip(names, zip(*[itertools.repeat(f, n) for f in fixed], found, strict=True),
                                strict=True))
            return [(name, (*fixed, i)) for name, i in zip(names, found, strict=True) if i is not None]
        if self._leaf_names_are_ints():
            last = array.grid_shape[-1]
            for name in names:
                if name.isascii() and name.isdigit() and (name[0] != "0" or name == "0"):  # canonical_int, inlined
                    i = int(name)
                    if i < last:
                        out.append((name, (*fixed, i)))
            return out
        for name in names:
            coords = array.decode_key(head + name)
            if coords is not None and array.in_grid(coords):
                out.append((name, coords))
        return out

    def _inner_chunks(self, head: str, names: list[str], fixed: Coords,
                      also: Callable[[set[Coords]], list[Coords]] | None = None) -> DirPage:
        """The inner chunks of directory `head` (names: its shards). `also`: other shards
        whose indexes to read alongside theirs if theirs must be read, for the
        directories listed next."""
        array = self._array
        grid = array.grid_shape
        shards = [shard for shard in (self._shard_of(head + name) for name in names) if shard is not None]
        out: DirPage = []
        n = len(fixed)
        # indexes already cached (the ten directories one shard covers read it once)
        # need no trip through zarr's event loop
        indexes = [self._indexes.cached(s) for s in shards]
        if any(index is None for index in indexes):
            more = also(set(shards)) if also is not None else []
            indexes = sync(self._indexes.load(shards + more))[: len(shards)]
        int_names = self._leaf_names_are_ints()
        per_shard = array.chunks_per_shard
        # a directory of the last axis (`/`-separated keys): each shard's slab of the
        # chunk map is taken from bytes made once per shard, in C-level passes with no
        # numpy call. A numpy call on a whole map lets go of the GIL, and each time the
        # listing thread takes it back the event loop waits for it: it cost `ls -lR` of
        # 100,000 inner chunks 0.15 s.
        last_axis = int_names and n == len(per_shard) - 1
        limit = None if last_axis else np.array(grid[n:])
        for shard, index in zip(shards, indexes, strict=True):
            if index is None:
                continue
            base = [s * c for s, c in zip(shard, per_shard, strict=True)]
            # only the slab of the shard the directory's fixed coordinates select
            local = tuple(f - b for f, b in zip(fixed, base, strict=False))
            if not all(0 <= i < c for i, c in zip(local, per_shard, strict=False)):
                continue
            if last_axis:
                span, first = per_shard[-1], base[-1]
                at = 0
                for i, c in zip(local, per_shard, strict=False):
                    at = at * c + i
                at *= span
                present = self._chunk_map_bytes(index)[at : at + span]
                lasts = [j + first for j in itertools.compress(range(span), present)]
                if lasts and lasts[-1] >= grid[-1]:
                    lasts = [j for j in lasts if j < grid[-1]]  # an edge shard, past the grid
                out += zip(map(str, lasts), zip(*[itertools.repeat(f, len(lasts)) for f in fixed], lasts, strict=True), strict=True)
                continue
            found = np.argwhere(index.get_full_chunk_map()[local]) + base[n:]
            found = found[(found < limit).all(axis=1)]
            # hot (100 inner chunks per directory of `ls -lR`): the pairs are built by
            # zip in C, not a Python statement per chunk
            axes = found.T.tolist()  # the free coordinates, axis by axis
            coords = list(zip(*[itertools.repeat(f, len(found)) for f in fixed], *axes, strict=True))
            if int_names:
                out += zip(map(str, axes[-1]), coords, strict=True)
            else:
                out += [(array.chunk_key(c).rsplit("/", 1)[-1], c) for c in coords]
        return out

    def _shard_of(self, key: str) -> Coords | None:
        """The shard that storage key `key` (relative to the array) names, if it lies in
        the grid of shards; else None."""
        shard = self._array.decode_key(key)
        grid = self._array.storage_grid
        if shard is None or len(shard) != len(grid) or not all(0 <= i < g for i, g in zip(shard, grid, strict=True)):
            return None
        return shard

    def _chunk_map_bytes(self, index: Any) -> bytes:
        """Shard index `index`'s chunk map (one byte per inner chunk, C order, nonzero
        where one is stored), made once per index and kept for up to `CHUNK_MAPS_KEPT`
        shards and `CHUNK_MAPS_BYTES` bytes. Only a weak reference to the index's
        array is kept: the index cache alone decides how long an index lives."""
        offsets = index.offsets_and_lengths
        memo = self._chunk_maps
        kept = memo.get(id(offsets))
        if kept is not None and kept[0]() is offsets:  # (an id is reused once its array is gone)
            return kept[1]
        mapped = index.get_full_chunk_map().tobytes()
        if len(mapped) > CHUNK_MAPS_BYTES:
            return mapped
        if len(memo) >= CHUNK_MAPS_KEPT or self._chunk_maps_bytes + len(mapped) > CHUNK_MAPS_BYTES:
            # all at once, not the oldest alone: other listing threads may be adding
            memo.clear()
            self._chunk_maps_bytes = 0
        memo[id(offsets)] = (weakref.ref(offsets), mapped)
        self._chunk_maps_bytes += len(mapped)
        return mapped
