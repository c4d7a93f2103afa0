"""Issue 30 item 3 figure: a remount with `-o cache=DIR` against a fresh cold mount,
a warm re-read and the remount's listings, on moto S3 on loopback (no added latency;
benchmarks/s3_remote.py adds it). Request counts come from `.zfuse/stats`.

    .venv/bin/python -m benchmarks.remote_cache [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import boto3
import zarr

from benchmarks.arrays import Spec, chunk_paths, create
from benchmarks.common import image, mounted, read_files, timed
from benchmarks.s3 import BUCKET, KEY, SECRET, _env, moto_server, storage_options

SPECS = [Spec("zstd4096", (4096, 4096), (512, 512)), Spec("sharded4096", (4096, 4096), (512, 512), shards=(2048, 2048))]
REQUESTS = ("store_get_chunk", "store_get_chunk_ranged", "store_get_revalidate", "store_exists", "store_head",
            "store_list")


def stats(root: Path) -> dict:
    fd = os.open(root / ".zfuse" / "stats", os.O_RDONLY | os.O_DIRECT)
    try:
        return json.loads(os.read(fd, 1 << 20))
    finally:
        os.close(fd)


def requests(s: dict) -> str:
    return " ".join(f"{k.removeprefix('store_')}={int(s.get(k, 0))}" for k in REQUESTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        for spec in SPECS:
            url = f"s3://{BUCKET}/{spec.name}.zarr"
            store = zarr.storage.FsspecStore.from_url(url, storage_options=storage_options(endpoint), read_only=False)
            create(store, spec)[...] = image(spec.shape, 0)
            coords = spec.coords()
            times: dict[str, list[float]] = {}
            counts: dict[str, str] = {}
            for _ in range(args.reps):  # interleaved: cold, warm, listings only, remounts from the cache
                cache = Path(tempfile.mkdtemp(prefix="zfuse-cache-"))
                opts = ("-o", f"endpoint_url={endpoint},ro,cache={cache}")
                with mounted([url], *opts, env=_env()) as m:
                    paths = chunk_paths(m.path, coords)
                    t, _ = timed(lambda paths=paths: read_files(paths))
                    times.setdefault("cold (empty cache)", []).append(t)
                    counts["cold (empty cache)"] = requests(stats(m.path))
                    before = stats(m.path)
                    t, _ = timed(lambda paths=paths: read_files(paths))
                    times.setdefault("warm re-read, same mount", []).append(t)
                    after = stats(m.path)
                    counts["warm re-read, same mount"] = requests({k: after.get(k, 0) - before.get(k, 0) for k in REQUESTS})
                with mounted([url], *opts, env=_env()) as m:
                    dirs = sorted({os.path.dirname(p) for p in chunk_paths(m.path, coords)})
                    t, _ = timed(lambda dirs=dirs: [os.listdir(d) for d in dirs])
                    times.setdefault("listings of a fresh mount", []).append(t)
                    counts["listings of a fresh mount"] = requests(stats(m.path))
                for label, list_first in (("remount, ls + read (cache)", True), ("remount, read (cache)", False)):
                    with mounted([url], *opts, env=_env()) as m:
                        paths = chunk_paths(m.path, coords)
                        dirs = sorted({os.path.dirname(p) for p in paths})

                        def ls_and_read(paths: list[str] = paths, dirs: list[str] = dirs, ls: bool = list_first) -> None:
                            if ls:
                                for d in dirs:
                                    os.listdir(d)
                            read_files(paths)

                        t, _ = timed(ls_and_read)
                        times.setdefault(label, []).append(t)
                        s = stats(m.path)
                        counts[label] = requests(s) + f" disk_cache_hits={s.get('disk_cache_hits', 0)}"
                shutil.rmtree(cache)
            print(f"\n{spec.name}: {len(coords)} chunk files, {args.reps} interleaved runs")
            for name, runs in times.items():
                print(f"  {name:32s} median {statistics.median(runs):.3f} s  runs "
                      f"{' / '.join(f'{r:.3f}' for r in runs)}  requests: {counts[name]}")


if __name__ == "__main__":
    main()
