"""Refusals nobody can miss, on real mounts: a file that can never be the chunk fails
the write that shows it (tifffile, which ignores close()'s error, raises), and a file
closed incomplete is named in `.zfuse/errors` at its close."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile

from zfuse.testing import snapshot

import stores

pytestmark = pytest.mark.mount


def test_tifffile_of_the_wrong_dtype_raises_at_write(tmp_path: Path, mount) -> None:
    """[write-13] tifffile.imwrite of float32 into a uint16 chunk raises, the chunk is
    unchanged and one line of `.zfuse/errors` says why."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(3, 8, 16), chunks=(3, 8, 16))
    m = mount(src)
    before = snapshot(src)
    target = m.path / "c" / "0" / "0" / "0.tiff"
    with pytest.raises(OSError):
        tifffile.imwrite(target, np.ones((3, 8, 16), "float32"), photometric="minisblack")
    assert snapshot(src) == before
    np.testing.assert_array_equal(tifffile.imread(target), data)
    lines = [line for line in m.errors().splitlines() if "wrong dtype" in line]
    assert len(lines) == 1 and "float32" in lines[0] and "uint16" in lines[0], m.errors()


def test_a_wrong_plane_size_fails_cp(tmp_path: Path, mount) -> None:
    """[write-13] cp of a TIFF whose planes are not the chunk's fails with an error."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(8, 16), chunks=(8, 16))
    m = mount(src)
    before = snapshot(src)
    small = tmp_path / "small.tif"
    tifffile.imwrite(small, np.ones((4, 4), "uint16"))
    with pytest.raises(OSError):
        shutil.copyfile(small, m.path / "c" / "0" / "0.tiff")
    assert snapshot(src) == before
    assert "wrong shape" in m.errors()


def test_fewer_planes_than_the_chunk_are_named_at_close(tmp_path: Path, mount) -> None:
    """[write-2] [write-13] a complete TIFF of 2 of the chunk's 3 planes: close succeeds (Bio-Formats
    closes and reopens), the file is pending, and `.zfuse/errors` names it and why at once."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(3, 8, 16), chunks=(3, 8, 16))
    m = mount(src)
    before = snapshot(src)
    two = tmp_path / "two.tif"
    tifffile.imwrite(two, np.ones((2, 8, 16), "uint16"), photometric="minisblack")
    shutil.copyfile(two, m.path / "c" / "0" / "0" / "0.tiff")
    assert snapshot(src) == before
    (line,) = [line for line in m.errors().splitlines() if "pending" in line]
    assert "c/0/0/0.tiff" in line and "2 of 3 image plane(s)" in line, line
    # and `zfuse status` shows it among the mount's recent errors
    shown = subprocess.run([sys.executable, "-m", "zfuse.cli", "status", str(m.path)],
                           capture_output=True, text=True, timeout=60).stdout
    assert any(s.startswith("  recent") and "2 of 3 image plane(s)" in s for s in shown.splitlines()), shown
    report = json.loads(subprocess.run([sys.executable, "-m", "zfuse.cli", "status", "--json", str(m.path)],
                                       capture_output=True, text=True, timeout=60).stdout)
    assert report[0]["recent_errors"][-1] == line


def test_a_store_on_a_read_only_filesystem_refuses_at_once(tmp_path: Path, mount) -> None:
    """[write-14] a read-write mount of a store on a read-only filesystem (a read-only
    bind mount): the mount warns (the log, which `zfuse mount` prints); `rm` of a chunk
    fails EROFS at once and the chunk stays; `cp` onto a chunk fails at its open, before
    any byte is copied; the store is unchanged."""
    import errno
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root: a read-only bind mount")
    src, view = tmp_path / "a.zarr", tmp_path / "ro" / "a.zarr"
    stores.v3(src)
    view.mkdir(parents=True)
    for args in (["mount", "--bind", str(src), str(view)], ["mount", "-o", "remount,bind,ro", str(view)]):
        made = subprocess.run(args, capture_output=True, text=True)
        if made.returncode != 0:
            subprocess.run(["umount", "-l", str(view)], capture_output=True)
            pytest.skip(f"no read-only bind mount here: {made.stderr.strip()}")
    try:
        before = snapshot(src)
        m = mount(view)
        assert "is on a read-only filesystem: writes and deletions through the mount fail with EROFS" in m.log()
        chunk = m.path / "c" / "0" / "0.tiff"
        with pytest.raises(OSError) as e:
            chunk.unlink()
        assert e.value.errno == errno.EROFS
        assert chunk.exists() and "0.tiff" in os.listdir(m.path / "c" / "0")
        other = tmp_path / "x.tiff"
        other.write_bytes(chunk.read_bytes())
        copied = subprocess.run(["cp", str(other), str(chunk)], capture_output=True, text=True)
        assert copied.returncode != 0 and "Read-only file system" in copied.stderr
        assert snapshot(src) == before
        m.unmount()
    finally:
        subprocess.run(["umount", "-l", str(view)], check=True)
