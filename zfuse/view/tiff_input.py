"""Parse a TIFF written into the mount back into one chunk's array: pure, no I/O.

Invariants:

- `decode_tiff` returns an array of exactly the chunk's shape (or the cropped
  edge shape, when the TIFF has that shape) and exactly the requested dtype,
  or raises `InvalidTiffError` whose message names the problem. It never
  casts between dtypes and never pads or crops. Exceptions, both lossless
  encodings of the same values: a bool chunk accepts uint8 0/1 and 1-bit
  bilevel images; an int16 chunk accepts ImageJ's signed-16-bit form (uint16
  offset by 32768, declared by its calibration function).
- Any valid TIFF layout is accepted (via tifffile): strips or tiles, either
  byte order, classic or BigTIFF, compressed with a codec whose output can
  be bounded before decoding (`tiff_segments.ACCEPTED_COMPRESSIONS`), one
  page per flattened leading-axis index, in IFD order. Pages run
  in the order zfuse's own file for the chunk has (``layout.file_axes``:
  ImageJ's c, z, t order for an OME-Zarr t, c, z chunk), so what ImageJ saves
  is stored as it showed it.
  Reduced-resolution pages (thumbnails, NewSubfileType bit 0) are ignored.
- Hostile files cost bounded work: the IFD chain is walked once
  (`tiff_complete.walk_tiff`: loops, too many IFDs, overlapping or
  oversized tag values are refused) before tifffile or the plain reader
  parses anything; geometry, dtype and sample layout are checked on the
  IFDs, and every strip and tile's decoded size (`tiff_segments`) *before*
  any pixel is decoded, so a file cannot make us allocate much more than
  the chunk's size; every strip/tile must lie inside the given bytes.
- zfuse's own layout (as produced by `build_header`) is recognised without
  tifffile when the caller passes the `layout`: the header must equal, byte
  for byte, the header zfuse would generate for the position it records, and
  the length must be exact. Anything else takes the full parse.
- The plainest TIFF (one classic IFD, one uncompressed grayscale page of the
  chunk's dtype and shape in contiguous strips, only tags that do not change
  the pixels: `_plain_image`) is read from its strips without tifffile; it
  gives the values tifffile would. Anything else takes the full parse.
"""

from __future__ import annotations

import io
import logging
import math
import re
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import tifffile

from zfuse.errors import InvalidTiffError
from zfuse.view.tiff import (
    TiffLayout,
    build_header,
    flatten,
    geometry,
    samples_fit,
    zarr_order_shapes,
)
from zfuse.view.tiff_complete import incomplete_reason, walk_tiff
from zfuse.view.tiff_parse import read_position
from zfuse.view.tiff_segments import ACCEPTED_COMPRESSIONS, check_segments

__all__ = ["MAX_TIFF_FACTOR", "MAX_TIFF_SLACK", "decode_tiff", "max_file_size"]

#: A TIFF written for a chunk may be at most this many times the size of
#: zfuse's own file for it, plus `MAX_TIFF_SLACK`: compression can expand data
#: slightly, tiles pad edges (up to ~4x for tiles just smaller than the image),
#: and writers add metadata; anything beyond is a runaway write.
MAX_TIFF_FACTOR = 4
MAX_TIFF_SLACK = 16 * 2**20

_MAGICS = {b"II*\0": "classic", b"MM\0*": "classic", b"II+\0": "BigTIFF", b"MM\0+": "BigTIFF"}

_log = logging.getLogger("tifffile")
_SEPARATE = 2  # PlanarConfiguration: each sample in its own plane


def max_file_size(layout: TiffLayout) -> int:
    """Largest TIFF the writer should buffer for one chunk of `layout`."""
    return MAX_TIFF_FACTOR * layout.file_size + MAX_TIFF_SLACK


def _describe(geom: tuple[int, int, int], shape: Sequence[int]) -> str:
    pages, rows, cols = geom
    return f"{pages} page(s) of {rows}x{cols} (rows x columns) for chunk shape {tuple(shape)}"


