"""Pre-release v3 stores (zarr-python 2.18's experimental API) through zfuse.ext.legacy_v3.

Fixtures in tests/data/legacy_v3/ were written by zarr 2.18 itself
(tests/data/make_legacy_v3.py); the .npy files hold what zarr 2.18 reads back.
Sharded fixtures are checked twice: through zfuse.open_array (needs the
sharding-v1 transformer) and, independently of zfuse's transformer, by
unpacking the shards presented by LegacyV3Store with numpy.

Set ZFUSE_ZARR2_PYTHON to a Python with zarr 2.18 installed to also have
zarr 2.18 read back what was written through the wrapper.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore, StorePath

from zfuse.errors import MetadataError
from zfuse.ext.legacy_v3 import LegacyV3Store, wrap_if_legacy
from zfuse.ext.legacy_v3_metadata import SHARDING_V1_URL

pytestmark = pytest.mark.filterwarnings(
    "ignore:Numcodecs codecs are not in the Zarr version 3 specification"
)

DATA = Path(__file__).parent / "data" / "legacy_v3"
PROTO = default_buffer_prototype()
EMPTY = 2**64 - 1

# (fixture directory, array path, sharded?)
ARRAYS = [
    ("sharded_2d", "arr", True),
    ("sharded_3d", "volumes/vol", True),
    ("unsharded", "plain", False),
    ("hierarchy", "group1/fortran", False),
    ("hierarchy", "group1/implicit/mask", False),
    ("empty_chunks", "sparse", True),
    ("big_endian", "be_u2", True),
    ("big_endian", "be_f8", False),
    ("acquire_style", "0", True),  # hand-made like acquire-driver-zarr, see make_legacy_v3.py
]
UNSHARDED = [(f, p) for f, p, sharded in ARRAYS if not sharded]
SHARDED = [(f, p) for f, p, sharded in ARRAYS if sharded]


def expected(fixture: str, path: str) -> np.ndarray:
    return np.load(DATA / f"{fixture}__{path.replace('/', '__')}.npy")


def wrap(root: Path, read_only: bool = True) -> LegacyV3Store:
    store = sync(wrap_if_legacy(LocalStore(root, read_only=read_only)))
    assert isinstance(store, LegacyV3Store)
    return store


def get(store: Any, key: str, byte_range: Any = None) -> bytes | None:
    buf = sync(store.get(key, PROTO, byte_range))
    return None if buf is None else buf.to_bytes()


def put(store: Any, key: str, data: bytes) -> None:
    sync(store.set(key, PROTO.buffer.from_bytes(data)))


def listing(store: Any, prefix: str, how: str = "dir") -> set[str]:
    async def collect() -> set[str]:
        it = store.list_dir(prefix) if how == "dir" else store.list_prefix(prefix)
        return {k async for k in it}

    return sync(collect())


def copy_fixture(fixture: str, tmp_path: Path) -> Path:
    dst = tmp_path / fixture
    shutil.copytree(DATA / fixture, dst)
    return dst


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def legacy_doc(root: Path, path: str, kind: str = "array") -> dict[str, Any]:
    return json.loads((root / "meta" / "root" / f"{path}.{kind}.json").read_text())


def unshard(store: LegacyV3Store, path: str) -> zarr.Array:
    """Read a sharding-v1 array by hand: parse every presented shard's index with numpy,
    put each chunk at its chunk key in a MemoryStore, open that with plain zarr."""
    meta = json.loads(get(store, f"{path}/zarr.json") or b"")
    (transformer,) = meta.pop("storage_transformers")
    assert transformer["name"] == SHARDING_V1_URL and transformer["type"] == "indexed"
    cps = transformer["configuration"]["chunks_per_shard"]
    n = math.prod(cps)
    sep = meta["chunk_key_encoding"]["configuration"]["separator"]
    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    grid = [math.ceil(s / c) for s, c in zip(meta["shape"], chunks, strict=True)]
    shard_grid = [math.ceil(g / p) for g, p in zip(grid, cps, strict=True)]
    mem = MemoryStore()
    put(mem, "zarr.json", json.dumps(meta).encode())
    for shard in itertools.product(*map(range, shard_grid)):
        data = get(store, f"{path}/c{sep}" + sep.join(map(str, shard)))
        if data is None:
            continue
        index = np.frombuffer(data[-16 * n :], "<u8").reshape(*cps, 2)
        for local in itertools.product(*map(range, cps)):
            offset, nbytes = (int(v) for v in index[local])
            if (offset, nbytes) == (EMPTY, EMPTY):
                continue
            assert offset + nbytes <= len(data) - 16 * n
            coords = [s * p + q for s, p, q in zip(shard, cps, local, strict=True)]
            put(mem, "c" + sep + sep.join(map(str, coords)), data[offset : offset + nbytes])
    return zarr.open_array(mem, mode="r")


# ---------------------------------------------------------------------------
# detection
# ---------------------------------------------------------------------------


def test_wrap_if_legacy_passes_other_stores_through(tmp_path: Path) -> None:
    empty = LocalStore(tmp_path / "empty")
    assert sync(wrap_if_legacy(empty)) is empty
    modern = LocalStore(tmp_path / "modern")
    zarr.create_array(modern, shape=(2,), dtype="u1")
    assert sync(wrap_if_legacy(modern)) is modern
    legacy = wrap(DATA / "unsharded")
    assert sync(wrap_if_legacy(legacy)) is legacy


def test_unknown_entry_point_encoding_is_refused(tmp_path: Path) -> None:
    root = copy_fixture("unsharded", tmp_path)
    entry = json.loads((root / "zarr.json").read_text())
    entry["metadata_encoding"] = "https://example.org/other-encoding"
    (root / "zarr.json").write_text(json.dumps(entry))
    with pytest.raises(MetadataError, match="metadata_encoding"):
        sync(wrap_if_legacy(LocalStore(root)))


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("fixture", "path"), UNSHARDED)
def test_read_unsharded_through_wrapper(fixture: str, path: str) -> None:
    a = zarr.open_array(StorePath(wrap(DATA / fixture), path), mode="r")
    want = expected(fixture, path)
    assert a.shape == want.shape and a.dtype == want.dtype.newbyteorder("=")
    np.testing.assert_array_equal(a[...], want)


@pytest.mark.parametrize(("fixture", "path"), SHARDED)
def test_read_sharded_by_unpacking_presented_shards(fixture: str, path: str) -> None:
    np.testing.assert_array_equal(unshard(wrap(DATA / fixture), path)[...], expected(fixture, path))


@pytest.mark.parametrize(("fixture", "path", "sharded"), ARRAYS)
def test_read_with_zfuse_open_array(fixture: str, path: str, sharded: bool) -> None:
    import zfuse

    a = zfuse.open_array(str(DATA / fixture), mode="r", path=path)
    np.testing.assert_array_equal(a[...], expected(fixture, path))
    np.testing.assert_array_equal(a[1:, ...][::2], expected(fixture, path)[1:, ...][::2])


def test_presented_array_metadata() -> None:
    store = wrap(DATA / "sharded_2d")
    meta = json.loads(get(store, "arr/zarr.json") or b"")
    assert meta == {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [13, 17],
        "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {
                "name": "blosc",
                "configuration": {
                    "cname": "lz4",
                    "clevel": 5,
                    "shuffle": "shuffle",
                    "typesize": 2,
                    "blocksize": 0,
                },
            },
        ],
        "attributes": {"description": "sharded 2-D"},
        "storage_transformers": [
            {
                "name": SHARDING_V1_URL,
                "type": "indexed",
                "configuration": {"chunks_per_shard": [2, 3]},
            }
        ],
    }
    fortran = json.loads(get(wrap(DATA / "hierarchy"), "group1/fortran/zarr.json") or b"")
    assert fortran["codecs"] == [
        {"name": "transpose", "configuration": {"order": [1, 0]}},
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "gzip", "configuration": {"level": 5}},
    ]
    be = wrap(DATA / "big_endian")
    be_f8 = json.loads(get(be, "be_f8/zarr.json") or b"")
    assert be_f8["data_type"] == "float64" and be_f8["fill_value"] == "NaN"
    assert be_f8["codecs"][0] == {"name": "bytes", "configuration": {"endian": "big"}}
    assert be_f8["chunk_key_encoding"]["configuration"]["separator"] == "."


def test_groups_explicit_and_implicit() -> None:
    store = wrap(DATA / "hierarchy")
    root = zarr.open_group(StorePath(store, ""), mode="r")
    assert root.attrs.asdict() == {"title": "legacy hierarchy", "version": 1}
    assert root["group1"].attrs.asdict() == {"kind": "explicit group"}
    implicit = root["group1/implicit"]
    assert isinstance(implicit, zarr.Group) and implicit.attrs.asdict() == {}
    assert root["group1/fortran"].attrs.asdict() == {"units": "counts"}
    members = {name for name, _ in root.members(max_depth=None)}
    assert members == {"group1", "group1/fortran", "group1/implicit", "group1/implicit/mask"}
    assert get(store, "nonexistent/zarr.json") is None
    # A store with arrays only still has an (implicit) root group.
    assert json.loads(get(wrap(DATA / "unsharded"), "zarr.json") or b"")["node_type"] == "group"


@pytest.mark.parametrize("spelling", ["<i4", "i4", "int32"])
def test_data_type_spellings(spelling: str, tmp_path: Path) -> None:
    """zarr 2.18 writes "<i4"; acquire-driver-zarr wrote "i4" and later "int32" (native LE)."""
    root = copy_fixture("unsharded", tmp_path)
    meta_file = root / "meta/root/plain.array.json"
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text()) | {"data_type": spelling}))
    a = zarr.open_array(StorePath(wrap(root), "plain"), mode="r")
    np.testing.assert_array_equal(a[...], expected("unsharded", "plain"))


def test_acquire_style_root_group() -> None:
    store = wrap(DATA / "acquire_style")
    root = zarr.open_group(StorePath(store, ""), mode="r")
    assert root.attrs["acquire"] == {"camera": "sim"}
    assert listing(store, "") == {"zarr.json", "0"}
    assert json.loads(get(store, "0/zarr.json") or b"")["data_type"] == "uint16"


def test_listing() -> None:
    store = wrap(DATA / "hierarchy")
    assert listing(store, "") == {"zarr.json", "group1"}
    assert listing(store, "group1") == {"zarr.json", "fortran", "implicit"}
    assert listing(store, "group1/fortran/") == {"zarr.json", "c"}
    assert listing(store, "group1/fortran/c") == {"0", "1", "2"}
    assert listing(store, "group1/fortran/c/1/") == {"0", "1"}
    assert listing(store, "group1/implicit/mask/c/", how="prefix") == {
        "group1/implicit/mask/c/0",
        "group1/implicit/mask/c/1",
        "group1/implicit/mask/c/2",
    }
    everything = listing(store, "", how="prefix")
    assert "group1/implicit/zarr.json" in everything and "group1/fortran/c/2/1" in everything
    assert len(everything) == 5 + 6 + 3  # zarr.json: root, group1, implicit, 2 arrays; chunks
    vol = wrap(DATA / "sharded_3d")
    assert listing(vol, "volumes/vol") == {"zarr.json"} | {
        f"c.{i}.{j}.{k}" for i in range(2) for j in range(2) for k in range(2)
    }
    # Missing shard (1, 1) stays missing; present shards listed by their keys.
    assert listing(wrap(DATA / "empty_chunks"), "sparse/c/", how="prefix") == {
        "sparse/c/0/0",
        "sparse/c/0/1",
        "sparse/c/1/0",
    }


def test_shard_index_of_empty_chunks_fixture() -> None:
    """zarr 2.18 wrote spec-conformant shards: index of 16-byte LE pairs at the end, empties max."""
    store = wrap(DATA / "empty_chunks")
    shard = get(store, "sparse/c/0/1") or b""
    index = np.frombuffer(shard[-64:], "<u8").reshape(2, 2, 2)
    present = [tuple(ix) for ix in itertools.product(range(2), range(2)) if index[ix][0] != EMPTY]
    assert present == [(1, 0)]  # chunk (1, 2) of the array
    assert (index[0, 0] == EMPTY).all() and (index[1, 1] == EMPTY).all()
    assert get(store, "sparse/c/1/1") is None


def test_byte_ranges_and_partial_values() -> None:
    store = wrap(DATA / "sharded_2d")
    whole = (DATA / "sharded_2d" / "data" / "root" / "arr" / "c1" / "0").read_bytes()
    assert get(store, "arr/c/1/0") == whole
    assert get(store, "arr/c/1/0", RangeByteRequest(3, 11)) == whole[3:11]
    assert get(store, "arr/c/1/0", OffsetByteRequest(len(whole) - 5)) == whole[-5:]
    assert get(store, "arr/c/1/0", SuffixByteRequest(96)) == whole[-96:]
    meta = get(store, "arr/zarr.json") or b""
    assert get(store, "arr/zarr.json", RangeByteRequest(0, 10)) == meta[:10]
    values = sync(
        store.get_partial_values(
            PROTO,
            [
                ("arr/c/1/0", SuffixByteRequest(16)),
                ("arr/zarr.json", None),
                ("arr/not-a-chunk", None),
                ("arr/c/0/0", RangeByteRequest(0, 4)),
            ],
        )
    )
    got = [None if v is None else v.to_bytes() for v in values]
    shard00 = (DATA / "sharded_2d" / "data" / "root" / "arr" / "c0" / "0").read_bytes()
    assert got == [whole[-16:], meta, None, shard00[:4]]
    assert sync(store.exists("arr/c/1/0")) and not sync(store.exists("arr/c/9/9"))
    assert sync(store.exists("arr/zarr.json")) and not sync(store.exists("arr/.zarray"))
    assert sync(store.getsize("arr/c/1/0")) == len(whole)
    # Keys in the legacy spelling are not visible through the wrapper.
    assert get(store, "data/root/arr/c1/0") is None and get(store, "arr/c1/0") is None


def test_suffix_longer_than_presented_metadata_gives_the_whole_document() -> None:
    """A presented zarr.json is built by the wrapper, so the wrapper cuts its byte
    ranges; a suffix longer than the document is the whole document, as zarr's own
    stores answer (and as TransformerStore answers for its presented documents)."""
    import zfuse

    store = wrap(DATA / "sharded_2d")
    meta = get(store, "arr/zarr.json") or b""
    assert len(meta) > 0
    assert get(store, "arr/zarr.json", SuffixByteRequest(len(meta) + 7)) == meta
    assert get(store, "arr/zarr.json", SuffixByteRequest(5)) == meta[-5:]
    assert get(store, "arr/zarr.json", SuffixByteRequest(0)) == b""
    transformed = zfuse.open_array(str(DATA / "sharded_2d"), mode="r", path="arr").store_path.store
    presented = get(transformed, "arr/zarr.json") or b""
    assert get(transformed, "arr/zarr.json", SuffixByteRequest(len(presented) + 7)) == presented


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("fixture", "path"), UNSHARDED)
def test_write_unsharded_lands_at_legacy_keys(fixture: str, path: str, tmp_path: Path) -> None:
    root = copy_fixture(fixture, tmp_path)
    before = files(root)
    a = zarr.open_array(StorePath(wrap(root, read_only=False), path), mode="r+")
    rng = np.random.default_rng(0)
    new = rng.integers(0, 100, size=a.shape).astype(a.dtype)
    a[...] = new
    after = files(root)
    # Only legacy data keys appear; nothing in today's layout is written.
    assert {f for f in after - before} <= {f for f in after if f.startswith(f"data/root/{path}/c")}
    assert not any(f.endswith("zarr.json") for f in after - {"zarr.json"})
    np.testing.assert_array_equal(zarr.open_array(StorePath(wrap(root), path))[...], new)
    # The raw legacy chunk (0, ..., 0) holds the encoded first chunk.
    sep = legacy_doc(root, path)["chunk_grid"]["separator"]
    first = f"data/root/{path}/c" + sep.join("0" * a.ndim)
    assert (root / first).read_bytes() == get(wrap(root), f"{path}/c{sep}" + sep.join("0" * a.ndim))


def test_write_shard_bytes_through_wrapper(tmp_path: Path) -> None:
    root = copy_fixture("sharded_3d", tmp_path)
    store = wrap(root, read_only=False)
    shard = (root / "data/root/volumes/vol/c1.0.1").read_bytes()
    put(store, "volumes/vol/c.0.1.0", shard)
    assert (root / "data/root/volumes/vol/c0.1.0").read_bytes() == shard
    put(store, "volumes/vol/c.1.1.1.index", b"extra part")  # a suffix is carried through
    assert (root / "data/root/volumes/vol/c1.1.1.index").read_bytes() == b"extra part"
    sync(store.delete("volumes/vol/c.1.1.1.index"))
    sync(store.delete("volumes/vol/c.0.0.0"))
    assert not (root / "data/root/volumes/vol/c0.0.0").exists()
    with pytest.raises(MetadataError, match="volumes/vol/c/0/0/0"):
        put(store, "volumes/vol/c/0/0/0", shard)  # wrong separator for this array
    with pytest.raises(MetadataError, match="stray"):
        put(store, "stray", b"x")
    assert not (root / "stray").exists() and not (root / "data/root/stray").exists()


@pytest.mark.parametrize(("fixture", "path"), SHARDED)
def test_write_sharded_with_zfuse_open_array(fixture: str, path: str, tmp_path: Path) -> None:
    import zfuse

    root = copy_fixture(fixture, tmp_path)
    before = files(root)
    a = zfuse.open_array(str(root), mode="r+", path=path)
    new = (np.arange(math.prod(a.shape)).reshape(a.shape) % 97).astype(a.dtype)
    a[...] = new
    # Only shards at legacy keys of this array appear; nothing in today's layout.
    assert all(f.startswith(f"data/root/{path}/c") for f in files(root) - before)
    np.testing.assert_array_equal(zfuse.open_array(str(root), mode="r", path=path)[...], new)
    # Independently of zfuse's transformer: the shards parse and hold the new values.
    np.testing.assert_array_equal(unshard(wrap(root), path)[...], new)
    a.attrs["written_by"] = "zfuse"
    doc = legacy_doc(root, path)
    assert doc["attributes"]["written_by"] == "zfuse"
    assert doc["storage_transformers"][0]["extension"] == SHARDING_V1_URL


def test_attribute_update_keeps_legacy_document(tmp_path: Path) -> None:
    root = copy_fixture("hierarchy", tmp_path)
    entry = (root / "zarr.json").read_bytes()
    original = legacy_doc(root, "group1/fortran")
    store = wrap(root, read_only=False)
    a = zarr.open_array(StorePath(store, "group1/fortran"), mode="r+")
    a.attrs["units"] = "photons"
    a.attrs.update({"extra": [1, 2]})
    doc = legacy_doc(root, "group1/fortran")
    assert doc == original | {"attributes": {"units": "photons", "extra": [1, 2]}}
    assert (root / "zarr.json").read_bytes() == entry  # the entry point is never rewritten
    assert not (root / "group1").exists()
    g = zarr.open_group(StorePath(store, "group1"), mode="r+")
    g.attrs["kind"] = "still explicit"
    assert legacy_doc(root, "group1", "group") == {"attributes": {"kind": "still explicit"}}
    root_group = zarr.open_group(StorePath(store, ""), mode="r+")
    root_group.attrs["version"] = 2
    assert json.loads((root / "meta" / "root.group.json").read_text())["attributes"] == {
        "title": "legacy hierarchy",
        "version": 2,
    }
    # Reopen from disk: the attributes come back through the wrapper.
    assert zarr.open_array(StorePath(wrap(root), "group1/fortran")).attrs["units"] == "photons"


def test_attribute_update_on_sharded_array_keeps_transformer(tmp_path: Path) -> None:
    """What zfuse.ext.api writes on an attribute update: today's document, transformers kept."""
    root = copy_fixture("sharded_2d", tmp_path)
    original = legacy_doc(root, "arr")
    store = wrap(root, read_only=False)
    meta = json.loads(get(store, "arr/zarr.json") or b"")
    meta["attributes"] = {"description": "changed"}
    put(store, "arr/zarr.json", json.dumps(meta).encode())
    assert legacy_doc(root, "arr") == original | {"attributes": {"description": "changed"}}
    meta["storage_transformers"][0]["name"] = "sharding"  # today's short name, same transformer
    put(store, "arr/zarr.json", json.dumps(meta).encode())
    assert legacy_doc(root, "arr") == original | {"attributes": {"description": "changed"}}


