"""The ``suffix`` chunk key encoding: a base chunk key encoding plus a fixed suffix.

Spec: docs/specs/suffix-chunk-key-encoding.md. JSON form::

    {"name": "suffix",
     "configuration": {"suffix": ".tiff",
                       "base_encoding": {"name": "v2", "configuration": {"separator": "/"}}}}

Invariants:

- ``encode_chunk_key(c) == base_encoding.encode_chunk_key(c) + suffix``.
- ``decode_chunk_key(k)`` requires ``k`` to end with ``suffix`` (``NotAChunkKeyError``, a
  ``ValueError``, otherwise)
  and returns ``base_encoding.decode_chunk_key(k[:-len(suffix)])``.
- The base encoding is read from ``base_encoding`` or ``base-encoding`` (the seed uses
  both spellings) and defaults to ``{"name": "default"}``; it may be any registered
  chunk key encoding, including another ``suffix``. It is always written as
  ``base_encoding``, so ``from_dict(to_dict(e)) == e``.

Importing this module registers the encoding with zarr-python under ``suffix``
(the ``zarr.chunk_key_encoding`` entry point does the same lazily; zarr keys that
registry by entry point name, which is ``suffix`` too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, cast

from zarr.core.chunk_key_encodings import (
    ChunkKeyEncoding,
    ChunkKeyEncodingLike,
    DefaultChunkKeyEncoding,
    parse_chunk_key_encoding,
)
from zarr.core.common import JSON
from zarr.registry import register_chunk_key_encoding

from zfuse.errors import MetadataError, NotAChunkKeyError
from zfuse.ext.chunk_keys import decode_default_chunk_key

if TYPE_CHECKING:
    from typing import Self

__all__ = ["SuffixChunkKeyEncoding"]

ENCODING_NAME = "suffix"

_BASE_KEYS = ("base_encoding", "base-encoding")
_CONFIG_KEYS = frozenset({"suffix", *_BASE_KEYS})


def parse_suffix(data: object) -> str:
    if not isinstance(data, str):
        raise MetadataError(f"suffix chunk key encoding: 'suffix' must be a string. Got {data!r}")
    # Appended to a chunk key, every component the suffix starts after a '/' is a
    # component of the key: one that is empty, '.' or '..' names another file than the
    # chunk's (`..` one outside the store), and NUL or a backslash no file at all. The
    # array is refused (shown with a README), never read through such keys.
    later = data.split("/")[1:]
    if any(part in ("", ".", "..") for part in later) or "\x00" in data or "\\" in data:
        raise MetadataError(
            "suffix chunk key encoding: 'suffix' would make chunk keys with a component that "
            f"is empty, '.' or '..' (or holds NUL or a backslash), naming files outside the "
            f"chunk's place in the store. Got {data!r}"
        )
    return data


def parse_base_encoding(data: object) -> ChunkKeyEncoding:
    if data is None:
        return DefaultChunkKeyEncoding()
    if isinstance(data, ChunkKeyEncoding):
        return data
    if not isinstance(data, dict):
        raise MetadataError(
            "suffix chunk key encoding: 'base_encoding' must be a chunk key encoding "
            f"object such as {{'name': 'default'}}. Got {data!r}"
        )
    try:
        return parse_chunk_key_encoding(cast("ChunkKeyEncodingLike", data))
    except (ValueError, TypeError, KeyError) as e:
        raise MetadataError(
            f"suffix chunk key encoding: invalid 'base_encoding' ({e}). Got {data!r}"
        ) from e


@dataclass(frozen=True)
class SuffixChunkKeyEncoding(ChunkKeyEncoding):
    """Chunk keys of ``base_encoding`` with ``suffix`` appended (e.g. ``c/0/1.tiff``)."""

    name: ClassVar[Literal["suffix"]] = "suffix"
    suffix: str
    base_encoding: ChunkKeyEncoding = field(default_factory=DefaultChunkKeyEncoding)

    def __init__(
        self,
        *,
        suffix: str,
        base_encoding: ChunkKeyEncoding | dict[str, JSON] | None = None,
    ) -> None:
        object.__setattr__(self, "suffix", parse_suffix(suffix))
        object.__setattr__(self, "base_encoding", parse_base_encoding(base_encoding))

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        if not isinstance(data, dict) or data.get("name") != ENCODING_NAME:
            raise MetadataError(
                f"suffix chunk key encoding: expected a dict with name 'suffix'. Got {data!r}"
            )
        config = data.get("configuration")
        if not isinstance(config, dict):
            raise MetadataError(
                "suffix chunk key encoding: 'configuration' must be an object with 'suffix'. "
                f"Got {config!r}"
            )
        unknown = sorted(set(config) - _CONFIG_KEYS)
        if unknown:
            raise MetadataError(
                f"suffix chunk key encoding: unknown configuration keys {unknown}. Got {config!r}"
            )
        if "suffix" not in config:
            raise MetadataError(
                f"suffix chunk key encoding: configuration needs 'suffix'. Got {config!r}"
            )
        given = [config[k] for k in _BASE_KEYS if k in config]
        # Both spellings at once is only acceptable if they agree.
        if len(given) == 2 and parse_base_encoding(given[0]) != parse_base_encoding(given[1]):
            raise MetadataError(
                "suffix chunk key encoding: 'base_encoding' and 'base-encoding' disagree. "
                f"Got {config!r}"
            )
        return cls(
            suffix=cast("str", config["suffix"]),
            base_encoding=cast("dict[str, JSON] | None", given[0] if given else None),
        )

    def to_dict(self) -> dict[str, JSON]:
        return {
            "name": self.name,
            "configuration": {
                "suffix": self.suffix,
                "base_encoding": self.base_encoding.to_dict(),
            },
        }

    def encode_chunk_key(self, chunk_coords: tuple[int, ...]) -> str:
        return self.base_encoding.encode_chunk_key(chunk_coords) + self.suffix

    def decode_chunk_key(self, chunk_key: str) -> tuple[int, ...]:
        if not chunk_key.endswith(self.suffix):
            raise NotAChunkKeyError(
                f"suffix chunk key encoding: chunk key {chunk_key!r} does not end with the "
                f"expected suffix {self.suffix!r}"
            )
        base_key = chunk_key[: len(chunk_key) - len(self.suffix)]
        if isinstance(self.base_encoding, DefaultChunkKeyEncoding):
            return decode_default_chunk_key(base_key, self.base_encoding.separator)
        return self.base_encoding.decode_chunk_key(base_key)


# Direct imports register too; the registry is a plain dict keyed by name, so
# registering again (e.g. after the entry point loaded us) is harmless.
register_chunk_key_encoding(ENCODING_NAME, SuffixChunkKeyEncoding)
