"""The storage-transformer layer protocol: :class:`ChunkIO`, its store bottom, byte ranges.

A transformer stack is a chain of :class:`ChunkIO` layers, each a key/value
view keyed relative to one array's directory (``"c/0/0"``); the bottom is
:class:`StoreIO` on the real store.  The layers themselves live in
``concat_parts.py`` and ``sharding_v1.py``; ``stack.py`` builds a stack from
an array's ``storage_transformers``; ``transformers.py`` is the zarr Store
that routes chunk keys through it.

Invariants
----------
* ``get`` returns ``None`` for a missing key, like zarr's ``Store.get``.
* Byte ranges follow zarr's ``ByteRequest`` semantics, decided in one place,
  :func:`slice_for_request`: a range or offset running past the end returns
  the remainder, and a suffix longer than the value returns the whole value.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import default_buffer_prototype

from zfuse.ext.chunk_keys import METADATA_NAMES

__all__ = ["ChunkIO", "StoreIO", "slice_bytes", "slice_for_request"]


class ChunkIO(ABC):
    """One level of a transformer stack: a key/value view keyed relative to one array.

    ``get`` returns ``None`` for a missing key, like zarr's Store.get.  Byte ranges
    follow zarr's ByteRequest semantics (a range running past the end returns the
    remainder).
    """

    @abstractmethod
    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None: ...

    @abstractmethod
    async def set(self, key: str, value: bytes) -> None: ...

    @abstractmethod
    async def delete(self, key: str) -> None: ...

    @abstractmethod
    async def exists(self, key: str) -> bool: ...

    @abstractmethod
    async def getsize(self, key: str) -> int:
        """Size of the value; FileNotFoundError when missing."""

    @abstractmethod
    async def list_keys(self) -> list[str]:
        """Every key present at this level (relative to the array directory)."""

    @abstractmethod
    def full_key(self, key: str) -> str:
        """The store key ``key`` corresponds to at the bottom of the stack (for messages/locks)."""

    @property
    @abstractmethod
    def lock_namespace(self) -> str:
        """Identifies the underlying storage, so per-key locks are shared by every wrapper of it."""


class StoreIO(ChunkIO):
    """The bottom of every stack: the wrapped zarr Store, under the array's directory."""

    def __init__(self, store: Store, array_path: str) -> None:
        self._store = store
        self._prefix = f"{array_path}/" if array_path else ""

    def full_key(self, key: str) -> str:
        return self._prefix + key

    @property
    def lock_namespace(self) -> str:
        return str(self._store)

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        buf = await self._store.get(self._prefix + key, default_buffer_prototype(), byte_range)
        return None if buf is None else buf.to_bytes()

    async def set(self, key: str, value: bytes) -> None:
        await self._store.set(
            self._prefix + key, default_buffer_prototype().buffer.from_bytes(value)
        )

    async def delete(self, key: str) -> None:
        await self._store.delete(self._prefix + key)

    async def exists(self, key: str) -> bool:
        return await self._store.exists(self._prefix + key)

    async def getsize(self, key: str) -> int:
        return await self._store.getsize(self._prefix + key)

    async def list_keys(self) -> list[str]:
        n = len(self._prefix)
        return [
            k[n:]
            async for k in self._store.list_prefix(self._prefix)
            if k[n:] not in METADATA_NAMES
        ]


def slice_for_request(length: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """[start, stop) that ``byte_range`` selects from a value of ``length`` bytes (clipped)."""
    if byte_range is None:
        return 0, length
    if isinstance(byte_range, RangeByteRequest):
        start, stop = byte_range.start, byte_range.end
    elif isinstance(byte_range, OffsetByteRequest):
        start, stop = byte_range.offset, length
    elif isinstance(byte_range, SuffixByteRequest):
        start, stop = length - byte_range.suffix, length
    else:  # pragma: no cover - zarr defines only the three
        raise TypeError(f"unexpected byte range {byte_range!r}")
    start = min(max(start, 0), length)
    return start, max(start, min(stop, length))


def slice_bytes(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """The bytes of ``data`` that ``byte_range`` selects (see :func:`slice_for_request`)."""
    if byte_range is None:
        return data
    start, stop = slice_for_request(len(data), byte_range)
    return data[start:stop]
