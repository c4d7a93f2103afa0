"""The one TIFF IFD encoder: the chunk files' headers (`tiff.py`) and the whole-image
files' (`whole_image/header.py`) are both written with it. Pure functions, no I/O.

Little endian ("II") only. Classic TIFF (16-bit entry counts, 32-bit offsets,
12-byte entries) or BigTIFF (64-bit counts and offsets, 20-byte entries): an
`IfdFormat`. An IFD is its entry count, its entries in the order given (callers
give them sorted by tag), then the next IFD's offset (0: the last). A value
longer than an entry's value field is stored out of line, at an offset the
caller chooses with `place_values` (one after another, each at an even offset,
as TIFF wants words to start on word boundaries); a shorter one sits in the
field, zero padded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CLASSIC_LIMIT = 2**32 - 1  # largest file a classic TIFF can address

# TIFF field types
ASCII, SHORT, LONG, RATIONAL, LONG8 = 2, 3, 4, 5, 16

# Compression values zfuse writes
COMPRESSION_NONE, COMPRESSION_DEFLATE = 1, 8

# SampleFormat per NumPy kind (bool is unsigned 8-bit)
SAMPLE_FORMAT = {"b": 1, "u": 1, "i": 2, "f": 3, "c": 6}


@dataclass(frozen=True)
class IfdFormat:
    """Sizes and struct formats of classic TIFF or BigTIFF."""

    bigtiff: bool
    count_fmt: str  # an IFD's entry count
    offset_fmt: str  # offsets, value counts and the next-IFD link
    entry_size: int
    inline: int  # bytes of an entry's value field
    offset_type: int  # the field type of offsets (LONG or LONG8)
    head_size: int  # the file header
    uint: np.dtype  # offsets as a NumPy dtype

    @property
    def count_size(self) -> int:
        return struct.calcsize(self.count_fmt)

    @property
    def offset_size(self) -> int:
        return struct.calcsize(self.offset_fmt)

    def ifd_size(self, entries: int) -> int:
        """Bytes of an IFD of `entries` entries, without its out-of-line values."""
        return self.count_size + entries * self.entry_size + self.offset_size

    def file_header(self, first_ifd: int) -> bytes:
        """The 8 (classic) or 16 (BigTIFF) bytes that start the file."""
        if self.bigtiff:
            return b"II" + struct.pack("<HHHQ", 43, 8, 0, first_ifd)
        return b"II" + struct.pack("<HI", 42, first_ifd)


CLASSIC = IfdFormat(False, "<H", "<I", 12, 4, LONG, 8, np.dtype("<u4"))
BIGTIFF = IfdFormat(True, "<Q", "<Q", 20, 8, LONG8, 16, np.dtype("<u8"))


def ifd_format(bigtiff: bool) -> IfdFormat:
    return BIGTIFF if bigtiff else CLASSIC


def even(n: int, to: int = 2) -> int:
    """`n` rounded up to a multiple of `to`."""
    return -(-n // to) * to


def sample_format(dtype: np.dtype) -> int:
    """The SampleFormat of a dtype TIFF can hold (see `tiff.tiff_unsupported_reason`)."""
    return SAMPLE_FORMAT[np.dtype(dtype).kind]


def place_values(fmt: IfdFormat, lengths: Iterable[tuple[int, int]], start: int) -> tuple[dict[int, int], int]:
    """Where the out-of-line values go: of (tag, length) in the order given, those
    longer than an entry's value field, one after another from `start`, each at an
    even offset. ({tag: offset}, the end of the last)."""
    placed: dict[int, int] = {}
    at = start
    for tag, length in lengths:
        if length > fmt.inline:
            placed[tag] = at
            at += even(length)
    return placed, at


def pack_ifd(
    fmt: IfdFormat,
    entries: Sequence[tuple[int, int, int, bytes | None]],
    outside: Mapping[int, int],
    next_ifd: int,
) -> bytearray:
    """An IFD's bytes: entries (tag, type, count, value), then the link to the next IFD.

    A value that fits the entry's field is written there (zero padded); a longer one,
    or None (a value the caller writes itself), is pointed to at `outside[tag]`."""
    inline, off_fmt = fmt.inline, fmt.offset_fmt
    out = bytearray(struct.pack(fmt.count_fmt, len(entries)))
    for tag, typ, count, value in entries:
        out += struct.pack("<HH", tag, typ) + struct.pack(off_fmt, count)
        if value is not None and len(value) <= inline:
            out += value.ljust(inline, b"\0")
        else:
            out += struct.pack(off_fmt, outside[tag])
    out += struct.pack(off_fmt, next_ifd)
    return out
