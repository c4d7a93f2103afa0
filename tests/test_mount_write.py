"""The write path on real mounts: TIFFs in, Zarr chunks out, nothing ever lost."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import tifffile

from zfuse.testing import snapshot

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
        subprocess.run(["rsync", "-a", str(tmp_path / "1.tiff"), str(c / "1") + "/"], check=True)
        np.testing.assert_array_equal(stores.open_any(src)[8:16, 16:30], new2[:, :14])


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
