"""The one door to zarr-python's private API (names starting with ``_``).

zfuse reads and writes chunks below zarr's indexing machinery (one store get
and the codecs' synchronous methods in a worker thread, a shard index read
once and cached) and that needs a few of zarr-python's private names. Every
such use goes through a function here, and tests/test_zarr_private.py pins
each one against the installed zarr, so raising the zarr pin is a deliberate
step: when zarr renames or drops one, that test names it.

What zfuse *overrides* rather than calls (``Store._get_many``,
``Store._set_many``, ``WrapperStore._with_store``, the codecs'
``_decode_single``/``_encode_single``/``_decode_sync``/``_encode_sync``) is
listed in :data:`OVERRIDDEN_HOOKS` and pinned by the same test, so an
override cannot silently stop being called.

Checked against zarr-python 3.1.6.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# zarr.storage._common: zarr's own resolution of a path / URL / Store into a StorePath.
from zarr.storage._common import make_store_path

if TYPE_CHECKING:
    import zarr
    from zarr.abc.store import Store
    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.storage import StorePath

__all__ = [
    "OVERRIDDEN_HOOKS",
    "array_config",
    "async_group",
    "can_decode_sync",
    "can_encode_sync",
    "convert_v2_metadata_to_v3",
    "decode_sync",
    "encode_sync",
    "event_loop",
    "inner_chunk_spec",
    "load_numcodecs_codec",
    "load_shard_index",
    "make_store_path",
    "morton_order",
    "new_shard_index",
    "shard_index_size",
    "shard_index_spec",
    "wrapped_store",
]

# (module, class, method): zarr's private hooks that zfuse's subclasses override.
OVERRIDDEN_HOOKS = (
    ("zarr.abc.store", "Store", "_get_many"),
    ("zarr.abc.store", "Store", "_set_many"),
    ("zarr.abc.store", "Store", "_check_writable"),
    ("zarr.abc.store", "Store", "_ensure_open"),
    ("zarr.storage", "WrapperStore", "_with_store"),
    ("zarr.abc.codec", "BaseCodec", "_decode_single"),
    ("zarr.abc.codec", "BaseCodec", "_encode_single"),
)


def array_config(array: zarr.Array) -> ArrayConfig:
    """The array's runtime config (order, write_empty_chunks), as ``get_chunk_spec`` needs it.

    Formerly ``array._async_array._config``; zarr 3.1 deprecated that for the public
    ``Array.config`` (and warns on every access), so this is the public spelling.
    """
    return array.config


def async_group(group: zarr.Group) -> Any:
    """The AsyncGroup under a ``zarr.Group`` (``group._async_group``: no public spelling)."""
    return group._async_group


def event_loop() -> Any:
    """zarr's own event loop, which ``zarr.core.sync.sync`` runs store I/O on
    (``zarr.core.sync._get_loop``): work submitted to it shares its connections."""
    from zarr.core.sync import _get_loop

    return _get_loop()


def can_decode_sync(codec: Any) -> bool:
    """Whether ``codec`` decodes synchronously (``_decode_sync``), in the caller's thread."""
    return hasattr(codec, "_decode_sync")


def can_encode_sync(codec: Any) -> bool:
    """Whether ``codec`` encodes synchronously (``_encode_sync``), in the caller's thread."""
    return hasattr(codec, "_encode_sync")


def decode_sync(codec: Any, data: Any, spec: ArraySpec) -> Any:
    """One codec's decode in this thread (``codec._decode_sync``): no event-loop hop."""
    return codec._decode_sync(data, spec)


def encode_sync(codec: Any, data: Any, spec: ArraySpec) -> Any:
    """One codec's encode in this thread (``codec._encode_sync``)."""
    return codec._encode_sync(data, spec)


async def load_shard_index(
    sharding: ShardingCodec, store_path: StorePath, chunks_per_shard: tuple[int, ...]
) -> Any:
    """The shard's index, None when the shard is missing (``_load_shard_index_maybe``)."""
    return await sharding._load_shard_index_maybe(store_path, chunks_per_shard)


def inner_chunk_spec(sharding: ShardingCodec, shard_spec: ArraySpec) -> ArraySpec:
    """The spec of one inner chunk of a shard with ``shard_spec`` (``_get_chunk_spec``)."""
    return sharding._get_chunk_spec(shard_spec)


def convert_v2_metadata_to_v3(metadata: Any) -> Any:
    """zarr's own v2 -> v3 array metadata conversion (``migrate_v3._convert_array_metadata``)."""
    from zarr.metadata.migrate_v3 import _convert_array_metadata

    return _convert_array_metadata(metadata)


def wrapped_store(store: Store) -> Store:
    """The store a ``WrapperStore`` wraps (``WrapperStore._store``)."""
    return store._store  # type: ignore[attr-defined, no-any-return]


def load_numcodecs_codec(codec: Any) -> None:
    """Load a numcodecs codec that zarr wraps lazily (its ``_codec``), so a codec that
    cannot work fails now, not on the first chunk; other codecs are left alone."""
    if hasattr(type(codec), "_codec"):
        codec._codec  # noqa: B018 - the load is the check


def shard_index_spec(sharding: ShardingCodec, chunks_per_shard: tuple[int, ...]) -> ArraySpec:
    """The spec the shard index is encoded with (``_get_index_chunk_spec``)."""
    return sharding._get_index_chunk_spec(chunks_per_shard)


def shard_index_size(sharding: ShardingCodec, chunks_per_shard: tuple[int, ...]) -> int:
    """The encoded shard index's size in bytes (``_shard_index_size``)."""
    return sharding._shard_index_size(chunks_per_shard)  # type: ignore[no-any-return]


def new_shard_index(offsets_and_lengths: Any) -> Any:
    """A shard index over an (..., 2) uint64 array (``sharding._ShardIndex``)."""
    from zarr.codecs.sharding import _ShardIndex

    return _ShardIndex(offsets_and_lengths)


def morton_order(chunks_per_shard: tuple[int, ...]) -> Any:
    """Inner-chunk positions in the order zarr lays them out in a shard
    (``zarr.core.indexing.morton_order_iter``, not exported)."""
    from zarr.core.indexing import morton_order_iter

    return morton_order_iter(chunks_per_shard)
