"""The ``packbits`` codec: a zarr v3 array->bytes codec packing values into ``k`` bits each.

Spec: docs/specs/packbits-codec.md (zarr-extensions ``codecs/packbits/README.md``). JSON form::

    {"name": "packbits",
     "configuration": {"padding_encoding": "none" | "first_byte" | "last_byte",
                       "first_bit": int | null, "last_bit": int | null}}

Every configuration key is optional (``{"name": "packbits"}`` is valid).

Invariants:

- Each component (a complex number has two, everything else one) is taken as its
  ``N``-bit little-endian value; bits ``first_bit..last_bit`` (``b`` bits, counted from
  the least-significant bit) are kept. Element ``i`` occupies bits ``[i*k, (i+1)*k)`` of
  one bit sequence, ``k = num_components * b``, in C order, and sequence bit ``j`` is bit
  ``j % 8`` (least significant first) of byte ``j // 8``: with every bit kept, the bytes
  are exactly the ``bytes`` codec's little-endian bytes, as the spec requires.
- The sequence is padded with 0 bits to a whole byte; ``padding_encoding`` ``first_byte``
  / ``last_byte`` prepends / appends one byte holding that padding count (0..7).
- So the encoded length is ``ceil(n * k / 8) + (padding_encoding != "none")`` for ``n``
  elements; :meth:`PackBitsCodec.encoded_nbytes` is that formula, and decoding refuses any
  other length or a wrong padding byte with :class:`~zfuse.errors.CorruptDataError`.
- Decoding shifts the ``b`` bits back to ``first_bit`` and sign-extends from ``last_bit``
  for signed integers, zero-extends otherwise (the spec's rule). So decode(encode(x)) == x
  exactly when every value of ``x`` is representable (its dropped bits are zero, or copies
  of the sign for signed types); other values come back with those bits cleared / filled.
- Data types: bool (1 bit), int8..int64, uint8..uint64, float16/32/64, complex64/128
  (the spec's int2/int4/uint2/uint4/float4/float6/bfloat16 types do not exist in
  zarr-python 3.1; float16 is not in the spec's list but is handled like zarrs does,
  as a 16-bit component). Anything else, or ``last_bit >= N``, is a MetadataError when
  the array is opened.
- ``from_dict(to_dict(c)) == c``; only non-default keys are written, so the seed's
  ``{"name": "packbits"}`` is written back exactly as it was read.

Bit order note: the numcodecs (zarr v2) ``packbits`` codec that the spec calls compatible
with ``first_byte`` uses numpy's default most-significant-bit-first order inside each
byte; this codec follows the spec's least-significant-bit numbering (as zarrs does), so
for bool data the bytes after the padding byte are numcodecs' bytes bit-reversed.

The spec's ``schema.json`` (an older revision) spells the keys ``start_byte``/``end_byte``
and ``start_bit``/``end_bit``; those spellings are accepted when reading and written
back in the README's spelling.

Importing this module registers the codec with zarr-python under the name ``packbits``
(the ``zarr.codecs`` entry point does the same lazily without importing zfuse first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.common import JSON
from zarr.registry import register_codec

from zfuse.errors import CorruptDataError, MetadataError

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.chunk_grids import ChunkGrid
    from zarr.core.dtype.wrapper import TBaseDType, TBaseScalar, ZDType

__all__ = ["PackBitsCodec", "component_layout"]

CODEC_NAME = "packbits"

PaddingEncoding = Literal["none", "first_byte", "last_byte"]
PADDING_ENCODINGS: tuple[PaddingEncoding, ...] = ("none", "first_byte", "last_byte")
# The older spelling of the spec's schema.json, accepted when reading.
_PADDING_ALIASES = {"start_byte": "first_byte", "end_byte": "last_byte"}
_KEY_ALIASES = {"start_bit": "first_bit", "end_bit": "last_bit"}
_CONFIG_KEYS = frozenset({"padding_encoding", "first_bit", "last_bit", *_KEY_ALIASES})

# Elements packed per block: a multiple of 8, so every block ends on a byte boundary
# whatever k is, and the bit matrix of one block stays a few MiB.
_BLOCK_ELEMENTS = 1 << 16


def component_layout(dtype: np.dtype[Any]) -> tuple[int, int, bool]:
    """(bits per component N, components per element, signed) for a numpy dtype.

    MetadataError for data types the codec does not define.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return 1, 1, False
    if dtype.kind in "iu" and dtype.itemsize in (1, 2, 4, 8):
        return 8 * dtype.itemsize, 1, dtype.kind == "i"
    if dtype.kind == "f" and dtype.itemsize in (2, 4, 8):
        return 8 * dtype.itemsize, 1, False
    if dtype.kind == "c" and dtype.itemsize in (8, 16):
        return 4 * dtype.itemsize, 2, False
    raise MetadataError(
        f"packbits codec: data type {dtype} is not supported (packbits handles bool, "
        f"int8..int64, uint8..uint64, float16/32/64, complex64/128); use the 'bytes' codec"
    )


