"""The filesystem layer (`zfuse.fs`) driven by plain calls: no kernel, no FUSE, no sleeps.

The `Kernel` class below plays the kernel's part: it resolves paths by lookups,
turns an open with O_CREAT of a missing name into create, and records the
cache invalidations zfuse asks for. Time is a fake clock moved by hand. Each
test states a rule of SEMANTICS.md (tags in docstrings) as decided by the
filesystem layer; real-mount tests check what only the kernel decides.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile
import trio
import trio.lowlevel
import trio.testing
import zarr

from zfuse.daemon import MountConfig
from zfuse.fs import ATTR_TIMEOUT, ROOT_INODE, FileSystem, FsError
from zfuse.handles import StoredChunkHandle
from zfuse.open_view import make_view
from zfuse.stats import Stats

import stores

WRITER, OTHER = 100, 200  # process ids


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Kernel:
    """The kernel's part, modelled: path walks, O_CREAT, and recorded invalidations."""

    def __init__(self, fs: FileSystem) -> None:
        self.fs = fs
        self.invalidated: list[int] = []
        self.forgotten_names: list[tuple[int, str]] = []
        self.no_flush = False

    # Kernel protocol (called by fs)
    def invalidate_inode(self, ino: int) -> None:
        self.invalidated.append(ino)

    def invalidate_inode_here(self, ino: int) -> None:
        self.invalidated.append(ino)

    def invalidate_entry(self, parent_ino: int, name: str) -> None:
        self.forgotten_names.append((parent_ino, name))

    # system calls, as the VFS turns them into filesystem operations
    def call(self, fn, *args):  # noqa: ANN001, ANN201
        return trio.run(fn, *args)

    def walk(self, path: str, pid: int = WRITER) -> int:
        ino = ROOT_INODE
        for name in [p for p in path.split("/") if p]:
            ino = self.call(self.fs.lookup, ino, name, pid).ino
        return ino

    def parent_and_name(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        return self.walk(head), name

    def stat(self, path: str, pid: int = WRITER):  # noqa: ANN201
        return self.call(self.fs.getattr, self.walk(path, pid), pid)

    def exists(self, path: str, pid: int = WRITER) -> bool:
        try:
            self.walk(path, pid)
            return True
        except FsError as e:
            assert e.errno == errno.ENOENT
            return False

    def open(self, path: str, flags: int = os.O_RDONLY, pid: int = WRITER) -> int:
        try:
            ino = self.walk(path, pid)
        except FsError as e:
            if e.errno != errno.ENOENT or not flags & os.O_CREAT:
                raise
            parent, name = self.parent_and_name(path)
            reply, _ = self.call(self.fs.create, parent, name, flags, pid)
            return reply.fh
        return self.call(self.fs.open, ino, flags, pid).fh

    def read(self, fh: int, size: int = 1 << 30, off: int = 0) -> bytes:
        return self.call(self.fs.read, fh, off, size)

    def write(self, fh: int, data: bytes, off: int = 0) -> None:
        assert self.call(self.fs.write, fh, off, data) == len(data)

    def close(self, fh: int) -> None:
        """close(2) of the last descriptor: flush, then release (as the kernel does). A FLUSH
        answered ENOSYS is a success, and the kernel sends none again on this mount."""
        try:
            if not self.no_flush:
                try:
                    self.call(self.fs.flush, fh)
                except FsError as e:
                    if e.errno != errno.ENOSYS:
                        raise
                    self.no_flush = True
        finally:
            self.fs.release(fh)

    def write_file(self, path: str, data: bytes, pid: int = WRITER, *, step: int = 0) -> None:
        fh = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, pid)
        step = step or len(data) or 1
        for off in range(0, len(data), step):
            self.write(fh, data[off : off + step], off)
        self.close(fh)

    def read_file(self, path: str, pid: int = OTHER) -> bytes:
        fh = self.open(path, os.O_RDONLY, pid)
        try:
            return self.read(fh)
        finally:
            self.fs.release(fh)

    def unlink(self, path: str) -> None:
        parent, name = self.parent_and_name(path)
        self.call(self.fs.unlink, parent, name)

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        p_old, n_old = self.parent_and_name(old)
        p_new, n_new = self.parent_and_name(new)
        self.call(self.fs.rename, p_old, n_old, p_new, n_new, flags)

    def listdir(self, path: str) -> list[str]:
        fh = self.call(self.fs.opendir, self.walk(path))
        names: list[str] = []
        self.call(self.fs.readdir, fh, 0, lambda name, ino, attrs, nxt: names.append(name) or True)
        self.fs.releasedir(fh)
        return names

    def tick(self) -> None:
        self.call(self.fs.tick)


def tiff(values: np.ndarray, **kw: object) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, values, **kw)
    return out.getvalue()


def pixels(data: bytes) -> np.ndarray:
    return tifffile.imread(io.BytesIO(data))


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_fs(src: Path, clock: Clock, **kw: object) -> tuple[FileSystem, Kernel]:
    config = MountConfig(sources=[str(src)], mountpoint="", read_only=bool(kw.pop("read_only", False)),
                         lossy_writes=bool(kw.pop("lossy_writes", False)))
    view = make_view(config)
    process = kw.pop("process", lambda pid: pid)
    fs = FileSystem(view, read_only=config.read_only, stats=Stats(), clock=clock, process=process,
                    reload=lambda: make_view(config), **kw)  # type: ignore[arg-type]
    kernel = Kernel(fs)
    fs.kernel = kernel
    return fs, kernel


@pytest.fixture
def v3(tmp_path: Path, clock: Clock):  # noqa: ANN201
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    fs, k = make_fs(src, clock, replace_window=5.0, pending_timeout=60.0)
    return src, data, fs, k


CHUNK = "c/0/0.tiff"


def chunk00(data: np.ndarray) -> np.ndarray:
    return data[0:8, 0:16]


# -------------------------------------------------------------- replacement


def test_rm_then_refused_file_keeps_the_chunk(v3, clock: Clock) -> None:
    """[ns-4] [write-5] unlink + create + a refused file: the store is byte-identical and the
    file reads the old chunk again (mv across filesystems, bfconvert -overwrite)."""
    src, data, fs, k = v3
    before = stores.snapshot(src)
    k.unlink(CHUNK)
    assert not k.exists(CHUNK)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_CREAT)
    with pytest.raises(FsError) as e:  # [write-13]: refused once its first IFD is written
        k.write(fh, tiff(np.zeros((8, 16), "float32")))
    assert e.value.errno == errno.EINVAL
    with pytest.raises(FsError) as e:
        k.call(k.fs.flush, fh)
    assert e.value.errno == errno.EINVAL
    fs.release(fh)
    assert stores.snapshot(src) == before
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))
    clock.now += 100
    k.tick()
    assert stores.snapshot(src) == before  # nothing left to delete
    assert "wrong dtype" in k.read_file(".zfuse/errors").decode()


def test_rm_then_good_file_replaces(v3, clock: Clock) -> None:
    """[ns-4] unlink + create of a good file stores the new chunk; nothing is deleted later."""
    src, data, fs, k = v3
    k.unlink(CHUNK)
    new = stores.values((8, 16), "uint16", seed=5)
    k.write_file(CHUNK, tiff(new))
    clock.now += 100
    k.tick()
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)


def test_plain_rm_deletes_when_the_window_closes(v3, clock: Clock) -> None:
    """[ns-4] rm: gone from lookups and listings at once, from the store after the window."""
    src, data, fs, k = v3
    k.unlink(CHUNK)
    assert not k.exists(CHUNK) and "0.tiff" not in k.listdir("c/0")
    assert (src / "c" / "0" / "0").exists()
    clock.now += 4.9
    k.tick()
    assert (src / "c" / "0" / "0").exists()
    clock.now += 0.2
    k.tick()
    assert not (src / "c" / "0" / "0").exists()
    assert fs.stats.snapshot()["chunks_deleted"] == 1


def test_rm_is_carried_out_at_unmount(v3) -> None:
    """[ns-4] deferred deletions happen at unmount at the latest."""
    src, data, fs, k = v3
    k.unlink(CHUNK)
    k.call(fs.shutdown)
    assert not (src / "c" / "0" / "0").exists()


def test_rm_then_abandoned_replacement_brings_the_old_chunk_back(v3, clock: Clock) -> None:
    """[ns-4] [write-2] unlink, then a new file that is never completed: after the pending
    timeout it is dropped (journaled) and the old chunk reads again."""
    src, data, fs, k = v3
    before = stores.snapshot(src)
    k.unlink(CHUNK)
    whole = tiff(stores.values((8, 16), "uint16", seed=9))
    k.write_file(CHUNK, whole[: len(whole) // 2])  # a writer killed half way
    assert k.stat(CHUNK, WRITER).size == len(whole) // 2
    clock.now += 61
    k.tick()
    assert stores.snapshot(src) == before
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))
    assert "incomplete file dropped" in k.read_file(".zfuse/errors").decode()
    assert fs.stats.snapshot()["abandoned_writes"] == 1


# -------------------------------------------------------------- pending files


def test_close_incomplete_then_reopen_commits(v3) -> None:
    """[write-2] Bio-Formats' pattern: header, close, reopen read-write, add the image, close."""
    src, data, fs, k = v3
    new = stores.values((8, 16), "uint16", seed=11)
    whole = tiff(new)
    k.write_file(CHUNK, whole[:8])  # the header only: no error
    assert k.read_file(CHUNK, WRITER) == whole[:8]  # the writer reads back what it wrote
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), chunk00(data))  # others: stored
    fh = k.open(CHUNK, os.O_RDWR, WRITER)
    assert k.read(fh) == whole[:8]
    k.write(fh, whole[8:], 8)
    k.close(fh)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), new)


def test_pages_missing_is_incomplete(tmp_path: Path, clock: Clock) -> None:
    """[write-2] a TIFF with fewer pages than the chunk is pending, not refused; a later page
    completes it."""
    src = tmp_path / "a.zarr"
    stores.v3(src, shape=(4, 20, 30), chunks=(2, 8, 16))
    fs, k = make_fs(src, clock)
    new = stores.values((2, 8, 16), "uint16", seed=3)
    k.write_file("c/0/0/0.tiff", tiff(new[:1]))
    assert fs.stats.snapshot().get("rejected_writes", 0) == 0
    k.write_file("c/0/0/0.tiff", tiff(new))
    np.testing.assert_array_equal(stores.open_any(src)[0:2, 0:8, 0:16], new)


def test_imagemagick_pattern_is_not_an_error(v3) -> None:
    """[write-2] open with O_TRUNC, close empty, then write: no error, nothing counted."""
    src, data, fs, k = v3
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.close(fh)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), chunk00(data))
    new = stores.values((8, 16), "uint16", seed=12)
    k.write_file(CHUNK, tiff(new))
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)
    assert fs.stats.snapshot().get("errors", 0) == 0
    assert k.read_file(".zfuse/errors") == b""


def test_fsync_mid_write_and_duplicated_descriptors(v3) -> None:
    """[write-2] fsync of a partial file succeeds; with two descriptors on one open file, a
    close before the file is complete is no error and the last close stores it."""
    src, data, fs, k = v3
    new = stores.values((8, 16), "uint16", seed=13)
    whole = tiff(new)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, whole[:100])
    k.call(fs.fsync, fh)
    k.call(fs.flush, fh)  # the first of two closes (dup'd descriptor): incomplete, no error
    k.write(fh, whole[100:], 100)
    k.close(fh)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)


def test_complete_but_wrong_shape_is_refused_at_close(v3) -> None:
    """[write-5] a complete TIFF of the wrong shape: EINVAL at close, chunk unchanged."""
    src, data, fs, k = v3
    before = stores.snapshot(src)
    with pytest.raises(FsError) as e:
        k.write_file(CHUNK, tiff(np.ones((5, 5), "uint16")))
    assert e.value.errno == errno.EINVAL
    assert stores.snapshot(src) == before
    assert "wrong shape" in k.read_file(".zfuse/errors").decode()


def test_not_a_tiff_is_refused(v3) -> None:
    """[write-5] bytes that do not begin a TIFF are refused at close."""
    src, data, fs, k = v3
    with pytest.raises(FsError) as e:
        k.write_file(CHUNK, b"hello world" * 10)
    assert e.value.errno == errno.EINVAL


# -------------------------------------------------------------- who sees what


def test_other_processes_see_the_stored_chunk_until_commit(v3) -> None:
    """[write-2] while a replacement is written, other processes read the stored chunk
    (bytes and size); the writer sees its own bytes; after close everyone sees the new one."""
    src, data, fs, k = v3
    stored_size = k.stat(CHUNK).size
    new = stores.values((8, 16), "uint16", seed=14)
    whole = tiff(new)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC, WRITER)
    k.write(fh, whole[:50])
    assert k.stat(CHUNK, WRITER).size == 50
    assert k.stat(CHUNK, OTHER).size == stored_size
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), chunk00(data))
    reader = k.open(CHUNK, os.O_RDONLY, OTHER)  # open across the commit: keeps the old bytes
    k.write(fh, whole[50:], 50)
    k.close(fh)
    np.testing.assert_array_equal(pixels(k.read(reader)), chunk00(data))
    fs.release(reader)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), new)


