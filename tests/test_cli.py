"""The command line: background mounts, clear failures, `zfuse info`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import zarr

import stores
from conftest import fuse_available, skip_or_fail

ZFUSE = [sys.executable, "-m", "zfuse.cli"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ZFUSE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.mount
def test_background_mount_returns_once_live_and_umount(tmp_path: Path) -> None:
    if reason := fuse_available():
        skip_or_fail(reason)
    stores.v3(tmp_path / "a.zarr")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "zfuse.log"
    r = run("mount", "--log-file", str(log), str(tmp_path / "a.zarr"), str(mnt))
    try:
        assert r.returncode == 0, r.stderr
        assert os.path.ismount(mnt)  # live when the command returns
        assert (mnt / "c" / "0" / "0.tiff").is_file()
        busy = run("mount", str(tmp_path / "a.zarr"), str(mnt))
        assert busy.returncode != 0 and "busy" in busy.stderr
        pid = json.loads((mnt / ".zfuse" / "mount").read_text())["pid"]
        # a pending file: the daemon drops it (and logs it) only as it exits
        (mnt / "c" / "0" / "1.tiff").write_bytes(b"II*\0")
    finally:
        u = run("umount", str(mnt))
    assert u.returncode == 0, u.stderr
    assert not os.path.ismount(mnt)
    # umount returned once the daemon had exited: its last words are in the log
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "dropped at unmount" in log.read_text()


def test_info_describes_arrays(tmp_path: Path) -> None:
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    stores.sharded(tmp_path / "g.zarr" / "sharded")
    s = root.create_array("names", shape=(4,), chunks=(2,), dtype=str)
    s[...] = ["a", "b", "c", "d"]
    stores.concat_parts(tmp_path / "g.zarr" / "parts")
    r = run("info", str(tmp_path / "g.zarr"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "array sharded" in out and "inner chunks of shards (16, 32)" in out
    assert "chunks (8, 16)" in out and "TIFF: header" in out
    assert "not shown as TIFF" in out
    assert "concat-parts" in out
    report = json.loads(run("info", "--json", str(tmp_path / "g.zarr")).stdout)
    by_path = {a["path"]: a for a in report["arrays"]}
    assert by_path["sharded"]["files"] == 6  # 20x30 in inner chunks of 8x16: a 3x2 grid
    assert by_path["names"]["shown"] is False and by_path["names"]["why_not"]


@pytest.mark.mount
def test_verbose_logs_every_operation(tmp_path: Path, mount) -> None:
    stores.v3(tmp_path / "a.zarr")
    m = mount(tmp_path / "a.zarr", "-v")
    os.listdir(m.path / "c" / "0")
    (m.path / "c" / "0" / "0.tiff").read_bytes()
    log = m.log()
    for op in ("lookup(2, '0')", "opendir(", "readdir(", "open(", "read(", "flush("):
        assert op in log, op


@pytest.mark.mount
def test_missing_dev_fuse_is_a_clear_error(tmp_path: Path) -> None:
    """In a private mount namespace whose /dev has no fuse device, mount fails clearly."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "mnt").mkdir()
    script = (f"mount -t tmpfs tmpfs /dev && exec {sys.executable} -m zfuse.cli mount "
              f"{tmp_path / 'a.zarr'} {tmp_path / 'mnt'}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "/dev/fuse is missing" in r.stderr, r.stderr


def test_a_user_who_may_not_use_dev_fuse_or_the_store_is_told_why(tmp_path: Path) -> None:
    """A user who is not root: /dev/fuse not theirs to open (0600 root, as in containers)
    is named with its mode and owner and what to do (libfuse said only
    "fuse_session_mount failed"); a store inside a directory they may not enter is not
    "no such file" but names that directory, and a store directory they may not read is
    not "no Zarr metadata". Run in a private mount namespace (a 0600 /dev/fuse bound
    over the real one) by a child that becomes nobody after its imports."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace and another user")
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="zfuse-user-"))  # (every directory above it may be entered)
    (base / "mnt").mkdir(parents=True)
    stores.v3(base / "private" / "a.zarr")
    stores.v3(base / "closed.zarr")
    for d in (base, base / "mnt"):
        d.chmod(0o777)
    (base / "private").chmod(0o700)
    (base / "closed.zarr").chmod(0o700)
    fake = tmp_path / "fuse"
    fake.write_text("")
    fake.chmod(0o600)
    child = (
        "import os, sys, grp, pwd, zipfile, stat, zfuse.mounts, zfuse.ext.concat\n"
        "from zfuse.daemon import check_mountpoint, check_sources\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "for call in (lambda: check_mountpoint(sys.argv[1]), lambda: check_sources([sys.argv[2]]),\n"
        "             lambda: check_sources([sys.argv[3]])):\n"
        "    try:\n"
        "        call(); print('passed')\n"
        "    except SystemExit as e:\n"
        "        print(e.code)\n"
    )
    script = (f"mount --bind {fake} /dev/fuse && exec {sys.executable} -c \"$0\" "
              f"{base / 'mnt'} {base / 'private' / 'a.zarr'} {base / 'closed.zarr'}")
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", script, child], capture_output=True, text=True,
                           timeout=60, cwd="/")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    device, hidden, closed = r.stdout.splitlines()
    assert device.startswith("zfuse: /dev/fuse is not readable and writable by uid 65534 (it is -rw------- "
                             "root:root), so no FUSE filesystem can be mounted by this user"), device
    assert "chmod 0666 /dev/fuse" in device and "--device /dev/fuse" in device
    assert hidden == (f"zfuse: cannot open {base / 'private' / 'a.zarr'}: permission denied: uid 65534 may "
                      f"not enter {base / 'private'}")
    assert closed == (f"zfuse: cannot open {base / 'closed.zarr'}: permission denied (the directory is not "
                      "readable by uid 65534)")


# -- the first hour (issue 13): errors that name the real problem --------------------------
def run_in(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ZFUSE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _mount_error_case(tmp_path: Path, case: str) -> tuple[list[str], str]:
    (tmp_path / "mnt").mkdir()
    if case == "not-zarr":
        (tmp_path / "notzarr").mkdir()
        (tmp_path / "notzarr" / "hello.txt").write_text("hi")
        return (["mount", "notzarr", "mnt"],
                "zfuse: no Zarr metadata (zarr.json, .zarray or .zgroup) found at notzarr\n")
    if case == "zarr-one-level-down":
        stores.v3(tmp_path / "outer" / "a.zarr")
        return (["mount", "outer", "mnt"],
                "zfuse: no Zarr metadata (zarr.json, .zarray or .zgroup) found at outer; "
                "Zarr data one level down: outer/a.zarr\n")
    if case == "file":
        (tmp_path / "file.txt").write_text("hi")
        return (["mount", "file.txt", "mnt"],
                "zfuse: file.txt is a file, not a Zarr store: a SOURCE is a Zarr directory, a URL, "
                "or a concat description file (written by `zfuse concat`)\n")
    if case == "zipped-store":  # (zarr's ZipStore: one file)
        stores.v3(tmp_path / "z.zarr")
        import shutil

        shutil.make_archive(str(tmp_path / "z.zarr"), "zip", tmp_path / "z.zarr")
        return (["mount", "z.zarr.zip", "mnt"],
                "zfuse: z.zarr.zip is a zipped Zarr store (a .zip file): zfuse mounts Zarr directories and URLs; "
                "unzip it (unzip z.zarr.zip -d DIR) and mount the directory\n")
    if case == "metadata-is-a-fifo":
        (tmp_path / "f.zarr").mkdir()
        os.mkfifo(tmp_path / "f.zarr" / "zarr.json")
        return (["mount", "f.zarr", "mnt"],
                "zfuse: f.zarr/zarr.json is a FIFO, not a regular file: no Zarr metadata is read from it\n")
    if case == "missing-source":
        return ["mount", "missing.zarr", "mnt"], "zfuse: cannot open missing.zarr: no such file or directory\n"
    stores.v3(tmp_path / "a.zarr")
    if case == "mountpoint-inside-store":
        (tmp_path / "a.zarr" / "mnt").mkdir()
        return (["mount", "a.zarr", "a.zarr/mnt"],
                f"zfuse: a.zarr holds the mountpoint {tmp_path}/a.zarr/mnt: the daemon would read its own "
                "mount (and wait for itself for ever); mount it on a directory outside the store\n")
    if case == "local-url-holding-mountpoint":  # (fsspec's local:// had passed as a remote store)
        (tmp_path / "a.zarr" / "mnt").mkdir()
        return (["mount", f"local://{tmp_path}/a.zarr", "a.zarr/mnt"],
                f"zfuse: {tmp_path}/a.zarr holds the mountpoint {tmp_path}/a.zarr/mnt: the daemon would read "
                "its own mount (and wait for itself for ever); mount it on a directory outside the store\n")
    if case == "store-is-mountpoint":
        return (["mount", "a.zarr", "a.zarr"],
                f"zfuse: a.zarr is the mountpoint {tmp_path}/a.zarr: the daemon would read its own mount "
                "(and wait for itself for ever); mount it on a directory outside the store\n")
    if case == "description-source-inside-mountpoint":
        from zfuse.ext.concat import save_concat

        stores.v3(tmp_path / "mnt" / "b.zarr")
        save_concat(tmp_path / "ab.json", [str(tmp_path / "a.zarr"), str(tmp_path / "mnt" / "b.zarr")], axis=0)
        return (["mount", "ab.json", "mnt"],
                f"zfuse: {tmp_path}/mnt/b.zarr lies inside the mountpoint {tmp_path}/mnt: the daemon would "
                "read its own mount (and wait for itself for ever); mount it on a directory outside the store\n")
    if case == "log-file-inside-mountpoint":  # (and not made there)
        return (["mount", "--log-file", "mnt/z.log", "a.zarr", "mnt"],
                f"zfuse: the log file {tmp_path}/mnt/z.log is inside the mountpoint {tmp_path}/mnt: the daemon "
                "would write it through its own mount; put it elsewhere\n")
    if case == "cache-inside-mountpoint":
        return (["mount", "-o", "cache=mnt/cache", "a.zarr", "mnt"],
                f"zfuse: -o cache= {tmp_path}/mnt/cache is inside the mountpoint {tmp_path}/mnt: the daemon "
                "would write it through its own mount; put it elsewhere\n")
    if case == "missing-mountpoint":
        return (["mount", "a.zarr", "nowhere"],
                f"zfuse: mountpoint {tmp_path}/nowhere does not exist (create it with mkdir)\n")
    if case == "mountpoint-is-file":
        (tmp_path / "f").write_text("")
        return ["mount", "a.zarr", "f"], f"zfuse: mountpoint {tmp_path}/f is not a directory\n"
    if case == "info-not-zarr":
        (tmp_path / "notzarr").mkdir()
        return (["info", "notzarr"],
                "zfuse: no Zarr metadata (zarr.json, .zarray or .zgroup) found at notzarr\n")
    assert case == "umount-not-mounted"
    return ["umount", "mnt"], "zfuse: mnt is not mounted\n"


@pytest.mark.parametrize("case", ["not-zarr", "zarr-one-level-down", "file", "zipped-store", "missing-source",
                                  "missing-mountpoint", "mountpoint-is-file", "info-not-zarr",
                                  "umount-not-mounted", "mountpoint-inside-store", "store-is-mountpoint",
                                  "description-source-inside-mountpoint", "metadata-is-a-fifo",
                                  "cache-inside-mountpoint", "log-file-inside-mountpoint",
                                  "local-url-holding-mountpoint"])
def test_error_messages_name_the_real_problem(tmp_path: Path, case: str) -> None:
    """Exact text, as a user running the command from the store's directory sees it. [cons-4] A
    mount whose daemon would read its own mount (a mountpoint inside the store, the store
    itself, a concatenation's source inside it) is refused: such a mount showed itself
    in itself at every reload and hung its readers beyond kill -9."""
    args, expected = _mount_error_case(tmp_path, case)
    r = run_in(tmp_path, *args)
    assert r.returncode == 1
    assert r.stderr == expected
    assert r.stdout == ""
    assert not os.path.ismount(tmp_path / "mnt")
    if case == "log-file-inside-mountpoint":
        assert os.listdir(tmp_path / "mnt") == []


def test_umount_of_something_else_says_so(tmp_path: Path) -> None:
    r = run("umount", "/proc")
    assert r.returncode == 1
    assert r.stderr == "zfuse: /proc is not a zfuse mount (it is proc); use umount(8)\n"


def _daemon_pid(mnt: Path) -> int:
    return json.loads((mnt / ".zfuse" / "mount").read_text())["pid"]


def _background_mount(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`zfuse mount ARGS` from tmp_path; the last argument is the mountpoint."""
    if reason := fuse_available():
        skip_or_fail(reason)
    r = run_in(tmp_path, "mount", *args)
    assert r.returncode == 0, r.stderr
    assert os.path.ismount(tmp_path / args[-1])
    return r


def _cleanup(mnt: Path) -> None:
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def _wait_gone(pid: int) -> None:
    import psutil

    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass


@pytest.mark.mount
def test_stale_mountpoint_is_named_and_cleared_with_umount_z(tmp_path: Path) -> None:
    import signal

    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "mnt").mkdir()
    try:
        _background_mount(tmp_path, "--log-file", "log.txt", "a.zarr", "mnt")
        pid = _daemon_pid(tmp_path / "mnt")
        os.kill(pid, signal.SIGKILL)  # the daemon dies without unmounting
        _wait_gone(pid)
        again = run_in(tmp_path, "mount", "a.zarr", "mnt")
        assert again.returncode == 1
        assert again.stderr == (
            f"zfuse: mountpoint {tmp_path}/mnt is a stale mount: the zfuse daemon that served it is "
            f"gone (Transport endpoint is not connected); clear it with: zfuse umount -z {tmp_path}/mnt\n")
        st = run_in(tmp_path, "status", "mnt")
        assert st.returncode == 1
        assert st.stdout == (
            f"{tmp_path}/mnt  STALE  source {tmp_path}/a.zarr\n"
            f"  the daemon is gone (Transport endpoint is not connected); clear it with: "
            f"zfuse umount -z {tmp_path}/mnt\n")
        rl = run_in(tmp_path, "reload", "mnt")
        assert rl.returncode == 1
        assert rl.stderr == ("zfuse: cannot reload mnt: mnt is a stale mount: its daemon is gone; "
                             "clear it with: zfuse umount -z mnt\n")
        z = run_in(tmp_path, "umount", "-z", "mnt")
        assert z.returncode == 0, z.stderr
        assert not os.path.ismount(tmp_path / "mnt")
        _background_mount(tmp_path, "a.zarr", "mnt")  # usable again
        assert (tmp_path / "mnt" / "c" / "0" / "0.tiff").is_file()
    finally:
        run_in(tmp_path, "umount", "mnt")
        _cleanup(tmp_path / "mnt")


@pytest.mark.mount
def test_a_hung_daemons_mount_is_answered_and_cleared_with_umount_z(tmp_path: Path) -> None:
    """A daemon that does not answer (SIGSTOP): `zfuse reload` says so, `zfuse mount` onto
    it says busy, and `zfuse umount -z` detaches it, each within seconds (they had lstat'ed
    the mountpoint, waiting for the daemon for ever); a symbolic link to a live
    mountpoint is that mountpoint (a second daemon had been stacked over the first)."""
    import signal

    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "mnt").mkdir()
    (tmp_path / "link").symlink_to("mnt")
    pid = None
    try:
        _background_mount(tmp_path, "a.zarr", "mnt")
        stacked = run_in(tmp_path, "mount", "a.zarr", "link")
        assert stacked.returncode == 1 and f"is busy (already a mount point: {tmp_path}/mnt)" in stacked.stderr
        assert [e.mountpoint for e in _mounts_at(tmp_path / "mnt")] == [str(tmp_path / "mnt")]
        pid = _daemon_pid(tmp_path / "mnt")
        os.kill(pid, signal.SIGSTOP)
        _wait_until_stat_waits(tmp_path / "mnt")  # (the kernel's cached attributes expired)
        rl = run_in(tmp_path, "reload", "mnt")
        assert rl.returncode == 1 and "does not answer" in rl.stderr, rl.stderr
        busy = run_in(tmp_path, "mount", "a.zarr", "link")
        assert busy.returncode == 1 and "is busy" in busy.stderr, busy.stderr
        z = run_in(tmp_path, "umount", "-z", "link")
        assert z.returncode == 0, z.stderr
        assert _mounts_at(tmp_path / "mnt") == []
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        run_in(tmp_path, "umount", "mnt")
        _cleanup(tmp_path / "mnt")


