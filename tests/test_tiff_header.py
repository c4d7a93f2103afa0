"""The generated chunk-file header, checked by real readers: tifffile, libtiff
(tiffinfo, tiffcp) and headless ImageJ; plus the layout invariants (fixed
header size, position round trip, BigTIFF threshold)."""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
from hypothesis import given, settings
from hypothesis import strategies as st

from zfuse.view.tiff import TiffLayout, build_header, plan_layout, tiff_unsupported_reason
from zfuse.view.tiff_meta import POSITION_TAG
from zfuse.view.tiff_parse import parse_position, read_position

from stores import sample
from tools import have, imagej_stats_many, requires, tiffcp, tiffinfo

DTYPES = ["?", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "c8", "c16"]
SHAPES = [(), (7,), (5, 6), (1, 5, 6), (3, 5, 6), (2, 3, 4, 5), (2, 1, 3, 4, 5)]

# (tag, name) every page must carry
REQUIRED_TAGS = [
    "NewSubfileType",
    "ImageWidth",
    "ImageLength",
    "BitsPerSample",
    "Compression",
    "PhotometricInterpretation",
    "StripOffsets",
    "SamplesPerPixel",
    "RowsPerStrip",
    "StripByteCounts",
    "PlanarConfiguration",
    "SampleFormat",
]


def raw(layout: TiffLayout, chunk: np.ndarray) -> bytes:
    """Pixel bytes exactly as the view serves them (pages in the file's order)."""
    return np.ascontiguousarray(layout.to_file_order(chunk)).astype(layout.dtype).tobytes()


def write_chunk(
    path: Path, layout: TiffLayout, chunk: np.ndarray, coords: tuple[int, ...], **kw: object
) -> Path:
    header = build_header(layout, coords, **kw)  # type: ignore[arg-type]
    assert len(header) == layout.header_size
    path.write_bytes(header + raw(layout, chunk))
    return path


def read_pages(path: Path) -> np.ndarray:
    with tifffile.TiffFile(path) as tif:
        return np.stack([p.asarray() for p in tif.pages])


def as_chunk_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    # bool is stored as uint8 0/1: that is what readers return
    return a.astype(bool) if np.dtype(dtype).kind == "b" else a


# --------------------------------------------------------------------- tifffile


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tifffile_reads_exact_chunk(tmp_path: Path, shape: tuple[int, ...], dtype: str) -> None:
    layout = plan_layout(shape, dtype, grid_shape=[4] * len(shape))
    chunk = sample(shape, dtype)
    coords = tuple(range(1, len(shape) + 1))[: len(shape)]
    coords = tuple(min(c, 3) for c in coords)
    path = write_chunk(tmp_path / "c.tiff", layout, chunk, coords)
    assert path.stat().st_size == layout.file_size

    pages, rows, cols = layout.pages, layout.rows, layout.cols
    assert pages * rows * cols == max(math.prod(shape), 1)
    with tifffile.TiffFile(path) as tif:
        assert tif.byteorder == "<"
        assert not tif.is_bigtiff
        assert len(tif.pages) == pages
        for k, page in enumerate(tif.pages):
            names = {tag.name for tag in page.tags}
            assert set(REQUIRED_TAGS) <= names, set(REQUIRED_TAGS) - names
            assert page.shape == (rows, cols)
            assert page.compression == 1
            assert page.photometric == 1
            assert page.samplesperpixel == 1
            assert page.bitspersample == layout.dtype.itemsize * 8
            # one strip per page, contiguous after the header, in page order
            assert page.dataoffsets == (layout.header_size + k * layout.page_bytes,)
            assert page.databytecounts == (layout.page_bytes,)
            got = page.dtype
            want = np.dtype("u1") if layout.dtype.kind == "b" else layout.dtype
            assert got is not None and got.newbyteorder("<") == want
        # the whole-file read (ImageJ series for stacks) agrees too
        whole = tif.asarray()
    expect = chunk.reshape(pages, rows, cols)
    np.testing.assert_array_equal(as_chunk_dtype(read_pages(path), dtype), expect)
    np.testing.assert_array_equal(as_chunk_dtype(whole, dtype).reshape(shape), chunk)
    assert parse_position(path.read_bytes()[: layout.header_size]) == coords


