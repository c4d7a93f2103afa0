"""Less-travelled paths on real mounts: virtual concatenation (straddling writes, rm,
rename, mixed byte orders, sharded sources), pre-release v3 fixtures (read, write, rm
in legacy shards), and SIGHUP while files are open for writing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import zfuse

import stores

pytestmark = pytest.mark.mount
LEGACY = Path(__file__).parent / "data" / "legacy_v3"


def _sources(*paths: Path) -> list[np.ndarray]:
    return [zarr.open_array(str(p))[...] for p in paths]


def _hup(m) -> None:
    """SIGHUP the daemon and wait until it has logged the reload and finished it."""
    n = m.log().count("SIGHUP")
    os.kill(m.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while m.log().count("SIGHUP") == n:
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.01)
    time.sleep(0.3)  # the reload runs in a worker thread after the log line


def _pixel_offset(path: Path, nbytes: int) -> int:
    return path.stat().st_size - nbytes


# ------------------------------------------------------------------ concatenation

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


# ------------------------------------------------------------- pre-release v3

def test_every_legacy_fixture_reads_as_its_npy(tmp_path: Path, mount) -> None:
    """[tree-2] [read-1] [read-6] every array of every pre-release v3 fixture: each chunk
    file is a TIFF and zarr-python on the mount reads the values next to the fixture."""
    for npy in sorted(LEGACY.glob("*.npy")):
        fixture, *array = npy.stem.split("__")
        src = tmp_path / fixture
        if not src.exists():
            shutil.copytree(LEGACY / fixture, src)
        expected = np.load(npy)
        m = mount(src, name=npy.stem)
        adir = m.path.joinpath(*array)
        files = list(adir.rglob("*.tiff"))
        assert files, npy.stem
        for f in files:
            assert tifffile.imread(f).size > 0
        np.testing.assert_array_equal(zarr.open_array(str(adir))[...], expected, err_msg=npy.stem)
        m.unmount()


def test_legacy_sharded_rm_empties_index_entry_and_keeps_layout(tmp_path: Path, mount) -> None:
    """[ns-4] [write-1] a zarr 2.18 sharding-v1 store with '.' keys and a non-zero fill:
    rm of an inner chunk makes it fill in the store, writes go to the legacy shard keys,
    and no object in today's layout appears."""
    src = tmp_path / "sharded_3d"
    shutil.copytree(LEGACY / "sharded_3d", src)
    expected = np.load(LEGACY / "sharded_3d__volumes__vol.npy")
    before = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    m = mount(src)
    adir = m.path / "volumes" / "vol"
    os.unlink(adir / "c.0.0.0.tiff")
    assert not (adir / "c.0.0.0.tiff").exists()
    m.settle()
    expected[0:2, 0:3, 0:2] = -1.5
    np.testing.assert_array_equal(zfuse.open_array(str(src), path="volumes/vol")[...], expected)

    new = np.full((2, 3, 2), 3.25, "float32")
    tifffile.imwrite(tmp_path / "n.tif", new)
    shutil.copyfile(tmp_path / "n.tif", adir / "c.1.1.0.tiff")
    expected[2:4, 3:4, 0:2] = 3.25
    np.testing.assert_array_equal(zfuse.open_array(str(src), path="volumes/vol")[...], expected)
    np.testing.assert_array_equal(zarr.open_array(str(adir))[...], expected)
    after = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    assert after == before


def test_legacy_emptied_shard_is_removed(tmp_path: Path, mount) -> None:
    """[ns-4] rm of every inner chunk of a legacy sharding-v1 shard removes the shard
    object at its legacy key; the other shards stay."""
    src = tmp_path / "empty_chunks"
    shutil.copytree(LEGACY / "empty_chunks", src)
    expected = np.load(LEGACY / "empty_chunks__sparse.npy")
    shard = src / "data" / "root" / "sparse" / "c1" / "0"
    assert shard.exists()
    m = mount(src)
    adir = m.path / "sparse" / "c"
    in_shard = [f for f in adir.rglob("*.tiff") if int(f.parent.name) in (2, 3) and int(f.stem) in (0, 1)]
    assert in_shard
    for f in in_shard:
        os.unlink(f)
    m.settle()
    assert not shard.exists()
    expected[4:8, 0:4] = 7
    np.testing.assert_array_equal(zfuse.open_array(str(src), path="sparse")[...], expected)
    assert (src / "data" / "root" / "sparse" / "c0" / "0").exists()


# ------------------------------------------------------------------ SIGHUP

def test_sighup_while_writers_are_open(tmp_path: Path, mount) -> None:
    """[cons-2] [write-2] [write-3] [write-9] SIGHUP in the middle of a whole-file write,
    of an in-place patch, and between a write and its close while the new view has read
    the same shard: each close still commits exactly its chunk to the store."""
    src = tmp_path / "s.zarr"
    d = stores.sharded(src, shape=(16, 32), shards=(16, 32), chunks=(8, 16))
    m = mount(src)
    c = m.path / "c"

    new = stores.values((8, 16), "uint16", 7)
    tifffile.imwrite(tmp_path / "n.tif", new)
    blob = (tmp_path / "n.tif").read_bytes()
    fd = os.open(c / "0" / "0.tiff", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, blob[:100])
    _hup(m)
    os.write(fd, blob[100:])
    assert (c / "0" / "0.tiff").read_bytes() == blob  # readers see the bytes written so far
    os.close(fd)
    expect = d.copy()
    expect[0:8, 0:16] = new
    np.testing.assert_array_equal(zarr.open_array(str(src))[...], expect)
    np.testing.assert_array_equal(tifffile.imread(c / "0" / "0.tiff"), new)

    new2 = stores.values((8, 16), "uint16", 8)
    tifffile.imwrite(tmp_path / "n2.tif", new2)
    fd = os.open(c / "0" / "1.tiff", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, (tmp_path / "n2.tif").read_bytes())
    _hup(m)
    tifffile.imread(c / "1" / "1.tiff")  # the new view reads the shard index
    os.close(fd)
    expect[0:8, 16:32] = new2
    np.testing.assert_array_equal(zarr.open_array(str(src))[...], expect)
    np.testing.assert_array_equal(zarr.open_array(str(m.path))[...], expect)

    f = c / "1" / "1.tiff"
    fd = os.open(f, os.O_RDWR)
    os.pwrite(fd, np.full(32, 999, "<u2").tobytes(), _pixel_offset(f, 8 * 16 * 2))
    _hup(m)
    os.close(fd)
    expect[8:10, 16:32] = 999
    np.testing.assert_array_equal(zarr.open_array(str(src))[...], expect)
    np.testing.assert_array_equal(tifffile.imread(f), expect[8:16, 16:32])
