"""Is a TIFF written so far complete, only the beginning of one, or hostile? Pure, no I/O.

Writers such as Bio-Formats close and reopen a file while writing it: the
first `close()` sees a header whose IFDs or strips point past the end. Such a
file is *incomplete*, not invalid: the write layer keeps it pending instead of
refusing it. `walk_tiff` walks the IFD chain once, with bounded work, and
decides:

- a prefix of a TIFF header (including the empty file) is incomplete;
- an IFD, a tag value, or a strip/tile that lies past the end (but within the
  largest file the chunk may have, `max_size`) is incomplete;
- fewer image planes than the chunk holds (with the chunk's rows and columns)
  is incomplete;
- a *structure problem* is a file no amount of further writing makes a chunk:
  an IFD chain that loops, more IFDs than the chunk has planes allow, tags or
  data that reach past `max_size`, or IFDs and tag values that claim more
  bytes than the file has (twice over, for shared values: well-formed files
  never overlap their structures). `decode_tiff` refuses those before any
  other parse, so a crafted file costs at most a walk of its own bytes;
- anything else (not a TIFF at all, or complete) is for `decode_tiff` to
  accept or refuse.

Work and memory are bounded by the file's size: every IFD is visited once,
at most `max_ifds(chunk_shapes)` of them, and tag values are read (as numpy
views, no Python object per value) only while the bytes they claim stay
within the budget.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zfuse.view.tiff import flatten, samples_fit

__all__ = ["EARLY_LOOKS", "EarlyCheck", "TiffWalk", "early_refusal", "incomplete_reason", "max_ifds", "walk_tiff"]

_MAGICS = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4,
               16: 8, 17: 8, 18: 8}
_NEW_SUBFILE_TYPE, _WIDTH, _LENGTH = 254, 256, 257
_STRIP_OFFSETS, _STRIP_COUNTS, _SAMPLES, _PLANAR = 273, 279, 277, 284
_TILE_OFFSETS, _TILE_COUNTS, _IMAGE_DEPTH = 324, 325, 32997
_DESCRIPTION, _BITS = 270, 258
_READ_TAGS = frozenset({_BITS, _NEW_SUBFILE_TYPE, _WIDTH, _LENGTH, _STRIP_OFFSETS, _STRIP_COUNTS,
                        _SAMPLES, _PLANAR, _TILE_OFFSETS, _TILE_COUNTS, _IMAGE_DEPTH})
_INT_DTYPES = {3: "u2", 4: "u4", 16: "u8"}
_IMAGEJ_IMAGES = re.compile(rb"ImageJ=.*?\bimages=(\d+)", re.S)
#: IFDs allowed when the chunk is not known (error messages only): the budget of
#: claimed bytes bounds the walk as well
_MAX_IFDS_UNKNOWN = 100_000
#: bytes of structure (IFD tables and out-of-line tag values) a file may claim
#: beyond twice its size
_CLAIM_SLACK = 64 * 1024


def max_ifds(chunk_shapes: Sequence[Sequence[int]]) -> int:
    """The most IFDs a TIFF of one of `chunk_shapes` may have: one per plane, as many
    again for reduced-resolution pages (thumbnails), and a few to spare."""
    if not chunk_shapes:
        return _MAX_IFDS_UNKNOWN
    planes = max(flatten(s)[0] for s in chunk_shapes)
    return 2 * planes + 16


@dataclass(frozen=True)
class TiffWalk:
    """What one bounded walk of a TIFF's IFD chain found."""

    incomplete: str | None = None  # why it is only the beginning of a TIFF
    problem: str | None = None  # why no further writing makes it a chunk (refuse)
    deferred: bool = False  # stopped at `max_entries`: nothing decided, walk it all elsewhere


def incomplete_reason(data: bytes | bytearray | memoryview, chunk_shapes: Sequence[Sequence[int]],
                      max_size: int | None = None) -> str | None:
    """Why `data` is only the beginning of a TIFF of one of `chunk_shapes`, or None.

    None means: not recognisably incomplete (complete, not a TIFF at all, or a
    structure problem, which `decode_tiff` refuses).
    """
    return walk_tiff(data, chunk_shapes, max_size).incomplete


