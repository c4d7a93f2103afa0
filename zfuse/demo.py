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
# In ImageJ 1.53t a macro's open() throws HeadlessException unless ImageJ is
# first initialised through IJ.open on a missing file.
IJ_MACRO = """
call("ij.IJ.open", "/nonexistent");
setBatchMode(true);
args = split(getArgument(), "\\n");
open(args[0]);
print("ImageJ: " + getTitle() + " " + getWidth() + "x" + getHeight() + ", " + nSlices + " slices, " + bitDepth() + "-bit");
setSlice(1);
getStatistics(area, mean, min, max);
setMinAndMax(min, max);
call("ij.IJ.saveAs", "png", args[1]);
"""


def imagej_picture(chunk: Path, png: Path) -> Path | None:
    """Open a chunk in headless ImageJ and save what it shows as a PNG (if ImageJ is here)."""
    if not IJ_JAR.exists() or shutil.which("java") is None:
        return None
    macro = png.with_suffix(".ijm")
    macro.write_text(IJ_MACRO)
    result = subprocess.run(
        ["java", "-Djava.awt.headless=true", "-jar", str(IJ_JAR), "-batch", str(macro), f"{chunk}\n{png}"],
        capture_output=True, text=True, timeout=120,
    )
    for line in result.stdout.splitlines():
        if line.startswith("ImageJ: "):
            print(line)
    macro.unlink()
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
