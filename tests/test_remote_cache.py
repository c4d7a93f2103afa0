"""The disk cache of remote stores (`-o cache=DIR`, zfuse/remote_cache.py).

Plain calls first (no mount): what is served, what is refused, the bound, the
directory's safety. Then real mounts against moto's server (tests/s3server.py):
a remount reads unchanged chunks from the cache (0 GETs), an object changed
behind the mount is fetched again after metadata_ttl, a damaged entry costs one
refetch, a small limit evicts, two mounts share one directory at once. Request
counts come from `.zfuse/stats` and the server's log, never from timings.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from zfuse.remote_cache import LAYOUT, CacheDirError, DiskCache


class Counts(dict):
    def __call__(self, name: str, amount: float = 1) -> None:
        self[name] = self.get(name, 0) + amount


def entry_path(cache: DiskCache, identity: str) -> Path:
    sub, name = cache.name_of(identity)
    return Path(cache.directory) / LAYOUT / sub / name


# -- plain calls -----------------------------------------------------------------------


def test_served_only_for_the_version_it_was_stored_under(tmp_path: Path) -> None:
    counts = Counts()
    cache = DiskCache(str(tmp_path / "c"), 1 << 20, counts)
    assert cache.get("s3|x|b/k\nall", '"e1"') is None
    assert cache.put("s3|x|b/k\nall", '"e1"', b"old bytes")
    assert cache.get("s3|x|b/k\nall", '"e1"') == b"old bytes"
    assert cache.get("s3|x|b/k\nall", '"e2"') is None  # the object changed: a miss, never the old bytes
    assert cache.get("s3|x|b/k\nbytes=0-3", '"e1"') is None  # another range of it
    cache.put("s3|x|b/k\nall", '"e2"', b"new")
    assert cache.get("s3|x|b/k\nall", '"e2"') == b"new"
    assert cache.get("s3|x|b/k\nall", '"e1"') is None
    assert counts["disk_cache_hits"] == 2 and counts["disk_cache_misses"] == 4 and counts.get("disk_cache_corrupt", 0) == 0


def test_an_entry_of_an_unknown_version_is_offered_for_revalidation(tmp_path: Path) -> None:
    counts = Counts()
    cache = DiskCache(str(tmp_path), 1 << 20, counts)
    assert cache.get_any("id") is None
    cache.put("id", '"e1"', b"bytes")
    assert cache.get_any("id") == ('"e1"', b"bytes")
    assert counts.get("disk_cache_hits", 0) == 0  # not served yet: the store is asked first
    cache.served(5)
    assert counts["disk_cache_hits"] == 1 and counts["disk_cache_bytes_read"] == 5
    entry_path(cache, "id").write_bytes(b"garbage")
    assert cache.get_any("id") is None and counts["disk_cache_corrupt"] == 1


def test_survives_a_new_instance(tmp_path: Path) -> None:
    DiskCache(str(tmp_path), 1 << 20).put("id", "v", b"kept")
    assert DiskCache(str(tmp_path), 1 << 20).get("id", "v") == b"kept"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip_payload", "flip_etag", "empty", "grow"])
def test_a_damaged_entry_is_a_miss_and_removed(tmp_path: Path, damage: str) -> None:
    counts = Counts()
    cache = DiskCache(str(tmp_path), 1 << 20, counts)
    payload = bytes(range(256)) * 64
    cache.put("id", '"etag"', payload)
    path = entry_path(cache, "id")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-100]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "flip_payload":
        data[-1] ^= 1
    elif damage == "flip_etag":
        data[30] ^= 1  # inside the etag, after the 26-byte header
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"x"
    path.write_bytes(bytes(data))
    assert cache.get("id", '"etag"') is None
    if damage == "flip_etag":
        # an entry naming another version is not read further (its payload is not ours):
        # left as another version's, a miss; the refetched bytes replace it
        assert counts.get("disk_cache_corrupt", 0) == 0 and counts["disk_cache_misses"] == 1
    else:
        assert counts["disk_cache_corrupt"] == 1 and not path.exists()
    cache.put("id", '"etag"', payload)  # the refetched bytes
    assert cache.get("id", '"etag"') == payload


def test_a_planted_entry_is_checked_before_its_payload_is_read(tmp_path: Path) -> None:
    """[remote-1] a 2.5 GB file (sparse) put under an entry's name, within the cache's
    limit: its header is read and checked first, so it costs no read of its bytes (it
    had been read whole: 30 s and 4.8 GB); one past ENTRY_MAX is never opened for reading."""
    import tracemalloc

    from zfuse.remote_cache import ENTRY_MAX

    counts = Counts()
    cache = DiskCache(str(tmp_path), 1 << 40, counts)
    cache.put("id", "v", b"small")
    path = entry_path(cache, "id")
    for size, header in ((2_500_000_000, b"ZFCACHE1" + bytes(18)), (ENTRY_MAX + 1, path.read_bytes()[:26])):
        with open(path, "wb") as f:
            f.write(header)
            f.truncate(size)
        tracemalloc.start()
        try:
            assert cache.get("id", "v") is None
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak
    assert counts["disk_cache_corrupt"] == 2
    assert not cache.put("huge", "v", memoryview(bytearray(ENTRY_MAX)))  # never stored either


def test_links_and_special_files_inside_are_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the cache's")
    cache = DiskCache(str(tmp_path / "c"), 1 << 20)
    cache.put("id", "v", b"x")
    path = entry_path(cache, "id")
    path.unlink()
    path.symlink_to(secret)
    assert cache.get("id", "v") is None
    assert secret.read_bytes() == b"not the cache's"
    # a subdirectory replaced by a link leading out: neither read nor written through
    sub = path.parent
    for f in sub.iterdir():
        f.unlink()
    sub.rmdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    sub.symlink_to(outside)
    assert not cache.put("id", "v", b"y")
    assert cache.get("id", "v") is None
    assert list(outside.iterdir()) == []
    # a FIFO where an entry belongs: a miss, not a hang
    sub.unlink()
    sub.mkdir()
    os.mkfifo(path)
    assert cache.get("id", "v") is None


def test_the_directory_is_made_private_and_a_shared_one_refused(tmp_path: Path) -> None:
    DiskCache(str(tmp_path / "new"), 1 << 20)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / LAYOUT).stat().st_mode) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(CacheDirError, match="writable by group or others"):
        DiskCache(str(open_dir), 1 << 20)
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / LAYOUT).symlink_to(tmp_path / "new" / LAYOUT)
    with pytest.raises(CacheDirError, match="symbolic link"):
        DiskCache(str(tmp_path / "l"), 1 << 20)
    (tmp_path / "file").write_text("")
    with pytest.raises(CacheDirError):
        DiskCache(str(tmp_path / "file"), 1 << 20)


def test_bounded_least_recently_used_evicted_first(tmp_path: Path) -> None:
    counts = Counts()
    limit = 10 * 1100
    cache = DiskCache(str(tmp_path), limit, counts)
    for i in range(8):
        cache.put(f"id{i}", "v", bytes(1000))
        os.utime(entry_path(cache, f"id{i}"), (1000 + i, 1000 + i))  # (written a second apart)
    assert cache.get("id0", "v") is not None  # used: now the most recent
    for i in range(8, 12):
        cache.put(f"id{i}", "v", bytes(1000))
        assert cache.used() <= limit
    assert counts["disk_cache_evicted"] >= 2
    assert cache.get("id0", "v") is not None  # used recently: kept
    assert cache.get("id1", "v") is None  # the least recently used: gone
    assert not cache.put("big", "v", bytes(limit))  # bigger than the bound: not kept


def test_an_entry_bigger_than_the_limit_is_never_read(tmp_path: Path) -> None:
    cache = DiskCache(str(tmp_path), 4096)
    cache.put("id", "v", b"small")
    with open(entry_path(cache, "id"), "ab") as f:
        f.truncate(1 << 30)  # sparse: costs no disk, would cost a GiB of memory to read
    assert cache.get("id", "v") is None


def test_two_writers_at_once_leave_whole_entries(tmp_path: Path) -> None:
    """Two instances (as two daemons) putting and reading one entry concurrently: every
    read is one whole version or a miss, never a mix."""
    a, b = DiskCache(str(tmp_path), 1 << 24), DiskCache(str(tmp_path), 1 << 24)
    versions = {f"v{i}": bytes([i]) * 50_000 for i in range(4)}
    stop = threading.Event()
    bad: list[bytes] = []

    def write(cache: DiskCache) -> None:
        while not stop.is_set():
            for v, data in versions.items():
                cache.put("id", v, data)

    threads = [threading.Thread(target=write, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    try:
        for _ in range(400):
            for v, data in versions.items():
                got = a.get("id", v)
                if got is not None and got != data:
                    bad.append(got[:8])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad
    leftovers = [p for p in (tmp_path / LAYOUT).rglob(".tmp.*")]
    assert leftovers == []


def test_the_options_reach_the_remote_store_and_only_it(tmp_path: Path) -> None:
    from zfuse.daemon import MountConfig
    from zfuse.mount_options import OptionError, apply_mount_options
    from zfuse.store import MeteredStore, fsspec_options, open_store

    config = MountConfig(sources=["s3://b/x.zarr"], mountpoint=str(tmp_path))
    apply_mount_options(config, [f"cache={tmp_path}/c,cache_limit=2M,endpoint_url=http://127.0.0.1:9"])
    assert config.storage_options["zfuse_cache"] == f"{tmp_path}/c"
    assert config.storage_options["zfuse_cache_limit"] == 2 << 20
    with pytest.raises(OptionError, match="needs a path"):
        apply_mount_options(config, ["cache="])
    with pytest.raises(OptionError, match="cache_limit"):
        apply_mount_options(config, ["cache_limit=lots"])
    store = MeteredStore(open_store("s3://b/x.zarr", read_only=True, storage_options=config.storage_options))
    assert store.cache is not None and store.cache.limit == 2 << 20
    assert "zfuse_cache" not in fsspec_options("s3", {}) and "zfuse_cache" not in store._store.fs.storage_options
    # a local directory has no cache (its files are local already)
    (tmp_path / "local").mkdir()
    assert MeteredStore(open_store(str(tmp_path / "local"), read_only=True,
                                   storage_options=config.storage_options)).cache is None


# -- real mounts against moto's server -----------------------------------------------

s3_tests = pytest.importorskip("test_s3")  # (its helpers and fixtures: one S3 setup for all)
aws_env = s3_tests.aws_env
CHUNKS = "store_get_chunk", "store_get_chunk_ranged"


def make_data(tmp_path: Path) -> tuple[str, dict]:
    """A bucket with an unsharded and a sharded array (6 chunk files each)."""
    import zarr

    import stores

    local = tmp_path / "g.zarr"
    zarr.open_group(str(local), mode="w")
    stores.v3(local / "plain")
    stores.sharded(local / "sharded", shape=(20, 30), shards=(16, 32), chunks=(8, 16))
    return str(local), {name: zarr.open_array(str(local / name)) for name in ("plain", "sharded")}


def read_all(root: Path, arrays: dict) -> int:
    import io

    import numpy as np
    import tifffile

    n = 0
    for name, arr in arrays.items():
        for f in sorted((root / name).rglob("*.tiff")):
            coords = tuple(int(p) for p in str(f.relative_to(root / name / "c"))[: -len(".tiff")].split("/"))
            got = tifffile.imread(io.BytesIO(s3_tests.read_direct(f)))
            np.testing.assert_array_equal(got.reshape(arr.chunks), s3_tests.expected_chunk(arr, coords),
                                          err_msg=str(f))
            n += 1
    return n


def chunk_gets(server: object, since: int, bucket: str) -> list:
    """The server's GETs of chunk objects (not metadata, not listings) after request #since."""
    return [r for r in server.requests()[since:]  # type: ignore[attr-defined]
            if r.method == "GET" and r.path.startswith(f"/{bucket}/g.zarr/") and "/c/" in r.path and not r.query]


