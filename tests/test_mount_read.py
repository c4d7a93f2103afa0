"""The read path on real mounts: every chunk a TIFF that real readers open."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from zarr.codecs import ZstdCodec

from zfuse.testing import assert_no_traceback

import stores
from tools import imagej_stats_many, requires, tiffcp, tiffinfo

pytestmark = pytest.mark.mount


def expected_chunk(arr: zarr.Array, coords: tuple[int, ...]) -> np.ndarray:
    """The full-shape chunk as Zarr stores it (fill value outside the array)."""
    chunks = arr.chunks
    region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, chunks, arr.shape, strict=True))
    out = np.full(chunks, arr.fill_value, dtype=arr.dtype)
    out[tuple(slice(0, r.stop - r.start) for r in region)] = arr[region]
    return out


def chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tiff"))


def coords_of(array_dir: Path, f: Path, sep: str) -> tuple[int, ...]:
    rel = str(f.relative_to(array_dir))[: -len(".tiff")]
    if rel.startswith("c/") or rel.startswith("c."):
        rel = rel[2:]
    return tuple(int(p) for p in rel.replace("/", sep).split(sep))


def assert_all_chunks_equal(array_dir: Path, arr: zarr.Array, sep: str = "/") -> int:
    files = chunk_files(array_dir)
    assert files, f"no chunk files under {array_dir}"
    for f in files:
        data = tifffile.imread(f)
        coords = coords_of(array_dir, f, sep)
        expect = expected_chunk(arr, coords)
        np.testing.assert_array_equal(data.reshape(expect.shape), expect, err_msg=str(f))
    return len(files)


SOURCES = {
    "v3-raw": lambda p: stores.v3(p, codecs="raw"),
    "v3-zstd-crc32c": lambda p: stores.v3(p, codecs="crc32c"),
    "v3-blosc-3d": lambda p: stores.v3(p, shape=(5, 20, 30), chunks=(2, 8, 16), codecs="blosc"),
    "v2-dot": lambda p: stores.v2(p, separator="."),
    "v2-slash": lambda p: stores.v2(p, separator="/"),
    "sharded": lambda p: stores.sharded(p),
    "concat-parts": lambda p: stores.concat_parts(p),
    "sharding-v1": lambda p: stores.sharding_v1(p),
    "stacked": lambda p: stores.stacked(p),
}


@pytest.mark.parametrize("kind", list(SOURCES))
def test_every_chunk_reads_as_the_source_chunk(tmp_path: Path, mount, kind: str) -> None:
    """[tree-1] [read-6] v2 and v3 sources, transformers included; zarr-python reads the mount."""
    src = tmp_path / "a.zarr"
    SOURCES[kind](src)
    arr = stores.open_any(src)
    m = mount(src)
    sep = "." if kind == "v2-dot" else "/"
    n = assert_all_chunks_equal(m.path, arr, sep)
    grid = np.prod([-(-s // c) for s, c in zip(arr.shape, arr.chunks, strict=True)])
    assert n == grid
    # dual access: zarr-python reads the mount as an array with the same values
    view = zarr.open_array(str(m.path))
    np.testing.assert_array_equal(view[...], arr[...])
    assert view.chunks == arr.chunks


def test_chunk_names_follow_the_source_keys(tmp_path: Path, mount) -> None:
    """[tree-2] chunk file names follow the source's own chunk keys."""
    stores.v2(tmp_path / "dot.zarr", separator=".")
    stores.v2(tmp_path / "slash.zarr", separator="/")
    stores.v3(tmp_path / "v3.zarr")
    assert (mount(tmp_path / "dot.zarr").path / "0.1.tiff").is_file()
    assert (mount(tmp_path / "slash.zarr").path / "0" / "1.tiff").is_file()
    assert (mount(tmp_path / "v3.zarr").path / "c" / "0" / "1.tiff").is_file()


DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64", "complex64", "complex128"]


