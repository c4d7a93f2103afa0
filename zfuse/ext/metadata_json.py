"""Bounded reading of metadata documents (``zarr.json``, ``.zarray``, ``.zattrs``,
``.zgroup``, ``.zmetadata``).

A store's metadata is input like any other: a document nested thousands of
brackets deep makes Python's JSON decoder (and every recursive walk after it,
zarr-python's included) raise RecursionError, and one of gigabytes makes the
reader hold it all. Either would take the whole store down with one member.
So every document zfuse or zarr-python reads through zfuse's stores is checked
first, in linear time and without recursion: at most `MAX_METADATA_BYTES` bytes
and `MAX_METADATA_DEPTH` levels of nesting. Real metadata is far inside both:
an OME-Zarr image's ``zarr.json`` nests about 10 deep (attributes, ome,
multiscales, datasets, coordinateTransformations, scale), consolidated
metadata about 15. A document past either limit raises `MetadataError` naming
the key and the limit; the member it belongs to is shown as not supported.

A parsed document is then checked for what costs zarr-python time or memory out of
proportion to its size (`structure_problem`): more than `MAX_RANK` dimensions (a regex
group, a tuple entry and more per dimension, in every key zfuse parses), a codec list
longer than `MAX_CODECS` (zarr-python's pipeline is built in quadratic time), a v2 data
type whose element is past `MAX_ELEMENT_BYTES` (zarr-python allocates the default fill
value, one element: `|V1500000000` is 1.5 GB for a 200-byte ``.zarray``), and attributes
that are not a JSON object.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from zfuse.errors import MetadataError
from zfuse.ext.chunk_keys import METADATA_NAMES

MAX_METADATA_BYTES = 16 * 1024**2
MAX_METADATA_DEPTH = 64
#: dimensions of an array (numpy holds at most 64; real images have up to 6)
MAX_RANK = 32
#: codecs (v2: filters) in one list; a real pipeline has fewer than 10
MAX_CODECS = 64
#: bytes of one element of a v2 data type (a structured record, a void, a string)
MAX_ELEMENT_BYTES = 1024**2
_CODEC_LISTS = ("codecs", "index_codecs", "filters")

# A JSON string (escapes included): its brackets are not nesting
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def is_metadata_key(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in METADATA_NAMES


def nesting_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), without
    parsing it: brackets inside strings are dropped, the rest counted in numpy."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, dtype=np.uint8)
    opens = (steps == ord("[")) | (steps == ord("{"))
    return int(np.cumsum(np.where(opens, 1, -1).astype(np.int32)).max())


def too_large_problem(key: str, size: int) -> str:
    """Why a metadata document of `size` bytes is not read (what a store whose size is
    known ahead says too, before reading it)."""
    return f"{key} is {size} bytes: zfuse reads metadata documents of at most {MAX_METADATA_BYTES} bytes"


def metadata_problem(raw: bytes, key: str) -> str | None:
    """Why the document stored at `key` is not read (too large, too deep); None if it is read."""
    if len(raw) > MAX_METADATA_BYTES:
        return too_large_problem(key, len(raw))
    if raw.count(b"[") + raw.count(b"{") > MAX_METADATA_DEPTH:  # fewer brackets: cannot be too deep
        depth = nesting_depth(raw)
        if depth > MAX_METADATA_DEPTH:
            return (f"{key} nests {depth} levels deep: zfuse reads metadata documents nested "
                    f"at most {MAX_METADATA_DEPTH} levels")
    return None


def check_metadata(raw: bytes, key: str) -> None:
    """MetadataError if the document stored at `key` is too large or too deep to read."""
    problem = metadata_problem(raw, key)
    if problem is not None:
        raise MetadataError(problem)


def load_metadata(raw: bytes, key: str) -> Any:
    """The document stored at `key`, parsed (MetadataError if too large or too deep, or
    if its structure is past what zfuse reads: `structure_problem`; ValueError if it is
    not JSON)."""
    check_metadata(raw, key)
    doc = json.loads(raw)
    problem = structure_problem(doc, key)
    if problem is not None:
        raise MetadataError(problem)
    return doc


def structure_problem(doc: Any, key: str) -> str | None:
    """Why the parsed document stored at `key` is not read (see the module's doc); None
    if it is. Anything else wrong with it is left to zarr-python to say."""
    name = key.rsplit("/", 1)[-1]
    if name == ".zattrs":
        if doc is not None and not isinstance(doc, dict):
            return f"{key} holds a JSON {_kind(doc)}: attributes are a JSON object"
        return None
    if not isinstance(doc, dict):
        # (zarr-python's own error for a list is "pop expected at most 1 argument")
        return f"{key} holds a JSON {_kind(doc)}: metadata documents are JSON objects"
    if name == "zarr.json" and doc.get("attributes") is not None and not isinstance(doc["attributes"], dict):
        return f"{key}: attributes are a JSON {_kind(doc['attributes'])}, not an object"
    shape = doc.get("shape")
    if isinstance(shape, list) and len(shape) > MAX_RANK:
        return f"{key}: {len(shape)} dimensions: zfuse reads arrays of at most {MAX_RANK}"
    if name == ".zarray":
        itemsize = _v2_itemsize(doc.get("dtype"))
        if itemsize is not None and itemsize > MAX_ELEMENT_BYTES:
            return (f"{key}: an element of data type {str(doc.get('dtype'))[:80]} is {itemsize} bytes: "
                    f"zfuse reads elements of at most {MAX_ELEMENT_BYTES} bytes")
    # codec lists, nested ones (sharding's) too, walked without recursion
    pending: list[Any] = [doc]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        for field in _CODEC_LISTS:
            codecs = node.get(field)
            if isinstance(codecs, list):
                if len(codecs) > MAX_CODECS:
                    return f"{key}: {len(codecs)} {field}: zfuse reads lists of at most {MAX_CODECS}"
                pending.extend(c.get("configuration") for c in codecs if isinstance(c, dict))
    return None


def consolidated_problem(doc: Any, key: str) -> str | None:
    """Why the consolidated metadata in the document at `key` (a group's `zarr.json`,
    or a v2 `.zmetadata`) is not used: the first member document in it past zfuse's
    bounds (`structure_problem`); zarr-python opens members from it without reading
    their own documents, so the store is then listed instead."""
    name = key.rsplit("/", 1)[-1]
    if isinstance(doc, dict) and name == ".zmetadata":
        entries = doc.get("metadata")
        for path, entry in entries.items() if isinstance(entries, dict) else ():
            if (problem := structure_problem(entry, str(path))) is not None:
                return f"{key}: the consolidated metadata of {path}: {problem}"
        return None
    if not (isinstance(doc, dict) and name == "zarr.json"):
        return None
    # a group's entries may hold consolidated metadata of their own (zarr-python parses
    # them all): walked without recursion
    pending: list[Any] = [doc]
    while pending:
        consolidated = pending.pop().get("consolidated_metadata")
        entries = consolidated.get("metadata") if isinstance(consolidated, dict) else None
        for path, entry in entries.items() if isinstance(entries, dict) else ():
            if (problem := structure_problem(entry, f"{path}/zarr.json")) is not None:
                return f"{key}: the consolidated metadata of {path}: {problem}"
            if isinstance(entry, dict):
                pending.append(entry)
    return None


def _kind(value: Any) -> str:
    """A parsed JSON value's kind, as JSON names it."""
    if value is None:
        return "null"
    return {list: "list", str: "string", bool: "boolean", dict: "object"}.get(type(value), "number")


def _v2_itemsize(dtype: Any) -> int | None:
    """Bytes per element of a v2 `dtype` (a string, or a structured list of fields);
    None where numpy cannot say (zarr-python then refuses it)."""
    def spec(value: Any) -> Any:  # JSON lists are numpy's tuples (fields, shapes)
        if isinstance(value, list):
            return [tuple(spec(v) for v in field) if isinstance(field, list) else field for field in value]
        return value
    try:
        return int(np.dtype(spec(dtype)).itemsize)
    except Exception:  # noqa: BLE001 - any refusal of numpy's is zarr-python's to report
        return None
