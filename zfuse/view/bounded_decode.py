"""Decompressing a stored chunk with its output bounded: a store is input too. Pure, no I/O.

A 32 KB zstd object in a crafted store decodes to 1 GiB: zarr-python's codecs
allocate whatever a stream holds (zstd's declared content size, a deflate or
bz2 stream's whole output) before the chunk's shape is checked, so one chunk
file would cost the daemon gigabytes, and each concurrent reader as much
again. Every compressor zfuse knows is decoded here into at most `limit` bytes
(the chunk's size, for the stage that feeds the array serializer), and a
stream that holds more is refused (`CorruptDataError`: EIO for that file, the
log naming the key):

- zstd: decoded into a buffer of exactly `limit` bytes (libzstd stops at its
  end, whatever the frame header declares or omits);
- gzip, zlib, bz2, LZMA: streaming decompressors asked for at most `limit` + 1
  bytes;
- Blosc and LZ4 (numcodecs' framing): the size their header declares is
  checked before the codec decodes.

Any other bytes-to-bytes codec (checksums, filters) decodes as zarr-python
does and its output is checked afterwards. `CODEC_IDS` names what is bounded.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from collections.abc import Callable
from typing import Any

import imagecodecs

from zfuse.errors import CorruptDataError

__all__ = ["CODEC_IDS", "bounded", "codec_id", "decompress_bounded", "declared_size"]

Bytes = bytes | bytearray | memoryview


def _zstd(data: Bytes, limit: int, config: dict[str, Any]) -> bytes:
    # exactly `limit`: libzstd refuses a frame that needs more (dst too small)
    return imagecodecs.zstd_decode(data, out=limit) if limit else b""  # type: ignore[no-any-return]


def _zlib_stream(wbits: int) -> Callable[[Bytes, int, dict[str, Any]], bytes]:
    def decode(data: Bytes, limit: int, config: dict[str, Any]) -> bytes:
        out = bytearray()
        rest: Bytes = data
        while True:  # gzip files may hold several members, read one after another
            d = zlib.decompressobj(wbits)
            out += d.decompress(rest, limit + 1 - len(out))
            if len(out) > limit or d.unconsumed_tail:
                raise _too_big(limit)
            rest = d.unused_data
            if wbits != 31 or not rest:
                return out
    return decode


def _bz2(data: Bytes, limit: int, config: dict[str, Any]) -> bytes:
    out = bz2.BZ2Decompressor().decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise _too_big(limit)
    return out


def _lzma(data: Bytes, limit: int, config: dict[str, Any]) -> bytes:
    fmt = config.get("format", lzma.FORMAT_AUTO)
    filters = config.get("filters") if fmt == lzma.FORMAT_RAW else None
    out = lzma.LZMADecompressor(format=fmt, filters=filters).decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise _too_big(limit)
    return out


_DECODERS: dict[str, Callable[[Bytes, int, dict[str, Any]], bytes]] = {
    "zstd": _zstd, "gzip": _zlib_stream(31), "zlib": _zlib_stream(15), "bz2": _bz2, "lzma": _lzma,
}
#: codecs whose framing declares the decoded size: checked, then decoded as zarr does
_DECLARING = ("blosc", "lz4")
CODEC_IDS = tuple(sorted((*_DECODERS, *_DECLARING)))


def _too_big(limit: int) -> CorruptDataError:
    return CorruptDataError(f"the stored chunk decompresses to more than the {limit} bytes a chunk "
                            "holds (a corrupt or hostile object)")


def codec_id(codec: Any) -> tuple[str | None, dict[str, Any]]:
    """(the compressor's id, its configuration) of a zarr v3 codec, a zarr numcodecs
    wrapper or a numcodecs codec; (None, {}) if it is none zfuse bounds."""
    name = type(codec).__name__
    native = {"ZstdCodec": "zstd", "GzipCodec": "gzip", "BloscCodec": "blosc"}.get(name)
    if native is not None and type(codec).__module__.startswith("zarr.codecs"):
        return native, {}
    config = getattr(codec, "codec_config", None)  # zarr's numcodecs wrappers
    if not isinstance(config, dict):
        get_config = getattr(codec, "get_config", None)  # numcodecs codecs themselves
        config = get_config() if callable(get_config) else {}
    ident = config.get("id") if isinstance(config, dict) else None
    if ident in _DECODERS or ident in _DECLARING:
        return ident, config
    return None, {}


def declared_size(ident: str, data: Bytes) -> int | None:
    """The decoded size a Blosc or LZ4 (numcodecs) frame declares, None if unreadable."""
    try:
        if ident == "blosc":
            return struct.unpack_from("<I", data, 4)[0]
        if ident == "lz4":
            return struct.unpack_from("<I", data, 0)[0]
    except struct.error:
        return None
    return None


def decompress_bounded(ident: str, config: dict[str, Any], data: Bytes, limit: int) -> bytes | None:
    """`data` decompressed into at most `limit` bytes; CorruptDataError if it holds more.
    None for a codec that declares its size (checked here): decode it as usual."""
    if ident in _DECLARING:
        size = declared_size(ident, data)
        if size is not None and size > limit:
            raise CorruptDataError(f"the stored chunk's {ident} header declares {size} bytes, "
                                   f"more than the {limit} a chunk holds (a corrupt or hostile object)")
        return None
    try:
        return _DECODERS[ident](data, limit, config)
    except CorruptDataError:
        raise
    except Exception as e:  # the library's own error: too big, or not this format at all
        raise CorruptDataError(f"the stored chunk does not decompress ({ident}) into the {limit} "
                               f"bytes a chunk holds: {e}") from e


def bounded(codec: Any, data: Bytes, limit: int, decode: Callable[[], Any]) -> Any:
    """Decode one stored stage: the bounded decompressor for `codec`'s id (its bytes), or
    `decode()` (zarr's own) for the rest, whose output must then fit `limit` too.
    Returns bytes from a bounded decompressor, else what `decode()` returned."""
    ident, config = codec_id(codec)
    if ident is not None:
        out = decompress_bounded(ident, config, data, limit)
        if out is not None:
            return out
    result = decode()
    size = _nbytes(result)
    if size is not None and size > limit:
        raise _too_big(limit)
    return result


def _nbytes(value: Any) -> int | None:
    try:
        return len(memoryview(value).cast("B"))
    except TypeError:
        nbytes = getattr(value, "nbytes", None)
        if nbytes is not None:
            return int(nbytes)
        as_numpy = getattr(value, "as_numpy_array", None)
        return int(as_numpy().nbytes) if callable(as_numpy) else None
