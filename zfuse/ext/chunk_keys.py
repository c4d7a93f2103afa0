"""Chunk keys: the one decoder from a chunk key back to chunk coordinates.

Every layer that must tell whether a key names a chunk, and which one, asks a
:class:`ChunkKeyDecoder`: the transformer wrapper and sharding v1 (which keys
to route), the ``suffix`` encoding's default base, and the view (which store
objects are chunk files).

Invariants
----------
* ``decoder(key) == coords`` iff ``coords`` are ``rank`` non-negative integers
  and ``encode(coords) == key``: a key is accepted only if it round-trips, so
  ``c/01``, ``c/1/`` or a key of another rank is never a chunk key, whatever
  the encoding's own ``decode_chunk_key`` would make of it.
* The ``default`` and ``v2`` encodings (rank >= 1) are decoded by one compiled
  regular expression of canonical integers (listing 100,000 keys is dominated
  by key decoding otherwise); it accepts exactly the keys those encodings
  produce.
* Any other encoding is decoded by its own ``decode_chunk_key`` first, then by
  trying the key's leading and trailing integers; either answer is kept only
  if it round-trips.
* zarr-python 3.1.6's ``DefaultChunkKeyEncoding.decode_chunk_key`` keeps the
  leading separator and fails on every non-scalar key;
  :func:`decode_default_chunk_key` is the replacement used wherever a default
  key must be decoded without a known rank.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from zarr.core.chunk_key_encodings import (
    ChunkKeyEncoding,
    DefaultChunkKeyEncoding,
    V2ChunkKeyEncoding,
    parse_chunk_key_encoding,
)

from zfuse.errors import MetadataError, NotAChunkKeyError

__all__ = [
    "METADATA_NAMES",
    "ChunkKeyDecoder",
    "chunk_key_encoding_of",
    "decode_default_chunk_key",
    "standard_layout",
]

Coords = tuple[int, ...]

# Keys that are never chunk keys, whatever the encoding says.
METADATA_NAMES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})

_INT_RE = re.compile(r"\d+")
_CANONICAL_INT = "(0|[1-9][0-9]*)"


def decode_default_chunk_key(chunk_key: str, separator: str) -> Coords:
    """Decode a ``default`` encoding key such as ``c/1/2`` (NotAChunkKeyError if it is not one).

    zarr-python 3.1.6's ``DefaultChunkKeyEncoding.decode_chunk_key`` splits ``chunk_key[1:]``,
    which keeps the leading separator and fails on ``int('')`` for every non-scalar key.
    """
    if chunk_key == "c":
        return ()
    prefix = "c" + separator
    if not chunk_key.startswith(prefix):
        raise NotAChunkKeyError(
            f"chunk key {chunk_key!r} does not start with {prefix!r} (default encoding)"
        )
    try:
        return tuple(int(part) for part in chunk_key[len(prefix) :].split(separator))
    except ValueError:
        raise NotAChunkKeyError(
            f"chunk key {chunk_key!r}: coordinates are not integers (default encoding)"
        ) from None


def standard_layout(encoding: ChunkKeyEncoding | None) -> tuple[str, str] | None:
    """(key head, separator) of the ``default`` ("c/", "/") and ``v2`` ("", ".") encodings."""
    if isinstance(encoding, DefaultChunkKeyEncoding):
        return "c" + encoding.separator, encoding.separator
    if isinstance(encoding, V2ChunkKeyEncoding):
        return "", encoding.separator
    return None


def chunk_key_encoding_of(metadata: dict[str, Any]) -> ChunkKeyEncoding:
    """The array's chunk key encoding (MetadataError if zarr cannot parse it)."""
    try:
        return parse_chunk_key_encoding(metadata.get("chunk_key_encoding", {"name": "default"}))
    except Exception as e:  # zarr raises ValueError/TypeError/KeyError variously
        raise MetadataError(f"chunk_key_encoding: {e}") from e


class ChunkKeyDecoder:
    """``decoder(key)``: the coordinates of the chunk ``key`` names, or None.

    ``encoding`` is the array's zarr chunk key encoding (the fast path and the
    encoding's own decoder); ``encode`` the function that makes keys (default:
    the encoding's), for key makers that are not a zarr encoding.
    """

    def __init__(
        self,
        rank: int,
        *,
        encoding: ChunkKeyEncoding | None = None,
        encode: Callable[[Coords], str] | None = None,
    ) -> None:
        if encode is None:
            if encoding is None:
                raise TypeError("ChunkKeyDecoder needs an encoding or an encode function")
            encode = encoding.encode_chunk_key
        self.rank = rank
        self.encoding = encoding
        self.encode = encode
        self._pattern: re.Pattern[str] | None = None
        layout = standard_layout(encoding)
        if layout is not None and rank > 0:
            head, sep = layout
            self._pattern = re.compile(re.escape(head) + re.escape(sep).join([_CANONICAL_INT] * rank))

    def __call__(self, key: str) -> Coords | None:
        pattern = self._pattern
        if pattern is not None:
            match = pattern.fullmatch(key)
            return None if match is None else tuple(map(int, match.groups()))
        if self.rank == 0:
            return () if key == self.encode(()) else None
        if self.encoding is not None:
            coords = self._by_encoding(key)
            if coords is not None:
                return coords
        return self._by_integers(key)

    def _by_encoding(self, key: str) -> Coords | None:
        assert self.encoding is not None
        try:
            coords = tuple(int(c) for c in self.encoding.decode_chunk_key(key))
        except Exception:  # any decoding failure simply means "not decoded this way"
            return None
        return coords if self._round_trips(coords, key) else None

    def _by_integers(self, key: str) -> Coords | None:
        """Any encoding that spells coordinates as decimal integers: the key's leading
        or trailing integers, accepted only if they give the key back."""
        ints = _INT_RE.findall(key)
        for candidate in (ints[-self.rank :], ints[: self.rank]):
            if len(candidate) != self.rank:
                continue
            coords = tuple(int(i) for i in candidate)
            if self.encode(coords) == key:
                return coords
        return None

    def _round_trips(self, coords: Coords, key: str) -> bool:
        return len(coords) == self.rank and all(c >= 0 for c in coords) and self.encode(coords) == key