def _wait_until_stat_waits(path: Path) -> None:
    """Until an lstat of `path` goes to its (stopped) daemon: no longer answered by the
    kernel from the attributes it caches for a second."""
    from zfuse.mounts import MountNotResponding, call_with_timeout

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            call_with_timeout(os.lstat, str(path), timeout=0.3)
        except MountNotResponding:
            return
    raise AssertionError(f"{path}: still answered by the kernel's cache after 30 s")


def _mounts_at(path: Path) -> list:
    from zfuse.mounts import mount_table

    return [e for e in mount_table() if e.mountpoint == str(path)]


@pytest.mark.mount
def test_nonempty_mountpoint_warns(tmp_path: Path) -> None:
    import re

    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt" / "old.txt").write_text("hidden while mounted")
    try:
        r = _background_mount(tmp_path, "--log-file", "log.txt", "a.zarr", "mnt")
        warning = (f"WARNING zfuse.daemon: mountpoint {tmp_path}/mnt is not empty: its 1 entry is "
                   "hidden while zfuse is mounted there")
        assert re.fullmatch(rf"zfuse\[\d+\] {re.escape(warning)}\n", r.stderr), r.stderr
        assert warning in (tmp_path / "log.txt").read_text()
        assert not (tmp_path / "mnt" / "old.txt").exists()
    finally:
        run_in(tmp_path, "umount", "mnt")
        _cleanup(tmp_path / "mnt")
    assert (tmp_path / "mnt" / "old.txt").read_text() == "hidden while mounted"


