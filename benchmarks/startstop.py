"""Issue 11 figure: `zfuse mount` until it returns with the mount live, and `zfuse umount`.

Both as a user runs them (background daemon), from the checkout in CODE, on the raw read
array. Also reported: the time of the first `ls` of the fresh mount, and the floor no
daemon avoids: a Python process importing numpy, zarr and pyfuse3 (the reference).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.arrays import build, read_specs
from benchmarks.common import CODE, Config, Result, median, tmp_dir


def _run(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zfuse.cli", *args], check=True, cwd=CODE,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def bench_startstop(cfg: Config) -> list[Result]:
    store = build(cfg, read_specs(cfg)[0])
    mnt = tmp_dir() / "startstop"
    mnt.mkdir(exist_ok=True)
    floor_code = "import numpy, zarr, pyfuse3"
    mount_s, ls_s, umount_s, floor_s = [], [], [], []
    for _ in range(max(cfg.reps, 5)):
        mount_s.append(_run(["mount", str(store), str(mnt)]))
        try:
            assert os.path.ismount(mnt)
            t0 = time.perf_counter()
            os.listdir(mnt)
            ls_s.append(time.perf_counter() - t0)
        finally:
            umount_s.append(_run(["umount", str(mnt)]))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", floor_code], check=True)
        floor_s.append(time.perf_counter() - t0)
    m, u, f = median(mount_s), median(umount_s), median(floor_s)
    cfg.log(f"  mount {m:.3f}s (first ls {median(ls_s) * 1000:.1f} ms) umount {u:.3f}s; "
            f"python importing numpy+zarr+pyfuse3 {f:.3f}s")
    return [
        Result(name="mount", what="`zfuse mount` of the raw read array until it returns, mount live",
               zfuse_s=m, ref_s=f, ref_name="python -c 'import numpy, zarr, pyfuse3'", value=m, unit="s",
               ratio=f / m, goal="< 0.5 s", met=m < 0.5,
               extra={"runs_s": mount_s, "first_ls_ms": median(ls_s) * 1000, "floor_runs_s": floor_s}),
        Result(name="umount", what="`zfuse umount` of that mount", zfuse_s=u, value=u, unit="s",
               goal="< 0.5 s", met=u < 0.5, extra={"runs_s": umount_s}),
    ]
