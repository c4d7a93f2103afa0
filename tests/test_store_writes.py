"""How `AtomicLocalStore` replaces an object (plain calls on a real directory, no mount):
the new object takes the old one's name in one step, no other name is left behind,
and the old object's data stays whole for whoever still has it open."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from zarr.core.buffer import cpu

from zfuse import local_store
from zfuse.local_store import AtomicLocalStore


def _buffer(data: bytes) -> cpu.Buffer:
    return cpu.Buffer.from_bytes(data)


def _names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("durable", [True, False])
def test_replacing_an_object_leaves_only_its_name_and_keeps_the_old_data_whole(
    tmp_path: Path, durable: bool
) -> None:
    store = AtomicLocalStore(str(tmp_path), durable=durable)
    old, new = b"old!" * 50_000, b"new" * 70_000
    store.set_sync("c/0/0", _buffer(old))
    with open(tmp_path / "c" / "0" / "0", "rb") as reader:  # a reader of the old object
        store.set_sync("c/0/0", _buffer(new))
        assert (tmp_path / "c" / "0" / "0").read_bytes() == new
        assert _names(tmp_path / "c" / "0") == ["0"]  # no temporary or old name, at once
        assert reader.read() == old  # never truncated under the reader
        assert os.fstat(reader.fileno()).st_nlink == 0


def test_a_new_object_and_a_list_of_parts(tmp_path: Path) -> None:
    store = AtomicLocalStore(str(tmp_path), durable=False)
    store.set_sync("c/1/2", [b"ab", memoryview(b"cd"), bytearray(b"ef")])
    assert (tmp_path / "c" / "1" / "2").read_bytes() == b"abcdef"
    assert _names(tmp_path / "c" / "1") == ["2"]


def _open_deleted_files() -> list[str]:
    """Files this process holds open that no name points to any more."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)"):
            out.append(target)
    return out


def test_the_replaced_objects_data_is_freed_soon_after(tmp_path: Path) -> None:
    """The old object is unlinked at once; its last descriptor (which frees its blocks)
    is closed in a background thread, soon."""
    store = AtomicLocalStore(str(tmp_path), durable=False)
    for i in range(20):
        store.set_sync("c/0/0", _buffer(bytes([i]) * 100_000))
    deadline = time.monotonic() + 10
    while [t for t in _open_deleted_files() if str(tmp_path) in t]:
        assert time.monotonic() < deadline, _open_deleted_files()
        time.sleep(0.01)
    assert (tmp_path / "c" / "0" / "0").read_bytes() == bytes([19]) * 100_000


