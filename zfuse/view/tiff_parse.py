"""Reading a zfuse chunk file's header back: its chunk position record. Pure functions, no I/O.

Invariants:

- Any TIFF byte order and classic or BigTIFF are read; only the first IFD's
  ASCII tags are looked at, so a header alone (``layout.header_size`` bytes) or
  a whole file both work.
- The position record is PageName (`POSITION_TAG`) if it holds one, else
  DocumentName: the JSON `tiff_meta.position_text` writes into both. Bytes that
  are not a TIFF, are cut off, or hold no record raise an error, never a guess:
  `TiffHeaderError` (a ValueError), or `struct.error` for fewer than 8 bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

from zfuse.errors import TiffHeaderError
from zfuse.view.tiff_ifd import ASCII
from zfuse.view.tiff_meta import DOCUMENT_NAME, POSITION_TAG

__all__ = ["parse_position", "read_position"]


def _read_ifd0_ascii(header: bytes | memoryview, tags: Sequence[int]) -> dict[int, str]:
    """ASCII values of `tags` in the first IFD (any byte order, classic or BigTIFF)."""
    data = bytes(header[:16])
    if data[:2] == b"II":
        bo = "<"
    elif data[:2] == b"MM":
        bo = ">"
    else:
        raise TiffHeaderError("not a TIFF header (no II/MM byte order mark)")
    (magic,) = struct.unpack(bo + "H", data[2:4])
    if magic == 42:
        (ifd,) = struct.unpack(bo + "I", data[4:8])
        cnt_fmt, off_fmt, esize, inline = "H", "I", 12, 4
    elif magic == 43:
        (ifd,) = struct.unpack(bo + "Q", data[8:16])
        cnt_fmt, off_fmt, esize, inline = "Q", "Q", 20, 8
    else:
        raise TiffHeaderError(f"not a TIFF header (magic {magic})")
    view = memoryview(header)
    csize = struct.calcsize(cnt_fmt)
    osize = struct.calcsize(off_fmt)
    if ifd + csize > len(view):
        raise TiffHeaderError("TIFF header truncated before the first IFD")
    (count,) = struct.unpack(bo + cnt_fmt, view[ifd : ifd + csize])
    found: dict[int, str] = {}
    for i in range(count):
        at = ifd + csize + i * esize
        if at + esize > len(view):
            raise TiffHeaderError("TIFF header truncated inside the first IFD")
        tag, typ = struct.unpack(bo + "HH", view[at : at + 4])
        if tag not in tags or typ != ASCII:
            continue
        (n,) = struct.unpack(bo + off_fmt, view[at + 4 : at + 4 + osize])
        if n <= inline:
            raw = bytes(view[at + 4 + osize : at + 4 + osize + n])
        else:
            (ptr,) = struct.unpack(bo + off_fmt, view[at + 4 + osize : at + 4 + 2 * osize])
            if ptr + n > len(view):
                raise TiffHeaderError(f"tag {tag} value lies beyond the given bytes")
            raw = bytes(view[ptr : ptr + n])
        found[tag] = raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()
    return found


def read_position(header: bytes | memoryview) -> dict[str, list[int]]:
    """The position record {"chunk", "origin", "shape"} of a zfuse chunk file."""
    values = _read_ifd0_ascii(header, (POSITION_TAG, DOCUMENT_NAME))
    for tag in (POSITION_TAG, DOCUMENT_NAME):
        text = values.get(tag)
        if not text:
            continue
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("chunk"), list):
            return record
    raise TiffHeaderError("no zfuse chunk position in this TIFF (PageName / DocumentName)")


def parse_position(header_bytes: bytes | memoryview) -> tuple[int, ...]:
    """Chunk coordinates stored in a zfuse chunk file's header (or whole file)."""
    return tuple(int(c) for c in read_position(header_bytes)["chunk"])
