"""rm of chunk files on real mounts: what the store keeps, what open readers and writers see.

rm hides a chunk at once and deletes it from the store when the replace window
closes (`Mount.settle()` waits for that); in a shard it empties the chunk's index
entry, and the last one removes the shard."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import zfuse
from zfuse.testing import tiff_bytes

import stores

pytestmark = pytest.mark.mount
DATA = Path(__file__).parent / "data" / "legacy_v3"  # pre-release v3 fixtures


def test_legacy_sharded_rm_empties_index_entry_and_keeps_layout(tmp_path: Path, mount) -> None:
    """[ns-4] [write-1] a zarr 2.18 sharding-v1 store with '.' keys and a non-zero fill:
    rm of an inner chunk makes it fill in the store, writes go to the legacy shard keys,
    and no object in today's layout appears."""
    src = tmp_path / "sharded_3d"
    shutil.copytree(DATA / "sharded_3d", src)
    expected = np.load(DATA / "sharded_3d__volumes__vol.npy")
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
    shutil.copytree(DATA / "empty_chunks", src)
    expected = np.load(DATA / "empty_chunks__sparse.npy")
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


def test_unlinked_while_open(tmp_path: Path, mount) -> None:
    """[ns-4] a writer's close after unlink stores nothing; a reader keeps reading and fstat works."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    m = mount(src)
    target = m.path / "c" / "0" / "0.tiff"
    reader = open(m.path / "c" / "0" / "1.tiff", "rb")  # noqa: SIM115 - kept open across unlink
    before = reader.read()
    reader.seek(0)
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, tiff_bytes(stores.values((8, 16), "uint16", seed=34)))
    target.unlink()
    os.close(fd)
    assert not target.exists()
    (m.path / "c" / "0" / "1.tiff").unlink()
    m.settle()  # both deleted from the store, their inodes invalidated
    assert not (src / "c" / "0" / "0").exists()
    assert os.fstat(reader.fileno()).st_size == len(before)
    assert reader.read() == before
    reader.close()
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], data[8:16, 0:16])
