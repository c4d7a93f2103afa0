"""Hostile users and legacy tools on real mounts: odd names, odd syscalls, odd arrays.

Every test here passed when written; each guards a behaviour a review found
working (the failures it found were reported, not committed as tests).
"""

from __future__ import annotations

import errno
import io
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr
from zarr.codecs import BytesCodec, TransposeCodec

from zfuse.testing import wait_until

import stores

pytestmark = pytest.mark.mount


def tiff_bytes(values: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    tifffile.imwrite(buf, values, **kw)
    return buf.getvalue()


def errno_of(fn, *args) -> str:
    """'ok' or the errno name an OSError carries."""
    try:
        fn(*args)
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


def write_file(path: Path, data: bytes) -> str:
    def go() -> None:
        with open(path, "wb") as f:
            f.write(data)

    return errno_of(go)


def no_traceback(m) -> None:
    assert "Traceback" not in m.log(), m.log()


def test_odd_names_are_scratch_or_refused(tmp_path: Path, mount) -> None:
    """[ns-1] [write-7] names that are not canonical chunk keys never reach the store;
    canonical-looking names outside the grid (or zero-padded) are refused with EINVAL."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    before = {p.relative_to(src) for p in src.rglob("*")}
    m = mount(src)
    row = m.path / "c" / "0"
    tif = tiff_bytes(np.ones((8, 16), "u2"))
    scratch = ["+1.tiff", " 1.tiff", "1.tiff.tiff", "1.TIFF", "1\n.tiff", "-1.tiff", "1.tif",
               "a b$`\\x.tiff", "é.tiff", "a" * 255]
    for name in scratch:
        assert write_file(row / name, tif) == "ok", name
    listed = set(os.listdir(row))
    assert set(scratch) <= listed
    for name in scratch:
        assert (row / name).read_bytes() == tif
    assert write_file(row / "01.tiff", tif) == "EINVAL"
    assert write_file(row / "99.tiff", tif) == "EINVAL"
    assert write_file(m.path / "c" / "7" / "0.tiff", tif) == "ENOENT"  # no such row directory
    assert {p.relative_to(src) for p in src.rglob("*")} == before  # nothing reached the store
    for name in scratch:
        (row / name).unlink()
    assert sorted(os.listdir(row)) == ["0.tiff", "1.tiff"]
    no_traceback(m)


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
    no_traceback(m)


def test_append_truncate_ftruncate_and_limits(tmp_path: Path, mount) -> None:
    """[write-1] [write-3] [write-6] [ns-5] O_APPEND, O_RDWR read-before-write, truncate
    to larger sizes, ftruncate on an open handle, and EFBIG past the size limit."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    m = mount(src)
    arr = zarr.open_array(str(src))
    p = m.path / "c" / "0" / "0.tiff"
    orig = p.read_bytes()
    # O_RDWR without O_TRUNC: reads the file as it is before any write
    fd = os.open(p, os.O_RDWR)
    assert os.read(fd, len(orig) + 10) == orig
    os.close(fd)
    # appending junk after a valid TIFF: still a valid TIFF, values unchanged
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"junk")
    os.close(fd)
    np.testing.assert_array_equal(arr[0:8, 0:16], data[0:8, 0:16])
    # a whole file written with O_APPEND|O_TRUNC in pieces
    new = np.full((8, 16), 9, "u2")
    tif = tiff_bytes(new)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_TRUNC)
    os.write(fd, tif[:50])
    os.write(fd, tif[50:])
    os.close(fd)
    np.testing.assert_array_equal(arr[0:8, 0:16], new)
    # truncate to a larger size leaves a valid TIFF: accepted, values unchanged
    os.truncate(p, 100_000)
    np.testing.assert_array_equal(arr[0:8, 0:16], new)
    assert os.path.getsize(p) == len(orig)
    assert errno_of(os.truncate, p, 0) == "EINVAL"
    assert errno_of(os.truncate, p, 1 << 40) == "EFBIG"
    np.testing.assert_array_equal(arr[0:8, 0:16], new)
    # ftruncate on an open handle, then write: committed at close only
    new2 = np.full((8, 16), 11, "u2")
    fd = os.open(p, os.O_RDWR)
    os.ftruncate(fd, 0)
    np.testing.assert_array_equal(arr[0:8, 0:16], new)
    os.pwrite(fd, tiff_bytes(new2), 0)
    os.close(fd)
    np.testing.assert_array_equal(arr[0:8, 0:16], new2)
    # a write far past the limit: EFBIG, nothing stored
    fd = os.open(p, os.O_WRONLY)
    assert errno_of(os.pwrite, fd, b"x", 20 << 20) == "EFBIG"
    os.close(fd)
    np.testing.assert_array_equal(arr[0:8, 0:16], new2)
    no_traceback(m)