def test_every_dtype_reads_with_tifffile_and_libtiff(tmp_path: Path, mount) -> None:
    """[read-1] every dtype is a valid TIFF for tifffile, tiffinfo and tiffcp."""
    requires("tiffinfo", "tiffcp")
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    data = {}
    for dt in DTYPES:
        a = root.create_array(dt, shape=(3, 10, 12), chunks=(2, 8, 8), dtype=dt, fill_value=0,
                              compressors=[ZstdCodec(level=1)])
        data[dt] = a[...] = stores.values((3, 10, 12), dt)
    m = mount(tmp_path / "g.zarr")
    for dt in DTYPES:
        arr = root[dt]
        assert_all_chunks_equal(m.path / dt, arr)
        f = m.path / dt / "c" / "1" / "1" / "1.tiff"
        info = tiffinfo(f)
        assert "Bits/Sample" in info
        if dt not in ("float16", "complex64", "complex128", "bool"):
            # libtiff copies what it understands; the copy reads back equal
            out = tmp_path / f"copy-{dt}.tif"
            tiffcp(f, out)
            # page by page: tiffcp keeps the ImageJ description but not the
            # contiguous layout it promises, so whole-file ImageJ reading misleads
            with tifffile.TiffFile(out) as copy, tifffile.TiffFile(f) as orig:
                assert len(copy.pages) == len(orig.pages)
                for pc, po in zip(copy.pages, orig.pages, strict=True):
                    np.testing.assert_array_equal(pc.asarray(), po.asarray())


def test_imagej_opens_chunks_as_stacks(tmp_path: Path, mount) -> None:
    """[read-1] ImageJ sees dimensions, bit depth, stack size and mean."""
    requires("imagej")
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    cases = {"uint8": 8, "uint16": 16, "float32": 32}
    for dt in cases:
        a = root.create_array(dt, shape=(6, 40, 50), chunks=(3, 16, 32), dtype=dt, fill_value=0)
        a[...] = stores.values((6, 40, 50), dt)
        b = root.create_array(dt + "_2d", shape=(40, 50), chunks=(16, 32), dtype=dt, fill_value=0)
        b[...] = stores.values((40, 50), dt, seed=3)
    m = mount(tmp_path / "g.zarr")
    paths, expects = [], []
    for dt, bits in cases.items():
        for name, coords in ((dt, (1, 2, 1)), (dt + "_2d", (1, 0))):
            arr = root[name]
            key = "/".join(map(str, coords))
            paths.append(m.path / name / "c" / f"{key}.tiff")
            expects.append((expected_chunk(arr, coords), bits))
    stats = imagej_stats_many(paths)
    for st, (expect, bits) in zip(stats, expects, strict=True):
        assert st["width"] == expect.shape[-1] and st["height"] == expect.shape[-2], st
        assert st["bitDepth"] == bits, st
        assert st["nSlices"] == (expect.shape[0] if expect.ndim == 3 else 1), st
        assert st["mean"] == pytest.approx(float(expect.astype(np.float64).mean()), rel=1e-4), st


def test_ome_zarr_group_shows_levels_and_scales(tmp_path: Path, mount) -> None:
    """[tree-1] groups are directories; OME-Zarr scales reach the TIFF."""
    data = stores.ome_group(tmp_path / "ome.zarr")
    m = mount(tmp_path / "ome.zarr")
    assert sorted(os.listdir(m.path)) == ["0", "1", "pyramid.ome.tif", "zarr.json"]
    group_meta = json.loads((m.path / "zarr.json").read_text())
    assert group_meta["node_type"] == "group" and "multiscales" in group_meta["attributes"]
    with tifffile.TiffFile(m.path / "0" / "c" / "0" / "0" / "0.tiff") as tif:
        ij = tif.imagej_metadata
        assert ij is not None and ij.get("slices") == 2 and ij.get("spacing") == pytest.approx(2.0)
        xres = tif.pages[0].tags["XResolution"].value
        assert xres[0] / xres[1] == pytest.approx(2.0)  # 1 / 0.5 micrometer
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "1"))[...], data["1"])


