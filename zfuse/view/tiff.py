"""The TIFF header of a chunk file, assembled: file header and IFDs. Pure functions, no I/O.

What the header says (ImageJ description and calibration, page order, the
chunk position record) is `tiff_meta.py`; reading the position back from a
header is `tiff_parse.py`.

A chunk file is ``build_header(layout, coords)`` followed by the chunk's raw
pixels in page order, ``np.ascontiguousarray(layout.to_file_order(chunk))
.astype(layout.dtype).tobytes()`` (C order, little endian, bool as one byte 0/1).

Invariants (the rest of zfuse relies on them):

- ``len(build_header(layout, coords, ...)) == layout.header_size`` for every
  chunk of the array, cropped edge chunks included: the header size depends
  only on what `plan_layout` was given, never on the coordinates. Coordinate
  text is written at a fixed width reserved from the grid size.
- The header holds the 8/16-byte TIFF header and *every* IFD; pixel data starts
  exactly at ``layout.header_size``. Page ``k`` (the leading axes flattened in
  C order, after ``file_axes``) is a single strip at ``header_size + k *
  page_bytes``, so pages lie at increasing offsets and contiguously, as ImageJ
  assumes.
- Pages run in ``layout.file_axes`` order: ImageJ's (c fastest, then z, then
  t) whenever the leading axes can be named (`tiff_meta.py`).
- Little endian ("II"); classic TIFF unless the full file would exceed
  4 GiB - 1, then BigTIFF. The choice depends on the layout, not the chunk.
- Every IFD has BitsPerSample, SampleFormat, Photometric (BlackIsZero),
  Compression=1, SamplesPerPixel=1, PlanarConfig, RowsPerStrip, StripOffsets,
  StripByteCounts and NewSubfileType. The first IFD also has an ImageJ
  ImageDescription, and the chunk position as JSON in DocumentName and in
  PageName (`POSITION_TAG`): ``{"chunk":[..],"origin":[..],"shape":[..]}``,
  space-padded to a fixed width (libtiff warns about NULs inside ASCII values).
- A cropped header (``shape=`` smaller than the chunk) describes the smaller
  image and is zero-padded to ``header_size``; its position fields sit at the
  same offsets as in the full header.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from zfuse.errors import TiffLayoutError
from zfuse.view.tiff_ifd import (
    ASCII,
    CLASSIC_LIMIT,
    LONG,
    RATIONAL,
    SHORT,
    ifd_format,
    pack_ifd,
    place_values,
    sample_format,
)
from zfuse.view.tiff_meta import (
    DOCUMENT_NAME,
    IMAGE_DESCRIPTION,
    POSITION_TAG,
    HeaderMeta,
    imagej_description,
    plan_meta,
    position_text,
)

__all__ = [
    "TiffLayout",
    "build_header",
    "geometry",
    "plan_layout",
    "samples_fit",
    "zarr_order_shapes",
    "tiff_unsupported_reason",
]

_HEADER_ALIGN = 16  # pixel data aligned for every dtype (complex128 is 16 bytes)


def tiff_unsupported_reason(dtype: object) -> str | None:
    """None if chunks of this dtype can be shown as TIFF; otherwise why not."""
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        return f"not a NumPy dtype: {dtype!r} ({exc})"
    if dt.subdtype is not None or dt.fields is not None:
        return f"structured/sub-array dtype {dt} has no TIFF sample format"
    kind, size = dt.kind, dt.itemsize
    if kind == "b":
        return None
    if kind in "ui" and size in (1, 2, 4, 8):
        return None
    if kind == "f" and size in (2, 4, 8):
        return None
    if kind == "c" and size in (8, 16):
        return None
    names = {
        "S": "byte strings",
        "U": "unicode strings",
        "T": "strings",
        "O": "Python objects",
        "V": "raw/void data",
        "M": "datetime64",
        "m": "timedelta64",
    }
    what = names.get(kind, f"dtype {dt}")
    return f"{what} ({dt}) have no TIFF sample format"


# What a chunk file can express. Its size must be an off_t (st_size); its width and
# height are TIFF LONGs. Each page is an IFD of the header, which is built in memory
# for every chunk file read (~256 bytes a page): a chunk of more pages than this would
# make every read of it build a header of over 16 MiB.
MAX_FILE_SIZE = 2**63 - 1
MAX_EDGE = 2**32 - 1
MAX_CHUNK_PAGES = 65536


def chunk_file_unsupported_reason(chunk_shape: Sequence[int], dtype: object,
                                  image: Sequence[int] | None = None) -> str | None:
    """Why chunks of this shape cannot be TIFF files, from their shape alone; None if they
    can (the planned file's size is checked against `MAX_FILE_SIZE` after planning).
    `image`: the axes that are rows and columns (`tiff_meta.image_axes`; the last two)."""
    shape = [int(n) for n in chunk_shape]
    if image is not None:
        shape = [n for i, n in enumerate(shape) if i not in image] + [shape[i] for i in image]
    pages, rows, cols = flatten(shape)
    if max(rows, cols) > MAX_EDGE:
        return (f"chunks of {rows} x {cols} pixels: a TIFF image is at most {MAX_EDGE} pixels "
                "high and wide")
    if pages > MAX_CHUNK_PAGES:
        return (f"chunks of {pages} pages (shape {tuple(int(n) for n in chunk_shape)}): zfuse shows "
                f"chunk files of at most {MAX_CHUNK_PAGES} pages")
    size = pages * rows * cols * np.dtype(dtype).itemsize  # type: ignore[call-overload]
    if size > MAX_FILE_SIZE:
        return f"chunks of {size} bytes: past the largest file size ({MAX_FILE_SIZE} bytes, 2**63 - 1)"
    return None


def flatten(shape: Sequence[int]) -> tuple[int, int, int]:
    """(pages, rows, cols) of a chunk's TIFF: the last two axes are the image, leading
    axes pages; a 1-d chunk is one row, a 0-d chunk one pixel. The one flattening every
    reader and writer of chunk files uses."""
    if len(shape) == 0:
        return 1, 1, 1
    if len(shape) == 1:
        return 1, 1, int(shape[0])
    return math.prod(shape[:-2]), int(shape[-2]), int(shape[-1])


def samples_fit(file_shape: Sequence[int], samples: int) -> bool:
    """Whether `samples` per pixel of a written image can be the fastest planes of a
    file of `file_shape` (file order): the product of its fastest page axes, axes of
    size 1 skipped. An RGB image is a chunk's 3 channels; 3 samples across the c=2
    and t axes of a (t, c) chunk are not (they were stored split across time)."""
    if samples <= 1:
        return True
    product = 1
    for n in reversed(list(file_shape)[:-2]):  # the page axes, fastest first
        if n > 1:
            if product * int(n) >= samples:
                # (whole runs of that axis: 2 RGB pages are a c=6 chunk's channels)
                return samples % product == 0 and product * int(n) % samples == 0
            product *= int(n)
    return False


#: bytes at the start of a written file where `zarr_order_shapes` looks for its description
SAID_SHAPE_BYTES = 64 * 1024


def zarr_order_shapes(layout: TiffLayout | None, shapes: Sequence[Sequence[int]],
                      data: bytes | bytearray | memoryview) -> list[tuple[int, ...]]:
    """The chunk shapes (chunk order, full or cropped) a written file may hold in zarr's
    order besides the chunk file's: where rows and columns are not the chunk's last two
    axes (`TiffLayout.moves_image`), that order has another geometry, and the file's
    first bytes hold tifffile's description of that very shape (`{"shape": [...]}`, as
    `tifffile.imwrite(path, chunk)` writes it). Only then do the IFD limits and early
    checks take its geometry too: a chunk of many rows would otherwise let any file have
    that many IFDs."""
    if layout is None or not layout.moves_image:
        return []
    own = {geometry(layout, s) for s in shapes}
    head = bytes(memoryview(data)[:SAID_SHAPE_BYTES])
    out = []
    for shape in shapes:
        said = ('{"shape": [' + ", ".join(str(int(n)) for n in shape) + "]}").encode("ascii")
        if flatten(shape) not in own and said in head:
            out.append(tuple(int(n) for n in shape))
    return out


def geometry(layout: TiffLayout | None, shape: Sequence[int]) -> tuple[int, int, int]:
    """(pages, rows, cols) of the file of a chunk of chunk-order `shape` (full or
    cropped): in the layout's file order (`TiffLayout.file_shape`); without a layout,
    the last two axes are the image."""
    return flatten(layout.file_shape(shape) if layout is not None else shape)


@dataclass(frozen=True)
class TiffLayout:
    """Everything about one array's chunk files that does not depend on the chunk."""

    chunk_shape: tuple[int, ...]
    dtype: np.dtype  # little-endian (or byte-order-free) form of the array dtype
    header_size: int
    data_size: int  # bytes of pixel data of a full chunk
    bigtiff: bool
    pages: int  # leading axes flattened
    rows: int
    cols: int
    description: str = field(compare=False)  # ImageJ description of the template (origin 0)
    _meta: HeaderMeta = field(repr=False)
    _template: bytes = field(repr=False, compare=False)
    # absolute offsets of the patched fields: JSON, DocumentName, (offset, width, axis) origins
    _pos_offsets: tuple[int, int] = field(repr=False, compare=False)
    _origin_fields: tuple[tuple[int, int, int], ...] = field(repr=False, compare=False)
    #: chunk axes in the file's order (``chunk.transpose(file_axes)``): the page axes
    #: as the pages run, then rows and columns. The identity unless the page axes must
    #: be reordered into ImageJ's t, z, c, or the axes named y and x are not the last two
    file_axes: tuple[int, ...] = ()

    @property
    def file_size(self) -> int:
        return self.header_size + self.data_size

    def pixel_size(self) -> tuple[float, float] | None:
        """(row height, column width) as the resolution tags state them (in the
        description's `unit`), or None where there are none."""
        xres = self._meta.xres
        if xres is None:
            return None
        xn, xd, yn, yd = xres
        return yd / yn, xd / xn

    @property
    def page_bytes(self) -> int:
        return self.rows * self.cols * self.dtype.itemsize

    @property
    def roles(self) -> tuple[str | None, ...] | None:
        """The ImageJ role ("c", "z", "t"; None for an axis of size 1 and for the rows
        and columns) of each chunk axis; None for a plain stack."""
        return self._meta.roles

    @property
    def image_axes(self) -> tuple[int, ...]:
        """The chunk axes that are the file's rows and columns (`tiff_meta.image_axes`)."""
        return self._meta.image_axes

    @property
    def moves_image(self) -> bool:
        """Whether the file's rows and columns are not the chunk's last two axes (then a
        file written in zarr's order, `tifffile.imwrite(path, chunk)`, has another
        geometry than the chunk file's: `tiff_input` reads it where it says so)."""
        n = len(self.chunk_shape)
        return n >= 2 and self.image_axes != (n - 2, n - 1)

    def file_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """A chunk-order shape (full or cropped) in the file's axis order: what `flatten`
        makes pages, rows and columns of."""
        return tuple(int(shape[i]) for i in self.file_axes)

    @property
    def permuted(self) -> bool:
        """True if the file's pages run in another order than the chunk's axes."""
        return self.file_axes != tuple(range(len(self.chunk_shape)))

    def to_file_order(self, values: np.ndarray) -> np.ndarray:
        """A chunk's values (full or cropped, chunk axis order) in the file's page
        order; a view, not necessarily contiguous."""
        return values.transpose(self.file_axes) if self.permuted else values

    def from_file_order(self, pixels: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        """Pixels in the file's page order (any shape with the right size) of an
        image whose chunk-order shape is `shape` -> an array of `shape`."""
        shape = tuple(shape)
        if not self.permuted:
            return pixels.reshape(shape)
        file_shape = tuple(shape[i] for i in self.file_axes)
        return pixels.reshape(file_shape).transpose(np.argsort(self.file_axes))


def _check_len(name: str, seq: Sequence[object] | None, ndim: int) -> None:
    if seq is not None and len(seq) != ndim:
        raise TiffLayoutError(f"{name} must have one entry per axis ({ndim}); got {list(seq)!r}")


def plan_layout(
    chunk_shape: Sequence[int],
    dtype: object,
    *,
    axes: Sequence[str] | None = None,
    axis_types: Sequence[str | None] | None = None,
    scales: Sequence[float] | None = None,
    units: Sequence[str | None] | None = None,
    grid_shape: Sequence[int] | None = None,
    array_shape: Sequence[int] | None = None,
) -> TiffLayout:
    """Plan the chunk files of one array and precompute the header template.

    `axes`/`axis_types`/`scales`/`units` are OME-Zarr axis names, types
    ("space"/"time"/"channel"), physical scales and units, one per axis.
    `grid_shape` (chunks per axis) or `array_shape` size the fixed-width
    coordinate fields; without either, 20 digits per coordinate are reserved.
    """
    shape = tuple(int(n) for n in chunk_shape)
    if any(n < 1 for n in shape):
        raise TiffLayoutError(f"chunk shape must be positive; got {shape!r}")
    reason = tiff_unsupported_reason(dtype)
    if reason is not None:
        raise TiffLayoutError(reason)
    dt = np.dtype(dtype).newbyteorder("<")  # type: ignore[call-overload]
    ndim = len(shape)
    for name, seq in (
        ("axes", axes),
        ("axis_types", axis_types),
        ("scales", scales),
        ("units", units),
        ("grid_shape", grid_shape),
        ("array_shape", array_shape),
    ):
        _check_len(name, seq, ndim)
    meta, file_axes = plan_meta(shape, axes=axes, axis_types=axis_types, scales=scales, units=units,
                                grid_shape=grid_shape, array_shape=array_shape)

    pages, rows, cols = flatten([shape[i] for i in file_axes])
    data_size = math.prod(shape) * dt.itemsize

    # Classic unless the whole file passes 4 GiB - 1 (offsets are uint32).
    bigtiff = data_size > CLASSIC_LIMIT  # no classic header can address that
    if not bigtiff:
        built = _build(meta, dt, shape, bigtiff=False, data_offset=0)
        bigtiff = _align(len(built.header)) + data_size > CLASSIC_LIMIT
    if bigtiff:
        built = _build(meta, dt, shape, bigtiff=True, data_offset=0)
    header_size = _align(len(built.header))
    built = _build(meta, dt, shape, bigtiff=bigtiff, data_offset=header_size)
    template = bytes(built.header.ljust(header_size, b"\0"))
    return TiffLayout(
        chunk_shape=shape,
        dtype=dt,
        header_size=header_size,
        data_size=data_size,
        bigtiff=bigtiff,
        pages=pages,
        rows=rows,
        cols=cols,
        description=built.description,
        _meta=meta,
        _template=template,
        _pos_offsets=built.pos_offsets,
        _origin_fields=built.origin_fields,
        file_axes=file_axes,
    )


def _align(n: int) -> int:
    return -(-n // _HEADER_ALIGN) * _HEADER_ALIGN


@dataclass
class _Built:
    header: bytearray
    description: str
    pos_offsets: tuple[int, int]
    origin_fields: tuple[tuple[int, int, int], ...]


def _build(
    meta: HeaderMeta, dt: np.dtype, shape: Sequence[int], *, bigtiff: bool, data_offset: int
) -> _Built:
    """Assemble header bytes (unpadded) for an image of `shape`.

    Structure: file header, IFD0, IFD0's out-of-line values (position JSON,
    DocumentName, resolutions, description — in that order so the position
    fields have fixed offsets), then the IFDs of pages 1..N-1.
    """
    pages, rows, cols = flatten([shape[i] for i in meta.file_axes])
    page_bytes = rows * cols * dt.itemsize
    bits = 8 * dt.itemsize
    fmt = ifd_format(bigtiff)
    off_fmt, otype = fmt.offset_fmt, fmt.offset_type

    description, origin_fields = imagej_description(meta, shape)
    desc_bytes = description.encode("ascii") + b"\0"
    pos_len = meta.pos_width + 1  # space-padded fixed-width JSON + NUL
    pos_blank = b" " * meta.pos_width + b"\0"

    # (tag, type, count, value bytes) — value bytes filled below where needed
    def common(strip_offset: int) -> list[tuple[int, int, int, bytes | None]]:
        e: list[tuple[int, int, int, bytes | None]] = [
            (254, LONG, 1, struct.pack("<I", 0)),
            (256, LONG, 1, struct.pack("<I", cols)),
            (257, LONG, 1, struct.pack("<I", rows)),
            (258, SHORT, 1, struct.pack("<H", bits)),
            (259, SHORT, 1, struct.pack("<H", 1)),
            (262, SHORT, 1, struct.pack("<H", 1)),
            (273, otype, 1, struct.pack(off_fmt, strip_offset)),
            (277, SHORT, 1, struct.pack("<H", 1)),
            (278, LONG, 1, struct.pack("<I", rows)),
            (279, otype, 1, struct.pack(off_fmt, page_bytes)),
            (284, SHORT, 1, struct.pack("<H", 1)),
            (339, SHORT, 1, struct.pack("<H", sample_format(dt))),
        ]
        if meta.xres is not None:
            xn, xd, yn, yd = meta.xres
            e += [
                (282, RATIONAL, 1, struct.pack("<II", xn, xd)),
                (283, RATIONAL, 1, struct.pack("<II", yn, yd)),
                (296, SHORT, 1, struct.pack("<H", 1)),  # ResolutionUnit none
            ]
        return e

    ifd0_entries = common(data_offset) + [
        (DOCUMENT_NAME, ASCII, pos_len, pos_blank),
        (IMAGE_DESCRIPTION, ASCII, len(desc_bytes), desc_bytes),
        (POSITION_TAG, ASCII, pos_len, pos_blank),
    ]
    ifd0_entries.sort(key=lambda e: e[0])
    ifd0_at = fmt.head_size
    ool_at = ifd0_at + fmt.ifd_size(len(ifd0_entries))
    # Out-of-line order fixed: position JSON, DocumentName, rationals, description.
    by_tag = {e[0]: e for e in ifd0_entries}
    placed = [by_tag[tag] for tag in (POSITION_TAG, DOCUMENT_NAME, 282, 283, IMAGE_DESCRIPTION) if tag in by_tag]
    ool_pos, ifd1_at = place_values(fmt, [(tag, len(value or b"")) for tag, _, _, value in placed], ool_at)
    ool = bytearray(ifd1_at - ool_at)
    for tag, at in ool_pos.items():
        value = by_tag[tag][3] or b""
        ool[at - ool_at : at - ool_at + len(value)] = value

    header = bytearray(fmt.file_header(ifd0_at))
    header += pack_ifd(fmt, ifd0_entries, ool_pos, ifd1_at if pages > 1 else 0)
    header += ool
    if pages > 1:
        # Pages 1..N-1 share one IFD image; only StripOffsets and next differ.
        entries = common(0)
        entries.sort(key=lambda e: e[0])
        ifd = pack_ifd(fmt, entries, ool_pos, 0)  # rationals: IFD0's values
        size = len(ifd)
        off_size = fmt.offset_size
        strip_at = fmt.count_size + [e[0] for e in entries].index(273) * fmt.entry_size + fmt.entry_size - fmt.inline
        uint = fmt.uint
        k = np.arange(1, pages, dtype=np.uint64)
        block = np.frombuffer(bytes(ifd) * (pages - 1), np.uint8).reshape(pages - 1, size).copy()
        offsets = (data_offset + k * page_bytes).astype(uint)
        block[:, strip_at : strip_at + off_size] = offsets.view(np.uint8).reshape(-1, off_size)
        nexts = (ifd1_at + k * size).astype(uint)
        nexts[-1] = 0
        block[:, size - off_size :] = nexts.view(np.uint8).reshape(-1, off_size)
        header += block.tobytes()

    desc_at = ool_pos[IMAGE_DESCRIPTION]
    return _Built(
        header=header,
        description=description,
        pos_offsets=(ool_pos[POSITION_TAG], ool_pos[DOCUMENT_NAME]),
        origin_fields=tuple((desc_at + off, w, ax) for off, w, ax in origin_fields),
    )


@lru_cache(maxsize=256)
def _cropped_template(layout: TiffLayout, shape: tuple[int, ...]) -> bytes:
    built = _build(
        layout._meta, layout.dtype, shape, bigtiff=layout.bigtiff, data_offset=layout.header_size
    )
    # Same tag set and out-of-line order, so the patched fields did not move.
    assert built.pos_offsets == layout._pos_offsets
    assert built.origin_fields == layout._origin_fields
    if len(built.header) > layout.header_size:  # cannot happen: every number is <= the full one
        raise AssertionError("cropped header larger than the full header")
    return bytes(built.header.ljust(layout.header_size, b"\0"))


def build_header(
    layout: TiffLayout,
    chunk_coords: Sequence[int],
    *,
    shape: Sequence[int] | None = None,
    origin: Sequence[int] | None = None,
) -> bytes:
    """TIFF header of one chunk file; always exactly ``layout.header_size`` bytes.

    `shape` (each axis 1..chunk size) describes a cropped edge chunk; the pixel
    data still starts at ``layout.header_size``. `origin` is the chunk's first
    element in array coordinates (default ``coords * chunk_shape``).
    """
    meta = layout._meta
    if len(chunk_coords) != meta.ndim:
        raise TiffLayoutError(f"expected {meta.ndim} chunk coordinates; got {list(chunk_coords)!r}")
    if origin is None:
        origin = [c * n for c, n in zip(chunk_coords, layout.chunk_shape, strict=True)]
    elif len(origin) != meta.ndim:
        raise TiffLayoutError(f"expected {meta.ndim} origin values; got {list(origin)!r}")
    for values, digits, what in (
        (chunk_coords, meta.coord_digits, "chunk coordinate"),
        (origin, meta.origin_digits, "origin"),
    ):
        for v, d in zip(values, digits, strict=True):
            if v < 0 or v >= 10**d:
                raise TiffLayoutError(
                    f"{what} {v} outside the range this layout reserves (0..{10**d - 1}); "
                    f"got {list(values)!r}"
                )
    if shape is None or tuple(shape) == layout.chunk_shape:
        shape = layout.chunk_shape
        buf = bytearray(layout._template)
    else:
        shape = tuple(int(n) for n in shape)
        if len(shape) != meta.ndim or not all(
            1 <= n <= c for n, c in zip(shape, layout.chunk_shape, strict=True)
        ):
            raise TiffLayoutError(
                f"cropped shape must be within 1..{layout.chunk_shape} per axis; got {shape!r}"
            )
        buf = bytearray(_cropped_template(layout, shape))
    text = position_text(chunk_coords, origin, shape)
    for at in layout._pos_offsets:
        buf[at : at + len(text)] = text  # the rest of the field stays blank
    for at, width, axis in layout._origin_fields:
        buf[at : at + width] = f"{-int(origin[axis]):0{width}d}".encode("ascii")
    return bytes(buf)