@pytest.mark.mount
def test_mounting_a_store_twice_warns(tmp_path: Path) -> None:
    """The second mount of one store says where the first is and that they do not see
    each other's writes until a reload; both mount."""
    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    try:
        first = _background_mount(tmp_path, "a.zarr", "one")
        assert "already mounted" not in first.stderr
        second = _background_mount(tmp_path, "a.zarr", "two")
        assert f"is already mounted at {tmp_path}/one" in second.stderr, second.stderr
        assert "until a reload" in second.stderr
    finally:
        for name in ("one", "two"):
            run_in(tmp_path, "umount", name)
            _cleanup(tmp_path / name)


@pytest.mark.mount
def test_findmnt_shows_the_source_and_fuse_zfuse(tmp_path: Path) -> None:
    """fsname = the source (absolute, even when given relative), subtype zfuse; a path
    with a space and a comma survives libfuse's option parsing."""
    src = tmp_path / "my data" / "a,1.zarr"
    stores.v3(src)
    stores.v3(tmp_path / "b.zarr")
    for name in ("m1", "m2"):
        (tmp_path / name).mkdir()
    try:
        _background_mount(tmp_path, "my data/a,1.zarr", "m1")
        _background_mount(tmp_path, "-o", "ro", "--concat", "0", "b.zarr", "b.zarr", "m2")  # (one array twice: read-only)
        for mnt, source in (("m1", str(src)), ("m2", f"{tmp_path}/b.zarr+{tmp_path}/b.zarr")):
            out = subprocess.run(["findmnt", "-J", "-o", "TARGET,SOURCE,FSTYPE", str(tmp_path / mnt)],
                                 capture_output=True, text=True, check=True).stdout
            (fs,) = json.loads(out)["filesystems"]
            assert fs == {"target": str(tmp_path / mnt), "source": source, "fstype": "fuse.zfuse"}
        listing = subprocess.run(["mount"], capture_output=True, text=True, check=True).stdout
        assert f"{src} on {tmp_path}/m1 type fuse.zfuse (" in listing
    finally:
        for name in ("m1", "m2"):
            run_in(tmp_path, "umount", name)
            _cleanup(tmp_path / name)


