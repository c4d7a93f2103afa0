"""A failing store fails that file only, within the timeout, the stored chunk unchanged.

Real mounts of a daemon whose store is wrapped in `zfuse.testing.FaultyStore`
(`tests/faulty_daemon.py`): the rules are written to a control file the daemon reads
again when it changes, and each fault it injects is a line of a journal, which the
tests wait on (never on time). The wrapper sits under zfuse's `MeteredStore` as a
remote store would, so these are the paths of remote stores: every chunk read and
written through zarr's event loop and bounded by `-o timeout=`. (The local-directory
shortcuts, reads and writes in worker threads, are not behind the wrapper; their
failures are the files themselves: tests/test_mount_errors.py.)
"""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

from zfuse.testing import (
    Fault,
    Mount,
    MountError,
    Mounts,
    assert_no_traceback,
    errno_of,
    read_fault_journal,
    snapshot,
    start_mount,
    tiff_bytes,
    wait_until,
    write_faults,
    write_file,
)

import stores
from conftest import TEST_REPLACE_WINDOW, _mount_or_fail
from test_mount_read import expected_chunk

pytestmark = pytest.mark.mount

DAEMON = Path(__file__).with_name("faulty_daemon.py")
TIMEOUT = 1.0  # -o timeout= of the mounts that hang
BOUND = TIMEOUT * 3 + 5  # "within the timeout", generously: never a timing in pass/fail otherwise


@dataclass
class FaultyMount:
    mount: Mount
    control: Path
    journal: Path

    @property
    def path(self) -> Path:
        return self.mount.path

    def faults(self, *rules: Fault) -> None:
        """Replace the daemon's rules (none: every request goes through; ends hangs)."""
        write_faults(self.control, rules)

    def injected(self, kind: str | None = None) -> list[dict]:
        return [e for e in read_fault_journal(self.journal) if kind is None or e["kind"] == kind]


@pytest.fixture
def faulty_mount(tmp_path: Path) -> Iterator[Callable[..., FaultyMount]]:
    """faulty_mount(source, *cli_args, faults=[...]) -> FaultyMount; unmounted at teardown.
    (Mountpoints `faultyN`, beside the `mount` fixture's `mntN` in the same directory.)"""
    with Mounts(tmp_path) as mounts:

        def make(source: Path, *args: str, faults: tuple[Fault, ...] | list[Fault] = ()) -> FaultyMount:
            n = len(mounts.mounts)
            control, journal = tmp_path / f"faults{n}.json", tmp_path / f"journal{n}"
            write_faults(control, faults)
            command = [sys.executable, str(DAEMON), str(control), str(journal)]
            m = _mount_or_fail(lambda: mounts.start(
                source, "-o", f"replace_window={TEST_REPLACE_WINDOW}", *args, name="faulty", command=command))
            return FaultyMount(m, control, journal)

        yield make


