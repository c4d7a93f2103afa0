"""Issue 4 figure: `cp` of prepared chunk TIFFs into the mount vs zarr-python writes.

Two copying clients, each in this process (a process per file would cost more than
the copy): `copy_like_cp` does what coreutils `cp` (9.x) does between filesystems,
one write per `st_blksize` of the destination (one 512 KiB write request per chunk
file here), and Python's `shutil.copyfile` (sendfile: nine 64 KiB write requests per
chunk file). With ZFUSE_BENCH_OTHER_CODE=CHECKOUT the daemon of another checkout
takes the same copies in the same repetitions (before/after).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
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
# Another checkout whose daemon takes the same copies in the same repetitions
# (interleaved, so a busy machine weighs on both alike): a "before" figure.
OTHER_CODE = os.environ.get("ZFUSE_BENCH_OTHER_CODE")


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


def switches(pid: int) -> int:
    """Context switches of the threads of process `pid` so far: each thread hop and each
    request that wakes the event loop is at least one (threads that ended are not counted)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            pass  # the thread ended meanwhile
    return total


def warm(paths: list[str]) -> None:
    """Read the prepared TIFFs into the page cache: zarr-python's side has its blocks in
    memory, so the copies start from memory too (the figure is the write, not a disk read)."""
    for path in paths:
        with open(path, "rb") as f:
            f.read()


@dataclass
class CopyRun:
    """One `cp` of every prepared TIFF onto its chunk file."""

    seconds: float
    daemon_cpu: float  # seconds
    client_cpu: float  # seconds, this process (the copying client)
    daemon_switches: int
    problem: str = ""  # what is wrong with the store afterwards ('' : every chunk written)


def copy_timed(m: object, srcs: list[str], dests: list[str], copy: Callable[[str, str], object]) -> CopyRun:
    """Wall time of copying, the daemon's CPU time and context switches, and the client's CPU time."""
    pid = m.pid  # type: ignore[attr-defined]
    d0, c0, s0 = cpu_s(pid), cpu_s(os.getpid()), switches(pid)
    t, _ = timed(partial(copy_all, srcs, dests, copy))
    return CopyRun(t, cpu_s(pid) - d0, cpu_s(os.getpid()) - c0, switches(pid) - s0)


def zarr_timed(arr: zarr.Array, spec: Spec, blocks: list[np.ndarray]) -> tuple[float, float]:
    c0 = cpu_s(os.getpid())
    t, _ = timed(partial(zarr_write_all, arr, spec, blocks))
    return t, cpu_s(os.getpid()) - c0


def copy_all(srcs: list[str], dests: list[str], copy: Callable[[str, str], object]) -> None:
    for s, d in zip(srcs, dests, strict=True):
        copy(s, d)


CP_MIN_BUFFER = 128 * 1024  # coreutils' IO_BUFSIZE (9.1; 256 KiB from 9.2)


def copy_like_cp(src: str, dst: str) -> None:
    """What coreutils `cp SRC DST` does onto an existing file on another filesystem
    (strace of cp 9.1 onto a chunk file): open O_WRONLY|O_TRUNC, fstat both,
    copy_file_range refused (EXDEV), then read and write in buffers of
    max(st_blksize, IO_BUFSIZE), with no fsync."""
    fd_in = os.open(src, os.O_RDONLY)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o644)
        try:
            os.fstat(fd_in)
            buffer = bytearray(max(os.fstat(fd_out).st_blksize, CP_MIN_BUFFER))
            view = memoryview(buffer)
            while n := os.readv(fd_in, [buffer]):
                done = 0
                while done < n:
                    done += os.write(fd_out, view[done:n])
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


CLIENTS: dict[str, Callable[[str, str], object]] = {"cp": copy_like_cp, "copyfile": shutil.copyfile}


def zarr_write_all(arr: zarr.Array, spec: Spec, blocks: list[np.ndarray]) -> None:
    for (i, j), b in zip(spec.coords(), blocks, strict=True):
        arr[spec.region(i, j)] = b


def cp_into_fresh_mount(cfg: Config, src: Path, spec: Spec, tiff_paths: list[str], *mount_args: str,
                        code: Path | None = None, client: str = "cp") -> CopyRun:
    """A copy (`client`: a key of CLIENTS) of each prepared TIFF onto its chunk file, in a
    fresh mount (of the daemon in checkout `code`, default this one) of a fresh copy of `src`."""
    store = fresh_copy(src, f"w-{spec.name}.zarr")
    with mounted([store], *mount_args, code=code) as m:
        dests = chunk_paths(m.path, spec.coords())
        drop_caches(cfg)
        warm(tiff_paths)
        run = copy_timed(m, tiff_paths, dests, CLIENTS[client])
    run.problem = check_store(store, spec)
    return run


def zarr_into_fresh_copy(cfg: Config, src: Path, spec: Spec, blocks: list[np.ndarray],
                         open_store: Callable[[Path], Any]) -> tuple[float, float]:
    """zarr-python `array[region] = data` of the same chunks on a fresh copy of `src`,
    opened through `open_store`: (seconds, CPU)."""
    store = fresh_copy(src, f"w-{spec.name}.zarr")
    arr = zarr.open_array(open_store(store), mode="r+")
    drop_caches(cfg)
    return zarr_timed(arr, spec, blocks)


MODES = {"disk": (), "process": ("-o", "durability=process")}  # what close() promises: mount options


