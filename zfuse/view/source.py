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

Here: the `ChunkSource` interface, and `ZarrChunkSource`'s reads and writes of
a zarr array. The parts of a `ZarrChunkSource` that keep state of their own are
modules of their own, each held by the source:

- `chunk_codecs.py` (`ChunkCodecs`): its chunks decoded and encoded, in the
  worker thread where the codecs allow, every decompression bounded;
- `shard_writes.py` (`LocalShardWrites`): inner chunks written into a local
  store's shards in the worker thread;

- `chunk_listing.py` (`ChunkListing`): its chunk-key directories listed from the
  store, and what those listings keep (shared store directories, a small remote
  array's whole listing, shards' chunk maps);
- `remote_fetch.py` (`RemoteFetcher`): a remote array's chunks fetched ahead of
  its readers, in batches (whole small shards, ranged requests);
- `shard_indexes.py` (`ShardIndexes`): shard indexes read once and cached.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import stat as stat_mod
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.codecs.sharding import ShardingCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_key_encodings import V2ChunkKeyEncoding
from zarr.core.sync import sync

from zfuse.conditional import retry_lost_races
from zfuse.errors import CorruptDataError, OutsideStoreError
from zfuse.ext import zarr_private
from zfuse.ext.chunk_keys import ChunkKeyDecoder, Coords, standard_layout
from zfuse.ext.read_limits import chunk_read_limited
from zfuse.view.caches import BoundedLRU
from zfuse.view.chunk_codecs import ChunkCodecs, same_values
from zfuse.view.chunk_listing import LIST_PAGE as LIST_PAGE  # (re-exported: the view pages by it)
from zfuse.view.chunk_listing import ChunkListing, DirPage, canonical_int
from zfuse.view.fetch_ahead import MISSED
from zfuse.view.remote_fetch import RemoteFetcher
from zfuse.view.shard_indexes import ShardIndexes
from zfuse.view.shard_writes import LocalShardWrites

