"""Sharding storage transformer, version 1.0 (spec: docs/specs/sharding-storage-transformer-v1.rst).

Recognised (see :func:`zfuse.ext.stack.transformer_kind`) by ``"extension"``
or ``"name"`` equal to ``https://purl.org/zarr/spec/storage_transformers/sharding/1.0``,
or ``"name": "sharding"``; ``"type"`` (top level or in ``configuration``) must be
``"indexed"`` when given; ``configuration.chunks_per_shard`` lists one positive
integer per array dimension.

Invariants
----------
* Shard key = the chunk key with every coordinate floor-divided by
  ``chunks_per_shard``, encoded with the array's own chunk key encoding.
* A shard is chunk bytes followed by an index of ``n = prod(chunks_per_shard)``
  little-endian uint64 ``(offset, nbytes)`` pairs in C order; ``(2^64-1, 2^64-1)``
  marks an empty position.  The index always has all ``n`` positions.
* This writer stores the chunks back to back in C order from offset 0, then the
  index.  Any valid layout is read.
* Reading one chunk (or a byte range of it) = exactly one ranged read of the
  index (a suffix request of ``16 n`` bytes) and, if the chunk exists, one
  ranged read of the chunk's bytes.  ``exists``/``getsize`` = the index read only.
* Writing/deleting a chunk rewrites its shard keeping the others, under a
  per-shard lock shared by every wrapper in the process (keyed by the store's
  identity and the shard's full key), so concurrent writers of different chunks
  of one shard never lose updates.  Readers take the same lock shared, so they
  never pair an old index with new bytes.  Deleting the last chunk removes the
  shard.  Other processes are not coordinated.
* Validation, CorruptDataError naming the shard key: an index shorter than
  ``16 n`` bytes, a half-empty entry, entries overlapping each other, an entry
  outside the shard.  Writes read the whole shard, so they check all of it and
  refuse (changing nothing) to rewrite a corrupt shard; reads check what the two
  ranged reads reveal (overlaps, and a chunk read that comes back short).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.chunk_key_encodings import ChunkKeyEncoding

from zfuse.errors import CorruptDataError, MetadataError
from zfuse.ext.chunk_keys import ChunkKeyDecoder
from zfuse.ext.layers import ChunkIO, slice_for_request

__all__ = [
    "EMPTY",
    "SHARDING_V1_URI",
    "ShardingV1IO",
    "build_shard",
    "parse_index",
    "parse_sharding_v1",
]

SHARDING_V1_URI = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
EMPTY = 2**64 - 1
#: bytes of one shard's index at most (16 per chunk: 1M chunks per shard)
MAX_INDEX_BYTES = 16 * 2**20


def parse_sharding_v1(
    doc: dict[str, Any], rank: int, *, field: str = "storage_transformers[?]"
) -> tuple[int, ...]:
    """chunks_per_shard from a sharding-v1 transformer document (MetadataError naming the field)."""
    conf = doc.get("configuration")
    if not isinstance(conf, dict):
        raise MetadataError(f"{field}.configuration: missing or not an object")
    kind = doc.get("type", conf.get("type", "indexed"))
    if kind != "indexed":
        raise MetadataError(
            f"{field}.type: unknown sharding v1 binary format {kind!r} (only 'indexed')"
        )
    cps = conf.get("chunks_per_shard")
    if not isinstance(cps, list | tuple) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in cps
    ):
        raise MetadataError(
            f"{field}.configuration.chunks_per_shard: must be a list of positive integers, got {cps!r}"
        )
    if len(cps) != rank:
        raise MetadataError(
            f"{field}.configuration.chunks_per_shard: has {len(cps)} entries but the array has "
            f"{rank} dimensions"
        )
    n = math.prod(cps)
    if 16 * n > MAX_INDEX_BYTES:
        # every read of a chunk reads its shard's index whole (none is kept)
        raise MetadataError(
            f"{field}.configuration.chunks_per_shard: {n} chunks per shard make an index of "
            f"{16 * n} bytes, read for every chunk; zfuse reads indexes of at most {MAX_INDEX_BYTES}"
        )
    return tuple(cps)


def parse_index(raw: bytes, n: int, *, key: str, data_len: int | None = None) -> np.ndarray:
    """Validate a shard index; returns an (n, 2) uint64 array of (offset, nbytes).

    ``raw`` is exactly the index bytes (or fewer, when the shard is too short).
    ``data_len`` is the length of the shard before the index, when known.
    """
    if len(raw) < 16 * n:
        raise CorruptDataError(
            f"sharding v1: shard {key!r} is {len(raw)} bytes, shorter than its index of "
            f"16 x {n} = {16 * n} bytes"
        )
    index = np.frombuffer(raw[len(raw) - 16 * n :], dtype="<u8").reshape(n, 2)
    offsets, sizes = index[:, 0], index[:, 1]
    empty_o, empty_n = offsets == EMPTY, sizes == EMPTY
    half = np.flatnonzero(empty_o != empty_n)
    if half.size:
        raise CorruptDataError(
            f"sharding v1: shard {key!r} index entry {int(half[0])} has only one of offset/nbytes "
            f"set to 2^64-1"
        )
    used = np.flatnonzero(~empty_o)
    if used.size:
        # in numpy, without Python ints per entry (a 64 MiB index is 4M entries):
        # offset + nbytes may overflow uint64, so the bound is checked as a difference
        o, n_ = offsets[used], sizes[used]
        limit = np.uint64(data_len if data_len is not None else 2**63)
        outside = (n_ > limit) | (o > limit - np.minimum(n_, limit))
        if outside.any():
            j = int(np.flatnonzero(outside)[0])
            where = f"the {data_len} data bytes" if data_len is not None else "any possible shard"
            raise CorruptDataError(
                f"sharding v1: shard {key!r} index entry {int(used[j])} "
                f"(offset {int(o[j])}, nbytes {int(n_[j])}) lies outside {where}"
            )
        # Sorted by offset, any overlap shows between neighbours (zero-length entries can't
        # overlap); every end is within the limit now, so o + n does not overflow
        nz = np.flatnonzero(n_ > 0)
        nz = nz[np.argsort(o[nz], kind="stable")]
        overlaps = np.flatnonzero((o[nz] + n_[nz])[:-1] > o[nz][1:])
        if overlaps.size:
            a, b = nz[overlaps[0]], nz[overlaps[0] + 1]
            raise CorruptDataError(
                f"sharding v1: shard {key!r} index entries {int(used[a])} and {int(used[b])} overlap"
            )
    return index


def build_shard(chunks: dict[int, bytes], n: int) -> bytes:
    """Chunks back to back in C order, then the index."""
    index = np.full((n, 2), EMPTY, dtype="<u8")
    out: list[bytes] = []
    pos = 0
    for i in sorted(chunks):
        data = chunks[i]
        index[i] = (pos, len(data))
        out.append(data)
        pos += len(data)
    out.append(index.tobytes())
    return b"".join(out)


class _RWLock:
    """State of one readers-writer lock (guarded by _LockTable._mutex)."""

    def __init__(self) -> None:
        self.readers = 0
        self.writer = False
        self.waiting_writers = 0
        self.refs = 0


class _LockTable:
    """Per-key readers-writer locks, created on demand and dropped when unused.

    Waiters poll with asyncio.sleep instead of blocking: the holder may be a coroutine on
    the same event loop (blocking would deadlock it) or on another thread's loop (an
    asyncio.Lock would not work across loops).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, _RWLock] = {}

    @asynccontextmanager
    async def hold(self, key: str, *, write: bool) -> AsyncIterator[None]:
        with self._mutex:
            lock = self._locks.setdefault(key, _RWLock())
            lock.refs += 1
            if write:
                lock.waiting_writers += 1
        try:
            delay = 0.0001
            while True:
                with self._mutex:
                    if write and not lock.writer and lock.readers == 0:
                        lock.writer = True
                        lock.waiting_writers -= 1
                        break
                    # writers first, so a stream of readers cannot starve them
                    if not write and not lock.writer and lock.waiting_writers == 0:
                        lock.readers += 1
                        break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.005)
            try:
                yield
            finally:
                with self._mutex:
                    if write:
                        lock.writer = False
                    else:
                        lock.readers -= 1
        finally:
            with self._mutex:
                lock.refs -= 1
                if lock.refs == 0:
                    self._locks.pop(key, None)


