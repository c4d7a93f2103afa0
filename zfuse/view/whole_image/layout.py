"""Where everything is in a whole-image file, from metadata alone: its levels (one
array each) and their tiling, the planes, which levels may pass stored chunks
through, and the offsets of every IFD block and tile slot (`FileLayout`).

Layout (little endian; classic TIFF, BigTIFF when the file passes 4 GiB - 1):

    file header | IFD block of (plane 0, level 0) with the OME-XML |
    IFD blocks (plane 0, level 1..L-1) | (plane 1, level 0) | ... |
    4 MiB of zeros (page aligned) | tile slots of level 0 (planes, rows, columns) |
    tile slots of level 1 | ... | 64 KiB of zeros

- Rows and columns are the array's axes named y and x (else its last two), as in
  the chunk files (`ImageAxes`); planes are the other axes in C order; the OME
  `DimensionOrder` names them fastest first, so plane k is IFD k.
- Level 0 IFDs form the main chain; levels 1.. are SubIFDs of each plane's
  level-0 IFD (NewSubfileType 1): the OME-TIFF 6 / Bio-Formats pyramid layout.
- Every tile has a fixed-size *slot* at an offset known from metadata, so the
  file size and every tile offset are known without reading any chunk
  (`ls -l`, `stat`, open decode nothing). A tile's bytes start at its slot;
  the rest of the slot is zeros that no reader looks at.

No reading here: no store, no tiles, no FUSE.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zfuse.view.tiff_ifd import (
    CLASSIC_LIMIT,
    COMPRESSION_DEFLATE,
    COMPRESSION_NONE,
    even,
    ifd_format,
)

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView

log = logging.getLogger("zfuse.view.image")

_ALIGN = 16
# Zeros between the header and the first tile: readers of the header read on in
# big buffers (Bio-Formats maps 1 MiB from wherever it is in the header, and the
# kernel reads ahead of that) and must stop in them, not decode the first tiles.
# And zeros after the last tile: Bio-Formats reads the last 4 KiB when it opens
# the file.
_HEADER_GAP = 4 << 20
_TRAILER = 64 * 1024
# What a whole-image file can express: TIFF image widths and heights are LONGs, and a
# file's size must be an off_t (st_size).
MAX_EDGE = 2**32 - 1
MAX_FILE_SIZE = 2**63 - 1
COMPRESSION_NAMES = {COMPRESSION_NONE: "none", COMPRESSION_DEFLATE: "deflate"}


def tile_edge(chunk: int, extent: int) -> int:
    """Tile size along one image axis (a multiple of 16, as TIFF requires).

    A chunk edge that is a multiple of 16 is the tile edge (one tile = one chunk),
    shrunk to the image when the chunk is larger than the image. Otherwise a
    size at most the chunk's, so a tile overlaps at most two chunks per axis, but
    at least 256 so small chunks do not make millions of tiles.
    """
    fit = max(16, -(-extent // 16) * 16)
    if chunk % 16 == 0:
        return min(chunk, fit)
    edge = 256 if chunk < 256 else min(chunk, 1024) // 16 * 16
    return min(edge, fit)


def image_dims(shape: Sequence[int]) -> tuple[tuple[int, ...], int, int]:
    """(leading shape, rows, columns): the last two axes are Y and X."""
    if len(shape) == 0:
        return (), 1, 1
    if len(shape) == 1:
        return (), 1, int(shape[0])
    return tuple(int(n) for n in shape[:-2]), int(shape[-2]), int(shape[-1])


@dataclass(frozen=True)
class ImageAxes:
    """Where a whole image's axes are in its array. Everything in a whole-image file is
    planned in *image order* (`order`: the page axes in the array's order, then rows
    and columns, the axes the chunk files take for them: `tiff_meta.image_axes`); a
    chunk's coordinates and values are put in and out of that order here, where the
    chunks are met. The identity for arrays stored (..., y, x)."""

    order: tuple[int, ...]

    @classmethod
    def of(cls, arr: ArrayView) -> ImageAxes:
        ndim = len(arr.source.shape)
        layout = arr.layout
        image = layout.image_axes if layout is not None else tuple(range(max(ndim - 2, 0), ndim))
        return cls((*(i for i in range(ndim) if i not in image), *image))

    @property
    def identity(self) -> bool:
        return self.order == tuple(range(len(self.order)))

    def permute(self, values: Sequence[Any]) -> list[Any]:
        """Per-axis values (a shape, OME-Zarr axis names or scales) in image order."""
        return [values[i] for i in self.order]

    def dims(self, shape: Sequence[int]) -> tuple[tuple[int, ...], int, int]:
        """`image_dims` of an array-order shape: (page shape, rows, columns)."""
        return image_dims(self.permute(shape))

    def chunk_coords(self, lead: Sequence[int], y: int, x: int) -> tuple[int, ...]:
        """The array-order chunk coordinates of page-axes chunk `lead`, chunk row y and
        column x (y is dropped for a 1-d array, both for a 0-d one)."""
        ndim = len(self.order)
        placed = (*lead, y, x)[-ndim:] if ndim else ()
        out = [0] * ndim
        for axis, value in zip(self.order, placed, strict=True):
            out[axis] = value
        return tuple(out)

    def image_coords(self, coords: Sequence[int]) -> tuple[int, ...]:
        return tuple(coords[i] for i in self.order)

    def plane(self, chunk: np.ndarray, lead_in: tuple[int, ...]) -> np.ndarray:
        """The 2-d (rows, columns) plane at page index `lead_in` of an array-order chunk."""
        if chunk.ndim == 0:
            return chunk.reshape(1, 1)
        image = chunk if self.identity else chunk.transpose(self.order)
        plane = image[lead_in] if lead_in else image
        return plane.reshape(-1, image.shape[-1])

    def ome(self, ome: dict[str, Any] | None) -> dict[str, Any] | None:
        """OME-Zarr per-axis lists (axes, types, scales, units) in image order; lists of
        another length are left as they are (their users check it)."""
        if ome is None or self.identity:
            return ome
        return {k: self.permute(v) if isinstance(v, (list, tuple)) and len(v) == len(self.order) else v
                for k, v in ome.items()}


def compress_bound(compression: int, n: int) -> int:
    """Largest stream the compressor's own encoder makes of n bytes."""
    if compression == COMPRESSION_DEFLATE:
        return n + (n >> 12) + (n >> 14) + (n >> 25) + 13  # zlib compressBound
    return n


