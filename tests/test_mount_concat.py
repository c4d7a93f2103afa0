"""Virtual concatenation through the mount: one array made of several, read and write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import stores

pytestmark = pytest.mark.mount


def _sources(*paths: Path) -> list[np.ndarray]:
    return [zarr.open_array(str(p))[...] for p in paths]


def _pixel_offset(path: Path, nbytes: int) -> int:
    return path.stat().st_size - nbytes


def tsconcat_sources(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """tsconcat's own example: shapes [2,2,2] and [2,3,2], block [1,2,1]."""
    a = zarr.create_array(str(tmp_path / "ds1.zarr"), shape=(2, 2, 2), chunks=(1, 2, 1), dtype="int32",
                          fill_value=0, zarr_format=2, chunk_key_encoding={"name": "v2", "separator": "/"})
    b = zarr.create_array(str(tmp_path / "ds2.zarr"), shape=(2, 3, 2), chunks=(1, 2, 1), dtype="int32",
                          fill_value=0, zarr_format=2, chunk_key_encoding={"name": "v2", "separator": "/"})
    da = np.arange(8, dtype="int32").reshape(2, 2, 2) + 1
    db = np.arange(12, dtype="int32").reshape(2, 3, 2) + 100
    a[...] = da
    b[...] = db
    return tmp_path / "ds1.zarr", tmp_path / "ds2.zarr", da, db


@pytest.mark.parametrize("order", ["ds1,ds2", "ds2,ds1"])
def test_tsconcat_example_through_the_mount(tmp_path: Path, mount, order: str) -> None:
    p1, p2, d1, d2 = tsconcat_sources(tmp_path)
    paths, datas = ([p1, p2], [d1, d2]) if order == "ds1,ds2" else ([p2, p1], [d2, d1])
    expect = np.concatenate(datas, axis=1)
    m = mount(paths, "--concat", "1")
    view = zarr.open_array(str(m.path))
    np.testing.assert_array_equal(view[...], expect)
    # every chunk file, including those that straddle the boundary, holds exactly its region
    for i in range(2):
        for j in range(3):
            for k in range(2):
                got = tifffile.imread(m.path / "c" / str(i) / str(j) / f"{k}.tiff").reshape(1, 2, 1)
                full = np.zeros((1, 2, 1), "int32")
                part = expect[i:i + 1, 2 * j:2 * j + 2, k:k + 1]
                full[:, : part.shape[1]] = part
                np.testing.assert_array_equal(got, full, err_msg=f"chunk {(i, j, k)}")


def test_writes_land_in_the_right_sources(tmp_path: Path, mount) -> None:
    """A straddling view chunk is split between the two sources on write."""
    p1, p2, d1, d2 = tsconcat_sources(tmp_path)
    m = mount([p2, p1], "--concat", "1")  # 3 + 2: view chunk j=1 straddles
    new = np.array([[[7], [8]]], dtype="int32")
    tifffile.imwrite(tmp_path / "n.tif", new.reshape(2, 1))
    import shutil

    shutil.copyfile(tmp_path / "n.tif", m.path / "c" / "0" / "1" / "0.tiff")
    s2, s1 = zarr.open_array(str(p2))[...], zarr.open_array(str(p1))[...]
    assert s2[0, 2, 0] == 7 and s1[0, 0, 0] == 8
    e2, e1 = d2.copy(), d1.copy()
    e2[0, 2, 0], e1[0, 0, 0] = 7, 8
    np.testing.assert_array_equal(s2, e2)
    np.testing.assert_array_equal(s1, e1)