def _parse_bit(data: object, name: str) -> int | None:
    if data is None:
        return None
    if isinstance(data, bool) or not isinstance(data, int | np.integer) or data < 0:
        raise MetadataError(
            f"packbits codec: {name!r} must be an integer >= 0 or null. Got {data!r}"
        )
    return int(data)


def _parse_padding_encoding(data: object) -> PaddingEncoding:
    if data is None:
        return "none"
    data = _PADDING_ALIASES.get(data, data) if isinstance(data, str) else data
    if data not in PADDING_ENCODINGS:
        raise MetadataError(
            f"packbits codec: 'padding_encoding' must be one of {list(PADDING_ENCODINGS)}. "
            f"Got {data!r}"
        )
    return cast("PaddingEncoding", data)


def _unsigned_view(arr: np.ndarray[Any, Any], bits: int) -> np.ndarray[Any, Any]:
    """The array's components as little-endian unsigned integers of ``bits`` bits, flat."""
    if bits == 1:
        return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return np.ascontiguousarray(le).reshape(-1).view(f"<u{bits // 8}")


@dataclass(frozen=True)
class PackBitsCodec(ArrayBytesCodec):
    """Pack every array element into ``k`` bits (see the module docstring)."""

    is_fixed_size = True

    padding_encoding: PaddingEncoding = "none"
    first_bit: int | None = None
    last_bit: int | None = None

    def __init__(
        self,
        *,
        padding_encoding: PaddingEncoding | str | None = "none",
        first_bit: int | None = None,
        last_bit: int | None = None,
    ) -> None:
        pe = _parse_padding_encoding(padding_encoding)
        fb = _parse_bit(first_bit, "first_bit")
        lb = _parse_bit(last_bit, "last_bit")
        if fb is not None and lb is not None and lb < fb:
            raise MetadataError(
                f"packbits codec: 'last_bit' ({lb}) must not be less than 'first_bit' ({fb})"
            )
        object.__setattr__(self, "padding_encoding", pe)
        object.__setattr__(self, "first_bit", fb)
        object.__setattr__(self, "last_bit", lb)

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        if not isinstance(data, dict) or data.get("name") != CODEC_NAME:
            raise MetadataError(
                f"packbits codec: expected a dict with name 'packbits'. Got {data!r}"
            )
        config = data.get("configuration", {})
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise MetadataError(f"packbits codec: 'configuration' must be an object. Got {config!r}")
        unknown = sorted(set(config) - _CONFIG_KEYS)
        if unknown:
            raise MetadataError(
                f"packbits codec: unknown configuration keys {unknown} (known: "
                f"'padding_encoding', 'first_bit', 'last_bit'). Got {config!r}"
            )
        for old, new in _KEY_ALIASES.items():
            if old in config and new in config:
                raise MetadataError(
                    f"packbits codec: give {new!r} or its old spelling {old!r}, not both. "
                    f"Got {config!r}"
                )
        get = {new: config.get(new, config.get(old)) for old, new in _KEY_ALIASES.items()}
        return cls(
            padding_encoding=cast("str | None", config.get("padding_encoding")),
            first_bit=cast("int | None", get["first_bit"]),
            last_bit=cast("int | None", get["last_bit"]),
        )

    def to_dict(self) -> dict[str, JSON]:
        config: dict[str, JSON] = {}
        if self.padding_encoding != "none":
            config["padding_encoding"] = self.padding_encoding
        if self.first_bit is not None:
            config["first_bit"] = self.first_bit
        if self.last_bit is not None:
            config["last_bit"] = self.last_bit
        if not config:
            return {"name": CODEC_NAME}
        return {"name": CODEC_NAME, "configuration": config}

    # ------------------------------------------------------------------ layout

    def bit_range(self, dtype: np.dtype[Any]) -> tuple[int, int]:
        """(first_bit, last_bit) resolved for ``dtype``; MetadataError if out of range."""
        n_bits, _, _ = component_layout(dtype)
        first = 0 if self.first_bit is None else self.first_bit
        last = n_bits - 1 if self.last_bit is None else self.last_bit
        if last >= n_bits or first > last:
            raise MetadataError(
                f"packbits codec: bits first_bit={first}..last_bit={last} do not fit the "
                f"{n_bits}-bit components of {np.dtype(dtype)}; last_bit must be at most "
                f"{n_bits - 1} and not below first_bit"
            )
        return first, last

    def bits_per_element(self, dtype: np.dtype[Any]) -> int:
        """``k`` of the spec: ``num_components * (last_bit - first_bit + 1)``."""
        _, n_comp, _ = component_layout(dtype)
        first, last = self.bit_range(dtype)
        return n_comp * (last - first + 1)

    def encoded_nbytes(self, n_elements: int, dtype: np.dtype[Any]) -> int:
        """The spec's encoded length: ``ceil(n * k / 8)`` plus the padding byte if any."""
        k = self.bits_per_element(dtype)
        return -(-n_elements * k // 8) + (self.padding_encoding != "none")

    def validate(
        self,
        *,
        shape: tuple[int, ...],
        dtype: ZDType[TBaseDType, TBaseScalar],
        chunk_grid: ChunkGrid,
    ) -> None:
        self.bit_range(dtype.to_native_dtype())

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        dtype = chunk_spec.dtype.to_native_dtype()
        return self.encoded_nbytes(input_byte_length // dtype.itemsize, dtype)

    # ------------------------------------------------------------------ pure functions

    def encode_array(self, arr: np.ndarray[Any, Any]) -> bytes:
        """The encoded bytes of ``arr`` (any shape, C order), padding byte included."""
        arr = np.asarray(arr)
        n_bits, n_comp, _ = component_layout(arr.dtype)
        first, last = self.bit_range(arr.dtype)
        b = last - first + 1
        comps = _unsigned_view(arr, n_bits)
        n = arr.size
        if first == 0 and b == n_bits and n_bits % 8 == 0:
            packed = comps.tobytes()  # every bit kept: the little-endian bytes themselves
        elif n_bits == 1:
            packed = np.packbits(comps, bitorder="little").tobytes()  # bool: values are bits
        else:
            packed = self._pack(comps, first, b, n_comp)
        pad = (-n * n_comp * b) % 8
        if self.padding_encoding == "first_byte":
            return bytes([pad]) + packed
        if self.padding_encoding == "last_byte":
            return packed + bytes([pad])
        return packed

    @staticmethod
    def _pack(comps: np.ndarray[Any, Any], first: int, b: int, n_comp: int) -> bytes:
        # Bit j of a little-endian value is bit j % 8 of its byte j // 8, which is exactly
        # column j of unpackbits(bitorder="little") over its bytes: slice the kept columns.
        width = comps.dtype.itemsize
        out = []
        step = _BLOCK_ELEMENTS * n_comp  # a multiple of 8 components: blocks end on a byte
        for start in range(0, comps.size, step):
            # flat unpack: rows of 8*width bits, same layout as axis=1 but much faster
            as_bytes = comps[start : start + step].view(np.uint8)
            bits = np.unpackbits(as_bytes, bitorder="little").reshape(-1, 8 * width)
            bits = bits[:, first : first + b]
            out.append(np.packbits(bits.reshape(-1), bitorder="little").tobytes())
        return b"".join(out)

    def decode_bytes(
        self, data: bytes | np.ndarray[Any, Any], dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> np.ndarray[Any, Any]:
        """Decode ``data`` into a new array of ``shape`` and ``dtype`` (native byte order)."""
        dtype = np.dtype(dtype)
        n_bits, n_comp, signed = component_layout(dtype)
        first, last = self.bit_range(dtype)
        b = last - first + 1
        n = int(np.prod(shape, dtype=np.int64))
        raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data.view(np.uint8).reshape(-1)
        expected = self.encoded_nbytes(n, dtype)
        if raw.size != expected:
            raise CorruptDataError(
                f"packbits codec: stored chunk is {raw.size} bytes, expected {expected} "
                f"({n} elements x {n_comp * b} bits"
                f"{', plus the padding byte' if self.padding_encoding != 'none' else ''})"
            )
        pad = (-n * n_comp * b) % 8
        if self.padding_encoding == "first_byte":
            stored_pad, raw = int(raw[0]), raw[1:]
        elif self.padding_encoding == "last_byte":
            stored_pad, raw = int(raw[-1]), raw[:-1]
        else:
            stored_pad = pad
        if stored_pad != pad:
            raise CorruptDataError(
                f"packbits codec: padding byte says {stored_pad} padding bits, but "
                f"{n} elements of {n_comp * b} bits need {pad}"
            )
        out_dtype = dtype.newbyteorder("<")
        if first == 0 and b == n_bits and n_bits % 8 == 0:
            return raw.view(out_dtype).reshape(shape).astype(dtype.newbyteorder("="))
        if n_bits == 1:
            return np.unpackbits(raw, count=n, bitorder="little").astype(bool).reshape(shape)
        comps = self._unpack(raw, n * n_comp, first, b, n_bits, signed)
        return comps.view(out_dtype).reshape(shape).astype(dtype.newbyteorder("="))

    @staticmethod
    def _unpack(
        raw: np.ndarray[Any, Any], count: int, first: int, b: int, n_bits: int, signed: bool
    ) -> np.ndarray[Any, Any]:
        """``count`` components as little-endian unsigned ``n_bits`` values (uint8 for 1 bit)."""
        width = max(n_bits // 8, 1)
        last = first + b - 1
        out = np.empty((count, width), dtype=np.uint8)
        step = _BLOCK_ELEMENTS * 8  # components per block; b * step is a multiple of 8 bits
        for start in range(0, count, step):
            stop = min(start + step, count)
            nbits = (stop - start) * b
            byte0 = start * b // 8
            bits = np.unpackbits(
                raw[byte0 : byte0 + -(-nbits // 8)], count=nbits, bitorder="little"
            ).reshape(-1, b)
            full = np.zeros((stop - start, 8 * width), dtype=np.uint8)
            full[:, first : last + 1] = bits  # shifted back to first_bit
            if signed and last + 1 < n_bits:
                full[:, last + 1 : n_bits] = bits[:, b - 1 : b]  # sign extension
            # rows are whole bytes, so packing the flat matrix packs each row
            out[start:stop] = np.packbits(full.reshape(-1), bitorder="little").reshape(-1, width)
        return out.reshape(-1).view(f"<u{width}")

    # ------------------------------------------------------------------ zarr hooks

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        dtype = chunk_spec.dtype.to_native_dtype()
        arr = self.decode_bytes(chunk_bytes.as_numpy_array(), dtype, tuple(chunk_spec.shape))
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(arr)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        return self._decode_sync(chunk_bytes, chunk_spec)

    def _encode_sync(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        encoded = self.encode_array(chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(encoded)

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        return self._encode_sync(chunk_array, chunk_spec)


# Direct imports register too; re-registering the same class under the same
# fully-qualified name just overwrites the identical registry entry.
register_codec(CODEC_NAME, PackBitsCodec)
