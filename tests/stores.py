"""Sample stores for view and mount tests: one builder per source kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

# moved to zfuse.testing; still importable from here for branches written before the move
from zfuse.testing import CountingStore, snapshot  # noqa: F401


def values(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Deterministic, never-fill-valued test data of any dtype."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -1000), min(info.max, 60000)
        out = rng.integers(lo, hi, shape, dtype=np.int64).astype(dtype)
        out[out == 0] = 1
        return out
    if dtype.kind == "c":
        return (rng.random(shape) + 1 + 1j * rng.random(shape)).astype(dtype)
    return (rng.random(shape) * 100 + 1).astype(dtype)


def sample(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Deterministic values exercising sign, range and (for complex) both parts."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "ui":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1000).astype(dt)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)


def v3(path: Path, shape=(20, 30), chunks=(8, 16), dtype="uint16", codecs="zstd", seed=0, **kw) -> np.ndarray:
    data = values(shape, dtype, seed)
    compressors: Any = {"zstd": [ZstdCodec(level=1)], "raw": None, "crc32c": [ZstdCodec(level=1), Crc32cCodec()],
                        "blosc": [BloscCodec()]}[codecs]
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype, compressors=compressors,
                            fill_value=0, **kw)
    arr[...] = data
    return data


def v2(path: Path, shape=(20, 30), chunks=(8, 16), dtype="uint16", separator=".", seed=0) -> np.ndarray:
    data = values(shape, dtype, seed)
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype, zarr_format=2,
                            chunk_key_encoding={"name": "v2", "separator": separator}, fill_value=0)
    arr[...] = data
    return data


def sharded(path: Path, shape=(20, 30), shards=(16, 32), chunks=(8, 16), dtype="uint16", seed=0) -> np.ndarray:
    data = values(shape, dtype, seed)
    arr = zarr.create_array(str(path), shape=shape, shards=shards, chunks=chunks, dtype=dtype,
                            compressors=[ZstdCodec(level=1)], fill_value=0)
    arr[...] = data
    return data


def ome_group(path: Path, shape=(4, 40, 50), chunks=(2, 16, 16), seed=0) -> dict[str, np.ndarray]:
    """An OME-Zarr-like multiscale group with two levels (z, y, x axes)."""
    root = zarr.open_group(str(path), mode="w")
    out = {}
    for level in range(2):
        s = tuple(max(1, n // (2**level)) if i else n for i, n in enumerate(shape))
        data = values(s, "uint16", seed + level)
        a = root.create_array(str(level), shape=s, chunks=chunks, dtype="uint16",
                              compressors=[ZstdCodec(level=1)], fill_value=0)
        a[...] = data
        out[str(level)] = data
    root.attrs["multiscales"] = [{
        "version": "0.4",
        "axes": [{"name": "z", "type": "space", "unit": "micrometer"},
                 {"name": "y", "type": "space", "unit": "micrometer"},
                 {"name": "x", "type": "space", "unit": "micrometer"}],
        "datasets": [{"path": str(lv), "coordinateTransformations": [{"type": "scale", "scale": [2.0, 0.5 * 2**lv, 0.5 * 2**lv]}]}
                     for lv in range(2)],
    }]
    return out


def raw_chunks(path: Path, grid: tuple[int, ...], *, separator: str = "/", shard: tuple[int, ...] | None = None,
               every: int = 1) -> None:
    """A v3 uint8 array of 1x…x1 chunks (value = flat chunk index % 251 + 1) written as raw
    files with os.write, not zarr: tens of thousands of chunks in a second. `shard`:
    inner chunks per shard (index without checksum); `every`: only every n-th chunk (C
    order) is stored."""
    import json
    import os

    shape = list(grid)
    codecs: list[Any] = [{"name": "bytes"}]
    chunk_shape = [1] * len(grid)
    if shard is not None:
        chunk_shape = list(shard)
        codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1] * len(grid), "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end"}}]
    meta = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk_shape}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
            "fill_value": 0, "codecs": codecs, "attributes": {}}
    path.mkdir(parents=True, exist_ok=True)
    (path / "zarr.json").write_text(json.dumps(meta))
    made: set[str] = set()

    def put(coords: tuple[int, ...], data: bytes) -> None:
        """One stored object (a chunk or a shard) at its key, written directly."""
        key = "c" + separator + separator.join(map(str, coords))
        parent = os.path.join(path, key.rsplit("/", 1)[0]) if "/" in key else str(path)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        fd = os.open(os.path.join(path, key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)

    if shard is None:
        for flat, coords in enumerate(np.ndindex(*grid)):
            if flat % every:
                continue
            put(coords, bytes([flat % 251 + 1]))
        return
    per = int(np.prod(shard))
    for shard_coords in np.ndindex(*(-(-g // s) for g, s in zip(grid, shard, strict=True))):
        index = np.full((per, 2), np.iinfo(np.uint64).max, dtype="<u8")
        data = bytearray()
        for local_flat, local in enumerate(np.ndindex(*shard)):
            coords = tuple(s * n + i for s, n, i in zip(shard_coords, shard, local, strict=True))
            if any(c >= g for c, g in zip(coords, grid, strict=True)):
                continue
            flat = int(np.ravel_multi_index(coords, grid))
            if flat % every:
                continue
            index[local_flat] = (len(data), 1)
            data.append(flat % 251 + 1)
        put(shard_coords, bytes(data) + index.tobytes())


__all__ = ["values", "v3", "v2", "sharded", "ome_group", "BytesCodec", "ShardingCodec"]


SHARDING_V1 = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"


def with_transformers(path: Path, transformers: list, shape=(20, 30), chunks=(8, 16), dtype="uint16",
                      seed=0, compressors: Any = "zstd") -> np.ndarray:
    """An array created through zfuse.open_array with storage transformers."""
    from zfuse.ext.api import open_array

    data = values(shape, dtype, seed)
    comp = [ZstdCodec(level=1)] if compressors == "zstd" else list(compressors or [])
    arr = open_array(str(path), mode="w", shape=shape, chunks=chunks, dtype=dtype, fill_value=0,
                     codecs=[BytesCodec(), *comp], storage_transformers=transformers)
    arr[...] = data
    return data


def concat_parts(path: Path, **kw: Any) -> np.ndarray:
    """The concat-parts seed's layout: zstd data in c/i/j, crc32c in c/i/j.crc32c."""
    parts = [{"name": "concat-parts", "configuration": {"parts": [
        {"key_suffix": ""}, {"key_suffix": ".crc32c", "size": 4}]}}]
    return with_transformers(path, parts, compressors=[ZstdCodec(level=1), Crc32cCodec()], **kw)


