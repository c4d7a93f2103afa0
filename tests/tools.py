"""Helpers that run real external programs (libtiff tools, headless ImageJ) for tests.

Every helper raises AssertionError with the program's output when the program
fails, so a test failure shows what the program said. `requires(...)` skips a
test when a program is missing, except under ZFUSE_REQUIRE_FUSE=1 (CI), where a
missing program is a failure: nothing is silently skipped there.

Headless ImageJ notes (Debian imagej: ij-1.52i.jar, which reports itself as 1.53t; OpenJDK 17):
- A macro's open() throws HeadlessException (IJ.init builds AWT menus) unless
  the macro first calls ``call("ij.IJ.open", "/nonexistent")``: that call
  initialises ImageJ once (printing the exception trace to stdout), after which
  open() works.
- One JVM start costs roughly 0.3-2 s, so the helpers take many files per run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from zfuse.testing import fetch_bioformats_jar

IJ_JAR = Path("/usr/share/java/ij.jar")
_JAVA_TIMEOUT = 300

_MARK = "ZFUSE"  # prefix of every line our macros print, to find them among traces


def _strict() -> bool:
    return os.environ.get("ZFUSE_REQUIRE_FUSE") == "1"


def have(program: str) -> bool:
    """True if `program` can run here ("imagej" means java + the ImageJ jar)."""
    if program == "imagej":
        return shutil.which("java") is not None and IJ_JAR.exists()
    return shutil.which(program) is not None


def requires(*programs: str) -> None:
    """Skip the calling test if a program is missing (fail under ZFUSE_REQUIRE_FUSE=1)."""
    missing = [p for p in programs if not have(p)]
    if not missing:
        return
    msg = f"required program(s) not installed: {', '.join(missing)}"
    if _strict():
        pytest.fail(msg + " (ZFUSE_REQUIRE_FUSE=1 forbids skipping)")
    pytest.skip(msg)


def _run(
    args: Sequence[str | os.PathLike[str]], *, timeout: float = 120
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [os.fspath(a) for a in args], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def tiffinfo(path: str | os.PathLike[str], *args: str, strict: bool = True) -> str:
    """stdout of ``tiffinfo [args] path``; with `strict`, any stderr output
    (libtiff warnings such as unknown tags or bad ASCII values) is a failure."""
    proc = _run(["tiffinfo", *args, path])
    if strict and proc.stderr.strip():
        raise AssertionError(f"tiffinfo {path} printed warnings:\n{proc.stderr}")
    return proc.stdout


def tiffcp(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *args: str, strict: bool = True
) -> None:
    """``tiffcp [args] src dst``; with `strict`, warnings on stderr are a failure."""
    proc = _run(["tiffcp", *args, src, dst])
    if strict and proc.stderr.strip():
        raise AssertionError(f"tiffcp {src} printed warnings:\n{proc.stderr}")


def _run_macro(macro: str, argument: str) -> str:
    """Run an ImageJ macro headless in one JVM; return its stdout."""
    with tempfile.TemporaryDirectory(prefix="zfuse-ij-") as tmp:
        path = Path(tmp) / "macro.ijm"
        path.write_text(macro)
        proc = subprocess.run(
            [
                "java",
                "-Djava.awt.headless=true",
                # keep ImageJ's prefs out of the user's home
                f"-Duser.home={tmp}",
                "-jar",
                str(IJ_JAR),
                "-batch",
                str(path),
                argument,
            ],
            capture_output=True,
            text=True,
            timeout=_JAVA_TIMEOUT,
        )
    if proc.returncode != 0:
        raise AssertionError(
            f"ImageJ exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc.stdout + proc.stderr


# The first call() initialises ImageJ headless (see module docstring).
_INIT = 'call("ij.IJ.open", "/nonexistent");\n'

_STATS_MACRO = (
    _INIT
    + r"""
