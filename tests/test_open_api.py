"""zfuse.open_array / open_group / raw_array_metadata and the TransformerStore's Store API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore, StorePath

import zfuse
from zfuse.errors import ArgumentError, MetadataError
from zfuse.ext.api import open_array, raw_array_metadata
from zfuse.ext.transformers import TransformerStore
from zfuse.testing import snapshot

PROTO = default_buffer_prototype()
SHARD = {"name": "sharding", "type": "indexed", "configuration": {"chunks_per_shard": [2, 2]}}
SPLIT = {
    "name": "concat-parts",
    "configuration": {"parts": [{"key_suffix": ""}, {"key_suffix": ".idx", "size": 64}]},
}
STACK = [SHARD, SPLIT]
LEGACY = Path(__file__).parent / "data" / "legacy_v3"


def make(store: Any, **kw: Any) -> zarr.Array:
    kw.setdefault("mode", "w")
    return zfuse.open_array(
        store, shape=(6, 6), chunks=(2, 2), dtype="i4", storage_transformers=STACK, **kw
    )


DATA = np.arange(36, dtype="i4").reshape(6, 6) + 1


def test_returns_plain_zarr_objects_and_stored_metadata(tmp_path: Path) -> None:
    a = make(str(tmp_path / "a.zarr"))
    assert type(a) is zarr.Array
    a[...] = DATA
    doc = json.loads((tmp_path / "a.zarr/zarr.json").read_text())
    assert doc["storage_transformers"] == STACK
    assert raw_array_metadata(str(tmp_path / "a.zarr"))["storage_transformers"] == STACK
    assert raw_array_metadata(a)["storage_transformers"] == STACK
    b = zfuse.open_array(tmp_path / "a.zarr")  # pathlib.Path
    np.testing.assert_array_equal(b[...], DATA)
    # every zarr indexing mode works
    np.testing.assert_array_equal(b[::2, 1::3], DATA[::2, 1::3])
    np.testing.assert_array_equal(b.oindex[[0, 5], [1, 4]], DATA[np.ix_([0, 5], [1, 4])])
    np.testing.assert_array_equal(b.vindex[[0, 5], [1, 4]], DATA[[0, 5], [1, 4]])
    np.testing.assert_array_equal(b.get_mask_selection(DATA > 30), DATA[DATA > 30])
    assert b[5, 5] == 36
    # zarr-python alone still refuses the array (what zfuse exists for)
    with pytest.raises(ValueError, match="storage transformers"):
        zarr.open_array(str(tmp_path / "a.zarr"), mode="r")


@pytest.mark.parametrize("kind", ["str", "url", "local", "memory", "storepath"])
def test_store_forms(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "s.zarr"
    store: Any = {
        "str": str(root),
        "url": f"file://{root}",
        "local": LocalStore(root),
        "memory": MemoryStore(),
        "storepath": StorePath(LocalStore(root), "sub"),
    }[kind]
    # fsspec's local filesystem makes no parent directories unless asked
    opts = {"storage_options": {"auto_mkdir": True}} if kind == "url" else {}
    a = make(store, path="x/arr", **opts)
    a[...] = DATA
    np.testing.assert_array_equal(zfuse.open_array(store, path="x/arr", **opts)[...], DATA)
    if kind != "memory":
        prefix = "sub/x/arr" if kind == "storepath" else "x/arr"
        assert (root / prefix / "c/0/0.idx").is_file()


def test_modes(tmp_path: Path) -> None:
    root = str(tmp_path / "m.zarr")
    with pytest.raises(FileNotFoundError):
        zfuse.open_array(root, mode="r")
    a = make(root, mode="a")  # absent -> created with the transformers
    a[...] = DATA
    assert raw_array_metadata(root)["storage_transformers"] == STACK
    again = zfuse.open_array(
        root, mode="a", shape=(1,), storage_transformers=[SHARD]
    )  # exists: opened
    np.testing.assert_array_equal(again[...], DATA)
    with pytest.raises(Exception, match="already contains data"):
        make(root, mode="w-")
    r = zfuse.open_array(root, mode="r")
    with pytest.raises(ValueError, match="read-only"):
        r[0, 0] = 5
    rw = zfuse.open_array(root, mode="r+")
    rw[0, 0] = 99
    assert zfuse.open_array(root)[0, 0] == 99
    # "w" replaces the array, parts and shards included
    w = zfuse.open_array(root, mode="w", shape=(3,), chunks=(1,), dtype="u1")
    assert not raw_array_metadata(root).get("storage_transformers")
    assert sorted(snapshot(Path(root))) == ["zarr.json"]
    w[...] = [1, 2, 3]
    assert sorted(snapshot(Path(root))) == ["c/0", "c/1", "c/2", "zarr.json"]
    # an unknown mode is the caller's mistake, named as such (and still a ValueError)
    with pytest.raises(ArgumentError, match="mode must be one of"):
        zfuse.open_array(root, mode="x")
    assert issubclass(ArgumentError, ValueError)


def test_attribute_update_and_resize_keep_transformers(tmp_path: Path) -> None:
    root = tmp_path / "attrs.zarr"
    make(str(root))[...] = DATA
    a = zfuse.open_array(str(root), mode="r+")
    a.attrs["units"] = "nm"
    a.attrs.update({"more": [1, 2]})
    doc = json.loads((root / "zarr.json").read_text())
    assert doc["storage_transformers"] == STACK and doc["attributes"] == {
        "units": "nm",
        "more": [1, 2],
    }
    a.resize((4, 4))  # drops chunks outside: through the sharding layer
    doc = json.loads((root / "zarr.json").read_text())
    assert doc["storage_transformers"] == STACK and doc["shape"] == [4, 4]
    b = zfuse.open_array(str(root))
    np.testing.assert_array_equal(b[...], DATA[:4, :4])
    assert sorted(k for k in snapshot(root) if k != "zarr.json") == ["c/0/0", "c/0/0.idx"]


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")
def test_groups_and_consolidated_metadata(tmp_path: Path) -> None:
    root = tmp_path / "g.zarr"
    g = zfuse.open_group(str(root), mode="w", attributes={"title": "t"})
    make(str(root), path="grp/arr")[...] = DATA
    zarr.open_array(str(root), path="grp/plain", mode="w", shape=(2,), dtype="u1")[...] = [4, 5]
    g = zfuse.open_group(str(root), mode="r")
    assert type(g) is zarr.Group
    np.testing.assert_array_equal(g["grp/arr"][...], DATA)
    assert sorted(g["grp"].array_keys()) == ["arr", "plain"]
    # consolidated: the group's zarr.json keeps the array's transformers; reading via it works
    zarr.consolidate_metadata(TransformerStore(LocalStore(root)))
    cm = json.loads((root / "zarr.json").read_text())["consolidated_metadata"]["metadata"]
    assert cm["grp/arr"]["storage_transformers"] == STACK
    g2 = zfuse.open_group(str(root), mode="r", use_consolidated=True)
    np.testing.assert_array_equal(g2["grp/arr"][...], DATA)
    np.testing.assert_array_equal(g2["grp/plain"][...], [4, 5])


def test_legacy_store_goes_through_the_hook() -> None:
    if not (LEGACY / "sharded_2d").is_dir():
        pytest.skip("legacy fixtures absent")
    a = zfuse.open_array(str(LEGACY / "sharded_2d"), path="arr")
    expected = np.load(LEGACY / "sharded_2d__arr.npy")
    np.testing.assert_array_equal(a[...], expected)
    assert raw_array_metadata(str(LEGACY / "sharded_2d"), "arr")["storage_transformers"]


def test_unknown_transformer_refused_everywhere(tmp_path: Path) -> None:
    root = tmp_path / "u.zarr"
    make(str(root))[...] = DATA
    doc = json.loads((root / "zarr.json").read_text())
    doc["storage_transformers"].append({"name": "rot13", "configuration": {}})
    (root / "zarr.json").write_text(json.dumps(doc))
    before = snapshot(root)
    with pytest.raises(
        MetadataError, match=r"storage_transformers\[2\]: unknown storage transformer 'rot13'"
    ):
        zfuse.open_array(str(root), mode="r+")
    with pytest.raises(MetadataError, match="rot13"):
        zfuse.open_array(str(tmp_path), path="u.zarr", mode="r")
    assert snapshot(root) == before
    with pytest.raises(MetadataError, match=r"storage_transformers\[0\]: unknown .*'zip'"):
        open_array(
            str(tmp_path / "new"), mode="w", shape=(2,), storage_transformers=[{"name": "zip"}]
        )
    assert not (tmp_path / "new" / "zarr.json").exists()


# --------------------------------------------------------------------------- Store API


@pytest.fixture
def wrapped() -> TransformerStore:
    store = TransformerStore(MemoryStore())
    a = zfuse.open_array(store, mode="w", path="arr", shape=(6, 6), chunks=(2, 2), dtype="i4",
                         codecs=[{"name": "bytes"}], storage_transformers=STACK)  # fmt: skip
    a[...] = DATA
    return store


async def _list(it: Any) -> list[str]:
    return sorted([k async for k in it])


def test_store_api_on_chunk_keys(wrapped: TransformerStore) -> None:
    raw = wrapped.raw_store
    chunk = np.ascontiguousarray(DATA[2:4, 4:6]).tobytes()  # chunk (1, 2)
    got = sync(wrapped.get("arr/c/1/2", PROTO))
    assert got is not None and got.to_bytes() == chunk
    for r in (RangeByteRequest(1, 9), OffsetByteRequest(5), SuffixByteRequest(3)):
        part = sync(wrapped.get("arr/c/1/2", PROTO, r))
        assert part is not None
        start = {RangeByteRequest: 1, OffsetByteRequest: 5, SuffixByteRequest: len(chunk) - 3}[
            type(r)
        ]
        stop = 9 if isinstance(r, RangeByteRequest) else len(chunk)
        assert part.to_bytes() == chunk[start:stop]
    vals = sync(
        wrapped.get_partial_values(
            PROTO, [("arr/c/1/2", None), ("arr/c/9/9", None), ("arr/zarr.json", None)]
        )
    )
    assert vals[0] is not None and vals[0].to_bytes() == chunk and vals[1] is None
    assert vals[2] is not None and "storage_transformers" not in json.loads(vals[2].to_bytes())
    assert sync(wrapped.exists("arr/c/1/2")) and not sync(wrapped.exists("arr/c/9/9"))
    assert sync(wrapped.getsize("arr/c/1/2")) == 16
    # listing shows chunk keys, never shards or parts
    keys = sync(_list(wrapped.list()))
    assert keys == sorted(
        ["zarr.json", "arr/zarr.json"] + [f"arr/c/{i}/{j}" for i in range(3) for j in range(3)]
    )
    assert sync(_list(wrapped.list_prefix("arr/c/2/"))) == ["arr/c/2/0", "arr/c/2/1", "arr/c/2/2"]
    assert sync(_list(wrapped.list_dir("arr"))) == ["c", "zarr.json"]
    assert sync(_list(wrapped.list_dir("arr/c/1"))) == ["0", "1", "2"]
    assert sync(_list(wrapped.list_dir(""))) == ["arr", "zarr.json"]
    raw_keys = sync(_list(raw.list()))
    assert "arr/c/1/1.idx" in raw_keys and "arr/c/2/2" not in raw_keys
    # set / delete one chunk
    sync(wrapped.set("arr/c/2/2", PROTO.buffer.from_bytes(bytes(16))))
    assert sync(wrapped.get("arr/c/2/2", PROTO)).to_bytes() == bytes(16)  # type: ignore[union-attr]
    sync(wrapped.delete("arr/c/2/2"))
    assert sync(wrapped.get("arr/c/2/2", PROTO)) is None
    assert "arr/c/1/1" not in sync(_list(raw.list()))  # shard (1, 1) held only chunk (2, 2)
    # delete_dir inside the array: the chunks under it
    sync(wrapped.delete_dir("arr/c/0"))
    assert sync(_list(wrapped.list_prefix("arr/c/0/"))) == []
    assert sync(_list(wrapped.list_prefix("arr/c/1/"))) == ["arr/c/1/0", "arr/c/1/1", "arr/c/1/2"]
    # delete_dir of the array: everything
    sync(wrapped.delete_dir("arr"))
    assert sync(_list(raw.list())) == ["zarr.json"]


def test_store_api_plain_keys_pass_through(wrapped: TransformerStore) -> None:
    raw = wrapped.raw_store
    sync(wrapped.set("other/blob", PROTO.buffer.from_bytes(b"abcdef")))
    assert sync(raw.get("other/blob", PROTO)).to_bytes() == b"abcdef"  # type: ignore[union-attr]
    assert sync(wrapped.get("other/blob", PROTO, RangeByteRequest(1, 3))).to_bytes() == b"bc"  # type: ignore[union-attr]
    assert sync(wrapped.getsize("other/blob")) == 6
    assert "other/blob" in sync(_list(wrapped.list()))
    # a key inside the array's directory that is not a chunk key is not routed
    sync(wrapped.set("arr/notes.txt", PROTO.buffer.from_bytes(b"x")))
    assert sync(raw.get("arr/notes.txt", PROTO)).to_bytes() == b"x"  # type: ignore[union-attr]
    sync(wrapped.delete("other/blob"))
    assert not sync(wrapped.exists("other/blob"))
    # read-only copies share what the wrapper learnt, and refuse writes
    ro = wrapped.with_read_only(True)
    assert ro.read_only and sync(ro.get("arr/c/0/0", PROTO)) is not None
    with pytest.raises(ValueError, match="read-only"):
        sync(ro.set("arr/c/0/0", PROTO.buffer.from_bytes(bytes(16))))
    assert wrapped == TransformerStore(raw)


def test_writing_metadata_with_bad_transformers_changes_nothing(wrapped: TransformerStore) -> None:
    before = sync(wrapped.raw_store.get("arr/zarr.json", PROTO)).to_bytes()  # type: ignore[union-attr]
    doc = json.loads(before)
    doc["storage_transformers"] = [
        {"name": "sharding", "type": "indexed", "configuration": {"chunks_per_shard": [2]}}
    ]
    with pytest.raises(MetadataError, match=r"chunks_per_shard: has 1 entries but the array has 2"):
        sync(wrapped.set("arr/zarr.json", PROTO.buffer.from_bytes(json.dumps(doc).encode())))
    assert sync(wrapped.raw_store.get("arr/zarr.json", PROTO)).to_bytes() == before  # type: ignore[union-attr]