def test_a_filesystem_that_cannot_swap_names_gets_a_plain_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Filesystems without RENAME_EXCHANGE, e.g. some network filesystems, answer
    EINVAL once and are remembered; here the memory is set beforehand.)"""
    monkeypatch.setattr(local_store, "_no_exchange", {os.stat(tmp_path).st_dev})
    store = AtomicLocalStore(str(tmp_path), durable=False)
    store.set_sync("k", _buffer(b"one"))
    with open(tmp_path / "k", "rb") as reader:
        store.set_sync("k", _buffer(b"two"))
        assert reader.read() == b"one"
    assert (tmp_path / "k").read_bytes() == b"two"
    assert _names(tmp_path) == ["k"]


def test_a_failed_write_leaves_the_old_object_and_no_temporary(tmp_path: Path) -> None:
    store = AtomicLocalStore(str(tmp_path), durable=False)
    store.set_sync("k", _buffer(b"kept"))

    with pytest.raises(TypeError):
        store.set_sync("k", [b"partial", object()])
    assert (tmp_path / "k").read_bytes() == b"kept"
    assert _names(tmp_path) == ["k"]


def test_an_object_cannot_replace_a_directory(tmp_path: Path) -> None:
    """As with a rename onto a directory: refused, the directory and its files untouched."""
    (tmp_path / "c" / "0").mkdir(parents=True)
    (tmp_path / "c" / "0" / "1").write_bytes(b"inner")
    store = AtomicLocalStore(str(tmp_path), durable=False)
    with pytest.raises(IsADirectoryError):
        store.set_sync("c/0", _buffer(b"a file"))
    assert (tmp_path / "c" / "0" / "1").read_bytes() == b"inner"
    assert _names(tmp_path / "c") == ["0"]


def test_at_most_a_bounded_number_of_replaced_objects_wait_to_be_freed(tmp_path: Path) -> None:
    """Each replaced object waiting to be freed is an open descriptor: past
    FREEING_WAITING the writer closes its own (frees it in its own call)."""
    import threading

    started, release = threading.Event(), threading.Event()

    def hold(_: object) -> None:
        started.set()
        release.wait(30)

    local_store._freeing.submit(hold, None)  # the freeing thread, busy until released
    assert started.wait(30)
    store = AtomicLocalStore(str(tmp_path), durable=False)
    try:
        for i in range(local_store.FREEING_WAITING + 6):
            store.set_sync("k", _buffer(bytes([i % 256]) * 1000))
        assert local_store._freeing.waiting() == local_store.FREEING_WAITING
        assert len([t for t in _open_deleted_files() if str(tmp_path) in t]) == local_store.FREEING_WAITING
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while [t for t in _open_deleted_files() if str(tmp_path) in t]:
        assert time.monotonic() < deadline, _open_deleted_files()
        time.sleep(0.01)
    assert (tmp_path / "k").read_bytes() == bytes([69]) * 1000


def test_a_rewritten_object_keeps_its_mode_and_a_new_one_is_readable(tmp_path) -> None:
    """A chunk rewritten through the store keeps the mode (and owner) it had: a root
    daemon's writes made a user's 0644 chunks 0600 and root's, unreadable to the user;
    a new one is 0666 less the umask, as zarr-python makes it."""
    import os
    import stat as stat_mod

    from zfuse.local_store import AtomicLocalStore

    root = tmp_path / "s"
    (root / "c").mkdir(parents=True)
    (root / "c" / "0").write_bytes(b"old")
    os.chmod(root / "c" / "0", 0o640)
    import asyncio

    from zarr.core.buffer import cpu

    store = AtomicLocalStore(str(root))
    asyncio.run(store.set("c/0", cpu.Buffer.from_bytes(b"new")))
    asyncio.run(store.set("c/1", cpu.Buffer.from_bytes(b"new")))
    assert (root / "c" / "0").read_bytes() == b"new"
    assert stat_mod.S_IMODE(os.stat(root / "c" / "0").st_mode) == 0o640
    umask = os.umask(0)
    os.umask(umask)
    assert stat_mod.S_IMODE(os.stat(root / "c" / "1").st_mode) == 0o666 & ~umask


def test_a_user_rewriting_another_members_object_keeps_its_group(tmp_path: Path) -> None:
    """A store shared through a group: a member who is not root replacing another
    member's object (a child of this test, turned into nobody in that group) keeps the
    object's group and mode, the owner being the writer, as for any file they write (the
    group had become the writer's own: the others could no longer write it)."""
    import stat as stat_mod

    if os.geteuid() != 0:
        pytest.skip("needs root: the child becomes another user")
    shared_gid = 4242
    root = tmp_path / "s"
    (root / "c").mkdir(parents=True)
    (root / "c" / "0").write_bytes(b"old")
    os.chown(root / "c" / "0", 0, shared_gid)
    os.chmod(root / "c" / "0", 0o664)
    os.chown(root / "c", 0, shared_gid)
    os.chmod(root / "c", 0o775)  # (no setgid bit: new files would take the group anyway)
    for d in (tmp_path, root):
        d.chmod(0o755)
    store = AtomicLocalStore(str(root))
    store.root_fd()
    pid = os.fork()
    if pid == 0:  # the child: nobody, in the shared group
        code = 1
        try:
            os.setgroups([shared_gid])
            os.setgid(65534)
            os.setuid(65534)
            store.set_sync("c/0", cpu.Buffer.from_bytes(b"new"))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    st = os.stat(root / "c" / "0")
    assert (root / "c" / "0").read_bytes() == b"new"
    assert (st.st_uid, st.st_gid, stat_mod.S_IMODE(st.st_mode)) == (65534, shared_gid, 0o664)