def cache_mount(mount, server, bucket: str, cache: Path, name: str, options: str = ""):
    opts = f"endpoint_url={server.endpoint_url},timeout=5,cache={cache}" + (f",{options}" if options else "")
    return mount(f"s3://{bucket}/g.zarr", "-o", opts, "--cache-size", "0", name=name)


def entries(cache: Path) -> list[Path]:
    return [p for p in (cache / LAYOUT).rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_remount_reads_unchanged_chunks_from_the_cache(s3, aws_env, mount, tmp_path: Path) -> None:
    """[remote-1] a remount with -o cache= reads unchanged chunks with no GET."""
    local, arrays = make_data(tmp_path)
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, Path(local), bucket, "g.zarr")
    cache = tmp_path / "cache"
    first = cache_mount(mount, s3, bucket, cache, "first")
    assert read_all(first.path, arrays) == 12
    cold = s3_tests.stats(first.path)
    assert sum(cold.get(k, 0) for k in CHUNKS) > 0 and cold.get("disk_cache_stored", 0) > 0
    first.unmount()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700

    since = len(s3.requests())
    again = cache_mount(mount, s3, bucket, cache, "again")
    assert read_all(again.path, arrays) == 12
    warm = s3_tests.stats(again.path)
    assert {k: warm.get(k, 0) for k in (*CHUNKS, "store_head")} == {k: 0 for k in (*CHUNKS, "store_head")}
    assert warm.get("disk_cache_hits", 0) > 0 and warm.get("disk_cache_corrupt", 0) == 0
    assert chunk_gets(s3, since, bucket) == []  # the server agrees: no chunk object was read


