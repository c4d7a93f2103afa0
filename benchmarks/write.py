"""Issue 4 figure: `cp` of prepared chunk TIFFs into the mount vs zarr-python writes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tifffile
import zarr

from benchmarks.arrays import Spec, build, chunk_paths, read_specs
from benchmarks.common import (
    DATA,
    Config,
    Result,
    build_once,
    drop_caches,
    fresh_copy,
    image,
    median,
    mounted,
    timed,
)

NEW_SEED = 1  # the written pixels differ from the stored ones


def prepared_tiffs(cfg: Config, spec: Spec) -> Path:
    """One tifffile-written TIFF per chunk (full chunk shape; same grid for every variant)."""
    def make(path: Path) -> None:
        data = image(spec.shape, NEW_SEED)
        for (i, j), out in zip(spec.coords(), chunk_paths(path, spec.coords()), strict=True):
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(out, data[spec.region(i, j)])

    return build_once(DATA / f"tiffs-{spec.shape[0]}x{spec.shape[1]}-{spec.chunks[0]}", make, cfg,
                      f"{len(spec.coords())} chunk TIFFs (tifffile)")


def check_store(store: Path, spec: Spec) -> str:
    """'' if the store now holds the written pixels, else what is wrong."""
    got = zarr.open_array(str(store), mode="r")[...]
    want = image(spec.shape, NEW_SEED)
    if np.array_equal(got, want):
        return ""
    bad = [(i, j) for i, j in spec.coords() if not np.array_equal(got[spec.region(i, j)], want[spec.region(i, j)])]
    return f"{len(bad)} of {len(spec.coords())} chunks not written, e.g. {bad[:3]}"


def cpu_s(pid: int) -> float:
    """CPU time of the threads of process `pid` so far (schedstat: nanosecond resolution;
    steadier than wall time on a shared machine)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # the thread ended meanwhile
    return total / 1e9


def warm(paths: list[str]) -> None:
    """Read the prepared TIFFs into the page cache: zarr-python's side has its blocks in
    memory, so the copies start from memory too (the figure is the write, not a disk read)."""
    for path in paths:
        with open(path, "rb") as f:
            f.read()


def copy_timed(m: object, srcs: list[str], dests: list[str]) -> tuple[float, float, float]:
    """Wall time of copying, the daemon's CPU time and this process's (the copying client)."""
    pid = m.pid  # type: ignore[attr-defined]
    d0, c0 = cpu_s(pid), cpu_s(os.getpid())
    t, _ = timed(partial(copy_all, srcs, dests))
    return t, cpu_s(pid) - d0, cpu_s(os.getpid()) - c0


def zarr_timed(arr: zarr.Array, spec: Spec, blocks: list[np.ndarray]) -> tuple[float, float]:
    c0 = cpu_s(os.getpid())
    t, _ = timed(partial(zarr_write_all, arr, spec, blocks))
    return t, cpu_s(os.getpid()) - c0


def copy_all(srcs: list[str], dests: list[str]) -> None:
    for s, d in zip(srcs, dests, strict=True):
        shutil.copyfile(s, d)


def zarr_write_all(arr: zarr.Array, spec: Spec, blocks: list[np.ndarray]) -> None:
    for (i, j), b in zip(spec.coords(), blocks, strict=True):
        arr[spec.region(i, j)] = b


def cp_into_fresh_mount(cfg: Config, src: Path, spec: Spec, tiff_paths: list[str],
                        *mount_args: str) -> tuple[float, float, float, str]:
    """`cp` of each prepared TIFF onto its chunk file, in a fresh mount of a fresh copy
    of `src`: (seconds, daemon CPU, cp CPU, what is wrong with the store afterwards)."""
    store = fresh_copy(src, f"w-{spec.name}.zarr")
    with mounted([store], *mount_args) as m:
        dests = chunk_paths(m.path, spec.coords())
        drop_caches(cfg)
        warm(tiff_paths)
        t, daemon, client = copy_timed(m, tiff_paths, dests)
    return t, daemon, client, check_store(store, spec)


def zarr_into_fresh_copy(cfg: Config, src: Path, spec: Spec, blocks: list[np.ndarray],
                         open_store: Callable[[Path], Any]) -> tuple[float, float]:
    """zarr-python `array[region] = data` of the same chunks on a fresh copy of `src`,
    opened through `open_store`: (seconds, CPU)."""
    store = fresh_copy(src, f"w-{spec.name}.zarr")
    arr = zarr.open_array(open_store(store), mode="r+")
    drop_caches(cfg)
    return zarr_timed(arr, spec, blocks)


