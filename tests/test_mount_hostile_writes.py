"""Hostile TIFFs written into a real mount: each is refused at close() with EINVAL,
the chunk stays byte-identical, the daemon answers another process's `stat`
while it parses, and its peak memory stays under 1 GiB.

The files are those of `hostile_tiffs` (the FUSE-free suite checks each one's
reason); here the kernel, the worker threads and the journal are in the path.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

import zfuse.testing as h
from zfuse.testing import Mount, errno_of, snapshot, write_file

import stores

pytestmark = pytest.mark.mount

SHAPE = (1024, 1024)  # uint16 chunks: the largest file one may take is 24 MiB
PEAK_BOUND = 2**30  # the daemon's VmHWM after every hostile write
RESPONSIVE = 1.0  # seconds another process's stat of .zfuse/stats may take meanwhile


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _stat_seconds(path: Path) -> float:
    began = time.monotonic()
    subprocess.run(["stat", "-c", "%s", str(path)], check=True, capture_output=True, timeout=60)
    return time.monotonic() - began


def refused_while_responsive(m: Mount, target: Path, data: bytes) -> None:
    """Write `data` onto `target` in a thread; meanwhile another process stats the
    daemon's own file, again and again, each answering within RESPONSIVE s."""
    outcome: list[str] = []
    writer = threading.Thread(target=lambda: outcome.append(write_file(target, data)))
    writer.start()
    slowest = 0.0
    while writer.is_alive():
        slowest = max(slowest, _stat_seconds(m.path / ".zfuse" / "stats"))
    writer.join()
    assert outcome == ["EINVAL"], outcome
    assert slowest < RESPONSIVE, f"a stat took {slowest:.2f} s while the file was parsed"


CASES = h.hostile_tiffs_for_1024_uint16()


def test_hostile_tiffs_are_refused_and_cost_bounded_memory(tmp_path: Path, mount) -> None:
    """[write-5] [write-12] Loops, huge tag counts, 190,000 pages, codec bombs (JPEG 2000
    of 2 x 2 precincts too), empty strips and strips sharing their bytes: EINVAL at close, the store byte-identical, the journal naming the
    reason, the daemon responsive throughout and under 1 GiB at its peak."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(1024, 2048), chunks=SHAPE, dtype="uint16")
    m = mount(src)
    before = snapshot(src)
    target = m.path / "c" / "0" / "1.tiff"
    for name, make in CASES.items():
        data = make()
        refused_while_responsive(m, target, data)
        assert snapshot(src) == before, name
    errors = m.errors()
    for word in ("loops", "more than 18 IFDs", "overlapping", "40000x40000", "8192x8192",
                 "not accepted", "byte count 0", "precincts, more than", "share bytes"):
        assert word in errors, (word, errors[-2000:])
    assert _vm_hwm(m.pid) < PEAK_BOUND, f"peak {_vm_hwm(m.pid) / 2**20:.0f} MiB"
    assert errno_of((m.path / "c" / "0" / "1.tiff").read_bytes) == "ok"
