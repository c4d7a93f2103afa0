"""Issue 11: 8 reader processes at once against one, on one mount (cold, zstd).

Each side: a fresh mount, page cache dropped, the chunk files split into
contiguous runs (one per process), every process started and waiting before
the clock starts, then released at once; the time is until the last exits.
Aggregate throughput of 8 processes over that of 1 says whether the daemon's
single request loop limits decoding (on N cores the ceiling is about N). The
daemon's CPU is split into its event loop's thread (the main thread) and all
others (decoding and store I/O): a loop thread busy for the whole read would be
the limit; well below that, the cores are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.arrays import Spec, build, chunk_paths
from benchmarks.common import Config, Result, drop_caches, median, mounted

READER = (
    "import sys\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read(1)\n"  # wait for the start signal
    "n = 0\n"
    "for p in sys.argv[1:]:\n"
    "    with open(p, 'rb') as f:\n"
    "        n += len(f.read())\n"
    "print(n)\n"
)


def read_in_processes(paths: list[str], processes: int) -> tuple[float, int]:
    """Seconds until `processes` readers (contiguous shares of `paths`) have all read theirs."""
    share = -(-len(paths) // processes)
    procs = [
        subprocess.Popen([sys.executable, "-c", READER, *paths[i * share:(i + 1) * share]],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for i in range(processes)
    ]
    for p in procs:  # every interpreter started (not timed; the start signal begins the clock)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("x")
        p.stdin.close()
    outputs = [p.stdout.read() for p in procs if p.stdout is not None]
    elapsed = time.perf_counter() - t0
    nbytes = sum(int(out) for out in outputs)
    if any(p.wait() for p in procs):
        raise RuntimeError("a reader process failed")
    return elapsed, nbytes


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread (zfuse: the event loop) and of all its other
    threads, those that have ended included (the process's total less the main thread's)."""

    def cpu(path: str) -> float:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    main = cpu(f"/proc/{pid}/task/{pid}/stat")
    return main, cpu(f"/proc/{pid}/stat") - main


def bench_parallel(cfg: Config) -> list[Result]:
    n = 4096 if cfg.quick else 8192
    spec = Spec(f"zstd{n}", (n, n), (512, 512))
    store = build(cfg, spec)
    one, many, nbytes = [], [], 0
    loop_busy: dict[int, list[float]] = {1: [], 8: []}  # loop thread CPU / wall time
    workers_cpu: dict[int, list[float]] = {1: [], 8: []}
    for _ in range(cfg.reps):
        for count, runs in ((1, one), (8, many)):
            with mounted([store]) as m:
                paths = chunk_paths(m.path, spec.coords())
                drop_caches(cfg)
                loop0, others0 = thread_cpu(m.pid)
                t, nbytes = read_in_processes(paths, count)
                loop1, others1 = thread_cpu(m.pid)
                runs.append(t)
                loop_busy[count].append((loop1 - loop0) / t)
                workers_cpu[count].append(others1 - others0)
    t1, t8 = median(one), median(many)
    cfg.log(f"  8 readers: {t8:.3f} s, 1 reader: {t1:.3f} s ({t1 / t8:.2f}x aggregate); event loop thread "
            f"busy {median(loop_busy[8]):.0%} / {median(loop_busy[1]):.0%} of the time, other threads' CPU "
            f"{median(workers_cpu[8]):.2f} / {median(workers_cpu[1]):.2f} s")
    return [Result(
        name=f"parallel8_{spec.name}",
        what=f"cold read of {len(spec.coords())} zstd chunk files by 8 processes at once vs 1 (same mount)",
        zfuse_s=t8, ref_s=t1, ref_name="1 reader process, same files", nbytes=nbytes, ref_nbytes=nbytes,
        ratio=t1 / t8, goal="report", met=None,
        extra={"eight_runs_s": many, "one_runs_s": one,
               "loop_thread_busy_8": median(loop_busy[8]), "loop_thread_busy_1": median(loop_busy[1]),
               "other_threads_cpu_s_8": median(workers_cpu[8]), "other_threads_cpu_s_1": median(workers_cpu[1])},
    )]
