"""`mount -t fuse.zfuse` and /etc/fstab lines, through util-linux mount(8) and Debian's mount.fuse3.

mount(8) runs /sbin/mount.fuse (-> mount.fuse3) with PATH removed from the
environment; mount.fuse3 then runs `/bin/sh -c 'zfuse SOURCE MNT -o opts'`,
so `zfuse` must be on sh's default PATH (/usr/local/bin, /usr/bin, ...), as it
is after a system-wide install. The tests link the venv's `zfuse` there for
their duration (only if nothing is there yet) and remove the link afterwards.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tifffile
import zarr

import stores
from conftest import fuse_available, skip_or_fail

pytestmark = pytest.mark.mount

DEFAULT_PATH_ZFUSE = Path("/usr/local/bin/zfuse")
VENV_ZFUSE = Path(sys.executable).parent / "zfuse"
LOCK = "/tmp/zfuse-test-usr-local-bin.lock"


@pytest.fixture(scope="module")
def zfuse_on_default_path() -> Iterator[None]:
    reason = fuse_available()
    if reason:
        skip_or_fail(reason)
    if os.geteuid() != 0:
        skip_or_fail("mount -t fuse.zfuse needs root")
    for tool in ("mount", "umount"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is missing (util-linux)")
    if not Path("/sbin/mount.fuse3").exists() and shutil.which("mount.fuse3") is None:
        skip_or_fail("mount.fuse3 is missing (Debian package fuse3)")
    if not VENV_ZFUSE.exists():
        skip_or_fail(f"{VENV_ZFUSE} is missing (pip install -e .)")
    # concurrent test runs share /usr/local/bin: one at a time creates/uses/removes the link
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        created = False
        if DEFAULT_PATH_ZFUSE.is_symlink() or DEFAULT_PATH_ZFUSE.exists():
            if DEFAULT_PATH_ZFUSE.resolve() != VENV_ZFUSE.resolve():
                skip_or_fail(f"{DEFAULT_PATH_ZFUSE} is another zfuse; not replacing it")
        else:
            DEFAULT_PATH_ZFUSE.symlink_to(VENV_ZFUSE)
            created = True
        try:
            yield
        finally:
            if created:
                DEFAULT_PATH_ZFUSE.unlink()


def daemons_for(mountpoint: Path) -> list[psutil.Process]:
    """The zfuse daemon serving `mountpoint` (started by mount.fuse3, so not our child)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        # the daemon is a fork of the `zfuse` command mount.fuse3 ran (the entry point script)
        runs_zfuse = any(c == "zfuse.cli" or os.path.basename(c) == "zfuse" for c in cmd)
        if runs_zfuse and str(mountpoint) in cmd:
            out.append(p)
    return out


def cleanup(mountpoint: Path) -> None:
    """umount, then lazy fusermount3, then stop the daemon: never leave a mount behind."""
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", str(mountpoint)], capture_output=True)
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    procs = daemons_for(mountpoint)
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        p.kill()


def run_mount(*args: str) -> subprocess.CompletedProcess:
    # a plain environment: mount(8) drops PATH for its helpers anyway
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def proc_mounts_entry(mountpoint: Path) -> list[str]:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(mountpoint):
            return fields
    raise AssertionError(f"{mountpoint} not in /proc/self/mounts")


def assert_chunks_equal(mnt: Path, arr: zarr.Array) -> None:
    files = sorted(mnt.rglob("*.tiff"))
    assert len(files) == 6
    ci, cj = arr.chunks
    for f in files:
        i, j = (int(p) for p in str(f.relative_to(mnt / "c"))[: -len(".tiff")].split("/"))
        expect = np.full(arr.chunks, arr.fill_value, dtype=arr.dtype)  # edge chunks: fill outside
        part = arr[i * ci:(i + 1) * ci, j * cj:(j + 1) * cj]
        expect[: part.shape[0], : part.shape[1]] = part
        np.testing.assert_array_equal(tifffile.imread(f), expect, err_msg=str(f))


def test_mount_t_fuse_zfuse_read_only(zfuse_on_default_path: None, tmp_path: Path) -> None:
    src, mnt = tmp_path / "a.zarr", tmp_path / "mnt"
    stores.v3(src)  # (20, 30) in (8, 16) chunks: 3 x 2 files
    mnt.mkdir()
    try:
        result = run_mount("-t", "fuse.zfuse", str(src), str(mnt), "-o", "ro,allow_other,cache_size=64M")
        assert result.returncode == 0, result.stderr
        # mount(8) returned: the daemon went to the background and the mount is already live
        assert os.path.ismount(mnt)
        fields = proc_mounts_entry(mnt)
        assert fields[2] == "fuse.zfuse"
        options = fields[3].split(",")
        assert "ro" in options and "allow_other" in options, fields
        (daemon,) = daemons_for(mnt)
        # mount.fuse3 adds dev,suid; the daemon got them and the cache size, and ignores the former
        assert "cache_size=64M" in " ".join(daemon.cmdline())
        assert_chunks_equal(mnt, zarr.open_array(str(src)))
        chunk = mnt / "c" / "0" / "1.tiff"
        with pytest.raises(OSError) as e:
            open(chunk, "r+b").close()
        assert e.value.errno == errno.EROFS
        with pytest.raises(OSError) as e:
            (mnt / "c" / "new.tiff").write_bytes(b"x")
        assert e.value.errno == errno.EROFS
        # umount(8) ends the daemon
        assert subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0
        assert not os.path.ismount(mnt)
        daemon.wait(timeout=10)
    finally:
        cleanup(mnt)


