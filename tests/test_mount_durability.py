"""What the daemon's system calls show about durability (strace attached to the
daemon): with the default `durability=disk` every stored object is fdatasync'ed
before it replaces the old one; with `durability=process` nothing is synced at
close, and an application's fsync() syncs the filesystem."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from zfuse.testing import tiff_bytes

import stores
from tools import requires


class _Strace:
    """strace attached to every thread of a running process, writing to `out`."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            ["strace", "-f", "-y", "-qq", "-e", "trace=fdatasync,fsync,sync,syncfs,sync_file_range,rename,renameat,renameat2",
             "-o", str(out), "-p", str(pid)],
            stderr=subprocess.PIPE, text=True,
        )
        # attached once every thread of the daemon shows strace as its tracer
        deadline = time.monotonic() + 20
        while not self._tracing(pid):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.skip(f"strace cannot attach here: {self.proc.stderr.read() if self.proc.stderr else ''}")
            time.sleep(0.02)

    def _tracing(self, pid: int) -> bool:
        """Every thread of `pid` has strace as its tracer."""
        tasks = os.listdir(f"/proc/{pid}/task")
        for tid in tasks:
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            if re.search(r"^TracerPid:\s+0$", status, re.M):
                return False
        return True

    def stop(self) -> list[str]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=20)
        return self.out.read_text().splitlines()


def _chunk_syscalls(lines: list[str], key_path: str, sync: str = "fdatasync") -> tuple[list[int], list[int]]:
    """Line numbers of `sync` calls on the chunk's temporary files, and of renames onto it."""
    # names appear whole ("/store/c/0/0") or relative to a directory descriptor, as the
    # store opens and renames inside its own directory ([outside-1]): 15</store/c/0>, "0"
    folder, name = re.escape(os.path.dirname(key_path)), re.escape(os.path.basename(key_path))
    tmp = folder + r'(/|>, ")\.' + name + r'\.[^.>"]+\.tmp'
    target = f'("{re.escape(key_path)}"|{folder}>, "{name}")'
    syncs = [i for i, line in enumerate(lines) if f"{sync}(" in line and re.search(tmp, line)]
    renames = [i for i, line in enumerate(lines) if "rename" in line and re.search(tmp, line)
               and line.rstrip().endswith("= 0") and re.search(target, line)]
    return syncs, renames


@pytest.mark.parametrize("layout", ["v3", "sharded"])
def test_disk_durability_syncs_each_object_before_replacing_it(tmp_path: Path, mount, layout: str) -> None:
    """[write-10] durability=disk: the written chunk's object is fdatasync'ed, then renamed
    over the old one, once per close."""
    requires("strace")
    src = tmp_path / "a.zarr"
    (stores.v3 if layout == "v3" else stores.sharded)(src)
    m = mount(src)
    tif = tiff_bytes(stores.values((8, 16), "uint16", seed=11))
    trace = _Strace(m.pid, tmp_path / "trace.txt")
    try:
        for _ in range(2):
            (m.path / "c" / "0" / "0.tiff").write_bytes(tif)
    finally:
        lines = trace.stop()
    key = str(src / "c" / "0" / "0")
    syncs, renames = _chunk_syscalls(lines, key)
    assert len(renames) == 2, lines
    assert len(syncs) == 2, lines
    assert syncs[0] < renames[0] < syncs[1] < renames[1], lines
    # the new object swaps names with the old one, which is then freed in the background
    assert all("RENAME_EXCHANGE" in lines[i] for i in renames), lines


def test_process_durability_syncs_only_on_fsync(tmp_path: Path, mount) -> None:
    """[write-10] durability=process: close() renames without fdatasync; fsync() syncs."""
    requires("strace")
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src, "-o", "durability=process")
    tif = tiff_bytes(stores.values((8, 16), "uint16", seed=12))
    trace = _Strace(m.pid, tmp_path / "trace.txt")
    try:
        (m.path / "c" / "0" / "0.tiff").write_bytes(tif)
        with open(m.path / "c" / "0" / "1.tiff", "wb") as f:
            f.write(tif)
            f.flush()
            os.fsync(f.fileno())
    finally:
        lines = trace.stop()
    syncs, renames = _chunk_syscalls(lines, str(src / "c" / "0" / "0"))
    assert len(renames) == 1 and not syncs, lines
    assert not [line for line in lines if "fdatasync(" in line], lines
    assert [line for line in lines if re.search(r"\bsync\(\)", line)], lines  # the fsync()
    # the data's writeback starts before the swap, as ext4 does before a plain rename
    # over a file: a journal commit of the swap then waits for the data (power cut:
    # old or new object, not an empty one)
    started, _ = _chunk_syscalls(lines, str(src / "c" / "0" / "0"), sync="sync_file_range")
    assert len(started) == 1 and started[0] < renames[0], lines
    assert "RENAME_EXCHANGE" in lines[renames[0]], lines