def test_an_object_changed_behind_the_mount_is_fetched_after_a_reload(s3, aws_env, mount, tmp_path: Path) -> None:
    import io

    import numpy as np
    import tifffile
    import zarr

    import stores

    local, arrays = make_data(tmp_path)
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, Path(local), bucket, "g.zarr")
    cache = tmp_path / "cache"
    m = cache_mount(mount, s3, bucket, cache, "m", options="metadata_ttl=3600")
    read_all(m.path, arrays)
    # another host rewrites chunk (1, 0) of "plain" (same shape, other values)
    stores.v3(tmp_path / "other.zarr", seed=7)
    other = zarr.open_array(str(tmp_path / "other.zarr"))
    client = s3_tests.make_bucket(s3, bucket)
    client.put_object(Bucket=bucket, Key="g.zarr/plain/c/1/0", Body=(tmp_path / "other.zarr/c/1/0").read_bytes())
    from zfuse.mounts import reload_mount

    reload_mount(str(m.path))  # what metadata_ttl does when it expires (and SIGHUP)
    before = s3_tests.stats(m.path)
    got = tifffile.imread(io.BytesIO(s3_tests.read_direct(m.path / "plain" / "c" / "1" / "0.tiff")))
    np.testing.assert_array_equal(got, s3_tests.expected_chunk(other, (1, 0)))
    after = s3_tests.stats(m.path)
    assert after["store_get_chunk"] - before.get("store_get_chunk", 0) == 1
    # and the others still come from the cache after the reload
    arrays["plain"] = None
    assert read_all(m.path, {"sharded": arrays["sharded"]}) == 6
    assert s3_tests.stats(m.path).get("store_get_chunk_ranged", 0) == before.get("store_get_chunk_ranged", 0)


