"""A remote array's chunks fetched ahead of its readers, in batches: `RemoteFetcher`.

Over a remote store (S3, HTTP, GCS) each request waits a round trip. A reader's
next chunks are fetched ahead (`ahead`), on zarr's event loop, and its reads take
them (`take`) instead of sending requests of their own. This part owns the array's
`FetchAhead` (the chunks fetched or under way) and decides what one batch asks the
store: a sharded array's window widened to whole small shards, a shard's inner
chunks lying close together in one ranged request (`coalesce`) handed on as the
response brings them, and the inner chunks nobody fetches that lie inside such a
request claimed for their reads. The array's store, keys and shard indexes are the
array's (`FetchedArray`, `ShardIndexes`). No FUSE; no decoding.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype

from zfuse.ext import zarr_private
from zfuse.ext.chunk_keys import Coords
from zfuse.ext.read_limits import chunk_read_limited
from zfuse.view.fetch_ahead import MISSED, FetchAhead, coalesce
from zfuse.view.shard_indexes import ShardIndexes

FETCH_CONCURRENCY = 16  # requests in flight at once for one batch of chunks fetched ahead
SHARD_AHEAD_CHUNKS = 64  # shards of at most this many inner chunks are fetched ahead whole


class FetchedArray(Protocol):
    """What a `RemoteFetcher` uses of its array (the `ZarrChunkSource` holding it): its
    store, its storage objects' keys and grid, and what its store stack is."""

    store: Any
    sharding: Any  # None: not sharded
    chunks_per_shard: tuple[int, ...]  # (sharded arrays only)
    access: Any  # `metered`: zfuse's metered store of the remote source, if any
    caches_ranges: bool  # the remote store keeps what it fetched on disk (`-o cache=DIR`)
    codecs: Any  # `stored_max`: bytes a stored chunk is read up to (`ChunkCodecs`)

    def in_grid(self, coords: Coords) -> bool: ...

    def storage_coords(self, coords: Coords) -> Coords: ...  # the storage object (shard) holding a chunk

    def storage_key(self, coords: Coords) -> str: ...  # that object's key in the store

    def has_transformers(self) -> bool: ...  # storage transformers between the array and the store


