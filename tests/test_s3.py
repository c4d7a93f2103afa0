"""End to end against a real S3 server (moto's server mode, a child process on loopback).

The mounts get credentials from the environment and the endpoint from
`-o endpoint_url=...`, as a user would. Request counts are checked twice: by
zfuse's own `.zfuse/stats` and by the server's request log.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
import zarr
from zarr.storage import FsspecStore

from zfuse.testing import wait_until

import stores
from s3server import KEY, SECRET, S3Server, make_bucket

pytest.importorskip("s3fs")
pytestmark = pytest.mark.mount


# -- helpers -----------------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials the usual way (environment) for the zfuse processes the test starts."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # never read a developer's real AWS config, never probe instance metadata
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


_bucket_counter = iter(range(10**6))


def new_bucket(server: S3Server) -> str:
    name = f"b{os.getpid()}-{next(_bucket_counter)}"
    make_bucket(server, name)
    return name


def upload(server: S3Server, local: Path, bucket: str, prefix: str, acl: str | None = None) -> int:
    """Copy a local store into s3://bucket/prefix/ object by object; returns the object count."""
    client = make_bucket(server, bucket)
    n = 0
    for f in sorted(local.rglob("*")):
        if f.is_file():
            extra = {"ACL": acl} if acl else {}
            client.put_object(Bucket=bucket, Key=f"{prefix}/{f.relative_to(local)}", Body=f.read_bytes(), **extra)
            n += 1
    return n


def s3_store(server: S3Server, url: str, read_only: bool = True) -> FsspecStore:
    return FsspecStore.from_url(url, storage_options={**server.storage_options, "skip_instance_cache": True,
                                                     "use_listings_cache": False}, read_only=read_only)


def read_direct(path: Path) -> bytes:
    """Read through the daemon, bypassing the kernel page cache (FUSE allows unaligned O_DIRECT)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        out = []
        while chunk := os.read(fd, 1 << 20):
            out.append(chunk)
        return b"".join(out)
    finally:
        os.close(fd)


def stats(mnt: Path) -> dict[str, Any]:
    # O_DIRECT: the stats file is opened keep_cache with a 5 s attribute timeout, so a
    # plain read within 5 s of the last one can return the kernel's cached old counters.
    return json.loads(read_direct(mnt / ".zfuse" / "stats"))


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0) for k in after
            if k.startswith("store_") and after[k] != before.get(k, 0)}


def expected_chunk(arr: zarr.Array, coords: tuple[int, ...]) -> np.ndarray:
    region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, arr.chunks, arr.shape, strict=True))
    out = np.full(arr.chunks, arr.fill_value, dtype=arr.dtype)
    out[tuple(slice(0, r.stop - r.start) for r in region)] = arr[region]
    return out


def assert_every_chunk_equal(array_dir: Path, arr: zarr.Array) -> int:
    files = sorted(array_dir.rglob("*.tiff"))
    assert files, f"no chunk files under {array_dir}"
    for f in files:
        coords = tuple(int(p) for p in str(f.relative_to(array_dir / "c"))[: -len(".tiff")].split("/"))
        expect = expected_chunk(arr, coords)
        np.testing.assert_array_equal(tifffile.imread(f).reshape(expect.shape), expect, err_msg=str(f))
    return len(files)


def s3_mount(mount: Any, server: S3Server, url: str, *args: str, options: str = "", name: str = "mnt") -> Any:
    opts = f"endpoint_url={server.endpoint_url},timeout=5" + (f",{options}" if options else "")
    return mount(url, "-o", opts, *args, name=name)


def object_gets(server: S3Server, since: int, path_prefix: str) -> list[tuple[str, int]]:
    """(path, status) of the server's object GETs under path_prefix after request #since."""
    return [(r.path, r.status) for r in server.requests()[since:]
            if r.method == "GET" and r.path.startswith(path_prefix) and not r.query]


# -- tests -------------------------------------------------------------------


