"""Edge chunks on a real mount: what a written file reads back as, exactly as
SEMANTICS.md [write-4] states it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

pytestmark = pytest.mark.mount


def test_edge_chunk_reads_back_in_bounds_pixels_and_fill_outside(tmp_path: Path, mount) -> None:
    """[write-4] A full-shape file written over an edge chunk reads back with the same
    pixels inside the array bounds and the fill value outside them; only the in-bounds
    part is stored. An interior chunk reads back with exactly the pixels written."""
    src = tmp_path / "a.zarr"
    arr = zarr.create_array(str(src), shape=(20, 30), chunks=(8, 16), dtype="uint16", fill_value=7)
    arr[...] = 1
    m = mount(src)
    written = (np.arange(8 * 16, dtype=np.uint16).reshape(8, 16) + 100)
    tiff = tmp_path / "w.tif"
    tifffile.imwrite(tiff, written)
    edge, inner = m.path / "c" / "2" / "1.tiff", m.path / "c" / "0" / "0.tiff"  # rows 16..19, cols 16..29
    for target in (edge, inner):
        target.write_bytes(tiff.read_bytes())
    back = tifffile.imread(edge)
    np.testing.assert_array_equal(back[:4, :14], written[:4, :14])  # inside the array
    assert (back[4:, :] == 7).all() and (back[:, 14:] == 7).all()  # outside: the fill value
    np.testing.assert_array_equal(tifffile.imread(inner), written)
    stored = zarr.open_array(str(src))
    np.testing.assert_array_equal(stored[16:20, 16:30], written[:4, :14])
    np.testing.assert_array_equal(stored[0:8, 0:16], written)


def test_cropped_edge_chunk_reads_back_what_was_written(tmp_path: Path, mount) -> None:
    """[write-4] With --crop-edges the edge file has the in-bounds shape: all its pixels
    are stored, and it reads back with exactly the pixels written."""
    src = tmp_path / "a.zarr"
    zarr.create_array(str(src), shape=(20, 30), chunks=(8, 16), dtype="uint16", fill_value=7)[...] = 1
    m = mount(src, "--crop-edges")
    written = (np.arange(4 * 14, dtype=np.uint16).reshape(4, 14) + 100)
    tiff = tmp_path / "w.tif"
    tifffile.imwrite(tiff, written)
    edge = m.path / "c" / "2" / "1.tiff"
    edge.write_bytes(tiff.read_bytes())
    np.testing.assert_array_equal(tifffile.imread(edge), written)
    np.testing.assert_array_equal(zarr.open_array(str(src))[16:20, 16:30], written)
