"""Rows and columns are the axes named y and x, wherever they are ([read-13]): an RGB
image stored (y, x, c), as PIL/imageio/xarray give it, is 3 channels of an image, in
its chunk files, its whole-image files and in files written into it.

Layer tests first (plain calls: the layout, the written-file decoder), then real
mounts read by tifffile, ImageJ and Bio-Formats, and written by PIL.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

from zfuse.errors import InvalidTiffError
from zfuse.view.tiff import build_header, plan_layout
from zfuse.view.tiff_complete import early_refusal
from zfuse.view.tiff_input import decode_tiff
from zfuse.view.tiff_meta import array_axis_names, image_axes

from tools import bftool, imagej_stats_many, requires

THIRDPARTY = Path(__file__).resolve().parents[2] / "shared" / "thirdparty-zarr"
RGB = np.random.default_rng(7).integers(0, 255, size=(100, 90, 3), dtype=np.uint8)


def chunk_file(layout, chunk: np.ndarray, coords: tuple[int, ...]) -> bytes:  # noqa: ANN001
    return build_header(layout, coords) + np.ascontiguousarray(layout.to_file_order(chunk)).tobytes()


def tiff(values: np.ndarray, **kw: object) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, values, **kw)
    return out.getvalue()


# ----------------------------------------------------------------- the layer rules


def test_named_axes_pick_rows_and_columns() -> None:
    """[read-13] y and x by name, wherever they are; else the last two."""
    assert image_axes(3, ["y", "x", "c"]) == (0, 1)
    assert image_axes(3, ["Y", "X", "band"]) == (0, 1)
    assert image_axes(2, ["x", "y"]) == (1, 0)
    assert image_axes(3, ["c", "y", "x"]) == (1, 2)
    assert image_axes(3, None) == (1, 2)
    assert image_axes(3, ["y", "y", "x"]) == (1, 2)  # (ambiguous: the last two)
    assert image_axes(1, ["x"]) == (0,)
    assert image_axes(0, []) == ()
    layout = plan_layout((64, 48, 3), "u1", axes=["y", "x", "c"])
    assert layout.file_axes == (2, 0, 1)
    assert (layout.pages, layout.rows, layout.cols) == (3, 64, 48)
    assert "channels=3" in layout.description
    assert plan_layout((16, 32), "u2", axes=["x", "y"]).file_axes == (1, 0)
    # t and c around the image: pages in ImageJ's order, then y, x
    assert plan_layout((2, 8, 8, 3), "u1", axes=["t", "y", "x", "c"]).file_axes == (0, 3, 1, 2)


def test_unnamed_rgb_is_guessed_as_napari_does() -> None:
    """[read-13] no names, 3 or 4 elements last after two of more than 30: y, x, c."""
    assert array_axis_names((512, 512, 3), None) == ["y", "x", "c"]
    assert array_axis_names((10, 512, 512, 4), None) == ["", "y", "x", "c"]
    assert array_axis_names((512, 512, 3), ["y", "x", "band"]) == ["y", "x", "band"]
    assert array_axis_names((20, 20, 3), None) is None  # too small to be an image
    assert array_axis_names((512, 512, 5), None) is None
    assert array_axis_names((512, 3), None) is None
    assert array_axis_names((512, 512, 3), ["y", None, "c"]) == ["y", "x", "c"]  # (partial names: guessed)


def test_chunk_file_is_the_channels_of_the_image(tmp_path: Path) -> None:
    """[read-13] a (y, x, c) chunk's file: 3 pages, the channels, an ImageJ hyperstack."""
    layout = plan_layout((64, 48, 3), "u1", axes=["y", "x", "c"], scales=[0.5, 0.25, 1.0],
                         units=["micrometer", "micrometer", None])
    chunk = RGB[:64, :48]
    path = tmp_path / "c.tiff"
    path.write_bytes(chunk_file(layout, chunk, (0, 0, 0)))
    with tifffile.TiffFile(path) as tif:
        assert tif.series[0].axes == "CYX"
        np.testing.assert_array_equal(tif.asarray(), chunk.transpose(2, 0, 1))
        assert tif.imagej_metadata["channels"] == 3
        num, den = tif.pages[0].tags["XResolution"].value
        assert num / den == pytest.approx(4.0)  # x's scale, not c's
    # zfuse's own bytes decode back to the chunk in its own order
    back = decode_tiff(path.read_bytes(), chunk_shape=(64, 48, 3), dtype="u1", layout=layout)
    np.testing.assert_array_equal(back, chunk)


