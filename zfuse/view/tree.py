"""The mounted view as a tree of paths, with no FUSE in it.

Paths are tuples of names relative to the mount root. The tree holds:
groups and arrays (directories), each node's ``zarr.json`` (a file), the
directories that chunk keys imply (``c/``, ``c/0/``) and chunk files named by
the array's own chunk key plus ``.tiff``.

Invariants:
- The size of a chunk file comes from metadata alone (the TIFF layout), so
  `entry()` never reads chunk data. Knowing *which* chunks exist needs one
  listing of the array's keys (and shard indexes for sharded arrays); that is
  done once per array by `ArrayView.ensure_listed()` and kept until
  `refresh()`.
- Chunk bytes are the generated header followed by the chunk's values in C
  order, little endian (`bytes` codec order): the same bytes the view's
  dual-access ``zarr.json`` (suffix ``.tiff`` keys, codecs bytes + pad)
  describes.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import zarr

from zfuse.stats import Stats
from zfuse.view.source import ChunkSource, Coords, ZarrChunkSource
from zfuse.view.tiff import TiffLayout, build_header, plan_layout, tiff_unsupported_reason
from zfuse.view.whole_image import NAMES as IMAGE_NAMES
from zfuse.view.whole_image import WholeImage, plan_whole_images

log = logging.getLogger("zfuse.view")

CHUNK_SUFFIX = ".tiff"
META_NAME = "zarr.json"
DIR, FILE = "dir", "file"


@dataclass
class ViewOptions:
    all_chunks: bool = False
    crop_edges: bool = False
    cache_bytes: int = 256 * 1024 * 1024
    read_only: bool = False


class Entry(NamedTuple):
    """What is at one path: a directory, a metadata file or a chunk file.

    A NamedTuple, not a dataclass: `ls -lR` of 100,000 chunks builds one per
    file, and tuple construction is several times cheaper.
    """

    kind: str
    size: int = 0
    array: ArrayView | None = None
    coords: Coords | None = None
    content: bytes | None = None  # metadata files
    node: str = ""  # "group" | "array" | "keydir" | "meta" | "chunk" | "image"
    reader: Any = None  # node "image": the whole-image file (size, read_cached, read)


class ChunkCache:
    """A bounded LRU of decoded chunk bytes, keyed by (array id, coords)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[tuple[int, Coords], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, Coords]) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return data

    def contains(self, key: tuple[int, Coords]) -> bool:
        with self._lock:
            return key in self._items

    def peek(self, key: tuple[int, Coords]) -> bytes | None:
        """A cache hit without a miss being counted (the caller falls back to `get`)."""
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return data

    def put(self, key: tuple[int, Coords], data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= len(old)
            self._items[key] = data
            self.used += len(data)
            while self.used > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self.used -= len(evicted)

    def drop(self, key: tuple[int, Coords]) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.used = 0


@dataclass
class _KeyDir:
    """A directory implied by chunk keys: name -> subdirectory or chunk coords."""

    children: dict[str, _KeyDir | Coords] = field(default_factory=dict)


class ArrayView:
    """One array's directory: its view metadata and its chunk files."""

    def __init__(
        self,
        source: ChunkSource,
        options: ViewOptions,
        cache: ChunkCache,
        ome: dict[str, Any] | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.source = source
        self.options = options
        self.cache = cache
        self.stats = stats or Stats()
        self.unsupported: str | None = tiff_unsupported_reason(source.dtype)
        self.layout: TiffLayout | None = None
        if self.unsupported is None:
            ome = ome or {}
            self.layout = plan_layout(
                source.chunk_shape,
                source.dtype,
                axes=ome.get("axes"),
                axis_types=ome.get("axis_types"),
                scales=ome.get("scales"),
                units=ome.get("units"),
                grid_shape=source.grid_shape,
                array_shape=source.shape,
            )
        self._root: _KeyDir | None = None
        self._stale = False
        self._existing: set[Coords] = set()
        self._lock = threading.Lock()
        self._inflight: dict[Coords, threading.Lock] = {}
        self.changes = 0  # chunks written or deleted through the view
        self.metadata_bytes = self._view_metadata()

    # -- names ------------------------------------------------------------
    def file_parts(self, coords: Coords) -> tuple[str, ...]:
        return tuple((self.source.chunk_key(coords) + CHUNK_SUFFIX).split("/"))

    def coords_of(self, parts: tuple[str, ...]) -> Coords | None:
        """The chunk a file path names, if it names one inside the grid."""
        if not parts or not parts[-1].endswith(CHUNK_SUFFIX):
            return None
        key = "/".join(parts)[: -len(CHUNK_SUFFIX)]
        return self._decode_key(key)

    def _decode_key(self, key: str) -> Coords | None:
        coords = self.source.decode_key(key)
        if coords is None or not self.source.in_grid(coords):
            return None
        return coords

    # -- listing ----------------------------------------------------------
    @property
    def listed(self) -> bool:
        return self._root is not None and not self._stale

    def ensure_listed(self) -> None:
        """List the array's existing chunks once (store I/O: call from a worker thread)."""
        if self.listed:
            return
        if self.layout is None:
            self._root, self._stale = _KeyDir(), False
            return
        root = _KeyDir()
        existing = set()
        if self.options.all_chunks:
            for coords in np.ndindex(*self.source.grid_shape):
                existing.add(coords)
                _insert(root, self.file_parts(coords), coords)
        else:
            for coords, key in self.source.list_chunk_keys():
                existing.add(coords)
                _insert(root, tuple((key + CHUNK_SUFFIX).split("/")), coords)
        with self._lock:
            self._root, self._existing, self._stale = root, existing, False

    def refresh(self) -> None:
        # Mark stale rather than clearing: lookups racing with the refresh keep the
        # old listing until `ensure_listed` swaps in the new one (never a false ENOENT).
        self._stale = True
        self.source.invalidate()

    def add_chunk(self, coords: Coords) -> None:
        with self._lock:
            if self._root is not None and coords not in self._existing:
                self._existing.add(coords)
                _insert(self._root, self.file_parts(coords), coords)

    def remove_chunk(self, coords: Coords) -> None:
        with self._lock:
            if self._root is None or coords not in self._existing:
                return
            if self.options.all_chunks:
                return  # every grid position stays listed; a missing one reads as fill
            self._existing.discard(coords)
            _remove(self._root, self.file_parts(coords))

    def exists(self, coords: Coords) -> bool:
        return coords in self._existing

    def successors(self, coords: Coords, count: int) -> list[Coords]:
        """The next `count` existing chunks after `coords` in C order (for read-ahead)."""
        grid = self.source.grid_shape
        out: list[Coords] = []
        current = list(coords)
        for _ in range(count * 4):  # skip a few missing positions, not the whole grid
            for axis in range(len(grid) - 1, -1, -1):
                current[axis] += 1
                if current[axis] < grid[axis]:
                    break
                current[axis] = 0
            else:
                return out
            candidate = tuple(current)
            if candidate in self._existing:
                out.append(candidate)
                if len(out) == count:
                    break
        return out

    def is_cached(self, coords: Coords) -> bool:
        return self.cache.contains((id(self), coords))

    def keydir(self, parts: tuple[str, ...]) -> _KeyDir | None:
        node: _KeyDir | Coords | None = self._root
        for name in parts:
            if not isinstance(node, _KeyDir):
                return None
            node = node.children.get(name)
        return node if isinstance(node, _KeyDir) else None

    def is_key_prefix(self, parts: tuple[str, ...]) -> bool:
        """Whether `parts` is a directory some chunk key of the grid would live in."""
        if not parts:
            return True
        origin = self.file_parts(tuple(0 for _ in self.source.shape))
        if len(parts) >= len(origin):
            return False
        probe = _decode_dir(self, parts)
        return probe

    # -- bytes ------------------------------------------------------------
    def file_size(self, coords: Coords) -> int:
        assert self.layout is not None
        if self.options.crop_edges:
            region = self.source.chunk_region(coords)
            n = int(np.prod([r.stop - r.start for r in region])) * self.source.dtype.itemsize
            return self.layout.header_size + n
        return self.layout.file_size

    def header(self, coords: Coords) -> bytes:
        assert self.layout is not None
        region = self.source.chunk_region(coords)
        origin = tuple(r.start for r in region)
        if self.options.crop_edges:
            shape = tuple(r.stop - r.start for r in region)
            if shape != tuple(self.source.chunk_shape):
                return build_header(self.layout, coords, shape=shape, origin=origin)
        return build_header(self.layout, coords, origin=origin)

    def pixel_bytes(self, coords: Coords) -> bytes:
        """The chunk's values as stored after the header (decoded once, then cached)."""
        key = (id(self), coords)
        data = self.cache.get(key)
        if data is not None:
            return data
        # Single flight: the kernel reads one file in several concurrent
        # requests; only the first decodes, the others wait for it.
        with self._lock:
            flight = self._inflight.setdefault(coords, threading.Lock())
        with flight:
            data = self.cache.get(key)
            if data is not None:
                return data
            try:
                data = self._decode(coords)
            finally:
                with self._lock:
                    self._inflight.pop(coords, None)
            self.cache.put(key, data)
            return data

    def _decode(self, coords: Coords) -> bytes:
        started = time.perf_counter()
        # a chunk we listed must still be there; with --all-chunks missing is fill
        must_exist = not self.options.all_chunks and coords in self._existing
        values = self.source.read_chunk(coords, must_exist=must_exist)
        self.stats.count("chunks_decoded")
        self.stats.count("decode_seconds", time.perf_counter() - started)
        if self.options.crop_edges:
            region = self.source.chunk_region(coords)
            values = values[tuple(slice(0, r.stop - r.start) for r in region)]
        return to_pixel_bytes(values, self.source.dtype)

    def read_cached(self, coords: Coords, offset: int, size: int) -> bytes | None:
        """Like `read` but only from memory; None when the chunk must be decoded."""
        assert self.layout is not None
        hsize = self.layout.header_size
        end = min(offset + size, self.file_size(coords))
        if offset >= end:
            return b""
        if end <= hsize:
            return self.header(coords)[offset:end]
        pixels = self.cache.peek((id(self), coords))
        if pixels is None:
            return None
        head = self.header(coords)[offset:hsize] if offset < hsize else b""
        return head + pixels[max(offset - hsize, 0) : end - hsize]

    def read(self, coords: Coords, offset: int, size: int) -> bytes:
        """Bytes [offset, offset+size) of the chunk file (may decode: worker thread)."""
        assert self.layout is not None
        hsize = self.layout.header_size
        end = min(offset + size, self.file_size(coords))
        if offset >= end:
            return b""
        out = []
        if offset < hsize:
            out.append(self.header(coords)[offset : min(end, hsize)])
        if end > hsize:
            pixels = self.pixel_bytes(coords)
            out.append(pixels[max(offset - hsize, 0) : end - hsize])
        return b"".join(out) if len(out) > 1 else out[0]

    def forget(self, coords: Coords) -> None:
        self.cache.drop((id(self), coords))
        self.changes += 1  # whole-image files with stored byte counts re-plan

    # -- metadata -----------------------------------------------------------
    def _view_metadata(self) -> bytes:
        """The view's dual-access zarr.json: chunks are `.tiff` keys holding bytes + pad."""
        meta = dict(self.source.v3_metadata())
        meta.pop("storage_transformers", None)
        meta["chunk_grid"] = {
            "name": "regular",
            "configuration": {"chunk_shape": list(self.source.chunk_shape)},
        }
        if self.layout is None:
            meta["attributes"] = dict(meta.get("attributes") or {})
            meta["attributes"]["zfuse"] = {"unsupported": self.unsupported}
            return json.dumps(meta, indent=2).encode()
        meta["chunk_key_encoding"] = {
            "name": "suffix",
            "configuration": {
                "suffix": CHUNK_SUFFIX,
                "base_encoding": self.source.key_encoding_dict(),
            },
        }
        first = build_header(self.layout, tuple(0 for _ in self.source.shape))
        bytes_codec: dict[str, Any] = {"name": "bytes"}
        if self.source.dtype.itemsize > 1 and self.source.dtype.kind != "b":
            bytes_codec["configuration"] = {"endian": "little"}
        meta["codecs"] = [
            bytes_codec,
            {
                "name": "pad",
                "configuration": {
                    "location": "start",
                    "nbytes": self.layout.header_size,
                    # the first chunk's header: zarr-python writing through the
                    # mount then produces valid TIFFs (the position tag is ignored)
                    "padding": base64.b64encode(first).decode("ascii"),
                },
            },
        ]
        return json.dumps(meta, indent=2).encode()


def to_pixel_bytes(values: np.ndarray, dtype: np.dtype) -> bytes:
    """C-order little-endian bytes, as the `bytes` codec and the TIFF header say."""
    if dtype.kind == "b":
        return np.ascontiguousarray(values, dtype=np.uint8).tobytes()
    return np.ascontiguousarray(values, dtype=dtype.newbyteorder("<")).tobytes()


def _decode_dir(view: ArrayView, parts: tuple[str, ...]) -> bool:
    """Whether a directory path is a prefix of some in-grid chunk file path."""
    # Directory levels of the standard encodings hold one coordinate each
    # (after a leading "c" for the default encoding): check each is in range.
    origin = view.file_parts(tuple(0 for _ in view.source.shape))
    coord_dirs = [i for i, name in enumerate(origin[:-1]) if name.isdigit()]
    grid = view.source.grid_shape
    for depth, name in enumerate(parts):
        if depth not in coord_dirs:
            if name != origin[depth]:
                return False
            continue
        axis = coord_dirs.index(depth)
        if not name.isdigit() or str(int(name)) != name or int(name) >= grid[axis]:
            return False
    return True


def _insert(root: _KeyDir, parts: tuple[str, ...], coords: Coords) -> None:
    node = root
    for name in parts[:-1]:
        child = node.children.get(name)
        if not isinstance(child, _KeyDir):
            child = _KeyDir()
            node.children[name] = child
        node = child
    node.children[parts[-1]] = coords


def _remove(root: _KeyDir, parts: tuple[str, ...]) -> None:
    trail = [root]
    for name in parts[:-1]:
        child = trail[-1].children.get(name)
        if not isinstance(child, _KeyDir):
            return
        trail.append(child)
    trail[-1].children.pop(parts[-1], None)
    # prune directories the removal emptied
    for depth in range(len(parts) - 2, -1, -1):
        if trail[depth + 1].children:
            break
        trail[depth].children.pop(parts[depth], None)


@dataclass
class _Node:
    """A group or array of the hierarchy."""

    kind: str  # "group" | "array"
    children: dict[str, _Node] = field(default_factory=dict)
    array: ArrayView | None = None
    metadata: bytes = b""


class View:
    """The whole mount: a hierarchy of groups and arrays, addressed by path."""

    def __init__(self, root: _Node, options: ViewOptions, cache: ChunkCache) -> None:
        self.root = root
        self.options = options
        self.cache = cache
        self._images: dict[tuple[str, ...], dict[str, WholeImage]] = {}
        self._images_lock = threading.Lock()

    def arrays(self) -> Iterator[tuple[tuple[str, ...], ArrayView]]:
        def walk(node: _Node, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], ArrayView]]:
            if node.array is not None:
                yield path, node.array
            for name, child in node.children.items():
                yield from walk(child, (*path, name))

        yield from walk(self.root, ())

    def _split(self, path: tuple[str, ...]) -> tuple[_Node, tuple[str, ...]]:
        """The deepest group/array node on `path`, and the rest of the path."""
        node = self.root
        for i, name in enumerate(path):
            child = node.children.get(name)
            if child is None:
                return node, path[i:]
            node = child
        return node, ()

    def array_at(self, path: tuple[str, ...]) -> tuple[ArrayView | None, tuple[str, ...]]:
        node, rest = self._split(path)
        return node.array, rest

    def entry(self, path: tuple[str, ...]) -> Entry | None:
        """What is at `path`, from memory (the array at `path` must be listed)."""
        node, rest = self._split(path)
        if not rest:
            return Entry(DIR, node=node.kind, array=node.array)
        if rest == (META_NAME,):
            return Entry(FILE, size=len(node.metadata), content=node.metadata, node="meta")
        if len(rest) == 1 and rest[0] in IMAGE_NAMES:
            image = self.whole_images(path[:-1], node).get(rest[0])
            if image is not None:
                return Entry(FILE, size=image.size, array=node.array, node="image", reader=image)
        arr = node.array
        if arr is None or arr.layout is None:
            return None
        keydir = arr.keydir(rest[:-1])
        child = keydir.children.get(rest[-1]) if keydir is not None else None
        if child is None:
            # A directory some chunk key of the grid would live in exists even
            # when empty, so `cp x c/3/0.tiff` works after `rm c/3/*`.
            return Entry(DIR, array=arr, node="keydir") if arr.is_key_prefix(rest) else None
        if isinstance(child, _KeyDir):
            return Entry(DIR, array=arr, node="keydir")
        return Entry(FILE, size=arr.file_size(child), array=arr, coords=child, node="chunk")

    def list_dir(self, path: tuple[str, ...]) -> list[tuple[str, Entry]]:
        """Entries of a directory, sorted by name (the array must be listed)."""
        node, rest = self._split(path)
        out: list[tuple[str, Entry]] = []
        if not rest:
            out.append(
                (META_NAME, Entry(FILE, size=len(node.metadata), content=node.metadata, node="meta"))
            )
            for name, child in node.children.items():
                out.append((name, Entry(DIR, node=child.kind, array=child.array)))
            for name, image in self.whole_images(path, node).items():
                out.append((name, Entry(FILE, size=image.size, array=node.array, node="image", reader=image)))
        arr = node.array
        if arr is not None and arr.layout is not None:
            keydir = arr.keydir(rest)
            if keydir is None and rest:
                return []
            if keydir is not None:
                for name, child in keydir.children.items():
                    if isinstance(child, _KeyDir):
                        out.append((name, Entry(DIR, array=arr, node="keydir")))
                    else:
                        size = arr.file_size(child)
                        out.append((name, Entry(FILE, size=size, array=arr, coords=child, node="chunk")))
        out.sort(key=lambda item: item[0])
        return out

    def refresh(self) -> None:
        self.cache.clear()
        with self._images_lock:
            self._images.clear()
        for _, arr in self.arrays():
            arr.refresh()

    def whole_images(self, path: tuple[str, ...], node: _Node | None = None) -> dict[str, WholeImage]:
        """The whole-image files directory `path` shows (planned from metadata, no I/O)."""
        with self._images_lock:
            images = self._images.get(path)
            if images is not None and not any(i.stale for i in images.values()):
                return images
        if node is None:
            node, rest = self._split(path)
            if rest:
                return {}
        parent = self._split(path[:-1])[0] if path else None
        images = plan_whole_images(path, node, parent)
        with self._images_lock:
            self._images[path] = images
        return images

    def all_whole_images(self) -> Iterator[tuple[tuple[str, ...], WholeImage]]:
        """Every whole-image file of the view, with its path."""

        def walk(node: _Node, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], WholeImage]]:
            for name, image in self.whole_images(path, node).items():
                yield (*path, name), image
            for name, child in node.children.items():
                yield from walk(child, (*path, name))

        yield from walk(self.root, ())


