"""FetchAhead and coalesce with plain calls (no mount, no store): what a reader of a
remote store gets from fetches started ahead of it. The fetches run on a real
asyncio loop in a thread, as zarr's do."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from zfuse.view.fetch_ahead import MISSED, FetchAhead, coalesce


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


class Store:
    """What `fetch_many` fetches: each batch asked for, answered when `release` is set."""

    def __init__(self, missing: set[Any] = frozenset(), failing: set[Any] = frozenset()) -> None:
        self.batches: list[list[Any]] = []
        self.missing = missing
        self.failing = failing
        self.release = threading.Event()
        self.release.set()

    async def fetch_many(self, wanted: list[Any]) -> dict[Any, Any]:
        self.batches.append(list(wanted))
        await asyncio.to_thread(self.release.wait, 30)
        return {c: (None if c in self.missing else f"bytes of {c}".encode())
                for c in wanted if c not in self.failing}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_coalesce_merges_ranges_close_together_up_to_a_span() -> None:
    ranges = [(100, 200, "b"), (0, 100, "a"), (200, 250, "c"), (10_000, 10_100, "far")]
    assert coalesce(ranges, gap=0) == [
        (0, 250, [(0, 100, "a"), (100, 200, "b"), (200, 250, "c")]), (10_000, 10_100, [(10_000, 10_100, "far")])]
    assert [r[:2] for r in coalesce(ranges, gap=20_000)] == [(0, 10_100)]
    assert [r[:2] for r in coalesce(ranges, gap=20_000, span=200)] == [(0, 200), (200, 250), (10_000, 10_100)]
    assert coalesce([]) == []
    # farther apart, while at least half of the request is wanted (a shard's inner chunks
    # a reader wants next, spread over the shard's Morton order)
    spread = [(0, 100, "a"), (200, 300, "b"), (400, 500, "c")]
    assert [r[:2] for r in coalesce(spread, gap=0)] == [(0, 500)]
    assert [r[:2] for r in coalesce([(0, 100, "a"), (1000, 1100, "b")], gap=0)] == [(0, 100), (1000, 1100)]


def test_a_chunk_fetched_ahead_is_taken_once_without_a_request_of_its_own(loop: asyncio.AbstractEventLoop) -> None:
    store = Store(missing={2})
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    assert ahead.ahead([0, 1, 2, 3]) == 4
    assert ahead.take(0) == b"bytes of 0"
    assert ahead.take(2) is None  # not stored
    assert ahead.take(0) is MISSED  # taken already: the reader fetches it itself
    assert ahead.take(9) is MISSED  # never asked for
    assert store.batches == [[0, 1, 2, 3]]  # one batch: fetch_many may merge them


def test_a_read_waits_for_the_fetch_under_way(loop: asyncio.AbstractEventLoop) -> None:
    store = Store()
    store.release.clear()
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    ahead.ahead([5])
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(ahead.take(5)))
    reader.start()
    reader.join(timeout=0.05)
    assert reader.is_alive() and not got  # waiting, not fetching again
    store.release.set()
    reader.join(timeout=10)
    assert got == [b"bytes of 5"] and store.batches == [[5]]


def test_the_window_is_topped_up_in_batches_of_half(loop: asyncio.AbstractEventLoop) -> None:
    store = Store()
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    assert ahead.ahead(list(range(0, 8))) == 8
    for reader_at in range(1, 4):  # the window slides by one: still more than half ahead
        ahead.take(reader_at - 1)
        assert ahead.ahead(list(range(reader_at, reader_at + 8))) == 0
    ahead.take(3)
    assert ahead.ahead(list(range(4, 12))) == 4  # half of it new: asked for together
    assert ahead.take(8) == b"bytes of 8"  # (that batch fetched)
    assert store.batches == [list(range(8)), [8, 9, 10, 11]]


def test_bounded_in_chunks_and_in_time(loop: asyncio.AbstractEventLoop) -> None:
    store, clock = Store(), Clock()
    ahead = FetchAhead(store.fetch_many, lambda: loop, max_entries=3, ttl=10.0, clock=clock)
    assert ahead.ahead([0, 1, 2, 3, 4]) == 3  # no more than max_entries held
    assert ahead.take(1) == b"bytes of 1"
    clock.now = 11.0  # nobody took 0 or 2 in time: never served late
    assert ahead.take(0) is MISSED
    assert ahead.ahead([7, 8, 9]) == 3  # the expired ones made room
    assert ahead.take(9) == b"bytes of 9"


def test_forget_drops_what_is_fetched_and_what_is_under_way(loop: asyncio.AbstractEventLoop) -> None:
    store = Store()
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    ahead.ahead([0, 1])
    assert ahead.take(0) == b"bytes of 0"
    store.release.clear()
    ahead.ahead([2, 3, 4])
    ahead.forget()  # a write through the mount: nothing fetched before it is served
    store.release.set()
    assert [ahead.take(c) for c in (1, 2, 3)] == [MISSED, MISSED, MISSED]
    assert ahead.ahead([2, 3]) == 2 and ahead.take(2) == b"bytes of 2"


def test_a_fetch_that_fails_or_leaves_a_chunk_out_is_the_readers_to_do(loop: asyncio.AbstractEventLoop) -> None:
    store = Store(failing={1})
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    ahead.ahead([0, 1])
    assert ahead.take(1) is MISSED and ahead.take(0) == b"bytes of 0"

    async def broken(wanted: list[Any]) -> dict[Any, Any]:
        raise OSError("connection reset")

    failing = FetchAhead(broken, lambda: loop)
    failing.ahead([0])
    assert failing.take(0) is MISSED


def test_peek_answers_an_existence_check_and_leaves_the_chunk_for_its_read(loop: asyncio.AbstractEventLoop) -> None:
    store = Store(missing={1})
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    ahead.ahead([0, 1])
    assert ahead.peek(0) == b"bytes of 0" and ahead.peek(1) is None  # exists / not stored
    assert ahead.take(0) == b"bytes of 0"  # still there for the read
    assert ahead.peek(0) is MISSED and ahead.peek(7) is MISSED
    assert store.batches == [[0, 1]]


def test_a_window_covering_half_a_shard_or_more_is_widened_to_the_whole_shard() -> None:
    """What a sharded array fetches ahead: the whole of each shard the window covers at
    least half of (parallel readers then ask for a shard once); shards it only grazes
    as they are."""
    import zarr
    from zarr.storage import MemoryStore

    from zfuse.view.remote_fetch import RemoteFetcher
    from zfuse.view.source import ZarrChunkSource

    arr = zarr.create_array(MemoryStore(), shape=(64, 64), shards=(32, 32), chunks=(8, 16), dtype="uint8")
    source = ZarrChunkSource(arr)  # inner grid 8 x 4, shards of 4 x 2 inner chunks
    fetcher = RemoteFetcher(source, source._indexes)
    shard0 = [(i, j) for i in range(4) for j in range(2)]
    half = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert fetcher._whole_shards(half) == [(0, 0), *[c for c in shard0 if c != (0, 0)]]
    grazing = [(0, 1), (0, 2)]  # one chunk of each of two shards
    assert fetcher._whole_shards(grazing) == grazing
    assert fetcher._whole_shards([]) == []


def test_a_shard_directory_is_listed_once_for_its_view_directories_unless_too_big(monkeypatch) -> None:
    """A store directory of shards is listed once and kept for the view directories its
    shard row covers; one with more names than SHARD_DIR_NAMES is not kept, and is still
    listed only once for the view directory that asked."""
    import zarr
    from zarr.storage import MemoryStore, WrapperStore

    from zfuse.view import chunk_listing
    from zfuse.view.source import ZarrChunkSource

    class Counting(WrapperStore[MemoryStore]):
        def __init__(self, store: MemoryStore) -> None:
            super().__init__(store)
            self.listed: list[str] = []

        async def list_dir(self, prefix: str):  # type: ignore[override]
            self.listed.append(prefix)
            async for name in self._store.list_dir(prefix):
                yield name

    store = Counting(MemoryStore())
    arr = zarr.create_array(store, shape=(64, 64), shards=(8, 32), chunks=(8, 16), dtype="uint8")
    arr[...] = 1  # shards c/0/0 and c/0/1 in store directory c/0/
    source = ZarrChunkSource(arr)
    names = lambda: sorted(n for page in source._listing._shard_dir_names("c/0/") for n in page)  # noqa: E731
    assert names() == names() == ["0", "1"]
    assert store.listed.count("c/0/") == 1  # kept for the next view directory
    store.listed.clear()
    source._listing.forget_store_dirs()
    monkeypatch.setattr(chunk_listing, "SHARD_DIR_NAMES", 1)
    assert names() == ["0", "1"] and store.listed.count("c/0/") == 1  # too big: listed once all the same
    assert names() == ["0", "1"] and store.listed.count("c/0/") == 2  # and not kept


def counting_store() -> Any:
    """A MemoryStore that records its listings: `dirs` (list_dir) and `flat` (list_prefix)."""
    from zarr.storage import MemoryStore, WrapperStore

    class Counting(WrapperStore[MemoryStore]):
        def __init__(self, store: MemoryStore) -> None:
            super().__init__(store)
            self.dirs: list[str] = []
            self.flat: list[str] = []

        async def list_dir(self, prefix: str):  # type: ignore[override]
            self.dirs.append(prefix)
            async for name in self._store.list_dir(prefix):
                yield name

        async def list_prefix(self, prefix: str):  # type: ignore[override]
            self.flat.append(prefix)
            async for key in self._store.list_prefix(prefix):
                yield key

    return Counting(MemoryStore())


def _remote_source(arr):  # a source whose store counts as remote (what `store_access` finds for S3)
    from zfuse.view.source import StoreAccess, ZarrChunkSource

    source = ZarrChunkSource(arr, name=arr.path)
    source.__dict__["access"] = StoreAccess(remote=True)
    return source


def _listed(source, parts: tuple[str, ...]) -> list[tuple[str, object]]:
    return sorted(entry for page in source.iter_chunk_dir(parts) for entry in page)


def test_a_small_remote_array_walked_from_the_top_is_listed_whole_in_one_listing(monkeypatch) -> None:
    """A walker listing `c/` of a remote array of at most FLAT_LISTING_OBJECTS objects makes
    one listing of the array's prefix, which answers every directory below until a write;
    `ls` of one chunk directory first stays one listing of that directory alone."""
    import zarr

    from zfuse.view import chunk_listing

    store = counting_store()
    arr = zarr.create_array(store, name="a", shape=(24, 32), chunks=(8, 16), dtype="uint8", fill_value=0)
    arr[:16, :] = 1  # chunks c/0/0, c/0/1, c/1/0, c/1/1 of a 3 x 2 grid
    source = _remote_source(arr)
    assert _listed(source, ("c", "0")) == [("0", (0, 0)), ("1", (0, 1))]
    assert (store.dirs, store.flat) == (["a/c/0/"], [])  # a chunk directory first: itself only
    store.dirs.clear()
    assert _listed(source, ("c",)) == [("0", None), ("1", None)]
    assert _listed(source, ("c", "1")) == [("0", (1, 0)), ("1", (1, 1))]
    assert _listed(source, ("c", "2")) == []
    assert (store.dirs, store.flat) == ([], ["a/"])  # one listing, of the whole array
    source.write_chunk((2, 1), np.full((8, 16), 5, "uint8"))  # a new object: listed again
    assert _listed(source, ("c", "2")) == [("1", (2, 1))]
    assert store.dirs == ["a/c/2/"]
    assert _listed(source, ("c",)) == [("0", None), ("1", None), ("2", None)] and store.flat == ["a/", "a/"]
    # a bigger array, or one with too many strays, is listed directory by directory
    store.dirs.clear(), store.flat.clear()
    monkeypatch.setattr(chunk_listing, "FLAT_LISTING_OBJECTS", 5)
    source.invalidate()
    assert _listed(source, ("c",)) == [("0", None), ("1", None), ("2", None)]
    assert (store.dirs, store.flat) == (["a/c/"], [])
    monkeypatch.setattr(chunk_listing, "FLAT_LISTING_OBJECTS", 1000)
    monkeypatch.setattr(chunk_listing, "FLAT_LISTING_KEYS", 3)
    source.invalidate()
    store.dirs.clear()
    assert _listed(source, ("c",)) == [("0", None), ("1", None), ("2", None)]
    assert _listed(source, ("c",)) == [("0", None), ("1", None), ("2", None)]
    assert store.flat == ["a/"] and store.dirs == ["a/c/", "a/c/"]  # tried once, then each directory itself


def test_directories_of_a_flat_listing() -> None:
    from zfuse.view.chunk_listing import _directories_of

    assert _directories_of(["zarr.json", "c/0/1", "c/0/0", "c/10/0"]) == {
        "": ["c", "zarr.json"], "c/": ["0", "10"], "c/0/": ["0", "1"], "c/10/": ["0"]}
    assert _directories_of([]) == {}


@pytest.mark.parametrize("alongside", [64, 1])
def test_a_walk_of_a_small_sharded_array_reads_every_shard_index_with_the_first_directory(
    monkeypatch: pytest.MonkeyPatch, alongside: int
) -> None:
    """A walker of a remote sharded array listed whole: the first chunk directory listed
    reads the indexes of the shards the listing found (up to INDEXES_ALONGSIDE more than
    its own), side by side; the directories whose shards were read then read none, and
    each index is read once."""
    import zarr

    from zfuse.view import chunk_listing

    monkeypatch.setattr(chunk_listing, "INDEXES_ALONGSIDE", alongside)

    store = counting_store()
    reads: list[str] = []
    real_get = type(store).get

    async def get(self, key, prototype=None, byte_range=None):  # type: ignore[no-untyped-def]
        reads.append(key)
        return await real_get(self, key, prototype, byte_range)

    type(store).get = get  # (this store's class only: made by counting_store)
    arr = zarr.create_array(store, name="s", shape=(32, 32), shards=(8, 32), chunks=(8, 8), dtype="uint8",
                            fill_value=0)
    arr[...] = 1  # shards c/0/0 .. c/3/0, one per view directory c/0 .. c/3
    source = _remote_source(arr)
    reads.clear()
    assert _listed(source, ("c",)) == [(str(i), None) for i in range(4)]
    assert _listed(source, ("c", "0")) == [(str(j), (0, j)) for j in range(4)]
    # every index with the first directory; or, one more at a time, its own and the next
    assert sorted(reads) == [f"s/c/{i}/0" for i in range(min(4, 1 + alongside))]
    for i in range(1, 4):
        assert _listed(source, ("c", str(i))) == [(str(j), (i, j)) for j in range(4)]
    assert sorted(reads) == [f"s/c/{i}/0" for i in range(4)]  # each once
    assert store.dirs == [] and store.flat == ["s/"]


def test_a_reader_past_max_entries_chunks_keeps_its_window_full(loop: asyncio.AbstractEventLoop) -> None:
    """Chunks taken are remembered apart from the max_entries bound (they hold no bytes):
    a sequential reader of an array of 200 chunks has every one fetched ahead, in
    batches (before: after the first 64, none for ttl seconds: a round trip per chunk)."""
    store = Store()
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    got = []
    for at in range(200):
        ahead.ahead(list(range(at, min(at + 33, 200))))
        got.append(ahead.take(at))
    assert got == [f"bytes of {c}".encode() for c in range(200)]
    assert sorted(c for batch in store.batches for c in batch) == list(range(200))  # each once
    assert len(store.batches) < 200 // 8  # in batches, not one by one
    assert ahead.ahead([5, 6]) == 0  # taken lately: not fetched again for another window


def test_a_window_reaching_into_chunks_others_took_still_fetches_its_own(
    loop: asyncio.AbstractEventLoop
) -> None:
    """Parallel readers, each its own rows: a window whose far half lies in chunks other
    readers fetched is topped up by what its nearer half lacks (before: more than half
    of it known counted as ahead, and its own chunks were fetched one by one)."""
    store = Store()
    ahead = FetchAhead(store.fetch_many, lambda: loop)
    assert ahead.ahead(list(range(8, 41))) == 33  # other readers' rows
    for c in range(8, 16):
        ahead.take(c)
    assert ahead.ahead(list(range(0, 33))) == 8  # this reader's own 8
    assert ahead.take(0) == b"bytes of 0"  # (that batch fetched)
    assert store.batches == [list(range(8, 41)), list(range(8))]


def test_coalesce_never_reaches_across_bytes_fetched_elsewhere() -> None:
    spread = [(0, 100, "a"), (200, 300, "b"), (400, 500, "c")]
    assert [r[:2] for r in coalesce(spread, gap=0, fetched_elsewhere=[(300, 400)])] == [(0, 300), (400, 500)]
    assert [r[:2] for r in coalesce(spread, gap=1000, fetched_elsewhere=[(100, 200)])] == [(0, 100), (200, 500)]
    assert [r[:2] for r in coalesce(spread, gap=0, fetched_elsewhere=[(600, 700)])] == [(0, 500)]


def test_parallel_windows_over_one_shard_fetch_each_byte_once() -> None:
    """Two readers' windows over one shard: the first asks for 6 of its 16 inner chunks
    (one request reaching across others, as at least half of it is wanted: those come
    with it, claimed and held for their reads), the second's window covers the whole
    shard: it asks for the rest only. Every byte is fetched once (before: the second
    fetched the first's spans again, and 2.5 MB of every 6.8 MB shard came twice)."""
    import zarr
    from zarr.storage import MemoryStore, WrapperStore

    class Recording(WrapperStore[MemoryStore]):
        def __init__(self, store: MemoryStore) -> None:
            super().__init__(store)
            self.ranges: list[tuple[str, Any]] = []

        async def get(self, key, prototype, byte_range=None):  # type: ignore[no-untyped-def, override]
            self.ranges.append((key, byte_range))
            return await self._store.get(key, prototype, byte_range)

    store = Recording(MemoryStore())
    arr = zarr.create_array(store, shape=(32, 32), shards=(32, 32), chunks=(8, 8), dtype="uint16",
                            compressors=None, fill_value=0)
    arr[...] = np.arange(32 * 32, dtype="uint16").reshape(32, 32)  # one shard, 4 x 4 inner chunks
    source = _remote_source(arr)
    first = [(0, 3), (1, 2), (1, 3), (2, 3), (3, 2), (3, 3)]  # Morton 5-7 and 13-15: two spans
    source.fetch_ahead(first)
    assert source._fetcher is not None
    taken = {first[0]: source._fetcher.take(first[0])}  # (the first window's fetch done)
    every = [(i, j) for i in range(4) for j in range(4)]
    source.fetch_ahead(every)
    got = [taken.get(c) or source._fetcher.take(c) for c in every]
    assert all(g is not None and g is not MISSED for g in got)
    spans = sorted((r.start, r.end) for key, r in store.ranges
                   if key == "c/0/0" and r is not None and hasattr(r, "end"))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)), spans
    assert sum(end - start for start, end in spans) == 16 * 8 * 8 * 2  # every inner chunk's bytes, once


