"""Metadata translation between the pre-release Zarr v3 layout and today's v3 documents.

``legacy_v3.py`` (the store) reads and writes the legacy layout's documents;
this module maps one document at a time, both ways, with no I/O.  The
legacy documents, as zarr-python 2.18 writes them (``zarr/meta.py``)::

    zarr.json                              entry point: zarr_format and metadata_encoding
                                           "https://purl.org/zarr/spec/protocol/core/3.0",
                                           metadata_key_suffix ".json", extensions []
    meta/root/<path>.group.json            {"attributes": {...}, "extensions": [...]}
    meta/root/<path>.array.json            shape, data_type ("<u2", "bool", "u1", ...),
                                           chunk_grid {type, chunk_shape, separator},
                                           chunk_memory_layout "C"|"F", compressor
                                           {codec: URL, configuration}, fill_value,
                                           attributes, extensions, dimension_separator,
                                           storage_transformers [{extension, type, configuration}]

Invariants:

- A presented document written back is translated into the legacy document,
  keeping the original document's fields and spellings and replacing only what
  changed (attributes; shape): :func:`update_legacy_array`.
- What cannot be represented one way or the other raises
  ``zfuse.errors.MetadataError`` naming the field and value.
- ``storage_transformers`` are carried across unchanged except that the
  legacy ``extension`` key becomes today's ``name`` (and back), so the
  transformer machinery in ``zfuse.ext`` recognises sharding v1.

Mapping notes: ``data_type`` is read in zarr 2.18's spelling ("<u2", "u1",
"bool", complex as an extension object) and in acquire-driver-zarr's ("u2",
"<u1", later "uint16"; no byte order means its native little-endian); it is
written back in zarr 2.18's spelling. zarr 2.18 keeps v3 filters in
``attributes["filters"]``; arrays using them are refused, not misread.
``fill_value: null`` reads as the data type's zero.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from zarr.core.buffer import default_buffer_prototype

from zfuse.errors import MetadataError

__all__ = [
    "LEGACY_FORMAT_URL",
    "SHARDING_V1_URL",
    "array_doc_from_legacy",
    "array_doc_to_legacy",
    "check_entry_point",
    "group_doc_from_legacy",
    "is_legacy_entry_point",
    "legacy_separator",
    "update_legacy_array",
]

LEGACY_FORMAT_URL = "https://purl.org/zarr/spec/protocol/core/3.0"
SHARDING_V1_URL = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
_CODEC_URL = "https://purl.org/zarr/spec/codec/"
_COMPLEX_URL = "https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/extensions/complex-dtypes/v1.0.html"

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


def check_entry_point(doc: dict[str, Any]) -> str:
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
    separator = legacy_separator(doc, where)
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


def legacy_separator(doc: dict[str, Any], where: str) -> str:
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
