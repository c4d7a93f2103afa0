"""Many hosts writing one object store (issue 30 item 4): conditional writes.

Two zfuse daemons mounting one bucket read-write stand for two hosts. Every write
of a shard is made on condition that the shard is still the version read
(If-Match; If-None-Match: * for a new one), and a lost race is redone from the new
version, so neither host's inner chunks are lost. A store that ignores conditions
(a real proxy that drops the headers, tests/s3server.py) refuses a read-write
mount unless `-o last_writer_wins` accepts it. The server is moto's (real HTTP).
Plain calls first: the retry rule (zfuse/conditional.py) without any store.
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import tifffile

from zfuse.conditional import CONFLICT_RETRIES, backoff, retry_lost_races
from zfuse.remote_objects import WriteConflictError

# -- plain calls -----------------------------------------------------------------------


def test_a_lost_race_is_redone_and_gives_up_with_estale() -> None:
    import errno

    attempts: list[int] = []
    waits: list[float] = []

    def lose_twice() -> str:
        attempts.append(1)
        if len(attempts) <= 2:
            raise WriteConflictError("c/0/0")
        return "written"

    assert retry_lost_races(lose_twice, "x", sleep=waits.append) == "written"
    assert len(attempts) == 3 and len(waits) == 2

    def always_lose() -> None:
        raise WriteConflictError("c/0/0")

    with pytest.raises(WriteConflictError) as info:
        retry_lost_races(always_lose, "x", sleep=waits.append)
    assert info.value.errno == errno.ESTALE and "another writer" in str(info.value)
    assert all(0 <= backoff(n) <= 0.5 for n in range(CONFLICT_RETRIES))

    def other_error() -> None:
        raise OSError(errno.EIO, "the store failed")

    calls = len(waits)
    with pytest.raises(OSError, match="the store failed"):
        retry_lost_races(other_error, "x", sleep=waits.append)
    assert len(waits) == calls  # anything else is not retried


# -- real mounts against moto ------------------------------------------------------------

s3_tests = pytest.importorskip("test_s3")
aws_env = s3_tests.aws_env
pytestmark = pytest.mark.mount


def one_shard(tmp_path: Path, server: object) -> tuple[str, np.ndarray]:
    """A bucket holding one shard of 2 x 2 inner chunks of 8 x 16 uint16."""
    import stores

    values = stores.sharded(tmp_path / "s.zarr", shape=(16, 32), shards=(16, 32), chunks=(8, 16))
    bucket = s3_tests.new_bucket(server)
    s3_tests.upload(server, tmp_path / "s.zarr", bucket, "s.zarr")
    assert [p.name for p in (tmp_path / "s.zarr" / "c").rglob("*") if p.is_file()] == ["0"]  # one shard object
    return bucket, values


def rw_mount(mount, server, bucket: str, name: str, endpoint: str | None = None, options: str = ""):
    opts = f"endpoint_url={endpoint or server.endpoint_url},timeout=10" + (f",{options}" if options else "")
    return mount(f"s3://{bucket}/s.zarr", "-o", opts, "--cache-size", "0", name=name)


def tiff_of(values: np.ndarray) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, values)
    return out.getvalue()


def on_s3(server, bucket: str) -> np.ndarray:
    import zarr

    return zarr.open_array(s3_tests.s3_store(server, f"s3://{bucket}/s.zarr"), mode="r")[...]


def chunk_values(value: int) -> np.ndarray:
    return np.full((8, 16), value, dtype="uint16")


def test_two_hosts_writing_inner_chunks_of_one_shard_lose_no_update(s3, aws_env, mount, tmp_path: Path) -> None:
    """[remote-2] each shard PUT is conditional on the version read; a lost race is redone."""
    bucket, original = one_shard(tmp_path, s3)
    a = rw_mount(mount, s3, bucket, "a")
    b = rw_mount(mount, s3, bucket, "b")
    rounds = 12
    errors: list[BaseException] = []

    def writer(root: Path, chunk: str, base: int) -> None:
        try:
            for i in range(rounds):
                (root / "c" / chunk).write_bytes(tiff_of(chunk_values(base + i)))
        except BaseException as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(a.path, "0/0.tiff", 1000)),
               threading.Thread(target=writer, args=(b.path, "1/1.tiff", 2000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    final = on_s3(s3, bucket)
    # each host's last write is there: neither overwrote the other's with an old shard
    np.testing.assert_array_equal(final[0:8, 0:16], chunk_values(1000 + rounds - 1))
    np.testing.assert_array_equal(final[8:16, 16:32], chunk_values(2000 + rounds - 1))
    # the chunks nobody wrote are as they were
    np.testing.assert_array_equal(final[0:8, 16:32], original[0:8, 16:32])
    np.testing.assert_array_equal(final[8:16, 0:16], original[8:16, 0:16])
    conflicts = sum(s3_tests.stats(m.path).get("store_write_conflicts", 0) for m in (a, b))
    print(f"lost races redone: {conflicts}")
    assert not [p for p in os.listdir(a.path) if p.startswith(".zfuse-conditions-probe")]


def test_two_hosts_writing_the_same_chunk_leave_whole_versions(s3, aws_env, mount, tmp_path: Path) -> None:
    """Both write one inner chunk while a third mount reads it: every read is one whole
    version, or ESTALE when the shard changed under the index the reader holds (then a
    reload reads the new one); never a mix, never another chunk's bytes."""
    import errno

    from zfuse.mounts import reload_mount

    bucket, original = one_shard(tmp_path, s3)
    a = rw_mount(mount, s3, bucket, "a")
    b = rw_mount(mount, s3, bucket, "b")
    c = mount(f"s3://{bucket}/s.zarr", "-o", f"endpoint_url={s3.endpoint_url},timeout=10,ro",
              "--cache-size", "0", name="c")
    rounds = 10
    errors: list[BaseException] = []
    seen: set[int] = set()
    stale = []
    done = threading.Event()

    def version(value: int) -> np.ndarray:
        values = chunk_values(value)
        values[0, :] = np.arange(16) + value  # each version: one value, and its own first row
        return values

    written = {1000 + i for i in range(rounds)} | {2000 + i for i in range(rounds)}

    def writer(root: Path, base: int) -> None:
        try:
            for i in range(rounds):
                (root / "c" / "0" / "0.tiff").write_bytes(tiff_of(version(base + i)))
        except BaseException as e:  # (reported below)
            errors.append(e)

    def check(got: np.ndarray) -> None:
        value = int(got[1, 0])
        seen.add(value)
        if value in written:
            np.testing.assert_array_equal(got, version(value))  # one whole version
        else:
            np.testing.assert_array_equal(got, original[0:8, 0:16])

    def reader() -> None:
        try:
            while not done.is_set():
                try:
                    check(tifffile.imread(io.BytesIO(s3_tests.read_direct(c.path / "c" / "0" / "0.tiff"))))
                except OSError as e:
                    if e.errno != errno.ESTALE:
                        raise
                    stale.append(e)
                    reload_mount(str(c.path))  # what metadata_ttl does
        except BaseException as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(a.path, 1000)),
               threading.Thread(target=writer, args=(b.path, 2000))]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert not errors, errors
    final = on_s3(s3, bucket)
    assert int(final[1, 0]) in {1000 + rounds - 1, 2000 + rounds - 1}  # one host's last version, whole
    np.testing.assert_array_equal(final[0:8, 0:16], version(int(final[1, 0])))
    np.testing.assert_array_equal(final[8:16, 16:32], original[8:16, 16:32])
    reload_mount(str(c.path))
    check(tifffile.imread(io.BytesIO(s3_tests.read_direct(c.path / "c" / "0" / "0.tiff"))))
    print(f"versions read: {len(seen)}, ESTALE then reloaded: {len(stale)}")