def test_dd_odd_block_sizes_and_direct_io(tmp_path: Path, mount) -> None:
    """[write-3] dd conv=notrunc with a 3-byte block size and a byte seek patches pixels;
    O_DIRECT reads and whole-file writes work."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    arr = zarr.open_array(str(src))
    p = m.path / "c" / "1" / "0.tiff"
    hdr = os.path.getsize(p) - 8 * 16 * 2
    patch = tmp_path / "patch.bin"
    patch.write_bytes(np.arange(100, 113, dtype="<u2").tobytes())  # 13 pixels, 26 bytes
    subprocess.run(["dd", f"if={patch}", f"of={p}", "bs=3", "conv=notrunc", "oflag=seek_bytes",
                    f"seek={hdr + 10}"], check=True, capture_output=True)
    np.testing.assert_array_equal(arr[8, 5:16], np.arange(100, 111))
    np.testing.assert_array_equal(arr[9, 0:2], [111, 112])
    np.testing.assert_array_equal(tifffile.imread(p)[0, 5:16], np.arange(100, 111))
    whole = tmp_path / "w.tiff"
    tifffile.imwrite(whole, np.full((8, 16), 21, "u2"))
    subprocess.run(["dd", f"if={whole}", f"of={p}", "bs=4096", "oflag=direct"], check=True, capture_output=True)
    np.testing.assert_array_equal(arr[8:16, 0:16], 21)
    out = subprocess.run(["dd", f"if={p}", "bs=4096", "iflag=direct"], check=True, capture_output=True).stdout
    assert out == p.read_bytes()
    no_traceback(m)


def test_mmap_read_and_write(tmp_path: Path, mount) -> None:
    """[write-3] [write-4] mmap reads give the file's bytes; pixels patched through a shared
    mapping reach the store, with msync or with the fd closed before munmap (numpy.memmap)."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    arr = zarr.open_array(str(src))
    p = m.path / "c" / "1" / "0.tiff"
    size = os.path.getsize(p)
    hdr = size - 8 * 16 * 2
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert mm[:] == p.read_bytes()
    fd = os.open(p, os.O_RDWR)
    mm = mmap.mmap(fd, size)
    mm[hdr : hdr + 2] = (4242).to_bytes(2, "little")
    mm.flush()
    mm.close()
    os.close(fd)
    assert arr[8, 0] == 4242
    fd = os.open(p, os.O_RDWR)
    mm = mmap.mmap(fd, size)
    os.close(fd)
    mm[hdr + 2 : hdr + 4] = (555).to_bytes(2, "little")
    mm.close()
    assert arr[8, 1] == 555
    mem = np.memmap(p, dtype="<u2", mode="r+", offset=hdr, shape=(8, 16))
    mem[1, 0] = 777
    mem.flush()
    del mem
    assert arr[9, 0] == 777
    assert tifffile.imread(p)[0, :2].tolist() == [4242, 555]
    no_traceback(m)


