"""Storage transformers for zarr-python 3: the store wrapper and the layer machinery.

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
  the array's rank.
* Transformers stack in list order: ``storage_transformers[0]`` is nearest the
  array, the last one nearest the store.  Each layer is a :class:`ChunkIO` whose
  keys are relative to the array's directory (``"c/0/0"``).
* Listing presents the logical view: under a transformed array the raw part /
  shard objects are hidden and the existing chunk keys are listed instead.
* Unknown transformer names or types raise :class:`zfuse.errors.MetadataError`
  naming them, when the metadata is read (before any chunk is touched).
"""

from __future__ import annotations

import asyncio
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.core.chunk_key_encodings import (
    ChunkKeyEncoding,
    DefaultChunkKeyEncoding,
    parse_chunk_key_encoding,
)
from zarr.storage import WrapperStore

from zfuse.errors import MetadataError

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "ChunkIO",
    "StoreIO",
    "TransformerStore",
    "build_stack",
    "chunk_key_encoding_of",
    "decode_chunk_key",
    "is_transformed_array",
    "slice_for_request",
]

METADATA_KEY = "zarr.json"
# Keys that are never chunk keys, whatever the encoding says.
_METADATA_NAMES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


# --------------------------------------------------------------------------- layers


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
            if k[n:] not in _METADATA_NAMES
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


# --------------------------------------------------------------------------- stack building

SHARDING_V1_URIS = frozenset(
    {
        "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
        # the seed's own (draft) spelling of the URI
        "http://purl.org/zarr/spec/storage-transformers/sharding/1.0",
    }
)
CONCAT_PARTS_NAME = "concat-parts"


def transformer_kind(doc: object, index: int) -> str:
    """``"sharding_v1"`` or ``"concat-parts"``; MetadataError for anything else."""
    field = f"storage_transformers[{index}]"
    if not isinstance(doc, dict):
        raise MetadataError(f"{field} must be an object, got {doc!r}")
    name = doc.get("name", doc.get("extension"))
    if doc.get("extension") in SHARDING_V1_URIS or name in SHARDING_V1_URIS or name == "sharding":
        return "sharding_v1"
    if name == CONCAT_PARTS_NAME:
        return "concat-parts"
    raise MetadataError(
        f"{field}: unknown storage transformer {name!r} "
        f"(zfuse knows 'concat-parts' and sharding v1 "
        f"'https://purl.org/zarr/spec/storage_transformers/sharding/1.0' / 'sharding')"
    )


def decode_chunk_key(encoding: ChunkKeyEncoding, key: str) -> tuple[int, ...] | None:
    """Chunk coordinates of ``key`` under ``encoding``, or None if it is not one of its keys.

    A key counts only if it round-trips (encode(decode(key)) == key).  zarr 3.1.6's
    DefaultChunkKeyEncoding.decode_chunk_key fails on every non-scalar key (it keeps the
    leading separator), so the default encoding is decoded here.
    """
    try:
        if isinstance(encoding, DefaultChunkKeyEncoding):
            if key == "c":
                coords: tuple[int, ...] = ()
            elif key.startswith("c" + encoding.separator):
                coords = tuple(int(c) for c in key[2:].split(encoding.separator))
            else:
                return None
        else:
            coords = tuple(int(c) for c in encoding.decode_chunk_key(key))
    except Exception:  # any decoding failure simply means "not a chunk key"
        return None
    if any(c < 0 for c in coords) or encoding.encode_chunk_key(coords) != key:
        return None
    return coords


def chunk_key_encoding_of(metadata: dict[str, Any]) -> ChunkKeyEncoding:
    """The array's chunk key encoding (MetadataError if zarr cannot parse it)."""
    try:
        return parse_chunk_key_encoding(metadata.get("chunk_key_encoding", {"name": "default"}))
    except Exception as e:  # zarr raises ValueError/TypeError/KeyError variously
        raise MetadataError(f"chunk_key_encoding: {e}") from e


