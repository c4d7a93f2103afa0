"""Pre-release Zarr v3 stores (zarr-python 2.14-2.18 experimental API) in today's v3 layout.

The only sharding-storage-transformer-v1 data in the wild was written in the
*pre-release* v3 layout, which zarr-python 3 cannot read. ``wrap_if_legacy``
recognises such a store and returns a ``LegacyV3Store`` that presents it in
today's layout, so the rest of zfuse (and plain zarr-python) sees an ordinary
v3 hierarchy.

The legacy layout, as zarr-python 2.18 writes it (``zarr/_storage/store.py``,
``zarr/meta.py``, ``zarr/core.py``)::

    zarr.json                              entry point: zarr_format and metadata_encoding
                                           "https://purl.org/zarr/spec/protocol/core/3.0",
                                           metadata_key_suffix ".json", extensions []
    meta/root.group.json                   root group {"attributes": {...}} (or root.array.json)
    meta/root/<path>.group.json            explicit group; groups may also be implicit
    meta/root/<path>.array.json            array document (its fields: ``legacy_v3_metadata``)
    data/root/<path>/c<i><sep><j>...        chunk (or shard) of array <path>: "c0/1" or "c0.1"

Presented layout (what callers of ``LegacyV3Store`` see)::

    zarr.json, <path>/zarr.json            today's group/array documents (zarr_format 3)
    <path>/c<sep><i><sep><j>...            chunk keys of the "default" chunk key encoding
                                           with the legacy separator ("c/0/1", "c.0.1")

Invariants:

- Key translation is a bijection between presented chunk keys of a known array
  and legacy ``data/root`` keys: presented ``<path>/c<sep><rest>`` <->
  legacy ``data/root/<path>/c<rest>`` (0-d: ``<path>/c`` <-> ``.../c``). A
  suffix after the coordinates (e.g. from a transformer's extra parts) is
  carried through unchanged.
- Nothing is ever written in today's layout into the legacy store: every write
  lands at a legacy key, and a presented ``zarr.json`` is translated back into
  the legacy ``.array.json``/``.group.json`` document, keeping the original
  document's fields and spellings and replacing only what changed
  (attributes; shape). The legacy entry point ``zarr.json`` is never touched.
- What cannot be represented one way or the other raises
  ``zfuse.errors.MetadataError`` naming the field and value, before anything
  is written.

Documents are translated by ``legacy_v3_metadata.py``. Array metadata is
cached per path; another process rewriting ``.array.json`` behind an open
store is not noticed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import default_buffer_prototype

from zfuse.errors import MetadataError
from zfuse.ext.legacy_v3_metadata import (
    LEGACY_FORMAT_URL,
    array_doc_from_legacy,
    array_doc_to_legacy,
    check_entry_point,
    group_doc_from_legacy,
    is_legacy_entry_point,
    legacy_separator,
    update_legacy_array,
)
from zfuse.ext.mapped_store import MappedStore
from zfuse.ext.metadata_json import load_metadata

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

__all__ = ["LegacyV3Store", "wrap_if_legacy"]

_META = "meta/"
_META_ROOT = "meta/root/"
_DATA_ROOT = "data/root/"
_ZARR_JSON = "zarr.json"


async def wrap_if_legacy(store: Store) -> Store:
    """Return ``store`` unchanged unless it is a pre-release v3 store, else a ``LegacyV3Store`` on it.

    Raises MetadataError if the entry point claims a legacy layout this module cannot map.
    """
    if isinstance(store, LegacyV3Store):
        return store
    buf = await store.get(_ZARR_JSON, prototype=default_buffer_prototype())
    if buf is None:
        return store
    try:
        doc = load_metadata(buf.to_bytes(), _ZARR_JSON)  # (bounded: nested 100,000 deep recursed)
    except (ValueError, MetadataError):
        return store  # not JSON, or past zfuse's bounds: not ours to judge, the opener reports it
    if not is_legacy_entry_point(doc):
        return store
    return LegacyV3Store(store, entry_point=doc)


def _node_of_meta_key(key: str) -> str | None:
    """Presented metadata key -> node path ("" for the root), or None if not a zarr.json."""
    if key == _ZARR_JSON:
        return ""
    if key.endswith("/" + _ZARR_JSON):
        return key[: -len(_ZARR_JSON) - 1]
    return None


def _meta_json_key(path: str) -> str:
    return f"{path}/{_ZARR_JSON}" if path else _ZARR_JSON


def _data_prefix(path: str) -> str:
    return f"{_DATA_ROOT}{path}/" if path else _DATA_ROOT


class LegacyV3Store(MappedStore):
    """Presents a pre-release v3 store (zarr-python 2.14-2.18) in today's v3 layout.

    See the module docstring for the two layouts and the invariants. Array
    metadata is cached per path (positive and negative) so that resolving a
    chunk key costs no extra read; writes through this store keep it current.
    """

    def __init__(self, store: Store, entry_point: dict[str, Any] | None = None) -> None:
        super().__init__(store)
        self._entry = (
            dict(entry_point)
            if entry_point is not None
            else dict(
                zarr_format=LEGACY_FORMAT_URL,
                metadata_encoding=LEGACY_FORMAT_URL,
                metadata_key_suffix=".json",
                extensions=[],
            )
        )
        self._suffix = check_entry_point(self._entry)
        self._arrays: dict[str, dict[str, Any] | None] = {}

    def _with_store(self, store: Store) -> LegacyV3Store:
        return type(self)(store, entry_point=self._entry)

    def __repr__(self) -> str:
        return f"LegacyV3Store({self._store!r})"

    # -- legacy keys ---------------------------------------------------------

    def _legacy_meta_key(self, path: str, kind: str) -> str:
        if path:
            return f"{_META_ROOT}{path}.{kind}{self._suffix}"
        return f"{_META_ROOT[:-1]}.{kind}{self._suffix}"

    async def _read_json(self, key: str) -> dict[str, Any] | None:
        buf = await self._store.get(key, prototype=default_buffer_prototype())
        if buf is None:
            return None
        try:
            doc = json.loads(buf.to_bytes())
        except ValueError as e:
            raise MetadataError(f"{key}: not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise MetadataError(f"{key}: expected a JSON object, got {type(doc).__name__}")
        return doc

    async def _write_json(self, key: str, doc: dict[str, Any]) -> None:
        # Same style as zarr 2.18's json_dumps: sorted keys, indent 4.
        data = json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True).encode()
        await self._store.set(key, default_buffer_prototype().buffer.from_bytes(data))

    async def _array_doc(self, path: str) -> dict[str, Any] | None:
        if path not in self._arrays:
            self._arrays[path] = await self._read_json(self._legacy_meta_key(path, "array"))
        return self._arrays[path]

    async def _is_implicit_group(self, path: str) -> bool:
        if not path:
            return True  # a legacy hierarchy always has a root
        async for _ in self._store.list_prefix(f"{_META_ROOT}{path}/"):
            return True
        return False

    async def _chunk_key_to_legacy(self, key: str) -> str | None:
        """Presented chunk key -> legacy data key, or None if ``key`` is no chunk of a known array."""
        segments = key.split("/")
        for i, seg in enumerate(segments):
            if seg != "c" and not seg.startswith("c."):
                continue
            path = "/".join(segments[:i])
            doc = await self._array_doc(path)
            if doc is None:
                continue
            sep = legacy_separator(doc, self._legacy_meta_key(path, "array"))
            rest = "/".join(segments[i:])
            if rest == "c":
                return _data_prefix(path) + "c"
            if rest.startswith("c" + sep):
                return _data_prefix(path) + "c" + rest[2:]
        return None

    def _legacy_to_chunk_key(self, key: str, arrays: dict[str, str]) -> str | None:
        """Legacy data key -> presented key, given {array path: separator}."""
        if not key.startswith(_DATA_ROOT):
            return None
        segments = key[len(_DATA_ROOT) :].split("/")
        for i, seg in enumerate(segments):
            if not seg.startswith("c"):
                continue
            path = "/".join(segments[:i])
            sep = arrays.get(path)
            if sep is None:
                continue
            rest = "/".join(segments[i:])
            head = f"{path}/" if path else ""
            return head + ("c" if rest == "c" else "c" + sep + rest[1:])
        return None

    async def _scan_meta(self) -> tuple[dict[str, str], set[str]]:
        """All nodes: ({array path: separator}, {group path incl. implicit ones})."""
        arrays: dict[str, str] = {}
        groups: set[str] = {""}
        array_sfx, group_sfx = f".array{self._suffix}", f".group{self._suffix}"
        async for key in self._store.list_prefix(_META):
            if key in (self._legacy_meta_key("", "array"), self._legacy_meta_key("", "group")):
                path = ""
            elif key.startswith(_META_ROOT) and key.endswith((array_sfx, group_sfx)):
                path = key[
                    len(_META_ROOT) : -len(array_sfx if key.endswith(array_sfx) else group_sfx)
                ]
            else:
                continue
            if key.endswith(array_sfx):
                doc = await self._array_doc(path)
                if doc is not None:
                    arrays[path] = legacy_separator(doc, key)
            else:
                groups.add(path)
            parts = path.split("/")
            groups.update("/".join(parts[:i]) for i in range(1, len(parts)))
        groups -= set(arrays)
        return arrays, groups

    # -- metadata documents --------------------------------------------------

    async def _presented_meta(self, path: str) -> bytes | None:
        array_key = self._legacy_meta_key(path, "array")
        doc = await self._array_doc(path)
        if doc is not None:
            out = array_doc_from_legacy(doc, array_key)
        else:
            group_key = self._legacy_meta_key(path, "group")
            gdoc = await self._read_json(group_key)
            if gdoc is None and not await self._is_implicit_group(path):
                return None
            out = group_doc_from_legacy(gdoc, group_key)
        return json.dumps(out, indent=2).encode()

    async def _set_meta(self, path: str, value: bytes) -> None:
        where = _meta_json_key(path)
        try:
            new = json.loads(value)
        except ValueError as e:
            raise MetadataError(f"{where}: not valid JSON: {e}") from None
        if not isinstance(new, dict) or new.get("zarr_format") != 3:
            raise MetadataError(f"{where}: only zarr_format 3 documents can be written here")
        node_type = new.get("node_type")
        array_key = self._legacy_meta_key(path, "array")
        group_key = self._legacy_meta_key(path, "group")
        old_array = await self._array_doc(path)
        if node_type == "group":
            if old_array is not None:
                raise MetadataError(f"{where}: node_type: {path!r} is an array, not a group")
            if new.get("consolidated_metadata") is not None:
                raise MetadataError(f"{where}: consolidated_metadata has no legacy form")
            old_group = await self._read_json(group_key)
            doc = dict(old_group) if old_group is not None else {}
            doc["attributes"] = new.get("attributes") or {}
            await self._write_json(group_key, doc)
        elif node_type == "array":
            if old_array is None and await self._store.exists(group_key):
                raise MetadataError(f"{where}: node_type: {path!r} is a group, not an array")
            if old_array is not None:
                doc = update_legacy_array(old_array, new, array_key)
            else:
                doc = array_doc_to_legacy(new, array_key)
            self._arrays[path] = None  # if the write fails, re-read next time
            await self._write_json(array_key, doc)
            self._arrays[path] = doc
        else:
            raise MetadataError(f"{where}: unsupported node_type {node_type!r}")

    async def _delete_meta(self, path: str) -> None:
        self._arrays.pop(path, None)
        for kind in ("array", "group"):
            key = self._legacy_meta_key(path, kind)
            if await self._store.exists(key):
                await self._store.delete(key)

    # -- Store API -------------------------------------------------------------

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        path = _node_of_meta_key(key)
        if path is not None:
            data = await self._presented_meta(path)
            return None if data is None else self._ranged(data, prototype, byte_range)
        legacy = await self._chunk_key_to_legacy(key)
        if legacy is None:
            return None
        return await self._store.get(legacy, prototype, byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        results: list[Buffer | None] = [None] * len(key_ranges)
        passthrough: list[tuple[int, str, ByteRequest | None]] = []
        for i, (key, byte_range) in enumerate(key_ranges):
            if _node_of_meta_key(key) is not None:
                results[i] = await self.get(key, prototype, byte_range)
            elif (legacy := await self._chunk_key_to_legacy(key)) is not None:
                passthrough.append((i, legacy, byte_range))
        if passthrough:
            # One batched call, so the inner store's partial-read batching is kept.
            values = await self._store.get_partial_values(
                prototype, [(legacy, r) for _, legacy, r in passthrough]
            )
            for (i, _, _), value in zip(passthrough, values, strict=True):
                results[i] = value
        return results

    async def exists(self, key: str) -> bool:
        path = _node_of_meta_key(key)
        if path is not None:
            return await self._presented_meta(path) is not None
        legacy = await self._chunk_key_to_legacy(key)
        return legacy is not None and await self._store.exists(legacy)

    async def getsize(self, key: str) -> int:
        if _node_of_meta_key(key) is None:
            legacy = await self._chunk_key_to_legacy(key)
            if legacy is None:
                raise FileNotFoundError(key)
            return await self._store.getsize(legacy)
        data = await self._presented_meta(_node_of_meta_key(key) or "")
        if data is None:
            raise FileNotFoundError(key)
        return len(data)

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        path = _node_of_meta_key(key)
        if path is not None:
            await self._set_meta(path, value.to_bytes())
            return
        legacy = await self._chunk_key_to_legacy(key)
        if legacy is None:
            raise MetadataError(
                f"{key!r} is neither a zarr.json nor a chunk key of an array in this "
                "pre-release v3 store, so it has no place in the legacy layout"
            )
        await self._store.set(legacy, value)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        for key, value in values:
            await self.set(key, value)

    async def delete(self, key: str) -> None:
        self._check_writable()
        path = _node_of_meta_key(key)
        if path is not None:
            await self._delete_meta(path)
            return
        legacy = await self._chunk_key_to_legacy(key)
        if legacy is not None:
            await self._store.delete(legacy)

    async def delete_dir(self, prefix: str) -> None:
        # Not the inner store's delete_dir: only what is listed here. Chunks go first,
        # because a chunk key only resolves while its array's metadata still exists.
        self._check_writable()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        keys = [key async for key in self.list_prefix(prefix)]
        keys.sort(key=lambda k: _node_of_meta_key(k) is not None)
        for key in keys:
            await self.delete(key)

    async def clear(self) -> None:
        # Keeps the legacy entry point: the store stays a (now empty) legacy hierarchy.
        await Store.clear(self)
        self._arrays.clear()

    async def is_empty(self, prefix: str) -> bool:
        return await Store.is_empty(self, prefix)

    @property
    def supports_partial_writes(self) -> bool:  # type: ignore[override]
        return False

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        arrays, groups = await self._scan_meta()
        for path in sorted(set(arrays) | groups):
            key = _meta_json_key(path)
            if key.startswith(prefix):
                yield key
        # Narrow the inner listing to the node directories named in the prefix;
        # stop before the chunk part, whose spelling differs between layouts.
        head: list[str] = []
        for seg in prefix.split("/")[:-1]:
            if seg == "c" or seg.startswith("c."):
                break
            head.append(seg)
        inner_prefix = _DATA_ROOT + "".join(s + "/" for s in head)
        async for legacy in self._store.list_prefix(inner_prefix):
            key = self._legacy_to_chunk_key(legacy, arrays)
            if key is not None and key.startswith(prefix):
                yield key
