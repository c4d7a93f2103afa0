"""decode_tiff against TIFFs really written by tifffile, libtiff's tiffcp and
headless ImageJ, zfuse's own layout (fast path), and a catalogue of bad files
that must each raise InvalidTiffError naming the problem."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zfuse.errors import InvalidTiffError
from zfuse.view.tiff import build_header, plan_layout
from zfuse.view.tiff_input import decode_tiff as decode
from zfuse.view.tiff_input import max_file_size

from stores import sample
from tools import imagej_save_many, requires, tiffcp

SHAPE = (3, 40, 50)
DTYPES = ["?", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "c8", "c16"]


def tiff_bytes(a: np.ndarray, **kw: object) -> bytes:
    buf = io.BytesIO()
    kw.setdefault("photometric", "minisblack")
    # without metadata=None tifffile squeezes size-1 axes: (3, 2, 1) becomes one
    # 3x2 page with a trailing "sample" axis instead of three 2x1 pages
    kw.setdefault("metadata", None)
    tifffile.imwrite(buf, a, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


def own_file(a: np.ndarray, coords: tuple[int, ...] = (1, 0, 1), **plan: object) -> bytes:
    layout = plan_layout(a.shape, a.dtype, **plan)  # type: ignore[arg-type]
    return build_header(layout, coords) + a.astype(layout.dtype).tobytes()


def assert_decodes(data: bytes, expect: np.ndarray, **kw: object) -> None:
    got = decode(data, chunk_shape=expect.shape, dtype=expect.dtype, **kw)  # type: ignore[arg-type]
    assert got.shape == expect.shape
    assert got.dtype == expect.dtype
    np.testing.assert_array_equal(got, expect)


def assert_invalid(data: bytes, *words: str, **kw: object) -> str:
    kw.setdefault("chunk_shape", SHAPE)
    kw.setdefault("dtype", "u2")
    with pytest.raises(InvalidTiffError) as info:
        decode(data, **kw)  # type: ignore[arg-type]
    message = str(info.value)
    for word in words:
        assert word.lower() in message.lower(), message
    return message


# ------------------------------------------------------------------- tifffile

TIFFFILE_VARIANTS = {
    "contiguous": {},
    "deflate": {"compression": "zlib"},
    "lzw": {"compression": "lzw"},
    "packbits": {"compression": "packbits"},
    "zstd": {"compression": "zstd"},
    "lzma": {"compression": "lzma"},
    "deflate+predictor": {"compression": "zlib", "predictor": True},
    "tiled": {"tile": (16, 16)},
    "tiled+lzw": {"tile": (32, 16), "compression": "lzw"},
    "strips": {"rowsperstrip": 7},
    "big-endian": {"byteorder": ">"},
    "big-endian+deflate": {"byteorder": ">", "compression": "zlib"},
    "bigtiff": {"bigtiff": True},
    "bigtiff+big-endian+tiled": {"bigtiff": True, "byteorder": ">", "tile": (16, 32)},
    "imagej": {"imagej": True, "photometric": None},
    "planar-rgb-default": {"photometric": None},  # tifffile writes (3, Y, X) as planar RGB
}


@pytest.mark.filterwarnings("ignore:.*stored as RGB with separate:DeprecationWarning")
@pytest.mark.parametrize("variant", TIFFFILE_VARIANTS)
def test_tifffile_layouts(variant: str) -> None:
    a = sample(SHAPE, "u2")
    kw = dict(TIFFFILE_VARIANTS[variant])
    if kw.get("photometric", "x") is None:
        del kw["photometric"]
        buf = io.BytesIO()
        tifffile.imwrite(buf, a, **kw)  # type: ignore[arg-type]
        data = buf.getvalue()
    else:
        data = tiff_bytes(a, **kw)
    assert_decodes(data, a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compression", [None, "zlib"])
def test_tifffile_every_dtype(dtype: str, compression: str | None) -> None:
    a = sample((2, 9, 11), dtype)
    assert_decodes(tiff_bytes(a, compression=compression), a)
    assert_decodes(tiff_bytes(a, compression=compression, byteorder=">"), a)


def test_imagej_hyperstack_from_tifffile() -> None:
    a = sample((2, 3, 4, 10, 12), "f4")  # TZCYX: ImageJ's page order is C order here
    buf = io.BytesIO()
    tifffile.imwrite(buf, a, imagej=True, metadata={"axes": "TZCYX"})
    assert_decodes(buf.getvalue(), a)


def test_imagej_single_ifd_stack() -> None:
    """ImageJ writes stacks over 4 GiB with one IFD: images=N planes follow it."""
    a = sample(SHAPE, "u2")
    layout = plan_layout(SHAPE, "u2", axes="zyx")
    header = bytearray(build_header(layout, (0, 0, 0)))
    (count,) = struct.unpack_from("<H", header, 8)
    struct.pack_into("<I", header, 8 + 2 + 12 * count, 0)  # IFD0 is now the last IFD
    data = bytes(header) + a.tobytes()
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        assert len(tif.pages) == 1
    assert_decodes(data, a)
    assert_decodes(data, a, layout=layout)  # not byte-exact any more: full parse


def test_volumetric_tiles_count_as_pages() -> None:
    a = sample((4, 32, 32), "u1")
    buf = io.BytesIO()
    tifffile.imwrite(buf, a, tile=(2, 16, 16), volumetric=True, photometric="minisblack")
    with tifffile.TiffFile(io.BytesIO(buf.getvalue())) as tif:
        assert len(tif.pages) == 1 and tif.pages[0].imagedepth == 4
    assert_decodes(buf.getvalue(), a)


def test_low_dimensional_chunks() -> None:
    line = sample((17,), "i4")
    assert_decodes(tiff_bytes(line.reshape(1, 17)), line)
    scalar = np.array(3.5, dtype="f8")
    assert_decodes(tiff_bytes(scalar.reshape(1, 1)), scalar)
    five = sample((2, 1, 3, 6, 7), "u2")
    assert_decodes(tiff_bytes(five.reshape(6, 6, 7)), five)


def test_bool_chunk_accepts_uint8_and_bilevel() -> None:
    a = sample((3, 8, 9), "?")
    assert_decodes(tiff_bytes(a.astype("u1")), a)
    assert_decodes(tiff_bytes(a), a)  # tifffile writes bool as 1-bit bilevel
    bad = a.astype("u1") * 255
    assert_invalid(tiff_bytes(bad), "0 or 1", "255", chunk_shape=a.shape, dtype="?")
    assert_invalid(tiff_bytes(a.astype("u2")), "uint16", "bool", chunk_shape=a.shape, dtype="?")


def test_jpeg_decodes_when_codec_available() -> None:
    a = (np.arange(64 * 64).reshape(64, 64) % 251).astype("u1")
    data = tiff_bytes(a, compression="jpeg")
    got = decode(data, chunk_shape=(64, 64), dtype="u1")
    assert got.shape == (64, 64) and got.dtype == np.uint8
    assert np.abs(got.astype(int) - a).mean() < 8  # lossy, but the right image


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple),
    dtype=st.sampled_from(DTYPES),
    compression=st.sampled_from([None, "zlib", "lzw", "packbits"]),
    byteorder=st.sampled_from(["<", ">"]),
    tiled=st.booleans(),
)
def test_property_tifffile_round_trip(
    shape: tuple[int, ...], dtype: str, compression: str | None, byteorder: str, tiled: bool
) -> None:
    a = sample(shape, dtype, seed=len(shape))
    pages = a.reshape(-1, *shape[-2:])
    kw: dict[str, object] = {"compression": compression, "byteorder": byteorder}
    if tiled:
        kw["tile"] = (16, 16)
    if np.dtype(dtype).kind == "b" and (compression or tiled):
        pages = pages.astype("u1")  # tifffile: no compressed/tiled bilevel
    assert_decodes(tiff_bytes(pages, **kw), a)


# ---------------------------------------------------------------------- tiffcp

TIFFCP_VARIANTS = {
    "lzw": ["-c", "lzw"],
    "lzw+predictor": ["-c", "lzw:2"],
    "zip": ["-c", "zip"],
    "packbits": ["-c", "packbits"],
    "zstd": ["-c", "zstd"],
    "lzma": ["-c", "lzma"],
    "tiles": ["-t", "-w", "16", "-l", "16"],
    "tiles+zip": ["-t", "-w", "32", "-l", "16", "-c", "zip"],
    "strips": ["-s", "-r", "3"],
    "big-endian": ["-B"],
    "big-endian+lzw+tiles": ["-B", "-c", "lzw", "-t", "-w", "16", "-l", "16"],
    "bigtiff": ["-8"],
}


@pytest.mark.parametrize("variant", TIFFCP_VARIANTS)
def test_tiffcp_layouts(tmp_path: Path, variant: str) -> None:
    requires("tiffcp")
    for dtype in ("u2", "f4", "i1"):
        a = sample(SHAPE, dtype)
        src = tmp_path / f"{dtype}.tiff"
        src.write_bytes(own_file(a))
        dst = tmp_path / f"{dtype}-{variant}.tiff"
        tiffcp(src, dst, *TIFFCP_VARIANTS[variant])
        assert_decodes(dst.read_bytes(), a)


# ---------------------------------------------------------------------- ImageJ


@pytest.mark.imagej
def test_imagej_saved_files(tmp_path: Path) -> None:
    """One ImageJ run saves every case; ImageJ writes big-endian ("MM") files."""
    requires("imagej")
    stack = sample(SHAPE, "u2")
    own = tmp_path / "own.tiff"
    own.write_bytes(own_file(stack, axes="zyx", scales=[2.0, 0.5, 0.5]))
    hyper = sample((2, 3, 4, 10, 12), "u1")
    own5 = tmp_path / "own5.tiff"
    own5.write_bytes(own_file(hyper, (0, 0, 0, 0, 0), axes="tzcyx"))
    signed = np.array([[-32768, -1, 0], [1, 2, 32767]], dtype="i2")
    signed_own = tmp_path / "signed.tiff"
    signed_own.write_bytes(own_file(signed, (0, 0)))
    cases: list[tuple[np.ndarray | Path, np.ndarray | None, str]] = [
        (sample((40, 50), "u1"), None, "u1"),
        (sample((40, 50), "u2"), None, "u2"),
        (sample((40, 50), "f4"), None, "f4"),
        (sample((3, 40, 50), "f4"), None, "f4 stack"),
        (own, stack, "own 3-D u2"),
        (own5, hyper, "own 5-D hyperstack"),
        (signed_own, signed, "own int16 (ImageJ's offset form)"),
    ]
    pairs = [(src, tmp_path / f"saved{i}.tif") for i, (src, _, _) in enumerate(cases)]
    imagej_save_many(pairs)
    for (src, expect, name), (_, dst) in zip(cases, pairs, strict=True):
        want = src if expect is None else expect
        assert isinstance(want, np.ndarray)
        data = dst.read_bytes()
        assert data[:2] == b"MM", name
        try:
            assert_decodes(data, want)
        except InvalidTiffError as exc:  # pragma: no cover - shows which case
            raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.imagej
def test_imagej_int32_becomes_float_and_is_refused(tmp_path: Path) -> None:
    requires("imagej")
    a = sample((6, 7), "i4") // 1000
    src = tmp_path / "i4.tiff"
    src.write_bytes(own_file(a, (0, 0)))
    dst = tmp_path / "i4-saved.tif"
    imagej_save_many([(src, dst)])
    assert_invalid(dst.read_bytes(), "float32", "int32", chunk_shape=(6, 7), dtype="i4")


# ------------------------------------------------------------ own layout path


def test_own_layout_fast_and_slow_paths_agree() -> None:
    for dtype in DTYPES:
        a = sample(SHAPE, dtype)
        layout = plan_layout(SHAPE, dtype, grid_shape=(5, 5, 5))
        data = build_header(layout, (4, 0, 2)) + a.astype(layout.dtype).tobytes()
        assert_decodes(data, a, layout=layout)
        assert_decodes(data, a)
        assert_decodes(bytearray(data), a, layout=layout)
        assert_decodes(memoryview(data), a, layout=layout)


def test_own_layout_result_does_not_alias_input() -> None:
    a = sample(SHAPE, "u2")
    layout = plan_layout(SHAPE, "u2")
    buf = bytearray(build_header(layout, (0, 0, 0)) + a.tobytes())
    got = decode(memoryview(buf), chunk_shape=SHAPE, dtype="u2", layout=layout)
    buf[-2:] = b"\xff\xff"
    np.testing.assert_array_equal(got, a)
    got[0, 0, 0] = 1  # writable


def test_own_layout_cropped_edge_chunk() -> None:
    layout = plan_layout(SHAPE, "f4", grid_shape=(2, 2, 2))
    crop = (2, 40, 13)
    a = sample(crop, "f4")
    data = build_header(layout, (1, 0, 1), shape=crop) + a.tobytes()
    for kw in ({"layout": layout}, {}):
        got = decode(data, chunk_shape=SHAPE, dtype="f4", cropped_shape=crop, **kw)
        np.testing.assert_array_equal(got, a)
    # without cropped_shape the smaller image is a shape error
    assert_invalid(data, "shape", "2 page(s) of 40x13", dtype="f4")
    # and the full shape is still accepted when a cropped shape is allowed
    full = sample(SHAPE, "f4")
    got = decode(own_file(full), chunk_shape=SHAPE, dtype="f4", cropped_shape=crop)
    np.testing.assert_array_equal(got, full)


def test_own_layout_with_edited_header_is_parsed_not_trusted() -> None:
    a = sample(SHAPE, "u2")
    layout = plan_layout(SHAPE, "u2", grid_shape=(3, 3, 3))
    header = bytearray(build_header(layout, (0, 1, 2)))
    # ImageWidth 50 -> 25 in the first IFD only: the file now lies about page 0
    with tifffile.TiffFile(io.BytesIO(bytes(header))) as tif:
        width_at = tif.pages[0].tags["ImageWidth"].valueoffset
    struct.pack_into("<I", header, width_at, 25)
    data = bytes(header) + a.tobytes()
    assert_invalid(data, "differ", layout=layout)
    # a position record claiming another chunk is fine: the pixels are what count
    header = bytearray(build_header(layout, (0, 1, 2)))
    at = header.index(b'{"chunk":[0,1,2]')
    header[at : at + 16] = b'{"chunk":[2,2,2]'
    assert_decodes(bytes(header) + a.tobytes(), a, layout=layout)


def test_layout_must_match_arguments() -> None:
    layout = plan_layout(SHAPE, "u2")
    with pytest.raises(ValueError, match="layout"):
        decode(own_file(sample(SHAPE, "u2")), chunk_shape=SHAPE, dtype="u1", layout=layout)


def test_max_file_size_allows_real_writers_and_stops_runaways() -> None:
    layout = plan_layout((2, 257, 257), "u2")
    limit = max_file_size(layout)
    assert limit > layout.file_size
    # tiles just smaller than the image nearly quadruple the stored pixels
    a = sample((2, 257, 257), "u2")
    padded = tiff_bytes(a, tile=(256, 256))
    assert len(padded) < limit
    assert limit < 100 * layout.file_size + 64 * 2**20


# -------------------------------------------------------------------- bad files


def test_not_a_tiff() -> None:
    assert_invalid(b"", "not a TIFF", "0 bytes")
    assert_invalid(b"II*", "not a TIFF")
    assert_invalid(b"\x89PNG\r\n\x1a\n" + bytes(100), "not a TIFF", "PNG")
    assert_invalid(b"GIF89a" + bytes(100), "not a TIFF")


def test_truncated() -> None:
    a = sample(SHAPE, "u2")
    full = tiff_bytes(a)
    assert_invalid(full[:10], "truncated")
    assert_invalid(full[: len(full) - 1000], "truncated")
    own = own_file(a)
    layout = plan_layout(SHAPE, "u2")
    assert_invalid(own[:-1], "truncated", layout=layout)
    assert_invalid(own[:-1], "truncated")
    assert_invalid(own[: layout.header_size // 2], "truncated")
    compressed = tiff_bytes(a, compression="zlib")
    assert_invalid(compressed[: len(compressed) // 2], "truncated")


def test_wrong_dtype_names_both() -> None:
    a = sample(SHAPE, "f4")
    msg = assert_invalid(tiff_bytes(a), "float32", "uint16")
    assert "convert" in msg
    assert_invalid(tiff_bytes(sample(SHAPE, "i2")), "int16", "uint16")
    assert_invalid(tiff_bytes(sample(SHAPE, "u2")), "uint16", "int16", dtype="i2")  # no ImageJ cf
    assert_invalid(tiff_bytes(sample(SHAPE, "c8")), "complex64", dtype="f8")
    assert_invalid(tiff_bytes(sample(SHAPE, "u1")), "uint8", "uint16")


def test_wrong_shape_and_page_count() -> None:
    assert_invalid(tiff_bytes(sample((40, 50), "u2")), "shape", "1 page(s)", "3 page(s)")
    assert_invalid(tiff_bytes(sample((4, 40, 50), "u2")), "shape", "4 page(s)")
    assert_invalid(tiff_bytes(sample((3, 50, 40), "u2")), "shape", "50x40", "40x50")
    # a 3-D chunk flattened into one tall image is not accepted
    assert_invalid(tiff_bytes(sample((120, 50), "u2")), "shape", "120x50")
    # pages of different sizes
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as tw:
        tw.write(sample((40, 50), "u2"), photometric="minisblack")
        tw.write(sample((40, 51), "u2"), photometric="minisblack")
        tw.write(sample((40, 50), "u2"), photometric="minisblack")
    assert_invalid(buf.getvalue(), "differ", "40x51")


def test_rgb_samples_are_planes_and_refused_where_they_do_not_fit() -> None:
    """[read-13] an interleaved RGB image is 3 planes (samples fastest): the 3 planes of
    a (3, 40, 50) chunk; refused for a one-plane chunk, and RGBA pages for 3 planes."""
    rgb = sample((40, 50, 3), "u1")
    buf = io.BytesIO()
    tifffile.imwrite(buf, rgb, photometric="rgb")
    np.testing.assert_array_equal(decode(buf.getvalue(), chunk_shape=SHAPE, dtype="u1"), rgb.transpose(2, 0, 1))
    assert_invalid(buf.getvalue(), "3 samples per pixel", "RGB", chunk_shape=(40, 50), dtype="u1")
    rgba = sample((3, 40, 50, 4), "u1")
    buf = io.BytesIO()
    tifffile.imwrite(buf, rgba, photometric="rgb")
    assert_invalid(buf.getvalue(), "4 samples per pixel", dtype="u1")


def test_unsupported_compression() -> None:
    data = bytearray(tiff_bytes(sample(SHAPE, "u2"), compression="zlib"))
    with tifffile.TiffFile(io.BytesIO(bytes(data))) as tif:
        offsets = [p.tags["Compression"].valueoffset for p in tif.pages]
    for at in offsets:
        struct.pack_into("<H", data, at, 50123)  # no codec has this number
    assert_invalid(bytes(data), "unsupported compression", "50123")


def test_corrupt_compressed_data() -> None:
    a = sample(SHAPE, "u2")
    data = bytearray(tiff_bytes(a, compression="zlib"))
    with tifffile.TiffFile(io.BytesIO(bytes(data))) as tif:
        start = tif.pages[1].dataoffsets[0]
    data[start : start + 16] = bytes(16)
    assert_invalid(bytes(data), "decode")


def test_garbage_ifd() -> None:
    data = bytearray(tiff_bytes(sample(SHAPE, "u2")))
    struct.pack_into("<I", data, 4, len(data) + 100)  # first IFD beyond the end
    assert_invalid(bytes(data), "truncated")
    noise = b"II*\0" + np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    with pytest.raises(InvalidTiffError):
        decode(noise, chunk_shape=SHAPE, dtype="u2")


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, 10_000), flip=st.integers(0, 10_000), value=st.integers(0, 255))
def test_mangled_files_never_crash(cut: int, flip: int, value: int) -> None:
    """Any corruption gives a correct array or InvalidTiffError, nothing else."""
    a = sample((2, 20, 30), "u2")
    for base in (tiff_bytes(a, compression="zlib"), own_file(a)):
        data = bytearray(base[: max(8, len(base) - cut)])
        data[flip % len(data)] = value
        try:
            got = decode(bytes(data), chunk_shape=a.shape, dtype="u2")
        except InvalidTiffError:
            continue
        assert got.shape == a.shape and got.dtype == np.uint16


def test_ome_tczyx_chunk_takes_pages_in_imagej_order() -> None:
    """A chunk stored (t, c, z, y, x) is shown with ImageJ's page order c, z, t;
    files written into it are read in that order: zfuse's own bytes, an ImageJ
    hyperstack written by tifffile, and a compressed plain multi-page TIFF."""
    chunk = sample((2, 3, 4, 5, 6), "u2", 5)
    layout = plan_layout(chunk.shape, "u2", axes=list("tczyx"))
    tzcyx = np.ascontiguousarray(chunk.transpose(0, 2, 1, 3, 4))
    own = build_header(layout, (0,) * 5) + tzcyx.tobytes()
    assert_decodes(own, chunk, layout=layout)
    imagej = tiff_bytes(tzcyx, imagej=True, metadata={"axes": "TZCYX"}, photometric=None)
    assert_decodes(imagej, chunk, layout=layout)
    plain = tiff_bytes(tzcyx.reshape(24, 5, 6), compression="zlib")
    assert_decodes(plain, chunk, layout=layout)
    # a cropped edge chunk: the same order over the smaller shape
    crop = chunk[:, :2, :3]
    cut = tiff_bytes(np.ascontiguousarray(crop.transpose(0, 2, 1, 3, 4)).reshape(-1, 5, 6))
    got = decode(cut, chunk_shape=chunk.shape, dtype="u2", cropped_shape=crop.shape, layout=layout)
    np.testing.assert_array_equal(got, crop)


def test_a_file_that_says_its_page_order_is_read_in_that_order() -> None:
    """[read-1] a file written into an OME (t, c, z, y, x) chunk that says its pages
    run otherwise than ImageJ's order is read in its own: a tifffile shape description
    of the chunk's shape (`tifffile.imwrite(path, chunk)`: zarr's C order) and OME-XML's
    DimensionOrder. Read in ImageJ's order, their planes were stored scrambled and the
    write succeeded. Files that say nothing, or whose words fit both orders (c and z of
    one size), are read in ImageJ's order as before."""
    chunk = sample((2, 2, 3, 5, 6), "u2", 7)  # (t, c, z): c and z of different sizes
    layout = plan_layout(chunk.shape, "u2", axes=list("tczyx"))
    buf = io.BytesIO()
    tifffile.imwrite(buf, chunk, photometric="minisblack")  # {"shape": [2, 2, 3, 5, 6]}
    assert_decodes(buf.getvalue(), chunk, layout=layout)
    buf = io.BytesIO()
    tifffile.imwrite(buf, chunk, ome=True, photometric="minisblack", metadata={"axes": "TCZYX"})
    assert b'DimensionOrder="XYZCT"' in buf.getvalue()
    assert_decodes(buf.getvalue(), chunk, layout=layout)
    buf = io.BytesIO()  # OME in ImageJ's own order (XYCZT): as ImageJ's
    tifffile.imwrite(buf, np.ascontiguousarray(chunk.transpose(0, 2, 1, 3, 4)), ome=True, photometric="minisblack",
                     metadata={"axes": "TZCYX"})
    assert b'DimensionOrder="XYCZT"' in buf.getvalue()
    assert_decodes(buf.getvalue(), chunk, layout=layout)
    # a (z, c, y, x) chunk runs in ImageJ's order already (c fastest): an OME-TIFF saying
    # z fastest (Bio-Formats' usual XYZCT) is still read in its own order
    zc = sample((3, 2, 5, 6), "u2", 9)
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.ascontiguousarray(zc.transpose(1, 0, 2, 3)), ome=True, photometric="minisblack",
                     metadata={"axes": "CZYX"})
    assert b'DimensionOrder="XYZCT"' in buf.getvalue()
    assert_decodes(buf.getvalue(), zc, layout=plan_layout(zc.shape, "u2", axes=list("zcyx")))
    # saying nothing: ImageJ's order, as the chunk files' own pages run
    tzcyx = np.ascontiguousarray(chunk.transpose(0, 2, 1, 3, 4))
    assert_decodes(tiff_bytes(tzcyx.reshape(12, 5, 6)), chunk, layout=layout)
    # a shape that fits both orders: ImageJ's (a tifffile read of a chunk file, written back)
    square = sample((1, 2, 2, 5, 6), "u2", 8)
    square_layout = plan_layout(square.shape, "u2", axes=list("tczyx"))
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.ascontiguousarray(square.transpose(0, 2, 1, 3, 4)), photometric="minisblack")
    assert_decodes(buf.getvalue(), square, layout=square_layout)


