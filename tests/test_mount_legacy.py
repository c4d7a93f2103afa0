"""Stores in the pre-release v3 layout (zarr-python 2.14-2.18, sharding v1) through the mount."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import zfuse

pytestmark = pytest.mark.mount
DATA = Path(__file__).parent / "data" / "legacy_v3"


def test_sharded_legacy_store_reads_and_writes(tmp_path: Path, mount) -> None:
    """[read-6] [write-1] a zarr 2.18 sharding-v1 store: chunk files, dual access, writes at legacy keys."""
    src = tmp_path / "sharded_2d"
    shutil.copytree(DATA / "sharded_2d", src)
    expected = np.load(DATA / "sharded_2d__arr.npy")
    m = mount(src)
    files = sorted((m.path / "arr" / "c").rglob("*.tiff"))
    assert files
    for f in files:
        i, j = int(f.parent.name), int(f.stem)
        got = tifffile.imread(f)
        part = expected[3 * i:3 * i + 3, 4 * j:4 * j + 4]
        np.testing.assert_array_equal(got[: part.shape[0], : part.shape[1]], part)
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "arr"))[...], expected)
    before = {p.relative_to(src) for p in src.rglob("*") if p.is_file()}
    new = np.full((3, 4), 77, "uint16")
    tifffile.imwrite(tmp_path / "n.tif", new)
    shutil.copyfile(tmp_path / "n.tif", m.path / "arr" / "c" / "1" / "1.tiff")
    arr = zfuse.open_array(str(src), path="arr")
    np.testing.assert_array_equal(arr[3:6, 4:8], new)
    expected[3:6, 4:8] = 77
    np.testing.assert_array_equal(arr[...], expected)
    after = {p.relative_to(src) for p in src.rglob("*") if p.is_file()}
    assert after == before  # the shard at its legacy key was rewritten; nothing in today's layout
    assert all(str(p).startswith(("data/root/", "meta/root", "zarr.json")) for p in after)


def test_every_legacy_fixture_reads_as_its_npy(tmp_path: Path, mount) -> None:
    """[tree-2] [read-1] [read-6] every array of every pre-release v3 fixture: each chunk
    file is a TIFF and zarr-python on the mount reads the values next to the fixture."""
    for npy in sorted(DATA.glob("*.npy")):
        fixture, *array = npy.stem.split("__")
        src = tmp_path / fixture
        if not src.exists():
            shutil.copytree(DATA / fixture, src)
        expected = np.load(npy)
        m = mount(src, name=npy.stem)
        adir = m.path.joinpath(*array)
        files = list(adir.rglob("*.tiff"))
        assert files, npy.stem
        for f in files:
            assert tifffile.imread(f).size > 0
        np.testing.assert_array_equal(zarr.open_array(str(adir))[...], expected, err_msg=npy.stem)
        m.unmount()
