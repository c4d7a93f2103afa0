"""zfuse's stores pass zarr-python's own store test suite (`zarr.testing.store.StoreTests`).

AtomicLocalStore (temporary file + rename, optional fdatasync, scandir listings)
in both durabilities, the metering wrapper every mount uses (MeteredStore), the
storage-transformer wrapper (TransformerStore) and the pre-release v3 layout
(LegacyV3Store) must be real zarr Stores, not ones that only work for the paths
zfuse happens to use. The SupportsGetSync/SetSync/DeleteSync cases are skipped
by zarr itself for stores without those optional protocols.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.storage import LocalStore
from zarr.testing.store import StoreTests

from zfuse.ext.legacy_v3 import LegacyV3Store
from zfuse.ext.legacy_v3_metadata import LEGACY_FORMAT_URL
from zfuse.ext.transformers import TransformerStore
from zfuse.local_store import AtomicLocalStore
from zfuse.stats import Stats
from zfuse.store import MeteredStore

pytest.importorskip("pytest_asyncio")


class _LocalFiles:
    """Reads and writes behind the store's back, as zarr's own LocalStore tests do."""

    buffer_cls = cpu.Buffer

    @staticmethod
    def _root(store: Any) -> Path:
        return Path(store.root)

    async def get(self, store: Any, key: str) -> Buffer:
        return self.buffer_cls.from_bytes((self._root(store) / key).read_bytes())

    async def set(self, store: Any, key: str, value: Buffer) -> None:
        path = self._root(store) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value.to_bytes())

    def test_store_supports_writes(self, store: Any) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: Any) -> None:
        assert store.supports_listing


class TestAtomicLocalStore(_LocalFiles, StoreTests[AtomicLocalStore, cpu.Buffer]):
    store_cls = AtomicLocalStore

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"root": str(tmp_path)}

    def test_store_repr(self, store: AtomicLocalStore) -> None:
        assert str(store) == f"file://{Path(store.root).as_posix()}"


class TestAtomicLocalStoreProcessDurability(TestAtomicLocalStore):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"root": str(tmp_path), "durable": False}


class TestTransformerStore(_LocalFiles, StoreTests[TransformerStore, cpu.Buffer]):
    """The storage-transformer wrapper over a local store: with no transformed array in
    it, every key and byte must pass through as zarr's own stores answer."""

    store_cls = TransformerStore

    @staticmethod
    def _root(store: Any) -> Path:
        return Path(store.raw_store.root)

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"store": LocalStore(str(tmp_path))}

    @pytest.fixture
    def open_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"store_cls": LocalStore, "root": str(tmp_path)}

    def test_store_repr(self, store: TransformerStore) -> None:
        assert repr(store) == f"TransformerStore({store.raw_store!r})"


class TestMeteredStore(_LocalFiles, StoreTests[MeteredStore, cpu.Buffer]):
    """The mount's metering wrapper must stay a faithful zarr Store (it wraps every mount's store)."""

    store_cls = MeteredStore

    @staticmethod
    def _root(store: Any) -> Path:
        return Path(store._store.root)

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"store": AtomicLocalStore(str(tmp_path))}

    @pytest.fixture
    def open_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"store_cls": AtomicLocalStore, "root": str(tmp_path)}

    def test_store_repr(self, store: MeteredStore) -> None:
        assert str(store) == f"wrapping-file://{Path(store._store.root).as_posix()}"

    async def test_open_and_pickle_keep_stats_and_timeout(self, tmp_path: Path) -> None:
        stats = Stats()
        store = await MeteredStore.open(AtomicLocalStore, str(tmp_path), stats=stats, timeout=5.0)
        assert store.stats is stats and store.timeout == 5.0 and store._is_open
        await store.set("c/0", cpu.Buffer.from_bytes(b"1234"))
        stats.gauge("cache_bytes", lambda: 7)  # a live reader: stays with this process
        copy = pickle.loads(pickle.dumps(store))
        assert copy == store and copy.timeout == 5.0
        assert copy.stats.snapshot()["store_bytes_written"] == 4
        assert "cache_bytes" not in copy.stats.snapshot()
        await copy.set("c/1", cpu.Buffer.from_bytes(b"56"))  # the recreated lock works
        assert copy.stats.snapshot()["store_bytes_written"] == 6
        assert stats.snapshot()["store_bytes_written"] == 4  # the copy counts on its own


