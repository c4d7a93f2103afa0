"""Chunks of a remote store fetched ahead of a sequential reader, on a real S3 server
(moto): a shard's inner chunks come in few ranged requests, not one each, and a
write through the mount is never answered with bytes fetched before it. Request
counts from `.zfuse/stats` and the server's log; no timings."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import zarr

import stores
from s3server import S3Server
from test_s3 import aws_env, delta, expected_chunk, new_bucket, object_gets, s3, s3_mount, stats, upload  # noqa: F401

pytest.importorskip("s3fs")
pytestmark = pytest.mark.mount


def chunk_files_in_order(array_dir: Path, grid: tuple[int, int]) -> list[Path]:
    return [array_dir / "c" / str(i) / f"{j}.tiff" for i in range(grid[0]) for j in range(grid[1])]


def test_sequential_reader_of_a_sharded_array_fetches_shards_in_few_requests(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    # two shards of 4x4 inner chunks of 8x16: 32 chunk files
    stores.sharded(tmp_path / "s.zarr", shape=(64, 64), shards=(32, 64), chunks=(8, 16))
    arr = zarr.open_array(str(tmp_path / "s.zarr"))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "s.zarr", bucket, "s.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/s.zarr")
    files = chunk_files_in_order(m.path, (8, 4))
    before, since = stats(m.path), len(s3.requests())
    for f in files:  # as `cat` of each file in turn: open, read through, close
        coords = tuple(int(p) for p in f.relative_to(m.path / "c").with_suffix("").parts)
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(arr, coords), err_msg=str(f))
    d = delta(before, stats(m.path))
    gets = object_gets(s3, since, f"/{bucket}/s.zarr/c/")
    # each shard: its index, then its inner chunks in a few requests (one per batch of
    # the window), never one per inner chunk (34 requests)
    assert len(gets) == d.get("store_get_chunk_ranged", 0) + d.get("store_get_chunk", 0)
    assert len(gets) <= 10, gets
    assert d.get("store_get_chunk", 0) == 0  # never the whole shard object in one GET either: ranges


def test_sequential_reader_of_chunk_objects_reads_each_once(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    stores.v3(tmp_path / "a.zarr", shape=(64, 64), chunks=(8, 16))
    arr = zarr.open_array(str(tmp_path / "a.zarr"))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "a.zarr", bucket, "a.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/a.zarr")
    before = stats(m.path)
    for f in chunk_files_in_order(m.path, (8, 4)):
        coords = tuple(int(p) for p in f.relative_to(m.path / "c").with_suffix("").parts)
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(arr, coords), err_msg=str(f))
    assert delta(before, stats(m.path))["store_get_chunk"] == 32  # fetched ahead, never twice


def test_a_write_through_the_mount_is_not_answered_with_bytes_fetched_before_it(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    stores.sharded(tmp_path / "s.zarr", shape=(64, 64), shards=(32, 64), chunks=(8, 16))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "s.zarr", bucket, "s.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/s.zarr")
    tifffile.imread(m.path / "c" / "0" / "0.tiff")  # the rest of the shard is fetched ahead
    new = np.full((8, 16), 4242, dtype="uint16")
    made = tmp_path / "new.tif"
    tifffile.imwrite(made, new)
    shutil.copyfile(made, m.path / "c" / "1" / "2.tiff")
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "1" / "2.tiff"), new)
