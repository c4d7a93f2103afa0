"""`zfuse mount` re-executes itself with glibc's malloc tuned (zfuse/launch.py): the
environment it asks for (plain calls), and that a real daemon runs with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zfuse.launch import MALLOC_TUNABLES, is_mount, malloc_tuned_environment

import stores
from conftest import fuse_available, skip_or_fail

GLIBC = bool(os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else "")


@pytest.mark.skipif(not GLIBC, reason="glibc tunables only")
def test_tunables_are_added_to_the_environment() -> None:
    env = malloc_tuned_environment({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": MALLOC_TUNABLES}


@pytest.mark.skipif(not GLIBC, reason="glibc tunables only")
def test_other_tunables_are_kept() -> None:
    env = malloc_tuned_environment({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=2048"})
    assert env is not None
    assert env["GLIBC_TUNABLES"] == f"glibc.rtld.optional_static_tls=2048:{MALLOC_TUNABLES}"


def test_nothing_to_do_when_tuned_already_or_turned_off() -> None:
    # the re-executed process sees its own tunables: no second exec
    assert malloc_tuned_environment({"GLIBC_TUNABLES": MALLOC_TUNABLES}) is None
    # the user's own hugetlb choice wins
    assert malloc_tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert malloc_tuned_environment({"ZFUSE_MALLOC_TUNING": "0"}) is None


@pytest.mark.parametrize(("argv", "mounts"), [
    (["mount", "a.zarr", "/mnt"], True),
    (["a.zarr", "/mnt", "-o", "ro"], True),  # the mount.fuse3 form
    (["umount", "/mnt"], False),
    (["unmount", "/mnt"], False),
    (["info", "a.zarr"], False),
    (["status"], False),
    (["--version"], False),
    ([], False),
])
def test_only_mounting_commands_are_re_executed(argv: list[str], mounts: bool) -> None:
    assert is_mount(argv) is mounts


@pytest.mark.mount
@pytest.mark.skipif(not GLIBC, reason="glibc tunables only")
def test_the_daemon_runs_with_malloc_tuned(tmp_path: Path) -> None:
    """Through the installed `zfuse` script (what users run), the daemon it leaves
    behind has the tunables; its pid is the mount's (`zfuse status`)."""
    if reason := fuse_available():
        skip_or_fail(reason)
    stores.v3(tmp_path / "a.zarr")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    zfuse = Path(sys.executable).parent / "zfuse"  # the console script next to this interpreter
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "ZFUSE_MALLOC_TUNING")}
    r = subprocess.run([str(zfuse), "mount", str(tmp_path / "a.zarr"), str(mnt)], env=env,
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        info = (mnt / ".zfuse" / "mount").read_text()
        pid = json.loads(info)["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        tunables = [e for e in environ if e.startswith(b"GLIBC_TUNABLES=")]
        assert tunables and b"glibc.malloc.hugetlb=1" in tunables[0], environ
    finally:
        subprocess.run([str(zfuse), "umount", str(mnt)], capture_output=True, timeout=60)
    assert not os.path.ismount(mnt)
