"""OME-Zarr written by the real writers, on a real mount: every writer's layout gives the
same metadata (issue 31 item 1). ngff-zarr (`scale0/<name>` datasets, NGFF 0.5),
ome-zarr-py (`s0`, NGFF 0.5) write here with zarr 3; iohub (an HCS plate of positions,
NGFF 0.4, upper-case axis names) needs zarr 2 and writes in ZFUSE_ZARR2_PYTHON's venv.

Each image is c=2, z=3, y=x=64 (t=1 too for iohub), z spacing 2 µm, y/x 0.5 µm: a chunk
file's ImageJ metadata, `image.ome.tif`'s and `pyramid.ome.tif`'s OME-XML must say so.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

pytestmark = [pytest.mark.mount, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

OME = "{http://www.openmicroscopy.org/Schemas/OME/2016-06}"
DATA = (np.arange(2 * 3 * 64 * 64) % 1000).astype("u2").reshape(2, 3, 64, 64)
SCALE = {"z": 2.0, "y": 0.5, "x": 0.5}
UNITS = {"z": "micrometer", "y": "micrometer", "x": "micrometer"}
ZARR2 = os.environ.get("ZFUSE_ZARR2_PYTHON")


def check_chunk_file(path: Path, data: np.ndarray) -> None:
    """A chunk file holding all 2 channels and 3 slices: an ImageJ hyperstack with
    the writer's z spacing and x/y pixel size."""
    with tifffile.TiffFile(path) as tf:
        ij = tf.imagej_metadata
        assert ij is not None, path
        assert (ij.get("channels"), ij.get("slices"), ij.get("hyperstack")) == (2, 3, True), ij
        assert ij.get("spacing") == pytest.approx(2.0), ij
        assert ij.get("unit") in ("micron", "\\u00B5m", "µm", "um"), ij
        page = tf.pages[0]
        num, den = page.tags["XResolution"].value
        assert num / den == pytest.approx(2.0), (num, den)  # pixels per µm: 1 / 0.5
        axes = tf.series[0].axes
        assert axes.endswith("ZCYX"), axes  # ImageJ's page order: c fastest, then z
        got = tf.asarray()
    np.testing.assert_array_equal(got.reshape(3, 2, 32, 32), data.transpose(1, 0, 2, 3))


def check_ome(path: Path, size_x: int, physical_x: float, name: str | None = None) -> None:
    with tifffile.TiffFile(path) as tf:
        image = ET.fromstring(tf.pages[0].description).find(f"{OME}Image")
    assert image is not None, path
    pixels = image.find(f"{OME}Pixels")
    assert pixels is not None
    assert [pixels.get(k) for k in ("SizeX", "SizeY", "SizeZ", "SizeC")] == [str(size_x), str(size_x), "3", "2"]
    assert float(pixels.get("PhysicalSizeX", "nan")) == pytest.approx(physical_x), path
    assert float(pixels.get("PhysicalSizeZ", "nan")) == pytest.approx(2.0), path
    if name is not None:
        assert image.get("Name") == name, image.get("Name")


def first_chunk(array_dir: Path) -> Path:
    for root, _dirs, files in sorted(os.walk(array_dir)):
        for f in sorted(files):
            if f.endswith(".tiff"):
                return Path(root) / f
    raise AssertionError(f"no chunk file in {array_dir}")


def test_ngff_zarr(tmp_path: Path, mount) -> None:
    """[image-1] ngff-zarr 0.50: datasets `scale0/cells`, `scale1/cells`, NGFF 0.5."""
    nz = pytest.importorskip("ngff_zarr", reason="ngff-zarr is in zfuse's test extra")
    image = nz.to_ngff_image(DATA, dims=["c", "z", "y", "x"], scale=SCALE, axes_units=UNITS, name="cells")
    nz.to_ngff_zarr(tmp_path / "n.zarr", nz.to_multiscales(image, scale_factors=[2], chunks=(2, 3, 32, 32)))
    m = mount(tmp_path / "n.zarr", "-o", "ro")
    check_chunk_file(first_chunk(m.path / "scale0" / "cells"), DATA[:, :, :32, :32])
    check_ome(m.path / "scale0" / "cells" / "image.ome.tif", 64, 0.5)
    check_ome(m.path / "pyramid.ome.tif", 64, 0.5, name="cells")


def test_ome_zarr_py(tmp_path: Path, mount) -> None:
    """[image-1] ome-zarr-py 0.18: datasets `s0`, `s1`, NGFF 0.5."""
    writer = pytest.importorskip("ome_zarr.writer", reason="ome-zarr is in zfuse's test extra")
    root = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    writer.write_image(DATA, group=root, axes="czyx", scale_factors=[2], scale=SCALE, axes_units=UNITS,
                       storage_options={"chunks": (2, 3, 32, 32)}, name="cells")
    m = mount(tmp_path / "o.zarr", "-o", "ro")
    check_chunk_file(first_chunk(m.path / "s0"), DATA[:, :, :32, :32])
    check_ome(m.path / "s0" / "image.ome.tif", 64, 0.5)
    check_ome(m.path / "s1" / "image.ome.tif", 32, 1.0)
    check_ome(m.path / "pyramid.ome.tif", 64, 0.5, name="cells")


@pytest.mark.skipif(not ZARR2, reason="iohub needs zarr 2: set ZFUSE_ZARR2_PYTHON to "
                    ".venv-zarr2's python (`make test` builds it with iohub 0.2)")