def test_resize_updates_legacy_shape(tmp_path: Path) -> None:
    root = copy_fixture("unsharded", tmp_path)
    a = zarr.open_array(StorePath(wrap(root, read_only=False), "plain"), mode="r+")
    a.resize((4, 9))
    doc = legacy_doc(root, "plain")
    assert doc["shape"] == [4, 9] and doc["compressor"]["codec"].endswith("/zstd/1.0")
    assert not files(root / "data/root/plain/c1")  # chunks outside the new shape removed
    np.testing.assert_array_equal(
        zarr.open_array(StorePath(wrap(root), "plain"))[...], expected("unsharded", "plain")[:4]
    )


def test_create_new_nodes_in_legacy_layout(tmp_path: Path) -> None:
    root = copy_fixture("hierarchy", tmp_path)
    store = wrap(root, read_only=False)
    zarr.create_group(StorePath(store, "group2"), attributes={"new": True})
    assert legacy_doc(root, "group2", "group") == {"attributes": {"new": True}}
    b = zarr.create_array(
        StorePath(store, "group2/new"),
        shape=(5, 3),
        chunks=(2, 2),
        dtype=">i4",
        fill_value=-1,
        serializer=zarr.codecs.BytesCodec(endian="big"),
        compressors=zarr.codecs.ZstdCodec(level=2),
        chunk_key_encoding={"name": "default", "separator": "."},
    )
    b[...] = np.arange(15).reshape(5, 3)
    doc = legacy_doc(root, "group2/new")
    assert doc["data_type"] == ">i4" and doc["chunk_memory_layout"] == "C"
    assert doc["chunk_grid"] == {"chunk_shape": [2, 2], "separator": ".", "type": "regular"}
    assert doc["compressor"] == {
        "codec": "https://purl.org/zarr/spec/codec/zstd/1.0",
        "configuration": {"level": 2, "checksum": False},
    }
    assert (root / "data/root/group2/new/c2.1").is_file()
    again = zarr.open_array(StorePath(wrap(root), "group2/new"))
    np.testing.assert_array_equal(again[...], np.arange(15).reshape(5, 3))
    assert zarr.open_group(StorePath(wrap(root), "")).attrs["title"] == "legacy hierarchy"