def test_interleaved_rgb_written_into_a_channels_chunk() -> None:
    """[read-13] an interleaved RGB TIFF (PIL, ImageMagick, tifffile) is the chunk's 3
    channels; planar RGB too; an RGB image into a one-plane chunk is refused, naming both."""
    layout = plan_layout((64, 48, 3), "u1", axes=["y", "x", "c"])
    chunk = RGB[:64, :48]
    for data in (tiff(chunk, photometric="rgb"), tiff(chunk, photometric="rgb", compression="zlib"),
                 tiff(chunk.transpose(2, 0, 1), photometric="rgb", planarconfig="separate"),
                 tiff(chunk.transpose(2, 0, 1), imagej=True, metadata={"axes": "CYX"})):
        back = decode_tiff(data, chunk_shape=(64, 48, 3), dtype="u1", layout=layout)
        np.testing.assert_array_equal(back, chunk)
    # RGBA into 4 channels
    rgba = np.dstack([chunk, chunk[..., :1]])
    layout4 = plan_layout((64, 48, 4), "u1", axes=["y", "x", "c"])
    np.testing.assert_array_equal(
        decode_tiff(tiff(rgba, photometric="rgb", extrasamples=["unassalpha"]), chunk_shape=(64, 48, 4),
                    dtype="u1", layout=layout4), rgba)
    gray = plan_layout((64, 48), "u1")
    data = tiff(chunk, photometric="rgb")
    decided, _, reason = early_refusal(data, [gray.file_shape((64, 48))], np.dtype("u1"))
    assert decided and reason is not None and "3 samples per pixel" in reason and "(64, 48)" in reason
    with pytest.raises(InvalidTiffError, match="3 samples per pixel"):
        decode_tiff(data, chunk_shape=(64, 48), dtype="u1", layout=gray)


# ----------------------------------------------------------------- real mounts


def make_store(path: Path) -> None:
    root = zarr.open_group(path, mode="w")
    named = root.create_array("named", shape=RGB.shape, chunks=(64, 64, 3), dtype="u1",
                              dimension_names=["y", "x", "c"])
    named[:] = RGB
    unnamed = root.create_array("unnamed", shape=RGB.shape, chunks=(64, 64, 1), dtype="u1")
    unnamed[:] = RGB
    xy = root.create_array("xy", shape=(40, 50), chunks=(16, 32), dtype="u2", dimension_names=["x", "y"])
    xy[:] = np.arange(2000, dtype="u2").reshape(40, 50)