def passthrough_compression(codecs: list[dict[str, Any]] | None, dtype: np.dtype) -> tuple[int, int] | None:
    """(TIFF compression, checksum bytes after the stream) when a TIFF decoder reads
    the stored chunk stream as is; None otherwise.

    The rule: the codecs are `bytes` (little endian, or single-byte values),
    then at most one zlib (TIFF Adobe Deflate, 8), then only crc32c checksums
    (verified and stripped here). Anything else (zstd, blosc, gzip, transpose,
    filters, big endian) is served decoded. zstd would map onto TIFF ZSTD
    (50000), which libtiff, GDAL, tifffile and Bio-Formats read, but the libtiff
    in common libvips builds has no zstd and reads such tiles as zeros, silently.
    """
    if not codecs:
        return None
    first, rest = codecs[0], codecs[1:]
    if first.get("name") != "bytes":
        return None
    endian = (first.get("configuration") or {}).get("endian", "little")
    if endian != "little" and dtype.itemsize > 1 and dtype.kind != "b":
        return None
    compression = COMPRESSION_NONE
    if rest and rest[0].get("name") in ("zlib", "numcodecs.zlib"):
        compression, rest = COMPRESSION_DEFLATE, rest[1:]
    if any(c.get("name") != "crc32c" for c in rest):
        return None
    return compression, 4 * len(rest)