def test_a_second_replacement_before_the_first_is_released(v3) -> None:
    """[write-2] A `cp` right after a `cp`: the second O_TRUNC open comes while the first
    replacement is committed but not yet released. Other processes read the first
    replacement, never the second one's bytes so far, and are told its stored size; the
    writer sees its own bytes. Once a committed file's size was reported, its release
    drops the kernel's cached attributes (the file then reads as the rendered chunk)."""
    src, data, fs, k = v3
    first, second = stores.values((8, 16), "uint16", seed=21), stores.values((8, 16), "uint16", seed=22)
    one = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC, WRITER)
    k.write(one, tiff(first))
    k.call(fs.flush, one)  # close() of the first cp; its RELEASE has not arrived
    rendered = k.read_file(CHUNK, OTHER)
    np.testing.assert_array_equal(pixels(rendered), first)
    assert k.stat(CHUNK, OTHER).size == len(rendered)
    two = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC, WRITER)
    k.write(two, tiff(second)[:60])
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), first)
    assert k.stat(CHUNK, OTHER).size == len(rendered)
    assert k.stat(CHUNK, WRITER).size == 60
    k.write(two, tiff(second)[60:], 60)
    k.close(two)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, OTHER)), second)
    ino = k.walk(CHUNK)
    k.invalidated.clear()
    assert k.stat(CHUNK, WRITER).size == len(tiff(second))  # the writer's bytes, still open
    fs.release(one)
    assert k.invalidated == [ino]
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK, WRITER)), second)


def test_rename_onto_a_chunk_never_loses_the_name(v3) -> None:
    """[ns-2] the atomic-save pattern: a process that looked the chunk up just before the
    rename can still stat and open that inode; an open reader keeps the old bytes."""
    src, data, fs, k = v3
    looked_up = k.walk(CHUNK, OTHER)  # resolved by a reader a moment before the rename
    reader = k.open(CHUNK, os.O_RDONLY, OTHER)
    new = stores.values((8, 16), "uint16", seed=15)
    k.write_file("c/0/.0.tiff.tmp", tiff(new))
    k.rename("c/0/.0.tiff.tmp", CHUNK)
    assert k.call(fs.getattr, looked_up, OTHER).size > 0
    fh = k.call(fs.open, looked_up, os.O_RDONLY, OTHER).fh
    np.testing.assert_array_equal(pixels(k.read(fh)), new)
    fs.release(fh)
    np.testing.assert_array_equal(pixels(k.read(reader)), chunk00(data))
    fs.release(reader)
    assert "0.tiff" in k.listdir("c/0") and ".0.tiff.tmp" not in k.listdir("c/0")


def test_a_file_not_stored_yet_is_not_renamed(v3) -> None:
    """[ns-2] a chunk file open for writing, or pending, and a scratch file still open
    are not renamed onto a chunk (EBUSY): a rename moves what is stored, and their bytes
    were lost while their close() said 0. Closed and complete, they are."""
    src, data, fs, k = v3
    other = "c/1/0.tiff"
    new = stores.values((8, 16), "uint16", seed=31)
    before = stores.snapshot(src)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, tiff(new))
    with pytest.raises(FsError) as e:
        k.rename(CHUNK, other)
    assert e.value.errno == errno.EBUSY
    assert stores.snapshot(src) == before
    k.close(fh)  # stored at its own name
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)
    pending = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(pending, tiff(new)[:40])
    k.close(pending)  # incomplete: pending
    with pytest.raises(FsError) as e:
        k.rename(CHUNK, other)
    assert e.value.errno == errno.EBUSY
    scratch = k.open("c/0/.0.tiff.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    k.write(scratch, tiff(new))
    with pytest.raises(FsError) as e:
        k.rename("c/0/.0.tiff.tmp", other)
    assert e.value.errno == errno.EBUSY
    k.close(scratch)
    k.rename("c/0/.0.tiff.tmp", other)
    np.testing.assert_array_equal(pixels(k.read_file(other)), new)


def test_a_file_renamed_onto_an_edge_chunk_may_have_its_cropped_shape(tmp_path: Path, clock: Clock) -> None:
    """[write-1] [ns-2] the atomic-save pattern (rsync, editors) onto an edge chunk: a
    complete file of the cropped shape is stored, as `cp` onto the chunk stores it (the
    rename had checked the full chunk shape alone: EINVAL, "incomplete (2 of 4 image
    planes written)"); a file cut short is still refused as incomplete."""
    import zarr

    src = tmp_path / "e.zarr"
    a = zarr.create_array(str(src), shape=(6, 8, 16), chunks=(4, 8, 16), dtype="uint16", fill_value=0)
    a[:] = 1
    fs, k = make_fs(src, clock)
    new = np.full((2, 8, 16), 7, "uint16")  # the edge chunk's cropped shape
    k.write_file("c/1/0/.0.tiff.tmp", tiff(new))
    k.rename("c/1/0/.0.tiff.tmp", "c/1/0/0.tiff")
    np.testing.assert_array_equal(zarr.open_array(str(src))[4:6], new)
    before = stores.snapshot(src)
    k.write_file("c/1/0/.0.tiff.tmp", tiff(np.full((4, 8, 16), 9, "uint16"))[:-600])
    with pytest.raises(FsError) as e:
        k.rename("c/1/0/.0.tiff.tmp", "c/1/0/0.tiff")
    assert e.value.errno == errno.EINVAL
    assert stores.snapshot(src) == before


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[tuple[Path, np.ndarray]]:
    """A v3 store seen through a read-only bind mount of its directory (root only: the
    mount), as a store on a read-only filesystem is."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a read-only bind mount")
    src, view = tmp_path / "a.zarr", tmp_path / "ro" / "a.zarr"
    data = stores.v3(src)
    view.mkdir(parents=True)
    for args in (["mount", "--bind", str(src), str(view)], ["mount", "-o", "remount,bind,ro", str(view)]):
        made = subprocess.run(args, capture_output=True, text=True)
        if made.returncode != 0:
            subprocess.run(["umount", str(view)], capture_output=True)
            pytest.skip(f"no read-only bind mount here: {made.stderr.strip()}")
    try:
        yield view, data
    finally:  # (lazily: the view under test may still hold the store's directory open)
        subprocess.run(["umount", "-l", str(view)], check=True)


def test_writes_a_store_refuses_are_refused_before_anything_changes(read_only_store, clock: Clock) -> None:
    """[write-14] a read-write mount of a store its directories refuse (a read-only
    filesystem here): an `rm` fails at once (EROFS) and the chunk stays listed (it had
    been hidden, rm said 0, and it came back when the delete failed 30 s later); an open
    for writing, a new chunk file and a rename onto a chunk fail before any byte is
    written (a whole file had been taken, to fail at close()); a scratch file is the
    daemon's and may be written, but not renamed onto a chunk. The store is unchanged."""
    src, data = read_only_store
    before = stores.snapshot(src)
    fs, k = make_fs(src, clock, replace_window=5.0)
    for attempt in (lambda: k.unlink(CHUNK), lambda: k.open(CHUNK, os.O_WRONLY | os.O_TRUNC),
                    lambda: k.open("c/1/1.tiff", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                    lambda: k.rename(CHUNK, "c/1/0.tiff")):
        with pytest.raises(FsError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert "0.tiff" in k.listdir("c/0")
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))
    k.write_file("c/0/.0.tiff.tmp", tiff(chunk00(data) + 1))
    with pytest.raises(FsError) as e:
        k.rename("c/0/.0.tiff.tmp", CHUNK)
    assert e.value.errno == errno.EROFS
    clock.now += 60
    k.tick()
    assert stores.snapshot(src) == before
    assert any("read-only filesystem" in line and "c/0/0" in line for line in fs.errors)


def test_a_store_directory_another_user_owns_refuses_that_user(tmp_path: Path) -> None:
    """[write-14] what `write_refusal` tells a process that is not the store's owner
    (a child of this test, turned into another user): EACCES naming the directory and
    the uid, for a key in a directory it may not write, or one below it not made yet;
    in a sticky directory it may write, another owner's file (EACCES) but not its own
    nor a new one. The owner itself is told nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the child becomes another user")
    from zfuse.local_store import AtomicLocalStore

    base = tmp_path / "s"
    (base / "c" / "0").mkdir(parents=True)
    (base / "c" / "0" / "0").write_bytes(b"x")
    sticky = base / "shared"
    sticky.mkdir()
    (sticky / "theirs").write_bytes(b"x")
    mine = sticky / "mine"
    mine.write_bytes(b"x")
    os.chown(mine, 65534, 65534)
    for d in (tmp_path, base, base / "c", base / "c" / "0"):
        d.chmod(0o755)
    sticky.chmod(0o1777)
    store = AtomicLocalStore(str(base))
    assert store.write_refusal("c/0/0") is None and store.write_refusal("c/1/0") is None
    pid = os.fork()
    if pid == 0:  # the child: nobody (65534)
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            said = {key: store.write_refusal(key) for key in
                    ("c/0/0", "c/0/9", "c/5/0", "shared/theirs", "shared/mine", "shared/new", "shared/x/y")}
            ok = all(said[k] is not None and said[k].errno == errno.EACCES for k in ("c/0/0", "c/0/9", "c/5/0"))
            ok = ok and f"{base}/c/0 is not writable by uid 65534" in str(said["c/0/0"])
            ok = ok and f"{base}/c is not writable" in str(said["c/5/0"])
            ok = ok and said["shared/theirs"] is not None and "sticky" in str(said["shared/theirs"])
            ok = ok and said["shared/mine"] is None and said["shared/new"] is None and said["shared/x/y"] is None
            code = 0 if ok else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _narrowing_and_lossy_store(root: Path) -> dict[str, np.ndarray]:
    """v2 arrays (as zarr-python 2 users write them) whose filters or compressor cannot
    hold every value: FixedScaleOffset, AsType, a narrowing Delta, PackBits of bytes
    (zarr opens it: it keeps of each byte whether it is zero), JPEG 2000; and `sparse`,
    an AsType array of two chunks, one stored."""
    import imagecodecs.numcodecs
    import numcodecs

    imagecodecs.numcodecs.register_codecs()
    group = zarr.open_group(str(root), mode="w", zarr_format=2)
    made = {}
    for name, dtype, filters, compressor, value in (
        ("fso", "<f8", [numcodecs.FixedScaleOffset(offset=1000, scale=10, dtype="<f8", astype="<u2")],
         numcodecs.Zlib(), 1000.5),
        ("astype", "<u2", [numcodecs.AsType(encode_dtype="|u1", decode_dtype="<u2")], None, 7),
        ("delta", "<i4", [numcodecs.Delta(dtype="<i4", astype="<i2")], None, 7),
        ("packbits", "|u1", [numcodecs.PackBits()], None, 1),
        ("j2k", "u1", None, imagecodecs.numcodecs.Jpeg2k(level=30), None),
    ):
        a = group.create_array(name, shape=(16, 16), chunks=(16, 16), dtype=dtype, fill_value=0,
                               filters=filters, compressors=compressor)
        a[...] = (np.add.outer(np.arange(16), np.arange(16)) * 7 % 256).astype("u1") if value is None else value
        made[name] = a[...]
    sparse = group.create_array("sparse", shape=(32, 16), chunks=(16, 16), dtype="<u2", fill_value=0,
                                filters=[numcodecs.AsType(encode_dtype="|u1", decode_dtype="<u2")], compressors=None)
    sparse[:16] = 7
    return made


def test_values_an_array_cannot_hold_are_refused_not_changed(tmp_path: Path, clock: Clock) -> None:
    """[write-15] an array whose codecs narrow or lose values: a file whose values they
    cannot store exactly fails at close() (EINVAL, naming the first value that would read
    back otherwise, or the codec's own error) and the chunk is unchanged (FixedScaleOffset
    had stored 3.0 as 6556.6, AsType 300 as 44, a narrowing Delta gave EIO and a
    traceback); values they hold are stored; a chunk file copied back unchanged leaves
    the lossy chunk as it is (JPEG 2000 had changed 180 of 256 pixels at each copy); with
    `-o lossy_writes` the codec's approximation is stored."""
    src = tmp_path / "l.zarr"
    held = _narrowing_and_lossy_store(src)
    before = stores.snapshot(src)
    fs, k = make_fs(src, clock)
    for name, values in (("fso", np.full((16, 16), 3.0)), ("astype", np.full((16, 16), 300, "<u2")),
                         ("delta", np.full((16, 16), 100000, "<i4")), ("packbits", np.full((16, 16), 3, "u1"))):
        with pytest.raises(FsError) as e:
            k.write_file(f"{name}/0.0.tiff", tiff(values))
        assert e.value.errno == errno.EINVAL
    assert any("fso/0.0: the array's codecs (fixedscaleoffset, zlib) cannot store these values exactly: 256 of "
               "256 would read back otherwise (at (0, 0): 3.0 as 6556.6)" in line for line in fs.errors)
    assert any("astype/0.0" in line and "300 as 44" in line for line in fs.errors)
    assert any("delta/0.0" in line and "cannot encode these values: OverflowError" in line for line in fs.errors)
    assert any("packbits/0.0" in line and "3 as 1" in line for line in fs.errors)
    k.write_file("j2k/0.0.tiff", k.read_file("j2k/0.0.tiff"))  # (copied back unchanged)
    edited = held["j2k"].copy()
    edited[3, 3] = 0
    with pytest.raises(FsError) as e:
        k.write_file("j2k/0.0.tiff", tiff(edited))
    assert e.value.errno == errno.EINVAL
    assert stores.snapshot(src) == before
    k.write_file("fso/0.0.tiff", tiff(np.full((16, 16), 1010.5)))  # (what the filter holds)
    np.testing.assert_array_equal(zarr.open_array(str(src / "fso"))[...], np.full((16, 16), 1010.5))
    # a new chunk of only the fill value is stored (it had been taken for the one held)
    k.write_file("sparse/1.0.tiff", tiff(np.zeros((16, 16), "<u2")))
    assert (src / "sparse" / "1.0").exists() and "1.0.tiff" in k.listdir("sparse")
    fs, k = make_fs(src, clock, lossy_writes=True)
    k.write_file("j2k/0.0.tiff", tiff(edited))
    stored = zarr.open_array(str(src / "j2k"))[...]
    assert not np.array_equal(stored, held["j2k"]) and np.abs(stored.astype(int) - edited).max() < 64


def test_truncating_a_read_only_file_is_refused_as_opening_it_for_writing(v3) -> None:
    """`truncate(2)` of `zarr.json` (a file the mount never writes) is refused as an open
    for writing is: EACCES, and a line in `.zfuse/errors` naming it (it had been a bare
    EACCES, neither counted nor journaled)."""
    src, data, fs, k = v3
    ino = k.walk("zarr.json")
    for attempt in (lambda: k.call(fs.setattr, ino, 0), lambda: k.open("zarr.json", os.O_WRONLY)):
        with pytest.raises(FsError) as e:
            attempt()
        assert e.value.errno == errno.EACCES
    assert sum("zarr.json is read-only" in line for line in fs.errors) == 2, fs.errors


def test_a_concatenation_s_straddling_chunk_is_checked_in_every_part(tmp_path: Path, clock: Clock) -> None:
    """[write-15] a view chunk of a concatenation that straddles two sources whose codecs
    cannot hold every value (AsType): values they cannot store are refused in whichever
    part (the straddling write went through zarr's indexing unchecked: 300 stored as 44
    in both); values they hold are stored."""
    import numcodecs

    from zfuse.ext.concat import save_concat

    parts = []
    for name in ("p0", "p1"):
        a = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=(12, 16), chunks=(8, 16), dtype="<u2",
                              fill_value=0, zarr_format=2, compressors=None,
                              filters=[numcodecs.AsType(encode_dtype="|u1", decode_dtype="<u2")])
        a[...] = 5
        parts.append(str(tmp_path / f"{name}.zarr"))
    save_concat(tmp_path / "c.json", parts, axis=0)
    before = [stores.snapshot(Path(p)) for p in parts]
    fs, k = make_fs(tmp_path / "c.json", clock)
    with pytest.raises(FsError) as e:  # rows 8-16: part 0's rows 8-12, part 1's 0-4
        k.write_file("c/1/0.tiff", tiff(np.full((8, 16), 300, "<u2")))
    assert e.value.errno == errno.EINVAL
    assert [stores.snapshot(Path(p)) for p in parts] == before
    k.write_file("c/1/0.tiff", tiff(np.full((8, 16), 9, "<u2")))
    assert (zarr.open_array(parts[0])[8:] == 9).all() and (zarr.open_array(parts[1])[:4] == 9).all()


