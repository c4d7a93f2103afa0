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


def metadata_problem(raw: bytes, key: str) -> str | None:
    """Why the document stored at `key` is not read (too large, too deep); None if it is read."""
    if len(raw) > MAX_METADATA_BYTES:
        return (f"{key} is {len(raw)} bytes: zfuse reads metadata documents of at most "
                f"{MAX_METADATA_BYTES} bytes")
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
    """The document stored at `key`, parsed (MetadataError if too large or too deep;
    ValueError if it is not JSON)."""
    check_metadata(raw, key)
    return json.loads(raw)
