"""Issue 30: how long a zfuse mount of an S3 store takes to go live, against the same
store's local copy, in `s3_remote`'s lab (moto behind nginx, network namespaces, a
delay on every packet), with and without `-o cache=`:

    sudo .venv/bin/python -m benchmarks.remote_mount [--reps 4] [--rtt 20]

Each mount starts with zfuse's modules in the page cache (as the mount figures of
`s3_remote` do). Prints the seconds until the mountpoint's first stat answers, per
repetition. Timings never decide a pass/fail test; this is where they live.
"""

from __future__ import annotations

import argparse
import os
import shutil

from benchmarks import s3_remote
from benchmarks.common import tmp_dir
from benchmarks.remote_lab import Lab

SYSTEMS = ("zfuse", "zfuse-cache", "zfuse-local")


def run(reps: int, rtt: float) -> dict[str, list[float]]:
    workdir = tmp_dir() / "remote_mount"
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.update(s3_remote._aws_env())
    times: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    try:
        with Lab(workdir, s3_remote.KEY, s3_remote.SECRET, log=print) as lab:
            s3_remote.build_and_upload(lab, workdir, print)
            lab.set_delay(rtt / 2)
            systems = s3_remote.Systems(lab, workdir)
            for rep in range(reps):
                for name in SYSTEMS:
                    mounted, seconds = systems.mount(name, workdir / "cache" / f"{name}-{rep}")
                    times[name].append(round(seconds, 3))
                    mounted.unmount()
            lab.set_delay(0)
    finally:
        s3_remote.unmount_all_under(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.remote_mount", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--rtt", type=float, default=20.0, help="round trip in ms (default 20)")
    args = parser.parse_args(argv)
    for name, seconds in run(args.reps, args.rtt).items():
        print(f"{name:12s} {' '.join(f'{s:.3f}' for s in seconds)} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
