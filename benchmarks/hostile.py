"""Issue 27 figures: what one hostile input costs the daemon.

Written files (`zfuse.testing`'s crafted TIFFs: IFD loops, 65,535 tags over one
region, 190,000 pages, codec bombs, an empty strip) are each copied onto a chunk
of a mounted 1024x1024 uint16 array: the figure is the time until `close()`
refuses it, and the daemon's peak RSS (VmHWM) after all of them. A stored chunk
that decompresses to 1 GiB is read: the time until EIO. While each runs, another
process stats `.zfuse/stats`: the slowest answer is reported (the event loop
must never wait on a parse).

The code before issue 27 never returns from the loop cases (its memory grows
~45 MB/s), so there is no side-by-side run: the figures are absolute, the
goal each < 1 s and the peak < 1 GiB. Timings never go in tests.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import zfuse.testing as h
from benchmarks.common import CODE, Config, Result, tmp_dir
from zfuse.testing import errno_of, start_mount, write_file

CASES = h.hostile_tiffs_for_1024_uint16()


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _timed_with_stats(mnt: Path, action: Callable[[], str]) -> tuple[str, float, float]:
    """(outcome, seconds, slowest stat of .zfuse/stats by another process meanwhile)."""
    outcome: list[str] = []
    began = time.perf_counter()
    worker = threading.Thread(target=lambda: outcome.append(action()))
    worker.start()
    slowest = 0.0
    while worker.is_alive():
        t0 = time.perf_counter()
        subprocess.run(["stat", str(mnt / ".zfuse" / "stats")], capture_output=True, timeout=600)
        slowest = max(slowest, time.perf_counter() - t0)
    worker.join()
    return outcome[0], time.perf_counter() - began, slowest


def bench_hostile(cfg: Config) -> list[Result]:
    work = tmp_dir() / "hostile"
    work.mkdir(exist_ok=True)
    src = work / "a.zarr"
    zarr.create_array(str(src), shape=(1024, 2048), chunks=(1024, 1024), dtype="uint16",
                      compressors=[ZstdCodec(level=1)], overwrite=True)[...] = 7
    bomb = work / "bomb.zarr"
    arr = zarr.create_array(str(bomb), shape=(128, 128), chunks=(64, 64), dtype="u1",
                            compressors=[ZstdCodec()], overwrite=True)
    arr[...] = 1
    (bomb / "c" / "0" / "0").write_bytes(numcodecs.Zstd(level=1).encode(np.zeros(2**30, np.uint8)))
    results: list[Result] = []
    m = start_mount([src], work / "mnt", cwd=CODE)
    try:
        target = m.path / "c" / "0" / "1.tiff"
        for name, make in CASES.items():
            data = make()
            outcome, seconds, slowest = _timed_with_stats(m.path, lambda d=data: write_file(target, d))
            cfg.log(f"  {name}: {outcome} after {seconds:.3f} s ({len(data)} bytes; slowest stat {slowest:.3f} s)")
            results.append(Result(
                name=f"hostile_write_{name}", what=f"close() of a crafted TIFF ({name}, {len(data)} bytes) "
                "onto a chunk, until refused", zfuse_s=seconds, value=seconds, unit="s", goal="< 1 s, EINVAL",
                met=seconds < 1 and outcome == "EINVAL",
                extra={"outcome": outcome, "slowest_stat_s": slowest, "bytes": len(data)}))
        peak = _vm_hwm(m.pid)
    finally:
        m.unmount()
    results.append(Result(name="hostile_write_peak_rss", what="daemon VmHWM after every crafted write",
                          value=peak / 2**20, unit="MiB", goal="< 1024 MiB", met=peak < 2**30))
    m = start_mount([bomb], work / "mntb", cwd=CODE)
    try:
        outcome, seconds, slowest = _timed_with_stats(
            m.path, lambda: errno_of((m.path / "c" / "0" / "0.tiff").read_bytes))
        peak = _vm_hwm(m.pid)
    finally:
        m.unmount()
    cfg.log(f"  stored zstd bomb: {outcome} after {seconds:.3f} s, daemon peak {peak / 2**20:.0f} MiB")
    results.append(Result(name="hostile_read_stored_bomb", what="read of a stored 64x64 chunk whose "
                          "32 KB zstd object holds 1 GiB, until refused", zfuse_s=seconds, value=seconds,
                          unit="s", goal="< 1 s, EIO, peak < 1 GiB", met=seconds < 1 and outcome == "EIO"
                          and peak < 2**30, extra={"outcome": outcome, "peak_MiB": peak / 2**20,
                                                   "slowest_stat_s": slowest}))
    return results
