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
    meta/root/<path>.array.json            shape, data_type ("<u2", "bool", "u1", ...),
                                           chunk_grid {type, chunk_shape, separator},
                                           chunk_memory_layout "C"|"F", compressor
                                           {codec: URL, configuration}, fill_value,
                                           attributes, extensions, dimension_separator,
                                           storage_transformers [{extension, type, configuration}]
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
- ``storage_transformers`` are carried across unchanged except that the
  legacy ``extension`` key becomes today's ``name`` (and back), so the
  transformer machinery in ``zfuse.ext`` recognises sharding v1.

Mapping notes: ``data_type`` is read in zarr 2.18's spelling ("<u2", "u1",
"bool", complex as an extension object) and in acquire-driver-zarr's ("u2",
"<u1", later "uint16"; no byte order means its native little-endian); it is
written back in zarr 2.18's spelling. zarr 2.18 keeps v3 filters in
``attributes["filters"]``; arrays using them are refused, not misread.
``fill_value: null`` reads as the data type's zero. Array metadata is cached
per path; another process rewriting ``.array.json`` behind an open store is
not noticed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import WrapperStore

from zfuse.errors import MetadataError
from zfuse.ext.transformers import GetManyThroughGet

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

__all__ = ["LEGACY_FORMAT_URL", "LegacyV3Store", "is_legacy_entry_point", "wrap_if_legacy"]

LEGACY_FORMAT_URL = "https://purl.org/zarr/spec/protocol/core/3.0"
SHARDING_V1_URL = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
_CODEC_URL = "https://purl.org/zarr/spec/codec/"
_COMPLEX_URL = "https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/extensions/complex-dtypes/v1.0.html"

_META = "meta/"
_META_ROOT = "meta/root/"
_DATA_ROOT = "data/root/"
_ZARR_JSON = "zarr.json"

# zarr 2.18 writes numcodecs' integer blosc shuffle; today's blosc codec names it.
_BLOSC_SHUFFLE = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}
_BLOSC_SHUFFLE_BACK = {v: k for k, v in _BLOSC_SHUFFLE.items()}

# Legacy codec URL name -> today's codec name. gzip/blosc/zstd exist in zarr 3
# proper; the rest only as zarr-python's numcodecs wrappers (same byte format).
_COMPRESSORS = {
    "gzip": "gzip",
    "blosc": "blosc",
    "zstd": "zstd",
    "zlib": "numcodecs.zlib",
    "bz2": "numcodecs.bz2",
    "lz4": "numcodecs.lz4",
    "lzma": "numcodecs.lzma",
}
_COMPRESSORS_BACK = {v: k for k, v in _COMPRESSORS.items()}

