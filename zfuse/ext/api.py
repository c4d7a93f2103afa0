"""``zfuse.open_array`` / ``zfuse.open_group``: zarr-python with storage transformers.

Invariants
----------
* The objects returned are plain ``zarr.Array`` / ``zarr.Group`` built on a
  :class:`~zfuse.ext.transformers.TransformerStore` wrapping the resolved store,
  so every zarr indexing mode works and arrays with ``storage_transformers``
  read and write through their transformer stack.
* ``store`` may be a path (str/Path), a URL (resolved by zarr's
  ``make_store_path``, i.e. fsspec with ``storage_options``), a zarr Store or a
  StorePath.  Before wrapping, the store passes :func:`_detect` -- the hook where
  other layouts are recognised (today: the pre-release v3 layout through
  ``zfuse.ext.legacy_v3.wrap_if_legacy`` when that module is present).
* Modes are zarr's: "r", "r+", "a", "w", "w-".  Creating (mode "w"/"w-", or "a"
  on an absent array) with ``storage_transformers=[...]`` validates the
  transformers against the would-be metadata *before* touching the store
  (MetadataError, nothing written), then creates the array with zarr and writes
  the transformers into its ``zarr.json``.
* Opening an existing v3 array (``open_array``, or ``open_group`` on a path that
  holds an array) first checks its stored ``zarr.json`` with
  :func:`zfuse.ext.validate.validate_array_metadata`: invalid metadata is a
  MetadataError naming the array, each bad field and its fix, never zarr's bare
  ``KeyError``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore, StorePath, WrapperStore

from zfuse.errors import ArgumentError, MetadataError
from zfuse.ext import zarr_private
from zfuse.ext.layers import StoreIO
from zfuse.ext.metadata_json import load_metadata
from zfuse.ext.stack import build_stack
from zfuse.ext.transformers import TransformerStore
from zfuse.ext.validate import validate_array_metadata

__all__ = ["open_array", "open_group", "raw_array_metadata", "resolve_store"]

_MODES = ("r", "r+", "a", "w", "w-")


def _join(*parts: str | None) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


async def _detect(store: Store) -> Store:
    """Present other on-disk layouts in today's v3 layout (the detection hook)."""
    try:
        from zfuse.ext.legacy_v3 import wrap_if_legacy
    except ImportError:  # legacy support not installed/written yet
        return store
    return await wrap_if_legacy(store)