@pytest.mark.mount
def test_status_and_reload_on_a_real_mount(tmp_path: Path) -> None:
    """[tree-6] `.zfuse/mount` describes the daemon; `zfuse status` and `zfuse reload` use it."""
    import errno
    import re

    stores.v3(tmp_path / "g.zarr" / "a")
    zarr.open_group(str(tmp_path / "g.zarr"), mode="a")
    (tmp_path / "mnt").mkdir()
    mnt = tmp_path / "mnt"
    try:
        _background_mount(tmp_path, "-o", "ro", "--log-file", "log.txt", "g.zarr", "mnt")
        pid = _daemon_pid(mnt)
        assert os.readlink(f"/proc/{pid}/cwd") == "/"  # the caller's directory is not kept busy
        assert {"mount", "stats"} <= set(os.listdir(mnt / ".zfuse"))
        info = json.loads((mnt / ".zfuse" / "mount").read_text())
        assert info["sources"] == [str(tmp_path / "g.zarr")] and info["mountpoint"] == str(mnt)
        assert info["read_only"] is True and info["reloads"] == 0 and info["last_reload"] is None
        with pytest.raises(OSError) as refused:
            open(mnt / ".zfuse" / "mount", "w")
        assert refused.value.errno in (errno.EROFS, errno.EACCES)
        (mnt / "a" / "c" / "0" / "0.tiff").read_bytes()
        # (other mounts on this machine may be listed too: check only ours)
        assert str(mnt) in run_in(tmp_path, "status").stdout
        st = run_in(tmp_path, "status", "mnt")
        assert st.returncode == 0, st.stderr
        pattern = (rf"{re.escape(str(mnt))}  pid {pid}  read-only  up \d+s\n"
                   rf"  source  {re.escape(str(tmp_path / 'g.zarr'))}\n"
                   rf"  log     {re.escape(str(tmp_path / 'log.txt'))}\n"
                   r"  reloads 0\n"
                   r"  stats   .*chunks_decoded=[1-9]\d* .*\n")
        assert re.fullmatch(pattern, st.stdout), st.stdout
        (item,) = [i for i in json.loads(run_in(tmp_path, "status", "--json", "mnt").stdout)]
        assert item["state"] == "running" and item["pid"] == pid and item["read_only"] is True
        assert item["sources"] == [str(tmp_path / "g.zarr")] and item["source"] == str(tmp_path / "g.zarr")
        assert item["stats"]["chunks_decoded"] >= 1 and item["reloads"] == 0

        # a new array appears after `zfuse reload`, which returns once the reload is done
        stores.v3(tmp_path / "g.zarr" / "b", shape=(4, 4), chunks=(4, 4))
        rl = run_in(tmp_path, "reload", "mnt")
        assert rl.returncode == 0, rl.stderr
        assert rl.stdout == f"reloaded mnt (reload 1, pid {pid})\n"
        assert (mnt / "b" / "c" / "0" / "0.tiff").is_file()
        assert "SIGHUP: reloading metadata" in (tmp_path / "log.txt").read_text()

        # a failed reload is reported, and the mount keeps the previous view
        (tmp_path / "g.zarr" / "zarr.json").rename(tmp_path / "zarr.json.away")
        bad = run_in(tmp_path, "reload", "mnt")
        assert bad.returncode == 1
        assert bad.stderr.startswith("zfuse: cannot reload mnt: the reload failed, the mount keeps "
                                     "showing the previous state: "), bad.stderr
        assert (mnt / "b" / "c" / "0" / "0.tiff").is_file()
        assert "FAILED" in run_in(tmp_path, "status", "mnt").stdout
    finally:
        run_in(tmp_path, "umount", "mnt")
        _cleanup(mnt)
    nothing = run_in(tmp_path, "status", "mnt")
    assert nothing.returncode == 1 and nothing.stderr == "zfuse: mnt is not a zfuse mount\n"


