"""Inner chunks written into their shards of a local store in the calling worker
thread: `LocalShardWrites`, a part of a `ZarrChunkSource` (`source.py`).

zarr's own partial shard write does the same with several thread switches per
step. The shard comes out byte for byte as zarr-python lays it out (inner chunks in
Morton order, then the index, or the index first) and replaces the old one
atomically; a shard whose index cannot be read is refused, never overwritten.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from zarr.codecs.sharding import ShardingCodec
from zarr.core.buffer import default_buffer_prototype

from zfuse.errors import CorruptDataError
from zfuse.ext import zarr_private
from zfuse.ext.chunk_keys import Coords
from zfuse.view.chunk_codecs import ChunkCodecs


class LocalShardWrites:
    """Writes of one sharded array's inner chunks into a local store's shards."""

    def __init__(self, sharding: ShardingCodec, chunks_per_shard: tuple[int, ...], codecs: ChunkCodecs,
                 shard_codecs: int, local: Any, shard_max: int | None) -> None:
        """`shard_codecs`: how many codecs the array has over whole shards (the sharding
        codec itself included); `local`: zfuse's metered store of the local directory
        (None: not local); `shard_max`: bytes a whole shard is read up to."""
        self._sharding = sharding
        self._chunks_per_shard = chunks_per_shard
        self._codecs = codecs
        self._shard_codecs = shard_codecs
        self._local = local
        self._shard_max = shard_max

    @functools.cached_property
    def available(self) -> bool:
        """Whether inner chunks can be written here: a local store, and inner and index
        codecs that all encode and decode synchronously, no codec over the whole shard."""
        from zarr.abc.codec import ArrayBytesCodec, BytesBytesCodec

        local, sharding = self._local, self._sharding
        codecs = [*sharding.codecs, *sharding.index_codecs]
        return bool(
            local is not None and local.local_writer and self._codecs.in_thread is not None
            and self._shard_codecs == 1
            and all(zarr_private.can_encode_sync(c) and zarr_private.can_decode_sync(c) for c in codecs)
            and isinstance(sharding.index_codecs[0], ArrayBytesCodec)
            and all(isinstance(c, BytesBytesCodec) for c in sharding.index_codecs[1:])
        )

    def write(self, key: str, coords: Coords, full: np.ndarray) -> Any:
        """Store inner chunk `coords` (its values `full`) into the shard at `key`: read the
        shard, encode the chunk, lay the shard out again and replace it atomically.
        Returns the shard's new index (for the index cache)."""
        from zarr.codecs.sharding import MAX_UINT_64, ShardingCodecIndexLocation

        sharding, local = self._sharding, self._local
        cps = self._chunks_per_shard
        index_spec = zarr_private.shard_index_spec(sharding, cps)
        index_size = zarr_private.shard_index_size(sharding, cps)
        index_first = sharding.index_location == ShardingCodecIndexLocation.start
        proto = default_buffer_prototype()
        stored = local.get_local(key, max_bytes=self._shard_max)
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
                raise CorruptDataError(f"{key}: unreadable shard index: {str(e) or type(e).__name__}") from e
            data = memoryview(stored)
            for local_coords in np.argwhere(old[..., 0] != MAX_UINT_64):
                at = tuple(int(v) for v in local_coords)
                start, length = (int(v) for v in old[at])
                if start + length > len(stored):
                    raise CorruptDataError(f"{key}: inner chunk {at} lies outside the stored shard")
                parts[at] = data[start : start + length]
        encoded = self._codecs.encode(full)
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
        return index
