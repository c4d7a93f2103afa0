"""Regression tests for bugs found by adversarial review (each names what broke)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

import stores

pytestmark = pytest.mark.mount


def tiff_bytes(tmp_path: Path, values: np.ndarray, name: str = "t.tif") -> bytes:
    tifffile.imwrite(tmp_path / name, values)
    return (tmp_path / name).read_bytes()


def test_writes_during_a_commit_are_not_lost(tmp_path: Path, mount) -> None:
    """[write-10] a second writer's close commits while the first keeps writing: nothing is lost."""
    src = tmp_path / "big.zarr"
    zarr.create_array(str(src), shape=(2000, 4000), chunks=(2000, 2000), dtype="uint8", fill_value=0)[...] = 1
    m = mount(src)
    path = m.path / "c" / "0" / "0.tiff"
    data = tiff_bytes(tmp_path, np.full((2000, 2000), 4, "uint8"))
    header = len(data) - 2000 * 2000
    for _ in range(3):
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, data)
        other = os.open(path, os.O_RDWR)  # shares the open file's buffer
        closer = threading.Thread(target=os.close, args=(other,))
        closer.start()  # its close commits while the first writer goes on
        os.pwrite(fd, b"\x07" * 2000, header)
        closer.join()
        os.close(fd)
        arr = zarr.open_array(str(src))
        assert (arr[0, :2000] == 7).all() and (arr[1, :2000] == 4).all()


def test_v2_fortran_order_chunks(tmp_path: Path, mount) -> None:
    """[read-1] [write-1] v2 arrays with order F read and write in the right orientation."""
    src = tmp_path / "f.zarr"
    a = zarr.create_array(str(src), shape=(8, 10), chunks=(4, 5), dtype="<i2", zarr_format=2, order="F",
                          fill_value=0)
    a[...] = np.arange(80, dtype="<i2").reshape(8, 10)
    m = mount(src)
    np.testing.assert_array_equal(tifffile.imread(m.path / "0.0.tiff"), a[0:4, 0:5])
    np.testing.assert_array_equal(zarr.open_array(str(m.path))[...], a[...])
    new = np.arange(20, dtype="<i2").reshape(4, 5) + 500
    (m.path / "1.1.tiff").write_bytes(tiff_bytes(tmp_path, new))
    np.testing.assert_array_equal(zarr.open_array(str(src))[4:8, 5:10], new)


def test_fsync_in_the_middle_of_a_write(tmp_path: Path, mount) -> None:
    """[write-1] fsync (and O_SYNC writes) of a file still being written succeed; close stores it."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    values = stores.values((8, 16), "uint16", seed=31)
    data = tiff_bytes(tmp_path, values)
    fd = os.open(m.path / "c" / "0" / "1.tiff", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, data[:100])
    os.fsync(fd)
    os.write(fd, data[100:])
    os.fsync(fd)
    assert os.fstat(fd).st_size == len(data)  # the writer's own bytes until it closes
    os.close(fd)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 16:30], values[:, :14])
    r = subprocess.run(["dd", f"if={tmp_path / 't.tif'}", f"of={m.path / 'c' / '1' / '1.tiff'}", "bs=128",
                        "oflag=sync", "status=none"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_other_descriptors_closing_mid_write(tmp_path: Path, mount) -> None:
    """[write-2] a reader's close, or a shell group's first command, do not fail a write in progress."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    values = stores.values((8, 16), "uint16", seed=32)
    data = tiff_bytes(tmp_path, values)
    target = m.path / "c" / "1" / "0.tiff"
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, data[:100])
    os.close(os.open(target, os.O_RDONLY))  # a reader peeks: no commit, no error
    os.write(fd, data[100:])
    os.close(fd)
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], values)
    script = f"{{ head -c 100 {tmp_path / 't.tif'}; tail -c +101 {tmp_path / 't.tif'}; }} > {m.path}/c/2/0.tiff"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    # head's close of the shared descriptor comes before the file is whole: EINVAL there,
    # but the last close stores the complete file
    np.testing.assert_array_equal(stores.open_any(src)[16:20, 0:16], values[:4])
    assert "tail" not in r.stderr


