"""Is a TIFF written so far complete, or only the beginning of one? Pure, no I/O.

Writers such as Bio-Formats close and reopen a file while writing it: the
first `close()` sees a header whose IFDs or strips point past the end. Such a
file is *incomplete*, not invalid: the write layer keeps it pending instead of
refusing it. `incomplete_reason` decides, from the IFD chain alone:

- a prefix of a TIFF header (including the empty file) is incomplete;
- an IFD, a tag value, or a strip/tile that lies past the end is incomplete;
- fewer image planes than the chunk holds (with the chunk's rows and columns)
  is incomplete;
- anything else (not a TIFF at all, or complete) is for `decode_tiff` to
  accept or refuse: this module never refuses.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence

__all__ = ["incomplete_reason"]

_MAGICS = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4,
               16: 8, 17: 8, 18: 8}
_NEW_SUBFILE_TYPE, _WIDTH, _LENGTH = 254, 256, 257
_STRIP_OFFSETS, _STRIP_COUNTS, _SAMPLES, _PLANAR = 273, 279, 277, 284
_TILE_OFFSETS, _TILE_COUNTS, _IMAGE_DEPTH = 324, 325, 32997
_DESCRIPTION, _BITS = 270, 258
_IMAGEJ_IMAGES = re.compile(rb"ImageJ=.*?\bimages=(\d+)", re.S)
_MAX_IFDS = 1_000_000


def _planes_of(shape: Sequence[int]) -> tuple[int, int, int]:
    """(planes, rows, cols) as the header layer flattens a chunk."""
    if len(shape) == 0:
        return 1, 1, 1
    if len(shape) == 1:
        return 1, 1, int(shape[0])
    return math.prod(shape[:-2]), int(shape[-2]), int(shape[-1])


def incomplete_reason(data: bytes | bytearray | memoryview, chunk_shapes: Sequence[Sequence[int]]) -> str | None:
    """Why `data` is only the beginning of a TIFF of one of `chunk_shapes`, or None.

    None means: not recognisably incomplete (complete, or not a TIFF at all).
    """
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    size = len(view)
    head = bytes(view[:4])
    if size < 4:
        if any(m.startswith(head) for m in _MAGICS):
            return f"{size} bytes: the TIFF header is not written yet"
        return None
    if head not in _MAGICS:
        return None
    bo = "<" if head[:2] == b"II" else ">"
    big = head[2:] in (b"+\0", b"\0+")
    # struct formats of an IFD's entry count, an offset and a tag's value count; the
    # size of one IFD entry; where the first IFD offset is; bytes of a value held inline
    cnt, off, num, esize, first_at, inline = (("Q", "Q", "Q", 20, 8, 8) if big
                                              else ("H", "I", "I", 12, 4, 4))
    csize, osize = struct.calcsize(cnt), struct.calcsize(off)
    if first_at + osize > size:
        return f"{size} bytes: the TIFF header is not written yet"
    (offset,) = struct.unpack(bo + off, view[first_at : first_at + osize])
    planes = 0
    dims: tuple[int, int] | None = None
    imagej: tuple[int, int, int] | None = None  # (images, first data offset, bytes per plane)
    seen: set[int] = set()
    index = 0
    while offset and offset not in seen and len(seen) < _MAX_IFDS:
        seen.add(offset)
        if offset + csize > size:
            return f"IFD {index} starts at byte {offset}, past the {size} bytes written"
        (count,) = struct.unpack(bo + cnt, view[offset : offset + csize])
        end = offset + csize + count * esize + osize
        if end > size:
            return f"IFD {index} ends at byte {end}, past the {size} bytes written"
        tags: dict[int, list[int]] = {}
        for i in range(count):
            at = offset + csize + i * esize
            tag, typ = struct.unpack(bo + "HH", view[at : at + 4])
            (n,) = struct.unpack(bo + num, view[at + 4 : at + 4 + inline])
            nbytes = _TYPE_SIZES.get(typ, 1) * n
            value_at = at + 4 + inline
            if nbytes > inline:
                (value_at,) = struct.unpack(bo + off, view[value_at : value_at + osize])
                if value_at + nbytes > size:
                    return f"tag {tag} of IFD {index} points to byte {value_at + nbytes}, past the {size} bytes written"
            if tag == _DESCRIPTION and index == 0 and typ == 2:
                found = _IMAGEJ_IMAGES.search(bytes(view[value_at : value_at + min(nbytes, 4096)]))
                if found:
                    imagej = (int(found.group(1)), 0, 0)
            if tag in (_BITS, _NEW_SUBFILE_TYPE, _WIDTH, _LENGTH, _STRIP_OFFSETS, _STRIP_COUNTS, _SAMPLES,
                       _PLANAR, _TILE_OFFSETS, _TILE_COUNTS, _IMAGE_DEPTH) and typ in (3, 4, 16):
                fmt = {3: "H", 4: "I", 16: "Q"}[typ]
                if n > 10_000_000:
                    return None  # hostile; decode_tiff refuses it
                tags[tag] = list(struct.unpack(bo + fmt * n, view[value_at : value_at + nbytes]))
        offsets = tags.get(_STRIP_OFFSETS) or tags.get(_TILE_OFFSETS) or []
        counts = tags.get(_STRIP_COUNTS) or tags.get(_TILE_COUNTS) or []
        for o, c in zip(offsets, counts, strict=False):
            if c and o + c > size:
                return f"image data of IFD {index} ends at byte {o + c}, past the {size} bytes written"
        if not tags.get(_WIDTH) or not tags.get(_LENGTH):
            # every image IFD has a size: this one is still being written (zeros so far)
            return f"IFD {index} at byte {offset} has no image size yet ({count} entries)"
        reduced = bool((tags.get(_NEW_SUBFILE_TYPE) or [0])[0] & 1)
        if not reduced:
            depth = max((tags.get(_IMAGE_DEPTH) or [1])[0], 1)
            if (tags.get(_PLANAR) or [1])[0] == 2:
                depth *= (tags.get(_SAMPLES) or [1])[0]
            planes += depth
            if dims is None:
                dims = ((tags.get(_LENGTH) or [0])[0], (tags.get(_WIDTH) or [0])[0])
                if imagej is not None and offsets:
                    bits = (tags.get(_BITS) or [8])[0]
                    imagej = (imagej[0], offsets[0], dims[0] * dims[1] * max(bits // 8, 1))
        (offset,) = struct.unpack(bo + off, view[end - osize : end])
        index += 1
    if offset and offset not in seen:
        return None  # too many IFDs: decode_tiff refuses it
    wanted = [_planes_of(s) for s in chunk_shapes]
    if dims is None:
        return "no image written yet (no IFD)"
    fits = [p for p, r, c in wanted if (r, c) == dims]
    if imagej is not None and planes == 1 and imagej[0] > 1 and imagej[2]:
        # ImageJ's one-IFD stacks: `images=N` planes follow the first contiguously
        images, start, plane = imagej
        if start + images * plane > size:
            return f"ImageJ stack of {images} images ends at byte {start + images * plane}, past the {size} bytes written"
        planes = images
    if fits and planes < min(fits):
        return f"{planes} of {min(fits)} image plane(s) written"
    return None