def test_stat_and_ls_never_read_chunk_data(tmp_path: Path, mount) -> None:
    """[read-3] [tree-6] stat/ls read no chunk data (counted in .zfuse/stats)."""
    stores.v3(tmp_path / "a.zarr", shape=(64, 64), chunks=(8, 8))
    m = mount(tmp_path / "a.zarr", "--cache-size", "0")  # no read-ahead: exact counts
    out = subprocess.run(["ls", "-lR", str(m.path)], capture_output=True, text=True, check=True).stdout
    assert out.count(".tiff") == 64
    for f in chunk_files(m.path):
        assert f.stat().st_size > 128
    stats = json.loads((m.path / ".zfuse" / "stats").read_text())
    assert stats.get("store_get_chunk", 0) == 0 and stats.get("store_get_chunk_ranged", 0) == 0, stats
    assert stats.get("store_list", 0) >= 1
    (m.path / "c" / "0" / "0.tiff").read_bytes()
    stats = json.loads((m.path / ".zfuse" / "stats").read_text())
    assert stats["store_get_chunk"] == 1, stats


def test_sharded_listing_reads_only_shard_indexes(tmp_path: Path, mount) -> None:
    """[read-3] [read-4] shards: one index read each, then one ranged read per chunk."""
    stores.sharded(tmp_path / "s.zarr", shape=(64, 64), shards=(32, 32), chunks=(8, 8))
    m = mount(tmp_path / "s.zarr", "--cache-size", "0")  # no read-ahead: exact counts
    files = chunk_files(m.path)
    assert len(files) == 64
    for f in files:
        f.stat()
    stats = json.loads((m.path / ".zfuse" / "stats").read_text())
    assert stats.get("store_get_chunk", 0) == 0, stats
    assert stats["store_get_chunk_ranged"] == 4  # one index read per shard
    assert stats["store_bytes_chunk"] == 4 * (16 * 16 + 4)  # 16 entries + crc32c
    before = stats["store_get_chunk_ranged"]
    files[5].read_bytes()
    stats = json.loads((m.path / ".zfuse" / "stats").read_text())
    assert stats["store_get_chunk_ranged"] == before + 1  # index cached: one ranged read


def test_corrupt_chunk_is_eio_and_neighbours_read(tmp_path: Path, mount) -> None:
    """[read-5] a corrupt chunk is EIO for that file only."""
    src = tmp_path / "a.zarr"
    stores.v3(src, codecs="crc32c")
    stores.v3(tmp_path / "z.zarr", codecs="zstd")
    bad = src / "c" / "0" / "1"
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    truncated = tmp_path / "z.zarr" / "c" / "1" / "0"
    truncated.write_bytes(truncated.read_bytes()[:-7])
    m = mount(src)
    with pytest.raises(OSError) as e:
        (m.path / "c" / "0" / "1.tiff").read_bytes()
    assert e.value.errno == errno.EIO
    arr = zarr.open_array(str(src))
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "0" / "0.tiff"), expected_chunk(arr, (0, 0)))
    m2 = mount(tmp_path / "z.zarr")
    with pytest.raises(OSError) as e:
        (m2.path / "c" / "1" / "0.tiff").read_bytes()
    assert e.value.errno == errno.EIO
    tifffile.imread(m2.path / "c" / "1" / "1.tiff")
    assert "c/0/1" in m.log() or "c/0/1.tiff" in m.log()


