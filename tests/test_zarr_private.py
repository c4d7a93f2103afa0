"""Pins every use zfuse makes of zarr-python's private API (zfuse.ext.zarr_private).

zfuse reaches below zarr's indexing for speed; each private name it uses is
exercised here through the adapter, against the installed zarr. When a zarr
release renames or changes one, the failing test names the private API, so
raising the zarr pin (pyproject: zarr>=3.1.6,<3.2) is a deliberate step.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore, StorePath, WrapperStore

from zfuse.ext import zarr_private

PROTO = default_buffer_prototype()


@contextmanager
def pinned(name: str) -> Iterator[None]:
    """Turn any failure into one naming the private API that changed."""
    try:
        yield
    except Exception as e:
        pytest.fail(
            f"zarr-python {zarr.__version__}: private API {name} changed "
            f"({type(e).__name__}: {e}); update zfuse/ext/zarr_private.py",
            pytrace=False,
        )


def _sharded() -> zarr.Array:
    a = zarr.create_array(MemoryStore(), shape=(8, 8), chunks=(2, 4), shards=(4, 8), dtype="u2")
    a[:4, :] = np.arange(32, dtype="u2").reshape(4, 8)
    return a


def test_make_store_path_from_zarr_storage_common(tmp_path: object) -> None:
    with pinned("zarr.storage._common.make_store_path"):
        sp = sync(zarr_private.make_store_path(str(tmp_path), mode="a"))
        assert isinstance(sp, StorePath) and isinstance(sp.store, LocalStore)
        sp = sync(zarr_private.make_store_path(MemoryStore(), mode="r"))
        assert isinstance(sp.store, MemoryStore)


def test_array_config_for_get_chunk_spec() -> None:
    # zfuse used AsyncArray._config (deprecated in 3.1 for the public Array.config)
    a = zarr.create_array(MemoryStore(), shape=(4, 4), chunks=(2, 2), dtype="u1")
    with pinned("Array.config / ArrayV3Metadata.get_chunk_spec(coords, config, prototype)"):
        spec = a.metadata.get_chunk_spec((0, 0), zarr_private.array_config(a), PROTO)
        assert tuple(spec.shape) == (2, 2)


def test_decode_sync_and_encode_sync_of_codecs() -> None:
    a = zarr.create_array(
        MemoryStore(), shape=(4,), chunks=(4,), dtype="u2", compressors=[zarr.codecs.GzipCodec()]
    )
    spec = a.metadata.get_chunk_spec((0,), zarr_private.array_config(a), PROTO)
    serializer, gzip = a.metadata.codecs
    with pinned("codec._encode_sync / codec._decode_sync"):
        assert zarr_private.can_encode_sync(serializer) and zarr_private.can_decode_sync(gzip)
        values = PROTO.nd_buffer.from_numpy_array(np.arange(4, dtype="u2"))
        stored = zarr_private.encode_sync(gzip, zarr_private.encode_sync(serializer, values, spec), spec)
        decoded = zarr_private.decode_sync(serializer, zarr_private.decode_sync(gzip, stored, spec), spec)
        np.testing.assert_array_equal(decoded.as_numpy_array(), np.arange(4))


def test_shard_index_and_inner_chunk_spec() -> None:
    a = _sharded()
    sharding = a.metadata.codecs[0]
    store = a.store_path.store
    with pinned("ShardingCodec._load_shard_index_maybe(byte_getter, chunks_per_shard)"):
        index = sync(zarr_private.load_shard_index(sharding, StorePath(store, "c/0/0"), (2, 2)))
        assert index is not None and index.get_chunk_slice((1, 1)) is not None
        assert sync(zarr_private.load_shard_index(sharding, StorePath(store, "c/1/0"), (2, 2))) is None
    with pinned("ShardingCodec._get_chunk_spec(shard_spec)"):
        shard_spec = a.metadata.get_chunk_spec((0, 0), zarr_private.array_config(a), PROTO)
        inner = zarr_private.inner_chunk_spec(sharding, shard_spec)
        assert tuple(inner.shape) == (2, 4)


def test_shard_layout_helpers() -> None:
    """What writing an inner chunk into a local shard uses: the index spec and size,
    a fresh index, and zarr's Morton order of inner chunks."""
    a = _sharded()
    sharding = a.metadata.codecs[0]
    with pinned("ShardingCodec._get_index_chunk_spec / _shard_index_size(chunks_per_shard)"):
        spec = zarr_private.shard_index_spec(sharding, (2, 2))
        assert tuple(spec.shape) == (2, 2, 2)
        assert zarr_private.shard_index_size(sharding, (2, 2)) == 2 * 2 * 16 + 4  # + crc32c
    with pinned("zarr.codecs.sharding._ShardIndex(offsets_and_lengths)"):
        index = zarr_private.new_shard_index(np.full((2, 2, 2), 2**64 - 1, dtype=np.uint64))
        assert index.get_chunk_slice((0, 1)) is None
    with pinned("zarr.core.indexing.morton_order_iter(chunks_per_shard)"):
        assert [tuple(int(i) for i in c) for c in zarr_private.morton_order((2, 2))] == [
            (0, 0), (1, 0), (0, 1), (1, 1)]


def test_convert_v2_metadata_to_v3() -> None:
    a = zarr.create_array(MemoryStore(), shape=(4,), chunks=(2,), dtype="i4", zarr_format=2)
    with pinned("zarr.metadata.migrate_v3._convert_array_metadata"):
        doc = zarr_private.convert_v2_metadata_to_v3(a.metadata).to_dict()
        assert doc["zarr_format"] == 3 and tuple(doc["shape"]) == (4,)


def test_async_group() -> None:
    g = zarr.open_group(MemoryStore(), mode="w")
    g.create_array("x", shape=(2,), dtype="u1")
    with pinned("Group._async_group"):
        ag = zarr_private.async_group(g)
        assert isinstance(ag, zarr.AsyncGroup)

        async def names() -> list[str]:
            return [name async for name, _ in ag.members()]

        assert sync(names()) == ["x"]


def test_event_loop_is_the_one_sync_runs_on() -> None:
    import asyncio

    with pinned("zarr.core.sync._get_loop"):
        loop = zarr_private.event_loop()

        async def running() -> asyncio.AbstractEventLoop:
            return asyncio.get_running_loop()

        assert sync(running()) is loop
        assert asyncio.run_coroutine_threadsafe(running(), loop).result(timeout=10) is loop


def test_wrapped_store() -> None:
    inner = MemoryStore()
    with pinned("WrapperStore._store"):
        assert zarr_private.wrapped_store(WrapperStore(inner)) is inner


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3 specification")
def test_load_numcodecs_codec() -> None:
    from zarr.codecs.numcodecs import Zlib

    codec = Zlib(level=1)
    with pinned("zarr.codecs.numcodecs wrappers' lazy _codec"):
        zarr_private.load_numcodecs_codec(codec)
        assert isinstance(codec._codec, numcodecs.Zlib)
    zarr_private.load_numcodecs_codec(zarr.codecs.GzipCodec())  # not a numcodecs wrapper: no-op


@pytest.mark.parametrize(("module", "cls", "method"), zarr_private.OVERRIDDEN_HOOKS)
def test_overridden_hooks_still_exist(module: str, cls: str, method: str) -> None:
    with pinned(f"{module}.{cls}.{method} (overridden by zfuse)"):
        assert callable(getattr(getattr(importlib.import_module(module), cls), method))
