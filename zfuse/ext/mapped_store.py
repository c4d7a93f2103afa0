"""The base of zfuse's key-mapping stores (storage transformers, the pre-release v3 layout).

Both wrap a real store and present keys or values that differ from what is
stored, so neither may let zarr's ``WrapperStore`` pass a call straight to the
wrapped store when the wrapper must see it.  This base holds what they share:

* ``_get_many`` goes through the wrapper's own ``get`` (``WrapperStore`` sends
  it to the wrapped store, bypassing any key or value mapping);
* byte ranges of values the wrapper builds itself are cut by one slicer,
  :func:`zfuse.ext.layers.slice_bytes` (a suffix longer than the value gives
  the whole value, as zarr's own stores do);
* ``set_if_not_exists`` asks the wrapper's ``exists`` and ``set``;
* listing: ``list`` is ``list_prefix("")`` and ``list_dir`` is derived from
  the wrapper's ``list_prefix``, so the three always agree.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Iterable

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from zfuse.ext.layers import slice_bytes

__all__ = ["MappedStore"]


class MappedStore(WrapperStore[Store]):
    """A WrapperStore whose keys or values differ from the wrapped store's."""

    @abstractmethod
    def list_prefix(self, prefix: str) -> AsyncIterator[str]: ...

    @staticmethod
    def _ranged(data: bytes, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer:
        """A buffer of the part of ``data`` (a value built here) that ``byte_range`` selects."""
        return prototype.buffer.from_bytes(slice_bytes(data, byte_range))

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        if not await self.exists(key):
            await self.set(key, value)

    def list(self) -> AsyncIterator[str]:
        return self.list_prefix("")

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        norm = prefix.strip("/")
        base = norm + "/" if norm else ""
        seen: set[str] = set()
        async for key in self.list_prefix(base):
            child = key[len(base) :].split("/", 1)[0]
            if child not in seen:
                seen.add(child)
                yield child
