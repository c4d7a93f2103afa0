"""Transformer stacks: [sharding v1, concat-parts], concat-parts under the sharding_indexed codec.

Transformers stack in list order: the first is nearest the array, the last nearest the store.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.abc.store import RangeByteRequest
from zarr.storage import LocalStore

import zfuse
from zfuse.errors import MetadataError
from zfuse.testing import CountingStore, snapshot

EMPTY = 2**64 - 1
URI = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
BYTES = [{"name": "bytes", "configuration": {"endian": "little"}}]


def sharding(cps: list[int]) -> dict[str, Any]:
    return {"name": "sharding", "type": "indexed", "configuration": {"chunks_per_shard": cps}}


def concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "concat-parts", "configuration": {"parts": parts}}


def test_sharding_then_concat_parts_split_index(tmp_path: Path) -> None:
    """A v1 shard split into a data part and an index part."""
    root = tmp_path / "a.zarr"
    cps = [2, 3]
    n = math.prod(cps)
    a = zfuse.open_array(
        str(root), mode="w", shape=(6, 9), chunks=(2, 2), dtype="<u2", codecs=BYTES,
        storage_transformers=[sharding(cps), concat([{"key_suffix": ""}, {"key_suffix": ".index", "size": 16 * n}])],
    )  # fmt: skip
    data = np.arange(54, dtype="<u2").reshape(6, 9) + 1
    a[...] = data
    files = snapshot(root)
    # chunk grid 3 x 5 -> shard grid 2 x 2
    assert sorted(k for k in files if k != "zarr.json") == sorted(
        f"c/{i}/{j}{s}" for i in range(2) for j in range(2) for s in ("", ".index")
    )
    for i in range(2):
        for j in range(2):
            assert len(files[f"c/{i}/{j}.index"]) == 16 * n
            shard = files[f"c/{i}/{j}"] + files[f"c/{i}/{j}.index"]
            index = np.frombuffer(shard[-16 * n :], "<u8").reshape(-1, 2)
            for pos, (off, nbytes) in enumerate(index):
                ly, lx = divmod(pos, 3)
                cy, cx = i * 2 + ly, j * 3 + lx
                if cy >= 3 or cx >= 5:
                    assert off == EMPTY and nbytes == EMPTY
                    continue
                block = np.zeros((2, 2), "<u2")
                part = data[cy * 2 : cy * 2 + 2, cx * 2 : cx * 2 + 2]
                block[: part.shape[0], : part.shape[1]] = part
                assert shard[int(off) : int(off) + int(nbytes)] == block.tobytes()
    # one chunk = one read of the index part + one ranged read of the data part
    counting = CountingStore(LocalStore(root))
    b = zfuse.open_array(counting)
    counting.gets.clear()
    assert b[3, 7] == data[3, 7]
    # chunk (1, 3) -> shard (0, 1), position 3 (local (1, 0)); positions 2 and 5 lie outside
    # the array, so it is the 3rd chunk stored -> bytes 16..24
    assert counting.gets == [("c/0/1.index", None), ("c/0/1", RangeByteRequest(16, 24))]
    np.testing.assert_array_equal(b[...], data)
    # deleting every chunk of a shard removes both parts
    a[0:4, 6:9] = 0
    assert not any(k.startswith("c/0/1") for k in snapshot(root))


def test_concat_parts_with_sharding_indexed_codec_reads_two_requests(tmp_path: Path) -> None:
    """concat-parts below the standard sharding codec: a partial read touches index + data only."""
    root = tmp_path / "b.zarr"
    n_inner = 4 * 4
    a = zfuse.open_array(
        str(root), mode="w", shape=(16, 16), chunks=(8, 8), dtype="u1", fill_value=0,
        codecs=[{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2, 2], "index_location": "end",
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "codecs": [{"name": "bytes"}]}}],
        storage_transformers=[concat([
            {"key_suffix": ".header", "size": 16},
            {"key_suffix": ""},
            {"key_suffix": ".index", "size": 16 * n_inner + 4},
        ])],
    )  # fmt: skip
    data = (np.arange(256) % 250 + 1).astype("u1").reshape(16, 16)
    a[...] = data
    files = snapshot(root)
    idx = files["c/1/0.index"]
    assert len(files["c/1/0.header"]) == 16 and len(idx) == 16 * n_inner + 4
    assert int.from_bytes(idx[-4:], "little") == crc32c.crc32c(idx[:-4])
    counting = CountingStore(LocalStore(root))
    b = zfuse.open_array(counting)
    counting.gets.clear()
    assert b[15, 7] == data[15, 7]
    # zarr's codec reads the shard index (a suffix: the .index part alone), then one inner
    # chunk (the shard's last, inside the data part, past the 16-byte header)
    assert [k for k, _ in counting.gets] == ["c/1/0.index", "c/1/0"], counting.gets
    assert isinstance(counting.gets[1][1], RangeByteRequest)
    np.testing.assert_array_equal(b[...], data)


def test_concat_parts_before_sharding_refused(tmp_path: Path) -> None:
    root = tmp_path / "c.zarr"
    root.mkdir()
    with pytest.raises(
        MetadataError, match=r"storage_transformers\[1\]: sharding v1 cannot sit below concat-parts"
    ):
        zfuse.open_array(
            str(root), mode="w", shape=(4,), chunks=(1,), dtype="u1",
            storage_transformers=[concat([{"key_suffix": ""}]), sharding([2])],
        )  # fmt: skip
    assert snapshot(root) == {}


STACKS = [
    "sharding",
    "concat",
    "sharding+concat-index",
    "sharding+concat-header-index",
    "sharding+sharding",
    "codec-sharding+concat",
]


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, s)) for s in shape)
    cps = [draw(st.integers(1, 3)) for _ in shape]
    dtype = draw(st.sampled_from(["u1", "<i2", "<u4", "<f4", "<f8"]))
    stack = draw(st.sampled_from(STACKS))
    head = draw(st.integers(0, 12))
    return {
        "shape": shape,
        "chunks": chunks,
        "cps": cps,
        "dtype": dtype,
        "stack": stack,
        "head": head,
    }


def _kwargs(case: dict[str, Any]) -> dict[str, Any]:
    chunks, cps, stack = case["chunks"], case["cps"], case["stack"]
    n = math.prod(cps)
    itemsize = np.dtype(case["dtype"]).itemsize
    kw: dict[str, Any] = {"chunks": chunks, "codecs": BYTES}
    if stack == "sharding":
        kw["storage_transformers"] = [sharding(cps)]
    elif stack == "concat":
        head = min(case["head"], math.prod(chunks) * itemsize)
        kw["storage_transformers"] = [
            concat([{"key_suffix": ".h", "size": head}, {"key_suffix": ""}])
        ]
    elif stack == "sharding+concat-index":
        kw["storage_transformers"] = [
            sharding(cps),
            concat([{"key_suffix": ""}, {"key_suffix": ".index", "size": 16 * n}]),
        ]
    elif stack == "sharding+concat-header-index":
        # the header takes the first bytes of the v1 shard: at most one chunk's worth
        head = min(case["head"], math.prod(chunks) * itemsize)
        kw["storage_transformers"] = [
            sharding(cps),
            concat(
                [
                    {"key_suffix": ".hdr", "size": head},
                    {"key_suffix": ""},
                    {"key_suffix": ".index", "size": 16 * n},
                ]
            ),
        ]
    elif stack == "sharding+sharding":
        kw["storage_transformers"] = [sharding(cps), sharding([2] * len(cps))]
    else:  # the standard sharding codec, its shards split by concat-parts
        kw["chunks"] = tuple(c * k for c, k in zip(chunks, cps, strict=True))
        kw["codecs"] = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(chunks), "index_location": "end",
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "codecs": BYTES}}]  # fmt: skip
        head = min(case["head"], math.prod(chunks) * itemsize)  # <= one inner chunk
        kw["storage_transformers"] = [
            concat(
                [
                    {"key_suffix": ".header", "size": head},
                    {"key_suffix": ""},
                    {"key_suffix": ".index", "size": 16 * n + 4},
                ]
            )
        ]
    return kw


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases(), seed=st.integers(0, 2**16))
def test_property_stacks_roundtrip(case: dict[str, Any], seed: int, tmp_path_factory: Any) -> None:
    root = tmp_path_factory.mktemp("stack")
    shape, dtype = case["shape"], case["dtype"]
    a = zfuse.open_array(
        str(root), mode="w", shape=shape, dtype=dtype, fill_value=0, **_kwargs(case)
    )
    rng = np.random.default_rng(seed)
    # never the fill value, so the sharding codec's blobs are never shorter than a header
    data = (rng.random(shape) * 50 + 1).astype(dtype)
    a[...] = data
    b = zfuse.open_array(str(root))
    np.testing.assert_array_equal(b[...], data)
    sl = tuple(slice(s // 3, s) for s in shape)
    np.testing.assert_array_equal(b[sl], data[sl])
    last = tuple(s - 1 for s in shape)
    assert b[last] == data[last]
    # overwrite a corner, then clear it back to the fill value (deletes through the stack)
    corner = tuple(slice(0, max(1, s // 2)) for s in shape)
    a[corner] = 7
    data[corner] = 7
    np.testing.assert_array_equal(zfuse.open_array(str(root))[...], data)
    a[...] = 0
    assert sorted(snapshot(root)) == ["zarr.json"]
