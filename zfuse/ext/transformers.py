"""Storage transformers for zarr-python 3: the store wrapper.

zarr-python refuses array metadata that carries ``storage_transformers``.  zfuse
opens such arrays by wrapping the real store in :class:`TransformerStore`, which

* presents every array's ``zarr.json`` to zarr-python *without*
  ``storage_transformers`` (so zarr-python accepts it), and re-injects the
  stored list whenever zarr-python writes that ``zarr.json`` back (attribute
  updates, resize), so the transformers are never lost;
* routes every *chunk key* of such an array through that array's transformer
  stack; every other key (metadata, groups, arrays without transformers) goes
  straight to the wrapped store.

Invariants
----------
* Arrays are discovered as their ``zarr.json`` passes through the wrapper (zarr
  always reads metadata before chunks).  As a safety net, a chunk-looking key
  under a directory never seen is resolved by reading the ancestors'
  ``zarr.json`` once (results cached).
* A key is a chunk key of array ``A`` iff it lies in ``A``'s directory, is not
  ``zarr.json`` and round-trips through ``A``'s chunk key encoding (parsed with
  zarr's ``parse_chunk_key_encoding``, so any registered encoding works) with
  the array's rank (:class:`~zfuse.ext.chunk_keys.ChunkKeyDecoder`).
* Transformers stack in list order (``stack.py``); each layer is a
  :class:`~zfuse.ext.layers.ChunkIO` whose keys are relative to the array's
  directory (``"c/0/0"``).
* Listing presents the logical view: under a transformed array the raw part /
  shard objects are hidden and the existing chunk keys are listed instead.
* Unknown transformer names or types raise :class:`zfuse.errors.MetadataError`
  naming them, when the metadata is read (before any chunk is touched).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from zfuse.errors import MetadataError
from zfuse.ext.chunk_keys import METADATA_NAMES, ChunkKeyDecoder, chunk_key_encoding_of
from zfuse.ext.layers import ChunkIO, StoreIO
from zfuse.ext.mapped_store import MappedStore
from zfuse.ext.metadata_json import (
    consolidated_problem,
    is_metadata_key,
    load_metadata,
    metadata_problem,
)
from zfuse.ext.stack import build_stack, is_transformed_array

_log = logging.getLogger("zfuse.store")  # (what the store layer logs under)

if TYPE_CHECKING:
    from typing import Self

__all__ = ["TransformerStore"]

METADATA_KEY = "zarr.json"
_METADATA_NAMES = METADATA_NAMES

# --------------------------------------------------------------------------- registry


@dataclass
class _ArrayEntry:
    path: str
    metadata: dict[str, Any]  # as stored, storage_transformers included
    decode_key: ChunkKeyDecoder | None  # None: a plain array, no chunk key is routed
    stack: ChunkIO | None  # None: a plain array, nothing to route

    def is_chunk_key(self, rel: str) -> bool:
        if self.decode_key is None or rel in _METADATA_NAMES:
            return False
        return self.decode_key(rel) is not None


def _transformed_entry(path: str, doc: dict[str, Any], stack: ChunkIO) -> _ArrayEntry:
    decoder = ChunkKeyDecoder(len(doc["shape"]), encoding=chunk_key_encoding_of(doc))
    return _ArrayEntry(path, doc, decoder, stack)


class _NotArray:
    """Registry value for a directory known to hold a group or nothing."""


_NOT_ARRAY = _NotArray()


class _Registry:
    """What the wrapper knows about the store's nodes; shared by with_read_only copies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # zarr's sync API and FUSE threads may share a wrapper
        self.nodes: dict[str, _ArrayEntry | _NotArray] = {}

    def get(self, path: str) -> _ArrayEntry | _NotArray | None:
        with self.lock:
            return self.nodes.get(path)

    def put(self, path: str, node: _ArrayEntry | _NotArray) -> None:
        with self.lock:
            self.nodes[path] = node

    def purge(self, prefix: str) -> None:
        """Forget ``prefix`` and everything below it ("" forgets everything)."""
        with self.lock:
            if not prefix:
                self.nodes.clear()
                return
            for p in [p for p in self.nodes if p == prefix or p.startswith(prefix + "/")]:
                del self.nodes[p]


def _dirname(key: str) -> str:
    return key.rpartition("/")[0]