def sharding_v1(path: Path, chunks_per_shard=(2, 2), **kw: Any) -> np.ndarray:
    t = [{"name": SHARDING_V1, "type": "indexed", "configuration": {"chunks_per_shard": list(chunks_per_shard)}}]
    return with_transformers(path, t, **kw)


def stacked(path: Path, **kw: Any) -> np.ndarray:
    """sharding v1 then concat-parts: each shard split into a data part and its 16*n-byte index."""
    t = [{"name": SHARDING_V1, "type": "indexed", "configuration": {"chunks_per_shard": [2, 2]}},
         {"name": "concat-parts", "configuration": {"parts": [{"key_suffix": ""},
                                                              {"key_suffix": ".index", "size": 16 * 4}]}}]
    return with_transformers(path, t, **kw)


def open_any(path: Path) -> Any:
    """Open any test store the way the mount does (transformers included)."""
    from zfuse.ext.api import open_array

    return open_array(str(path), mode="r")


def ngff_nested(src: Path, version: str = "0.4", name: str = "cells") -> None:
    """ngff-zarr's layout: the multiscale names datasets `scale0/image`, `scale1/image`;
    OME-Zarr 0.5 puts the multiscales under attributes["ome"], 0.4 at the top, with
    a multiscale-level scale that multiplies every dataset's."""
    root = zarr.open_group(str(src), mode="w")
    for level in range(2):
        arr = root.create_group(f"scale{level}").create_array(
            "image", shape=(2, 32 >> level, 32 >> level), chunks=(2, 16, 16), dtype="u2")
        arr[...] = values(arr.shape, "uint16", seed=level)
    multiscale = {
        "axes": [{"name": "c", "type": "channel"}, {"name": "y", "type": "space", "unit": "micrometer"},
                 {"name": "x", "type": "space", "unit": "micrometer"}],
        "datasets": [{"path": f"scale{lv}/image", "coordinateTransformations": [
            {"type": "scale", "scale": [1.0, 0.325 * 2**lv, 0.325 * 2**lv]}]} for lv in range(2)],
        "coordinateTransformations": [{"type": "scale", "scale": [1.0, 2.0, 2.0]}],
        "name": name,
    }
    if version == "0.5":
        root.attrs["ome"] = {"version": "0.5", "multiscales": [multiscale]}
    else:
        root.attrs["multiscales"] = [{"version": "0.4", **multiscale}]