def test_fstab_line_read_write(zfuse_on_default_path: None, tmp_path: Path) -> None:
    src, mnt = tmp_path / "a.zarr", tmp_path / "mnt"
    stores.v3(src, codecs="crc32c")
    mnt.mkdir()
    # the documented fstab line (systemd/README.md), in a private fstab: `mount -T FILE MNT`
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{src} {mnt} fuse.zfuse rw,allow_other,cache_size=32M,_netdev,nofail,noauto 0 0\n")
    new = (np.arange(8 * 16, dtype="uint16").reshape(8, 16) + 1000).astype("uint16")
    made = tmp_path / "new.tif"
    tifffile.imwrite(made, new)
    try:
        result = run_mount("-T", str(fstab), str(mnt))
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(mnt)
        options = proc_mounts_entry(mnt)[3].split(",")
        assert "rw" in options and "allow_other" in options, options
        shutil.copyfile(made, mnt / "c" / "1" / "0.tiff")  # cp onto an existing (interior) chunk
        np.testing.assert_array_equal(tifffile.imread(mnt / "c" / "1" / "0.tiff"), new)
        (daemon,) = daemons_for(mnt)
        assert subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0
        daemon.wait(timeout=10)
        # the write reached the store
        np.testing.assert_array_equal(zarr.open_array(str(src))[8:16, 0:16], new)
    finally:
        cleanup(mnt)


def test_mount_t_fuse_zfuse_reports_a_bad_source(zfuse_on_default_path: None, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    t0 = time.monotonic()
    try:
        result = run_mount("-t", "fuse.zfuse", str(tmp_path / "missing.zarr"), str(mnt), "-o", "ro")
        assert result.returncode != 0
        assert "missing.zarr" in result.stderr, result.stderr
        assert not os.path.ismount(mnt)
        assert time.monotonic() - t0 < 30
    finally:
        cleanup(mnt)


def test_fstab_line_with_an_s3_source(zfuse_on_default_path: None, tmp_path: Path) -> None:
    """`s3://...` as the fstab source; credentials reach zfuse through mount(8)'s environment."""
    pytest.importorskip("s3fs")
    from s3server import S3Server, make_bucket

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with S3Server(tmp_path / "s3.log") as server:
        make_bucket(server, "fstab")
        from zarr.storage import FsspecStore

        arr = zarr.create_array(FsspecStore.from_url("s3://fstab/a.zarr", storage_options=server.storage_options),
                                shape=(20, 30), chunks=(8, 16), dtype="uint16", fill_value=0)
        arr[...] = data = stores.values((20, 30), "uint16")
        fstab = tmp_path / "fstab"
        fstab.write_text(f"s3://fstab/a.zarr {mnt} fuse.zfuse "
                         f"ro,endpoint_url={server.endpoint_url},timeout=5,_netdev 0 0\n")
        try:
            result = subprocess.run(["mount", "-T", str(fstab), str(mnt)], capture_output=True, text=True,
                                    timeout=60, stdin=subprocess.DEVNULL, env=server.env())
            assert result.returncode == 0, result.stderr
            assert proc_mounts_entry(mnt)[2] == "fuse.zfuse"
            np.testing.assert_array_equal(tifffile.imread(mnt / "c" / "1" / "0.tiff"), data[8:16, 0:16])
        finally:
            cleanup(mnt)


def test_mount_t_fuse_zfuse_log_file_and_fsname(zfuse_on_default_path: None, tmp_path: Path) -> None:
    """-o log_file= keeps a background daemon's log in a file; /proc/mounts names the source."""
    src, mnt, log = tmp_path / "a.zarr", tmp_path / "mnt", tmp_path / "zfuse.log"
    stores.v3(src)
    mnt.mkdir()
    try:
        result = run_mount("-t", "fuse.zfuse", str(src), str(mnt), "-o", f"ro,log_file={log}")
        assert result.returncode == 0, result.stderr
        fields = proc_mounts_entry(mnt)
        assert fields[:3] == [str(src), str(mnt), "fuse.zfuse"]
        assert f"INFO zfuse.daemon: mounted {src} at {mnt}" in log.read_text()
        (daemon,) = daemons_for(mnt)
        assert daemon.cwd() == "/"
    finally:
        cleanup(mnt)
    assert f"INFO zfuse.daemon: unmounted {mnt}" in log.read_text()