setBatchMode(true);
args = split(getArgument(), "\n");
for (k = 0; k < args.length; k++) {
  print("ZFUSE_OPEN\t" + args[k]);
  open(args[k]);
  getDimensions(w, h, c, z, t);
  sum = 0; cnt = 0; lo = 1/0; hi = -1/0;
  for (s = 1; s <= nSlices; s++) {
    setSlice(s);
    getStatistics(area, mean, smin, smax);
    sum += mean * area; cnt += area;
    if (smin < lo) lo = smin;
    if (smax > hi) hi = smax;
  }
  getPixelSize(unit, pw, ph, pd);
  print("ZFUSE_STATS\t" + args[k] + "\t" + w + "\t" + h + "\t" + c + "\t" + z + "\t" + t
        + "\t" + bitDepth() + "\t" + nSlices + "\t" + d2s(sum / cnt, 9) + "\t" + d2s(lo, 9)
        + "\t" + d2s(hi, 9) + "\t" + unit + "\t" + d2s(pw, 9) + "\t" + d2s(ph, 9)
        + "\t" + d2s(pd, 9));
  close();
}
print("ZFUSE_DONE");
"""
)

_STAT_KEYS = (
    ("width", int),
    ("height", int),
    ("channels", int),
    ("slices", int),
    ("frames", int),
    ("bitDepth", int),
    ("nSlices", int),
    ("mean", float),
    ("min", float),
    ("max", float),
    ("unit", str),
    ("pixelWidth", float),
    ("pixelHeight", float),
    ("pixelDepth", float),
)


def _check_paths(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    out = []
    for p in paths:
        s = os.fspath(Path(p).resolve())
        if "\n" in s or "\t" in s:
            raise ValueError(f"path unusable in an ImageJ macro argument: {s!r}")
        out.append(s)
    return out


def imagej_stats_many(paths: Sequence[str | os.PathLike[str]]) -> list[dict[str, object]]:
    """Open each file in one headless ImageJ run; per file a dict with width,
    height, channels, slices, frames, bitDepth, nSlices, mean (whole stack),
    min, max, unit, pixelWidth/Height/Depth. A file ImageJ cannot open fails
    with ImageJ's output (the macro stops at the first such file)."""
    files = _check_paths(paths)
    if not files:
        return []
    out = _run_macro(_STATS_MACRO, "\n".join(files))
    stats: dict[str, dict[str, object]] = {}
    for line in out.splitlines():
        if line.startswith("ZFUSE_STATS\t"):
            parts = line.split("\t")
            values = parts[2 : 2 + len(_STAT_KEYS)]
            record: dict[str, object] = {"path": parts[1]}
            for (key, conv), value in zip(_STAT_KEYS, values, strict=True):
                record[key] = conv(value)
            stats[parts[1]] = record
    missing = [f for f in files if f not in stats]
    if missing:
        raise AssertionError(f"ImageJ did not open {missing[0]}; output:\n{out}")
    return [stats[f] for f in files]


def imagej_stats(path: str | os.PathLike[str]) -> dict[str, object]:
    """`imagej_stats_many` for one file."""
    return imagej_stats_many([path])[0]


_SAVE_MACRO = (
    _INIT
    + r"""
setBatchMode(true);
args = split(getArgument(), "\n");
for (k = 0; k + 1 < args.length; k += 2) {
  print("ZFUSE_OPEN\t" + args[k]);
  open(args[k]);
  saveAs("Tiff", args[k + 1]);
  close();
  print("ZFUSE_SAVED\t" + args[k + 1]);
}
print("ZFUSE_DONE");
"""
)


