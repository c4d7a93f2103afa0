"""zfuse's stores pass zarr-python's own store test suite (`zarr.testing.store.StoreTests`).

AtomicLocalStore (temporary file + rename, optional fdatasync, scandir listings)
in both durabilities must be a real zarr Store, not one that only works for
the paths zfuse happens to use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from zarr.core.buffer import Buffer, cpu
from zarr.testing.store import StoreTests

from zfuse.store import AtomicLocalStore

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