@pytest.mark.mount
def test_log_file_keeps_refusal_reasons_of_a_background_daemon(tmp_path: Path) -> None:
    """mount.fuse3 form with -o log_file=: the reason for EINVAL on close is in the file."""
    import errno

    import numpy as np
    import tifffile

    stores.v3(tmp_path / "a.zarr")  # uint16 chunks of 8x16
    (tmp_path / "mnt").mkdir()
    try:
        _background_mount(tmp_path, "-o", "log_file=zfuse.log", "a.zarr", "mnt")
        target = tmp_path / "mnt" / "c" / "0" / "0.tiff"
        wrong = tmp_path / "wrong.tif"
        tifffile.imwrite(wrong, np.ones((8, 16), dtype=np.float32))
        with pytest.raises(OSError) as info:
            with open(target, "r+b") as f:
                f.truncate(0)
                f.write(wrong.read_bytes())
        assert info.value.errno == errno.EINVAL
        log = (tmp_path / "zfuse.log").read_text()
        assert "c/0/0.tiff" in log and "float32" in log and "uint16" in log, log
        assert json.loads((tmp_path / "mnt" / ".zfuse" / "mount").read_text())["log"] == str(
            tmp_path / "zfuse.log")
    finally:
        run_in(tmp_path, "umount", "mnt")
        _cleanup(tmp_path / "mnt")


def test_log_file_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    if reason := fuse_available():
        skip_or_fail(reason)
    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "mnt").mkdir()
    r = run_in(tmp_path, "mount", "a.zarr", "mnt", "--log-file", "no/such/dir/log.txt")
    assert r.returncode == 1
    assert r.stderr == (f"zfuse: cannot write the log file {tmp_path}/no/such/dir/log.txt: "
                        "No such file or directory\n")
    assert not os.path.ismount(tmp_path / "mnt")


# -- help ----------------------------------------------------------------------------------
def test_every_subcommand_and_option_has_help() -> None:
    import argparse

    from zfuse.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    summaries = {c.dest: c.help for c in sub._choices_actions}
    assert set(summaries) == {"mount", "umount", "status", "reload", "info", "concat"}
    for name, p in sub.choices.items():
        assert summaries[name], name
        assert p.description and len(p.description) > 30, name
        assert "example" in (p.epilog or ""), name
        assert f"zfuse {name}" in p.epilog, name
        for action in p._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            assert action.help and len(action.help) > 10, (name, action.dest)
    top = run("--help")
    assert top.returncode == 0
    for name, summary in summaries.items():
        assert re.search(rf"^\s+{name}\s+{re.escape(summary)}", top.stdout, re.M), (name, top.stdout)
    assert "man zfuse" in top.stdout


def test_help_explains_what_users_asked_about() -> None:
    umount = run("umount", "-h").stdout
    assert "lazy unmount" in umount and "stale" in umount
    concat = run("concat", "-h").stdout
    assert "--axis N" in concat and "OUT.json" in concat and "relative to it" in concat
    info = run("info", "-h").stdout
    assert "--concat AXIS" in info and "endpoint_url=" in info
    mount = run("mount", "--help").stdout
    assert "--log-file PATH" in mount and "log_file=PATH" in mount
    assert "journalctl -u zfuse@NAME" in mount  # under systemd: the journal


# -- zfuse info ------------------------------------------------------------------------------
def test_info_into_a_closed_pipe_exits_cleanly(tmp_path: Path) -> None:
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    for i in range(220):  # > 64 KiB of JSON: more than a pipe holds
        root.create_array(f"array_with_a_long_name_{i:04d}", shape=(4, 4), chunks=(2, 2), dtype="u1")
    cmd = f"{sys.executable} -m zfuse.cli info --json g.zarr | head -c 10"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.stdout == '{\n  "sourc'
    assert r.stderr == ""
    assert r.returncode == 0
    full = run_in(tmp_path, "info", "--json", "g.zarr")
    assert len(full.stdout) > 65536


def test_info_says_why_an_array_is_not_shown_once(tmp_path: Path) -> None:
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    s = root.create_array("names", shape=(4,), chunks=(2,), dtype=str)
    s[...] = ["a", "b", "c", "d"]
    r = run_in(tmp_path, "info", "g.zarr")
    assert r.returncode == 0
    assert r.stderr == ""
    assert r.stdout.count("have no TIFF sample format") == 1


def test_info_concat_names_sources_as_given(tmp_path: Path) -> None:
    stores.v3(tmp_path / "a.zarr", shape=(10, 30))
    stores.v3(tmp_path / "b.zarr", shape=(7, 30))
    r = run_in(tmp_path, "info", "--concat", "0", "a.zarr", "b.zarr")
    assert r.returncode == 0, r.stderr
    assert "    a.zarr: shape (10, 30) at offset 0\n    b.zarr: shape (7, 30) at offset 10\n" in r.stdout
    assert "zfuse-" not in r.stdout and "file://" not in r.stdout