# ---------------------------------------------------------------- libtiff tools


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiffinfo_and_tiffcp(tmp_path: Path, dtype: str) -> None:
    requires("tiffinfo", "tiffcp")
    for i, shape in enumerate(SHAPES):
        layout = plan_layout(shape, dtype, scales=[0.5] * len(shape))
        chunk = sample(shape, dtype, seed=i)
        src = write_chunk(tmp_path / f"c{i}.tiff", layout, chunk, (0,) * len(shape))
        # -D decodes every strip: any libtiff complaint is a failure
        info = tiffinfo(src, "-D")
        assert info.count("TIFF Directory at offset") == layout.pages
        assert '"chunk":[' in info  # position readable by libtiff users
        dst = tmp_path / f"copy{i}.tiff"
        tiffcp(src, dst)
        np.testing.assert_array_equal(
            as_chunk_dtype(read_pages(dst), dtype), chunk.reshape(layout.pages, -1, layout.cols)
        )


def test_tiffinfo_reports_fields(tmp_path: Path) -> None:
    requires("tiffinfo")
    layout = plan_layout((4, 6, 8), "f4", scales=[2.0, 0.5, 0.25], units=["micrometer"] * 3)
    src = write_chunk(tmp_path / "c.tiff", layout, sample((4, 6, 8), "f4"), (1, 2, 3))
    info = tiffinfo(src)
    assert "Image Width: 8 Image Length: 6" in info
    assert "Bits/Sample: 32" in info
    assert "Sample Format: IEEE floating point" in info
    assert "Photometric Interpretation: min-is-black" in info
    assert "Compression Scheme: None" in info
    assert "Resolution: 4, 2 (unitless)" in info
    assert "images=4" in info


# ----------------------------------------------------------------------- ImageJ

# ImageJ 1.53t (Debian) opens these natively (u4 is read as *signed* 32-bit: keep < 2**31;
# i1 is read as unsigned 8-bit; f8, f2, 64-bit ints and complex do not open).
IJ_DTYPES = {"?": 8, "u1": 8, "u2": 16, "i2": 16, "f4": 32, "i4": 32, "u4": 32}


