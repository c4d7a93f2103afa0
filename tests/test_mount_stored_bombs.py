"""Hostile stores on a real mount: a stored chunk that decompresses to far more than a
chunk holds (a 16 KB object of 512 MiB) gives EIO for that file only, one log line
naming the key and no traceback, while the daemon's peak memory stays under 1 GiB."""

from __future__ import annotations

import gzip
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from zfuse.testing import assert_no_traceback, errno_of

pytestmark = pytest.mark.mount

BOMB = 2**29  # bytes each crafted object decompresses to


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_decompression_bombs_in_the_store_fail_that_file_only(tmp_path: Path, mount) -> None:
    """[read-5] [read-10] zstd (v3) and zlib (v2) objects of 512 MiB of zeros in 64x64 uint8 chunks."""
    zeros = np.zeros(BOMB, np.uint8)
    v3 = zarr.create_array(str(tmp_path / "v3.zarr"), shape=(128, 128), chunks=(64, 64), dtype="u1",
                           compressors=[ZstdCodec()])
    v3[:] = 7
    (tmp_path / "v3.zarr" / "c" / "0" / "0").write_bytes(numcodecs.Zstd(level=1).encode(zeros))
    v2 = zarr.create_array(str(tmp_path / "v2.zarr"), shape=(128, 128), chunks=(64, 64), dtype="u1",
                           zarr_format=2, compressors=numcodecs.Zlib(level=1))
    v2[:] = 9
    (tmp_path / "v2.zarr" / "0.0").write_bytes(numcodecs.Zlib(level=1).encode(zeros))
    (tmp_path / "v2.zarr" / "0.1").write_bytes(gzip.compress(b"not what the array says"))
    del zeros
    for name, bombs, good in (("v3.zarr", ["c/0/0.tiff"], "c/1/1.tiff"),
                              ("v2.zarr", ["0.0.tiff", "0.1.tiff"], "1.1.tiff")):
        m = mount(tmp_path / name)
        for bomb in bombs:
            assert errno_of((m.path / bomb).read_bytes) == "EIO", bomb
        assert (m.path / good).read_bytes()
        assert "decompress" in m.log() or "does not decode" in m.log(), m.log()
        assert_no_traceback(m)
        assert _vm_hwm(m.pid) < BOMB, f"peak {_vm_hwm(m.pid) / 2**20:.0f} MiB"