def test_unusual_arrays_round_trip(tmp_path: Path, mount) -> None:
    """[read-1] [write-1] [write-5] 1-D, 4-D, 0-d, NaN-filled, bool and sharded arrays
    read as their values and take writes (cropped edge shapes only on edge chunks)."""
    src = tmp_path / "g.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("one", shape=(100,), chunks=(30,), dtype="int32", fill_value=0)[:] = np.arange(100)
    four = np.random.default_rng(0).random((3, 4, 10, 12)).astype("f4")
    g.create_array("four", shape=four.shape, chunks=(2, 3, 5, 8), dtype="float32", fill_value=0)[:] = four
    g.create_array("zero", shape=(), chunks=(), dtype="uint8", fill_value=0)[()] = 7
    nan = g.create_array("nan", shape=(10, 10), chunks=(4, 4), dtype="float64", fill_value=float("nan"))
    nan[:4, :4] = 1.5
    g.create_array("bool", shape=(10, 10), chunks=(4, 4), dtype="bool", fill_value=False)[:] = np.eye(10, dtype=bool)
    g.create_array("sh", shape=(20, 30), shards=(16, 32), chunks=(8, 16), dtype="uint16", fill_value=0)[:] = 5
    m = mount(src)
    p = m.path
    # reads
    for name in ["one", "four", "zero", "nan", "bool", "sh"]:
        a = g[name]
        for f in (p / name).rglob("*.tiff"):
            assert f.stat().st_size == len(f.read_bytes())
            key = f.relative_to(p / name).as_posix()[: -len(".tiff")]
            coords = tuple(int(x) for x in key.split("/")[1:])
            sl = tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, a.chunks, strict=True))
            want = a[sl]
            got = tifffile.imread(f).reshape(a.chunks)[tuple(slice(0, s) for s in want.shape)]
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {key}")
    assert sorted(os.listdir(p / "nan" / "c")) == ["0"]  # only stored chunks are listed
    # writes
    assert write_file(p / "zero" / "c.tiff", tiff_bytes(np.array([[9]], "u1"))) == "ok"
    assert g["zero"][()] == 9
    assert write_file(p / "one" / "c" / "1.tiff", tiff_bytes(-np.arange(30, dtype="i4"))) == "ok"
    np.testing.assert_array_equal(g["one"][30:60], -np.arange(30))
    assert write_file(p / "one" / "c" / "3.tiff", tiff_bytes(np.full(10, 5, "i4"))) == "ok"  # edge, cropped
    np.testing.assert_array_equal(g["one"][90:], 5)
    assert write_file(p / "one" / "c" / "1.tiff", tiff_bytes(np.full(10, 5, "i4"))) == "EINVAL"  # not an edge
    np.testing.assert_array_equal(g["one"][30:60], -np.arange(30))
    assert write_file(p / "bool" / "c" / "0" / "1.tiff", tiff_bytes(np.ones((4, 4), bool))) == "ok"
    assert g["bool"][0:4, 4:8].all()
    assert write_file(p / "bool" / "c" / "0" / "1.tiff", tiff_bytes(np.zeros((4, 4), "u1"))) == "ok"
    assert not g["bool"][0:4, 4:8].any()
    assert (p / "bool" / "c" / "0" / "1.tiff").exists()  # an all-fill chunk written stays listed
    assert write_file(p / "bool" / "c" / "0" / "1.tiff", tiff_bytes(np.full((4, 4), 2, "u1"))) == "EINVAL"
    assert write_file(p / "nan" / "c" / "1" / "1.tiff", tiff_bytes(np.full((4, 4), np.nan))) == "ok"
    assert np.isnan(g["nan"][4:8, 4:8]).all() and (src / "nan" / "c" / "1" / "1").exists()
    x = np.random.default_rng(1).random((2, 3, 5, 8)).astype("f4")
    assert write_file(p / "four" / "c" / "0" / "0" / "0" / "0.tiff", tiff_bytes(x, imagej=True)) == "ok"
    np.testing.assert_array_equal(g["four"][0:2, 0:3, 0:5, 0:8], x)
    assert write_file(p / "four" / "c" / "0" / "0" / "0" / "0.tiff",
                      tiff_bytes(x * 2, byteorder=">", bigtiff=True)) == "ok"
    np.testing.assert_array_equal(g["four"][0:2, 0:3, 0:5, 0:8], x * 2)
    assert write_file(p / "sh" / "c" / "2" / "1.tiff", tiff_bytes(np.full((8, 16), 3, "u2"))) == "ok"
    assert g["sh"][16:20, 16:30].min() == 3 and g["sh"][0, 0] == 5
    assert write_file(p / "sh" / "c" / "2" / "1.tiff", tiff_bytes(np.full((8, 16), 3, "f8"))) == "EINVAL"
    no_traceback(m)