# One table for the process: two wrappers over the same store must share shard locks.
SHARD_LOCKS = _LockTable()


class ShardingV1IO(ChunkIO):
    """Sharding storage transformer v1 over ``inner`` (the next layer toward the store)."""

    def __init__(
        self, inner: ChunkIO, chunks_per_shard: tuple[int, ...], encoding: ChunkKeyEncoding
    ) -> None:
        self.inner = inner
        self.cps = chunks_per_shard
        self.encoding = encoding
        self._decode_key = ChunkKeyDecoder(len(self.cps), encoding=encoding)
        self.n = math.prod(chunks_per_shard)
        self.index_nbytes = 16 * self.n
        depth, layer = 0, inner
        while hasattr(layer, "inner"):
            depth, layer = depth + 1, layer.inner
        self._depth = depth

    def full_key(self, key: str) -> str:
        return self.inner.full_key(key)

    @property
    def lock_namespace(self) -> str:
        return self.inner.lock_namespace

    # -- keys ------------------------------------------------------------------------

    def _decode(self, key: str) -> tuple[int, ...] | None:
        return self._decode_key(key)

    def locate(self, key: str) -> tuple[str, int]:
        """(shard key, position of the chunk in the shard's C-order index)."""
        coords = self._decode(key)
        if coords is None:
            raise KeyError(f"sharding v1: {self.full_key(key)!r} is not a chunk key of this array")
        shard = tuple(c // s for c, s in zip(coords, self.cps, strict=True))
        local = tuple(c % s for c, s in zip(coords, self.cps, strict=True))
        pos = int(np.ravel_multi_index(local, self.cps)) if self.cps else 0
        return self.encoding.encode_chunk_key(shard), pos

    def _chunk_key(self, shard: tuple[int, ...], pos: int) -> str:
        local = np.unravel_index(pos, self.cps) if self.cps else ()
        coords = tuple(int(s * c + lo) for s, c, lo in zip(shard, self.cps, local, strict=True))
        return self.encoding.encode_chunk_key(coords)

    def _lock(self, shard_key: str, *, write: bool) -> Any:
        # The layer's depth is part of the key: in a [sharding, sharding] stack both layers
        # lock the same full key, and the outer one holds its lock while calling the inner.
        return SHARD_LOCKS.hold(
            f"{self.lock_namespace}\0{self._depth}\0{self.full_key(shard_key)}", write=write
        )

    # -- reading ---------------------------------------------------------------------

    async def _read_index(self, shard_key: str) -> np.ndarray | None:
        raw = await self.inner.get(shard_key, SuffixByteRequest(self.index_nbytes))
        if raw is None:
            return None
        return parse_index(raw, self.n, key=self.full_key(shard_key))

    async def _entry(self, key: str) -> tuple[str, int, int] | None:
        shard_key, pos = self.locate(key)
        index = await self._read_index(shard_key)
        if index is None or index[pos, 0] == EMPTY:
            return None
        return shard_key, int(index[pos, 0]), int(index[pos, 1])

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        shard_key, _ = self.locate(key)
        async with self._lock(shard_key, write=False):
            entry = await self._entry(key)
            if entry is None:
                return None
            _, offset, nbytes = entry
            lo, hi = slice_for_request(nbytes, byte_range)
            if lo == hi:
                return b""
            data = await self.inner.get(shard_key, RangeByteRequest(offset + lo, offset + hi))
        if data is None or len(data) != hi - lo:
            raise CorruptDataError(
                f"sharding v1: shard {self.full_key(shard_key)!r} index entry for chunk "
                f"{self.full_key(key)!r} (offset {offset}, nbytes {nbytes}) lies outside the shard"
            )
        return data

    async def exists(self, key: str) -> bool:
        shard_key, _ = self.locate(key)
        async with self._lock(shard_key, write=False):
            return await self._entry(key) is not None

    async def getsize(self, key: str) -> int:
        shard_key, _ = self.locate(key)
        async with self._lock(shard_key, write=False):
            entry = await self._entry(key)
        if entry is None:
            raise FileNotFoundError(self.full_key(key))
        return entry[2]

    async def _read_shard(self, shard_key: str) -> dict[int, bytes] | None:
        """Every chunk of a shard (validated in full), or None if the shard is absent."""
        blob = await self.inner.get(shard_key)
        if blob is None:
            return None
        data_len = len(blob) - self.index_nbytes
        index = parse_index(
            blob[max(data_len, 0) :], self.n, key=self.full_key(shard_key), data_len=data_len
        )
        return {
            int(i): blob[int(index[i, 0]) : int(index[i, 0]) + int(index[i, 1])]
            for i in np.flatnonzero(index[:, 0] != EMPTY)
        }

    # -- writing ---------------------------------------------------------------------

    async def set(self, key: str, value: bytes) -> None:
        shard_key, pos = self.locate(key)
        async with self._lock(shard_key, write=True):
            chunks = await self._read_shard(shard_key) or {}
            chunks[pos] = value
            await self.inner.set(shard_key, build_shard(chunks, self.n))

    async def delete(self, key: str) -> None:
        shard_key, pos = self.locate(key)
        async with self._lock(shard_key, write=True):
            chunks = await self._read_shard(shard_key)
            if chunks is None or pos not in chunks:
                return  # nothing to do; leave the shard untouched
            del chunks[pos]
            if chunks:
                await self.inner.set(shard_key, build_shard(chunks, self.n))
            else:
                await self.inner.delete(shard_key)

    # -- listing ---------------------------------------------------------------------

    async def list_keys(self) -> list[str]:
        shards = [
            (k, c) for k in await self.inner.list_keys() if (c := self._decode(k)) is not None
        ]

        async def chunks_of(shard_key: str, coords: tuple[int, ...]) -> list[str]:
            async with self._lock(shard_key, write=False):
                index = await self._read_index(shard_key)
            if index is None:
                return []
            return [self._chunk_key(coords, int(i)) for i in np.flatnonzero(index[:, 0] != EMPTY)]

        lists = await asyncio.gather(*(chunks_of(k, c) for k, c in shards))
        return sorted(k for sub in lists for k in sub)