def test_sources_with_different_chunks_and_codecs(tmp_path: Path, mount) -> None:
    d1 = stores.v3(tmp_path / "a.zarr", shape=(13, 30), chunks=(8, 16), codecs="zstd")
    d2 = stores.sharded(tmp_path / "b.zarr", shape=(9, 30), shards=(8, 32), chunks=(4, 8), seed=2)
    d3 = stores.v2(tmp_path / "c.zarr", shape=(5, 30), chunks=(5, 10), seed=3)
    m = mount([tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr"], "--concat", "0")
    expect = np.concatenate([d1, d2, d3])
    np.testing.assert_array_equal(zarr.open_array(str(m.path))[...], expect)
    assert len(list(m.path.rglob("*.tiff"))) == 4 * 2  # grid of the first source's chunks


def test_mismatched_sources_are_refused_before_mounting(tmp_path: Path) -> None:
    stores.v3(tmp_path / "a.zarr", shape=(10, 30))
    stores.v3(tmp_path / "b.zarr", shape=(10, 31))
    stores.v3(tmp_path / "c.zarr", shape=(10, 30), dtype="int16")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for other, word in (("b.zarr", "extent"), ("c.zarr", "dtype")):
        r = subprocess.run([sys.executable, "-m", "zfuse.cli", "mount", "--concat", "0",
                            str(tmp_path / "a.zarr"), str(tmp_path / other), str(mnt)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert word in r.stderr and other in r.stderr, r.stderr
        assert not mnt.is_mount()


def test_saved_description_mounts_and_opens(tmp_path: Path, mount) -> None:
    p1, p2, d1, d2 = tsconcat_sources(tmp_path)
    out = tmp_path / "cat.json"
    r = subprocess.run([sys.executable, "-m", "zfuse.cli", "concat", "--axis", "1", str(out), str(p1), str(p2)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    desc = json.loads(out.read_text())
    assert desc["axis"] == 1 and len(desc["sources"]) == 2
    import zfuse

    arr = zfuse.load_concat(str(out))
    np.testing.assert_array_equal(arr[...], np.concatenate([d1, d2], axis=1))
    with pytest.raises(ValueError, match="load_concat"):  # open_array opens Zarr stores only
        zfuse.open_array(str(out))
    m = mount(out)
    np.testing.assert_array_equal(zarr.open_array(str(m.path))[...], np.concatenate([d1, d2], axis=1))
    info = subprocess.run([sys.executable, "-m", "zfuse.cli", "info", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert "offset 2" in info.stdout and "straddling" in info.stdout, info.stdout


def test_aligned_chunks_read_and_write_their_source_chunk(tmp_path: Path, mount) -> None:
    """View chunks that are exactly one source chunk go straight to it, both ways."""
    d1 = stores.v3(tmp_path / "a.zarr", shape=(16, 32), chunks=(8, 16), codecs="crc32c")
    d2 = stores.v3(tmp_path / "b.zarr", shape=(12, 32), chunks=(8, 16), seed=5)
    m = mount([tmp_path / "a.zarr", tmp_path / "b.zarr"], "--concat", "0")
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "2" / "1.tiff"), d2[0:8, 16:32])
    edge = tifffile.imread(m.path / "c" / "3" / "0.tiff")  # last 4 rows of b, fill below
    np.testing.assert_array_equal(edge[:4], d2[8:12, 0:16])
    assert (edge[4:] == 0).all()
    new = stores.values((8, 16), "uint16", seed=40)
    tifffile.imwrite(tmp_path / "n.tif", new)
    import shutil

    shutil.copyfile(tmp_path / "n.tif", m.path / "c" / "2" / "1.tiff")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "b.zarr"))[0:8, 16:32], new)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[...], d1)


def test_concat_axis0_straddling_patch_rm_rename(tmp_path: Path, mount) -> None:
    """[write-3] [ns-3] [ns-4] [read-6] concat along axis 0 of a v3 source (13 rows) and a
    sharded one: an in-place patch, rm and rename onto a view chunk that straddles the
    boundary each touch exactly the right rows of both sources."""
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    d1 = stores.v3(a, shape=(13, 30), chunks=(8, 16))
    d2 = stores.sharded(b, shape=(9, 30), shards=(8, 32), chunks=(4, 8), seed=2)
    m = mount([a, b], "--concat", "0")
    expect = np.concatenate([d1, d2])
    for f in m.path.rglob("*.tiff"):
        i, j = int(f.parent.name), int(f.stem)
        part = expect[8 * i:8 * i + 8, 16 * j:16 * j + 16]
        np.testing.assert_array_equal(tifffile.imread(f)[: part.shape[0], : part.shape[1]], part, err_msg=str(f))

    # in-place patch of view chunk (1, 0): rows 8..13 of a, rows 0..3 of b
    f = m.path / "c" / "1" / "0.tiff"
    with open(f, "r+b") as fh:
        fh.seek(_pixel_offset(f, 8 * 16 * 2))
        fh.write(np.full((8, 16), 4242, "<u2").tobytes())
    s1, s2 = _sources(a, b)
    assert (s1[8:13, :16] == 4242).all() and (s2[0:3, :16] == 4242).all()
    np.testing.assert_array_equal(s1[:8], d1[:8])
    np.testing.assert_array_equal(s1[8:, 16:], d1[8:, 16:])
    np.testing.assert_array_equal(s2[3:], d2[3:])
    np.testing.assert_array_equal(s2[:3, 16:], d2[:3, 16:])

    # rm view chunk (1, 1): its part of both sources becomes fill, nothing else changes
    os.unlink(m.path / "c" / "1" / "1.tiff")
    assert not (m.path / "c" / "1" / "1.tiff").exists()
    m.settle()
    s1, s2 = _sources(a, b)
    assert (s1[8:13, 16:] == 0).all() and (s2[0:3, 16:] == 0).all()
    np.testing.assert_array_equal(s2[3:], d2[3:])
    np.testing.assert_array_equal(s1[:8], d1[:8])

    # rename (0, 0) onto the straddling (1, 1): values move, the old chunk is fill
    os.rename(m.path / "c" / "0" / "0.tiff", m.path / "c" / "1" / "1.tiff")
    s1, s2 = _sources(a, b)
    np.testing.assert_array_equal(s1[8:13, 16:30], d1[0:5, 0:14])
    np.testing.assert_array_equal(s2[0:3, 16:30], d1[5:8, 0:14])
    assert (s1[0:8, 0:16] == 0).all()
    assert not (m.path / "c" / "0" / "0.tiff").exists()
    np.testing.assert_array_equal(zarr.open_array(str(m.path))[...], np.concatenate([s1, s2]))


def test_concat_last_axis_mixed_byte_order_saved_description(tmp_path: Path, mount) -> None:
    """[read-1] [read-6] [write-1] a big-endian v2 source and a little-endian v3 one,
    concatenated along the last axis through a saved description: little-endian chunk
    files equal to numpy.concatenate; a big-endian TIFF written over a straddling chunk
    and a zarr write through the mount both land in both sources, which keep their dtype."""
    be = zarr.create_array(str(tmp_path / "be.zarr"), shape=(10, 7), chunks=(4, 4), dtype=">u2",
                           zarr_format=2, fill_value=0)
    d1 = stores.values((10, 7), "u2", 1)
    be[...] = d1
    d2 = stores.v3(tmp_path / "le.zarr", shape=(10, 9), chunks=(4, 4), seed=2)
    out = tmp_path / "cat.json"
    r = subprocess.run([sys.executable, "-m", "zfuse.cli", "concat", "--axis", "1", str(out),
                        str(tmp_path / "be.zarr"), str(tmp_path / "le.zarr")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    m = mount(out)
    expect = np.concatenate([d1, d2], axis=1)
    np.testing.assert_array_equal(zarr.open_array(str(m.path))[...], expect)
    files = list(m.path.rglob("*.tiff"))
    assert len(files) == 3 * 4
    for f in files:
        i, j = int(f.parent.name), int(f.stem)
        with tifffile.TiffFile(f) as t:
            assert t.byteorder == "<"
            got = t.asarray()
        part = expect[4 * i:4 * i + 4, 4 * j:4 * j + 4]
        np.testing.assert_array_equal(got[: part.shape[0], : part.shape[1]], part, err_msg=str(f))

    new = stores.values((4, 4), "u2", 9)
    tifffile.imwrite(tmp_path / "n.tif", new.astype(">u2"), byteorder=">")
    shutil.copyfile(tmp_path / "n.tif", m.path / "c" / "0" / "1.tiff")  # cols 4..8: be 4..7, le 0..1
    s1, s2 = _sources(tmp_path / "be.zarr", tmp_path / "le.zarr")
    np.testing.assert_array_equal(s1[0:4, 4:7], new[:, :3])
    np.testing.assert_array_equal(s2[0:4, 0:1], new[:, 3:])
    np.testing.assert_array_equal(s1[4:], d1[4:])
    np.testing.assert_array_equal(s2[:, 1:], d2[:, 1:])
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "0" / "1.tiff"), new)

    zarr.open_array(str(m.path), mode="r+")[4:8, 4:8] = 5
    s1, s2 = _sources(tmp_path / "be.zarr", tmp_path / "le.zarr")
    assert (s1[4:8, 4:7] == 5).all() and (s2[4:8, 0:1] == 5).all()
    assert json.loads((tmp_path / "be.zarr" / ".zarray").read_text())["dtype"] == ">u2"
