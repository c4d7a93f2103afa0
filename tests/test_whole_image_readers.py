"""Whole-image files opened by the readers people run: plain ImageJ 1.x (`image.tif`,
the stripped file), OpenSlide (`slide.tif`, the pyramid as successive tiled IFDs)
and the Python OME-TIFF readers (bioio, aicsimageio) on `image.ome.tif`.

Real mounts, read by the programs themselves (headless ImageJ from the Debian
`imagej` package; openslide-python with openslide-bin; bioio).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from zarr.codecs import BloscCodec

from zfuse.daemon import MountConfig
from zfuse.open_view import make_view
from zfuse.stats import Stats

from tools import _INIT, _check_paths, _run_macro, requires

pytestmark = pytest.mark.mount

# aicsimageio pins zarr 2.15 and tifffile 2023: it runs in a venv of its own (the Makefile's
# .venv-aics), given here as its Python
AICS = os.environ.get("ZFUSE_AICS_PYTHON")

AXES = [
    {"name": "t", "type": "time", "unit": "second"},
    {"name": "c", "type": "channel"},
    {"name": "z", "type": "space", "unit": "micrometer"},
    {"name": "y", "type": "space", "unit": "micrometer"},
    {"name": "x", "type": "space", "unit": "micrometer"},
]
CHANNELS = [
    {"label": "DAPI", "color": "0000FF", "window": {"start": 10, "end": 3000, "min": 0, "max": 4000}},
    {"label": "GFP", "color": "00FF00", "window": {"start": 20, "end": 2000, "min": 0, "max": 4000}},
    {"label": "RFP", "color": "FF0000", "window": {"start": 30, "end": 1000, "min": 0, "max": 4000}},
]


def stats_of(mount_path: Path) -> dict:
    return json.loads((mount_path / ".zfuse" / "stats").read_text())


def tczyx_store(path: Path, shape=(2, 3, 4, 150, 130), chunks=(1, 1, 1, 64, 64), dtype="uint16",
                scale=(2.0, 1.0, 0.5, 0.25, 0.125), name="cells") -> np.ndarray:
    """An OME-Zarr 0.4 image (t, c, z, y, x) with omero channels: level 0 only."""
    root = zarr.open_group(str(path), mode="w")
    a = root.create_array("0", shape=shape, chunks=chunks, dtype=dtype, fill_value=0, compressors=[BloscCodec()])
    values = np.random.default_rng(28).integers(0, 4000, size=shape).astype(dtype)
    a[...] = values
    root.attrs["multiscales"] = [{
        "version": "0.4", "name": name, "axes": AXES,
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": list(scale)}]}],
    }]
    root.attrs["omero"] = {"channels": CHANNELS}
    return values


# -- plain ImageJ 1.x: image.tif ---------------------------------------------------------

_REGION_MACRO = _INIT + r"""
setBatchMode(true);
args = split(getArgument(), "\n");
open(args[0]);
getDimensions(w, h, c, z, t);
getVoxelSize(pw, ph, pd, unit);
print("ZFUSE_DIMS\t" + w + "\t" + h + "\t" + c + "\t" + z + "\t" + t + "\t" + bitDepth() + "\t"
      + Stack.isHyperstack + "\t" + is("composite") + "\t" + d2s(pw, 9) + "\t" + d2s(ph, 9) + "\t"
      + d2s(pd, 9) + "\t" + unit + "\t" + d2s(Stack.getFrameInterval(), 9));