# ------------------------------------------------- plain images (no tifffile parse)

PLAIN_DTYPES = ["u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"]


def _tifffile_pixels(data: bytes) -> np.ndarray:
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        return tif.pages[0].asarray()


@pytest.mark.parametrize("dtype", PLAIN_DTYPES)
def test_plain_image_is_decoded_without_tifffile_and_agrees(dtype: str) -> None:
    """One uncompressed grayscale page (what tifffile and libtiff write for a 2-D
    chunk) is read straight from its strips: the same values tifffile decodes,
    in either byte order, one strip or many, full or cropped edge chunk."""
    from zfuse.view.tiff_input import _plain_image

    a = sample((40, 50), dtype)
    for kw in ({}, {"byteorder": ">"}, {"rowsperstrip": 7}, {"rowsperstrip": 7, "byteorder": ">"},
               {"description": "a note"}, {"metadata": {"axes": "YX"}}):
        data = tiff_bytes(a, **kw)
        fast = _plain_image(memoryview(data), [(40, 50)], np.dtype(dtype), None)
        assert fast is not None, kw
        np.testing.assert_array_equal(fast, _tifffile_pixels(data))
        assert fast.dtype == np.dtype(dtype) and fast.flags.writeable
        assert_decodes(data, a)
        assert_decodes(data, a[None])  # a (1, Y, X) chunk: one page
    crop = sample((40, 13), dtype)
    got = decode(tiff_bytes(crop), chunk_shape=(40, 50), dtype=dtype, cropped_shape=(40, 13))
    np.testing.assert_array_equal(got, crop)
    layout = plan_layout((40, 50), dtype)
    assert_decodes(tiff_bytes(a), a, layout=layout)