def ij_sample(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    a = sample(shape, dtype, seed)
    if dtype == "u4":
        a = a // 2  # ImageJ reads uint32 as int32
    if dtype in ("f4", "i4", "u4"):
        a = (a % 100000).astype(dtype)  # ImageJ's float32 statistics stay exact enough
    return a


@pytest.mark.imagej
def test_imagej_opens_chunks(tmp_path: Path) -> None:
    """One ImageJ run over many files: dtypes, stack layouts, calibration, cropping."""
    requires("imagej")
    cases: list[tuple[Path, np.ndarray, dict[str, object]]] = []

    def add(name: str, chunk: np.ndarray, layout: TiffLayout, expect: dict, **kw: object) -> None:
        coords = (0,) * chunk.ndim
        path = write_chunk(tmp_path / f"{name}.tiff", layout, chunk, coords, **kw)
        cases.append((path, chunk, expect))

    for i, (dtype, bits) in enumerate(IJ_DTYPES.items()):
        for shape in [(5, 6), (3, 5, 6), (7,)]:
            chunk = ij_sample(shape, dtype, i)
            layout = plan_layout(shape, dtype)
            expect = {"bitDepth": bits, "nSlices": layout.pages}
            add(f"{dtype}_{len(shape)}", chunk, layout, expect)

    hyper = [
        # (axes, types, shape, (channels, slices, frames))
        ("tzcyx", None, (2, 3, 4, 5, 6), (4, 3, 2)),
        ("tczyx", None, (2, 3, 4, 5, 6), (3, 4, 2)),  # OME order: pages reordered c, z, t
        ("tczyx", None, (1, 1, 4, 5, 6), (1, 4, 1)),  # size-1 axes do not matter
        ("tczyx", None, (2, 1, 4, 5, 6), (1, 4, 2)),
        ("cyx", ["channel", "space", "space"], (3, 5, 6), (3, 1, 1)),
        ("tyx", ["time", "space", "space"], (4, 5, 6), (1, 1, 4)),
        ("zyx", None, (4, 5, 6), (1, 4, 1)),
        ("abcyx", None, (2, 2, 2, 5, 6), (1, 8, 1)),
    ]
    for i, (axes, types, shape, (c, z, t)) in enumerate(hyper):
        chunk = ij_sample(shape, "u2", 7)
        layout = plan_layout(shape, "u2", axes=list(axes), axis_types=types)
        add(f"hyper{i}_{axes}", chunk, layout, {"channels": c, "slices": z, "frames": t})

    calib = plan_layout(
        (4, 5, 6), "u1", axes="zyx", scales=[2.0, 0.5, 0.25], units=["micrometer"] * 3
    )
    add(
        "calibrated",
        ij_sample((4, 5, 6), "u1", 3),
        calib,
        {"pixelWidth": 0.25, "pixelHeight": 0.5, "pixelDepth": 2.0, "unit": "micron"},
    )
    crop_layout = plan_layout((4, 5, 6), "u2", grid_shape=(3, 3, 3))
    cropped = ij_sample((2, 3, 6), "u2", 9)
    add("cropped", cropped, crop_layout, {"nSlices": 2}, shape=(2, 3, 6))

    t0 = time.monotonic()
    results = imagej_stats_many([p for p, _, _ in cases])
    elapsed = time.monotonic() - t0
    assert elapsed < 60, f"ImageJ took {elapsed:.1f}s"
    for (path, chunk, expect), got in zip(cases, results, strict=True):
        pages, rows, cols = (
            (math.prod(chunk.shape[:-2]), *chunk.shape[-2:])
            if chunk.ndim >= 2
            else (1, 1, chunk.shape[-1])
        )
        assert (got["width"], got["height"], got["nSlices"]) == (cols, rows, pages), path.name
        assert got["mean"] == pytest.approx(float(chunk.astype(np.float64).mean()), rel=1e-6)
        assert got["min"] == pytest.approx(float(chunk.min()))
        assert got["max"] == pytest.approx(float(chunk.max()))
        for key, value in expect.items():
            if key == "unit":
                assert str(value) in str(got["unit"]), (path.name, got)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value), (path.name, key, got)
            else:
                assert got[key] == value, (path.name, key, got)


# --------------------------------------------------------------- header layout


def test_typical_sizes() -> None:
    flat = plan_layout((512, 512), "u2", grid_shape=(40, 40))
    stack = plan_layout((16, 512, 512), "u2", grid_shape=(10, 40, 40))
    assert flat.data_size == 512 * 512 * 2
    assert stack.data_size == 16 * 512 * 512 * 2
    assert flat.header_size % 16 == 0 and stack.header_size % 16 == 0
    assert flat.header_size < 512
    assert stack.header_size < 4096
    assert not flat.bigtiff and not stack.bigtiff


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    shape=st.lists(st.integers(1, 9), min_size=0, max_size=5).map(tuple),
    dtype=st.sampled_from(DTYPES),
)
def test_header_size_constant_and_position_round_trip(
    data: st.DataObject, shape: tuple[int, ...], dtype: str
) -> None:
    grid = tuple(
        data.draw(st.lists(st.integers(1, 5000), min_size=len(shape), max_size=len(shape)))
    )
    layout = plan_layout(shape, dtype, grid_shape=grid)
    coords = tuple(data.draw(st.integers(0, g - 1)) for g in grid)
    header = build_header(layout, coords)
    assert len(header) == layout.header_size
    assert parse_position(header) == coords
    record = read_position(header)
    assert record["origin"] == [c * n for c, n in zip(coords, shape, strict=True)]
    assert record["shape"] == list(shape)
    # the biggest and smallest coordinates give the same size
    assert len(build_header(layout, tuple(g - 1 for g in grid))) == layout.header_size
    assert len(build_header(layout, (0,) * len(shape))) == layout.header_size
    # a cropped edge chunk too, with the same position fields
    crop = tuple(data.draw(st.integers(1, n)) for n in shape)
    cropped = build_header(layout, coords, shape=crop)
    assert len(cropped) == layout.header_size
    assert parse_position(cropped) == coords
    assert read_position(cropped)["shape"] == list(crop)


