"""Renaming and copying onto a chunk on real mounts: atomic for everyone else (real processes).

Chunk onto chunk moves values, onto an array of another dtype is refused, and a
reader keeps the bytes it opened. Under load: writers (one process, a thread per
chunk) replace their chunks by the atomic-save pattern and by `cp`-style O_TRUNC
writes; readers (another process, 8 threads) stat, read and list at the same time. No read may fail
with ENOENT, every read is a whole chunk of the old or a new value, listings
never omit a chunk, and each chunk ends with its writer's last value.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import zfuse
from benchmarks.stress import INITIAL, run
from zfuse.testing import assert_no_traceback, errno_of, tiff_bytes, write_file

import stores

SHAPE, CHUNKS = (16, 32), (8, 16)
COORDS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def _initial() -> np.ndarray:
    out = np.empty(SHAPE, "uint32")
    for index, (i, j) in enumerate(COORDS):
        out[i * 8 : i * 8 + 8, j * 16 : j * 16 + 16] = INITIAL + index
    return out


def _make(kind: str, path: Path) -> list[Path]:
    """The store(s) of one kind, holding the initial uniform chunks."""
    if kind == "concatenation":
        a, b = path / "a.zarr", path / "b.zarr"
        init = _initial()
        for src, rows in ((a, slice(0, 8)), (b, slice(8, 16))):
            zarr.create_array(str(src), shape=(8, 32), chunks=CHUNKS, dtype="uint32", fill_value=0)[...] = init[rows]
        return [a, b]
    src = path / "s.zarr"
    if kind == "v3":
        stores.v3(src, shape=SHAPE, chunks=CHUNKS, dtype="uint32")
    elif kind == "sharding_indexed":
        stores.sharded(src, shape=SHAPE, shards=SHAPE, chunks=CHUNKS, dtype="uint32")
    elif kind == "sharding_v1":
        stores.sharding_v1(src, shape=SHAPE, chunks=CHUNKS, dtype="uint32")
    elif kind == "concat_parts":
        stores.concat_parts(src, shape=SHAPE, chunks=CHUNKS, dtype="uint32")
    zfuse.open_array(str(src), mode="r+")[...] = _initial()
    return [src]


def _read_back(kind: str, sources: list[Path]) -> np.ndarray:
    if kind == "concatenation":
        return np.concatenate([zarr.open_array(str(s))[...] for s in sources])
    return stores.open_any(sources[0])[...]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["v3", "sharding_indexed", "sharding_v1", "concat_parts", "concatenation"])
def test_replacements_are_atomic_for_readers(tmp_path: Path, mount, kind: str) -> None:
    """[ns-2] [write-2] [write-9] [cons-1] 4 writers doing atomic saves and cp replacements of
    their own chunks in one shard, 8 readers doing open/read/stat/readdir: no ENOENT, no torn
    or foreign value, no chunk missing from a listing, no lost update."""
    sources = _make(kind, tmp_path)
    m = mount(sources, "--concat", "0") if kind == "concatenation" else mount(sources[0])
    chunks = [f"c/{i}/{j}.tiff" for i, j in COORDS]
    result = run(m.path, chunks, CHUNKS, seconds=3.0)
    wr, rd = result["writers"], result["readers"]
    assert not wr["errors"], wr["errors"][:5]
    assert wr["ops"] > 8 and rd["reads"] > 20, result
    for key in ("enoent", "torn", "bad_value", "missing_in_listing", "other_errors"):
        assert rd[key] == 0, (key, rd["examples"])
    stored = _read_back(kind, sources)
    for index, (i, j) in enumerate(COORDS):
        last = wr["last"][chunks[index]]
        region = (slice(i * 8, i * 8 + 8), slice(j * 16, j * 16 + 16))
        assert (stored[region] == last).all(), (chunks[index], last)
        assert (tifffile.imread(m.path / chunks[index]) == last).all()


@pytest.mark.mount
def test_renames_between_chunks_and_arrays(tmp_path: Path, mount) -> None:
    """[ns-2] [ns-3] [write-5] chunk onto chunk moves values; onto an array of another
    dtype fails with EINVAL and changes nothing; key directories cannot be renamed."""
    src = tmp_path / "g.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("u", shape=(16, 16), chunks=(8, 16), dtype="uint16", fill_value=0)[:] = 7
    g.create_array("i", shape=(16, 16), chunks=(8, 16), dtype="int32", fill_value=0)[:] = 9
    m = mount(src)
    u, i = m.path / "u" / "c", m.path / "i" / "c"
    assert errno_of(os.rename, u / "0" / "0.tiff", i / "0" / "0.tiff") == "EINVAL"
    assert (g["u"][:] == 7).all() and (g["i"][:] == 9).all()
    assert write_file(u / "1" / "0.tiff", tiff_bytes(np.full((8, 16), 8, "u2"))) == "ok"
    os.rename(u / "1" / "0.tiff", u / "0" / "0.tiff")
    assert (g["u"][:8] == 8).all() and (g["u"][8:] == 0).all()
    assert os.listdir(u / "1") == [] and not (src / "u" / "c" / "1" / "0").exists()
    assert errno_of(os.rename, u / "0", u / "5") != "ok"
    # atomic-save pattern with a name that does not parse: rename fails, scratch stays
    (u / "0" / ".save.tmp").write_bytes(b"not a tiff")
    assert errno_of(os.rename, u / "0" / ".save.tmp", u / "0" / "0.tiff") == "EINVAL"
    assert (u / "0" / ".save.tmp").read_bytes() == b"not a tiff"
    assert (g["u"][:8] == 8).all()
    assert_no_traceback(m)


@pytest.mark.mount
def test_reader_survives_atomic_replace(tmp_path: Path, mount) -> None:
    """[ns-2] a reader of a chunk replaced by rename keeps the bytes it opened."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    target = m.path / "c" / "1" / "1.tiff"
    original = target.read_bytes()
    with open(target, "rb") as reader:
        head = reader.read(64)
        tifffile.imwrite(m.path / "c" / "1" / ".1.tiff.tmp", stores.values((8, 16), "uint16", seed=35))
        os.rename(m.path / "c" / "1" / ".1.tiff.tmp", target)
        time.sleep(0.5)
        rest = reader.read()
        assert os.fstat(reader.fileno()).st_size == len(original)
    assert head + rest == original
    assert target.read_bytes() != original  # new openers see the replacement