def _dtype_name(dt: np.dtype) -> str:
    return "bool" if dt.kind == "b" else dt.newbyteorder("=").name


class _Collect(logging.Handler):
    """Collects tifffile's warnings emitted by this thread, for error messages (the
    first few: a file of 4,000 bad tags makes 4,000)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.thread = threading.get_ident()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread and len(self.messages) < 3:
            self.messages.append(record.getMessage())


_collecting: set[int] = set()  # threads parsing a written file: tifffile's lines are theirs


class _Forward(logging.Handler):
    """tifffile's lines, as its logger would have propagated them, but for those of a
    thread parsing a written file: those go into its refusal's one line (a file of
    4,000 bad tags wrote 4,000 log lines, naming no key)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread not in _collecting:
            logging.getLogger().handle(record)


_log.propagate = False
_log.addHandler(_Forward())


@contextmanager
def _tifffile_warnings() -> Iterator[list[str]]:
    handler = _Collect()
    _log.addHandler(handler)
    _collecting.add(handler.thread)
    try:
        yield handler.messages
    finally:
        _collecting.discard(handler.thread)
        _log.removeHandler(handler)


def _fail(message: str, warnings: Sequence[str] = ()) -> InvalidTiffError:
    if warnings:
        message += " (tifffile: " + "; ".join(w[:200] for w in warnings[:3]) + ")"
    return InvalidTiffError(message)


def decode_tiff(
    data: bytes | bytearray | memoryview,
    *,
    chunk_shape: tuple[int, ...],
    dtype: object,
    cropped_shape: tuple[int, ...] | None = None,
    layout: TiffLayout | None = None,
) -> np.ndarray:
    """The chunk stored in TIFF bytes `data`, shaped `chunk_shape` (or
    `cropped_shape` for an edge chunk whose TIFF has that shape), of `dtype`.

    Pass the array's `layout` to let zfuse's own files skip the full parse.
    Raises InvalidTiffError for anything that is not exactly such a chunk.
    """
    chunk_shape = tuple(int(n) for n in chunk_shape)
    want = np.dtype(dtype)  # type: ignore[call-overload]
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    size = len(view)
    if size < 8:
        raise InvalidTiffError(f"not a TIFF: only {size} bytes")
    kind = _MAGICS.get(bytes(view[:4]))
    if kind is None:
        raise InvalidTiffError(
            f"not a TIFF: starts with {bytes(view[:4])!r}, expected b'II*\\x00' or b'MM\\x00*'"
        )
    shapes = [chunk_shape]
    if cropped_shape is not None and tuple(cropped_shape) != chunk_shape:
        shapes.append(tuple(int(n) for n in cropped_shape))

    if layout is not None:
        if layout.chunk_shape != chunk_shape or layout.dtype != want.newbyteorder("<"):
            raise ValueError("layout does not belong to this chunk shape/dtype")
        fast = _own_layout(view, layout, shapes, want)
        if fast is not None:
            return fast

    # Bounded work before any other parse: a loop, too many IFDs or overlapping tag
    # values would cost tifffile (and the plain reader) time and memory without bound.
    walk_shapes = [layout.file_shape(s) if layout is not None else s for s in shapes]
    walk_shapes += zarr_order_shapes(layout, shapes, view)  # (a file in zarr's order, saying so)
    walk = walk_tiff(view, walk_shapes, max_file_size(layout) if layout is not None else None)
    if walk.problem is not None:
        raise InvalidTiffError(f"malformed TIFF: {walk.problem}")

    plain = _plain_image(view, shapes, want, layout)
    if plain is not None:
        return plain

    with _tifffile_warnings() as warnings:
        try:
            tif = tifffile.TiffFile(io.BytesIO(view))
        except Exception as exc:
            raise _fail(f"not a readable TIFF: {_truncation(view) or exc}", warnings) from exc
        with tif:
            try:
                try:
                    return _decode_pages(tif, view, shapes, want, warnings, layout)
                except InvalidTiffError:
                    raise
                except Exception as exc:
                    # tifffile meets malformed tags lazily, as any exception type
                    raise _fail(f"malformed TIFF: {exc!r}", warnings) from exc
            except InvalidTiffError as exc:
                # a cut-off file shows up as missing pages or bad data: say so
                cut = _truncation(view)
                if cut is None or str(exc).startswith("TIFF truncated"):
                    raise
                raise InvalidTiffError(f"{cut}; {exc}") from exc


