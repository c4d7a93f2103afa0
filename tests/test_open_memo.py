"""OpenMemo with plain calls: while a source is opened its metadata documents are read
once; afterwards every read reaches the store (a reload sees the store as it is)."""

from __future__ import annotations

from typing import Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore, WrapperStore

from zfuse.ext.open_memo import OpenMemo

PROTO = default_buffer_prototype()


class Counting(WrapperStore[MemoryStore]):
    """A real MemoryStore, counting the reads that reach it."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.reads: list[str] = []

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.reads.append(key)
        return await self._store.get(key, prototype, byte_range)


def put(store: Any, key: str, data: bytes) -> None:
    sync(store.set(key, PROTO.buffer.from_bytes(data)))


def get(store: Any, key: str, byte_range: Any = None) -> bytes | None:
    buf = sync(store.get(key, PROTO, byte_range))
    return None if buf is None else buf.to_bytes()


def test_documents_are_read_once_while_opening_and_data_always() -> None:
    inner = Counting(MemoryStore())
    put(inner, "zarr.json", b'{"a": 1}')
    put(inner, "c/0", b"chunk")
    memo = OpenMemo(inner)
    assert [get(memo, "zarr.json") for _ in range(4)] == [b'{"a": 1}'] * 4
    assert [get(memo, ".zarray") for _ in range(2)] == [None, None]  # "not there" is remembered too
    assert not sync(memo.exists(".zarray")) and sync(memo.exists("zarr.json"))
    assert get(memo, "c/0") == get(memo, "c/0") == b"chunk"  # chunk data: never memoised
    assert inner.reads == ["zarr.json", ".zarray", "c/0", "c/0"]


def test_a_write_drops_the_document_and_closing_ends_the_memo() -> None:
    inner = Counting(MemoryStore())
    put(inner, "a/zarr.json", b"old")
    memo = OpenMemo(inner)
    assert get(memo, "a/zarr.json") == b"old"
    put(memo, "a/zarr.json", b"new")  # written through it: never the old document again
    assert get(memo, "a/zarr.json") == b"new"
    memo.close_memo()
    put(inner, "a/zarr.json", b"changed behind its back")
    assert get(memo, "a/zarr.json") == b"changed behind its back"  # opened: the store as it is
    reads = len(inner.reads)
    get(memo, "a/zarr.json")
    assert len(inner.reads) == reads + 1


def test_a_read_only_twin_shares_the_memo() -> None:
    inner = Counting(MemoryStore())
    put(inner, "zarr.json", b"{}")
    memo = OpenMemo(inner)
    get(memo, "zarr.json")
    twin = memo.with_read_only(True)
    assert isinstance(twin, OpenMemo) and get(twin, "zarr.json") == b"{}"
    assert inner.reads == ["zarr.json"]
