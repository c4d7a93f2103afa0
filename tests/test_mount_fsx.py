"""fsx-style randomized reads on real mounts: random `pread`s and `mmap` slices of chunk
files and whole-image files, each checked against an oracle.

The oracle of a file is one full read of it, checked first: a chunk file's pixels
(tifffile) are zarr's values of that chunk, `image.ome.tif`'s are the whole array. Then
every random read of the file (any offset, any length: zero, one byte, straddling pages,
past the end of file; through several descriptors, reopened, or mapped) must be the
same slice of that full read [image-5]. The files are read through three mounts: read-only,
read-write, and one whose store zfuse does not see as local (`FaultyStore` with no
faults, tests/test_mount_faults.py). The run is seeded and bounded:
ZFUSE_FSX_SEED changes the seed (a failure names it, with the operations that led to
it), ZFUSE_FSX_OPS the number of operations per store.
"""

from __future__ import annotations

import io
import itertools
import mmap
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import test_mount_faults
import tifffile
import zarr
from zarr.codecs import ZstdCodec

from test_mount_read import expected_chunk

pytestmark = pytest.mark.mount
faulty_mount = test_mount_faults.faulty_mount  # the fixture

SEED = int(os.environ.get("ZFUSE_FSX_SEED", "27"))
OPS = int(os.environ.get("ZFUSE_FSX_OPS", "600"))
PAGE = mmap.PAGESIZE


def _store(path: Path, shape: tuple[int, int], chunks: tuple[int, int], dtype: str,
           compressors: object = None, shards: tuple[int, int] | None = None) -> np.ndarray:
    rng = np.random.default_rng(SEED)
    info = np.iinfo(dtype)
    data = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, shards=shards, dtype=dtype,
                            compressors=compressors, fill_value=0)
    arr[...] = data
    return data


# name -> store maker; chunk files of 64 KiB (16 pages) but for "small"
STORES: dict[str, Callable[[Path], np.ndarray]] = {
    "raw": lambda p: _store(p, (256, 512), (128, 256), "uint16"),
    "zstd": lambda p: _store(p, (256, 512), (128, 256), "uint16", [ZstdCodec(level=1)]),
    "sharded": lambda p: _store(p, (256, 512), (128, 256), "uint16", [ZstdCodec(level=1)], shards=(256, 512)),
    "edge": lambda p: _store(p, (300, 700), (128, 256), "uint16", [ZstdCodec(level=1)]),  # 300, 700: not multiples
    "small": lambda p: _store(p, (21, 37), (8, 16), "uint8"),  # files smaller than a page, odd sizes
}


@dataclass
class Oracle:
    path: Path
    data: bytes  # the file as one full read gave it
    fds: list[int] = field(default_factory=list)


@dataclass
class Run:
    seed: int
    rng: random.Random
    history: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.history.append(text)

    def where(self) -> str:
        return (f"ZFUSE_FSX_SEED={self.seed}, operation {len(self.history)}; last operations:\n  "
                + "\n  ".join(self.history[-8:]))


