"""The view's bounded caches by plain calls, no store and no mount.

`ChunkCache` (decoded chunk bytes, bounded in bytes) and `BoundedLRU` (listings,
existence answers and shard indexes, bounded in a cost): what each keeps, what it
evicts first, how it is invalidated, and that the bound holds under threads.
"""

from __future__ import annotations

import random
import threading

from zfuse.stats import Stats
from zfuse.view.array_view import ChunkCache
from zfuse.view.caches import BoundedLRU, ViewCaches

A, B, C, D = ((1, (0, 0)), (1, (0, 1)), (1, (1, 0)), (2, (0, 0)))  # (array id, coords)


def chunk(fill: int, size: int = 10) -> bytes:
    return bytes([fill]) * size


def cached_keys(cache: ChunkCache, keys: tuple) -> list:
    return [k for k in keys if cache.contains(k)]


# -- ChunkCache -----------------------------------------------------------------


def test_chunk_cache_returns_what_was_put_and_counts_hits_and_misses() -> None:
    cache = ChunkCache(100)
    assert cache.get(A) is None
    cache.put(A, chunk(1))
    cache.put(D, chunk(4))  # same coords, another array: another entry
    assert cache.get(A) == chunk(1) and cache.get(D) == chunk(4)
    assert (cache.hits, cache.misses) == (2, 1)
    assert cache.used == 20


def test_chunk_cache_evicts_the_least_recently_used_first() -> None:
    cache = ChunkCache(30)
    for key, fill in ((A, 1), (B, 2), (C, 3)):
        cache.put(key, chunk(fill))
    assert cache.used == 30
    cache.get(A)  # A is now the most recently used; B the least
    cache.put(D, chunk(4))
    assert cached_keys(cache, (A, B, C, D)) == [A, C, D]
    assert cache.used == 30
    cache.peek(C)  # a peek is a use too
    cache.put(B, chunk(2))
    assert cached_keys(cache, (A, B, C, D)) == [B, C, D]


def test_chunk_cache_asking_is_not_using() -> None:
    """`contains` (read-ahead asking what is decoded) does not keep an entry alive."""
    cache = ChunkCache(20)
    cache.put(A, chunk(1))
    cache.put(B, chunk(2))
    assert cache.contains(A)
    cache.put(C, chunk(3))
    assert cached_keys(cache, (A, B, C)) == [B, C]
    assert (cache.hits, cache.misses) == (0, 0)


def test_chunk_cache_bound_in_bytes_holds() -> None:
    cache = ChunkCache(25)
    cache.put(A, chunk(1, 10))
    cache.put(B, chunk(2, 10))
    cache.put(C, chunk(3, 20))  # evicts both older entries to fit
    assert cached_keys(cache, (A, B, C)) == [C] and cache.used == 20
    cache.put(D, chunk(4, 26))  # larger than the whole cache: not kept, nothing evicted
    assert cached_keys(cache, (A, B, C, D)) == [C] and cache.used == 20
    cache.put(D, chunk(4, 25))  # exactly the bound fits
    assert cached_keys(cache, (A, B, C, D)) == [D] and cache.used == 25


def test_chunk_cache_replacing_an_entry_counts_its_new_size_once() -> None:
    cache = ChunkCache(100)
    cache.put(A, chunk(1, 10))
    cache.put(B, chunk(2, 10))
    cache.put(A, chunk(5, 30))
    assert cache.get(A) == chunk(5, 30)
    assert cache.used == 40


def test_chunk_cache_invalidation() -> None:
    """`drop` forgets one chunk (a write or unlink), `clear` all (a reload); misses follow."""
    cache = ChunkCache(100)
    for key, fill in ((A, 1), (B, 2), (C, 3)):
        cache.put(key, chunk(fill))
    cache.drop(B)
    cache.drop(B)  # dropping what is not there is harmless
    cache.drop(D)
    assert cache.used == 20
    assert cache.get(B) is None and cache.peek(B) is None
    assert cache.get(A) == chunk(1)
    cache.clear()
    assert cache.used == 0
    assert cached_keys(cache, (A, B, C, D)) == []
    assert cache.get(A) is None
    cache.put(A, chunk(7))  # usable again after a clear
    assert cache.get(A) == chunk(7)


