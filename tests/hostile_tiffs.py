"""Crafted TIFFs that attack the write path, shared by the FUSE-free and the mount tests.

Each builder returns the bytes of one classic little-endian TIFF made by hand
with struct (and imagecodecs for codec streams), small to write, costly to a
parser or decoder without bounds.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import imagecodecs
import numpy as np

SHORT, LONG = 3, 4
Entry = tuple[int, int, int, int]  # tag, type, count, value (inline) or offset


def ifd_bytes(entries: Sequence[Entry], next_ifd: int = 0) -> bytes:
    out = struct.pack("<H", len(entries))
    for tag, typ, count, value in sorted(entries):
        if typ == SHORT and count == 1:
            out += struct.pack("<HHIHH", tag, typ, count, value, 0)
        else:
            out += struct.pack("<HHII", tag, typ, count, value)
    return out + struct.pack("<I", next_ifd)


def image_entries(rows: int, cols: int, offset: int, nbytes: int, *, compression: int = 1,
                  bits: int = 8) -> list[Entry]:
    """One strip of a grayscale image at `offset`."""
    return [(256, SHORT, 1, cols), (257, SHORT, 1, rows), (258, SHORT, 1, bits),
            (259, SHORT, 1, compression), (262, SHORT, 1, 1), (273, LONG, 1, offset),
            (277, SHORT, 1, 1), (278, SHORT, 1, rows), (279, LONG, 1, nbytes)]


def one_strip(rows: int, cols: int, strip: bytes, *, compression: int = 1, bits: int = 8,
              count: int | None = None, next_ifd: int | None = None) -> bytes:
    """A TIFF of one image whose single strip is `strip` (byte count `count`, default its
    length); `next_ifd` None: the chain ends, else that offset (a loop if it is the IFD's)."""
    ifd_at = 8 + len(strip) + (len(strip) & 1)
    entries = image_entries(rows, cols, 8, len(strip) if count is None else count,
                            compression=compression, bits=bits)
    pad = b"\0" * (len(strip) & 1)
    nxt = 0 if next_ifd is None else (ifd_at if next_ifd == -1 else next_ifd)
    return b"II*\0" + struct.pack("<I", ifd_at) + strip + pad + ifd_bytes(entries, nxt)


def self_loop(rows: int, cols: int) -> bytes:
    """One IFD whose next-IFD offset points at itself."""
    return one_strip(rows, cols, bytes(rows * cols), next_ifd=-1)


def mutual_loop(rows: int, cols: int) -> bytes:
    """Two IFDs pointing at each other."""
    strip = bytes(rows * cols)
    first = 8 + len(strip) + (len(strip) & 1)
    entries = image_entries(rows, cols, 8, len(strip))
    second = first + len(ifd_bytes(entries))
    return (b"II*\0" + struct.pack("<I", first) + strip + b"\0" * (len(strip) & 1)
            + ifd_bytes(entries, second) + ifd_bytes(entries, first))


def huge_counts(region: int = 16 * 2**20, entries: int = 65535) -> bytes:
    """One IFD of `entries` entries, each claiming region/2 SHORT values at the same
    `region`-byte block: a parse that reads every value reads entries x region bytes."""
    table = [(tag, SHORT, region // 2, 8) for tag in range(1, entries + 1)]
    ifd_at = 8 + region
    return b"II*\0" + struct.pack("<I", ifd_at) + bytes(region) + ifd_bytes(table)


def many_pages(pages: int, rows: int = 1, cols: int = 1) -> bytes:
    """`pages` minimal one-pixel IFDs in a chain, sharing one strip."""
    entries = image_entries(rows, cols, 8, rows * cols)
    size = len(ifd_bytes(entries))
    first = 8 + rows * cols + ((rows * cols) & 1)
    out = bytearray(b"II*\0" + struct.pack("<I", first) + bytes(rows * cols) + b"\0" * ((rows * cols) & 1))
    for i in range(pages):
        out += ifd_bytes(entries, first + (i + 1) * size if i + 1 < pages else 0)
    return bytes(out)


def codec_stream(codec: str, rows: int, cols: int) -> bytes:
    """A real `codec` stream of a rows x cols zero image (small: zeros compress)."""
    if codec == "jpegxl":
        zeros = np.zeros((rows, cols), np.uint8)
        return imagecodecs.jpegxl_encode(zeros, lossless=True)
    channels = 3 if codec == "webp" else None
    zeros = np.zeros((rows, cols, channels) if channels else (rows, cols), np.uint8)
    encode = getattr(imagecodecs, f"{codec}_encode")
    if codec == "webp":
        return encode(zeros, lossless=True)
    return encode(zeros)


#: TIFF Compression tag values of the image codecs crafted into bombs
COMPRESSION = {"png": 34933, "jpeg2k": 33004, "webp": 50001, "lerc": 34887, "jpegxl": 50002,
               "jpegxr": 22610, "jpeg8": 7}


def png_header_bomb(rows: int, cols: int) -> bytes:
    """A PNG stream whose IHDR declares rows x cols pixels, followed by nothing useful."""
    ihdr = struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", 0)
    return b"\x89PNG\r\n\x1a\n" + chunk
