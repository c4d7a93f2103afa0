"""Shared fixtures: real FUSE mounts that always unmount, even on failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REQUIRE_FUSE = os.environ.get("ZFUSE_REQUIRE_FUSE") == "1"


def fuse_available() -> str | None:
    """None if FUSE mounts can work here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    return None


def skip_or_fail(reason: str) -> None:
    if REQUIRE_FUSE:
        pytest.fail(f"ZFUSE_REQUIRE_FUSE=1 but {reason}")
    pytest.skip(reason)


TEST_REPLACE_WINDOW = 0.3


class Mount:
    """A running `zfuse mount -f` daemon and its mountpoint."""

    def __init__(self, proc: subprocess.Popen, mountpoint: Path, log_path: Path) -> None:
        self.proc = proc
        self.path = mountpoint
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stats(self) -> dict:
        import json

        return json.loads((self.path / ".zfuse" / "stats").read_text())

    def errors(self) -> str:
        return (self.path / ".zfuse" / "errors").read_text()

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every unlinked chunk has been deleted from the store (rm defers it)."""
        from tools import wait_until

        wait_until(lambda: not self.stats().get("unlinked_not_yet_deleted", 0), timeout,
                   what="unlinked chunks to be deleted from the store")

    def unmount(self) -> None:
        """Escalate: fusermount3 -u, lazy unmount, SIGTERM, SIGKILL. Never a fixed sleep."""
        if os.path.ismount(self.path):
            subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], capture_output=True)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.path):
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], capture_output=True)


def start_mount(sources: list[str], mountpoint: Path, *args: str, timeout: float = 60) -> Mount:
    reason = fuse_available()
    if reason:
        skip_or_fail(reason)
    mountpoint.mkdir(parents=True, exist_ok=True)
    log_path = mountpoint.parent / f"{mountpoint.name}.log"
    log_file = open(log_path, "ab")
    cmd = [sys.executable, "-m", "zfuse.cli", "mount", *sources, str(mountpoint), "-f", *args]
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log_file.close()
    mount = Mount(proc, mountpoint, log_path)
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None:
            pytest.fail(f"zfuse exited ({proc.returncode}) before mounting:\n{mount.log()}")
        if time.monotonic() > deadline:
            mount.unmount()
            pytest.fail(f"mount not live after {timeout}s:\n{mount.log()}")
        time.sleep(0.02)
    return mount


@pytest.fixture
def mount(tmp_path: Path) -> Iterator:
    """mount(source_or_sources, *cli_args) -> Mount; every mount is unmounted at teardown."""
    mounts: list[Mount] = []

    def make(source: str | Path | list, *args: str, name: str = "mnt") -> Mount:
        sources = [str(s) for s in source] if isinstance(source, list) else [str(source)]
        if not any("replace_window" in a for a in args):
            # rm's deferred store deletion: short in tests, which wait for it with settle()
            args = ("-o", f"replace_window={TEST_REPLACE_WINDOW}", *args)
        m = start_mount(sources, tmp_path / f"{name}{len(mounts)}", *args)
        mounts.append(m)
        return m

    try:
        yield make
    finally:
        for m in mounts:
            m.unmount()