DIR_COORDS_KEPT = 16384  # chunk-key directories whose coordinates are remembered
_UNKNOWN = object()


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
      stores;
    - `bounded`: zfuse's metered store of any source, so reached (its `failures`:
      the keys whose requests failed lately).
    """

    local: Any = None
    root: str | None = None
    files: Any = None
    remote: bool = False
    metered: Any = None
    bounded: Any = None


def store_access(store: Any) -> StoreAccess:
    """The `StoreAccess` of a store stack (its wrappers walked once)."""
    from zarr.storage import FsspecStore, LocalStore

    from zfuse.ext.open_memo import OpenMemo
    from zfuse.ext.transformers import TransformerStore
    from zfuse.local_store import AtomicLocalStore
    from zfuse.store import MeteredStore

    inner = store
    # transformer stores pass keys through unless transformers; OpenMemo passes all
    while isinstance(inner, (TransformerStore, OpenMemo)):
        inner = zarr_private.wrapped_store(inner)
    bounded = inner if isinstance(inner, MeteredStore) else None
    local = bounded if bounded is not None and bounded.local_root is not None else None
    metered = bounded if bounded is not None and bounded.remote is not None else None
    while isinstance(inner, (TransformerStore, MeteredStore, OpenMemo)):
        inner = zarr_private.wrapped_store(inner)
    root = str(inner.root) if type(inner) in (LocalStore, AtomicLocalStore) else None
    return StoreAccess(local=local, root=root, files=inner if type(inner) is AtomicLocalStore else None,
                       remote=isinstance(inner, FsspecStore), metered=metered, bounded=bounded)


#: stored chunks whose sizes `stored_sizes` gives at most (a level of more is decoded):
#: a crafted shard of a million 11-byte inner chunks, hard-linked 8 times, cost 2 GB
#: and 31 s at the first read of image.ome.tif's header
STORED_SIZES_MAX = 1 << 21
SHARDS_AT_ONCE = 64  # shard indexes `stored_sizes` reads together


@dataclass(frozen=True)
class StoredSizes:
    """The stored chunks of an array and their stored sizes in bytes: `coords` (one row
    of chunk coordinates per chunk) and `sizes`, numpy arrays (16 bytes and more a chunk,
    no Python object each)."""

    coords: np.ndarray  # (n, ndim) int64
    sizes: np.ndarray  # (n,) int64

    @classmethod
    def joined(cls, coords: list[np.ndarray], sizes: list[np.ndarray], ndim: int) -> StoredSizes:
        if not coords:
            return cls(np.zeros((0, ndim), dtype=np.int64), np.zeros(0, dtype=np.int64))
        return cls(np.concatenate(coords), np.concatenate(sizes))


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

    @abstractmethod
    def decode_key(self, key: str) -> Coords | None:
        """The chunk a key names (any rank, in or out of the grid), or None."""

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
            elif not canonical_int(name) or int(name) >= grid[axis]:
                return None
            else:
                fixed.append(int(name))
        return tuple(fixed)

    @abstractmethod
    def iter_chunk_dir(self, parts: tuple[str, ...]) -> Iterator[DirPage]:
        """Pages of what chunk-key directory `parts` holds (``()`` is the array's own
        directory): ``(name, coords)`` for chunks, ``(name, None)`` for subdirectories;
        only the directory asked for is listed."""

    @abstractmethod
    def chunk_exists(self, coords: Coords) -> bool:
        """Whether chunk `coords` is stored (one existence check, not a listing)."""

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

    def open_raw_chunk(self, coords: Coords) -> int:
        """A descriptor of `raw_chunk_path(coords)`'s file, opened inside the store only
        (`ZarrChunkSource.open_raw_chunk`); only called where that is not None."""
        raise NotImplementedError

    def may_store_raw(self) -> bool:
        """False when `raw_chunk_path` is None for every chunk, as known from memory."""
        return False

    def shard_index_nbytes(self) -> int | None:
        """Bytes of one shard's index (sharding_indexed), None when not sharded."""
        return None

    def unbounded_reason(self) -> str | None:
        """Why this array's chunks could not be decoded within a bound (the array is then
        not shown); None: they can."""
        return None

    # -- stored bytes: what a source can say of its chunks as they are stored. Every
    # source answers (these defaults: nothing known), so callers never probe with
    # getattr; `ZarrChunkSource` answers where its store allows.
    def stored_form(self) -> dict[str, Any]:
        """The array's metadata as stored, for arrays shown without chunk files."""
        return self.v3_metadata()

    def stored_codecs(self) -> list[dict[str, Any]] | None:
        """The codecs between a chunk's values and its stored bytes; None: not read directly."""
        return None

    def stored_sizes(self) -> StoredSizes | None:
        """Stored byte size of every stored chunk, when cheap; None otherwise."""
        return None

    def stored_chunk_path(self, coords: Coords) -> str | None:
        """The local file that holds chunk `coords` as stored; None: none."""
        return None

    def use_index_cache(self, cache: BoundedLRU) -> None:  # noqa: B027 - optional hook
        """Keep shard indexes in `cache` (shared by the arrays of one view)."""

    @abstractmethod
    def read_chunk(self, coords: Coords, must_exist: bool = False) -> np.ndarray:
        """Decoded chunk, full chunk shape; fill value where nothing is stored
        (or CorruptDataError with `must_exist`: a listed chunk that vanished)."""

    @abstractmethod
    def write_chunk(self, coords: Coords, data: np.ndarray, *, lossy: bool = False) -> None:
        """Store `data` (full chunk shape, or the clipped shape of an edge chunk). Values
        the array's codecs cannot hold exactly (a lossy or narrowing codec) are refused
        (InvalidTiffError) unless `lossy`; values the chunk holds already are not stored
        again (a lossy codec would degrade them at each copy)."""

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

    def dimension_names(self) -> list[str] | None:
        """The array's dimension names (`v3_metadata`'s), if it has them."""
        return self.v3_metadata().get("dimension_names")

    def extensions(self) -> list[str]:
        """Names of the Zarr extensions and notable codecs this source uses."""
        return []

    @property
    def checks_written_values(self) -> bool:
        """Whether `write_chunk` encodes and decodes a chunk once before storing it (codecs
        not known to be exact): a commit then holds more memory for it."""
        return False

    def write_refusal(self, coords: Coords) -> OSError | None:
        """Why writing or deleting chunk `coords` would fail, where the store can tell
        before anything changes (a local directory this process may not write); None:
        nothing known stands in the way (blocking: a few system calls)."""
        return None

    def retry_failed(self, coords: Coords) -> None:
        """Ask the store again, at once, for chunk `coords` if a request for it timed out
        or failed lately (a reader looking its file up or opening it anew). Sources
        with no store of their own have nothing to ask again."""
        return

    def forget_listing(self) -> None:  # noqa: B027 - optional hook
        """Drop what listings the source keeps (a chunk was written or deleted through it)."""

    def invalidate(self) -> None:
        """Forget cached store state (after external changes)."""
        self.forget_listing()


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


