"""The whole array as a stripped classic TIFF that plain ImageJ 1.x opens:
`image.tif` beside `image.ome.tif` (`StrippedImage`).

ImageJ 1.x reads strips, not tiles, and reads an ImageJ hyperstack by its first
IFD alone: a description starting `ImageJ=` with `images=N` on an uncompressed
file makes it read N planes one after another from the first strip on (it
skips the other IFDs). So the pixels are laid out as ImageJ writes them:

    file header | IFD of plane 0 (ImageJ description, IJ metadata) |
    IFDs of planes 1..N-1 | 4 MiB of zeros (page aligned) |
    plane 0 | plane 1 | ... (each plane's rows in order, uncompressed) | 64 KiB of zeros

- Planes run in ImageJ's order (c fastest, then z, then t) whenever the leading
  axes can be named so (`tiff_meta.plan_meta`, as the chunk files do); IFD k is
  the k-th plane in that order. Otherwise a plain stack in C order.
- Every IFD is complete (its own strip offsets), so libtiff, tifffile, Pillow
  and anything else that walks the IFDs reads the same planes.
- A strip is one row of chunks (RowsPerStrip = the chunk height), so reading
  a strip decodes only the chunks of that row; a read of part of a row decodes
  only the chunks its columns cover.
- Classic TIFF only (ImageJ 1.x reads no BigTIFF): a file past 4 GiB - 1, or a
  plane of more than 2**31 - 1 pixels (ImageJ holds a plane in one Java array),
  is not made; nor for dtypes ImageJ has no type for (int64, uint64,
  float16, complex).
- Calibration: XResolution/YResolution (pixels per unit) and `unit=`,
  `spacing=`, `finterval=` as the chunk files have them; OME-Zarr `omero`
  channels give `min=`/`max=` and, for several channels or a colour, a
  composite image with one LUT and display range per channel (IJ metadata,
  tags 50838/50839).

Size and every offset come from metadata alone; nothing is decoded before a
read of pixel bytes. No FUSE here.
"""

from __future__ import annotations

import itertools
import logging
import math
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zfuse.view.tiff_ifd import (
    ASCII,
    CLASSIC_LIMIT,
    LONG,
    RATIONAL,
    SHORT,
    ifd_format,
    sample_format,
)
from zfuse.view.tiff_meta import HeaderMeta, imagej_description, plan_meta
from zfuse.view.whole_image.file import ImageFile
from zfuse.view.whole_image.header import Values, ifd_block, ifd_block_size
from zfuse.view.whole_image.layout import ImageAxes, image_dims, unravel
from zfuse.view.whole_image.tiles import (
    chunk_plane,
    crop_edges,
    fill_value_of,
    pixel_dtype,
)

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView

log = logging.getLogger("zfuse.view.image")

STRIPPED_NAME = "image.tif"  # in every array directory whose image ImageJ 1.x can hold

BYTE = 1  # TIFF field type
_HEADER_GAP = 4 << 20  # as image.ome.tif: readers of the header stop in zeros
_TRAILER = 64 * 1024
_HEADER_KEPT = 4 * 1024**2
# ImageJ 1.x holds a plane in one Java array (int index) and reads classic TIFF only
MAX_PLANE_PIXELS = 2**31 - 1
# dtypes ImageJ 1.x reads as stored ("<kind><bytes>"; bool is written as uint8). Not
# int8 (read as uint8: -97 is 159), uint32 (read as int32) or float64 ("Unsupported
# format"): image.ome.tif serves those
_IMAGEJ_DTYPES = {"b1", "u1", "u2", "i2", "i4", "f4"}
# ImageJ holds int16 as uint16 plus 32768 (a calibration gives the values back), and
# reads display ranges (min=/max=, the IJ "rang" metadata) as the values it holds
_IMAGEJ_HELD_OFFSET = {"i2": 32768}
_SERIALS = itertools.count(1)