def test_a_misspelt_option_is_refused_before_the_store_is_opened(tmp_path: Path) -> None:
    """An -o option neither zfuse nor libfuse takes is refused at once, naming the
    nearest options (libfuse refused it only after the store was opened, as
    "fuse_session_new() failed"); libfuse's own options still pass."""
    from zfuse.daemon import MountConfig
    from zfuse.mount_options import OptionError, apply_mount_options

    run = subprocess.run([*ZFUSE, "mount", "-o", "ro,cache_sise=1G", str(tmp_path / "nowhere.zarr"),
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "unknown option 'cache_sise' (did you mean cache_size" in run.stderr, run.stderr
    assert "fuse_session_new" not in run.stderr and "no such file" not in run.stderr, run.stderr
    config = MountConfig(sources=["/x"], mountpoint="/y")
    apply_mount_options(config, ["allow_root,fsname=x,noatime,_netdev,x-systemd.idle-timeout=5"])
    assert config.fuse_options == ["allow_root", "fsname=x", "noatime"]
    with pytest.raises(OptionError, match="unknown option 'kernel_cache'"):
        apply_mount_options(config, ["kernel_cache"])
    # pyfuse3 sets max_read itself: another made the kernel's INIT fail after the mount
    # had said it was live (exit 0, no mount)
    with pytest.raises(OptionError, match="option 'max_read' is libfuse's, refused: pyfuse3 sets"):
        apply_mount_options(config, ["max_read=4096"])
    # a reload opens the whole source again: 1e-9 held a core with 4,233 reloads in 10 s
    with pytest.raises(OptionError, match=r"metadata_ttl.*at least 0.1 seconds \(or 0: never\)"):
        apply_mount_options(config, ["metadata_ttl=1e-9"])
    apply_mount_options(config, ["metadata_ttl=0,metadata_ttl=0.5"])
    assert config.metadata_ttl == 0.5


def test_a_refused_mount_with_a_log_file_says_so_once_on_the_terminal(tmp_path: Path) -> None:
    """--log-file and a refused mount: the reason once on the terminal (it was twice, the
    second time as a log line), and in the log file."""
    (tmp_path / "notzarr").mkdir()
    (tmp_path / "mnt").mkdir()
    r = run_in(tmp_path, "mount", "notzarr", "mnt", "--log-file", "zfuse.log")
    assert r.returncode == 1
    assert r.stderr.count("no Zarr metadata") == 1, r.stderr
    assert "no Zarr metadata" in (tmp_path / "zfuse.log").read_text()


@pytest.mark.mount
def test_umount_names_the_incomplete_files_it_drops(tmp_path: Path) -> None:
    """[write-2] a one-page TIFF copied onto a chunk of two planes is pending (cp exits
    0, nothing is stored); `zfuse umount` drops it and says which file, its chunk
    unchanged (it said nothing: the one refusal a first-day user missed)."""
    import shutil

    import numpy as np
    import tifffile

    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 8, 16), chunks=(2, 8, 16), dtype="u2", fill_value=0)
    a[...] = 1
    tifffile.imwrite(tmp_path / "one.tif", np.full((8, 16), 9, "u2"))
    tifffile.imwrite(tmp_path / "two.tif", np.full((2, 8, 16), 7, "u2"))
    (tmp_path / "mnt").mkdir()
    try:
        _background_mount(tmp_path, "a.zarr", "mnt")
        # pending, then completed (as Bio-Formats writes): not dropped, not named
        shutil.copyfile(tmp_path / "one.tif", tmp_path / "mnt" / "c" / "0" / "0" / "0.tiff")
        shutil.copyfile(tmp_path / "two.tif", tmp_path / "mnt" / "c" / "0" / "0" / "0.tiff")
        shutil.copyfile(tmp_path / "one.tif", tmp_path / "mnt" / "c" / "1" / "0" / "0.tiff")
        r = run_in(tmp_path, "umount", "mnt")
        assert r.returncode == 0, r.stderr
        assert "zfuse: 1 file(s) written incomplete were dropped at unmount, their stored chunks unchanged: " \
               "c/1/0/0.tiff\n" in r.stderr, r.stderr
        stored = zarr.open_array(str(tmp_path / "a.zarr"))[...]
        assert (stored[:2] == 7).all() and (stored[2:] == 1).all()
    finally:
        _cleanup(tmp_path / "mnt")


def test_mounting_one_level_of_an_ome_zarr_image_says_where_its_metadata_is(tmp_path: Path) -> None:
    """A mount of one level (`img.zarr/0`, ngff-zarr's `img.zarr/scale0/image`) shows it without the image's axes, scales and
    channel names (they are the parent group's, outside the level's store): a warning at
    mount, and a note of `zfuse info`, say so and name the image to mount (it was
    silent). Not for other arrays."""
    from zfuse.daemon import level_hint

    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w")
    root.create_array("0", shape=(4, 8), chunks=(4, 8), dtype="u1")
    root.create_array("other", shape=(4, 8), chunks=(4, 8), dtype="u1")
    root.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": "y"}, {"name": "x"}],
                                  "datasets": [{"path": "0"}]}]
    hint = level_hint([str(tmp_path / "img.zarr" / "0")])
    assert hint is not None and "is level '0' of the OME-Zarr image" in hint and str(tmp_path / "img.zarr") in hint
    assert level_hint([str(tmp_path / "img.zarr" / "other")]) is None
    assert level_hint([str(tmp_path / "img.zarr")]) is None
    info = run_in(tmp_path, "info", "img.zarr/0")
    assert info.returncode == 0 and "note: img.zarr/0 is level '0' of the OME-Zarr image" in info.stdout, info.stdout
    v2 = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    v2.create_array("s0", shape=(4, 8), chunks=(4, 8), dtype="u1")
    v2.attrs["multiscales"] = [{"version": "0.4", "datasets": [{"path": "s0"}]}]
    assert "is level 's0'" in (level_hint([str(tmp_path / "v2.zarr" / "s0")]) or "")
    # ngff-zarr's levels are two groups down (`scale0/image`): the level, or its group
    nested = zarr.open_group(str(tmp_path / "ngff.zarr"), mode="w")
    nested.create_group("scale0").create_array("image", shape=(4, 8), chunks=(4, 8), dtype="u1")
    nested.attrs["ome"] = {"version": "0.5", "multiscales": [{"axes": [{"name": "y"}, {"name": "x"}],
                                                              "datasets": [{"path": "scale0/image"}]}]}
    for level in ("scale0/image", "scale0"):
        hint = level_hint([str(tmp_path / "ngff.zarr" / level)]) or ""
        assert f"is level '{level}' of the OME-Zarr image {tmp_path / 'ngff.zarr'}" in hint, (level, hint)