def test_after_metadata_ttl_the_new_object_is_served(s3, aws_env, mount, tmp_path: Path) -> None:
    import io
    import time

    import tifffile
    import zarr

    import stores

    local, arrays = make_data(tmp_path)
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, Path(local), bucket, "g.zarr")
    cache = tmp_path / "cache"
    m = cache_mount(mount, s3, bucket, cache, "m", options="metadata_ttl=0.5")
    read_all(m.path, arrays)
    stores.v3(tmp_path / "other.zarr", seed=7)
    new = s3_tests.expected_chunk(zarr.open_array(str(tmp_path / "other.zarr")), (0, 1))
    client = s3_tests.make_bucket(s3, bucket)
    client.put_object(Bucket=bucket, Key="g.zarr/plain/c/0/1", Body=(tmp_path / "other.zarr/c/0/1").read_bytes())
    deadline = time.monotonic() + 60
    while True:  # each read asks the daemon (O_DIRECT); the ttl's reload is what changes its answer
        got = tifffile.imread(io.BytesIO(s3_tests.read_direct(m.path / "plain" / "c" / "0" / "1.tiff")))
        if (got == new).all():
            break
        assert time.monotonic() < deadline, "the new object was never served"
    # and never the old bytes under the new version: the cache now holds the new one
    m.unmount()
    again = cache_mount(mount, s3, bucket, cache, "again")
    got = tifffile.imread(io.BytesIO(s3_tests.read_direct(again.path / "plain" / "c" / "0" / "1.tiff")))
    assert (got == new).all() and s3_tests.stats(again.path).get("store_get_chunk", 0) == 0


