"""The write path on real mounts: TIFFs in, Zarr chunks out, nothing ever lost."""

from __future__ import annotations

import errno
import io
import mmap
import os
import shutil
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

from zfuse.testing import assert_no_traceback, errno_of, snapshot, tiff_bytes, write_file

import stores
from tools import imagej_save_many, requires, tiffcp

pytestmark = pytest.mark.mount

KINDS = {
    "v2": lambda p: stores.v2(p, separator="/"),
    "v3-zstd": lambda p: stores.v3(p, codecs="zstd"),
    "v3-crc32c": lambda p: stores.v3(p, codecs="crc32c"),
    "sharding_indexed": lambda p: stores.sharded(p),
    "sharding-v1": lambda p: stores.sharding_v1(p),
    "concat-parts": lambda p: stores.concat_parts(p),
    "stacked": lambda p: stores.stacked(p),
}


def tiff_file(tmp_path: Path, values: np.ndarray, name: str = "t.tif") -> bytes:
    """`values` written by tifffile as tmp_path/name (some tests hand the file to other programs); its bytes."""
    tifffile.imwrite(tmp_path / name, values)
    return (tmp_path / name).read_bytes()


def chunk_path(mnt: Path, kind: str, coords: tuple[int, ...]) -> Path:
    key = "/".join(map(str, coords))
    return mnt / f"{key}.tiff" if kind == "v2" else mnt / "c" / f"{key}.tiff"


@pytest.mark.parametrize("kind", list(KINDS))
def test_round_trip_from_every_writer(tmp_path: Path, mount, kind: str) -> None:
    """[write-1] [write-4] [cons-1] TIFFs made by tifffile (several layouts), tiffcp and ImageJ land in the store exactly."""
    requires("tiffcp", "imagej")
    src = tmp_path / "a.zarr"
    KINDS[kind](src)
    m = mount(src)
    new = {}
    made = tmp_path / "made"
    made.mkdir()
    # (0,0): tifffile zlib; (0,1): tifffile tiled big-endian; (1,0): tiffcp lzw;
    # (1,1): ImageJ saveAs; (2,1): edge chunk, cropped shape, packbits
    new[(0, 0)] = stores.values((8, 16), "uint16", seed=10)
    tifffile.imwrite(made / "a.tif", new[(0, 0)], compression="zlib")
    new[(0, 1)] = stores.values((8, 16), "uint16", seed=11)
    tifffile.imwrite(made / "b.tif", new[(0, 1)], tile=(16, 16), byteorder=">")
    new[(1, 0)] = stores.values((8, 16), "uint16", seed=12)
    tifffile.imwrite(made / "c0.tif", new[(1, 0)])
    tiffcp(made / "c0.tif", made / "c.tif", "-c", "lzw")
    new[(1, 1)] = stores.values((8, 16), "uint16", seed=13)
    imagej_save_many([(new[(1, 1)], made / "d.tif")])
    new[(2, 1)] = stores.values((4, 14), "uint16", seed=14)
    tifffile.imwrite(made / "e.tif", new[(2, 1)], compression="packbits")
    for name, coords in zip("abcde", [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1)], strict=True):
        shutil.copyfile(made / f"{name}.tif", chunk_path(m.path, kind, coords))
    arr = stores.open_any(src)
    for coords, values in new.items():
        region = tuple(slice(i * c, min(i * c + n, s))
                       for i, c, n, s in zip(coords, arr.chunks, values.shape, arr.shape, strict=True))
        inside = values[tuple(slice(0, r.stop - r.start) for r in region)]
        np.testing.assert_array_equal(arr[region], inside, err_msg=f"{kind} {coords}")
        # readers of the mount see the new pixels at once
        seen = tifffile.imread(chunk_path(m.path, kind, coords))
        np.testing.assert_array_equal(seen[: inside.shape[0], : inside.shape[1]], inside)