def test_every_chunk_reads_equal_from_s3(s3: S3Server, aws_env: None, mount: Any, tmp_path: Path) -> None:
    local = tmp_path / "g.zarr"
    root = zarr.open_group(str(local), mode="w")
    stores.v3(local / "zstd", codecs="crc32c")
    stores.v3(local / "blosc3d", shape=(5, 20, 30), chunks=(2, 8, 16), codecs="blosc")
    root.attrs["note"] = "on s3"
    stores.v2(tmp_path / "v2.zarr", separator="/")
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "g.zarr")
    upload(s3, tmp_path / "v2.zarr", bucket, "v2.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/g.zarr")
    assert sorted(os.listdir(m.path)) == ["blosc3d", "zarr.json", "zstd"]
    assert json.loads((m.path / "zarr.json").read_text())["attributes"]["note"] == "on s3"
    assert assert_every_chunk_equal(m.path / "zstd", zarr.open_array(str(local / "zstd"))) == 3 * 2
    assert assert_every_chunk_equal(m.path / "blosc3d", zarr.open_array(str(local / "blosc3d"))) == 3 * 3 * 2
    s = stats(m.path)
    assert s["store_get_chunk"] == 6 + 18 and s.get("store_timeouts", 0) == 0
    # zarr-python reading the mount sees the S3 array
    np.testing.assert_array_equal(zarr.open_array(str(m.path / "zstd"))[...],
                                  zarr.open_array(str(local / "zstd"))[...])

    m2 = s3_mount(mount, s3, f"s3://{bucket}/v2.zarr")
    v2 = zarr.open_array(str(tmp_path / "v2.zarr"))
    files = sorted(m2.path.rglob("*.tiff"))
    assert len(files) == 6
    for f in files:
        coords = tuple(int(p) for p in str(f.relative_to(m2.path))[: -len(".tiff")].split("/"))
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(v2, coords))


def test_whole_chunk_read_is_one_get(s3: S3Server, aws_env: None, mount: Any, tmp_path: Path) -> None:
    """Unsharded: one GET per chunk file, no HEAD first (s3fs max_concurrency=1)."""
    stores.v3(tmp_path / "a.zarr")
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "a.zarr", bucket, "a.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/a.zarr", "--cache-size", "0")
    os.listdir(m.path / "c" / "1")  # the chunk's directory is listed: its lookup costs nothing more
    before, since = stats(m.path), len(s3.requests())
    tifffile.imread(m.path / "c" / "1" / "1.tiff")
    assert delta(before, stats(m.path)) == {"store_get_chunk": 1, "store_bytes_chunk": pytest.approx(
        (tmp_path / "a.zarr" / "c" / "1" / "1").stat().st_size)}
    reqs = [(r.method, r.path) for r in s3.requests()[since:] if r.path.startswith(f"/{bucket}/")]
    assert reqs == [("GET", f"/{bucket}/a.zarr/c/1/1")]


def test_write_through_mount_lands_on_s3(s3: S3Server, aws_env: None, mount: Any, tmp_path: Path) -> None:
    stores.v3(tmp_path / "a.zarr", codecs="crc32c")
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "a.zarr", bucket, "a.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/a.zarr")
    new = (np.arange(8 * 16, dtype="uint16").reshape(8, 16) * 7 + 3).astype("uint16")
    made = tmp_path / "new.tif"
    tifffile.imwrite(made, new, compression="zlib")
    target = m.path / "c" / "1" / "0.tiff"
    shutil.copyfile(made, target)  # what `cp` does: open(O_TRUNC), write, close
    np.testing.assert_array_equal(tifffile.imread(target), new)
    assert stats(m.path)["store_set"] >= 1
    on_s3 = zarr.open_array(s3_store(s3, f"s3://{bucket}/a.zarr"), mode="r")
    np.testing.assert_array_equal(on_s3[8:16, 0:16], new)
    # the neighbours are untouched
    np.testing.assert_array_equal(on_s3[0:8, :], zarr.open_array(str(tmp_path / "a.zarr"))[0:8, :])


def test_shard_sub_chunk_is_two_ranged_gets_cold_one_warm(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    # shards of 2x2 inner chunks of 8x16: four shards, 12 inner chunks in the grid
    stores.sharded(tmp_path / "s.zarr", shape=(20, 30), shards=(16, 32), chunks=(8, 16))
    arr = zarr.open_array(str(tmp_path / "s.zarr"))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "s.zarr", bucket, "s.zarr")
    shard_prefix = f"/{bucket}/s.zarr/c/"
    # --all-chunks lists the grid without reading shard indexes, so the first read is cold;
    # --cache-size 0 makes every read reach the store.
    m = s3_mount(mount, s3, f"s3://{bucket}/s.zarr", "--all-chunks", "--cache-size", "0")
    os.listdir(m.path / "c" / "0")
    counts = {}
    reads = (("cold", (0, 0)), ("warm", (0, 1)), ("warm", (1, 1)), ("again", (0, 0)))
    for i, (label, coords) in enumerate(reads):
        before, since = stats(m.path), len(s3.requests())
        # O_DIRECT: a re-read must reach the daemon, not the kernel's page cache
        got = tifffile.imread(io.BytesIO(read_direct(m.path / "c" / f"{coords[0]}" / f"{coords[1]}.tiff")))
        np.testing.assert_array_equal(got, expected_chunk(arr, coords))
        d, gets = delta(before, stats(m.path)), object_gets(s3, since, shard_prefix)
        counts[i, label] = (d.get("store_get_chunk_ranged", 0), len(gets))
        assert d.get("store_get_chunk", 0) == 0, (label, d)  # never a whole-shard GET
        assert all(status == 206 for _, status in gets), (label, gets)  # the server sent ranges
        assert {p for p, _ in gets} == {f"{shard_prefix}0/0"}, (label, gets)
        # bytes fetched: an inner chunk (plus the index when cold), never the whole shard
        shard_size = (tmp_path / "s.zarr" / "c" / "0" / "0").stat().st_size
        assert d["store_bytes_chunk"] < shard_size / 2 + 16 * 4 + 4, (label, d)
    # (zfuse's count, the server's count): index + inner chunk cold, the inner chunk alone warm
    assert counts == {(0, "cold"): (2, 2), (1, "warm"): (1, 1), (2, "warm"): (1, 1), (3, "again"): (1, 1)}


