"""The header of a whole-image file: its IFDs, written with the shared IFD encoder
(`view/tiff_ifd.py`) from the `FileLayout`, the levels' compression (decoded or
passed through) and their tile byte counts (`Counts`).

Decoded tiles: uncompressed, byte count = tile bytes, so the header holds no
data-dependent number. Passthrough tiles: the byte counts are the stored
sizes. A header is rendered by byte range (`render`): a tile offset or byte
count is computed when the bytes holding it are read, so memory and time follow
the bytes read, never the number of tiles.

Bytes only: no store, no tiles, no FUSE.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from zfuse.view.tiff_ifd import (
    ASCII,
    COMPRESSION_NONE,
    LONG,
    RATIONAL,
    SHORT,
    IfdFormat,
    ifd_format,
    pack_ifd,
    place_values,
    sample_format,
)
from zfuse.view.whole_image.layout import FileLayout


class Counts:
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
        return (isinstance(other, Counts) and self.default == other.default
                and np.array_equal(self.indexes, other.indexes) and np.array_equal(self.values, other.values))

    __hash__ = None  # type: ignore[assignment]


def render(layout: FileLayout, dtype: np.dtype, modes: Sequence[int | None], counts: Sequence[Counts],
           start: int, stop: int) -> bytes:
    """Bytes [start, stop) of the header, built from the IFD blocks they cover only:
    a tile offset or byte count is computed when the bytes holding it are read, so
    memory and time follow the bytes read, never the number of tiles."""
    stop = min(stop, layout.header_size)
    if start >= stop:
        return b""
    out = bytearray(stop - start)
    fmt = ifd_format(layout.bigtiff)
    head = fmt.head_size
    if start < head:
        first = fmt.file_header(layout.ifd_at(0, 0))
        piece = first[start : min(stop, head)]
        out[: len(piece)] = piece
    pos = max(start, head)
    per_plane = sum(layout.blocks)
    while pos < stop:
        # the IFD block holding `pos`: block (0, 0) is `_first_extra` longer, which
        # moves every later block by as much
        rel = pos - head
        if rel < layout.blocks[0] + layout.first_extra:
            plane, level = 0, 0
        else:  # counted from where block (0, 0) would end without its extra
            plane, within = divmod(rel - layout.first_extra, per_plane)
            level = 0
            while within >= layout.blocks[level]:
                within -= layout.blocks[level]
                level += 1
        at = layout.ifd_at(plane, level)
        size = layout.blocks[level] + (layout.first_extra if (plane, level) == (0, 0) else 0)
        end = min(stop, at + size)
        assert at <= pos < end, (pos, plane, level)  # never loop without moving on
        piece = _block_bytes(layout, dtype, modes, counts, plane, level, pos - at, end - at)
        out[pos - start : pos - start + len(piece)] = piece  # the rest: padding, zeros
        pos = end
    return bytes(out)


def _block_bytes(layout: FileLayout, dtype: np.dtype, modes: Sequence[int | None], counts_of: Sequence[Counts],
                 plane: int, k: int, lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of the IFD block of (plane, level k), relative to its start:
    the entries, then the values that do not fit in them, each at an even offset."""
    fmt = ifd_format(layout.bigtiff)
    otype, uint = fmt.offset_type, fmt.uint
    lv = layout.levels[k]
    nlev = len(layout.levels)
    first = plane == 0 and k == 0
    at = layout.ifd_at(plane, k)
    tags = layout.entries(k, first)
    first_slot = layout.slot_offset(k, plane, 0)
    counts = counts_of[k]
    base = plane * lv.tiles

    def offsets(e0: int, e1: int) -> bytes:
        return (np.uint64(first_slot) + np.arange(e0, e1, dtype=np.uint64) * np.uint64(lv.slot)) \
            .astype(uint).tobytes()

    def byte_counts(e0: int, e1: int) -> bytes:
        return counts.slice(base + e0, e1 - e0).astype(uint).tobytes()

    # tag -> (type, count, bytes if small, or (length, maker of elements [e0, e1)) if not)
    n = layout.samples
    values: Values = {
        254: (LONG, 1, struct.pack("<I", 0 if k == 0 else 1)),
        256: (LONG, 1, struct.pack("<I", lv.width)),
        257: (LONG, 1, struct.pack("<I", lv.height)),
        258: (SHORT, n, struct.pack(f"<{n}H", *[8 * dtype.itemsize] * n)),
        259: (SHORT, 1, struct.pack("<H", modes[k] or COMPRESSION_NONE)),
        262: (SHORT, 1, struct.pack("<H", 2 if n == 3 else 1)),  # RGB, or BlackIsZero
        277: (SHORT, 1, struct.pack("<H", n)),
        284: (SHORT, 1, struct.pack("<H", 1)),  # interleaved (chunky)
        322: (LONG, 1, struct.pack("<I", lv.tile_w)),
        323: (LONG, 1, struct.pack("<I", lv.tile_h)),
        324: (otype, lv.tiles, offsets),
        325: (otype, lv.tiles, byte_counts),
        339: (SHORT, n, struct.pack(f"<{n}H", *[sample_format(dtype)] * n)),
    }
    if 270 in tags:
        values[270] = (ASCII, len(layout.description), layout.description)
    resolution = layout.resolutions[k]
    if resolution is not None:
        xn, xd, yn, yd = resolution
        values[282] = (RATIONAL, 1, struct.pack("<II", xn, xd))
        values[283] = (RATIONAL, 1, struct.pack("<II", yn, yd))
        values[296] = (SHORT, 1, struct.pack("<H", 3))  # centimetre
    if 330 in tags:
        subs = [layout.ifd_at(plane, j) for j in range(1, nlev)]
        values[330] = (otype, nlev - 1, np.array(subs, dtype=uint).tobytes())
    if layout.successive:  # the levels one after another in the main chain
        nxt = layout.ifd_at(0, k + 1) if k + 1 < nlev else 0
    else:
        nxt = layout.ifd_at(plane + 1, 0) if k == 0 and plane + 1 < layout.planes else 0
    return ifd_block(fmt, at, values, tags, nxt, lo, hi)


# An IFD's values: tag -> (type, count, bytes), or for a long array (type, count, maker
# of elements [e0, e1) as bytes), so a read builds only the elements it covers.
Values = dict[int, tuple[int, int, Any]]


def _lengths(fmt: IfdFormat, values: Values, tags: Sequence[int]) -> list[tuple[int, int]]:
    return [(tag, values[tag][1] * fmt.offset_size if callable(values[tag][2]) else len(values[tag][2]))
            for tag in tags]


def ifd_block_size(fmt: IfdFormat, values: Values, tags: Sequence[int]) -> int:
    """Bytes of an IFD block: its entries, then the values that do not fit in them."""
    _, end = place_values(fmt, _lengths(fmt, values, tags), fmt.ifd_size(len(tags)))
    return end


def ifd_block(fmt: IfdFormat, at: int, values: Values, tags: Sequence[int], next_ifd: int,
              lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of the IFD block at file offset `at`, relative to its start: the
    entries (`tags`, in order), then the values that do not fit in them, each at an
    even offset. A maker's elements are built for the bytes asked only."""
    osize = fmt.offset_size
    lengths = _lengths(fmt, values, tags)
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
    entries = pack_ifd(fmt, rows, placed, next_ifd)
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