def test_seek_back_writer_and_reading_own_output(tmp_path: Path, mount) -> None:
    """[write-2] pixel data first, header patched last, reading back before close (libtiff/Bio-Formats style)."""
    stores.v3(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr")
    values = stores.values((8, 16), "uint16", seed=5)
    blob = tmp_path / "x.tif"
    tifffile.imwrite(blob, values, compression="zlib")
    data = blob.read_bytes()
    target = m.path / "c" / "1" / "1.tiff"
    with open(target, "r+b") as f:
        f.truncate(0)
        half = len(data) // 2
        f.seek(half)
        f.write(data[half:])
        f.seek(0)
        f.write(data[:half])
        f.flush()
        f.seek(0)
        assert f.read() == data  # its own output, before close
    arr = stores.open_any(tmp_path / "a.zarr")
    np.testing.assert_array_equal(arr[8:16, 16:30], values[:, :14])


def test_in_place_pixel_patch(tmp_path: Path, mount) -> None:
    """[write-3] patching pixel bytes in place, also with dd conv=notrunc."""
    data = stores.v3(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr")
    target = m.path / "c" / "0" / "0.tiff"
    size = target.stat().st_size
    header = size - 8 * 16 * 2
    with open(target, "r+b") as f:
        f.seek(header + 2 * (3 * 16 + 5))  # pixel (3, 5)
        f.write(np.array([4242], "<u2").tobytes())
    arr = stores.open_any(tmp_path / "a.zarr")
    expect = data.copy()
    expect[3, 5] = 4242
    np.testing.assert_array_equal(arr[...], expect)
    # dd conv=notrunc does the same
    subprocess.run(["dd", f"of={target}", "bs=1", f"seek={header}", "conv=notrunc", "status=none"],
                   input=np.array([7], "<u2").tobytes(), check=True)
    assert stores.open_any(tmp_path / "a.zarr")[0, 0] == 7


def test_atomic_save_pattern_and_scratch_files(tmp_path: Path, mount) -> None:
    """[ns-1] [ns-2] scratch files stay in the daemon; rename onto a chunk commits."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    before = set(snapshot(src))
    m = mount(src)
    values = stores.values((8, 16), "uint16", seed=9)
    scratch = m.path / "c" / "0" / ".0.tiff.tmp123"
    tifffile.imwrite(scratch, values)
    assert scratch.exists() and scratch.name in os.listdir(m.path / "c" / "0")
    assert set(snapshot(src)) == before  # scratch files never reach the store
    os.rename(scratch, m.path / "c" / "0" / "0.tiff")
    assert not scratch.exists()
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], values)
    assert set(snapshot(src)) == before
    # a scratch file that is not a TIFF cannot be renamed onto a chunk
    bad = m.path / "c" / "0" / "junk.tmp"
    bad.write_bytes(b"not a tiff at all")
    with pytest.raises(OSError) as e:
        os.rename(bad, m.path / "c" / "0" / "1.tiff")
    assert e.value.errno == errno.EINVAL
    bad.unlink()


def test_unlink_truncate_mv_cp_p_rsync(tmp_path: Path, mount) -> None:
    """[ns-3] [ns-4] [ns-5] [ns-6] rm, truncate, mv, cp -p and rsync behave as users expect."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    m = mount(src)
    c = m.path / "c"
    # rm removes the file at once; the store follows when the replace window closes
    (c / "0" / "1.tiff").unlink()
    assert not (c / "0" / "1.tiff").exists()
    assert "1.tiff" not in os.listdir(c / "0")
    m.settle()
    assert not (src / "c" / "0" / "1").exists()
    # truncate(2) by path to a size that is no complete TIFF fails and changes nothing
    with pytest.raises(OSError) as e:
        os.truncate(c / "0" / "0.tiff", 10)
    assert e.value.errno == errno.EINVAL
    # truncate(1) opens the file first: an incomplete file, kept pending; the chunk unchanged
    subprocess.run(["truncate", "-s", "10", str(c / "0" / "0.tiff")], check=True)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], data[0:8, 0:16])
    np.testing.assert_array_equal(tifffile.imread(c / "0" / "0.tiff"), data[0:8, 0:16])
    # a pending file is not renamed (its bytes are not stored: a rename moves what is)
    with pytest.raises(OSError) as e:
        os.rename(c / "0" / "0.tiff", c / "0" / "1.tiff")
    assert e.value.errno == errno.EBUSY
    tifffile.imwrite(c / "0" / "0.tiff", data[0:8, 0:16])  # finished: stored, no longer pending
    # mv within the mount moves the chunk's values
    os.rename(c / "0" / "0.tiff", c / "0" / "1.tiff")
    arr = stores.open_any(src)
    np.testing.assert_array_equal(arr[0:8, 16:30], data[0:8, 0:14])
    assert not (src / "c" / "0" / "0").exists()
    # cp -p (chmod + utimes after the copy) and rsync (temp file + rename) succeed
    new = stores.values((8, 16), "uint16", seed=21)
    tifffile.imwrite(tmp_path / "n.tif", new)
    subprocess.run(["cp", "-p", str(tmp_path / "n.tif"), str(c / "1" / "0.tiff")], check=True)
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], new)
    if shutil.which("rsync"):
        new2 = stores.values((8, 16), "uint16", seed=22)
        tifffile.imwrite(tmp_path / "1.tiff", new2)
        os.utime(tmp_path / "1.tiff", (1_600_000_000, 1_600_000_000))
        subprocess.run(["rsync", "-a", str(tmp_path / "1.tiff"), str(c / "1") + "/"], check=True)
        np.testing.assert_array_equal(stores.open_any(src)[8:16, 16:30], new2[:, :14])
        # rsync -a set the source's mtime on its temporary file, then renamed it
        assert int(os.stat(c / "1" / "1.tiff").st_mtime) == 1_600_000_000


