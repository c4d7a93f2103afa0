"""One array's chunk files: their names, which exist, and their bytes, with no FUSE in it.

`ArrayView` answers, for one array of the view: which chunk file a path
names, whether that chunk exists, what a chunk directory lists, and the bytes
of a chunk file (header and decoded values, kept in a `ChunkCache`). The tree
of paths above the arrays is `tree.py`.

Invariants:
- The size of a chunk file comes from metadata alone (the TIFF layout), so
  asking for it never reads chunk data. Knowing *which* chunks exist costs store
  requests for what is looked at only: `exists()` of one chunk is one
  existence check of its key (or its shard's index); `iter_dir()` of a chunk
  directory is one listing of that key prefix (plus the indexes of the shards
  it covers). Answers are kept in the view's bounded caches (`ViewCaches`)
  until evicted or `refresh()`; `known()` and `needs_listing()` say whether
  an answer is already in memory, so callers on an event loop know when to use
  a thread.
- Chunk bytes are the generated header followed by the chunk's values in C
  order, little endian (`bytes` codec order): the same bytes the view's
  dual-access ``zarr.json`` (suffix ``.tiff`` keys, codecs bytes + pad)
  describes. A chunk is decoded once at a time (single flight) and kept in the
  `ChunkCache` until evicted, `forget()` or a refresh of the view.
- Chunks stored raw (`ZarrChunkSource.raw_chunk_path`: the stored object *is*
  the values after the header) need no decoding: `open_stored` opens the
  stored file once, and a `StoredChunkFile` serves the header from memory and
  the values by byte range from that open file, nothing copied or kept here
  (the OS page cache keeps the stored file). Holding the file open is what
  keeps a reader on the bytes it opened: stores replace objects by renaming a
  new file over them, and an open descriptor keeps the old one.
"""

from __future__ import annotations

import base64
import errno
import itertools
import json
import operator
import os
import stat as stat_mod
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zfuse import defaults
from zfuse.errors import CorruptDataError, OutsideStoreError
from zfuse.stats import Stats
from zfuse.view.caches import BoundedLRU, SingleFlight, ViewCaches, owner_ident
from zfuse.view.hierarchy import unsupported_metadata
from zfuse.view.ome_zarr import fitted_ome
from zfuse.view.source import LIST_PAGE, ChunkSource, Coords, DirPage
from zfuse.view.tiff import (
    MAX_FILE_SIZE,
    TiffLayout,
    build_header,
    chunk_file_unsupported_reason,
    plan_layout,
    tiff_unsupported_reason,
    zarr_order_shapes,
)
from zfuse.view.tiff_meta import array_axis_names, image_axes

CHUNK_SUFFIX = ".tiff"
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


@dataclass
class ViewOptions:
    all_chunks: bool = False
    crop_edges: bool = False
    cache_bytes: int = defaults.CACHE_BYTES
    read_only: bool = False
    # directory listings and existence answers kept, in names (~190 bytes each)
    listing_cache_names: int = defaults.LISTING_CACHE_NAMES
    shard_index_cache_bytes: int = defaults.INDEX_CACHE_BYTES
    # the kernel's read-ahead window of the mount: how far past a read it may ask
    read_ahead_bytes: int = defaults.READ_AHEAD_KB * 1024
    # group members held opened across the view, about 15 KB each (None: no bound);
    # past it the groups used least lately forget theirs (`members.OpenedMembers`)
    members_kept: int | None = defaults.MEMBERS_KEPT
    # written values stored as an array's lossy codecs make them (else refused: EINVAL)
    lossy_writes: bool = False


# preadv2(RWF_NOWAIT): a read that only takes what the OS page cache holds (Linux)
RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


class _Descriptors:
    """How many stored files open chunk files hold open: at most half of the daemon's
    descriptor limit, so that a reader holding thousands of chunk files open never
    leaves the daemon without descriptors for writes (beyond it, chunks are decoded)."""

    def __init__(self) -> None:
        self.open = 0
        self.lock = threading.Lock()
        self.limit: int | None = None

    def bound(self) -> int:
        if self.limit is None:
            import resource

            self.limit = max(16, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2)
        return self.limit

    def take(self) -> bool:
        with self.lock:
            if self.open >= self.bound():
                return False
            self.open += 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.open -= 1


_DESCRIPTORS = _Descriptors()


def stored_files_bound() -> int:
    """How many stored files chunk files may hold open at once (then they are decoded)."""
    return _DESCRIPTORS.bound()