_INT_NAMES = {("i", 1): "int8", ("i", 2): "int16", ("i", 4): "int32", ("i", 8): "int64"}
_INT_NAMES |= {("u", 1): "uint8", ("u", 2): "uint16", ("u", 4): "uint32", ("u", 8): "uint64"}
_FLOAT_NAMES = {("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64"}
_COMPLEX_NAMES = {("c", 8): "complex64", ("c", 16): "complex128"}
_NAMES = _INT_NAMES | _FLOAT_NAMES | _COMPLEX_NAMES
_NAMES_BACK = {v: k for k, v in _NAMES.items()}
_LEGACY_DTYPE = re.compile(r"^([<>|]?)([uifc])(\d+)$")


def is_legacy_entry_point(doc: object) -> bool:
    """True for a root ``zarr.json`` of the pre-release v3 layout (it has ``metadata_encoding``)."""
    return isinstance(doc, dict) and "metadata_encoding" in doc and doc.get("zarr_format") != 3


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
        doc = json.loads(buf.to_bytes())
    except ValueError:
        return store  # not JSON at all: not ours to judge, zarr will report it
    if not is_legacy_entry_point(doc):
        return store
    return LegacyV3Store(store, entry_point=doc)


def _check_entry_point(doc: dict[str, Any]) -> str:
    """Validate the legacy entry point; return its metadata key suffix."""
    for field in ("zarr_format", "metadata_encoding"):
        value = doc.get(field)
        if not isinstance(value, str) or not value.startswith(
            "https://purl.org/zarr/spec/protocol/core/3.0"
        ):
            raise MetadataError(
                f"pre-release v3 entry point zarr.json: unsupported {field} {value!r}"
            )
    _check_extensions(doc.get("extensions", []), "zarr.json")
    suffix = doc.get("metadata_key_suffix", ".json")
    if not isinstance(suffix, str):
        raise MetadataError(
            f"pre-release v3 entry point zarr.json: bad metadata_key_suffix {suffix!r}"
        )
    return suffix


def _check_extensions(extensions: object, where: str) -> None:
    if extensions is None:
        return
    if not isinstance(extensions, list):
        raise MetadataError(f"{where}: extensions must be a list, got {extensions!r}")
    for ext in extensions:
        # The pre-release spec made must_understand default to true.
        if not isinstance(ext, dict) or ext.get("must_understand", True) is not False:
            raise MetadataError(f"{where}: unsupported extension {ext!r} (must_understand)")


# ---------------------------------------------------------------------------
# metadata mapping, legacy -> today
# ---------------------------------------------------------------------------


def _legacy_dtype(value: object, where: str) -> tuple[str, str | None, int]:
    """Legacy ``data_type`` -> (today's name, endian or None, itemsize)."""
    raw = value
    if isinstance(value, dict):
        # Extended dtypes are {"extension": URL, "type": "<c8", "fallback": ...}; only complex maps.
        if value.get("extension") != _COMPLEX_URL:
            raise MetadataError(f"{where}: unsupported data_type {raw!r}")
        value = value.get("type")
    if value in ("bool", "|b1", "b1"):
        return "bool", None, 1
    if isinstance(value, str) and value in _NAMES_BACK and not value.startswith("complex"):
        # acquire-driver-zarr writes today's names ("uint16") into the pre-release
        # layout, with the camera's native (little-endian) bytes.
        kind, size = _NAMES_BACK[value]
        return value, (None if size == 1 else "little"), size
    if not isinstance(value, str) or (m := _LEGACY_DTYPE.match(value)) is None:
        raise MetadataError(f"{where}: unsupported data_type {raw!r}")
    order, kind, size_s = m.groups()
    size = int(size_s)
    name = _NAMES.get((kind, size))
    if name is None or (kind == "c") != isinstance(raw, dict):
        raise MetadataError(f"{where}: unsupported data_type {raw!r}")
    if size == 1:
        return name, None, 1
    if order == "|":
        raise MetadataError(f"{where}: data_type {raw!r}: multi-byte type without byte order")
    # No order at all ("u2"): older acquire-driver-zarr, native little-endian bytes.
    return name, ("big" if order == ">" else "little"), size


def _map_compressor(comp: object, itemsize: int, where: str) -> dict[str, Any]:
    if not isinstance(comp, dict) or not isinstance(comp.get("codec"), str):
        raise MetadataError(f"{where}: unsupported compressor {comp!r}")
    url: str = comp["codec"]
    m = re.fullmatch(re.escape(_CODEC_URL) + r"([a-z0-9]+)/1\.0", url)
    if m is None or m.group(1) not in _COMPRESSORS:
        raise MetadataError(f"{where}: unsupported compressor codec {url!r}")
    legacy_name = m.group(1)
    config = dict(comp.get("configuration") or {})
    config.pop("id", None)
    if legacy_name == "blosc":
        shuffle = config.get("shuffle", 1)
        if shuffle == -1:  # numcodecs AUTOSHUFFLE, resolved the way numcodecs resolves it
            shuffle = 2 if itemsize == 1 else 1
        if shuffle not in _BLOSC_SHUFFLE:
            raise MetadataError(
                f"{where}: unsupported compressor.configuration.shuffle {shuffle!r}"
            )
        config = {
            "cname": config.get("cname", "lz4"),
            "clevel": config.get("clevel", 5),
            "shuffle": _BLOSC_SHUFFLE[shuffle],
            "typesize": itemsize,
            "blocksize": config.get("blocksize", 0),
        }
    elif legacy_name == "zstd":
        config = {"level": config.get("level", 0), "checksum": bool(config.get("checksum", False))}
    return {"name": _COMPRESSORS[legacy_name], "configuration": config}


def _default_fill(name: str) -> Any:
    if name == "bool":
        return False
    if name.startswith("complex"):
        return [0.0, 0.0]
    if name.startswith("float"):
        return 0.0
    return 0


def array_doc_from_legacy(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """Map a legacy ``.array.json`` document onto today's ``zarr.json`` (raises MetadataError)."""
    try:
        shape = [int(s) for s in doc["shape"]]
        grid = doc["chunk_grid"]
        data_type = doc["data_type"]
    except (KeyError, TypeError, ValueError) as e:
        raise MetadataError(f"{where}: missing or malformed field {e}") from None
    if not isinstance(grid, dict) or grid.get("type", "regular") != "regular":
        raise MetadataError(f"{where}: unsupported chunk_grid {grid!r}")
    chunk_shape = grid.get("chunk_shape")
    if not isinstance(chunk_shape, list) or len(chunk_shape) != len(shape):
        raise MetadataError(f"{where}: chunk_grid.chunk_shape {chunk_shape!r} does not match shape")
    separator = _legacy_separator(doc, where)
    name, endian, itemsize = _legacy_dtype(data_type, where)
    layout = doc.get("chunk_memory_layout", "C")
    if layout not in ("C", "F"):
        raise MetadataError(f"{where}: unsupported chunk_memory_layout {layout!r}")
    _check_extensions(doc.get("extensions", []), where)
    attributes = doc.get("attributes", {})
    if not isinstance(attributes, dict):
        raise MetadataError(f"{where}: attributes must be an object, got {attributes!r}")
    # zarr 2.18 keeps v3 filters in attributes["filters"]; applying them is not supported.
    if attributes.get("filters"):
        raise MetadataError(f"{where}: unsupported attributes.filters {attributes['filters']!r}")

    codecs: list[dict[str, Any]] = []
    if layout == "F" and len(shape) > 1:
        # F-order chunk bytes == C-order bytes of the transposed chunk.
        codecs.append(
            {"name": "transpose", "configuration": {"order": list(range(len(shape)))[::-1]}}
        )
    codecs.append(
        {"name": "bytes", "configuration": {"endian": endian}} if endian else {"name": "bytes"}
    )
    if doc.get("compressor") is not None:
        codecs.append(_map_compressor(doc["compressor"], itemsize, where))

    fill_value = doc.get("fill_value")
    if fill_value is None:  # zarr 2 allowed "no fill value"; today's format requires one
        fill_value = _default_fill(name)

    out: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
        "fill_value": fill_value,
        "codecs": codecs,
        "attributes": attributes,
    }
    transformers = doc.get("storage_transformers") or []
    if transformers:
        out["storage_transformers"] = [_transformer_from_legacy(t, where) for t in transformers]
    if doc.get("dimension_names") is not None:
        out["dimension_names"] = doc["dimension_names"]
    return out


def _legacy_separator(doc: dict[str, Any], where: str) -> str:
    # zarr 2.18 reads chunk_grid.separator (dimension_separator is a redundant copy).
    grid = doc.get("chunk_grid") or {}
    sep = grid.get("separator", doc.get("dimension_separator", "/"))
    if sep not in ("/", "."):
        raise MetadataError(f"{where}: unsupported chunk_grid.separator {sep!r}")
    return sep


def _transformer_from_legacy(t: object, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or not isinstance(t.get("extension", t.get("name")), str):
        raise MetadataError(f"{where}: malformed storage_transformers entry {t!r}")
    out = {("name" if k == "extension" else k): v for k, v in t.items()}
    return out


def _transformer_to_legacy(t: object, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or not isinstance(t.get("name", t.get("extension")), str):
        raise MetadataError(f"{where}: malformed storage_transformers entry {t!r}")
    out = {("extension" if k == "name" else k): v for k, v in t.items()}
    if out["extension"] == "sharding":  # today's short name; the legacy layout only knows the URL
        out["extension"] = SHARDING_V1_URL
    return out


def group_doc_from_legacy(doc: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """Map a legacy ``.group.json`` (None: implicit group) onto today's ``zarr.json``."""
    attributes: Any = {}
    if doc is not None:
        _check_extensions(doc.get("extensions", []), where)
        attributes = doc.get("attributes", {})
        if not isinstance(attributes, dict):
            raise MetadataError(f"{where}: attributes must be an object, got {attributes!r}")
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes}


# ---------------------------------------------------------------------------
# metadata mapping, today -> legacy
# ---------------------------------------------------------------------------


def _normalized_array(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """Today's array document as zarr-python would write it, minus attributes/transformers."""
    from zarr.core.metadata.v3 import ArrayV3Metadata

    core = {k: v for k, v in doc.items() if k not in ("attributes", "storage_transformers")}
    try:
        meta = ArrayV3Metadata.from_dict(core)
        raw = meta.to_buffer_dict(default_buffer_prototype())[_ZARR_JSON].to_bytes()
    except Exception as e:  # zarr raises many types for bad metadata
        raise MetadataError(f"{where}: invalid array metadata: {e}") from e
    out = json.loads(raw)
    out.pop("attributes", None)
    out.pop("storage_transformers", None)
    return out


def _fill_to_legacy(value: Any, where: str) -> Any:
    if isinstance(value, str) and value not in ("NaN", "Infinity", "-Infinity"):
        raise MetadataError(f"{where}: fill_value {value!r} cannot be written in the legacy layout")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def array_doc_to_legacy(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """Map today's array ``zarr.json`` onto a new legacy ``.array.json`` (raises MetadataError)."""
    norm = _normalized_array(doc, where)
    shape = norm["shape"]
    grid = norm["chunk_grid"]
    if grid.get("name") != "regular":
        raise MetadataError(f"{where}: chunk_grid {grid!r} cannot be written in the legacy layout")
    cke = norm["chunk_key_encoding"]
    sep = (cke.get("configuration") or {}).get("separator", "/")
    if cke.get("name") != "default" or sep not in ("/", "."):
        raise MetadataError(
            f"{where}: chunk_key_encoding {cke!r} cannot be written in the legacy layout"
        )
    name = norm["data_type"]
    if not isinstance(name, str) or (name != "bool" and name not in _NAMES_BACK):
        raise MetadataError(f"{where}: data_type {name!r} cannot be written in the legacy layout")

    codecs = list(norm["codecs"])
    layout = "C"
    if codecs and codecs[0]["name"] == "transpose":
        order = codecs.pop(0)["configuration"]["order"]
        if list(order) == list(range(len(shape)))[::-1]:
            layout = "F"
        elif list(order) != list(range(len(shape))):
            raise MetadataError(f"{where}: codecs transpose order {order!r} has no legacy form")
    if not codecs or codecs[0]["name"] != "bytes":
        raise MetadataError(
            f"{where}: codecs {norm['codecs']!r} cannot be written in the legacy layout"
        )
    endian = (codecs.pop(0).get("configuration") or {}).get("endian", "little")
    if name == "bool":
        data_type: Any = "bool"
    else:
        kind, size = _NAMES_BACK[name]
        # zarr 2.18 spells one-byte types without byte order ("u1"), others "<u2"/">u2".
        legacy = (
            f"{kind}{size}" if size == 1 else f"{'<' if endian == 'little' else '>'}{kind}{size}"
        )
        data_type = (
            {"extension": _COMPLEX_URL, "type": legacy, "fallback": None} if kind == "c" else legacy
        )
    if len(codecs) > 1:
        raise MetadataError(
            f"{where}: codecs {norm['codecs']!r}: the legacy layout holds one compressor at most"
        )
    out: dict[str, Any] = {
        "attributes": doc.get("attributes") or {},
        "chunk_grid": {
            "chunk_shape": grid["configuration"]["chunk_shape"],
            "separator": sep,
            "type": "regular",
        },
        "chunk_memory_layout": layout,
        "data_type": data_type,
        "dimension_separator": sep,  # zarr 2.18 writes this redundant copy; keep its files alike
        "extensions": [],
        "fill_value": _fill_to_legacy(norm["fill_value"], where),
        "shape": shape,
    }
    if codecs:
        out["compressor"] = _compressor_to_legacy(codecs[0], where)
    if doc.get("storage_transformers"):
        out["storage_transformers"] = [
            _transformer_to_legacy(t, where) for t in doc["storage_transformers"]
        ]
    if norm.get("dimension_names") is not None:
        out["dimension_names"] = norm["dimension_names"]
    return out


def _compressor_to_legacy(codec: dict[str, Any], where: str) -> dict[str, Any]:
    legacy_name = _COMPRESSORS_BACK.get(codec["name"])
    if legacy_name is None:
        raise MetadataError(f"{where}: codec {codec['name']!r} has no legacy compressor form")
    config = dict(codec.get("configuration") or {})
    if legacy_name == "blosc":
        config.pop("typesize", None)
        config["shuffle"] = _BLOSC_SHUFFLE_BACK[config.get("shuffle", "shuffle")]
    return {"codec": f"{_CODEC_URL}{legacy_name}/1.0", "configuration": config}


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return key
    return None


def update_legacy_array(old: dict[str, Any], new: dict[str, Any], where: str) -> dict[str, Any]:
    """The legacy document ``old`` changed so that it maps onto ``new`` (today's form).

    Keeps every field of ``old`` as spelled; replaces attributes and shape. Any
    other difference has no place in the legacy document and raises MetadataError.
    """
    current = array_doc_from_legacy(old, where)
    a, b = _normalized_array(current, where), _normalized_array(new, where)
    a.pop("shape")
    shape = b.pop("shape")
    field = _first_difference(a, b)
    if field is not None:
        raise MetadataError(
            f"{where}: cannot change {field} from {a.get(field)!r} to {b.get(field)!r} "
            "in a pre-release v3 array"
        )
    old_t = [_transformer_to_legacy(t, where) for t in current.get("storage_transformers", [])]
    new_t = [_transformer_to_legacy(t, where) for t in new.get("storage_transformers") or []]
    if old_t != new_t:
        raise MetadataError(
            f"{where}: cannot change storage_transformers from {old_t!r} to {new_t!r} "
            "in a pre-release v3 array"
        )
    out = dict(old)
    out["attributes"] = new.get("attributes") or {}
    if list(old["shape"]) != list(shape):
        out["shape"] = list(shape)
    return out


# ---------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------


def _slice(data: bytes, byte_range: ByteRequest | None) -> bytes:
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[len(data) - byte_range.suffix :] if byte_range.suffix else b""
    raise TypeError(f"unexpected byte range {byte_range!r}")


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


class LegacyV3Store(GetManyThroughGet, WrapperStore[Store]):
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
        self._suffix = _check_entry_point(self._entry)
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
            sep = _legacy_separator(doc, self._legacy_meta_key(path, "array"))
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
                    arrays[path] = _legacy_separator(doc, key)
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
            return None if data is None else prototype.buffer.from_bytes(_slice(data, byte_range))
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

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        if not await self.exists(key):
            await self.set(key, value)

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

    def list(self) -> AsyncIterator[str]:
        return self.list_prefix("")

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

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        seen: set[str] = set()
        async for key in self.list_prefix(prefix):
            child = key[len(prefix) :].split("/", 1)[0]
            if child not in seen:
                seen.add(child)
                yield child