def walk_tiff(data: bytes | bytearray | memoryview, chunk_shapes: Sequence[Sequence[int]],
              max_size: int | None = None, max_entries: int | None = None) -> TiffWalk:
    """Walk `data`'s IFD chain once, with work bounded by its size (see the module doc).

    `max_size`: the largest file the chunk may have; anything claimed past it is a
    problem, not an incomplete file. None: only the file's own size bounds it.
    `max_entries`: stop (`deferred`) rather than read more IFD entries than that: a
    caller on an event loop decides small files at once and walks the rest in a thread.
    """
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    size = len(view)
    head = bytes(view[:4])
    if size < 4:
        if any(m.startswith(head) for m in _MAGICS):
            return TiffWalk(incomplete=f"{size} bytes: the TIFF header is not written yet")
        return TiffWalk()
    if head not in _MAGICS:
        return TiffWalk()
    bo = "<" if head[:2] == b"II" else ">"
    big = head[2:] in (b"+\0", b"\0+")
    # struct formats of an IFD's entry count, an offset and a tag's value count; the
    # size of one IFD entry; where the first IFD offset is; bytes of a value held inline
    cnt, off, num, esize, first_at, inline = (("Q", "Q", "Q", 20, 8, 8) if big
                                              else ("H", "I", "I", 12, 4, 4))
    csize, osize = struct.calcsize(cnt), struct.calcsize(off)
    if first_at + osize > size:
        return TiffWalk(incomplete=f"{size} bytes: the TIFF header is not written yet")
    limit = max(size, max_size) if max_size is not None else None
    ifd_limit = max_ifds(chunk_shapes)
    budget = 2 * size + _CLAIM_SLACK  # bytes of structure the walk may read

    def past(end: int, what: str) -> TiffWalk:
        """`what` ends at byte `end`, past what is written: incomplete, unless no file
        of the chunk may reach that far."""
        if limit is not None and end > limit:
            return TiffWalk(problem=f"{what} ends at byte {end}, past the {limit} bytes "
                            "a TIFF of this chunk may have")
        return TiffWalk(incomplete=f"{what} ends at byte {end}, past the {size} bytes written")

    (offset,) = struct.unpack(bo + off, view[first_at : first_at + osize])
    planes = 0
    dims: tuple[int, int] | None = None
    imagej: tuple[int, int, int] | None = None  # (images, first data offset, bytes per plane)
    seen: dict[int, int] = {}
    index = 0
    while offset:
        if offset in seen:
            return TiffWalk(problem=f"the IFD chain loops: IFD {index - 1} points back to "
                            f"IFD {seen[offset]} at byte {offset}")
        if index >= ifd_limit:
            return TiffWalk(problem=f"more than {ifd_limit} IFDs (pages): a TIFF of this chunk "
                            "has at most one per plane, and as many reduced-resolution ones")
        seen[offset] = index
        if offset + csize > size:
            return past(offset + csize, f"IFD {index}")
        (count,) = struct.unpack(bo + cnt, view[offset : offset + csize])
        end = offset + csize + count * esize + osize
        if end > size:
            return past(end, f"IFD {index} ({count} entries)")
        if max_entries is not None:
            max_entries -= count
            if max_entries < 0:
                return TiffWalk(deferred=True)
        budget -= end - offset
        if budget < 0:
            return TiffWalk(problem=f"IFD {index}: the IFDs and tag values claim more than twice "
                            f"the file's {size} bytes (overlapping structures)")
        tags: dict[int, np.ndarray] = {}
        for i in range(count):
            at = offset + csize + i * esize
            tag, typ = struct.unpack(bo + "HH", view[at : at + 4])
            (n,) = struct.unpack(bo + num, view[at + 4 : at + 4 + inline])
            nbytes = _TYPE_SIZES.get(typ, 1) * n
            value_at = at + 4 + inline
            if nbytes > inline:
                (value_at,) = struct.unpack(bo + off, view[value_at : value_at + osize])
                if value_at + nbytes > size:
                    return past(value_at + nbytes, f"tag {tag} of IFD {index} ({n} values)")
                budget -= nbytes
                if budget < 0:
                    return TiffWalk(problem=f"tag {tag} of IFD {index}: the IFDs and tag values claim "
                                    f"more than twice the file's {size} bytes (overlapping structures)")
            if tag == _DESCRIPTION and index == 0 and typ == 2:
                found = _IMAGEJ_IMAGES.search(bytes(view[value_at : value_at + min(nbytes, 4096)]))
                if found:
                    imagej = (int(found.group(1)), 0, 0)
            if tag in _READ_TAGS and typ in _INT_DTYPES and n:
                tags[tag] = np.frombuffer(view, dtype=bo + _INT_DTYPES[typ], count=n, offset=value_at)
        offsets = tags.get(_STRIP_OFFSETS, tags.get(_TILE_OFFSETS))
        counts = tags.get(_STRIP_COUNTS, tags.get(_TILE_COUNTS))
        if offsets is not None and counts is not None:
            n = min(len(offsets), len(counts))
            ends = offsets[:n].astype(np.uint64) + counts[:n].astype(np.uint64)
            ends[counts[:n] == 0] = 0
            if n and int(ends.max()) > size:
                return past(int(ends.max()), f"image data of IFD {index}")

        def first(tag: int, default: int, tags: dict[int, np.ndarray] = tags) -> int:
            values = tags.get(tag)
            return int(values[0]) if values is not None else default

        if not first(_WIDTH, 0) or not first(_LENGTH, 0):
            # every image IFD has a size: this one is still being written (zeros so far)
            return TiffWalk(incomplete=f"IFD {index} at byte {offset} has no image size yet ({count} entries)")
        if not first(_NEW_SUBFILE_TYPE, 0) & 1:  # not a reduced-resolution page
            # samples per pixel are planes too, interleaved or separate (`tiff_input._planes`)
            depth = max(first(_IMAGE_DEPTH, 1), 1) * max(first(_SAMPLES, 1), 1)
            planes += depth
            if dims is None:
                dims = (first(_LENGTH, 0), first(_WIDTH, 0))
                if imagej is not None and offsets is not None and len(offsets):
                    bits = first(_BITS, 8)
                    imagej = (imagej[0], int(offsets[0]), dims[0] * dims[1] * max(bits // 8, 1))
        (offset,) = struct.unpack(bo + off, view[end - osize : end])
        index += 1
    if dims is None:
        return TiffWalk(incomplete="no image written yet (no IFD)")
    wanted = [flatten(s) for s in chunk_shapes]
    fits = [p for p, r, c in wanted if (r, c) == dims]
    if imagej is not None and planes == 1 and imagej[0] > 1 and imagej[2]:
        # ImageJ's one-IFD stacks: `images=N` planes follow the first contiguously
        images, start, plane = imagej
        if start + images * plane > size:
            found = past(start + images * plane, f"ImageJ stack of {images} images")
            return TiffWalk(incomplete=found.incomplete, problem=found.problem)
        planes = images
    if fits and planes < min(fits):
        return TiffWalk(incomplete=f"{planes} of {min(fits)} image plane(s) written")
    return TiffWalk()


_SAMPLE_FORMAT = 339
#: full looks at a written IFD whose size or sample type is not set yet before the
#: write path stops looking (close() judges the file): bounded work per file
EARLY_LOOKS = 16


class EarlyCheck(NamedTuple):
    """What `early_refusal` found: `decided` (no need to look again), `looked` (the
    whole first IFD was read: the caller counts these), `reason` (refuse the file)."""

    decided: bool
    looked: bool
    reason: str | None


_LATER = EarlyCheck(False, False, None)
_FORMAT_KINDS = {1: "u", 2: "i", 3: "f", 6: "c"}


def early_refusal(data: bytes | bytearray | memoryview, chunk_shapes: Sequence[Sequence[int]],
                  dtype: np.dtype) -> EarlyCheck:
    """Whether the first IFD is all written with its image size and
    sample type set, and if so why it can never be a chunk of `chunk_shapes` and
    `dtype` (None: it can). Reads one IFD with numpy (no Python object per entry), so
    a writer can be refused at the write that completes the IFD instead of at close,
    which some writers never report (tifffile ignores close()'s error). Constant work
    until the IFD's entries are all there; the caller bounds how often it looks after
    that (`EARLY_LOOKS`)

    Only what decode_tiff refuses whatever follows counts: pixel size (the plane's rows
    and columns; a reduced-resolution first page decides nothing), bits per sample and
    sample format kind (an int16 chunk takes ImageJ's uint16 form, a bool chunk 1-bit
    or 8-bit unsigned), interleaved samples.
    """
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    head = bytes(view[:4])
    if len(view) >= 4 and head not in _MAGICS:
        return EarlyCheck(True, False, None)  # not a TIFF: close() says so
    if len(view) < 16:
        return _LATER
    bo = "<" if head[:2] == b"II" else ">"
    big = head[2:] in (b"+\0", b"\0+")
    cnt, off, csize, esize, first_at = ("Q", "Q", 8, 20, 8) if big else ("H", "I", 2, 12, 4)
    inline_size = 8 if big else 4
    (offset,) = struct.unpack_from(bo + off, view, first_at)
    if not offset or offset + csize > len(view):
        return _LATER
    (count,) = struct.unpack_from(bo + cnt, view, offset)
    if not count or offset + csize + count * esize > len(view):
        return _LATER  # zeros so far (tifffile writes pixels before the IFD), or cut off
    entries = np.frombuffer(view, dtype=np.dtype([
        ("tag", bo + "u2"), ("type", bo + "u2"), ("count", bo + ("u8" if big else "u4")),
        ("value", f"V{inline_size}")]), count=count, offset=offset + csize)
    formats = {3: "H", 4: "I", 16: "Q"}

    def first(tag: int, default: int) -> int | None:
        """The tag's first value; None if it is not an integer or not written yet."""
        found = np.flatnonzero(entries["tag"] == tag)
        if not len(found):
            return default
        entry = entries[found[0]]
        fmt = formats.get(int(entry["type"]))
        if fmt is None or not int(entry["count"]):
            return None
        raw = entry["value"].tobytes()
        if struct.calcsize(fmt) * int(entry["count"]) <= inline_size:
            return struct.unpack_from(bo + fmt, raw)[0]
        (at,) = struct.unpack_from(bo + off, raw)
        if at + struct.calcsize(fmt) > len(view):
            return None
        return struct.unpack_from(bo + fmt, view, at)[0]

    width, length, bits = first(_WIDTH, 0), first(_LENGTH, 0), first(_BITS, 0)
    spp, planar, fmt = first(_SAMPLES, 1), first(_PLANAR, 1), first(_SAMPLE_FORMAT, 1)
    if not width or not length or not bits or None in (spp, planar, fmt):
        return EarlyCheck(False, True, None)  # not set yet: writers fill IFDs in later
    if (first(_NEW_SUBFILE_TYPE, 0) or 0) & 1:
        return EarlyCheck(True, True, None)
    planes = [flatten(s) for s in chunk_shapes]
    if spp > 1 and planar != 2 and chunk_shapes and not any(samples_fit(s, spp) for s in chunk_shapes):
        # (samples are planes, the fastest: an RGB image is a chunk's 3 channels)
        held = " or ".join(dict.fromkeys(str(tuple(s)) for s in chunk_shapes))
        return EarlyCheck(True, True, f"the image has {spp} samples per pixel (RGB or multi-channel); "
                f"the chunk's fastest planes are not {spp} of them (its file's shape: {held})")
    if planes and all((r, c) != (length, width) for _, r, c in planes):
        sizes = " or ".join(f"{r}x{c}" for _, r, c in planes)
        return EarlyCheck(True, True, f"wrong shape: the image is {length}x{width} (rows x columns), "
                f"the chunk's planes are {sizes}")
    kind = _FORMAT_KINDS.get(fmt or 1)
    want_bits = dtype.itemsize * 8
    if dtype.kind == "b":
        ok = kind == "u" and bits in (1, 8)
    elif dtype.kind == "i" and dtype.itemsize == 2:
        ok = bits == 16 and kind in ("i", "u")  # ImageJ's signed 16-bit is uint16 + 32768
    else:
        ok = bits == want_bits and kind == dtype.kind
    if not ok:
        names = {"u": "uint", "i": "int", "f": "float", "c": "complex"}
        got = f"{names[kind]}{bits}" if kind in names and bits % 8 == 0 else f"{bits}-bit (sample format {fmt})"
        name = "bool" if dtype.kind == "b" else dtype.newbyteorder("=").name
        return EarlyCheck(True, True, f"wrong dtype: the image has {got} pixels, the chunk is {name}; "
                f"save the TIFF as {name} (zfuse does not convert)")
    return EarlyCheck(True, True, None)