def test_a_chunk_claimed_by_a_fetch_is_answered_to_a_read_that_took_it_meanwhile(
    loop: asyncio.AbstractEventLoop
) -> None:
    """A fetch claims a chunk its request brings anyway (`claim`); a read taking that
    chunk while the fetch is under way waits for it and gets its bytes (and a chunk some
    fetch already brings is not claimed again); outside a fetch nothing is claimed."""
    release = threading.Event()
    ahead: FetchAhead

    async def fetch_many(wanted: list[Any]) -> dict[Any, Any]:
        claimed = ahead.claim([1, 2, 9]) if wanted == [1, 2] else []
        await asyncio.to_thread(release.wait, 30)
        return {c: f"bytes of {c}".encode() for c in [*wanted, *claimed]}

    ahead = FetchAhead(fetch_many, lambda: loop)
    assert ahead.claim([5]) == []  # outside a fetch
    assert ahead.ahead([1, 2]) == 2  # its fetch claims 9 (1 and 2 are its own already)
    while not ahead.pending(9):
        time.sleep(0.001)
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(ahead.take(9)))
    reader.start()
    while ahead.pending(9) and 9 in ahead._entries:  # until the read has taken it
        time.sleep(0.001)
    release.set()
    reader.join(timeout=10)
    assert result == [b"bytes of 9"]
    assert ahead.ahead([9, 10]) == 1  # 9 was read: only 10 is asked for
    assert ahead.take(10) == b"bytes of 10"