def test_eight_processes_read_different_chunks(tmp_path: Path, mount) -> None:
    """[read-1] 8 concurrent readers all get correct bytes."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(256, 256), chunks=(64, 64))
    m = mount(src)
    script = (
        "import sys, hashlib, numpy as np, tifffile, zarr\n"
        "mnt, src, i = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "a = zarr.open_array(src)\n"
        "for j in range(4):\n"
        "    for _ in range(3):\n"
        "        d = tifffile.imread(f'{mnt}/c/{(i + j) % 4}/{i % 4}.tiff')\n"
        "        r, c = (i + j) % 4, i % 4\n"
        "        assert (d == a[r*64:(r+1)*64, c*64:(c+1)*64]).all(), (i, j)\n"
        "print('ok')\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(m.path), str(src), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_cleanly(tmp_path: Path, mount, sig: int) -> None:
    """[cons-3] SIGTERM/SIGINT unmount cleanly."""
    stores.v3(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr")
    (m.path / "c" / "0" / "0.tiff").read_bytes()
    m.proc.send_signal(sig)
    assert m.proc.wait(timeout=20) == 0, m.log()
    assert not os.path.ismount(m.path)


def test_many_entries_in_one_directory(tmp_path: Path, mount) -> None:
    """[tree-2] paged readdir with thousands of entries."""
    src = tmp_path / "flat.zarr"
    a = zarr.create_array(str(src), shape=(3000,), chunks=(1,), dtype="uint8", zarr_format=2,
                          chunk_key_encoding={"name": "v2", "separator": "."}, fill_value=0, compressors=None)
    a[...] = np.arange(3000) % 250 + 1
    m = mount(src)
    names = os.listdir(m.path)
    assert len(names) == 3003 and "2999.tiff" in names and "image.ome.tif" in names and "image.tif" in names
    assert tifffile.imread(m.path / "2999.tiff").ravel()[0] == 2999 % 250 + 1


def test_all_chunks_lists_missing_as_fill(tmp_path: Path, mount) -> None:
    """[tree-3] only stored chunks are listed; --all-chunks lists all."""
    src = tmp_path / "sparse.zarr"
    a = zarr.create_array(str(src), shape=(16, 16), chunks=(8, 8), dtype="int16", fill_value=-7)
    a[0:8, 0:8] = 5
    assert len(chunk_files(mount(src).path)) == 1
    m = mount(src, "--all-chunks")
    assert len(chunk_files(m.path)) == 4
    assert (tifffile.imread(m.path / "c" / "1" / "1.tiff") == -7).all()


def test_read_ahead_decodes_the_next_chunks(tmp_path: Path, mount) -> None:
    """[read-7] a sequential reader finds the next chunks already decoded (read-ahead)."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(64, 64), chunks=(16, 16))
    m = mount(src)
    for i in range(4):
        for j in range(4):
            got = tifffile.imread(m.path / "c" / str(i) / f"{j}.tiff")
            np.testing.assert_array_equal(got, data[16 * i:16 * i + 16, 16 * j:16 * j + 16])
    stats = json.loads((m.path / ".zfuse" / "stats").read_text())
    assert stats.get("read_ahead", 0) >= 1, stats
    assert stats["store_get_chunk"] == 16, stats  # each chunk decoded once
    assert stats["read_ahead"] == 15, stats  # the window slid on: only the first file waited


def test_read_only_mount_sends_flush_once(tmp_path: Path, mount) -> None:
    """[read-8] on a read-only mount every close() succeeds, and after the first the
    kernel sends no FLUSH (answered ENOSYS once)."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(64, 64), chunks=(16, 16))
    m = mount(src, "-o", "ro")
    for _ in range(2):
        for i in range(4):
            with open(m.path / "c" / str(i) / "0.tiff", "rb") as f:  # close() raises on failure
                got = tifffile.imread(f)
            np.testing.assert_array_equal(got, data[16 * i:16 * i + 16, 0:16])
    stats = json.loads((m.path / ".zfuse" / "stats").read_text())
    assert stats["flush_requests"] == 1, stats


def test_crop_edges(tmp_path: Path, mount) -> None:
    """[read-2] edge chunks full-size by default, cropped with --crop-edges."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(20, 30), chunks=(8, 16))
    m = mount(src, "--crop-edges")
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "2" / "1.tiff"), data[16:20, 16:30])
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "0" / "0.tiff"), data[0:8, 0:16])


