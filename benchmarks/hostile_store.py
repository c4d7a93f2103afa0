"""Thirteenth session: what a crafted *store* costs the daemon when walked, side by side
with an older checkout:

    python -m benchmarks.hostile_store [--groups 300] [--arrays 200] [--before DIR]

A local store of GROUPS groups of ARRAYS arrays each (small groups: each opens all its
members when listed; before this session nothing ever forgot an opened member) is
mounted and walked by `find`: the figures are the walk's time, the daemon's peak RSS
(VmHWM) and how many members it holds opened at the end (`group_members_held`). A
second store nests 300 directories (before: RecursionError while mounting, and no
mount). `--before DIR` runs the same on the checkout in DIR (`git worktree add DIR
REV`); without it only this checkout runs. Timings never go in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import CODE, mounted, tmp_dir
from zfuse.testing import MountError

_ARRAY = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
          "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
          "fill_value": 3, "codecs": [{"name": "bytes"}], "attributes": {}}
_GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}


def _nested_store(root: Path, groups: int, arrays: int) -> Path:
    root.mkdir(parents=True)
    (root / "zarr.json").write_text(json.dumps(_GROUP))
    array = json.dumps(_ARRAY)
    for g in range(groups):
        group = root / f"g{g:04d}"
        group.mkdir()
        (group / "zarr.json").write_text(json.dumps(_GROUP))
        for a in range(arrays):
            (group / f"a{a:04d}").mkdir()
            (group / f"a{a:04d}" / "zarr.json").write_text(array)
    return root


def _deep_store(root: Path, depth: int) -> Path:
    root.mkdir(parents=True)
    (root / "zarr.json").write_text(json.dumps(_GROUP))
    deep = root / "/".join(["d"] * depth)
    deep.mkdir(parents=True)
    (deep / "x").write_bytes(b"stray")
    return root


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def walk(store: Path, code: Path) -> dict[str, object]:
    t0 = time.perf_counter()
    with mounted([store], "-o", "ro", code=code) as m:
        mount_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        found = subprocess.run(["find", str(m.path)], capture_output=True, text=True, check=True)
        find_s = time.perf_counter() - t0
        stats = json.loads((m.path / ".zfuse" / "stats").read_bytes())
        return {"mount_s": round(mount_s, 2), "find_s": round(find_s, 1),
                "entries": len(found.stdout.splitlines()), "peak_rss_mb": round(_peak_rss_mb(m.pid)),
                "held": stats.get("group_members_held", "-"), "opened": stats.get("group_members_opened", "-")}


def deep(store: Path, code: Path) -> str:
    try:
        with mounted([store], "-o", "ro", code=code, timeout=60) as m:
            found = subprocess.run(["find", str(m.path)], capture_output=True, text=True)
            return f"mounted; find listed {len(found.stdout.splitlines())} paths"
    except MountError as e:
        return "no mount: " + (str(e).strip().splitlines() or ["?"])[-1][:120]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile_store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--arrays", type=int, default=200)
    parser.add_argument("--before", type=Path, help="an older checkout to run side by side")
    args = parser.parse_args(argv)
    work = tmp_dir() / "hostile_store"
    shutil.rmtree(work, ignore_errors=True)
    nested = _nested_store(work / "nested.zarr", args.groups, args.arrays)
    deep_store = _deep_store(work / "deep.zarr", 300)
    codes = {"this": CODE, **({"before": args.before} if args.before else {})}
    try:
        for name, code in codes.items():
            figures = walk(nested, code)
            print(f"{name:7s} {args.groups} groups x {args.arrays} arrays: " +
                  " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
            print(f"{name:7s} 300 nested directories: {deep(deep_store, code)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
