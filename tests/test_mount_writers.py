"""Every TIFF writer people use stores a chunk through the mount (issue 9).

Each program replaces an existing chunk of a plain v3 array and of a sharded
one with its own TIFF of the same values: the store then holds exactly those
values, the file reads them back, and nothing was refused or left pending.
Bio-Formats, which closes and reopens while writing, is in test_mount_replace.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile

import stores
from tools import imagej_save_tiff, requires, tiffcp

IMAGEMAGICK = "/usr/bin/convert"  # /usr/local/bin/convert may be a stand-in on these machines


def _imagemagick(src: Path, dst: Path) -> None:
    if not Path(IMAGEMAGICK).exists():
        requires("convert-im6.q16")
    subprocess.run([IMAGEMAGICK, str(src), "-define", "quantum:format=unsigned", "-depth", "16", str(dst)],
                   check=True)


def _gdal(src: Path, dst: Path) -> None:
    requires("gdal_translate")
    subprocess.run(["gdal_translate", "-q", "-of", "GTiff", str(src), str(dst)], check=True)


def _python(code: str, src: Path, dst: Path) -> None:
    subprocess.run([sys.executable, "-c", code, str(src), str(dst)], check=True)


def _vips(src: Path, dst: Path) -> None:
    _python("import sys, pyvips; pyvips.Image.new_from_file(sys.argv[1]).tiffsave(sys.argv[2])", src, dst)


def _itk(src: Path, dst: Path) -> None:
    _python("import sys, SimpleITK as s; s.WriteImage(s.ReadImage(sys.argv[1]), sys.argv[2])", src, dst)


def _tifffile(src: Path, dst: Path) -> None:
    tifffile.imwrite(dst, tifffile.imread(src), compression="zlib", tile=(16, 16))


def _tiffcp(src: Path, dst: Path) -> None:
    tiffcp(src, dst, "-c", "lzw")


def _imagej(src: Path, dst: Path) -> None:
    imagej_save_tiff(src, dst)


WRITERS = {"imagemagick": _imagemagick, "gdal": _gdal, "libvips": _vips, "itk": _itk,
           "tifffile": _tifffile, "libtiff": _tiffcp, "imagej": _imagej}
KINDS = {
    "v3": lambda p: stores.v3(p, shape=(64, 64), chunks=(32, 32)),
    "sharding_indexed": lambda p: stores.sharded(p, shape=(64, 64), shards=(64, 64), chunks=(32, 32)),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("writer", list(WRITERS))
def test_writer_stores_a_chunk(tmp_path: Path, mount, writer: str, kind: str) -> None:
    """[write-1] a TIFF written by this program replaces the chunk exactly."""
    src = tmp_path / "a.zarr"
    data = KINDS[kind](src)
    new = stores.values((32, 32), "uint16", seed=len(writer))
    local = tmp_path / "in.tif"
    tifffile.imwrite(local, new)
    m = mount(src)
    target = m.path / "c" / "1" / "0.tiff"
    WRITERS[writer](local, target)
    expected = data.copy()
    expected[32:64, 0:32] = new
    np.testing.assert_array_equal(stores.open_any(src)[...], expected)
    np.testing.assert_array_equal(tifffile.imread(target), new)
    assert m.errors() == "", m.errors()
    assert m.stats().get("pending_files_now", 0) == 0