class GatedCommits:
    """A worker pool (`run`) whose first chunk commit waits at `gate` once it has
    started (`committing`): what arrives meanwhile meets a commit under way."""

    def __init__(self) -> None:
        self.gate, self.committing = trio.Event(), trio.Event()

    async def run(self, fn, *args):  # noqa: ANN001, ANN202 - the FileSystem's `run`
        from zfuse.view.writes import _commit_chunk

        if fn is _commit_chunk and not self.committing.is_set():
            self.committing.set()
            await self.gate.wait()
        return fn(*args)


@pytest.mark.parametrize("change", ["rename", "unlink"])
def test_a_rename_or_unlink_during_a_commit_waits_for_it_and_wins(tmp_path: Path, clock: Clock, change: str) -> None:
    """[ns-4] a chunk's commit, then a rename onto it (or an unlink of it) that arrives
    while the commit runs: the change waits for the commit and then takes effect. Before,
    it took effect at once and the commit, ending later, stored over the renamed chunk
    (whose values were then nowhere) or brought the unlinked chunk back."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    gated = GatedCommits()
    gate, committing = gated.gate, gated.committing
    fs, k = make_fs(src, clock, run=gated.run, replace_window=5.0, pending_timeout=60.0)
    written = stores.values((8, 16), "uint16", seed=41)
    other = "c/1/0.tiff"
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, tiff(written))
    order: list[str] = []
    row0, row1 = k.walk("c/0"), k.walk("c/1")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def close() -> None:
                await fs.flush(fh)
                order.append("committed")

            nursery.start_soon(close)
            await committing.wait()

            async def change_it() -> None:
                if change == "rename":
                    await fs.rename(row1, "0.tiff", row0, "0.tiff", 0)
                else:
                    await fs.unlink(row0, "0.tiff")
                order.append(change)

            nursery.start_soon(change_it)
            await trio.testing.wait_all_tasks_blocked()
            assert order == []  # the change waits for the commit
            gate.set()

    trio.run(main)
    fs.release(fh)
    assert order == ["committed", change]
    if change == "rename":
        np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), data[8:16, :16])
        assert not k.exists(other)
    else:
        assert not k.exists(CHUNK)
        clock.now += 10  # past the replace window: deleted from the store
        k.tick()
        assert not k.exists(CHUNK)


def test_an_open_for_writing_waits_for_a_rename_under_way(tmp_path: Path, clock: Clock) -> None:
    """[ns-3] a writer opening a chunk while a rename of it runs (its commit at the new
    name under way) is opened after the rename, never detached by it: before, its
    bytes were then stored nowhere while its close() said 0."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    gated = GatedCommits()
    gate, committing = gated.gate, gated.committing
    fs, k = make_fs(src, clock, run=gated.run, replace_window=5.0, pending_timeout=60.0)
    row0, row1 = k.walk("c/0"), k.walk("c/1")
    old = k.walk(CHUNK)
    order: list[str] = []
    opened: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def rename() -> None:
                await fs.rename(row0, "0.tiff", row1, "0.tiff", 0)
                order.append("renamed")

            nursery.start_soon(rename)
            await committing.wait()

            async def open_old() -> None:
                opened.append((await fs.open(old, os.O_WRONLY | os.O_TRUNC, WRITER)).fh)
                order.append("opened")

            nursery.start_soon(open_old)
            await trio.testing.wait_all_tasks_blocked()
            assert order == []  # the open waits for the rename
            gate.set()

    trio.run(main)
    assert order == ["renamed", "opened"]
    new = stores.values((8, 16), "uint16", seed=51)
    k.write(opened[0], tiff(new))
    k.close(opened[0])  # stored at the old name, a new chunk there
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)


def test_an_open_waiting_for_an_unlink_finds_the_chunk_removed(tmp_path: Path, clock: Clock) -> None:
    """[ns-4] an open for writing that waited for an unlink of its chunk (itself
    waiting for the chunk's commit) finds it removed (ENOENT), instead of bringing it
    back under the name `rm` just removed."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    gated = GatedCommits()
    gate, committing = gated.gate, gated.committing
    fs, k = make_fs(src, clock, run=gated.run, replace_window=5.0, pending_timeout=60.0)
    chunk, row0 = k.walk(CHUNK), k.walk("c/0")
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, tiff(stores.values((8, 16), "uint16", seed=61)))
    outcome: list[object] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.flush, fh)
            await committing.wait()
            nursery.start_soon(fs.unlink, row0, "0.tiff")
            await trio.testing.wait_all_tasks_blocked()

            async def open_it() -> None:
                try:
                    outcome.append(await fs.open(chunk, os.O_WRONLY, WRITER))
                except FsError as e:
                    outcome.append(e.errno)

            nursery.start_soon(open_it)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()

    trio.run(main)
    fs.release(fh)
    assert outcome == [errno.ENOENT]
    assert not k.exists(CHUNK)


def test_invalidations_never_drift_when_no_thread_can_start() -> None:
    """Inodes waiting to be invalidated when no worker can be started (no nursery yet,
    or any more): the count of drainers stays right, and the next start drains them."""
    from zfuse.fuse_ops import _Kernel

    class Ops:
        started: list = []
        nursery = None

        def spawn_thread(self, fn):  # noqa: ANN001, ANN202 - ZfuseOperations.spawn_thread's contract
            if self.nursery is None:
                return False
            self.started.append(fn)
            return True

    ops = Ops()
    kernel = _Kernel(ops)  # type: ignore[arg-type]
    done: list[int] = []
    kernel.invalidate_inode_here = done.append  # type: ignore[method-assign] (no kernel here)
    for ino in range(10):
        kernel.invalidate_inode(ino)
    assert kernel._draining == 0 and len(kernel._waiting) == 10
    ops.nursery = object()
    kernel.invalidate_inode(10)
    assert len(ops.started) == 1
    ops.started[0]()
    assert sorted(done) == list(range(11)) and kernel._draining == 0


def test_listing_during_a_replacement_keeps_the_chunk(v3) -> None:
    """[ns-4] a chunk being rewritten stays listed, once."""
    src, data, fs, k = v3
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, b"II*\0")
    assert k.listdir("c/0").count("0.tiff") == 1
    k.close(fh)
    assert k.listdir("c/0").count("0.tiff") == 1


def test_unlinked_while_open_writer_stores_nothing(v3) -> None:
    """[ns-4] a writer whose file is unlinked never stores; its reader keeps reading."""
    src, data, fs, k = v3
    new = stores.values((8, 16), "uint16", seed=16)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, tiff(new))
    k.unlink(CHUNK)
    k.close(fh)
    k.call(fs.shutdown)
    assert not (src / "c" / "0" / "0").exists()


def test_commit_while_writes_continue_keeps_them(v3) -> None:
    """[write-2] writes landing after a commit keep the file dirty: the next close stores them."""
    src, data, fs, k = v3
    a, b = stores.values((8, 16), "uint16", seed=17), stores.values((8, 16), "uint16", seed=18)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, tiff(a))
    k.call(fs.flush, fh)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], a)
    k.write(fh, tiff(b))
    k.close(fh)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], b)


def test_reload_during_a_write_commits_into_the_new_view(v3) -> None:
    """[cons-2] a reload between write and close: the close commits into the reloaded view."""
    src, data, fs, k = v3
    new = stores.values((8, 16), "uint16", seed=19)
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    k.write(fh, tiff(new))
    old_view = fs.view
    k.call(fs.refresh)
    assert fs.view is not old_view
    k.close(fh)
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)


def test_rm_survives_a_reload(v3, clock: Clock) -> None:
    """[cons-2] an unlinked chunk stays hidden across a reload and is still deleted."""
    src, data, fs, k = v3
    k.unlink(CHUNK)
    k.call(fs.refresh)
    assert not k.exists(CHUNK) and "0.tiff" not in k.listdir("c/0")
    clock.now += 10
    k.tick()
    assert not (src / "c" / "0" / "0").exists()


# -------------------------------------------------------------- namespace and errors


def test_read_only_mount(tmp_path: Path, clock: Clock) -> None:
    """[ns-8] every change fails with EROFS."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    fs, k = make_fs(src, clock, read_only=True)
    for attempt in (lambda: k.open(CHUNK, os.O_RDWR), lambda: k.unlink(CHUNK),
                    lambda: k.open("c/0/x.tmp", os.O_WRONLY | os.O_CREAT),
                    lambda: k.rename(CHUNK, "c/0/1.tiff")):
        with pytest.raises(FsError) as e:
            attempt()
        assert e.value.errno == errno.EROFS


def test_metadata_and_special_files_are_not_writable(v3) -> None:
    """[ns-7] zarr.json and .zfuse/ files: EACCES to write, EPERM to create in .zfuse/."""
    src, data, fs, k = v3
    for path in ("zarr.json", ".zfuse/stats", ".zfuse/errors"):
        with pytest.raises(FsError) as e:
            k.open(path, os.O_WRONLY)
        assert e.value.errno == errno.EACCES
    with pytest.raises(FsError) as e:
        k.open(".zfuse/new", os.O_WRONLY | os.O_CREAT)
    assert e.value.errno == errno.EPERM


def test_stats_size_is_the_size_read(v3) -> None:
    """[tree-6] .zfuse/stats: the size stat reports is the size read gives, and it is JSON."""
    src, data, fs, k = v3
    k.read_file(CHUNK)
    size = k.stat(".zfuse/stats").size
    content = k.read_file(".zfuse/stats")
    assert len(content) == size
    assert json.loads(content)["bytes_read"] > 0


def test_scratch_files_live_in_memory(v3) -> None:
    """[ns-1] a non-chunk name is a scratch file: listed, readable, never stored."""
    src, data, fs, k = v3
    before = stores.snapshot(src)
    k.write_file("c/0/notes.txt", b"hello")
    assert k.read_file("c/0/notes.txt") == b"hello"
    assert "notes.txt" in k.listdir("c/0")
    k.call(fs.shutdown)
    assert stores.snapshot(src) == before


def test_forgotten_inodes_are_freed(v3) -> None:
    """Inodes the kernel forgot are dropped: memory follows what the kernel holds."""
    src, data, fs, k = v3
    ino = k.walk(CHUNK)
    assert ino in fs.inodes
    lookups = fs.inodes[ino].lookups
    fs.forget([(ino, lookups)])
    assert ino not in fs.inodes
    assert k.walk(CHUNK) != ino or ino in fs.inodes


def test_bfconvert_overwrite_sequence_refused_keeps_the_chunk(v3, clock: Clock) -> None:
    """[ns-4] [write-2] Bio-Formats `bfconvert -overwrite` as the mount sees it: unlink,
    create + close empty, reopen read-write and read-only, write the header, close the
    reader, write byte by byte past the replace window, then a refused close."""
    src, data, fs, k = v3
    before = stores.snapshot(src)
    bad = tiff(np.full((8, 16), 9, "float32"))
    k.unlink(CHUNK)
    k.close(k.open(CHUNK, os.O_RDWR | os.O_CREAT))
    fh = k.open(CHUNK, os.O_RDWR)
    reader = k.open(CHUNK, os.O_RDONLY)
    k.write(fh, bad[:8])
    k.close(reader)
    clock.now += 10
    k.tick()
    refused_at = None
    for off in range(8, len(bad)):
        try:
            k.write(fh, bad[off : off + 1], off)
        except FsError as e:
            assert e.errno == errno.EINVAL
            refused_at = refused_at or off
    # refused at the byte that completed the first IFD, and at every write after it
    assert refused_at is not None and refused_at < len(bad) // 2
    with pytest.raises(FsError):
        k.close(fh)
    clock.now += 10
    k.tick()
    assert stores.snapshot(src) == before
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))