def _truncation(view: memoryview) -> str | None:
    """A message if the IFD chain, a tag value or the image data leave the bytes (a
    cut-off file), else None. Only called on error paths; the walk is the one the
    write layer uses to keep incomplete files pending."""
    reason = incomplete_reason(view, [])
    return f"truncated: {reason}" if reason else None


def _own_layout(
    view: memoryview, layout: TiffLayout, shapes: list[tuple[int, ...]], want: np.dtype
) -> np.ndarray | None:
    """The chunk if `view` is byte-exact zfuse layout, else None (full parse)."""
    hsize = layout.header_size
    for shape in shapes:
        if len(view) == hsize + math.prod(shape) * layout.dtype.itemsize:
            break
    else:
        return None
    try:
        record = read_position(view[:hsize])
        if [int(n) for n in record["shape"]] != list(shape):
            return None
        expected = build_header(
            layout, [int(c) for c in record["chunk"]], shape=shape, origin=record["origin"]
        )
    except (ValueError, KeyError, TypeError):
        return None
    if view[:hsize] != expected:
        return None
    raw = layout.from_file_order(np.frombuffer(view, dtype=layout.dtype, offset=hsize), shape)
    if want.kind == "b":
        return _to_bool(raw.view(np.uint8))
    return raw.astype(want)  # copies: the result never aliases the caller's buffer


# Tags a plain image may carry: they describe the pixels (checked below) or are
# metadata that no decoder looks at. Any other tag sends the file to tifffile.
_PLAIN_TAGS = frozenset({
    254,  # NewSubfileType (must be 0)
    256, 257, 258, 259, 262,  # width, length, bits per sample, compression, photometric
    269, 270, 271, 272,  # DocumentName, ImageDescription (not ImageJ's), Make, Model
    273, 277, 278, 279,  # strip offsets, samples per pixel, rows per strip, strip byte counts
    282, 283, 284, 285, 296,  # resolutions, planar configuration, PageName, resolution unit
    305, 306, 315, 339,  # Software, DateTime, Artist, SampleFormat
})
_SAMPLE_FORMATS = {"u": 1, "i": 2, "f": 3}
_INT_TYPES = {3: "H", 4: "I"}  # SHORT, LONG