def resolve_store(
    store: Any,
    mode: str = "r",
    *,
    path: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[TransformerStore, str]:
    """(wrapped store, array/group path) for anything ``open_array`` accepts."""
    if mode not in _MODES:
        raise ArgumentError(f"mode must be one of {_MODES}, got {mode!r}")
    if isinstance(store, Path):
        store = str(store)
    if isinstance(store, TransformerStore):
        if mode == "r" and not store.read_only:
            store = store.with_read_only(True)
        return store, _join(path)
    # zarr's own resolution: paths -> LocalStore, URLs -> FsspecStore, Store/StorePath kept.
    # "w"/"w-" resolve as "a": zarr.open_array does the overwrite itself (through the
    # wrapper, so part/shard objects go too); resolving must never delete anything.
    resolve_mode = mode if mode in ("r", "r+") else "a"
    sp: StorePath = sync(zarr_private.make_store_path(store, mode=resolve_mode, storage_options=storage_options))
    raw = sync(_detect(sp.store))
    if isinstance(raw, TransformerStore):
        return raw, _join(sp.path, path)
    return TransformerStore(raw), _join(sp.path, path)


async def _metadata_exists(store: Store, path: str) -> bool:
    return await store.exists(_join(path, "zarr.json"))


def describe_location(store: Store, path: str) -> str:
    """The array's location for messages: the innermost store's URL plus the path."""
    while isinstance(store, WrapperStore):
        store = zarr_private.wrapped_store(store)
    base = str(store).rstrip("/")
    return f"{base}/{path}" if path else base


def _check_stored_metadata(wrapped: TransformerStore, path: str) -> None:
    """MetadataError (array, field, fix) if the v3 array metadata at ``path`` is invalid."""
    key = _join(path, "zarr.json")
    buf = sync(wrapped.raw_store.get(key, default_buffer_prototype()))
    if buf is None:
        return  # no v3 metadata here: zarr reports the missing node (or reads v2) itself
    where = describe_location(wrapped.raw_store, path)
    try:
        doc = load_metadata(buf.to_bytes(), key)  # (bounded: size and nesting)
    except MetadataError as e:
        raise MetadataError(f"array {where}: {e}") from e
    except ValueError as e:
        raise MetadataError(f"array {where}: zarr.json is not valid JSON ({e})") from e
    validate_array_metadata(doc, where)


def open_array(
    store: Any,
    mode: str = "r",
    *,
    path: str | None = None,
    storage_options: dict[str, Any] | None = None,
    **create_kwargs: Any,
) -> zarr.Array:
    """Open (or create) a zarr v3 array, storage transformers included.

    ``create_kwargs`` are zarr.open_array's creation keywords (shape, chunks,
    dtype, codecs, chunk_key_encoding, fill_value, attributes, ...), plus
    ``storage_transformers``: a list of transformer documents to create the
    array with (ignored when an existing array is opened).
    """
    if isinstance(store, (str, Path)) and path is None and Path(store).is_file():
        # a Zarr store is a directory or a URL; a file is most likely a saved virtual
        # concatenation, which is no zarr.Array and has its own opener
        raise ArgumentError(
            f"{store} is a file, not a Zarr store; a concatenation saved by `zfuse concat` "
            "opens with zfuse.load_concat(path)"
        )
    transformers = create_kwargs.pop("storage_transformers", None)
    wrapped, array_path = resolve_store(store, mode, path=path, storage_options=storage_options)
    creating = mode in ("w", "w-") or (
        mode == "a" and not sync(_metadata_exists(wrapped, array_path))
    )
    if not creating:
        _check_stored_metadata(wrapped, array_path)
    if not (creating and transformers):
        return zarr.open_array(store=wrapped, path=array_path, mode=mode, **create_kwargs)

    transformers = list(transformers)
    # Dry run in memory: the exact metadata zarr would write, to validate the stack against
    # (rank, chunk key encoding) before the real store is touched.
    probe = zarr.open_array(store=MemoryStore(), mode="w", **create_kwargs)
    doc = probe.metadata.to_dict()
    if doc.get("zarr_format") != 3:
        raise MetadataError("storage_transformers need a zarr v3 array (zarr_format=3)")
    doc["storage_transformers"] = transformers
    build_stack(transformers, doc, StoreIO(MemoryStore(), array_path), for_writing=True)

    zarr.open_array(
        store=wrapped, path=array_path, mode="w-" if mode == "a" else mode, **create_kwargs
    )
    sync(wrapped.attach_transformers(array_path, transformers))
    return zarr.open_array(store=wrapped, path=array_path, mode="r+")


def open_group(
    store: Any,
    mode: str = "r",
    *,
    path: str | None = None,
    storage_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> zarr.Group:
    """Open (or create) a zarr group whose arrays may use storage transformers.

    ``kwargs`` go to zarr.open_group (attributes, use_consolidated, ...).  Member
    arrays (``group["name"]``) read and write through the transformer wrapper.
    """
    wrapped, group_path = resolve_store(store, mode, path=path, storage_options=storage_options)
    if mode in ("r", "r+", "a"):
        # An array here with broken metadata: its own error says more than "not a group"
        # (and is what `zfuse info` / the mount report for an array source).
        _check_stored_metadata(wrapped, group_path)
    return zarr.open_group(store=wrapped, path=group_path, mode=mode, **kwargs)


def raw_array_metadata(store: Any, path: str | None = None) -> dict[str, Any]:
    """The array's ``zarr.json`` as stored (``storage_transformers`` included).

    ``store`` is anything ``open_array`` accepts, or a ``zarr.Array`` opened by
    ``open_array`` (then ``path`` defaults to the array's own path).  Pre-release
    v3 stores are read in today's layout (through the detection hook).
    """
    if isinstance(store, zarr.Array):
        sp = store.store_path
        store, path = sp.store, _join(sp.path, path) if path else sp.path
    wrapped, array_path = resolve_store(store, "r", path=path)
    key = _join(array_path, "zarr.json")
    buf = sync(wrapped.raw_store.get(key, default_buffer_prototype()))
    if buf is None:
        raise FileNotFoundError(key)
    doc = json.loads(buf.to_bytes())
    if not isinstance(doc, dict):
        raise MetadataError(f"{key}: not a JSON object")
    return doc
