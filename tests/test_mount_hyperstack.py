"""5-D OME-Zarr chunks (t, c, z, y, x) are ImageJ hyperstacks on a real mount:
headless ImageJ sees channels, slices, frames and the z/t calibration, each
plane where ImageJ's sliders say; zarr reads the view exactly (transpose codec);
a hyperstack ImageJ saves into the mount is stored in the same order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

import stores
from tools import imagej_hyperstack, imagej_save_tiff, requires

pytestmark = pytest.mark.mount

SHAPE, CHUNKS = (2, 3, 8, 32, 32), (2, 3, 4, 32, 32)  # two chunks along z


def ome_5d(path: Path) -> np.ndarray:
    root = zarr.open_group(str(path), mode="w")
    data = stores.values(SHAPE, "uint16", seed=3)
    a = root.create_array("0", shape=SHAPE, chunks=CHUNKS, dtype="uint16",
                          compressors=[ZstdCodec(level=1)], fill_value=0)
    a[...] = data
    root.attrs["multiscales"] = [{
        "version": "0.4",
        "axes": [{"name": "t", "type": "time", "unit": "second"},
                 {"name": "c", "type": "channel"},
                 {"name": "z", "type": "space", "unit": "micrometer"},
                 {"name": "y", "type": "space", "unit": "micrometer"},
                 {"name": "x", "type": "space", "unit": "micrometer"}],
        "datasets": [{"path": "0", "coordinateTransformations": [
            {"type": "scale", "scale": [1.5, 1.0, 2.0, 0.5, 0.5]}]}],
    }]
    return data


@pytest.mark.imagej
def test_imagej_opens_a_5d_ome_chunk_as_a_hyperstack(tmp_path: Path, mount) -> None:
    requires("imagej")
    data = ome_5d(tmp_path / "ome.zarr")
    m = mount(tmp_path / "ome.zarr")
    got = imagej_hyperstack(m.path / "0" / "c" / "0" / "0" / "1" / "0" / "0.tiff")
    assert (got["channels"], got["slices"], got["frames"]) == (3, 4, 2)
    assert got["hyperstack"] is True
    assert (got["width"], got["height"]) == (32, 32)
    assert got["pixelDepth"] == pytest.approx(2.0) and got["pixelWidth"] == pytest.approx(0.5)
    assert "micron" in str(got["unit"]) or "µm" in str(got["unit"])
    assert got["frameInterval"] == pytest.approx(1.5)
    chunk = data[:, :, 4:8]
    expected = {(c, z, t): float(chunk[t, c, z].astype(np.float64).mean())
                for t in range(2) for c in range(3) for z in range(4)}
    assert got["planes"].keys() == expected.keys()
    for position, mean in expected.items():
        assert got["planes"][position] == pytest.approx(mean, rel=1e-6), position


def test_view_zarr_json_declares_the_page_order_with_transpose(tmp_path: Path, mount) -> None:
    data = ome_5d(tmp_path / "ome.zarr")
    m = mount(tmp_path / "ome.zarr")
    meta = json.loads((m.path / "0" / "zarr.json").read_text())
    assert meta["codecs"][0] == {"name": "transpose", "configuration": {"order": [0, 2, 1, 3, 4]}}
    view = zarr.open_array(str(m.path / "0"))
    np.testing.assert_array_equal(view[...], data)
    # and zarr writing through the view lands in the right places
    new = stores.values((2, 3, 4, 32, 32), "uint16", seed=9)
    zarr.open_array(str(m.path / "0"), mode="r+")[:, :, 4:8] = new
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "ome.zarr" / "0"))[:, :, 4:8], new)


@pytest.mark.imagej
def test_imagej_saves_a_hyperstack_into_the_mount_in_the_same_order(tmp_path: Path, mount) -> None:
    """ImageJ opens chunk z0 from the mount and saves it over chunk z1: the store's
    z1 block then equals z0 exactly (pages taken in ImageJ's c, z, t order)."""
    requires("imagej")
    data = ome_5d(tmp_path / "ome.zarr")
    m = mount(tmp_path / "ome.zarr")
    chunks = m.path / "0" / "c" / "0" / "0"
    imagej_save_tiff(chunks / "0" / "0" / "0.tiff", chunks / "1" / "0" / "0.tiff")
    stored = zarr.open_array(str(tmp_path / "ome.zarr" / "0"))
    np.testing.assert_array_equal(stored[:, :, 4:8], data[:, :, 0:4])
    np.testing.assert_array_equal(stored[:, :, 0:4], data[:, :, 0:4])


def test_a_chunk_written_in_zarr_order_is_stored_in_zarr_order(tmp_path: Path, mount) -> None:
    """[read-1] `tifffile.imwrite(f, chunk)` of a (t, c, z, y, x) chunk in zarr's own
    order, copied onto the chunk file with cp: stored as written (the file's shape
    description says its order; read in ImageJ's, its planes were scrambled and cp
    exited 0), and an OME-TIFF saying DimensionOrder="XYZCT" likewise."""
    import shutil

    import tifffile

    data = ome_5d(tmp_path / "ome.zarr")
    m = mount(tmp_path / "ome.zarr")
    block = np.ascontiguousarray(data[:, :, 0:4] + 1)
    tifffile.imwrite(tmp_path / "plain.tif", block, photometric="minisblack")
    shutil.copyfile(tmp_path / "plain.tif", m.path / "0" / "c" / "0" / "0" / "1" / "0" / "0.tiff")
    tifffile.imwrite(tmp_path / "ome.tif", block + 1, ome=True, photometric="minisblack", metadata={"axes": "TCZYX"})
    shutil.copyfile(tmp_path / "ome.tif", m.path / "0" / "c" / "0" / "0" / "0" / "0" / "0.tiff")
    stored = zarr.open_array(str(tmp_path / "ome.zarr" / "0"))
    np.testing.assert_array_equal(stored[:, :, 4:8], block)
    np.testing.assert_array_equal(stored[:, :, 0:4], block + 1)
