"""Stored chunks fetched ahead of a reader from a remote store: `FetchAhead`.

On a store with a round trip of tens of milliseconds, what a sequential reader
waits for is the store, not the decode. Decoding ahead on a few threads keeps as
many requests in flight as there are threads; fetching ahead does not hold a
thread per request: the fetches run on zarr's event loop, as many at once as
the window asks (`ahead`), and a later read of the chunk (`take`) waits on the
fetch already under way instead of sending its own request.

What is fetched is given by `fetch_many` (an array's: `RemoteFetcher`'s), which
may fetch several chunks in one request (a shard's adjacent inner chunks: one
ranged GET); it answers a chunk's stored bytes, None for a chunk not stored, and
leaves out a chunk it could not fetch. `coalesce` merges adjacent byte ranges for
it.

Bounded: at most `max_entries` chunks are fetched or held, each for at most
`ttl` seconds (a fetched chunk nobody takes is dropped, never served late);
chunks taken are remembered (not fetched again for another reader's window) for
`ttl` seconds, at most TAKEN_KEPT of them, apart from that bound: a reader going
through an array of thousands of chunks keeps its window full all the way.
`forget` drops everything (a write through the mount, a reload). A fetch that
fails is not an error here: the read that takes it fetches again and reports.
No FUSE; no decoding.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

MAX_ENTRIES = 64  # chunks fetched ahead or held, per array
TAKEN_KEPT = 4096  # chunks taken, remembered for `ttl` so other windows do not fetch them again
TTL = 10.0  # seconds a chunk fetched ahead is held for its reader
WAIT = 120.0  # seconds a read waits for a fetch under way (each request has its own timeout)

MERGE_GAP = 64 << 10  # bytes between two ranges fetched in one request rather than two
MERGE_SPAN = 32 << 20  # the largest range one request fetches

MISSED = object()  # `take`'s answer when nothing usable was fetched ahead


class _Fetching:
    """The fetch under way in this task (and those it starts): the futures of the chunks
    it was asked for and of those it claimed (`FetchAhead.claim`), and the `forget`s
    before it began (`FetchAhead.deliver`)."""

    __slots__ = ("claimed", "generation", "own")

    def __init__(self, own: dict[Hashable, concurrent.futures.Future[Any]], generation: int) -> None:
        self.own = own
        self.claimed: dict[Hashable, concurrent.futures.Future[Any]] = {}
        self.generation = generation


_fetching: contextvars.ContextVar[_Fetching | None] = contextvars.ContextVar("zfuse_fetching", default=None)


def coalesce(ranges: Sequence[tuple[int, int, Any]], gap: int = MERGE_GAP,
             span: int = MERGE_SPAN, fetched_elsewhere: Sequence[tuple[int, int]] = ()
             ) -> list[tuple[int, int, list[tuple[int, int, Any]]]]:
    """Byte ranges `(start, end, what)` merged into the fewest requests: ranges no
    more than `gap` bytes apart go in one, and so do farther ones as long as at least
    half of the request's bytes are wanted (a shard's inner chunks lie in Morton order,
    so the chunks a reader wants next in C order are apart), up to `span` bytes each.
    No request reaches across a range of `fetched_elsewhere` (`(start, end)`: bytes
    another request brings, or brought): parallel readers' windows each fetch part of
    one shard, and would fetch the others' parts again. Each request is `(start, end,
    its ranges)`, in order of offset."""
    merged: list[tuple[int, int, list[tuple[int, int, Any]]]] = []
    elsewhere = sorted(fetched_elsewhere)
    wanted = 0  # bytes wanted in the last request
    for start, end, what in sorted(ranges, key=lambda r: r[0]):
        if merged:
            first, last, members = merged[-1]
            stop = max(end, last)
            mostly_wanted = 2 * (wanted + end - start) >= stop - first
            across = any(last <= a < start for a, _ in elsewhere)
            if (start - last <= gap or mostly_wanted) and stop - first <= span and not across:
                members.append((start, end, what))
                merged[-1] = (first, stop, members)
                wanted += end - start
                continue
        merged.append((start, end, [(start, end, what)]))
        wanted = end - start
    return merged


class FetchAhead:
    """Chunks being fetched, or fetched and not yet taken, keyed by their coordinates."""

    def __init__(self, fetch_many: Callable[[list[Any]], Awaitable[dict[Any, Any]]],
                 loop: Callable[[], asyncio.AbstractEventLoop], *, max_entries: int = MAX_ENTRIES,
                 ttl: float = TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch_many = fetch_many
        self.loop = loop
        self.max_entries = max_entries
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        # coords -> (the fetch's future, when it was asked for): fetched or under way
        self._entries: collections.OrderedDict[Hashable, tuple[concurrent.futures.Future[Any], float]] = \
            collections.OrderedDict()
        # coords -> when asked for, of the chunks taken: asking for one again within its
        # ttl (another reader's window) would fetch what its reader has just read. Not
        # counted in max_entries (they hold no bytes): else a reader past max_entries
        # chunks would find the window full of them, and fetch one chunk at a time
        self._taken: collections.OrderedDict[Hashable, float] = collections.OrderedDict()
        self._generation = 0  # `forget`s so far: a fetch started before one is not kept

    def ahead(self, wanted: Sequence[Hashable]) -> int:
        """Start fetching the chunks of `wanted` (in reading order) not fetched or asked
        for lately; how many were asked for. A window whose nearer half (and one more)
        is all fetched or under way is not topped up: the next chunks are asked for
        together, in one batch, once half of it is read (a shard's inner chunks then
        go in one request, not one per chunk as the window slides). Only the nearer
        half counts: a window reaching into chunks other readers took says nothing of
        how far this reader is ahead."""
        if not wanted:
            return 0
        now = self.clock()
        with self._lock:
            self._expire(now)
            entries, taken = self._entries, self._taken
            missing = [c for c in wanted if c not in entries and c not in taken]
            near = wanted[: len(wanted) // 2 + 1]
            if not missing or all(c in entries or c in taken for c in near):
                return 0
            missing = missing[: max(0, self.max_entries - len(self._entries))]
            futures: dict[Hashable, concurrent.futures.Future[Any]] = {}
            for coords in missing:
                futures[coords] = concurrent.futures.Future()
                self._entries[coords] = (futures[coords], now)
            generation = self._generation
        if futures:
            asyncio.run_coroutine_threadsafe(self._fetch(list(futures), futures, generation), self.loop())
        return len(futures)

    async def _fetch(self, coords: list[Any], futures: dict[Any, concurrent.futures.Future[Any]],
                     generation: int) -> None:
        state = _Fetching(futures, generation)
        claimed = state.claimed
        token = _fetching.set(state)
        try:
            got = await self.fetch_many(coords)
        except BaseException as e:  # (the reader that takes it fetches again and reports)
            for future in [*futures.values(), *claimed.values()]:
                try:
                    future.set_exception(e)
                except concurrent.futures.InvalidStateError:
                    pass
            if not isinstance(e, Exception):
                raise
            return
        finally:
            try:
                _fetching.reset(token)
            except ValueError:
                pass  # (a coroutine closed from elsewhere: its task's context goes with it)
        stale = generation != self._generation
        futures = {**futures, **claimed}
        for c, future in futures.items():
            try:
                if stale:
                    future.set_exception(RuntimeError("forgotten while being fetched"))
                else:
                    future.set_result(got.get(c, MISSED))  # (left out: not fetched)
            except concurrent.futures.InvalidStateError:
                pass  # failed by `forget` meanwhile

    def claim(self, coords: Sequence[Hashable]) -> list[Hashable]:
        """From within a fetch under way (`fetch_many`): take on the chunks of `coords`
        that no fetch brings yet, within max_entries (their bytes come with the fetch's
        request anyway); the fetch's answer then holds them for their reads, as if
        asked for. Which were claimed; none outside a fetch."""
        state = _fetching.get()
        if state is None:
            return []
        claimed = state.claimed
        now = self.clock()
        out: list[Hashable] = []
        with self._lock:
            for c in coords:
                if c in self._entries or c in self._taken or len(self._entries) >= self.max_entries:
                    continue
                # (the fetch keeps the future: a read may take the entry before it is done)
                claimed[c] = future = concurrent.futures.Future()
                self._entries[c] = (future, now)
                out.append(c)
        return out

    def deliver(self, coords: Hashable, value: Any) -> None:
        """From within a fetch under way: `coords`' stored bytes (None: not stored) are
        here before the fetch is done (a shard's inner chunk come while the rest of
        the response still arrives): its read goes on now."""
        state = _fetching.get()
        if state is None or state.generation != self._generation:
            return  # (outside a fetch, or forgotten meanwhile: `_fetch` answers)
        future = state.own.get(coords) or state.claimed.get(coords)
        if future is not None:
            try:
                future.set_result(value)
            except concurrent.futures.InvalidStateError:
                pass  # (answered already, or failed by `forget`)

    def pending(self, coords: Hashable) -> bool:
        """Whether `coords` is fetched, being fetched, or was taken lately (its bytes
        are another request's)."""
        with self._lock:
            return coords in self._entries or coords in self._taken

    def take(self, coords: Hashable) -> Any:
        """What was fetched ahead for `coords` (waiting for a fetch under way): the
        stored chunk, None for a chunk not stored, or MISSED (nothing fetched ahead, or
        the fetch failed or was forgotten): then the caller fetches it itself."""
        return self._answer(coords, take=True)

    def peek(self, coords: Hashable) -> Any:
        """What `take` would answer, leaving it for the read (an existence check of a
        chunk being fetched: no request of its own). MISSED when nothing was fetched
        ahead, or it was taken already."""
        return self._answer(coords, take=False)

    def _answer(self, coords: Hashable, *, take: bool) -> Any:
        with self._lock:
            entry = self._entries.get(coords)
            if entry is None:
                return MISSED
            future, asked = entry
            if take:
                del self._entries[coords]
                self._taken[coords] = asked
                if len(self._taken) > TAKEN_KEPT:
                    self._taken.popitem(last=False)
        if self.clock() - asked > self.ttl and future.done():
            return MISSED  # held too long: what the store holds now may differ
        try:
            return future.result(timeout=WAIT)
        except Exception:
            return MISSED

    def forget(self) -> None:
        """Drop every chunk fetched or being fetched (the store changed through the mount,
        or the view is reloaded): what a fetch under way brings is not kept."""
        with self._lock:
            self._generation += 1
            for future, _ in self._entries.values():
                try:
                    future.set_exception(RuntimeError("forgotten while being fetched"))
                except concurrent.futures.InvalidStateError:
                    pass  # (done already)
            self._entries.clear()
            self._taken.clear()

    def _expire(self, now: float) -> None:
        """(Under the lock.) Entries asked for more than `ttl` ago (unless under way), and
        chunks taken then, oldest first."""
        entries = self._entries
        while entries:
            coords, (future, asked) = next(iter(entries.items()))
            if now - asked <= self.ttl or not future.done():
                break
            del entries[coords]
        taken = self._taken
        while taken:
            coords, asked = next(iter(taken.items()))
            if now - asked <= self.ttl:
                break
            del taken[coords]