def test_delete_node(tmp_path: Path) -> None:
    root = copy_fixture("hierarchy", tmp_path)
    store = wrap(root, read_only=False)
    sync(store.delete_dir("group1/implicit"))
    assert not (root / "meta/root/group1/implicit/mask.array.json").exists()
    assert not [p for p in (root / "data").rglob("*") if p.is_file() and "implicit" in p.parts]
    assert listing(store, "group1") == {"zarr.json", "fortran"}
    assert (root / "zarr.json").exists()


# ---------------------------------------------------------------------------
# what cannot be mapped
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (
            "compressor",
            {"codec": "https://purl.org/zarr/spec/codec/snappy/1.0", "configuration": {}},
        ),
        ("data_type", "<U4"),
        ("data_type", {"extension": "TODO: bytestring array protocol URL", "type": "|S3"}),
        ("chunk_memory_layout", "K"),
        ("extensions", [{"extension": "https://example.org/x", "must_understand": True}]),
        ("attributes", {"filters": [{"id": "delta", "dtype": "<i4"}]}),
        ("chunk_grid", {"type": "rectangular", "chunk_shape": [4, 4], "separator": "/"}),
        ("chunk_grid", {"type": "regular", "chunk_shape": [4, 4], "separator": "-"}),
    ],
)
def test_unmappable_legacy_metadata_is_refused(field: str, value: Any, tmp_path: Path) -> None:
    root = copy_fixture("unsharded", tmp_path)
    meta_file = root / "meta/root/plain.array.json"
    doc = json.loads(meta_file.read_text())
    doc[field] = value
    meta_file.write_text(json.dumps(doc))
    name = {"attributes": "filters", "extensions": "must_understand"}.get(field, field)
    with pytest.raises(MetadataError, match=name) as info:
        zarr.open_array(StorePath(wrap(root), "plain"), mode="r")
    assert "plain.array.json" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("data_type", "int64"),
        ("codecs", [{"name": "bytes", "configuration": {"endian": "little"}}]),
        ("chunk_key_encoding", {"name": "v2", "configuration": {"separator": "/"}}),
        ("fill_value", 5),
        ("storage_transformers", [{"name": "https://example.org/t", "type": "x"}]),
    ],
)
def test_unrepresentable_changes_are_refused(field: str, value: Any, tmp_path: Path) -> None:
    root = copy_fixture("unsharded", tmp_path)
    before = (root / "meta/root/plain.array.json").read_bytes()
    store = wrap(root, read_only=False)
    meta = json.loads(get(store, "plain/zarr.json") or b"")
    meta[field] = value
    with pytest.raises(MetadataError, match=field):
        put(store, "plain/zarr.json", json.dumps(meta).encode())
    assert (root / "meta/root/plain.array.json").read_bytes() == before