def test_cp_waits_for_page_cache_readers(v3) -> None:
    """[write-2] an O_TRUNC writer waits for readers that read the chunk through the page
    cache to close (the kernel would cut their file to 0 bytes); readers opening meanwhile
    get direct I/O and the stored chunk."""
    src, data, fs, k = v3
    ino = k.walk(CHUNK)

    async def scenario() -> None:
        early = await fs.open(ino, os.O_RDONLY, OTHER)
        assert early.keep_cache and not early.direct_io
        opened = trio.Event()
        writer_fh: list[int] = []

        async def writer() -> None:
            writer_fh.append((await fs.open(ino, os.O_WRONLY | os.O_TRUNC, WRITER)).fh)
            opened.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            assert not opened.is_set()  # waiting for the early reader
            late = await fs.open(ino, os.O_RDONLY, OTHER)
            assert late.direct_io
            np.testing.assert_array_equal(pixels(await fs.read(late.fh, 0, 1 << 20)), chunk00(data))
            fs.release(late.fh)
            fs.release(early.fh)  # the last page-cache reader closes: the writer goes on
        assert opened.is_set()
        fs.release(writer_fh[0])

    trio.run(scenario)


def test_cp_waits_for_page_cache_readers_only_so_long(tmp_path: Path, clock: Clock) -> None:
    """[write-2] a reader that keeps the file open does not block a writer for ever."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    fs, k = make_fs(src, clock, reader_grace=0.01)
    reader = k.open(CHUNK, os.O_RDONLY, OTHER)
    new = stores.values((8, 16), "uint16", seed=21)
    k.write_file(CHUNK, tiff(new))
    np.testing.assert_array_equal(stores.open_any(src)[0:8, 0:16], new)
    fs.release(reader)


def test_names_only_the_daemon_holds_are_never_cached(v3) -> None:
    """[ns-1] scratch files and files being written get no attribute or entry cache time:
    a rename or release can take them away at any moment."""
    src, data, fs, k = v3
    k.write_file("c/0/.0.tiff.tmp", b"partial")
    assert k.stat("c/0/.0.tiff.tmp").timeout == 0
    assert k.stat(CHUNK).timeout > 0
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC)
    assert k.stat(CHUNK).timeout == 0
    fs.release(fh)


def test_arrays_not_shown_are_in_the_error_journal(tmp_path: Path, clock: Clock) -> None:
    """[tree-5] [tree-6] an array whose metadata zarr-python rejects is listed in
    .zfuse/errors with the array's path, the field and the fix; its neighbour is shown."""
    import zarr

    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    root.create_array("good", shape=(4, 4), chunks=(2, 2), dtype="uint8")[...] = 1
    bad = tmp_path / "g.zarr" / "bad"
    bad.mkdir()
    (bad / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default"}, "codecs": [{"name": "zstd"}]}))
    fs, k = make_fs(tmp_path / "g.zarr", clock)
    journal = k.read_file(".zfuse/errors").decode()
    (line,) = [x for x in journal.splitlines() if "\tbad\t" in x]
    assert "not shown" in line and "fill_value: missing" in line and "Add" in line
    assert "c" in k.listdir("good")


def test_mount_config_defaults_match_the_view() -> None:
    """The daemon's config repeats two view defaults so the CLI starts without zarr."""
    from zfuse.view.array_view import ViewOptions

    config = MountConfig(sources=[], mountpoint="")
    assert config.listing_cache_names == ViewOptions.listing_cache_names
    assert config.index_cache_bytes == ViewOptions.shard_index_cache_bytes


def test_read_only_opens_need_no_flush(v3) -> None:
    """A read-only open's close has nothing to commit: its reply tells the kernel to skip
    FLUSH (where pyfuse3 passes it on); a writable open keeps FLUSH, its commit point."""
    src, data, fs, k = v3
    ino = k.walk(CHUNK)
    for flags, noflush in ((os.O_RDONLY, True), (os.O_WRONLY, False), (os.O_RDWR, False)):
        reply = k.call(fs.open, ino, flags, WRITER)
        assert reply.noflush is noflush, flags
        k.close(reply.fh)
    meta = k.call(fs.open, k.walk("zarr.json"), os.O_RDONLY, OTHER)
    assert meta.noflush
    fs.release(meta.fh)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))


def test_chunk_files_suggest_large_writes(v3) -> None:
    """`stat` suggests 1 MiB I/O for chunk files (cp writes a chunk in one request), 128 KiB
    for the rest (buffered readers of a whole-image file do not fetch 1 MiB per tile)."""
    src, data, fs, k = v3
    assert k.stat(CHUNK).blksize == 1 << 20
    assert k.stat("zarr.json").blksize == 128 << 10
    assert k.stat("image.ome.tif").blksize == 128 << 10
    sizes = {}
    fh = k.call(fs.opendir, k.walk("c/0"))
    k.call(fs.readdir, fh, 0, lambda name, ino, attrs, nxt: sizes.setdefault(name, attrs.blksize) or True)
    fs.releasedir(fh)
    assert set(sizes.values()) == {1 << 20}, sizes


def test_read_ahead_window_slides_with_a_scan_and_not_on_a_re_read(tmp_path: Path, clock: Clock) -> None:
    """Opening a chunk file decodes it and the next READ_AHEAD chunks in C order (and checks
    that they exist, so their lookups need no I/O); opening
    a file that was decoded ahead asks for one more, so a scan never waits for a new
    batch; re-opening a file read before (the page cache serves it) decodes nothing."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(40, 32), chunks=(8, 16))  # grid 5 x 2
    spawned: list[tuple[int, ...]] = []

    def spawn(fn, job) -> None:  # noqa: ANN001
        spawned.append(job[1])
        fn(job)  # at once, as a worker thread would

    stats = Stats()
    config = MountConfig(sources=[str(src)], mountpoint="")
    fs = FileSystem(make_view(config, stats), stats=stats, clock=clock, spawn=spawn)
    k = Kernel(fs)
    fs.kernel = k
    k.read_file("c/0/0.tiff")
    assert spawned == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert stats.snapshot()["read_ahead"] == 4
    spawned.clear()
    assert not fs.view.needs_io(("c", "2", "0.tiff"))  # its lookup answers from memory
    k.read_file("c/0/1.tiff")  # decoded ahead: the window moves one on
    assert spawned == [(2, 1)]
    spawned.clear()
    k.read_file("c/0/0.tiff")  # a re-read
    k.read_file("c/0/1.tiff")
    assert spawned == []
    assert stats.snapshot()["chunks_decoded"] == 6  # each once
    np.testing.assert_array_equal(pixels(k.read_file("c/2/1.tiff")), data[16:24, 16:32])
    assert spawned == [(3, 0), (3, 1), (4, 0), (4, 1)]  # (2, 1) was ready


def test_read_only_mount_turns_flush_off(tmp_path: Path, clock: Clock) -> None:
    """A read-only mount answers the first FLUSH with ENOSYS, which the kernel takes as
    success and as "never send FLUSH again": closes after it cost no request."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    fs, k = make_fs(src, clock, read_only=True)
    with pytest.raises(FsError) as e:
        fh = k.open(CHUNK)
        try:
            k.call(fs.flush, fh)
        finally:
            fs.release(fh)
    assert e.value.errno == errno.ENOSYS
    for _ in range(3):
        fh = k.open(CHUNK)
        np.testing.assert_array_equal(pixels(k.read(fh)), chunk00(data))
        k.close(fh)
    assert fs.stats.snapshot()["flush_requests"] == 2  # the call above, and the first close
    assert not fs.errors  # not an error: nothing logged or journaled


def test_a_commit_checks_the_next_chunks_so_their_lookups_need_no_io(tmp_path: Path, clock: Clock) -> None:
    """A writer going through the chunk files in order looks up the next one next: a commit
    checks whether the next chunks in C order exist (on a local store: one stat each, in
    the commit's worker thread), so that lookup answers from memory, and rightly. A
    shard's chunks are checked ahead only while its index is in memory."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)  # grid 3 x 2
    (src / "c" / "1" / "0").unlink()  # not stored: the check ahead must say so
    fs, k = make_fs(src, clock)
    new = stores.values((8, 16), "uint16", seed=3)
    k.write_file(CHUNK, tiff(new))
    assert not fs.view.needs_io(("c", "0", "1.tiff"))
    assert not fs.view.needs_io(("c", "1", "0.tiff"))
    assert fs.view.needs_io(("c", "1", "1.tiff"))  # not next: asked when looked up
    assert k.exists("c/0/1.tiff") and not k.exists("c/1/0.tiff")
    np.testing.assert_array_equal(pixels(k.read_file("c/0/1.tiff"))[:, :14], data[0:8, 16:30])  # an edge chunk
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)

    sharded = tmp_path / "s.zarr"
    stores.sharded(sharded)  # shards of 2 x 2 chunks: (0, 0)-(1, 1) and (2, 0)-(2, 1)
    fs, k = make_fs(sharded, clock)
    k.write_file(CHUNK, tiff(new))
    assert not fs.view.needs_io(("c", "0", "1.tiff"))  # the index just written is in memory
    assert not fs.view.needs_io(("c", "1", "0.tiff"))
    k.write_file("c/1/1.tiff", tiff(new))
    assert fs.view.needs_io(("c", "2", "0.tiff"))  # another shard, its index not read yet
    assert k.exists("c/2/0.tiff")


def test_process_of_a_request_thread() -> None:
    """A request's thread id maps to its process (the writer sees its own bytes from any
    of its threads); an id that is not a live thread stands for itself."""
    import threading

    from zfuse.fs import process_of

    found: list[int] = []
    thread = threading.Thread(target=lambda: found.append(process_of(threading.get_native_id())))
    thread.start()
    thread.join()
    assert found == [os.getpid()]
    assert process_of(os.getpid()) == os.getpid()
    assert process_of(2**31 - 1) == 2**31 - 1


def test_the_writing_thread_needs_no_process_look_up(tmp_path: Path, clock: Clock) -> None:
    """[write-2] The thread that opened a file for writing sees its bytes without its
    process being looked up again (cp's fstat after its open); another thread of the same
    process sees them too, another process does not."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    asked: list[int] = []
    processes = {WRITER: WRITER, WRITER + 1: WRITER, OTHER: OTHER}  # WRITER + 1: a second thread

    def process(tid: int) -> int:
        asked.append(tid)
        return processes[tid]

    fs, k = make_fs(src, clock, process=process)
    stored_size = k.stat(CHUNK).size
    fh = k.open(CHUNK, os.O_WRONLY | os.O_TRUNC, WRITER)
    k.write(fh, b"II*\0")
    asked.clear()
    assert k.stat(CHUNK, WRITER).size == 4
    assert asked == []
    assert k.stat(CHUNK, WRITER + 1).size == 4 and set(asked) == {WRITER + 1}
    assert k.stat(CHUNK, OTHER).size == stored_size
    k.write(fh, tiff(chunk00(data)))
    k.close(fh)


def test_a_commit_drops_cached_data_in_its_own_worker_thread(tmp_path: Path, clock: Clock) -> None:
    """[write-4] Readers see the new values at once: the commit drops the kernel's cached
    data of the file in the worker thread that stored the chunk, before close returns
    (not in a thread of its own afterwards); a failure there does not fail the close."""
    src = tmp_path / "a.zarr"
    stores.v3(src)
    in_worker: list[bool] = []

    async def run(fn, *args):  # noqa: ANN001, ANN202 - a worker thread, modelled
        in_worker.append(True)
        try:
            return fn(*args)
        finally:
            in_worker.pop()

    fs, k = make_fs(src, clock, run=run)
    dropped: list[tuple[int, bool]] = []
    k.invalidate_inode_here = lambda ino: dropped.append((ino, bool(in_worker)))  # type: ignore[method-assign]
    ino = k.walk(CHUNK)
    k.invalidated.clear()
    new = stores.values((8, 16), "uint16", seed=5)
    k.write_file(CHUNK, tiff(new))
    assert dropped == [(ino, True)] and k.invalidated == []
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)

    def broken(ino: int) -> None:
        raise RuntimeError("the kernel said no")

    k.invalidate_inode_here = broken  # type: ignore[method-assign]
    newer = stores.values((8, 16), "uint16", seed=6)
    k.write_file(CHUNK, tiff(newer))  # close succeeds: the chunk is stored
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), newer)