def test_plain_image_refuses_what_it_does_not_know() -> None:
    """Anything but the plainest page goes to the full parse (which decides)."""
    from zfuse.view.tiff_input import _plain_image

    a = sample((40, 50), "u2")
    others = {
        "deflate": tiff_bytes(a, compression="zlib"),
        "tiled": tiff_bytes(a, tile=(16, 16)),
        "bigtiff": tiff_bytes(a, bigtiff=True),
        "imagej": tiff_bytes(a, imagej=True, photometric=None, metadata={}),
        "miniswhite": tiff_bytes(a, photometric="miniswhite"),
        "two pages": tiff_bytes(np.stack([a, a])),
        "other dtype": tiff_bytes(a.astype("i2")),
        "other shape": tiff_bytes(a[:, :49]),
        "extra tag": tiff_bytes(a, extratags=[(700, "B", 3, b"xmp", True)]),
        "not a tiff": b"\x89PNG\r\n\x1a\n" + bytes(100),
    }
    for name, data in others.items():
        assert _plain_image(memoryview(data), [(40, 50)], np.dtype("u2"), None) is None, name
    assert_invalid(others["other dtype"], "int16", chunk_shape=(40, 50))
    assert_invalid(others["other shape"], "shape", chunk_shape=(40, 50))
    np.testing.assert_array_equal(decode(others["miniswhite"], chunk_shape=(40, 50), dtype="u2"), a)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, 400), flip=st.integers(0, 400), value=st.integers(0, 255),
       strips=st.sampled_from([None, 7]), big_endian=st.booleans())