for (cc = 1; cc <= c; cc++) {
  Stack.setPosition(cc, 1, 1);
  getMinAndMax(lo, hi);
  getLut(r, g, b);
  print("ZFUSE_CHANNEL\t" + cc + "\t" + d2s(lo, 3) + "\t" + d2s(hi, 3) + "\t" + r[255] + "\t" + g[255]
        + "\t" + b[255]);
}
x0 = parseInt(args[1]); y0 = parseInt(args[2]); n = parseInt(args[3]);
for (tt = 1; tt <= t; tt++) {
  for (zz = 1; zz <= z; zz++) {
    for (cc = 1; cc <= c; cc++) {
      Stack.setPosition(cc, zz, tt);
      s = "";
      for (y = y0; y < y0 + n; y++)
        for (x = x0; x < x0 + n; x++)
          s = s + getValue(x, y) + ",";  // (calibrated: int16 as stored)
      print("ZFUSE_REGION\t" + cc + "\t" + zz + "\t" + tt + "\t" + s);
    }
  }
}
print("ZFUSE_DONE");
"""


def imagej_region(path: Path, x0: int, y0: int, n: int) -> dict:
    """Open a file with ImageJ's own open(): dimensions, calibration, per-channel display
    range and LUT top colour, and an n x n region of every plane ({(c, z, t): array})."""
    (file,) = _check_paths([path])
    out = _run_macro(_REGION_MACRO, f"{file}\n{x0}\n{y0}\n{n}")
    dims = [line.split("\t")[1:] for line in out.splitlines() if line.startswith("ZFUSE_DIMS\t")]
    if not dims or "ZFUSE_DONE" not in out:
        raise AssertionError(f"ImageJ did not open {file}; output:\n{out}")
    w, h, c, z, t, bits, hyper, composite, pw, ph, pd, unit, finterval = dims[0]
    channels, regions = {}, {}
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] == "ZFUSE_CHANNEL":
            channels[int(parts[1]) - 1] = (float(parts[2]), float(parts[3]), tuple(int(v) for v in parts[4:7]))
        elif parts[0] == "ZFUSE_REGION":
            values = [float(v) for v in parts[4].split(",") if v]
            regions[(int(parts[1]) - 1, int(parts[2]) - 1, int(parts[3]) - 1)] = np.array(values).reshape(n, n)
    return {"width": int(w), "height": int(h), "channels": int(c), "slices": int(z), "frames": int(t),
            "bits": int(bits), "hyperstack": hyper in ("1", "true"), "composite": composite in ("1", "true"),
            "pixelWidth": float(pw), "pixelHeight": float(ph), "pixelDepth": float(pd), "unit": unit,
            "frameInterval": float(finterval), "channel": channels, "regions": regions}


@pytest.mark.parametrize("dtype", ["uint16", "int16"])
def test_imagej_opens_the_stripped_hyperstack(tmp_path: Path, mount, dtype: str) -> None:
    """[image-8] plain ImageJ's open() reads image.tif: a hyperstack with the OME-Zarr
    dimensions, calibration, channel colours and windows, and every plane's pixels
    (int16 too: ImageJ holds it plus 32768, and its display ranges so; given as the
    values, each window was 32768 below them and every channel a flat saturated image)."""
    requires("imagej")
    values = tczyx_store(tmp_path / "g.zarr", dtype=dtype)
    if dtype == "int16":  # (negative values too)
        values -= 2000
        zarr.open_array(str(tmp_path / "g.zarr" / "0"), mode="r+")[...] = values
    m = mount(tmp_path / "g.zarr")
    image = m.path / "0" / "image.tif"
    assert image.exists() and (m.path / "0" / "image.ome.tif").exists()
    x0, y0, n = 60, 58, 8  # straddles the chunk corner at (64, 64)
    got = imagej_region(image, x0, y0, n)
    assert (got["width"], got["height"], got["channels"], got["slices"], got["frames"]) == (130, 150, 3, 4, 2)
    assert got["bits"] == 16 and got["hyperstack"] and got["composite"]
    assert got["unit"] in ("micron", "microns", "\u00b5m")
    assert got["pixelWidth"] == pytest.approx(0.125) and got["pixelHeight"] == pytest.approx(0.25)
    assert got["pixelDepth"] == pytest.approx(0.5) and got["frameInterval"] == pytest.approx(2.0)
    for c, ch in enumerate(CHANNELS):
        lo, hi, top = got["channel"][c]
        assert (lo, hi) == (ch["window"]["start"], ch["window"]["end"])
        assert top == tuple(int(ch["color"][i : i + 2], 16) for i in (0, 2, 4))
    assert len(got["regions"]) == 24
    for (c, z, t), region in got["regions"].items():
        np.testing.assert_array_equal(region, values[t, c, z, y0 : y0 + n, x0 : x0 + n], err_msg=str((c, z, t)))


def covered_chunks(offset: int, length: int, data_start: int, height: int, width: int, itemsize: int,
                   chunk: tuple[int, int]) -> set[tuple[int, int, int]]:
    """(plane, chunk row, chunk column) of the chunks holding bytes [offset, offset+length)
    of a stripped file's pixels."""
    out = set()
    p0, p1 = (offset - data_start) // itemsize, -(-(offset + length - data_start) // itemsize)
    for px in range(p0, p1):
        plane, within = divmod(px, height * width)
        y, x = divmod(within, width)
        out.add((plane, y // chunk[0], x // chunk[1]))
    return out


def test_stripped_file_layout_and_lazy_reads(tmp_path: Path, mount) -> None:
    """[image-8] image.tif: one IFD per plane in ImageJ's order, strips of one chunk row,
    every IFD complete (tifffile walks them all); stat decodes nothing; reading part of a
    strip decodes only the chunks holding the bytes read (part of a row: the chunks its
    columns cover), never the whole row of chunks for a few bytes."""
    values = tczyx_store(tmp_path / "g.zarr")
    wide = zarr.open_group(str(tmp_path / "w.zarr"), mode="w").create_array(
        "wide", shape=(3, 100, 6000), chunks=(1, 32, 1000), dtype="uint16", fill_value=0, compressors=[BloscCodec()])
    wide_values = np.random.default_rng(1).integers(0, 60000, size=wide.shape).astype("uint16")
    wide[...] = wide_values
    g = mount(tmp_path / "g.zarr", name="g")
    m = mount(tmp_path / "w.zarr")
    for mounted, name in ((g, "0"), (m, "wide")):
        subprocess.run(["ls", "-lR", str(mounted.path)], check=True, capture_output=True)
        os.stat(mounted.path / name / "image.tif")
        with open(mounted.path / name / "image.tif", "rb"):
            pass
        assert stats_of(mounted.path).get("chunks_decoded", 0) == 0

    view = make_view(MountConfig([str(tmp_path / "w.zarr")], "/unused", read_only=True), Stats())
    planned = view.whole_images(("wide",))["image.tif"]
    assert os.stat(m.path / "wide" / "image.tif").st_size == planned.size < 2**32
    page = 4096
    row_bytes = 6000 * 2
    first = -(-planned.data_start // page) * page
    # a page inside one row (row 40 of plane 1), and a page spanning rows 70-71 of plane 2
    in_row = first + ((planned.plane_bytes + 40 * row_bytes) // page + 1) * page
    across = first + ((2 * planned.plane_bytes + 71 * row_bytes) // page) * page
    fd = os.open(m.path / "wide" / "image.tif", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead
        for at in (in_row, across):
            before = stats_of(m.path).get("chunks_decoded", 0)
            got = os.pread(fd, page, at)
            cover = covered_chunks(at, page, planned.data_start, 100, 6000, 2, (32, 1000))
            assert len(cover) < 6  # not the whole row of chunks: only those holding the bytes
            decoded = stats_of(m.path).get("chunks_decoded", 0) - before
            assert decoded == len(cover), (at, decoded, cover)
            flat = wide_values.reshape(-1)
            np.testing.assert_array_equal(np.frombuffer(got, "<u2"),
                                          flat[(at - planned.data_start) // 2 : (at - planned.data_start + page) // 2])
    finally:
        os.close(fd)

    with tifffile.TiffFile(g.path / "0" / "image.tif") as tif:
        assert tif.is_imagej and len(tif.pages) == 24
        first_page = tif.pages[0]
        assert first_page.rowsperstrip == 64 and len(first_page.dataoffsets) == 3 and not first_page.is_tiled
        meta = tif.imagej_metadata
        assert (meta["channels"], meta["slices"], meta["frames"]) == (3, 4, 2)
        assert meta["Ranges"] == (10.0, 3000.0, 20.0, 2000.0, 30.0, 1000.0)
        pages = np.stack([p.asarray() for p in tif.pages])  # each IFD on its own
    # ImageJ's order: c fastest, then z, then t
    np.testing.assert_array_equal(pages, values.transpose(0, 2, 1, 3, 4).reshape(24, 150, 130))


# -- OpenSlide: slide.tif ----------------------------------------------------------------


def slide_store(path: Path, lead=(3,), axes=("c",), size=(700, 600), chunks=128, levels=3, unit="micrometer",
                dtype="uint8") -> list[np.ndarray]:
    """An OME-Zarr 0.4 pyramid (leading `axes`, then y, x), y/x halved per level; 0.25 units per pixel."""
    root = zarr.open_group(str(path), mode="w")
    rng = np.random.default_rng(7)
    out = []
    for lv in range(levels):
        shape = (*lead, max(1, size[0] >> lv), max(1, size[1] >> lv))
        a = root.create_array(str(lv), shape=shape, chunks=(*([1] * len(lead)), chunks, chunks), dtype=dtype,
                              fill_value=0, compressors=[BloscCodec()])
        a[...] = values = rng.integers(0, 256, size=shape).astype(dtype)
        out.append(values)
    kinds = {"c": "channel", "z": "space", "t": "time"}
    root.attrs["multiscales"] = [{
        "version": "0.4", "name": "slide",
        "axes": [*({"name": a, "type": kinds[a]} for a in axes),
                 {"name": "y", "type": "space", **({"unit": unit} if unit else {})},
                 {"name": "x", "type": "space", **({"unit": unit} if unit else {})}],
        "datasets": [{"path": str(lv), "coordinateTransformations": [
            {"type": "scale", "scale": [*([1.0] * len(lead)), 0.25 * 2**lv, 0.25 * 2**lv]}]} for lv in range(levels)],
    }]
    return out


def _openslide():
    try:
        import openslide
    except ImportError as e:  # openslide-python and openslide-bin: the test extra
        requires(f"openslide-python ({e})")
    return openslide


def test_openslide_reads_the_rgb_pyramid(tmp_path: Path, mount) -> None:
    """[image-9] OpenSlide opens slide.tif of a c=3 uint8 pyramid: its level count,
    dimensions, downsamples and microns per pixel are the OME-Zarr pyramid's, and
    read_region at every level equals the arrays (RGB interleaved from the c planes).
    stat and OpenSlide's open decode nothing; a region decodes only the chunks it covers."""
    openslide = _openslide()
    levels = slide_store(tmp_path / "s.zarr")
    m = mount(tmp_path / "s.zarr")
    slide = m.path / "slide.tif"
    subprocess.run(["ls", "-lR", str(m.path)], check=True, capture_output=True)
    os.stat(slide)
    assert stats_of(m.path).get("chunks_decoded", 0) == 0
    with openslide.OpenSlide(slide) as osr:
        # OpenSlide's open hashes the smallest level's tiles (openslide.quickhash-1): that
        # level's chunks, no others (the kernel's read-around of libtiff's map of the
        # file finds zeros after each tile, not its neighbours)
        assert stats_of(m.path).get("chunks_decoded", 0) == 3 * 2 * 2  # 175 x 150: 2 x 2 chunks, 3 planes
        assert osr.properties["openslide.vendor"] == "generic-tiff"
        assert osr.level_count == 3
        assert osr.level_dimensions == tuple((v.shape[2], v.shape[1]) for v in levels)
        assert osr.level_downsamples == pytest.approx((1.0, 2.0, 4.0))
        assert float(osr.properties["openslide.mpp-x"]) == pytest.approx(0.25)
        assert float(osr.properties["openslide.mpp-y"]) == pytest.approx(0.25)
        # one tile's region at level 0: the three planes' chunk of that tile
        before = stats_of(m.path).get("chunks_decoded", 0)
        region = np.asarray(osr.read_region((130, 260), 0, (100, 110)))
        assert stats_of(m.path).get("chunks_decoded", 0) - before == 3
        np.testing.assert_array_equal(region[..., :3], levels[0][:, 260:370, 130:230].transpose(1, 2, 0))
        assert (region[..., 3] == 255).all()
        for k, values in enumerate(levels):
            h, w = values.shape[1:]
            y, x, rh, rw = h // 5, w // 7, h // 2, w // 2
            down = 2**k
            region = np.asarray(osr.read_region((x * down, y * down), k, (rw, rh)))
            np.testing.assert_array_equal(region[..., :3], values[:, y : y + rh, x : x + rw].transpose(1, 2, 0),
                                          err_msg=f"level {k}")
    with tifffile.TiffFile(slide) as tif:  # the layout OpenSlide's generic TIFF reader documents
        assert [p.subfiletype for p in tif.pages] == [0, 1, 1] and all(p.is_tiled for p in tif.pages)
        assert all(p.planarconfig == 1 and p.photometric == 2 for p in tif.pages)
        assert not any(p.subifds for p in tif.pages)


def test_openslide_grayscale_and_which_pyramids_have_a_slide(tmp_path: Path, mount) -> None:
    """[image-9] a one-plane uint8 pyramid is a grayscale slide (no mpp without a length
    unit); uint16 or two-channel pyramids have no slide.tif (pyramid.ome.tif only)."""
    openslide = _openslide()
    top = tmp_path / "top.zarr"
    zarr.open_group(str(top), mode="w")
    gray = slide_store(top / "g", lead=(1, 1, 1), axes=("t", "c", "z"), size=(300, 260), chunks=100,
                       levels=2, unit=None)
    slide_store(top / "w", lead=(3,), dtype="uint16", levels=2)
    slide_store(top / "two", lead=(2,), levels=2)
    m = mount(top)
    assert sorted(p.name for p in m.path.glob("*/slide.tif")) == ["slide.tif"]
    assert (m.path / "w" / "pyramid.ome.tif").exists() and (m.path / "two" / "pyramid.ome.tif").exists()
    with openslide.OpenSlide(m.path / "g" / "slide.tif") as osr:
        assert osr.level_count == 2 and osr.level_dimensions == ((260, 300), (130, 150))
        assert "openslide.mpp-x" not in osr.properties
        for k, values in enumerate(gray):
            region = np.asarray(osr.read_region((0, 0), k, (values.shape[-1], values.shape[-2])))
            for band in range(3):
                np.testing.assert_array_equal(region[..., band], values[0, 0, 0])


def test_libvips_reads_every_level_of_the_slide(tmp_path: Path, mount) -> None:
    """[image-9] libvips (8.14.2 on) refuses a level whose tile edge passes twice its
    larger side rounded up to 256 ("tile size out of range"): slide.tif's one tile shape
    is at most 256 x 256, so its small levels read too (288 x 288 tiles, from chunks of
    300, failed the 125 x 112 level)."""
    pyvips = pytest.importorskip("pyvips", reason="pyvips is in zfuse's test extra")
    levels = slide_store(tmp_path / "s.zarr", size=(1000, 900), chunks=300, levels=4)
    m = mount(tmp_path / "s.zarr")
    for k, values in enumerate(levels):
        image = pyvips.Image.new_from_file(str(m.path / "slide.tif"), page=k, access="sequential")
        got = np.ndarray(buffer=image.write_to_memory(), dtype=np.uint8, shape=(image.height, image.width, 3))
        np.testing.assert_array_equal(got, values.transpose(1, 2, 0), err_msg=f"level {k}")
        del image


# -- the Python OME-TIFF readers: image.ome.tif ------------------------------------------


def test_bioio_reads_image_ome_tif(tmp_path: Path, mount) -> None:
    """[image-2] bioio with bioio-ome-tiff reads image.ome.tif: dims, physical sizes,
    channel names and a region of one plane are the OME-Zarr image's; bioio-tifffile
    reads the same pixels from image.ome.tif and image.tif, and image.tif's ImageJ
    calibration."""
    try:
        import bioio_ome_tiff
        import bioio_tifffile
        from bioio import BioImage
    except ImportError as e:  # bioio, bioio-ome-tiff, bioio-tifffile: the test extra
        requires(f"bioio ({e})")
    values = tczyx_store(tmp_path / "g.zarr")
    m = mount(tmp_path / "g.zarr")
    ome = m.path / "0" / "image.ome.tif"
    img = BioImage(ome, reader=bioio_ome_tiff.Reader)
    assert (img.dims.T, img.dims.C, img.dims.Z, img.dims.Y, img.dims.X) == (2, 3, 4, 150, 130)
    sizes = img.physical_pixel_sizes
    assert (sizes.Z, sizes.Y, sizes.X) == pytest.approx((0.5, 0.25, 0.125))
    assert img.channel_names == [c["label"] for c in CHANNELS]
    region = img.get_image_dask_data("YX", T=1, C=2, Z=3)[40:100, 50:120].compute()
    np.testing.assert_array_equal(region, values[1, 2, 3, 40:100, 50:120])
    np.testing.assert_array_equal(img.get_image_data("TCZYX"), values)

    for path in (ome, m.path / "0" / "image.tif"):
        plain = BioImage(path, reader=bioio_tifffile.Reader)
        assert (plain.dims.T, plain.dims.C, plain.dims.Z) == (2, 3, 4), path
        np.testing.assert_array_equal(plain.get_image_data("TCZYX"), values, err_msg=str(path))
    # the ImageJ calibration of image.tif, as bioio-tifffile reads it
    sizes = BioImage(m.path / "0" / "image.tif", reader=bioio_tifffile.Reader).physical_pixel_sizes
    assert (sizes.Z, sizes.Y, sizes.X) == pytest.approx((0.5, 0.25, 0.125))


_AICS_SCRIPT = """
import json, sys
from aicsimageio import AICSImage
from aicsimageio.readers import OmeTiffReader
img = AICSImage(sys.argv[1], reader=OmeTiffReader)
d, p = img.dims, img.physical_pixel_sizes
region = img.get_image_dask_data("YX", T=1, C=2, Z=3)[40:100, 50:120].compute()
print(json.dumps({"dims": [d.T, d.C, d.Z, d.Y, d.X], "sizes": [p.Z, p.Y, p.X], "channels": img.channel_names,
                  "region": region.tolist(), "dtype": str(region.dtype)}))
"""


@pytest.mark.skipif(not AICS, reason="set ZFUSE_AICS_PYTHON to the Python of a venv with aicsimageio 4.14 "
                                     "(make test sets up .venv-aics)")
def test_aicsimageio_reads_image_ome_tif(tmp_path: Path, mount) -> None:
    """[image-2] aicsimageio's OmeTiffReader (in its own venv: it pins zarr 2.15) reads
    image.ome.tif: dims, physical sizes, channel names and a region."""
    values = tczyx_store(tmp_path / "g.zarr")
    m = mount(tmp_path / "g.zarr")
    proc = subprocess.run([str(AICS), "-c", _AICS_SCRIPT, str(m.path / "0" / "image.ome.tif")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["dims"] == [2, 3, 4, 150, 130]
    assert got["sizes"] == pytest.approx([0.5, 0.25, 0.125])
    assert got["channels"] == [c["label"] for c in CHANNELS]
    assert got["dtype"] == "uint16"
    np.testing.assert_array_equal(np.array(got["region"]), values[1, 2, 3, 40:100, 50:120])


def test_ome_names_and_colours_from_omero(tmp_path: Path, mount) -> None:
    """[image-2] the OME-XML of image.ome.tif and pyramid.ome.tif names each channel and
    gives its colour from OME-Zarr `omero` (OME's signed RGBA); the pyramid's Image
    Name is the multiscale's name, a level's image.ome.tif names the level too."""
    import xml.etree.ElementTree as ET

    ome_ns = "{http://www.openmicroscopy.org/Schemas/OME/2016-06}"
    tczyx_store(tmp_path / "g.zarr", name="cells")
    m = mount(tmp_path / "g.zarr")
    names = {}
    for f in (m.path / "0" / "image.ome.tif", m.path / "pyramid.ome.tif"):
        with tifffile.TiffFile(f) as tif:
            image = ET.fromstring(tif.pages[0].description).find(f"{ome_ns}Image")
        assert image is not None
        names[f.name] = image.get("Name")
        channels = image.findall(f"{ome_ns}Pixels/{ome_ns}Channel")
        assert [c.get("Name") for c in channels] == ["DAPI", "GFP", "RFP"], f
        rgba = [int(c.get("Color")) % 2**32 for c in channels]
        assert rgba == [int(c["color"] + "FF", 16) for c in CHANNELS], f
    # the pyramid is the multiscale; one level's image.ome.tif says which level of it
    assert names == {"pyramid.ome.tif": "cells", "image.ome.tif": "cells, level 0"}
