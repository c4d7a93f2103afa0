"""Regenerate the pre-release Zarr v3 fixtures in tests/data/legacy_v3/.

These stores are written by zarr-python 2.18's *experimental* v3 API, the only
writer of sharding-storage-transformer-v1 data in the wild besides
acquire-driver-zarr. The tests never need zarr 2.18; only this script does::

    python3 -m venv /tmp/zarr2
    /tmp/zarr2/bin/pip install 'zarr==2.18.*' numcodecs numpy pytest
    /tmp/zarr2/bin/python tests/data/make_legacy_v3.py

Each fixture is a directory store ``<name>/`` plus one ``<name>__<path>.npy``
per array (``/`` in the path spelled ``__``) holding the values zarr 2.18
reads back, so the tests compare against zarr 2.18's own view of the data.

(pytest is needed because zarr 2.18 decodes storage transformers by importing
``zarr.tests.test_storage_v3``.)
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# Both switches are read at import time by zarr 2.18, so set them first.
os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"

import numpy as np  # noqa: E402
import zarr  # noqa: E402
from numcodecs import GZip, Zlib, Zstd  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer  # noqa: E402

OUT = Path(__file__).resolve().parent / "legacy_v3"


def sharding(*chunks_per_shard: int) -> list[ShardingStorageTransformer]:
    return [ShardingStorageTransformer("indexed", chunks_per_shard=chunks_per_shard)]


def create(store: DirectoryStoreV3, path: str, **kwargs: object) -> zarr.Array:
    # zarr.open_array silently drops storage_transformers; zarr.create honours them.
    return zarr.create(store=store, path=path, zarr_version=3, overwrite=True, **kwargs)


def new_store(name: str) -> DirectoryStoreV3:
    path = OUT / name
    if path.exists():
        shutil.rmtree(path)
    return DirectoryStoreV3(str(path))


def save_expected(name: str, store: DirectoryStoreV3, path: str) -> None:
    # Read back through zarr 2.18 itself: the fixture's truth is what the writer reads.
    a = zarr.open_array(store, mode="r", path=path, zarr_version=3)
    np.save(OUT / f"{name}__{path.replace('/', '__')}.npy", a[...])


def sharded_2d() -> None:
    """2-D uint16, blosc, separator "/", 2x3 chunks per shard, partial edge shards."""
    store = new_store("sharded_2d")
    a = create(
        store,
        "arr",
        shape=(13, 17),
        chunks=(3, 4),
        dtype="<u2",
        compressor=zarr.Blosc(cname="lz4", clevel=5, shuffle=1),
        dimension_separator="/",
        fill_value=0,
        storage_transformers=sharding(2, 3),
    )
    a[...] = np.arange(13 * 17, dtype="<u2").reshape(13, 17) * 3
    a.attrs["description"] = "sharded 2-D"
    save_expected("sharded_2d", store, "arr")


def sharded_3d() -> None:
    """3-D float32, zlib, separator ".", nested path, 2x1x2 chunks per shard."""
    store = new_store("sharded_3d")
    a = create(
        store,
        "volumes/vol",
        shape=(5, 4, 6),
        chunks=(2, 3, 2),
        dtype="<f4",
        compressor=Zlib(level=3),
        dimension_separator=".",
        fill_value=-1.5,
        storage_transformers=sharding(2, 1, 2),
    )
    a[...] = np.linspace(0, 1, 5 * 4 * 6, dtype="<f4").reshape(5, 4, 6)
    save_expected("sharded_3d", store, "volumes/vol")


def unsharded() -> None:
    """Plain chunks (no transformer), int32, zstd, separator "/"."""
    store = new_store("unsharded")
    a = create(
        store,
        "plain",
        shape=(7, 9),
        chunks=(4, 4),
        dtype="<i4",
        compressor=Zstd(level=1),
        dimension_separator="/",
        fill_value=-1,
    )
    a[...] = np.arange(63, dtype="<i4").reshape(7, 9) - 30
    save_expected("unsharded", store, "plain")


def hierarchy() -> None:
    """Root group + attributes, explicit and implicit subgroups, F-order and bool arrays."""
    store = new_store("hierarchy")
    root = zarr.group(store, path="/", zarr_version=3)
    root.attrs.update({"title": "legacy hierarchy", "version": 1})
    g = root.create_group("group1")
    g.attrs["kind"] = "explicit group"
    a = g.create_dataset(
        "fortran",
        shape=(5, 6),
        chunks=(2, 4),
        dtype="<i2",
        order="F",
        compressor=GZip(level=5),
        fill_value=0,
        dimension_separator="/",
    )
    a[...] = np.arange(30, dtype="<i2").reshape(5, 6) * 7
    a.attrs["units"] = "counts"
    # "group1/implicit" is never created: a pre-release v3 implicit group.
    b = create(
        store,
        "group1/implicit/mask",
        shape=(10,),
        chunks=(4,),
        dtype=bool,
        compressor=None,
        fill_value=False,
        dimension_separator="/",
    )
    b[...] = np.arange(10) % 3 == 0
    save_expected("hierarchy", store, "group1/fortran")
    save_expected("hierarchy", store, "group1/implicit/mask")


def empty_chunks() -> None:
    """Sharded, with chunks missing from a shard and a shard missing entirely."""
    store = new_store("empty_chunks")
    a = create(
        store,
        "sparse",
        shape=(8, 8),
        chunks=(2, 2),
        dtype="<u1",
        compressor=None,
        fill_value=7,
        dimension_separator="/",
        storage_transformers=sharding(2, 2),
        write_empty_chunks=False,
    )
    a[0:2, 0:2] = 1  # shard (0, 0): only chunk (0, 0) present
    a[3, 5] = 9  # shard (0, 1): only chunk (1, 2) present
    a[6:8, 0:4] = np.arange(8, dtype="u1").reshape(2, 4)  # shard (1, 0): chunks (3, 0), (3, 1)
    # shard (1, 1) never written
    save_expected("empty_chunks", store, "sparse")


def big_endian() -> None:
    """Big-endian dtypes: sharded >u2 and unsharded >f8, both zlib/uncompressed."""
    store = new_store("big_endian")
    a = create(
        store,
        "be_u2",
        shape=(6, 5),
        chunks=(2, 2),
        dtype=">u2",
        compressor=None,
        fill_value=0,
        dimension_separator="/",
        storage_transformers=sharding(2, 2),
    )
    a[...] = (np.arange(30).reshape(6, 5) * 1000 + 1).astype(">u2")
    b = create(
        store,
        "be_f8",
        shape=(9,),
        chunks=(4,),
        dtype=">f8",
        compressor=Zlib(level=1),
        fill_value=float("nan"),
        dimension_separator=".",
    )
    b[:7] = np.arange(7, dtype=">f8") / 4
    save_expected("big_endian", store, "be_u2")
    save_expected("big_endian", store, "be_f8")


def acquire_style() -> None:
    """Written by hand the way acquire-driver-zarr's pre-release v3 writer does
    (src/driver/writers/zarrv3.array.writer.cpp, czar.v3.cpp): data_type in
    today's spelling ("uint16", native little-endian bytes), blosc via numcodecs,
    root group attributes under "acquire", array "0", shards data/root/0/c<t>/<z>/<y>/<x>."""
    import json

    import numcodecs

    root = OUT / "acquire_style"
    if root.exists():
        shutil.rmtree(root)
    shape, chunks, cps = (3, 1, 12, 10), (2, 1, 4, 5), (1, 1, 2, 2)
    values = (np.arange(np.prod(shape)).reshape(shape) * 11 % 65536).astype("<u2")
    blosc = numcodecs.Blosc(cname="zstd", clevel=1, shuffle=1)

    def write(rel: str, data: bytes | str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    write(
        "zarr.json",
        json.dumps(
            {
                "extensions": [],
                "metadata_encoding": "https://purl.org/zarr/spec/protocol/core/3.0",
                "metadata_key_suffix": ".json",
                "zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0",
            },
            indent=4,
        ),
    )
    write(
        "meta/root.group.json", json.dumps({"attributes": {"acquire": {"camera": "sim"}}}, indent=4)
    )
    write(
        "meta/root/0.array.json",
        json.dumps(
            {
                "attributes": {},
                "chunk_grid": {"chunk_shape": list(chunks), "separator": "/", "type": "regular"},
                "chunk_memory_layout": "C",
                "data_type": "uint16",
                "extensions": [],
                "fill_value": 0,
                "shape": list(shape),
                "compressor": {
                    "codec": "https://purl.org/zarr/spec/codec/blosc/1.0",
                    "configuration": {"blocksize": 0, "clevel": 1, "cname": "zstd", "shuffle": 1},
                },
                "storage_transformers": [
                    {
                        "type": "indexed",
                        "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
                        "configuration": {"chunks_per_shard": list(cps)},
                    }
                ],
            },
            indent=4,
        ),
    )
    grid = [-(-s // c) for s, c in zip(shape, chunks, strict=True)]
    shard_grid = [-(-g // p) for g, p in zip(grid, cps, strict=True)]
    for shard in np.ndindex(*shard_grid):
        body, index = b"", np.full((*cps, 2), 2**64 - 1, dtype="<u8")
        for local in np.ndindex(*cps):
            chunk = [s * p + q for s, p, q in zip(shard, cps, local, strict=True)]
            if any(c >= g for c, g in zip(chunk, grid, strict=True)):
                continue  # outside the array: index entry stays empty
            block = np.zeros(chunks, dtype="<u2")  # edge chunks are written full-size
            sel = tuple(
                slice(c * n, min((c + 1) * n, s))
                for c, n, s in zip(chunk, chunks, shape, strict=True)
            )
            block[tuple(slice(0, x.stop - x.start) for x in sel)] = values[sel]
            encoded = blosc.encode(block.tobytes())
            index[local] = (len(body), len(encoded))
            body += encoded
        write("data/root/0/c" + "/".join(map(str, shard)), body + index.tobytes())
    np.save(OUT / "acquire_style__0.npy", values)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for npy in OUT.glob("*.npy"):
        npy.unlink()
    for make in (
        sharded_2d,
        sharded_3d,
        unsharded,
        hierarchy,
        empty_chunks,
        big_endian,
        acquire_style,
    ):
        make()
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"zarr {zarr.__version__}: wrote {OUT} ({total} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
