"""Writing inner chunks into shards of a local store in the worker thread
(`zfuse/view/shard_writes.py`, `LocalShardWrites`): the shards come out byte for byte as
zarr-python writes them, for either index location and edge shards; a shard whose
index cannot be read is refused and left as it was; arrays the fast path does not
know (a codec over the whole shard) are written by zarr-python as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

from zfuse.errors import CorruptDataError
from zfuse.open_view import open_source
from zfuse.view.tree import ViewOptions, build_view

from stores import values


def _source(path: Path):
    view = build_view(open_source([str(path)]), ViewOptions())
    arr, _ = view.array_at(("c",))
    return arr.source


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _create(path: Path, shape, shards, chunks, index_location: str):
    codec = ShardingCodec(chunk_shape=chunks, codecs=[BytesCodec(), ZstdCodec(level=3)],
                          index_codecs=[BytesCodec(), Crc32cCodec()], index_location=index_location)
    return zarr.create_array(str(path), shape=shape, chunks=shards, dtype="u2", fill_value=7,
                             serializer=codec, compressors=None)


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("shape", [(100, 90), (64, 64)])
def test_inner_chunk_writes_match_zarr_byte_for_byte(tmp_path: Path, index_location: str, shape) -> None:
    a = _create(tmp_path / "a.zarr", shape, (30, 40) if shape == (100, 90) else (32, 32), (10, 20)
                if shape == (100, 90) else (16, 16), index_location)
    a[: shape[0] // 2] = values((shape[0] // 2, shape[1]), "u2", seed=1)  # some shards half full
    shutil.copytree(tmp_path / "a.zarr", tmp_path / "b.zarr")
    new = values(shape, "u2", seed=2)
    src = _source(tmp_path / "b.zarr")
    assert src._shard_writes.available
    for coords in np.ndindex(*src.grid_shape):
        src.write_chunk(coords, src.full_chunk(new[src.chunk_region(coords)]))
        a[src.chunk_region(coords)] = new[src.chunk_region(coords)]  # zarr-python, chunk by chunk
        # the index cached by the write answers like the shard read afresh
        assert src.chunk_exists(coords)
        written = new[src.chunk_region(coords)]
        np.testing.assert_array_equal(src.read_chunk(coords)[: written.shape[0], : written.shape[1]], written)
    assert _files(tmp_path / "a.zarr") == _files(tmp_path / "b.zarr")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "b.zarr"))[...], new)
    assert not list((tmp_path / "b.zarr").rglob("*.tmp"))


def test_one_chunk_into_a_new_shard(tmp_path: Path) -> None:
    a = _create(tmp_path / "a.zarr", (40, 40), (20, 20), (10, 10), "end")
    shutil.copytree(tmp_path / "a.zarr", tmp_path / "b.zarr")  # no shard stored yet
    block = values((10, 10), "u2", seed=3)
    src = _source(tmp_path / "b.zarr")
    src.write_chunk((3, 1), block)
    a[30:40, 10:20] = block
    assert _files(tmp_path / "a.zarr") == _files(tmp_path / "b.zarr")
    assert src.chunk_exists((3, 1)) and not src.chunk_exists((3, 0))


def test_unreadable_index_refuses_and_keeps_the_shard(tmp_path: Path) -> None:
    a = _create(tmp_path / "a.zarr", (40, 40), (20, 20), (10, 10), "end")
    a[...] = values((40, 40), "u2", seed=4)
    shard = tmp_path / "a.zarr" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the index checksum no longer matches
    shard.write_bytes(bytes(data))
    src = _source(tmp_path / "a.zarr")
    with pytest.raises(CorruptDataError, match="c/0/0"):
        src.write_chunk((0, 0), values((10, 10), "u2", seed=5))
    assert shard.read_bytes() == bytes(data)


def test_codec_over_the_whole_shard_is_left_to_zarr(tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr warns that such shards cannot be read partially
        a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(40, 40), chunks=(20, 20), dtype="u2",
                              serializer=ShardingCodec(chunk_shape=(10, 10)), compressors=[ZstdCodec()])
        a[...] = values((40, 40), "u2", seed=6)
        src = _source(tmp_path / "a.zarr")
        assert not src._shard_writes.available
        block = values(src.chunk_shape, "u2", seed=7)
        src.write_chunk((1, 0), block)
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[src.chunk_region((1, 0))], block)