def test_iohub_hcs_plate(tmp_path: Path, mount) -> None:
    """[image-1] iohub 0.2: an HCS plate (rows A, B; a position per well) of t,c,z,y,x
    images with upper-case axis names, NGFF 0.4, zarr v2."""
    script = textwrap.dedent(f"""
        import numpy as np
        from iohub.ngff import open_ome_zarr
        from iohub.ngff.models import TransformationMeta
        data = (np.arange(2 * 3 * 64 * 64) % 1000).astype("u2").reshape(1, 2, 3, 64, 64)
        with open_ome_zarr({str(tmp_path / "plate.zarr")!r}, layout="hcs", mode="w-",
                           channel_names=["DAPI", "GFP"]) as plate:
            for row, col in (("A", "1"), ("B", "2")):
                pos = plate.create_position(row, col, "0")
                pos.create_image("0", data, chunks=(1, 2, 3, 32, 32), transform=[
                    TransformationMeta(type="scale", scale=[1.0, 1.0, 2.0, 0.5, 0.5])])
    """)
    subprocess.run([ZARR2, "-c", script], check=True, timeout=120)
    m = mount(tmp_path / "plate.zarr", "-o", "ro")
    for well in ("A/1/0", "B/2/0"):
        check_chunk_file(first_chunk(m.path / well / "0"), DATA[:, :, :32, :32])
        check_ome(m.path / well / "0" / "image.ome.tif", 64, 0.5)
        check_ome(m.path / well / "pyramid.ome.tif", 64, 0.5)


def _bf_physical(path: Path) -> dict[str, str]:
    """Bio-Formats' (Fiji's importer's) reading of a file's calibration, from its OME-XML."""
    from tools import bftool

    xml = bftool("ImageInfo", "-nopix", "-omexml", path).stdout
    pixels = re.search(r"<Pixels [^>]*>", xml)
    assert pixels is not None, xml[-2000:]
    return dict(re.findall(r'(PhysicalSize[XZ](?:Unit)?|TimeIncrement(?:Unit)?)="([^"]*)"', pixels.group(0)))


def test_ngff_zarr_in_nanometres_and_milliseconds_reads_right_in_every_reader(tmp_path: Path, mount) -> None:
    """[image-1] [read-14] ngff-zarr 0.50 with nanometre pixels, a micrometre z step and millisecond
    frames: Bio-Formats (Fiji's importer), ImageJ and tifffile read the same calibration
    from a chunk file, `image.tif` and `image.ome.tif`. Bio-Formats had read 325 nm as
    325 µm from the chunk files and `image.tif` (it takes an ImageJ TIFF's calibration
    as micrometres), and 30 ms as 30 s. `image.ome.tif` of ngff-zarr's `scale0/cells`
    names its channels (the multiscale and its `omero` are two groups up)."""
    nz = pytest.importorskip("ngff_zarr", reason="ngff-zarr is in zfuse's test extra")
    data = DATA[None]  # t=1, c=2, z=3, y, x
    image = nz.to_ngff_image(data, dims=["t", "c", "z", "y", "x"],
                             scale={"t": 30.0, "c": 1.0, "z": 2.0, "y": 325.0, "x": 325.0},
                             axes_units={"t": "millisecond", "z": "micrometer", "y": "nanometer", "x": "nanometer"},
                             name="cells")
    multiscales = nz.to_multiscales(image, scale_factors=[2], chunks=(1, 2, 3, 32, 32))
    multiscales.metadata.omero = nz.Omero(channels=[
        nz.OmeroChannel(color=color, label=label, window=nz.OmeroWindow(min=0, max=1000, start=0, end=1000))
        for color, label in (("0000FF", "DAPI"), ("00FF00", "GFP"))])
    nz.to_ngff_zarr(tmp_path / "nm.zarr", multiscales, version="0.5")
    m = mount(tmp_path / "nm.zarr", "-o", "ro")
    level = m.path / "scale0" / "cells"
    chunk = first_chunk(level)
    for path in (chunk, level / "image.tif"):
        with tifffile.TiffFile(path) as tf:
            ij = tf.imagej_metadata
            num, den = tf.pages[0].tags["XResolution"].value
        assert (ij["unit"], ij["spacing"], ij["finterval"], ij["tunit"]) == ("micron", 2.0, 0.03, "sec"), ij
        assert den / num == pytest.approx(0.325)
        bf = _bf_physical(path)
        assert float(bf["PhysicalSizeX"]) == pytest.approx(0.325) and bf["PhysicalSizeXUnit"] == "µm", bf
        assert float(bf["TimeIncrement"]) == pytest.approx(0.03) and bf["TimeIncrementUnit"] == "s", bf
    with tifffile.TiffFile(level / "image.ome.tif") as tf:
        image_el = ET.fromstring(tf.pages[0].description).find(f"{OME}Image")
    assert image_el is not None and image_el.get("Name") == "cells, level 0"
    pixels = image_el.find(f"{OME}Pixels")
    assert pixels is not None
    assert [c.get("Name") for c in pixels.findall(f"{OME}Channel")] == ["DAPI", "GFP"]
    assert {k: pixels.get(k) for k in ("PhysicalSizeX", "PhysicalSizeXUnit", "TimeIncrement",
                                       "TimeIncrementUnit")} == {
        "PhysicalSizeX": "325.0", "PhysicalSizeXUnit": "nm", "TimeIncrement": "30.0", "TimeIncrementUnit": "ms"}
    bf = _bf_physical(level / "image.ome.tif")
    assert (bf["PhysicalSizeX"], bf["PhysicalSizeXUnit"], bf["PhysicalSizeZ"], bf["PhysicalSizeZUnit"]) == (
        "325.0", "nm", "2.0", "µm"), bf