def test_chunk_cache_peek_counts_hits_only() -> None:
    """`peek` is the event loop's try-from-memory: a miss there is not counted (the
    worker thread's `get` that follows counts it)."""
    cache = ChunkCache(100)
    assert cache.peek(A) is None
    assert (cache.hits, cache.misses) == (0, 0)
    cache.put(A, chunk(1))
    assert cache.peek(A) == chunk(1)
    assert (cache.hits, cache.misses) == (1, 0)


def test_chunk_cache_bound_and_accounting_hold_under_threads() -> None:
    """Eight threads putting, getting and dropping: every get returns its own key's bytes,
    and afterwards the byte count is exactly what is held, within the bound."""
    cache = ChunkCache(1000)
    keys = [(array, (i, j)) for array in (1, 2) for i in range(6) for j in range(6)]
    fill = {key: n + 1 for n, key in enumerate(keys)}
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(2000):
            key = rng.choice(keys)
            action = rng.random()
            if action < 0.5:
                cache.put(key, chunk(fill[key], rng.randrange(1, 120)))
            elif action < 0.9:
                data = cache.get(key)
                if data is not None and data[0] != fill[key]:
                    errors.append(f"{key} returned another key's bytes")
            else:
                cache.drop(key)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    held = [cache.peek(k) for k in keys]
    assert cache.used == sum(len(d) for d in held if d is not None) <= 1000
    assert any(d is not None for d in held)


# -- BoundedLRU / ViewCaches ------------------------------------------------------


def test_bounded_lru_evicts_by_cost_and_counts_evictions() -> None:
    stats = Stats()
    lru = BoundedLRU(10, stats, "listing_evictions")
    assert lru.put("a", "A", 4) and lru.put("b", "B", 4)
    assert lru.get("a") == "A"  # b is now the least recently used
    assert lru.put("c", "C", 4)
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == ("A", None, "C")
    assert lru.used == 8 and len(lru) == 2
    assert stats.snapshot()["listing_evictions"] == 1
    assert lru.put("d", "D", 10)  # takes the whole bound
    assert len(lru) == 1 and lru.used == 10
    assert stats.snapshot()["listing_evictions"] == 3


def test_bounded_lru_refuses_an_item_larger_than_the_bound_and_forgets_the_old_one() -> None:
    """A listing too large to keep is answered without the cache; an older, smaller
    answer for the same key must not be served in its place."""
    lru = BoundedLRU(10)
    assert lru.put("a", "old", 3)
    assert not lru.put("a", "new", 11)
    assert lru.get("a") is None and lru.used == 0


def test_bounded_lru_update_pop_and_clear() -> None:
    lru = BoundedLRU(10)
    lru.put("a", "A", 2)
    lru.update("a", "A2", 5)  # a listing that grew: same item, new cost
    assert lru.get("a") == "A2" and lru.used == 5
    lru.update("missing", "x", 3)  # updating what is not there keeps nothing
    assert lru.get("missing") is None and lru.used == 5
    assert lru.pop("a") == "A2" and lru.pop("a") is None
    assert lru.used == 0
    lru.put("b", "B", 1)
    lru.clear()
    assert len(lru) == 0 and lru.used == 0
    assert BoundedLRU(-5).max_cost == 0  # a negative setting keeps nothing


def test_view_caches_report_their_use_as_gauges() -> None:
    stats = Stats()
    caches = ViewCaches(max_names=100, max_index_bytes=64, stats=stats)
    caches.names.put(("dir", "c/0"), ["0", "1"], 3)
    caches.indexes.put(("shard", "c/0/0"), b"\0" * 32, 32)
    snap = stats.snapshot()
    assert snap["listing_cache_names"] == 3 and snap["shard_index_cache_bytes"] == 32
    caches.clear()
    snap = stats.snapshot()
    assert snap["listing_cache_names"] == 0 and snap["shard_index_cache_bytes"] == 0
