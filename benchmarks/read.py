"""Issue 3 figures: cold read, warm re-read, `ls -lR` of 100,000 chunks, daemon peak RSS."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from benchmarks.arrays import Spec, build, chunk_paths, read_block, read_specs
from benchmarks.common import (
    DATA,
    Config,
    MiB,
    Result,
    RssSampler,
    build_once,
    drop_caches,
    mbps,
    median,
    mounted,
    proc_status,
    read_files,
    timed,
)


def plain_copy(cfg: Config, spec: Spec, store: Path) -> Path:
    """The chunk TIFFs copied once out of a mount into an ordinary directory."""

    def make(dst: Path) -> None:
        with mounted([store]) as m:
            for c, src in zip(spec.coords(), chunk_paths(m.path, spec.coords()), strict=True):
                out = Path(chunk_paths(dst, [c])[0])
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out)

    return build_once(DATA / f"plain-{spec.name}", make, cfg, f"plain copies of {spec.name}'s chunk files")


def warm_rate(paths: list[str], nbytes: int) -> float:
    """GB/s re-reading files that are in the page cache (at least 3 passes and 0.5 s)."""
    read_files(paths)
    passes, t0 = 0, time.perf_counter()
    while passes < 3 or time.perf_counter() - t0 < 0.5:
        read_files(paths)
        passes += 1
    return nbytes * passes / (time.perf_counter() - t0) / 1e9


def bench_cold_warm(cfg: Config) -> list[Result]:
    results = []
    for spec in read_specs(cfg):
        store = build(cfg, spec)
        plain = plain_copy(cfg, spec, store)
        plain_paths = chunk_paths(plain, spec.coords())
        z_t, r_t, p_t, warm, warm_ro, plain_warm = [], [], [], [], [], []
        nbytes = ref_nbytes = 0
        dropped = True
        for _ in range(cfg.reps):
            # zfuse: fresh mount, page cache dropped, every chunk file read like `cat`
            with mounted([store]) as m:
                paths = chunk_paths(m.path, spec.coords())
                dropped &= drop_caches(cfg)
                t, nbytes = timed(lambda paths=paths: read_files(paths))
                z_t.append(t)
                # warm: the same files again, served from the kernel page cache
                warm.append(warm_rate(paths, nbytes))
            # warm on a read-only mount: closes cost no FLUSH request there (SEMANTICS [read-8])
            with mounted([store], "-o", "ro") as m:
                warm_ro.append(warm_rate(chunk_paths(m.path, spec.coords()), nbytes))
            # zarr-python in-process over the same chunks (array opened before timing)
            arr = zarr.open_array(str(store), mode="r")
            dropped &= drop_caches(cfg)
            t, ref_nbytes = timed(lambda arr=arr, spec=spec: sum(
                read_block(arr, spec, i, j).nbytes for i, j in spec.coords()))
            r_t.append(t)
            # plain files: the same TIFF bytes from the local disk
            dropped &= drop_caches(cfg)
            t, plain_bytes = timed(lambda pp=plain_paths: read_files(pp))
            p_t.append(t)
            plain_warm.append(warm_rate(plain_paths, plain_bytes))
        zt, rt, pt = median(z_t), median(r_t), median(p_t)
        ratio = rt / zt  # same chunks on both sides: throughput ratio = time ratio
        note = "" if dropped else "page cache NOT dropped"
        results.append(Result(
            name=f"read_cold_{spec.name}",
            what=f"cold read of {len(spec.coords())} chunk files, {spec.name} {spec.shape} "
                 f"chunks {spec.chunks}" + (f" shards {spec.shards}" if spec.shards else ""),
            zfuse_s=zt, ref_s=rt, ref_name="zarr-python in-process", nbytes=nbytes,
            ref_nbytes=ref_nbytes, ratio=ratio, goal=">= 1.0x", met=ratio >= 1.0,
            extra={"plain_files_s": pt, "plain_MBps": mbps(plain_bytes, pt),
                   "zfuse_vs_plain": pt / zt, "zfuse_runs_s": z_t, "zarr_runs_s": r_t,
                   "plain_runs_s": p_t, "note": note},
        ))
        w, w_ro = median(warm), median(warm_ro)
        for suffix, where, runs in (("", "", warm), ("ro_", " on a -o ro mount", warm_ro)):
            rate = median(runs)
            results.append(Result(
                name=f"read_warm_{suffix}{spec.name}",
                what=f"warm re-read (page cache) of {spec.name}'s chunk files{where}",
                nbytes=nbytes, value=rate, unit="GB/s", ratio=rate / median(plain_warm),
                goal=">= 3 GB/s", met=rate >= 3.0,
                extra={"runs_GBps": runs, "plain_files_warm_GBps": median(plain_warm),
                       "plain_warm_runs_GBps": plain_warm},
            ))
        cfg.log(f"  {spec.name}: zfuse {zt:.3f}s zarr {rt:.3f}s plain {pt:.3f}s warm {w:.2f} GB/s, "
                f"-o ro {w_ro:.2f} GB/s (plain files {median(plain_warm):.2f} GB/s)")
    return results


# -- ls -lR of 100,000 chunks -----------------------------------------------------------------
def ls_shape(cfg: Config) -> tuple[int, int]:
    return (100, 100) if cfg.quick else (1000, 100)


def build_ls_flat(cfg: Config) -> Path:
    """uint8, chunks (1, 1), raw: each chunk object is one byte, written directly as files."""
    shape = ls_shape(cfg)

    def make(path: Path) -> None:
        zarr.create_array(store=str(path), shape=shape, chunks=(1, 1), dtype="uint8",
                          compressors=None, fill_value=0, zarr_format=3)
        for i in range(shape[0]):
            d = path / "c" / str(i)
            d.mkdir(parents=True)
            for j in range(shape[1]):
                with open(d / str(j), "wb") as f:
                    f.write(bytes([(i + j) % 251 + 1]))
        arr = zarr.open_array(str(path), mode="r")  # the files are what zarr would write
        assert arr[shape[0] - 1, shape[1] - 1] == (shape[0] + shape[1] - 2) % 251 + 1

    return build_once(DATA / f"ls-flat-{shape[0]}x{shape[1]}.zarr", make, cfg,
                      f"{shape[0] * shape[1]} one-byte chunk objects")


def build_ls_sharded(cfg: Config) -> Path:
    """The same chunks as inner chunks of (100, 100) shards (few objects)."""
    shape = ls_shape(cfg)

    def make(path: Path) -> None:
        arr = zarr.create_array(store=str(path), shape=shape, chunks=(1, 1), shards=(100, 100),
                                dtype="uint8", compressors=None, fill_value=0, zarr_format=3)
        i, j = np.indices(shape)
        arr[...] = ((i + j) % 251 + 1).astype(np.uint8)

    return build_once(DATA / f"ls-sharded-{shape[0]}x{shape[1]}.zarr", make, cfg,
                      f"{shape[0] * shape[1]} inner chunks in {shape[0] // 100} shards")


def ls_lR(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = subprocess.run(["ls", "-lR", str(path)], capture_output=True, check=True).stdout
    return time.perf_counter() - t0, out.count(b".tiff\n")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ls_fresh_mount(cfg: Config, store: Path, code: Path | None = None) -> tuple[float, int, float]:
    """`ls -lR` of a fresh mount of `store` (daemon of `code`), page cache dropped:
    seconds, .tiff files listed, daemon CPU seconds."""
    with mounted([store], code=code) as m:
        drop_caches(cfg)
        c0 = cpu_seconds(m.pid)
        t, seen = ls_lR(m.path)
        return t, seen, cpu_seconds(m.pid) - c0


def bench_ls(cfg: Config) -> list[Result]:
    """`ls -lR` of a fresh mount vs `ls -lR` of the flat store directory (100,000 files),
    in the same repetition: the sharded store itself is ten files, so the flat store's
    listing is the reference for both. Also recorded: the daemon's CPU time. With
    ZFUSE_BENCH_OTHER_CODE=CHECKOUT that checkout's daemon lists in the same repetitions
    too (before/after), the two daemons taking turns at going first. Each repetition
    also lists the listing floor (`minimal_fs --listing`: the same names answered from
    memory by a pyfuse3 + trio filesystem doing nothing else): what the requests and
    the kernel cost on this machine, whatever a daemon does."""
    from benchmarks.floor import listing_floor_mount

    results = []
    rows, cols = ls_shape(cfg)
    n = rows * cols
    flat = build_ls_flat(cfg)
    other_code = os.environ.get("ZFUSE_BENCH_OTHER_CODE")
    for kind, builder in (("flat", build_ls_flat), ("sharded", build_ls_sharded)):
        store = builder(cfg)
        z_t, p_t, own_t, cpu, seen = [], [], [], [], 0
        o_t: list[float] = []
        o_cpu: list[float] = []
        f_t: list[float] = []
        for rep in range(cfg.reps):
            # the listing floor: a pyfuse3 + trio filesystem answering the same names
            # from memory (what the requests cost with no work at all)
            with listing_floor_mount(rows, cols) as (mnt, _):
                drop_caches(cfg)
                t, listed = ls_lR(mnt)
                assert listed == n, f"the listing floor listed {listed} files"
                f_t.append(t)
            order = [None, other_code] if rep % 2 == 0 else [other_code, None]
            for code in order if other_code else [None]:
                t, listed, used = _ls_fresh_mount(cfg, store, Path(code) if code else None)
                if code:
                    o_t.append(t)
                    o_cpu.append(used)
                else:
                    z_t.append(t)
                    cpu.append(used)
                    seen = listed
            drop_caches(cfg)
            p_t.append(ls_lR(flat)[0])
            if store != flat:
                drop_caches(cfg)
                own_t.append(ls_lR(store)[0])
        zt, pt = median(z_t), median(p_t)
        ratios = [p / z for p, z in zip(p_t, z_t, strict=True)]
        ft = median(f_t)
        extra = {"zfuse_runs_s": z_t, "store_runs_s": p_t, "ratios": ratios, "daemon_cpu_s": cpu,
                 "own_store_runs_s": own_t, "listed": seen, "floor_runs_s": f_t,
                 "floor_vs_store": f"{median([p / f for p, f in zip(p_t, f_t, strict=True)]):.2f}x",
                 "zfuse_vs_floor": f"{median([f / z for f, z in zip(f_t, z_t, strict=True)]):.2f}x"}
        if other_code:
            other_ratios = [p / o for p, o in zip(p_t, o_t, strict=True)]
            extra.update(other_code=other_code, other_runs_s=o_t, other_ratios=other_ratios,
                         other_ratio=f"{median(other_ratios):.2f}x", other_daemon_cpu_s=o_cpu)
        results.append(Result(
            name=f"ls_lR_{kind}",
            what=f"ls -lR of a fresh mount, {n} chunks ({kind} store), {seen} .tiff listed",
            zfuse_s=zt, ref_s=pt, ref_name="ls -lR of the flat store directory (100,000 files)",
            ratio=median(ratios), value=zt, unit="s", goal="zfuse <= store (ratio >= 1.0x)",
            met=median(ratios) >= 1.0 and seen == n,
            extra=extra,
        ))
        cfg.log(f"  ls -lR {kind}: zfuse {zt:.2f}s (flat store dir {pt:.2f}s, ratio {median(ratios):.2f}x), "
                f"daemon cpu {median(cpu):.2f}s, {seen} files; listing floor {ft:.2f}s "
                f"(store / floor {extra['floor_vs_store']}, floor / zfuse {extra['zfuse_vs_floor']})")
        if other_code:
            cfg.log(f"  ls -lR {kind}, {other_code}: {median(o_t):.2f}s (ratio {median(other_ratios):.2f}x), "
                    f"daemon cpu {median(o_cpu):.2f}s")
    return results


# -- peak RSS on a 4 GiB array -----------------------------------------------------------------
def rss_shape(cfg: Config) -> tuple[int, int]:
    return (16384, 16384) if cfg.quick else (32768, 65536)  # 512 MiB / 4 GiB of uint16


def build_big(cfg: Config) -> Path:
    shape = rss_shape(cfg)

    def make(path: Path) -> None:
        arr = zarr.create_array(store=str(path), shape=shape, chunks=(512, 512), dtype="uint16",
                                compressors=[ZstdCodec(level=1)], fill_value=0, zarr_format=3)
        x = np.arange(shape[1], dtype=np.uint32)
        for b in range(0, shape[0], 512):  # one row of chunks (64 MiB) at a time
            y = np.arange(b, b + 512, dtype=np.uint32)[:, None]
            arr[b:b + 512] = ((y + (x // 512)[None, :] * 7) & 0xFFFF).astype(np.uint16)

    gib = shape[0] * shape[1] * 2 / 2**30
    return build_once(DATA / f"big-{shape[0]}x{shape[1]}.zarr", make, cfg,
                      f"{gib:g} GiB gradient array (zstd, chunk by chunk)")


def bench_rss(cfg: Config) -> list[Result]:
    shape = rss_shape(cfg)
    store = build_big(cfg)
    coords = [(i, j) for i in range(shape[0] // 512) for j in range(shape[1] // 512)]
    with mounted([store], "--cache-size", "256M") as m:
        paths = chunk_paths(m.path, coords)
        idle = proc_status(m.pid).get("VmRSS", 0)
        drop_caches(cfg)
        with RssSampler(m.pid) as sampler:
            t, nbytes = timed(lambda: read_files(paths))
        peak = sampler.peak
    mib = peak / MiB
    results = [Result(
        name="rss_4GiB" if not cfg.quick else "rss_512MiB",
        what=f"daemon peak RSS reading every chunk file of a {nbytes / 2**30:.2f} GiB array "
             f"({len(coords)} chunks) with --cache-size 256M",
        zfuse_s=t, nbytes=nbytes, value=mib, unit="MiB", goal="< 512 MiB", met=mib < 512,
        extra={"read_MBps": mbps(nbytes, t), "vm_hwm_MiB": (sampler.hwm or 0) / MiB,
               "samples": len(sampler.samples), "idle_MiB": idle / MiB},
    )]
    cfg.log(f"  peak RSS {mib:.0f} MiB over {nbytes / 2**30:.2f} GiB read in {t:.1f}s")
    return results