# -- building a view from a source -------------------------------------------


def _ome_for(group_attrs: dict[str, Any], array_name: str) -> dict[str, Any] | None:
    """Axis names/types/units and scales for `array_name` from OME-Zarr multiscales."""
    attrs = group_attrs.get("ome", group_attrs)
    multiscales = attrs.get("multiscales") if isinstance(attrs, dict) else None
    if not multiscales or not isinstance(multiscales, list):
        return None
    ms = multiscales[0]
    axes = ms.get("axes") or []
    names = [a["name"] if isinstance(a, dict) else str(a) for a in axes]
    types = [a.get("type") if isinstance(a, dict) else None for a in axes]
    units = [a.get("unit") if isinstance(a, dict) else None for a in axes]
    scales = None
    for ds in ms.get("datasets", []):
        if ds.get("path") == array_name:
            for t in ds.get("coordinateTransformations", []):
                if t.get("type") == "scale":
                    scales = [float(s) for s in t["scale"]]
    return {"axes": names or None, "axis_types": types or None, "units": units or None, "scales": scales}


def _group_metadata(group: zarr.Group) -> bytes:
    meta = {"zarr_format": 3, "node_type": "group", "attributes": dict(group.attrs)}
    return json.dumps(meta, indent=2).encode()


def build_view(
    obj: zarr.Group | zarr.Array | ChunkSource, options: ViewOptions, stats: Stats | None = None
) -> View:
    """The view of a zarr group/array (or any chunk source) opened by the caller."""
    cache = ChunkCache(options.cache_bytes)

    def array_node(source: ChunkSource, ome: dict[str, Any] | None) -> _Node:
        view = ArrayView(source, options, cache, ome, stats)
        if view.unsupported:
            log.warning("array %r shown without chunk files: %s", source.name, view.unsupported)
        return _Node("array", array=view, metadata=view.metadata_bytes)

    def group_node(group: zarr.Group) -> _Node:
        node = _Node("group", metadata=_group_metadata(group))
        attrs = dict(group.attrs)
        for name, member in sorted(group.members(), key=lambda m: m[0]):
            if isinstance(member, zarr.Group):
                node.children[name] = group_node(member)
            else:
                source = ZarrChunkSource(member, name=member.path)
                node.children[name] = array_node(source, _ome_for(attrs, name))
        return node

    if isinstance(obj, zarr.Group):
        root = group_node(obj)
    elif isinstance(obj, zarr.Array):
        root = array_node(ZarrChunkSource(obj, name=obj.path), None)
    else:
        root = array_node(obj, None)
    return View(root, options, cache)