def test_a_chunk_delivered_during_its_fetch_is_read_before_the_fetch_ends(
    loop: asyncio.AbstractEventLoop
) -> None:
    """`deliver` from within a fetch (a shard's inner chunk the response brought while the
    rest still arrives) answers that chunk's read at once; outside a fetch it does nothing."""
    release = threading.Event()
    ahead: FetchAhead

    async def fetch_many(wanted: list[Any]) -> dict[Any, Any]:
        ahead.deliver(0, b"early 0")
        await asyncio.to_thread(release.wait, 30)
        return {c: f"bytes of {c}".encode() for c in wanted}

    ahead = FetchAhead(fetch_many, lambda: loop)
    ahead.deliver(5, b"nothing")  # outside a fetch
    assert ahead.ahead([0, 1]) == 2
    assert ahead.take(0) == b"early 0"  # while the fetch still waits
    release.set()
    assert ahead.take(1) == b"bytes of 1"


def test_pieces_of_a_response_are_handed_on_as_soon_as_they_arrive() -> None:
    """`_PieceStream`: each piece (ascending, gaps between) is handed on once the body
    parts that arrived cover it, with the right bytes, whatever the parts' sizes."""
    from zfuse.store import _PieceStream

    body = bytes(range(256)) * 4  # the object's bytes from offset 100
    pieces = [(0, 100, 150), (3, 160, 400), (7, 900, 1124)]
    for part in (1, 7, 64, 1024):
        got: list[tuple[int, bytes, int]] = []
        stream = _PieceStream(100, pieces, lambda i, data: got.append((i, data, arrived)))  # noqa: B023
        arrived = 0
        for at in range(0, len(body), part):
            arrived = min(at + part, len(body))
            stream.arrived(body[at:at + part])
        assert [(i, data) for i, data, _ in got] == [(i, body[a - 100:b - 100]) for i, a, b in pieces]
        # each as soon as covered: piece i handed on with the part reaching its end
        assert all(when - part < b - 100 <= when for (_, _, when), (_, _, b) in zip(got, pieces, strict=True))


