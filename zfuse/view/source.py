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
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.codecs.sharding import ShardingCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import StorePath

from zfuse.errors import CorruptDataError

Coords = tuple[int, ...]
_INT_RE = re.compile(r"\d+")


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

        Works for any chunk key encoding: candidate coordinates are the key's
        integers, accepted only if encoding them gives the key back.
        """
        rank = len(self.shape)
        if rank == 0:
            return () if key == self.chunk_key(()) else None
        ints = _INT_RE.findall(key)
        for candidate in (ints[-rank:], ints[:rank]):
            if len(candidate) != rank:
                continue
            coords = tuple(int(i) for i in candidate)
            if self.chunk_key(coords) == key:
                return coords
        return None

    @abstractmethod
    def list_chunks(self) -> Iterable[Coords]:
        """Coordinates of the chunks that exist in the store."""

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
        """The source's metadata in v3 form (fill value, attributes, dimension names)."""

    def extensions(self) -> list[str]:
        """Names of the Zarr extensions and notable codecs this source uses."""
        return []

    def invalidate(self) -> None:  # noqa: B027 - optional hook
        """Forget cached store state (after external changes)."""


def _collect(aiter: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [item async for item in aiter]

    return sync(run())


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
        self._index_cache: dict[str, Any] = {}
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
                and all(hasattr(c, "_decode_sync") for c in codecs)
            ):
                self._sync_codecs = (codecs[0], codecs[1:])
        # whole-chunk writes encode in the worker thread too when every codec can
        self._sync_encode = self._sync_codecs is not None and self.sharding is None and all(
            hasattr(c, "_encode_sync") for c in meta.codecs
        )
        self._standard_re: re.Pattern[str] | None = None
        # (key head, separator) for the default and v2 encodings: fast key decoding
        self._standard: tuple[str, str] | None = None
        if self.zarr_format == 2:
            self._standard = ("", meta.dimension_separator)
        else:
            cke = meta.chunk_key_encoding.to_dict()
            sep = (cke.get("configuration") or {}).get("separator", "/" if cke["name"] == "default" else ".")
            if cke["name"] == "default":
                self._standard = ("c" + sep, sep)
            elif cke["name"] == "v2":
                self._standard = ("", sep)
        if self._standard is not None and self.shape:
            head, sep = self._standard
            number = "(0|[1-9][0-9]*)"
            self._standard_re = re.compile(re.escape(head) + re.escape(sep).join([number] * len(self.shape)))

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return self._grid

    # -- keys -------------------------------------------------------------
    def _encode_storage_key(self, coords: Coords) -> str:
        return self.array.metadata.encode_chunk_key(coords)

    def chunk_key(self, coords: Coords) -> str:
        if self._standard is not None and coords:
            head, sep = self._standard
            return head + sep.join(map(str, coords))
        return self._encode_storage_key(coords)

    def decode_key(self, key: str) -> Coords | None:
        fast = self._fast_decode(key, len(self.shape)) if self.shape else None
        if fast is not None:
            return fast if fast != () else None
        return super().decode_key(key)

    def _fast_decode(self, key: str, rank: int) -> Coords | None:
        """The standard encodings by one compiled regex (only canonical integers):
        listing 100,000 keys is dominated by key decoding otherwise. () = not a
        chunk key; None = not a standard encoding, use the general path."""
        if self._standard_re is None:
            return None
        match = self._standard_re.fullmatch(key)
        if match is None:
            return ()
        return tuple(map(int, match.groups()))

    def key_encoding_dict(self) -> dict[str, Any]:
        meta = self.array.metadata
        if self.zarr_format == 2:
            return {"name": "v2", "configuration": {"separator": meta.dimension_separator}}
        return meta.chunk_key_encoding.to_dict()

    def v3_metadata(self) -> dict[str, Any]:
        meta = self.array.metadata
        if self.zarr_format == 2:
            from zarr.metadata.migrate_v3 import _convert_array_metadata

            meta = _convert_array_metadata(meta)
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

    async def _load_indexes(self, shard_coords: Sequence[Coords]) -> list[Any]:
        sem = asyncio.Semaphore(16)

        async def one(shard: Coords) -> Any:
            async with sem:
                return await self._shard_index(shard)

        return await asyncio.gather(*(one(s) for s in shard_coords))

    async def _shard_index(self, shard: Coords) -> Any:
        key = self.prefix + self._encode_storage_key(shard)
        cached = self._index_cache.get(key)
        if cached is not None:
            return cached
        assert self.sharding is not None
        try:
            index = await self.sharding._load_shard_index_maybe(
                StorePath(self.store, key), self.chunks_per_shard
            )
        except Exception as e:  # a bad index checksum or a short object
            raise CorruptDataError(f"{key}: unreadable shard index: {e}") from e
        if index is not None:
            self._index_cache[key] = index
        return index

    # -- reading ----------------------------------------------------------
    def read_chunk(self, coords: Coords, must_exist: bool = False) -> np.ndarray:
        if not self._direct:
            return self.full_chunk(np.asarray(self.array[self.chunk_region(coords)]))
        fetch = self._fetch_inner_chunk if self.sharding is not None else self._fetch_stored_chunk
        fetched = sync(fetch(coords, must_exist))  # store I/O on zarr's event loop
        if fetched is None:
            return np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        buf, spec = fetched
        codecs = self._sync_codecs
        if codecs is None:
            pipeline = (self.sharding or self.array._async_array).codec_pipeline
            (decoded,) = sync(pipeline.decode([(buf, spec)]))
            if decoded is None:
                return np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        else:
            # decoding in this worker thread with the codecs' synchronous methods:
            # zarr's pipeline would hop to a thread per codec, and would hold
            # its event loop, which serves every other read
            serializer, bytes_codecs = codecs
            for codec in reversed(bytes_codecs):
                buf = codec._decode_sync(buf, spec)
            decoded = serializer._decode_sync(buf, spec)
        return np.asarray(decoded.as_numpy_array()).reshape(self.chunk_shape)

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

    def _has_transformers(self) -> bool:
        if self.zarr_format == 2:
            return False
        found = getattr(self, "_transformers", None)
        if found is None:
            from zfuse.ext.api import raw_array_metadata

            try:
                found = bool(raw_array_metadata(self.array).get("storage_transformers"))
            except Exception:  # not a plain zarr.json (e.g. a pre-release layout): not direct
                found = True
            self._transformers = found
        return found

    def _local_root(self) -> str | None:
        """The directory of a local store (under zfuse's metering wrapper), else None.
        Other wrappers may map keys (pre-release layouts): no file sizes through them."""
        from zarr.storage import LocalStore

        from zfuse.ext.transformers import TransformerStore
        from zfuse.store import AtomicLocalStore, MeteredStore

        store = self.store
        while isinstance(store, (TransformerStore, MeteredStore)):
            store = store._store
        return str(store.root) if type(store) in (LocalStore, AtomicLocalStore) else None

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
        root = self._local_root()
        if root is None:
            return None
        out = {}
        for coords, key in self.list_chunk_keys():
            try:
                out[coords] = os.stat(os.path.join(root, self.prefix + key)).st_size
            except FileNotFoundError:
                continue
        return out

    def read_stored(self, coords: Coords) -> bytes | None:
        """Chunk `coords` as stored (an inner chunk's bytes for sharded arrays), not
        decoded; None when nothing is stored."""
        fetch = self._fetch_inner_chunk if self.sharding is not None else self._fetch_stored_chunk
        fetched = sync(fetch(coords, False))
        return None if fetched is None else fetched[0].to_bytes()

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
        return buf, self.array.metadata.get_chunk_spec(coords, self.array._async_array._config, proto)

    async def _fetch_inner_chunk(self, coords: Coords, must_exist: bool) -> tuple[Any, Any] | None:
        """One inner chunk's bytes and spec: the shard index (cached) and one ranged read."""
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
            self._index_cache.pop(key, None)
            raise CorruptDataError(f"{key}: inner chunk {coords} lies outside the stored shard")
        shard_spec = self.array.metadata.get_chunk_spec(shard, self.array._async_array._config, proto)
        return buf, self.sharding._get_chunk_spec(shard_spec)

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
        if self.sharding is not None:
            self._index_cache.pop(self.prefix + self._encode_storage_key(self._storage_coords(coords)), None)

    def write_chunk(self, coords: Coords, data: np.ndarray) -> None:
        region = self.chunk_region(coords)
        clipped = data[tuple(slice(0, r.stop - r.start) for r in region)]
        with self._lock_for(coords):
            try:
                if self.sharding is None and self._direct and self._sync_encode:
                    encoded = self._encode_in_this_thread(coords, self.full_chunk(clipped))
                    sync(self._set_chunk(coords, encoded))  # store I/O on zarr's event loop
                elif self.sharding is None and self._direct:
                    sync(self._write_stored_chunk(coords, self.full_chunk(clipped)))
                else:
                    self._writer[region] = clipped  # zarr rewrites the shard
            finally:
                self._forget_index(coords)

    async def _write_stored_chunk(self, coords: Coords, full: np.ndarray) -> None:
        """Encode one whole chunk with the codec pipeline and store it (one set)."""
        proto = default_buffer_prototype()
        async_array = self.array._async_array
        spec = self.array.metadata.get_chunk_spec(coords, async_array._config, proto)
        values = proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype))
        (encoded,) = await async_array.codec_pipeline.encode([(values, spec)])
        await self._set_chunk(coords, encoded)

    async def _set_chunk(self, coords: Coords, encoded: Any) -> None:
        key = self.prefix + self._encode_storage_key(coords)
        if encoded is None:  # cannot happen with write_empty_chunks semantics; be safe
            raise CorruptDataError(f"{key}: the codecs produced no bytes")
        await self.store.set(key, encoded)

    def _encode_in_this_thread(self, coords: Coords, full: np.ndarray) -> Any:
        """Encode with the codecs' synchronous methods (the mirror of reading)."""
        assert self._sync_codecs is not None
        proto = default_buffer_prototype()
        spec = self.array.metadata.get_chunk_spec(coords, self.array._async_array._config, proto)
        serializer, bytes_codecs = self._sync_codecs
        encoded = serializer._encode_sync(proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype)), spec)
        for codec in bytes_codecs:
            encoded = codec._encode_sync(encoded, spec)
        return encoded

    def delete_chunk(self, coords: Coords) -> None:
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
        self._index_cache.clear()
