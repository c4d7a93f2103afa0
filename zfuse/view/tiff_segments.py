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

import imagecodecs
import tifffile

from zfuse.errors import InvalidTiffError

__all__ = ["ACCEPTED_COMPRESSIONS", "check_segments", "declared_dims", "declared_image"]

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
    if codec == "JPEG" and (scans := jpeg_scans(segment)) > JPEG_SCANS_MAX:
        raise _refuse(f"{what}: its JPEG stream has {scans} scans, more than the {JPEG_SCANS_MAX} "
                      "zfuse decodes (each scan is decoded over the whole image)")
    if codec == "JPEG 2000" and (costly := j2k_cost_problem(segment)) is not None:
        raise _refuse(f"{what}: its JPEG 2000 stream has {costly}")
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


def _j2k_cost(stream: bytes, at: int) -> str | None:
    xsiz, ysiz, xosiz, yosiz, xtsiz, ytsiz, xtosiz, ytosiz = struct.unpack_from(">IIIIIIII", stream, at + 8)
    (csiz,) = struct.unpack_from(">H", stream, at + 40)
    if not (xtsiz and ytsiz and xsiz > xosiz and ysiz > yosiz and csiz):
        return None
    tiles = -(-(xsiz - xtosiz) // xtsiz) * -(-(ysiz - ytosiz) // ytsiz)
    if tiles > J2K_TILES_MAX:
        return f"{tiles} tiles, more than the {J2K_TILES_MAX} zfuse decodes"
    tile_w, tile_h = min(xtsiz, xsiz - xosiz), min(ytsiz, ysiz - yosiz)
    # per component: (decomposition levels, precinct exponents per resolution); COD sets
    # every component's, COC one's; a tile-part header's override the main header's
    # (counted as the most any tile may cost)
    default: tuple[int, list[tuple[int, int]]] = (5, [])
    per_component: dict[int, tuple[int, list[tuple[int, int]]]] = {}
    worst = 0
    (lsiz,) = struct.unpack_from(">H", stream, at + 4)
    pos = at + 4 + lsiz
    steps = 0
    while pos + 4 <= len(stream) and steps < 100_000:
        steps += 1
        marker, length = struct.unpack_from(">HH", stream, pos)
        if marker == 0xFFD9:  # EOC
            break
        if marker == 0xFF52:  # COD
            scod = stream[pos + 4]
            levels = stream[pos + 9]
            default = (levels, _precincts(stream, pos + 14, levels) if scod & 1 else [])
        elif marker == 0xFF53:  # COC
            wide = csiz >= 257
            comp = struct.unpack_from(">H" if wide else ">B", stream, pos + 4)[0]
            body = pos + 4 + (2 if wide else 1)
            scoc, levels = stream[body], stream[body + 1]
            per_component[comp] = (levels, _precincts(stream, body + 6, levels) if scoc & 1 else [])
        elif marker == 0xFF90:  # SOT: this tile-part's header, then its data (Psot bytes in all)
            (psot,) = struct.unpack_from(">I", stream, pos + 6)
            worst = max(worst, _precinct_count(default, per_component, csiz, tile_w, tile_h))
            if worst > J2K_PRECINCTS_MAX // tiles:
                break
            # (markers of this tile-part's header, up to SOD, count for it)
            header_end = _sod_at(stream, pos + 2 + length)
            if header_end is None:
                break
            saved = (default, dict(per_component))
            inner = pos + 2 + length
            while inner < header_end:
                m, n = struct.unpack_from(">HH", stream, inner)
                if m == 0xFF52:
                    default = (stream[inner + 9], _precincts(stream, inner + 14, stream[inner + 9])
                               if stream[inner + 4] & 1 else [])
                elif m == 0xFF53:
                    wide = csiz >= 257
                    comp = struct.unpack_from(">H" if wide else ">B", stream, inner + 4)[0]
                    body = inner + 4 + (2 if wide else 1)
                    per_component[comp] = (stream[body + 1], _precincts(stream, body + 6, stream[body + 1])
                                           if stream[body] & 1 else [])
                inner += 2 + n
            worst = max(worst, _precinct_count(default, per_component, csiz, tile_w, tile_h))
            default, per_component = saved
            if psot == 0:
                break  # (the last tile-part runs to the end)
            pos += psot
            continue
        pos += 2 + length
    worst = max(worst, _precinct_count(default, per_component, csiz, tile_w, tile_h))
    total = worst * tiles
    if total > J2K_PRECINCTS_MAX:
        return f"{total} precincts, more than the {J2K_PRECINCTS_MAX} zfuse decodes (precincts of a few pixels)"
    return None


def _sod_at(stream: bytes, pos: int) -> int | None:
    for _ in range(10_000):
        if pos + 2 > len(stream):
            return None
        (marker,) = struct.unpack_from(">H", stream, pos)
        if marker == 0xFF93:  # SOD
            return pos
        (length,) = struct.unpack_from(">H", stream, pos + 2)
        pos += 2 + length
    return None


def _precincts(stream: bytes, at: int, levels: int) -> list[tuple[int, int]]:
    """(PPx, PPy) of each resolution, lowest first, from a COD/COC's precinct bytes."""
    return [(b & 0x0F, b >> 4) for b in stream[at : at + levels + 1]]


def _precinct_count(default: tuple[int, list[tuple[int, int]]],
                    per_component: dict[int, tuple[int, list[tuple[int, int]]]],
                    components: int, width: int, height: int) -> int:
    """Precincts of one tile over every component and resolution (15: one per resolution)."""
    total = 0
    for c in range(min(components, 16384)):
        levels, sizes = per_component.get(c, default)
        for r in range(levels + 1):
            scale = 1 << (levels - r)
            w, h = -(-width // scale), -(-height // scale)
            ppx, ppy = sizes[r] if r < len(sizes) else (15, 15)
            total += -(-w // (1 << ppx)) * -(-h // (1 << ppy))
        if total > J2K_PRECINCTS_MAX:
            return total
    return total


def _j2k_dims(stream: bytes) -> tuple[int, int, int, int] | None:
    if stream[:4] == b"\xff\x4f\xff\x51":
        return _j2k_codestream_dims(stream, 0)
    at = 0  # JP2 boxes: the image is the codestream box's
    while at + 8 <= len(stream):
        (length,) = struct.unpack_from(">I", stream, at)
        kind = stream[at + 4 : at + 8]
        header = 8
        if length == 1:
            (length,) = struct.unpack_from(">Q", stream, at + 8)
            header = 16
        elif length == 0:
            length = len(stream) - at
        if kind == b"jp2c":
            return _j2k_codestream_dims(stream, at + header)
        if length < header:
            return None
        at += length
    return None


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

