"""The shard indexes of one sharded array: `ShardIndexes`.

It owns reading a shard's index (one read however many ask for it at once) and
keeping the indexes read: a bounded cache of their bytes, the array's own until
the view shares one among its arrays (`use_cache`). Shards are named by their
grid position; their storage keys come from the array (`key_of`). Every read runs
on zarr's event loop. No FUSE.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from zarr.storage import StorePath

from zfuse.errors import CorruptDataError, StoreServerError, StoreTimeoutError
from zfuse.ext import zarr_private
from zfuse.view.caches import BoundedLRU, owner_ident

Coords = tuple[int, ...]
DEFAULT_INDEX_CACHE_BYTES = 64 * 1024 * 1024


class ShardIndexes:
    """Shard indexes read and kept, by shard (its grid position in the grid of shards).

    `key_of(shard)`: the shard's storage key in `store` (the array's prefix included);
    `sharding` and `chunks_per_shard`: the array's sharding codec and shard shape in
    inner chunks (None for an array not sharded, which reads no index)."""

    def __init__(self, key_of: Callable[[Coords], str], store: Any, sharding: Any,
                 chunks_per_shard: tuple[int, ...] | None) -> None:
        self._key_of = key_of
        self._store = store
        self._sharding = sharding
        self._chunks_per_shard = chunks_per_shard
        # bounded, shared by the view's arrays once `use_cache` is called; keyed by
        # `_ident` and the shard's key
        self._cache = BoundedLRU(DEFAULT_INDEX_CACHE_BYTES)
        self._ident = owner_ident()
        self._loading: dict[str, asyncio.Future[Any]] = {}  # index reads in flight

    def use_cache(self, cache: BoundedLRU) -> None:
        """Keep the indexes in `cache` (shared by the arrays of one view)."""
        self._cache = cache

    def cached(self, shard: Coords) -> Any:
        """The shard's index if it is cached (memory only), else None."""
        return self._cache.get((self._ident, self._key_of(shard)))

    def keep(self, shard: Coords, index: Any) -> None:
        """Cache `index` as the shard's (one just written: no need to read it back)."""
        self._keep(self._key_of(shard), index)

    def _keep(self, key: str, index: Any) -> None:
        self._cache.put((self._ident, key), index, index.offsets_and_lengths.nbytes + 256)

    def forget(self, shard: Coords) -> None:
        """Drop the shard's cached index (it was rewritten, or is wrong)."""
        self._cache.pop((self._ident, self._key_of(shard)))

    def clear(self) -> None:
        """Drop every cached index (of every array sharing the cache)."""
        self._cache.clear()

    async def load(self, shards: Sequence[Coords]) -> list[Any]:
        """The indexes of `shards` (None: a shard not stored), at most 16 read at once."""
        sem = asyncio.Semaphore(16)

        async def one(shard: Coords) -> Any:
            async with sem:
                return await self.get(shard)

        return await asyncio.gather(*(one(s) for s in shards))

    async def get(self, shard: Coords) -> Any:
        """The shard's index, cached or read (and cached); None: the shard is not stored."""
        key = self._key_of(shard)
        cached = self._cache.get((self._ident, key))
        if cached is not None:
            return cached
        # one read per index, however many requests want it at once (listings of the
        # directories one shard covers run side by side when listed ahead of `ls -R`);
        # all of them run on zarr's one event loop, so a plain dict is enough
        loading = self._loading.get(key)
        if loading is None:
            loading = self._loading[key] = asyncio.ensure_future(self._read(key))
            loading.add_done_callback(lambda done: self._loading.pop(key, None))
        return await asyncio.shield(loading)

    async def _read(self, key: str) -> Any:
        assert self._sharding is not None and self._chunks_per_shard is not None
        try:
            index = await zarr_private.load_shard_index(
                self._sharding, StorePath(self._store, key), self._chunks_per_shard
            )
        except (StoreTimeoutError, StoreServerError):
            raise  # (the store's failure, named as such: no corrupt index)
        except Exception as e:  # a bad index checksum or a short object
            raise CorruptDataError(f"{key}: unreadable shard index: {str(e) or type(e).__name__}") from e
        if index is not None:
            self._keep(key, index)
        return index
