"""Whole-image files: tiles pushed into the kernel's page cache ahead of a region reader.

The rule (which tiles, when) is decided in the FUSE-free layer and tested with
plain calls on a planned file; one real mount shows that pushed tiles reach the
page cache (read afterwards without a FUSE request, same bytes).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from zfuse.daemon import MountConfig
from zfuse.open_view import make_view
from zfuse.stats import Stats
from zfuse.testing import wait_until

import stores


def planned(source: Path, rel: tuple[str, ...] = ("image.ome.tif",)):
    """The file planned in this process, its header built (as the reader's first read does)."""
    view = make_view(MountConfig([str(source)], "/unused", read_only=True), Stats())
    img = view.whole_images(rel[:-1])[rel[-1]]
    img.header()
    return img


def tile_array(path: Path, tiles: int, compressors=None, edge: int = 128) -> np.ndarray:
    """A (tiles*edge)^2 uint16 array in edge x edge chunks (one tile = one chunk; 128: 32 KiB)."""
    a = zarr.create_array(str(path), shape=(tiles * edge, tiles * edge), chunks=(edge, edge),
                          dtype="uint16", fill_value=0, compressors=compressors)
    a[...] = data = stores.values(a.shape, "uint16")
    return data


def asked(img, *reads: tuple[int, int] | tuple[int, int, int]) -> list[tuple[int, int]]:
    """What the kernel asking for these tiles brings, as (row, column), after the last read.
    Each read is (row, column) or (row, column, tiles): that many tiles in one request
    (the kernel's read-ahead takes the next tiles of the row with a tile)."""
    lv = img.levels[0]
    out = []
    for ty, tx, *n in reads:
        out = img.pushes_after(img.slot_offset(0, 0, ty * lv.tiles_across + tx), lv.slot * (n[0] if n else 1))
    return [divmod((start - lv.data_start) // lv.slot, lv.tiles_across) for start, _ in out]


def test_nothing_pushed_for_one_tile_or_tiles_far_apart(tmp_path: Path) -> None:
    """[image-3] a read of one tile pushes nothing (it decodes only the chunks it covers),
    nor do reads of tiles that are not next to each other, nor header reads."""
    tile_array(tmp_path / "a.zarr", 8)
    img = planned(tmp_path / "a.zarr")
    assert img.pushes_after(0, 4096) == []  # the header
    assert asked(img, (3, 3)) == []
    assert asked(img, (0, 0)) == []
    assert asked(img, (6, 0, 2)) == []  # two tiles in one request (the kernel's read-ahead)
    assert asked(img, (3, 3)) == []  # the same tile again


def test_region_reader_gets_the_rest_of_its_regions_then_the_rings_around(tmp_path: Path) -> None:
    """[image-3] once a read asks for a tile next to one asked before, each read's first new
    tile brings the tiles right, below and below right (not those asked already); a new
    tile near the last ones brings the ring of two around it, nearest first; a tile far
    from them only its region's."""
    tile_array(tmp_path / "a.zarr", 16, edge=32)  # 2 KiB tiles: not worth a push of their own
    assert asked(planned(tmp_path / "a.zarr"), (0, 0), (0, 1)) == []  # tiny tiles: not worth a push

    tile_array(tmp_path / "b.zarr", 16)
    img = planned(tmp_path / "b.zarr")
    assert asked(img, (4, 4, 2)) == []  # one request: (4, 4) and the kernel's read-ahead (4, 5)
    # the reader now asks for (5, 4), next to them: a region reader
    assert asked(img, (5, 4)) == [(5, 5), (6, 4), (6, 5)]
    # a new region starting near the last one: its own three, then the ring of two, nearest first
    got = asked(img, (4, 6))
    assert got[:3] == [(4, 7), (5, 6), (5, 7)]
    ring = {(4 + dy, 6 + dx) for dy in range(-2, 3) for dx in range(-2, 3)}
    before = {(4, 4), (4, 5), (5, 4), (4, 6), (5, 5), (6, 4), (6, 5)}  # asked or pushed
    assert set(got) == ring - before
    assert len(got) == len(set(got))
    dist = [max(abs(y - 4), abs(x - 6)) for y, x in got]
    assert dist == sorted(dist)
    # far from everything read lately (a reader jumping about): only its own region
    assert asked(img, (12, 0)) == [(12, 1), (13, 0), (13, 1)]
    # pushed tiles are not pushed again, and no longer wanted once the kernel asks for them
    lv = img.levels[0]
    at = img.slot_offset(0, 0, 13 * lv.tiles_across + 1)
    assert img.push_wanted(at)
    assert asked(img, (13, 1)) == []  # a pushed tile asked for (pushed too late): nothing new
    assert not img.push_wanted(at)
    assert asked(img, (4, 6)) == []  # asked before (evicted, say): nothing new


def test_over_a_remote_store_only_the_rest_of_a_rows_region_is_pushed(tmp_path: Path) -> None:
    """[image-3] over a remote store each pushed tile is a request: nothing is pushed until
    a reader, having read a row of a region left to right, starts the next row at the
    same column; then the rest of that row, as wide, and never a tile past the region."""
    from zfuse.view.whole_image.push import Pusher, ReadAheadAdvisor

    tile_array(tmp_path / "b.zarr", 16)
    img = planned(tmp_path / "b.zarr")
    lv = img.levels[0]
    remote = Pusher(img.layout, img._tile_byte_count, img._change_marks, ReadAheadAdvisor(), remote=True)

    def read(ty: int, tx: int, n: int = 1) -> list[tuple[int, int]]:
        out = remote.pushes_after(img.slot_offset(0, 0, ty * lv.tiles_across + tx), lv.slot * n)
        return [divmod((start - lv.data_start) // lv.slot, lv.tiles_across) for start, _ in out]

    # a region of 3 x 3 tiles at (4, 5), read row by row (tifffile, GDAL)
    assert [read(4, 5), read(4, 6), read(4, 7)] == [[], [], []]  # the first row: its width unknown
    assert read(5, 5) == [(5, 6), (5, 7)]  # the next row: the rest of it, together
    assert [read(5, 6), read(5, 7)] == [[], []]  # (pushed: the reader finds them)
    assert read(6, 5) == [(6, 6), (6, 7)]
    assert read(6, 6, 2) == []  # the kernel's read-ahead of the row: nothing more
    # a reader jumping about, or going down a column: nothing
    assert [read(12, 0), read(0, 12), read(1, 12), read(2, 12)] == [[], [], [], []]


def test_ring_is_at_most_16_mib_per_read(tmp_path: Path) -> None:
    """[image-3] big tiles: a read brings its region's tiles and at most 16 MiB of the ring,
    nearest first."""
    zarr.create_array(str(tmp_path / "a.zarr"), shape=(8192, 8192), chunks=(1024, 1024), dtype="uint16",
                      fill_value=0, compressors=None)  # 2 MiB tiles, nothing stored
    img = planned(tmp_path / "a.zarr")
    assert img.levels[0].tile_bytes == 2 << 20
    assert asked(img, (2, 2, 2)) == []
    assert asked(img, (3, 2)) == [(3, 3), (4, 2), (4, 3)]
    got = asked(img, (2, 4))
    assert got[:3] == [(2, 5), (3, 4), (3, 5)]
    dist = [max(abs(y - 2), abs(x - 4)) for y, x in got[3:]]
    assert len(dist) == 8 and dist == sorted(dist)  # 8 x 2 MiB of the ring, nearest first
    assert got[3:6] == [(1, 4), (1, 5), (1, 3)]  # the ring's tiles at distance 1 not asked or pushed yet


def test_pushed_ranges_are_whole_pages_of_the_tiles_bytes(tmp_path: Path) -> None:
    """[image-3] a pushed range starts at the tile's slot, page aligned, and covers the tile's
    bytes (the same bytes a read returns); a change of the array starts the rule over."""
    data = tile_array(tmp_path / "a.zarr", 4, compressors=[ZstdCodec(level=1)])
    img = planned(tmp_path / "a.zarr")
    lv = img.levels[0]
    img.pushes_after(img.slot_offset(0, 0, 0), lv.tile_bytes)
    spans = img.pushes_after(img.slot_offset(0, 0, 1), lv.tile_bytes)
    assert spans
    for start, length in spans:
        assert start % 4096 == 0 and length % 4096 == 0 and length >= lv.tile_bytes
        index = (start - lv.data_start) // lv.slot
        ty, tx = divmod(index, lv.tiles_across)
        got = np.frombuffer(bytes(img.read(start, length))[: lv.tile_bytes], dtype="<u2").reshape(128, 128)
        np.testing.assert_array_equal(got, data[ty * 128 : ty * 128 + 128, tx * 128 : tx * 128 + 128])


def test_reads_of_several_pieces_equal_one_sequential_read(tmp_path: Path) -> None:
    """[image-5] reads spanning the header, gaps, several passthrough or decoded tiles and
    the trailer (put together in one buffer) equal the same bytes read in small pieces."""
    for name, compressors in (("raw", None), ("zstd", [ZstdCodec(level=1)])):
        tile_array(tmp_path / f"{name}.zarr", 3, compressors=compressors, edge=48)  # 4.5 KiB tiles
        img = planned(tmp_path / f"{name}.zarr")
        whole = b"".join(bytes(img.read(at, 4096)) for at in range(0, img.size, 4096))
        assert len(whole) == img.size
        rng = np.random.default_rng(3)
        starts = [0, img.data_start - 100, img.size - 70000, *rng.integers(0, img.size, 40)]
        for at in starts:
            n = int(rng.integers(1, 3 << 20))
            assert bytes(img.read(int(at), n)) == whole[int(at) : int(at) + n], (name, at, n)


def resident(fd: int, offset: int, length: int) -> bool:
    """Whether every page of [offset, offset+length) of the open file is in the page cache
    (mincore on a mapping: looks, reads nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert offset % mmap.PAGESIZE == 0
    pages = -(-length // mmap.PAGESIZE)
    addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    vec = (ctypes.c_ubyte * pages)()
    try:
        assert libc.mincore(addr, length, vec) == 0, os.strerror(ctypes.get_errno())
    finally:
        libc.munmap(addr, length)
    return all(v & 1 for v in vec)


@pytest.mark.mount
@pytest.mark.parametrize("compressors", [None, [ZstdCodec(level=1)]], ids=["passthrough", "decoded"])
def test_pushed_tiles_are_in_the_page_cache_before_they_are_read(tmp_path: Path, mount, compressors) -> None:
    """[image-3] a region reader's next tiles reach the kernel's page cache before it asks
    for them (the rest of its region), with the array's values; other tiles do not."""
    data = tile_array(tmp_path / "a.zarr", 8, compressors=compressors)
    m = mount(tmp_path / "a.zarr", "-o", "ro")
    img = planned(tmp_path / "a.zarr")
    lv = img.levels[0]

    def at(ty: int, tx: int) -> int:
        return img.slot_offset(0, 0, ty * lv.tiles_across + tx)

    def tile(fd: int, ty: int, tx: int) -> np.ndarray:
        return np.frombuffer(os.pread(fd, lv.tile_bytes, at(ty, tx)), dtype="<u2").reshape(128, 128)

    fd = os.open(m.path / "image.ome.tif", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead: one tile per read
        tile(fd, 2, 2)
        tile(fd, 2, 3)  # next to the first: a region reader
        region = ((2, 4), (3, 3), (3, 4))  # the rest of the region of (2, 3)
        wait_until(lambda: all(resident(fd, at(ty, tx), lv.tile_bytes) for ty, tx in region),
                   what="the region's tiles pushed into the page cache")
        assert not resident(fd, at(6, 6), lv.tile_bytes)
        assert json.loads((m.path / ".zfuse" / "stats").read_text())["image_tiles_pushed"] >= 3
        for ty, tx in (*region, (6, 6)):
            np.testing.assert_array_equal(tile(fd, ty, tx), data[ty * 128 : ty * 128 + 128, tx * 128 : tx * 128 + 128])
    finally:
        os.close(fd)


def test_over_a_remote_store_each_tile_is_followed_by_a_read_ahead_window_of_zeros(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[image-3] over a remote store each tile slot of image.ome.tif ends in zeros as long
    as two of the mount's read-ahead windows: the kernel reading ahead past a region's
    last tile of a row reads them (nothing decoded, nothing fetched), not the tiles after
    it; the image reads the same."""
    import io

    import tifffile

    from zfuse import defaults
    from zfuse.view.source import ZarrChunkSource

    data = tile_array(tmp_path / "a.zarr", 4, compressors=[ZstdCodec()])  # 4 x 4 tiles of 32 KiB
    local = planned(tmp_path / "a.zarr")
    monkeypatch.setattr(ZarrChunkSource, "fetches_remotely", property(lambda self: True))
    img = planned(tmp_path / "a.zarr")
    lv, window = img.levels[0], 2 * defaults.READ_AHEAD_KB * 1024
    assert local.levels[0].slot == lv.tile_bytes == 128 * 128 * 2
    assert lv.slot == lv.tile_bytes + window
    tile = img.slot_offset(0, 0, 1)
    assert img.layout.tiles_in(tile, lv.slot) == [(0, 0, 1)]  # the tile and the window after it
    fetched = lambda: img.stats.snapshot().get("store_get_chunk", 0)  # noqa: E731
    assert img.read(tile + lv.tile_bytes, window) == bytes(window) and fetched() == 0
    assert img.read(tile, 100) and fetched() == 1  # (what the counter counts: the tile's chunk)
    whole = img.read(0, img.size)
    np.testing.assert_array_equal(tifffile.imread(io.BytesIO(whole)), data)


def test_over_a_remote_store_the_tiles_pushed_are_fetched_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[image-3] the rest of a row pushed over a remote store: its chunks' fetches start
    together when the push is decided (the push then stores them one after another)."""
    from zfuse.view.array_view import ArrayView
    from zfuse.view.source import ZarrChunkSource

    tile_array(tmp_path / "a.zarr", 8)
    monkeypatch.setattr(ZarrChunkSource, "fetches_remotely", property(lambda self: True))
    fetched: list[list[tuple[int, ...]]] = []
    monkeypatch.setattr(ArrayView, "fetch_ahead", lambda self, coords: fetched.append(list(coords)))
    img = planned(tmp_path / "a.zarr")
    assert [asked(img, (2, 3)), asked(img, (2, 4)), asked(img, (2, 5))] == [[], [], []]
    assert fetched == []
    assert asked(img, (3, 3)) == [(3, 4), (3, 5)]
    assert fetched == [[(3, 4), (3, 5)]]


def test_over_a_remote_store_reads_of_a_slots_zeros_say_nothing_of_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[image-3] the kernel reading ahead into the zeros after a tile (late, after the
    reader started the next row) neither counts as a read of that tile nor breaks the
    row the reader is going through: the rest of each row is still pushed."""
    from zfuse.view.source import ZarrChunkSource

    tile_array(tmp_path / "a.zarr", 8)
    monkeypatch.setattr(ZarrChunkSource, "fetches_remotely", property(lambda self: True))
    img = planned(tmp_path / "a.zarr")
    lv = img.levels[0]

    def zeros_after(ty: int, tx: int) -> list[tuple[int, int]]:
        start = img.slot_offset(0, 0, ty * lv.tiles_across + tx) + lv.tile_bytes
        return img.pushes_after(start, 65536)

    assert [asked(img, (2, 3)), asked(img, (2, 4)), asked(img, (2, 5))] == [[], [], []]
    assert asked(img, (3, 3)) == [(3, 4), (3, 5)]
    assert zeros_after(2, 5) == []  # the read-ahead of the row before, late
    assert [asked(img, (3, 4)), asked(img, (3, 5))] == [[], []]
    assert zeros_after(3, 5) == []
    assert asked(img, (4, 3)) == [(4, 4), (4, 5)]  # the row goes on as before


def test_over_a_remote_store_a_rows_rest_is_fetched_beside_its_first_tile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[image-3] over a remote store the filesystem asks for the push before it serves the
    read (the push needs the offset only): the chunks of the rest of a region's next row
    are fetched beside its first tile's, one round trip for the row, not two."""
    import trio

    from zfuse.fs import ROOT_INODE, FileSystem
    from zfuse.view.array_view import ArrayView
    from zfuse.view.source import ZarrChunkSource
    from zfuse.view.whole_image.image import WholeImage

    tile_array(tmp_path / "a.zarr", 8)
    monkeypatch.setattr(ZarrChunkSource, "fetches_remotely", property(lambda self: True))
    events: list[tuple[str, object]] = []
    monkeypatch.setattr(ArrayView, "fetch_ahead", lambda self, coords: events.append(("fetch", list(coords))))
    read = WholeImage.read

    def recorded_read(self: WholeImage, offset: int, size: int) -> bytes:
        events.append(("read", offset))
        return read(self, offset, size)

    monkeypatch.setattr(WholeImage, "read", recorded_read)

    class Kernel:
        def store(self, ino: int, offset: int, data: bytes) -> None:
            pass

    stats = Stats()
    fs = FileSystem(make_view(MountConfig([str(tmp_path / "a.zarr")], "/unused", read_only=True), stats),
                    stats=stats, kernel=Kernel(), spawn=lambda fn, job: None, read_only=True)  # type: ignore[arg-type]

    img = fs.view.whole_images(())["image.ome.tif"]
    img.header()
    lv = img.levels[0]
    slot = lambda ty, tx: img.slot_offset(0, 0, ty * lv.tiles_across + tx)  # noqa: E731

    async def read_tiles() -> None:
        ino = (await fs.lookup(ROOT_INODE, "image.ome.tif", 0)).ino
        fh = (await fs.open(ino, os.O_RDONLY, 0)).fh
        for ty, tx in [(2, 3), (2, 4), (2, 5), (3, 3)]:
            await fs.read(fh, slot(ty, tx), 4096)

    trio.run(read_tiles)
    assert events[-2:] == [("fetch", [(3, 4), (3, 5)]), ("read", slot(3, 3))], events