def test_strings_array_is_a_directory_without_chunk_files(tmp_path: Path, mount) -> None:
    """[tree-5] arrays without a TIFF form have no chunk files; README says why."""
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    s = root.create_array("names", shape=(4,), chunks=(2,), dtype=str)
    s[...] = np.array(["a", "b", "c", "d"])
    root.create_array("img", shape=(4, 4), chunks=(4, 4), dtype="uint8")[...] = 3
    m = mount(tmp_path / "g.zarr")
    assert sorted(os.listdir(m.path / "names")) == ["README", "zarr.json"]
    assert "unsupported" in (m.path / "names" / "zarr.json").read_text()
    assert "array 'names': strings" in (m.path / "names" / "README").read_text()
    assert (m.path / "img" / "c" / "0" / "0.tiff").is_file()


def test_sizes_match_bytes_for_every_file_kind(tmp_path: Path, mount) -> None:
    """[read-3] [read-2] [tree-3] [tree-6] stat size equals the bytes read for metadata,
    chunk, cropped edge chunk, fill-valued missing chunk, scratch file and stats file;
    the stats file reads as valid JSON however it is read."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    (src / "c" / "2" / "0").unlink()
    m = mount(src, "--crop-edges", "--all-chunks")
    (m.path / "c" / "0" / "note.txt").write_bytes(b"scratch\n")
    files = [m.path / "zarr.json", m.path / "c" / "0" / "note.txt", *m.path.rglob("*.tiff")]
    assert len(files) == 8
    for f in files:
        assert f.stat().st_size == len(f.read_bytes()), f
    assert tifffile.imread(m.path / "c" / "2" / "1.tiff").shape == (4, 14)
    assert (tifffile.imread(m.path / "c" / "2" / "0.tiff") == 0).all()
    stats = m.path / ".zfuse" / "stats"
    for _ in range(5):
        fd = os.open(stats, os.O_RDONLY)
        first = os.read(fd, 50)
        rest = os.read(fd, 1 << 20)
        os.close(fd)
        json.loads(first + rest)
        json.loads(stats.read_bytes())
    assert stats.stat().st_mode & 0o222 == 0
    assert_no_traceback(m)


def test_group_with_1000_arrays(tmp_path: Path, mount) -> None:
    """[tree-1] [tree-2] a group of 1000 arrays lists and reads in reasonable time."""
    src = tmp_path / "many.zarr"
    g = zarr.open_group(str(src), mode="w")
    for i in range(1000):
        g.create_array(f"a{i:04d}", shape=(4, 4), chunks=(2, 2), dtype="uint8", fill_value=0, compressors=None)
    for i in range(0, 1000, 37):
        g[f"a{i:04d}"][:] = i % 250 + 1
    m = mount(src)
    t0 = time.monotonic()
    names = os.listdir(m.path)
    assert len(names) == 1001 and "zarr.json" in names
    tiffs = list(m.path.rglob("*.tiff"))
    assert len(tiffs) == 4 * len(range(0, 1000, 37))
    assert time.monotonic() - t0 < 20
    assert (tifffile.imread(m.path / "a0037" / "c" / "1" / "1.tiff") == 38).all()
    assert_no_traceback(m)


def _stats(m) -> dict:  # noqa: ANN001
    return json.loads((m.path / ".zfuse" / "stats").read_text())


def _read_past_the_page_cache(fd: int, offset: int) -> bytes:
    """The rest of an open file as zfuse serves it now: the kernel's cached pages of the
    file are dropped first (posix_fadvise DONTNEED), so the reads reach the daemon."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return os.pread(fd, 1 << 22, offset)