class RemoteFetcher:
    """The chunks of one remote array fetched ahead of its readers, taken by their reads."""

    def __init__(self, array: FetchedArray, indexes: ShardIndexes) -> None:
        self._array = array
        self._indexes = indexes
        self._fetches = FetchAhead(self._fetch_many, zarr_private.event_loop)

    def ahead(self, coords: Sequence[Coords], skip: Callable[[Coords], bool] | None = None) -> None:
        """Start fetching these chunks' stored bytes for reads to come (returns at once),
        leaving out those `skip` says are at hand.

        A sharded array's window is widened to the whole of each shard it covers at
        least half of (small shards: SHARD_AHEAD_CHUNKS inner chunks at most): readers
        going through one shard from several places (parallel readers, each its own
        window) then ask for it once, in one request, as zarr's `arr[:]` does."""
        array = self._array
        if array.sharding is not None and math.prod(array.chunks_per_shard) <= SHARD_AHEAD_CHUNKS:
            coords = self._whole_shards(coords)
        self._fetches.ahead([c for c in coords if not skip(c)] if skip is not None else coords)

    def take(self, coords: Coords) -> Any:
        """What was fetched ahead for chunk `coords` (`FetchAhead.take`): its stored bytes,
        None (not stored) or MISSED (the read fetches it itself); counted into the
        metered store's `chunks_fetched_ahead` or `chunks_fetched_on_read`."""
        fetched = self._fetches.take(coords)
        metered = self._array.access.metered
        if metered is not None:
            metered.stats.count("chunks_fetched_on_read" if fetched is MISSED else "chunks_fetched_ahead")
        return fetched

    def peek(self, coords: Coords) -> Any:
        """What `take` would answer, left for the read (`FetchAhead.peek`)."""
        return self._fetches.peek(coords)

    def forget(self) -> None:
        """Drop every chunk fetched or being fetched (a write through the mount, a reload)."""
        self._fetches.forget()

    def _whole_shards(self, coords: Sequence[Coords]) -> list[Coords]:
        """`coords` in their order, each followed by the rest of its shard's inner chunks
        (C order, in the grid) when at least half of that shard is among them already,
        every chunk once. (A shard the window only grazes is left as it is: a reader
        going along a row of square shards reads their other rows much later.)"""
        array = self._array
        per_shard = array.chunks_per_shard
        in_shard: dict[Coords, int] = {}
        for c in coords:
            shard = array.storage_coords(c)
            in_shard[shard] = in_shard.get(shard, 0) + 1
        size = math.prod(per_shard)
        out: dict[Coords, None] = {}
        widened: set[Coords] = set()
        for c in coords:
            out.setdefault(c, None)
            shard = array.storage_coords(c)
            if shard in widened or 2 * in_shard[shard] < size:
                continue
            widened.add(shard)
            for inner in self._inner_chunks_of(shard):
                out.setdefault(inner, None)
        return list(out)

    def _inner_chunks_of(self, shard: Coords) -> list[Coords]:
        """A shard's inner chunks in the grid, in C order."""
        array = self._array
        per_shard = array.chunks_per_shard
        base = [s * n for s, n in zip(shard, per_shard, strict=True)]
        return [inner for local in itertools.product(*(range(n) for n in per_shard))
                if array.in_grid(inner := tuple(b + i for b, i in zip(base, local, strict=True)))]

    async def _fetch_many(self, wanted: list[Coords]) -> dict[Coords, Any]:
        """Stored bytes of the chunks `wanted` (None: not stored; left out: not fetched).
        A shard's inner chunks lying close together come in one ranged request."""
        array = self._array
        proto = default_buffer_prototype()
        limit = asyncio.Semaphore(FETCH_CONCURRENCY)
        out: dict[Coords, Any] = {}
        if array.sharding is None:
            async def whole(coords: Coords) -> None:
                async with limit:
                    with chunk_read_limited(array.codecs.stored_max):
                        out[coords] = await array.store.get(array.storage_key(coords), prototype=proto)

            await asyncio.gather(*(whole(c) for c in wanted), return_exceptions=True)
            return out
        by_shard: dict[Coords, list[Coords]] = {}
        for coords in wanted:
            by_shard.setdefault(array.storage_coords(coords), []).append(coords)

        # zfuse's metered store right below (no storage transformers between): a span's
        # inner chunks are handed on as the response brings them (`get_pieces`), each
        # its own disk cache entry with `-o cache=`
        metered = array.access.metered
        if metered is not None and array.has_transformers():  # (answered from the metadata recorded at open)
            metered = None
        # a disk cache (-o cache=DIR) keeps byte ranges as requested: one per inner chunk,
        # found again after a remount whatever was read together (`get_pieces`; with
        # storage transformers between, one request each)
        coalesced = metered is not None or not array.caches_ranges
        fetches = self._fetches

        async def span(key: str, start: int, end: int, members: list[tuple[int, int, Coords]]) -> None:
            if metered is not None:
                def arrived(i: int, data: bytes) -> None:
                    coords = members[i][2]
                    out[coords] = buffer = proto.buffer.from_bytes(data)
                    fetches.deliver(coords, buffer)  # (its read goes on while the rest comes)

                async with limit:
                    got = await metered.get_pieces(key, [(a, b) for a, b, _ in members], arrived)
                for (_, _, coords), data in zip(members, got, strict=True):
                    if data is not None and coords not in out:
                        out[coords] = proto.buffer.from_bytes(data)
                return
            async with limit:
                buf = await array.store.get(key, prototype=proto, byte_range=RangeByteRequest(start, end))
            if buf is None or len(buf) != end - start:
                return  # (left out: each read fetches its own and reports what is wrong)
            for first, last, coords in members:
                out[coords] = buf[first - start : last - start]

        wanted_set = set(wanted)

        async def shard(shard_coords: Coords, inner: list[Coords]) -> None:
            key = array.storage_key(shard_coords)
            index = await self._indexes.get(shard_coords)
            ranges = []
            for coords in inner:
                byte_slice = index.get_chunk_slice(coords) if index is not None else None
                if byte_slice is None:
                    out[coords] = None
                elif byte_slice[1] - byte_slice[0] <= array.codecs.stored_max:
                    ranges.append((*byte_slice, coords))
                # (else not fetched ahead: its read refuses it, naming it)
            # the shard's other inner chunks: those other fetches bring (parallel readers'
            # windows) no request here reaches across; those nobody fetches that lie
            # inside a request are fetched with it, and kept for their reads
            others = self._other_inner_chunks(shard_coords, index, wanted_set)
            if not coalesced:
                requests = [(a, b, [(a, b, c)]) for a, b, c in ranges]
            else:
                elsewhere = [byte_slice for c, byte_slice in others if fetches.pending(c)]
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
        if index is None or math.prod(self._array.chunks_per_shard) > SHARD_AHEAD_CHUNKS:
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
        claimed = set(self._fetches.claim(inside))
        # (in order of offset, as every request's members are: `get_pieces` needs it)
        return sorted(members + [(a, b, c) for c, (a, b) in others if c in claimed], key=lambda m: m[0])