_NOT_LOCAL: Any = object()


class ZarrChunkSource(ChunkSource):
    """A zarr-python array (v2 or v3, any codecs, optionally sharded)."""

    def __init__(self, array: zarr.Array, name: str | None = None) -> None:
        super().__init__()
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
        # shard indexes: read once each, kept in a bounded cache (the view's, once
        # `use_index_cache` is called); a remote store's fetches ahead: `_fetcher`
        self._indexes = ShardIndexes(self.storage_key, self.store, self.sharding,
                                     self.chunks_per_shard if self.sharding is not None else None)
        # the chunk-key directories listed from the store, and what those listings keep
        self._listing = ChunkListing(self, self._indexes)
        # decoding and encoding (which codecs run in the worker thread, the bounds; a v2
        # array in F order: its chunks' stored bytes are its values in F order)
        self.codecs = ChunkCodecs(array, self.sharding, self.fill_value)
        self._c_order_bytes = self.codecs.order == "C"
        encoding = (
            V2ChunkKeyEncoding(separator=meta.dimension_separator) if self.zarr_format == 2 else meta.chunk_key_encoding
        )
        # (key head, separator) for the default and v2 encodings: fast key encoding
        self.standard_keys: tuple[str, str] | None = standard_layout(encoding)
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
        self._indexes.use_cache(cache)

    # -- keys -------------------------------------------------------------
    def _encode_storage_key(self, coords: Coords) -> str:
        return self.array.metadata.encode_chunk_key(coords)

    def storage_key(self, coords: Coords) -> str:
        """The store key of the storage object at `coords` in `storage_grid` (a shard's, if
        sharded), the array's prefix included."""
        return self.prefix + self._encode_storage_key(coords)

    def chunk_key(self, coords: Coords) -> str:
        if self.standard_keys is not None and coords:
            head, sep = self.standard_keys
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
        names = self.dimension_names()
        if names is not None:
            doc["dimension_names"] = names
        return doc

    def dimension_names(self) -> list[str] | None:
        # (without building the whole metadata document: every array view asks, at open)
        names = getattr(self.array.metadata, "dimension_names", None)
        if names is None and self.zarr_format == 2:
            # xarray's v2 spelling: the same dataset written as v3 has them as dimension_names
            # (its axes for the chunk and whole-image files; xarray reading the mount needs them there)
            said = self.array.attrs.get("_ARRAY_DIMENSIONS")
            if isinstance(said, list) and len(said) == len(self.shape) and all(isinstance(n, str) for n in said):
                names = said
        return list(names) if names is not None else None

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
        indexes = sync(self._indexes.load(shard_coords))
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
        """One delimited listing of the store directory behind `parts`, paged
        (`ChunkListing.iter_chunk_dir`: a sharded array's directories too)."""
        return self._listing.iter_chunk_dir(parts)

    def chunk_exists(self, coords: Coords) -> bool:
        """One existence check of the chunk's key (or one read of its shard's index,
        then cached): no listing."""
        if not self.in_grid(coords):
            return False
        if self.sharding is None:
            key = self.storage_key(coords)
            local = self._local_store
            if local is not None:  # in this worker thread, as `_fetch_local` reads
                return local.exists_local(key)
            fetcher = self._fetcher
            if fetcher is not None:  # being fetched ahead: that GET answers, no HEAD of its own
                fetched = fetcher.peek(coords)
                if fetched is not MISSED:
                    return fetched is not None
            return bool(sync(self.store.exists(key)))
        shard = self.storage_coords(coords)
        index = self._indexes.cached(shard)
        if index is None:  # not cached: read (and cache) it on zarr's event loop
            index = sync(self._indexes.get(shard))
        return index is not None and index.get_chunk_slice(coords) is not None

    @property
    def lists_locally(self) -> bool:
        return self.listing_store() is not None

    def exists_is_local(self, coords: Coords) -> bool:
        if self._local_store is None or not self.in_grid(coords):
            return False
        if self.sharding is None:
            return True
        return self._indexes.cached(self.storage_coords(coords)) is not None

    # -- reading ----------------------------------------------------------
    def read_chunk(self, coords: Coords, must_exist: bool = False) -> np.ndarray:
        try:
            return self._read_chunk_once(coords, must_exist)
        except CorruptDataError:
            # A chunk stored as several objects (concat-parts) is written one object
            # at a time: a read between the two sees parts that disagree; a shard's
            # index read before a rewrite of the shard points past its new bytes
            # (forgotten: read again). Wait for a write in flight on this storage
            # object and read once more; real corruption fails again and is reported.
            # Any other chunk is not read twice (a bomb would cost its decoding twice).
            if self.sharding is None and not self.has_transformers():
                raise
            with self._lock_for(coords):
                pass
            return self._read_chunk_once(coords, must_exist)

    def _read_chunk_once(self, coords: Coords, must_exist: bool) -> np.ndarray:
        fetched = self._fetch(coords, must_exist)
        if fetched is None:
            return np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        buf, spec = fetched
        try:
            return self.codecs.decode(buf, spec)
        except CorruptDataError as e:
            raise CorruptDataError(f"{self.chunk_key(coords)}: {e}") from e
        except (ValueError, RuntimeError, TypeError) as e:
            # zarr's codecs meet bad stored bytes as any of these: corrupt data (EIO for
            # this file, one log line), not a daemon error
            raise CorruptDataError(f"{self.chunk_key(coords)}: the stored chunk does not decode: "
                                   f"{type(e).__name__}: {e}") from e

    @functools.cached_property
    def _storage_object_max(self) -> int | None:
        """Bytes a whole storage object (a shard: its inner chunks and its index; else a
        chunk) is read up to; None where storage transformers lie between (a
        sharding-v1 shard's bound is theirs: the default bound applies)."""
        if self.sharding is not None:
            inner = math.prod(self.chunks_per_shard)
            return inner * self.codecs.stored_max + 16 * inner + 4 + (1 << 20)
        return None if self.has_transformers() else self.codecs.stored_max

    # -- stored bytes (whole-image passthrough) -------------------------------
    def stored_codecs(self) -> list[dict[str, Any]] | None:
        """The codecs between a chunk's values and its stored bytes (the inner codecs
        of a sharded array), as v3 dicts; None when stored bytes are not read directly
        (F order) or their sizes are not cheap to know (neither sharded nor local).
        No I/O: `stored_sizes` checks the rest (storage transformers)."""
        if not self._c_order_bytes or (self.sharding is None and self._local_root() is None):
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

    def listing_store(self) -> Any:
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

    def has_transformers(self) -> bool:
        """Whether the stored ``zarr.json`` names storage transformers (which map chunk
        keys to keys of their own): from the copy recorded at open where there is one."""
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
    def access(self) -> StoreAccess:
        """What the store stack offers beyond zarr's Store API, found once."""
        return store_access(self.store)

    def _local_root(self) -> str | None:
        """The directory of a local store (under zfuse's metering wrapper), else None.
        Other wrappers may map keys (pre-release layouts): no file sizes through them."""
        return self.access.root

    def _local_files(self) -> Any:
        """The `AtomicLocalStore` under `_local_root`'s wrappers, or None: its `open_key`
        and `stat_key` open stored files inside the store only."""
        return self.access.files

    def stored_sizes(self) -> StoredSizes | None:
        """Stored byte size of every stored chunk (inner chunks of shards), when that is
        cheap: shard indexes (read SHARDS_AT_ONCE at a time), or a local store's file
        sizes; at most STORED_SIZES_MAX of them. None otherwise (blocking)."""
        if self.stored_codecs() is None or self.has_transformers():
            return None
        ndim = len(self.shape)
        coords_parts: list[np.ndarray] = []
        size_parts: list[np.ndarray] = []
        found = 0
        if self.sharding is not None:
            shards = [c for c, _ in self._keys_with_coords()]
            grid = np.array(self.grid_shape, dtype=np.int64)
            per_shard = np.array(self.chunks_per_shard, dtype=np.int64)
            for at in range(0, len(shards), SHARDS_AT_ONCE):
                batch = shards[at : at + SHARDS_AT_ONCE]
                for shard, index in zip(batch, sync(self._indexes.load(batch)), strict=True):
                    if index is None:
                        continue
                    stored = index.get_full_chunk_map()
                    found += int(np.count_nonzero(stored))
                    if found > STORED_SIZES_MAX:
                        return None
                    local = np.argwhere(stored).astype(np.int64)
                    coords = np.array(shard, dtype=np.int64) * per_shard + local
                    inside = (coords < grid).all(axis=1)
                    coords_parts.append(coords[inside])
                    size_parts.append(index.offsets_and_lengths[..., 1][stored][inside].astype(np.int64))
            return StoredSizes.joined(coords_parts, size_parts, ndim)
        files = self._local_files()
        if files is None:
            return None
        listed: list[tuple[int, ...]] = []
        sizes: list[int] = []
        for coords, key in self.list_chunk_keys():
            try:
                st = files.stat_key(self.prefix + key)  # inside the store only
            except OutsideStoreError:
                return None  # a chunk leading out of the store: decoded, where reading it fails
            if st is not None:
                if len(listed) >= STORED_SIZES_MAX:
                    return None
                listed.append(coords)
                sizes.append(st.st_size)
        return StoredSizes(np.array(listed, dtype=np.int64).reshape(len(listed), ndim),
                           np.array(sizes, dtype=np.int64))

    def stored_chunk_path(self, coords: Coords) -> str | None:
        """The local file that holds chunk `coords` as stored (it may not exist), when the
        store is a local directory and a chunk is one whole object (not sharded, no
        transformers); None otherwise. No I/O: readers of stored bytes can then read
        just the range they need instead of the whole object through zarr."""
        root = self._chunk_root
        if root is None:
            return None
        key = self.storage_key(coords)
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

    def open_raw_chunk(self, coords: Coords) -> int:
        """A read-only descriptor of chunk `coords`'s stored file (`stored_chunk_path`),
        opened inside the store only: a key or link leading out of it, or what is no
        regular file, raises OutsideStoreError."""
        files = self._local_files()
        if files is None:
            raise OutsideStoreError(f"{self.name}: chunk {coords} is not in a local store")
        key = self.storage_key(coords)
        try:
            fd, _ = files.open_file_key(key)  # (never waiting on a FIFO)
        except IsADirectoryError as e:
            raise OutsideStoreError(f"{key}: a directory, not a stored chunk: not read") from e
        return int(fd)

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
        return os.path.join(self._chunk_root, self.storage_key(coords))

    def may_store_raw(self) -> bool:
        return self._raw_stored

    def unbounded_reason(self) -> str | None:
        if self.zarr_format != 3:
            return None
        codecs = list(self.array.metadata.codecs)
        nested = self.sharding is not None and any(isinstance(c, ShardingCodec) for c in self.sharding.codecs)
        later = any(isinstance(c, ShardingCodec) for c in codecs[1:])
        if nested or later:
            # (zarr's pipeline decodes such shards whole, every inner chunk's codec
            # allocating what its stream declares: 2 KB took 3.5 GB)
            where = "inside another's codecs (nested sharding)" if nested else "after another codec"
            return (f"a sharding codec {where}: zfuse cannot bound what its inner chunks decode to, "
                    "so it does not read them")
        return None

    def shard_index_nbytes(self) -> int | None:
        if self.sharding is None:
            return None
        return 16 * math.prod(self.chunks_per_shard)  # (and a checksum, 4 bytes, or none)

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
        direct = self.sharding is None and not self.has_transformers()
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
        fetcher = self._fetcher
        if fetcher is not None:
            fetched = fetcher.take(coords)  # fetched ahead, or being fetched: no request of its own
            if fetched is None:
                if must_exist:
                    raise self._vanished(self.chunk_key(coords))
                return None
            if fetched is not MISSED:
                return fetched, self.codecs.spec
        fetch = self._fetch_inner_chunk if self.sharding is not None else self._fetch_stored_chunk
        return sync(fetch(coords, must_exist))

    @functools.cached_property
    def _fetcher(self) -> RemoteFetcher | None:
        """Remote stores: chunks fetched ahead of readers (`fetch_ahead`), on zarr's
        event loop, taken by `_fetch`."""
        if not self.access.remote:
            return None
        return RemoteFetcher(self, self._indexes)

    @property
    def fetches_remotely(self) -> bool:
        return self._fetcher is not None

    @functools.cached_property
    def caches_ranges(self) -> bool:
        """Whether the remote store keeps what it fetched on disk (`-o cache=DIR`)."""
        metered = self.access.metered
        return metered is not None and metered.cache is not None

    def fetch_ahead(self, coords: Sequence[Coords], skip: Callable[[Coords], bool] | None = None) -> None:
        """Start fetching these chunks' stored bytes for reads to come, leaving out those
        `skip` says are at hand: a remote store's (`RemoteFetcher.ahead`: a sharded
        array's window widened to whole small shards); nothing for other stores."""
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.ahead(coords, skip)

    @functools.cached_property
    def _local_store(self) -> Any:
        """zfuse's metered store when it wraps a local directory directly (no storage
        transformers or key mapping in between), else None: its synchronous methods
        (`get_local`, `exists_local`, `list_dir_local`, `set_local`) are the fast path."""
        local = self.access.local
        return local if local is not None and not self.has_transformers() else None

    def _fetch_local(self, local: Any, coords: Coords, must_exist: bool) -> Any:
        """`_fetch_stored_chunk`/`_fetch_inner_chunk` without the event loop; _NOT_LOCAL
        when a shard's index is not cached yet (the async path reads and caches it)."""
        proto = default_buffer_prototype()
        if self.sharding is None:
            key = self.storage_key(coords)
            data = local.get_local(key, max_bytes=self.codecs.stored_max)
            if data is None:
                if must_exist:
                    raise self._vanished(key)
                return None
            return proto.buffer.from_bytes(data), self.codecs.spec
        shard = self.storage_coords(coords)
        key = self.storage_key(shard)
        index = self._indexes.cached(shard)
        if index is None:
            return _NOT_LOCAL
        byte_slice = index.get_chunk_slice(coords)
        if byte_slice is None:
            if must_exist:
                raise self._vanished(f"{key} (inner chunk {coords})")
            return None
        start, end = byte_slice
        self._check_inner_size(key, shard, coords, start, end)
        data = local.get_local(key, byte_slice)
        if data is None or len(data) != end - start:
            self._indexes.forget(shard)
            raise CorruptDataError(f"{key}: inner chunk {coords} lies outside the stored shard")
        return proto.buffer.from_bytes(data), self.codecs.spec

    def _check_inner_size(self, key: str, shard: Coords, coords: Coords, start: int, end: int) -> None:
        """CorruptDataError (the index forgotten) if an inner chunk's range in its shard's
        index is past what it can be stored in: never read, locally or remotely."""
        if end - start > self.codecs.stored_max:
            self._indexes.forget(shard)
            raise CorruptDataError(f"{key}: inner chunk {coords} is {end - start} bytes in the shard's "
                                   f"index, past the {self.codecs.stored_max} it can be stored in")

    def _vanished(self, key: str) -> CorruptDataError:
        return CorruptDataError(f"{key}: listed chunk is no longer in the store")

    async def _fetch_stored_chunk(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        """One stored chunk's bytes and spec (one get; no zarr selection machinery,
        which costs more than decoding a raw chunk). Zarr stores edge chunks at full
        shape, so decoding gives the full chunk as is. None: nothing stored."""
        proto = default_buffer_prototype()
        key = self.storage_key(coords)
        with chunk_read_limited(self.codecs.stored_max):  # (an endless body is not held)
            buf = await self.store.get(key, prototype=proto)
        if buf is None:
            if must_exist:
                raise self._vanished(key)
            return None
        return buf, self.codecs.spec

    async def _fetch_inner_chunk(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        """One inner chunk's bytes and spec: the shard index (cached) and one ranged read.
        A shard another host rewrote since its index was read (ObjectChangedError: its
        ranges are pinned to the version the index came from) is read afresh once: its
        new index, then the chunk's range in the new version."""
        from zfuse.remote_objects import ObjectChangedError

        try:
            return await self._fetch_inner_chunk_once(coords, must_exist)
        except ObjectChangedError:
            metered = self.access.metered
            if metered is None:
                raise
            shard = self.storage_coords(coords)
            self._indexes.forget(shard)
            metered.forget_version(self.storage_key(shard))
            return await self._fetch_inner_chunk_once(coords, must_exist)

    async def _fetch_inner_chunk_once(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        assert self.sharding is not None
        shard = self.storage_coords(coords)
        key = self.storage_key(shard)
        index = await self._indexes.get(shard)
        byte_slice = index.get_chunk_slice(coords) if index is not None else None
        if byte_slice is None:
            if must_exist:
                raise self._vanished(f"{key} (inner chunk {coords})")
            return None
        start, end = byte_slice
        self._check_inner_size(key, shard, coords, start, end)  # (never asked for, however it streams)
        proto = default_buffer_prototype()
        buf = await self.store.get(key, prototype=proto, byte_range=RangeByteRequest(start, end))
        if buf is None or len(buf) != end - start:
            self._indexes.forget(shard)
            raise CorruptDataError(f"{key}: inner chunk {coords} lies outside the stored shard")
        return buf, self.codecs.spec

    # -- writing ----------------------------------------------------------
    def storage_coords(self, coords: Coords) -> Coords:
        """The grid position of the storage object holding chunk `coords` (its shard, if sharded)."""
        if self.sharding is None:
            return coords
        return tuple(c // n for c, n in zip(coords, self.chunks_per_shard, strict=True))

    def _lock_for(self, coords: Coords) -> threading.Lock:
        key = self._encode_storage_key(self.storage_coords(coords))
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    @property
    def checks_written_values(self) -> bool:
        return not self.codecs.exact

    def write_refusal(self, coords: Coords) -> OSError | None:
        files = self.access.files
        return files.write_refusal(self.storage_key(self.storage_coords(coords))) if files is not None else None

    def retry_failed(self, coords: Coords) -> None:
        failures = self.access.bounded.failures if self.access.bounded is not None else None
        if failures is None or not failures.pending():
            return
        if self.zarr_format == 2 or self._recorded_transformers() is False:
            failures.forget(self.storage_key(self.storage_coords(coords)))  # (its shard's, if sharded)
        else:  # (storage transformers may map the chunk to keys of their own)
            failures.forget_under(self.prefix)

    def _forget_index(self, coords: Coords) -> None:
        self._listing.forget_store_dirs()  # (a write may have made a new shard object)
        fetcher = self.__dict__.get("_fetcher")  # (what a write makes stale, if any was fetched ahead)
        if fetcher is not None:
            fetcher.forget()
        if self.sharding is not None:
            self._indexes.forget(self.storage_coords(coords))

    def write_chunk(self, coords: Coords, data: np.ndarray, *, lossy: bool = False) -> None:
        if not self.codecs.exact:
            region = self.chunk_region(coords)
            inside = tuple(slice(0, r.stop - r.start) for r in region)
            clipped = np.asarray(data, dtype=self.dtype)[inside]
            try:  # (a chunk not stored, or that does not read: the write stores it)
                held = self.read_chunk(coords, must_exist=True)[inside]
            except Exception:
                held = None
            if held is not None and same_values(held, clipped):
                return  # (what the chunk holds: stored again, a lossy codec would change it)
            del held  # (not kept through the check: its memory is the write budget's)
            self.codecs.check_exact(self.full_chunk(clipped), inside, lossy)
        # another host's write between this one's read and write: redone (zfuse/conditional.py)
        retry_lost_races(lambda: self._write_chunk_once(coords, data), f"{self.name} chunk {coords}")

    def _write_chunk_once(self, coords: Coords, data: np.ndarray) -> None:
        region = self.chunk_region(coords)
        clipped = data[tuple(slice(0, r.stop - r.start) for r in region)]
        with self._lock_for(coords):
            new_index = None
            try:
                if self.sharding is not None and self._shard_writes.available:
                    shard_key = self.storage_key(self.storage_coords(coords))
                    new_index = self._shard_writes.write(shard_key, coords, self.full_chunk(clipped))
                elif self.sharding is None and self.codecs.encodes_in_thread:
                    encoded = self.codecs.encode(self.full_chunk(clipped))
                    local = self._local_store
                    if local is not None and local.local_writer:
                        self._set_chunk_local(local, coords, encoded)  # in this worker thread
                    else:
                        sync(self._set_chunk(coords, encoded))  # store I/O on zarr's event loop
                elif self.sharding is None:
                    sync(self._write_stored_chunk(coords, self.full_chunk(clipped)))
                else:
                    with chunk_read_limited(self._storage_object_max):
                        self._writer[region] = clipped  # zarr rewrites the shard (read whole, bounded)
            finally:
                self._forget_index(coords)
                if new_index is not None:  # the shard just written: no need to read it back
                    self._indexes.keep(self.storage_coords(coords), new_index)

    async def _write_stored_chunk(self, coords: Coords, full: np.ndarray) -> None:
        """Encode one whole chunk with the codec pipeline and store it (one set)."""
        await self._set_chunk(coords, await self.codecs.encode_on_loop(full))

    @functools.cached_property
    def _shard_writes(self) -> LocalShardWrites:
        """Inner chunks written into a local store's shards in the worker thread."""
        assert self.sharding is not None
        return LocalShardWrites(self.sharding, self.chunks_per_shard, self.codecs, len(self.array.metadata.codecs),
                                self._local_store, self._storage_object_max)

    async def _set_chunk(self, coords: Coords, encoded: Any) -> None:
        key = self.storage_key(coords)
        if encoded is None:  # cannot happen with write_empty_chunks semantics; be safe
            raise CorruptDataError(f"{key}: the codecs produced no bytes")
        await self.store.set(key, encoded)

    def _set_chunk_local(self, local: Any, coords: Coords, encoded: Any) -> None:
        """`_set_chunk` on a local store, without zarr's event loop (the mirror of `_fetch_local`)."""
        key = self.storage_key(coords)
        if encoded is None:
            raise CorruptDataError(f"{key}: the codecs produced no bytes")
        local.set_local(key, encoded)

    def delete_chunk(self, coords: Coords) -> None:
        retry_lost_races(lambda: self._delete_chunk_once(coords), f"{self.name} chunk {coords}")

    def write_region(self, region: tuple[slice, ...], values: Any) -> None:
        """Store `values` (the fill value: erase) into `region` of the array, whatever its
        alignment to the chunks, as `write_chunk` stores one chunk: under the locks of the
        storage objects it touches, their cached indexes and listings forgotten after."""
        retry_lost_races(lambda: self._write_region_once(region, values), f"{self.name} region {region}")

    def _write_region_once(self, region: tuple[slice, ...], values: Any) -> None:
        first = self.storage_coords(tuple(r.start // c for r, c in zip(region, self.chunk_shape, strict=True)))
        last = self.storage_coords(tuple((r.stop - 1) // c for r, c in zip(region, self.chunk_shape, strict=True)))
        objects = list(itertools.product(*(range(a, b + 1) for a, b in zip(first, last, strict=True))))
        erase = np.ndim(values) == 0 and np.array_equal(values, self.fill_value, equal_nan=True)
        with contextlib.ExitStack() as held:
            for obj in sorted(objects):  # (one order: no two writers wait on each other)
                held.enter_context(self._lock_for(self._first_chunk_of(obj)))
            try:
                with chunk_read_limited(self._storage_object_max):
                    (self._eraser if erase else self._writer)[region] = values
            finally:
                for obj in objects:
                    self._forget_index(self._first_chunk_of(obj))

    def _first_chunk_of(self, storage: Coords) -> Coords:
        """The first chunk (inner chunk) of the storage object at `storage` (`storage_coords`'s inverse)."""
        if self.sharding is None:
            return storage
        return tuple(s * n for s, n in zip(storage, self.chunks_per_shard, strict=True))

    def _delete_chunk_once(self, coords: Coords) -> None:
        with self._lock_for(coords):
            try:
                if self.sharding is None:
                    key = self.storage_key(coords)
                    sync(self.store.delete(key))
                else:
                    region = self.chunk_region(coords)
                    self._eraser[region] = self.fill_value
            finally:
                self._forget_index(coords)

    def invalidate(self) -> None:
        super().invalidate()
        self._listing.invalidate()
        fetcher = self.__dict__.get("_fetcher")
        if fetcher is not None:
            fetcher.forget()
        self._indexes.clear()
