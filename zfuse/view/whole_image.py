"""The whole image as one file: an array (or an OME-Zarr pyramid) as a virtual tiled OME-TIFF.

No FUSE and no store listing here: a `WholeImage` is planned from metadata
alone, and its bytes are produced on demand from the array views' chunks.

Layout (little endian; classic TIFF, BigTIFF when the file passes 4 GiB - 1):

    file header | IFD block of (plane 0, level 0) with the OME-XML |
    IFD blocks (plane 0, level 1..L-1) | (plane 1, level 0) | ... |
    4 MiB of zeros (page aligned) | tile slots of level 0 (planes, rows, columns) |
    tile slots of level 1 | ... | 64 KiB of zeros

- Planes are the leading axes (all but the last two) in C order; the OME
  `DimensionOrder` names them fastest first, so plane k is IFD k.
- Level 0 IFDs form the main chain; levels 1.. are SubIFDs of each plane's
  level-0 IFD (NewSubfileType 1): the OME-TIFF 6 / Bio-Formats pyramid layout.
- Every tile has a fixed-size *slot* at an offset known from metadata, so the
  file size and every tile offset are known without reading any chunk
  (`ls -l`, `stat`, open decode nothing). A tile's bytes start at its slot;
  the rest of the slot is zeros that no reader looks at.
- Decoded tiles (the default): uncompressed, byte count = tile bytes. The
  header holds no data-dependent number, so it is built from metadata alone.
- Passthrough tiles (`passthrough_compression`): the stored chunk stream as
  is, when a TIFF compression reads it. The slot is the codec's worst-case
  size; the header's byte counts come from the stored sizes (a local store's
  file sizes or a shard index), looked up when the header is first read
  (uncompressed chunks in local files: the tile size, nothing looked up).
  A local chunk file is read by range, straight from the file.
- Reading a tile that is one local chunk file asks the OS to read ahead the
  files of the tiles right, below and below right (a region reader's next).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import quoteattr

import numpy as np

from zfuse.errors import CorruptDataError, OutsideStoreError, ZfuseError
from zfuse.stats import Stats
from zfuse.view.array_view import advise_willneed
from zfuse.view.tiff import tiff_unsupported_reason
from zfuse.view.tiff_ifd import (
    ASCII,
    CLASSIC_LIMIT,
    COMPRESSION_DEFLATE,
    COMPRESSION_NONE,
    LONG,
    SHORT,
    even,
    ifd_format,
    pack_ifd,
    place_values,
    sample_format,
)
from zfuse.view.tiff_meta import ome_axes  # the chunk files' reading of OME-Zarr axes

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView

log = logging.getLogger("zfuse.view.image")

IMAGE_NAME = "image.ome.tif"  # in every array directory
PYRAMID_NAME = "pyramid.ome.tif"  # in every OME-Zarr multiscale group directory
NAMES = (IMAGE_NAME, PYRAMID_NAME)

_ALIGN = 16
# Zeros between the header and the first tile: readers of the header read on in
# big buffers (Bio-Formats maps 1 MiB from wherever it is in the header, and the
# kernel reads ahead of that) and must stop in them, not decode the first tiles.
# And zeros after the last tile: Bio-Formats reads the last 4 KiB when it opens
# the file.
_HEADER_GAP = 4 << 20
_TRAILER = 64 * 1024
_TILE_CACHE_BYTES = 64 * 1024**2
# A header up to this size is built once and kept; a bigger one (an image of millions
# of tiles: 16 bytes of offset and count per tile) is rendered per read, only the
# bytes read, so the daemon's memory never follows the number of tiles.
_HEADER_KEPT = 4 * 1024**2
# What a whole-image file can express: TIFF image widths and heights are LONGs, and a
# file's size must be an off_t (st_size).
_MAX_EDGE = 2**32 - 1
MAX_FILE_SIZE = 2**63 - 1
# Chunk files of tiles up to this size are read ahead (three neighbours): bigger
# tiles would make the disk read more than a small region needs.
_READ_AHEAD_MAX_TILE = 8 * 1024**2
# Tiles stored ahead in the kernel's page cache (see `pushes_after`): at least a
# few pages (smaller tiles are many requests' worth of bookkeeping for little), at
# most the read-ahead's limit.
_PAGE = 4096
_PUSH_MIN_TILE = 4 * _PAGE
_PUSH_MAX_TILE = _READ_AHEAD_MAX_TILE
_TILES_REMEMBERED = 1 << 16  # tiles asked for or pushed, per file (then forgotten)
_PUSH_RING = 2  # tiles around a read in an area already read, pushed ahead
_PUSH_RING_BYTES = 16 * 1024**2  # at most this much of the ring per read (big tiles: the nearest)
_PUSH_RECENT = 8  # the reader's last reads of new tiles: whether it works in an area

_COMPRESSION_NAMES = {COMPRESSION_NONE: "none", COMPRESSION_DEFLATE: "deflate"}

# OME pixel types; int64/uint64/float16 have none (the file then has no OME-XML)
_OME_TYPES = {
    "b1": "uint8", "u1": "uint8", "i1": "int8", "u2": "uint16", "i2": "int16",
    "u4": "uint32", "i4": "int32", "f4": "float", "f8": "double",
    "c8": "complex", "c16": "double-complex",
}  # fmt: skip

# OME-Zarr (UDUNITS) unit names -> OME unit symbols
_OME_UNITS = {
    "angstrom": "\u00c5", "nanometer": "nm", "micrometer": "\u00b5m", "micron": "\u00b5m",
    "millimeter": "mm", "centimeter": "cm", "meter": "m", "kilometer": "km",
    "picometer": "pm", "inch": "in", "foot": "ft",
    "second": "s", "millisecond": "ms", "microsecond": "\u00b5s", "nanosecond": "ns",
    "minute": "min", "hour": "h",
}  # fmt: skip


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


def _image_dims(shape: Sequence[int]) -> tuple[tuple[int, ...], int, int]:
    """(leading shape, rows, columns): the last two axes are Y and X."""
    if len(shape) == 0:
        return (), 1, 1
    if len(shape) == 1:
        return (), 1, int(shape[0])
    return tuple(int(n) for n in shape[:-2]), int(shape[-2]), int(shape[-1])


def _compress_bound(compression: int, n: int) -> int:
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


def _encode(compression: int, data: bytes) -> bytes:
    if compression == COMPRESSION_DEFLATE:
        return zlib.compress(data, 6)
    return data


@dataclass
class _Level:
    """One resolution level: an array view and its tiling."""

    array: ArrayView
    lead: tuple[int, ...]  # leading shape (planes)
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


def _plan_level(arr: ArrayView) -> _Level:
    src = arr.source
    lead, height, width = _image_dims(src.shape)
    clead, ch, cw = _image_dims(src.chunk_shape)
    th, tw = tile_edge(ch, height), tile_edge(cw, width)
    dtype = np.dtype(src.dtype)
    tile_bytes = th * tw * dtype.itemsize
    passthrough = None
    # passthrough needs one tile = one whole stored chunk holding one plane
    if (th, tw) == (ch, cw) and all(n == 1 for n in clead) and len(src.shape) >= 2:
        stored_codecs = getattr(src, "stored_codecs", None)
        passthrough = passthrough_compression(stored_codecs() if stored_codecs else None, dtype)
    slot = tile_bytes
    if passthrough is not None and passthrough[0] != COMPRESSION_NONE:
        slot = -(-_compress_bound(passthrough[0], tile_bytes) // _ALIGN) * _ALIGN
    return _Level(
        array=arr, lead=lead, height=height, width=width, chunk_lead=clead, chunk_h=ch, chunk_w=cw,
        tile_h=th, tile_w=tw, tiles_down=-(-height // th), tiles_across=-(-width // tw),
        tile_bytes=tile_bytes, slot=slot, passthrough=passthrough,
    )  # fmt: skip


# -- OME-XML -----------------------------------------------------------------


def _role(name: str | None, kind: str | None) -> str | None:
    if kind:
        role = {"channel": "C", "time": "T", "space": "Z"}.get(str(kind).lower())
        if role:
            return role
    if name:
        return {"c": "C", "ch": "C", "channel": "C", "t": "T", "time": "T", "z": "Z"}.get(
            str(name).lower()
        )
    return None


@dataclass(frozen=True)
class PlaneAxes:
    """How the leading axes map onto OME's Z, C and T."""

    order: str  # DimensionOrder, e.g. "XYZCT"
    sizes: dict[str, int]  # Z, C, T
    axis_of: dict[str, int | None]  # role -> leading axis index when one axis carries it