def test_shard_listing_reads_each_index_once(s3: S3Server, aws_env: None, mount: Any, tmp_path: Path) -> None:
    stores.sharded(tmp_path / "s.zarr", shape=(20, 30), shards=(16, 32), chunks=(8, 16))
    arr = zarr.open_array(str(tmp_path / "s.zarr"))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "s.zarr", bucket, "s.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/s.zarr", "--cache-size", "0")
    before, since = stats(m.path), len(s3.requests())
    files = sorted(m.path.rglob("*.tiff"))
    assert len(files) == 6  # 3x2 inner chunks hold data
    listing = delta(before, stats(m.path))
    assert listing.get("store_get_chunk_ranged") == 2  # two shards exist: one index GET each
    before, since = stats(m.path), len(s3.requests())
    for f in files:
        coords = tuple(int(p) for p in str(f.relative_to(m.path / "c"))[: -len(".tiff")].split("/"))
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(arr, coords))
    d = delta(before, stats(m.path))
    assert d.get("store_get_chunk_ranged") == 6 and d.get("store_get_chunk", 0) == 0
    # metadata was listed once, at mount: reading chunks lists nothing and reads no metadata again
    assert set(d) == {"store_get_chunk_ranged", "store_bytes_chunk"}, d
    gets = object_gets(s3, since, f"/{bucket}/s.zarr/c/")
    assert len(gets) == 6 and all(status == 206 for _, status in gets)


def test_ls_of_one_directory_is_one_delimited_list_and_stat_lists_nothing(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    stores.raw_chunks(tmp_path / "r.zarr", (12, 50))  # 12 directories of 50 one-byte objects
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "r.zarr", bucket, "r.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/r.zarr")
    since = len(s3.requests())
    assert sorted(os.listdir(m.path / "c" / "7")) == sorted(f"{j}.tiff" for j in range(50))
    reqs = [r for r in s3.requests()[since:] if r.path.startswith(f"/{bucket}")]
    assert [(r.method, r.path) for r in reqs] == [("GET", f"/{bucket}")], reqs
    assert "list-type=2" in reqs[0].query and "prefix=r.zarr/c/7/" in reqs[0].query
    assert "delimiter=" in reqs[0].query
    # a chunk of another directory: one HEAD of its object, no listing
    since = len(s3.requests())
    os.stat(m.path / "c" / "3" / "4.tiff")
    reqs = [(r.method, r.path) for r in s3.requests()[since:] if r.path.startswith(f"/{bucket}")]
    assert reqs == [("HEAD", f"/{bucket}/r.zarr/c/3/4")], reqs


def test_a_sequential_reader_of_many_chunks_has_them_all_fetched_ahead(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """[remote-7] a reader going through 160 chunk files in order (more than the 64 chunks
    fetched ahead at once) finds nearly every chunk fetched ahead, each fetched once
    (before: past the 64th, every chunk waited for a request of its own)."""
    data = stores.v3(tmp_path / "a.zarr", shape=(160 * 4, 4), chunks=(4, 4), codecs="zstd")
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "a.zarr", bucket, "a.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/a.zarr", options="ro")
    since = len(s3.requests())
    for y in range(160):
        np.testing.assert_array_equal(tifffile.imread(m.path / "c" / str(y) / "0.tiff"), data[4 * y:4 * y + 4])
    stats = json.loads((m.path / ".zfuse" / "stats").read_bytes())
    gets = object_gets(s3, since, f"/{bucket}/a.zarr/c/")
    assert sorted(path for path, _ in gets) == sorted(f"/{bucket}/a.zarr/c/{y}/0" for y in range(160))
    assert stats.get("chunks_fetched_on_read", 0) <= 8 and stats["chunks_fetched_ahead"] >= 152, stats