def test_raw_chunks_are_read_from_their_stored_files(tmp_path: Path, mount) -> None:
    """[read-9] [read-7] Chunks stored raw are served from their stored files, decoding
    nothing, with the next stored files read ahead: tifffile, tiffinfo and tiffcp read them."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(64, 64), chunks=(16, 16), codecs="raw")
    m = mount(src)
    for i in range(4):
        for j in range(4):
            got = tifffile.imread(m.path / "c" / str(i) / f"{j}.tiff")
            np.testing.assert_array_equal(got, data[16 * i:16 * i + 16, 16 * j:16 * j + 16])
    stats = _stats(m)
    assert stats["chunks_passed_through"] == 16 and stats.get("chunks_decoded", 0) == 0, stats
    assert stats["read_ahead"] == 15, stats  # every file after the first was asked ahead
    requires("tiffinfo", "tiffcp")
    info = tiffinfo(m.path / "c" / "3" / "2.tiff")
    assert "Image Width: 16 Image Length: 16" in info and "Bits/Sample: 16" in info
    tiffcp(m.path / "c" / "3" / "2.tiff", tmp_path / "copy.tif")
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "copy.tif"), data[48:64, 32:48])


def test_a_raw_reader_keeps_the_file_it_opened(tmp_path: Path, mount) -> None:
    """[read-9] [write-2] [cons-2] A reader holding a chunk stored raw keeps reading the
    bytes it opened when another program replaces the chunk in the store (zarr-python:
    a new file renamed over it) and when `cp` replaces it through the mount, even when its
    reads reach the daemon again. Programs opening it afterwards read the new chunk: at
    once after the `cp`; after a reload (or the attribute timeout) after the change behind
    the mount's back, and a whole chunk, never a mix, before. After a reload an open file
    reads the store as it is."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(32, 32), chunks=(16, 16), codecs="raw")
    m = mount(src)
    path = m.path / "c" / "0" / "0.tiff"
    size = path.stat().st_size
    header = size - 16 * 16 * 2

    def values(blob: bytes) -> np.ndarray:
        return np.frombuffer(blob[-16 * 16 * 2:], "<u2").reshape(16, 16)

    def reload() -> None:
        n = m.log().count("SIGHUP")
        os.kill(m.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while m.log().count("SIGHUP") == n:
            assert time.monotonic() < deadline, m.log()
            time.sleep(0.02)

    z = zarr.open_array(str(src), mode="r+")
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, header, 0)
        z[0:16, 0:16] = 7  # another writer, behind the mount's back
        rest = _read_past_the_page_cache(fd, header)
        np.testing.assert_array_equal(values(head + rest), data[0:16, 0:16])
        got = tifffile.imread(path)  # the old chunk until 5 s after the first open saw it: whole
        assert (got == data[0:16, 0:16]).all() or (got == 7).all(), got
    finally:
        os.close(fd)
    reload()
    deadline = time.monotonic() + 20
    while not (tifffile.imread(path) == 7).all():  # the reload runs after its log line
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.05)

    new = stores.values((16, 16), "uint16", seed=5)
    tifffile.imwrite(tmp_path / "new.tif", new)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 100, 0)
        subprocess.run(["cp", str(tmp_path / "new.tif"), str(path)], check=True)  # waits for this reader, 2 s
        assert (values(_read_past_the_page_cache(fd, 0)) == 7).all()
        np.testing.assert_array_equal(tifffile.imread(path), new)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(zarr.open_array(str(src))[0:16, 0:16], new)

    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 100, 0)
        z[0:16, 0:16] = 9
        reload()
        deadline = time.monotonic() + 20
        while not (values(_read_past_the_page_cache(fd, 0)) == 9).all():  # the reload runs after the log line
            assert time.monotonic() < deadline, m.log()
            time.sleep(0.05)
    finally:
        os.close(fd)
    assert_no_traceback(m)


def test_a_truncated_raw_chunk_is_eio_and_neighbours_read(tmp_path: Path, mount) -> None:
    """[read-5] [read-9] a raw chunk shorter than its values is EIO, naming its key."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(32, 32), chunks=(16, 16), codecs="raw")
    bad = src / "c" / "1" / "0"
    bad.write_bytes(bad.read_bytes()[:-10])
    m = mount(src)
    with pytest.raises(OSError) as e:
        (m.path / "c" / "1" / "0.tiff").read_bytes()
    assert e.value.errno == errno.EIO
    assert "c/1/0" in m.log() and "c/1/0" in (m.path / ".zfuse" / "errors").read_text()
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "1" / "1.tiff"), data[16:32, 16:32])
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "0" / "0.tiff"), data[0:16, 0:16])
    assert_no_traceback(m)
