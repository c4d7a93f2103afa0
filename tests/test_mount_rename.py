"""Renaming and copying onto a chunk is atomic for everyone else (real mounts, real processes).

Writers (one process, a thread per chunk) replace their chunks by the
atomic-save pattern and by `cp`-style O_TRUNC writes; readers (another
process, 8 threads) stat, read and list at the same time. No read may fail
with ENOENT, every read is a whole chunk of the old or a new value, listings
never omit a chunk, and each chunk ends with its writer's last value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import zfuse
from benchmarks.stress import INITIAL, run

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
