"""`make demo`: build a small OME-Zarr sample store, mount it, show a chunk, unmount.

Run as `python -m zfuse.demo [WORKDIR]` (default ./demo).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec


def build_sample(path: Path) -> None:
    """A 3-D uint16 zstd-compressed sharded array inside an OME-Zarr multiscale group."""
    shutil.rmtree(path, ignore_errors=True)
    root = zarr.open_group(str(path), mode="w")
    z, y, x = np.mgrid[0:8, 0:256, 0:256]
    # rings around the centre that shift with z: something to look at in Fiji
    image = (np.sin(np.hypot(y - 128, x - 128) / 6.0 - z / 2.0) * 20000 + 30000).astype("uint16")
    arr = root.create_array("0", shape=image.shape, shards=(8, 256, 256), chunks=(4, 128, 128),
                            dtype="uint16", compressors=[ZstdCodec(level=3)], fill_value=0,
                            dimension_names=["z", "y", "x"])
    arr[...] = image
    root.attrs["multiscales"] = [{
        "version": "0.4", "name": "rings",
        "axes": [{"name": "z", "type": "space", "unit": "micrometer"},
                 {"name": "y", "type": "space", "unit": "micrometer"},
                 {"name": "x", "type": "space", "unit": "micrometer"}],
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [2.0, 0.5, 0.5]}]}],
    }]


IJ_JAR = Path("/usr/share/java/ij.jar")
# ImageJ's own API, driven from jshell: the macro language cannot save PNGs
# headless (its file-format commands need the GUI menus).
IJ_SCRIPT = """
import ij.*;
import ij.io.*;
import ij.process.*;
ImagePlus imp = IJ.openImage(System.getProperty("chunk"));
System.out.println("ImageJ " + IJ.getVersion() + " opened " + imp.getTitle() + ": " + imp.getWidth() + "x" + imp.getHeight() + ", " + imp.getStackSize() + " slices, " + imp.getBitDepth() + "-bit");
imp.setSlice(1);
ImageStatistics st = imp.getStatistics();
imp.setDisplayRange(st.min, st.max);
ImageProcessor big = imp.flatten().getProcessor().resize(imp.getWidth() * 2, imp.getHeight() * 2);
new FileSaver(new ImagePlus(imp.getTitle(), big)).saveAsPng(System.getProperty("png"));
/exit
"""


def imagej_picture(chunk: Path, png: Path) -> Path | None:
    """Open a chunk with ImageJ (headless) and save what it shows as a PNG, if a JDK is here."""
    if not IJ_JAR.exists() or shutil.which("jshell") is None:
        return None
    script = png.with_suffix(".jsh")
    script.write_text(IJ_SCRIPT)
    result = subprocess.run(
        ["jshell", "--class-path", str(IJ_JAR), "-R-Djava.awt.headless=true",
         f"-R-Dchunk={chunk}", f"-R-Dpng={png}", str(script)],
        capture_output=True, text=True, timeout=300,
    )
    for line in result.stdout.splitlines():
        if line.startswith("ImageJ "):
            print(line)
    script.unlink()
    return png if png.exists() else None


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kw)  # type: ignore[call-overload]


def main(argv: list[str]) -> int:
    work = Path(argv[0] if argv else "demo").resolve()
    store, mnt = work / "sample.zarr", work / "mnt"
    work.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(mnt):
        run(["fusermount3", "-u", str(mnt)])
    mnt.mkdir(exist_ok=True)
    build_sample(store)
    print(f"built {store}: 8x256x256 uint16, zstd, shards of 8x256x256 holding 4x128x128 chunks")
    zfuse = [sys.executable, "-m", "zfuse.cli"]
    run([*zfuse, "info", str(store)], check=True)
    run([*zfuse, "mount", str(store), str(mnt)], check=True)
    try:
        run(["ls", "-lR", str(mnt)], check=True)
        chunk = mnt / "0" / "c" / "1" / "0" / "1.tiff"
        run(["tiffinfo", str(chunk)], check=True)
        import tifffile

        data = tifffile.imread(chunk)
        print(f"tifffile reads {chunk.relative_to(mnt)}: shape {data.shape}, dtype {data.dtype}, "
              f"mean {data.mean():.1f}")
        picture = imagej_picture(chunk, work / "chunk-in-imagej.png")
        if picture:
            print(f"ImageJ opened it headless and saved a rendering: {picture}")
    finally:
        for _ in range(50):
            if run(["fusermount3", "-u", str(mnt)]).returncode == 0:
                break
            time.sleep(0.1)
    print("unmounted; demo done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
