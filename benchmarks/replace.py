"""Issue 9 and 16 figures: replacing chunks with real writers, and the rename/cp stress mix.

- `replace`: the same prepared TIFFs put onto existing chunks by `cp`, by `mv`
  from another filesystem (unlink + create + copy) and, for a few chunks, by
  Bio-Formats `bfconvert -overwrite` (against bfconvert writing a local file).
- `stress`: benchmarks/stress.py on a v3 and a sharded array: atomic saves and
  cp replacements by 4 writer threads against 8 reader threads in another
  process; operations per second of each, and the errors readers saw. With
  ZFUSE_BENCH_CODE pointing at an older checkout, the same for that daemon.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from benchmarks.arrays import Spec, build, chunk_paths
from benchmarks.common import CODE, Config, Result, drop_caches, fresh_copy, image, median, mounted
from benchmarks.stress import INITIAL, run
from benchmarks.write import NEW_SEED, check_store, prepared_tiffs
from zfuse.testing import fetch_bioformats_jar


def _spec(cfg: Config) -> Spec:
    n = 1024 if cfg.quick else 2048
    return Spec(f"zstd{n}", (n, n), (256, 256))


def _each(cmd: list[str], pairs: list[tuple[str, str]]) -> float:
    started = time.perf_counter()
    for s, d in pairs:
        subprocess.run([*cmd, s, d], check=True)
    return time.perf_counter() - started


def bench_replace(cfg: Config) -> list[Result]:
    spec = _spec(cfg)
    src = build(cfg, spec)
    tiffs = chunk_paths(prepared_tiffs(cfg, spec), spec.coords())
    cp_t, mv_t = [], []
    problem = ""
    for _ in range(cfg.reps):
        store = fresh_copy(src, "replace.zarr")
        with mounted([store], "-o", "replace_window=120") as m:
            pairs = list(zip(tiffs, chunk_paths(m.path, spec.coords()), strict=True))
            drop_caches(cfg)
            cp_t.append(_each(["cp"], pairs))
        problem = problem or check_store(store, spec)
        store = fresh_copy(src, "replace.zarr")
        with tempfile.TemporaryDirectory(dir="/var/tmp") as other:  # another filesystem than the mount
            moved = []
            for t in tiffs:
                dst = Path(other) / f"{len(moved)}.tif"
                shutil.copyfile(t, dst)
                moved.append(str(dst))
            with mounted([store], "-o", "replace_window=120") as m:
                pairs = list(zip(moved, chunk_paths(m.path, spec.coords()), strict=True))
                drop_caches(cfg)
                mv_t.append(_each(["mv"], pairs))
        problem = problem or check_store(store, spec)
    n = len(spec.coords())
    results = [Result(
        name="replace_mv", what=f"mv of {n} chunk TIFFs from another filesystem onto existing chunks, {spec.name}",
        zfuse_s=median(mv_t), ref_s=median(cp_t), ref_name="cp of the same TIFFs onto the same chunks",
        ratio=median(cp_t) / median(mv_t), goal="report (no slower than cp by much)", error=problem or None,
        extra={"mv_runs_s": mv_t, "cp_runs_s": cp_t}),
    ]
    cfg.log(f"  mv {median(mv_t):.3f}s cp {median(cp_t):.3f}s for {n} chunks")
    results.append(_bench_bfconvert(cfg, spec, src, tiffs))
    return results


def _bench_bfconvert(cfg: Config, spec: Spec, src: Path, tiffs: list[str]) -> Result:
    jar = fetch_bioformats_jar()  # the tests' cached download of the Bio-Formats jar
    count = 3
    base = ["java", "-Djava.awt.headless=true", "-cp", str(jar), "loci.formats.tools.ImageConverter",
            "-overwrite", "-nolookup"]
    store = fresh_copy(src, "replace-bf.zarr")
    with tempfile.TemporaryDirectory() as local, mounted([store], "-o", "replace_window=120") as m:
        dests = chunk_paths(m.path, spec.coords())[:count]
        local_pairs = [(t, str(Path(local) / f"{i}.tif")) for i, t in enumerate(tiffs[:count])]
        for s, d in local_pairs:  # bfconvert refuses to overwrite without -overwrite; start equal
            shutil.copyfile(s, d)
        into_mount = _each(base, list(zip(tiffs[:count], dests, strict=True)))
        to_local = _each(base, local_pairs)
    got = zarr.open_array(str(store))[...]
    want = image(spec.shape, NEW_SEED)
    ok = all(np.array_equal(got[spec.region(i, j)], want[spec.region(i, j)]) for i, j in spec.coords()[:count])
    cfg.log(f"  bfconvert -overwrite: {into_mount / count:.2f}s per chunk into the mount, "
            f"{to_local / count:.2f}s per file locally")
    return Result(
        name="replace_bfconvert", what=f"Bio-Formats bfconvert -overwrite of {count} chunk TIFFs onto chunks",
        zfuse_s=into_mount / count, ref_s=to_local / count, ref_name="bfconvert to a local file (JVM start included)",
        ratio=to_local / into_mount, unit="s per file", goal="report", error=None if ok else "values not stored",
    )


def bench_stress(cfg: Config) -> list[Result]:
    results = []
    seconds = 3.0 if cfg.quick else 6.0
    for name, shards in (("v3", None), ("sharded", (16, 32))):
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "s.zarr"
            arr = zarr.create_array(str(store), shape=(16, 32), chunks=(8, 16), shards=shards, dtype="uint32",
                                    fill_value=0)
            init = np.empty((16, 32), "uint32")
            coords = [(0, 0), (0, 1), (1, 0), (1, 1)]
            for k, (i, j) in enumerate(coords):
                init[i * 8 : i * 8 + 8, j * 16 : j * 16 + 16] = INITIAL + k
            arr[...] = init
            with mounted([store]) as m:
                out = run(m.path, [f"c/{i}/{j}.tiff" for i, j in coords], (8, 16), seconds=seconds)
        rd, wr = out["readers"], out["writers"]
        failures = {k: rd[k] for k in ("enoent", "torn", "bad_value", "missing_in_listing", "other_errors")}
        failures["writer_errors"] = len(wr["errors"])
        cfg.log(f"  stress {name} ({CODE}): writers {out['write_ops_per_s']:.0f} ops/s, readers "
                f"{out['read_ops_per_s']:.0f} ops/s, failures {failures}")
        results.append(Result(
            name=f"stress_{name}", what=f"4 writers (atomic save + cp) / 8 readers on one {name} array, {seconds:g} s",
            value=out["read_ops_per_s"], unit="reader ops/s", goal="report; zero failures",
            met=not any(failures.values()),
            extra={"write_ops_per_s": out["write_ops_per_s"], "failures": failures, "code": str(CODE),
                   "examples": rd["examples"][:5] + wr["errors"][:5]},
        ))
    return results
