"""Chunk sources: one array as the view sees it, a grid of decoded chunks.

A `ChunkSource` knows nothing of TIFF or FUSE. It answers, for one array:
which chunks exist, the decoded values of one chunk (always the full chunk
shape, the part outside the array filled with the fill value, as Zarr stores
edge chunks), and how to write or delete one chunk. For sharded arrays (the
`sharding_indexed` codec) the chunks are the *inner* chunks.

Every method here may do store I/O and decoding: callers on an event loop run
them in worker threads. Methods are thread-safe; writes to chunks that share a
storage object (a shard) are serialised by a per-object lock so no concurrent
read-modify-write loses another's update.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import math
import os
import stat as stat_mod
import threading
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.codecs.sharding import ShardingCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_key_encodings import V2ChunkKeyEncoding
from zarr.core.sync import sync
from zarr.storage import StorePath

from zfuse.conditional import retry_lost_races
from zfuse.errors import CorruptDataError, OutsideStoreError
from zfuse.ext import zarr_private
from zfuse.ext.chunk_keys import ChunkKeyDecoder, standard_layout
from zfuse.view import bounded_decode
from zfuse.view.caches import BoundedLRU
from zfuse.view.fetch_ahead import MISSED, FetchAhead, coalesce

log = logging.getLogger("zfuse.view")
Coords = tuple[int, ...]
LIST_PAGE = 1000  # names taken from a store listing at a time (S3 returns 1000 per LIST page)
DEFAULT_INDEX_CACHE_BYTES = 64 * 1024 * 1024
FETCH_CONCURRENCY = 16  # requests in flight at once for one batch of chunks fetched ahead
LEAF_INDEX_MAX = 4096  # chunks along the last axis up to which listings decode names by a dict
DirPage = list[tuple[str, Coords | None]]  # (key name, chunk coords) or (directory name, None)
DIR_COORDS_KEPT = 16384  # chunk-key directories whose coordinates are remembered
CHUNK_MAPS_KEPT = 64  # shards whose chunk map is kept as bytes for listings (one byte per inner chunk)
CHUNK_MAPS_BYTES = 16 * 1024 * 1024  # and at most this many bytes of them
SHARD_AHEAD_CHUNKS = 64  # shards of at most this many inner chunks are fetched ahead whole
SHARD_DIRS_KEPT = 64  # remote store directories of shards kept listed (`_shard_dir_names`)
SHARD_DIR_NAMES = 100_000  # at most, names kept per such directory
LIST_WAIT = 60.0  # seconds a listing waits for the same directory's listing under way
# a remote array of at most this many storage objects (one LIST page of S3) is listed
# whole, in one request, when a walker lists a directory above its chunks
FLAT_LISTING_OBJECTS = 1000
FLAT_LISTING_KEYS = 2 * FLAT_LISTING_OBJECTS  # keys read at most (strays too) before giving up
INDEXES_ALONGSIDE = 64  # shard indexes read along with a listed directory's, at most
_FLAT = "\0flat"  # `_store_dirs` key of the whole array's listing (no store directory's name)
_UNKNOWN = object()


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


def _canonical_int(name: str) -> bool:
    # ASCII only: str.isdigit and int() also take other scripts' digits ("١", "１")
    return name.isascii() and name.isdigit() and (name == "0" or name[0] != "0")


@dataclass(frozen=True)
class StoreAccess:
    """What a store stack offers beyond zarr's Store API, found once per source by
    `store_access` (never probed again with isinstance or getattr):

    - `local`: zfuse's metered store over a local directory, reached through nothing
      but transformer stores, whose synchronous methods read and write in the
      calling thread (`get_local`, `exists_local`, `list_dir_local`, `set_local`);
    - `root`: the directory of the local store under every wrapper;
    - `files`: zfuse's own local store under every wrapper, whose `open_key` and
      `stat_key` open stored files inside the store only;
    - `remote`: the store under every wrapper is a remote one (fsspec: S3, HTTP, GCS),
      whose requests each wait a round trip: chunks are fetched ahead of readers;
    - `metered`: zfuse's metered store of a remote source (`forget_version`: a shard
      another host rewrote is read afresh), reached through nothing but transformer
      stores.
    """

    local: Any = None
    root: str | None = None
    files: Any = None
    remote: bool = False
    metered: Any = None


def store_access(store: Any) -> StoreAccess:
    """The `StoreAccess` of a store stack (its wrappers walked once)."""
    from zarr.storage import FsspecStore, LocalStore

    from zfuse.ext.open_memo import OpenMemo
    from zfuse.ext.transformers import TransformerStore
    from zfuse.store import AtomicLocalStore, MeteredStore

    inner = store
    # transformer stores pass keys through unless transformers; OpenMemo passes all
    while isinstance(inner, (TransformerStore, OpenMemo)):
        inner = zarr_private.wrapped_store(inner)
    local = inner if isinstance(inner, MeteredStore) and inner.local_root is not None else None
    metered = inner if isinstance(inner, MeteredStore) and inner.remote is not None else None
    while isinstance(inner, (TransformerStore, MeteredStore, OpenMemo)):
        inner = zarr_private.wrapped_store(inner)
    root = str(inner.root) if type(inner) in (LocalStore, AtomicLocalStore) else None
    return StoreAccess(local=local, root=root, files=inner if type(inner) is AtomicLocalStore else None,
                       remote=isinstance(inner, FsspecStore), metered=metered)


class ChunkSource(ABC):
    """One array as a grid of chunks (inner chunks for sharded arrays)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    fill_value: Any

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunk_shape, strict=True))

    def list_chunk_keys(self) -> list[tuple[Coords, str]]:
        """Existing chunks with their keys (sources that list keys avoid re-encoding)."""
        return [(c, self.chunk_key(c)) for c in self.list_chunks()]

    def chunk_region(self, coords: Coords) -> tuple[slice, ...]:
        """The part of the array chunk `coords` covers, clipped to the array bounds."""
        return tuple(
            slice(i * c, min((i + 1) * c, n))
            for i, c, n in zip(coords, self.chunk_shape, self.shape, strict=True)
        )

    def in_grid(self, coords: Coords) -> bool:
        grid = self.grid_shape
        return len(coords) == len(grid) and all(0 <= i < g for i, g in zip(coords, grid, strict=True))

    def full_chunk(self, clipped: np.ndarray) -> np.ndarray:
        """Pad a clipped edge chunk to the full chunk shape with the fill value."""
        if clipped.shape == self.chunk_shape:
            return clipped
        out = np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        out[tuple(slice(0, d) for d in clipped.shape)] = clipped
        return out

    @abstractmethod
    def chunk_key(self, coords: Coords) -> str:
        """The source's own key of chunk `coords`, relative to the array (e.g. ``c/0/1``)."""

    def decode_key(self, key: str) -> Coords | None:
        """The chunk a key names (any rank, in or out of the grid), or None.

        Works for any chunk key encoding: accepted only if encoding the
        coordinates gives the key back (`zfuse.ext.chunk_keys.ChunkKeyDecoder`).
        """
        decoder = getattr(self, "_key_decoder", None)
        if decoder is None:
            decoder = self._key_decoder = ChunkKeyDecoder(len(self.shape), encode=self.chunk_key)
        return decoder(key)

    @abstractmethod
    def list_chunks(self) -> Iterable[Coords]:
        """Coordinates of the chunks that exist in the store (the whole array: `zfuse info`,
        concatenations; a mount lists by directory with `iter_chunk_dir`)."""

    # -- the chunk-key tree, one directory at a time ---------------------------
    def key_layout(self) -> tuple[tuple[str, ...], dict[int, int]]:
        """The path of chunk (0, …, 0)'s key, and {directory level: axis} for the
        levels that hold a coordinate (``c/0/0``: ``{1: 0}``; ``0.0``: ``{}``)."""
        layout = getattr(self, "_key_layout", None)
        if layout is None:
            origin = tuple(self.chunk_key(tuple(0 for _ in self.shape)).split("/"))
            levels = [depth for depth, name in enumerate(origin[:-1]) if name.isdigit()]
            layout = self._key_layout = (origin, {depth: axis for axis, depth in enumerate(levels)})
        return layout

    def dir_coords(self, parts: tuple[str, ...]) -> Coords | None:
        """The leading coordinates that chunk-key directory `parts` fixes, or None when
        no in-grid chunk key lives under it (``("c", "3")`` -> ``(3,)``).

        Remembered (a bounded memo: the grid never changes): listing one directory
        ahead asks for its coordinates five times."""
        memo: dict[tuple[str, ...], Any] | None = getattr(self, "_dir_coords_memo", None)
        if memo is None:
            memo = self._dir_coords_memo = {}
        fixed = memo.get(parts, _UNKNOWN)
        if fixed is _UNKNOWN:
            fixed = self._decode_dir(parts)
            if len(memo) >= DIR_COORDS_KEPT:
                memo.clear()
            memo[parts] = fixed
        return fixed

    def _decode_dir(self, parts: tuple[str, ...]) -> Coords | None:
        origin, axis_at = self.key_layout()
        if len(parts) >= len(origin):
            return None
        grid = self.grid_shape
        fixed = []
        for depth, name in enumerate(parts):
            axis = axis_at.get(depth)
            if axis is None:
                if name != origin[depth]:
                    return None
            elif not _canonical_int(name) or int(name) >= grid[axis]:
                return None
            else:
                fixed.append(int(name))
        return tuple(fixed)

    def iter_chunk_dir(self, parts: tuple[str, ...]) -> Iterator[DirPage]:
        """Pages of what chunk-key directory `parts` holds (``()`` is the array's own
        directory): ``(name, coords)`` for chunks, ``(name, None)`` for subdirectories.

        This fallback lists the whole array once and keeps it until `invalidate`;
        store-backed sources list only the directory asked for.
        """
        depth = len(parts)
        subdirs: set[str] = set()
        page: DirPage = []
        for coords, key in self._all_chunk_keys():
            names = key.split("/")
            if len(names) <= depth or tuple(names[:depth]) != parts:
                continue
            if len(names) == depth + 1:
                page.append((names[depth], coords))
            elif names[depth] not in subdirs:
                subdirs.add(names[depth])
                page.append((names[depth], None))
        yield page

    def chunk_exists(self, coords: Coords) -> bool:
        """Whether chunk `coords` is stored (one existence check, not a listing, for
        store-backed sources; this fallback uses the whole-array listing)."""
        return coords in {c for c, _ in self._all_chunk_keys()}

    def exists_is_local(self, coords: Coords) -> bool:
        """Whether `chunk_exists(coords)` answers from a local file's stat or from memory
        (no server, no zarr event loop): cheap enough to ask ahead of a writer."""
        return False

    @property
    def lists_locally(self) -> bool:
        """Whether `iter_chunk_dir` lists a local directory in the calling thread (short
        work), not a remote store (a long wait)."""
        return False

    @property
    def fetches_remotely(self) -> bool:
        """Whether chunks are fetched from a remote store, and `fetch_ahead` starts their
        fetches ahead of a reader; here: no."""
        return False

    def fetch_ahead(self, coords: Sequence[Coords], skip: Callable[[Coords], bool] | None = None) -> None:  # noqa: B027
        """Start fetching these chunks' stored bytes for reads to come (remote stores;
        returns at once), leaving out those `skip` says are at hand. Here: nothing."""

    def raw_chunk_path(self, coords: Coords) -> str | None:
        """A local file holding chunk `coords`'s values exactly as its chunk file's data,
        when there is one (`ZarrChunkSource.raw_chunk_path`); here: none."""
        return None

    def open_raw_chunk(self, coords: Coords, flags: int = os.O_RDONLY) -> int:
        """A descriptor of `raw_chunk_path(coords)`'s file, opened inside the store only
        (`ZarrChunkSource.open_raw_chunk`); only called where that is not None."""
        raise NotImplementedError

    def may_store_raw(self) -> bool:
        """False when `raw_chunk_path` is None for every chunk, as known from memory."""
        return False

    # -- stored bytes: what a source can say of its chunks as they are stored. Every
    # source answers (these defaults: nothing known), so callers never probe with
    # getattr; `ZarrChunkSource` answers where its store allows.
    def stored_form(self) -> dict[str, Any]:
        """The array's metadata as stored, for arrays shown without chunk files."""
        return self.v3_metadata()

    def stored_codecs(self) -> list[dict[str, Any]] | None:
        """The codecs between a chunk's values and its stored bytes; None: not read directly."""
        return None

    def stored_sizes(self) -> dict[Coords, int] | None:
        """Stored byte size of every stored chunk, when cheap; None otherwise."""
        return None

    def stored_chunk_path(self, coords: Coords) -> str | None:
        """The local file that holds chunk `coords` as stored; None: none."""
        return None

    def _all_chunk_keys(self) -> list[tuple[Coords, str]]:
        listed = getattr(self, "_listed_keys", None)
        if listed is None:
            listed = self._listed_keys = self.list_chunk_keys()
        return listed

    def use_index_cache(self, cache: BoundedLRU) -> None:  # noqa: B027 - optional hook
        """Keep shard indexes in `cache` (shared by the arrays of one view)."""

    @abstractmethod
    def read_chunk(self, coords: Coords, must_exist: bool = False) -> np.ndarray:
        """Decoded chunk, full chunk shape; fill value where nothing is stored
        (or CorruptDataError with `must_exist`: a listed chunk that vanished)."""

    @abstractmethod
    def write_chunk(self, coords: Coords, data: np.ndarray) -> None:
        """Store `data` (full chunk shape, or the clipped shape of an edge chunk)."""

    @abstractmethod
    def delete_chunk(self, coords: Coords) -> None:
        """Remove chunk `coords` from the store."""

    def key_encoding_dict(self) -> dict[str, Any]:
        """The source's chunk key encoding, as a v3 metadata dict."""
        return {"name": "default", "configuration": {"separator": "/"}}

    @abstractmethod
    def v3_metadata(self) -> dict[str, Any]:
        """The view-independent part of the source's v3 metadata: shape, data_type,
        fill_value, attributes, dimension names (built by zfuse; never fails)."""

    def extensions(self) -> list[str]:
        """Names of the Zarr extensions and notable codecs this source uses."""
        return []

    def invalidate(self) -> None:
        """Forget cached store state (after external changes)."""
        self._listed_keys: list[tuple[Coords, str]] | None = None