def test_old_bytes_in_the_page_cache_never_reach_new_readers(tmp_path: Path, clock: Clock) -> None:
    """[write-2] A reader open through the page cache across a replacement keeps reading
    the old bytes, which the kernel keeps in the file's (shared) page cache: until it
    closes, readers opening the new chunk bypass that cache; when it closes, it is dropped."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    fs, k = make_fs(src, clock, reader_grace=0.01)
    ino = k.walk(CHUNK)
    early = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert early.keep_cache and not early.direct_io
    new = stores.values((8, 16), "uint16", seed=8)
    k.write_file(CHUNK, tiff(new))  # goes on once the grace for the early reader is over
    np.testing.assert_array_equal(pixels(k.read(early.fh)), chunk00(data))
    late = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert late.direct_io and not late.keep_cache
    np.testing.assert_array_equal(pixels(k.read(late.fh)), new)
    fs.release(late.fh)
    k.invalidated.clear()
    fs.release(early.fh)
    assert k.invalidated == [ino]  # what the early reader read is dropped
    after = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert after.keep_cache and not after.direct_io
    np.testing.assert_array_equal(pixels(k.read(after.fh)), new)
    fs.release(after.fh)


def test_a_decode_overtaken_by_a_write_is_not_cached(v3) -> None:
    """[read-7] a read-ahead decode that read the store before a commit landed serves its
    caller but is not cached: readers after the commit decode the new chunk."""
    src, data, fs, k = v3
    arr = fs.view.entry(("c", "0", "0.tiff")).array
    read_chunk = arr.source.read_chunk

    def overtaken(coords, must_exist=False):  # noqa: ANN001, ANN202
        values = read_chunk(coords, must_exist)
        arr.forget(coords)  # a commit of this chunk lands while the decode runs
        return values

    arr.source.read_chunk = overtaken
    try:
        arr.file_bytes((0, 0))
    finally:
        arr.source.read_chunk = read_chunk
    assert not arr.is_cached((0, 0))
    arr.file_bytes((0, 0))
    assert arr.is_cached((0, 0))


def test_local_directories_are_listed_ahead_on_the_listing_thread(tmp_path: Path, clock: Clock) -> None:
    """[read-3] A local store's directories are listed ahead through `spawn_listing`
    (one thread of their own: short jobs holding the GIL), not through `spawn` (the
    threads of decodes and of remote stores' listings, which wait and overlap)."""
    stores.raw_chunks(tmp_path / "a.zarr", (6, 4))
    jobs: list = []
    fs, k = make_fs(tmp_path / "a.zarr", clock, spawn=lambda fn, arg: pytest.fail("not the listing thread"),
                    spawn_listing=lambda fn, arg: jobs.append((fn, arg)))
    rows = k.listdir("c")
    for row in rows[:2]:  # a walk starts: the next rows are listed ahead
        k.listdir(f"c/{row}")
    assert [arg.path for _, arg in jobs] == [("c", row) for row in rows[2:]]
    for fn, arg in jobs:
        fn(arg)
    assert fs.stats.snapshot()["listing_read_ahead"] == len(rows) - 2
    assert sorted(k.listdir(f"c/{rows[2]}")) == [f"{j}.tiff" for j in range(4)]


# -------------------------------------------------------------- chunks stored raw


def make_raw_fs(tmp_path: Path, clock: Clock, **kw: object) -> tuple[Path, np.ndarray, FileSystem, Kernel]:
    """A raw v3 array (grid 3 x 2), its view and filesystem sharing one Stats."""
    src = tmp_path / "raw.zarr"
    data = stores.v3(src, codecs="raw")
    stats = Stats()
    config = MountConfig(sources=[str(src)], mountpoint="")
    fs = FileSystem(make_view(config, stats), stats=stats, clock=clock,
                    reload=lambda: make_view(config, stats), **kw)  # type: ignore[arg-type]
    k = Kernel(fs)
    fs.kernel = k
    return src, data, fs, k


def replace_stored(src: Path, coords: tuple[int, int], values: np.ndarray) -> None:
    """Another writer stores a chunk, as zarr-python does: a new file renamed over the old."""
    z = zarr.open_array(str(src), mode="r+")
    i, j = coords
    z[i * 8 : i * 8 + values.shape[0], j * 16 : j * 16 + values.shape[1]] = values


def test_a_chunk_stored_raw_is_read_from_its_stored_file(tmp_path: Path, clock: Clock) -> None:
    """[read-9] A chunk stored raw is not decoded: its file is the header, then the stored
    file's bytes, read by range from the stored file; once that file is open, reads take
    what the OS page cache holds on the event loop (no worker thread)."""
    threads: list[str] = []

    async def run(fn, *args):  # noqa: ANN001, ANN202 - a worker thread, counted
        threads.append(getattr(fn, "__name__", repr(fn)))
        return fn(*args)

    src, data, fs, k = make_raw_fs(tmp_path, clock, run=run)
    arr = fs.view.entry(("c", "0", "0.tiff")).array
    decoded = bytes(arr.file_bytes((0, 0)))  # the decoding path, for comparison
    arr.cache.clear()
    threads.clear()
    fh = k.open(CHUNK)
    assert threads == ["open_stored"]  # (the lookup answered from memory: checked above)
    whole = k.read(fh)
    assert whole == decoded
    assert [k.read(fh, 100, off) for off in (0, 300, len(whole) - 50)] == \
        [decoded[0:100], decoded[300:400], decoded[-50:]]  # the header, across it, the end
    assert k.read(fh, 10, len(whole)) == b""
    k.close(fh)
    assert threads == ["open_stored"]  # every read from the page cache, on the event loop
    stats = fs.stats.snapshot()
    assert stats["chunks_passed_through"] == 1 and stats.get("chunks_decoded", 0) == 1  # (the comparison's)
    np.testing.assert_array_equal(pixels(whole), chunk00(data))
    assert not arr.is_cached((0, 0))  # nothing kept by the daemon: the page cache has it


def test_which_chunks_are_read_from_their_stored_files(tmp_path: Path, clock: Clock) -> None:
    """[read-9] Only chunks whose stored bytes are the file's values: codec `bytes` alone,
    little endian, not sharded, not booleans, pages not reordered, not a cropped edge chunk,
    and something stored (Zarr v2 too). Every other chunk is decoded, and reads the same values."""
    from zarr.codecs import BytesCodec, Crc32cCodec

    def build(name: str, **kw: object) -> Path:
        path = tmp_path / name
        values = kw.pop("values", None)
        z = zarr.create_array(str(path), shape=(16, 24), chunks=(8, 16), fill_value=0, **kw)  # type: ignore[arg-type]
        z[...] = values if values is not None else stores.values((16, 24), str(z.dtype), 1)
        return path

    cases = {
        "raw": (build("raw", dtype="uint16", compressors=None), True),
        "one-byte": (build("u8", dtype="uint8", compressors=None), True),
        "float": (build("f4", dtype="float32", compressors=None), True),
        "big-endian": (build("be", dtype="uint16", compressors=None, serializer=BytesCodec(endian="big")), False),
        "zstd": (build("zstd", dtype="uint16"), False),
        "crc32c": (build("crc", dtype="uint16", compressors=[Crc32cCodec()]), False),
        "sharded": (build("shard", dtype="uint16", compressors=None, shards=(16, 32)), False),
        "bool": (build("bool", dtype="bool", compressors=None, values=np.arange(16 * 24).reshape(16, 24) % 3 == 0),
                 False),
    }
    v2 = tmp_path / "v2"
    zarr.create_array(str(v2), shape=(16, 24), chunks=(8, 16), dtype="<u2", zarr_format=2, compressors=None,
                      fill_value=0)[...] = stores.values((16, 24), "uint16", 1)
    cases["v2 raw"] = (v2, True)
    for name, (path, raw) in cases.items():
        stats = Stats()
        fs = FileSystem(make_view(MountConfig(sources=[str(path)], mountpoint=""), stats), stats=stats, clock=clock)
        k = Kernel(fs)
        chunk = "0.0.tiff" if name == "v2 raw" else CHUNK
        got = pixels(k.read_file(chunk))
        want = zarr.open_array(str(path))[0:8, 0:16]
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert stats.snapshot().get("chunks_passed_through", 0) == int(raw), name
    # OME-Zarr t, c, z chunks: the pages are reordered into ImageJ's c, z, t (decoded)
    root = zarr.open_group(str(tmp_path / "ome"), mode="w")
    ome = root.create_array("0", shape=(2, 3, 4, 8, 8), chunks=(2, 3, 4, 8, 8), dtype="uint16", compressors=None,
                            fill_value=0)
    ome[...] = stores.values((2, 3, 4, 8, 8), "uint16", 2)
    root.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": n, "type": t} for n, t in (
        ("t", "time"), ("c", "channel"), ("z", "space"), ("y", "space"), ("x", "space"))],
        "datasets": [{"path": "0"}]}]
    stats = Stats()
    fs = FileSystem(make_view(MountConfig(sources=[str(tmp_path / "ome")], mountpoint=""), stats), stats=stats,
                    clock=clock)
    arr = fs.view.entry(("0", "c", "0", "0", "0", "0", "0.tiff")).array
    assert arr.layout.permuted
    pages = pixels(Kernel(fs).read_file("0/c/0/0/0/0/0.tiff")).reshape(-1, 8, 8)
    np.testing.assert_array_equal(pages, ome[...].transpose(arr.layout.file_axes).reshape(-1, 8, 8))
    assert stats.snapshot().get("chunks_passed_through", 0) == 0
    # the fill value: nothing stored, decoded
    src, data, fs, k = make_raw_fs(tmp_path, clock)
    (src / "c" / "1" / "1").unlink()
    fs2 = FileSystem(make_view(MountConfig(sources=[str(src)], mountpoint="", all_chunks=True)), clock=clock)
    assert not pixels(Kernel(fs2).read_file("c/1/1.tiff")).any()
    # --crop-edges: an edge chunk's file is shorter than the stored chunk (decoded); others are not
    stats = Stats()
    fs3 = FileSystem(make_view(MountConfig(sources=[str(src)], mountpoint="", crop_edges=True), stats),
                     stats=stats, clock=clock)
    k3 = Kernel(fs3)
    np.testing.assert_array_equal(pixels(k3.read_file("c/0/1.tiff")), data[0:8, 16:30])
    assert stats.snapshot().get("chunks_passed_through", 0) == 0
    np.testing.assert_array_equal(pixels(k3.read_file(CHUNK)), chunk00(data))
    assert stats.snapshot()["chunks_passed_through"] == 1


def test_a_reader_keeps_the_stored_file_it_opened(tmp_path: Path, clock: Clock) -> None:
    """[read-9] [write-2] A reader of a chunk stored raw keeps reading the stored file it
    opened when another writer replaces the chunk in the store (a new file renamed over
    it). A reader opening the new one meanwhile reads around the kernel's page cache,
    which may hold the old bytes; once no reader of those is left, the next open drops it."""
    src, data, fs, k = make_raw_fs(tmp_path, clock)
    ino = k.walk(CHUNK)
    early = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert not early.keep_cache  # (the first open: nothing of the path is cached yet)
    head = k.read(early.fh, 400)
    new = stores.values((8, 16), "uint16", seed=9)
    replace_stored(src, (0, 0), new)
    np.testing.assert_array_equal(pixels(head + k.read(early.fh, 1 << 20, 400)), chunk00(data))
    clock.now += ATTR_TIMEOUT  # (sooner, an open takes the stored file as unchanged: the next test)
    late = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert late.direct_io and not late.keep_cache
    np.testing.assert_array_equal(pixels(k.read(late.fh)), new)
    fs.release(late.fh)
    fs.release(early.fh)
    after = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert not after.keep_cache and not after.direct_io  # the old bytes cached are dropped
    np.testing.assert_array_equal(pixels(k.read(after.fh)), new)
    fs.release(after.fh)
    again = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert again.keep_cache  # unchanged since: the page cache serves it
    fs.release(again.fh)


def test_a_raw_reader_keeps_its_bytes_across_a_write_through_the_mount(tmp_path: Path, clock: Clock) -> None:
    """[write-2] a reader open across a commit keeps the old bytes; readers after it read the new."""
    src, data, fs, k = make_raw_fs(tmp_path, clock, reader_grace=0.01)
    fh = k.open(CHUNK, os.O_RDONLY, OTHER)
    head = k.read(fh, 400)
    new = stores.values((8, 16), "uint16", seed=10)
    k.write_file(CHUNK, tiff(new))
    np.testing.assert_array_equal(pixels(head + k.read(fh, 1 << 20, 400)), chunk00(data))
    k.close(fh)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)
    np.testing.assert_array_equal(zarr.open_array(str(src))[0:8, 0:16], new)


def test_a_reload_reopens_the_stored_files_of_open_readers(tmp_path: Path, clock: Clock) -> None:
    """[cons-2] after a reload an open file reads the store as it is now."""
    src, data, fs, k = make_raw_fs(tmp_path, clock)
    fh = k.open(CHUNK)
    first = k.read(fh)
    new = stores.values((8, 16), "uint16", seed=11)
    replace_stored(src, (0, 0), new)
    np.testing.assert_array_equal(pixels(k.read(fh)), chunk00(data))  # the file it opened
    k.call(fs.refresh)
    again = k.read(fh)
    assert len(again) == len(first)
    np.testing.assert_array_equal(pixels(again), new)
    k.close(fh)
    # without reopening the source (no `reload`): the same
    fs.reload = None
    fh = k.open(CHUNK)
    newer = stores.values((8, 16), "uint16", seed=12)
    replace_stored(src, (0, 0), newer)
    k.call(fs.refresh)
    np.testing.assert_array_equal(pixels(k.read(fh)), newer)
    k.close(fh)


def test_a_truncated_raw_chunk_is_eio_naming_its_key(tmp_path: Path, clock: Clock) -> None:
    """[read-5] [read-9] A stored raw chunk that is not the size of its values fails: EIO,
    with the store key and both sizes in the error journal; its header reads, and so do
    the other chunks. One truncated while open (rewritten in place) fails its next read."""
    src, data, fs, k = make_raw_fs(tmp_path, clock)
    stored = src / "c" / "0" / "1"
    stored.write_bytes(stored.read_bytes()[:-6])
    with pytest.raises(FsError) as e:
        k.read_file("c/0/1.tiff")
    assert e.value.errno == errno.EIO
    assert any("c/0/1" in line and "250 bytes, not the 256" in line for line in fs.errors), list(fs.errors)
    fh = k.open("c/0/1.tiff")
    assert k.read(fh, 8) == k.read_file(CHUNK)[:8]  # the header
    fs.release(fh)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))

    fh = k.open("c/1/0.tiff")
    head = k.read(fh, 400)
    assert head[:2] == b"II"
    with open(src / "c" / "1" / "0", "r+b") as f:  # in place, not a new file
        f.truncate(100)
    with pytest.raises(FsError) as e:
        k.read(fh, 1 << 20, 400)
    assert e.value.errno == errno.EIO
    assert any("c/1/0" in line and "ended after" in line for line in fs.errors), list(fs.errors)
    fs.release(fh)