def test_transpose_big_endian_and_v2_filters(tmp_path: Path, mount) -> None:
    """[read-1] [read-6] [write-1] a v3 array with a transpose filter and a big-endian
    bytes codec, and a v2 array with a Delta filter, read, write and open through the mount."""
    import numcodecs

    tr = tmp_path / "tr.zarr"
    a = zarr.create_array(str(tr), shape=(10, 12), chunks=(4, 5), dtype="i2", fill_value=0,
                          serializer=BytesCodec(endian="big"), filters=[TransposeCodec(order=(1, 0))],
                          compressors=None)
    a[:] = np.arange(120).reshape(10, 12)
    dl = tmp_path / "dl.zarr"
    b = zarr.create_array(str(dl), shape=(10, 12), chunks=(4, 5), dtype="i4", zarr_format=2,
                          filters=[numcodecs.Delta(dtype="i4")], fill_value=0)
    b[:] = np.arange(120).reshape(10, 12)
    for src, key in [(tr, "c/1/1"), (dl, "1.1")]:
        m = mount(src)
        z = zarr.open_array(str(src))
        np.testing.assert_array_equal(tifffile.imread(m.path / f"{key}.tiff"), z[4:8, 5:10])
        np.testing.assert_array_equal(zarr.open_array(str(m.path))[:], z[:])
        assert write_file(m.path / f"{key}.tiff", tiff_bytes(np.arange(20, dtype=z.dtype).reshape(4, 5))) == "ok"
        np.testing.assert_array_equal(z[4:8, 5:10], np.arange(20).reshape(4, 5))
        no_traceback(m)


def test_chunk_larger_than_64_mib(tmp_path: Path, mount) -> None:
    """[read-1] [write-1] a 72 MB chunk reads byte-exact and takes a compressed TIFF and a
    plain one; the daemon's resident memory stays within a few chunk sizes."""
    src = tmp_path / "big.zarr"
    a = zarr.create_array(str(src), shape=(9000, 16000), chunks=(9000, 8000), dtype="uint8", fill_value=0)
    a[:, :8000] = 1
    a[:, 8000:] = 2
    m = mount(src)
    p = m.path / "c" / "0"
    size = 9000 * 8000
    first = (p / "0.tiff").read_bytes()
    assert len(first) == (p / "0.tiff").stat().st_size and first.endswith(b"\x01" * 4096)
    assert first[-size:] == b"\x01" * size
    tifffile.imwrite(tmp_path / "z.tiff", np.full((9000, 8000), 3, "u1"), compression="zlib")
    shutil.copyfile(tmp_path / "z.tiff", p / "1.tiff")
    shutil.copyfile(tmp_path / "z.tiff", p / "0.tiff")
    assert a[0, 0] == 3 and a[8999, 15999] == 3
    rss_kb = int(next(line for line in Path(f"/proc/{m.proc.pid}/status").read_text().splitlines()
                      if line.startswith("VmHWM")).split()[1])
    assert rss_kb * 1024 < 12 * size, rss_kb
    no_traceback(m)