@dataclass
class Level:
    """One resolution level: an array view and its tiling."""

    array: ArrayView
    axes: ImageAxes
    lead: tuple[int, ...]  # leading shape (planes), image order
    height: int
    width: int
    chunk_lead: tuple[int, ...]
    chunk_h: int
    chunk_w: int
    tile_h: int
    tile_w: int
    tiles_down: int
    tiles_across: int
    tile_bytes: int
    slot: int
    passthrough: tuple[int, int] | None  # planned (compression, checksum bytes)
    data_start: int = 0  # absolute offset of the level's first slot

    @property
    def tiles(self) -> int:
        """Tiles per plane."""
        return self.tiles_down * self.tiles_across

    @property
    def chunk_per_tile(self) -> bool:
        """Whether each tile is one whole chunk of one plane."""
        return (self.tile_h, self.tile_w) == (self.chunk_h, self.chunk_w) and all(n == 1 for n in self.chunk_lead)

    def tile_chunk(self, plane: int, tile: int) -> tuple[int, ...]:
        """The chunk at a tile's position, when one tile is one chunk of one plane."""
        ty, tx = divmod(tile, self.tiles_across)
        return self.axes.chunk_coords(unravel(plane, self.lead), ty, tx)

    def tile_index(self, coords: Sequence[int]) -> int | None:
        """Index (plane * tiles + tile) of the tile that is exactly chunk `coords`."""
        coords = self.axes.image_coords(coords)
        lead = tuple(coords[:-2])
        ty, tx = coords[-2], coords[-1]
        if ty >= self.tiles_down or tx >= self.tiles_across:
            return None
        plane = ravel(lead, self.lead) if lead else 0
        return plane * self.tiles + ty * self.tiles_across + tx

    def tile_indexes(self, coords: np.ndarray) -> np.ndarray:
        """`tile_index` of each row of chunk coordinates (n, ndim), -1 where none: numpy,
        no Python object per chunk (a level may have millions stored)."""
        chunks = np.asarray(coords, dtype=np.int64).reshape(len(coords), len(self.axes.order))
        if math.prod(self.lead) * self.tiles >= 2**62:  # (past int64: Python integers, one by one)
            found = (self.tile_index(tuple(int(v) for v in row)) for row in chunks)
            return np.array([-1 if i is None else i for i in found], dtype=np.int64)
        coords = chunks[:, list(self.axes.order)]
        if coords.shape[1] < 2:  # (0-d and 1-d arrays: one row of tiles)
            coords = np.concatenate([np.zeros((len(coords), 2 - coords.shape[1]), np.int64), coords], axis=1)
        ty, tx = coords[:, -2], coords[:, -1]
        plane = np.zeros(len(coords), dtype=np.int64)
        for i, n in enumerate(self.lead):
            plane = plane * n + coords[:, i]
        out = plane * self.tiles + ty * self.tiles_across + tx
        out[(ty >= self.tiles_down) | (tx >= self.tiles_across)] = -1
        return out

    def chunk_file(self, coords: tuple[int, ...]) -> str | None:
        """The local file of a stored chunk, when the store is a directory of whole chunks."""
        return self.array.source.stored_chunk_path(coords)