def _plain_image(
    view: memoryview, shapes: list[tuple[int, ...]], want: np.dtype, layout: TiffLayout | None
) -> np.ndarray | None:
    """The chunk if `view` is the plainest TIFF there is, else None (full parse).

    Plain: classic TIFF, one IFD, one uncompressed grayscale (BlackIsZero) sample
    of exactly `want`'s kind and size, one plane of one of `shapes`, strips that
    follow each other and hold exactly the image, and no tag outside
    `_PLAIN_TAGS` (no ImageJ description: its stacks and calibrations need the
    full parse). That is what tifffile, libtiff and most tools write for an
    uncompressed 2-D image; the pixels are then the bytes as they lie, so
    tifffile's parse (most of a commit's cost for such a file) is skipped.
    """
    fmt = _SAMPLE_FORMATS.get(want.kind)
    if fmt is None or len(view) < 8:
        return None
    head = bytes(view[:4])
    if head == b"II*\0":
        bo = "<"
    elif head == b"MM\0*":
        bo = ">"
    else:
        return None
    size = len(view)
    try:
        (ifd,) = struct.unpack_from(bo + "I", view, 4)
        (count,) = struct.unpack_from(bo + "H", view, ifd)
        if ifd + 2 + 12 * count + 4 > size:
            return None
        tags: dict[int, list[int]] = {}
        seen: set[int] = set()
        description = b""
        for i in range(count):
            at = ifd + 2 + 12 * i
            tag, typ, n = struct.unpack_from(bo + "HHI", view, at)
            if tag not in _PLAIN_TAGS or tag in seen:
                return None  # (a repeated tag: readers disagree on which counts; the full parse decides)
            seen.add(tag)
            if tag == 270:
                if typ != 2:
                    return None
                start = at + 8 if n <= 4 else struct.unpack_from(bo + "I", view, at + 8)[0]
                if start + n > size:
                    return None
                description = bytes(view[start : start + min(n, 4096)])
                continue
            if tag in (269, 282, 283, 285, 305, 306, 315, 271, 272):
                continue  # text and rational metadata: not looked at
            int_fmt = _INT_TYPES.get(typ)
            if int_fmt is None:
                return None  # (a pixel tag of an unusual type, a signed SampleFormat: the full parse decides)
            width = struct.calcsize(int_fmt) * n
            start = at + 8 if width <= 4 else struct.unpack_from(bo + "I", view, at + 8)[0]
            if n > 1_000_000 or start + width > size:
                return None
            tags[tag] = list(struct.unpack_from(f"{bo}{n}{int_fmt}", view, start))
        (next_ifd,) = struct.unpack_from(bo + "I", view, ifd + 2 + 12 * count)
    except struct.error:
        return None
    if next_ifd != 0 or b"ImageJ=" in description:
        return None

    def one(tag: int, default: int | None = None) -> int | None:
        values = tags.get(tag)
        if values is None:
            return default
        return values[0] if len(values) == 1 else None

    if (one(254, 0), one(259), one(262), one(277, 1), one(284, 1)) != (0, 1, 1, 1, 1):
        return None
    if one(258) != want.itemsize * 8 or one(339, 1) != fmt:
        return None
    rows, cols = one(257), one(256)
    for shape in shapes:
        if geometry(layout, shape) == (1, rows, cols):
            break
    else:
        return None
    offsets, counts = tags.get(273), tags.get(279)
    if not offsets or counts is None or len(offsets) != len(counts):
        return None
    row_bytes = cols * want.itemsize
    per_strip = min(one(278, rows) or 0, rows) * row_bytes  # RowsPerStrip; default: all rows
    start = offsets[0]
    at = start
    for offset, n in zip(offsets, counts, strict=True):
        if offset != at or n != min(per_strip, start + rows * row_bytes - at):
            return None
        at += n
    if per_strip == 0 or at - start != rows * row_bytes or at > size:
        return None
    pixels = np.frombuffer(view, dtype=want.newbyteorder(bo), count=rows * cols, offset=start)
    pixels = pixels.reshape(1, rows, cols)
    arr = layout.from_file_order(pixels, shape) if layout is not None else pixels.reshape(shape)
    return arr.astype(want)  # copies: the result never aliases the caller's buffer


_OME_ORDER = re.compile(rb'DimensionOrder\s*=\s*"XY([ZCT]{3})"')


def _said_shape(tif: tifffile.TiffFile) -> list[int] | None:
    """The shape a tifffile shape description says the file holds, its axes of size 1
    left out (tifffile squeezes them); None without one."""
    said = (tif.shaped_metadata or [{}])[0].get("shape") if tif.is_shaped and tif.shaped_metadata else None
    return [int(s) for s in said if s != 1] if isinstance(said, list) else None


def _zarr_order_said(tif: tifffile.TiffFile, layout: TiffLayout | None, shapes: list[tuple[int, ...]],
                     geom: tuple[int, int, int]) -> tuple[int, ...] | None:
    """The chunk shape a written file holds in zarr's order, its last two axes as rows
    and columns, where the chunk file's are others (a y, x, c or x, y array) and the
    file says so: a tifffile shape description of that shape (`tifffile.imwrite(path,
    chunk)`); else None."""
    if layout is None or not layout.moves_image:
        return None
    written = _said_shape(tif)
    if written is None:
        return None
    for shape in shapes:
        if flatten(shape) == geom and written == [int(s) for s in shape if s != 1]:
            return shape
    return None


