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
  checked before the codec decodes;
- imagecodecs' numcodecs codecs (registered by codec_packages): its zstd,
  zlib, bz2, LZMA and Blosc are the formats above and bounded as they are;
  PNG, JPEG, JPEG 2000 (and HTJ2K) and WebP streams declare height, width,
  components and sample depth in their header (`tiff_segments.declared_image`),
  checked against `limit` before the codec decodes;
- the image codecs in `DECODED_INTO` (LERC, JPEG XL, JPEG XR, JPEG-LS, BMP and
  the declaring ones) are given the chunk's own array as `out` where the
  caller has one (a v2 chunk without filters, as zarr-python 2 writes them):
  imagecodecs compares the shape the stream declares with it and refuses a
  mismatch before it allocates (measured: a 70-byte LERC stream declaring
  16000 x 16000 costs nothing). JPEG 2000 and QOI allocate first, hence the
  header check above.

Any other codec (checksums, filters, the rest of imagecodecs: QOI, AVIF,
LZ4 with imagecodecs' framing, Brotli, ...) decodes as zarr-python does and its
output is checked afterwards: a crafted chunk can cost what its stream
declares before it is refused. `CODEC_IDS` names what is bounded.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from collections.abc import Callable
from typing import Any

import imagecodecs
import numpy as np

from zfuse.errors import CorruptDataError
from zfuse.view.tiff_segments import declared_image, decode_cost_problem

__all__ = ["CODEC_IDS", "DECODED_INTO", "bounded", "codec_id", "decode_into", "declared_size",
           "declares_size", "decompress_bounded"]

Bytes = bytes | bytearray | memoryview


# resolved now (1 ms): imagecodecs loads its extensions when first used, and one that
# fails to load then (a daemon short of memory at that moment) stays a stub that fails
# every later zstd chunk until the daemon restarts
_zstd_decode = imagecodecs.zstd_decode


def _zstd(data: Bytes, limit: int, config: dict[str, Any]) -> bytes:
    # exactly `limit`: libzstd refuses a frame that needs more (dst too small)
    return _zstd_decode(data, out=limit) if limit else b""  # type: ignore[no-any-return]


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
#: imagecodecs' byte codecs that write exactly these formats (its LZ4 has its own framing)
_ALIASES = {"imagecodecs_zstd": "zstd", "imagecodecs_zlib": "zlib", "imagecodecs_bz2": "bz2",
            "imagecodecs_lzma": "lzma", "imagecodecs_blosc": "blosc"}
#: imagecodecs image codecs whose stream header declares the image: its kind for declared_dims
_IMAGE_DECLARING = {"imagecodecs_png": "PNG", "imagecodecs_spng": "PNG", "imagecodecs_jpeg": "JPEG",
                    "imagecodecs_jpeg8": "JPEG", "imagecodecs_jpeg2k": "JPEG 2000",
                    "imagecodecs_htj2k": "JPEG 2000", "imagecodecs_webp": "WebP"}
#: imagecodecs codecs that refuse an `out` of another shape than their stream declares,
#: before allocating (measured with 16000 x 16000 streams: no growth); not jpeg2k (it
#: decodes, then compares)
DECODED_INTO = frozenset({"imagecodecs_lerc", "imagecodecs_jpegxl", "imagecodecs_jpegxr",
                          "imagecodecs_jpegls", "imagecodecs_bmp", "imagecodecs_png",
                          "imagecodecs_spng", "imagecodecs_jpeg", "imagecodecs_jpeg8",
                          "imagecodecs_webp", "imagecodecs_htj2k"})
CODEC_IDS = tuple(sorted((*_DECODERS, *_DECLARING, *_ALIASES, *_IMAGE_DECLARING, *DECODED_INTO)))


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
    ident = _ALIASES.get(ident, ident) if isinstance(ident, str) else None
    if ident in _DECODERS or ident in _DECLARING or ident in _IMAGE_DECLARING or ident in DECODED_INTO:
        return ident, config
    return None, {}


def declares_size(ident: str) -> bool:
    """Whether `decompress_bounded` only checks what `ident`'s stream declares (and
    returns None: decode it as usual), so it can check a stage before filters too."""
    return ident in _DECLARING or ident in _IMAGE_DECLARING


def declared_size(ident: str, data: Bytes, config: dict[str, Any] | None = None) -> int | None:
    """The decoded size a Blosc or LZ4 (numcodecs) frame or an image stream's header
    declares, None if unreadable."""
    if ident in _IMAGE_DECLARING:
        return _image_size(_IMAGE_DECLARING[ident], _image_stream(data, config or {}))
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
    if ident in _IMAGE_DECLARING:
        kind = _IMAGE_DECLARING[ident]
        size = declared_size(ident, data, config)
        if size is None:
            raise CorruptDataError(f"the stored chunk is not a {kind} stream whose image size "
                                   "can be read (a corrupt or hostile object)")
        if size > limit:
            raise CorruptDataError(f"the stored chunk's {kind} header declares an image of {size} "
                                   f"bytes, more than the {limit} a chunk holds (a corrupt or "
                                   "hostile object)")
        costly = decode_cost_problem(kind, bytes(data))
        if costly is not None:
            raise CorruptDataError(f"the stored chunk's {kind} stream has {costly} (a corrupt or hostile object)")
        return None
    if ident in DECODED_INTO:
        return None  # decoded into the chunk's array by `decode_into`, or as zarr does
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


def decode_into(codec: Any, data: Bytes, out: np.ndarray) -> np.ndarray:
    """A `DECODED_INTO` codec's chunk decoded into `out` (the chunk's own array): the
    decoder compares the shape its stream declares with `out`'s and refuses another
    before it allocates. CorruptDataError for a stream that is not that image."""
    try:
        decoded = codec.decode(data, out=out)
    except Exception as e:
        ident = codec_id(codec)[0]
        raise CorruptDataError(f"the stored chunk does not decode ({ident}) into the chunk's "
                               f"{'x'.join(map(str, out.shape))} {out.dtype} values: "
                               f"{type(e).__name__}: {e}") from e
    values = np.asarray(decoded)
    if values.size != out.size or values.dtype != out.dtype:
        raise CorruptDataError(f"the stored chunk decodes to {values.size} {values.dtype} values, "
                               f"the chunk holds {out.size} {out.dtype}")
    return values.reshape(out.shape)


def _image_stream(data: Bytes, config: dict[str, Any]) -> bytes:
    # imagecodecs' JPEG codec may keep the tables (everything before the scan) in its
    # configuration, as TIFF's JPEGTables: the frame header is then there
    header = config.get("header")
    stream = bytes(data)
    return header + stream if isinstance(header, bytes) else stream


def _image_size(kind: str, stream: bytes) -> int | None:
    """height * width * components * bytes per sample, from the stream's header
    (imagecodecs decodes more than 8 bits into uint16, more than 16 into uint32)."""
    image = declared_image(kind, stream)
    if image is None:
        return None
    height, width, components, bits = image
    return height * width * components * (1 if bits <= 8 else 2 if bits <= 16 else 4)


def _nbytes(value: Any) -> int | None:
    try:
        return len(memoryview(value).cast("B"))
    except TypeError:
        nbytes = getattr(value, "nbytes", None)
        if nbytes is not None:
            return int(nbytes)
        as_numpy = getattr(value, "as_numpy_array", None)
        return int(as_numpy().nbytes) if callable(as_numpy) else None
