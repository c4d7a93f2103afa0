"""Listing what is looked at, with no FUSE: a counting store under the view says which
store requests each lookup and listing costs, and the caches' bounds hold."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import trio
import zarr

from zfuse.fs import LIST_AHEAD, ROOT_INODE, FileSystem, encode_names
from zfuse.fs.listing_ahead import let_go as _let_go
from zfuse.local_store import AtomicLocalStore
from zfuse.stats import Stats
from zfuse.testing import CountingStore
from zfuse.view.array_view import ViewOptions
from zfuse.view.tree import DirReader, View, build_view

from stores import raw_chunks

GRID = (30, 40)


def expected_value(coords: tuple[int, ...]) -> int:
    return int(np.ravel_multi_index(coords, GRID)) % 251 + 1


def open_view(path: Path, **options) -> tuple[View, CountingStore, Stats]:
    counting = CountingStore(AtomicLocalStore(str(path), read_only=False))
    stats = Stats()
    view = build_view(zarr.open_array(counting, mode="r+"), ViewOptions(**options), stats)
    counting.reset()
    return view, counting, stats


def names(view: View, path: tuple[str, ...]) -> list[str]:
    return [name for name, _ in view.list_dir(path)]


@pytest.fixture
def slash(tmp_path: Path) -> Path:
    raw_chunks(tmp_path / "a.zarr", GRID, every=3)  # a third of the chunks stored
    return tmp_path / "a.zarr"


def test_stat_of_one_chunk_is_one_existence_check_no_listing(slash: Path) -> None:
    view, store, _ = open_view(slash)
    assert view.needs_io(("c", "7", "5.tiff"))
    entry = view.entry(("c", "7", "5.tiff"))  # 7*40+5 = 285, a multiple of 3: stored
    assert entry is not None and entry.coords == (7, 5)
    assert view.entry(("c", "7", "6.tiff")) is None  # not stored
    assert store.lists == [] and store.gets == []
    assert store.exists_checks == ["c/7/5", "c/7/6"]
    # answered from memory now: no second check
    assert not view.needs_io(("c", "7", "5.tiff")) and view.entry(("c", "7", "5.tiff")) is not None
    assert store.exists_checks == ["c/7/5", "c/7/6"]
    # directories implied by the grid need nothing at all
    assert view.entry(("c", "29")).node.is_dir and view.entry(("c", "30")) is None
    assert store.lists == [] and len(store.exists_checks) == 2


def test_listing_one_directory_lists_that_prefix_only(slash: Path) -> None:
    view, store, stats = open_view(slash)
    assert view.needs_io(("c", "7"), listing=True)
    got = names(view, ("c", "7"))
    want = sorted(f"{j}.tiff" for j in range(40) if (7 * 40 + j) % 3 == 0)
    assert got == want
    assert store.lists == [("list_dir", "c/7/")]
    assert store.gets == [] and store.exists_checks == []  # ls reads no chunk data
    assert stats.snapshot()["listing_pages"] == 1
    # again, and lookups in it: from memory
    assert not view.needs_io(("c", "7"), listing=True)
    assert names(view, ("c", "7")) == want
    assert view.entry(("c", "7", "2.tiff")) is not None and view.entry(("c", "7", "3.tiff")) is None
    assert store.lists == [("list_dir", "c/7/")] and store.exists_checks == []
    # the array directory costs no listing (every chunk key begins with `c/`); c/ is one
    # listing of its own prefix
    assert names(view, ()) == ["c", "image.ome.tif", "image.tif", "zarr.json"]
    assert names(view, ("c",)) == sorted(str(i) for i in range(30))
    assert store.lists == [("list_dir", "c/7/"), ("list_dir", "c/")]


def test_sharded_directory_reads_only_the_indexes_of_its_shards(tmp_path: Path) -> None:
    raw_chunks(tmp_path / "s.zarr", GRID, shard=(4, 8))  # storage grid 8 x 5 shards
    view, store, _ = open_view(tmp_path / "s.zarr")
    assert names(view, ("c", "13")) == sorted(f"{j}.tiff" for j in range(40))
    assert store.lists == [("list_dir", "c/3/")]  # inner row 13 lives in shard row 3
    assert sorted(key for key, _ in store.gets) == [f"c/3/{j}" for j in range(5)]  # 5 index reads
    # a neighbouring row in the same shards: the indexes are cached
    store.reset()
    assert len(names(view, ("c", "14"))) == 40
    assert store.gets == []
    # one chunk of another shard: one index read, no listing
    store.reset()
    assert view.entry(("c", "29", "39.tiff")) is not None
    assert store.lists == [] and [key for key, _ in store.gets] == ["c/7/4"]
    entry = view.entry(("c", "29", "39.tiff"))
    assert entry.array.pixel_bytes((29, 39)) == bytes([expected_value((29, 39))])


@pytest.mark.parametrize(("grid", "shard", "every"), [
    ((23,), (5,), 2),  # 1-D: the array's one chunk directory
    ((30, 41), (4, 8), 3),  # edge shards along both axes
    ((7, 13, 11), (2, 3, 4), 5),  # 3-D: directories two levels deep
])
def test_sharded_directories_list_exactly_the_stored_inner_chunks(
        tmp_path: Path, grid: tuple[int, ...], shard: tuple[int, ...], every: int) -> None:
    """Every chunk directory of a sparse sharded array shows the inner chunks its shard
    indexes hold and no other, including in edge shards, where an index entry past the
    array's grid (another writer's, or a shrunk array's) is not a chunk file."""
    path = tmp_path / "s.zarr"
    raw_chunks(path, grid, shard=shard, every=every)
    # the last shard's index marks its last inner position stored: past the grid when
    # the grid does not fill that shard
    storage = tuple(-(-g // s) for g, s in zip(grid, shard, strict=True))
    last = path / ("c/" + "/".join(str(s - 1) for s in storage))
    blob = bytearray(last.read_bytes())
    per = int(np.prod(shard))
    entry = len(blob) - 16 * per + 16 * (per - 1)
    blob[entry : entry + 16] = np.array([0, 1], dtype="<u8").tobytes()
    last.write_bytes(bytes(blob))
    view, _, _ = open_view(path)
    stored = {c for flat, c in enumerate(np.ndindex(*grid)) if flat % every == 0}
    for lead in np.ndindex(*grid[:-1]):
        directory = ("c", *map(str, lead))
        expected = sorted(f"{c[-1]}.tiff" for c in stored if c[:-1] == lead)
        assert names(view, directory) == expected, directory
        entries = dict(view.list_dir(directory))
        assert all(entries[name].coords == (*lead, int(name.removesuffix(".tiff"))) for name in expected)


def test_flat_keys_lookup_checks_one_key_and_listing_is_paged(tmp_path: Path) -> None:
    grid = (150, 100)  # 15,000 chunks, all in the array's own directory (c.i.j)
    raw_chunks(tmp_path / "f.zarr", grid, separator=".")
    view, store, _ = open_view(tmp_path / "f.zarr")
    assert view.entry(("c.149.99.tiff",)) is not None
    assert store.lists == [] and store.exists_checks == ["c.149.99"]
    # readdir of the array directory: answered after the first pages, not the whole listing
    reader = DirReader(view, (), [])
    assert reader.at_hand(0) is None
    reader.fetch(0)
    first = reader.at_hand(0)
    assert first and store.listed_names[0] < 15_000
    seen = []
    offset = 0
    while True:
        batch = reader.at_hand(offset)
        if batch is None:
            reader.fetch(offset)
            continue
        if not batch:
            break
        seen += [name for name, _ in batch]
        offset += len(batch)
    assert sorted(seen) == sorted(["image.ome.tif", "image.tif", "zarr.json"] + [f"c.{i}.{j}.tiff" for i in range(150) for j in range(100)])
    assert store.lists == [("list_dir", "")]
    # seeking back restarts the listing and gives the same order
    reader.fetch(5)
    assert [name for name, _ in reader.at_hand(5)[:3]] == seen[5:8]


def test_small_directory_reader_is_one_sorted_snapshot(slash: Path) -> None:
    view, _, _ = open_view(slash)
    reader = view.dir_reader(("c", "1"), tail=[("scratch.tmp", view.entry(("c",)))])
    reader.fetch(0)
    got = [name for name, _ in reader.at_hand(0)]
    assert got == names(view, ("c", "1")) + ["scratch.tmp"]
    assert reader.at_hand(len(got)) == []


def test_cache_bound_holds_when_browsing_many_directories(slash: Path) -> None:
    view, store, stats = open_view(slash, listing_cache_names=100)
    for i in range(30):
        assert len(names(view, ("c", str(i)))) in (13, 14)
        assert view.entry(("c", str(i), "0.tiff")) is not None or (i * 40) % 3
    caches = next(arr for _, arr in view.arrays()).caches
    assert caches.names.used <= 100
    snap = stats.snapshot()
    assert snap["listing_evictions"] > 0 and snap["listing_cache_names"] <= 100
    # an evicted directory is listed again when asked, with the same answer
    store.reset()
    assert names(view, ("c", "0")) == sorted(f"{j}.tiff" for j in range(40) if j % 3 == 0)
    assert store.lists == [("list_dir", "c/0/")]


def test_directory_bigger_than_the_cache_is_streamed_not_kept(slash: Path) -> None:
    view, store, _ = open_view(slash, listing_cache_names=10)
    assert len(names(view, ("c", "3"))) == 14
    assert view.needs_io(("c", "3"), listing=True)  # not kept
    # lookups in it are single checks
    store.reset()
    assert view.entry(("c", "3", "3.tiff")) is not None  # 3*40+3 is a multiple of 3
    assert store.lists == [] and store.exists_checks == ["c/3/3"]


def test_shard_index_cache_is_bounded(tmp_path: Path) -> None:
    raw_chunks(tmp_path / "s.zarr", GRID, shard=(4, 8))
    # one index of 32 inner chunks is 512 bytes (+256 counted): room for two
    view, store, stats = open_view(tmp_path / "s.zarr", shard_index_cache_bytes=1600)
    for i in range(0, 30, 4):
        names(view, ("c", str(i)))
    arr = next(arr for _, arr in view.arrays())
    assert arr.caches.indexes.used <= 1600
    assert stats.snapshot()["shard_index_evictions"] > 0


def test_sharded_listing_chunk_maps_are_bounded_and_follow_rewritten_shards(tmp_path: Path) -> None:
    """A directory spanning more shards than `CHUNK_MAPS_KEPT` lists them all, the
    chunk maps kept stay within the bound, and a shard rewritten through the view (a
    new index) is listed from its new map, not the one kept for the old index."""
    from zfuse.view.chunk_listing import CHUNK_MAPS_KEPT

    shards = CHUNK_MAPS_KEPT + 36
    raw_chunks(tmp_path / "s.zarr", (2, 2 * shards), shard=(2, 2), every=2)  # row 0: even columns
    view, _, _ = open_view(tmp_path / "s.zarr", shard_index_cache_bytes=1 << 20)
    arr = next(arr for _, arr in view.arrays())
    assert names(view, ("c", "0")) == sorted(f"{j}.tiff" for j in range(0, 2 * shards, 2))
    assert 0 < len(arr.source._listing._chunk_maps) <= CHUNK_MAPS_KEPT
    arr.source.write_chunk((0, 1), np.full((1, 1), 9, dtype="uint8"))  # shard (0, 0), kept
    arr.add_chunk((0, 1))
    arr.refresh()  # listed again from the shard indexes, not from the listing in memory
    assert names(view, ("c", "0"))[:3] == ["0.tiff", "1.tiff", "10.tiff"]
    assert len(names(view, ("c", "0"))) == shards + 1


def test_sharded_listing_chunk_maps_keep_no_index_alive_and_bound_their_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk maps kept for listings hold no shard index alive (the index cache's
    byte bound is the only one on indexes) and stay within `CHUNK_MAPS_BYTES`."""
    import gc

    from zfuse.view import chunk_listing

    monkeypatch.setattr(chunk_listing, "CHUNK_MAPS_BYTES", 3 * 32)  # three maps of 4 x 8 inner chunks
    raw_chunks(tmp_path / "s.zarr", GRID, shard=(4, 8), every=2)
    view, _, _ = open_view(tmp_path / "s.zarr")
    arr = next(arr for _, arr in view.arrays())
    first = names(view, ("c", "5"))
    assert first == sorted(f"{j}.tiff" for j in range(40) if (5 * 40 + j) % 2 == 0)
    memo = arr.source._listing._chunk_maps
    assert 0 < len(memo) <= 3 and arr.source._listing._chunk_maps_bytes <= 3 * 32
    arr.source._indexes.clear()  # the index cache lets go of every index
    gc.collect()
    assert all(ref() is None for ref, _ in memo.values())
    arr.refresh()
    assert names(view, ("c", "5")) == first  # from the indexes read again


def test_writes_update_listed_directories(slash: Path) -> None:
    view, store, _ = open_view(slash)
    arr = next(arr for _, arr in view.arrays())
    assert "1.tiff" not in names(view, ("c", "0"))
    arr.source.write_chunk((0, 1), np.full((1, 1), 9, dtype="uint8"))
    arr.add_chunk((0, 1))
    assert "1.tiff" in names(view, ("c", "0"))
    assert view.entry(("c", "0", "1.tiff")) is not None
    # removing every chunk of a listed row (`rm c/2/*`) drops the row from the listed parent
    assert "2" in names(view, ("c",)) and names(view, ("c", "2"))
    for j in range(40):
        if arr.exists((2, j)):
            arr.source.delete_chunk((2, j))
            arr.remove_chunk((2, j))
    assert names(view, ("c", "2")) == [] and "2" not in names(view, ("c",))
    assert view.entry(("c", "2")).node.is_dir  # still there to be written into
    n_lists = len(store.lists)
    assert view.entry(("c", "2", "0.tiff")) is None and len(store.lists) == n_lists


def test_refresh_forgets_listings_and_existence(slash: Path) -> None:
    view, store, _ = open_view(slash)
    assert "1.tiff" not in names(view, ("c", "0"))
    assert view.entry(("c", "5", "2.tiff")) is None
    (slash / "c" / "0" / "1").write_bytes(b"\x07")  # another writer
    (slash / "c" / "5" / "2").write_bytes(b"\x07")
    assert "1.tiff" not in names(view, ("c", "0"))  # cached until a refresh
    view.refresh()
    assert view.needs_io(("c", "0"), listing=True) and view.needs_io(("c", "5", "2.tiff"))
    assert "1.tiff" in names(view, ("c", "0"))
    assert view.entry(("c", "5", "2.tiff")) is not None


def test_all_chunks_lists_the_grid_without_the_store(slash: Path) -> None:
    view, store, _ = open_view(slash, all_chunks=True)
    assert names(view, ("c", "4")) == sorted(f"{j}.tiff" for j in range(40))
    assert view.entry(("c", "4", "1.tiff")) is not None
    assert store.lists == [] and store.exists_checks == []


def test_count_files_walks_every_directory(slash: Path) -> None:
    view, _, _ = open_view(slash)
    arr = next(arr for _, arr in view.arrays())
    assert arr.count_files() == len(range(0, 30 * 40, 3))


def test_concat_existence_checks_agree_with_its_listing(tmp_path: Path) -> None:
    from zfuse.ext.concat import concat
    from zfuse.view.concat_source import ConcatChunkSource

    parts = []
    for n, rows in enumerate((12, 9)):  # the second source starts mid-chunk: straddling chunks
        arr = zarr.create_array(str(tmp_path / f"{n}.zarr"), shape=(rows, 16), chunks=(4, 8), dtype="uint8",
                                fill_value=0)
        arr[0:4, 0:8] = 1
        arr[rows - 1, 15] = 2
        parts.append(zarr.open_array(str(tmp_path / f"{n}.zarr"), mode="r"))
    source = ConcatChunkSource(concat(parts, axis=0))
    listed = set(source.list_chunks())
    checked = {c for c in np.ndindex(*source.grid_shape) if source.chunk_exists(c)}
    assert checked == listed and len(listed) >= 3


def fs_listdir(fs: FileSystem, path: tuple[str, ...]) -> list[str]:
    """lookup each name, opendir, readdir to the end, releasedir: what `ls` makes the kernel do."""

    async def run() -> list[str]:
        ino = ROOT_INODE
        for name in path:
            ino = (await fs.lookup(ino, name)).ino
        fh = await fs.opendir(ino)
        out: list[str] = []
        await fs.readdir(fh, 0, lambda name, ino, attrs, next_id: out.append(name) or True)
        fs.releasedir(fh)
        return out

    return trio.run(run)


def test_a_walk_lists_the_next_directories_ahead_and_one_ls_does_not(slash: Path) -> None:
    view, store, stats = open_view(slash)
    jobs: list[tuple[object, object]] = []
    fs = FileSystem(view, stats=stats, spawn=lambda fn, arg: jobs.append((fn, arg)))

    def listed() -> list[str]:
        return [p.split("/")[1] for kind, p in store.lists if p.count("/") == 2]

    subdirs = fs_listdir(fs, ("c",))
    assert subdirs == sorted(str(i) for i in range(GRID[0]))  # 0 1 10 11 ... 19 2 20 ...
    # one directory looked at: that directory is listed, nothing ahead
    fs_listdir(fs, ("c", "5"))
    assert listed() == ["5"] and jobs == []
    # the first two subdirectories in listing order, one after the other: a walk
    fs_listdir(fs, ("c", "0"))
    assert jobs == []
    fs_listdir(fs, ("c", "1"))
    assert listed() == ["5", "0", "1"]
    ahead = subdirs[2 : 2 + LIST_AHEAD]  # the next ones in listing order: 10, 11, ...
    assert [arg.path for _, arg in jobs] == [("c", name) for name in ahead]  # type: ignore[attr-defined]
    for fn, arg in jobs:  # the read-ahead threads' work
        fn(arg)  # type: ignore[operator]
    jobs.clear()
    assert listed() == ["5", "0", "1", *ahead]
    assert stats.snapshot()["listing_read_ahead"] == LIST_AHEAD
    # the walker finds them listed: it lists nothing itself, and stays LIST_AHEAD ahead
    want = sorted(f"{j}.tiff" for j in range(GRID[1]) if (10 * GRID[1] + j) % 3 == 0)
    assert sorted(fs_listdir(fs, ("c", "10"))) == want
    assert listed() == ["5", "0", "1", *ahead]
    # (and the directory just read is let go in the listing thread: its objects freed there)
    assert [arg.path for fn, arg in jobs if fn is not _let_go] == [("c", subdirs[2 + LIST_AHEAD])]  # type: ignore[attr-defined]
    assert [arg.path for fn, arg in jobs if fn is _let_go] == [("c", "10")]  # type: ignore[attr-defined]
    # nothing is read but listings: no chunk data, no existence checks
    assert store.gets == [] and store.exists_checks == []


def test_without_a_listed_parent_no_directory_is_listed_ahead(slash: Path) -> None:
    view, store, stats = open_view(slash)
    jobs: list[tuple[object, object]] = []
    fs = FileSystem(view, stats=stats, spawn=lambda fn, arg: jobs.append((fn, arg)))
    for i in range(5):  # `ls c/0; ls c/1; ...` without listing c/ first
        fs_listdir(fs, ("c", str(i)))
    assert jobs == [] and len(store.lists) == 5


def fs_listing(fs: FileSystem, path: tuple[str, ...]) -> list[tuple[str, int, object]]:
    """As `fs_listdir`: (name, inode number, attributes) of every entry."""

    async def run() -> list[tuple[str, int, object]]:
        ino = ROOT_INODE
        for name in path:
            ino = (await fs.lookup(ino, name)).ino
        fh = await fs.opendir(ino)
        out: list[tuple[str, int, object]] = []
        await fs.readdir(fh, 0, lambda name, ino, attrs, next_id: out.append((name, ino, attrs)) or True)
        fs.releasedir(fh)
        return out

    return trio.run(run)


def walked_past_two(slash: Path) -> tuple[View, CountingStore, FileSystem, str]:
    """(view, store, fs, next): `ls -R` through the first two subdirectories of c/, the
    read-ahead's jobs done as they come (what the listing threads do); `next`, the
    third, is then made ready ahead."""
    view, store, stats = open_view(slash)
    jobs: list = []
    fs = FileSystem(view, stats=stats, spawn=lambda fn, arg: jobs.append((fn, arg)))
    subdirs = fs_listdir(fs, ("c",))
    for name in subdirs[:2]:
        fs_listdir(fs, ("c", name))
        while jobs:
            fn, arg = jobs.pop(0)
            fn(arg)
    nxt = subdirs[2]
    assert ("c", nxt) in fs.listing_ahead.prepared
    return view, store, fs, nxt


def test_a_directory_listed_ahead_opens_as_listed_with_inodes_made_ahead(slash: Path) -> None:
    """[read-3] A walker's next directory comes listed, sorted and with its entries'
    inodes made in the listing thread: its opendir and readdir list nothing, and its
    entries look exactly as a directory listed at opendir would (names, attributes,
    one distinct inode per entry, the same inode for a name looked up before)."""
    view, store, fs, nxt = walked_past_two(slash)
    lists = len(store.lists)
    known = view.list_dir(("c", nxt))[-1][0]  # a name looked up before the directory is opened

    async def lookup() -> int:
        ino = ROOT_INODE
        for name in ("c", nxt, known):
            ino = (await fs.lookup(ino, name)).ino
        return ino

    known_ino = trio.run(lookup)
    listing = fs_listing(fs, ("c", nxt))
    assert len(store.lists) == lists  # nothing listed again
    assert ("c", nxt) not in fs.listing_ahead.prepared  # taken by the opendir
    # what a directory listed at opendir shows: a second FileSystem without read-ahead
    plain = FileSystem(open_view(slash)[0], stats=Stats())
    plain.started_ns = fs.started_ns  # the mount's time: every file's mtime
    expected = fs_listing(plain, ("c", nxt))
    assert [name for name, _, _ in listing] == [name for name, _, _ in expected]
    assert [attrs[1:] for _, _, attrs in listing] == [attrs[1:] for _, _, attrs in expected]  # type: ignore[index]
    inos = [ino for _, ino, _ in listing]
    assert len(set(inos)) == len(inos) and all(fs.inodes[ino].path == ("c", nxt, name) for name, ino, _ in listing)
    assert dict((name, ino) for name, ino, _ in listing)[known] == known_ino
    # one kernel reference per entry (two for the name looked up)
    assert [fs.inodes[ino].lookups for ino in inos] == [2 if ino == known_ino else 1 for ino in inos]
    # listed again: the same inodes (the names have them now), one more reference each
    again = fs_listing(fs, ("c", nxt))
    assert [ino for _, ino, _ in again] == inos
    assert [fs.inodes[ino].lookups for ino in inos] == [3 if ino == known_ino else 2 for ino in inos]


def test_a_directory_listed_ahead_is_offered_as_runs_numbered_in_order(slash: Path) -> None:
    """[read-3] What the FUSE adapter gets for `ls -lR`: a directory listed ahead, none
    of whose entries the kernel knows yet, is offered as runs (names encoded, inode
    numbers in order, one set of attributes) however full the reply buffer gets; the
    entries are what a plain listing shows, and each is an inode by number, with one
    kernel reference, until forgotten."""
    view, store, fs, nxt = walked_past_two(slash)
    prepared = fs.listing_ahead.prepared[("c", nxt)]
    assert prepared.version is not None  # made from the listing: no Entry, no snapshot per name
    assert prepared.reader.at_hand(0) is None
    runs: list[tuple[list[bytes], list[int], object, int]] = []

    def accept_run(names, inos, attrs, offset) -> int:  # a reply buffer with room for 3
        taken = min(3, len(names))
        runs.append((list(names[:taken]), list(inos[:taken]), attrs, offset))
        return taken

    async def run() -> None:
        ino = ROOT_INODE
        for name in ("c", nxt):
            ino = (await fs.lookup(ino, name)).ino
        fh = await fs.opendir(ino)
        offset = 0
        while True:
            await fs.readdir(fh, offset, lambda *entry: pytest.fail(f"offered one by one: {entry}"), accept_run)
            if runs[-1][3] != offset or not runs[-1][0]:
                break
            offset += len(runs[-1][0])
        fs.releasedir(fh)

    trio.run(run)
    names = [name.decode() for taken, _, _, _ in runs for name in taken]
    inos = [ino for _, taken, _, _ in runs for ino in taken]
    plain = FileSystem(open_view(slash)[0], stats=Stats())
    plain.started_ns = fs.started_ns
    expected = fs_listing(plain, ("c", nxt))
    assert names == [name for name, _, _ in expected] and len(names) > 3
    assert all(attrs[1:] == expected[0][2][1:] for _, _, attrs, _ in runs)  # type: ignore[index]
    assert inos == list(range(inos[0], inos[0] + len(inos)))
    assert [fs.inodes.path_of(ino) for ino in inos] == [("c", nxt, name) for name in names]
    assert [fs.inodes.ino_of(("c", nxt, name)) for name in names] == inos
    fs.forget([(ino, 1) for ino in inos])
    assert all(ino not in fs.inodes for ino in inos)


def test_a_directory_listed_ahead_then_written_to_is_listed_as_it_is_now(slash: Path) -> None:
    """[read-3] A listing made ahead is not used once its array changed (a chunk
    written or removed through the mount): the opendir shows the directory as it is."""
    view, _, fs, nxt = walked_past_two(slash)
    before = fs_listdir(FileSystem(open_view(slash)[0], stats=Stats()), ("c", nxt))
    row = int(nxt)
    new = next(j for j in range(GRID[1]) if f"{j}.tiff" not in before)
    arr = next(arr for _, arr in view.arrays())
    arr.source.write_chunk((row, new), np.full((1, 1), 9, dtype="uint8"))
    arr.add_chunk((row, new))  # what a commit through the mount does
    assert sorted(fs_listdir(fs, ("c", nxt))) == sorted([*before, f"{new}.tiff"])


def test_entries_of_one_kind_and_size_share_their_attributes(slash: Path) -> None:
    """readdir builds no attribute tuple per stored chunk: the chunks of a directory
    share one (inode number 0), the entry's own inode comes with it, and it equals
    what `stat` gives but for the inode number."""
    view, _, stats = open_view(slash)
    fs = FileSystem(view, stats=stats)
    listing = fs_listing(fs, ("c", "0"))
    assert len(listing) > 2
    shared = listing[0][2]
    assert all(attrs is shared for _, _, attrs in listing) and shared.ino == 0  # type: ignore[attr-defined]
    for _name, ino, attrs in listing:
        stat = trio.run(fs.getattr, ino)
        assert stat.ino == ino and stat[1:] == attrs[1:]  # type: ignore[index]
    subdirs = fs_listing(fs, ("c",))
    assert all(attrs is subdirs[0][2] and attrs.is_dir for _, _, attrs in subdirs)  # type: ignore[attr-defined]


def test_listing_thread_runs_jobs_in_order_on_one_thread() -> None:
    import threading

    from zfuse.workers import WorkerThreads

    ran: list[tuple[int, str]] = []
    done = threading.Event()
    pool = WorkerThreads(1, "test")
    for i in range(5):
        pool.submit(lambda i: ran.append((i, threading.current_thread().name)), i)
    pool.submit(lambda _: done.set(), None)
    assert done.wait(30)
    assert [i for i, _ in ran] == list(range(5)) and {name for _, name in ran} == {"test-1"}


def test_a_walker_lists_a_directory_itself_when_the_listing_thread_has_not_got_to_it(slash: Path) -> None:
    """[read-3] The walker does not wait behind the directories queued for the listing
    thread (which falls behind under CPU load): its opendir lists a directory whose
    job has not started, and the job then lists nothing. Each directory is still
    listed once."""
    view, store, stats = open_view(slash)
    jobs: list = []
    fs = FileSystem(view, stats=stats, spawn=lambda fn, arg: jobs.append((fn, arg)))
    subdirs = fs_listdir(fs, ("c",))
    fs_listdir(fs, ("c", subdirs[0]))
    fs_listdir(fs, ("c", subdirs[1]))  # a walk: the next ones are queued, none started
    assert [arg.path for _, arg in jobs] == [("c", name) for name in subdirs[2 : 2 + LIST_AHEAD]]
    want = sorted(fs_listdir(FileSystem(open_view(slash)[0], stats=Stats()), ("c", subdirs[2])))
    assert sorted(fs_listdir(fs, ("c", subdirs[2]))) == want  # listed by the opendir
    lists = len(store.lists)
    assert len(jobs) == LIST_AHEAD + 1  # the walk moved on: one more queued
    for fn, arg in jobs:  # the listing thread catches up: nothing listed twice
        fn(arg)
    assert len(store.lists) == lists + LIST_AHEAD
    assert stats.snapshot()["listing_read_ahead"] == LIST_AHEAD
    listed = [p for kind, p in store.lists if p.count("/") == 2]
    assert len(listed) == len(set(listed))


@pytest.mark.parametrize("columns", [40, 5000])  # names decoded by a dict (few columns) or one by one
def test_a_chunk_directory_lists_its_chunks_and_nothing_else(tmp_path: Path, columns: int) -> None:
    """Store files that are not chunks of the grid (zero-padded, past the grid's edge,
    not a number) are not chunk files; the ones that are keep their coordinates."""
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(3, columns), chunks=(1, 1), dtype="uint8",
                            fill_value=0, compressors=None)
    arr[1, 2] = arr[1, 3] = arr[1, columns - 1] = 7
    row = tmp_path / "a.zarr" / "c" / "1"
    for stray in ("02", str(columns), "x", "-1", "3.0", "\u0661", "\uff11"):  # and other scripts' digits
        (row / stray).write_bytes(b"\0")
    view, _, _ = open_view(tmp_path / "a.zarr")
    entries = view.list_dir(("c", "1"))
    assert [(name, e.coords) for name, e in entries] == sorted(
        [("2.tiff", (1, 2)), ("3.tiff", (1, 3)), (f"{columns - 1}.tiff", (1, columns - 1))])


def test_a_one_dimensional_array_lists_its_chunks(tmp_path: Path) -> None:
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(10,), chunks=(1,), dtype="uint8", fill_value=0,
                            compressors=None)
    arr[4] = arr[9] = 1
    (tmp_path / "a.zarr" / "c" / "04").write_bytes(b"\0")
    view, _, _ = open_view(tmp_path / "a.zarr")
    assert [(name, e.coords) for name, e in view.list_dir(("c",))] == [("4.tiff", (4,)), ("9.tiff", (9,))]


def test_a_worker_thread_keeps_no_job_argument_once_the_job_ran() -> None:
    """A background job's argument is freed once the job has run, not kept until the
    next job comes (a directory let go after readdir holds its whole view)."""
    import threading
    import weakref

    from zfuse.testing import wait_until
    from zfuse.workers import WorkerThreads

    class Payload:
        pass

    pool = WorkerThreads(1, "test-let-go")
    payload = Payload()
    freed = weakref.ref(payload)
    ran = threading.Event()
    pool.submit(lambda _: ran.set(), payload)
    del payload
    assert ran.wait(30)
    wait_until(lambda: freed() is None, what="the job's argument freed")


def test_an_entry_left_out_of_a_full_reply_gets_no_inode(slash: Path) -> None:
    """readdir numbers each entry it offers, but an entry the reply had no room for is
    not an inode the kernel holds: nothing is left behind for a walker that stops."""
    view, _, stats = open_view(slash)
    fs = FileSystem(view, stats=stats)
    got: list[tuple[str, int]] = []

    def accept(name: str, ino: int, attrs: object, next_id: int) -> bool:
        if len(got) == 2:
            return False  # the reply buffer is full
        got.append((name, ino))
        return True

    async def run() -> None:
        ino = ROOT_INODE
        for name in ("c", "7"):
            ino = (await fs.lookup(ino, name)).ino
        fh = await fs.opendir(ino)
        await fs.readdir(fh, 0, accept)
        fs.releasedir(fh)

    before = len(fs.inodes)
    trio.run(run)
    names = [name for name, _ in view.list_dir(("c", "7"))]
    assert [name for name, _ in got] == names[:2] and len(names) > 2
    assert fs.inodes.ino_of(("c", "7", names[2])) is None
    assert [fs.inodes[ino].lookups for _, ino in got] == [1, 1]
    assert len(fs.inodes) == before + 2 + 2  # c, c/7 and the two entries


def test_a_chunk_found_once_is_answered_from_memory_until_its_array_changes(slash: Path) -> None:
    """A re-open (each pass of a warm re-read opens every file again) finds the chunk
    file as it was found, until a chunk is added or removed through the mount or the
    array is refreshed; then it is looked at again."""
    from zfuse.view.tree import NEEDS_IO

    view, store, _ = open_view(slash)
    path = ("c", "7", "5.tiff")  # 7*40+5 = 285, a multiple of 3: stored
    found = view.entry(path)
    assert found is not None and found.coords == (7, 5) and store.exists_checks == ["c/7/5"]
    assert view.entry(path, memory_only=True) is found  # the same answer, nothing looked at
    arr = view.array_at(path)[0]
    assert arr is not None
    arr.remove_chunk((7, 5))
    assert view.entry(path, memory_only=True) is None
    arr.add_chunk((7, 5))
    again = view.entry(path, memory_only=True)
    assert again is not None and again is not found
    arr.refresh()  # forget what exists: the store is asked again
    assert view.entry(path, memory_only=True) is NEEDS_IO
    assert view.entry(path) is not None and store.exists_checks == ["c/7/5", "c/7/5"]


@pytest.mark.parametrize("names", [
    [], ["0.tiff"], ["10.tiff", "2.tiff", "zarr.json"], ["", "a"], ["caf\u00e9", "\udcff.tiff", "\u6f22"],
])
def test_names_are_encoded_together_as_one_by_one(names: list[str]) -> None:
    # a reply carries a name's bytes: UTF-8, and undecodable bytes (surrogate escapes) restored
    assert encode_names(names) == [os.fsencode(name) for name in names]


def test_directory_coordinates_are_remembered_within_a_bound(slash: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zfuse.view.source as source_module

    monkeypatch.setattr(source_module, "DIR_COORDS_KEPT", 8)
    view, _, _ = open_view(slash)
    source = view._split(("c",))[0].array.source
    for row in range(GRID[0]):
        assert source.dir_coords(("c", str(row))) == (row,)
        assert source.dir_coords(("c", str(row))) == (row,)  # the remembered answer is the same
        assert len(source._dir_coords_memo) <= 8
    # names outside the grid, or not canonical, fix nothing, remembered or not
    for _ in range(2):
        assert source.dir_coords(("c", str(GRID[0]))) is None
        assert source.dir_coords(("c", "07")) is None
        assert source.dir_coords(("d", "1")) is None


def test_a_key_of_thousands_of_digits_is_not_a_coordinate() -> None:
    """A listed key of more than 4,300 digits made int() raise, and its whole chunk
    directory failed (EIO) on every listing; coordinates have at most 20 digits."""
    from zfuse.view.chunk_listing import canonical_int

    assert canonical_int("7") and canonical_int("18446744073709551615") and canonical_int("0")
    assert not canonical_int("07") and not canonical_int("1" * 21) and not canonical_int("9" * 5000)
    assert not canonical_int("١")
