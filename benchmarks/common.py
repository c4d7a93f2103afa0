"""Shared machinery: data directory, mounts, cache dropping, timed readers, results."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zfuse.testing import Mount, start_mount

ROOT = Path(__file__).resolve().parent
DATA = Path(os.environ.get("ZFUSE_BENCH_DATA", ROOT / "data"))
# the zfuse whose daemon is measured: this checkout, or another one (a "before" figure:
# `git worktree add /tmp/zfuse-before REV`, then ZFUSE_BENCH_CODE=/tmp/zfuse-before)
CODE = Path(os.environ.get("ZFUSE_BENCH_CODE", ROOT.parent))
BUF = 1 << 20  # `cat`-like reads: 1 MiB buffer
MiB = 1 << 20


@dataclass
class Config:
    quick: bool = False
    reps: int = 3
    drop_caches: bool = True
    keep_data: bool = True
    log: Callable[[str], None] = print


@dataclass
class Result:
    """One figure: zfuse against a reference, same work, same run."""

    name: str
    what: str
    zfuse_s: float | None = None  # seconds (median of reps)
    ref_s: float | None = None
    ref_name: str = ""
    nbytes: int = 0  # bytes the zfuse side moved (per rep)
    ref_nbytes: int = 0
    ratio: float | None = None  # zfuse throughput / reference throughput (or absolute figure)
    value: float | None = None  # absolute figure when the goal is absolute (GB/s, s, MiB)
    unit: str = ""
    goal: str = ""
    met: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def mbps(nbytes: int, seconds: float | None) -> float | None:
    if not seconds:
        return None
    return nbytes / seconds / 1e6


# -- page cache -----------------------------------------------------------------
_DROP_WARNED = False


def drop_caches(cfg: Config) -> bool:
    """sync + drop the kernel page cache (root only); False if not possible."""
    global _DROP_WARNED
    if not cfg.drop_caches:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        if not _DROP_WARNED:
            cfg.log(f"  (cannot drop the page cache: {e}; cold runs may be warm)")
            _DROP_WARNED = True
        return False


# -- reading -----------------------------------------------------------------------
def read_file(path: str | os.PathLike, buf: bytearray | None = None) -> int:
    """Read a whole file like `cat` does (1 MiB reads); return its size."""
    buf = buf if buf is not None else bytearray(BUF)
    view = memoryview(buf)
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            got = os.readv(fd, [view])
            if not got:
                return n
            n += got
    finally:
        os.close(fd)


def read_files(paths: Iterable[str | os.PathLike]) -> int:
    buf = bytearray(BUF)
    return sum(read_file(p, buf) for p in paths)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# -- mounts ---------------------------------------------------------------------------
_TMP: Path | None = None


def tmp_dir() -> Path:
    """One scratch directory per run for mountpoints and logs."""
    global _TMP
    if _TMP is None:
        _TMP = Path(tempfile.mkdtemp(prefix="zfuse-bench-"))
    return _TMP


def cleanup_tmp() -> None:
    global _TMP
    if _TMP is not None:
        shutil.rmtree(_TMP, ignore_errors=True)
        _TMP = None


_COUNTER = [0]


@contextlib.contextmanager
def mounted(
    sources: Sequence[str | os.PathLike], *args: str, env: dict[str, str] | None = None,
    timeout: float = 120, code: Path | None = None,
) -> Iterator[Mount]:
    """A fresh `zfuse mount -f` daemon of the code in `code` (default: CODE; its pid is
    the daemon's), always unmounted; zfuse.testing.MountError if it does not come up."""
    _COUNTER[0] += 1
    m = start_mount(sources, tmp_dir() / f"mnt{_COUNTER[0]}", *args, timeout=timeout, env=env or {},
                    cwd=code or CODE, unmount_timeout=20, log_tail=3000)
    try:
        yield m
    finally:
        m.unmount()


class RssSampler:
    """Samples a process's RSS in a thread; `peak` is the larger of the samples and VmHWM."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = proc_status(self.pid).get("VmRSS")
            if rss is not None:
                self.samples.append(rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hwm = proc_status(self.pid).get("VmHWM")
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        return max([*self.samples, getattr(self, "hwm", None) or 0])


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM/... of /proc/PID/status in bytes."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key.startswith("Vm") and len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


# -- data -------------------------------------------------------------------------------
def image(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """A microscope-like uint16 image: smooth structure plus noise (zstd ~1.5-2x)."""
    rng = np.random.default_rng(seed)
    y = np.arange(shape[0], dtype=np.float32)[:, None]
    x = np.arange(shape[1], dtype=np.float32)[None, :]
    smooth = 2000 + 1500 * np.sin(y / 97.0) * np.cos(x / 131.0) + 0.05 * (x + y)
    noise = rng.integers(0, 256, size=shape, dtype=np.uint16)
    return (smooth.astype(np.uint16) + noise).astype(np.uint16)


def done_marker(path: Path) -> Path:
    return path.with_name(path.name + ".done")


def build_once(path: Path, build: Callable[[Path], None], cfg: Config, what: str) -> Path:
    """Build data at `path` unless a previous run finished it (marker file)."""
    marker = done_marker(path)
    if marker.exists() and path.exists():
        return path
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg.log(f"  building {what} at {path} ...")
    t, _ = timed(lambda: build(path))
    cfg.log(f"  built in {t:.1f} s")
    marker.write_text("ok\n")
    return path


def fresh_copy(src: Path, name: str) -> Path:
    """A scratch copy of a store (for write benchmarks)."""
    dst = tmp_dir() / name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_json(path: Path, results: list[Result], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({"meta": meta, "results": [r.as_dict() for r in results]}, indent=2) + "\n")