def v3_array_fields(
    shape: Sequence[int], dtype: np.dtype, fill_value: Any, attributes: dict[str, Any], zdtype: Any = None
) -> dict[str, Any]:
    """The v3 array document fields zfuse knows without zarr's conversion: shape,
    data type (byte order is the codecs' business in v3), fill value, attributes."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": v3_data_type(dtype, zdtype),
        "fill_value": v3_fill_value(fill_value, dtype, zdtype),
        "attributes": attributes,
    }


_NUMERIC_KINDS = "biufc"


def v3_data_type(dtype: np.dtype, zdtype: Any = None) -> Any:
    if dtype.kind in _NUMERIC_KINDS and dtype.fields is None:
        return dtype.name  # "int16" for <i2 and >i2 alike
    if zdtype is not None:
        try:
            return zdtype.to_json(zarr_format=3)
        except Exception:
            pass
    return str(dtype)


def _float_json(value: float) -> float | str:
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(value)


def v3_fill_value(value: Any, dtype: np.dtype, zdtype: Any = None) -> Any:
    """The fill value as v3 JSON encodes it (NaN/Infinity as strings, complex as [re, im])."""
    if dtype.kind in _NUMERIC_KINDS and dtype.fields is None:
        scalar = np.asarray(value if value is not None else 0).astype(dtype)[()]
        if dtype.kind == "b":
            return bool(scalar)
        if dtype.kind in "iu":
            return int(scalar)
        if dtype.kind == "f":
            return _float_json(float(scalar))
        return [_float_json(float(scalar.real)), _float_json(float(scalar.imag))]
    if zdtype is not None:
        try:
            return zdtype.to_json_scalar(zdtype.cast_scalar(value), zarr_format=3)
        except Exception:
            pass
    return None if value is None else str(value)


def _collect(aiter: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [item async for item in aiter]

    return sync(run())


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


_NOT_LOCAL: Any = object()


class ZarrChunkSource(ChunkSource):
    """A zarr-python array (v2 or v3, any codecs, optionally sharded)."""

    def __init__(self, array: zarr.Array, name: str | None = None) -> None:
        self.array = array
        self.name = name if name is not None else array.path
        meta = array.metadata
        self.zarr_format: int = meta.zarr_format
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.chunk_shape = tuple(array.chunks)
        self._grid = tuple(-(-s // c) for s, c in zip(self.shape, self.chunk_shape, strict=True))
        fill = array.fill_value
        self.fill_value = fill if fill is not None else np.zeros((), self.dtype)[()]
        self.store = array.store_path.store
        self.prefix = array.store_path.path + "/" if array.store_path.path else ""
        self.sharding: ShardingCodec | None = None
        if self.zarr_format == 3 and meta.codecs and isinstance(meta.codecs[0], ShardingCodec):
            self.sharding = meta.codecs[0]
            self.shard_shape = tuple(meta.chunk_grid.chunk_shape)
            self.chunks_per_shard = tuple(
                s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True)
            )
        # Writes store chunks even if they equal the fill value (a file written
        # through the mount must stay listed); deletes use the default config,
        # under which zarr drops all-fill inner chunks from a shard.
        self._writer = array.with_config({"write_empty_chunks": True})
        self._eraser = array.with_config({"write_empty_chunks": False})
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # shard indexes: bounded, shared by the view's arrays once `use_index_cache` is called
        self._index_cache = BoundedLRU(DEFAULT_INDEX_CACHE_BYTES)
        # id(index's offsets array) -> (a weak reference to that array, the chunk map as
        # bytes): kept for listings without keeping the index alive past its own cache
        self._chunk_maps: dict[int, tuple[weakref.ref[Any], bytes]] = {}
        self._chunk_maps_bytes = 0
        self._index_loading: dict[str, asyncio.Future[Any]] = {}  # index reads in flight
        # a remote store's directories listed, shared by the view directories that lie in
        # one (`_shard_dir_names`: a shard row's), or the whole array's (`_flat_listing`)
        self._store_dirs: collections.OrderedDict[str, _SharedListing] = collections.OrderedDict()
        self._store_dirs_guard = threading.Lock()
        # Chunks are read and written directly with the codec pipeline, except for
        # v2 arrays in F order, whose chunk memory order only zarr's indexing handles
        self._direct = not (self.zarr_format == 2 and getattr(meta, "order", "C") == "F")
        # [array->bytes codec, bytes->bytes codecs...] when every one of them can
        # decode synchronously and no array->array codec changes the spec
        self._sync_codecs: tuple[Any, list[Any]] | None = None
        if self.zarr_format == 3:
            from zarr.abc.codec import ArrayBytesCodec, BytesBytesCodec

            codecs = list(self.sharding.codecs if self.sharding is not None else meta.codecs)
            if (
                codecs
                and isinstance(codecs[0], ArrayBytesCodec)
                and all(isinstance(c, BytesBytesCodec) for c in codecs[1:])
                and all(zarr_private.can_decode_sync(c) for c in codecs)
            ):
                self._sync_codecs = (codecs[0], codecs[1:])
        # whole-chunk writes encode in the worker thread too when every codec can
        self._sync_encode = self._sync_codecs is not None and self.sharding is None and all(
            zarr_private.can_encode_sync(c) for c in meta.codecs
        )
        encoding = (
            V2ChunkKeyEncoding(separator=meta.dimension_separator) if self.zarr_format == 2 else meta.chunk_key_encoding
        )
        # (key head, separator) for the default and v2 encodings: fast key encoding
        self._standard: tuple[str, str] | None = standard_layout(encoding)
        self._key_decoder = ChunkKeyDecoder(len(self.shape), encoding=encoding, encode=self.chunk_key)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return self._grid

    @property
    def storage_grid(self) -> tuple[int, ...]:
        """The grid of storage objects: shards for sharded arrays, else the chunks."""
        if self.sharding is None:
            return self._grid
        return tuple(-(-g // n) for g, n in zip(self._grid, self.chunks_per_shard, strict=True))

    def use_index_cache(self, cache: BoundedLRU) -> None:
        self._index_cache = cache

    # -- keys -------------------------------------------------------------
    def _encode_storage_key(self, coords: Coords) -> str:
        return self.array.metadata.encode_chunk_key(coords)

    def chunk_key(self, coords: Coords) -> str:
        if self._standard is not None and coords:
            head, sep = self._standard
            return head + sep.join(map(str, coords))
        return self._encode_storage_key(coords)

    def decode_key(self, key: str) -> Coords | None:
        return self._key_decoder(key)

    def key_encoding_dict(self) -> dict[str, Any]:
        meta = self.array.metadata
        if self.zarr_format == 2:
            return {"name": "v2", "configuration": {"separator": meta.dimension_separator}}
        return meta.chunk_key_encoding.to_dict()

    def v3_metadata(self) -> dict[str, Any]:
        # Built here rather than by zarr's v2 -> v3 conversion, which cannot
        # express every v2 array zarr-python reads (fill_value null, numcodecs
        # filters, object dtypes): this never fails.
        meta = self.array.metadata
        doc = v3_array_fields(self.shape, self.dtype, self.fill_value, dict(self.array.attrs), meta.dtype)
        names = getattr(meta, "dimension_names", None)
        if names is not None:
            doc["dimension_names"] = list(names)
        return doc

    def stored_form(self) -> dict[str, Any]:
        """The array's metadata as zarr-python holds it, in v3 form where zarr can
        convert it (for arrays shown without chunk files), else in v2 form."""
        meta = self.array.metadata
        with warnings.catch_warnings():
            # zarr warns that v2-only data types (fixed-length strings) have no v3 spec
            warnings.simplefilter("ignore")
            if self.zarr_format == 2:
                try:
                    return zarr_private.convert_v2_metadata_to_v3(meta).to_dict()
                except Exception:
                    pass
            return meta.to_dict()

    def extensions(self) -> list[str]:
        meta = self.array.metadata
        if self.zarr_format == 2:
            out = ["zarr v2"]
            if meta.compressor is not None:
                out.append(meta.compressor.codec_id)
            return out
        names = [c.to_dict()["name"] for c in meta.codecs]
        if self.sharding is not None:
            names += [c.to_dict()["name"] for c in self.sharding.codecs]
        cke = meta.chunk_key_encoding.to_dict()["name"]
        if cke not in ("default", "v2"):
            names.append(f"{cke} chunk keys")
        from zfuse.ext.api import raw_array_metadata

        # zarr-python never sees storage transformers: ask for the stored document
        for t in raw_array_metadata(self.array).get("storage_transformers") or []:
            name = t.get("name") or t.get("extension")
            names.append("sharding v1" if "sharding" in str(name) else str(name))
        return names

    # -- listing ----------------------------------------------------------
    def _keys_with_coords(self) -> list[tuple[Coords, str]]:
        """(coords, key) of every storage object of the array that is a chunk (or shard) key."""
        prefix, n = self.prefix, len(self.prefix)
        decode = self.decode_key
        out = []
        for key in _collect(self.store.list_prefix(prefix)):
            rel = key[n:]
            coords = decode(rel)
            if coords is not None:
                out.append((coords, rel))
        return out

    def list_chunk_keys(self) -> list[tuple[Coords, str]]:
        if self.sharding is not None:
            return super().list_chunk_keys()
        found = self._keys_with_coords()
        if not found:
            return found
        # outside the grid (left over after a resize): one vectorised test, not a loop
        inside = (np.array([c for c, _ in found]) < np.array(self.grid_shape)).all(axis=1)
        return found if inside.all() else [item for item, ok in zip(found, inside, strict=True) if ok]

    def list_chunks(self) -> list[Coords]:
        if self.sharding is None:
            return [c for c, _ in self.list_chunk_keys()]
        shard_coords = [c for c, _ in self._keys_with_coords()]
        indexes = sync(self._load_indexes(shard_coords))
        out: list[Coords] = []
        for shard, index in zip(shard_coords, indexes, strict=True):
            if index is None:
                continue
            base = np.array(shard) * np.array(self.chunks_per_shard)
            for local in np.argwhere(index.get_full_chunk_map()):
                coords = tuple(int(v) for v in base + local)
                if self.in_grid(coords):
                    out.append(coords)
        return out

    def iter_chunk_dir(self, parts: tuple[str, ...]) -> Iterator[DirPage]:
        """One delimited listing of the store directory behind `parts`, paged.

        Unsharded, the view's directories are the store's. Sharded, directory
        names hold inner-chunk coordinates: the store directory is the one of the
        shards covering them; a shard name there stands for the inner names it
        covers, and at the last level the indexes of the listed shards (only
        those) say which inner chunks exist.
        """
        fixed = self.dir_coords(parts)
        if fixed is None:
            return
        origin, axis_at = self.key_layout()
        per_object = self.chunks_per_shard if self.sharding is not None else (1,) * len(self.shape)
        store_parts = [
            str(int(name) // per_object[axis_at[depth]]) if depth in axis_at else name
            for depth, name in enumerate(parts)
        ]
        head = "".join(p + "/" for p in store_parts)
        depth = len(parts)
        leaf = depth == len(origin) - 1
        local = self._listing_store()
        if local is None and not leaf and depth not in axis_at:
            # a component every chunk key has (v3's `c`): shown with no request, as `entry`
            # shows it even before a chunk is stored (a reader's readdir of the array,
            # GDAL's, costs no round trip; a walker lists the array at `c/`, whole)
            yield [(origin[depth], None)]
            return
        flat = None if local is not None else self._flat_listing(first=not leaf)
        if local is not None:
            pages = local.list_dir_local(self.prefix + head, LIST_PAGE)
        elif flat is not None:
            assert flat.children is not None
            pages = iter([flat.children.get(head, [])])
        elif self.sharding is not None:
            pages = self._shard_dir_names(head)
        else:
            pages = _pages(self.store.list_dir(self.prefix + head))
        for names in pages:
            if local is None:
                names = [name.rstrip("/") for name in names]  # http(s) listings mark directories "name/"
            if not leaf:
                yield self._subdirs(depth, names, per_object)
            elif self.sharding is None:
                yield self._stored_chunks(head, names, fixed)
            else:
                # a walker of the whole array: the indexes of the other shards are read
                # alongside this directory's (one round trip, not one per shard row)
                also = functools.partial(self._shards_ahead, flat) if flat is not None else None
                yield self._inner_chunks(head, names, fixed, also)

    def _shard_dir_names(self, head: str) -> Iterator[list[str]]:
        """A remote store directory of shards, listed once for every view directory it
        holds inner chunks of (a shard row covers several: each listing its store
        directory again cost a LIST each), in pages. Kept until `invalidate` or a write
        through the mount (a new shard object), for the SHARD_DIRS_KEPT directories
        listed last, each of at most SHARD_DIR_NAMES names (a bigger one is listed per
        view directory, as before)."""
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
            pages = _pages(self.store.list_dir(self.prefix + head))
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
            yield from _pages(self.store.list_dir(self.prefix + head))
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
        if not self._store_access.remote or math.prod(self.storage_grid) > FLAT_LISTING_OBJECTS:
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
            n = len(self.prefix)
            try:
                for page in _pages(self.store.list_prefix(self.prefix)):
                    keys += (key[n:] for key in page)
                    if len(keys) > FLAT_LISTING_KEYS:
                        break  # (stray objects: each directory is listed by itself)
            except BaseException:
                self._unshare(_FLAT, shared)
                raise
            if len(keys) <= FLAT_LISTING_KEYS:
                shared.children = _directories_of(keys)
                if self.sharding is not None:
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
        if self.sharding is None or math.prod(self.storage_grid) > INDEXES_ALONGSIDE or self._caches_ranges:
            return
        shards = list(itertools.product(*(range(n) for n in self.storage_grid)))
        future = asyncio.run_coroutine_threadsafe(self._load_indexes(shards), zarr_private.event_loop())
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

    def _forget_store_dirs(self) -> None:
        with self._store_dirs_guard:
            self._store_dirs.clear()

    @functools.cached_property
    def _leaf_index(self) -> dict[str, int] | None:
        """Chunk file name -> last coordinate, for every name a chunk directory may hold,
        when names are the last coordinate alone and there are few (else None)."""
        if not self._leaf_names_are_ints() or self._grid[-1] > LEAF_INDEX_MAX:
            return None
        return {str(i): i for i in range(self._grid[-1])}

    def _leaf_names_are_ints(self) -> bool:
        """Whether a chunk file's name in its directory is its last coordinate alone
        (``/``-separated default and v2 keys): listings then decode names with int()."""
        return self._standard is not None and self._standard[1] == "/" and len(self._grid) > 0  # 0-d: key "c"

    def _subdirs(self, depth: int, names: list[str], per_object: tuple[int, ...]) -> DirPage:
        origin, axis_at = self.key_layout()
        axis = axis_at.get(depth)
        if axis is None:
            return [(name, None) for name in names if name == origin[depth]]
        span, grid = per_object[axis], self._grid[axis]
        out: DirPage = []
        for name in names:
            if _canonical_int(name) and int(name) * span < grid:
                first = int(name) * span
                out.extend((str(i), None) for i in range(first, min(first + span, grid)))
        return out

    def _stored_chunks(self, head: str, names: list[str], fixed: Coords) -> DirPage:
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
            last = self._grid[-1]
            for name in names:
                if name.isascii() and name.isdigit() and (name[0] != "0" or name == "0"):  # _canonical_int, inlined
                    i = int(name)
                    if i < last:
                        out.append((name, (*fixed, i)))
            return out
        for name in names:
            coords = self.decode_key(head + name)
            if coords is not None and self.in_grid(coords):
                out.append((name, coords))
        return out

    def _inner_chunks(self, head: str, names: list[str], fixed: Coords,
                      also: Callable[[set[Coords]], list[Coords]] | None = None) -> DirPage:
        """The inner chunks of directory `head` (names: its shards). `also`: other shards
        whose indexes to read alongside theirs if theirs must be read, for the
        directories listed next."""
        shards = [shard for shard in (self._shard_of(head + name) for name in names) if shard is not None]
        out: DirPage = []
        n = len(fixed)
        # indexes already cached (the ten directories one shard covers read it once)
        # need no trip through zarr's event loop
        indexes = [self._index_cache.get((id(self), self.prefix + self._encode_storage_key(s))) for s in shards]
        if any(index is None for index in indexes):
            more = also(set(shards)) if also is not None else []
            indexes = sync(self._load_indexes(shards + more))[: len(shards)]
        int_names = self._leaf_names_are_ints()
        per_shard = self.chunks_per_shard
        # a directory of the last axis (`/`-separated keys): each shard's slab of the
        # chunk map is taken from bytes made once per shard, in C-level passes with no
        # numpy call. A numpy call on a whole map lets go of the GIL, and each time the
        # listing thread takes it back the event loop waits for it: it cost `ls -lR` of
        # 100,000 inner chunks 0.15 s.
        last_axis = int_names and n == len(per_shard) - 1
        limit = None if last_axis else np.array(self._grid[n:])
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
                if lasts and lasts[-1] >= self._grid[-1]:
                    lasts = [j for j in lasts if j < self._grid[-1]]  # an edge shard, past the grid
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
                out += [(self.chunk_key(c).rsplit("/", 1)[-1], c) for c in coords]
        return out

    def _shard_of(self, key: str) -> Coords | None:
        """The shard that storage key `key` (relative to the array) names, if it lies in
        the grid of shards; else None."""
        shard = self.decode_key(key)
        grid = self.storage_grid
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

    def chunk_exists(self, coords: Coords) -> bool:
        """One existence check of the chunk's key (or one read of its shard's index,
        then cached): no listing."""
        if not self.in_grid(coords):
            return False
        if self.sharding is None:
            key = self.prefix + self._encode_storage_key(coords)
            local = self._local_store
            if local is not None:  # in this worker thread, as `_fetch_local` reads
                return local.exists_local(key)
            fetches = self._fetches
            if fetches is not None:  # being fetched ahead: that GET answers, no HEAD of its own
                fetched = fetches.peek(coords)
                if fetched is not MISSED:
                    return fetched is not None
            return bool(sync(self.store.exists(key)))
        shard = self._storage_coords(coords)
        index = self._index_cache.get((id(self), self.prefix + self._encode_storage_key(shard)))
        if index is None:  # not cached: read (and cache) it on zarr's event loop
            index = sync(self._shard_index(shard))
        return index is not None and index.get_chunk_slice(coords) is not None

    @property
    def lists_locally(self) -> bool:
        return self._listing_store() is not None

    def exists_is_local(self, coords: Coords) -> bool:
        if self._local_store is None or not self.in_grid(coords):
            return False
        if self.sharding is None:
            return True
        shard = self._storage_coords(coords)
        return self._index_cache.get((id(self), self.prefix + self._encode_storage_key(shard))) is not None

    async def _load_indexes(self, shard_coords: Sequence[Coords]) -> list[Any]:
        sem = asyncio.Semaphore(16)

        async def one(shard: Coords) -> Any:
            async with sem:
                return await self._shard_index(shard)

        return await asyncio.gather(*(one(s) for s in shard_coords))

    async def _shard_index(self, shard: Coords) -> Any:
        key = self.prefix + self._encode_storage_key(shard)
        cached = self._index_cache.get((id(self), key))
        if cached is not None:
            return cached
        # one read per index, however many requests want it at once (listings of the
        # directories one shard covers run side by side when listed ahead of `ls -R`);
        # all of them run on zarr's one event loop, so a plain dict is enough
        loading = self._index_loading.get(key)
        if loading is None:
            loading = self._index_loading[key] = asyncio.ensure_future(self._read_shard_index(key))
            loading.add_done_callback(lambda done: self._index_loading.pop(key, None))
        return await asyncio.shield(loading)

    async def _read_shard_index(self, key: str) -> Any:
        assert self.sharding is not None
        try:
            index = await zarr_private.load_shard_index(
                self.sharding, StorePath(self.store, key), self.chunks_per_shard
            )
        except Exception as e:  # a bad index checksum or a short object
            raise CorruptDataError(f"{key}: unreadable shard index: {e}") from e
        if index is not None:
            self._index_cache.put((id(self), key), index, index.offsets_and_lengths.nbytes + 256)
        return index

    # -- reading ----------------------------------------------------------
    def read_chunk(self, coords: Coords, must_exist: bool = False) -> np.ndarray:
        try:
            return self._read_chunk_once(coords, must_exist)
        except Exception:
            # A chunk stored as several objects (concat-parts) is written one object
            # at a time: a read between the two sees parts that disagree. Wait for a
            # write in flight on this storage object and read once more; real
            # corruption fails again and is reported.
            with self._lock_for(coords):
                pass
            return self._read_chunk_once(coords, must_exist)

    def _read_chunk_once(self, coords: Coords, must_exist: bool) -> np.ndarray:
        if not self._direct:
            return self.full_chunk(np.asarray(self.array[self.chunk_region(coords)]))
        fetched = self._fetch(coords, must_exist)
        if fetched is None:
            return np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        buf, spec = fetched
        try:
            return self._decode(buf, spec, coords)
        except CorruptDataError as e:
            raise CorruptDataError(f"{self.chunk_key(coords)}: {e}") from e
        except (ValueError, RuntimeError, TypeError) as e:
            # zarr's codecs meet bad stored bytes as any of these: corrupt data (EIO for
            # this file, one log line), not a daemon error
            raise CorruptDataError(f"{self.chunk_key(coords)}: the stored chunk does not decode: "
                                   f"{type(e).__name__}: {e}") from e

    def _decode(self, buf: Any, spec: Any, coords: Coords) -> np.ndarray:
        """A fetched chunk's values, every decompression bounded by the chunk's size."""
        codecs = self._sync_codecs
        nbytes = self._chunk_nbytes
        if codecs is None:
            values = self._decode_v2_bounded(buf)
            if values is not None:
                return values
            pipeline = (self.sharding or self.array.async_array).codec_pipeline
            (decoded,) = sync(pipeline.decode([(buf, spec)]))
            if decoded is None:
                return np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        else:
            # decoding in this worker thread with the codecs' synchronous methods:
            # zarr's pipeline would hop to a thread per codec, and would hold
            # its event loop, which serves every other read. Each stage's output is
            # bounded (bounded_decode): the one feeding the serializer by the chunk's
            # size, the others by their input and the chunk's size.
            serializer, bytes_codecs = codecs
            for i, codec in enumerate(reversed(bytes_codecs)):
                limit = nbytes if i == len(bytes_codecs) - 1 else len(buf) + nbytes + 65536
                out = bounded_decode.bounded(
                    codec, buf.as_numpy_array(), limit,
                    functools.partial(zarr_private.decode_sync, codec, buf, spec))
                buf = spec.prototype.buffer.from_bytes(out) if isinstance(out, (bytes, bytearray)) else out
            decoded = zarr_private.decode_sync(serializer, buf, spec)
        values = np.asarray(decoded.as_numpy_array())
        if values.size != math.prod(self.chunk_shape):
            raise CorruptDataError(f"the stored chunk decodes to {values.size} values, "
                                   f"the chunk holds {math.prod(self.chunk_shape)}")
        return values.reshape(self.chunk_shape)

    @functools.cached_property
    def _chunk_nbytes(self) -> int:
        return math.prod(self.chunk_shape) * np.dtype(self.dtype).itemsize

    def _decode_v2_bounded(self, buf: Any) -> np.ndarray | None:
        """A v2 chunk (C order, no filters) whose compressor zfuse bounds, decoded as
        zarr's V2Codec does (decompress, view as the dtype, reshape) with the output
        bounded by the chunk's size; None for anything else (zarr's pipeline decodes it,
        after a declared size is checked where the framing has one)."""
        if self.zarr_format != 2 or self.sharding is not None:
            return None
        meta = self.array.metadata
        compressor = getattr(meta, "compressor", None)
        if compressor is None:
            return None
        ident, config = bounded_decode.codec_id(compressor)
        if ident is None:
            return None
        raw = buf.as_numpy_array()
        if getattr(meta, "filters", None):
            # the filters come after: check what the framing declares, else leave it to zarr
            if bounded_decode.declares_size(ident):
                bounded_decode.decompress_bounded(ident, config, raw, self._chunk_nbytes)
            return None
        out = bounded_decode.decompress_bounded(ident, config, raw, self._chunk_nbytes)
        stored = np.dtype(self.array.metadata.dtype.to_native_dtype())
        if ident in bounded_decode.DECODED_INTO and stored.isnative:
            # an image codec: decoded into the chunk's own array (as zarr-python 2 does),
            # which the decoder checks against the image its stream declares first
            return bounded_decode.decode_into(compressor, raw, np.empty(self.chunk_shape, stored))
        if out is None:
            return None  # its declared size was checked: zarr decodes it
        if len(out) != self._chunk_nbytes:
            raise CorruptDataError(f"the stored chunk decompresses to {len(out)} bytes, "
                                   f"the chunk holds {self._chunk_nbytes}")
        return np.frombuffer(out, dtype=stored).reshape(self.chunk_shape)

    # -- stored bytes (whole-image passthrough) -------------------------------
    def stored_codecs(self) -> list[dict[str, Any]] | None:
        """The codecs between a chunk's values and its stored bytes (the inner codecs
        of a sharded array), as v3 dicts; None when stored bytes are not read directly
        (F order) or their sizes are not cheap to know (neither sharded nor local).
        No I/O: `stored_sizes` checks the rest (storage transformers)."""
        if not self._direct or (self.sharding is None and self._local_root() is None):
            return None
        meta = self.array.metadata
        if self.zarr_format == 2:
            endian = "big" if np.dtype(meta.dtype.to_native_dtype()).byteorder == ">" else "little"
            out: list[dict[str, Any]] = [{"name": f"v2 filter {f.codec_id}"} for f in meta.filters or ()]
            out.append({"name": "bytes", "configuration": {"endian": endian}})
            if meta.compressor is not None:
                out.append({"name": meta.compressor.codec_id, "configuration": meta.compressor.get_config()})
            return out
        codecs = self.sharding.codecs if self.sharding is not None else meta.codecs
        return [c.to_dict() for c in codecs]

    def _listing_store(self) -> Any:
        """`_local_store` for listings, decided from memory only (`ls` reads nothing
        but the listing: not even ``zarr.json`` again); None when that is not known."""
        if (self.zarr_format != 2 and getattr(self, "_transformers", None) is None
                and self._recorded_transformers() is None):
            return None  # only reading zarr.json again would tell
        return self._local_store

    def _recorded_transformers(self) -> bool | None:
        """Whether the stored ``zarr.json`` names storage transformers, from the copy the
        store wrapper recorded when the array was opened (memory only); None if none."""
        from zfuse.ext.transformers import TransformerStore

        store = self.store
        while isinstance(store, TransformerStore):
            doc = store.recorded_metadata(self.array.store_path.path)
            if isinstance(doc, dict):
                return bool(doc.get("storage_transformers"))
            store = zarr_private.wrapped_store(store)
        return None

    def _has_transformers(self) -> bool:
        if self.zarr_format == 2:
            return False
        found = getattr(self, "_transformers", None)
        if found is None:
            found = self._recorded_transformers()
        if found is None:  # not recorded: read the stored document again
            from zfuse.ext.api import raw_array_metadata

            try:
                found = bool(raw_array_metadata(self.array).get("storage_transformers"))
            except Exception:  # not a plain zarr.json (e.g. a pre-release layout): not direct
                found = True
        self._transformers = found
        return found

    @functools.cached_property
    def _store_access(self) -> StoreAccess:
        """What the store stack offers beyond zarr's Store API, found once."""
        return store_access(self.store)

    def _local_root(self) -> str | None:
        """The directory of a local store (under zfuse's metering wrapper), else None.
        Other wrappers may map keys (pre-release layouts): no file sizes through them."""
        return self._store_access.root

    def _local_files(self) -> Any:
        """The `AtomicLocalStore` under `_local_root`'s wrappers, or None: its `open_key`
        and `stat_key` open stored files inside the store only."""
        return self._store_access.files

    def stored_sizes(self) -> dict[Coords, int] | None:
        """Stored byte size of every stored chunk (inner chunks of shards), when that is
        cheap: shard indexes, or a local store's file sizes. None otherwise (blocking)."""
        if self.stored_codecs() is None or self._has_transformers():
            return None
        if self.sharding is not None:
            shards = [c for c, _ in self._keys_with_coords()]
            indexes = sync(self._load_indexes(shards))
            out: dict[Coords, int] = {}
            for shard, index in zip(shards, indexes, strict=True):
                if index is None:
                    continue
                base = np.array(shard) * np.array(self.chunks_per_shard)
                lengths = index.offsets_and_lengths[..., 1]
                for local in np.argwhere(index.get_full_chunk_map()):
                    coords = tuple(int(v) for v in base + local)
                    if self.in_grid(coords):
                        out[coords] = int(lengths[tuple(local)])
            return out
        files = self._local_files()
        if files is None:
            return None
        out = {}
        for coords, key in self.list_chunk_keys():
            try:
                st = files.stat_key(self.prefix + key)  # inside the store only
            except OutsideStoreError:
                return None  # a chunk leading out of the store: decoded, where reading it fails
            if st is not None:
                out[coords] = st.st_size
        return out

    def stored_chunk_path(self, coords: Coords) -> str | None:
        """The local file that holds chunk `coords` as stored (it may not exist), when the
        store is a local directory and a chunk is one whole object (not sharded, no
        transformers); None otherwise. No I/O: readers of stored bytes can then read
        just the range they need instead of the whole object through zarr."""
        root = self._chunk_root
        if root is None:
            return None
        key = self.prefix + self._encode_storage_key(coords)
        if not self._stored_path_stays_inside(key):
            return None  # read through the store instead, which refuses it (EIO, naming the key)
        return os.path.join(root, key)

    def _stored_path_stays_inside(self, key: str) -> bool:
        """Whether opening `key`'s path plainly reaches a file inside the store, or
        nothing: no `..` in the key and no symbolic link on its way (one O_PATH open,
        no data read). Callers that open the path themselves (whole-image tiles) then
        cannot be led out of the store by a link that is already there."""
        files = self._local_files()
        if files is None:
            return False
        try:
            fd = files.open_key(key, os.O_PATH | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return True  # nothing stored (the fill value)
        except OSError:
            return False
        except OutsideStoreError:
            return False
        try:
            return not stat_mod.S_ISLNK(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def open_raw_chunk(self, coords: Coords, flags: int = os.O_RDONLY) -> int:
        """A descriptor of chunk `coords`'s stored file (`stored_chunk_path`), opened inside
        the store only: a key or link leading out of it raises OutsideStoreError."""
        files = self._local_files()
        if files is None:
            raise OutsideStoreError(f"{self.name}: chunk {coords} is not in a local store")
        return int(files.open_key(self.prefix + self._encode_storage_key(coords), flags))

    def raw_chunk_path(self, coords: Coords) -> str | None:
        """The local file whose bytes are chunk `coords`'s values exactly as a chunk file
        holds them after its header (C order, little endian), when the array stores its
        chunks raw: the `bytes` codec alone (little endian, or one-byte values; not
        booleans, whose stored bytes zarr does not check), not sharded, no storage
        transformers, in a local directory. None otherwise. The file may not exist
        (nothing stored). Blocking the first time (`stored_chunk_path`), then memory only."""
        if not self._raw_stored or self._chunk_root is None:
            return None
        # unchecked: its readers open it with `open_raw_chunk`, inside the store only
        return os.path.join(self._chunk_root, self.prefix + self._encode_storage_key(coords))

    def may_store_raw(self) -> bool:
        return self._raw_stored

    @functools.cached_property
    def _raw_stored(self) -> bool:
        """The codecs leave the values as they are (memory only; `raw_chunk_path` then
        also checks for storage transformers)."""
        codecs = self.stored_codecs()  # (None: F order, or neither local nor sharded)
        if (self.sharding is not None or codecs is None or len(codecs) != 1 or codecs[0].get("name") != "bytes"
                or self.dtype.kind == "b"):
            return False
        endian = (codecs[0].get("configuration") or {}).get("endian", "little")
        return endian == "little" or self.dtype.itemsize == 1

    @functools.cached_property
    def _chunk_root(self) -> str | None:
        """`stored_chunk_path`'s directory: the local root when a chunk is one object."""
        direct = self.sharding is None and not self._has_transformers()
        files = self._local_files() if direct else None  # (zfuse's own local store: it opens inside only)
        return str(files.root) if files is not None else None

    def read_stored(self, coords: Coords) -> bytes | None:
        """Chunk `coords` as stored (an inner chunk's bytes for sharded arrays), not
        decoded; None when nothing is stored."""
        fetched = self._fetch(coords, False)
        return None if fetched is None else fetched[0].to_bytes()

    def _fetch(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        """One chunk's stored bytes and spec (None: nothing stored). A local store is
        read in this worker thread; any other store on zarr's event loop."""
        local = self._local_store
        if local is not None:
            fetched = self._fetch_local(local, coords, must_exist)
            if fetched is not _NOT_LOCAL:
                return fetched
        fetches = self._fetches
        if fetches is not None:
            fetched = fetches.take(coords)  # fetched ahead, or being fetched: no request of its own
            metered = self._store_access.metered
            if metered is not None:
                metered.stats.count("chunks_fetched_on_read" if fetched is MISSED else "chunks_fetched_ahead")
            if fetched is None:
                if must_exist:
                    raise self._vanished(self.chunk_key(coords))
                return None
            if fetched is not MISSED:
                return fetched, self._chunk_spec
        fetch = self._fetch_inner_chunk if self.sharding is not None else self._fetch_stored_chunk
        return sync(fetch(coords, must_exist))

    @functools.cached_property
    def _fetches(self) -> FetchAhead | None:
        """Remote stores: chunks fetched ahead of readers (`fetch_ahead`), on zarr's
        event loop, taken by `_fetch`."""
        if not self._direct or not self._store_access.remote:
            return None
        return FetchAhead(self._fetch_many, zarr_private.event_loop)

    @property
    def fetches_remotely(self) -> bool:
        return self._fetches is not None

    @functools.cached_property
    def _caches_ranges(self) -> bool:
        """Whether the remote store keeps what it fetched on disk (`-o cache=DIR`)."""
        metered = self._store_access.metered
        return metered is not None and metered.cache is not None

    def fetch_ahead(self, coords: Sequence[Coords], skip: Callable[[Coords], bool] | None = None) -> None:
        """A sharded array's window is widened to the whole of each shard it covers at
        least half of (small shards: SHARD_AHEAD_CHUNKS inner chunks at most): readers
        going through one shard from several places (parallel readers, each its own
        window) then ask for it once, in one request, as zarr's `arr[:]` does."""
        if self._fetches is None:
            return
        if self.sharding is not None and math.prod(self.chunks_per_shard) <= SHARD_AHEAD_CHUNKS:
            coords = self._whole_shards(coords)
        self._fetches.ahead([c for c in coords if not skip(c)] if skip is not None else coords)

    def _whole_shards(self, coords: Sequence[Coords]) -> list[Coords]:
        """`coords` in their order, each followed by the rest of its shard's inner chunks
        (C order, in the grid) when at least half of that shard is among them already,
        every chunk once. (A shard the window only grazes is left as it is: a reader
        going along a row of square shards reads their other rows much later.)"""
        per_shard = self.chunks_per_shard
        in_shard: dict[Coords, int] = {}
        for c in coords:
            shard = self._storage_coords(c)
            in_shard[shard] = in_shard.get(shard, 0) + 1
        size = math.prod(per_shard)
        out: dict[Coords, None] = {}
        widened: set[Coords] = set()
        for c in coords:
            out.setdefault(c, None)
            shard = self._storage_coords(c)
            if shard in widened or 2 * in_shard[shard] < size:
                continue
            widened.add(shard)
            for inner in self._inner_chunks_of(shard):
                out.setdefault(inner, None)
        return list(out)

    def _inner_chunks_of(self, shard: Coords) -> list[Coords]:
        """A shard's inner chunks in the grid, in C order."""
        per_shard = self.chunks_per_shard
        base = [s * n for s, n in zip(shard, per_shard, strict=True)]
        return [inner for local in itertools.product(*(range(n) for n in per_shard))
                if self.in_grid(inner := tuple(b + i for b, i in zip(base, local, strict=True)))]

    async def _fetch_many(self, wanted: list[Coords]) -> dict[Coords, Any]:
        """Stored bytes of the chunks `wanted` (None: not stored; left out: not fetched).
        A shard's inner chunks lying close together come in one ranged request."""
        proto = default_buffer_prototype()
        limit = asyncio.Semaphore(FETCH_CONCURRENCY)
        out: dict[Coords, Any] = {}
        if self.sharding is None:
            async def whole(coords: Coords) -> None:
                async with limit:
                    out[coords] = await self.store.get(self.prefix + self._encode_storage_key(coords), prototype=proto)

            await asyncio.gather(*(whole(c) for c in wanted), return_exceptions=True)
            return out
        by_shard: dict[Coords, list[Coords]] = {}
        for coords in wanted:
            by_shard.setdefault(self._storage_coords(coords), []).append(coords)

        # zfuse's metered store right below (no storage transformers between): a span's
        # inner chunks are handed on as the response brings them (`get_pieces`), each
        # its own disk cache entry with `-o cache=`
        metered = self._store_access.metered
        if metered is not None and self._has_transformers():  # (answered from the metadata recorded at open)
            metered = None
        # a disk cache (-o cache=DIR) keeps byte ranges as requested: one per inner chunk,
        # found again after a remount whatever was read together (`get_pieces`; with
        # storage transformers between, one request each)
        coalesced = metered is not None or not self._caches_ranges
        fetches = self._fetches

        async def span(key: str, start: int, end: int, members: list[tuple[int, int, Coords]]) -> None:
            if metered is not None:
                def arrived(i: int, data: bytes) -> None:
                    coords = members[i][2]
                    out[coords] = buffer = proto.buffer.from_bytes(data)
                    if fetches is not None:
                        fetches.deliver(coords, buffer)  # (its read goes on while the rest comes)

                async with limit:
                    got = await metered.get_pieces(key, [(a, b) for a, b, _ in members], arrived)
                for (_, _, coords), data in zip(members, got, strict=True):
                    if data is not None and coords not in out:
                        out[coords] = proto.buffer.from_bytes(data)
                return
            async with limit:
                buf = await self.store.get(key, prototype=proto, byte_range=RangeByteRequest(start, end))
            if buf is None or len(buf) != end - start:
                return  # (left out: each read fetches its own and reports what is wrong)
            for first, last, coords in members:
                out[coords] = buf[first - start : last - start]

        wanted_set = set(wanted)

        async def shard(shard_coords: Coords, inner: list[Coords]) -> None:
            key = self.prefix + self._encode_storage_key(shard_coords)
            index = await self._shard_index(shard_coords)
            ranges = []
            for coords in inner:
                byte_slice = index.get_chunk_slice(coords) if index is not None else None
                if byte_slice is None:
                    out[coords] = None
                else:
                    ranges.append((*byte_slice, coords))
            # the shard's other inner chunks: those other fetches bring (parallel readers'
            # windows) no request here reaches across; those nobody fetches that lie
            # inside a request are fetched with it, and kept for their reads
            others = self._other_inner_chunks(shard_coords, index, wanted_set)
            if not coalesced:
                requests = [(a, b, [(a, b, c)]) for a, b, c in ranges]
            else:
                elsewhere = [byte_slice for c, byte_slice in others if fetches is not None and fetches.pending(c)]
                requests = coalesce(ranges, fetched_elsewhere=elsewhere)
                if others:
                    requests = [(a, b, self._with_unclaimed(a, b, members, others)) for a, b, members in requests]
            await asyncio.gather(*(span(key, *request) for request in requests), return_exceptions=True)

        await asyncio.gather(*(shard(s, inner) for s, inner in by_shard.items()), return_exceptions=True)
        return out

    def _other_inner_chunks(self, shard: Coords, index: Any, wanted: set[Coords]) -> list[tuple[Coords, tuple[int, int]]]:
        """(inner chunk, its byte slice) of the stored inner chunks of a small shard (at
        most SHARD_AHEAD_CHUNKS) that are not `wanted`; [] for a bigger shard (its fetches
        are not widened, and listing its chunks would cost more than it saves)."""
        if index is None or self._fetches is None or math.prod(self.chunks_per_shard) > SHARD_AHEAD_CHUNKS:
            return []
        return [(c, byte_slice) for c in self._inner_chunks_of(shard)
                if c not in wanted and (byte_slice := index.get_chunk_slice(c)) is not None]

    def _with_unclaimed(self, start: int, end: int, members: list[tuple[int, int, Coords]],
                        others: list[tuple[Coords, tuple[int, int]]]) -> list[tuple[int, int, Coords]]:
        """A request's members, plus the inner chunks lying inside [start, end) that no
        fetch brings yet, claimed for this one (`FetchAhead.claim`): their bytes come
        anyway, and another reader's window would fetch them again."""
        inside = [c for c, (a, b) in others if start <= a and b <= end]
        if not inside:
            return members
        assert self._fetches is not None
        claimed = set(self._fetches.claim(inside))
        # (in order of offset, as every request's members are: `get_pieces` needs it)
        return sorted(members + [(a, b, c) for c, (a, b) in others if c in claimed], key=lambda m: m[0])

    @functools.cached_property
    def _local_store(self) -> Any:
        """zfuse's metered store when it wraps a local directory directly (no storage
        transformers or key mapping in between), else None: its synchronous methods
        (`get_local`, `exists_local`, `list_dir_local`, `set_local`) are the fast path."""
        local = self._store_access.local
        return local if local is not None and not self._has_transformers() else None

    def _fetch_local(self, local: Any, coords: Coords, must_exist: bool) -> Any:
        """`_fetch_stored_chunk`/`_fetch_inner_chunk` without the event loop; _NOT_LOCAL
        when a shard's index is not cached yet (the async path reads and caches it)."""
        proto = default_buffer_prototype()
        if self.sharding is None:
            key = self.prefix + self._encode_storage_key(coords)
            data = local.get_local(key)
            if data is None:
                if must_exist:
                    raise self._vanished(key)
                return None
            return proto.buffer.from_bytes(data), self._chunk_spec
        shard = self._storage_coords(coords)
        key = self.prefix + self._encode_storage_key(shard)
        index = self._index_cache.get((id(self), key))
        if index is None:
            return _NOT_LOCAL
        byte_slice = index.get_chunk_slice(coords)
        if byte_slice is None:
            if must_exist:
                raise self._vanished(f"{key} (inner chunk {coords})")
            return None
        data = local.get_local(key, byte_slice)
        start, end = byte_slice
        if data is None or len(data) != end - start:
            self._index_cache.pop((id(self), key))
            raise CorruptDataError(f"{key}: inner chunk {coords} lies outside the stored shard")
        return proto.buffer.from_bytes(data), self._chunk_spec

    @functools.cached_property
    def _chunk_spec(self) -> Any:
        """The spec a (inner) chunk is encoded and decoded with: one for the whole
        regular grid (zarr gives every chunk the full chunk shape)."""
        proto = default_buffer_prototype()
        first = tuple(0 for _ in self.shape)
        spec = self.array.metadata.get_chunk_spec(first, zarr_private.array_config(self.array), proto)
        return spec if self.sharding is None else zarr_private.inner_chunk_spec(self.sharding, spec)

    def _vanished(self, key: str) -> CorruptDataError:
        return CorruptDataError(f"{key}: listed chunk is no longer in the store")

    async def _fetch_stored_chunk(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        """One stored chunk's bytes and spec (one get; no zarr selection machinery,
        which costs more than decoding a raw chunk). Zarr stores edge chunks at full
        shape, so decoding gives the full chunk as is. None: nothing stored."""
        proto = default_buffer_prototype()
        key = self.prefix + self._encode_storage_key(coords)
        buf = await self.store.get(key, prototype=proto)
        if buf is None:
            if must_exist:
                raise self._vanished(key)
            return None
        return buf, self._chunk_spec

    async def _fetch_inner_chunk(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        """One inner chunk's bytes and spec: the shard index (cached) and one ranged read.
        A shard another host rewrote since its index was read (ObjectChangedError: its
        ranges are pinned to the version the index came from) is read afresh once: its
        new index, then the chunk's range in the new version."""
        from zfuse.store import ObjectChangedError

        try:
            return await self._fetch_inner_chunk_once(coords, must_exist)
        except ObjectChangedError:
            metered = self._store_access.metered
            if metered is None:
                raise
            key = self.prefix + self._encode_storage_key(self._storage_coords(coords))
            self._index_cache.pop((id(self), key))
            metered.forget_version(key)
            return await self._fetch_inner_chunk_once(coords, must_exist)

    async def _fetch_inner_chunk_once(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        assert self.sharding is not None
        shard = self._storage_coords(coords)
        key = self.prefix + self._encode_storage_key(shard)
        index = await self._shard_index(shard)
        byte_slice = index.get_chunk_slice(coords) if index is not None else None
        if byte_slice is None:
            if must_exist:
                raise self._vanished(f"{key} (inner chunk {coords})")
            return None
        start, end = byte_slice
        proto = default_buffer_prototype()
        buf = await self.store.get(key, prototype=proto, byte_range=RangeByteRequest(start, end))
        if buf is None or len(buf) != end - start:
            self._index_cache.pop((id(self), key))
            raise CorruptDataError(f"{key}: inner chunk {coords} lies outside the stored shard")
        return buf, self._chunk_spec

    # -- writing ----------------------------------------------------------
    def _storage_coords(self, coords: Coords) -> Coords:
        """The grid position of the storage object holding chunk `coords` (its shard, if sharded)."""
        if self.sharding is None:
            return coords
        return tuple(c // n for c, n in zip(coords, self.chunks_per_shard, strict=True))

    def _lock_for(self, coords: Coords) -> threading.Lock:
        key = self._encode_storage_key(self._storage_coords(coords))
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def _forget_index(self, coords: Coords) -> None:
        self._forget_store_dirs()  # (a write may have made a new shard object)
        fetches = self.__dict__.get("_fetches")  # (what a write makes stale, if any was fetched ahead)
        if fetches is not None:
            fetches.forget()
        if self.sharding is not None:
            self._index_cache.pop((id(self), self.prefix + self._encode_storage_key(self._storage_coords(coords))))

    def write_chunk(self, coords: Coords, data: np.ndarray) -> None:
        # another host's write between this one's read and write: redone (zfuse/conditional.py)
        retry_lost_races(lambda: self._write_chunk_once(coords, data), f"{self.name} chunk {coords}")

    def _write_chunk_once(self, coords: Coords, data: np.ndarray) -> None:
        region = self.chunk_region(coords)
        clipped = data[tuple(slice(0, r.stop - r.start) for r in region)]
        with self._lock_for(coords):
            new_index = None
            try:
                if self.sharding is not None and self._direct and self._local_shard_writes():
                    new_index = self._write_inner_chunk_local(coords, self.full_chunk(clipped))
                elif self.sharding is None and self._direct and self._sync_encode:
                    encoded = self._encode_in_this_thread(self.full_chunk(clipped))
                    local = self._local_store
                    if local is not None and local.local_writer:
                        self._set_chunk_local(local, coords, encoded)  # in this worker thread
                    else:
                        sync(self._set_chunk(coords, encoded))  # store I/O on zarr's event loop
                elif self.sharding is None and self._direct:
                    sync(self._write_stored_chunk(coords, self.full_chunk(clipped)))
                else:
                    self._writer[region] = clipped  # zarr rewrites the shard
            finally:
                self._forget_index(coords)
                if new_index is not None:  # the shard just written: no need to read it back
                    key, index = new_index
                    self._index_cache.put((id(self), key), index, index.offsets_and_lengths.nbytes + 256)

    def _local_shard_writes(self) -> bool:
        """Whether an inner chunk can be written into its shard in this worker thread:
        a local store, and inner and index codecs that all encode and decode synchronously."""
        found = getattr(self, "_shard_writes", None)
        if found is None:
            from zarr.abc.codec import ArrayBytesCodec, BytesBytesCodec

            local = self._local_store
            codecs = [*self.sharding.codecs, *self.sharding.index_codecs]
            found = (
                local is not None and local.local_writer and self._sync_codecs is not None
                and len(self.array.metadata.codecs) == 1  # no codec over the whole shard
                and all(zarr_private.can_encode_sync(c) and zarr_private.can_decode_sync(c) for c in codecs)
                and isinstance(self.sharding.index_codecs[0], ArrayBytesCodec)
                and all(isinstance(c, BytesBytesCodec) for c in self.sharding.index_codecs[1:])
            )
            self._shard_writes = found
        return found

    def _write_inner_chunk_local(self, coords: Coords, full: np.ndarray) -> tuple[str, Any]:
        """Store inner chunk `coords` into its shard, in this worker thread: read the shard,
        encode the chunk, lay the shard out again as zarr does (inner chunks in Morton
        order, then the index, or the index first) and replace it atomically. zarr's own
        partial shard write does the same with several thread switches per step.
        Returns the shard's key and new index (for the index cache)."""
        from zarr.codecs.sharding import MAX_UINT_64, ShardingCodecIndexLocation

        sharding, local = self.sharding, self._local_store
        cps = tuple(self.chunks_per_shard)
        key = self.prefix + self._encode_storage_key(self._storage_coords(coords))
        index_spec = zarr_private.shard_index_spec(sharding, cps)
        index_size = zarr_private.shard_index_size(sharding, cps)
        index_first = sharding.index_location == ShardingCodecIndexLocation.start
        proto = default_buffer_prototype()
        stored = local.get_local(key)
        parts: dict[tuple[int, ...], memoryview] = {}
        if stored is not None:
            if len(stored) < index_size:
                raise CorruptDataError(f"{key}: shard of {len(stored)} bytes is shorter than its index")
            raw = stored[:index_size] if index_first else stored[len(stored) - index_size:]
            buf = proto.buffer.from_bytes(raw)
            try:
                for codec in reversed(sharding.index_codecs[1:]):
                    buf = zarr_private.decode_sync(codec, buf, index_spec)
                old = zarr_private.decode_sync(sharding.index_codecs[0], buf, index_spec).as_numpy_array()
            except Exception as e:  # a bad checksum: never overwrite what cannot be read
                raise CorruptDataError(f"{key}: unreadable shard index: {e}") from e
            data = memoryview(stored)
            for local_coords in np.argwhere(old[..., 0] != MAX_UINT_64):
                at = tuple(int(v) for v in local_coords)
                start, length = (int(v) for v in old[at])
                if start + length > len(stored):
                    raise CorruptDataError(f"{key}: inner chunk {at} lies outside the stored shard")
                parts[at] = data[start : start + length]
        encoded = self._encode_in_this_thread(full)
        parts[tuple(c % n for c, n in zip(coords, cps, strict=True))] = memoryview(encoded.as_numpy_array()).cast("B")
        index = zarr_private.new_shard_index(np.full((*cps, 2), MAX_UINT_64, dtype=np.uint64))
        ordered = []
        at = index_size if index_first else 0
        for local_coords in zarr_private.morton_order(cps):
            part = parts.get(local_coords)
            if part is None or len(part) == 0:
                continue
            index.offsets_and_lengths[local_coords] = (at, len(part))
            ordered.append(part)
            at += len(part)
        index_buf = zarr_private.encode_sync(
            sharding.index_codecs[0], proto.nd_buffer.from_numpy_array(index.offsets_and_lengths), index_spec)
        for codec in sharding.index_codecs[1:]:
            index_buf = zarr_private.encode_sync(codec, index_buf, index_spec)
        index_bytes = index_buf.as_numpy_array().tobytes()
        if index_first:
            ordered.insert(0, index_bytes)
        else:
            ordered.append(index_bytes)
        local.set_local(key, ordered)
        return key, index

    async def _write_stored_chunk(self, coords: Coords, full: np.ndarray) -> None:
        """Encode one whole chunk with the codec pipeline and store it (one set)."""
        proto = default_buffer_prototype()
        async_array = self.array.async_array
        values = proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype))
        (encoded,) = await async_array.codec_pipeline.encode([(values, self._chunk_spec)])
        await self._set_chunk(coords, encoded)

    async def _set_chunk(self, coords: Coords, encoded: Any) -> None:
        key = self.prefix + self._encode_storage_key(coords)
        if encoded is None:  # cannot happen with write_empty_chunks semantics; be safe
            raise CorruptDataError(f"{key}: the codecs produced no bytes")
        await self.store.set(key, encoded)

    def _set_chunk_local(self, local: Any, coords: Coords, encoded: Any) -> None:
        """`_set_chunk` on a local store, without zarr's event loop (the mirror of `_fetch_local`)."""
        key = self.prefix + self._encode_storage_key(coords)
        if encoded is None:
            raise CorruptDataError(f"{key}: the codecs produced no bytes")
        local.set_local(key, encoded)

    def _encode_in_this_thread(self, full: np.ndarray) -> Any:
        """Encode with the codecs' synchronous methods (the mirror of reading)."""
        assert self._sync_codecs is not None
        proto = default_buffer_prototype()
        spec = self._chunk_spec
        serializer, bytes_codecs = self._sync_codecs
        values = proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype))
        encoded = zarr_private.encode_sync(serializer, values, spec)
        for codec in bytes_codecs:
            encoded = zarr_private.encode_sync(codec, encoded, spec)
        return encoded

    def delete_chunk(self, coords: Coords) -> None:
        retry_lost_races(lambda: self._delete_chunk_once(coords), f"{self.name} chunk {coords}")

    def _delete_chunk_once(self, coords: Coords) -> None:
        with self._lock_for(coords):
            try:
                if self.sharding is None:
                    key = self.prefix + self._encode_storage_key(coords)
                    sync(self.store.delete(key))
                else:
                    region = self.chunk_region(coords)
                    self._eraser[region] = self.fill_value
            finally:
                self._forget_index(coords)

    def invalidate(self) -> None:
        super().invalidate()
        self._forget_store_dirs()
        fetches = self.__dict__.get("_fetches")
        if fetches is not None:
            fetches.forget()
        self._index_cache.clear()
        self._chunk_maps.clear()
        self._chunk_maps_bytes = 0
