"""The write path's clock and bounds, with plain calls (no FUSE): when the daemon's tick
next has something to do, on the writes' own clock, and the budget of all write buffers.

The deadlines of deferred deletions and pending files are taken on the clock the
`Writes` object was given (time.monotonic in the daemon); trio's clock has another
origin, so subtracting a deadline from `trio.current_time()` made the tick wake 50
times a second while anything was scheduled."""

from __future__ import annotations

import os
from pathlib import Path

from zfuse.view.writes import Writes

import stores
from test_fs import CHUNK, Clock, make_fs


def test_due_in_counts_down_on_the_writes_clock(tmp_path: Path) -> None:
    clock = Clock()
    stores.v3(tmp_path / "a.zarr")
    fs, k = make_fs(tmp_path / "a.zarr", clock, replace_window=5.0, pending_timeout=60.0)
    writes: Writes = fs.writes
    assert writes.due_in() is None  # nothing scheduled: the tick sleeps its longest
    k.unlink(CHUNK)
    assert writes.due_in() == 5.0
    clock.now += 3.0
    assert writes.due_in() == 2.0
    clock.now += 10.0
    assert writes.due_in() == 0.0  # overdue: at once, never negative
    k.tick()
    assert writes.due_in() is None


def test_the_daemon_tick_sleeps_on_the_writes_clock() -> None:
    """With a deletion due in 5 s on the writes' clock and trio's clock far from it (as
    its real origin is), the tick wakes 4 times a second at most, not 50."""
    import trio
    import trio.testing

    from zfuse import daemon

    class Due:
        def due_in(self) -> float:
            return 5.0

        def next_deadline(self) -> float:
            return 1005.0  # on a clock near 1000: what the old loop subtracted trio's time from

    class Fs:
        writes = Due()
        ticks = 0

        async def tick(self) -> None:
            Fs.ticks += 1

    class Ops:
        fs = Fs()

    async def main() -> None:
        with trio.move_on_after(10.0):
            await daemon._tick(Ops())

    clock = trio.testing.MockClock(autojump_threshold=0)
    clock.jump(1e6)  # trio's clock has its own origin, far from time.monotonic's
    trio.run(main, clock=clock)
    assert 30 <= Fs.ticks <= 41, Fs.ticks


def test_write_buffers_share_one_budget(tmp_path: Path) -> None:
    """[write-12] files being written hold their bytes in the daemon: together at most
    `buffer_budget`; a write past it fails with ENOSPC, the other files go on."""
    import errno

    import numpy as np
    import pytest

    from zfuse.fs import FsError
    from zfuse.testing import tiff_bytes

    clock = Clock()
    stores.v3(tmp_path / "a.zarr")
    fs, k = make_fs(tmp_path / "a.zarr", clock, replace_window=5.0, pending_timeout=60.0)
    first = tiff_bytes(stores.values((8, 16), "uint16", seed=3))
    fs.writes.buffer_budget = len(first) + 100
    a = k.open("c/0/0.tiff", os.O_WRONLY | os.O_TRUNC)
    k.write(a, first)
    b = k.open("c/0/1.tiff", os.O_WRONLY | os.O_TRUNC)
    with pytest.raises(FsError) as refused:
        k.write(b, first)
    assert refused.value.errno == errno.ENOSPC
    k.close(a)  # the first file commits: its buffer is let go
    k.write(b, first)
    k.close(b)
    arr = stores.open_any(tmp_path / "a.zarr")
    np.testing.assert_array_equal(arr[0:8, 16:30], stores.values((8, 16), "uint16", seed=3)[:, :14])