def _written_order(tif: tifffile.TiffFile, layout: TiffLayout | None, shape: Sequence[int]) -> tuple[int, ...] | None:
    """The chunk axes in the order a written file's pages run (slowest first), where
    the file itself says an order other than the chunk files' (ImageJ's: c fastest,
    then z, then t) and the two orders put the planes in different places; else None
    (the chunk files' order: ImageJ files, files that say nothing, or whose words fit
    both orders).

    Said by a tifffile shape description of the chunk's own shape (zarr's C order:
    `tifffile.imwrite(path, chunk)`), or OME-XML's DimensionOrder (its Z, C and T
    matched to the chunk's axes by their roles). Read in ImageJ's order, such files
    were stored with their planes scrambled, and the write succeeded."""
    if layout is None or tif.is_imagej:
        return None
    image = layout.image_axes
    pages = [i for i in range(len(shape)) if i not in image]
    lead = len(pages)
    imagej = layout.file_axes

    def moves_planes(order: Sequence[int]) -> bool:
        return [i for i in order[:lead] if shape[i] > 1] != [i for i in imagej[:lead] if shape[i] > 1]

    first = tif.pages.first
    if tif.is_shaped and layout.permuted and not (first.samplesperpixel > 1 and first.planarconfig != _SEPARATE):
        # (interleaved samples are the fastest planes read, as the chunk file's: an RGB
        # image written in zarr's order (y, x, 3) is read as its (3, y, x) already)
        written = _said_shape(tif)
        if written is None:
            return None
        own = [int(s) for s in shape if s != 1]
        if written == own and written != [int(shape[i]) for i in imagej if shape[i] != 1]:
            return tuple(range(len(shape)))  # zarr's order: its last two axes rows and columns
        return None
    if tif.is_ome and layout.roles is not None:
        found = _OME_ORDER.search(str(tif.ome_metadata or "").encode("ascii", "replace"))
        if found is None:
            return None
        axis_of = {role: i for i, role in enumerate(layout.roles) if role is not None}
        unnamed = [i for i in pages if layout.roles[i] is None]
        if len(axis_of) != len([r for r in layout.roles if r is not None]) or any(shape[i] > 1 for i in unnamed):
            return None  # (two axes of one role, or one without a role: the file cannot say)
        slowest_first = found.group(1).decode()[::-1].lower()
        samples = int(first.samplesperpixel)
        if samples > 1:
            # samples are planes, the fastest ([read-13]), whatever DimensionOrder puts
            # C (Bio-Formats' XYZCT RGB z-stack was stored scrambled); channels beyond
            # the samples run where DimensionOrder says: only where that is fastest too
            # are they one axis with the samples
            if "c" in axis_of and shape[axis_of["c"]] > samples and not slowest_first.endswith("c"):
                raise InvalidTiffError(
                    f"the image has {shape[axis_of['c']]} channels of {samples} samples per pixel, its "
                    f"DimensionOrder XY{found.group(1).decode()} puts channels among other planes: "
                    "save it with C first (XYC..) or one channel per plane")
            slowest_first = slowest_first.replace("c", "") + "c"
        order = (*[axis_of[r] for r in slowest_first if r in axis_of], *unnamed, *image)
        return order if moves_planes(order) else None
    return None


