"""Metadata documents read once while a remote source is opened: `OpenMemo`.

Opening a source reads its root's metadata several times over: the pre-release
layout detection, zfuse's own check of what the root is, the transformer
check, and zarr-python's open each read `zarr.json` (and zarr-python, not told
the format, probes `.zarray` and `.zattrs` too). On a local directory that is
four small file reads; on a remote store it is four round trips before the
mount is live. While `open` is on, a metadata document's first read (found or
not) answers every later one; after `close` the memo is empty and every read
goes to the store again, so a reload or a metadata refresh sees the store as
it is. A write or delete of a document drops its memo. Chunk data (any other
key, any ranged read) always goes through.
"""

from __future__ import annotations

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from zfuse.ext.chunk_keys import METADATA_NAMES


def _is_metadata(key: str) -> bool:
    return key.rpartition("/")[2] in METADATA_NAMES


class OpenMemo(WrapperStore[Store]):
    """A store whose metadata documents are read once while it is being opened."""

    def __init__(self, store: Store, memo: dict[str, Buffer | None] | None = None) -> None:
        super().__init__(store)
        self._memo: dict[str, Buffer | None] | None = {} if memo is None else memo

    def _with_store(self, store: Store) -> OpenMemo:
        return type(self)(store, self._memo)  # (a read-only twin shares the memo)

    def close_memo(self) -> None:
        """The source is open: every read goes to the store from now on."""
        if self._memo is not None:
            self._memo.clear()
        self._memo = None

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        memo = self._memo
        if memo is None or byte_range is not None or not _is_metadata(key):
            return await self._store.get(key, prototype, byte_range)
        if key in memo:
            return memo[key]
        buf = await self._store.get(key, prototype, byte_range)
        if self._memo is memo:
            memo[key] = buf
        return buf

    async def exists(self, key: str) -> bool:
        memo = self._memo
        if memo is not None and key in memo:
            return memo[key] is not None
        return await self._store.exists(key)

    async def set(self, key: str, value: Buffer) -> None:
        self._forget(key)
        await self._store.set(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        self._forget(key)
        await self._store.set_if_not_exists(key, value)

    async def delete(self, key: str) -> None:
        self._forget(key)
        await self._store.delete(key)

    def _forget(self, key: str) -> None:
        if self._memo is not None:
            self._memo.pop(key, None)

    def __repr__(self) -> str:
        return f"OpenMemo({self._store!r})"

    def __str__(self) -> str:
        return str(self._store)