def test_raw_read_ahead_asks_the_os_for_the_next_stored_files(tmp_path: Path, clock: Clock) -> None:
    """[read-7] Opening a chunk stored raw asks the OS to read the next 8 stored files ahead
    (posix_fadvise) and checks they exist, in one worker thread job; their lookups then
    answer from memory, and their opens and reads need no worker thread. The window moves
    on when less than half of it is left; a re-read asks nothing."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src, shape=(48, 32), chunks=(8, 16), codecs="raw")  # grid 6 x 2
    jobs: list[list[tuple[int, ...]]] = []
    threads: list[str] = []

    def spawn(fn, job) -> None:  # noqa: ANN001
        jobs.append(list(job[1]))
        fn(job)  # at once, as a worker thread would

    async def run(fn, *args):  # noqa: ANN001, ANN202
        threads.append(getattr(fn, "__name__", repr(fn)))
        return fn(*args)

    stats = Stats()
    config = MountConfig(sources=[str(src)], mountpoint="")
    fs = FileSystem(make_view(config, stats), stats=stats, clock=clock, spawn=spawn, run=run)
    k = Kernel(fs)
    fs.kernel = k
    k.read_file("c/0/0.tiff")
    assert jobs == [[(0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (4, 0)]]
    assert stats.snapshot()["read_ahead"] == 8
    assert not fs.view.needs_io(("c", "4", "0.tiff"))  # its lookup answers from memory
    threads.clear()
    jobs.clear()
    for name in ("c/0/1.tiff", "c/1/0.tiff", "c/1/1.tiff"):
        k.read_file(name)
    k.read_file("c/2/0.tiff")
    assert jobs == [] and threads == []  # still half a window ahead; all on the event loop
    k.read_file("c/2/1.tiff")
    assert jobs == [[(4, 1), (5, 0), (5, 1)]]  # less than half left: the rest of the grid
    k.read_file("c/0/0.tiff")  # a re-read
    assert len(jobs) == 1 and threads == []
    np.testing.assert_array_equal(pixels(k.read_file("c/5/1.tiff")), data[40:48, 16:32])
    assert stats.snapshot().get("chunks_decoded", 0) == 0


def test_raw_chunks_hold_at_most_half_the_descriptors(tmp_path: Path, clock: Clock, monkeypatch) -> None:  # noqa: ANN001
    """[read-9] Open chunk files (and the stored files kept for re-opens) hold stored files
    open only up to half the daemon's descriptor limit; beyond it chunks are decoded (same
    bytes), and closing gives them back."""
    from zfuse.view import array_view

    src, data, fs, k = make_raw_fs(tmp_path, clock)
    # stored files of earlier tests' discarded filesystems give their slots back when
    # collected: collect them now, not in the middle of this count
    gc.collect()
    monkeypatch.setattr(array_view._DESCRIPTORS, "limit", array_view._DESCRIPTORS.open + 2)
    names = ["c/0/0.tiff", "c/0/1.tiff", "c/1/0.tiff"]
    handles = [k.open(name) for name in names]
    assert fs.stats.snapshot()["chunks_passed_through"] == 2
    assert [isinstance(fs.handles[fh], StoredChunkHandle) for fh in handles] == [True, True, False]
    np.testing.assert_array_equal(pixels(k.read(handles[2])), data[8:16, 0:16])
    for fh in handles:
        k.close(fh)
    k.call(fs.refresh)  # (and the stored files kept for re-opens are closed)
    np.testing.assert_array_equal(pixels(k.read_file("c/1/0.tiff")), data[8:16, 0:16])
    assert fs.stats.snapshot()["chunks_passed_through"] == 3


def test_re_opens_within_the_attribute_timeout_read_the_stored_file_seen(tmp_path: Path, clock: Clock) -> None:
    """[read-9] [cons-1] [cons-2] Re-opening a chunk file stored raw within the attribute
    timeout of an open that saw its stored file reads that stored file, kept open (no
    system call), also if it was replaced behind the mount's back meanwhile: the kernel
    caches that file's bytes, and the chunk file is never a mix of two. An open after the
    timeout reads the new one. A change through the mount is seen at once."""
    src, data, fs, k = make_raw_fs(tmp_path, clock)
    ino = k.walk(CHUNK)
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), chunk00(data))  # the first open
    descriptors = len(os.listdir("/proc/self/fd"))
    again = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert again.keep_cache and len(os.listdir("/proc/self/fd")) == descriptors  # the kept one
    np.testing.assert_array_equal(pixels(k.read(again.fh)), chunk00(data))
    fs.release(again.fh)

    new = stores.values((8, 16), "uint16", seed=13)
    replace_stored(src, (0, 0), new)
    clock.now += ATTR_TIMEOUT / 2
    late = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert late.keep_cache
    np.testing.assert_array_equal(pixels(k.read(late.fh)), chunk00(data))  # whole, as the kernel has it
    fs.release(late.fh)
    clock.now += ATTR_TIMEOUT / 2
    fresh = k.call(fs.open, ino, os.O_RDONLY, OTHER)
    assert not fresh.keep_cache  # the kernel's cached bytes (the old file's) are dropped
    np.testing.assert_array_equal(pixels(k.read(fresh.fh)), new)
    fs.release(fresh.fh)

    newest = stores.values((8, 16), "uint16", seed=14)
    k.write_file(CHUNK, tiff(newest))
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), newest)
    np.testing.assert_array_equal(zarr.open_array(str(src))[0:8, 0:16], newest)
    k.call(fs.refresh)
    replace_stored(src, (0, 0), new)
    k.call(fs.refresh)  # a reload: seen at once
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), new)


def test_whole_image_versions_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """[hostile-5] the version each whole-image file was last opened at is remembered for
    at most VERSIONS_KEPT files (a walker opening every image of a crafted store); a file
    forgotten keeps nothing cached from before, which is safe, and one remembered keeps
    its pages while its version stands."""
    from zfuse.fs import image_push

    monkeypatch.setattr(image_push, "VERSIONS_KEPT", 4)
    pages = image_push.ImagePages(Stats(), None, None, lambda ino: None)
    assert not pages.opened(("a", "image.ome.tif"), 1)  # first open: nothing to keep
    assert pages.opened(("a", "image.ome.tif"), 1)  # same version: keep the pages
    assert not pages.opened(("a", "image.ome.tif"), 2)  # changed: drop them
    for i in range(100):
        pages.opened((f"g{i}", "image.ome.tif"), 1)
        assert len(pages.versions) <= 4
    assert not pages.opened(("a", "image.ome.tif"), 2)  # forgotten: dropped, never stale


def test_own_mtimes_remembered_are_the_latest_ones(v3, monkeypatch: pytest.MonkeyPatch) -> None:
    """[ns-6] the mtime utimes (or a write) gives a file is remembered for the latest
    MTIMES_KEPT files (a conversion writing a million chunks, a walker touching every
    file); an older one shows the mount's start time again, and one set again is the
    latest once more."""
    from zfuse.view import writes

    monkeypatch.setattr(writes, "MTIMES_KEPT", 3)
    _, _, fs, k = v3
    names = [f"c/{i}/{j}.tiff" for i in range(3) for j in range(2)]  # (the 6 chunk files)
    for n, name in enumerate(names):
        k.call(fs.setattr, k.walk(name), None, (1_000 + n) * 10**9)
    assert len(fs.writes.mtimes) == 3
    assert [k.stat(name).mtime_ns // 10**9 for name in names[3:]] == [1_003, 1_004, 1_005]
    assert k.stat(names[0]).mtime_ns // 10**9 == fs.started_ns // 10**9  # forgotten: the mount's
    k.call(fs.setattr, k.walk(names[3]), None, 2_000 * 10**9)  # set again: the latest now
    k.call(fs.setattr, k.walk(names[0]), None, 3_000 * 10**9)
    assert k.stat(names[3]).mtime_ns // 10**9 == 2_000 and k.stat(names[4]).mtime_ns // 10**9 == fs.started_ns // 10**9


def test_a_reload_rebinds_open_files_in_more_groups_than_members_kept(tmp_path: Path, clock: Clock) -> None:
    """[hostile-5] [cons-2] files open in 3 groups of 5 arrays with `members_kept` 4: the
    reload opens each file's groups in turn, so the first ones are forgotten again
    before their files are rebound; each file still moves to the new view's array
    (before: it silently kept the old view's) and reads what the store holds now."""
    src = tmp_path / "g.zarr"
    root = zarr.open_group(str(src), mode="w")
    for g in range(3):
        for a in range(5):
            root.require_group(f"g{g}").create_array(f"a{a}", shape=(2,), chunks=(2,), dtype="u1")[...] = 1
    config = MountConfig(sources=[str(src)], mountpoint="", read_only=False, members_kept=4)
    fs = FileSystem(make_view(config), read_only=False, stats=Stats(), clock=clock,
                    reload=lambda: make_view(config))
    k = Kernel(fs)
    fs.kernel = k
    paths = [f"g{g}/a{a}/c/0.tiff" for g in range(3) for a in range(5)]
    handles = {path: k.open(path) for path in paths}
    old = {path: fs.handles[fh].array for path, fh in handles.items()}
    for g in range(3):
        for a in range(5):
            zarr.open_array(str(src / f"g{g}" / f"a{a}"), mode="r+")[...] = 10 * g + a + 2
    k.call(fs.refresh)
    for path, fh in handles.items():
        assert fs.handles[fh].array is not old[path], path
        g, a = int(path[1]), int(path[4])
        assert pixels(k.read(fh)).ravel().tolist() == [10 * g + a + 2] * 2, path
        k.close(fh)


def test_a_failed_reload_keeps_the_view_as_it_was(v3) -> None:
    """[cons-2] a reload that fails (the store down) keeps the previous view with its
    decoded chunks: a chunk read before is still answered from memory, not asked of the
    store again (the view was refreshed anyway, and every read then waited on the store)."""
    src, data, fs, k = v3
    first = k.read_file(CHUNK)
    threads = fs.stats.snapshot().get("reads_in_threads", 0)

    def down() -> None:
        raise OSError("the store is down")

    fs.reload = down
    k.call(fs.refresh)
    assert any("reload failed, keeping the previous view: the store is down" in line for line in fs.errors)
    assert k.read_file(CHUNK) == first
    assert fs.stats.snapshot().get("reads_in_threads", 0) == threads  # answered from memory


def test_a_write_whose_outcome_is_unknown_is_read_anew(v3) -> None:
    """[write-1] a chunk write that fails after it may have landed (the store's answer
    lost): close() fails, and the next read asks the store, not the decoded chunk cache
    (the mount showed the old pixels until a reload while the store held the new)."""
    import tifffile

    src, data, fs, k = v3
    before = k.read_file(CHUNK)
    arr = dict(fs.view.arrays())[()]
    source = arr.source
    landed = stores.values((8, 16), "uint16", seed=21)
    real = source.write_chunk

    def lands_then_fails(coords: tuple[int, ...], values: np.ndarray, **options: bool) -> None:
        real(coords, values, **options)
        raise OSError(errno.EREMOTEIO, "connection reset after the PUT was sent")

    source.write_chunk = lands_then_fails  # type: ignore[method-assign]
    buf = io.BytesIO()
    tifffile.imwrite(buf, landed)
    with pytest.raises(FsError):
        k.write_file(CHUNK, buf.getvalue())
    source.write_chunk = real  # type: ignore[method-assign]
    after = k.read_file(CHUNK)
    assert after != before
    np.testing.assert_array_equal(pixels(after), landed)


def test_the_daemon_running_out_of_memory_is_not_blamed_on_the_file(v3, monkeypatch) -> None:
    """[write-12] a commit that runs the daemon out of memory fails close() with ENOMEM,
    its reason saying so, the stored chunk unchanged (it was EINVAL with an empty reason,
    as if the file were wrong)."""
    import tifffile

    import zfuse.view.writes as writes_module

    src, data, fs, k = v3
    before = k.read_file(CHUNK)

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(writes_module, "decode_tiff", out_of_memory)
    buf = io.BytesIO()
    tifffile.imwrite(buf, stores.values((8, 16), "uint16", seed=31))
    with pytest.raises(FsError) as failed:
        k.write_file(CHUNK, buf.getvalue())
    assert failed.value.errno == errno.ENOMEM
    assert any("the daemon ran out of memory" in line for line in fs.errors), list(fs.errors)
    monkeypatch.undo()
    assert k.read_file(CHUNK) == before


def test_a_name_not_utf8_is_journaled_escaped(v3) -> None:
    """[tree-6] a refused mkdir of a name that is not UTF-8 (decoded with surrogates, as
    the kernel's names are): its line in .zfuse/errors shows the name escaped; reading
    the journal (and `ls .zfuse`) failed with EIO until 500 newer lines pushed it out."""
    _, _, fs, k = v3
    parent, _ = k.parent_and_name("c/x")
    with pytest.raises(FsError) as e:
        k.call(fs.mkdir, parent, os.fsdecode(b"\xff"))
    assert e.value.errno == errno.EPERM
    journal = k.read_file(".zfuse/errors").decode("utf-8")
    assert "c/\\udcff" in journal, journal
    assert journal.rstrip().endswith("(EPERM)") and "[Errno" not in journal, journal  # (the errno once)
    assert "errors" in k.listdir(".zfuse")  # (listed, not EIO)


def test_descriptors_of_the_journal_share_its_text(v3) -> None:
    """[tree-6] every descriptor open on .zfuse/errors reads one shared text, made once
    per change (3,000 descriptors each held a copy of it: 500 MB); a line is at most
    ERROR_LINE_MAX characters."""
    from zfuse.fs.special import ERROR_LINE_MAX

    _, _, fs, k = v3
    fs.journal(("c", "0"), "x" * 10_000)
    handles = [k.open(".zfuse/errors") for _ in range(50)]
    try:
        contents = {id(fs.handles[fh].content) for fh in handles}
        assert len(contents) == 1
        line = k.read(handles[0]).decode().splitlines()[-1]
        assert len(line) == ERROR_LINE_MAX and line.endswith("...")
    finally:
        for fh in handles:
            fs.release(fh)


def test_readers_of_a_replaced_chunk_share_one_copy_of_its_bytes(v3) -> None:
    """[write-2] readers open on a chunk being replaced keep its old bytes, all of them
    one copy (a copy per descriptor took 150 readers of an 8 MiB chunk to 1.3 GB)."""
    _, data, fs, k = v3
    old = k.read_file(CHUNK)
    readers = [k.open(CHUNK, pid=OTHER + i) for i in range(20)]
    try:
        k.write_file(CHUNK, tiff(chunk00(data) + 1))
        snapshots = {id(fs.handles[fh].content) for fh in readers}
        assert len(snapshots) == 1
        assert all(k.read(fh) == old for fh in readers)
    finally:
        for fh in readers:
            fs.release(fh)


def test_a_log_line_naming_a_name_not_utf8_reaches_the_log_file(tmp_path: Path) -> None:
    """[tree-6] the log file's line of such a refusal is written, the name escaped (the
    strict UTF-8 handler had dropped the whole line)."""
    import sys

    log = tmp_path / "zfuse.log"
    script = ("import logging, os, sys; from zfuse.daemonize import configure_logging; "
              "configure_logging(0, sys.argv[1]); "
              "logging.getLogger('zfuse').warning('mkdir %s: refused', os.fsdecode(b'c/\\xff'))")
    subprocess.run([sys.executable, "-c", script, str(log)], check=True, capture_output=True, timeout=60)
    assert "mkdir c/\\udcff: refused" in log.read_text("utf-8")


def test_a_sparse_write_is_zero_filled_off_the_event_loop(v3, monkeypatch: pytest.MonkeyPatch) -> None:
    """[write-6] a 1-byte write far past a file's end: the hole is zero-filled in a worker
    thread, and the mount serves other requests meanwhile (filled on the event loop, a
    write at 1 GiB held every request for a second); the file reads the zeros and the byte."""
    import threading

    import zfuse.view.writes as writes_module

    src, _, _, _ = v3

    async def in_threads(fn, *args):  # noqa: ANN001, ANN202 - as on a mount: worker threads
        return await trio.to_thread.run_sync(fn, *args)

    fs, k = make_fs(src, Clock(), run=in_threads)
    filling, release = threading.Event(), threading.Event()
    real = writes_module._zero_fill

    released: list[bool] = []

    def held_fill(buffer: bytearray, end: int) -> None:
        filling.set()
        released.append(release.wait(10))  # (False: the loop waited out the fill, not served)
        real(buffer, end)

    monkeypatch.setattr(writes_module, "_zero_fill", held_fill)
    fh = k.open("c/0/new.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    stats_inode = k.walk(".zfuse/stats")
    at = writes_module.GROW_INLINE * 3
    served: list[bytes] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.write, fh, at, b"x")
            assert await trio.to_thread.run_sync(filling.wait, 10)
            stats = await fs.open(stats_inode, os.O_RDONLY, OTHER)
            served.append(await fs.read(stats.fh, 0, 1 << 16))  # while the hole is being filled
            fs.release(stats.fh)
            release.set()

    trio.run(main)
    assert released == [True] and served and served[0].startswith(b"{")
    data = k.read(fh)
    assert len(data) == at + 1 and data[-1:] == b"x" and not any(data[:-1])
    fs.release(fh)


def test_growing_writes_do_not_sum_every_file_held(v3, monkeypatch: pytest.MonkeyPatch) -> None:
    """[write-6] the write-buffer budget is checked without summing every file held on
    each growing write (10,000 files held made writes 16 times slower): the files are
    summed only when the budget may be reached, and then it still refuses (ENOSPC)."""
    import zfuse.view.writes as writes_module

    _, _, fs, k = v3
    held = [k.open(f"c/0/held{i}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for i in range(300)]
    counted = [0]
    real = writes_module._held_by

    def counting(state):  # noqa: ANN001, ANN202
        counted[0] += 1
        return real(state)

    monkeypatch.setattr(writes_module, "_held_by", counting)
    fh = k.open("c/0/grows.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for i in range(100):
        k.write(fh, b"x" * 1000, i * 1000)
    assert counted[0] < 1000, counted[0]  # (summing each time: 30,000)
    fs.writes.buffer_budget = 150_000  # the budget reached: summed, and refused
    with pytest.raises(FsError) as e:
        k.write(fh, b"x" * 100_000, 100_000)
    assert e.value.errno == errno.ENOSPC
    for f in (*held, fh):
        fs.release(f)


def test_a_write_through_an_inode_removed_or_replaced_is_stale(v3) -> None:
    """[ns-2] an inode unlinked or renamed over since it was looked up, opened for writing
    (a reopen through /proc/self/fd), or truncated by it: ESTALE, and the file now at its
    name is untouched (it wrote into that file, undoing the rename). Opened for reading it
    is still the file at the name."""
    src, data, fs, k = v3
    looked_up = k.walk(CHUNK, OTHER)
    k.write_file("c/0/.0.tiff.tmp", tiff(stores.values((8, 16), "uint16", seed=15)))
    k.rename("c/0/.0.tiff.tmp", CHUNK)
    after = stores.snapshot(src)
    for call in ((fs.open, looked_up, os.O_WRONLY | os.O_TRUNC, OTHER), (fs.setattr, looked_up, 0)):
        with pytest.raises(FsError) as e:
            k.call(*call)
        assert e.value.errno == errno.ESTALE
    assert stores.snapshot(src) == after
    fh = k.call(fs.open, looked_up, os.O_RDONLY, OTHER).fh
    np.testing.assert_array_equal(pixels(k.read(fh)), stores.values((8, 16), "uint16", seed=15))
    fs.release(fh)


def test_a_reader_opening_while_cp_opens_the_chunk_bypasses_the_page_cache(v3) -> None:
    """[write-2] a reader whose open is served while a writer's O_TRUNC open is under way
    gets direct I/O (the stored chunk), not the page cache: the kernel sets the size of
    the file to 0 for every opener once the writer's open returns, and such a reader read
    an empty file."""
    _, data, fs, k = v3
    ino = k.walk(CHUNK, OTHER)
    replies: dict[str, object] = {}

    async def main() -> None:
        async def writer() -> None:
            replies["writer"] = await fs.open(ino, os.O_WRONLY | os.O_TRUNC, WRITER)

        async def reader() -> None:
            replies["reader"] = await fs.open(ino, os.O_RDONLY, OTHER)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.lowlevel.checkpoint()  # (the writer's open has started)
            nursery.start_soon(reader)

    trio.run(main)
    reader = replies["reader"]
    assert reader.direct_io  # type: ignore[attr-defined]
    np.testing.assert_array_equal(pixels(k.read(reader.fh)), chunk00(data))  # type: ignore[attr-defined]
    for reply in replies.values():
        fs.release(reply.fh)  # type: ignore[attr-defined]


def test_a_write_filling_a_hole_never_touches_the_file_an_o_trunc_open_began(tmp_path: Path) -> None:
    """[write-2] writer A's write far past the end (its hole zero-filled in a worker
    thread), and meanwhile writer B's O_TRUNC open and cp of the right file: A's write
    goes with the bytes B's open threw away; B's file is stored (A's first IFD, a 10 x 10
    image, was checked against B's file and refused it)."""
    import struct

    async def in_threads(fn, *args):  # noqa: ANN001, ANN202
        return await trio.to_thread.run_sync(fn, *args)

    src = tmp_path / "a.zarr"
    n = 4096
    zarr.create_array(str(src), shape=(n, n), chunks=(n, n), dtype="u1", fill_value=0, compressors=None)[0, 0] = 1
    fs, k = make_fs(src, Clock(), run=in_threads)
    ino = k.walk("c/0/0.tiff")
    far = 8 << 20
    entries = [(256, 4, 1, 10), (257, 4, 1, 10), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
               (273, 4, 1, 8), (277, 3, 1, 1), (278, 4, 1, 10), (279, 4, 1, 100)]
    bad_ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *e) for e in entries) + bytes(4)
    good = tiff(np.full((n, n), 7, np.uint8))
    out: dict[str, str] = {}

    async def main() -> None:
        fa = (await fs.open(ino, os.O_WRONLY | os.O_TRUNC, WRITER)).fh
        await fs.write(fa, 0, b"II*\0" + struct.pack("<I", far))
        state = fs.handles[fa].state

        async def writer_a() -> None:
            await fs.write(fa, far, bad_ifd)
            out["a"] = "written"

        async def writer_b() -> None:
            while state.growing is None:
                await trio.lowlevel.checkpoint()
            fb = (await fs.open(ino, os.O_WRONLY | os.O_TRUNC, OTHER)).fh
            try:
                for off in range(0, len(good), 1 << 20):
                    await fs.write(fb, off, good[off : off + (1 << 20)])
                await fs.flush(fb)
                out["b"] = "stored"
            finally:
                fs.release(fb)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer_a)
            nursery.start_soon(writer_b)
        fs.release(fa)

    trio.run(main)
    assert out == {"a": "written", "b": "stored"}
    assert (zarr.open_array(str(src), mode="r")[:4, :4] == 7).all()


def test_readers_of_different_versions_keep_their_own_when_the_chunk_is_replaced(tmp_path: Path) -> None:
    """[write-2] two readers of a raw chunk that opened different stored versions (the
    store rewritten behind the mount between their opens): once the chunk is replaced
    through the mount, each still reads its own (sharing one copy gave the second reader
    the first's bytes)."""
    src = tmp_path / "a.zarr"
    arr = zarr.create_array(str(src), shape=(64, 64), chunks=(32, 32), dtype="u1", fill_value=0, compressors=None)
    arr[...] = 1
    clock = Clock()
    fs, k = make_fs(src, clock)
    first = k.open(CHUNK, os.O_RDONLY, OTHER)
    assert set(pixels(k.read(first)).ravel()) == {1}
    arr[:32, :32] = 2  # another program rewrites the chunk in the store
    clock.now += 100  # (past the attribute timeout: the stored file is opened anew)
    second = k.open(CHUNK, os.O_RDONLY, OTHER + 1)
    assert set(pixels(k.read(second)).ravel()) == {2}
    k.write_file(CHUNK, tiff(np.full((32, 32), 3, np.uint8)))
    assert set(pixels(k.read(first)).ravel()) == {1}
    assert set(pixels(k.read(second)).ravel()) == {2}
    for fh in (first, second):
        fs.release(fh)


def test_a_reader_opening_a_chunk_while_it_is_renamed_reads_the_moved_values(tmp_path: Path, clock: Clock) -> None:
    """[ns-3] [cons-1] a reader opening A while `mv A B` runs: direct I/O (its reads never
    reach the page cache of the file the kernel moves to B), and once the rename is done
    it reads the moved values, not the fill value of a chunk A no longer stored (those
    zeros filled B's page cache: every later reader of B read zeros)."""
    src = tmp_path / "a.zarr"
    data = stores.v3(src)
    gated = GatedCommits()
    fs, k = make_fs(src, clock, run=gated.run, replace_window=5.0, pending_timeout=60.0)
    a_ino = k.walk("c/1/0.tiff", OTHER)
    row1, row0 = k.walk("c/1"), k.walk("c/0")
    replies: list[object] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.rename, row1, "0.tiff", row0, "0.tiff", 0)
            await gated.committing.wait()  # (the rename's commit at B under way)
            replies.append(await fs.open(a_ino, os.O_RDONLY, OTHER))
            gated.gate.set()

    trio.run(main)
    (reply,) = replies
    assert reply.direct_io  # type: ignore[attr-defined]
    np.testing.assert_array_equal(pixels(k.read(reply.fh)), data[8:16, :16])  # type: ignore[attr-defined]
    fs.release(reply.fh)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(pixels(k.read_file(CHUNK)), data[8:16, :16])