def test_info_says_each_arrays_axes_and_what_its_chunk_files_tell_imagej(tmp_path: Path) -> None:
    """`zfuse info` gives each array's axes as the store names them (OME-Zarr scale and
    unit) and the calibration its chunk files state ([read-14]), so a newcomer checks it
    before mounting; a crafted name prints escaped, no terminal control."""
    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w")
    root.create_array("0", shape=(2, 3, 4, 8), chunks=(2, 3, 4, 8), dtype="u2")
    root.attrs["multiscales"] = [{"version": "0.4", "axes": [
        {"name": "c\x1b[2J", "type": "channel"}, {"name": "z", "type": "space", "unit": "micrometer"},
        {"name": "y", "type": "space", "unit": "nanometer"}, {"name": "x", "type": "space", "unit": "nm"}],
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 2.0, 325.0, 325.0]}]}]}]
    r = run("info", str(tmp_path / "img.zarr"))
    assert r.returncode == 0, r.stderr
    assert "axes: c\\x1b[2J 1, z 2 micrometer, y 325 nanometer, x 325 nm" in r.stdout, r.stdout
    assert "\x1b" not in r.stdout
    assert "chunk files say (ImageJ): images=6 channels=2 slices=3 hyperstack=true mode=grayscale unit=micron " \
           "spacing=2.0" in r.stdout, r.stdout


def test_remote_sources_say_what_to_install_and_refuse_writes_without_conditions(tmp_path: Path) -> None:
    """[remote-3] An object store other than S3 is written without conditions (zfuse's are
    S3's If-Match): mounted read-write it is refused, naming `-o ro` and `-o
    last_writer_wins`, as an S3 store that ignores conditions is (az:// and gs:// had been
    written silently, last writer winning). A protocol whose package is missing names the
    extra to install; credentials in a URL are never repeated in the message."""
    import importlib.util

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    memory = run("mount", "memory://a.zarr", str(mnt))  # (fsspec's own: no package to install)
    assert memory.returncode == 1 and "without conditions" in memory.stderr, memory.stderr
    assert "-o last_writer_wins" in memory.stderr
    for protocol, package, extra in (("gs", "gcsfs", "gcs"), ("az", "adlfs", "az")):
        if importlib.util.find_spec(package) is None:
            r = run("mount", f"{protocol}://bucket/a.zarr", str(mnt), "-o", "ro")
            assert r.returncode == 1 and f"pip install 'zfuse[{extra}]'" in r.stderr, r.stderr
    secret = run("mount", "https://someone:s3cr3t@127.0.0.1:1/a.zarr", str(mnt))
    assert secret.returncode == 1 and "s3cr3t" not in secret.stderr and "https://127.0.0.1:1/a.zarr" in secret.stderr
    assert not os.path.ismount(mnt)


def test_a_mountpoint_is_named_as_the_kernel_resolves_it(tmp_path: Path, monkeypatch) -> None:
    """`zfuse umount`, `reload`, `status` and `mount` find a mountpoint given through
    symbolic links as the kernel resolves it (as realpath does), without stat'ing it:
    a relative link whose `..` climbs out of a linked directory, a link to a link, `..`
    after a linked directory, a trailing slash (a normpath had dropped the linked
    directory: a second daemon could stack over a live mount)."""
    from zfuse.mounts import normalise

    (tmp_path / "real" / "dir").mkdir(parents=True)
    (tmp_path / "real" / "mnt2").mkdir()
    (tmp_path / "alias").symlink_to("real/dir")
    (tmp_path / "real" / "dir" / "m").symlink_to("../mnt2")
    (tmp_path / "l1").symlink_to("l2")
    (tmp_path / "l2").symlink_to("alias/m")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dots").symlink_to("real/mnt2/.")
    for given in ("alias/m", str(tmp_path / "l1"), "alias/../real/mnt2/", "./real/./mnt2", "l2/", "real/mnt2/.",
                  "dots", "/" + str(tmp_path / "l1"), "alias/m/..", "real/mnt2/../dir/../mnt2"):
        assert normalise(given) == os.path.realpath(given), given
    from zfuse.mounts import absolute

    # what `zfuse mount` passes on: absolute, `..` left to the kernel (abspath had made
    # alias/../x name another directory than the kernel's)
    assert absolute("alias/../real/./mnt2/") == f"{tmp_path}/alias/../real/mnt2"
    assert os.path.realpath(absolute("alias/../dir")) == str(tmp_path / "real" / "dir")