def _full_read(path: Path) -> bytes:
    """The whole file in one read() of its size (os.read may return less: then go on)."""
    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while True:
            part = os.read(fd, max(size, 1) + PAGE)
            if not part:
                break
            parts.append(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def _offset_and_length(rng: random.Random, size: int) -> tuple[int, int]:
    """Offsets anywhere up to past the end; lengths from zero to past the end, often
    around page boundaries."""
    kind = rng.random()
    if kind < 0.3:  # straddle a page boundary
        boundary = rng.randrange(0, max(size, 1) + PAGE, PAGE) if size else 0
        offset = max(0, boundary - rng.randrange(1, 64))
        return offset, rng.randrange(2, 128)
    if kind < 0.4:
        return rng.randrange(0, size + 2 * PAGE + 1), 0
    if kind < 0.5:  # at or past the end
        return size + rng.randrange(-8, 2 * PAGE), rng.randrange(1, 3 * PAGE)
    if kind < 0.6:  # from the start, any length
        return 0, rng.randrange(1, size + PAGE + 2)
    if kind < 0.8:  # small reads anywhere
        return rng.randrange(0, size + 1), rng.randrange(1, 300)
    return rng.randrange(0, size + 1), rng.randrange(1, 4 * PAGE + 1)


def _pread(run: Run, f: Oracle) -> None:
    offset, length = _offset_and_length(run.rng, len(f.data))
    offset = max(offset, 0)
    if not f.fds or run.rng.random() < 0.1:  # another descriptor of the same file
        f.fds.append(os.open(f.path, os.O_RDONLY))
    fd = run.rng.choice(f.fds)
    run.note(f"pread({f.path.name}, fd {f.fds.index(fd)}, length {length}, offset {offset})")
    got = os.pread(fd, length, offset)
    assert got == f.data[offset:offset + length], run.where()


def _seq_read(run: Run, f: Oracle) -> None:
    """lseek, then reads one after another (the kernel's read-ahead path)."""
    offset, _ = _offset_and_length(run.rng, len(f.data))
    offset = max(offset, 0)
    step = run.rng.choice([1, 511, PAGE, PAGE + 3, 3 * PAGE, 65536])
    count = run.rng.randrange(1, 6)
    run.note(f"seq({f.path.name}, from {offset}, {count} reads of {step})")
    fd = os.open(f.path, os.O_RDONLY)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        got = b"".join(os.read(fd, step) for _ in range(count))
    finally:
        os.close(fd)
    assert got == f.data[offset:offset + step * count], run.where()


def _mmap_read(run: Run, f: Oracle) -> None:
    """Slices of a mapping of the file: the whole file, or a window at a page offset
    (never past the end of file: that is SIGBUS, not a read)."""
    size = len(f.data)
    if size == 0:
        return
    start = run.rng.randrange(0, (size - 1) // mmap.ALLOCATIONGRANULARITY + 1) * mmap.ALLOCATIONGRANULARITY \
        if run.rng.random() < 0.5 else 0
    length = run.rng.randrange(1, size - start + 1) if start else 0  # 0: to the end of file
    run.note(f"mmap({f.path.name}, offset {start}, length {length or size - start})")
    with open(f.path, "rb") as fh, mmap.mmap(fh.fileno(), length, access=mmap.ACCESS_READ, offset=start) as m:
        window = f.data[start:start + len(m)]
        assert len(m) == (length or size - start), run.where()
        for _ in range(run.rng.randrange(1, 8)):
            a, n = _offset_and_length(run.rng, len(m))
            a = min(max(a, 0), len(m))
            run.note(f"  mmap slice [{a}:{a + n}]")
            assert m[a:a + n] == window[a:a + n], run.where()


def _close_some(run: Run, f: Oracle) -> None:
    if f.fds:
        fd = f.fds.pop(run.rng.randrange(len(f.fds)))
        run.note(f"close({f.path.name}, a descriptor)")
        os.close(fd)


OPERATIONS = [(_pread, 0.55), (_seq_read, 0.15), (_mmap_read, 0.25), (_close_some, 0.05)]


def _fsx(files: list[Oracle], seed: int, ops: int) -> Run:
    run = Run(seed, random.Random(seed))
    funcs, weights = zip(*OPERATIONS, strict=True)
    try:
        for _ in range(ops):
            f = run.rng.choice(files)
            op = run.rng.choices(funcs, weights)[0]
            op(run, f)
    finally:
        for f in files:
            for fd in f.fds:
                os.close(fd)
            f.fds.clear()
    return run


def _chunk_paths(root: Path, arr: zarr.Array) -> dict[tuple[int, ...], Path]:
    grid = [range(-(-n // c)) for n, c in zip(arr.shape, arr.chunks, strict=True)]
    return {coords: root.joinpath("c", *map(str, coords[:-1]), f"{coords[-1]}.tiff")
            for coords in itertools.product(*grid)}


@pytest.mark.parametrize("name", list(STORES))
def test_random_reads_match_one_full_read(tmp_path: Path, mount, request: pytest.FixtureRequest, name: str) -> None:
    src = tmp_path / f"{name}.zarr"
    data = STORES[name](src)
    arr = zarr.open_array(str(src), mode="r")
    m = mount(src, "-o", "ro")
    files = []
    chunk_paths = _chunk_paths(m.path, arr)
    assert sorted(chunk_paths.values()) == sorted(m.path.rglob("*.tiff"))
    for coords, path in chunk_paths.items():
        full = _full_read(path)
        assert len(full) == os.stat(path).st_size
        np.testing.assert_array_equal(tifffile.imread(io.BytesIO(full)), expected_chunk(arr, coords),
                                      err_msg=str(coords))
        files.append(Oracle(path, full))
    image = m.path / "image.ome.tif"
    full = _full_read(image)
    assert len(full) == os.stat(image).st_size
    np.testing.assert_array_equal(tifffile.imread(io.BytesIO(full)), data)
    files.append(Oracle(image, full))
    # the same files, nothing read before: on a read-write mount (its own open and close
    # paths), and on one whose store is not a local directory to zfuse (a remote
    # store's paths: no stored bytes served as they are, every chunk decoded)
    chunks = files[:-1]
    for other in (mount(src, name="rw"), request.getfixturevalue("faulty_mount")(src, "-o", "ro").mount):
        files.append(Oracle(other.path / "image.ome.tif", full))
        files.extend(Oracle(other.path / f.path.relative_to(m.path), f.data) for f in chunks)
    seed = SEED + list(STORES).index(name)
    run = _fsx(files, seed, OPS)
    assert len(run.history) >= OPS