def _mib(n: int) -> int:
    return -(-n // 2**20)


def stripped_unsupported_reason(shape: Sequence[int], dtype: np.dtype) -> str | None:
    """Why an array gets no `image.tif` (None: it gets one). Size limits aside."""
    dt = np.dtype(dtype)
    if f"{dt.kind}{dt.itemsize}" not in _IMAGEJ_DTYPES:
        return f"ImageJ 1.x has no image type for {dt}"
    if any(int(n) == 0 for n in shape):
        return "the array is empty"
    _, height, width = image_dims(shape)
    if height * width > MAX_PLANE_PIXELS:
        return f"a plane of {height} x {width} pixels is past ImageJ 1.x's {MAX_PLANE_PIXELS}"
    return None


def _lut(color: str) -> bytes | None:
    """An ImageJ LUT (256 reds, greens, blues) from black to omero's "RRGGBB"."""
    if not isinstance(color, str) or len(color) != 6:
        return None
    try:
        rgb = [int(color[i : i + 2], 16) for i in (0, 2, 4)]
    except ValueError:
        return None
    ramp = np.arange(256, dtype=np.uint32)
    return b"".join(((ramp * c + 127) // 255).astype(np.uint8).tobytes() for c in rgb)


def _window(channel: Any) -> tuple[float, float] | None:
    window = channel.get("window") if isinstance(channel, dict) else None
    if not isinstance(window, dict):
        return None
    try:
        lo, hi = float(window["start"]), float(window["end"])
    except (KeyError, TypeError, ValueError):
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo < hi else None


def imagej_display(channels: list[dict[str, Any]] | None, size_c: int,
                   dtype: np.dtype | str = "u2") -> tuple[list[str], bytes, list[int]]:
    """What OME-Zarr `omero` channels say to ImageJ: description lines (min=/max=,
    mode=composite), and the IJ metadata (tag 50839 bytes, tag 50838 counts) of
    per-channel display ranges and LUTs, as ImageJ reads them for pixels of `dtype`;
    empty when there are no such channels."""
    if not channels or len(channels) != size_c or size_c > 64:
        return [], b"", []
    dt = np.dtype(dtype)
    held = _IMAGEJ_HELD_OFFSET.get(f"{dt.kind}{dt.itemsize}", 0)
    windows = [None if w is None else (w[0] + held, w[1] + held) for w in map(_window, channels)]
    luts = [_lut(c.get("color") if isinstance(c, dict) else None) for c in channels]
    lines: list[str] = []
    if windows[0] is not None:
        lines += [f"min={windows[0][0]!r}", f"max={windows[0][1]!r}"]
    items: list[tuple[bytes, list[bytes]]] = []  # (type, payloads)
    if all(w is not None for w in windows):
        items.append((b"rang", [struct.pack("<" + "d" * 2 * size_c,
                                            *[v for w in windows for v in w])]))  # type: ignore[union-attr]
    if all(lut is not None for lut in luts):
        items.append((b"luts", list(luts)))  # type: ignore[arg-type]
    if not items:
        return lines, b"", []
    # IJ metadata: "IJIJ", then (type, count) per kind, then the payloads; integers and
    # doubles in the file's byte order (little endian: the type names read reversed)
    header = b"IJIJ"[::-1] + b"".join(kind[::-1] + struct.pack("<I", len(p)) for kind, p in items)
    payloads = [p for _, ps in items for p in ps]
    return lines, header + b"".join(payloads), [len(header), *map(len, payloads)]


class StrippedImage(ImageFile):
    """A virtual stripped classic TIFF of one array, as ImageJ 1.x writes stacks.

    Raises ValueError when the array gets none (`stripped_unsupported_reason`, or a
    file past 4 GiB - 1). `size` and every offset come from metadata alone;
    `read_cached` answers from memory only, `read` may decode (a worker thread)."""

    def __init__(self, name: str, array: ArrayView, ome: dict[str, Any] | None = None,
                 channels: list[dict[str, Any]] | None = None, label: str = "") -> None:
        self.name = name
        self.label = label or name
        self.array = array
        self._serial = next(_SERIALS)
        src = array.source
        # planned in image order (`ImageAxes`): an array stored (y, x, c) is c planes
        self.axes = ImageAxes.of(array)
        self.shape = tuple(int(n) for n in self.axes.permute(src.shape))
        ome = self.axes.ome(ome)
        self.dtype = np.dtype(src.dtype)
        reason = stripped_unsupported_reason(self.shape, self.dtype)
        if reason is not None:
            raise ValueError(reason)
        self.pixel_dtype = pixel_dtype(self.dtype)
        self.lead, self.height, self.width = image_dims(self.shape)
        self.chunk_lead, self.chunk_h, self.chunk_w = self.axes.dims(src.chunk_shape)
        # A read of a few full-width rows needs every chunk across the image: a row of
        # chunks the chunk cache cannot hold (with room for the rest of the mount) was
        # decoded again for every read front to back (831 decodes of 10 chunks)
        band = -(-self.width // self.chunk_w) * math.prod(src.chunk_shape) * self.dtype.itemsize
        cache = array.cache.max_bytes
        if band > cache // 2:
            raise ValueError(f"a row of chunks across the image is {band} bytes decoded, more than half the "
                             f"chunk cache ({cache} bytes): each read would decode it again (mount with "
                             f"-o cache_size={_mib(2 * band)}M to have it; image.ome.tif reads by tiles)")
        self.rows_per_strip = max(1, min(self.chunk_h, self.height))
        self.strips = -(-self.height // self.rows_per_strip)
        self.planes = math.prod(self.lead)
        self.itemsize = self.dtype.itemsize
        self.row_bytes = self.width * self.itemsize
        self.plane_bytes = self.height * self.row_bytes
        meta, file_axes = self._plan_meta(ome)
        self._description, self._meta_bytes, self._meta_counts, self._file_lead = self._imagej(
            meta, file_axes, channels)
        # (the calibration the description states: the rows' and columns' axes, in
        # micrometres where the unit is known; raw scales had read 325 nm as 325 µm)
        self._xres = meta.xres
        self._fmt = ifd_format(False)
        self.data_start = 0  # (block sizes do not depend on it; set below)
        self._first_block = ifd_block_size(self._fmt, self._values(0), self._tags(0))
        self._block = ifd_block_size(self._fmt, self._values(1), self._tags(1)) if self.planes > 1 else 0
        self.header_size = self._fmt.head_size + self._first_block + (self.planes - 1) * self._block
        self.data_start = -(-(self.header_size + _HEADER_GAP) // 4096) * 4096
        self.size = self.data_start + self.planes * self.plane_bytes + _TRAILER
        if self.size > CLASSIC_LIMIT:
            raise ValueError(f"it would be {self.size} bytes, past the 4 GiB - 1 of a classic TIFF "
                             "(ImageJ 1.x reads no BigTIFF)")
        self._header: bytes | None = None
        self._header_lock = threading.Lock()
        self._failed: str | None = None

    # -- what the header says -----------------------------------------------------------
    def _plan_meta(self, ome: dict[str, Any] | None) -> tuple[HeaderMeta, tuple[int, ...]]:
        """What the header says, as the chunk files' headers say it (`plan_meta`)."""
        ome = ome or {}
        ndim = len(self.shape)
        return plan_meta(self.shape, axes=_fit(ome.get("axes"), ndim), axis_types=_fit(ome.get("axis_types"), ndim),
                         scales=_fit(ome.get("scales"), ndim), units=_fit(ome.get("units"), ndim),
                         grid_shape=[1] * ndim, array_shape=None)

    def _imagej(self, meta: HeaderMeta, file_axes: tuple[int, ...],
                channels: list[dict[str, Any]] | None) -> tuple[bytes, bytes, list[int], tuple[int, ...]]:
        """(description with NUL, IJ metadata bytes, their counts, the leading axes in
        the file's plane order: a permutation of the array's)."""
        text, _ = imagej_description(meta, self.shape)
        lines = [line for line in text.splitlines() if not line.split("=")[0].endswith("origin")]
        size_c = 1
        if meta.roles is not None:
            size_c = next((self.shape[i] for i, r in enumerate(meta.roles) if r == "c"), 1)
        extra, blob, counts = imagej_display(channels, size_c, self.dtype)
        if blob and size_c > 1:
            lines = [("mode=composite" if line == "mode=grayscale" else line) for line in lines]
        # ImageJ reads min=/max= before loop=false; keep that line last
        at = len(lines) - 1 if lines[-1] == "loop=false" else len(lines)
        lines[at:at] = extra
        description = ("\n".join(lines) + "\n").encode("ascii", "replace") + b"\0"
        return description, blob, counts, tuple(file_axes[: len(self.lead)])

    def _tags(self, plane: int) -> list[int]:
        tags = [254, 256, 257, 258, 259, 262]
        if plane == 0:
            tags.append(270)
        tags += [273, 277, 278, 279]
        if self._xres is not None:
            tags += [282, 283, 296]
        tags.append(339)
        if plane == 0 and self._meta_bytes:
            tags += [50838, 50839]
        return tags

    def _values(self, plane: int) -> Values:
        strip_bytes = self.rows_per_strip * self.row_bytes
        last = self.plane_bytes - (self.strips - 1) * strip_bytes
        first = self.data_start + plane * self.plane_bytes

        def offsets(e0: int, e1: int) -> bytes:
            return (np.uint64(first) + np.arange(e0, e1, dtype=np.uint64) * np.uint64(strip_bytes)) \
                .astype("<u4").tobytes()

        def counts(e0: int, e1: int) -> bytes:
            out = np.full(e1 - e0, strip_bytes, dtype="<u4")
            if e1 == self.strips:
                out[-1] = last
            return out.tobytes()

        values: Values = {
            254: (LONG, 1, struct.pack("<I", 0)),
            256: (LONG, 1, struct.pack("<I", self.width)),
            257: (LONG, 1, struct.pack("<I", self.height)),
            258: (SHORT, 1, struct.pack("<H", 8 * self.itemsize)),
            259: (SHORT, 1, struct.pack("<H", 1)),
            262: (SHORT, 1, struct.pack("<H", 1)),
            273: (LONG, self.strips, offsets),
            277: (SHORT, 1, struct.pack("<H", 1)),
            278: (LONG, 1, struct.pack("<I", self.rows_per_strip)),
            279: (LONG, self.strips, counts),
            339: (SHORT, 1, struct.pack("<H", sample_format(self.dtype))),
        }
        if plane == 0:
            values[270] = (ASCII, len(self._description), self._description)
            if self._meta_bytes:
                values[50838] = (LONG, len(self._meta_counts), struct.pack(f"<{len(self._meta_counts)}I",
                                                                           *self._meta_counts))
                values[50839] = (BYTE, len(self._meta_bytes), self._meta_bytes)
        if self._xres is not None:
            xn, xd, yn, yd = self._xres
            values[282] = (RATIONAL, 1, struct.pack("<II", xn, xd))
            values[283] = (RATIONAL, 1, struct.pack("<II", yn, yd))
            values[296] = (SHORT, 1, struct.pack("<H", 1))  # none: the unit is the description's
        return values

    def ifd_at(self, plane: int) -> int:
        head = self._fmt.head_size
        return head if plane == 0 else head + self._first_block + (plane - 1) * self._block

    def _render(self, start: int, stop: int) -> bytes:
        """Header bytes [start, stop), built from the IFD blocks they cover only."""
        stop = min(stop, self.header_size)
        if start >= stop:
            return b""
        out = bytearray(stop - start)
        head = self._fmt.head_size
        if start < head:
            piece = self._fmt.file_header(head)[start:stop]
            out[: len(piece)] = piece
        pos = max(start, head)
        while pos < stop:
            plane = 0 if pos < head + self._first_block else 1 + (pos - head - self._first_block) // self._block
            at = self.ifd_at(plane)
            size = self._first_block if plane == 0 else self._block
            end = min(stop, at + size)
            nxt = self.ifd_at(plane + 1) if plane + 1 < self.planes else 0
            piece = ifd_block(self._fmt, at, self._values(plane), self._tags(plane), nxt, pos - at, end - at)
            out[pos - start : end - start] = piece
            pos = end
        return bytes(out)

    def header_bytes(self, start: int, stop: int) -> bytes:
        if self._header is None and self.header_size <= _HEADER_KEPT:
            with self._header_lock:
                if self._header is None:
                    self._header = self._render(0, self.header_size)
        if self._header is not None:
            return self._header[start:stop]
        return self._render(start, stop)

    # -- what the owner asks -----------------------------------------------------------------
    @property
    def description(self) -> bytes:
        return self._description

    @property
    def version(self) -> tuple[int, tuple[int, ...]]:
        """Changes when the bytes may have (another file object, or a chunk written)."""
        return self._serial, (self.array.data_version,)

    @property
    def stale(self) -> bool:
        return self._failed is not None

    def same_layout(self, other: Any) -> bool:
        """Whether `other` has byte-for-byte the same header (no data-dependent number in it)."""
        return isinstance(other, StrippedImage) and self._layout_key() == other._layout_key()

    def _layout_key(self) -> tuple[Any, ...]:
        return (self.size, self.shape, self.dtype.str, self.rows_per_strip, self._description,
                self._meta_bytes, self._xres, self._file_lead)

    def settle(self) -> None:
        """Nothing to decide: every strip is decoded, its byte count known from the shape."""

    def pushes_after(self, offset: int, size: int) -> list[tuple[int, int]]:
        """Nothing is pushed ahead: the kernel's read-ahead follows the rows."""
        return []

    pushes_before_read = False

    def push_wanted(self, offset: int) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name, "size": self.size, "bigtiff": False, "levels": 1, "planes": self.planes,
            "tiles": self.planes * self.strips, "tile_shape": [[self.rows_per_strip, self.width]],
            "level_shapes": [list(self.array.source.shape)], "mode": ["decoded (strips)"], "ome": False,
        }  # fmt: skip

    # -- bytes ----------------------------------------------------------------------------

    def _read(self, offset: int, size: int, *, blocking: bool) -> bytes | None:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        pieces: list[bytes] = []
        pos = offset
        if pos < self.header_size:
            if self._header is None and not blocking:
                return None  # built (or, past _HEADER_KEPT, rendered per read) in a worker thread
            stop = min(end, self.header_size)
            pieces.append(self.header_bytes(pos, stop))
            pos = stop
        if pos < min(end, self.data_start):
            stop = min(end, self.data_start)
            pieces.append(bytes(stop - pos))
            pos = stop
        data_end = self.data_start + self.planes * self.plane_bytes
        while pos < min(end, data_end):
            plane, within = divmod(pos - self.data_start, self.plane_bytes)
            stop = min(end, data_end, pos - within + self.plane_bytes)
            piece = self._plane_bytes(plane, within, within + stop - pos, blocking)
            if piece is None:
                return None
            pieces.append(piece)
            pos = stop
        if pos < end:
            pieces.append(bytes(end - pos))  # the trailer's zeros
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _plane_bytes(self, plane: int, a: int, b: int, blocking: bool) -> bytes | None:
        """Bytes [a, b) of plane `plane` (file order), from the chunks they cover only."""
        isz, width = self.itemsize, self.width
        p0, p1 = a // isz, -(-b // isz)
        r0, c0 = divmod(p0, width)
        r1, c1 = divmod(p1 - 1, width)
        c1 += 1
        if r0 == r1:
            rects = [(r0, r0 + 1, c0, c1)]
        else:
            rects = [(r0, r0 + 1, c0, width)]
            if r1 > r0 + 1:
                rects.append((r0 + 1, r1, 0, width))
            rects.append((r1, r1 + 1, 0, c1))
        lead = self._array_lead(plane)
        parts = []
        for rect in rects:
            values = self._rect(lead, *rect, blocking)
            if values is None:
                return None
            parts.append(values.tobytes())
        data = b"".join(parts)
        return data[a - p0 * isz : b - p0 * isz]

    def _array_lead(self, plane: int) -> tuple[int, ...]:
        """The array's leading index of the file's plane `plane`."""
        file_shape = [self.lead[i] for i in self._file_lead]
        file_index = unravel(plane, file_shape)
        out = [0] * len(self.lead)
        for j, axis in enumerate(self._file_lead):
            out[axis] = file_index[j]
        return tuple(out)

    def _rect(self, lead: tuple[int, ...], y0: int, y1: int, x0: int, x1: int, blocking: bool) -> np.ndarray | None:
        """Rows [y0, y1) and columns [x0, x1) of the plane at the array's `lead` index."""
        arr = self.array
        out = np.full((y1 - y0, x1 - x0), fill_value_of(arr), dtype=self.pixel_dtype)
        lead_chunk = tuple(i // c for i, c in zip(lead, self.chunk_lead, strict=True))
        lead_in = tuple(i % c for i, c in zip(lead, self.chunk_lead, strict=True))
        crop = crop_edges(arr)
        for cy in range(y0 // self.chunk_h, (y1 - 1) // self.chunk_h + 1):
            for cx in range(x0 // self.chunk_w, (x1 - 1) // self.chunk_w + 1):
                coords = self.axes.chunk_coords(lead_chunk, cy, cx)
                raw = None
                if not blocking:
                    raw = arr.cached_pixels(coords)
                    if raw is None:
                        return None
                values = chunk_plane(arr, self.axes, coords, lead_in, self.pixel_dtype, crop, raw)
                ys, xs = cy * self.chunk_h, cx * self.chunk_w
                a0, a1 = max(y0, ys), min(y1, ys + values.shape[0])
                b0, b1 = max(x0, xs), min(x1, xs + values.shape[1])
                if a0 < a1 and b0 < b1:
                    out[a0 - y0 : a1 - y0, b0 - x0 : b1 - x0] = values[a0 - ys : a1 - ys, b0 - xs : b1 - xs]
        return out


def _fit(values: Any, ndim: int) -> list[Any] | None:
    """An OME-Zarr per-axis list, if it has one entry per axis."""
    return list(values) if isinstance(values, (list, tuple)) and len(values) == ndim else None