def _as_nobody(argv: list[str]) -> tuple[int, str]:
    """`zfuse ARGV` run by a child of this test turned into nobody after its imports:
    (exit status, stderr)."""
    import pwd

    import zfuse.cli as cli
    import zfuse.mounts  # noqa: F401 - imported before the child may no longer read modules

    pwd.getpwuid(0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(read)
            sys.stdout = sys.stderr = out = os.fdopen(write, "w")  # (not pytest's capture)
            os.setgid(65534)
            os.setuid(65534)
            code = cli.main(argv)
            out.flush()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said


def test_another_users_mount_is_named_as_theirs(tmp_path: Path) -> None:
    """Root's mount, seen by a user who is not root: `zfuse umount` says whose it is and
    who may unmount it (fusermount3 said "entry for ... not found in /etc/mtab"), and
    `zfuse status` of every mount is not failed by another user's private one (it was
    exit 1 whenever anyone else had a mount); named, it still is."""
    import shutil
    import tempfile

    from zfuse.testing import Mounts

    if os.geteuid() != 0:
        pytest.skip("needs root: the child becomes another user")
    base = Path(tempfile.mkdtemp(prefix="zfuse-others-"))
    base.chmod(0o755)
    stores.v3(base / "a.zarr")
    try:
        with Mounts(base) as mounts:
            m = mounts.start(base / "a.zarr", name="mnt")
            code, said = _as_nobody(["umount", str(m.path)])
            assert code == 1
            assert said == (f"zfuse: cannot unmount {m.path}: it was mounted by root (uid 0); only they or root "
                            "can unmount it\n")
            assert os.path.ismount(m.path)
            code, said = _as_nobody(["status"])
            assert code == 0 and "mounted by uid 0 without allow_other" in said, said
            code, said = _as_nobody(["status", str(m.path)])
            assert code == 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_read_ahead_window_only_root_may_set_is_said_at_mount() -> None:
    """`-o read_ahead_kb=N` from a user who is not root: the mount warns that the kernel's
    default window stays (it was ignored without a word); the default asks nothing."""
    from zfuse.daemon import MountConfig, read_ahead_hint

    if os.geteuid() != 0:
        pytest.skip("needs root: the child becomes another user")
    asked, default = MountConfig([], "/m", read_ahead_kb=4096), MountConfig([], "/m")
    assert read_ahead_hint(asked) is None  # (root sets it)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setuid(65534)
            said = read_ahead_hint(asked)
            code = 0 if said is not None and said.startswith("read_ahead_kb=4096 needs root") and \
                read_ahead_hint(default) is None else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_mount_inside_its_store_is_refused_however_it_is_reached(tmp_path: Path, mount) -> None:
    """[cons-4] the store reached through a bind mount of its directory (another path,
    the same directory) holds the mountpoint: refused (compared by path, it was mounted,
    and after a reload showed itself in itself); so is a second daemon mounting the first
    one's mount inside that one's store (each would read the other)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a bind mount")
    stores.v3(tmp_path / "a.zarr")
    (tmp_path / "a.zarr" / "mnt").mkdir()
    srv = tmp_path / "srv"
    srv.mkdir()
    subprocess.run(["mount", "--bind", str(tmp_path / "a.zarr"), str(srv)], check=True)
    try:
        r = run_in(tmp_path, "mount", "srv", "a.zarr/mnt")
    finally:
        subprocess.run(["umount", "-l", str(srv)], check=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"zfuse: srv holds the mountpoint {tmp_path}/a.zarr/mnt: the daemon would read its own "
                        "mount (and wait for itself for ever); mount it on a directory outside the store\n")
    assert not os.path.ismount(tmp_path / "a.zarr" / "mnt")
    first = mount(tmp_path / "a.zarr", name="first")
    r = run_in(tmp_path, "mount", str(first.path), "a.zarr/mnt")
    if os.path.ismount(tmp_path / "a.zarr" / "mnt"):
        subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "a.zarr" / "mnt")])
        pytest.fail("the second daemon was mounted inside the first one's store")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(f"zfuse: {tmp_path}/a.zarr (the store of the zfuse mount {first.path}, which "
                               f"serves {first.path}) holds the mountpoint {tmp_path}/a.zarr/mnt"), r.stderr
    assert not os.path.ismount(tmp_path / "a.zarr" / "mnt")
    # the first mount a concatenation of two stores, one of them named with a '+' (the
    # mount table's source had been split there, and a description not looked into)
    from zfuse.ext.concat import save_concat

    stores.v3(tmp_path / "p+0.zarr")
    (tmp_path / "p+0.zarr" / "mnt").mkdir()
    save_concat(tmp_path / "c.json", [str(tmp_path / "p+0.zarr"), str(tmp_path / "a.zarr")], axis=0)
    second = mount(tmp_path / "c.json", name="second")
    r = run_in(tmp_path, "mount", str(second.path), "p+0.zarr/mnt")
    if os.path.ismount(tmp_path / "p+0.zarr" / "mnt"):  # (never left behind: it would hang both daemons)
        subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "p+0.zarr" / "mnt")])
        pytest.fail("the second daemon was mounted inside the first one's store")
    assert r.returncode == 1 and f"holds the mountpoint {tmp_path}/p+0.zarr/mnt" in r.stderr, r.stderr


def test_a_mounts_zfuse_file_is_read_to_a_bound(tmp_path: Path) -> None:
    """`.zfuse/mount` of a mount the table calls zfuse (any FUSE filesystem may) is read
    to a bound: a file that never ends (a sparse GiB here) is refused, not held (`zfuse
    status` and the mount's check of the stores other mounts serve read it)."""
    import errno

    from zfuse.mounts import MOUNT_FILE, ZFUSE_FILE_MAX, read_json

    (tmp_path / ".zfuse").mkdir()
    with open(tmp_path.joinpath(*MOUNT_FILE), "wb") as f:
        f.truncate(1 << 30)
    with pytest.raises(OSError) as e:
        read_json(str(tmp_path), MOUNT_FILE, timeout=10)
    assert e.value.errno == errno.EFBIG and str(ZFUSE_FILE_MAX) in str(e.value)
    tmp_path.joinpath(*MOUNT_FILE).write_text('{"sources": ["/a.zarr"]}')
    assert read_json(str(tmp_path), MOUNT_FILE, timeout=10) == {"sources": ["/a.zarr"]}
