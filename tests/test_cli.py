"""The command line: background mounts, clear failures, `zfuse info`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

import stores
from conftest import fuse_available, skip_or_fail

ZFUSE = [sys.executable, "-m", "zfuse.cli"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ZFUSE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.mount
def test_background_mount_returns_once_live_and_umount(tmp_path: Path) -> None:
    if reason := fuse_available():
        skip_or_fail(reason)
    stores.v3(tmp_path / "a.zarr")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run("mount", str(tmp_path / "a.zarr"), str(mnt))
    try:
        assert r.returncode == 0, r.stderr
        assert os.path.ismount(mnt)  # live when the command returns
        assert (mnt / "c" / "0" / "0.tiff").is_file()
        busy = run("mount", str(tmp_path / "a.zarr"), str(mnt))
        assert busy.returncode != 0 and "busy" in busy.stderr
    finally:
        u = run("umount", str(mnt))
    assert u.returncode == 0, u.stderr
    assert not os.path.ismount(mnt)


@pytest.mark.parametrize("case", ["missing", "not-zarr", "no-mountpoint"])
def test_mount_failures_are_clear(tmp_path: Path, case: str) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    source = tmp_path / "a.zarr"
    if case == "missing":
        expect = "no such file"
    elif case == "not-zarr":
        source.mkdir()
        (source / "hello.txt").write_text("hi")
        expect = "cannot open"
    else:
        stores.v3(source)
        mnt = tmp_path / "nowhere"
        expect = "not a directory"
    r = run("mount", str(source), str(mnt))
    assert r.returncode != 0
    assert expect in r.stderr.lower(), r.stderr
    assert not os.path.ismount(mnt)


def test_info_describes_arrays(tmp_path: Path) -> None:
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    stores.sharded(tmp_path / "g.zarr" / "sharded")
    s = root.create_array("names", shape=(4,), chunks=(2,), dtype=str)
    s[...] = ["a", "b", "c", "d"]
    stores.concat_parts(tmp_path / "g.zarr" / "parts")
    r = run("info", str(tmp_path / "g.zarr"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "array sharded" in out and "inner chunks of shards (16, 32)" in out
    assert "chunks (8, 16)" in out and "TIFF: header" in out
    assert "not shown as TIFF" in out
    assert "concat-parts" in out
    report = json.loads(run("info", "--json", str(tmp_path / "g.zarr")).stdout)
    by_path = {a["path"]: a for a in report["arrays"]}
    assert by_path["sharded"]["files"] == 6  # 20x30 in inner chunks of 8x16: a 3x2 grid
    assert by_path["names"]["shown"] is False and by_path["names"]["why_not"]


@pytest.mark.mount
def test_verbose_logs_every_operation(tmp_path: Path, mount) -> None:
    stores.v3(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr", "-v")
    os.listdir(m.path / "c" / "0")
    (m.path / "c" / "0" / "0.tiff").read_bytes()
    log = m.log()
    for op in ("lookup(2, '0')", "opendir(", "readdir(", "open(", "read(", "flush("):
        assert op in log, op


@pytest.mark.mount
def test_missing_dev_fuse_is_a_clear_error(tmp_path: Path) -> None:
    """In a private mount namespace whose /dev has no fuse device, mount fails clearly."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "mnt").mkdir()
    script = (f"mount -t tmpfs tmpfs /dev && exec {sys.executable} -m zfuse.cli mount "
              f"{tmp_path / 'a.zarr'} {tmp_path / 'mnt'}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "/dev/fuse is missing" in r.stderr, r.stderr