def test_plain_image_mangled_never_differs_from_tifffile(
    cut: int, flip: int, value: int, strips: int | None, big_endian: bool
) -> None:
    """A corrupted plain page is read without tifffile only if tifffile reads the
    same values from it; otherwise the full parse decides (array or InvalidTiffError)."""
    from zfuse.view.tiff_input import _plain_image

    a = sample((20, 30), "u2")
    base = tiff_bytes(a, rowsperstrip=strips, byteorder=">" if big_endian else "<")
    data = bytearray(base[: max(8, len(base) - cut)])
    data[flip % min(len(data), 400)] = value  # the header and IFD, where a flip changes meaning
    fast = _plain_image(memoryview(data), [(20, 30)], np.dtype("u2"), None)
    if fast is not None:
        np.testing.assert_array_equal(fast, _tifffile_pixels(bytes(data)))
    try:
        got = decode(bytes(data), chunk_shape=(20, 30), dtype="u2")
    except InvalidTiffError:
        assert fast is None
        return
    assert got.shape == (20, 30) and got.dtype == np.uint16


def _one_strip(entries: list[tuple[int, int, int, int]], strips: list[bytes]) -> bytes:
    """A classic little-endian TIFF of one IFD (`entries`: tag, type, count, value; a
    StripOffsets value of i means the i-th of `strips`), the strips after it."""
    ifd_size = 2 + 12 * len(entries) + 4
    offsets = [8 + ifd_size + sum(len(s) for s in strips[:i]) for i in range(len(strips))]
    fixed = [(t, ty, n, offsets[v] if t == 273 else v) for t, ty, n, v in entries]
    ifd = struct.pack("<H", len(fixed)) + b"".join(struct.pack("<HHII", *e) for e in fixed) + b"\0\0\0\0"
    return b"II*\0" + struct.pack("<I", 8) + ifd + b"".join(strips)


