"""Sharding storage transformer v1: layout checked independently, request counts, bad input."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

import zfuse
from zfuse.errors import CorruptDataError, MetadataError
from zfuse.testing import CountingStore, snapshot

PROTO = default_buffer_prototype()
EMPTY = 2**64 - 1
URI = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
BYTES = [{"name": "bytes", "configuration": {"endian": "little"}}]


def sharding(cps: list[int], form: str = "extension") -> dict[str, Any]:
    conf = {"chunks_per_shard": cps}
    if form == "extension":  # the seed's spelling
        return {"extension": URI, "type": "indexed", "configuration": conf}
    if form == "name-uri":
        return {"name": URI, "type": "indexed", "configuration": conf}
    return {"name": "sharding", "type": "indexed", "configuration": conf}


def create(
    root: Path, shape: tuple[int, ...], chunks: tuple[int, ...], cps: list[int], **kw: Any
) -> Any:
    kw.setdefault("dtype", "u2")
    kw.setdefault("codecs", BYTES)
    return zfuse.open_array(
        str(root), mode="w", shape=shape, chunks=chunks,
        storage_transformers=[sharding(cps, kw.pop("form", "extension"))], **kw,
    )  # fmt: skip


def unshard(root: Path, shape: tuple[int, ...], chunks: tuple[int, ...], cps: tuple[int, ...],
            dtype: str, fill: Any = 0) -> np.ndarray:  # fmt: skip
    """Rebuild the array from the shard files with numpy alone (no zfuse reader)."""
    n = math.prod(cps)
    grid = tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
    padded = np.full([g * c for g, c in zip(grid, chunks, strict=True)], fill, dtype=dtype)
    for path in root.joinpath("c").rglob("*"):
        if not path.is_file():
            continue
        shard_coords = tuple(int(p) for p in path.relative_to(root / "c").parts)
        blob = path.read_bytes()
        index = np.frombuffer(blob[-16 * n :], "<u8").reshape(-1, 2)
        assert index.shape == (n, 2)  # every position, even those outside the array
        for pos, (off, nbytes) in enumerate(index):
            if off == EMPTY:
                assert nbytes == EMPTY
                continue
            local = np.unravel_index(pos, cps)
            coords = [s * c + lo for s, c, lo in zip(shard_coords, cps, local, strict=True)]
            if any(c >= g for c, g in zip(coords, grid, strict=True)):
                continue
            chunk = np.frombuffer(blob[int(off) : int(off) + int(nbytes)], dtype).reshape(chunks)
            region = tuple(slice(c * k, (c + 1) * k) for c, k in zip(coords, chunks, strict=True))
            padded[region] = chunk
    return padded[tuple(slice(0, s) for s in shape)]


@pytest.mark.parametrize("form", ["extension", "name-uri", "sharding"])
def test_layout_checked_independently(tmp_path: Path, form: str) -> None:
    root = tmp_path / "a.zarr"
    a = create(root, (10, 9), (2, 3), [2, 2], form=form)
    data = np.arange(90, dtype="u2").reshape(10, 9) + 1
    a[...] = data
    files = sorted(k for k in snapshot(root) if k != "zarr.json")
    # shard grid: ceil(5 / 2) x ceil(3 / 2)
    assert files == [f"c/{i}/{j}" for i in range(3) for j in range(2)]
    np.testing.assert_array_equal(unshard(root, (10, 9), (2, 3), (2, 2), "u2"), data)
    # the edge shard c/2/1 holds one chunk: the other three positions are empty
    blob = (root / "c/2/1").read_bytes()
    index = np.frombuffer(blob[-64:], "<u8").reshape(-1, 2)
    assert (index[1:] == EMPTY).all() and len(blob) == 64 + 2 * 3 * 2
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], data)


def test_seed_metadata_as_written(tmp_path: Path) -> None:
    """The seed's configuration block, in a today's-v3 zarr.json."""
    root = tmp_path / "seed.zarr"
    root.mkdir()
    doc = {
        "zarr_format": 3, "node_type": "array", "shape": [64, 8], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}],
        "storage_transformers": [
            {"extension": URI, "type": "indexed", "configuration": {"chunks_per_shard": [32, 2]}}
        ],
    }  # fmt: skip
    (root / "zarr.json").write_text(json.dumps(doc))
    data = (np.arange(512) % 255 + 1).astype("u1").reshape(64, 8)
    zfuse.open_array(str(root), mode="r+")[...] = data
    # 64 chunks per shard -> a 1024-byte index (the seed's "1014" is a slip)
    blob = (root / "c/1/1").read_bytes()
    assert len(blob) == 64 * 2 + 1024
    np.testing.assert_array_equal(unshard(root, (64, 8), (1, 2), (32, 2), "u1"), data)


def test_one_index_read_and_one_chunk_read(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    create(root, (8, 8), (2, 2), [2, 2])[...] = np.arange(64, dtype="u2").reshape(8, 8)
    counting = CountingStore(LocalStore(root))
    a = zfuse.open_array(counting)
    counting.gets.clear()
    assert a[5, 3] == 43
    # chunk (2, 1) -> shard c/1/0, position 1 of 4, stored at bytes 8..16
    assert counting.gets == [("c/1/0", SuffixByteRequest(64)), ("c/1/0", RangeByteRequest(8, 16))]
    counting.gets.clear()
    np.testing.assert_array_equal(a[4:6, 2:4], [[34, 35], [42, 43]])  # chunk (2, 1) again
    assert len(counting.gets) == 2
    # a byte range of a chunk: still one index read and one (narrower) chunk read
    counting.gets.clear()
    got = sync(a.store.get("c/2/1", PROTO, RangeByteRequest(2, 6)))
    assert got is not None and got.to_bytes() == np.array([35, 42], "<u2").tobytes()
    assert counting.gets == [("c/1/0", SuffixByteRequest(64)), ("c/1/0", RangeByteRequest(10, 14))]
    # a missing chunk in an existing shard: the index read only
    a2 = zfuse.open_array(counting, mode="r+")
    a2[0:2, 0:2] = 0  # fill value: chunk c/0/0 deleted from shard c/0/0
    counting.gets.clear()
    assert (a[0:2, 0:2] == 0).all()
    assert counting.gets == [("c/0/0", SuffixByteRequest(64))]


def test_write_keeps_other_chunks_delete_last_removes_shard_listing(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    a = create(root, (4, 4), (2, 2), [2, 2])
    a[0:2, 0:2] = 1
    a[2:4, 2:4] = 2
    assert sorted(snapshot(root)) == ["c/0/0", "zarr.json"]
    store = a.store
    keys = sorted(sync(_collect(store.list_prefix(""))))
    assert keys == ["c/0/0", "c/1/1", "zarr.json"]
    assert sorted(sync(_collect(store.list_dir("c")))) == ["0", "1"]
    assert sorted(sync(_collect(store.list_dir("c/1")))) == ["1"]
    assert a.nchunks_initialized == 2
    assert sync(store.exists("c/1/1")) and not sync(store.exists("c/0/1"))
    assert sync(store.getsize("c/1/1")) == 8
    a[0:2, 0:2] = 0
    assert sorted(snapshot(root)) == ["c/0/0", "zarr.json"]
    a[2:4, 2:4] = 0
    assert sorted(snapshot(root)) == ["zarr.json"]
    assert sync(_collect(store.list_prefix("c/"))) == []


async def _collect(it: Any) -> list[str]:
    return [k async for k in it]


def test_concurrent_writes_to_one_shard_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    create(root, (8, 8), (1, 1), [8, 8], dtype="u1")
    # several wrappers (as separate opens would make), several threads, tasks in each
    arrays = [zfuse.open_array(str(root), mode="r+") for _ in range(4)]

    def writer(t: int) -> None:
        store = arrays[t].store

        async def go() -> None:
            await asyncio.gather(
                *(
                    store.set(f"c/{i}/{j}", PROTO.buffer.from_bytes(bytes([i * 8 + j + 1])))
                    for i in range(8)
                    for j in range(8)
                    if (i * 8 + j) % 4 == t
                )
            )

        asyncio.run(go())

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    expected = (np.arange(64) + 1).astype("u1").reshape(8, 8)
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], expected)
    np.testing.assert_array_equal(unshard(root, (8, 8), (1, 1), (8, 8), "u1"), expected)


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 10), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, s)) for s in shape)
    cps = tuple(draw(st.integers(1, 3)) for _ in shape)
    dtype = draw(st.sampled_from(["u1", "<i2", "<u4", "<f4", "<f8", "bool"]))
    sep = draw(st.sampled_from(["/", "."]))
    return {"shape": shape, "chunks": chunks, "cps": cps, "dtype": dtype, "sep": sep}


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases(), seed=st.integers(0, 2**16))
def test_property_roundtrip(case: dict[str, Any], seed: int, tmp_path_factory: Any) -> None:
    root = tmp_path_factory.mktemp("s")
    shape, chunks, dtype = case["shape"], case["chunks"], case["dtype"]
    a = create(
        root, shape, chunks, list(case["cps"]), dtype=dtype,
        chunk_key_encoding={"name": "default", "separator": case["sep"]},
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    data = (rng.random(shape) * 50).astype(dtype)
    a[...] = data
    b = zfuse.open_array(str(root))
    np.testing.assert_array_equal(b[...], data)
    sl = tuple(slice(s // 2, s) for s in shape)
    np.testing.assert_array_equal(b[sl], data[sl])
    first = tuple(0 for _ in shape)
    assert b[first] == data[first]
    # partial overwrite keeps the rest
    patch = (
        rng.random(tuple(len(range(*s.indices(n))) for s, n in zip(sl, shape, strict=True))) * 50
    ).astype(dtype)
    a[sl] = patch
    data[sl] = patch
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], data)
    if case["sep"] == "/":
        np.testing.assert_array_equal(unshard(root, shape, chunks, case["cps"], dtype), data)


# --------------------------------------------------------------------------- bad input


def _shard_array(tmp_path: Path) -> tuple[Path, Any]:
    root = tmp_path / "bad.zarr"
    a = create(root, (4, 4), (2, 2), [2, 2])
    a[...] = np.arange(16, dtype="u2").reshape(4, 4) + 1
    return root, a


def _set_index(root: Path, entries: dict[int, tuple[int, int]]) -> None:
    blob = bytearray((root / "c/0/0").read_bytes())
    index = np.frombuffer(bytes(blob[-64:]), "<u8").reshape(-1, 2).copy()
    for pos, (off, nb) in entries.items():
        index[pos] = (off, nb)
    blob[-64:] = index.tobytes()
    (root / "c/0/0").write_bytes(bytes(blob))


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (
            lambda root: (root / "c/0/0").write_bytes(b"x" * 10),
            r"'c/0/0' is 10 bytes, shorter than its index of 16 x 4 = 64",
        ),
        (lambda root: _set_index(root, {0: (1000, 8)}), r"shard 'c/0/0'.*(outside|overlap)"),
        (
            lambda root: _set_index(root, {0: (0, 16), 1: (8, 8)}),
            r"shard 'c/0/0' index entries \d and \d overlap",
        ),
        (
            lambda root: _set_index(root, {2: (EMPTY, 8)}),
            r"shard 'c/0/0' index entry 2 has only one",
        ),
    ],
    ids=["index-short", "entry-outside", "entries-overlap", "half-empty"],
)
def test_corrupt_shard_refused_and_unchanged(tmp_path: Path, corrupt: Any, match: str) -> None:
    root, _ = _shard_array(tmp_path)
    corrupt(root)
    before = snapshot(root)
    a = zfuse.open_array(str(root), mode="r+")
    with pytest.raises(CorruptDataError, match=match):
        a[0:2, 0:2]
    with pytest.raises(CorruptDataError, match=match):
        a[0:2, 0:2] = 7  # a write must read the shard: refuses to rewrite a corrupt one
    with pytest.raises(CorruptDataError, match=match):
        a[0:2, 0:2] = 0  # delete too
    assert snapshot(root) == before


def test_entry_into_index_region_caught_on_write(tmp_path: Path) -> None:
    root, _ = _shard_array(tmp_path)
    _set_index(root, {3: (30, 8)})  # data is 32 bytes: 30..38 runs into the index
    before = snapshot(root)
    a = zfuse.open_array(str(root), mode="r+")
    with pytest.raises(
        CorruptDataError, match=r"shard 'c/0/0' index entry 3 .* outside the 32 data bytes"
    ):
        a[0, 0] = 9
    assert snapshot(root) == before


@pytest.mark.parametrize(
    ("transformer", "match"),
    [
        (
            sharding([2]),
            r"storage_transformers\[0\]\.configuration\.chunks_per_shard: has 1 entries but the array has 2",
        ),
        (sharding([2, 2, 2]), r"chunks_per_shard: has 3 entries"),
        (sharding([2, 0]), r"chunks_per_shard: must be a list of positive integers"),
        (
            {"extension": URI, "type": "hashed", "configuration": {"chunks_per_shard": [1, 1]}},
            r"storage_transformers\[0\]\.type: .*'hashed'",
        ),
        (
            {"name": "mystery", "configuration": {}},
            r"storage_transformers\[0\]: unknown storage transformer 'mystery'",
        ),
    ],
)
def test_bad_metadata(tmp_path: Path, transformer: dict[str, Any], match: str) -> None:
    # refused at creation, nothing written
    root = tmp_path / "new.zarr"
    root.mkdir()
    with pytest.raises(MetadataError, match=match):
        zfuse.open_array(str(root), mode="w", shape=(4, 4), chunks=(2, 2), dtype="u1",
                         storage_transformers=[transformer])  # fmt: skip
    assert snapshot(root) == {}
    # refused when opening an existing array carrying it, nothing changed
    root2, _ = _shard_array(tmp_path)
    doc = json.loads((root2 / "zarr.json").read_text())
    doc["storage_transformers"] = [transformer]
    (root2 / "zarr.json").write_text(json.dumps(doc))
    before = snapshot(root2)
    for mode in ("r", "r+", "a"):
        with pytest.raises(MetadataError, match=match):
            zfuse.open_array(str(root2), mode=mode)
    assert snapshot(root2) == before


def test_index_positions_outside_array_kept(tmp_path: Path) -> None:
    """A shard at the edge still has every index position; chunks there are listed."""
    root = tmp_path / "e.zarr"
    a = create(root, (3,), (1,), [4], dtype="u1")
    a[...] = [1, 2, 3]
    blob = (root / "c/0").read_bytes()
    index = np.frombuffer(blob[-64:], "<u8").reshape(-1, 2)
    assert [tuple(map(int, e)) for e in index] == [(0, 1), (1, 1), (2, 1), (EMPTY, EMPTY)]
    assert list(itertools.islice(sorted(sync(_collect(a.store.list_prefix("c")))), 5)) == [
        "c/0",
        "c/1",
        "c/2",
    ]