def bench_write(cfg: Config) -> list[Result]:
    from zfuse.store import AtomicLocalStore

    results = []
    for spec in read_specs(cfg):
        src = build(cfg, spec)
        tiffs = prepared_tiffs(cfg, spec)
        tiff_paths = chunk_paths(tiffs, spec.coords())
        data = image(spec.shape, NEW_SEED)
        blocks = [np.ascontiguousarray(data[spec.region(i, j)]) for i, j in spec.coords()]
        z_t, r_t, a_t, p_t = [], [], [], []
        cpu: dict[str, list[float]] = {k: [] for k in ("zfuse_daemon", "zfuse_client", "zfuse_process_daemon",
                                                    "zfuse_process_client", "zarr", "zarr_fsync")}
        problem = ""
        nbytes = sum(Path(p).stat().st_size for p in tiff_paths)
        for _ in range(cfg.reps):
            try:
                # zfuse: cp of each prepared TIFF onto its chunk file (commit at close)
                t, daemon, client, bad = cp_into_fresh_mount(cfg, src, spec, tiff_paths)
            except OSError as e:
                problem = f"{type(e).__name__}: {e}"
                break
            z_t.append(t)
            cpu["zfuse_daemon"].append(daemon)
            cpu["zfuse_client"].append(client)
            problem = problem or bad
            # zfuse with -o durability=process: close() survives the daemon, not a power cut
            t, daemon, client, bad = cp_into_fresh_mount(cfg, src, spec, tiff_paths, "-o", "durability=process")
            p_t.append(t)
            cpu["zfuse_process_daemon"].append(daemon)
            cpu["zfuse_process_client"].append(client)
            problem = problem or bad
            # zarr-python in-process: array[region] = data for the same chunks (data in memory)
            t, used = zarr_into_fresh_copy(cfg, src, spec, blocks, str)
            r_t.append(t)
            cpu["zarr"].append(used)
            # the same, on zfuse's fsync'ing store (what the mount writes through)
            t, used = zarr_into_fresh_copy(cfg, src, spec, blocks, lambda store: AtomicLocalStore(str(store)))
            a_t.append(t)
            cpu["zarr_fsync"].append(used)
        what = (f"cp of {len(spec.coords())} chunk TIFFs into the mount, {spec.name}"
                + (f" shards {spec.shards}" if spec.shards else ""))
        if not z_t or problem:
            results.append(Result(name=f"write_{spec.name}", what=what, goal=">= 0.8x", met=False,
                                  error=problem or "no run"))
            cfg.log(f"  {spec.name}: write failed: {problem}")
            continue
        zt, rt, at, pt = median(z_t), median(r_t), median(a_t), median(p_t)
        # at the same durability: fdatasync per object on both sides (zfuse's default),
        # and neither side syncing (zfuse -o durability=process, zarr's LocalStore)
        results.append(Result(
            name=f"write_{spec.name}", what=what + " (close() on disk)", zfuse_s=zt, ref_s=at,
            ref_name="zarr-python array[region] = data on an fdatasync-per-object store",
            nbytes=nbytes, ref_nbytes=spec.nbytes, ratio=at / zt, goal=">= 0.8x", met=at / zt >= 0.8,
            extra={"zfuse_runs_s": z_t, "zarr_fsync_runs_s": a_t,
                   "cpu_ms (daemon + cp / zarr)": f"{median(cpu['zfuse_daemon']) * 1e3:.0f} + "
                   f"{median(cpu['zfuse_client']) * 1e3:.0f} / {median(cpu['zarr_fsync']) * 1e3:.0f}"},
        ))
        results.append(Result(
            name=f"write_{spec.name}_process", what=what + " (-o durability=process)", zfuse_s=pt, ref_s=rt,
            ref_name="zarr-python array[region] = data (LocalStore, no sync)",
            nbytes=nbytes, ref_nbytes=spec.nbytes, ratio=rt / pt, goal=">= 0.8x", met=rt / pt >= 0.8,
            extra={"zfuse_runs_s": p_t, "zarr_runs_s": r_t,
                   "cpu_ms (daemon + cp / zarr)": f"{median(cpu['zfuse_process_daemon']) * 1e3:.0f} + "
                   f"{median(cpu['zfuse_process_client']) * 1e3:.0f} / {median(cpu['zarr']) * 1e3:.0f}"},
        ))
        cfg.log(f"  {spec.name}: zfuse cp {zt:.3f}s (process {pt:.3f}s) zarr {rt:.3f}s zarr+fsync store {at:.3f}s")
    return results
