"""Issue 17 figures: big stores cost what is looked at.

- `ls_dir_1M`: first `ls` of one chunk directory of a 1,000,000-chunk flat v3
  array (1000 x 1000 chunks of 1 x 1 uint8, `bytes` codec, `/` keys), fresh
  mount, page cache dropped, vs `ls` of that directory in the store.
- `stat_chunk_1M`: `stat` of one chunk file on a fresh mount (no listing).
- `rss_10dirs_1M` / `rss_10dirs_10M`: daemon RSS after listing 10 directories
  (10M: 1000 x 10000 inner chunks of 1 x 1 in 10,000 shards of 1 x 1000).
- `s3_ls_dir_100k`: 100 x 1000 chunk objects on moto S3; first `ls` of one
  directory, counted in the server's own request log.

The stores are written once with os.write (raw chunk files and zarr.json, not
zarr's writer: a million files), cached under $ZFUSE_BENCH_BIG (default
/tmp/zfuse-bench-big), each finished by a `.done` marker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    Config,
    MiB,
    Result,
    build_once,
    drop_caches,
    median,
    mounted,
    proc_status,
    tmp_dir,
)

BIG = Path(os.environ.get("ZFUSE_BENCH_BIG", "/tmp/zfuse-bench-big"))
FLAT_GRID = (1000, 1000)
SHARDED_GRID = (1000, 10000)
SHARD = (1, 1000)
S3_GRID = (100, 1000)
LISTED = [0, 111, 222, 333, 444, 555, 666, 777, 888, 999]  # the 10 directories of the RSS figures


def _meta(grid: tuple[int, int], shard: tuple[int, int] | None = None) -> dict[str, Any]:
    codecs: list[Any] = [{"name": "bytes"}]
    chunks = [1, 1]
    if shard is not None:
        chunks = list(shard)
        codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1, 1], "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end"}}]
    return {"zarr_format": 3, "node_type": "array", "shape": list(grid), "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": codecs, "attributes": {}}


def _value(i: int, j: int, cols: int) -> int:
    return (i * cols + j) % 251 + 1


def build_flat(path: Path, grid: tuple[int, int] = FLAT_GRID) -> None:
    """c/i/j one-byte files, written row by row with os.open relative to the row's directory."""
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(_meta(grid)))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for i in range(grid[0]):
        row = path / "c" / str(i)
        row.mkdir(parents=True)
        dfd = os.open(row, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for j in range(grid[1]):
                fd = os.open(str(j), flags, 0o644, dir_fd=dfd)
                os.write(fd, bytes([_value(i, j, grid[1])]))
                os.close(fd)
        finally:
            os.close(dfd)


def build_sharded(path: Path, grid: tuple[int, int] = SHARDED_GRID, shard: tuple[int, int] = SHARD) -> None:
    """Shards of 1 x 1000 one-byte inner chunks, index (offset, length) little-endian at the end."""
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(_meta(grid, shard)))
    per = shard[1]
    index = np.empty((per, 2), dtype="<u8")
    index[:, 0] = np.arange(per)
    index[:, 1] = 1
    tail = index.tobytes()
    for i in range(grid[0]):
        row = path / "c" / str(i)
        row.mkdir(parents=True)
        for s in range(grid[1] // per):
            flat = i * grid[1] + s * per + np.arange(per)
            data = (flat % 251 + 1).astype(np.uint8).tobytes()
            (row / str(s)).write_bytes(data + tail)


def _ls(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = subprocess.run(["ls", str(path)], capture_output=True, check=True, text=True).stdout
    return time.perf_counter() - t0, len(out.split())


def _stats(mnt: Path) -> dict[str, float]:
    return json.loads((mnt / ".zfuse" / "stats").read_text())


def _delta(before: dict[str, float], after: dict[str, float], *names: str) -> dict[str, float]:
    return {n: after.get(n, 0) - before.get(n, 0) for n in names}


def bench_big(cfg: Config) -> list[Result]:
    results = []
    flat = build_once(BIG / "flat-1000x1000.zarr", build_flat, cfg, "1,000,000 one-byte chunk files")
    directory = ("c", "7")

    # first `ls` of one directory, fresh mount, caches dropped, vs the store's own `ls`
    z_t, s_t, counts = [], [], []
    for _ in range(cfg.reps):
        with mounted([flat]) as m:
            before = _stats(m.path)
            drop_caches(cfg)
            t, n = _ls(m.path.joinpath(*directory))
            z_t.append(t)
            counts.append(_delta(before, _stats(m.path), "store_list", "store_list_keys", "store_exists"))
        drop_caches(cfg)
        t, n_store = _ls(flat.joinpath(*directory))
        s_t.append(t)
    zt, st = median(z_t), median(s_t)
    results.append(Result(
        name="ls_dir_1M", what="first `ls MNT/c/7` (1000 files) of a 1,000,000-chunk flat v3 array, fresh mount",
        zfuse_s=zt, ref_s=st, ref_name="`ls` of the store's c/7", ratio=zt / st, value=zt, unit="s",
        goal="<= 3x the store's ls", met=zt <= 3 * st and n == n_store,
        extra={"zfuse_runs_s": z_t, "store_runs_s": s_t, "names": n, "daemon_counters": counts[-1]},
    ))
    cfg.log(f"  ls c/7: zfuse {zt * 1000:.1f} ms, store {st * 1000:.1f} ms ({zt / st:.2f}x), {counts[-1]}")

    # stat of one chunk on a fresh mount: one existence check, no listing
    z_t, s_t = [], []
    for _ in range(cfg.reps):
        with mounted([flat]) as m:
            before = _stats(m.path)
            drop_caches(cfg)
            t0 = time.perf_counter()
            os.stat(m.path / "c" / "999" / "999.tiff")
            z_t.append(time.perf_counter() - t0)
            counted = _delta(before, _stats(m.path), "store_list", "store_exists")
        drop_caches(cfg)
        t0 = time.perf_counter()
        os.stat(flat / "c" / "999" / "999")
        s_t.append(time.perf_counter() - t0)
    zt, st = median(z_t), median(s_t)
    results.append(Result(
        name="stat_chunk_1M", what="`stat MNT/c/999/999.tiff` on a fresh mount of the 1,000,000-chunk array",
        zfuse_s=zt, ref_s=st, ref_name="stat of the store's c/999/999", ratio=zt / st, value=zt * 1000,
        unit="ms", goal="< 10 ms, no listing", met=zt < 0.010 and counted["store_list"] == 0,
        extra={"zfuse_runs_s": z_t, "store_runs_s": s_t, "daemon_counters": counted},
    ))
    cfg.log(f"  stat: zfuse {zt * 1000:.2f} ms, store {st * 1000:.2f} ms, {counted}")

    # daemon RSS after listing 10 directories: 1M flat, 10M sharded
    sharded = build_once(BIG / "sharded-1000x10000.zarr", build_sharded, cfg, "10,000,000 inner chunks in 10,000 shards")
    for name, store, per_dir in (("1M", flat, FLAT_GRID[1]), ("10M", sharded, SHARDED_GRID[1])):
        with mounted([store]) as m:
            idle = proc_status(m.pid).get("VmRSS", 0)
            drop_caches(cfg)
            t0 = time.perf_counter()
            seen = sum(len(os.listdir(m.path / "c" / str(i))) for i in LISTED)
            t = time.perf_counter() - t0
            status = proc_status(m.pid)
            rss, hwm = status.get("VmRSS", 0), status.get("VmHWM", 0)
            counters = {k: v for k, v in _stats(m.path).items()
                        if k.startswith(("store_list", "listing", "shard_index", "store_get"))}
        results.append(Result(
            name=f"rss_10dirs_{name}", what=f"daemon RSS after `ls` of 10 directories ({per_dir} files each) "
                                            f"of a {name}-chunk array",
            zfuse_s=t, value=rss / MiB, unit="MiB", goal="< 150 MiB",
            met=rss < 150 * MiB and seen == 10 * per_dir,
            extra={"idle_rss_mib": idle / MiB, "peak_rss_mib": hwm / MiB, "listed": seen, "daemon_counters": counters},
        ))
        cfg.log(f"  rss {name}: {rss / MiB:.0f} MiB after 10 dirs (idle {idle / MiB:.0f}, peak {hwm / MiB:.0f}) "
                f"in {t:.2f}s, {counters}")

    results.append(_bench_s3(cfg))
    return results


def _bench_s3(cfg: Config) -> Result:
    import boto3

    from benchmarks.s3 import BUCKET, KEY, SECRET, _env, moto_server

    rows, cols = S3_GRID
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                              region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        prefix = "big.zarr"
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/zarr.json", Body=json.dumps(_meta(S3_GRID)).encode())
        t0 = time.perf_counter()

        def put_row(i: int) -> None:
            for j in range(cols):
                client.put_object(Bucket=BUCKET, Key=f"{prefix}/c/{i}/{j}", Body=bytes([_value(i, j, cols)]))

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put_row, range(rows)))
        cfg.log(f"  uploaded {rows * cols} objects to moto in {time.perf_counter() - t0:.0f}s")
        log_path = tmp_dir() / "moto.log"
        with mounted([f"s3://{BUCKET}/{prefix}"], "-o", f"endpoint_url={endpoint}", env=_env()) as m:
            before_log = log_path.read_text(errors="replace")
            before = _stats(m.path)
            t0 = time.perf_counter()
            names = os.listdir(m.path / "c" / "7")
            t = time.perf_counter() - t0
            counted = _delta(before, _stats(m.path), "store_list", "store_list_keys", "store_exists")
            new_log = log_path.read_text(errors="replace")[len(before_log):]
    requests = re.findall(r'"([A-Z]+) (/\S*) HTTP', re.sub(r"\x1b\[[\d;]*m", "", new_log))
    lists = [path for method, path in requests if method == "GET" and "list-type=2" in path]
    return Result(
        name="s3_ls_dir_100k", what=f"first `ls MNT/c/7` ({cols} objects) of {rows * cols} chunk objects on moto S3",
        zfuse_s=t, value=len(lists), unit="LIST requests", goal="one delimited LIST",
        met=len(lists) == 1 and "delimiter=" in lists[0] and len(names) == cols,
        extra={"server_requests": requests, "daemon_counters": counted, "names": len(names)},
    )