def test_the_fast_path_never_reads_another_image_than_tifffile() -> None:
    """A tag given twice (StripOffsets: tifffile and libtiff take the first, the fast
    path took the last) and a SampleFormat of an unusual type (SSHORT: float16 bits
    were stored as uint16) go to the full parse: the pixels every reader sees, or a
    refusal."""
    ones, twos = np.full((8, 16), 1, "<u2").tobytes(), np.full((8, 16), 2, "<u2").tobytes()
    common = [(256, 4, 1, 16), (257, 4, 1, 8), (258, 3, 1, 16), (259, 3, 1, 1), (262, 3, 1, 1)]
    strip = [(277, 3, 1, 1), (278, 4, 1, 8), (279, 4, 1, len(ones))]
    twice = _one_strip([*common, (273, 4, 1, 0), (273, 4, 1, 1), *strip], [ones, twos])
    got = decode(twice, chunk_shape=(8, 16), dtype="uint16")
    np.testing.assert_array_equal(got, tifffile.imread(io.BytesIO(twice)))
    half = np.full((8, 16), 1.5, "<f2").tobytes()
    sshort = _one_strip([*common, (273, 4, 1, 0), *strip, (339, 8, 1, 3)], [half])
    assert tifffile.imread(io.BytesIO(sshort)).dtype == np.float16
    with pytest.raises(InvalidTiffError):
        decode(sshort, chunk_shape=(8, 16), dtype="uint16")