def test_a_truncated_cache_file_costs_one_refetch(s3, aws_env, mount, tmp_path: Path) -> None:
    local, arrays = make_data(tmp_path)
    arrays.pop("sharded")
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, Path(local), bucket, "g.zarr")
    cache = tmp_path / "cache"
    first = cache_mount(mount, s3, bucket, cache, "first")
    read_all(first.path, arrays)
    first.unmount()
    (victim, *_) = sorted(entries(cache))
    os.truncate(victim, victim.stat().st_size // 2)
    again = cache_mount(mount, s3, bucket, cache, "again")
    assert read_all(again.path, arrays) == 6  # every pixel right
    s = s3_tests.stats(again.path)
    assert s["disk_cache_corrupt"] == 1 and s["store_get_chunk"] == 1


def test_a_small_limit_evicts_least_recently_used(s3, aws_env, mount, tmp_path: Path) -> None:
    local, arrays = make_data(tmp_path)
    arrays.pop("sharded")
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, Path(local), bucket, "g.zarr")
    cache = tmp_path / "cache"
    sizes = sorted(p.stat().st_size for p in (Path(local) / "plain" / "c").rglob("*") if p.is_file())
    limit = sum(sizes[-3:]) + 3 * 400  # room for three chunks with their headers
    m = cache_mount(mount, s3, bucket, cache, "m", options=f"cache_limit={limit}")
    read_all(m.path, arrays)
    assert s3_tests.stats(m.path)["disk_cache_evicted"] >= 1
    assert 0 < sum(p.stat().st_size for p in entries(cache)) <= limit

    def gets_to_read(chunk: str) -> float:
        before = s3_tests.stats(m.path)
        s3_tests.read_direct(m.path / "plain" / "c" / chunk)
        return s3_tests.stats(m.path)["store_get_chunk"] - before["store_get_chunk"]

    assert gets_to_read("2/1.tiff") == 0  # read last: still cached
    assert gets_to_read("0/0.tiff") == 1  # read first: evicted


def test_two_mounts_share_one_cache_at_once(s3, aws_env, mount, tmp_path: Path) -> None:
    local, arrays = make_data(tmp_path)
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, Path(local), bucket, "g.zarr")
    cache = tmp_path / "cache"
    a = cache_mount(mount, s3, bucket, cache, "a")
    b = cache_mount(mount, s3, bucket, cache, "b")
    errors: list[BaseException] = []

    def reader(root: Path) -> None:
        try:
            for _ in range(3):
                read_all(root, arrays)
        except BaseException as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(m.path,)) for m in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not list((cache / LAYOUT).rglob(".tmp.*"))
    # a third mount finds every chunk the two stored
    since = len(s3.requests())
    c = cache_mount(mount, s3, bucket, cache, "c")
    assert read_all(c.path, arrays) == 12
    assert sum(s3_tests.stats(c.path).get(k, 0) for k in CHUNKS) == 0
    assert chunk_gets(s3, since, bucket) == []