def test_cropped_header_describes_smaller_image(tmp_path: Path) -> None:
    layout = plan_layout((4, 6, 8), "i2", grid_shape=(3, 3, 3))
    crop = (3, 2, 5)
    chunk = sample(crop, "i2")
    path = write_chunk(tmp_path / "c.tiff", layout, chunk, (2, 2, 2), shape=crop)
    assert path.stat().st_size == layout.header_size + chunk.nbytes
    with tifffile.TiffFile(path) as tif:
        assert len(tif.pages) == 3
        assert tif.pages[0].dataoffsets[0] == layout.header_size  # data still at header_size
        assert tif.imagej_metadata["images"] == 3
        np.testing.assert_array_equal(tif.asarray(), chunk)
    assert parse_position(path.read_bytes()) == (2, 2, 2)


def test_origin_in_imagej_description() -> None:
    layout = plan_layout((4, 6, 8), "u2", axes="zyx", grid_shape=(10, 10, 10))
    header = build_header(layout, (1, 2, 3))
    md = imagej_metadata(header)
    assert (md["xorigin"], md["yorigin"], md["zorigin"]) == (-24, -12, -4)
    custom = build_header(layout, (1, 2, 3), origin=(5, 6, 7))
    assert read_position(custom)["origin"] == [5, 6, 7]


def imagej_metadata(header: bytes) -> dict:
    with tifffile.TiffFile(io.BytesIO(header)) as tif:
        md = tif.imagej_metadata
    assert md is not None
    return md


@pytest.mark.parametrize(
    "shape, axes, types, expect",
    [
        ((2, 3, 4, 5, 6), "tzcyx", None, {"channels": 4, "slices": 3, "frames": 2}),
        ((2, 3, 4, 5, 6), "tczyx", None, {"channels": 3, "slices": 4, "frames": 2}),
        ((1, 1, 16, 5, 6), "tczyx", None, {"slices": 16}),
        ((1, 3, 1, 5, 6), "tczyx", None, {"channels": 3}),
        ((3, 5, 6), "cyx", ["channel", "space", "space"], {"channels": 3}),
        ((3, 5, 6), "qyx", ["time", "space", "space"], {"frames": 3}),
        ((3, 5, 6), None, None, {"slices": 3}),
        ((2, 4, 5, 6), None, None, {"slices": 8}),
        ((2, 4, 5, 6), ["a", "b", "y", "x"], ["custom", "space", "space", "space"], {"slices": 8}),
        ((2, 4, 5, 6), "zzyx", None, {"slices": 8}),
    ],
)
def test_imagej_dimensions(
    shape: tuple[int, ...], axes: str | None, types: list[str] | None, expect: dict[str, int]
) -> None:
    layout = plan_layout(shape, "u1", axes=None if axes is None else list(axes), axis_types=types)
    md = imagej_metadata(build_header(layout, (0,) * len(shape)))
    assert md["images"] == math.prod(shape[:-2])
    got = {k: md[k] for k in ("channels", "slices", "frames") if k in md}
    assert got == expect
    assert md.get("hyperstack", False) == (
        expect.get("channels", 1) > 1 or expect.get("frames", 1) > 1
    )


def test_calibration_from_ome_axes() -> None:
    layout = plan_layout(
        (1, 1, 4, 5, 6),
        "u2",
        axes="tczyx",
        axis_types=["time", "channel", "space", "space", "space"],
        scales=[1.5, 1.0, 2.0, 0.5, 0.25],
        units=["second", None, "micrometer", "micrometer", "micrometer"],
    )
    header = build_header(layout, (0, 0, 0, 0, 0))
    md = imagej_metadata(header)
    assert md["unit"] == "micron" and md["spacing"] == 2.0 and md["finterval"] == 1.5
    with tifffile.TiffFile(io.BytesIO(header)) as tif:
        tags = tif.pages[0].tags
        assert tags["XResolution"].value == (4, 1)
        assert tags["YResolution"].value == (2, 1)
        assert tags["ResolutionUnit"].value == 1


