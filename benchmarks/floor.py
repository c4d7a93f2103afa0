"""Issue 11: zfuse against the FUSE floor, same files, same requests, same run.

`benchmarks/minimal_fs.py` serves the plain copies of the read benchmark's
chunk files (the same TIFF bytes zfuse shows) with nothing but the requests;
zfuse serves them from the Zarr store. Interleaved per repetition, page cache
dropped before each cold read: cold reads (with zarr-python in-process as the
read benchmark's reference), warm re-reads on a read-write mount (FLUSH
answered at every close) and on a read-only one (FLUSH refused once, SEMANTICS
[read-8]), and each daemon's CPU time over the cold read. zfuse / floor at 1.0x
means zfuse's own work costs nothing the requests do not already cost.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import zarr

from benchmarks.arrays import build, chunk_paths, read_block, read_specs
from benchmarks.common import (
    ROOT,
    Config,
    Result,
    drop_caches,
    median,
    mounted,
    read_files,
    timed,
    tmp_dir,
)
from benchmarks.read import cpu_seconds, plain_copy, warm_rate
from zfuse.testing import wait_until


@contextlib.contextmanager
def _minimal_fs(args: list[str], mnt: Path, what: str) -> Iterator[tuple[Path, int]]:
    """`python -m benchmarks.minimal_fs ARGS MNT`: (mountpoint, daemon pid), always unmounted."""
    mnt.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.minimal_fs", *args, str(mnt)], cwd=ROOT.parent)
    try:
        wait_until(lambda: os.path.ismount(mnt) or proc.poll() is not None, what=what, timeout=120)
        if proc.poll() is not None:
            raise RuntimeError(f"benchmarks.minimal_fs exited with {proc.returncode}")
        yield mnt, proc.pid
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        proc.wait(timeout=30)


def floor_mount(source: Path, *, flush: bool) -> contextlib.AbstractContextManager[tuple[Path, int]]:
    """The minimal filesystem over `source`: (mountpoint, daemon pid), always unmounted."""
    args = [str(source)] + ([] if flush else ["--no-flush"])
    return _minimal_fs(args, tmp_dir() / f"floor-{'flush' if flush else 'noflush'}", "the minimal filesystem")


def listing_floor_mount(rows: int, cols: int) -> contextlib.AbstractContextManager[tuple[Path, int]]:
    """The listing floor (`minimal_fs --listing`): `c/I/J.tiff` for a rows x cols grid,
    every answer made before the mount; (mountpoint, daemon pid), always unmounted."""
    return _minimal_fs(["--listing", f"{rows}x{cols}"], tmp_dir() / f"floor-listing-{rows}x{cols}", "the listing floor")


def bench_floor(cfg: Config) -> list[Result]:
    results = []
    for spec in read_specs(cfg):
        store = build(cfg, spec)
        plain = plain_copy(cfg, spec, store)
        runs: dict[str, list[float]] = {k: [] for k in (
            "zfuse_cold", "floor_cold", "zarr_cold", "zfuse_cpu", "floor_cpu",
            "zfuse_warm", "floor_warm", "zfuse_warm_ro", "floor_warm_ro")}
        nbytes = 0
        for rep in range(cfg.reps):
            order = ("zfuse", "floor") if rep % 2 == 0 else ("floor", "zfuse")
            for side in order:
                if side == "zfuse":
                    with mounted([store]) as m:
                        paths = chunk_paths(m.path, spec.coords())
                        drop_caches(cfg)
                        cpu = cpu_seconds(m.pid)
                        t, nbytes = timed(lambda paths=paths: read_files(paths))
                        runs["zfuse_cpu"].append(cpu_seconds(m.pid) - cpu)
                        runs["zfuse_cold"].append(t)
                        runs["zfuse_warm"].append(warm_rate(paths, nbytes))
                    with mounted([store], "-o", "ro") as m:
                        runs["zfuse_warm_ro"].append(warm_rate(chunk_paths(m.path, spec.coords()), nbytes))
                else:
                    with floor_mount(plain, flush=True) as (mnt, pid):
                        paths = chunk_paths(mnt, spec.coords())
                        drop_caches(cfg)
                        cpu = cpu_seconds(pid)
                        t, nbytes = timed(lambda paths=paths: read_files(paths))
                        runs["floor_cpu"].append(cpu_seconds(pid) - cpu)
                        runs["floor_cold"].append(t)
                        runs["floor_warm"].append(warm_rate(paths, nbytes))
                    with floor_mount(plain, flush=False) as (mnt, _):
                        runs["floor_warm_ro"].append(warm_rate(chunk_paths(mnt, spec.coords()), nbytes))
            arr = zarr.open_array(str(store), mode="r")
            drop_caches(cfg)
            t, _ = timed(lambda arr=arr, spec=spec: sum(read_block(arr, spec, i, j).nbytes for i, j in spec.coords()))
            runs["zarr_cold"].append(t)
        m = {k: median(v) for k, v in runs.items()}
        cfg.log(f"  {spec.name}: cold zfuse {m['zfuse_cold']:.3f}s floor {m['floor_cold']:.3f}s "
                f"zarr {m['zarr_cold']:.3f}s (daemon CPU {m['zfuse_cpu']:.3f}s / {m['floor_cpu']:.3f}s); "
                f"warm {m['zfuse_warm']:.2f} / {m['floor_warm']:.2f} GB/s, "
                f"-o ro {m['zfuse_warm_ro']:.2f} / {m['floor_warm_ro']:.2f} GB/s")
        extra = {"runs": runs}
        results += [
            Result(name=f"floor_cold_{spec.name}", what=f"cold read of {spec.name}'s chunk files, zfuse vs the "
                   "minimal pyfuse3 filesystem serving the same bytes from plain files",
                   zfuse_s=m["zfuse_cold"], ref_s=m["floor_cold"], ref_name="minimal pyfuse3 fs (floor)",
                   nbytes=nbytes, ratio=m["floor_cold"] / m["zfuse_cold"], goal="report",
                   extra={**extra, "zarr_s": m["zarr_cold"], "floor_vs_zarr": m["zarr_cold"] / m["floor_cold"],
                          "zfuse_cpu_s": m["zfuse_cpu"], "floor_cpu_s": m["floor_cpu"]}),
            Result(name=f"floor_warm_{spec.name}", what=f"warm re-read of {spec.name}'s chunk files, read-write "
                   "mount (FLUSH at every close), zfuse vs the minimal filesystem",
                   value=m["zfuse_warm"], unit="GB/s", ref_name="minimal pyfuse3 fs (floor)",
                   ratio=m["zfuse_warm"] / m["floor_warm"], goal="report",
                   extra={"floor_GBps": m["floor_warm"]}),
            Result(name=f"floor_warm_ro_{spec.name}", what=f"warm re-read of {spec.name}'s chunk files, "
                   "read-only mount (no FLUSH), zfuse vs the minimal filesystem",
                   value=m["zfuse_warm_ro"], unit="GB/s", ref_name="minimal pyfuse3 fs (floor), no FLUSH",
                   ratio=m["zfuse_warm_ro"] / m["floor_warm_ro"], goal="report",
                   extra={"floor_GBps": m["floor_warm_ro"]}),
        ]
    return results