def test_node_type_change_is_refused(tmp_path: Path) -> None:
    root = copy_fixture("hierarchy", tmp_path)
    store = wrap(root, read_only=False)
    with pytest.raises(MetadataError, match="node_type"):
        put(store, "group1/fortran/zarr.json", b'{"zarr_format": 3, "node_type": "group"}')
    array_meta = get(store, "group1/fortran/zarr.json") or b""
    with pytest.raises(MetadataError, match="node_type"):
        put(store, "group1/zarr.json", array_meta)


def test_new_array_without_legacy_form_is_refused(tmp_path: Path) -> None:
    root = copy_fixture("hierarchy", tmp_path)
    store = wrap(root, read_only=False)
    with pytest.raises(MetadataError, match="codecs"):
        zarr.create_array(
            StorePath(store, "two_compressors"),
            shape=(4,),
            dtype="u2",
            compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.GzipCodec()],
        )
    assert not (root / "meta/root/two_compressors.array.json").exists()


# ---------------------------------------------------------------------------
# zarr 2.18 itself reads what was written (optional)
# ---------------------------------------------------------------------------


@pytest.mark.skipif(
    not os.environ.get("ZFUSE_ZARR2_PYTHON"), reason="set ZFUSE_ZARR2_PYTHON to a zarr 2.18 python"
)
def test_zarr2_reads_back_what_was_written(tmp_path: Path) -> None:
    root = copy_fixture("hierarchy", tmp_path)
    store = wrap(root, read_only=False)
    a = zarr.open_array(StorePath(store, "group1/fortran"), mode="r+")
    a[...] = np.arange(30, dtype="<i2").reshape(5, 6)[::-1]
    a.attrs["units"] = "photons"
    b = zarr.create_array(
        StorePath(store, "fresh"),
        shape=(5, 3),
        chunks=(2, 2),
        dtype="<f8",
        fill_value=float("nan"),
        compressors=zarr.codecs.BloscCodec(cname="zstd", shuffle="bitshuffle"),
    )
    b[:4] = np.arange(12.0).reshape(4, 3)
    import zfuse

    sharded = copy_fixture("sharded_2d", tmp_path)
    c = zfuse.open_array(str(sharded), mode="r+", path="arr")
    c[2:9, 3:15] = 7
    c.attrs["edited"] = True
    script = textwrap.dedent(
        f"""
        import os, sys, numpy as np
        os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
        import zarr
        from zarr._storage.v3 import DirectoryStoreV3
        s = DirectoryStoreV3({str(root)!r})
        a = zarr.open_array(s, mode="r", path="group1/fortran", zarr_version=3)
        assert a.attrs["units"] == "photons", dict(a.attrs)
        np.save({str(tmp_path / "a.npy")!r}, a[...])
        np.save({str(tmp_path / "b.npy")!r}, zarr.open_array(s, mode="r", path="fresh", zarr_version=3)[...])
        os.environ["ZARR_V3_SHARDING"] = "1"
        import zarr._storage.v3_storage_transformers as t
        t.v3_sharding_available = True
        c = zarr.open_array(DirectoryStoreV3({str(sharded)!r}), mode="r", path="arr", zarr_version=3)
        assert c.attrs["edited"] is True
        np.save({str(tmp_path / "c.npy")!r}, c[...])
        """
    )
    subprocess.run([os.environ["ZFUSE_ZARR2_PYTHON"], "-c", script], check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a[...])
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), b[...])
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), c[...])