def test_parts_are_handed_on_only_from_a_response_that_answers_the_range() -> None:
    """A response's body parts are taken for a range's bytes only when the server says
    they are (a 206 whose Content-Range and length are the range's): a server that
    ignores Range sends the whole object, whose parts would be handed on as the wrong
    inner chunks. Then nothing is handed on, and the length check refuses the body."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest

    from zfuse.remote_objects import _answers_range

    asked = RangeByteRequest(100, 200)
    assert _answers_range({"ContentRange": "bytes 100-199/1000", "ContentLength": 100}, asked)
    assert not _answers_range({"ContentLength": 1000}, asked)  # the whole object (200)
    assert not _answers_range({"ContentRange": "bytes 0-99/1000", "ContentLength": 100}, asked)
    assert not _answers_range({"ContentRange": "bytes 100-199/1000", "ContentLength": 1000}, asked)
    assert not _answers_range({"ContentRange": "bytes 900-999/1000", "ContentLength": 100}, SuffixByteRequest(100))


def test_a_small_sharded_arrays_indexes_are_read_beside_its_listing() -> None:
    """[remote-5] a walker's listing of a remote sharded array of at most
    INDEXES_ALONGSIDE shards: every shard's index is asked for while the whole-array
    LIST is under way (one round trip for the walk, not two). The LIST here waits for
    the first index read to start (up to 5 s): before, they came only after it."""
    import zarr

    store = counting_store()
    started = asyncio.Event()
    reads: list[str] = []
    real_get, real_list = type(store).get, type(store).list_prefix

    async def get(self, key, prototype=None, byte_range=None):  # type: ignore[no-untyped-def]
        reads.append(key)
        started.set()
        return await real_get(self, key, prototype, byte_range)

    async def list_prefix(self, prefix: str):  # type: ignore[no-untyped-def]
        try:
            await asyncio.wait_for(started.wait(), 5)
        except TimeoutError:
            pass
        async for key in real_list(self, prefix):
            yield key

    type(store).get, type(store).list_prefix = get, list_prefix  # (this store's class only)
    arr = zarr.create_array(store, name="s", shape=(32, 32), shards=(8, 32), chunks=(8, 8), dtype="uint8",
                            fill_value=0)
    arr[...] = 1  # shards c/0/0 .. c/3/0
    source = _remote_source(arr)
    reads.clear()
    started.clear()  # (the writes above read)
    assert _listed(source, ("c",)) == [(str(i), None) for i in range(4)]
    assert started.is_set() and reads  # asked for before the listing answered
    for i in range(4):
        assert _listed(source, ("c", str(i))) == [(str(j), (i, j)) for j in range(4)]
    assert sorted(reads) == [f"s/c/{i}/0" for i in range(4)]  # each once
    assert store.flat == ["s/"] and store.dirs == []
