"""Cold reads, interleaved: this checkout's daemon and another one in the same repetitions.

`--only cold`: for each read array (raw, zstd, sharded), every repetition mounts
each daemon in turn (the order alternating), drops the page cache, reads the 64
chunk files like `cat`, and reads the same chunks with zarr-python in-process
(page cache dropped too). The other daemon is ZFUSE_BENCH_OTHER_CODE (a checkout,
e.g. `git worktree add --detach /tmp/before REV`); without it only this one runs.
Reported: time ratios (zarr-python / zfuse, medians) and the daemon's CPU time
during the read (/proc/PID/stat utime + stime, all threads), the steadier figure
on a shared machine. ZFUSE_BENCH_COLD_ARRAYS=raw,zstd limits the arrays.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import zarr

from benchmarks.arrays import build, chunk_paths, read_block, read_specs
from benchmarks.common import Config, Result, drop_caches, median, mounted, read_files, timed
from benchmarks.read import cpu_seconds
from benchmarks.write import switches

OTHER_CODE = os.environ.get("ZFUSE_BENCH_OTHER_CODE")


def _cold_read(store: Path, paths_of: Any, cfg: Config, code: str | None) -> tuple[float, float, int, int]:
    """(seconds, daemon CPU seconds, daemon context switches, bytes) of one cold read of
    every chunk file."""
    with mounted([store], code=Path(code) if code else None) as m:
        paths = paths_of(m.path)
        drop_caches(cfg)
        c0, s0 = cpu_seconds(m.pid), switches(m.pid)
        t, nbytes = timed(lambda: read_files(paths))
        return t, cpu_seconds(m.pid) - c0, switches(m.pid) - s0, nbytes


def bench_cold(cfg: Config) -> list[Result]:
    wanted = os.environ.get("ZFUSE_BENCH_COLD_ARRAYS")
    results = []
    for spec in read_specs(cfg):
        if wanted and not any(spec.name.startswith(w) for w in wanted.split(",")):
            continue
        store = build(cfg, spec)
        coords = spec.coords()

        def paths_of(root: Path, coords: list[tuple[int, int]] = coords) -> list[str]:
            return chunk_paths(root, coords)

        runs: dict[str | None, list[tuple[float, float, int]]] = {None: [], OTHER_CODE: []}
        zarr_t: list[float] = []
        nbytes = ref_nbytes = 0
        for rep in range(cfg.reps):
            order = [None, OTHER_CODE] if rep % 2 == 0 else [OTHER_CODE, None]
            for code in order if OTHER_CODE else [None]:
                t, cpu, switched, nbytes = _cold_read(store, paths_of, cfg, code)
                runs[code].append((t, cpu, switched))
            arr = zarr.open_array(str(store), mode="r")
            drop_caches(cfg)
            t, ref_nbytes = timed(lambda arr=arr, spec=spec: sum(
                read_block(arr, spec, i, j).nbytes for i, j in spec.coords()))
            zarr_t.append(t)
        rt = median(zarr_t)
        this_t, this_cpu = median([r[0] for r in runs[None]]), median([r[1] for r in runs[None]])
        this_sw = median([r[2] for r in runs[None]])
        extra: dict[str, Any] = {"zfuse_runs_s": [r[0] for r in runs[None]],
                                 "daemon_cpu_s": this_cpu, "daemon_cpu_runs_s": [r[1] for r in runs[None]],
                                 "daemon_switches": this_sw, "zarr_runs_s": zarr_t}
        line = f"  {spec.name}: zfuse {this_t:.3f}s ({rt / this_t:.2f}x, daemon cpu {this_cpu:.3f}s, {this_sw:.0f} switches)"
        if OTHER_CODE:
            other = runs[OTHER_CODE]
            other_t, other_cpu, other_sw = (median([r[i] for r in other]) for i in range(3))
            extra.update({"other_code": OTHER_CODE, "other_ratio": f"{rt / other_t:.2f}x",
                          "other_runs_s": [r[0] for r in other], "other_daemon_cpu_s": other_cpu,
                          "other_daemon_cpu_runs_s": [r[1] for r in other], "other_daemon_switches": other_sw})
            line += (f", other {other_t:.3f}s ({rt / other_t:.2f}x, daemon cpu {other_cpu:.3f}s, "
                     f"{other_sw:.0f} switches)")
        cfg.log(line + f", zarr-python {rt:.3f}s")
        results.append(Result(
            name=f"read_cold_ab_{spec.name}",
            what=f"cold read of {len(coords)} chunk files of {spec.name}, interleaved"
                 + (f" with {OTHER_CODE}" if OTHER_CODE else ""),
            zfuse_s=this_t, ref_s=rt, ref_name="zarr-python in-process", nbytes=nbytes,
            ref_nbytes=ref_nbytes, ratio=rt / this_t, goal=">= 1.0x", met=rt / this_t >= 1.0, extra=extra,
        ))
    return results