def test_a_walk_of_a_small_array_is_one_list_of_its_prefix(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """`ls` of a remote array's own directory makes no request; `find` (or `ls -R`, a glob)
    of a remote array of at most FLAT_LISTING_OBJECTS objects: one LIST of the whole
    array, not one per directory (SEMANTICS [remote-5])."""
    stores.raw_chunks(tmp_path / "r.zarr", (12, 50))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "r.zarr", bucket, "r.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/r.zarr")
    since = len(s3.requests())
    assert "c" in os.listdir(m.path)  # the array's own directory: no request
    assert [r for r in s3.requests()[since:] if r.path.startswith(f"/{bucket}")] == []
    found = subprocess.run(["find", str(m.path / "c"), "-name", "*.tiff"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(found) == 12 * 50
    reqs = [r for r in s3.requests()[since:] if r.path.startswith(f"/{bucket}")]
    assert [(r.method, r.path) for r in reqs] == [("GET", f"/{bucket}")], reqs
    query = urllib.parse.parse_qs(reqs[0].query, keep_blank_values=True)
    assert query["prefix"] == ["r.zarr/"] and query.get("delimiter", [""]) == [""], query  # flat


def test_a_region_of_the_whole_image_fetches_only_the_chunks_it_covers(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """A 1024 x 1024 region of image.ome.tif read with tifffile (row by row of tiles):
    exactly the 3 x 3 chunks it covers are fetched, each once; the kernel's read-ahead
    past each row's last tile reads zeros, not the next tiles (SEMANTICS [image-3])."""
    local = tmp_path / "w.zarr"
    arr = zarr.create_array(str(local), shape=(2048, 2560), chunks=(512, 512), dtype="uint16", fill_value=0)
    arr[...] = data = stores.values(arr.shape, "uint16")  # 4 x 5 chunks of 512 KiB
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "w.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/w.zarr")
    since = len(s3.requests())
    store = tifffile.imread(m.path / "image.ome.tif", aszarr=True)
    try:
        region = zarr.open_array(store, mode="r")[256:1280, 256:1280]
    finally:
        store.close()
    np.testing.assert_array_equal(region, data[256:1280, 256:1280])
    gets = sorted(path for path, _ in object_gets(s3, since, f"/{bucket}/w.zarr/c/"))
    covered = [f"/{bucket}/w.zarr/c/{y}/{x}" for y in range(3) for x in range(3)]
    assert gets == covered, gets
    if shutil.which("gdal_translate") is None:
        return
    # GDAL reads the same region in its own pattern (a few KiB past each tile, which sets
    # off the kernel's asynchronous read-ahead): on a fresh mount, the same 9 chunks
    m.unmount()
    m = s3_mount(mount, s3, f"s3://{bucket}/w.zarr", name="gdal")
    since = len(s3.requests())
    subprocess.run(["gdal_translate", "-q", "-srcwin", "256", "256", "1024", "1024",
                    str(m.path / "image.ome.tif"), str(tmp_path / "region.tif")], check=True, capture_output=True)
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "region.tif"), data[256:1280, 256:1280])
    gets = sorted(path for path, _ in object_gets(s3, since, f"/{bucket}/w.zarr/c/"))
    assert gets == covered, gets


def test_a_member_not_shown_is_journaled_when_its_group_is_opened(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """A remote group opens its members when first listed: a member zfuse cannot show is
    then in `.zfuse/errors` with its reason, as a local one is at mount (SEMANTICS [remote-6])."""
    local = tmp_path / "g.zarr"
    root = zarr.open_group(str(local), mode="w")
    root.create_array("good", shape=(4,), chunks=(2,), dtype="u1")[...] = 5
    root.create_array("codec", shape=(4,), chunks=(2,), dtype="u1")
    doc = json.loads((local / "codec" / "zarr.json").read_text())
    doc["codecs"] = [{"name": "bytes"}, {"name": "no-such-codec"}]
    (local / "codec" / "zarr.json").write_text(json.dumps(doc))
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "g.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/g.zarr", options="ro")
    assert b"codec" not in (m.path / ".zfuse" / "errors").read_bytes()  # not opened yet
    assert sorted(os.listdir(m.path)) == ["codec", "good", "zarr.json"]
    errors = (m.path / ".zfuse" / "errors").read_text()
    assert "not shown: array 'codec': codec 'no-such-codec' is not known" in errors, errors
    assert sorted(os.listdir(m.path / "codec")) == ["README", "zarr.json"]