def plane_axes(
    lead: Sequence[int], axes: Sequence[str | None] | None, types: Sequence[str | None] | None
) -> PlaneAxes:
    """OME Z/C/T for leading axes of shape `lead`, planes in C order.

    Axes of size 1 do not change the plane order and take no role. Named axes
    (OME-Zarr type, or names z/c/t) keep their role; the others take the free
    roles fastest first in the order Z, C, T. More than three axes of size > 1:
    the slowest are merged into one role (their planes stay in C order).
    """
    names = list(axes or [None] * len(lead))[: len(lead)]
    kinds = list(types or [None] * len(lead))[: len(lead)]
    big = [i for i, n in enumerate(lead) if n > 1]
    groups: list[list[int]] = [[i] for i in big]
    while len(groups) > 3:
        groups[0:2] = [groups[0] + groups[1]]
    wanted = [_role(names[g[0]], kinds[g[0]]) if len(g) == 1 else None for g in groups]
    roles: list[str | None] = [None] * len(groups)
    used: set[str] = set()
    for k, r in enumerate(wanted):
        if r is not None and r not in used:
            roles[k] = r
            used.add(r)
    for k in range(len(groups) - 1, -1, -1):  # fastest first
        if roles[k] is None:
            roles[k] = next(r for r in "ZCT" if r not in used)
            used.add(roles[k])  # type: ignore[arg-type]
    sizes = {"Z": 1, "C": 1, "T": 1}
    axis_of: dict[str, int | None] = {"Z": None, "C": None, "T": None}
    for g, r in zip(groups, roles, strict=True):
        assert r is not None
        sizes[r] = math.prod(lead[i] for i in g)
        axis_of[r] = g[0] if len(g) == 1 else None
    # size-1 axes named z/c/t still say which axis calibrates a role
    for i, n in enumerate(lead):
        r = _role(names[i], kinds[i])
        if n == 1 and r is not None and axis_of[r] is None and sizes[r] == 1:
            axis_of[r] = i
    fast_first = [r for r in reversed(roles) if r is not None]
    order = "XY" + "".join(fast_first) + "".join(r for r in "ZCT" if r not in fast_first)
    return PlaneAxes(order=order, sizes=sizes, axis_of=axis_of)


def ome_pixel_type(dtype: np.dtype) -> str | None:
    dt = np.dtype(dtype)
    return _OME_TYPES.get(f"{dt.kind}{dt.itemsize}")


def ome_xml(
    name: str,
    shape: Sequence[int],
    dtype: np.dtype,
    ome: dict[str, Any] | None,
    channels: list[dict[str, Any]] | None,
) -> str | None:
    """OME-XML for an image of `shape` (the whole array, level 0); None when the dtype
    has no OME pixel type."""
    pixel_type = ome_pixel_type(dtype)
    if pixel_type is None:
        return None
    ome = ome or {}
    lead, height, width = _image_dims(shape)
    nd = len(shape)
    axes, types = ome.get("axes"), ome.get("axis_types")
    planes = plane_axes(lead, axes, types)
    scales, units = ome.get("scales"), ome.get("units")
    attrs = [
        ("ID", "Pixels:0"), ("DimensionOrder", planes.order), ("Type", pixel_type),
        ("SizeX", width), ("SizeY", height), ("SizeZ", planes.sizes["Z"]),
        ("SizeC", planes.sizes["C"]), ("SizeT", planes.sizes["T"]),
        ("BigEndian", "false"), ("Interleaved", "false"),
        ("SignificantBits", 8 * np.dtype(dtype).itemsize if pixel_type != "bit" else 1),
    ]  # fmt: skip

    def physical(axis: int | None, key: str, unit_key: str, time_axis: bool = False) -> None:
        if axis is None or scales is None or axis < 0 or axis >= len(scales):
            return
        value = float(scales[axis])
        if not math.isfinite(value) or value <= 0:
            return
        attrs.append((key, repr(value)))
        unit = (units or [None] * nd)[axis] if units else None
        symbol = _OME_UNITS.get(str(unit).lower()) if unit else None
        if symbol and (time_axis == (symbol in ("s", "ms", "\u00b5s", "ns", "min", "h"))):
            attrs.append((unit_key, symbol))

    if nd >= 1:
        physical(nd - 1, "PhysicalSizeX", "PhysicalSizeXUnit")
    if nd >= 2:
        physical(nd - 2, "PhysicalSizeY", "PhysicalSizeYUnit")
    physical(planes.axis_of["Z"], "PhysicalSizeZ", "PhysicalSizeZUnit")
    physical(planes.axis_of["T"], "TimeIncrement", "TimeIncrementUnit", time_axis=True)

    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:schemaLocation="http://www.openmicroscopy.org/Schemas/OME/2016-06 '
        'http://www.openmicroscopy.org/Schemas/OME/2016-06/ome.xsd" Creator="zfuse">',
        f"<Image ID=\"Image:0\" Name={quoteattr(name)}>",
        "<Pixels " + " ".join(f"{k}={quoteattr(str(v))}" for k, v in attrs) + ">",
    ]
    size_c = planes.sizes["C"]
    named = channels if channels and len(channels) == size_c else None
    for c in range(size_c):
        extra = ""
        if named is not None and isinstance(named[c], dict):
            label = named[c].get("label")
            if label:
                extra += f" Name={quoteattr(str(label))}"
            color = _ome_color(named[c].get("color"))
            if color is not None:
                extra += f' Color="{color}"'
        lines.append(f'<Channel ID="Channel:0:{c}" SamplesPerPixel="1"{extra}/>')
    total = planes.sizes["Z"] * size_c * planes.sizes["T"]
    lines.append(f'<TiffData IFD="0" PlaneCount="{total}"/>')
    lines += ["</Pixels>", "</Image>", "</OME>"]
    return "\n".join(lines) + "\n"


def _ome_color(value: Any) -> int | None:
    """omero's "RRGGBB" as OME's signed 32-bit RGBA."""
    if not isinstance(value, str) or len(value) != 6:
        return None
    try:
        rgba = int(value + "FF", 16)
    except ValueError:
        return None
    return rgba - 2**32 if rgba >= 2**31 else rgba


# -- the file ------------------------------------------------------------------


class StaleImageError(CorruptDataError):
    """The store changed under an open whole-image file (EIO; reopen it)."""