def plan_level(arr: ArrayView) -> Level:
    src = arr.source
    axes = ImageAxes.of(arr)
    lead, height, width = axes.dims(src.shape)
    clead, ch, cw = axes.dims(src.chunk_shape)
    th, tw = tile_edge(ch, height), tile_edge(cw, width)
    dtype = np.dtype(src.dtype)
    tile_bytes = th * tw * dtype.itemsize
    passthrough = None
    # passthrough needs one tile = one whole stored chunk holding one plane, its rows
    # before its columns (then the page axes' place in the stored order does not matter)
    rows_first = len(src.shape) >= 2 and axes.order[-2] < axes.order[-1]
    if (th, tw) == (ch, cw) and all(n == 1 for n in clead) and rows_first:
        passthrough = passthrough_compression(src.stored_codecs(), dtype)
    slot = tile_bytes
    if passthrough is not None and passthrough[0] != COMPRESSION_NONE:
        slot = -(-compress_bound(passthrough[0], tile_bytes) // _ALIGN) * _ALIGN
    return Level(
        array=arr, axes=axes, lead=lead, height=height, width=width, chunk_lead=clead, chunk_h=ch, chunk_w=cw,
        tile_h=th, tile_w=tw, tiles_down=-(-height // th), tiles_across=-(-width // tw),
        tile_bytes=tile_bytes, slot=slot, passthrough=passthrough,
    )  # fmt: skip


def pyramid_levels(levels: Sequence[ArrayView], label: str) -> tuple[list[ArrayView], str | None]:
    """The arrays that can be SubIFD levels under the first: same dtype and planes,
    each no larger than the one before. Stops at the first that cannot, and says why
    (None: every level is taken)."""
    if not levels:
        return [], None
    out = [levels[0]]
    base = levels[0].source
    axes = ImageAxes.of(levels[0])
    lead0, h, w = axes.dims(base.shape)
    for arr in levels[1:]:
        src = arr.source
        lead, hh, ww = axes.dims(src.shape) if ImageAxes.of(arr) == axes else ((-1,), 0, 0)
        if np.dtype(src.dtype) != np.dtype(base.dtype) or lead != lead0 or hh > h or ww > w:
            why = (f"{len(out)} of {len(levels)} levels: the pyramid stops before {src.name} (shape "
                   f"{tuple(src.shape)}, dtype {src.dtype}, {lead} planes; level 0 has {lead0} planes of "
                   f"{base.dtype}): OME-TIFF SubIFD levels need the same planes and dtype, each level no "
                   "larger (a multiscale downsampled along z, as ngff-zarr's are by default, has fewer planes "
                   "per level)")
            log.info("%s: %s", label, why)
            return out, why
        out.append(arr)
        h, w = hh, ww
    return out, None


def ravel(index: Sequence[int], shape: Sequence[int]) -> int:
    """`np.ravel_multi_index` in Python integers: numpy refuses shapes past 2**63 elements."""
    flat = 0
    for i, n in zip(index, shape, strict=True):
        flat = flat * n + int(i)
    return flat


def unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    """`np.unravel_index` in Python integers (see `_ravel`)."""
    out = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        out.append(i)
    return tuple(reversed(out))



class FileLayout:
    """The offsets of one whole-image file: every IFD block and tile slot, and the size.

    Classic TIFF unless the file passes 4 GiB - 1. Raises ValueError for an image no
    TIFF can express (wider or higher than a LONG, or a file past 2**63 - 1 bytes).
    """

    def __init__(self, levels: list[Level], description: bytes, *, successive: bool = False, samples: int = 1,
                 resolutions: Sequence[tuple[int, int, int, int] | None] | None = None) -> None:
        """`description`: the ImageDescription of the first IFD (NUL included; empty: none).

        `successive`: the levels as successive top-level IFDs (NewSubfileType 1 after the
        first), as OpenSlide's generic tiled TIFF reader wants them, instead of SubIFDs;
        `samples`: 3 for RGB interleaved (the leading axes are then the 3 samples of one
        plane); `resolutions`: per level, X/YResolution in pixels per centimetre (num,
        den, num, den) or None."""
        self.levels = levels
        self.successive = successive
        self.samples = samples
        self.resolutions = list(resolutions) if resolutions is not None else [None] * len(levels)
        self.planes = math.prod(levels[0].lead) // samples
        self.description = description
        self.bigtiff = False
        for lv in levels:
            if max(lv.height, lv.width) > MAX_EDGE:
                raise ValueError(f"{lv.array.source.name or 'the array'} is {lv.height} x {lv.width} "
                                 f"pixels: a TIFF image is at most {MAX_EDGE} pixels high and wide")
        self._plan_offsets()
        if self.size > CLASSIC_LIMIT:
            self.bigtiff = True
            self._plan_offsets()
        if self.size > MAX_FILE_SIZE:
            raise ValueError(f"it would be {self.size} bytes, past the largest file size "
                             f"({MAX_FILE_SIZE} bytes, 2**63 - 1)")

    def entries(self, level: int, first: bool) -> list[int]:
        """The tags of one IFD, in order."""
        tags = [254, 256, 257, 258, 259, 262]
        if first and self.description:
            tags.append(270)
        tags.append(277)
        if self.resolutions[level] is not None:
            tags += [282, 283]
        tags.append(284)
        if self.resolutions[level] is not None:
            tags.append(296)
        tags += [322, 323, 324, 325]
        if level == 0 and len(self.levels) > 1 and not self.successive:
            tags.append(330)
        tags.append(339)
        return tags

    def _block_size(self, level: int, first: bool) -> int:
        """Bytes of one IFD with its out-of-line values."""
        fmt = ifd_format(self.bigtiff)
        off, inline = fmt.offset_size, fmt.inline
        size = fmt.ifd_size(len(self.entries(level, first)))
        arrays = [self.levels[level].tiles, self.levels[level].tiles]
        if level == 0 and len(self.levels) > 1 and not self.successive:
            arrays.append(len(self.levels) - 1)
        for count in arrays:
            if count * off > inline:
                size += count * off
        if 2 * self.samples > inline:  # BitsPerSample, SampleFormat: a SHORT per sample
            size += 2 * even(2 * self.samples)
        if self.resolutions[level] is not None and 8 > inline:  # two RATIONALs
            size += 2 * 8
        if first and self.description:
            size += even(len(self.description))
        return even(size, 8 if self.bigtiff else 2)

    def _plan_offsets(self) -> None:
        head = ifd_format(self.bigtiff).head_size
        self.blocks = [self._block_size(k, False) for k in range(len(self.levels))]
        self.first_extra = self._block_size(0, True) - self.blocks[0]
        per_plane = sum(self.blocks)
        self.header_size = head + self.first_extra + self.planes * per_plane
        at = -(-(self.header_size + _HEADER_GAP) // 4096) * 4096
        self.data_start = at
        for lv in self.levels:
            lv.data_start = at
            at += self.planes * lv.tiles * lv.slot
        self.size = at + _TRAILER

    def ifd_at(self, plane: int, level: int) -> int:
        head = ifd_format(self.bigtiff).head_size
        at = head + plane * sum(self.blocks) + sum(self.blocks[:level])
        return at if plane == 0 and level == 0 else at + self.first_extra

    def slot_offset(self, level: int, plane: int, tile: int) -> int:
        lv = self.levels[level]
        return lv.data_start + (plane * lv.tiles + tile) * lv.slot

    @property
    def tiles(self) -> int:
        return sum(self.planes * lv.tiles for lv in self.levels)

    def locate(self, offset: int) -> tuple[int, int, int, int] | None:
        """(level, plane, tile, offset in slot) of a byte in the data region."""
        for k in range(len(self.levels) - 1, -1, -1):
            lv = self.levels[k]
            if offset >= lv.data_start:
                index, within = divmod(offset - lv.data_start, lv.slot)
                plane, tile = divmod(index, lv.tiles)
                if plane >= self.planes:
                    return None
                return k, plane, tile, within
        return None

    def tiles_in(self, offset: int, size: int) -> list[tuple[int, int, int]]:
        """(level, plane, tile) of the slots that bytes [offset, offset+size) touch."""
        out = []
        pos, end = max(offset, self.data_start), min(offset + size, self.size)
        while pos < end:
            found = self.locate(pos)
            if found is None:
                break
            level, plane, tile, within = found
            out.append((level, plane, tile))
            pos += self.levels[level].slot - within
        return out
