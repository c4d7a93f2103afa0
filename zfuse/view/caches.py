"""A bounded, thread-safe LRU (what the view keeps of listings, shard indexes, decoded
chunks and whole-image tiles), and single flight (`SingleFlight`: what is being
decoded, decoded once however many readers want it at once).

Memory for a big store must follow a setting, not the number of chunks in the
array: directory listings, single-chunk existence answers and shard indexes
all live in instances of `BoundedLRU`, each bounded by a total cost (names for
listings, bytes for shard indexes). Evictions are counted into the mount's
`Stats` so `.zfuse/stats` shows when a bound is too small for the workload.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from zfuse.stats import Stats

_owner_idents = itertools.count(1)


def owner_ident() -> int:
    """A number no other owner of cache entries (an array's view, its shard indexes)
    ever gets, for the keys of what it puts in shared caches. Not id(): a forgotten
    view's entries outlive it, and a new object may be given its id.
    (`next` on a count is atomic under the GIL: any thread may call this.)"""
    return next(_owner_idents)


class SingleFlight:
    """One computation per key at a time. The kernel reads one file (or one tile) in
    several concurrent requests: the first to take `turn(key)` computes it and caches
    it; the others wait for that turn to end, then look in the cache again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, threading.Lock] = {}

    @contextmanager
    def turn(self, key: Hashable) -> Iterator[None]:
        """Held while this caller computes `key` (after waiting for a caller doing so)."""
        with self._lock:
            flight = self._flights.setdefault(key, threading.Lock())
        with flight:
            try:
                yield
            finally:
                with self._lock:
                    if self._flights.get(key) is flight:
                        del self._flights[key]


class BoundedLRU:
    """Least-recently-used items whose total cost stays at or below `max_cost`.

    An item costing more than `max_cost` on its own is not kept (`put` returns
    False): the caller answers from what it has and does not rely on the cache.
    """

    def __init__(self, max_cost: int, stats: Stats | None = None, evictions_counter: str = "cache_evictions") -> None:
        self.max_cost = max(0, int(max_cost))
        self.stats = stats
        self.evictions_counter = evictions_counter
        self.used = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, cost: int = 1) -> bool:
        if cost > self.max_cost:
            self.pop(key)
            return False
        evicted = 0
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]
            self._items[key] = (value, cost)
            self.used += cost
            while self.used > self.max_cost:
                _, (_, gone) = self._items.popitem(last=False)
                self.used -= gone
                evicted += 1
        if evicted and self.stats is not None:
            self.stats.count(self.evictions_counter, evicted)
        return True

    def has(self, key: Hashable) -> bool:
        """Whether `key` is kept (its recency unchanged)."""
        with self._lock:
            return key in self._items

    def update(self, key: Hashable, value: Any, cost: int) -> None:
        """Replace an item's value and cost in place (no eviction of the item itself)."""
        with self._lock:
            old = self._items.get(key)
            if old is None:
                return
            self._items[key] = (value, cost)
            self.used += cost - old[1]

    def pop(self, key: Hashable) -> Any:
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self.used -= item[1]
            return item[0]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.used = 0


class ViewCaches:
    """The bounded caches one view shares between its arrays.

    `names`: directory listings and single-chunk existence answers, costed in
    names (a listing of n names costs n + 1, an existence answer 1).
    `indexes`: shard indexes, costed in bytes.
    """

    def __init__(self, max_names: int, max_index_bytes: int, stats: Stats | None = None) -> None:
        self.names = BoundedLRU(max_names, stats, "listing_evictions")
        self.indexes = BoundedLRU(max_index_bytes, stats, "shard_index_evictions")
        if stats is not None:
            stats.gauge("listing_cache_names", lambda: self.names.used)
            stats.gauge("shard_index_cache_bytes", lambda: self.indexes.used)

    def clear(self) -> None:
        self.names.clear()
        self.indexes.clear()