def _basename(key: str) -> str:
    return key.rpartition("/")[2]


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def _ancestors(key: str) -> list[str]:
    """Directories that could hold an array owning ``key``, shallowest first ("" is the root)."""
    parts = key.split("/")[:-1]
    return [""] + ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


# --------------------------------------------------------------------------- the wrapper


class TransformerStore(MappedStore):
    """A Store presenting arrays with ``storage_transformers`` to zarr-python.

    Use :func:`zfuse.ext.api.open_array` rather than constructing this directly.
    """

    def __init__(self, store: Store, *, _registry: _Registry | None = None) -> None:
        super().__init__(store)
        self._registry = _registry if _registry is not None else _Registry()

    # -- plumbing that must keep the registry ------------------------------------------

    def _with_store(self, store: Store) -> Self:
        return type(self)(store, _registry=self._registry)

    def __getstate__(self) -> dict[str, Any]:
        return {"_store": self._store}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._store = state["_store"]
        self._registry = _Registry()

    def __repr__(self) -> str:
        return f"TransformerStore({self._store!r})"

    def __str__(self) -> str:
        return f"zfuse-transformers-{self._store}"

    @property
    def raw_store(self) -> Store:
        """The wrapped store (what is really stored)."""
        return self._store

    @property
    def supports_consolidated_metadata(self) -> bool:
        return self._store.supports_consolidated_metadata

    # -- metadata --------------------------------------------------------------------

    def recorded_metadata(self, path: str) -> dict[str, Any] | None:
        """The stored ``zarr.json`` of the array at ``path`` as this wrapper recorded it
        when the array was opened (memory only), else None."""
        doc = getattr(self._registry.get(path), "metadata", None)
        return doc if isinstance(doc, dict) else None

    async def _register(self, path: str, doc: object) -> _ArrayEntry | _NotArray:
        """Record what ``path/zarr.json`` says; build the stack (MetadataError if bad)."""
        if not isinstance(doc, dict) or doc.get("node_type") != "array":
            node: _ArrayEntry | _NotArray = _NOT_ARRAY
            if isinstance(doc, dict):
                self._register_consolidated(path, doc)
        elif doc.get("storage_transformers"):
            stack = build_stack(list(doc["storage_transformers"]), doc, StoreIO(self._store, path))
            node = _transformed_entry(path, doc, stack)
        else:
            node = _ArrayEntry(path, doc, None, None)
        self._registry.put(path, node)
        return node

    def _register_consolidated(self, group_path: str, doc: dict[str, Any]) -> None:
        """Arrays described only in a group's consolidated metadata are opened from there."""
        for rel, sub in _consolidated_entries(doc):
            if is_transformed_array(sub):
                path = _join(group_path, rel)
                stack = build_stack(
                    list(sub["storage_transformers"]), sub, StoreIO(self._store, path)
                )
                entry = _transformed_entry(path, sub, stack)
                self._registry.put(path, entry)

    async def _load(self, path: str) -> _ArrayEntry | _NotArray:
        buf = await self._store.get(_join(path, METADATA_KEY), default_buffer_prototype())
        if buf is None:
            self._registry.put(path, _NOT_ARRAY)
            return _NOT_ARRAY
        raw = buf.to_bytes()
        try:
            # a document too large or deep to read describes no transformers we could use
            doc = None if metadata_problem(raw, path) else json.loads(raw)
        except ValueError:
            doc = None
        return await self._register(path, doc)

    def _present(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The document zarr-python sees: no storage_transformers anywhere."""
        out = {k: v for k, v in doc.items() if k != "storage_transformers"}
        cm = out.get("consolidated_metadata")
        if isinstance(cm, dict) and isinstance(cm.get("metadata"), dict):
            out["consolidated_metadata"] = {
                **cm,
                "metadata": {
                    k: (
                        {kk: vv for kk, vv in v.items() if kk != "storage_transformers"}
                        if isinstance(v, dict)
                        else v
                    )
                    for k, v in cm["metadata"].items()
                },
            }
        return out

    def _inject(self, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Put back the storage_transformers zarr-python dropped when rewriting ``doc``."""
        if doc.get("node_type") == "array" and not doc.get("storage_transformers"):
            node = self._registry.get(path)
            if isinstance(node, _ArrayEntry) and node.stack is not None:
                doc = {**doc, "storage_transformers": node.metadata["storage_transformers"]}
        cm = doc.get("consolidated_metadata")
        if isinstance(cm, dict) and isinstance(cm.get("metadata"), dict):
            meta = dict(cm["metadata"])
            for rel, sub in meta.items():
                if (
                    isinstance(sub, dict)
                    and sub.get("node_type") == "array"
                    and not sub.get("storage_transformers")
                ):
                    node = self._registry.get(_join(path, rel))
                    if isinstance(node, _ArrayEntry) and node.stack is not None:
                        meta[rel] = {
                            **sub,
                            "storage_transformers": node.metadata["storage_transformers"],
                        }
            doc = {**doc, "consolidated_metadata": {**cm, "metadata": meta}}
        return doc

    async def attach_transformers(self, path: str, transformers: list[dict[str, Any]]) -> None:
        """Add ``storage_transformers`` to the (chunk-less) array at ``path`` and register it.

        The stack is validated first (MetadataError, nothing written, if bad).
        """
        key = _join(path, METADATA_KEY)
        buf = await self._store.get(key, default_buffer_prototype())
        if buf is None:
            raise FileNotFoundError(key)
        doc = json.loads(buf.to_bytes())
        doc["storage_transformers"] = list(transformers)
        build_stack(list(transformers), doc, StoreIO(self._store, path), for_writing=True)
        await self._store.set(key, default_buffer_prototype().buffer.from_bytes(_dumps(doc)))
        await self._register(path, doc)

    # -- routing ---------------------------------------------------------------------

    async def _route(self, key: str) -> tuple[ChunkIO, str] | None:
        """(stack, key relative to the array) when ``key`` is a chunk key of a transformed array."""
        if _basename(key) in _METADATA_NAMES:
            return None
        ancestors = _ancestors(key)
        nodes = [self._registry.get(p) for p in ancestors]
        entry: _ArrayEntry | None = next((n for n in nodes if isinstance(n, _ArrayEntry)), None)
        if entry is None:
            # Safety net: a directory never seen; read metadata shallowest first, stop at an array.
            for path, node in zip(ancestors, nodes, strict=True):
                if node is None:
                    node = await self._load(path)
                if isinstance(node, _ArrayEntry):
                    entry = node
                    break
        if entry is None or entry.stack is None:
            return None
        rel = key[len(entry.path) + 1 :] if entry.path else key
        return (entry.stack, rel) if entry.is_chunk_key(rel) else None

    async def _container(self, prefix: str) -> _ArrayEntry | None:
        """The transformed array whose directory is, or contains, ``prefix``."""
        parts = [p for p in prefix.strip("/").split("/") if p]
        for i in range(len(parts) + 1):
            path = "/".join(parts[:i])
            node = self._registry.get(path)
            if node is None:
                node = await self._load(path)
            if isinstance(node, _ArrayEntry):
                return node if node.stack is not None else None
        return None

    # -- Store API -------------------------------------------------------------------

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if _basename(key) == METADATA_KEY:
            return await self._get_metadata(key, prototype, byte_range)
        routed = await self._route(key)
        if routed is None:
            buf = await self._store.get(key, prototype, byte_range)
            if buf is not None and byte_range is None and is_metadata_key(key):
                try:  # v2 documents: zarr-python parses them next
                    doc = load_metadata(buf.to_bytes(), key)
                except MetadataError:
                    raise
                except ValueError:
                    return buf  # not JSON: zarr-python says so
                if (problem := consolidated_problem(doc, key)) is not None:
                    _log.warning("%s: not used, the store is listed instead", problem)
                    return None  # (as if there were none)
            return buf
        stack, rel = routed
        data = await stack.get(rel, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def _get_metadata(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None
    ) -> Buffer | None:
        buf = await self._store.get(key, default_buffer_prototype())
        if buf is None:
            self._registry.put(_dirname(key), _NOT_ARRAY)
            return None
        raw = buf.to_bytes()
        try:  # too large, too deep or past zfuse's bounds: the node is not read (MetadataError)
            doc = load_metadata(raw, key)
        except MetadataError:
            raise
        except ValueError:
            doc = None  # not JSON: not ours to judge; zarr will complain
        await self._register(_dirname(key), doc)
        if (problem := consolidated_problem(doc, key)) is not None:
            _log.warning("%s: not used, the store is listed instead", problem)
            doc = {k: v for k, v in doc.items() if k != "consolidated_metadata"}
            raw = _dumps(self._present(doc))
        elif isinstance(doc, dict) and (
            is_transformed_array(doc) or _has_transformed_consolidated(doc)
        ):
            raw = _dumps(self._present(doc))
        return self._ranged(raw, prototype, byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        routed = await self._route(key)
        if routed is None:
            return await self._store.exists(key)
        stack, rel = routed
        return await stack.exists(rel)

    async def getsize(self, key: str) -> int:
        if _basename(key) == METADATA_KEY:
            buf = await self.get(key, default_buffer_prototype())
            if buf is None:
                raise FileNotFoundError(key)
            return len(buf)
        routed = await self._route(key)
        if routed is None:
            return await self._store.getsize(key)
        stack, rel = routed
        return await stack.getsize(rel)

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        if _basename(key) == METADATA_KEY:
            await self._set_metadata(key, value)
            return
        routed = await self._route(key)
        if routed is None:
            await self._store.set(key, value)
            return
        stack, rel = routed
        await stack.set(rel, value.to_bytes())

    async def _set_metadata(self, key: str, value: Buffer) -> None:
        path = _dirname(key)
        try:
            doc = json.loads(value.to_bytes())
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            new = self._inject(path, doc)
            if new is not doc:
                value = default_buffer_prototype().buffer.from_bytes(_dumps(new))
                doc = new
            if is_transformed_array(doc):
                # validate before writing: a bad stack must leave the store unchanged
                build_stack(list(doc["storage_transformers"]), doc, StoreIO(self._store, path))
        await self._store.set(key, value)
        await self._register(path, doc)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        await asyncio.gather(*(self.set(k, v) for k, v in values))

    async def delete(self, key: str) -> None:
        self._check_writable()
        if _basename(key) == METADATA_KEY:
            self._registry.purge(_dirname(key))
            await self._store.delete(key)
            return
        routed = await self._route(key)
        if routed is None:
            await self._store.delete(key)
            return
        stack, rel = routed
        await stack.delete(rel)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        norm = prefix.strip("/")
        entry = await self._container(prefix)
        if entry is not None and norm != entry.path:
            # Inside a transformed array: delete the logical chunks under the prefix.
            for key in [k async for k in self.list_prefix(norm + "/")]:
                await self.delete(key)
            return
        await self._store.delete_dir(prefix)
        self._registry.purge(norm)

    async def clear(self) -> None:
        await self._store.clear()
        self._registry.purge("")

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        raw = [k async for k in self._store.list_prefix(prefix)]
        arrays: dict[str, _ArrayEntry] = {}
        for key in raw:
            if _basename(key) == METADATA_KEY:
                path = _dirname(key)
                node = self._registry.get(path)
                if node is None:
                    node = await self._load(path)
                if isinstance(node, _ArrayEntry) and node.stack is not None:
                    arrays[path] = node
        container = await self._container(prefix) if prefix else None
        if container is not None:
            arrays[container.path] = container
        _metadata_keys = {_join(p, METADATA_KEY) for p in arrays}

        def hidden(key: str) -> bool:
            # raw objects inside a transformed array's directory, except its zarr.json
            # (checked through the key's ancestors: O(depth), not O(arrays))
            if not arrays or key in _metadata_keys:
                return False
            return any(p in arrays for p in _ancestors(key))

        for key in raw:
            if not hidden(key):
                yield key
        for path, entry in arrays.items():
            assert entry.stack is not None
            for rel in sorted(await entry.stack.list_keys()):
                if entry.is_chunk_key(rel):
                    key = _join(path, rel)
                    if key.startswith(prefix):
                        yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        entry = await self._container(prefix)
        # Outside any transformed array the wrapped store's own list_dir is exact (and cheaper).
        listing = self._store.list_dir(prefix) if entry is None else super().list_dir(prefix)
        async for key in listing:
            yield key


def _consolidated_entries(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    cm = doc.get("consolidated_metadata")
    if isinstance(cm, dict) and isinstance(cm.get("metadata"), dict):
        return list(cm["metadata"].items())
    return []


def _has_transformed_consolidated(doc: dict[str, Any]) -> bool:
    return any(is_transformed_array(sub) for _, sub in _consolidated_entries(doc))
