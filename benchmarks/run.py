"""Run the zfuse benchmarks side by side and print a table of ratios.

    python -m benchmarks.run [--only NAME ...] [--quick] [--reps N] [--no-drop-caches]

NAME is one of: read (cold + warm), cold (cold only, interleaved with
ZFUSE_BENCH_OTHER_CODE), ls, rss, write, concat, s3, replace, stress, big, wholeimage,
parallel, startstop, floor, hostile, posix, and s3remote (only with --only: root, network
namespaces; see benchmarks/s3_remote.py). Results are
printed as a table and written to benchmarks/results.json. Timings never go
in pass/fail tests; this is where they live (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import CODE, ROOT, Config, Result, cleanup_tmp, write_json

# name -> (module, function)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "read": ("benchmarks.read", "bench_cold_warm"),
    "cold": ("benchmarks.cold", "bench_cold"),
    "ls": ("benchmarks.read", "bench_ls"),
    "rss": ("benchmarks.read", "bench_rss"),
    "write": ("benchmarks.write", "bench_write"),
    "concat": ("benchmarks.concat", "bench_concat"),
    "s3": ("benchmarks.s3", "bench_s3"),
    "replace": ("benchmarks.replace", "bench_replace"),
    "stress": ("benchmarks.replace", "bench_stress"),
    "big": ("benchmarks.big", "bench_big"),
    "hostile": ("benchmarks.hostile", "bench_hostile"),
    "posix": ("benchmarks.posix_attacks", "bench_posix"),
    "wholeimage": ("benchmarks.wholeimage", "bench_wholeimage"),
    "openslide": ("benchmarks.wholeimage", "bench_openslide"),  # also part of wholeimage
    "parallel": ("benchmarks.parallel", "bench_parallel"),
    "startstop": ("benchmarks.startstop", "bench_startstop"),
    "floor": ("benchmarks.floor", "bench_floor"),
    "s3remote": ("benchmarks.s3_remote", "bench_s3remote"),
}
# run only when named with --only: s3remote needs root, network namespaces, nginx, and takes ~15 min;
# openslide runs within wholeimage
OPT_IN = {"s3remote", "openslide"}


def machine() -> dict[str, str]:
    def mem_total() -> str:
        try:
            with open("/proc/meminfo") as f:
                kib = int(f.readline().split()[1])
            return f"{kib / 2**20:.1f} GiB"
        except OSError:
            return "?"

    def cpu_model() -> str:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "?"

    def load() -> str:
        try:
            return " ".join(f"{x:.2f}" for x in os.getloadavg())
        except OSError:
            return "?"

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=ROOT.parent).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "busy": busy(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu_model(),
        "ram": mem_total(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": load(),
        "commit": commit,
    }


def busy() -> str:
    """Other processes using CPU right now (other people's test suites share the machine)."""
    try:
        out = subprocess.run(["ps", "-eo", "pcpu=,pid=,args=", "--sort=-pcpu"], capture_output=True,
                             text=True).stdout.splitlines()
    except OSError:
        return "?"
    rows = []
    for line in out[:12]:
        pcpu, pid, args = line.split(None, 2)
        if float(pcpu) >= 5 and int(pid) != os.getpid():
            rows.append(f"{pcpu}% {args[:80]}")
    return "; ".join(rows) or "none"


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _rate(r: Result) -> tuple[str, str]:
    z = f"{r.nbytes / r.zfuse_s / 1e6:.0f} MB/s" if r.nbytes and r.zfuse_s else "-"
    ref = f"{r.ref_nbytes / r.ref_s / 1e6:.0f} MB/s" if r.ref_nbytes and r.ref_s else "-"
    return z, ref


def table(results: list[Result], markdown: bool = False) -> str:
    head = ["benchmark", "zfuse", "reference", "zfuse rate", "ref rate", "ratio / figure",
            "goal", "met"]
    rows = []
    for r in results:
        if r.error:
            rows.append([r.name, "-", "-", "-", "-", f"ERROR: {r.error}", r.goal, "no"])
            continue
        z_rate, ref_rate = _rate(r)
        if r.value is not None and r.unit:
            fig = f"{r.value:.2f} {r.unit}"
            if r.ratio is not None:
                fig += f" ({r.ratio:.2f}x)"
        else:
            fig = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        ref = f"{_fmt(r.ref_s)} s" if r.ref_s is not None else "-"
        if r.ref_name and r.ref_s is not None:
            ref += f" ({r.ref_name})"
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        rows.append([r.name, f"{_fmt(r.zfuse_s)} s" if r.zfuse_s is not None else "-", ref,
                     z_rate, ref_rate, fig, r.goal, met])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*row) for row in rows])


def details(results: list[Result]) -> str:
    out = []
    for r in results:
        out.append(f"- {r.name}: {r.what}")
        for k, v in r.extra.items():
            if isinstance(v, float):
                v = f"{v:.3f}"
            elif isinstance(v, list):
                v = "[" + ", ".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in v) + "]"
            if v not in ("", None):
                out.append(f"    {k}: {v}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME",
                   help=f"run only these ({', '.join(BENCHMARKS)})")
    p.add_argument("--quick", action="store_true", help="small arrays, one repetition")
    p.add_argument("--reps", type=int, default=None, help="repetitions per figure (median)")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the page cache before cold runs")
    p.add_argument("--json", type=Path, default=ROOT / "results.json", help="where to write results")
    args = p.parse_args(argv)
    cfg = Config(quick=args.quick, reps=args.reps or (1 if args.quick else 3),
                 drop_caches=not args.no_drop_caches)
    info = machine()
    info["command"] = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    cfg.log("zfuse benchmarks: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    # the daemons start from bytecode, as an installed zfuse does (PYTHONDONTWRITEBYTECODE
    # would otherwise make every mount compile zfuse again)
    for code in {CODE, *([Path(os.environ["ZFUSE_BENCH_OTHER_CODE"])] if os.environ.get("ZFUSE_BENCH_OTHER_CODE") else [])}:
        compileall.compile_dir(str(code / "zfuse"), quiet=1)
    results: list[Result] = []
    t_start = time.perf_counter()
    try:
        for name in args.only or [n for n in BENCHMARKS if n not in OPT_IN]:
            module, fn_name = BENCHMARKS[name]
            cfg.log(f"[{name}]")
            t0 = time.perf_counter()
            try:
                fn: Callable[[Config], list[Result]] = getattr(importlib.import_module(module), fn_name)
                results += fn(cfg)
            except Exception as e:
                traceback.print_exc()
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                summary = " / ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""
                results.append(Result(name=name, what=f"{name} benchmark failed",
                                      error=f"{type(e).__name__}: {summary[:300]}"))
            cfg.log(f"  ({time.perf_counter() - t0:.0f} s)")
    finally:
        cleanup_tmp()
    info["total_s"] = f"{time.perf_counter() - t_start:.0f}"
    end = machine()
    info["loadavg_at_end"] = end["loadavg_at_start"]
    info["busy_at_end"] = end["busy"]
    print()
    print(table(results))
    print()
    print(details(results))
    print()
    print(table(results, markdown=True))
    write_json(args.json, results, info)
    print(f"\nresults written to {args.json} (total {info['total_s']} s)")
    return 0 if not any(r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
