"""Replacing chunks with real writers on real mounts: nothing is lost, whatever the writer does.

Writers that delete their destination before writing it (`mv` across
filesystems, Bio-Formats `bfconvert -overwrite`), that close and reopen the
file while writing (Bio-Formats), or that die half way: a good file is
stored, a refused or never-completed one leaves the store byte-identical and
the chunk file reading the old values, and the reason is readable in
`.zfuse/errors` and the log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile

from zfuse.testing import snapshot, wait_until

import stores
from tools import bftool

SHAPE, CHUNKS = (16, 32), (8, 16)
KINDS = {
    "v3": lambda p: stores.v3(p, shape=SHAPE, chunks=CHUNKS),
    "sharding_indexed": lambda p: stores.sharded(p, shape=SHAPE, shards=(16, 32), chunks=CHUNKS),
    "sharding_v1+concat_parts": lambda p: stores.stacked(p, shape=SHAPE, chunks=CHUNKS),
}
# converters take seconds between deleting their output and creating it again
LONG_WINDOW = ("-o", "replace_window=120")


def _chunk(data: np.ndarray, i: int = 0, j: int = 1) -> np.ndarray:
    return data[i * 8 : i * 8 + 8, j * 16 : j * 16 + 16]


@pytest.mark.parametrize("kind", list(KINDS))
def test_mv_from_another_filesystem(tmp_path: Path, mount, kind: str) -> None:
    """[ns-4] [write-5] `mv` from another filesystem unlinks the target, creates it and copies:
    a refused file fails mv and costs nothing; a good one is stored."""
    src = tmp_path / "a.zarr"
    data = KINDS[kind](src)
    m = mount(src, *LONG_WINDOW)
    target = m.path / "c" / "0" / "1.tiff"
    before = snapshot(src)
    bad = tmp_path / "bad.tif"
    tifffile.imwrite(bad, np.ones(CHUNKS, "float32"))
    r = subprocess.run(["mv", str(bad), str(target)], capture_output=True, text=True)
    assert r.returncode != 0 and "Invalid argument" in r.stderr
    assert snapshot(src) == before
    np.testing.assert_array_equal(tifffile.imread(target), _chunk(data))
    assert "wrong dtype" in m.errors()
    m.unmount()  # unmount carries out what is deferred: still nothing lost
    assert snapshot(src) == before

    m = mount(src, *LONG_WINDOW)
    good = tmp_path / "good.tif"
    new = stores.values(CHUNKS, "uint16", seed=3)
    tifffile.imwrite(good, new)
    subprocess.run(["mv", str(good), str(m.path / "c" / "0" / "1.tiff")], check=True)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 16:32], new)
    np.testing.assert_array_equal(tifffile.imread(m.path / "c" / "0" / "1.tiff"), new)


@pytest.mark.parametrize("kind", list(KINDS))
def test_bfconvert_overwrite(tmp_path: Path, mount, kind: str) -> None:
    """[write-1] [write-2] [write-5] Bio-Formats (Fiji's exporter) writes a chunk: it deletes
    the target, writes a header, closes, reopens and patches. A good file is stored and
    Bio-Formats reads it back; a refused one leaves the store byte-identical."""
    src = tmp_path / "a.zarr"
    data = KINDS[kind](src)
    m = mount(src, *LONG_WINDOW)
    target = m.path / "c" / "1" / "0.tiff"

    bad = tmp_path / "bad.tif"
    tifffile.imwrite(bad, np.ones(CHUNKS, "float32"))
    before = snapshot(src)
    r = bftool("ImageConverter", "-overwrite", "-nolookup", bad, target, check=False)
    assert r.returncode != 0 or "Exception" in r.stdout + r.stderr
    assert snapshot(src) == before
    np.testing.assert_array_equal(tifffile.imread(target), _chunk(data, 1, 0))
    assert "wrong dtype" in m.errors()

    good = tmp_path / "good.tif"
    new = stores.values(CHUNKS, "uint16", seed=4)
    tifffile.imwrite(good, new)
    bftool("ImageConverter", "-overwrite", "-nolookup", good, target)
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], new)
    # Bio-Formats reads back what it wrote (through zfuse's TIFF of the stored chunk)
    info = bftool("ImageInfo", "-nopix", target).stdout
    assert "Width = 16" in info and "Height = 8" in info and "uint16" in info
    back = tmp_path / "back.tif"
    bftool("ImageConverter", "-nolookup", target, back)
    np.testing.assert_array_equal(tifffile.imread(back), new)
    m.unmount()
    np.testing.assert_array_equal(stores.open_any(src)[8:16, 0:16], new)


WRITE_HALF_AND_DIE = """
import os, signal, sys
data = open(sys.argv[1], "rb").read()
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_TRUNC)
os.write(fd, data[: len(data) // 2])
print("half", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("kind", ["v3", "sharding_indexed"])
def test_writer_killed_half_way_keeps_the_chunk(tmp_path: Path, mount, kind: str) -> None:
    """[write-2] [write-10] a writer SIGKILLed after half a file: the old chunk stays, the
    half file is dropped after the pending timeout, and the log says why."""
    src = tmp_path / "a.zarr"
    data = KINDS[kind](src)
    m = mount(src, "-o", "pending_timeout=1")
    target = m.path / "c" / "0" / "1.tiff"
    good = tmp_path / "good.tif"
    tifffile.imwrite(good, stores.values(CHUNKS, "uint16", seed=5))
    before = snapshot(src)
    r = subprocess.run([sys.executable, "-c", WRITE_HALF_AND_DIE, str(good), str(target)],
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL and "half" in r.stdout
    np.testing.assert_array_equal(tifffile.imread(target), _chunk(data))  # another process: stored
    wait_until(lambda: "incomplete file dropped" in m.errors(), what="the half file to be dropped")
    assert snapshot(src) == before
    np.testing.assert_array_equal(tifffile.imread(target), _chunk(data))
    assert "incomplete file dropped" in m.log()
    assert m.stats()["abandoned_writes"] == 1


def test_incomplete_file_reopened_by_another_writer(tmp_path: Path, mount) -> None:
    """[write-2] a file closed incomplete can be finished by a later writer (`>>` appends)."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=SHAPE, chunks=CHUNKS)
    m = mount(src)
    target = m.path / "c" / "0" / "0.tiff"
    new = stores.values(CHUNKS, "uint16", seed=6)
    tifffile.imwrite(tmp_path / "n.tif", new)
    whole = (tmp_path / "n.tif").read_bytes()
    (tmp_path / "head").write_bytes(whole[:100])
    (tmp_path / "tail").write_bytes(whole[100:])
    subprocess.run(f"cat {tmp_path / 'head'} > {target} && cat {tmp_path / 'tail'} >> {target}",
                   shell=True, check=True)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)
    assert m.stats().get("errors", 0) == 0


def test_pending_file_is_dropped_at_unmount(tmp_path: Path, mount) -> None:
    """[write-2] [cons-3] a never-completed file is dropped at unmount; the store is unchanged."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=SHAPE, chunks=CHUNKS)
    before = snapshot(src)
    m = mount(src)
    tifffile.imwrite(tmp_path / "n.tif", stores.values(CHUNKS, "uint16", seed=7))
    (m.path / "c" / "1" / "1.tiff").write_bytes((tmp_path / "n.tif").read_bytes()[:200])
    m.unmount()
    assert snapshot(src) == before
    assert "incomplete file dropped" in m.log()


def test_refusal_reasons_are_readable_without_root(tmp_path: Path, mount) -> None:
    """[write-5] every refusal is a line of `.zfuse/errors` (time, path, reason), readable
    by the mount's user; the ImageMagick pattern (O_TRUNC, close empty, write) is no error."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=SHAPE, chunks=CHUNKS)
    m = mount(src)
    target = m.path / "c" / "0" / "0.tiff"
    os.close(os.open(target, os.O_WRONLY | os.O_TRUNC))
    tifffile.imwrite(target, stores.values(CHUNKS, "uint16", seed=8))
    assert m.errors() == ""
    tifffile.imwrite(tmp_path / "small.tif", np.ones((3, 3), "uint16"))
    with pytest.raises(OSError):  # (tifffile.imwrite itself ignores errors of close)
        with open(target, "wb") as f:
            f.write((tmp_path / "small.tif").read_bytes())
    (line,) = m.errors().splitlines()
    stamp, path, reason = line.split("\t")
    assert path == "c/0/0.tiff" and "wrong shape" in reason and stamp[:2] == "20"
    assert os.stat(m.path / ".zfuse" / "errors").st_mode & 0o444 == 0o444