@pytest.mark.mount
def test_rgb_stored_yxc_on_a_mount(tmp_path: Path, mount) -> None:
    """[read-13] [write-1] chunk files and whole-image files of (y, x, c) and (x, y)
    arrays, read by tifffile; PIL's RGB TIFF copied onto a chunk; zarr reads the mount."""
    from PIL import Image

    make_store(tmp_path / "rgb.zarr")
    m = mount(tmp_path / "rgb.zarr", "-o", "rw")
    with tifffile.TiffFile(m.path / "named" / "c" / "1" / "0" / "0.tiff") as tif:
        assert tif.imagej_metadata["channels"] == 3
        np.testing.assert_array_equal(tif.asarray()[:, :36], RGB[64:100, 0:64].transpose(2, 0, 1))
    # the unnamed RGB's chunks hold one channel each: each file one 64 x 64 image
    with tifffile.TiffFile(m.path / "unnamed" / "c" / "0" / "1" / "2.tiff") as tif:
        np.testing.assert_array_equal(tif.asarray(), np.pad(RGB[0:64, 64:90, 2], ((0, 0), (0, 38))))
    for name in ("named", "unnamed"):
        for image in ("image.ome.tif", "image.tif"):
            with tifffile.TiffFile(m.path / name / image) as tif:
                assert tif.series[0].axes == "CYX", (name, image)
                np.testing.assert_array_equal(tif.asarray(), RGB.transpose(2, 0, 1), err_msg=f"{name}/{image}")
    xy = np.arange(2000, dtype="u2").reshape(40, 50)
    np.testing.assert_array_equal(tifffile.imread(m.path / "xy" / "image.ome.tif"), xy.T)
    np.testing.assert_array_equal(tifffile.imread(m.path / "xy" / "c" / "1" / "0.tiff"), xy[16:32, 0:32].T)

    # a legacy tool writes an RGB TIFF: stored as the chunk's 3 channels
    edited = RGB[:64, :64][::-1].copy()
    Image.fromarray(edited).save(tmp_path / "edited.tif", compression="tiff_lzw")
    shutil.copyfile(tmp_path / "edited.tif", m.path / "named" / "c" / "0" / "0" / "0.tiff")
    stored = zarr.open_array(tmp_path / "rgb.zarr" / "named", mode="r")
    np.testing.assert_array_equal(stored[:64, :64], edited)
    # and zarr reading the mount sees the arrays as stored
    via = zarr.open_group(m.path, mode="r")
    for name in ("named", "unnamed", "xy"):
        np.testing.assert_array_equal(via[name][:], zarr.open_array(tmp_path / "rgb.zarr" / name, mode="r")[:])


@pytest.mark.mount
def test_imagej_and_bioformats_see_three_channels(tmp_path: Path, mount) -> None:
    """[read-13] ImageJ opens a (y, x, c) chunk file as 3 channels of 64 x 64; Bio-Formats
    reads image.ome.tif as SizeC 3 of the whole image."""
    requires("imagej")
    make_store(tmp_path / "rgb.zarr")
    m = mount(tmp_path / "rgb.zarr", "-o", "ro")
    (stats,) = imagej_stats_many([m.path / "named" / "c" / "0" / "0" / "0.tiff"])
    assert (stats["width"], stats["height"], stats["channels"]) == (64, 64, 3), stats
    out = bftool("ImageInfo", "-nopix", m.path / "unnamed" / "image.ome.tif").stdout
    assert "SizeC = 3" in out and "Width = 90" in out and "Height = 100" in out, out


@pytest.mark.mount
@pytest.mark.skipif(not (THIRDPARTY / "zarr_implementations").is_dir(), reason="no third-party stores")
def test_zarr_implementations_astronaut(tmp_path: Path, mount) -> None:
    """[read-13] the zarr_implementations RGB image (512, 512, 3), chunks (100, 100, 1), no
    names: each chunk file is one 100 x 100 image of one channel, image.ome.tif is CYX."""
    src = THIRDPARTY / "zarr_implementations" / "zarr.zr" / "blosc"
    m = mount(src, "-o", "ro")
    stored = zarr.open_array(src, mode="r")[:]
    np.testing.assert_array_equal(tifffile.imread(m.path / "1.2.2.tiff"), stored[100:200, 200:300, 2])
    with tifffile.TiffFile(m.path / "image.ome.tif") as tif:
        assert tif.series[0].axes == "CYX"
        np.testing.assert_array_equal(tif.asarray(), stored.transpose(2, 0, 1))