def test_a_reload_rebinds_open_files_in_a_group_not_opened_again_yet(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """SIGHUP builds a new view whose groups are not opened yet: the groups that open
    files and pending writes lie in are opened in a worker thread, so a write begun
    before the reload commits after it and a reader goes on reading (SEMANTICS [remote-6])."""
    import signal

    local = tmp_path / "g.zarr"
    zarr.open_group(str(local), mode="w")
    data = stores.v3(local / "a", shape=(16, 32), chunks=(8, 16), codecs="zstd")
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "g.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/g.zarr")
    c = m.path / "a" / "c"
    reader = open(c / "1" / "1.tiff", "rb")
    new = stores.values((8, 16), "uint16", 7)
    tifffile.imwrite(tmp_path / "n.tif", new)
    blob = (tmp_path / "n.tif").read_bytes()
    fd = os.open(c / "0" / "0.tiff", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, blob[:100])
    reloads = lambda: json.loads((m.path / ".zfuse" / "mount").read_bytes())["reloads"]  # noqa: E731
    before = reloads()
    os.kill(m.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while reloads() == before:  # the reload done, open files rebound
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.01)
    os.write(fd, blob[100:])
    os.close(fd)
    np.testing.assert_array_equal(tifffile.imread(reader), data[8:16, 16:32])
    reader.close()
    on_s3 = zarr.open_array(s3_store(s3, f"s3://{bucket}/g.zarr/a"), mode="r")
    np.testing.assert_array_equal(on_s3[0:8, 0:16], new)
    np.testing.assert_array_equal(tifffile.imread(c / "0" / "0.tiff"), new)
    assert "Traceback" not in m.log() and "reload failed" not in m.log()


def test_concat_parts_array_reads_from_s3(s3: S3Server, aws_env: None, mount: Any, tmp_path: Path) -> None:
    stores.concat_parts(tmp_path / "cp.zarr")
    local = stores.open_any(tmp_path / "cp.zarr")
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "cp.zarr", bucket, "cp.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/cp.zarr")
    names = sorted(str(f.relative_to(m.path)) for f in m.path.rglob("*.tiff"))
    assert names == [f"c/{i}/{j}.tiff" for i in range(3) for j in range(2)]  # no .crc32c parts shown
    assert assert_every_chunk_equal(m.path, local) == 6


def test_anonymous_access_to_a_public_bucket(
    s3: S3Server, mount: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores.v3(tmp_path / "a.zarr")
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "a.zarr", bucket, "pub.zarr", acl="public-read")
    upload(s3, tmp_path / "a.zarr", bucket, "private.zarr")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    m = s3_mount(mount, s3, f"s3://{bucket}/pub.zarr", options="anon,ro")
    assert assert_every_chunk_equal(m.path, zarr.open_array(str(tmp_path / "a.zarr"))) == 6
    # unsigned requests really are anonymous: the private copy is refused (403)
    import subprocess
    import sys

    mnt = tmp_path / "private-mnt"
    mnt.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "zfuse.cli", "mount", f"s3://{bucket}/private.zarr", str(mnt),
         "-o", f"anon,ro,endpoint_url={s3.endpoint_url},timeout=5"],
        capture_output=True, text=True, timeout=60,
    )
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", str(mnt)])
    assert result.returncode != 0 and "Forbidden" in result.stderr, result.stderr


def test_metadata_ttl_shows_new_chunks(s3: S3Server, aws_env: None, mount: Any, tmp_path: Path) -> None:
    local = tmp_path / "a.zarr"
    arr = zarr.create_array(str(local), shape=(16, 32), chunks=(8, 16), dtype="uint16", fill_value=0)
    arr[0:8, 0:16] = 5  # one chunk of four
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "a.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/a.zarr", options="metadata_ttl=1")
    assert sorted(str(f.relative_to(m.path)) for f in m.path.rglob("*.tiff")) == ["c/0/0.tiff"]
    on_s3 = zarr.open_array(s3_store(s3, f"s3://{bucket}/a.zarr", read_only=False), mode="r+")
    on_s3[8:16, 16:32] = 9  # another writer adds chunk (1, 1) on S3 directly
    deadline = time.monotonic() + 10
    while not (m.path / "c" / "1" / "1.tiff").exists():
        assert time.monotonic() < deadline, "new chunk not listed 10 s after a 1 s metadata_ttl"
        time.sleep(0.2)
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "1" / "1.tiff"), np.full((8, 16), 9, "uint16"))