def test_tifffile_lines_of_a_parsed_file_go_into_its_refusal_not_the_log() -> None:
    """A written file of 4,000 tags of an invalid type made 4,000 log lines (tifffile's,
    naming no key); they are kept for its refusal's message (three at most), not logged."""
    import logging

    values = np.arange(8 * 16, dtype="<f4").reshape(8, 16)
    out = io.BytesIO()
    tifffile.imwrite(out, values)
    good = out.getvalue()
    # an extra IFD entry of an invalid field type, 4,000 times, after the image's own
    (first,) = struct.unpack_from("<I", good, 4)
    (count,) = struct.unpack_from("<H", good, first)
    entries = [good[first + 2 + 12 * i: first + 14 + 12 * i] for i in range(count)]
    entries += [struct.pack("<HHII", 60000 + i % 5000, 99, 1, 0) for i in range(4000)]
    ifd = struct.pack("<H", len(entries)) + b"".join(entries) + b"\0\0\0\0"
    data = good[:4] + struct.pack("<I", len(good)) + good[8:] + ifd
    reached: list[logging.LogRecord] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reached.append(record)

    root = logging.getLogger()  # (where the daemon's log handlers are)
    counter = Count(logging.WARNING)
    root.addHandler(counter)
    try:
        try:
            decode(data, chunk_shape=(8, 16), dtype="float32")
        except InvalidTiffError:
            pass
        logging.getLogger("tifffile").warning("a line of tifffile's outside a parse")
    finally:
        root.removeHandler(counter)
    assert [r.getMessage() for r in reached if r.name == "tifffile"] == ["a line of tifffile's outside a parse"]


