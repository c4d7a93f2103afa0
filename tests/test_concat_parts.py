"""concat-parts storage transformer (seed concat-parts.md): layout, range reads, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numcodecs import Zstd
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore

import zfuse
from zfuse.errors import CorruptDataError, MetadataError
from zfuse.ext.concat_parts import ConcatPartsIO, parse_concat_parts
from zfuse.ext.layers import StoreIO, slice_for_request
from zfuse.testing import CountingStore, snapshot

PROTO = default_buffer_prototype()


def write_doc(root: Path, doc: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "zarr.json").write_text(json.dumps(doc))


# The seed's first example.  zarr-python 3.1.6 needs three fixes to accept it at all:
# an array->bytes codec ("bytes"), zstd's configuration, and a fill_value.
CRC_EXAMPLE: dict[str, Any] = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [1000, 1000],
    "data_type": "uint8",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [500, 500]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0,
    "codecs": [
        {"name": "bytes"},
        {"name": "zstd", "configuration": {"level": 0, "checksum": False}},
        {"name": "crc32c"},
    ],
    "storage_transformers": [
        {
            "name": "concat-parts",
            "configuration": {"parts": [{"key_suffix": ""}, {"key_suffix": ".crc32c", "size": 4}]},
        }
    ],
}

# The seed's second example, shrunk 100x per axis: still 100 inner chunks per shard, so the
# index (16 x 100 + 4-byte crc32c) is the seed's 1604 bytes.  zarr-python has no packbits
# codec; "bytes" stands in for it.
SHARDED_EXAMPLE: dict[str, Any] = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [100, 100],
    "data_type": "uint8",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [50, 50]}},
    "chunk_key_encoding": {"name": "default"},
    "fill_value": 0,
    "storage_transformers": [
        {
            "name": "concat-parts",
            "configuration": {
                "parts": [
                    {"key_suffix": ".header", "size": 64},
                    {"key_suffix": ""},
                    {"key_suffix": ".index", "size": 1604},
                ]
            },
        }
    ],
    "codecs": [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [5, 5],
                "index_location": "end",
                "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
                "codecs": [{"name": "bytes"}],
            },
        }
    ],
}


def test_seed_crc32c_example_files(tmp_path: Path) -> None:
    root = tmp_path / "crc.zarr"
    write_doc(root, CRC_EXAMPLE)
    data = (np.arange(1000 * 1000) % 251 + 1).astype("u1").reshape(1000, 1000)
    a = zfuse.open_array(str(root), mode="r+")
    a[...] = data
    chunk_files = sorted(k for k in snapshot(root) if k.startswith("c/"))
    assert chunk_files == sorted(
        f"c/{i}/{j}{s}" for i in range(2) for j in range(2) for s in ("", ".crc32c")
    )
    for i in range(2):
        for j in range(2):
            main = (root / f"c/{i}/{j}").read_bytes()
            crc = (root / f"c/{i}/{j}.crc32c").read_bytes()
            assert len(crc) == 4
            assert int.from_bytes(crc, "little") == crc32c.crc32c(main)
            # independently of zfuse: the main part is the zstd stream of the chunk
            block = data[i * 500 : (i + 1) * 500, j * 500 : (j + 1) * 500]
            assert Zstd().decode(main) == block.tobytes()
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], data)
    # stored zarr.json still carries the transformer
    assert (
        json.loads((root / "zarr.json").read_text())["storage_transformers"]
        == (CRC_EXAMPLE["storage_transformers"])
    )


def test_seed_sharded_header_example_files(tmp_path: Path) -> None:
    root = tmp_path / "sharded.zarr"
    write_doc(root, SHARDED_EXAMPLE)
    rng = np.random.default_rng(0)
    data = rng.integers(1, 255, size=(100, 100), dtype="u1")
    a = zfuse.open_array(str(root), mode="r+")
    a[...] = data
    files = snapshot(root)
    for i in range(2):
        for j in range(2):
            header = files[f"c/{i}/{j}.header"]
            main = files[f"c/{i}/{j}"]
            index_part = files[f"c/{i}/{j}.index"]
            assert len(header) == 64 and len(index_part) == 1604
            shard = header + main + index_part  # offsets are relative to header + data
            index_bytes, crc = index_part[:-4], index_part[-4:]
            assert int.from_bytes(crc, "little") == crc32c.crc32c(index_bytes)
            index = np.frombuffer(index_bytes, "<u8").reshape(-1, 2)
            assert index.shape == (100, 2)
            for pos, (off, nbytes) in enumerate(index):
                y, x = divmod(pos, 10)
                block = data[
                    i * 50 + y * 5 : i * 50 + y * 5 + 5, j * 50 + x * 5 : j * 50 + x * 5 + 5
                ]
                assert shard[int(off) : int(off) + int(nbytes)] == block.tobytes()
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], data)
    np.testing.assert_array_equal(zfuse.open_array(str(root))[7:33, 41:77], data[7:33, 41:77])


def _io(parts: list[dict[str, Any]]) -> tuple[ConcatPartsIO, CountingStore]:
    raw = CountingStore(MemoryStore())
    cfg = parse_concat_parts({"name": "concat-parts", "configuration": {"parts": parts}})
    return ConcatPartsIO(StoreIO(raw, "arr"), cfg), raw


HEADER_DATA_INDEX = [
    {"key_suffix": ".header", "size": 64},
    {"key_suffix": ""},
    {"key_suffix": ".index", "size": 100},
]


@pytest.mark.parametrize(
    ("byte_range", "expected_gets", "expected_sizes"),
    [
        (SuffixByteRequest(100), [("arr/c/0.index", None)], []),
        (SuffixByteRequest(30), [("arr/c/0.index", RangeByteRequest(70, 100))], []),
        (RangeByteRequest(0, 10), [("arr/c/0.header", RangeByteRequest(0, 10))], []),
        (RangeByteRequest(70, 80), [("arr/c/0", RangeByteRequest(6, 16))], []),
        (
            RangeByteRequest(60, 70),
            [("arr/c/0.header", RangeByteRequest(60, 64)), ("arr/c/0", RangeByteRequest(0, 6))],
            [],
        ),
        (
            RangeByteRequest(1000, 1074),
            [("arr/c/0", RangeByteRequest(936, 1010)), ("arr/c/0.index", RangeByteRequest(0, 10))],
            [],
        ),
        (
            OffsetByteRequest(1050),
            [("arr/c/0", OffsetByteRequest(986)), ("arr/c/0.index", None)],
            [],
        ),
        (
            SuffixByteRequest(150),
            [("arr/c/0", RangeByteRequest(950, 1000)), ("arr/c/0.index", None)],
            ["arr/c/0"],
        ),
        (
            RangeByteRequest(1100, 1130),
            [
                ("arr/c/0", RangeByteRequest(1036, 1066)),
                ("arr/c/0.index", RangeByteRequest(36, 66)),
            ],
            ["arr/c/0"],
        ),
    ],
)
def test_range_read_touches_only_overlapping_parts(
    byte_range: ByteRequest, expected_gets: list[Any], expected_sizes: list[str]
) -> None:
    io, raw = _io(HEADER_DATA_INDEX)
    block = bytes(np.random.default_rng(1).integers(0, 256, 64 + 1000 + 100, dtype="u1"))
    sync(io.set("c/0", block))
    raw.reset()
    got = sync(io.get("c/0", byte_range))
    start, stop = slice_for_request(len(block), byte_range)
    assert got == block[start:stop]
    assert sorted(raw.gets, key=str) == sorted(expected_gets, key=str)
    assert raw.sizes == expected_sizes


def test_whole_read_one_get_per_part_and_delete_removes_all() -> None:
    io, raw = _io(HEADER_DATA_INDEX)
    block = bytes(range(256)) * 5
    sync(io.set("c/0", block))
    raw.reset()
    assert sync(io.get("c/0")) == block
    assert sorted(k for k, _ in raw.gets) == ["arr/c/0", "arr/c/0.header", "arr/c/0.index"]
    assert sync(io.getsize("c/0")) == len(block)
    assert sync(io.list_keys()) == ["c/0"]
    sync(io.delete("c/0"))
    assert sync(io.get("c/0")) is None
    assert not sync(io.exists("c/0"))
    assert sync(raw.is_empty(""))


@st.composite
def layouts(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 4))
    suffixes = draw(
        st.lists(
            st.sampled_from(["", ".a", ".b", "_c", ".crc32c"]), min_size=n, max_size=n, unique=True
        )
    )
    unsized = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    parts = []
    for i, s in enumerate(suffixes):
        part: dict[str, Any] = {"key_suffix": s}
        if i != unsized:
            part["size"] = draw(st.integers(0, 40))
        parts.append(part)
    return parts


byte_ranges = st.one_of(
    st.none(),
    st.builds(lambda a, b: RangeByteRequest(a, a + b), st.integers(0, 200), st.integers(1, 200)),
    st.builds(OffsetByteRequest, st.integers(0, 200)),
    st.builds(SuffixByteRequest, st.integers(1, 200)),
)


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts(),
    extra=st.integers(0, 100),
    ranges=st.lists(byte_ranges, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_property_parts_roundtrip_and_ranges(
    layout: list[dict[str, Any]], extra: int, ranges: list[ByteRequest | None], seed: int
) -> None:
    io, raw = _io(layout)
    fixed = sum(p.get("size", 0) for p in layout)
    unsized = any("size" not in p for p in layout)
    n = fixed + (extra if unsized else 0)
    block = bytes(np.random.default_rng(seed).integers(0, 256, n, dtype="u1"))
    sync(io.set("c/1/2", block))
    for p in layout:  # every part stored, at its size
        stored = sync(raw.get("arr/c/1/2" + p["key_suffix"], PROTO))
        assert stored is not None
        if "size" in p:
            assert len(stored) == p["size"]
    assert sync(io.get("c/1/2")) == block
    for r in ranges:
        if isinstance(r, RangeByteRequest) and r.start >= n and n > 0:
            continue  # zarr stores disagree on ranges past the end; zarr never asks for them
        start, stop = slice_for_request(n, r)
        assert sync(io.get("c/1/2", r)) == block[start:stop]
    assert sync(io.get("c/9/9", SuffixByteRequest(3))) is None


@st.composite
def array_cases(draw: Any) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, s)) for s in shape)
    dtype = draw(st.sampled_from(["u1", "i2", "<u4", "f4", "f8"]))
    nbytes = int(np.prod(chunks)) * np.dtype(dtype).itemsize
    head = draw(st.integers(0, min(nbytes, 16)))
    tail = draw(st.integers(0, min(nbytes - head, 16)))
    parts = []
    if head:
        parts.append({"key_suffix": ".head", "size": head})
    parts.append({"key_suffix": ""})
    if tail:
        parts.append({"key_suffix": ".tail", "size": tail})
    return {"shape": shape, "chunks": chunks, "dtype": dtype, "parts": parts}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=array_cases(), seed=st.integers(0, 2**16))
def test_property_arrays_through_zarr(
    case: dict[str, Any], seed: int, tmp_path_factory: Any
) -> None:
    root = tmp_path_factory.mktemp("cp")
    a = zfuse.open_array(
        str(root),
        mode="w",
        shape=case["shape"],
        chunks=case["chunks"],
        dtype=case["dtype"],
        codecs=[{"name": "bytes", "configuration": {"endian": "little"}}],
        storage_transformers=[{"name": "concat-parts", "configuration": {"parts": case["parts"]}}],
    )
    rng = np.random.default_rng(seed)
    data = (rng.random(case["shape"]) * 100).astype(case["dtype"])
    a[...] = data
    b = zfuse.open_array(str(root))
    np.testing.assert_array_equal(b[...], data)
    sl = tuple(slice(s // 3, max(s // 3 + 1, s - 1)) for s in case["shape"])
    np.testing.assert_array_equal(b[sl], data[sl])
    idx = tuple(s - 1 for s in case["shape"])
    assert b[idx] == data[idx]


# --------------------------------------------------------------------------- bad input


def _crc_array(tmp_path: Path) -> tuple[Path, np.ndarray]:
    root = tmp_path / "crc.zarr"
    doc = dict(
        CRC_EXAMPLE,
        shape=[20, 20],
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": [10, 10]}},
    )
    write_doc(root, doc)
    data = (np.arange(400) % 200 + 1).astype("u1").reshape(20, 20)
    zfuse.open_array(str(root), mode="r+")[...] = data
    return root, data


def test_missing_part_is_corrupt(tmp_path: Path) -> None:
    root, _ = _crc_array(tmp_path)
    (root / "c/0/1.crc32c").unlink()
    before = snapshot(root)
    a = zfuse.open_array(str(root), mode="r+")
    with pytest.raises(CorruptDataError, match=r"c/0/1\.crc32c"):
        a[0:10, 10:20]
    assert snapshot(root) == before


def test_extra_part_without_main_is_corrupt(tmp_path: Path) -> None:
    root, _ = _crc_array(tmp_path)
    (root / "c/1/1").unlink()  # leaves c/1/1.crc32c behind
    before = snapshot(root)
    a = zfuse.open_array(str(root))
    with pytest.raises(CorruptDataError, match=r"'c/1/1'"):
        a[10:20, 10:20]
    assert snapshot(root) == before


def test_part_of_wrong_size_is_corrupt(tmp_path: Path) -> None:
    root, _ = _crc_array(tmp_path)
    (root / "c/1/0.crc32c").write_bytes(b"12345")
    before = snapshot(root)
    with pytest.raises(CorruptDataError, match=r"c/1/0\.crc32c.*holds more than 4 bytes, expected 4"):
        zfuse.open_array(str(root))[10:20, 0:10]
    assert snapshot(root) == before


def test_a_sized_part_far_too_long_is_refused_unread(tmp_path: Path) -> None:
    """[hostile-12] a mount's read of a sized part (a 4-byte .crc32c) that is a sparse
    3 GiB file: refused at one byte past its size, nothing read (it was read whole)."""
    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view

    root, _ = _crc_array(tmp_path)
    with open(root / "c/1/0.crc32c", "r+b") as f:
        f.truncate(3 * 2**30)
    view = make_view(MountConfig([str(root)], "/nonexistent", read_only=True))
    array = dict(view.arrays())[()]
    with pytest.raises(CorruptDataError, match=r"c/1/0\.crc32c: stored object of 3221225472 bytes or more, past the 5"):
        array.pixel_bytes((1, 0))


def test_block_shorter_than_fixed_parts_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "short.zarr"
    parts = [{"key_suffix": ".h", "size": 20}, {"key_suffix": ""}, {"key_suffix": ".t", "size": 20}]
    a = zfuse.open_array(
        str(root),
        mode="w",
        shape=(128,),
        chunks=(64,),
        dtype="u1",
        codecs=[{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}],
        storage_transformers=[{"name": "concat-parts", "configuration": {"parts": parts}}],
    )
    a[...] = np.random.default_rng(3).integers(0, 256, 128, dtype="u1")  # ~80-byte blocks
    before = snapshot(root)
    assert {"c/0", "c/0.h", "c/0.t", "c/1", "c/1.h", "c/1.t"} <= set(before)
    with pytest.raises(MetadataError, match=r"'c/0'.* bytes, shorter than the 40 bytes"):
        a[0:64] = 7  # compresses to ~25 bytes
    assert snapshot(root) == before


def test_block_longer_than_all_sized_parts(tmp_path: Path) -> None:
    io, raw = _io([{"key_suffix": "", "size": 3}, {"key_suffix": ".x", "size": 1}])
    with pytest.raises(MetadataError, match=r"arr/c/0.*longer than"):
        sync(io.set("c/0", b"12345"))
    assert sync(raw.is_empty(""))


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ([], r"parts: must be a non-empty list"),
        ([{"size": 3}], r"parts\[0\]\.key_suffix"),
        ([{"key_suffix": ""}, {"key_suffix": ""}], r"parts\[1\]\.key_suffix"),
        ([{"key_suffix": "", "size": -1}], r"parts\[0\]\.size"),
        ([{"key_suffix": "", "size": "4"}], r"parts\[0\]\.size"),
        ([{"key_suffix": ""}, {"key_suffix": ".x"}], r"parts: 2 parts without 'size'"),
        # [hostile-8] a chunk read costs a request per part
        ([{"key_suffix": f".{i}", "size": 1} for i in range(1025)], r"parts: 1025 parts, more than zfuse reads \(1024"),
    ],
)
def test_bad_config_refused_before_anything_is_stored(
    tmp_path: Path, parts: list[Any], match: str
) -> None:
    root = tmp_path / "bad.zarr"
    root.mkdir()
    with pytest.raises(MetadataError, match=match):
        zfuse.open_array(
            str(root),
            mode="w",
            shape=(4,),
            chunks=(2,),
            dtype="u1",
            storage_transformers=[{"name": "concat-parts", "configuration": {"parts": parts}}],
        )
    assert snapshot(root) == {}


def test_two_unsized_parts_still_read(tmp_path: Path) -> None:
    """Reading does not need sizes (only writing does)."""
    store = LocalStore(tmp_path)
    sync(store.set("c/0", PROTO.buffer.from_bytes(b"abc")))
    sync(store.set("c/0.x", PROTO.buffer.from_bytes(b"defg")))
    cfg = parse_concat_parts(
        {"configuration": {"parts": [{"key_suffix": ""}, {"key_suffix": ".x"}]}}
    )
    io = ConcatPartsIO(StoreIO(store, ""), cfg)
    assert sync(io.get("c/0")) == b"abcdefg"
    assert sync(io.get("c/0", RangeByteRequest(2, 5))) == b"cde"