def test_hung_or_stopped_server_gives_eio_then_recovers(aws_env: None, mount: Any, tmp_path: Path) -> None:
    # 512 KiB raw chunks: a chunk file is read in several requests, so the server can hang mid-file
    stores.v3(tmp_path / "a.zarr", shape=(1024, 1024), chunks=(512, 512), codecs="raw")
    arr = zarr.open_array(str(tmp_path / "a.zarr"))
    with S3Server(tmp_path / "own-server.log") as server:  # own server: this test kills it
        make_bucket(server, "data")
        upload(server, tmp_path / "a.zarr", "data", "a.zarr")
        # --cache-size 0: every read of pixel data goes to the store
        m = s3_mount(mount, server, "s3://data/a.zarr", "--cache-size", "0")
        chunk = m.path / "c" / "0" / "1.tiff"
        size = chunk.stat().st_size
        assert size > 512 * 512 * 2

        # a hung server (accepts, never answers) in the middle of reading a file: EIO within the timeout
        fd = os.open(chunk, os.O_RDONLY | os.O_DIRECT)  # no readahead: each pread is one FUSE read
        try:
            assert len(os.pread(fd, 64 * 1024, size // 4)) == 64 * 1024
            server.pause()
            try:
                t0 = time.monotonic()
                with pytest.raises(OSError) as e:
                    os.pread(fd, 64 * 1024, size // 2)
                hung_s = time.monotonic() - t0
            finally:
                server.resume()
        finally:
            os.close(fd)
        assert e.value.errno == errno.EIO
        assert 4 <= hung_s < 15, hung_s  # bounded by timeout=5, not by botocore's 60 s

        # a server that is gone (connection refused): EIO too, also bounded
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            read_direct(m.path / "c" / "1" / "1.tiff")
        gone_s = time.monotonic() - t0
        # (EREMOTEIO once the client's tries all failed to connect, [read-12]; EIO if the
        # timeout ended them first)
        assert e.value.errno in (errno.EIO, errno.EREMOTEIO) and gone_s < 15
        assert stats(m.path).get("store_timeouts", 0) >= 1
        assert os.path.ismount(m.path)

        # back on the same port (moto starts empty: put the data back): reads work again
        # (a file opened anew asks a store found unreachable again once a second, [read-12])
        server.start()
        upload(server, tmp_path / "a.zarr", "data", "a.zarr")

        def reads_again() -> bool:
            try:
                read_direct(m.path / "c" / "0" / "0.tiff")
                return True
            except OSError:
                return False

        wait_until(reads_again, timeout=10)
        for coords in ((0, 1), (1, 1), (1, 0)):
            got = tifffile.imread(io.BytesIO(read_direct(m.path / "c" / f"{coords[0]}" / f"{coords[1]}.tiff")))
            np.testing.assert_array_equal(got, expected_chunk(arr, coords))
    assert "store request timed out" in m.log() or "timed out" in m.log(), m.log()[-2000:]


def test_mount_options_reach_s3fs_in_its_spelling() -> None:
    """-o endpoint_url/region/profile/anon as `zfuse mount` parses them, as s3fs/gcsfs/http take them."""
    from zfuse.cli import apply_mount_options
    from zfuse.daemon import MountConfig
    from zfuse.store import fsspec_options, open_store

    config = MountConfig(sources=["s3://b/a.zarr"], mountpoint="/m")
    apply_mount_options(config, ["endpoint_url=http://127.0.0.1:9,region=eu-west-3,profile=p,anon"])
    s3 = fsspec_options("s3", config.storage_options)
    assert s3["client_kwargs"] == {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-3"}
    assert s3["profile"] == "p" and s3["anon"] is True and "endpoint_url" not in s3 and "region" not in s3
    fs = open_store("s3://b/a.zarr", read_only=True, storage_options=config.storage_options).fs
    assert fs.client_kwargs["endpoint_url"] == "http://127.0.0.1:9" and fs.anon is True
    gs = fsspec_options("gs", config.storage_options)
    assert gs["endpoint_url"] == "http://127.0.0.1:9" and gs["token"] == "anon" and "client_kwargs" not in gs
    # a store dropping connections silently is found unreachable: 3 tries of 4 s connects
    assert s3["config_kwargs"]["connect_timeout"] == 4.0
    assert s3["config_kwargs"]["retries"] == {"total_max_attempts": 3, "mode": "standard"}
    # (bodies as stored: a server's gzip is never decompressed on the way)
    https = fsspec_options("https", config.storage_options)
    assert https["client_kwargs"].pop("timeout").sock_connect == 4.0
    assert https == {"headers": {"Accept-Encoding": "identity"}, "client_kwargs": {"auto_decompress": False},
                     "allow_redirects": False}  # (zfuse's reads follow redirects within the server only)
    assert open_store("https://example.invalid/a.zarr", read_only=False, storage_options={}).read_only


# -- what a remote store is asked: the root metadata once, chunks fetched ahead ---


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


def read_chunk_objects_by_name(s3: S3Server, mount: Any, tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """A mount of a 64 x 64 array of 8 x 4 chunk objects on S3, each chunk file opened by
    name in order (no listing) and checked: the mount, and its stats before the reads."""
    stores.v3(tmp_path / "a.zarr", shape=(64, 64), chunks=(8, 16))
    arr = zarr.open_array(str(tmp_path / "a.zarr"))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "a.zarr", bucket, "a.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/a.zarr")
    before = stats(m.path)
    for f in chunk_files_in_order(m.path, (8, 4)):
        coords = tuple(int(p) for p in f.relative_to(m.path / "c").with_suffix("").parts)
        np.testing.assert_array_equal(tifffile.imread(f), expected_chunk(arr, coords), err_msg=str(f))
    return m, before


def test_sequential_reader_of_chunk_objects_reads_each_once(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    m, before = read_chunk_objects_by_name(s3, mount, tmp_path)
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


@pytest.mark.parametrize("kind", ["array", "group", "v2 group"])
def test_mount_reads_the_root_metadata_once_and_probes_no_other_format(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path, kind: str
) -> None:
    local = tmp_path / "r.zarr"
    if kind == "array":
        stores.sharded(local)
    elif kind == "group":
        zarr.open_group(str(local), mode="w")
        stores.v3(local / "a")
    else:
        stores.v2(local / "a")
        zarr.open_group(str(local), mode="a", zarr_format=2)
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "r.zarr")
    since = len(s3.requests())
    m = s3_mount(mount, s3, f"s3://{bucket}/r.zarr", options="ro")
    reads = [r.path.removeprefix(f"/{bucket}/r.zarr/") for r in s3.requests()[since:]
             if r.method in ("GET", "HEAD") and not r.query]
    at_root = [r for r in reads if "/" not in r]
    if kind == "v2 group":  # zarr.json first (not there), then v2's documents at once
        assert at_root[0] == "zarr.json" and {".zarray", ".zgroup", ".zattrs"} <= set(at_root), reads
        assert at_root.count(".zgroup") == at_root.count(".zattrs") == 1, reads
    else:  # the root's zarr.json, once; no v2 probe
        assert at_root == ["zarr.json"], reads
    if kind != "array":  # a group's members are opened when first looked at: no LIST, no member read
        listings = [r for r in s3.requests()[since:] if "list-type=2" in r.query]
        assert [r for r in reads if r.startswith("a/")] == [] and listings == [], (reads, listings)
        since = len(s3.requests())
    assert "a" in os.listdir(m.path) or kind == "array"
    if kind != "array":
        reads = [r.path.removeprefix(f"/{bucket}/r.zarr/") for r in s3.requests()[since:] if r.method == "GET"]
        assert any(r.startswith("a/") for r in reads), reads  # opened now
        assert sorted(os.listdir(m.path / "a")) and (m.path / "a" / "image.ome.tif").stat().st_size


def test_ls_lr_of_a_sharded_array_lists_each_store_directory_once(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    # shards of 4x2 inner chunks: the view directories c/0..c/3 all lie in store directory c/0/
    local = tmp_path / "s.zarr"
    zarr.create_array(str(local), shape=(64, 64), shards=(32, 32), chunks=(8, 16), dtype="uint16",
                      fill_value=0)[:32, :] = 7  # the second shard row stays unwritten
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "s.zarr")
    m = s3_mount(mount, s3, f"s3://{bucket}/s.zarr")
    since = len(s3.requests())
    listed = {d: sorted(os.listdir(m.path / "c" / d)) for d in sorted(os.listdir(m.path / "c"), key=int)}
    assert listed == {str(i): ["0.tiff", "1.tiff", "2.tiff", "3.tiff"] for i in range(4)}
    lists = [r.query for r in s3.requests()[since:] if r.method == "GET" and "list-type=2" in r.query]
    shard_dirs = [q for q in lists if "prefix=s.zarr/c/" in q and "prefix=s.zarr/c/&" not in q]
    assert sorted(shard_dirs) == sorted(set(shard_dirs)) and len(shard_dirs) <= 2, lists
    # a write into the unwritten shard row makes a new shard object: listed from then on
    new = np.full((8, 16), 9, dtype="uint16")
    tifffile.imwrite(tmp_path / "n.tif", new)
    os.makedirs(m.path / "c" / "5", exist_ok=True)
    shutil.copyfile(tmp_path / "n.tif", m.path / "c" / "5" / "1.tiff")
    assert os.listdir(m.path / "c" / "5") == ["1.tiff"]
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "5" / "1.tiff"), new)
    assert sorted(os.listdir(m.path / "c" / "4")) == []  # the new shard holds no other inner chunk


def test_chunk_files_opened_by_name_ask_no_existence_check_of_chunks_fetched_ahead(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """A reader opening chunk files by name, with no listing first: each chunk is one GET;
    the lookups of the chunks fetched ahead ask no HEAD of their own."""
    m, before = read_chunk_objects_by_name(s3, mount, tmp_path)
    d = delta(before, stats(m.path))
    assert d["store_get_chunk"] == 32
    # the first file's lookup asks (nothing is fetched ahead yet), and a few whose
    # lookup comes before the window reaches them; never one per chunk
    assert d.get("store_exists", 0) + d.get("store_head", 0) <= 8, d


def test_a_conditions_probe_object_is_never_taken_for_a_member(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """The probe object a read-write mount writes at the store's root (here: one left
    behind, so the root's listing surely sees it) is no member: not opened, not shown."""
    local = tmp_path / "g.zarr"
    zarr.open_group(str(local), mode="w")
    stores.v3(local / "a")
    bucket = new_bucket(s3)
    upload(s3, local, bucket, "g.zarr")
    client = make_bucket(s3, bucket)
    client.put_object(Bucket=bucket, Key="g.zarr/.zfuse-conditions-probe-leftover12", Body=b"zfuse probe 1")
    since = len(s3.requests())
    m = s3_mount(mount, s3, f"s3://{bucket}/g.zarr")  # read-write: it probes too
    assert sorted(os.listdir(m.path)) == ["a", "zarr.json"]
    asked = [r.path + "?" + r.query for r in s3.requests()[since:] if "probe-leftover12" in r.path + r.query]
    assert asked == [], asked


def test_a_server_that_ignores_ranges_still_gives_each_inner_chunk(
    s3: S3Server, aws_env: None, mount: Any, tmp_path: Path
) -> None:
    """[remote-8] behind a proxy that drops Range headers, every GET of an inner chunk or
    a shard index brings the whole shard (200, no Content-Range): each range is taken
    from the body as it streams, keeping only its own bytes, and every chunk file reads
    as the data (before: the whole body was read into memory, then refused for its
    length: EIO). The log says so once."""
    from s3server import RangeIgnoredProxy

    stores.sharded(tmp_path / "s.zarr", shape=(40, 60), shards=(32, 32), chunks=(8, 16))
    arr = zarr.open_array(str(tmp_path / "s.zarr"))
    bucket = new_bucket(s3)
    upload(s3, tmp_path / "s.zarr", bucket, "s.zarr")
    proxy = RangeIgnoredProxy(s3)
    try:
        m = mount(f"s3://{bucket}/s.zarr", "-o", f"endpoint_url={proxy.endpoint_url},timeout=5", "--cache-size", "0")
        since = len(s3.requests())
        assert assert_every_chunk_equal(m.path, arr) == 5 * 4  # (every inner chunk of the grid)
        gets = object_gets(s3, since, f"/{bucket}/s.zarr/c/")
        assert gets and all(status == 200 for _, status in gets)  # whole objects, every one
        assert m.log().count("the server sent the whole object for a byte range") == 1
        assert "Traceback" not in m.log()
    finally:
        proxy.close()


@pytest.mark.parametrize("kind", ["range", "offset", "suffix", "past_end"])
def test_a_range_is_taken_from_a_whole_object_keeping_only_its_bytes(kind: str) -> None:
    """[remote-8] (no server) the range's bytes out of a whole object streamed in parts of
    STREAM_PART: every kind of range, a range across part boundaries, and one past the
    end; and a body longer than the range it answers is cut short, not read whole."""
    import asyncio

    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    from zfuse.remote_objects import STREAM_PART, _range_of_whole_object, _read_at_most

    whole = bytes(range(256)) * (3 * STREAM_PART // 256 + 7)

    class Body:  # an HTTP body as aiohttp and botocore hand it on: read(n) gives at most n bytes
        def __init__(self, data: bytes) -> None:
            self.data, self.at, self.reads = data, 0, 0

        async def read(self, n: int = -1) -> bytes:
            self.reads += 1
            n = len(self.data) - self.at if n < 0 else n
            part = self.data[self.at:self.at + n]
            self.at += len(part)
            return part

    start, end = STREAM_PART - 5, 2 * STREAM_PART + 9
    byte_range, expected = {
        "range": (RangeByteRequest(start, end), whole[start:end]),
        "offset": (OffsetByteRequest(start), whole[start:]),
        "suffix": (SuffixByteRequest(1000), whole[-1000:]),
        "past_end": (RangeByteRequest(len(whole) - 3, len(whole) + 50), whole[-3:]),
    }[kind]
    body = Body(whole)
    assert asyncio.run(_range_of_whole_object(body, byte_range)) == expected
    if kind == "range":
        assert body.at <= end + STREAM_PART  # (no further than the range's end)
    cut = Body(whole)
    assert len(asyncio.run(_read_at_most(cut, 10))) <= STREAM_PART and cut.reads == 1


def test_first_day_refusals_name_the_real_problem(s3: S3Server, caplog) -> None:
    """A misspelt bucket is named as such (zarr reads a missing bucket's keys as missing
    keys: "no Zarr metadata" hid it), with no warning about a probe object never written;
    a write the store's credentials deny is EACCES (s3fs's AccessDenied carries no
    errno: it was EIO)."""
    import logging

    from zfuse.daemon import MountConfig
    from zfuse.daemonize import describe_open_error
    from zfuse.errors import errno_for
    from zfuse.open_view import make_view

    with caplog.at_level(logging.WARNING), pytest.raises(Exception) as failed:
        make_view(MountConfig(["s3://nobucket/g.zarr"], "/unused", read_only=False,
                              storage_options=s3.storage_options))
    assert describe_open_error(["s3://nobucket/g.zarr"], failed.value, s3.storage_options) == \
        "cannot open s3://nobucket/g.zarr: there is no bucket 'nobucket' at that endpoint"
    assert "probe object" not in caplog.text
    assert errno_for(PermissionError("Access Denied")) == errno.EACCES
