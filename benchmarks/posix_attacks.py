"""What one unprivileged client of a read-write mount costs the daemon through plain
POSIX calls (the sixteenth session's attacks), measured against the daemon of CODE:

- `readers_replaced`: 150 descriptors open on an 8 MiB chunk file, then `cp` of a
  new file onto it: the daemon's RSS growth and the writer's close() time;
- `journal_fds`: 500 refused `mkdir`s of 255-byte names, then 3,000 descriptors on
  `.zfuse/errors`: RSS growth;
- `sparse_write`: five 1-byte writes 1 GiB into a file (an array of 512 MiB
  chunks): the slowest `stat` of `.zfuse/stats` by another thread meanwhile;
- `many_held`: 9,990 files created and held open, then 1-byte appending writes to
  another file for 2 s: writes per second.

Absolute figures: run it once with ZFUSE_BENCH_CODE pointing at a worktree of the
code before, once at the code after (benchmarks/README.md). Timings never go in tests.
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import tifffile
import zarr

from benchmarks.common import Config, Result, mounted, proc_status, tmp_dir


def _rss(pid: int) -> int:
    return proc_status(pid).get("VmRSS", 0)


def _store(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    group = zarr.open_group(str(root), mode="w")
    big = group.create_array("chunks8m", shape=(2048, 4096), chunks=(2048, 2048), dtype="uint16", fill_value=0)
    big[...] = 7
    group.create_array("huge", shape=(16384, 16384), chunks=(16384, 16384), dtype="uint16", fill_value=0)
    group.create_array("small", shape=(64, 64), chunks=(16, 16), dtype="uint16", fill_value=0)
    return root


def _readers_replaced(mnt: Path, pid: int) -> dict[str, float]:
    chunk = mnt / "chunks8m" / "c" / "0" / "0.tiff"
    fds = [os.open(chunk, os.O_RDONLY) for _ in range(150)]
    try:
        for fd in fds:
            os.pread(fd, 1, 0)
        out = io.BytesIO()
        tifffile.imwrite(out, np.full((2048, 2048), 9, np.uint16))
        before = _rss(pid)
        started = time.perf_counter()
        with open(chunk, "wb") as f:
            f.write(out.getvalue())
        took = time.perf_counter() - started
        grown = _rss(pid) - before
    finally:
        for fd in fds:
            os.close(fd)
    return {"rss_growth_mib": grown / 2**20, "close_s": took}


def _journal_fds(mnt: Path, pid: int) -> dict[str, float]:
    for i in range(500):
        try:
            os.mkdir(mnt / "small" / (f"{i:03d}" + "x" * 252))
        except OSError:
            pass
    before = _rss(pid)
    fds = [os.open(mnt / ".zfuse" / "errors", os.O_RDONLY) for _ in range(3000)]
    grown = _rss(pid) - before
    for fd in fds:
        os.close(fd)
    return {"rss_growth_mib": grown / 2**20}


def _sparse_write(mnt: Path, pid: int) -> dict[str, float]:
    path = mnt / "huge" / "c" / "0" / "scratch.tmp"
    slowest = [0.0]
    done = threading.Event()

    def stats_reader() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            os.stat(mnt / ".zfuse" / "stats")
            (mnt / ".zfuse" / "stats").read_bytes()
            slowest[0] = max(slowest[0], time.perf_counter() - t0)

    reader = threading.Thread(target=stats_reader)
    reader.start()
    writes = []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                os.pwrite(fd, b"x", 2**30)
                writes.append(time.perf_counter() - t0)
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
            os.unlink(path)
    finally:
        done.set()
        reader.join()
    return {"slowest_stat_s": slowest[0], "write_s": max(writes)}


def _many_held(mnt: Path, pid: int) -> dict[str, float]:
    held = [os.open(mnt / "small" / "c" / "0" / f"held{i}.tmp", os.O_WRONLY | os.O_CREAT) for i in range(9990)]
    try:
        fd = os.open(mnt / "small" / "c" / "0" / "grows.tmp", os.O_WRONLY | os.O_CREAT)
        n, stop = 0, time.perf_counter() + 2.0
        while time.perf_counter() < stop:
            os.pwrite(fd, b"x", n)
            n += 1
        os.close(fd)
    finally:
        for f in held:
            os.close(f)
    return {"writes_per_s": n / 2.0}


CASES = {"readers_replaced": _readers_replaced, "journal_fds": _journal_fds,
         "sparse_write": _sparse_write, "many_held": _many_held}


def bench_posix(cfg: Config) -> list[Result]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 20000)), hard))
    work = tmp_dir() / "posix"
    work.mkdir(exist_ok=True)
    results = []
    for name, case in CASES.items():
        store = _store(work / f"{name}.zarr")
        try:
            with mounted([store], "-o", "rw,replace_window=1") as m:
                figures = case(m.path, m.pid)
            cfg.log(f"posix {name}: {figures}")
            first = next(iter(figures.items()))
            results.append(Result(name=f"posix_{name}", what=name, value=first[1], unit=first[0], extra=figures))
        except Exception as e:  # (the code before may fail a case: reported, not fatal)
            results.append(Result(name=f"posix_{name}", what=name, error=f"{type(e).__name__}: {e}"))
    return results
