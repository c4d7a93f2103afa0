"""One array's (inner) chunks decoded and encoded: `ChunkCodecs`, a part of a
`ZarrChunkSource` (`source.py`) with state of its own (which codecs run in the
calling thread, the chunk spec, the bounds).

Decoding runs in the calling worker thread with the codecs' synchronous methods
where every codec has one: zarr's pipeline would hop to a thread per codec and
hold its event loop, which serves every other read. Every decompression is
bounded by what the chunk can hold (`bounded_decode`): a stored chunk that
declares or decompresses to more is corrupt data, never allocated.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr
from zarr.codecs.sharding import ShardingCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from zfuse.errors import CorruptDataError, InvalidTiffError
from zfuse.ext import zarr_private
from zfuse.view import bounded_decode


def _decode_bytes_stages(bytes_codecs: Sequence[Any], buf: Any, spec: Any, nbytes: int) -> Any:
    """A stored chunk through its bytes->bytes codecs, last first, in this thread, each
    stage's output bounded (bounded_decode): the one feeding the array->bytes codec by
    the `nbytes` it decodes from, the others by their input and `nbytes`. A codec without
    a synchronous decode (numcodecs' wrappers) runs on zarr's event loop."""
    for i, codec in enumerate(reversed(bytes_codecs)):
        limit = nbytes if i == len(bytes_codecs) - 1 else len(buf) + nbytes + 65536
        if zarr_private.can_decode_sync(codec):
            decode = functools.partial(zarr_private.decode_sync, codec, buf, spec)
        else:
            decode = functools.partial(_decode_on_loop, codec, buf, spec)
        out = bounded_decode.bounded(codec, buf.as_numpy_array(), limit, decode)
        buf = spec.prototype.buffer.from_bytes(out) if isinstance(out, (bytes, bytearray)) else out
    return buf


def _decode_on_loop(codec: Any, buf: Any, spec: Any) -> Any:
    (out,) = sync(codec.decode([(buf, spec)]))
    return out


#: codecs that store any values of their input exactly (v3 names, numcodecs ids): a
#: chunk written through an array of only these is stored without a check that it
#: reads back the same. Any other codec (lossy: JPEG, BitRound, Quantize; narrowing:
#: FixedScaleOffset, AsType; unknown) is checked (`ChunkCodecs.check_exact`).
EXACT_CODECS = frozenset({
    "bytes", "transpose", "crc32c", "zstd", "gzip", "blosc", "sharding_indexed", "zlib", "bz2", "lzma",
    "lz4", "shuffle", "crc32", "adler32", "fletcher32", "jenkins_lookup3", "pad", "delta", "packbits",
    "imagecodecs_zlib", "imagecodecs_deflate", "imagecodecs_zstd", "imagecodecs_lzma", "imagecodecs_bz2",
    "imagecodecs_lz4", "imagecodecs_lzw", "imagecodecs_packbits", "imagecodecs_blosc", "imagecodecs_brotli",
    "imagecodecs_snappy", "imagecodecs_zopfli",
})


def _codec_names(codec: Any, dtype: np.dtype) -> list[str] | None:
    """The names of a codec and of what it nests (a shard's inner and index codecs), as
    `EXACT_CODECS` spells them; None for one exact only for some values or types, where
    `dtype`'s are not those: a Delta is exact on integers in their own type (their
    differences wrap around and back; a float's do not, a narrower type's overflow),
    numcodecs' PackBits on booleans (it keeps of any other byte whether it is zero),
    zfuse's packbits when it keeps every bit (`first_bit`/`last_bit` drop the others)."""
    if isinstance(codec, ShardingCodec):
        names = [_codec_names(c, dtype) for c in (*codec.codecs, *codec.index_codecs)]
        return None if any(n is None for n in names) else ["sharding_indexed", *(x for n in names for x in n)]
    config: dict[str, Any] = {}
    if hasattr(codec, "to_dict"):
        as_dict = codec.to_dict()
        name = str(as_dict.get("name", ""))
        config = as_dict.get("configuration") or {}
    else:  # (a numcodecs codec of a v2 array)
        config = codec.get_config()
        name = str(config.get("id", ""))
    name = name.removeprefix("numcodecs.")
    if name == "delta":
        astype, own = config.get("astype"), config.get("dtype")
        try:
            same = own is not None and np.dtype(own) == dtype
        except TypeError:
            same = False
        return ["delta"] if same and astype in (None, own) and dtype.kind in "iu" else None
    if name == "packbits" and not hasattr(codec, "to_dict"):  # (numcodecs' v2 filter)
        return ["packbits"] if dtype.kind == "b" else None
    if name == "packbits":  # (zfuse's own: exact when it keeps every bit of a component)
        bits = 1 if dtype.kind == "b" else dtype.itemsize * 8 // (2 if dtype.kind == "c" else 1)
        kept = config.get("first_bit") in (None, 0) and config.get("last_bit") in (None, bits - 1)
        return ["packbits"] if kept else None
    return [name]


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one dtype hold the same values bit for bit (a NaN is its
    own, -0.0 is not 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":  # (bit for bit: NaN == NaN, -0.0 != 0.0)
        width = np.dtype(f"u{a.dtype.itemsize // (2 if a.dtype.kind == 'c' else 1)}")
        a = np.ascontiguousarray(a).view(width) if not a.flags.c_contiguous else a.view(width)
        b = np.ascontiguousarray(b).view(width) if not b.flags.c_contiguous else b.view(width)
    return bool(np.array_equal(a, b))


class ChunkCodecs:
    """The codecs between one array's (inner) chunk values and their stored bytes.

    `decode` gives a stored chunk's values (the full chunk shape), `encode` (in the
    calling thread, when `encodes_in_thread`) and `encode_on_loop` (zarr's pipeline) the
    stored bytes of a whole chunk. `stored_max` bounds what a stored chunk is read up to.
    """

    def __init__(self, array: zarr.Array, sharding: ShardingCodec | None, fill_value: Any) -> None:
        meta = array.metadata
        self._array = array
        self._sharding = sharding
        self._fill_value = fill_value
        self._zarr_format: int = meta.zarr_format
        self.chunk_shape = tuple(array.chunks)
        self.dtype = np.dtype(array.dtype)
        # a v2 chunk's values in memory order: "F" (Fortran) or "C"
        self.order: str = getattr(meta, "order", "C") if self._zarr_format == 2 else "C"
        # [array->bytes codec, bytes->bytes codecs...] when every one of them can
        # decode synchronously and no array->array codec changes the spec
        self.in_thread: tuple[Any, list[Any]] | None = None
        if self._zarr_format == 3:
            from zarr.abc.codec import ArrayBytesCodec, BytesBytesCodec

            codecs = list(sharding.codecs if sharding is not None else meta.codecs)
            if (
                codecs
                and isinstance(codecs[0], ArrayBytesCodec)
                and all(isinstance(c, BytesBytesCodec) for c in codecs[1:])
                and all(zarr_private.can_decode_sync(c) for c in codecs)
            ):
                self.in_thread = (codecs[0], codecs[1:])
        #: whole (unsharded) chunks encode in the calling thread too when every codec can
        self.encodes_in_thread = self.in_thread is not None and sharding is None and all(
            zarr_private.can_encode_sync(c) for c in meta.codecs
        )

    @functools.cached_property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    @functools.cached_property
    def stored_max(self) -> int:
        """Bytes a stored (inner) chunk is read up to: twice its values and a MiB, far past
        what any codec's framing adds; a crafted terabyte-sized file is refused unread."""
        return 2 * self.chunk_nbytes + (1 << 20)

    @functools.cached_property
    def spec(self) -> Any:
        """The spec a (inner) chunk is encoded and decoded with: one for the whole
        regular grid (zarr gives every chunk the full chunk shape)."""
        proto = default_buffer_prototype()
        first = tuple(0 for _ in self._array.shape)
        config = zarr_private.array_config(self._array)
        if config.order != self.order:  # (a v2 array's chunks are in its own order, as zarr reads them)
            config = dataclasses.replace(config, order=self.order)
        spec = self._array.metadata.get_chunk_spec(first, config, proto)
        return spec if self._sharding is None else zarr_private.inner_chunk_spec(self._sharding, spec)

    # -- decoding -----------------------------------------------------------
    def decode(self, buf: Any, spec: Any) -> np.ndarray:
        """A fetched chunk's values, every decompression bounded by the chunk's size."""
        codecs = self.in_thread
        if codecs is None:
            values = self._decode_v2_bounded(buf)
            if values is not None:
                return values
            staged = self._staged
            if staged is not None:
                # the bytes->bytes stages one by one, each bounded, then zarr's pipeline for
                # the rest: numcodecs' wrappers (numcodecs.zlib, .bz2, ...) and a leading
                # transpose have no synchronous decode, and zarr's pipeline bounds nothing
                front, bytes_codecs, bytes_spec, bytes_nbytes = staged
                buf = _decode_bytes_stages(bytes_codecs, buf, bytes_spec, bytes_nbytes)
                (decoded,) = sync(front.decode([(buf, spec)]))
            else:  # (nested sharding, v2 filters: zarr's pipeline decodes the whole chunk)
                pipeline = (self._sharding or self._array.async_array).codec_pipeline
                (decoded,) = sync(pipeline.decode([(buf, spec)]))
            if decoded is None:
                return np.full(self.chunk_shape, self._fill_value, dtype=self.dtype)
        else:
            serializer, bytes_codecs = codecs
            buf = _decode_bytes_stages(bytes_codecs, buf, spec, self.chunk_nbytes)
            decoded = zarr_private.decode_sync(serializer, buf, spec)
        values = np.asarray(decoded.as_numpy_array())
        if values.size != math.prod(self.chunk_shape):
            raise CorruptDataError(f"the stored chunk decodes to {values.size} values, "
                                   f"the chunk holds {math.prod(self.chunk_shape)}")
        return values.reshape(self.chunk_shape)

    @functools.cached_property
    def _staged(self) -> tuple[Any, list[Any], Any, int] | None:
        """For v3 codecs `in_thread` cannot decode: (zarr's pipeline of the
        array->array codecs and the array->bytes one, the bytes->bytes codecs, the spec
        those see, the bytes they must decode to); None where the array->bytes codec is
        itself sharding (nested shards) or the codecs are not in that order."""
        if self._zarr_format != 3:
            return None
        from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
        from zarr.core.codec_pipeline import BatchedCodecPipeline

        codecs = list(self._sharding.codecs if self._sharding is not None else self._array.metadata.codecs)
        split = next((i for i, c in enumerate(codecs) if isinstance(c, ArrayBytesCodec)), None)
        if split is None or isinstance(codecs[split], ShardingCodec):
            return None
        if not all(isinstance(c, ArrayArrayCodec) for c in codecs[:split]) or \
                not all(isinstance(c, BytesBytesCodec) for c in codecs[split + 1:]):
            return None
        spec = self.spec
        for codec in codecs[:split + 1]:  # (as zarr's pipeline resolves them)
            spec = codec.resolve_metadata(spec)
        nbytes = math.prod(spec.shape) * spec.dtype.to_native_dtype().itemsize
        return BatchedCodecPipeline.from_codecs(codecs[:split + 1]), codecs[split + 1:], spec, nbytes

    def _decode_v2_bounded(self, buf: Any) -> np.ndarray | None:
        """A v2 chunk (C order, no filters) whose compressor zfuse bounds, decoded as
        zarr's V2Codec does (decompress, view as the dtype, reshape) with the output
        bounded by the chunk's size; None for anything else (zarr's pipeline decodes it,
        after a declared size is checked where the framing has one)."""
        if self._zarr_format != 2 or self._sharding is not None:
            return None
        meta = self._array.metadata
        compressor = getattr(meta, "compressor", None)
        if compressor is None:
            return None
        ident, config = bounded_decode.codec_id(compressor)
        if ident is None:
            return None
        raw = buf.as_numpy_array()
        stored = np.dtype(meta.dtype.to_native_dtype())
        filters = getattr(meta, "filters", None)
        if filters:
            # the filters come after: check what the framing declares, else leave it to zarr
            if bounded_decode.declares_size(ident):
                bounded_decode.decompress_bounded(ident, config, raw, self.chunk_nbytes)
                return None
            if ident in bounded_decode.DECODED_INTO:
                return None
            # decompressed into what any filter's encoding can be (an AsType of 16-byte
            # values from 1-byte ones), then the filters as zarr's V2Codec applies them
            out = bounded_decode.decompress_bounded(ident, config, raw, 16 * self.chunk_nbytes + 65536)
            if out is None:
                return None
            from numcodecs.compat import ensure_ndarray_like

            chunk: Any = out
            for f in reversed(filters):
                chunk = f.decode(chunk)
            values = ensure_ndarray_like(chunk).view(stored)
            if values.size != math.prod(self.chunk_shape):
                raise CorruptDataError(f"the stored chunk decodes to {values.size} values, "
                                       f"the chunk holds {math.prod(self.chunk_shape)}")
            return values.reshape(-1).reshape(self.chunk_shape, order=self.order)
        out = bounded_decode.decompress_bounded(ident, config, raw, self.chunk_nbytes)
        if ident in bounded_decode.DECODED_INTO and stored.isnative:
            # an image codec: decoded into the chunk's own array (as zarr-python 2 does),
            # which the decoder checks against the image its stream declares first (F
            # order: the image's values as zarr reads them, then in the chunk's order)
            if self.order == "F":
                into = np.empty(self.chunk_shape, stored)
                return bounded_decode.decode_into(compressor, raw, into).reshape(-1).reshape(
                    self.chunk_shape, order="F")
            return bounded_decode.decode_into(compressor, raw, np.empty(self.chunk_shape, stored))
        if out is None:
            return None  # its declared size was checked: zarr decodes it
        if len(out) != self.chunk_nbytes:
            raise CorruptDataError(f"the stored chunk decompresses to {len(out)} bytes, "
                                   f"the chunk holds {self.chunk_nbytes}")
        return np.frombuffer(out, dtype=stored).reshape(self.chunk_shape, order=self.order)

    # -- exactness -----------------------------------------------------------
    @functools.cached_property
    def _chain(self) -> list[Any]:
        """The codecs between a chunk's values and its stored bytes: a v3 array's, a v2
        array's filters and compressor."""
        meta = self._array.metadata
        if self._zarr_format == 3:
            return list(meta.codecs)
        return [*(meta.filters or ()), *((meta.compressor,) if meta.compressor is not None else ())]

    @functools.cached_property
    def codec_names(self) -> list[str | None]:
        """The names of `_chain`'s codecs (and of those a shard nests); None for one not
        known to be exact."""
        out: list[str | None] = []
        for codec in self._chain:
            names = _codec_names(codec, self.dtype)
            out.extend(names if names is not None else [None])
        return out

    @functools.cached_property
    def exact(self) -> bool:
        """Whether every codec stores any values exactly (`EXACT_CODECS`)."""
        return all(n in EXACT_CODECS for n in self.codec_names)

    def _described(self) -> str:
        """`_chain` as messages name it, a shard's inner codecs after `sharding_indexed`."""
        def named(codec: Any) -> list[str]:
            if isinstance(codec, ShardingCodec):
                return ["sharding_indexed", *(n for inner in codec.codecs for n in named(inner))]
            return [str(codec.to_dict().get("name")) if hasattr(codec, "to_dict") else codec.codec_id]

        return ", ".join(n for codec in self._chain for n in named(codec))

    @functools.cached_property
    def _pipeline(self) -> Any:
        """zarr's codec pipeline of one (inner) chunk."""
        if self._sharding is None:
            return self._array.async_array.codec_pipeline
        from zarr.core.codec_pipeline import BatchedCodecPipeline

        return BatchedCodecPipeline.from_codecs(self._sharding.codecs)

    def check_exact(self, full: np.ndarray, inside: tuple[slice, ...], lossy: bool) -> None:
        """Encode a whole chunk and decode it again: InvalidTiffError when the codecs
        cannot encode the values, or (unless `lossy`) when the chunk's part `inside` the
        array would read back otherwise (a FixedScaleOffset had stored 1e9 as 1000.0, an
        AsType 300 as 44, JPEG its own pixels): nothing is stored. Blocking (a worker
        thread)."""
        proto = default_buffer_prototype()
        values = proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype))
        try:
            (encoded,) = sync(self._pipeline.encode([(values, self.spec)]))
        except Exception as e:  # (numcodecs' filters raise OverflowError, ValueError, ...)
            raise InvalidTiffError(f"the array's codecs ({self._described()}) cannot encode these values: "
                                   f"{type(e).__name__}: {e}; not stored") from e
        if lossy:
            return
        back = self.decode(encoded, self.spec)[inside]
        written = np.asarray(full, dtype=self.dtype)[inside]
        if same_values(back, written):
            return
        flat_w = np.ascontiguousarray(written).reshape(-1)
        flat_b = np.ascontiguousarray(back).reshape(-1)
        differs = flat_w.view(np.uint8).reshape(flat_w.size, -1) != flat_b.view(np.uint8).reshape(flat_b.size, -1)
        wrong = np.flatnonzero(differs.any(axis=1))
        at = tuple(int(i) for i in np.unravel_index(int(wrong[0]), written.shape))
        raise InvalidTiffError(
            f"the array's codecs ({self._described()}) cannot store these values exactly: {wrong.size} of "
            f"{written.size} would read back otherwise (at {at}: {flat_w[wrong[0]].item()!r} as "
            f"{flat_b[wrong[0]].item()!r}); "
            "not stored (mount with -o lossy_writes to store them as the codecs make them)")

    # -- encoding -----------------------------------------------------------
    def encode(self, full: np.ndarray) -> Any:
        """A whole chunk's stored bytes, encoded in this thread with the codecs'
        synchronous methods (the mirror of `decode`); only where `in_thread`."""
        assert self.in_thread is not None
        proto = default_buffer_prototype()
        spec = self.spec
        serializer, bytes_codecs = self.in_thread
        values = proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype))
        encoded = zarr_private.encode_sync(serializer, values, spec)
        for codec in bytes_codecs:
            encoded = zarr_private.encode_sync(codec, encoded, spec)
        return encoded

    async def encode_on_loop(self, full: np.ndarray) -> Any:
        """A whole (unsharded) chunk's stored bytes, encoded by zarr's codec pipeline."""
        proto = default_buffer_prototype()
        values = proto.nd_buffer.from_numpy_array(np.ascontiguousarray(full, dtype=self.dtype))
        (encoded,) = await self._array.async_array.codec_pipeline.encode([(values, self.spec)])
        return encoded
