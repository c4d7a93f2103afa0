"""Refusals and failures on real mounts: which errno each gets, and that nothing is lost.

Names and places that cannot hold chunks, metadata that cannot be written, a
store that is full, read-only or changed under the mount."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

from zfuse.testing import assert_no_traceback, errno_of, tiff_bytes, wait_until, write_file

import stores

pytestmark = pytest.mark.mount


def test_namespace_outside_arrays_is_refused(tmp_path: Path, mount) -> None:
    """[ns-7] [tree-5] files and directories can only be made inside arrays (as chunk
    files, key directories or scratch files); groups and arrays cannot be removed
    or renamed; links and nodes fail with EPERM; zarr.json cannot be opened for writing."""
    src = tmp_path / "g.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("one", shape=(100,), chunks=(30,), dtype="int32", fill_value=0)[:] = np.arange(100)
    g.create_array("str", shape=(3,), chunks=(3,), dtype=str)[:] = ["a", "b", "c"]
    g.create_group("sub").create_array("x", shape=(4, 4), chunks=(2, 2), dtype="uint8", fill_value=0)[:] = 3
    m = mount(src)
    p = m.path
    tif = tiff_bytes(np.ones((30,), "i4"))
    for target in [p / "x", p / "x.tiff", p / "sub" / "x.tiff", p / "str" / "c", p / "str" / "x.tiff"]:
        assert write_file(target, tif) == "EPERM", target
    for d in [p / "newdir", p / "sub" / "c", p / "one" / "c" / "5", p / "one" / "d"]:
        assert errno_of(os.mkdir, d) == "EPERM", d
    assert errno_of(os.rmdir, p / "sub") == "ENOTEMPTY"
    assert errno_of(os.rmdir, p / "one" / "c") == "ENOTEMPTY"
    assert errno_of(os.rename, p / "one", p / "one2") == "EPERM"
    assert errno_of(os.rename, p / "sub" / "x", p / "sub" / "y") == "EPERM"
    assert errno_of(os.symlink, "0.tiff", p / "one" / "c" / "l") == "EPERM"
    assert errno_of(os.link, p / "one" / "c" / "0.tiff", p / "one" / "c" / "h") == "EPERM"
    assert errno_of(os.mkfifo, p / "one" / "c" / "f") == "EPERM"
    for meta in [p / "zarr.json", p / "one" / "zarr.json"]:
        assert errno_of(os.open, meta, os.O_WRONLY) == "EACCES"
        assert subprocess.run(["truncate", "-s", "0", str(meta)], capture_output=True).returncode == 1
        assert errno_of(os.unlink, meta) == "EPERM"
    assert json.loads((p / "str" / "zarr.json").read_text())["attributes"]["zfuse"]["unsupported"]
    # chmod/chown/utimes on chunks succeed and change nothing stored
    c0 = p / "one" / "c" / "0.tiff"
    os.chmod(c0, 0o600)
    os.chown(c0, os.getuid(), os.getgid())
    os.utime(c0, (1e9, 1e9))
    np.testing.assert_array_equal(zarr.open_array(str(src / "one"))[:30], np.arange(30))
    assert_no_traceback(m)


def test_store_errors_give_errnos(tmp_path: Path, mount) -> None:
    """[write-8] a full store gives ENOSPC at close, a read-only store EROFS at open and
    at unlink, or when it turned read-only after an unlink, a journaled failed deletion;
    the stored chunk is unchanged and no temporary file is left."""
    small = tmp_path / "small"
    small.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(small)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        src = small / "s.zarr"
        a = zarr.create_array(str(src), shape=(64, 256), chunks=(64, 128), dtype="uint8", fill_value=0,
                              compressors=None)
        a[:, :128] = 1
        m = mount(src)
        filler = small / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        os.close(fd)
        tif = tiff_bytes(np.full((64, 128), 9, "u1"))
        assert write_file(m.path / "c" / "0" / "0.tiff", tif) == "ENOSPC"
        assert write_file(m.path / "c" / "0" / "1.tiff", tif) == "ENOSPC"
        # .zfuse/errors names the store key (it said only "flush: No space left on device")
        assert "flush [store key c/0/1]: No space left on device (ENOSPC)" in m.errors(), m.errors()
        filler.unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(small)], check=True)
        assert write_file(m.path / "c" / "0" / "0.tiff", tif) == "EROFS"
        # [write-14] an rm the store would refuse fails at once; the chunk stays
        assert errno_of(os.unlink, m.path / "c" / "0" / "0.tiff") == "EROFS"
        assert (m.path / "c" / "0" / "0.tiff").exists()
        # rm hides the chunk at once; a store deletion after the replace window that fails
        # (read-only meanwhile) is journaled, and the chunk is shown again
        subprocess.run(["mount", "-o", "remount,rw", str(small)], check=True)
        assert errno_of(os.unlink, m.path / "c" / "0" / "0.tiff") == "ok"
        subprocess.run(["mount", "-o", "remount,ro", str(small)], check=True)
        m.settle()
        wait_until(lambda: (m.path / "c" / "0" / "0.tiff").exists(), what="the chunk shown again")
        assert "deleting c/0/0 from the store failed" in m.errors()
        subprocess.run(["mount", "-o", "remount,rw", str(small)], check=True)
        assert (a[:, :128] == 1).all() and (a[:, 128:] == 0).all()
        assert sorted(os.listdir(src / "c" / "0")) == ["0"]
        assert write_file(m.path / "c" / "0" / "0.tiff", tif) == "ok"
        assert (a[:, :128] == 9).all()
        m.unmount()
        assert_no_traceback(m)
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_names_that_must_not_be_taken(tmp_path: Path, mount) -> None:
    """[ns-3] [ns-7] zarr.json, .zfuse and chunk-to-backup renames are refused; long names too."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    (m.path / "c" / "0" / "t.json").write_text("{}")
    cases = [
        (lambda: os.rename(m.path / "c" / "0" / "t.json", m.path / "zarr.json"), (errno.EPERM,)),
        (lambda: os.rename(m.path / "c" / "0" / "0.tiff", m.path / "c" / "0" / "0.tiff.bak"), (errno.EPERM,)),
        (lambda: open(m.path / ".zfuse" / "junk", "w").close(), (errno.EPERM, errno.EACCES)),
        (lambda: open(m.path / ".zfuse" / "stats", "w").close(), (errno.EACCES,)),
        (lambda: os.truncate(m.path / "zarr.json", 0), (errno.EACCES,)),
        (lambda: open(m.path / "c" / "0" / ("x" * 300), "w").close(), (errno.ENAMETOOLONG,)),
        (lambda: os.rename(m.path / "c" / "0", m.path / "c" / "1" / "x"), (errno.EPERM,)),
    ]
    for attempt, codes in cases:
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno in codes, (e.value, codes)
    assert (m.path / "c" / "0" / "0.tiff").exists()
    assert not (m.path / "c" / "00").exists()
    r = subprocess.run(["mv", str(m.path / "c" / "0" / "0.tiff"), str(m.path / "c" / "2" / "1.tiff")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "rename flags" not in m.log()


def test_store_deleted_under_the_mount(tmp_path: Path, mount) -> None:
    """[read-5] a listed chunk that vanished from the store is EIO, not fill values."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    os.listdir(m.path / "c" / "0")
    (src / "c" / "0" / "1").unlink()
    with pytest.raises(OSError) as e:
        (m.path / "c" / "0" / "1.tiff").read_bytes()
    assert e.value.errno == errno.EIO