def _progressive_jpeg(side: int, scans: int) -> bytes:
    """A progressive JPEG of side x side pixels (one component) whose AC scans are one
    end-of-band run over every block each: valid, tiny, and as costly to decode as it
    has scans (a crafted 20 MB one of 1.7 million scans took two minutes)."""
    def seg(marker: int, payload: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload

    blocks = (side // 8) ** 2
    r = blocks.bit_length() - 1
    dc_bits = blocks
    dc = b"\x00" * (dc_bits // 8) + (b"" if dc_bits % 8 == 0 else bytes([0xFF >> (dc_bits % 8)]))
    bits = ("0" + format(blocks - (1 << r), f"0{r}b")) if r else "0"
    bits += "1" * (-len(bits) % 8)
    ac = int(bits, 2).to_bytes(len(bits) // 8, "big").replace(b"\xff", b"\xff\x00")
    return (b"\xff\xd8" + seg(0xDB, b"\x00" + bytes([1] * 64))
            + seg(0xC2, struct.pack(">BHHB", 8, side, side, 1) + b"\x01\x11\x00")
            + seg(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")
            + seg(0xDA, b"\x01\x01\x00\x00\x00\x00") + dc
            + seg(0xC4, b"\x10" + bytes([1] + [0] * 15) + bytes([r << 4]))
            + (seg(0xDA, b"\x01\x01\x00\x01\x3f\x00") + ac) * scans + b"\xff\xd9")


def test_a_jpeg_of_too_many_scans_is_refused_before_decoding() -> None:
    """[write-12] a JPEG strip whose header declares exactly the strip, but of thousands of
    scans (each decoded over the whole image): refused, counted, not decoded. A
    progressive JPEG of a few scans is read."""
    from zfuse.view.tiff_segments import JPEG_SCANS_MAX

    def tiff_of(jpeg: bytes, side: int) -> bytes:
        entries = [(256, 4, 1, side), (257, 4, 1, side), (258, 3, 1, 8), (259, 3, 1, 7), (262, 3, 1, 1),
                   (273, 4, 1, 8 + 2 + 12 * 9 + 4), (277, 3, 1, 1), (278, 4, 1, side), (279, 4, 1, len(jpeg))]
        ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries)
        return b"II*\0" + struct.pack("<I", 8) + ifd + b"\0\0\0\0" + jpeg

    few = tiff_of(_progressive_jpeg(64, 3), 64)
    assert decode(few, chunk_shape=(64, 64), dtype="uint8").shape == (64, 64)
    many = tiff_of(_progressive_jpeg(64, 20_000), 64)
    with pytest.raises(InvalidTiffError, match=f"20001 scans, more than the {JPEG_SCANS_MAX}"):
        decode(many, chunk_shape=(64, 64), dtype="uint8")


def test_a_planar_rgb_guess_is_named_in_the_refusal() -> None:
    """[write-1] tifffile writes a (3, Y, X) array as one page of 3 separate samples
    (planar RGB); into a chunk of 2 planes the refusal says so, and how to write it
    (it said "3 page(s)" for a file of one page)."""
    data = tiff_bytes(sample((3, 8, 16), "u2"), photometric=None)
    why = assert_invalid(data, "wrong shape", chunk_shape=(2, 8, 16), dtype="u2")
    assert "3 plane(s) of 8x16 in 1 page(s) of 3 separate samples per pixel" in why
    assert "photometric='minisblack'" in why