def test_position_in_document_name_and_page_name(tmp_path: Path) -> None:
    layout = plan_layout((5, 6), "u1", grid_shape=(100, 100))
    path = write_chunk(tmp_path / "c.tiff", layout, sample((5, 6), "u1"), (42, 7))
    with tifffile.TiffFile(path) as tif:
        tags = tif.pages[0].tags
        for code in (269, POSITION_TAG):
            value = tags[code].value
            assert value.startswith('{"chunk":[42,7],"origin":[210,42]')


def test_build_header_is_cheap() -> None:
    layout = plan_layout((16, 512, 512), "u2", grid_shape=(100, 100, 100))
    n = 2000
    t0 = time.perf_counter()
    for i in range(n):
        build_header(layout, (i % 100, 3, 7))
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 100e-6, f"{per_call * 1e6:.1f} us per header"


def test_many_pages_plan_fast() -> None:
    t0 = time.perf_counter()
    layout = plan_layout((20000, 1, 1), "u1")
    assert time.perf_counter() - t0 < 2
    assert layout.pages == 20000
    with tifffile.TiffFile(io.BytesIO(build_header(layout, (0, 0, 0)) + bytes(20000))) as tif:
        assert len(tif.pages) == 20000
        assert tif.pages[-1].dataoffsets[0] == layout.header_size + 19999


# ---------------------------------------------------------------------- BigTIFF


def test_classic_up_to_4gib_then_bigtiff() -> None:
    small = plan_layout((65535, 65535), "u1")
    assert small.file_size <= 2**32 - 1 and not small.bigtiff
    big = plan_layout((65536, 65536), "u1")
    assert big.bigtiff
    assert build_header(big, (0, 0))[:4] == b"II+\0"
    assert build_header(small, (0, 0))[:4] == b"II*\0"


def test_bigtiff_header_parses_over_sparse_file(tmp_path: Path) -> None:
    layout = plan_layout((3, 30000, 30000), "u2", axes="zyx", grid_shape=(2, 2, 2))
    assert layout.bigtiff and layout.file_size > 2**32
    path = tmp_path / "big.tiff"
    with path.open("wb") as f:
        f.write(build_header(layout, (1, 0, 1)))
        f.truncate(layout.file_size)  # sparse: nothing written past the header
    with tifffile.TiffFile(path) as tif:
        assert tif.is_bigtiff
        assert len(tif.pages) == 3
        last = tif.pages[2]
        assert last.shape == (30000, 30000)
        assert last.dataoffsets[0] == layout.header_size + 2 * layout.page_bytes
        assert last.dataoffsets[0] + last.databytecounts[0] == layout.file_size
        assert tif.imagej_metadata["images"] == 3
    assert parse_position(path.open("rb").read(layout.header_size)) == (1, 0, 1)
    if have("tiffinfo"):
        info = tiffinfo(path)
        assert info.count("TIFF Directory at offset") == 3


# ------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "dtype, word",
    [
        ("S4", "string"),
        ("U3", "string"),
        ("O", "object"),
        ("M8[s]", "datetime"),
        ("m8[s]", "timedelta"),
        ([("a", "u1"), ("b", "f4")], "structured"),
        ("V8", "void"),
        ("f16" if hasattr(np, "float128") else "V16", ""),
    ],
)
def test_unsupported_dtypes(dtype: object, word: str) -> None:
    reason = tiff_unsupported_reason(dtype)
    assert reason is not None and word in reason
    with pytest.raises(ValueError, match="TIFF"):
        plan_layout((2, 2), dtype)


@pytest.mark.parametrize("dtype", DTYPES + [">u2", ">f8", "<c8"])
def test_supported_dtypes(dtype: str) -> None:
    assert tiff_unsupported_reason(dtype) is None
    assert plan_layout((2, 2), dtype).dtype.byteorder in "<|"