def test_a_reader_of_a_shard_another_host_rewrote_reads_the_new_version(s3, aws_env, mount, tmp_path: Path) -> None:
    """[remote-4] Host A rewrites the shard; host B, holding the old shard index, reads another
    inner chunk of it: the new version's bytes, with no ESTALE and no reload (its range
    read is refused as of another version, and the index is read afresh once)."""
    bucket, original = one_shard(tmp_path, s3)
    a = rw_mount(mount, s3, bucket, "a")
    b = mount(f"s3://{bucket}/s.zarr", "-o", f"endpoint_url={s3.endpoint_url},timeout=10,ro",
              "--cache-size", "0", name="b")
    first = tifffile.imread(io.BytesIO(s3_tests.read_direct(b.path / "c" / "0" / "0.tiff")))
    np.testing.assert_array_equal(first, original[0:8, 0:16])  # b holds the shard's index now
    (a.path / "c" / "1" / "1.tiff").write_bytes(tiff_of(chunk_values(4321)))  # a new shard version
    for _ in range(2):
        got = tifffile.imread(io.BytesIO(s3_tests.read_direct(b.path / "c" / "1" / "1.tiff")))
        np.testing.assert_array_equal(got, chunk_values(4321))
        np.testing.assert_array_equal(
            tifffile.imread(io.BytesIO(s3_tests.read_direct(b.path / "c" / "0" / "1.tiff"))), original[0:8, 16:32])