BAD_INPUTS = ["not-tiff", "wrong-dtype", "wrong-shape", "wrong-pages", "unsupported-compression",
              "outside-grid"]


def _patch_compression(path: Path, code: int) -> None:
    """Rewrite the Compression tag of every page of a little-endian classic TIFF in place."""
    import struct

    data = bytearray(path.read_bytes())
    offset = struct.unpack_from("<I", data, 4)[0]
    while offset:
        (count,) = struct.unpack_from("<H", data, offset)
        for i in range(count):
            entry = offset + 2 + 12 * i
            if struct.unpack_from("<H", data, entry)[0] == 259:
                struct.pack_into("<H", data, entry + 8, code)
        offset = struct.unpack_from("<I", data, offset + 2 + 12 * count)[0]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_fails_close_and_keeps_the_chunk(tmp_path: Path, mount, case: str) -> None:
    """[write-5] [write-7] bad files fail close() with EINVAL; the chunk is unchanged."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(4, 20, 30), chunks=(2, 8, 16))
    before = snapshot(src)
    m = mount(src)
    target = m.path / "c" / "0" / "0" / "0.tiff"
    good = stores.values((2, 8, 16), "uint16")
    blob = tmp_path / "bad.tif"
    if case == "not-tiff":
        blob.write_bytes(b"hello world" * 100)
    elif case == "wrong-dtype":
        tifffile.imwrite(blob, good.astype("float32"))
    elif case == "wrong-shape":
        tifffile.imwrite(blob, good[:, :5, :5])
    elif case == "wrong-pages":
        tifffile.imwrite(blob, np.concatenate([good, good]), photometric="minisblack")
    elif case == "unsupported-compression":
        tifffile.imwrite(blob, good, photometric="minisblack")
        _patch_compression(blob, 32809)  # ThunderScan: no decoder for it
        assert 32809 not in tifffile.TIFF.DECOMPRESSORS
    elif case == "outside-grid":
        tifffile.imwrite(blob, good)
        target = m.path / "c" / "0" / "0" / "9.tiff"
    with pytest.raises(OSError) as e:
        shutil.copyfile(blob, target)
    assert e.value.errno in (errno.EINVAL,), e.value
    assert snapshot(src) == before
    assert "c/0/0" in m.log() or "9.tiff" in m.log()


def test_runaway_write_is_refused(tmp_path: Path, mount) -> None:
    """[write-6] writes past the size limit fail with EFBIG."""
    stores.v3(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr")
    fd = os.open(m.path / "c" / "0" / "0.tiff", os.O_WRONLY | os.O_TRUNC)
    try:
        with pytest.raises(OSError) as e:
            for _ in range(64):
                os.write(fd, bytes(1 << 20))
        assert e.value.errno == errno.EFBIG
    finally:
        with pytest.raises(OSError):  # what was written is no TIFF: close fails, chunk kept
            os.close(fd)
    assert tifffile.imread(m.path / "c" / "0" / "0.tiff").shape == (8, 16)


def test_read_only_mount_refuses_every_write(tmp_path: Path, mount) -> None:
    """[ns-8] -o ro: EROFS on every write path."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    before = snapshot(src)
    m = mount(src, "-o", "ro")
    chunk = m.path / "c" / "0" / "0.tiff"
    attempts = [
        lambda: open(chunk, "r+b"),
        lambda: open(m.path / "c" / "0" / "new.tmp", "wb"),
        lambda: chunk.unlink(),
        lambda: os.rename(chunk, m.path / "c" / "0" / "x.tiff"),
        lambda: os.truncate(chunk, 0),
        lambda: os.mkdir(m.path / "c" / "9"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert snapshot(src) == before


def test_disk_full_in_the_store(tmp_path: Path, mount) -> None:
    """[write-8] ENOSPC from the store fails close(); nothing changes."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(small)], check=True)
    try:
        src = small / "a.zarr"
        stores.v3(src, shape=(256, 256), chunks=(128, 128), codecs="raw")
        before = snapshot(src)
        m = mount(src)
        filler = small / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=1000"], capture_output=True)
        tifffile.imwrite(tmp_path / "n.tif", stores.values((128, 128), "uint16", seed=3))
        with pytest.raises(OSError) as e:
            shutil.copyfile(tmp_path / "n.tif", m.path / "c" / "0" / "0.tiff")
        assert e.value.errno == errno.ENOSPC
        assert snapshot(src) == before
        m.unmount()
    finally:
        subprocess.run(["umount", "-l", str(small)])


@pytest.mark.parametrize("kind", ["sharding_indexed", "sharding-v1"])
def test_writers_and_readers_on_one_shard(tmp_path: Path, mount, kind: str) -> None:
    """[write-9] 4 writers and 4 readers at once on different chunks of one shard: no lost update, no torn read."""
    build = stores.sharded if kind == "sharding_indexed" else stores.sharding_v1
    src = tmp_path / f"{kind}.zarr"
    if kind == "sharding_indexed":
        data = build(src, shape=(16, 64), shards=(16, 64), chunks=(8, 16))
    else:
        data = build(src, shape=(16, 64), chunks=(8, 16), chunks_per_shard=(2, 4))
    m = mount(src)
    written = [(0, 0), (0, 1), (1, 2), (1, 3)]
    read = [(0, 2), (0, 3), (1, 0), (1, 1)]
    rounds = 5
    news = {c: [stores.values((8, 16), "uint16", seed=100 + 10 * i + r) for r in range(rounds)]
            for i, c in enumerate(written)}
    blobs = {}
    for c in written:
        for r in range(rounds):
            blobs[c, r] = tmp_path / f"{kind}-{c[0]}{c[1]}-{r}.tif"
            tifffile.imwrite(blobs[c, r], news[c][r])
    errors: list[BaseException] = []

    def block(c: tuple[int, int]) -> np.ndarray:
        return data[c[0] * 8:(c[0] + 1) * 8, c[1] * 16:(c[1] + 1) * 16]

    def writer(c: tuple[int, int]) -> None:
        try:
            for r in range(rounds):
                shutil.copyfile(blobs[c, r], m.path / "c" / f"{c[0]}/{c[1]}.tiff")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader(c: tuple[int, int]) -> None:
        try:
            for _ in range(rounds * 3):
                got = tifffile.imread(m.path / "c" / f"{c[0]}/{c[1]}.tiff")
                np.testing.assert_array_equal(got, block(c), err_msg=f"torn read of {c}")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(c,)) for c in written]
    threads += [threading.Thread(target=reader, args=(c,)) for c in read]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    arr = stores.open_any(src)
    for c in written:
        np.testing.assert_array_equal(arr[c[0] * 8:(c[0] + 1) * 8, c[1] * 16:(c[1] + 1) * 16],
                                      news[c][-1], err_msg=f"{kind} lost update at {c}")
    for c in read:
        np.testing.assert_array_equal(arr[c[0] * 8:(c[0] + 1) * 8, c[1] * 16:(c[1] + 1) * 16], block(c))


def test_zarr_python_writes_through_the_mount(tmp_path: Path, mount) -> None:
    """[read-6] dual access both ways: zarr-python opens the mount and writes chunks as TIFFs."""
    import zarr

    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    view = zarr.open_array(str(m.path), mode="r+")
    view[0:8, 0:16] = 99
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], 99)
    assert tifffile.imread(m.path / "c" / "0" / "0.tiff").max() == 99


def test_jpeg_tiff_is_stored_as_decoded(tmp_path: Path, mount) -> None:
    """[write-1] a JPEG-compressed TIFF (lossy) is accepted: the chunk gets the pixels it decodes to."""
    import zarr

    src = tmp_path / "a.zarr"
    zarr.create_array(str(src), shape=(16, 16), chunks=(16, 16), dtype="uint8", fill_value=0)[...] = 1
    m = mount(src)
    image = (np.arange(256).reshape(16, 16) % 200).astype("uint8")
    tifffile.imwrite(tmp_path / "j.tif", image, compression="jpeg")
    shutil.copyfile(tmp_path / "j.tif", m.path / "c" / "0" / "0.tiff")
    np.testing.assert_array_equal(stores.open_any(src)[...], tifffile.imread(tmp_path / "j.tif"))


def test_durability_process_stores_and_fsync_succeeds(tmp_path: Path, mount) -> None:
    """[write-10] -o durability=process: close() stores the chunk (without fdatasync) and
    an application's fsync() succeeds; the store holds exactly the written values."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src, "-o", "durability=process")
    new = stores.values((8, 16), "uint16", seed=41)
    tifffile.imwrite(tmp_path / "n.tif", new)
    with open(m.path / "c" / "0" / "0.tiff", "wb") as f:
        f.write((tmp_path / "n.tif").read_bytes())
        f.flush()
        os.fsync(f.fileno())
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)
    assert not list(src.rglob("*.tmp"))


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


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
        assert_no_traceback(m)


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


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
    assert_no_traceback(m)


def test_writes_during_a_commit_are_not_lost(tmp_path: Path, mount) -> None:
    """[write-10] a second writer's close commits while the first keeps writing: nothing is lost."""
    src = tmp_path / "big.zarr"
    zarr.create_array(str(src), shape=(2000, 4000), chunks=(2000, 2000), dtype="uint8", fill_value=0)[...] = 1
    m = mount(src)
    path = m.path / "c" / "0" / "0.tiff"
    data = tiff_file(tmp_path, np.full((2000, 2000), 4, "uint8"))
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
    (m.path / "1.1.tiff").write_bytes(tiff_file(tmp_path, new))
    np.testing.assert_array_equal(zarr.open_array(str(src))[4:8, 5:10], new)


def test_fsync_in_the_middle_of_a_write(tmp_path: Path, mount) -> None:
    """[write-1] fsync (and O_SYNC writes) of a file still being written succeed; close stores it."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    values = stores.values((8, 16), "uint16", seed=31)
    data = tiff_file(tmp_path, values)
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
    data = tiff_file(tmp_path, values)
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


def test_cp_writes_a_chunk_in_one_request(tmp_path: Path, mount) -> None:
    """stat's st_blksize is 1 MiB on chunk files: coreutils cp copies a chunk TIFF of up to
    1 MiB in one write request (counted with -v, which logs every operation)."""
    src = tmp_path / "a.zarr"
    arr = zarr.create_array(str(src), shape=(1024, 1024), chunks=(512, 512), dtype="uint16", fill_value=0,
                            compressors=None, zarr_format=3)
    arr[...] = 1
    m = mount(src, "-v")
    chunk = m.path / "c" / "0" / "0.tiff"
    assert os.stat(chunk).st_blksize == 1 << 20
    assert os.stat(m.path / "zarr.json").st_blksize == 128 << 10
    new = np.arange(512 * 512, dtype="uint16").reshape(512, 512)
    tifffile.imwrite(tmp_path / "new.tif", new)  # 512 KiB + header
    before = m.log().count("write(")
    subprocess.run(["cp", str(tmp_path / "new.tif"), str(chunk)], check=True)
    assert m.log().count("write(") - before == 1
    np.testing.assert_array_equal(zarr.open_array(str(src))[:512, :512], new)


def test_a_reader_open_across_a_cp_leaves_no_old_bytes_for_new_readers(tmp_path: Path, mount) -> None:
    """[write-2][write-4] A reader that keeps a chunk open through the page cache across a
    cp onto it (the cp goes on after at most 2 s) keeps reading the old bytes; readers
    opening afterwards read the new chunk, while that reader is still open and after it
    has closed: its old bytes never reach them through the file's shared page cache."""
    src = tmp_path / "a.zarr"
    arr = zarr.create_array(str(src), shape=(512, 512), chunks=(512, 512), dtype="uint16", fill_value=0,
                            compressors=None, zarr_format=3)
    arr[...] = 1
    m = mount(src)
    chunk = m.path / "c" / "0" / "0.tiff"
    old = chunk.read_bytes()
    new = np.arange(512 * 512, dtype="uint16").reshape(512, 512)
    tifffile.imwrite(tmp_path / "new.tif", new)
    at = 300 * 1024  # a page the early reader reads only after the cp
    fd = os.open(chunk, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: only what is asked
        assert os.pread(fd, 4096, 0) == old[:4096]
        shutil.copyfile(tmp_path / "new.tif", chunk)
        assert os.pread(fd, 4096, at) == old[at : at + 4096]
        np.testing.assert_array_equal(tifffile.imread(chunk), new)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(tifffile.imread(chunk), new)
    np.testing.assert_array_equal(zarr.open_array(str(src))[...], new)


_HOLDING_READER = """
import sys
with open(sys.argv[1], "rb") as f:
    head = f.read(64)
    print("opened", flush=True)
    sys.stdin.readline()
    sys.stdout.buffer.write(head + f.read())
"""


def test_a_second_cp_before_the_first_is_released_is_not_seen_half_written(tmp_path: Path, mount) -> None:
    """[write-2] A replacement that starts while the previous one is committed but still open
    (a `cp` right after a `cp`: the kernel's RELEASE of the first arrives after its close()
    returned; here a dup keeps it open) is invisible to other processes until it commits:
    they read the first replacement whole, never the second one's bytes so far, and a reader
    that opened before the second started keeps what it opened."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(16, 32), chunks=(8, 16), dtype="uint16")
    m = mount(src)
    chunk = m.path / "c" / "0" / "0.tiff"
    first, second = tiff_bytes(np.full((8, 16), 1, "u2")), tiff_bytes(np.full((8, 16), 2, "u2"))

    def other_process_reads() -> int:
        """The value of the uniform chunk another process reads (a torn file fails to decode)."""
        data = subprocess.run(["cat", str(chunk)], check=True, capture_output=True).stdout
        return uniform_value(data)

    fd1 = os.open(chunk, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd1, first)
        os.close(os.dup(fd1))  # close() of a copy: the commit point; fd1 keeps it open
        assert other_process_reads() == 1
        holder = subprocess.Popen([sys.executable, "-c", _HOLDING_READER, str(chunk)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert holder.stdout.readline() == b"opened\n"
        fd2 = os.open(chunk, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd2, second[: len(second) // 2])
            assert other_process_reads() == 1
            size = subprocess.run(["stat", "-c", "%s", str(chunk)], check=True, capture_output=True, text=True)
            assert int(size.stdout) == len(subprocess.run(["cat", str(chunk)], capture_output=True).stdout)
            held, _ = holder.communicate(b"\n", timeout=60)
            assert uniform_value(held) == 1
            os.write(fd2, second[len(second) // 2 :])
        finally:
            os.close(fd2)
        assert other_process_reads() == 2
    finally:
        os.close(fd1)
    assert other_process_reads() == 2
    assert (zarr.open_array(str(src))[:8, :16] == 2).all()


def uniform_value(tiff: bytes) -> int:
    """The one value of a uniform TIFF image (AssertionError if it is not uniform)."""
    values = tifffile.imread(io.BytesIO(tiff))
    assert (values == values.flat[0]).all(), "not uniform: torn"
    return int(values.flat[0])