def bench_write(cfg: Config) -> list[Result]:
    """Per array: each client (CLIENTS) at each durability (MODES) against zarr-python
    writing the same chunks at the same durability, every mount fresh, interleaved."""
    from zfuse.local_store import AtomicLocalStore

    results = []
    for spec in read_specs(cfg):
        src = build(cfg, spec)
        tiffs = prepared_tiffs(cfg, spec)
        tiff_paths = chunk_paths(tiffs, spec.coords())
        data = image(spec.shape, NEW_SEED)
        blocks = [np.ascontiguousarray(data[spec.region(i, j)]) for i, j in spec.coords()]
        runs: dict[tuple[str, str], list[CopyRun]] = {(c, m): [] for c in CLIENTS for m in MODES}
        other: dict[tuple[str, str], list[CopyRun]] = {(c, m): [] for c in CLIENTS for m in MODES}  # OTHER_CODE's daemon
        zarr_runs: dict[str, list[float]] = {"disk": [], "process": []}
        cpu: dict[str, list[float]] = {"disk": [], "process": []}
        problem = ""
        nbytes = sum(Path(p).stat().st_size for p in tiff_paths)
        for rep in range(cfg.reps):
            try:
                for code in ([None, OTHER_CODE] if rep % 2 == 0 else [OTHER_CODE, None]) if OTHER_CODE else [None]:
                    daemon = Path(code) if code else None
                    for (client, mode), into in (other if code else runs).items():
                        # each prepared TIFF copied onto its chunk file (the commit is at close)
                        run = cp_into_fresh_mount(cfg, src, spec, tiff_paths, *MODES[mode], code=daemon, client=client)
                        into.append(run)
                        problem = problem or run.problem
            except OSError as e:
                problem = f"{type(e).__name__}: {e}"
                break
            # zarr-python in-process: array[region] = data for the same chunks (data in
            # memory), on zarr's LocalStore (no sync) and on zfuse's fdatasync'ing store
            for mode, open_store in (("process", str), ("disk", lambda store: AtomicLocalStore(str(store)))):
                t, used = zarr_into_fresh_copy(cfg, src, spec, blocks, open_store)
                zarr_runs[mode].append(t)
                cpu[mode].append(used)
        what = (f"{len(spec.coords())} chunk TIFFs copied into the mount, {spec.name}"
                + (f" shards {spec.shards}" if spec.shards else ""))
        if not runs["cp", "process"] or problem:
            results.append(Result(name=f"write_{spec.name}", what=what, goal=">= 0.8x", met=False,
                                  error=problem or "no run"))
            cfg.log(f"  {spec.name}: write failed: {problem}")
            continue
        ref_names = {"disk": "zarr-python array[region] = data on an fdatasync-per-object store",
                     "process": "zarr-python array[region] = data (LocalStore, no sync)"}
        whats = {"disk": " (close() on disk)", "process": " (-o durability=process)"}
        clients = {"cp": "coreutils cp's writes (one per st_blksize)", "copyfile": "shutil.copyfile (64 KiB sendfile writes)"}
        for (client, mode), client_runs in runs.items():
            times = [r.seconds for r in client_runs]
            zt, rt = median(times), median(zarr_runs[mode])
            # the same durability on both sides: fdatasync per object (zfuse's default)
            # or none (zfuse -o durability=process, zarr's LocalStore)
            results.append(Result(
                name=f"write_{spec.name}" + ("" if client == "cp" else f"_{client}") + ("" if mode == "disk" else f"_{mode}"),
                what=f"{what}, {clients[client]}{whats[mode]}", zfuse_s=zt, ref_s=rt, ref_name=ref_names[mode],
                nbytes=nbytes, ref_nbytes=spec.nbytes, ratio=rt / zt, goal=">= 0.8x", met=rt / zt >= 0.8,
                extra={"zfuse_runs_s": times, "zarr_runs_s": zarr_runs[mode], **_cpu(client_runs, cpu[mode]),
                       **_other(other[client, mode], rt)},
            ))
        cfg.log(f"  {spec.name}: zfuse " + ", ".join(f"{c} {m} {median([r.seconds for r in rs]):.3f}s" for (c, m), rs in runs.items())
                + f"; zarr {median(zarr_runs['process']):.3f}s, zarr+fsync store {median(zarr_runs['disk']):.3f}s")
    return results


def _cpu(runs: list[CopyRun], zarr_cpu: list[float] | None = None) -> dict[str, str]:
    """CPU figures of the zfuse runs (against zarr's): steadier than wall time on a busy machine."""
    cpu = (f"{median([r.daemon_cpu for r in runs]) * 1e3:.0f} + {median([r.client_cpu for r in runs]) * 1e3:.0f}"
           + (f" / {median(zarr_cpu) * 1e3:.0f}" if zarr_cpu else ""))
    return {
        "cpu_ms (daemon + cp" + (" / zarr)" if zarr_cpu else ")"): cpu,
        "daemon context switches": f"{median([r.daemon_switches for r in runs]):.0f}",
    }


def _other(runs: list[CopyRun], ref_s: float) -> dict[str, Any]:
    """The other checkout's daemon in the same repetitions (ZFUSE_BENCH_OTHER_CODE)."""
    if not runs:
        return {}
    return {"other_code": OTHER_CODE, "other_runs_s": [r.seconds for r in runs],
            "other_ratio": f"{ref_s / median([r.seconds for r in runs]):.2f}x",
            **{f"other {k}": v for k, v in _cpu(runs).items()}}
