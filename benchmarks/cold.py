"""Cold reads, interleaved: this checkout's daemon and another one in the same repetitions.

`--only cold`: for each read array (raw, zstd, sharded), every repetition mounts
each daemon in turn (the order alternating), drops the page cache, reads the 64
chunk files like `cat`, and reads the same chunks with zarr-python in-process
(page cache dropped too). The other daemon is ZFUSE_BENCH_OTHER_CODE (a checkout,
e.g. `git worktree add --detach /tmp/before REV`); without it only this one runs.
Reported: time ratios (zarr-python / zfuse, medians) and the daemon's CPU time
during the read (/proc/PID/stat utime + stime, all threads), the steadier figure
on a shared machine; then, on the same mount, WARM_PASSES warm re-reads (page
cache): GB/s and the daemon's CPU per file (what an open, flush and release
cost it). ZFUSE_BENCH_COLD_ARRAYS=raw,zstd limits the arrays.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import zarr

from benchmarks.arrays import build, chunk_paths, read_block, read_specs
from benchmarks.common import Config, Result, drop_caches, median, mounted, read_files, timed
from benchmarks.read import cpu_seconds
from benchmarks.write import switches

OTHER_CODE = os.environ.get("ZFUSE_BENCH_OTHER_CODE")
WARM_PASSES = 20


class Run(NamedTuple):
    seconds: float
    cpu: float  # daemon CPU seconds
    switches: int  # daemon context switches
    warm_gbps: float
    warm_cpu_us: float  # daemon CPU per file of a warm re-read


def _thread_cpu_ns(pid: int) -> int:
    """CPU time of the live threads of process `pid` in ns (/proc/PID/task/*/schedstat: finer
    than the 10 ms ticks of /proc/PID/stat, which a warm re-read of 64 files is a few of)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # the thread ended meanwhile
    return total


def _cold_read(store: Path, paths_of: Any, cfg: Config, code: str | None) -> tuple[Run, int]:
    """One cold read of every chunk file on a fresh mount, then warm re-reads."""
    with mounted([store], code=Path(code) if code else None) as m:
        paths = paths_of(m.path)
        drop_caches(cfg)
        c0, s0 = cpu_seconds(m.pid), switches(m.pid)
        t, nbytes = timed(lambda: read_files(paths))
        cpu, switched = cpu_seconds(m.pid) - c0, switches(m.pid) - s0
        c0 = _thread_cpu_ns(m.pid)
        warm_t, _ = timed(lambda: [read_files(paths) for _ in range(WARM_PASSES)])
        warm_cpu = (_thread_cpu_ns(m.pid) - c0) / (WARM_PASSES * len(paths)) / 1e3
        return Run(t, cpu, switched, nbytes * WARM_PASSES / warm_t / 1e9, warm_cpu), nbytes


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

        runs: dict[str | None, list[Run]] = {None: [], OTHER_CODE: []}
        zarr_t: list[float] = []
        nbytes = ref_nbytes = 0
        for rep in range(cfg.reps):
            order = [None, OTHER_CODE] if rep % 2 == 0 else [OTHER_CODE, None]
            for code in order if OTHER_CODE else [None]:
                run, nbytes = _cold_read(store, paths_of, cfg, code)
                runs[code].append(run)
            arr = zarr.open_array(str(store), mode="r")
            drop_caches(cfg)
            t, ref_nbytes = timed(lambda arr=arr, spec=spec: sum(
                read_block(arr, spec, i, j).nbytes for i, j in spec.coords()))
            zarr_t.append(t)
        rt = median(zarr_t)
        def summary(rs: list[Run]) -> Run:
            return Run(*(median([r[i] for r in rs]) for i in range(len(Run._fields))))

        def described(r: Run, rt: float = rt) -> str:
            return (f"{r.seconds:.3f}s ({rt / r.seconds:.2f}x, daemon cpu {r.cpu:.3f}s, {r.switches:.0f} switches; "
                    f"warm {r.warm_gbps:.2f} GB/s, daemon {r.warm_cpu_us:.0f} us/file)")

        this = summary(runs[None])
        this_t = this.seconds
        extra: dict[str, Any] = {"zfuse_runs_s": [r.seconds for r in runs[None]],
                                 "daemon_cpu_s": this.cpu, "daemon_cpu_runs_s": [r.cpu for r in runs[None]],
                                 "daemon_switches": this.switches, "warm_GBps": this.warm_gbps,
                                 "warm_daemon_us_per_file": this.warm_cpu_us, "zarr_runs_s": zarr_t}
        line = f"  {spec.name}: zfuse {described(this)}"
        if OTHER_CODE:
            other = summary(runs[OTHER_CODE])
            extra.update({"other_code": OTHER_CODE, "other_ratio": f"{rt / other.seconds:.2f}x",
                          "other_runs_s": [r.seconds for r in runs[OTHER_CODE]], "other_daemon_cpu_s": other.cpu,
                          "other_daemon_cpu_runs_s": [r.cpu for r in runs[OTHER_CODE]],
                          "other_daemon_switches": other.switches, "other_warm_GBps": other.warm_gbps,
                          "other_warm_daemon_us_per_file": other.warm_cpu_us})
            line += f", other {described(other)}"
        cfg.log(line + f", zarr-python {rt:.3f}s")
        results.append(Result(
            name=f"read_cold_ab_{spec.name}",
            what=f"cold read of {len(coords)} chunk files of {spec.name}, interleaved"
                 + (f" with {OTHER_CODE}" if OTHER_CODE else ""),
            zfuse_s=this_t, ref_s=rt, ref_name="zarr-python in-process", nbytes=nbytes,
            ref_nbytes=ref_nbytes, ratio=rt / this_t, goal=">= 1.0x", met=rt / this_t >= 1.0, extra=extra,
        ))
    return results
