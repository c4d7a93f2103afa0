"""The ``pad`` codec: a zarr v3 bytes->bytes codec adding fixed-size padding.

Spec: docs/specs/pad-codec.md. JSON form::

    {"name": "pad",
     "configuration": {"location": "start" | "end", "nbytes": N, "padding": "<base64>"}}

Invariants:

- ``location`` is ``"start"`` or ``"end"``; ``nbytes`` is an int >= 0.
- ``padding`` (when given) is exactly ``nbytes`` raw bytes; absent means ``nbytes`` zero
  bytes. It is held as raw bytes and written to JSON as base64 only when it was given,
  so ``from_dict(to_dict(c)) == c`` for every codec without a ``padding_func``.
- encode(x) has length ``len(x) + nbytes``: ``padding + x`` (start) or ``x + padding`` (end).
- decode(y) drops ``nbytes`` bytes from that end without checking their content (so a
  foreign header such as N5's can be skipped); ``len(y) < nbytes`` raises
  :class:`~zfuse.errors.CorruptDataError`, never returns a short or garbage chunk.
- ``padding_func`` (optional, Python only, never serialised) builds the padding from the
  bytes being padded; it must return exactly ``nbytes`` bytes on every call.

Importing this module registers the codec with zarr-python under the name ``pad``
(the ``zarr.codecs`` entry point does the same lazily without importing zfuse first).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from zarr.abc.codec import BytesBytesCodec
from zarr.core.common import JSON
from zarr.registry import register_codec

from zfuse.errors import CorruptDataError, MetadataError

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer

__all__ = ["PadCodec", "PaddingFunc"]

CODEC_NAME = "pad"

PadLocation = Literal["start", "end"]
PaddingFunc = Callable[[bytes], bytes]
"""Builds the padding for one chunk from the (already encoded) bytes it will pad."""

_CONFIG_KEYS = frozenset({"location", "nbytes", "padding"})


def parse_location(data: object) -> PadLocation:
    if data not in ("start", "end"):
        raise MetadataError(f"pad codec: 'location' must be 'start' or 'end'. Got {data!r}")
    return cast("PadLocation", data)


def parse_nbytes(data: object) -> int:
    # bool is an int subclass; True as a byte count is surely a mistake.
    if isinstance(data, bool) or not isinstance(data, int | np.integer) or data < 0:
        raise MetadataError(f"pad codec: 'nbytes' must be an integer >= 0. Got {data!r}")
    return int(data)


def parse_padding(data: object, nbytes: int) -> bytes | None:
    """Return the raw padding bytes (``None`` when absent), checking the length."""
    if data is None:
        return None
    if isinstance(data, str):
        try:
            raw = base64.b64decode(data.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as e:
            raise MetadataError(
                f"pad codec: 'padding' must be a base64 string ({e}). Got {data!r}"
            ) from e
    elif isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
    else:
        raise MetadataError(
            f"pad codec: 'padding' must be a base64 string or raw bytes. Got {data!r}"
        )
    if len(raw) != nbytes:
        raise MetadataError(
            f"pad codec: 'padding' must decode to exactly nbytes={nbytes} bytes, "
            f"but decodes to {len(raw)} bytes. Got {data!r}"
        )
    return raw


@dataclass(frozen=True)
class PadCodec(BytesBytesCodec):
    """Add ``nbytes`` bytes of padding at the ``start`` or ``end`` of each chunk.

    ``padding`` may be given as a base64 string (as in JSON) or as raw bytes; it is
    stored as raw bytes. ``padding_func``, if given, overrides the static padding when
    encoding (decoding never needs it).
    """

    is_fixed_size = True

    location: PadLocation
    nbytes: int
    padding: bytes | None = None
    # Not part of the JSON metadata; compared by identity like any callable.
    padding_func: PaddingFunc | None = field(default=None, repr=False)

    def __init__(
        self,
        *,
        location: PadLocation | str,
        nbytes: int,
        padding: str | bytes | None = None,
        padding_func: PaddingFunc | None = None,
    ) -> None:
        location_parsed = parse_location(location)
        nbytes_parsed = parse_nbytes(nbytes)
        padding_parsed = parse_padding(padding, nbytes_parsed)
        if padding_func is not None and not callable(padding_func):
            raise MetadataError(f"pad codec: 'padding_func' must be callable. Got {padding_func!r}")
        object.__setattr__(self, "location", location_parsed)
        object.__setattr__(self, "nbytes", nbytes_parsed)
        object.__setattr__(self, "padding", padding_parsed)
        object.__setattr__(self, "padding_func", padding_func)

    @property
    def padding_bytes(self) -> bytes:
        """The static padding actually written: the given bytes, or ``nbytes`` zeros."""
        return self.padding if self.padding is not None else bytes(self.nbytes)

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        if not isinstance(data, dict) or data.get("name") != CODEC_NAME:
            raise MetadataError(f"pad codec: expected a dict with name 'pad'. Got {data!r}")
        config = data.get("configuration")
        if not isinstance(config, dict):
            raise MetadataError(
                f"pad codec: 'configuration' must be an object with 'location' and 'nbytes'. "
                f"Got {config!r}"
            )
        unknown = sorted(set(config) - _CONFIG_KEYS)
        if unknown:
            raise MetadataError(f"pad codec: unknown configuration keys {unknown}. Got {config!r}")
        for key in ("location", "nbytes"):
            if key not in config:
                raise MetadataError(f"pad codec: configuration needs {key!r}. Got {config!r}")
        padding = config.get("padding")
        # JSON only carries base64; raw bytes are a Python-side convenience.
        if padding is not None and not isinstance(padding, str):
            raise MetadataError(f"pad codec: 'padding' must be a base64 string. Got {padding!r}")
        return cls(
            location=cast("str", config["location"]),
            nbytes=cast("int", config["nbytes"]),
            padding=padding,
        )

    def to_dict(self) -> dict[str, JSON]:
        config: dict[str, JSON] = {"location": self.location, "nbytes": self.nbytes}
        if self.padding is not None:
            config["padding"] = base64.b64encode(self.padding).decode("ascii")
        return {"name": CODEC_NAME, "configuration": config}

    def compute_encoded_size(self, input_byte_length: int, _chunk_spec: ArraySpec) -> int:
        return input_byte_length + self.nbytes

    def make_padding(self, data: bytes) -> bytes:
        """The padding for one chunk whose bytes (before padding) are ``data``."""
        if self.padding_func is None:
            return self.padding_bytes
        result: Any = self.padding_func(data)
        if not isinstance(result, bytes | bytearray | memoryview):
            raise MetadataError(
                f"pad codec: 'padding_func' must return bytes. Got {type(result).__name__}"
            )
        result = bytes(result)
        if len(result) != self.nbytes:
            # A wrong length would silently corrupt every later read, so refuse to write.
            raise MetadataError(
                f"pad codec: 'padding_func' must return exactly nbytes={self.nbytes} bytes, "
                f"returned {len(result)} bytes"
            )
        return result

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        data = chunk_bytes.as_numpy_array()
        if len(data) < self.nbytes:
            raise CorruptDataError(
                f"pad codec: stored chunk is {len(data)} bytes, shorter than the "
                f"{self.nbytes} bytes of padding at its {self.location}"
            )
        if self.location == "start":
            inner = data[self.nbytes :]
        else:
            inner = data[: len(data) - self.nbytes]
        return chunk_spec.prototype.buffer.from_array_like(inner)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        return self._decode_sync(chunk_bytes, chunk_spec)

    def _encode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        data = chunk_bytes.as_numpy_array()
        # Only materialise a bytes copy when a callable needs to see the data.
        pad = self.make_padding(data.tobytes() if self.padding_func is not None else b"")
        pad_arr = np.frombuffer(pad, dtype=np.uint8)
        parts = (pad_arr, data) if self.location == "start" else (data, pad_arr)
        return chunk_spec.prototype.buffer.from_array_like(np.concatenate(parts))

    async def _encode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        return self._encode_sync(chunk_bytes, chunk_spec)


# Direct imports register too; re-registering the same class under the same
# fully-qualified name just overwrites the identical registry entry.
register_codec(CODEC_NAME, PadCodec)