def advise_willneed_fd(fd: int) -> bool:
    """Ask the OS to read the file open as `fd` into its page cache in the background
    (posix_fadvise WILLNEED); `fd` is closed. True."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


class StoredChunkFile:
    """One open chunk file of a chunk stored raw: the header from memory, the values by
    byte range from the stored file, which this keeps open (see the module docstring).

    Several open files may share one (`retain`; each `close` gives one back).

    `read_nowait` takes only what the OS page cache holds and never waits for the
    disk (preadv2 with RWF_NOWAIT), so an event loop may call it; `read` may wait.
    Both answer None once the file is closed (a reload reopened it: the caller
    reads from what replaced it). Every read fills a buffer of its own. `close`
    waits for reads in flight: a descriptor is never closed under a read (its
    number could name another file by then).
    """

    __slots__ = ("array", "coords", "size", "header_size", "identity", "error", "_header", "_fd",
                 "_users", "_holders", "_closing", "_slot", "_lock", "_got", "_nowait")

    def __init__(self, array: ArrayView, coords: Coords, identity: tuple[int, ...], *, fd: int = -1,
                 error: str | None = None) -> None:
        assert array.layout is not None
        self.array, self.coords = array, coords
        self.size = array.layout.file_size  # the chunk file's: header + values
        self.header_size = array.layout.header_size
        self.identity = identity  # (device, inode, size, mtime) of the stored file
        self.error = error  # what is wrong with the stored file: reads of values fail
        self._header: bytes | None = None  # built at the first read of it
        self._fd = fd  # (-1 with an error)
        self._slot = error is None  # holds one of _DESCRIPTORS (taken by the ArrayView)
        self._got = False  # values read from the store yet (counted as one store get)
        self._users = 0  # reads in flight
        self._holders = 1  # open files (and the like) sharing this one
        self._closing = False
        self._lock = threading.Lock()
        # RWF_NOWAIT until the stored file's filesystem says it has no such read (then
        # worker threads read this file): a flag of this object, no global changed
        self._nowait = RWF_NOWAIT

    def retain(self) -> StoredChunkFile | None:
        """This one for one more holder, or None if it is closed already."""
        with self._lock:
            if self._closing:
                return None
            self._holders += 1
            return self

    def read_nowait(self, offset: int, size: int) -> bytes | bytearray | None:
        """Bytes [offset, offset+size) if the page cache holds them, else None."""
        if not self._nowait:
            return None
        try:
            return self._read(offset, size, self._nowait)
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._nowait = 0  # this kernel or filesystem has no such read: worker threads read
            return None

    def read(self, offset: int, size: int) -> bytes | bytearray | None:
        """Bytes [offset, offset+size) (blocking); None if closed."""
        return self._read(offset, size, 0)

    @property
    def header(self) -> bytes:
        if self._header is None:
            self._header = self.array.header(self.coords)
        return self._header

    def _read(self, offset: int, size: int, flags: int) -> bytes | bytearray | None:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        hsize = self.header_size
        if end <= hsize:
            return self.header[offset:end]
        if self.error is not None:
            raise CorruptDataError(self.error)
        out = bytearray(end - offset)
        if offset < hsize:
            out[: hsize - offset] = self.header[offset:]
        start = max(offset, hsize)
        want = end - start
        with self._lock:
            if self._closing:
                return None
            fd = self._fd
            self._users += 1
        try:
            got = os.preadv(fd, [memoryview(out)[start - offset :]], start - hsize, flags)
        finally:
            self._done_with()
        if got != want:
            if flags:
                return None  # partly in the page cache (or short: the blocking read says)
            raise CorruptDataError(
                f"{self.array.key_name(self.coords)}: the stored chunk ended after {start - hsize + got} of "
                f"its {self.size - hsize} bytes (rewritten in place while open?)")
        stats = self.array.stats
        if not self._got:
            self._got = True
            stats.count("store_get_chunk")
        stats.count("store_bytes_chunk", got)
        return out

    def _done_with(self) -> None:
        with self._lock:
            self._users -= 1
            if self._closing and not self._users:
                self._finish()

    def close(self) -> None:
        """One holder less; the last one closes the stored file (once no read is in flight)."""
        with self._lock:
            self._holders -= 1
            if self._holders > 0 or self._closing:
                return
            self._closing = True
            if not self._users:
                self._finish()

    def _finish(self) -> None:
        """(Under the lock, closing, no reads in flight.)"""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._slot:
            self._slot = False
            _DESCRIPTORS.give_back()

    def __del__(self) -> None:  # a holder dropped without closing (a FileSystem discarded)
        if getattr(self, "_fd", -1) >= 0 or getattr(self, "_slot", False):
            self._finish()


class ChunkCache(BoundedLRU):
    """A bounded LRU of decoded chunk bytes, keyed by (array id, coords), costed in
    bytes; counts its hits and misses for `.zfuse/stats`."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.hits = 0
        self.misses = 0

    @property
    def max_bytes(self) -> int:
        return self.max_cost

    def get(self, key: Hashable) -> Any:
        data = super().get(key)
        if data is None:
            self.misses += 1  # (an unlocked += : counters for stats, never decisions)
        else:
            self.hits += 1
        return data

    def contains(self, key: Hashable) -> bool:
        return self.has(key)

    def peek(self, key: Hashable) -> bytes | None:
        """A cache hit without a miss being counted (the caller falls back to `get`)."""
        data = super().get(key)
        if data is not None:
            self.hits += 1
        return data  # type: ignore[no-any-return]

    def put(self, key: Hashable, data: Any, cost: int | None = None) -> bool:
        return super().put(key, data, len(data) if cost is None else cost)

    def drop(self, key: Hashable) -> None:
        self.pop(key)


