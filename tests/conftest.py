"""Shared fixtures: real FUSE mounts that always unmount, even on failure.

The machinery is `zfuse.testing` (shared with the benchmarks); this file only
turns what it reports into pytest outcomes: no FUSE here is a skip (a failure
under ZFUSE_REQUIRE_FUSE=1), a mount that does not come up is a failure."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zfuse.testing import Mount, MountError, Mounts, fuse_available
from zfuse.testing import start_mount as _start_mount

from s3server import S3Server

REQUIRE_FUSE = os.environ.get("ZFUSE_REQUIRE_FUSE") == "1"

# rm's deferred store deletion: short in tests, which wait for it with Mount.settle()
TEST_REPLACE_WINDOW = 0.3


def skip_or_fail(reason: str) -> None:
    if REQUIRE_FUSE:
        pytest.fail(f"ZFUSE_REQUIRE_FUSE=1 but {reason}")
    pytest.skip(reason)


def _mount_or_fail(start: Callable[[], Mount]) -> Mount:
    """`start()` once FUSE is known to work here; a MountError fails the test with the daemon's log."""
    reason = fuse_available()
    if reason:
        skip_or_fail(reason)
    try:
        return start()
    except MountError as e:
        failure = str(e)
    pytest.fail(failure)


def start_mount(sources: list[str], mountpoint: Path, *args: str, timeout: float = 60) -> Mount:
    """`zfuse.testing.start_mount` for a test: skipped without FUSE, failed if it does not come up."""
    return _mount_or_fail(lambda: _start_mount(sources, mountpoint, *args, timeout=timeout))


@pytest.fixture
def mount(tmp_path: Path) -> Iterator:
    """mount(source_or_sources, *cli_args, name="mnt") -> Mount; every mount is unmounted at teardown."""
    with Mounts(tmp_path) as mounts:

        def make(source: str | Path | list, *args: str, name: str = "mnt") -> Mount:
            if not any("replace_window" in a for a in args):
                args = ("-o", f"replace_window={TEST_REPLACE_WINDOW}", *args)
            return _mount_or_fail(lambda: mounts.start(source, *args, name=name))

        yield make


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server on loopback (moto's server mode), one per test module
    (each test makes its own bucket)."""
    server = S3Server(tmp_path_factory.mktemp("moto") / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()