def build_stack(
    transformers: list[dict[str, Any]],
    metadata: dict[str, Any],
    base: ChunkIO,
    *,
    for_writing: bool = False,
) -> ChunkIO:
    """Wrap ``base`` in one layer per transformer; the returned layer is nearest the array.

    Raises MetadataError for unknown/ill-configured transformers.  With
    ``for_writing`` also refuses configurations that can only be read (a
    concat-parts list with more than one unsized part).
    """
    # Imported here: the layer modules import ChunkIO from this module.
    from zfuse.ext.concat_parts import ConcatPartsIO, parse_concat_parts
    from zfuse.ext.sharding_v1 import ShardingV1IO, parse_sharding_v1

    if not isinstance(transformers, list | tuple):
        raise MetadataError(f"storage_transformers must be a list, got {transformers!r}")
    shape = metadata.get("shape")
    if not isinstance(shape, list | tuple):
        raise MetadataError(f"shape must be a list, got {shape!r}")
    rank = len(shape)
    kinds = [transformer_kind(t, i) for i, t in enumerate(transformers)]
    # concat-parts turns a chunk key into part keys that are no longer chunk keys, so a
    # sharding layer below it (later in the list) would have nothing it can decode.
    for i, kind in enumerate(kinds):
        if kind == "sharding_v1" and "concat-parts" in kinds[:i]:
            raise MetadataError(
                f"storage_transformers[{i}]: sharding v1 cannot sit below concat-parts "
                f"(storage_transformers[{kinds.index('concat-parts')}]); list sharding first"
            )
    encoding = chunk_key_encoding_of(metadata) if "sharding_v1" in kinds else None
    io = base
    for i in reversed(range(len(transformers))):
        doc, kind = transformers[i], kinds[i]
        if kind == "concat-parts":
            cfg = parse_concat_parts(doc, field=f"storage_transformers[{i}]")
            if for_writing:
                cfg.check_writable()
            io = ConcatPartsIO(io, cfg)
        else:
            assert encoding is not None
            cps = parse_sharding_v1(doc, rank, field=f"storage_transformers[{i}]")
            io = ShardingV1IO(io, cps, encoding)
    return io


def is_transformed_array(doc: object) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("node_type") == "array"
        and bool(doc.get("storage_transformers"))
    )


# --------------------------------------------------------------------------- registry


@dataclass
class _ArrayEntry:
    path: str
    metadata: dict[str, Any]  # as stored, storage_transformers included
    encoding: ChunkKeyEncoding | None
    rank: int
    stack: ChunkIO | None  # None: a plain array, nothing to route

    def is_chunk_key(self, rel: str) -> bool:
        if self.encoding is None or rel in _METADATA_NAMES:
            return False
        coords = decode_chunk_key(self.encoding, rel)
        return coords is not None and len(coords) == self.rank


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


class GetManyThroughGet:
    """WrapperStore sends `_get_many` straight to the wrapped store; a wrapper that
    rewrites keys or values in `get` must route it through its own `get`."""

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)  # type: ignore[attr-defined]


class TransformerStore(GetManyThroughGet, WrapperStore[Store]):
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

    async def _register(self, path: str, doc: object) -> _ArrayEntry | _NotArray:
        """Record what ``path/zarr.json`` says; build the stack (MetadataError if bad)."""
        if not isinstance(doc, dict) or doc.get("node_type") != "array":
            node: _ArrayEntry | _NotArray = _NOT_ARRAY
            if isinstance(doc, dict):
                self._register_consolidated(path, doc)
        elif doc.get("storage_transformers"):
            stack = build_stack(list(doc["storage_transformers"]), doc, StoreIO(self._store, path))
            node = _ArrayEntry(path, doc, chunk_key_encoding_of(doc), len(doc["shape"]), stack)
        else:
            node = _ArrayEntry(path, doc, None, len(doc.get("shape") or ()), None)
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
                entry = _ArrayEntry(path, sub, chunk_key_encoding_of(sub), len(sub["shape"]), stack)
                self._registry.put(path, entry)

    async def _load(self, path: str) -> _ArrayEntry | _NotArray:
        buf = await self._store.get(_join(path, METADATA_KEY), default_buffer_prototype())
        if buf is None:
            self._registry.put(path, _NOT_ARRAY)
            return _NOT_ARRAY
        try:
            doc = json.loads(buf.to_bytes())
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
            return await self._store.get(key, prototype, byte_range)
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
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None  # not ours to judge; zarr will complain
        await self._register(_dirname(key), doc)
        if isinstance(doc, dict) and (
            is_transformed_array(doc) or _has_transformed_consolidated(doc)
        ):
            raw = _dumps(self._present(doc))
        start, stop = slice_for_request(len(raw), byte_range)
        return prototype.buffer.from_bytes(raw[start:stop])

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

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        if not await self.exists(key):
            await self.set(key, value)

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

    def list(self) -> AsyncIterator[str]:
        return self.list_prefix("")

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
        norm = prefix.strip("/")
        entry = await self._container(prefix)
        if entry is None:
            async for key in self._store.list_dir(prefix):
                yield key
            return
        base = norm + "/" if norm else ""
        seen: set[str] = set()
        async for key in self.list_prefix(base):
            child = key[len(base) :].split("/", 1)[0]
            if child not in seen:
                seen.add(child)
                yield child


def _consolidated_entries(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    cm = doc.get("consolidated_metadata")
    if isinstance(cm, dict) and isinstance(cm.get("metadata"), dict):
        return list(cm["metadata"].items())
    return []


def _has_transformed_consolidated(doc: dict[str, Any]) -> bool:
    return any(is_transformed_array(sub) for _, sub in _consolidated_entries(doc))