def test_a_reader_of_an_unlinked_chunk_keeps_its_size_and_bytes(v3) -> None:
    """[ns-4] a chunk unlinked while a reader has it open: fstat of the reader's inode
    answers its size (ENOENT for the whole replace window, and so did the kernel's
    attribute check before a read), and its reads give the chunk's bytes, decoded again
    after the chunk cache let go of it."""
    _, data, fs, k = v3
    fh = k.open(CHUNK, os.O_RDONLY, OTHER)
    size = len(k.read(fh))
    ino = fs.handles[fh].inode.ino
    k.unlink(CHUNK)
    assert k.call(fs.getattr, ino, OTHER).size == size
    fs.view.cache.clear()
    np.testing.assert_array_equal(pixels(k.read(fh)), chunk00(data))
    fs.release(fh)
    assert not k.exists(CHUNK)


def test_a_name_with_a_newline_forges_no_line(v3, tmp_path: Path) -> None:
    """[tree-6] a refused name holding a newline and a tab: one journal line, the name's
    control characters escaped (it added a convincing line of its own to .zfuse/errors,
    `zfuse status` and the log); the log's line is one line too."""
    import subprocess
    import sys

    _, _, fs, k = v3
    parent, _ = k.parent_and_name("c/x")
    forged = "x\n2026-11-27T01:00:00\tc/0/0.tiff\tflush: store write failed (EIO)"
    with pytest.raises(FsError):
        k.call(fs.mkdir, parent, forged)
    lines = k.read_file(".zfuse/errors").decode().splitlines()
    assert len(lines) == 1 and "x\\x0a2026-11-27T01:00:00\\x09c/0/0.tiff" in lines[0], lines
    log = tmp_path / "zfuse.log"
    script = ("import logging, sys; from zfuse.daemonize import configure_logging; "
              "configure_logging(0, sys.argv[1]); logging.getLogger('zfuse').error('mkdir %s: refused', sys.argv[2])")
    subprocess.run([sys.executable, "-c", script, str(log), forged], check=True, capture_output=True, timeout=60)
    (line,) = log.read_text("utf-8").splitlines()
    assert "x\\x0a2026" in line