class _Dir:
    """One listed directory of an array: view name -> chunk coords, or None for a subdirectory."""

    __slots__ = ("generation", "children")

    def __init__(self, generation: int, children: dict[str, Coords | None]) -> None:
        self.generation = generation
        self.children = children


_DIR, _CHUNK = 0, 1  # cache key kinds: (array's ident, kind, path or coords)


class ArrayView:
    """One array's directory: its view metadata and its chunk files."""

    def __init__(
        self,
        source: ChunkSource,
        options: ViewOptions,
        cache: ChunkCache,
        ome: dict[str, Any] | None = None,
        stats: Stats | None = None,
        caches: ViewCaches | None = None,
    ) -> None:
        self.source = source
        # what this view's entries in the shared caches are keyed by (never reused)
        self.ident = owner_ident()
        self.options = options
        self.cache = cache
        ome = fitted_ome(ome, len(source.shape))
        self.ome = ome  # OME-Zarr axes, units and scales, from the multiscale that names it
        self.stats = stats or Stats()
        self.caches = caches or ViewCaches(options.listing_cache_names, options.shard_index_cache_bytes, stats)
        source.use_index_cache(self.caches.indexes)
        #: the axis names the files follow: OME-Zarr's, else the array's dimension names
        #: (or an RGB image's guessed y, x, c: `array_axis_names`)
        self.axes: list[str] | None = (ome or {}).get("axes") or array_axis_names(
            source.shape, source.dimension_names())
        self.unsupported: str | None = tiff_unsupported_reason(source.dtype)
        if self.unsupported is None:
            self.unsupported = chunk_file_unsupported_reason(
                source.chunk_shape, source.dtype, image_axes(len(source.shape), self.axes))
        if self.unsupported is None:
            self.unsupported = source.unbounded_reason()
        index_nbytes = source.shard_index_nbytes()
        index_max = max(options.shard_index_cache_bytes, defaults.INDEX_CACHE_BYTES)
        if self.unsupported is None and index_nbytes is not None and index_nbytes > index_max:
            # never kept: every listing and read of a shard would read its index whole again
            # (a crafted 100-byte shard of 2**40 inner chunks: an index of 16 TiB). A smaller
            # cache than the default hides nothing: it only keeps fewer indexes.
            self.unsupported = (f"each shard's index is {index_nbytes} bytes, more than the shard index "
                                f"cache holds ({index_max} bytes; mount with -o index_cache_size=SIZE "
                                "to show it)")
        self.layout: TiffLayout | None = None
        if self.unsupported is None:
            ome = ome or {}
            self.layout = plan_layout(
                source.chunk_shape,
                source.dtype,
                axes=self.axes,
                axis_types=ome.get("axis_types"),
                scales=ome.get("scales"),
                units=ome.get("units"),
                grid_shape=source.grid_shape,
                array_shape=source.shape,
            )
            if self.layout.file_size > MAX_FILE_SIZE:  # the header pushed it past: no st_size holds it
                self.unsupported = (f"chunk files of {self.layout.file_size} bytes: past the largest "
                                    f"file size ({MAX_FILE_SIZE} bytes, 2**63 - 1)")
                self.layout = None
        # Cached answers carry the generation they were made in; `refresh` moves on
        # to a new one. Old answers are not cleared: a lookup racing with the refresh
        # still finds them (never a false ENOENT), and the LRU ages them out.
        self._generation = 0
        self._listing_changes = 0  # chunks added/removed: a listing that raced with one is not kept
        self._lock = threading.Lock()
        self._decoding = SingleFlight()  # chunks being decoded
        self._data_changes = 0  # chunks written or deleted through the view (`data_version`)
        # chunk files served from their stored files (`open_stored`); None while only the
        # first open can tell (whether there are storage transformers may need zarr.json)
        self.serves_stored: bool | None = (
            None if self.layout is not None and not self.layout.permuted and source.may_store_raw() else False)
        self._metadata_bytes: bytes | None = None  # (`metadata_bytes`: made when first read)

    # -- names ------------------------------------------------------------
    def file_parts(self, coords: Coords) -> tuple[str, ...]:
        return tuple((self.source.chunk_key(coords) + CHUNK_SUFFIX).split("/"))

    def key_name(self, coords: Coords) -> str:
        """The chunk's store key with the array's path, for messages (``arr/c/0/1``)."""
        key = self.source.chunk_key(coords)
        named = f"{self.source.name}/{key}" if self.source.name else key
        parts = getattr(self.source, "part_key_names", None)  # (a concatenation: its sources' keys)
        if parts is not None and self.source.in_grid(coords):
            return f"{named} ({'; '.join(parts(coords))})"
        return named

    def coords_of(self, parts: tuple[str, ...]) -> Coords | None:
        """The chunk a file path names, if it names one inside the grid."""
        if not parts or not parts[-1].endswith(CHUNK_SUFFIX):
            return None
        key = "/".join(parts)[: -len(CHUNK_SUFFIX)]
        return self._decode_key(key)

    def _decode_key(self, key: str) -> Coords | None:
        coords = self.source.decode_key(key)
        if coords is None or not self.source.in_grid(coords):
            return None
        return coords

    # -- what exists (bounded caches; store I/O only for what is asked) -----
    def _listed(self, rest: tuple[str, ...]) -> _Dir | None:
        """Directory `rest` as listed in the current generation, if it is in memory."""
        listed = self.caches.names.get((self.ident, _DIR, rest))
        return listed if listed is not None and listed.generation == self._generation else None

    def listed_names(self, rest: tuple[str, ...]) -> tuple[list[str], bool | None] | None:
        """Directory `rest`'s names (listing order) if its listing is in memory, and
        whether every one is a chunk file (True), every one a subdirectory (False), or
        either (None). From memory only; C-level passes."""
        listed = self._listed(rest)
        if listed is None:
            return None
        with self._lock:  # writes update listed directories in place
            names = list(listed.children)
            found = list(listed.children.values())
        subdirs = found.count(None)
        return names, (True if not subdirs else False if subdirs == len(found) else None)

    def known(self, coords: Coords) -> bool | None:
        """Whether chunk `coords` exists, from memory only; None when unknown."""
        if self.options.all_chunks:
            return self.source.in_grid(coords)
        parts = self.file_parts(coords)
        listed = self._listed(parts[:-1])
        if listed is not None:
            return parts[-1] in listed.children
        answer = self.caches.names.get((self.ident, _CHUNK, coords))
        if answer is not None and answer[0] == self._generation:
            return answer[1]
        return None

    def exists(self, coords: Coords) -> bool:
        """Whether chunk `coords` exists: from memory, else one existence check
        (store I/O: worker thread, unless `known()` is not None)."""
        answer = self.known(coords)
        if answer is None:
            generation = self._generation
            answer = self.source.chunk_exists(coords)
            self.stats.count("chunk_checks")
            self.caches.names.put((self.ident, _CHUNK, coords), (generation, answer))
        return answer

    @property
    def listing_version(self) -> tuple[int, int]:
        """Changes to what this array's listings show (a refresh, a chunk added or
        removed through the view): an answer taken at the same version is current."""
        return self._generation, self._listing_changes

    def needs_listing(self, rest: tuple[str, ...]) -> bool:
        """Whether listing directory `rest` inside the array needs store I/O; False means
        the listing is in memory (or there is nothing to list). Whether one chunk exists
        is `known()`, None when not in memory."""
        if self.layout is None:
            return False
        return self.is_key_prefix(rest) and self._listed(rest) is None

    def iter_dir(self, rest: tuple[str, ...]) -> Iterator[list[tuple[str, Coords | None]]]:
        """Pages of directory `rest`: (file name, coords) for chunk files, (name, None)
        for subdirectories. From memory if listed, else one listing of that directory
        (store I/O), kept when complete and within the cache bound."""
        if self.layout is None or not self.is_key_prefix(rest):
            return
        listed = self._listed(rest)
        if listed is not None:
            with self._lock:  # writes update listed directories in place
                items = list(listed.children.items())
            for i in range(0, len(items), LIST_PAGE):
                yield items[i : i + LIST_PAGE]
            return
        generation, changes = self._generation, self._listing_changes
        limit = self.caches.names.max_cost
        children: dict[str, Coords | None] | None = {}
        pages = self._grid_pages(rest) if self.options.all_chunks else self.source.iter_chunk_dir(rest)
        for page in pages:
            self.stats.count("listing_pages")
            if all(map(_SECOND, page)):  # chunk files only (C-level: every entry of `ls -lR`)
                items = list(zip(map(operator.add, map(_FIRST, page), itertools.repeat(CHUNK_SUFFIX)), map(_SECOND, page), strict=True))
            else:
                items = [(name + CHUNK_SUFFIX, c) if c is not None else (name, None) for name, c in page]
            if children is not None:
                children.update(items)
                if len(children) >= limit:
                    children = None  # bigger than the whole cache: streamed, not kept
            yield items
        with self._lock:
            if children is not None and changes == self._listing_changes:
                self.caches.names.put((self.ident, _DIR, rest), _Dir(generation, children), len(children) + 1)

    def _grid_pages(self, rest: tuple[str, ...]) -> Iterator[DirPage]:
        """--all-chunks: every grid position under `rest`, from the grid alone."""
        fixed = self.source.dir_coords(rest)
        if fixed is None:
            return
        origin, axis_at = self.source.key_layout()
        grid = self.source.grid_shape
        depth = len(rest)
        if depth < len(origin) - 1:
            axis = axis_at.get(depth)
            names = [origin[depth]] if axis is None else [str(i) for i in range(grid[axis])]
            for i in range(0, len(names), LIST_PAGE):
                yield [(name, None) for name in names[i : i + LIST_PAGE]]
            return
        tails = itertools.product(*(range(g) for g in grid[len(fixed) :]))
        while True:
            page: DirPage = []
            for tail in itertools.islice(tails, LIST_PAGE):
                coords = (*fixed, *tail)
                page.append((self.source.chunk_key(coords).rsplit("/", 1)[-1], coords))
            if not page:
                return
            yield page

    def refresh(self) -> None:
        """Forget what exists (listings, existence answers, shard indexes)."""
        with self._lock:
            self._generation += 1
        self.source.invalidate()

    def add_chunk(self, coords: Coords) -> None:
        """A chunk was stored: listed directories on its path show it."""
        parts = self.file_parts(coords)
        names = self.caches.names
        with self._lock:
            self._listing_changes += 1
            names.put((self.ident, _CHUNK, coords), (self._generation, True))
            for depth in range(len(parts) - 1, -1, -1):
                listed = self._listed(parts[:depth])
                if listed is None:
                    continue
                name = parts[depth]
                if name in listed.children:
                    continue
                listed.children[name] = coords if depth == len(parts) - 1 else None
                names.update((self.ident, _DIR, parts[:depth]), listed, len(listed.children) + 1)

    def remove_chunk(self, coords: Coords) -> None:
        """A chunk was deleted: listed directories drop it (and directories it emptied)."""
        if self.options.all_chunks:
            return  # every grid position stays listed; a missing one reads as fill
        parts = self.file_parts(coords)
        names = self.caches.names
        with self._lock:
            self._listing_changes += 1
            names.put((self.ident, _CHUNK, coords), (self._generation, False))
            for depth in range(len(parts) - 1, -1, -1):
                listed = self._listed(parts[:depth])
                if listed is None or listed.children.pop(parts[depth], ...) is ...:
                    break
                names.update((self.ident, _DIR, parts[:depth]), listed, len(listed.children) + 1)
                if listed.children or depth == 0:
                    break
                # emptied: the parent's listing drops this directory too (as a re-listing would)

    def successors(self, coords: Coords, count: int) -> list[Coords]:
        """The next `count` chunks after `coords` in C order that exist or may exist
        (read-ahead; memory only: chunks known to be missing are skipped, chunks not
        listed or checked yet are included, and read as fill if they are missing)."""
        grid = self.source.grid_shape
        out: list[Coords] = []
        current = list(coords)
        for _ in range(count * 4):  # skip a few missing positions, not the whole grid
            for axis in range(len(grid) - 1, -1, -1):
                current[axis] += 1
                if current[axis] < grid[axis]:
                    break
                current[axis] = 0
            else:
                return out
            candidate = tuple(current)
            if self.known(candidate) is not False:
                out.append(candidate)
                if len(out) == count:
                    break
        return out

    def count_files(self) -> int:
        """Chunk files in the whole array (`zfuse info`): walks every directory."""
        total = 0
        stack: list[tuple[str, ...]] = [()]
        while stack:
            rest = stack.pop()
            for page in self.iter_dir(rest):
                for name, coords in page:
                    if coords is None:
                        stack.append((*rest, name))
                    else:
                        total += 1
        return total

    def is_cached(self, coords: Coords) -> bool:
        return self.cache.contains((self.ident, coords))

    @property
    def fetches_remotely(self) -> bool:
        """Whether its chunks come from a remote store, fetched ahead by `fetch_ahead`."""
        return self.source.fetches_remotely

    def fetch_ahead(self, coords: Sequence[Coords]) -> None:
        """Start fetching the stored bytes of these chunks (those not decoded and cached
        already) for the reads to come; returns at once (the fetches run on zarr's
        event loop, not on a thread each)."""
        self.source.fetch_ahead(coords, skip=self.is_cached)

    def is_key_prefix(self, parts: tuple[str, ...]) -> bool:
        """Whether `parts` is a directory some chunk key of the grid would live in."""
        return self.source.dir_coords(parts) is not None

    # -- what a file written for a chunk may hold ----------------------------
    def stored_shapes(self, coords: Coords) -> list[tuple[int, ...]]:
        """The chunk's shape, and its cropped shape if it is an edge chunk (chunk order)."""
        full = tuple(self.source.chunk_shape)
        cropped = tuple(r.stop - r.start for r in self.source.chunk_region(coords))
        return [full] if cropped == full else [full, cropped]

    def written_shapes(self, coords: Coords, data: bytes | bytearray | memoryview) -> list[tuple[int, ...]]:
        """The shapes a file written for the chunk may have, in the chunk file's axis
        order (its pages, rows and columns are checked against them), and in zarr's
        order where the file says it holds one (`tiff.zarr_order_shapes`:
        `tifffile.imwrite(path, chunk)`). Every way a file reaches a chunk (close,
        truncate, a rename onto it) is checked against these."""
        shapes = self.stored_shapes(coords)
        if self.layout is None:
            return shapes
        return [self.layout.file_shape(s) for s in shapes] + zarr_order_shapes(self.layout, shapes, data)

    # -- bytes ------------------------------------------------------------
    def file_size(self, coords: Coords) -> int:
        assert self.layout is not None
        if self.options.crop_edges:
            region = self.source.chunk_region(coords)
            n = int(np.prod([r.stop - r.start for r in region])) * self.source.dtype.itemsize
            return self.layout.header_size + n
        return self.layout.file_size

    def header(self, coords: Coords) -> bytes:
        assert self.layout is not None
        region = self.source.chunk_region(coords)
        origin = tuple(r.start for r in region)
        if self.options.crop_edges:
            shape = tuple(r.stop - r.start for r in region)
            if shape != tuple(self.source.chunk_shape):
                return build_header(self.layout, coords, shape=shape, origin=origin)
        return build_header(self.layout, coords, origin=origin)

    def pixel_bytes(self, coords: Coords) -> memoryview:
        """The chunk's values as stored after the header (decoded once, then cached)."""
        assert self.layout is not None
        return self.file_bytes(coords)[self.layout.header_size :]

    def cached_pixels(self, coords: Coords) -> memoryview | None:
        """`pixel_bytes` if the chunk is decoded already (no I/O), else None."""
        assert self.layout is not None
        data = self.cache.peek((self.ident, coords))
        return None if data is None else memoryview(data).toreadonly()[self.layout.header_size :]

    def file_bytes(self, coords: Coords) -> memoryview:
        """The whole chunk file, header and values, read-only (decoded once, then cached).

        The cache holds each file as one buffer, so a read of any range is a
        slice of it: no bytes are copied between decoding and the FUSE reply.
        """
        key = (self.ident, coords)
        data = self.cache.get(key)
        if data is not None:
            return memoryview(data).toreadonly()
        # Single flight: the kernel reads one file in several concurrent
        # requests; only the first decodes, the others wait for it.
        with self._decoding.turn(coords):
            data = self.cache.get(key)
            if data is not None:
                return memoryview(data).toreadonly()
            changes = self._data_changes
            data = self._decode(coords)
            # a chunk written (forget) while this decode read the store may have
            # been read before the write: serve it to this caller, never cache it
            if self._data_changes == changes:
                self.cache.put(key, data)
            return memoryview(data).toreadonly()

    def _decode(self, coords: Coords) -> bytes:
        assert self.layout is not None
        started = time.perf_counter()
        # a chunk we listed must still be there; with --all-chunks missing is fill
        must_exist = not self.options.all_chunks and self.known(coords) is True
        values = self.source.read_chunk(coords, must_exist=must_exist)
        self.stats.count("chunks_decoded")
        self.stats.count("decode_seconds", time.perf_counter() - started)
        if self.options.crop_edges:
            region = self.source.chunk_region(coords)
            values = values[tuple(slice(0, r.stop - r.start) for r in region)]
        return chunk_file(self.header(coords), self.layout.to_file_order(values), self.source.dtype)

    def read_cached(self, coords: Coords, offset: int, size: int) -> bytes | memoryview | None:
        """Like `read` but only from memory; None when the chunk must be decoded."""
        assert self.layout is not None
        hsize = self.layout.header_size
        end = min(offset + size, self.file_size(coords))
        if offset >= end:
            return b""
        if end <= hsize:
            return self.header(coords)[offset:end]
        data = self.cache.peek((self.ident, coords))
        return None if data is None else memoryview(data).toreadonly()[offset:end]

    def read(self, coords: Coords, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of the chunk file (may decode: worker thread)."""
        assert self.layout is not None
        end = min(offset + size, self.file_size(coords))
        if offset >= end:
            return b""
        if end <= self.layout.header_size:
            return self.header(coords)[offset:end]
        return self.file_bytes(coords)[offset:end]

    # -- chunks stored raw: served from their stored files ------------------------
    def _raw_path(self, coords: Coords) -> str | None:
        """The stored file whose bytes are chunk `coords`'s file after the header, if
        the array stores chunks raw (blocking the first time: `serves_stored`)."""
        if self.serves_stored is False:
            return None
        path = self.source.raw_chunk_path(coords)
        self.serves_stored = path is not None
        if path is not None and self.options.crop_edges and self.file_size(coords) != self.layout.file_size:
            return None  # a cropped edge chunk: not the stored bytes
        return path

    def open_stored(self, coords: Coords, advise: bool = False) -> StoredChunkFile | None:
        """Chunk `coords`'s file served from its stored file, or None: the array does
        not store chunks raw, or nothing is stored (fill value: decoded). A stored
        object that is not the size of the values gives a file whose header reads
        and whose values fail (CorruptDataError naming the key and both sizes). With
        `advise` the OS starts reading the values in now (posix_fadvise WILLNEED).

        Blocking: opens the stored file. An event loop may call it for a chunk whose
        file was opened lately (`advise_ahead`): its name is cached, no disk waits."""
        assert self.layout is not None
        path = self._raw_path(coords)
        if path is None or not _DESCRIPTORS.take():
            return None
        fd, st = -1, None
        try:
            # inside the store only (a link out of it: refused, then decoding reports it)
            fd = self.source.open_raw_chunk(coords)
            st = os.fstat(fd)
            if stat_mod.S_ISREG(st.st_mode) and st.st_size == self.layout.data_size:
                if advise:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                self.stats.count("chunks_passed_through")
                return StoredChunkFile(self, coords, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), fd=fd)
        except (OSError, OutsideStoreError):
            st = None  # not stored, not readable, or leading out of the store: decoding reports what it is
        if fd >= 0:
            os.close(fd)
        _DESCRIPTORS.give_back()
        if st is None or not stat_mod.S_ISREG(st.st_mode):
            return None
        # truncated, or not what the metadata says
        why = (f"{self.key_name(coords)}: the stored chunk has {st.st_size} bytes, not the "
               f"{self.layout.data_size} of its {self.source.dtype} values (codec bytes): truncated or corrupt")
        return StoredChunkFile(self, coords, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), error=why)

    def advise_ahead(self, coords: Coords) -> bool:
        """Ask the OS to read chunk `coords`'s stored file in (posix_fadvise WILLNEED, in
        the background: nothing is read or kept here), so opening and reading it later
        waits on no disk. Blocking (opens it); False when no such file is stored."""
        if self._raw_path(coords) is None:
            return False
        return self.advise_stored(coords)

    def advise_stored(self, coords: Coords) -> bool:
        """`advise_ahead` of a chunk's stored file, however it is stored (whole-image
        tiles read ahead): opened inside the store only, never a link swapped in that
        leads out of it. False when no such file is stored, or it is refused."""
        try:
            fd = self.source.open_raw_chunk(coords)
        except (OSError, OutsideStoreError):
            return False  # not stored, or refused: the read says which
        return advise_willneed_fd(fd)

    def forget(self, coords: Coords) -> None:
        self.cache.drop((self.ident, coords))
        self._data_changes += 1  # whole-image files with stored byte counts re-plan

    @property
    def data_version(self) -> int:
        """Changes whenever a chunk's stored values may have changed through the view (a
        write or deletion): what was built from chunks before (whole-image tiles, byte
        counts) is not served after."""
        return self._data_changes

    # -- changes through the view (blocking: worker threads) -----------------
    def store_values(self, coords: Coords, values: np.ndarray, *, lossy: bool = False) -> None:
        """Store chunk `coords`'s values (`ChunkSource.write_chunk`), then drop what was
        decoded of it, even when the write failed (it may have landed: what is stored is
        read anew), and list it once stored."""
        try:
            self.source.write_chunk(coords, values, lossy=lossy)
        finally:
            self.forget(coords)
        self.add_chunk(coords)

    def delete_stored(self, coords: Coords) -> None:
        """Delete chunk `coords` from the store, then drop what was decoded of it (even
        when the deletion failed) and its name from listings."""
        try:
            self.source.delete_chunk(coords)
        finally:  # (a failed deletion may have changed some of it: a concatenation's parts)
            self.forget(coords)
        self.remove_chunk(coords)

    # -- metadata -----------------------------------------------------------
    @property
    def metadata_bytes(self) -> bytes:
        """The view's `zarr.json`, made when first read: a third of what opening an array
        costs (pretty-printed JSON), and most arrays of a big store are only walked past.
        (Two threads may both make it: the same bytes.)"""
        data = self._metadata_bytes
        if data is None:
            data = self._metadata_bytes = self._view_metadata()
        return data

    def _view_metadata(self) -> bytes:
        """The view's dual-access zarr.json: chunks are `.tiff` keys holding bytes + pad."""
        if self.layout is None:
            # no chunk files: the array's own metadata, and why it has no TIFF form
            return unsupported_metadata(self.source.stored_form(), self.unsupported or "")
        meta = dict(self.source.v3_metadata())
        meta.pop("storage_transformers", None)
        meta["chunk_grid"] = {
            "name": "regular",
            "configuration": {"chunk_shape": list(self.source.chunk_shape)},
        }
        meta["chunk_key_encoding"] = {
            "name": "suffix",
            "configuration": {
                "suffix": CHUNK_SUFFIX,
                "base_encoding": self.source.key_encoding_dict(),
            },
        }
        first = build_header(self.layout, tuple(0 for _ in self.source.shape))
        bytes_codec: dict[str, Any] = {"name": "bytes"}
        if self.source.dtype.itemsize > 1 and self.source.dtype.kind != "b":
            bytes_codec["configuration"] = {"endian": "little"}
        # pages in ImageJ's order (c, z, t) for a chunk stored t, c, z: the standard
        # transpose codec says so, and zarr reads the files exactly
        transpose = ([{"name": "transpose", "configuration": {"order": list(self.layout.file_axes)}}]
                     if self.layout.permuted else [])
        meta["codecs"] = [
            *transpose,
            bytes_codec,
            {
                "name": "pad",
                "configuration": {
                    "location": "start",
                    "nbytes": self.layout.header_size,
                    # the first chunk's header: zarr-python writing through the
                    # mount then produces valid TIFFs (the position tag is ignored)
                    "padding": base64.b64encode(first).decode("ascii"),
                },
            },
        ]
        return json.dumps(meta, indent=2).encode()


def chunk_file(header: bytes, values: np.ndarray, dtype: np.dtype) -> bytes:
    """A chunk file: `header`, then `values` in C order, little-endian (booleans as
    one byte), as the `bytes` codec and the TIFF header say. Built in one buffer
    with one copy of the values (no intermediate bytes object)."""
    out = bytearray(len(header) + values.size * (1 if dtype.kind == "b" else dtype.itemsize))
    out[: len(header)] = header
    stored = np.dtype(np.uint8) if dtype.kind == "b" else dtype.newbyteorder("<")
    np.frombuffer(out, dtype=stored, offset=len(header)).reshape(values.shape)[...] = values
    return out  # type: ignore[return-value]  # a bytearray, handed out as read-only views