def test_a_shard_read_ahead_in_spans_is_found_chunk_by_chunk_after_a_remount(s3, aws_env, mount, tmp_path: Path) -> None:
    """[remote-1] a sequential reader has a shard's inner chunks fetched ahead, several
    in one ranged GET; with -o cache= each is kept as its own range all the same, so a
    remount reading them one by one in another order makes no chunk GET."""
    import io

    import numpy as np
    import tifffile
    import zarr

    import stores

    local = tmp_path / "g.zarr"
    zarr.open_group(str(local), mode="w")
    stores.sharded(local / "sharded", shape=(64, 64), shards=(32, 64), chunks=(8, 16))
    arr = zarr.open_array(str(local / "sharded"))
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, local, bucket, "g.zarr")
    cache = tmp_path / "cache"
    opts = f"endpoint_url={s3.endpoint_url},timeout=5,cache={cache}"
    files = [(i, j) for i in range(8) for j in range(4)]
    first = mount(f"s3://{bucket}/g.zarr", "-o", opts, name="first")  # read-ahead on (a chunk cache)
    for i, j in files:
        tifffile.imread(first.path / "sharded" / "c" / str(i) / f"{j}.tiff")
    ranged = s3_tests.stats(first.path).get("store_get_chunk_ranged", 0)
    assert 2 + 2 <= ranged <= 2 + 8, ranged  # 2 indexes, then spans of several inner chunks
    first.unmount()
    since = len(s3.requests())
    again = mount(f"s3://{bucket}/g.zarr", "-o", opts, "--cache-size", "0", name="again")
    for i, j in reversed(files):
        got = tifffile.imread(io.BytesIO(s3_tests.read_direct(again.path / "sharded" / "c" / str(i) / f"{j}.tiff")))
        np.testing.assert_array_equal(got, s3_tests.expected_chunk(arr, (i, j)))
    # (opened by name, not listed: each shard's version is asked once, a 304 with no body)
    assert [r for r in chunk_gets(s3, since, bucket) if r.status != 304] == []


def test_a_sequential_reader_of_a_sharded_array_reads_right_through_the_cache(
    s3, aws_env, mount, tmp_path: Path
) -> None:
    """[remote-7] `cat` in C order of a sharded array's chunk files (4 x 4 inner chunks per
    shard) through -o cache=: the fetches ahead bring whole runs of a shard's inner
    chunks, some claimed for other reads (before: those were put out of offset order,
    and 3 files failed with EIO "lies outside the stored shard"); every file reads right,
    on the first mount and from the cache after a remount."""
    import io

    import numpy as np
    import tifffile
    import zarr

    local = tmp_path / "g.zarr"
    zarr.open_group(str(local), mode="w")
    arr = zarr.create_array(str(local / "s"), shape=(256, 256), chunks=(32, 32), shards=(128, 128), dtype="uint16")
    arr[...] = data = np.arange(256 * 256, dtype="uint16").reshape(256, 256)
    bucket = s3_tests.new_bucket(s3)
    s3_tests.upload(s3, local, bucket, "g.zarr")
    cache = tmp_path / "cache"

    def read_in_order(root: Path) -> None:
        for y in range(8):
            for x in range(8):
                got = tifffile.imread(io.BytesIO(s3_tests.read_direct(root / "s" / "c" / str(y) / f"{x}.tiff")))
                np.testing.assert_array_equal(got, data[32 * y:32 * y + 32, 32 * x:32 * x + 32])

    # (the decoded-chunk cache on, as by default: chunks are fetched ahead of the reader)
    opts = f"endpoint_url={s3.endpoint_url},timeout=5,cache={cache}"
    first = mount(f"s3://{bucket}/g.zarr", "-o", opts, name="first")
    read_in_order(first.path)
    assert "Traceback" not in first.log() and "outside the stored shard" not in first.log()
    first.unmount()
    since = len(s3.requests())
    again = mount(f"s3://{bucket}/g.zarr", "-o", opts, name="again")
    read_in_order(again.path)
    # (opened by name, no listing: each shard's version is asked, 304 Not Modified, no bytes)
    assert {r.status for r in chunk_gets(s3, since, bucket)} <= {304}