def test_rewrite_right_after_a_failed_create(tmp_path: Path, mount) -> None:
    """[write-5] after a refused new file, writing a good one at once works (no stale dentry)."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    target = m.path / "c" / "2" / "0.tiff"
    target.unlink()
    (tmp_path / "bad.tif").write_bytes(b"not a tiff")
    with pytest.raises(OSError):
        shutil.copyfile(tmp_path / "bad.tif", target)
    values = stores.values((8, 16), "uint16", seed=33)
    tifffile.imwrite(target, values)
    np.testing.assert_array_equal(stores.open_any(src)[16:20, 0:16], values[:4])


def test_unlinked_while_open(tmp_path: Path, mount) -> None:
    """[ns-4] a writer's close after unlink stores nothing; a reader keeps reading and fstat works."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    m = mount(src)
    target = m.path / "c" / "0" / "0.tiff"
    reader = open(m.path / "c" / "0" / "1.tiff", "rb")  # noqa: SIM115 - kept open across unlink
    before = reader.read()
    reader.seek(0)
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, tiff_bytes(tmp_path, stores.values((8, 16), "uint16", seed=34)))
    target.unlink()
    os.close(fd)
    assert not target.exists()
    (m.path / "c" / "0" / "1.tiff").unlink()
    m.settle()  # both deleted from the store, their inodes invalidated
    assert not (src / "c" / "0" / "0").exists()
    assert os.fstat(reader.fileno()).st_size == len(before)
    assert reader.read() == before
    reader.close()
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], data[8:16, 0:16])


def test_reader_survives_atomic_replace(tmp_path: Path, mount) -> None:
    """[ns-2] a reader of a chunk replaced by rename keeps the bytes it opened."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    target = m.path / "c" / "1" / "1.tiff"
    original = target.read_bytes()
    with open(target, "rb") as reader:
        head = reader.read(64)
        tifffile.imwrite(m.path / "c" / "1" / ".1.tiff.tmp", stores.values((8, 16), "uint16", seed=35))
        os.rename(m.path / "c" / "1" / ".1.tiff.tmp", target)
        time.sleep(0.5)
        rest = reader.read()
        assert os.fstat(reader.fileno()).st_size == len(original)
    assert head + rest == original
    assert target.read_bytes() != original  # new openers see the replacement


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


@pytest.mark.parametrize("compressed", [False, True])
def test_open_file_across_an_outside_rewrite_and_sighup(tmp_path: Path, mount, compressed: bool) -> None:
    """[cons-2] after SIGHUP an open file reads the store as it is now, never old byte ranges of a rewritten shard."""
    import signal

    from zarr.codecs import ZstdCodec

    src = tmp_path / "s.zarr"
    z = zarr.create_array(str(src), shape=(16, 32), shards=(16, 32), chunks=(8, 16), dtype="uint16",
                          compressors=[ZstdCodec(level=1)] if compressed else None, fill_value=0)
    z[...] = 5
    m = mount(src)
    fd = os.open(m.path / "c" / "1" / "0.tiff", os.O_RDONLY)
    try:
        first = os.pread(fd, 1 << 20, 0)
        z[0:8, 0:16] = 0  # an outside writer drops chunk (0, 0): offsets in the shard move
        z[8:16, 0:16] = 9
        m.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "SIGHUP" not in m.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        again = os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)
    header = len(first) - 8 * 16 * 2
    assert np.frombuffer(first[header:], "<u2").tolist() == [5] * 128
    assert np.frombuffer(again[header:], "<u2").tolist() == [9] * 128
    assert (tifffile.imread(m.path / "c" / "1" / "0.tiff") == 9).all()
    assert "Traceback" not in m.log()