def test_a_store_that_ignores_conditions_refuses_rw_unless_accepted(s3, aws_env, mount, tmp_path: Path) -> None:
    """[remote-3] refused read-write unless -o last_writer_wins; ro works."""
    from zfuse.testing import MountError, Mounts

    from s3server import ConditionsIgnoredProxy

    bucket, original = one_shard(tmp_path, s3)
    proxy = ConditionsIgnoredProxy(s3)
    try:
        opts = f"endpoint_url={proxy.endpoint_url},timeout=10"
        with Mounts(tmp_path / "refused") as mounts, pytest.raises(MountError) as info:
            mounts.start(f"s3://{bucket}/s.zarr", "-o", opts)
        assert "ignores conditional writes" in str(info.value) and "last_writer_wins" in str(info.value)
        # read-only: nothing to condition
        ro = mount(f"s3://{bucket}/s.zarr", "-o", opts + ",ro", name="ro")
        np.testing.assert_array_equal(tifffile.imread(ro.path / "c" / "1" / "1.tiff"), original[8:16, 16:32])
        # accepted: writes land, last writer wins, and the log says so
        m = rw_mount(mount, s3, bucket, "lww", endpoint=proxy.endpoint_url, options="last_writer_wins")
        (m.path / "c" / "0" / "0.tiff").write_bytes(tiff_of(chunk_values(7)))
        np.testing.assert_array_equal(on_s3(s3, bucket)[0:8, 0:16], chunk_values(7))
        assert "ignores conditional writes" in m.log()
        client = s3_tests.make_bucket(s3, bucket)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert not [k for k in keys if ".zfuse-conditions-probe" in k]  # probes cleaned up
    finally:
        proxy.close()


# -- the store layer with plain calls against the server (no mount) -----------------------


def metered(server, url: str, *, read_only: bool = False, endpoint: str | None = None, **options):
    from zfuse.store import MeteredStore, open_store

    storage = {"endpoint_url": endpoint or server.endpoint_url, "key": "test", "secret": "test",
               "region": "us-east-1", "skip_instance_cache": True, **options}
    store = MeteredStore(open_store(url, read_only=read_only, storage_options=storage))
    store.settle_conditions()  # (what a mount does once the metadata is open)
    if store.remote is not None and store.remote.probe_cleanup is not None:
        store.remote.probe_cleanup.result(timeout=30)  # the probe object is gone (tests list the bucket)
    return store