def test_truncate_and_empty_files_count_against_the_daemon_limits(tmp_path: Path, monkeypatch) -> None:
    """[write-12] ftruncate grows a file's buffer as a write does, and is refused past the
    budget with ENOSPC (180 scratch files truncated to their limit held 4.3 GiB); files
    held for writers (empty ones too, ~2 KB each) are at most FILES_HELD_MAX: creating
    one more is ENOSPC; removing one lets the next be made."""
    import errno

    import pytest

    from zfuse import defaults
    from zfuse.fs import FsError

    clock = Clock()
    stores.v3(tmp_path / "a.zarr")
    fs, k = make_fs(tmp_path / "a.zarr", clock, replace_window=5.0, pending_timeout=60.0)
    fs.writes.buffer_budget = 1000
    scratch = k.open("c/0/scratch", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with pytest.raises(FsError) as refused:  # ftruncate(fd, 5000)
        k.call(fs.setattr, k.walk("c/0/scratch"), 5000, None, False, scratch)
    assert refused.value.errno == errno.ENOSPC
    k.close(scratch)
    monkeypatch.setattr(defaults, "FILES_HELD_MAX", 3)
    for name in ("e1", "e2"):
        k.close(k.open(f"c/0/{name}", os.O_WRONLY | os.O_CREAT))
    with pytest.raises(FsError) as refused:
        k.open("c/0/e3", os.O_WRONLY | os.O_CREAT)
    assert refused.value.errno == errno.ENOSPC
    k.unlink("c/0/e1")
    k.close(k.open("c/0/e3", os.O_WRONLY | os.O_CREAT))
    # an existing chunk opened O_TRUNC and closed empty is held (pending) too
    with pytest.raises(FsError) as refused:
        k.open("c/0/0.tiff", os.O_WRONLY | os.O_TRUNC)
    assert refused.value.errno == errno.ENOSPC


def test_every_buffer_counts_against_the_budget_before_it_is_loaded(tmp_path: Path) -> None:
    """[write-12] nothing escapes the write buffers' budget: a file unlinked while open
    still counts (139 files filled after their unlink held 3.25 GiB the budget never
    saw), a stored chunk is counted before it is loaded for an O_APPEND write (it was
    loaded first, then refused), and a read through an O_RDWR descriptor loads nothing
    (20 such reads held 2.5 times the budget)."""
    import errno

    import pytest

    from zfuse.fs import FsError

    stores.v3(tmp_path / "a.zarr", shape=(64, 256), chunks=(32, 32), dtype="uint16")  # 2 KiB chunks
    fs, k = make_fs(tmp_path / "a.zarr", Clock(), replace_window=5.0, pending_timeout=60.0)
    size = fs.view.array_at(("c",))[0].file_size((0, 0))
    fs.writes.buffer_budget = 4 * size

    def held() -> int:
        states = [*fs.writes.states.values(), *fs.writes.detached.values()]
        return sum(len(s.buffer) for s in states if s.buffer is not None)

    readers = [k.open(f"c/0/{i}.tiff", os.O_RDWR) for i in range(8)]
    for fh in readers:
        assert len(k.read(fh, 1 << 20)) == size
    assert held() == 0
    for fh in readers:
        k.close(fh)

    appenders = [k.open(f"c/1/{i}.tiff", os.O_WRONLY | os.O_APPEND) for i in range(6)]
    outcomes = []
    for fh in appenders:
        try:
            k.write(fh, b"x")
            outcomes.append("ok")
        except FsError as e:
            outcomes.append(errno.errorcode[e.errno])
    assert outcomes.count("ok") == 3 and outcomes.count("ENOSPC") == 3, outcomes
    assert held() <= fs.writes.buffer_budget
    for fh in appenders:
        fs.release(fh)

    fh = k.open("c/0/scratch", os.O_WRONLY | os.O_CREAT)
    k.unlink("c/0/scratch")
    with pytest.raises(FsError) as refused:
        for off in range(0, 8 * size, size):
            k.write(fh, bytes(size), off)
    assert refused.value.errno == errno.ENOSPC
    assert held() <= fs.writes.buffer_budget
    fs.release(fh)
    assert not fs.writes.detached  # (let go with its last handle)


def test_a_file_open_for_writing_keeps_its_bytes_when_unlinked_or_replaced(tmp_path: Path) -> None:
    """[ns-4] a chunk open O_RDWR and read (its stored bytes, read where they are: not
    loaded), then unlinked, or another chunk renamed onto it: the descriptor still reads
    its own bytes (it read nothing after the unlink, the replacement's after the rename)."""
    stores.v3(tmp_path / "a.zarr", shape=(64, 256), chunks=(32, 32), dtype="uint16")
    fs, k = make_fs(tmp_path / "a.zarr", Clock(), replace_window=5.0, pending_timeout=60.0)
    fh = k.open("c/0/0.tiff", os.O_RDWR)
    own = k.read(fh, 1 << 20)
    k.unlink("c/0/0.tiff")
    assert k.read(fh, 1 << 20) == own
    fs.release(fh)
    fh = k.open("c/0/2.tiff", os.O_RDWR)
    own = k.read(fh, 1 << 20)
    other = k.read_file("c/0/3.tiff")
    k.rename("c/0/3.tiff", "c/0/2.tiff")
    assert own != other and k.read(fh, 1 << 20) == own
    fs.release(fh)


def test_readers_of_a_detached_file_keep_it_counted(tmp_path: Path) -> None:
    """[write-12] a scratch file read by another descriptor, its writer closed, then
    unlinked: its bytes count against the budget until the reader closes too (20 such
    files held 5 times the budget, counted 0)."""
    import errno

    import pytest

    from zfuse.fs import FsError

    stores.v3(tmp_path / "a.zarr", shape=(64, 256), chunks=(32, 32), dtype="uint16")
    fs, k = make_fs(tmp_path / "a.zarr", Clock(), replace_window=5.0, pending_timeout=60.0)
    size = fs.view.array_at(("c",))[0].file_size((0, 0))
    fs.writes.buffer_budget = 4 * size
    readers = []
    with pytest.raises(FsError) as refused:
        for i in range(20):
            writer = k.open(f"c/0/s{i}", os.O_WRONLY | os.O_CREAT)
            k.write(writer, bytes(size))
            readers.append(k.open(f"c/0/s{i}", os.O_RDONLY))
            k.close(writer)
            k.unlink(f"c/0/s{i}")
    assert refused.value.errno == errno.ENOSPC and len(readers) <= 4
    assert len(fs.writes.detached) == len(readers)
    for fh in readers:
        fs.release(fh)
    assert not fs.writes.detached
