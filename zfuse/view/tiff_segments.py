"""Bounds on decoding the strips and tiles of a TIFF written into the mount. Pure, no I/O.

A written file's pixels are decoded by tifffile; some of its decoders size
their output from the compressed stream itself (a 200-byte PNG, LERC or
JPEG 2000 strip can declare 40000 x 40000 pixels) or silently truncate or
pad what does not fit. `check_segments` runs before tifffile decodes a page
and makes sure every strip or tile decodes to exactly the bytes its place
in the image needs, with work and memory bounded by that size:

- the page has exactly the strips or tiles its size, RowsPerStrip or tile
  size and sample layout imply, and none is empty (byte count 0);
- uncompressed: each holds at least its rows;
- byte-stream codecs (LZW, deflate, PackBits, LZMA, zstd): decoded into a
  buffer one byte larger than a full strip or tile, which must come out
  exactly full (or exactly the rows left, for a plane's last strip);
- image codecs (JPEG, PNG, JPEG 2000, WebP): the width, height and
  components their stream declares are read from its header, without
  decoding, and must be the strip's or tile's;
- CCITT (bilevel) decoders are given the rows and width: bounded as they are;
- every other compression (LERC, JPEG XL, JPEG XR, old-style JPEG, ...) is
  refused: its output cannot be bounded before it is decoded.

`ACCEPTED_COMPRESSIONS` names what is accepted, for messages and docs.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import imagecodecs
import tifffile

from zfuse.errors import InvalidTiffError

__all__ = ["ACCEPTED_COMPRESSIONS", "check_segments", "declared_dims", "declared_image", "decode_cost_problem"]

_BYTE_CODECS = {5: "LZW", 8: "deflate", 32946: "deflate", 32773: "PackBits", 34925: "LZMA",
                34926: "zstd", 50000: "zstd"}
_IMAGE_CODECS = {7: "JPEG", 34892: "JPEG", 33003: "JPEG 2000", 33004: "JPEG 2000",
                 33005: "JPEG 2000", 34712: "JPEG 2000", 34933: "PNG", 50001: "WebP",
                 34927: "WebP"}
_BOUNDED_BY_CALLER = {1: "none", 2: "CCITT RLE", 3: "CCITT fax 3", 4: "CCITT fax 4"}
ACCEPTED_COMPRESSIONS = "none, LZW, deflate, PackBits, LZMA, zstd, JPEG, PNG, JPEG 2000, WebP, CCITT"


def _refuse(message: str) -> InvalidTiffError:
    return InvalidTiffError(message)


def check_segments(page: tifffile.TiffPage, data: memoryview | bytes, where: str) -> None:
    """Raise InvalidTiffError unless every strip or tile of `page` decodes to exactly
    the bytes its place needs (see the module doc). `data` is the whole file."""
    compression = int(page.compression)
    if compression not in _BYTE_CODECS and compression not in _IMAGE_CODECS \
            and compression not in _BOUNDED_BY_CALLER:
        name = getattr(page.compression, "name", str(compression))
        raise _refuse(
            f"compression {name} ({compression}) in {where} is not accepted for files written "
            "into the mount: its decoded size cannot be checked before decoding; "
            f"save with one of: {ACCEPTED_COMPRESSIONS}"
        )
    separate, depth, length, width, contig = (int(n) for n in page.shaped)
    bits = int(page.bitspersample)

    def row_bytes(pixels: int) -> int:
        return math.ceil(pixels * contig * bits / 8)

    # (rows, columns, decoded bytes needed, decoded bytes of a full segment) per segment
    if page.is_tiled:
        tile_depth = max(int(page.tiledepth), 1)
        tile_rows, tile_cols = int(page.tilelength), int(page.tilewidth)
        if tile_rows <= 0 or tile_cols <= 0:
            raise _refuse(f"{where} has tiles of {tile_rows}x{tile_cols}")
        per_plane = (math.ceil(depth / tile_depth) * math.ceil(length / tile_rows)
                     * math.ceil(width / tile_cols))
        full = tile_depth * tile_rows * row_bytes(tile_cols)
        shapes = [(tile_rows, tile_cols, full, full)] * (per_plane * separate)
        kind = "tile"
    else:
        rows_per_strip = min(int(page.rowsperstrip or length), length) or length
        strips = math.ceil(length / rows_per_strip)
        full = rows_per_strip * row_bytes(width)
        one_plane = [(min(rows_per_strip, length - k * rows_per_strip), width) for k in range(strips)]
        shapes = [(r, c, r * row_bytes(c), full) for r, c in one_plane] * (depth * separate)
        kind = "strip"
    offsets, counts = page.dataoffsets, page.databytecounts
    if len(offsets) != len(shapes) or len(counts) != len(shapes):
        raise _refuse(
            f"{where} has {len(offsets)} {kind}(s) ({len(counts)} byte counts); "
            f"its {length}x{width} image needs {len(shapes)}"
        )
    _check_apart(offsets, counts, kind, where)
    decompress = tifffile.TIFF.DECOMPRESSORS[compression] if compression in _BYTE_CODECS else None
    for k, ((rows, cols, needed, most), offset, count) in enumerate(zip(shapes, offsets, counts, strict=True)):
        what = f"{kind} {k} of {where}"
        if count <= 0:
            raise _refuse(f"{what} is empty (byte count 0): every {kind} must hold its pixels")
        segment = data[offset : offset + count]
        if compression == 1:
            if count < needed:
                raise _refuse(f"{what} holds {count} bytes, its {rows} row(s) need {needed}")
        elif decompress is not None:
            if page.fillorder == 2:
                segment = imagecodecs.bitorder_decode(bytes(segment))
            try:
                decoded = len(decompress(bytes(segment), out=most + 1))
            except Exception as exc:
                raise _refuse(
                    f"{what} does not decode ({_BYTE_CODECS[compression]}) into the {most} bytes "
                    f"of its {rows} row(s) of {cols} pixel(s) (more bytes, or corrupt data): {exc}"
                ) from exc
            if decoded not in (needed, most):
                more = "more" if decoded > most else "fewer"
                raise _refuse(
                    f"{what} decodes to {more} bytes than its {rows} row(s) of {cols} pixel(s) "
                    f"hold ({decoded if decoded <= most else f'over {most}'} for {needed})"
                )
        elif compression in _IMAGE_CODECS:
            _check_declared(compression, bytes(segment), rows, cols, contig, what, page)


def _check_apart(offsets: Sequence[int], counts: Sequence[int], kind: str, where: str) -> None:
    """Refuse segments whose bytes overlap: each is read (and decoded) on its own, so
    tiles all pointing at one 20 MiB run of a 21 MB file cost the reads of thousands of
    files (287 s of CPU for one close). Apart, their bytes add up to at most the file."""
    spans = sorted(zip(offsets, counts, strict=True))
    for (a, n), (b, _) in zip(spans, spans[1:], strict=False):
        if a + n > b:
            raise _refuse(f"{where}: two of its {kind}s share bytes (at {a}..{a + n} and from {b}): "
                          f"every {kind} must have bytes of its own")


def _check_declared(compression: int, segment: bytes, rows: int, cols: int, samples: int,
                    what: str, page: tifffile.TiffPage) -> None:
    codec = _IMAGE_CODECS[compression]
    declared = declared_dims(codec, segment)
    if declared is None:
        raise _refuse(f"{what}: not a {codec} stream whose image size can be read")
    height, width, components = declared
    costly = decode_cost_problem(codec, segment)
    if costly is not None:
        raise _refuse(f"{what}: its {codec} stream has {costly}")
    # a plane's last strip may be coded with the full RowsPerStrip (the decoder's rows
    # past the image are dropped): both heights are the strip's
    heights = {rows}
    if not page.is_tiled:
        heights.add(min(int(page.rowsperstrip or rows), int(page.imagelength)))
    if height not in heights or width != cols:
        raise _refuse(
            f"{what}: its {codec} stream declares {height}x{width} pixels, "
            f"the {what.split()[0]} is {rows}x{cols}"
        )
    if components != samples and not (codec == "WebP" and samples in (3, 4)):
        raise _refuse(f"{what}: its {codec} stream has {components} component(s), the image {samples}")


def declared_dims(codec: str, stream: bytes) -> tuple[int, int, int] | None:
    """(height, width, components) that an image codec's stream declares in its header,
    read without decoding; None if the header is not there or not understood."""
    image = declared_image(codec, stream)
    return image[:3] if image is not None else None


def declared_image(codec: str, stream: bytes) -> tuple[int, int, int, int] | None:
    """(height, width, components, bits per sample) that an image codec's stream
    declares in its header, read without decoding; None if the header is not there or
    not understood. (Bits: the largest component's; 8 where a header leaves it out.)"""
    try:
        if codec == "JPEG":
            return _jpeg_dims(stream)
        if codec == "PNG":
            return _png_dims(stream)
        if codec == "JPEG 2000":
            return _j2k_dims(stream)
        if codec == "WebP":
            return _webp_dims(stream)
    except (struct.error, IndexError, ValueError):
        return None
    return None


#: scans of a (progressive) JPEG stream decoded at most: real ones have about ten; a
#: crafted 20 MB stream of 1.7 million scans cost two minutes of CPU to decode
JPEG_SCANS_MAX = 100


def decode_cost_problem(codec: str, stream: bytes) -> str | None:
    """What in an image codec's stream would cost its decoder far more than the image
    it declares ("N scans, more than ...": the end of "its JPEG stream has ..."); None if
    nothing would. Asked of written strips and tiles and of stored chunks alike."""
    if codec == "JPEG" and (scans := jpeg_scans(stream)) > JPEG_SCANS_MAX:
        return f"{scans} scans, more than the {JPEG_SCANS_MAX} zfuse decodes (each scan is decoded over the whole image)"
    if codec == "JPEG 2000":
        return j2k_cost_problem(stream)
    return None


def jpeg_scans(stream: bytes) -> int:
    """How many scans (SOS markers) a JPEG stream has. Entropy-coded data never holds
    0xFF 0xDA (a 0xFF there is followed by 0x00 or a restart marker), so counting the
    pair counts the scans, in C (a marker segment holding it could only count more)."""
    return stream.count(b"\xff\xda")


_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_dims(stream: bytes) -> tuple[int, int, int, int] | None:
    if stream[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(stream):
        if stream[at] != 0xFF:
            return None
        marker = stream[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        (seg_len,) = struct.unpack_from(">H", stream, at + 2)
        if marker in _JPEG_SOF:
            precision, height, width, components = struct.unpack_from(">BHHB", stream, at + 4)
            return (height, width, components, precision) if height else None  # 0: set later by DNL
        if marker in (0xDA, 0xD9):  # scan or end before any frame header
            return None
        at += 2 + seg_len
    return None


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_dims(stream: bytes) -> tuple[int, int, int, int] | None:
    if stream[:8] != b"\x89PNG\r\n\x1a\n" or stream[12:16] != b"IHDR":
        return None
    width, height, depth, color = struct.unpack_from(">IIBB", stream, 16)
    channels = _PNG_CHANNELS.get(color)
    return (height, width, channels, depth) if channels else None


def _j2k_codestream_dims(stream: bytes, at: int) -> tuple[int, int, int, int] | None:
    if stream[at : at + 4] != b"\xff\x4f\xff\x51":
        return None
    xsiz, ysiz, xosiz, yosiz = struct.unpack_from(">IIII", stream, at + 8)
    (csiz,) = struct.unpack_from(">H", stream, at + 40)
    try:  # each component's Ssiz: bit depth - 1 (the top bit: signed)
        bits = max((stream[at + 42 + 3 * c] & 0x7F) + 1 for c in range(csiz))
    except (IndexError, ValueError):
        bits = 8
    return (ysiz - yosiz, xsiz - xosiz, csiz, bits)


#: JPEG 2000 precincts (over tiles, components and resolutions) and tiles decoded at
#: most: OpenJPEG allocates each precinct's structures before decoding a byte, so a
#: 127-byte stream of 2x2 precincts over 2048 x 2048 pixels took 2.3 GB; real streams have
#: one precinct per resolution (the default 2**15), or some hundreds
J2K_PRECINCTS_MAX = 65536
J2K_TILES_MAX = 4096


def j2k_cost_problem(stream: bytes) -> str | None:
    """Why a JPEG 2000 stream (codestream or JP2) would cost its decoder far more than its
    image (too many precincts or tiles, from its SIZ, COD and COC markers, in the main
    header and every tile-part header); None if it would not, or it cannot be read."""
    try:
        at = _j2k_codestream_at(stream)
        return None if at is None else _j2k_cost(stream, at)
    except (struct.error, IndexError, ValueError):
        return None


def _j2k_codestream_at(stream: bytes) -> int | None:
    """Where a JPEG 2000 codestream starts: at 0, or in a JP2 file's codestream box."""
    if stream[:4] == b"\xff\x4f\xff\x51":
        return 0
    at = 0
    while at + 8 <= len(stream):
        (length,) = struct.unpack_from(">I", stream, at)
        kind, header = stream[at + 4 : at + 8], 8
        if length == 1:
            (length,) = struct.unpack_from(">Q", stream, at + 8)
            header = 16
        elif length == 0:
            length = len(stream) - at
        if kind == b"jp2c":
            return at + header if stream[at + header : at + header + 4] == b"\xff\x4f\xff\x51" else None
        if length < header:
            return None
        at += length
    return None


#: marker segments of a JPEG 2000 stream looked at, in all its headers together: real
#: ones have tens (a tile-part per tile, a few markers each); the walk is bounded by this
J2K_MARKERS_MAX = 8192

_Coding = tuple[int, list[tuple[int, int]]]  # decomposition levels, (PPx, PPy) per resolution


@dataclass
class _Codings:
    """How a tile's components are coded: every one's (COD), some components' own (COC)."""

    default: _Coding = (5, [])
    own: dict[int, _Coding] = field(default_factory=dict)

    def copy(self) -> _Codings:
        return _Codings(self.default, dict(self.own))


def _j2k_cost(stream: bytes, at: int) -> str | None:
    xsiz, ysiz, xosiz, yosiz, xtsiz, ytsiz, xtosiz, ytosiz = struct.unpack_from(">IIIIIIII", stream, at + 8)
    (csiz,) = struct.unpack_from(">H", stream, at + 40)
    if not (xtsiz and ytsiz and xsiz > xosiz and ysiz > yosiz and csiz):
        return None
    tiles = -(-(xsiz - xtosiz) // xtsiz) * -(-(ysiz - ytosiz) // ytsiz)
    if tiles > J2K_TILES_MAX:
        return f"{tiles} tiles, more than the {J2K_TILES_MAX} zfuse decodes"
    tile_w, tile_h = min(xtsiz, xsiz - xosiz), min(ytsiz, ysiz - yosiz)
    budget = [J2K_MARKERS_MAX]
    (lsiz,) = struct.unpack_from(">H", stream, at + 4)
    main = _Codings()
    pos = _j2k_header(stream, at + 4 + lsiz, csiz, main, budget, stop_at=0xFF90)
    if pos is None:
        return f"more than {J2K_MARKERS_MAX} marker segments, or a header that does not end"
    worst = _precinct_count(main, csiz, tile_w, tile_h)
    # each tile-part's header may code its tile otherwise: counted where one does
    while worst * tiles <= J2K_PRECINCTS_MAX and pos + 12 <= len(stream):
        marker, length = struct.unpack_from(">HH", stream, pos)
        if marker != 0xFF90:  # (EOC, or what follows the last tile-part)
            break
        (psot,) = struct.unpack_from(">I", stream, pos + 6)
        coding = main.copy()
        end = _j2k_header(stream, pos + 2 + length, csiz, coding, budget, stop_at=0xFF93)
        if end is None:
            return f"more than {J2K_MARKERS_MAX} marker segments, or a tile-part header that does not end"
        if psot and pos + psot < end + 2:
            return "a tile-part shorter than its own header"
        if coding != main:
            worst = max(worst, _precinct_count(coding, csiz, tile_w, tile_h))
        if not psot:
            break  # (Psot 0: the last tile-part runs to the end)
        pos += psot
    total = worst * tiles
    if total > J2K_PRECINCTS_MAX:
        return f"{total} precincts, more than the {J2K_PRECINCTS_MAX} zfuse decodes (precincts of a few pixels)"
    return None


def _j2k_header(stream: bytes, pos: int, components: int, coding: _Codings, budget: list[int],
                stop_at: int) -> int | None:
    """Read one header's marker segments from `pos` up to the `stop_at` marker (SOT after
    the main header, SOD after a tile-part's), taking its COD and COC into `coding`;
    where `stop_at` is, or None past the marker budget (shared by all headers) or the end."""
    wide = components >= 257
    while pos + 4 <= len(stream):
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        marker, length = struct.unpack_from(">HH", stream, pos)
        if marker in (stop_at, 0xFFD9):
            return pos
        if marker == 0xFF52:  # COD
            levels = stream[pos + 9]
            coding.default = (levels, _precincts(stream, pos + 14, levels) if stream[pos + 4] & 1 else [])
        elif marker == 0xFF53:  # COC
            comp = struct.unpack_from(">H" if wide else ">B", stream, pos + 4)[0]
            body = pos + 4 + (2 if wide else 1)
            levels = stream[body + 1]
            coding.own[comp] = (levels, _precincts(stream, body + 6, levels) if stream[body] & 1 else [])
        if length < 2:
            return None
        pos += 2 + length
    return None


def _precincts(stream: bytes, at: int, levels: int) -> list[tuple[int, int]]:
    """(PPx, PPy) of each resolution, lowest first, from a COD/COC's precinct bytes."""
    return [(b & 0x0F, b >> 4) for b in stream[at : at + levels + 1]]


def _precinct_count(coding: _Codings, components: int, width: int, height: int) -> int:
    """Precincts of one tile over every component and resolution (15: one a resolution),
    each distinct coding counted once, times the components coded so."""
    own = {c: v for c, v in coding.own.items() if c < components}
    total = (components - len(own)) * _coded_precincts(coding.default, width, height)
    for value in own.values():
        total += _coded_precincts(value, width, height)
    return total


def _coded_precincts(coding: _Coding, width: int, height: int) -> int:
    levels, sizes = coding
    total = 0
    for r in range(levels + 1):
        scale = 1 << min(levels - r, 62)
        w, h = -(-width // scale), -(-height // scale)
        ppx, ppy = sizes[r] if r < len(sizes) else (15, 15)
        total += -(-w // (1 << ppx)) * -(-h // (1 << ppy))
    return total


def _j2k_dims(stream: bytes) -> tuple[int, int, int, int] | None:
    at = _j2k_codestream_at(stream)  # (a codestream, or a JP2 file's codestream box)
    return None if at is None else _j2k_codestream_dims(stream, at)


def _webp_dims(stream: bytes) -> tuple[int, int, int, int] | None:
    if stream[:4] != b"RIFF" or stream[8:12] != b"WEBP":
        return None
    chunk = stream[12:16]
    body = 20
    if chunk == b"VP8X":
        w1 = int.from_bytes(stream[body + 4 : body + 7], "little")
        h1 = int.from_bytes(stream[body + 7 : body + 10], "little")
        return (h1 + 1, w1 + 1, 4 if stream[body] & 0x10 else 3, 8)
    if chunk == b"VP8L":
        if stream[body] != 0x2F:
            return None
        (bits,) = struct.unpack_from("<I", stream, body + 1)
        return (((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1, 4 if (bits >> 28) & 1 else 3, 8)
    if chunk == b"VP8 ":
        if stream[body + 3 : body + 6] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack_from("<HH", stream, body + 6)
        return (height & 0x3FFF, width & 0x3FFF, 3, 8)
    return None