def imagej_save_many(
    pairs: Sequence[tuple[np.ndarray | str | os.PathLike[str], str | os.PathLike[str]]],
) -> None:
    """For each (source, destination), ImageJ opens the source and writes
    ``saveAs("Tiff", destination)``; all in one JVM. A source array is first
    written with tifffile as an ImageJ file (3-D arrays become Z stacks), or as
    a plain grayscale TIFF for dtypes tifffile's ImageJ mode refuses."""
    import tifffile

    with tempfile.TemporaryDirectory(prefix="zfuse-ijsrc-") as tmp:
        items: list[str] = []
        for i, (src, dst) in enumerate(pairs):
            if isinstance(src, np.ndarray):
                path = Path(tmp) / f"src{i}.tif"
                try:
                    tifffile.imwrite(path, src, imagej=True)
                except ValueError:
                    # tifffile's ImageJ mode takes only u1/u2/i2(?)/f4; ImageJ itself
                    # also reads plain int32/uint32 TIFFs (as 32-bit float images)
                    tifffile.imwrite(path, src, photometric="minisblack")
                src = path
            items += _check_paths([src, dst])
        if not items:
            return
        out = _run_macro(_SAVE_MACRO, "\n".join(items))
    for dst in items[1::2]:
        if f"ZFUSE_SAVED\t{dst}" not in out or not Path(dst).exists():
            raise AssertionError(f"ImageJ did not save {dst}; output:\n{out}")


def imagej_save_tiff(src: np.ndarray | str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """ImageJ writes `src` (an array or a file it can open) as TIFF to `dst`."""
    imagej_save_many([(src, dst)])


_HYPERSTACK_MACRO = (
    _INIT
    + r"""
setBatchMode(true);
open(getArgument());
getDimensions(w, h, c, z, t);
getVoxelSize(pw, ph, pd, unit);
print("ZFUSE_DIMS\t" + w + "\t" + h + "\t" + c + "\t" + z + "\t" + t + "\t" + Stack.isHyperstack
      + "\t" + d2s(pw, 9) + "\t" + d2s(pd, 9) + "\t" + unit + "\t" + d2s(Stack.getFrameInterval(), 9));
for (tt = 1; tt <= t; tt++) {
  for (zz = 1; zz <= z; zz++) {
    for (cc = 1; cc <= c; cc++) {
      Stack.setPosition(cc, zz, tt);
      getStatistics(area, mean);
      print("ZFUSE_PLANE\t" + cc + "\t" + zz + "\t" + tt + "\t" + d2s(mean, 9));
    }
  }
}
print("ZFUSE_DONE");
"""
)


def imagej_hyperstack(path: str | os.PathLike[str]) -> dict[str, object]:
    """Open one file in headless ImageJ: width, height, channels, slices, frames,
    hyperstack (bool), pixelWidth, pixelDepth, unit, frameInterval, and `planes`:
    {(c, z, t): mean} with 0-based positions, as ImageJ's position sliders see it."""
    (file,) = _check_paths([path])
    out = _run_macro(_HYPERSTACK_MACRO, file)
    dims = [line.split("\t")[1:] for line in out.splitlines() if line.startswith("ZFUSE_DIMS\t")]
    if not dims or "ZFUSE_DONE" not in out:
        raise AssertionError(f"ImageJ did not open {file}; output:\n{out}")
    w, h, c, z, t, hyper, pw, pd, unit, finterval = dims[0]
    planes = {}
    for line in out.splitlines():
        if line.startswith("ZFUSE_PLANE\t"):
            cc, zz, tt, mean = line.split("\t")[1:]
            planes[(int(cc) - 1, int(zz) - 1, int(tt) - 1)] = float(mean)
    return {"width": int(w), "height": int(h), "channels": int(c), "slices": int(z),
            "frames": int(t), "hyperstack": hyper in ("1", "true"), "pixelWidth": float(pw),
            "pixelDepth": float(pd), "unit": unit, "frameInterval": float(finterval),
            "planes": planes}


def bioformats_jar() -> Path:
    """Bio-Formats' command-line tools (the jar Fiji uses): one cached download (zfuse.testing)."""
    requires("java")
    return fetch_bioformats_jar()


def bftool(tool: str, *args: str | os.PathLike[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a Bio-Formats tool: "ImageConverter" (bfconvert) or "ImageInfo" (showinf)."""
    cmd = ["java", "-Djava.awt.headless=true", "-cp", str(bioformats_jar()), f"loci.formats.tools.{tool}",
           *[str(a) for a in args]]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result
