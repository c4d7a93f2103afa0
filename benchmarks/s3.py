"""Issue 6 figure: the sharded read array on a loopback S3 server (moto), mount vs zarr-python."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zarr

from benchmarks.arrays import Spec, chunk_paths, create, read_block, read_specs
from benchmarks.common import Config, Result, image, median, mounted, read_files, timed, tmp_dir

HOST = "127.0.0.1"  # loopback only
KEY = SECRET = "test"
BUCKET = "zfuse-bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}


@contextmanager
def moto_server() -> Iterator[str]:
    """`python -m moto.server` in its own process (not sharing the benchmark's GIL)."""
    port = _free_port()
    url = f"http://{HOST}:{port}"
    log = open(tmp_dir() / "moto.log", "ab")
    env = {k: v for k, v in os.environ.items() if k != "AWS_PROFILE"}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**env, **_env()})
    log.close()
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited ({proc.returncode})")
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server not up after 60 s") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


def storage_options(endpoint: str) -> dict[str, Any]:
    return {"key": KEY, "secret": SECRET,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def bench_s3(cfg: Config) -> list[Result]:
    import boto3

    spec: Spec = next(s for s in read_specs(cfg) if s.shards)
    coords = spec.coords()
    url = f"s3://{BUCKET}/{spec.name}.zarr"
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        so = storage_options(endpoint)
        store = zarr.storage.FsspecStore.from_url(url, storage_options=so, read_only=False)
        t_up, _ = timed(lambda: create(store, spec).__setitem__(Ellipsis, image(spec.shape, 0)))
        cfg.log(f"  uploaded {spec.name} through zarr FsspecStore in {t_up:.1f}s")
        z_t, r_t = [], []
        nbytes = ref_nbytes = 0
        for _ in range(cfg.reps):
            with mounted([url], "-o", f"endpoint_url={endpoint}", env=_env()) as m:
                paths = chunk_paths(m.path, coords)
                t, nbytes = timed(lambda paths=paths: read_files(paths))
                z_t.append(t)
                stats = (m.path / ".zfuse" / "stats").read_text()
            arr = zarr.open_array(url, mode="r", storage_options=so)
            t, ref_nbytes = timed(lambda arr=arr: sum(read_block(arr, spec, i, j).nbytes for i, j in coords))
            r_t.append(t)
    zt, rt = median(z_t), median(r_t)
    cfg.log(f"  s3: zfuse {zt:.3f}s zarr {rt:.3f}s")
    import json

    counters = {k: v for k, v in json.loads(stats).items() if k.startswith("store_")}
    return [Result(
        name=f"s3_{spec.name}",
        what=f"read of {len(coords)} inner-chunk files of {spec.name} (shards {spec.shards}) "
             f"from moto S3 on loopback",
        zfuse_s=zt, ref_s=rt, ref_name="zarr-python in-process, same S3 store", nbytes=nbytes,
        ref_nbytes=ref_nbytes, ratio=rt / zt, goal=">= 0.8x", met=rt / zt >= 0.8,
        extra={"zfuse_runs_s": z_t, "zarr_runs_s": r_t, "daemon_store_counters": str(counters)},
    )]