def test_samples_are_the_fastest_planes_whatever_the_ome_order_says() -> None:
    """[read-13] an RGB z-stack written as OME-TIFF with DimensionOrder XYZCT (Bio-Formats'
    default) into a (c=3, z=4) chunk: its samples are the channels (it was stored
    scrambled, close() saying 0); 3 samples that would split across the c=2 and t axes of
    a (t=3, c=2) chunk are refused, naming both."""
    vol = np.random.default_rng(3).integers(0, 255, (4, 64, 48, 3), dtype=np.uint8)
    for order in ("XYCZT", "XYZCT"):
        buf = io.BytesIO()
        tifffile.imwrite(buf, vol, photometric="rgb", ome=True, metadata={"axes": "ZYXS"})
        data = buf.getvalue().replace(b'DimensionOrder="XYCZT"', f'DimensionOrder="{order}"'.encode())
        layout = plan_layout((3, 4, 64, 48), "u1", axes=["c", "z", "y", "x"])
        back = decode_tiff(data, chunk_shape=(3, 4, 64, 48), dtype="u1", layout=layout)
        np.testing.assert_array_equal(back, vol.transpose(3, 0, 1, 2), err_msg=order)
    two = tiff(vol[:2], photometric="rgb")
    layout = plan_layout((3, 2, 64, 48), "u1", axes=["t", "c", "y", "x"])
    decided, _, reason = early_refusal(two, [layout.file_shape((3, 2, 64, 48))], np.dtype("u1"))
    assert decided and reason is not None and "fastest planes are not 3" in reason
    with pytest.raises(InvalidTiffError, match="fastest planes are not 3"):
        decode_tiff(two, chunk_shape=(3, 2, 64, 48), dtype="u1", layout=layout)


def test_a_legacy_ome_rgb_image_is_labelled_by_its_guessed_axes(tmp_path: Path) -> None:
    """[read-13] an OME-Zarr 0.3 multiscale (no axes) of an RGB image stored (y, x, 3):
    image.ome.tif and pyramid.ome.tif are CYX, as its chunk files are (its channels
    were labelled Z)."""
    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view
    from zfuse.stats import Stats

    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", zarr_format=2)
    root.create_array("0", shape=RGB.shape, chunks=(64, 64, 3), dtype="u1")[...] = RGB
    root.attrs["multiscales"] = [{"version": "0.3", "datasets": [{"path": "0"}]}]
    view = make_view(MountConfig([str(tmp_path / "img.zarr")], "/unused", read_only=True), Stats())
    for rel in (("0",), ()):
        name = "image.ome.tif" if rel else "pyramid.ome.tif"
        image = view.whole_images(rel)[name]
        with tifffile.TiffFile(io.BytesIO(bytes(image.read(0, image.size)))) as tif:
            assert tif.series[0].axes == "CYX", name
            np.testing.assert_array_equal(tif.asarray(), RGB.transpose(2, 0, 1))


@pytest.mark.skipif(not (THIRDPARTY / "ome-zarr-py").is_dir(), reason="no third-party stores")
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_ome_zarr_0_1_and_0_2_channels_are_channels(version: str) -> None:
    """[read-13] ome-zarr-py's OME-Zarr 0.1 and 0.2 samples, (1, 2, 1, 16, 16) with no axes
    named (those versions imply t, c, z, y, x): a chunk file has 2 ImageJ channels, and
    image.ome.tif and pyramid.ome.tif SizeC 2 (they were 2 z slices)."""
    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view
    from zfuse.stats import Stats

    view = make_view(MountConfig([str(THIRDPARTY / "ome-zarr-py" / version)], "/unused", read_only=True), Stats())
    arr, coords = view.chunk_at(("0", "0.0.0.0.0.tiff"))
    if coords is None:  # ("/"-separated keys)
        arr, coords = view.chunk_at(("0", "0", "0", "0", "0", "0.tiff"))
    assert arr is not None and coords is not None
    with tifffile.TiffFile(io.BytesIO(bytes(arr.read(coords, 0, arr.file_size(coords))))) as tif:
        assert tif.imagej_metadata["channels"] == 2 and "slices" not in tif.imagej_metadata
    for rel, name in ((("0",), "image.ome.tif"), ((), "pyramid.ome.tif")):
        image = view.whole_images(rel)[name]
        with tifffile.TiffFile(io.BytesIO(bytes(image.read(0, image.size)))) as tif:
            assert tif.series[0].axes.endswith("CYX") and tif.series[0].shape[-3] == 2, name