def test_argument_errors() -> None:
    layout = plan_layout((4, 5), "u1", grid_shape=(10, 10))
    with pytest.raises(ValueError, match="chunk coordinates"):
        build_header(layout, (1,))
    with pytest.raises(ValueError, match="reserves"):
        build_header(layout, (10, 0))  # more digits than the grid allows
    with pytest.raises(ValueError, match="cropped shape"):
        build_header(layout, (0, 0), shape=(5, 5))
    with pytest.raises(ValueError, match="cropped shape"):
        build_header(layout, (0, 0), shape=(0, 5))
    with pytest.raises(ValueError, match="positive"):
        plan_layout((0, 5), "u1")
    with pytest.raises(ValueError, match="one entry per axis"):
        plan_layout((4, 5), "u1", axes=["y"])
    with pytest.raises(ValueError, match="zfuse chunk position"):
        parse_position(tifffile_bytes())


def tifffile_bytes() -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, np.zeros((2, 2), "u1"))
    return buf.getvalue()


def test_ome_tczyx_chunk_is_an_imagej_hyperstack_in_czt_page_order(tmp_path: Path) -> None:
    """OME-Zarr stores (t, c, z, y, x); ImageJ's pages run c fastest, then z, then t.
    The file's pages follow ImageJ, so tifffile (and ImageJ) see a true TZCYX hyperstack."""
    chunk = sample((2, 3, 4, 5, 6), "u2", 11)
    layout = plan_layout(chunk.shape, "u2", axes=list("tczyx"),
                         scales=[1.5, 1.0, 2.0, 0.5, 0.25],
                         units=["second", None, "micrometer", "micrometer", "micrometer"])
    assert layout.file_axes == (0, 2, 1, 3, 4)
    path = write_chunk(tmp_path / "c.tiff", layout, chunk, (0,) * 5)
    with tifffile.TiffFile(path) as tif:
        assert tif.is_imagej
        series = tif.series[0]
        assert series.axes == "TZCYX"
        np.testing.assert_array_equal(series.asarray(), chunk.transpose(0, 2, 1, 3, 4))
        md = tif.imagej_metadata
    assert (md["channels"], md["slices"], md["frames"], md["spacing"]) == (3, 4, 2, 2.0)
    # page k = (t, z, c) with c fastest
    pages = read_pages(path)
    np.testing.assert_array_equal(pages[1], chunk[0, 1, 0])  # t0 z0 c1
    np.testing.assert_array_equal(pages[3], chunk[0, 0, 1])  # t0 z1 c0
    np.testing.assert_array_equal(pages[12], chunk[1, 0, 0])  # t1 z0 c0
    # a cropped edge chunk keeps the same order
    crop = chunk[:, :2, :3, :4, :5]
    cut = write_chunk(tmp_path / "crop.tiff", layout, crop, (0,) * 5, shape=crop.shape)
    with tifffile.TiffFile(cut) as tif:
        assert tif.series[0].axes == "TZCYX"
        np.testing.assert_array_equal(tif.series[0].asarray(), crop.transpose(0, 2, 1, 3, 4))


def test_pages_keep_chunk_order_when_already_imagej_order_or_unnamed() -> None:
    assert plan_layout((2, 3, 4, 5, 6), "u2", axes=list("tzcyx")).file_axes == (0, 1, 2, 3, 4)
    assert plan_layout((2, 3, 4, 5, 6), "u2").file_axes == (0, 1, 2, 3, 4)  # a plain stack
    assert plan_layout((2, 3, 4, 5, 6), "u2", axes=list("zzcyx")).file_axes == (0, 1, 2, 3, 4)
    # size-1 axes stay put; only the axes with pages are reordered
    assert plan_layout((1, 3, 4, 5, 6), "u2", axes=list("tczyx")).file_axes == (0, 2, 1, 3, 4)
    assert plan_layout((2, 1, 4, 5, 6), "u2", axes=list("tczyx")).file_axes == (0, 1, 2, 3, 4)
    assert plan_layout((3, 2, 5, 6), "u2", axes=list("czyx")).file_axes == (1, 0, 2, 3)