def test_refusals_of_one_kind_are_logged_at_most_twenty_in_ten_seconds(
        v3, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    """[tree-6] one client's refused calls do not fill the log (39,000 refused mkdirs in
    5 s wrote 13 MiB): 20 lines of a kind (operation, errno) in 10 s, then one line
    counting the rest; .zfuse/errors has every one of them (its last 500)."""
    src = v3[0]
    fs, k = make_fs(src, clock)
    parent, _ = k.parent_and_name("c/x")
    with caplog.at_level("ERROR", logger="zfuse"):
        for i in range(30):
            with pytest.raises(FsError):
                k.call(fs.mkdir, parent, f"bad{i}")
        assert len([r for r in caplog.records if "mkdir" in r.getMessage()]) == 20
        clock.now += 11
        k.tick()  # (the burst has stopped: its count is said at the next tick)
        with pytest.raises(FsError):
            k.call(fs.mkdir, parent, "bad30")
    said = [r.getMessage() for r in caplog.records]
    assert "10 more failures of mkdir (EPERM) in 10 s were not logged (see .zfuse/errors)" in said
    assert any("bad30" in line for line in said)
    assert len(k.read_file(".zfuse/errors").decode().splitlines()) == 31


def test_open_directories_share_one_snapshot_of_their_listing(v3) -> None:
    """[tree-4] every open of an array directory reads one sorted snapshot of it per
    listing version (each opendir sorted and held its own: 1,000 handles of a 10,000-chunk
    directory held 1.6 GB); a chunk written makes a new one, which lists it."""
    _, data, fs, k = v3
    row = k.walk("c/1")
    handles = [k.call(fs.opendir, row) for _ in range(20)]
    assert len({id(fs._dirs[fh].reader._buffer) for fh in handles}) == 1
    names = sorted(k.listdir("c/1"))
    k.write_file("c/2/1.tiff", tiff(np.full((4, 14), 5, np.uint16)))  # (an edge chunk, cropped shape)
    later = k.call(fs.opendir, k.walk("c/2"))
    assert "1.tiff" in [name for name, _ in fs._dirs[later].reader._buffer]
    assert sorted(k.listdir("c/1")) == names
    for fh in (*handles, later):
        fs.releasedir(fh)


def test_big_directories_share_their_first_entries_and_list_whole(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """[tree-4] a directory too big for one snapshot (streamed in listing order): its
    readers share the first entries read, and each still lists every entry once."""
    import zfuse.view.chunk_listing as chunk_listing_module
    from zfuse.view.tree import DirReader

    monkeypatch.setattr(DirReader, "SNAPSHOT_MAX", 5)
    monkeypatch.setattr(chunk_listing_module, "LIST_PAGE", 7)  # (pages of 7: the first is shared)
    src = tmp_path / "a.zarr"
    zarr.create_array(str(src), shape=(40,), chunks=(1,), dtype="u1", fill_value=0, compressors=None)[:] = 1
    fs, k = make_fs(src, Clock())
    expected = sorted(f"{i}.tiff" for i in range(40))
    assert sorted(k.listdir("c")) == expected
    first = k.call(fs.opendir, k.walk("c"))
    second = k.call(fs.opendir, k.walk("c"))
    assert fs._dirs[first].reader._buffer is fs._dirs[second].reader._buffer
    assert len(fs._dirs[first].reader._buffer) == 7
    for fh in (second, first):
        seen: list[str] = []

        def take(name: str, ino: int, attrs: object, off: int, seen: list[str] = seen) -> bool:
            seen.append(name)
            return True

        k.call(fs.readdir, fh, 0, take)
        assert sorted(seen) == expected
        fs.releasedir(fh)


def test_old_copies_for_readers_are_bounded(v3) -> None:
    """[write-2] [ns-4] the old bytes readers of replaced chunks keep are counted, at most
    OLD_COPIES_BYTES together (one reader on each of 200 chunks of 8 MiB, then `rm` of
    them, held 1.5 GB): past it, such a reader's reads fail with ESTALE saying why, its
    fstat still answers; a copy is given back when its last reader closes."""
    src, data, _, _ = v3
    fs, k = make_fs(src, Clock(), reader_grace=0.01)  # (the writers wait for no reader)
    first = k.open(CHUNK, os.O_RDONLY, OTHER)
    second = k.open("c/1/0.tiff", os.O_RDONLY, OTHER)
    size = len(k.read(first))
    fs.old_copies.budget = size  # room for one copy
    k.write_file(CHUNK, tiff(chunk00(data) + 1))
    k.write_file("c/1/0.tiff", tiff(data[8:16, :16] + 1))
    np.testing.assert_array_equal(pixels(k.read(first)), chunk00(data))
    assert fs.old_copies.held == size
    with pytest.raises(FsError) as e:
        k.read(second)
    assert e.value.errno == errno.ESTALE
    assert "was replaced or removed while open" in k.read_file(".zfuse/errors").decode()
    assert k.call(fs.getattr, fs.handles[second].inode.ino, OTHER).size == size
    for fh in (first, second):
        fs.release(fh)
    assert fs.old_copies.held == 0


def test_a_refused_rename_leaves_its_readers_alone(v3) -> None:
    """[ns-3] a rename refused (RENAME_NOREPLACE onto a chunk, a chunk onto a name that is
    no chunk's) changes nothing for readers of its source: no copy of its bytes is made
    or counted (with the old-copies budget spent, such a reader's reads failed ESTALE,
    the file never changed)."""
    _, data, fs, k = v3
    fs.old_copies.budget = 0
    reader = k.open(CHUNK, os.O_RDONLY, OTHER)
    for flags, new in ((1, "c/1/0.tiff"), (0, "c/0/0.bak")):
        with pytest.raises(FsError):
            k.rename(CHUNK, new, flags)
    np.testing.assert_array_equal(pixels(k.read(reader)), chunk00(data))
    assert fs.old_copies.held == 0 and not fs.page_readers.old_bytes
    fs.release(reader)


def test_a_stale_page_cache_reader_is_uncounted_when_it_closes(v3) -> None:
    """[ns-4] a page-cache reader whose old bytes the daemon could not keep (ESTALE) is
    still counted as a page-cache reader until it closes, and uncounted then (the count
    stayed, and every later cp of the chunk waited the whole grace for a reader gone)."""
    _, data, fs, k = v3
    fs.old_copies.budget = 0
    reader = k.open(CHUNK, os.O_RDONLY, OTHER)
    assert fs.handles[reader].page_cached
    fs.page_readers.grace = 0.01
    k.write_file(CHUNK, tiff(chunk00(data) + 1))
    assert type(fs.handles[reader]).__name__ == "StaleHandle" and fs.handles[reader].page_cached
    fs.release(reader)
    assert not fs.page_readers.any_open(("c", "0", "0.tiff"))


def test_names_with_other_line_breaks_stay_one_line() -> None:
    """[tree-6] U+0085, U+2028 and U+2029, line breaks to str.splitlines() (zfuse status
    reads the journal so), are escaped too."""
    from zfuse.errors import printable

    text = printable("a\x85b\u2028c\u2029d\ne\udcff")
    assert text.splitlines() == [text] and text == "a\\x85b\\u2028c\\u2029d\\x0ae\\udcff"


def test_a_concatenation_names_its_sources_keys_in_errors(tmp_path: Path, clock: Clock) -> None:
    """[tree-6] a refused write to a chunk of a concatenated view names the source chunks
    behind it, each source's name and key (it named `concat/c/1/0`, no store's key)."""
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    stores.v3(a, shape=(16, 32))
    stores.v3(b, shape=(16, 32), seed=1)
    config = MountConfig(sources=[str(a), str(b)], mountpoint="", read_only=False, concat_axis=0)
    fs = FileSystem(make_view(config), read_only=False, stats=Stats(), clock=clock, process=lambda pid: pid,
                    reload=lambda: make_view(config))
    k = Kernel(fs)
    fs.kernel = k
    with pytest.raises(FsError):
        k.write_file("c/2/0.tiff", b"not a tiff at all")
    line = k.read_file(".zfuse/errors").decode().splitlines()[-1]
    assert f"concat/c/2/0 ({b}: c/0/0)" in line, line


def test_which_codecs_are_taken_for_exact(tmp_path: Path) -> None:
    """[write-15] the codecs a written chunk is stored through unchecked: a Delta only of
    integers in the array's own type (one of another type on the same bytes stored
    4607182418800017408 as 0), numcodecs' PackBits only of booleans, zfuse's packbits
    only keeping every bit (bits 0-3 of a byte stored 200 as 8)."""
    import numcodecs

    from zfuse.ext.packbits import PackBitsCodec
    from zfuse.view.source import ZarrChunkSource

    def exact(name: str, dtype: str, *, filters: object = None, serializer: object = "auto") -> bool:
        v2 = serializer == "auto" and filters is not None
        a = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=(8,), chunks=(8,), dtype=dtype, fill_value=0,
                              filters=filters, compressors=None, serializer=serializer,
                              zarr_format=2 if v2 else 3)
        return ZarrChunkSource(a, name=name).codecs.exact

    assert exact("d1", "<i8", filters=[numcodecs.Delta(dtype="<i8")])
    assert not exact("d2", "<i8", filters=[numcodecs.Delta(dtype="<f8")])
    assert not exact("d3", "<f8", filters=[numcodecs.Delta(dtype="<f8")])
    assert not exact("d4", "<i4", filters=[numcodecs.Delta(dtype="<i4", astype="<i2")])
    assert exact("p1", "bool", filters=[numcodecs.PackBits()])
    assert not exact("p2", "|u1", filters=[numcodecs.PackBits()])
    assert exact("p3", "uint8", serializer=PackBitsCodec())
    assert exact("p4", "uint8", serializer=PackBitsCodec(first_bit=0, last_bit=7))
    assert not exact("p5", "uint8", serializer=PackBitsCodec(first_bit=0, last_bit=3))
    assert exact("plain", "uint16")


def test_a_straddling_chunk_a_part_fails_to_store_is_not_left_half_new(tmp_path: Path, clock: Clock) -> None:
    """A concatenation's view chunk that straddles two sources, the second of which
    fails to store its part (its disk full): close() fails and the first source's rows
    are as they were (they had kept the new values: a chunk half new, half old), its
    chunk that was not stored not made either."""
    from zfuse.ext.concat import save_concat

    if os.geteuid() != 0:
        pytest.skip("needs root: a small tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        parts = [tmp_path / "p0.zarr", small / "p1.zarr"]
        for p in parts:
            zarr.create_array(str(p), shape=(12, 16), chunks=(8, 16), dtype="u1", fill_value=0,
                              compressors=None)[...] = 1
        (parts[0] / "c" / "1" / "0").unlink()  # (rows 8-12 of the first not stored: the fill value)
        save_concat(tmp_path / "c.json", [str(p) for p in parts], axis=0)
        before = stores.snapshot(parts[0])
        fs, k = make_fs(tmp_path / "c.json", clock)
        with contextlib.suppress(OSError), open(small / "filler", "wb") as f:  # (the second source's disk full)
            while f.write(b"\0" * 4096):
                f.flush()
        with pytest.raises(FsError) as e:  # rows 8-16: part 0's rows 8-12, part 1's 0-4
            k.write_file("c/1/0.tiff", tiff(np.full((8, 16), 9, "u1")))
        assert e.value.errno == errno.ENOSPC
        assert stores.snapshot(parts[0]) == before  # (no chunk of fill values made where none was)
        assert (zarr.open_array(str(parts[0]))[:8] == 1).all() and (zarr.open_array(str(parts[0]))[8:] == 0).all()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)


def test_immutable_and_append_only_chunks_are_refused_at_once(v3, clock: Clock) -> None:
    """[write-14] a chunk file made immutable (`chattr +i`), or a chunk directory made
    append-only (`chattr +a`), which no permission overrides: `rm`, an open for writing
    and a new chunk there fail at once with EPERM, naming it (rm had said 0 and the
    chunk came back 30 s later; a cp failed only at close())."""
    src, data, fs, k = v3
    chunk, folder = src / "c" / "0" / "0", src / "c" / "1"
    if subprocess.run(["chattr", "+i", str(chunk)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem keeps no inode flags (chattr)")
    try:
        subprocess.run(["chattr", "+a", str(folder)], check=True)
        before = stores.snapshot(src)
        for attempt in (lambda: k.unlink(CHUNK), lambda: k.open(CHUNK, os.O_WRONLY | os.O_TRUNC),
                        lambda: k.open("c/1/1.tiff", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            with pytest.raises(FsError) as e:
                attempt()
            assert e.value.errno == errno.EPERM
        assert "0.tiff" in k.listdir("c/0")
        assert any("c/0/0 is immutable (chattr)" in line for line in fs.errors), list(fs.errors)
        assert any("c/1 is append-only (chattr)" in line for line in fs.errors), list(fs.errors)
        assert stores.snapshot(src) == before
        # an append-only directory above, where a write only makes a new directory: no refusal
        from zfuse.local_store import AtomicLocalStore

        assert AtomicLocalStore(str(src)).write_refusal("c/1/new/0") is None
    finally:
        subprocess.run(["chattr", "-i", str(chunk)], check=True)
        subprocess.run(["chattr", "-a", str(folder)], check=True)


def test_a_straddling_chunk_over_an_unreadable_source_chunk_replaces_it(tmp_path: Path, clock: Clock) -> None:
    """A concatenation's straddling chunk whose source chunk does not decode (corrupt):
    written whole, it replaces it, as zarr does (keeping what it held, to put back on a
    failure, must not refuse the write)."""
    from zfuse.ext.concat import save_concat

    parts = [tmp_path / "p0.zarr", tmp_path / "p1.zarr"]
    for p, rows in zip(parts, (8, 4), strict=True):  # (the second's chunk 0: rows 0-4, covered whole)
        zarr.create_array(str(p), shape=(12, 16), chunks=(rows, 16), dtype="u1", fill_value=0,
                          compressors=zarr.codecs.ZstdCodec())[...] = 1
    (parts[1] / "c" / "0" / "0").write_bytes(b"not zstd")
    save_concat(tmp_path / "c.json", [str(p) for p in parts], axis=0)
    fs, k = make_fs(tmp_path / "c.json", clock)
    k.write_file("c/1/0.tiff", tiff(np.full((8, 16), 9, "u1")))  # rows 8-16: part 0's 8-12, part 1's 0-4
    assert (zarr.open_array(str(parts[0]))[8:] == 9).all() and (zarr.open_array(str(parts[1]))[:4] == 9).all()