class WholeImage:
    """A virtual tiled (Big)TIFF of one array, or of a pyramid of arrays (SubIFDs).

    `size` and the tile slots come from metadata alone. `read_cached` answers
    from memory only; `read` may decode (call it from a worker thread).
    """

    def __init__(
        self,
        name: str,
        levels: Sequence[ArrayView],
        ome: dict[str, Any] | None = None,
        channels: list[dict[str, Any]] | None = None,
        stats: Stats | None = None,
        label: str = "",
        title: str = "",
    ) -> None:
        """`label`: the directory's path, for log lines; `title`: the OME Image Name (the
        multiscale's name, else the directory's)."""
        if not levels:
            raise ValueError("a whole-image file needs at least one array")
        self.name = name
        self.label = label or name
        self._serial = next(_SERIALS)  # never reused, unlike id()
        self.stats = stats or levels[0].stats or Stats()
        first = levels[0].source
        self.dtype = np.dtype(first.dtype)
        reason = tiff_unsupported_reason(self.dtype)
        if reason is not None:
            raise ValueError(reason)
        self.levels = [_plan_level(a) for a in levels]
        self.shape = tuple(first.shape)
        self.planes = math.prod(self.levels[0].lead)
        xml = ome_xml(title or label or name, self.shape, self.dtype, ome, channels)
        # no OME pixel type: tifffile's "shaped" description keeps the array's shape
        text = xml if xml is not None else json.dumps({"shape": list(self.shape)})
        self.description = text.encode("utf-8") + b"\0"
        self.is_ome = xml is not None
        self.bigtiff = False
        for lv in self.levels:
            if max(lv.height, lv.width) > _MAX_EDGE:
                raise ValueError(f"{lv.array.source.name or 'the array'} is {lv.height} x {lv.width} "
                                 f"pixels: a TIFF image is at most {_MAX_EDGE} pixels high and wide")
        self._plan_offsets()
        if self.size > CLASSIC_LIMIT:
            self.bigtiff = True
            self._plan_offsets()
        if self.size > MAX_FILE_SIZE:
            raise ValueError(f"it would be {self.size} bytes, past the largest file size "
                             f"({MAX_FILE_SIZE} bytes, 2**63 - 1)")
        self._header: bytes | None = None
        self._header_lock = threading.Lock()
        self._counts: list[_Counts] | None = None  # byte counts per level (planes * tiles)
        self._modes: list[int | None] | None = None  # compression per level after the header
        self._changes: tuple[int, ...] = ()
        self._failed: str | None = None  # why this file is stale (reopen)
        self._tiles: OrderedDict[tuple[int, int, int], bytes] = OrderedDict()
        self._tiles_used = 0
        self._tiles_lock = threading.Lock()
        self._fills: dict[tuple[int, int], bytes] = {}
        self._inflight: dict[tuple[int, int, int], threading.Lock] = {}
        self._advised: set[tuple[int, int, int]] = set()  # tiles whose chunk file was read ahead
        # region readers (pushes_after): tiles the kernel asked for, and tiles pushed
        self._asked: set[tuple[int, int, int]] = set()
        self._pushed: set[tuple[int, int, int]] = set()
        self._region_reader = False
        self._recent: deque[tuple[int, int, int, int]] = deque(maxlen=_PUSH_RECENT)  # (level, plane, row, column)
        self._push_marks: tuple[int, ...] = self._change_marks()

    # -- layout -------------------------------------------------------------------
    def _entries(self, level: int, first: bool) -> list[int]:
        """The tags of one IFD, in order."""
        tags = [254, 256, 257, 258, 259, 262]
        if first:
            tags.append(270)
        tags += [277, 284, 322, 323, 324, 325]
        if level == 0 and len(self.levels) > 1:
            tags.append(330)
        tags.append(339)
        return tags

    def _block_size(self, level: int, first: bool) -> int:
        """Bytes of one IFD with its out-of-line values."""
        fmt = ifd_format(self.bigtiff)
        off, inline = fmt.offset_size, fmt.inline
        size = fmt.ifd_size(len(self._entries(level, first)))
        arrays = [self.levels[level].tiles, self.levels[level].tiles]
        if level == 0 and len(self.levels) > 1:
            arrays.append(len(self.levels) - 1)
        for count in arrays:
            if count * off > inline:
                size += count * off
        if first:
            size += even(len(self.description))
        return even(size, 8 if self.bigtiff else 2)

    def _plan_offsets(self) -> None:
        head = ifd_format(self.bigtiff).head_size
        self._blocks = [self._block_size(k, False) for k in range(len(self.levels))]
        self._first_extra = self._block_size(0, True) - self._blocks[0]
        per_plane = sum(self._blocks)
        self.header_size = head + self._first_extra + self.planes * per_plane
        at = -(-(self.header_size + _HEADER_GAP) // 4096) * 4096
        self.data_start = at
        for lv in self.levels:
            lv.data_start = at
            at += self.planes * lv.tiles * lv.slot
        self.size = at + _TRAILER

    def _ifd_at(self, plane: int, level: int) -> int:
        head = ifd_format(self.bigtiff).head_size
        at = head + plane * sum(self._blocks) + sum(self._blocks[:level])
        return at if plane == 0 and level == 0 else at + self._first_extra

    def slot_offset(self, level: int, plane: int, tile: int) -> int:
        lv = self.levels[level]
        return lv.data_start + (plane * lv.tiles + tile) * lv.slot

    # -- description for `zfuse info` -------------------------------------------------
    @property
    def tiles(self) -> int:
        return sum(self.planes * lv.tiles for lv in self.levels)

    def modes(self) -> list[str]:
        """Per level: "decoded" or "passthrough (<compression>)" (as planned, or as built)."""
        out = []
        for k, lv in enumerate(self.levels):
            mode = lv.passthrough[0] if lv.passthrough is not None else None
            if self._modes is not None:
                mode = self._modes[k]
            out.append("decoded" if mode is None else f"passthrough ({_COMPRESSION_NAMES[mode]})")
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "bigtiff": self.bigtiff,
            "levels": len(self.levels),
            "planes": self.planes,
            "tiles": self.tiles,
            "tile_shape": [[lv.tile_h, lv.tile_w] for lv in self.levels],
            "level_shapes": [list(lv.array.source.shape) for lv in self.levels],
            "mode": self.modes(),
            "ome": self.is_ome,
        }

    # -- staleness ---------------------------------------------------------------------
    @property
    def version(self) -> tuple[int, tuple[int, ...]]:
        """Changes when the bytes may have: another file object, or a chunk of its
        arrays written through the view (the adapter keeps the kernel's page cache
        of the file across opens only while this is unchanged)."""
        return self._serial, self._change_marks()

    def _change_marks(self) -> tuple[int, ...]:
        return tuple(getattr(lv.array, "changes", 0) for lv in self.levels)

    @property
    def stale(self) -> bool:
        """Whether a new file must be planned: the byte counts in a built passthrough
        header no longer match the store (a write through the mount, or a mismatch seen)."""
        if self._failed is not None:
            return True
        if self._modes is None or not any(m is not None for m in self._modes):
            return False
        return self._change_marks() != self._changes

    def invalidate(self, why: str) -> None:
        """Reads fail from now on (the store changed under an open file)."""
        self._failed = why

    def same_layout(self, other: WholeImage) -> bool:
        """Whether `other` has byte-for-byte the same header (blocking: may look up the
        stored sizes of both). Compared by what the header is made of, not its bytes:
        the header of a big image is never built whole."""
        if self.size != other.size or self.bigtiff != other.bigtiff:
            return False
        self.settle()
        other.settle()
        return self._layout_key() == other._layout_key()

    def _layout_key(self) -> tuple[Any, ...]:
        """Everything the header's bytes are a function of."""
        levels = tuple((lv.width, lv.height, lv.tile_w, lv.tile_h, lv.slot, lv.data_start) for lv in self.levels)
        return (self.bigtiff, self.header_size, self.description, self.dtype.str, self.planes, levels,
                tuple(self._modes or ()), tuple(self._counts or ()))

    # -- the header --------------------------------------------------------------------
    def settle(self) -> None:
        """Decide passthrough or decoded per level, and the byte counts (blocking for
        passthrough levels: looks up stored sizes once)."""
        if self._modes is not None:
            return
        with self._header_lock:
            if self._modes is None:
                marks = self._change_marks()
                counts, modes = self._byte_counts()
                self._counts, self._changes = counts, marks
                self._modes = modes  # last: `_modes` set means the counts are there

    def header(self) -> bytes:
        """Every IFD with its tile offsets and byte counts, the whole header as one
        bytes object (blocking for passthrough levels: looks up stored sizes once).
        Kept when it is at most `_HEADER_KEPT`; reads of a bigger one render only
        the bytes they cover (`header_bytes`)."""
        header = self._header
        if header is not None:
            return header
        self.settle()
        header = self._render(0, self.header_size)
        if self.header_size <= _HEADER_KEPT:
            self._header = header
        return header

    def header_bytes(self, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the header (blocking, as `header`)."""
        if self._header is not None:
            return self._header[start:stop]
        if self.header_size <= _HEADER_KEPT:
            return self.header()[start:stop]
        self.settle()
        return self._render(start, stop)

    def _byte_counts(self) -> tuple[list[_Counts], list[int | None]]:
        counts: list[_Counts] = []
        modes: list[int | None] = []
        for lv in self.levels:
            mode = None
            level_counts = _Counts(lv.tile_bytes)
            if lv.passthrough is not None and self._unchecked_sizes(lv):
                # Every well-formed stored chunk is exactly one tile: no size to look up
                # (a chunk file of another size is served decoded, see _stored_piece).
                mode = COMPRESSION_NONE
            elif lv.passthrough is not None:
                stored = self._stored_counts(lv)
                if stored is not None:
                    level_counts, mode = stored, lv.passthrough[0]
            counts.append(level_counts)
            modes.append(mode)
        return counts, modes

    @staticmethod
    def _chunk_file(lv: _Level, coords: tuple[int, ...]) -> str | None:
        """The local file of a stored chunk, when the store is a directory of whole chunks."""
        stored_path = getattr(lv.array.source, "stored_chunk_path", None)
        return stored_path(coords) if stored_path is not None else None

    def _unchecked_sizes(self, lv: _Level) -> bool:
        """Uncompressed passthrough from local chunk files without checksums: the byte
        counts are the tile size, known without looking at the store."""
        return (lv.passthrough == (COMPRESSION_NONE, 0)
                and self._chunk_file(lv, (0,) * len(lv.array.source.shape)) is not None)

    def _stored_counts(self, lv: _Level) -> _Counts | None:
        """Byte counts of a passthrough level from the stored sizes, or None (decoded).
        One entry per stored chunk; tiles with no stored chunk hold the fill tile."""
        assert lv.passthrough is not None
        compression, trailer = lv.passthrough
        src = lv.array.source
        sizes_of = getattr(src, "stored_sizes", None)
        sizes = sizes_of() if sizes_of is not None else None
        if sizes is None:
            return None  # sizes not cheap here (e.g. an object store without shards)
        fill = len(self._fill_stream(lv, compression))
        indexes: list[int] = []
        values: list[int] = []
        for coords, size in sizes.items():
            index = self._tile_index(lv, coords)
            if index is None:
                continue
            n = size - trailer
            if n < 0 or n > lv.slot or (compression == COMPRESSION_NONE and n != lv.tile_bytes):
                log.info("%s: stored chunk %s of %s has %d bytes, outside the tile slot: "
                         "the level is served decoded", self.label, coords, src.name, size)
                return None
            indexes.append(index)
            values.append(n)
        return _Counts(fill, indexes, values)

    def _tile_index(self, lv: _Level, coords: Sequence[int]) -> int | None:
        """Index (plane * tiles + tile) of the tile that is exactly chunk `coords`."""
        lead = tuple(coords[:-2])
        ty, tx = coords[-2], coords[-1]
        if ty >= lv.tiles_down or tx >= lv.tiles_across:
            return None
        plane = _ravel(lead, lv.lead) if lead else 0
        return plane * lv.tiles + ty * lv.tiles_across + tx

    def _fill_stream(self, lv: _Level, compression: int) -> bytes:
        """A tile of the fill value, compressed as the level's stored chunks are."""
        key = (id(lv), compression)
        data = self._fills.get(key)
        if data is None:
            data = self._fills[key] = _encode(compression, self._fill_tile(lv).tobytes())
        return data

    def _fill_tile(self, lv: _Level) -> np.ndarray:
        return np.full((lv.tile_h, lv.tile_w), _fill_value(lv.array), dtype=_pixel_dtype(self.dtype))

    def _render(self, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the header, built from the IFD blocks they cover only:
        a tile offset or byte count is computed when the bytes holding it are read, so
        memory and time follow the bytes read, never the number of tiles."""
        assert self._modes is not None and self._counts is not None
        stop = min(stop, self.header_size)
        if start >= stop:
            return b""
        out = bytearray(stop - start)
        fmt = ifd_format(self.bigtiff)
        head = fmt.head_size
        if start < head:
            first = fmt.file_header(self._ifd_at(0, 0))
            piece = first[start : min(stop, head)]
            out[: len(piece)] = piece
        pos = max(start, head)
        per_plane = sum(self._blocks)
        while pos < stop:
            # the IFD block holding `pos`: block (0, 0) is `_first_extra` longer, which
            # moves every later block by as much
            rel = pos - head
            if rel < self._blocks[0] + self._first_extra:
                plane, level = 0, 0
            else:  # counted from where block (0, 0) would end without its extra
                plane, within = divmod(rel - self._first_extra, per_plane)
                level = 0
                while within >= self._blocks[level]:
                    within -= self._blocks[level]
                    level += 1
            at = self._ifd_at(plane, level)
            size = self._blocks[level] + (self._first_extra if (plane, level) == (0, 0) else 0)
            end = min(stop, at + size)
            assert at <= pos < end, (pos, plane, level)  # never loop without moving on
            piece = self._block_bytes(plane, level, pos - at, end - at)
            out[pos - start : pos - start + len(piece)] = piece  # the rest: padding, zeros
            pos = end
        return bytes(out)

    def _block_bytes(self, plane: int, k: int, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the IFD block of (plane, level k), relative to its start:
        the entries, then the values that do not fit in them, each at an even offset."""
        assert self._modes is not None and self._counts is not None
        fmt = ifd_format(self.bigtiff)
        otype, osize, uint = fmt.offset_type, fmt.offset_size, fmt.uint
        lv = self.levels[k]
        nlev = len(self.levels)
        first = plane == 0 and k == 0
        at = self._ifd_at(plane, k)
        tags = self._entries(k, first)
        first_slot = self.slot_offset(k, plane, 0)
        counts = self._counts[k]
        base = plane * lv.tiles

        def offsets(e0: int, e1: int) -> bytes:
            return (np.uint64(first_slot) + np.arange(e0, e1, dtype=np.uint64) * np.uint64(lv.slot)) \
                .astype(uint).tobytes()

        def byte_counts(e0: int, e1: int) -> bytes:
            return counts.slice(base + e0, e1 - e0).astype(uint).tobytes()

        # tag -> (type, count, bytes if small, or (length, maker of elements [e0, e1)) if not)
        values: dict[int, tuple[int, int, Any]] = {
            254: (LONG, 1, struct.pack("<I", 0 if k == 0 else 1)),
            256: (LONG, 1, struct.pack("<I", lv.width)),
            257: (LONG, 1, struct.pack("<I", lv.height)),
            258: (SHORT, 1, struct.pack("<H", 8 * self.dtype.itemsize)),
            259: (SHORT, 1, struct.pack("<H", self._modes[k] or COMPRESSION_NONE)),
            262: (SHORT, 1, struct.pack("<H", 1)),
            277: (SHORT, 1, struct.pack("<H", 1)),
            284: (SHORT, 1, struct.pack("<H", 1)),
            322: (LONG, 1, struct.pack("<I", lv.tile_w)),
            323: (LONG, 1, struct.pack("<I", lv.tile_h)),
            324: (otype, lv.tiles, offsets),
            325: (otype, lv.tiles, byte_counts),
            339: (SHORT, 1, struct.pack("<H", sample_format(self.dtype))),
        }
        if first:
            values[270] = (ASCII, len(self.description), self.description)
        if 330 in tags:
            subs = [self._ifd_at(plane, j) for j in range(1, nlev)]
            values[330] = (otype, nlev - 1, np.array(subs, dtype=uint).tobytes())
        # lay out: small values inline, the others one after another past the entries
        lengths = [(tag, values[tag][1] * osize if callable(values[tag][2]) else len(values[tag][2]))
                   for tag in tags]
        placed, _ = place_values(fmt, lengths, at + fmt.ifd_size(len(tags)))
        rows: list[tuple[int, int, int, bytes | None]] = []
        outside: list[tuple[int, int, Any]] = []  # (offset in block, length, bytes or maker)
        for tag, length in lengths:
            typ, count, data = values[tag]
            if tag in placed:
                rows.append((tag, typ, count, None))
                outside.append((placed[tag] - at, length, data))
            else:
                rows.append((tag, typ, count, data(0, count) if callable(data) else data))
        nxt = self._ifd_at(plane + 1, 0) if k == 0 and plane + 1 < self.planes else 0
        entries = pack_ifd(fmt, rows, placed, nxt)
        out = bytearray(hi - lo)
        piece = entries[lo:hi]
        out[: len(piece)] = piece
        for where, length, data in outside:
            a, b = max(lo, where), min(hi, where + length)
            if a >= b:
                continue
            if callable(data):  # only the elements the range covers
                e0, e1 = (a - where) // osize, -(-(b - where) // osize)
                chunk = data(e0, e1)
                piece = chunk[a - where - e0 * osize : b - where - e0 * osize]
            else:
                piece = data[a - where : b - where]
            out[a - lo : b - lo] = piece
        return bytes(out)

    # -- tiles -------------------------------------------------------------------------
    def _locate(self, offset: int) -> tuple[int, int, int, int] | None:
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

    def _cached_tile(self, level: int, plane: int, tile: int) -> bytes | None:
        with self._tiles_lock:
            data = self._tiles.get((level, plane, tile))
            if data is not None:
                self._tiles.move_to_end((level, plane, tile))
            return data

    def _keep_tile(self, level: int, plane: int, tile: int, data: bytes) -> None:
        """Keep a built tile: the kernel reads one tile in several requests."""
        with self._tiles_lock:
            key = (level, plane, tile)
            if key in self._tiles:
                return
            self._tiles[key] = data
            self._tiles_used += len(data)
            while self._tiles_used > _TILE_CACHE_BYTES and len(self._tiles) > 1:
                _, old = self._tiles.popitem(last=False)
                self._tiles_used -= len(old)

    def _direct_chunk(self, lv: _Level, plane: int, tile: int) -> tuple[int, ...] | None:
        """The chunk whose decoded bytes *are* this tile's pixels, if there is one."""
        if (lv.tile_h, lv.tile_w) != (lv.chunk_h, lv.chunk_w) or any(n != 1 for n in lv.chunk_lead):
            return None
        if getattr(lv.array.options, "crop_edges", False):
            return None  # cropped edge chunks are shorter than a tile
        return self._tile_chunk(lv, plane, tile)

    def _tile_chunk(self, lv: _Level, plane: int, tile: int) -> tuple[int, ...]:
        """The chunk at a tile's position, when one tile is one chunk of one plane."""
        ty, tx = divmod(tile, lv.tiles_across)
        lead = _unravel(plane, lv.lead)
        coords = (*lead, ty, tx)
        return coords[-len(lv.array.source.shape) :] if lv.array.source.shape else ()

    def _tile_from_memory(self, level: int, plane: int, tile: int) -> bytes | None:
        data = self._cached_tile(level, plane, tile)
        if data is not None:
            return data
        if self._modes is not None and self._modes[level] is not None:
            return None
        lv = self.levels[level]
        coords = self._direct_chunk(lv, plane, tile)
        if coords is None:
            return None
        arr = lv.array
        return arr.cached_pixels(coords)

    def _tile(self, level: int, plane: int, tile: int) -> bytes:
        """A tile's stored bytes (passthrough stream, or decoded pixels) (blocking)."""
        self.settle()  # decides passthrough per level (and checks the store once)
        assert self._modes is not None and self._counts is not None
        data = self._cached_tile(level, plane, tile)
        if data is not None:
            return data
        lv = self.levels[level]
        mode = self._modes[level]
        if mode is None:
            coords = self._direct_chunk(lv, plane, tile)
            if coords is not None:
                data = lv.array.pixel_bytes(coords)  # the chunk cache holds it (single flight)
                if len(data) == lv.tile_bytes:
                    return data
        # Single flight: the kernel reads one tile in several concurrent requests;
        # only the first fetches or assembles it, the others wait for it.
        key = (level, plane, tile)
        with self._tiles_lock:
            flight = self._inflight.setdefault(key, threading.Lock())
        with flight:
            data = self._cached_tile(level, plane, tile)
            if data is not None:
                return data
            try:
                if mode is not None:
                    data = self._passthrough_tile(lv, level, plane, tile, mode)
                else:
                    data = self._assemble(lv, plane, tile)
                self._keep_tile(level, plane, tile, data)
            finally:
                with self._tiles_lock:
                    self._inflight.pop(key, None)
            return data

    def _decode_side_by_side(self, keys: list[tuple[int, int, int]]) -> None:
        """Start decoding the chunks of these tiles (the second and further tiles of one
        read: the kernel's read-ahead asks for two) in other threads, so they decode
        while this thread decodes the first; the read then finds them in the chunk
        cache, or waits for the decode under way (single flight)."""
        if not keys:
            return
        self.settle()
        assert self._modes is not None
        for level, plane, tile in keys:
            lv = self.levels[level]
            if self._modes[level] is not None:
                continue  # passed through: nothing to decode
            coords = self._direct_chunk(lv, plane, tile)
            if coords is not None and not lv.array.is_cached(coords):
                _decoder().submit(lv.array.pixel_bytes, coords)  # a failure: the read reports it

    def _read_ahead(self, level: int, plane: int, tile: int) -> None:
        """Ask the OS to start reading the chunk files of the tiles a region reader needs
        next: right, below and below right (the kernel's read-ahead of this file only
        follows rows). Local chunk files only; the disk works while the reader does
        (posix_fadvise WILLNEED in a background thread: nothing decoded or kept here)."""
        key = (level, plane, tile)
        lv = self.levels[level]
        if key in self._advised or lv.tile_bytes > _READ_AHEAD_MAX_TILE:
            return
        if (lv.tile_h, lv.tile_w) != (lv.chunk_h, lv.chunk_w) or any(n != 1 for n in lv.chunk_lead):
            return  # tiles assembled from several chunks: no file per tile
        if len(self._advised) > 65536:
            self._advised.clear()
        self._advised.add(key)
        ty, tx = divmod(tile, lv.tiles_across)
        paths = []
        for ny, nx in ((ty, tx + 1), (ty + 1, tx), (ty + 1, tx + 1)):
            if ny < lv.tiles_down and nx < lv.tiles_across:
                path = self._chunk_file(lv, self._tile_chunk(lv, plane, ny * lv.tiles_across + nx))
                if path is None:
                    return
                paths.append(path)
        _ADVISOR.will_need(paths)

    def _stored_piece(
        self, level: int, plane: int, tile: int, within: int, length: int, into: memoryview | None = None
    ) -> bytes | memoryview | None:
        """Bytes [within, within+length) of a passthrough tile read straight from its
        stored chunk file (blocking), or None when the level has no such file. With
        `into` (a buffer of at least `length` bytes) the file is read into it, and
        the part of it read is returned.

        A local store's chunk file *is* the tile's stream (no checksum to strip), so a
        read takes just the range asked for: no whole-chunk fetch through zarr's event
        loop and store threads, no copies, nothing kept (the OS page cache keeps it)."""
        lv = self.levels[level]
        if lv.passthrough is None or lv.passthrough[1]:
            return None
        assert self._modes is not None and self._counts is not None  # _read settled them
        mode = self._modes[level]
        if mode is None:
            return None
        coords = self._tile_chunk(lv, plane, tile)
        path = self._chunk_file(lv, coords)
        if path is None:
            return None
        expected = self._counts[level].at(plane * lv.tiles + tile)
        try:
            # opened inside the store (openat2 beneath its root): a link swapped in since
            # `stored_chunk_path` looked cannot lead the read out of the store [outside-1]
            fd = lv.array.source.open_raw_chunk(coords)
        except OutsideStoreError:
            return None  # decoded instead, where reading it fails (EIO, naming the key)
        except FileNotFoundError:  # nothing stored: the fill value
            fill = self._fill_stream(lv, mode)
            size, data = len(fill), fill[within : within + length]
        else:
            try:
                size = os.fstat(fd).st_size
                want = max(0, min(length, size - within))
                if not want:
                    data: bytes | memoryview = b""
                elif into is not None:
                    data = into[: os.preadv(fd, [into[:want]], within)]
                else:
                    data = os.pread(fd, want, within)
            finally:
                os.close(fd)
            if len(data) != want:
                size = within + len(data)  # it shrank while we read: stale, below
        if size != expected and mode == COMPRESSION_NONE and expected == lv.tile_bytes:
            # Not a tile's worth of raw values (the header did not look): the decoder
            # reads it, as for any decoded tile, or this tile fails, naming the chunk.
            try:
                return self._assemble(lv, plane, tile)[within : within + length]
            except StaleImageError:
                raise
            except ZfuseError as e:
                if type(e) is not CorruptDataError:  # (the decoder's own "does not decode" is said below)
                    raise
                raise CorruptDataError(
                    f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} ({path}) has "
                    f"{size} bytes, not the {lv.tile_bytes} of its uncompressed values: {e}") from e
            except Exception as e:
                raise CorruptDataError(
                    f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} ({path}) has "
                    f"{size} bytes, not the {lv.tile_bytes} of its uncompressed values: {e}") from e
        if size != expected:
            why = (f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} changed in "
                   f"the store since this file was opened ({size} bytes, header says "
                   f"{expected}); reopen the file")
            self.invalidate(why)
            raise StaleImageError(why)
        if within == 0:
            self.stats.count("tiles_passed_through")
        return data

    def _passthrough_tile(self, lv: _Level, level: int, plane: int, tile: int, mode: int) -> bytes:
        assert lv.passthrough is not None and self._counts is not None
        coords = self._tile_chunk(lv, plane, tile)
        expected = self._counts[level].at(plane * lv.tiles + tile)
        raw = lv.array.source.read_stored(coords)
        if raw is None:
            data = self._fill_stream(lv, mode)
        else:
            data = _strip_checksums(raw, lv.passthrough[1], f"{lv.array.source.name} chunk {coords}")
        if len(data) != expected:
            why = (f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} changed in "
                   f"the store since this file was opened ({len(data)} bytes, header says "
                   f"{expected}); reopen the file")
            self.invalidate(why)
            raise StaleImageError(why)
        self.stats.count("tiles_passed_through")
        return data

    def _assemble(self, lv: _Level, plane: int, tile: int) -> bytes:
        """A decoded tile put together from the chunks it overlaps (fill value elsewhere)."""
        started = time.perf_counter()
        src = lv.array.source
        dtype = _pixel_dtype(self.dtype)
        out = np.full((lv.tile_h, lv.tile_w), _fill_value(lv.array), dtype=dtype)
        ty, tx = divmod(tile, lv.tiles_across)
        y0, x0 = ty * lv.tile_h, tx * lv.tile_w
        y1, x1 = min(y0 + lv.tile_h, lv.height), min(x0 + lv.tile_w, lv.width)
        lead = _unravel(plane, lv.lead)
        lead_chunk = tuple(i // c for i, c in zip(lead, lv.chunk_lead, strict=True))
        lead_in = tuple(i % c for i, c in zip(lead, lv.chunk_lead, strict=True))
        ndim = len(src.shape)
        crop = bool(getattr(lv.array.options, "crop_edges", False))
        for cy in range(y0 // lv.chunk_h, (y1 - 1) // lv.chunk_h + 1):
            for cx in range(x0 // lv.chunk_w, (x1 - 1) // lv.chunk_w + 1):
                coords = (*lead_chunk, cy, cx)[-ndim:] if ndim else ()
                raw = lv.array.pixel_bytes(coords)
                shape = src.chunk_shape
                if crop:
                    shape = tuple(r.stop - r.start for r in src.chunk_region(coords))
                chunk = np.frombuffer(raw, dtype=dtype).reshape(shape) if ndim else np.frombuffer(raw, dtype=dtype)
                plane2d = chunk[lead_in] if lead_in else chunk
                plane2d = plane2d.reshape(-1, shape[-1]) if ndim >= 1 else plane2d.reshape(1, 1)
                ys, xs = cy * lv.chunk_h, cx * lv.chunk_w
                a0, a1 = max(y0, ys), min(y1, ys + plane2d.shape[0])
                b0, b1 = max(x0, xs), min(x1, xs + plane2d.shape[1])
                if a0 < a1 and b0 < b1:
                    out[a0 - y0 : a1 - y0, b0 - x0 : b1 - x0] = plane2d[a0 - ys : a1 - ys, b0 - xs : b1 - xs]
        self.stats.count("tiles_assembled")
        self.stats.count("tile_assembly_seconds", time.perf_counter() - started)
        return out.tobytes()

    # -- tiles pushed ahead of a region reader -------------------------------------------
    def pushes_after(self, offset: int, size: int) -> list[tuple[int, int]]:
        """Byte ranges (offset, length) worth storing in the kernel's page cache ahead of
        the reader, nearest first, after the kernel asked for [offset, offset+size).

        A region reader (tifffile `aszarr`, napari, GDAL) reads a region's tiles one
        after another, each a FUSE round trip and a disk read when cold, and the
        kernel's read-ahead of this file follows tile rows only. Nothing is pushed
        until the reads show such a reader: a tile asked for next to one an earlier
        read asked for (so reading one tile decodes only the chunks it covers). Then
        the first tile of each read that was neither asked for nor pushed before
        brings the rest of its region: the tiles right, below and below right. If it
        also lies near one of the last few such tiles (within two tiles: the reader
        works in an area, as a viewer panning does), it brings the ring of tiles two
        around it (up to 16 MiB of it, nearest first), so the neighbouring regions
        are read while the reader works. A reader jumping about a large image gets
        no more than its own regions. Tiles already asked for or pushed are left out.
        """
        with self._tiles_lock:
            marks = self._change_marks()
            if marks != self._push_marks:  # other bytes now: start over
                self._asked.clear()
                self._pushed.clear()
                self._recent.clear()
                self._push_marks = marks
            tiles = self._tiles_in(offset, size)
            if not tiles:
                return []
            first = tiles[0]
            fresh = first not in self._asked and first not in self._pushed
            if not self._region_reader:
                self._region_reader = any(self._next_to_asked(t) for t in tiles if t not in self._asked)
            if len(self._asked) + len(tiles) > _TILES_REMEMBERED or len(self._pushed) > _TILES_REMEMBERED:
                self._asked.clear()
                self._pushed.clear()
            self._asked.update(tiles)
            if not self._region_reader or not fresh:
                return []  # a tile pushed (too late) or read before: its region is on its way
            level, plane, tile = first
            lv = self.levels[level]
            ty, tx = divmod(tile, lv.tiles_across)
            near: list[tuple[int, int]] = [(ty, tx + 1), (ty + 1, tx), (ty + 1, tx + 1)]
            if any(r[:2] == (level, plane) and max(abs(r[2] - ty), abs(r[3] - tx)) <= _PUSH_RING
                   for r in self._recent):
                ring = [(ty + dy, tx + dx) for dy in range(-_PUSH_RING, _PUSH_RING + 1)
                        for dx in range(-_PUSH_RING, _PUSH_RING + 1)]
                # nearest first; at equal distance forward (right, below) first
                ring.sort(key=lambda p: (max(abs(p[0] - ty), abs(p[1] - tx)), p[0] < ty, p[1] < tx, p))
                near += ring
            self._recent.append((level, plane, ty, tx))
            out = []
            ring_bytes = 0
            for k, (ny, nx) in enumerate(near):
                if not (0 <= ny < lv.tiles_down and 0 <= nx < lv.tiles_across):
                    continue
                key = (level, plane, ny * lv.tiles_across + nx)
                if key in self._asked or key in self._pushed:
                    continue
                span = self._push_span(*key)
                if span is None:
                    continue
                if k >= 3:  # the ring, beyond the region's own tiles
                    ring_bytes += span[1]
                    if ring_bytes > _PUSH_RING_BYTES:
                        break
                self._pushed.add(key)
                out.append(span)
            return out

    def push_wanted(self, offset: int) -> bool:
        """Whether the tile at `offset` is still worth pushing: the kernel has not asked
        for it since it was chosen (the push would only repeat that read)."""
        found = self._locate(offset)
        return found is not None and found[:3] not in self._asked

    def _tiles_in(self, offset: int, size: int) -> list[tuple[int, int, int]]:
        """(level, plane, tile) of the slots that bytes [offset, offset+size) touch."""
        out = []
        pos, end = max(offset, self.data_start), min(offset + size, self.size)
        while pos < end:
            found = self._locate(pos)
            if found is None:
                break
            level, plane, tile, within = found
            out.append((level, plane, tile))
            pos += self.levels[level].slot - within
        return out

    def _next_to_asked(self, key: tuple[int, int, int]) -> bool:
        level, plane, tile = key
        lv = self.levels[level]
        ty, tx = divmod(tile, lv.tiles_across)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                ny, nx = ty + dy, tx + dx
                if (dy or dx) and 0 <= ny < lv.tiles_down and 0 <= nx < lv.tiles_across:
                    if (level, plane, ny * lv.tiles_across + nx) in self._asked:
                        return True
        return False

    def _push_span(self, level: int, plane: int, tile: int) -> tuple[int, int] | None:
        """The whole pages of a tile's slot that hold its bytes, or None when the tile
        is not worth pushing (tiny or huge tiles, slots not page aligned, a passthrough
        level whose byte counts are not known yet)."""
        lv = self.levels[level]
        if not _PUSH_MIN_TILE <= lv.tile_bytes <= _PUSH_MAX_TILE:
            return None
        start = self.slot_offset(level, plane, tile)
        if start % _PAGE or lv.slot % _PAGE:
            return None
        count = lv.tile_bytes
        if lv.passthrough is not None:
            if self._modes is None or self._counts is None:
                return None
            if self._modes[level] is not None:
                count = self._counts[level].at(plane * lv.tiles + tile)
        length = min(-(-count // _PAGE) * _PAGE, lv.slot)
        return (start, length) if length else None

    # -- bytes -------------------------------------------------------------------------
    def _check(self) -> None:
        if self._failed is not None:
            raise StaleImageError(self._failed)

    def read_cached(self, offset: int, size: int) -> bytes | None:
        """Bytes [offset, offset+size) from memory only; None when a read must decode."""
        self._check()
        return self._read(offset, size, blocking=False)

    def read(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset+size) (blocking: may look up sizes and decode chunks)."""
        self._check()
        data = self._read(offset, size, blocking=True)
        assert data is not None
        return data

    def _read(self, offset: int, size: int, *, blocking: bool) -> bytes | bytearray | memoryview | None:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        # A read of more than one piece (header and tiles, or two tiles: the kernel's
        # read-ahead asks for 1 MiB) is put together in one buffer, the chunk files
        # read straight into it: no copy of each piece, then of the whole.
        out: memoryview | None = None
        single: bytes | memoryview | None = None
        touched: list[tuple[int, int, int]] = []  # tiles read from the store
        if blocking and end - offset > self.levels[-1].slot:
            self._decode_side_by_side(self._tiles_in(offset, end - offset)[1:])
        pos = offset
        if pos < self.data_start:
            if self._header is None and not blocking and self._modes is None:
                return None  # the byte counts are not settled yet
            stop = min(end, self.data_start)
            piece = self.header_bytes(pos, stop)  # settled: memory work only
            if stop == end and len(piece) == stop - pos:
                return piece
            out = memoryview(bytearray(end - offset))
            out[: len(piece)] = piece  # the rest: alignment padding and the gap, zeros
            pos = stop
        while pos < end:
            found = self._locate(pos)
            if found is None:
                break  # past the last slot: the trailer's zeros
            level, plane, tile, within = found
            lv = self.levels[level]
            stop = min(end, pos - within + lv.slot)
            if out is None and stop < end:
                out = memoryview(bytearray(end - offset))
            target = out[pos - offset : stop - offset] if out is not None else None
            if self._modes is None and self.levels[level].passthrough is not None:
                if not blocking:
                    return None  # the header decides whether this level passes through
                self.settle()
            piece = self._stored_piece(level, plane, tile, within, stop - pos, target) if blocking else None
            if blocking:
                touched.append((level, plane, tile))
            if piece is None:
                data = self._tile(level, plane, tile) if blocking else self._tile_from_memory(level, plane, tile)
                if data is None:
                    return None
                piece = data[within : stop - pos + within]  # a view of a cached chunk: no copy
            if target is None:
                single = piece
                if len(piece) < stop - pos:  # rest of the slot: zeros
                    single = bytes(piece) + bytes(stop - pos - len(piece))
            elif not (isinstance(piece, memoryview) and piece.obj is target.obj):  # not read into it
                target[: len(piece)] = piece
            pos = stop
        for key in touched:  # after these reads: the disk serves them first
            self._read_ahead(*key)
        if out is not None:
            return out.obj  # type: ignore[return-value]
        return single if single is not None else bytes(end - offset)


_SERIALS = itertools.count(1)


class _Advisor:
    """One background thread that asks the OS to read files ahead (posix_fadvise
    WILLNEED). Opening a file and mapping its blocks may wait on the disk (cold
    inodes): a request being answered should not. Only the latest requests are kept
    (a reader that moved on does not need the old ones)."""

    def __init__(self, keep: int = 64) -> None:
        self._pending: deque[list[str]] = deque(maxlen=keep)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def will_need(self, paths: list[str]) -> None:
        if not paths:
            return
        with self._wake:
            self._pending.append(paths)
            if self._thread is None or not self._thread.is_alive():  # started on first use (after any fork)
                self._thread = threading.Thread(target=self._run, name="zfuse-read-ahead", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending:
                    self._wake.wait()
                paths = self._pending.popleft()
            for path in paths:
                # not stored (fill value) or unreadable: nothing to advise, the read will say
                advise_willneed(path)


_ADVISOR = _Advisor()
_DECODER: ThreadPoolExecutor | None = None
_DECODER_LOCK = threading.Lock()


def _decoder() -> ThreadPoolExecutor:
    """Threads decoding the further tiles of one read (created on first use: after any fork)."""
    global _DECODER
    with _DECODER_LOCK:
        if _DECODER is None:
            _DECODER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zfuse-tile-decode")
        return _DECODER


def _strip_checksums(raw: bytes, trailer: int, what: str) -> bytes:
    """The stream before `trailer` bytes of crc32c checksums (each checked)."""
    if trailer == 0:
        return raw
    import crc32c

    data = raw
    for _ in range(trailer // 4):
        if len(data) < 4:
            raise CorruptDataError(f"{what}: shorter than its checksum")
        body, stored = data[:-4], int.from_bytes(data[-4:], "little")
        if crc32c.crc32c(body) != stored:
            raise CorruptDataError(f"{what}: crc32c checksum mismatch")
        data = body
    return data


def _pixel_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind == "b":
        return np.dtype(np.uint8)
    return np.dtype(dtype).newbyteorder("<")


def _fill_value(arr: ArrayView) -> Any:
    fill = arr.source.fill_value
    if fill is None:
        return 0
    if np.dtype(arr.source.dtype).kind == "b":
        return int(bool(fill))
    return fill


def _ravel(index: Sequence[int], shape: Sequence[int]) -> int:
    """`np.ravel_multi_index` in Python integers: numpy refuses shapes past 2**63 elements."""
    flat = 0
    for i, n in zip(index, shape, strict=True):
        flat = flat * n + int(i)
    return flat


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    """`np.unravel_index` in Python integers (see `_ravel`)."""
    out = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        out.append(i)
    return tuple(reversed(out))


class _Counts:
    """The TileByteCounts of one level: every tile `default` bytes but those of stored
    chunks (passthrough), kept as two sorted arrays, so the memory follows the
    stored chunks (16 bytes each), never the number of tiles."""

    __slots__ = ("default", "indexes", "values")

    def __init__(self, default: int, indexes: Sequence[int] = (), values: Sequence[int] = ()) -> None:
        self.default = default
        order = np.argsort(np.asarray(indexes, dtype=np.uint64), kind="stable")
        self.indexes = np.asarray(indexes, dtype=np.uint64)[order]
        self.values = np.asarray(values, dtype=np.uint64)[order]

    def at(self, index: int) -> int:
        k = int(np.searchsorted(self.indexes, np.uint64(index)))
        if k < len(self.indexes) and int(self.indexes[k]) == index:
            return int(self.values[k])
        return self.default

    def slice(self, start: int, n: int) -> np.ndarray:
        """The counts of tiles [start, start + n) as uint64."""
        out = np.full(n, self.default, dtype=np.uint64)
        lo = int(np.searchsorted(self.indexes, np.uint64(start)))
        hi = int(np.searchsorted(self.indexes, np.uint64(start + n)))
        if hi > lo:
            out[(self.indexes[lo:hi] - np.uint64(start)).astype(np.intp)] = self.values[lo:hi]
        return out

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _Counts) and self.default == other.default
                and np.array_equal(self.indexes, other.indexes) and np.array_equal(self.values, other.values))

    __hash__ = None  # type: ignore[assignment]


# -- which files a directory shows --------------------------------------------------


def multiscale_name(attrs: dict[str, Any]) -> str | None:
    """The `name` of the first OME-Zarr multiscale in group attributes, if it has one."""
    attrs = attrs.get("ome", attrs) if isinstance(attrs, dict) else {}
    ms = attrs.get("multiscales") if isinstance(attrs, dict) else None
    if not isinstance(ms, list) or not ms or not isinstance(ms[0], dict):
        return None
    name = ms[0].get("name")
    return str(name) if isinstance(name, str) and name.strip() else None


def multiscale_paths(attrs: dict[str, Any]) -> list[str] | None:
    """Dataset paths of the first OME-Zarr multiscale in group attributes, if any."""
    attrs = attrs.get("ome", attrs) if isinstance(attrs, dict) else {}
    ms = attrs.get("multiscales") if isinstance(attrs, dict) else None
    if not isinstance(ms, list) or not ms or not isinstance(ms[0], dict):
        return None
    paths = [d.get("path") for d in ms[0].get("datasets") or [] if isinstance(d, dict)]
    return [str(p) for p in paths if p] or None


def omero_channels(attrs: dict[str, Any]) -> list[dict[str, Any]] | None:
    attrs = attrs.get("ome", attrs) if isinstance(attrs, dict) else {}
    omero = attrs.get("omero") if isinstance(attrs, dict) else None
    channels = omero.get("channels") if isinstance(omero, dict) else None
    return channels if isinstance(channels, list) else None


def pyramid_levels(levels: Sequence[ArrayView], label: str) -> list[ArrayView]:
    """The arrays that can be SubIFD levels under the first: same dtype and planes,
    each no larger than the one before. Stops at the first that cannot."""
    if not levels:
        return []
    out = [levels[0]]
    base = levels[0].source
    lead0, h, w = _image_dims(base.shape)
    for arr in levels[1:]:
        src = arr.source
        lead, hh, ww = _image_dims(src.shape)
        if np.dtype(src.dtype) != np.dtype(base.dtype) or lead != lead0 or hh > h or ww > w:
            log.info("%s: pyramid stops before %s (shape %s, dtype %s): SubIFD levels need "
                     "the same planes and dtype, each level no larger", label, src.name, src.shape, src.dtype)
            break
        out.append(arr)
        h, w = hh, ww
    return out


def plan_whole_images(path: tuple[str, ...], node: Any, parent: Any | None,
                      not_shown: dict[str, str] | None = None) -> dict[str, WholeImage]:
    """`image.ome.tif` for an array, `pyramid.ome.tif` for an OME-Zarr multiscale group.

    `node`/`parent` are the view tree's group/array nodes (kind, children, array,
    metadata). Planned from metadata alone. A file that cannot be planned (an image
    no TIFF can express: wider than a LONG, or a file past 2**63 - 1 bytes) is left
    out, its directory shown as usual, and why is put in `not_shown` (by the
    directory's path)."""
    label = "/".join(path) or "/"
    out: dict[str, WholeImage] = {}
    try:
        if node.array is not None and node.array.layout is not None:
            attrs = _node_attrs(parent) if parent is not None and path else {}
            # the array's own OME axes: the multiscale naming it may be further up
            # (ngff-zarr's scale0/image)
            ome = node.array.ome or (ome_axes(attrs, path[-1]) if path else None)
            if ome is None:
                names = node.array.source.v3_metadata().get("dimension_names")
                ome = {"axes": list(names)} if names and all(names) else None
            out[IMAGE_NAME] = WholeImage(IMAGE_NAME, [node.array], ome, omero_channels(attrs), label=label,
                                         title=path[-1] if path else "image")
        elif node.kind == "group" and PYRAMID_NAME not in node.children:
            attrs = _node_attrs(node)
            paths = multiscale_paths(attrs)
            arrays = [_descend(node, p) for p in paths or ()]
            if arrays and all(a is not None and a.layout is not None for a in arrays):
                levels = pyramid_levels(arrays, label)  # type: ignore[arg-type]
                out[PYRAMID_NAME] = WholeImage(PYRAMID_NAME, levels, ome_axes(attrs, paths[0]),  # type: ignore[index]
                                               omero_channels(attrs), label=label,
                                               title=multiscale_name(attrs) or (path[-1] if path else "image"))
    except Exception as e:  # a whole-image file is an extra: never lose the directory over it
        log.warning("%s: no whole-image file: %s", label, e)
        if not_shown is not None:
            not_shown[label] = str(e)
    return out


def _node_attrs(node: Any) -> dict[str, Any]:
    try:
        return dict(json.loads(node.metadata).get("attributes") or {})
    except (ValueError, AttributeError):
        return {}


def _descend(node: Any, rel: str) -> ArrayView | None:
    for name in rel.strip("/").split("/"):
        child = node.children.get(name)
        if child is None:
            return None
        node = child
    return node.array