def test_a_file_written_in_zarr_order_is_read_so_where_it_says_it() -> None:
    """[read-13] [read-1] `tifffile.imwrite(path, chunk)` of a chunk whose y and x are not
    its last two axes ((x, y), (y, x, 5 bands), (y, c, x)): the file's shape description
    says zarr's order, and it is stored exactly (it was refused as the wrong shape, or a
    square (x, y) one stored transposed; a square one still fits both orders: the chunk
    file's is taken)."""
    rng = np.random.default_rng(9)
    for shape, names in (((32, 16), ["x", "y"]), ((64, 48, 5), ["y", "x", "band"]), ((16, 2, 32), ["y", "c", "x"])):
        chunk = rng.integers(0, 60000, size=shape).astype("u2")
        layout = plan_layout(shape, "u2", axes=names)
        assert layout.moves_image
        out = io.BytesIO()
        tifffile.imwrite(out, chunk)
        data = out.getvalue()
        assert early_refusal(data, [layout.file_shape(shape), shape], np.dtype("u2"))[2] is None
        np.testing.assert_array_equal(decode_tiff(data, chunk_shape=shape, dtype="u2", layout=layout), chunk,
                                      err_msg=str(names))
    square = rng.integers(0, 60000, size=(48, 48)).astype("u2")
    layout = plan_layout((48, 48), "u2", axes=["x", "y"])
    out = io.BytesIO()
    tifffile.imwrite(out, square.T)  # (a chunk file read with tifffile, written back)
    np.testing.assert_array_equal(decode_tiff(out.getvalue(), chunk_shape=(48, 48), dtype="u2", layout=layout),
                                  square)


def test_review_cases_of_written_planes() -> None:
    """[read-13] a zarr-order file whose geometry is also the chunk file's but whose
    description says zarr's order ((y, z, c, x), y == c) is read in zarr's order (it was
    stored scrambled); 2 RGB pages are a c=6 chunk's channels (refused for a while); an
    OME RGB of 6 channels whose DimensionOrder puts C among other planes is refused,
    not scrambled; a 1-band (y, x, band) chunk allows no more IFDs than its one plane
    does (32,784 IFDs of 1 x 1 cost 3 s of parsing)."""
    rng = np.random.default_rng(5)
    chunk = rng.integers(0, 60000, size=(8, 4, 8, 64)).astype("u2")
    layout = plan_layout(chunk.shape, "u2", axes=["y", "z", "c", "x"])
    np.testing.assert_array_equal(
        decode_tiff(tiff(chunk), chunk_shape=chunk.shape, dtype="u2", layout=layout), chunk)
    six = rng.integers(0, 255, size=(6, 64, 48)).astype("u1")
    layout = plan_layout(six.shape, "u1", axes=["c", "y", "x"])
    rgb_pages = tiff(six.reshape(2, 3, 64, 48).transpose(0, 2, 3, 1), photometric="rgb")
    np.testing.assert_array_equal(decode_tiff(rgb_pages, chunk_shape=six.shape, dtype="u1", layout=layout), six)
    vol = rng.integers(0, 255, size=(2, 4, 64, 48, 3)).astype("u1")
    buf = io.BytesIO()
    tifffile.imwrite(buf, vol, photometric="rgb", ome=True, metadata={"axes": "CZYXS"})
    layout = plan_layout((6, 4, 64, 48), "u1", axes=["c", "z", "y", "x"])
    with pytest.raises(InvalidTiffError, match="DimensionOrder"):
        decode_tiff(buf.getvalue(), chunk_shape=(6, 4, 64, 48), dtype="u1", layout=layout)
    layout = plan_layout((4096, 64, 1), "u1", axes=["y", "x", "band"])
    many = io.BytesIO()
    with tifffile.TiffWriter(many) as writer:
        for _ in range(200):
            writer.write(np.zeros((1, 1), np.uint8), photometric="minisblack", metadata=None)
    with pytest.raises(InvalidTiffError, match="IFDs"):
        decode_tiff(many.getvalue(), chunk_shape=(4096, 64, 1), dtype="u1", layout=layout)