def chunk_files(root: Path, arr: zarr.Array) -> dict[tuple[int, ...], Path]:
    """Every chunk file by its path (not listed: a listing may need what fails)."""
    grid = [range(-(-n // c)) for n, c in zip(arr.shape, arr.chunks, strict=True)]
    return {coords: root.joinpath("c", *map(str, coords[:-1]), f"{coords[-1]}.tiff")
            for coords in itertools.product(*grid)}


def read_outcome(path: Path) -> np.ndarray | str:
    """The file's pixels, or the errno name its read failed with."""
    try:
        return tifffile.imread(path)
    except OSError as e:
        return errno.errorcode[e.errno]


def assert_only_failing(root: Path, arr: zarr.Array, failing: set[tuple[int, ...]], code: str = "EIO") -> None:
    """Every chunk file of `failing` fails with `code`; every other reads the stored values."""
    files = chunk_files(root, arr)
    assert failing <= set(files)
    for coords, f in files.items():
        got = read_outcome(f)
        if coords in failing:
            assert isinstance(got, str) and got == code, (coords, got)
        else:
            assert not isinstance(got, str), (coords, got)
            np.testing.assert_array_equal(got, expected_chunk(arr, coords), err_msg=str(coords))


# -- errors -----------------------------------------------------------------------------------


def test_a_failing_chunk_fails_that_file_only(tmp_path: Path, faulty_mount) -> None:
    """A get that fails gives EIO for that chunk file only: its neighbours read normally,
    `stat` still answers (no data is read for it), the failure is journaled, and nothing
    of it is kept: once the store answers again, the file reads its values."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    arr = zarr.open_array(str(src), mode="r")
    fm = faulty_mount(src, faults=[Fault("error", pattern="c/0/1")])
    assert os.stat(fm.path / "c" / "0" / "1.tiff").st_size > 0
    assert_only_failing(fm.path, arr, {(0, 1)})
    assert {e["key"] for e in fm.injected()} == {"c/0/1"}
    assert "c/0/1" in fm.mount.errors()
    assert errno_of(lambda: (fm.path / "image.ome.tif").read_bytes()) == "EIO"  # its tiles cover the chunk
    fm.faults()
    assert_only_failing(fm.path, arr, set())
    np.testing.assert_array_equal(tifffile.imread(fm.path / "image.ome.tif"), arr[:])
    assert_no_traceback(fm.mount)


@pytest.mark.parametrize(("fault", "code"), [
    (Fault("error", pattern="c/2/1", errno=errno.EACCES), "EACCES"),  # the store's errno reaches the reader
    (Fault("error", pattern="c/2/1", exception=ConnectionResetError(errno.ECONNRESET, "reset")), "ECONNRESET"),
    (Fault("error", pattern="c/2/1", exception=RuntimeError("a bug in a store")), "EIO"),
    (Fault("error", pattern="c/2/1", exception=TimeoutError("slow")), "EIO"),
])
def test_a_store_error_carries_its_errno(tmp_path: Path, faulty_mount, fault: Fault, code: str) -> None:
    src = tmp_path / "a.zarr"
    stores.v3(src)
    fm = faulty_mount(src, faults=[fault])
    assert_only_failing(fm.path, zarr.open_array(str(src), mode="r"), {(2, 1)}, code)


def test_a_failing_shard_fails_its_inner_chunks_only(tmp_path: Path, faulty_mount) -> None:
    """Sharded: an inner chunk's ranged read failing fails the chunk files of that shard,
    the index read failing too; the other shard's files read normally."""
    src = tmp_path / "s.zarr"
    stores.sharded(src)  # shards (16, 32) of chunks (8, 16): shard c/0/0 holds chunks (0..1, 0..1)
    arr = zarr.open_array(str(src), mode="r")
    in_shard = {(0, 0), (0, 1), (1, 0), (1, 1)}
    fm = faulty_mount(src, faults=[Fault("error", pattern="c/0/0", byte_range="suffix")])  # the index
    assert_only_failing(fm.path, arr, in_shard)
    # the listings of the shard's chunks need its index: they fail too, no others
    assert [errno_of(os.listdir, fm.path / "c" / d) for d in "012"] == ["EIO", "EIO", "ok"]
    fm.faults(Fault("error", pattern="c/0/0", byte_range="range"))  # the index read now, not the chunks
    assert_only_failing(fm.path, arr, in_shard)
    assert {(e["key"], e["kind"]) for e in fm.injected()} == {("c/0/0", "error")}
    fm.faults()
    assert_only_failing(fm.path, arr, set())
    assert_no_traceback(fm.mount)


# -- short reads --------------------------------------------------------------------------------


SHORT_CASES = {
    "raw-one-byte-short": ("raw", Fault("short", pattern="c/0/1")),
    "raw-empty": ("raw", Fault("short", pattern="c/0/1", keep=0)),
    "zstd-one-byte-short": ("zstd", Fault("short", pattern="c/0/1")),
    "zstd-half": ("zstd", Fault("short", pattern="c/0/1", keep=20)),
    "crc32c-one-byte-short": ("crc32c", Fault("short", pattern="c/0/1")),
    "sharded-inner-chunk": ("sharded", Fault("short", pattern="c/0/0", byte_range="range")),
    "sharded-index": ("sharded", Fault("short", pattern="c/0/0", byte_range="suffix")),
}


@pytest.mark.parametrize("case", list(SHORT_CASES))
def test_a_short_read_gives_eio_never_wrong_pixels(tmp_path: Path, faulty_mount, case: str) -> None:
    """A store answering fewer bytes than it holds (a truncated object, a short range)
    gives EIO for the chunk files it feeds, never other pixels; the whole-image file
    covering them fails its reads the same way; the other files read normally."""
    codecs, fault = SHORT_CASES[case]
    src = tmp_path / "a.zarr"
    if codecs == "sharded":
        stores.sharded(src)
        failing = {(0, 0), (0, 1), (1, 0), (1, 1)}
    else:
        stores.v3(src, codecs=codecs)
        failing = {(0, 1)}
    arr = zarr.open_array(str(src), mode="r")
    fm = faulty_mount(src, faults=[fault])
    assert_only_failing(fm.path, arr, failing)
    assert fm.injected("short")
    if case == "sharded-index":  # the listings of the shard's chunks need its index
        assert [errno_of(os.listdir, fm.path / "c" / d) for d in "012"] == ["EIO", "EIO", "ok"]
    assert errno_of(lambda: (fm.path / "image.ome.tif").read_bytes()) == "EIO"
    fm.faults()
    assert_only_failing(fm.path, arr, set())
    np.testing.assert_array_equal(tifffile.imread(fm.path / "image.ome.tif"), arr[:])


# -- writes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "key", "fault", "code"), [
    ("zstd", "c/0/0", Fault("error", pattern="c/0/0", ops=("set",), errno=errno.ENOSPC), "ENOSPC"),
    ("zstd", "c/0/0", Fault("error", pattern="c/0/0", ops=("set",), exception=RuntimeError("lost")), "EIO"),
    ("sharded", "c/0/0", Fault("error", pattern="c/0/0", ops=("set",)), "EIO"),
    ("sharded", "c/0/0", Fault("error", pattern="c/0/0", byte_range="suffix"), "EIO"),  # the shard's index unreadable
])
def test_a_failing_store_write_fails_close_and_keeps_the_chunk(
        tmp_path: Path, faulty_mount, layout: str, key: str, fault: Fault, code: str) -> None:
    """A write whose store `set` fails (or whose shard cannot be read to be rewritten)
    makes close() fail with the store's errno (EIO when it has none); the stored objects
    are byte-identical, the file reads the stored values again, the failure is in
    `.zfuse/errors`; once the store answers, the same write is stored."""
    src = tmp_path / "a.zarr"
    if layout == "sharded":
        stores.sharded(src)
    else:
        stores.v3(src)
    arr = zarr.open_array(str(src), mode="r")
    fm = faulty_mount(src, faults=[fault])
    target = fm.path / "c" / "0" / "0.tiff"  # chunk (0, 0): in shard c/0/0 when sharded
    before = snapshot(src)
    new = np.full(arr.chunks, 7, dtype=arr.dtype)
    assert write_file(target, tiff_bytes(new)) == code
    assert snapshot(src) == before
    assert fm.injected()
    assert key in fm.mount.errors()
    fm.faults()
    np.testing.assert_array_equal(tifffile.imread(target), expected_chunk(arr, (0, 0)))
    assert write_file(target, tiff_bytes(new)) == "ok"
    np.testing.assert_array_equal(zarr.open_array(str(src), mode="r")[0:8, 0:16], 7)
    np.testing.assert_array_equal(tifffile.imread(target), new)


# -- slow and hung stores ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["zstd", "sharded"])
def test_a_slow_store_answers_correctly(tmp_path: Path, faulty_mount, layout: str) -> None:
    """Every get delayed: every file still reads the stored values (no timeout set)."""
    src = tmp_path / "a.zarr"
    data = stores.sharded(src) if layout == "sharded" else stores.v3(src)
    arr = zarr.open_array(str(src), mode="r")
    fm = faulty_mount(src, faults=[Fault("delay", pattern="*", seconds=0.05, ops=("get", "exists", "list"))])
    assert_only_failing(fm.path, arr, set())
    np.testing.assert_array_equal(tifffile.imread(fm.path / "image.ome.tif"), data)
    assert fm.injected("delay")
    assert_no_traceback(fm.mount)


READ_IN_CHILD = """
import errno, sys, time
t = time.monotonic()
try:
    with open(sys.argv[1], "rb") as f:
        f.read()
    outcome = "ok"
except OSError as e:
    outcome = errno.errorcode[e.errno]
print(outcome, time.monotonic() - t)
"""


def _stat_in_child(path: Path) -> None:
    """Another process's `os.stat` of the path answers (bounded: a hung daemon fails it)."""
    subprocess.run([sys.executable, "-c", "import os, sys; os.stat(sys.argv[1])", str(path)],
                   check=True, timeout=BOUND)


def test_a_hung_get_fails_the_read_within_the_timeout(tmp_path: Path, faulty_mount) -> None:
    """A get that never answers: the read of that file fails with EIO within the timeout
    (`-o timeout=`), while the daemon keeps answering others (another process's stat of
    `.zfuse/stats`, another chunk's read); once the store answers, the file reads."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    arr = zarr.open_array(str(src), mode="r")
    fm = faulty_mount(src, "-o", f"timeout={TIMEOUT:g}", faults=[Fault("hang", pattern="c/1/0")])
    target = fm.path / "c" / "1" / "0.tiff"
    child = subprocess.Popen([sys.executable, "-c", READ_IN_CHILD, str(target)],
                             stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: fm.injected("hang"), timeout=BOUND, what="the get to reach its hang")
        _stat_in_child(fm.path / ".zfuse" / "stats")
        np.testing.assert_array_equal(tifffile.imread(fm.path / "c" / "0" / "0.tiff"), expected_chunk(arr, (0, 0)))
        out, _ = child.communicate(timeout=BOUND)
    finally:
        child.kill()
        child.wait()
    outcome, seconds = out.split()
    assert outcome == "EIO", out
    assert float(seconds) < BOUND
    assert fm.mount.stats().get("store_timeouts", 0) >= 1
    fm.faults()
    np.testing.assert_array_equal(tifffile.imread(target), expected_chunk(arr, (1, 0)))
    assert_no_traceback(fm.mount)


def test_a_hung_listing_fails_ls_within_the_timeout(tmp_path: Path, faulty_mount) -> None:
    """A listing that never answers: `ls` of that directory fails within the timeout; the
    daemon keeps answering. (Bounded here: released after BOUND s, so a hang fails the test.)"""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    fm = faulty_mount(src, "-o", f"timeout={TIMEOUT:g}", faults=[Fault("hang", pattern="c/1/*", ops=("list",))])
    start = time.monotonic()
    child = subprocess.Popen(["ls", str(fm.path / "c" / "1")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: fm.injected("hang"), timeout=BOUND, what="the listing to reach its hang")
        _stat_in_child(fm.path / ".zfuse" / "stats")
        try:
            child.wait(timeout=max(BOUND - (time.monotonic() - start), 0.1))
        except subprocess.TimeoutExpired:
            fm.faults()  # release it, so that the daemon and `ls` end
            child.wait(timeout=30)
            pytest.fail(f"ls still hung after {BOUND:g} s (timeout={TIMEOUT:g})")
    finally:
        child.kill()
        child.wait()
    assert child.returncode != 0
    assert b"Input/output error" in child.stderr.read()  # type: ignore[union-attr]


def test_start_mount_refuses_a_mount_point_in_use(tmp_path: Path, mount) -> None:
    """`zfuse.testing.start_mount` on a live mount point fails at once: that the path is a
    mount would otherwise pass for the new daemon's mount being live."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    m = mount(src)
    with pytest.raises(MountError, match="a mount point already"):
        start_mount([src], m.path)


def test_one_read_of_a_big_file_waits_one_timeout(tmp_path: Path, faulty_mount) -> None:
    """One read() of a whole 2 MiB chunk file (several kernel read requests) whose chunk
    hangs: the requests share the one failed get, so the read fails within the timeout
    and the store is asked once or twice, not once per request."""
    timeout = 0.5
    src = tmp_path / "big.zarr"
    stores.v3(src, shape=(2048, 1024), chunks=(1024, 1024))
    fm = faulty_mount(src, "-o", f"timeout={timeout:g}", faults=[Fault("hang", pattern="c/1/0")])
    target = fm.path / "c" / "1" / "0.tiff"
    fd = os.open(target, os.O_RDONLY)
    try:
        start = time.monotonic()
        assert errno_of(os.pread, fd, os.fstat(fd).st_size, 0) in ("EIO", "ok")  # ok: a short read
        seconds = time.monotonic() - start
    finally:
        os.close(fd)
    hung = len(fm.injected("hang"))
    assert hung <= 2 and seconds < timeout * 3 + 5, (hung, seconds)