def test_a_write_is_conditional_on_the_version_read(s3, aws_env) -> None:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    from zfuse.remote_objects import WriteConflictError

    bucket = s3_tests.new_bucket(s3)
    client = s3_tests.make_bucket(s3, bucket)
    client.put_object(Bucket=bucket, Key="a/c/0", Body=b"v1")
    store = metered(s3, f"s3://{bucket}/a")
    assert store.remote is not None and store.remote.conditional  # moto honours conditions
    proto = default_buffer_prototype()
    assert sync(store.get("c/0", proto)).to_bytes() == b"v1"
    client.put_object(Bucket=bucket, Key="a/c/0", Body=b"another host's")
    with pytest.raises(WriteConflictError):
        sync(store.set("c/0", proto.buffer.from_bytes(b"v1 modified")))  # read v1, store holds another
    assert client.get_object(Bucket=bucket, Key="a/c/0")["Body"].read() == b"another host's"
    assert sync(store.get("c/0", proto)).to_bytes() == b"another host's"  # read again: its version
    sync(store.set("c/0", proto.buffer.from_bytes(b"v3")))
    # a new object: on condition that there is none
    assert sync(store.get("c/1", proto)) is None
    client.put_object(Bucket=bucket, Key="a/c/1", Body=b"made meanwhile")
    with pytest.raises(WriteConflictError):
        sync(store.set("c/1", proto.buffer.from_bytes(b"mine")))
    assert store.stats.snapshot()["store_write_conflicts"] == 2
    # no probe object left behind
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(keys) == ["a/c/0", "a/c/1"]


def test_a_range_is_read_from_the_version_its_index_came_from(s3, aws_env) -> None:
    import errno

    from zarr.abc.store import RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    from zfuse.remote_objects import ObjectChangedError

    bucket = s3_tests.new_bucket(s3)
    client = s3_tests.make_bucket(s3, bucket)
    client.put_object(Bucket=bucket, Key="a/c/0", Body=b"AAAABBBBindex")
    store = metered(s3, f"s3://{bucket}/a", read_only=True)
    proto = default_buffer_prototype()
    assert sync(store.get("c/0", proto, SuffixByteRequest(5))).to_bytes() == b"index"
    assert sync(store.get("c/0", proto, RangeByteRequest(4, 8))).to_bytes() == b"BBBB"
    client.put_object(Bucket=bucket, Key="a/c/0", Body=b"CCCCCCCCDDDDindex")
    with pytest.raises(ObjectChangedError) as info:
        sync(store.get("c/0", proto, RangeByteRequest(4, 8)))
    assert info.value.errno == errno.ESTALE and "reload" in str(info.value)
    # a reload (a new store) reads the new version
    again = metered(s3, f"s3://{bucket}/a", read_only=True)
    assert sync(again.get("c/0", proto, RangeByteRequest(8, 12))).to_bytes() == b"DDDD"


def test_the_probe_finds_a_store_that_ignores_conditions(s3, aws_env) -> None:
    from zfuse.remote_objects import ConditionsIgnoredError

    from s3server import ConditionsIgnoredProxy

    bucket = s3_tests.new_bucket(s3)
    proxy = ConditionsIgnoredProxy(s3)
    try:
        with pytest.raises(ConditionsIgnoredError, match="ignores conditional writes"):
            metered(s3, f"s3://{bucket}/a", endpoint=proxy.endpoint_url)
        accepted = metered(s3, f"s3://{bucket}/a", endpoint=proxy.endpoint_url, zfuse_last_writer_wins=True)
        assert accepted.remote is not None and not accepted.remote.conditional
        assert metered(s3, f"s3://{bucket}/a", endpoint=proxy.endpoint_url, read_only=True).remote.can_put is False
    finally:
        proxy.close()
    client = s3_tests.make_bucket(s3, bucket)
    assert "Contents" not in client.list_objects_v2(Bucket=bucket)  # the probe objects removed