def test_concurrent_readers_and_shard_writers(tmp_path: Path, mount) -> None:
    """[write-9] [cons-1] many readers of one chunk agree; six writers hammering different
    chunks of the same shards never lose each other's last update."""
    src = tmp_path / "s.zarr"
    stores.sharded(src)
    m = mount(src)
    errors: list = []
    want = (m.path / "c" / "0" / "0.tiff").read_bytes()

    def reader() -> None:
        for _ in range(30):
            if (m.path / "c" / "0" / "0.tiff").read_bytes() != want:
                errors.append("reader saw other bytes")

    def writer(i: int, j: int, v: int) -> None:
        for k in range(5):
            r = write_file(m.path / "c" / str(i) / f"{j}.tiff", tiff_bytes(np.full((8, 16), v * 10 + k, "u2")))
            if r != "ok":
                errors.append((i, j, r))

    threads = [threading.Thread(target=reader) for _ in range(6)]
    threads += [threading.Thread(target=writer, args=(i, j, i * 2 + j + 1)) for i in (1, 2) for j in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    arr = zarr.open_array(str(src))[:]
    for i in (1, 2):
        for j in (0, 1):
            blk = arr[i * 8 : (i + 1) * 8, j * 16 : (j + 1) * 16]
            assert set(np.unique(blk)) == {(i * 2 + j + 1) * 10 + 4}
    no_traceback(m)


def test_tools_copy_trees_in_and_out(tmp_path: Path, mount) -> None:
    """[write-1] [ns-2] [ns-6] cp -r of an array directory out and back, rsync -a of a
    changed tree and tar x into the mount store every chunk (zarr.json is refused)."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    arr = zarr.open_array(str(src))
    out = tmp_path / "out"
    shutil.copytree(m.path, out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.tiff")) == \
        sorted(str(p.relative_to(m.path)) for p in m.path.rglob("*.tiff"))

    def refill(value: int) -> None:
        for f in out.rglob("*.tiff"):
            shape = tifffile.imread(f).shape
            tifffile.imwrite(f, np.full(shape, value, "u2"))

    refill(41)
    r = subprocess.run(["cp", "-r", f"{out}/.", f"{m.path}/"], capture_output=True, text=True)
    assert r.returncode == 1 and "zarr.json" in r.stderr  # the metadata file is read-only
    assert (arr[:] == 41).all()
    refill(42)
    os.unlink(out / "zarr.json")
    if shutil.which("rsync"):
        subprocess.run(["rsync", "-a", f"{out}/", f"{m.path}/"], check=True, capture_output=True)
        assert (arr[:] == 42).all()
    refill(43)
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        tar.add(out / "c", arcname="c")
    subprocess.run(["tar", "xf", str(tmp_path / "x.tar"), "-C", str(m.path)], check=True, capture_output=True)
    assert (arr[:] == 43).all()
    assert not list(m.path.rglob(".*"))  # no temporary files left behind
    no_traceback(m)


def test_renames_between_chunks_and_arrays(tmp_path: Path, mount) -> None:
    """[ns-2] [ns-3] [write-5] chunk onto chunk moves values; onto an array of another
    dtype fails with EINVAL and changes nothing; key directories cannot be renamed."""
    src = tmp_path / "g.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("u", shape=(16, 16), chunks=(8, 16), dtype="uint16", fill_value=0)[:] = 7
    g.create_array("i", shape=(16, 16), chunks=(8, 16), dtype="int32", fill_value=0)[:] = 9
    m = mount(src)
    u, i = m.path / "u" / "c", m.path / "i" / "c"
    assert errno_of(os.rename, u / "0" / "0.tiff", i / "0" / "0.tiff") == "EINVAL"
    assert (g["u"][:] == 7).all() and (g["i"][:] == 9).all()
    assert write_file(u / "1" / "0.tiff", tiff_bytes(np.full((8, 16), 8, "u2"))) == "ok"
    os.rename(u / "1" / "0.tiff", u / "0" / "0.tiff")
    assert (g["u"][:8] == 8).all() and (g["u"][8:] == 0).all()
    assert os.listdir(u / "1") == [] and not (src / "u" / "c" / "1" / "0").exists()
    assert errno_of(os.rename, u / "0", u / "5") != "ok"
    # atomic-save pattern with a name that does not parse: rename fails, scratch stays
    (u / "0" / ".save.tmp").write_bytes(b"not a tiff")
    assert errno_of(os.rename, u / "0" / ".save.tmp", u / "0" / "0.tiff") == "EINVAL"
    assert (u / "0" / ".save.tmp").read_bytes() == b"not a tiff"
    assert (g["u"][:8] == 8).all()
    no_traceback(m)


def test_sizes_match_bytes_for_every_file_kind(tmp_path: Path, mount) -> None:
    """[read-3] [read-2] [tree-3] [tree-6] stat size equals the bytes read for metadata,
    chunk, cropped edge chunk, fill-valued missing chunk, scratch file and stats file;
    the stats file reads as valid JSON however it is read."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    (src / "c" / "2" / "0").unlink()
    m = mount(src, "--crop-edges", "--all-chunks")
    (m.path / "c" / "0" / "note.txt").write_bytes(b"scratch\n")
    files = [m.path / "zarr.json", m.path / "c" / "0" / "note.txt", *m.path.rglob("*.tiff")]
    assert len(files) == 8
    for f in files:
        assert f.stat().st_size == len(f.read_bytes()), f
    assert tifffile.imread(m.path / "c" / "2" / "1.tiff").shape == (4, 14)
    assert (tifffile.imread(m.path / "c" / "2" / "0.tiff") == 0).all()
    stats = m.path / ".zfuse" / "stats"
    for _ in range(5):
        fd = os.open(stats, os.O_RDONLY)
        first = os.read(fd, 50)
        rest = os.read(fd, 1 << 20)
        os.close(fd)
        json.loads(first + rest)
        json.loads(stats.read_bytes())
    assert stats.stat().st_mode & 0o222 == 0
    no_traceback(m)


def test_sighup_under_read_load(tmp_path: Path, mount) -> None:
    """[cons-2] SIGHUP every 50 ms while readers walk and read every chunk: no read fails,
    values stay right, the daemon stays up."""
    src = tmp_path / "g.zarr"
    data = stores.ome_group(src)
    m = mount(src)
    stop = time.monotonic() + 3
    errors: list = []

    def reader() -> None:
        while time.monotonic() < stop:
            for f in m.path.rglob("*.tiff"):
                try:
                    t = tifffile.imread(f)
                except Exception as e:  # noqa: BLE001 - collected for the assertion
                    errors.append((f, repr(e)))
                    continue
                level, _, *rest = f.relative_to(m.path).with_suffix("").parts
                z, y, x = (int(v) for v in rest)
                want = data[level][z * 2 : z * 2 + 2, y * 16 : y * 16 + 16, x * 16 : x * 16 + 16]
                if not np.array_equal(t[: want.shape[0], : want.shape[1], : want.shape[2]], want):
                    errors.append((f, "wrong values"))

    def hupper() -> None:
        while time.monotonic() < stop:
            os.kill(m.proc.pid, signal.SIGHUP)
            time.sleep(0.05)

    threads = [threading.Thread(target=reader) for _ in range(3)] + [threading.Thread(target=hupper)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert m.proc.poll() is None and os.path.ismount(m.path)
    no_traceback(m)


def test_umount_busy_then_sigterm_commits(tmp_path: Path, mount) -> None:
    """[cons-3] `zfuse umount` with a file open fails with a clear message and leaves the
    mount working; SIGTERM then commits the open file that parses and unmounts."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    p = m.path / "c" / "1" / "0.tiff"
    new = np.full((8, 16), 5, "u2")
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, tiff_bytes(new))
    try:
        r = subprocess.run([sys.executable, "-m", "zfuse.cli", "umount", str(m.path)], capture_output=True, text=True)
        assert r.returncode == 1 and "busy" in r.stderr
        assert os.path.ismount(m.path)
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(timeout=20) == 0
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    np.testing.assert_array_equal(zarr.open_array(str(src))[8:16, 0:16], new)
    assert "SIGTERM" in m.log()
    no_traceback(m)


def test_group_with_1000_arrays(tmp_path: Path, mount) -> None:
    """[tree-1] [tree-2] a group of 1000 arrays lists and reads in reasonable time."""
    src = tmp_path / "many.zarr"
    g = zarr.open_group(str(src), mode="w")
    for i in range(1000):
        g.create_array(f"a{i:04d}", shape=(4, 4), chunks=(2, 2), dtype="uint8", fill_value=0, compressors=None)
    for i in range(0, 1000, 37):
        g[f"a{i:04d}"][:] = i % 250 + 1
    m = mount(src)
    t0 = time.monotonic()
    names = os.listdir(m.path)
    assert len(names) == 1001 and "zarr.json" in names
    tiffs = list(m.path.rglob("*.tiff"))
    assert len(tiffs) == 4 * len(range(0, 1000, 37))
    assert time.monotonic() - t0 < 20
    assert (tifffile.imread(m.path / "a0037" / "c" / "1" / "1.tiff") == 38).all()
    no_traceback(m)


def test_store_errors_give_errnos(tmp_path: Path, mount) -> None:
    """[write-8] a full store gives ENOSPC at close, a read-only store EROFS at close and
    on unlink; the stored chunk is unchanged and no temporary file is left."""
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
        filler.unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(small)], check=True)
        assert write_file(m.path / "c" / "0" / "0.tiff", tif) == "EROFS"
        # rm hides the chunk at once; the store deletion after the replace window fails,
        # is journaled, and the chunk is shown again
        assert errno_of(os.unlink, m.path / "c" / "0" / "0.tiff") == "ok"
        m.settle()
        wait_until(lambda: (m.path / "c" / "0" / "0.tiff").exists(), what="the chunk shown again")
        assert "deleting c/0/0 from the store failed" in m.errors()
        subprocess.run(["mount", "-o", "remount,rw", str(small)], check=True)
        assert (a[:, :128] == 1).all() and (a[:, 128:] == 0).all()
        assert sorted(os.listdir(src / "c" / "0")) == ["0"]
        assert write_file(m.path / "c" / "0" / "0.tiff", tif) == "ok"
        assert (a[:, :128] == 9).all()
        m.unmount()
        no_traceback(m)
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_touch_and_failed_creates(tmp_path: Path, mount) -> None:
    """[write-5] [ns-6] [ns-9] touch of an existing chunk only sets its time; touch of a
    missing chunk name leaves an empty placeholder that is not stored, and a TIFF written
    into it later is; a failed create of a new chunk leaves nothing in the store."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    (src / "c" / "2" / "0").unlink()
    (src / "c" / "1" / "0").unlink()
    m = mount(src)
    c = m.path / "c"
    subprocess.run(["touch", "-d", "2001-01-01", str(c / "0" / "0.tiff")], check=True)
    assert time.gmtime(os.stat(c / "0" / "0.tiff").st_mtime).tm_year == 2001
    np.testing.assert_array_equal(zarr.open_array(str(src))[0:8, 0:16], data[0:8, 0:16])
    subprocess.run(["touch", str(c / "2" / "0.tiff")], check=True)
    assert (c / "2" / "0.tiff").stat().st_size == 0
    assert sorted(os.listdir(c / "2")) == ["0.tiff", "1.tiff"]
    assert not (src / "c" / "2" / "0").exists()
    new = np.full((8, 16), 6, "u2")
    with open(c / "2" / "0.tiff", "r+b") as f:
        f.write(tiff_bytes(new))
    np.testing.assert_array_equal(zarr.open_array(str(src))[16:20, 0:16], new[:4])
    assert write_file(c / "1" / "0.tiff", tiff_bytes(np.zeros((8, 16), "u1"))) == "EINVAL"
    assert not (src / "c" / "1" / "0").exists()
    no_traceback(m)