# The pre-release v3 layout has a place only for zarr.json documents and chunk keys of
# its arrays. The fixture hierarchy has an array at the root and one at "foo", so
# StoreTests' "c/0" and "foo/c/..." keys are chunk keys; values are written behind the
# store's back at their legacy keys ("c/0" -> data/root/c0).
_LEGACY_ARRAYS = ("", "foo")


def _legacy_key(key: str) -> str:
    segments = key.split("/")
    for i, seg in enumerate(segments):
        path = "/".join(segments[:i])
        if seg == "c" and path in _LEGACY_ARRAYS and i + 1 < len(segments):
            head = f"data/root/{path}/" if path else "data/root/"
            return head + "c" + "/".join(segments[i + 1 :])
    raise KeyError(f"{key!r} has no place in the legacy layout")


def _legacy_array(shape: list[int]) -> dict[str, Any]:
    return {
        "shape": shape,
        "data_type": "<u2",
        "chunk_grid": {"type": "regular", "chunk_shape": [1] * len(shape), "separator": "/"},
        "chunk_memory_layout": "C",
        "fill_value": 0,
        "extensions": [],
        "attributes": {},
    }


class TestLegacyV3Store(StoreTests[LegacyV3Store, cpu.Buffer]):
    store_cls = LegacyV3Store
    buffer_cls = cpu.Buffer

    @staticmethod
    def _root(store: Any) -> Path:
        return Path(store._store.root)

    async def get(self, store: Any, key: str) -> Buffer:
        return self.buffer_cls.from_bytes((self._root(store) / _legacy_key(key)).read_bytes())

    async def set(self, store: Any, key: str, value: Buffer) -> None:
        path = self._root(store) / _legacy_key(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value.to_bytes())

    @pytest.fixture
    def legacy_root(self, tmp_path: Path) -> Path:
        entry = {"zarr_format": LEGACY_FORMAT_URL, "metadata_encoding": LEGACY_FORMAT_URL,
                 "metadata_key_suffix": ".json", "extensions": []}
        (tmp_path / "zarr.json").write_text(json.dumps(entry))
        (tmp_path / "meta" / "root").mkdir(parents=True)
        (tmp_path / "meta" / "root.array.json").write_text(json.dumps(_legacy_array([100])))
        (tmp_path / "meta" / "root" / "foo.array.json").write_text(json.dumps(_legacy_array([100])))
        return tmp_path

    @pytest.fixture
    def store_kwargs(self, legacy_root: Path) -> dict[str, Any]:
        return {"store": LocalStore(str(legacy_root))}

    @pytest.fixture
    def open_kwargs(self, legacy_root: Path) -> dict[str, Any]:
        return {"store_cls": LocalStore, "root": str(legacy_root)}

    def test_store_repr(self, store: LegacyV3Store) -> None:
        assert repr(store) == f"LegacyV3Store({store._store!r})"

    def test_store_supports_writes(self, store: LegacyV3Store) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: LegacyV3Store) -> None:
        assert store.supports_listing

    # -- cases rewritten with keys that have a place in the legacy layout ------------

    @pytest.fixture(autouse=True)
    def _key_with_a_place(self, request: pytest.FixtureRequest) -> None:
        callspec = getattr(request.node, "callspec", None)
        key = callspec.params.get("key") if callspec is not None else None
        if key == "foo/0/0":
            pytest.skip(f"{key!r}: {_NO_PLACE}")
        if key == "zarr.json":
            pytest.skip("its arbitrary bytes are no v3 document, the only thing a zarr.json holds here")

    async def test_serializable_store(self, store: LegacyV3Store) -> None:
        new_store = pickle.loads(pickle.dumps(store))
        assert new_store == store and new_store.read_only == store.read_only
        await new_store.set("c/3", cpu.Buffer.from_bytes(b"\x01\x02\x03\x04"))
        assert (await store.get("c/3", default_buffer_prototype())).to_bytes() == b"\x01\x02\x03\x04"

    async def test_with_read_only_store(self, open_kwargs: dict[str, Any]) -> None:
        store = await LegacyV3Store.open(**{**open_kwargs, "read_only": True})
        data = cpu.Buffer.from_bytes(b"bar")
        with pytest.raises(ValueError, match="read-only mode"):
            await store.set("c/1", data)
        writer = store.with_read_only(read_only=False)
        assert not writer._is_open and not writer.read_only
        await writer.set("c/1", data)
        await writer.delete("c/1")
        for reader in (store, store.with_read_only(read_only=True)):
            with pytest.raises(ValueError, match="read-only mode"):
                await reader.set("c/1", data)
            with pytest.raises(ValueError, match="read-only mode"):
                await reader.delete("c/1")

    async def test_exists(self, store: LegacyV3Store) -> None:
        assert not await store.exists("c/4") and await store.exists("foo/zarr.json")
        await store.set("c/4", cpu.Buffer.from_bytes(b"bar"))
        assert await store.exists("c/4") and not await store.exists("bar/zarr.json")

    async def test_delete(self, store: LegacyV3Store) -> None:
        await store.set("foo/c/2", cpu.Buffer.from_bytes(b"bar"))
        assert await store.exists("foo/c/2")
        await store.delete("foo/c/2")
        assert not await store.exists("foo/c/2")

    async def test_set_if_not_exists(self, store: LegacyV3Store) -> None:
        await self.set(store, "c/1", cpu.Buffer.from_bytes(b"0000"))
        new = cpu.Buffer.from_bytes(b"1111")
        await store.set_if_not_exists("c/1", new)
        assert (await store.get("c/1", default_buffer_prototype())).to_bytes() == b"0000"
        await store.set_if_not_exists("c/2", new)
        assert (await store.get("c/2", default_buffer_prototype())).to_bytes() == b"1111"

    async def test_get_many(self, store: LegacyV3Store) -> None:
        keys = [f"c/{i}" for i in range(10)]
        for k in keys:
            await self.set(store, k, cpu.Buffer.from_bytes(k.encode()))
        got = [(k, v.to_bytes() if v is not None else None) async for k, v in store._get_many(
            [(k, default_buffer_prototype(), None) for k in keys])]
        assert sorted(got) == sorted((k, k.encode()) for k in keys)

    # -- cases with no legacy equivalent ---------------------------------------------

    def _no_place(self) -> None:
        pytest.skip(_NO_PLACE)

    async def test_get_partial_values(self, *args: Any, **kwargs: Any) -> None:
        self._no_place()  # its keys ("zarr.json", "c/0/0") are no chunk keys of the rank-1 fixture arrays

    async def test_set_many(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes b"zarr.json" as a zarr.json document, which must be a v3 document here

    async def test_delete_dir(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes zarr.json documents that are not JSON

    async def test_is_empty(self, store: LegacyV3Store) -> None:
        self._no_place()  # a legacy hierarchy always holds its root node

    async def test_clear(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes key "key"; clear keeps the entry point, so the store is never empty

    async def test_list(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes zarr.json documents that are not JSON

    async def test_list_prefix(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes keys "a/b/c/zarr.json" with non-JSON values

    async def test_list_empty_path(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes keys "foo/bar/..." that are neither documents nor chunks

    async def test_list_dir(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes "foo/bar/foobar_first_child" and non-JSON documents

    async def test_get_bytes(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes key "zarr.json" as raw bytes

    def test_get_bytes_sync(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes key "zarr.json" as raw bytes

    async def test_get_json(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes an arbitrary JSON value as a zarr.json document

    def test_get_json_sync(self, store: LegacyV3Store) -> None:
        self._no_place()  # writes an arbitrary JSON value as a zarr.json document


_NO_PLACE = "no place in the pre-release v3 layout (only zarr.json documents and chunk keys of its arrays)"