def _to_bool(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "b":
        return arr.astype(bool)
    if arr.size and int(arr.max()) > 1:
        raise InvalidTiffError(
            f"chunk dtype is bool: pixel values must be 0 or 1, found {int(arr.max())}"
        )
    return arr.astype(bool)


def _compression_name(value: object) -> str:
    name = getattr(value, "name", None)
    return f"{name} ({value:d})" if name else str(value)


def _planes(page: tifffile.TiffPage) -> int:
    """Y x X planes in a page: ImageDepth slices times samples per pixel. Samples are
    planes, the fastest, whether stored separate (tifffile writes a (3, Y, X) array so,
    as planar RGB, unless told photometric="minisblack") or interleaved (an RGB image
    is a chunk's 3 channels, as ImageJ's c runs fastest)."""
    return max(int(page.imagedepth), 1) * max(int(page.samplesperpixel), 1)


def _page_planes(page: tifffile.TiffPage, rows: int, cols: int) -> np.ndarray:
    """A page's pixels as (planes, rows, cols) in `_planes`' order (blocking: decodes)."""
    values = page.asarray(maxworkers=1)
    spp = int(page.samplesperpixel)
    if spp > 1 and page.planarconfig != _SEPARATE:  # (depth, rows, cols, samples)
        values = values.reshape(-1, rows, cols, spp).transpose(0, 3, 1, 2)
    return values.reshape(_planes(page), rows, cols)


def _imagej_int16(tif: tifffile.TiffFile, got: np.dtype | None, want: np.dtype) -> bool:
    """ImageJ stores a signed 16-bit image as uint16 + 32768 and declares the
    linear calibration value = raw - 32768 (cf=0, c0=-32768, c1=1) in its
    description. That is int16 data in ImageJ's encoding, not a different dtype."""
    if want.kind != "i" or want.itemsize != 2 or got is None or got.kind != "u":
        return False
    if got.itemsize != 2 or not tif.is_imagej:
        return False
    md = tif.imagej_metadata or {}
    return md.get("cf") == 0 and md.get("c0") == -32768 and md.get("c1") == 1


def _dtype_ok(got: np.dtype | None, want: np.dtype) -> bool:
    if got is None:
        return False
    if want.kind == "b":
        return got.kind == "b" or (got.kind == "u" and got.itemsize == 1)
    return got.kind == want.kind and got.itemsize == want.itemsize


def _decode_pages(
    tif: tifffile.TiffFile,
    view: memoryview,
    shapes: list[tuple[int, ...]],
    want: np.dtype,
    warnings: list[str],
    layout: TiffLayout | None = None,
) -> np.ndarray:
    try:
        pages = [p for p in tif.pages if not p.is_reduced]  # type: ignore[union-attr]
    except Exception as exc:
        raise _fail(f"cannot read the TIFF's IFDs: {exc}", warnings) from exc
    if not pages:
        raise _fail("TIFF has no image", warnings)

    first = pages[0]
    signed16 = _imagej_int16(tif, first.dtype, want)
    names = f"{len(pages)} page(s) of {first.imagelength}x{first.imagewidth}"
    for i, page in enumerate(pages):
        where = f"page {i}" if len(pages) > 1 else "the image"
        got = page.dtype
        if not _dtype_ok(got, want) and not signed16:
            got_name = (
                _dtype_name(got)
                if got is not None
                else f"an unsupported sample type ({page.bitspersample} bits, "
                f"sample format {page.sampleformat!s})"
            )
            raise _fail(
                f"wrong dtype: {where} has {got_name} pixels, the chunk is "
                f"{_dtype_name(want)}; save the TIFF as {_dtype_name(want)} (zfuse does not convert)",
                warnings,
            )
        if (page.imagelength, page.imagewidth) != (first.imagelength, first.imagewidth):
            raise _fail(
                f"pages differ in size: page 0 is {first.imagelength}x{first.imagewidth}, "
                f"{where} is {page.imagelength}x{page.imagewidth}",
                warnings,
            )
        if page.compression not in tifffile.TIFF.DECOMPRESSORS:
            raise _fail(
                f"unsupported compression {_compression_name(page.compression)} in {where}: "
                f"save with one of: {ACCEPTED_COMPRESSIONS}",
                warnings,
            )
        for offset, count in zip(page.dataoffsets, page.databytecounts, strict=False):
            if count and offset + count > len(view):
                raise _fail(
                    f"TIFF truncated: {where} needs bytes {offset}..{offset + count} "
                    f"but the file has {len(view)}",
                    warnings,
                )

    depth = _planes(first)
    n_planes = sum(_planes(p) for p in pages)
    geom = (n_planes, int(first.imagelength), int(first.imagewidth))
    planes_from_imagej = False
    if tif.is_imagej and len(pages) == 1 and depth == 1:
        # ImageJ writes a single IFD for stacks >4 GiB: images=N pages follow contiguously.
        images = int((tif.imagej_metadata or {}).get("images", 1) or 1)
        if images > 1:
            geom = (images, geom[1], geom[2])
            planes_from_imagej = True

    zarr_order = None
    for shape in shapes:
        if geometry(layout, shape) == geom:
            break
    else:
        zarr_order = _zarr_order_said(tif, layout, shapes, geom)
    if zarr_order is not None:
        shape = zarr_order
    elif geometry(layout, shape) != geom:
        expected = " or ".join(_describe(geometry(layout, s), s) for s in shapes)
        got_desc = f"{geom[0]} page(s) of {geom[1]}x{geom[2]}"
        if planes_from_imagej:
            got_desc += " (ImageJ images=)"
        elif depth > 1:
            got_desc = f"{geom[0]} plane(s) of {geom[1]}x{geom[2]} in {len(pages)} page(s)"
            spp = int(first.samplesperpixel)
            if first.planarconfig == _SEPARATE and spp > 1:
                got_desc += (f" of {spp} separate samples per pixel (planar: tifffile "
                             "writes a (3, Y, X) array so, as RGB, unless given photometric='minisblack')")
            elif spp > 1:
                got_desc += f" of {spp} samples per pixel (RGB or multi-channel: each sample a plane)"
            else:
                got_desc += f" of {depth} ImageDepth slices each"
        else:
            got_desc = names if geom[0] == len(pages) else got_desc
        raise _fail(f"wrong shape: TIFF has {got_desc}; expected {expected}", warnings)

    spp = int(first.samplesperpixel)
    file_shape = layout.file_shape(shape) if layout is not None and zarr_order is None else tuple(shape)
    if spp > 1 and first.planarconfig != _SEPARATE and not samples_fit(file_shape, spp):
        # (interleaved; separate samples are planes in the page's order, as tifffile
        # writes a (3, Y, X) array: a shape description may then say their place)
        raise _fail(f"the image has {spp} samples per pixel (RGB or multi-channel); the chunk's fastest "
                    f"planes are not {spp} of them (its file's shape: {file_shape})", warnings)

    # The geometry is the chunk's: now every strip and tile must decode to exactly its
    # part of it, checked with bounded work before tifffile decodes anything.
    if planes_from_imagej:
        if int(first.compression) != 1:
            raise _fail("an ImageJ stack in one IFD (images=) must be uncompressed", warnings)
    else:
        for i, page in enumerate(pages):
            check_segments(page, view, f"page {i}" if len(pages) > 1 else "the image")

    pages_dtype = np.dtype(first.dtype)
    out = np.empty(geom, dtype=pages_dtype.newbyteorder("="))
    where = "ImageJ stack" if planes_from_imagej else "page 0"
    try:
        if planes_from_imagej:
            series = tif.series[0]
            if int(np.prod(series.shape)) != out.size:
                raise ValueError(f"ImageJ series has shape {series.shape}")
            out[...] = series.asarray(maxworkers=1).reshape(geom)
        else:
            at = 0
            for i, page in enumerate(pages):
                planes = _planes(page)
                where = f"page {i}"
                out[at : at + planes] = _page_planes(page, geom[1], geom[2])
                at += planes
    except (InvalidTiffError, MemoryError):
        raise  # (the daemon's memory running out is no fault of the file's: ENOMEM, not EINVAL)
    except Exception as exc:
        raise _fail(
            f"cannot decode the pixels ({where}, compression {_compression_name(first.compression)}): {exc}",
            warnings,
        ) from exc
    order = tuple(range(len(shape))) if zarr_order is not None else _written_order(tif, layout, shape)
    if order is not None:  # (the file says its pages run otherwise than ImageJ's order)
        arr = out.reshape(tuple(shape[i] for i in order)).transpose(np.argsort(order))
    else:
        arr = layout.from_file_order(out, shape) if layout is not None else out.reshape(shape)
    if signed16:
        return (arr ^ np.uint16(0x8000)).view(np.int16).astype(want)  # raw - 32768
    if want.kind == "b":
        return _to_bool(arr)
    return arr.astype(want, copy=False)
