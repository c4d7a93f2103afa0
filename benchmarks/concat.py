"""Issue 5 figure: every chunk of a 4-source concatenation vs one ordinary array, both mounted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from benchmarks.arrays import Spec, build, chunk_paths, create
from benchmarks.common import (
    DATA,
    Config,
    Result,
    build_once,
    drop_caches,
    image,
    median,
    mounted,
    read_files,
    timed,
)


def source_lengths(cfg: Config) -> dict[str, list[int]]:
    n = 2048 if cfg.quick else 4096
    q = n // 4
    return {
        "aligned": [q] * 4,  # multiples of the 512 chunk rows
        "straddling": [q - 24, q + 76, q - 124, q + 72],  # no boundary on a chunk edge
    }


def build_sources(cfg: Config, kind: str, lengths: list[int], n: int) -> list[Path]:
    data = image((n, n), 0)
    paths = []
    start = 0
    for k, length in enumerate(lengths):
        spec = Spec(f"part{k}", (length, n), (512, 512))
        piece = data[start:start + length]

        def make(p: Path, spec: Spec = spec, piece: np.ndarray = piece) -> None:
            create(p, spec)[...] = piece

        paths.append(build_once(DATA / f"concat-{kind}-{n}" / f"s{k}-{length}.zarr", make, cfg,
                                f"concat source {k} ({length} rows)"))
        start += length
    return paths


def bench_concat(cfg: Config) -> list[Result]:
    n = 2048 if cfg.quick else 4096
    single_spec = Spec(f"zstd{n}", (n, n), (512, 512))
    single = build(cfg, single_spec)  # the read benchmark's zstd array: same data, same chunks
    coords = single_spec.coords()
    results = []
    for kind, lengths in source_lengths(cfg).items():
        sources = build_sources(cfg, kind, lengths, n)
        c_t, s_t = [], []
        nbytes = 0
        for _ in range(cfg.reps):
            with mounted(sources, "--concat", "0") as m:
                paths = chunk_paths(m.path, coords)
                drop_caches(cfg)
                t, nbytes = timed(lambda paths=paths: read_files(paths))
                c_t.append(t)
                if not c_t[1:]:  # once: the view is exactly the single array
                    got = zarr.open_array(str(m.path), mode="r")[...]
                    assert np.array_equal(got, zarr.open_array(str(single), mode="r")[...]), \
                        "concatenation view differs from the single array"
            with mounted([single]) as m:
                paths = chunk_paths(m.path, coords)
                drop_caches(cfg)
                t, _ = timed(lambda paths=paths: read_files(paths))
                s_t.append(t)
        ct, st = median(c_t), median(s_t)
        straddle = sum(1 for i in range(single_spec.grid[0])
                       if any(i * 512 < b < (i + 1) * 512 for b in np.cumsum(lengths)[:-1]))
        goal = ">= 0.8x" if kind == "aligned" else "(report)"
        results.append(Result(
            name=f"concat_{kind}",
            what=f"cold read of {len(coords)} chunk files of a 4-source concat (rows {lengths}, "
                 f"{straddle * single_spec.grid[1]} chunks straddle) vs one {n}x{n} array, both mounted",
            zfuse_s=ct, ref_s=st, ref_name="one ordinary array, mounted", nbytes=nbytes,
            ref_nbytes=nbytes, ratio=st / ct, goal=goal,
            met=(st / ct >= 0.8) if kind == "aligned" else None,
            extra={"concat_runs_s": c_t, "single_runs_s": s_t},
        ))
        cfg.log(f"  {kind}: concat {ct:.3f}s single {st:.3f}s")
    return results
