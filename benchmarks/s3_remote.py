"""Issue 30: zfuse against zarr-python, rclone and s3fs-fuse on a remote S3 server, at 0 and
20 ms round-trip time, on this one machine.

    sudo .venv/bin/python -m benchmarks.s3_remote [--reps N] [--quick] [--rtt 0 20]
    sudo .venv/bin/python -m benchmarks.run --only s3remote      # the same, 5 repetitions

Opt-in (not in `benchmarks.run`'s default run): it needs root for network namespaces and
iptables, Debian's nginx, iptables, libnetfilter-queue-dev and a C compiler; rclone and
s3fs are used when installed and reported as skipped when not (gdal_translate likewise).

The server (benchmarks/remote_lab.py): moto's server mode behind nginx (upstream
keep-alive; moto closes every connection, real S3 does not), both in a "server" network
namespace reached through a "router" namespace whose NFQUEUE holds every packet RTT/2
(nfq_delay.c). nginx's access log counts every request: GETs (ranged or not), HEADs,
LISTs, bytes sent and how many were in flight at once.

The data, uploaded once into one bucket as the group `bench.zarr`: 4096x4096 uint16 in
512x512 chunks (64 chunks), one array zstd and one sharded (4 shards of 2048x2048, 16
inner chunks each), plus copies of them for the figures that need a cold array on a mount
already used (8 readers, the two region readers), and `many`, 10,000 one-byte chunks.

Per repetition every system runs every figure, the systems one after another (their order
rotates between repetitions), the page cache dropped before each cold figure:

- zfuse: `zfuse mount s3://BUCKET/bench.zarr MNT -o endpoint_url=...` (credentials in the
  environment), reading chunk files; zfuse-cache: the same with `-o cache=DIR` (skipped when
  `zfuse mount -h` lists no `cache=`).
- zarr-python in-process: FsspecStore with zfuse's own s3fs options (store.fsspec_options),
  a new S3FileSystem per repetition (no connections kept from the one before).
- rclone mount (`--vfs-cache-mode off` and `full`, `--use-server-modtime`) and s3fs-fuse
  (`use_path_request_style`) of the bucket, reading the stored objects (the chunks; for the
  sharded array the 4 shards).

Figures: mount (until the mountpoint's first stat answers, zfuse's modules in the page
cache first; zarr: open_group) and zfuse's
mount of a local copy; sequential cold read of the zstd chunks (the mounts: the chunk
directory listed, as `find` or a shell glob would, then the files read one after another
like `cat`; zarr: chunk by chunk); warm re-read on the same mount; sequential cold read of
the sharded array; a sequential cold read of the first 2 rows of `many` (200 one-byte
chunk files, each row listed first; zfuse and zarr only: chunk by chunk); 8 reader
processes (zarr: `arr[:]`); a 1024x1024 region of
`image.ome.tif` with tifffile and with gdal_translate (zarr: slicing); `ls -lR` of `many`
(zarr: list_prefix; first 2 repetitions, s3fs-fuse the first only); a re-read after a
remount (zfuse, zfuse-cache and rclone-full, same cache directory). Ratios are the other system's
time over zfuse's. Timings never decide a pass/fail test; this is where they live.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from benchmarks.arrays import Spec, create, read_block
from benchmarks.common import CODE, Config, Result, image, read_files, tmp_dir
from benchmarks.parallel import read_in_processes
from benchmarks.remote_lab import Lab, Request, max_in_flight

BUCKET = "zfuse-remote"
GROUP = "bench.zarr"
KEY = SECRET = "test"
N = 4096
ZSTD = Spec("zstd", (N, N), (512, 512))
SHARDED = Spec("sharded", (N, N), (512, 512), shards=(2048, 2048))
# arrays of the same content, each read cold once per mount by one figure
ARRAYS = {"zstd": ZSTD, "sharded": SHARDED, "pzstd": ZSTD, "psharded": SHARDED, "rzstd": ZSTD,
          "gzstd": ZSTD}
MANY = (100, 100)  # `many`: 10,000 chunks of 1x1 uint8
MANY_ROWS = 2  # seq_many: its first rows, 200 chunk files, more than one window fetched ahead
# figures of many small chunks read one after another: zfuse and zarr-python only (a peer
# makes a round trip per file, seconds per repetition, and says nothing new)
SMALL_CHUNK_SYSTEMS = ("zfuse", "zfuse-cache", "zarr")
REGION = (256, 256, 1024)  # y, x, size: rows/columns 256..1279 cover 3x3 chunks
READERS = 8
# `ls -lR` of 10,000 objects in the first 2 repetitions only, s3fs-fuse's in the first only: it
# HEADs every object (~45 s at 20 ms); one full run stays near 15 minutes
LS_REPS = {"s3fs": 1}
LS_REPS_OTHERS = 2
# the re-read after a remount where a cache could survive it (zfuse without a cache: the
# reference); zarr-python, rclone-off and s3fs-fuse would read as cold again
REMOUNT_SYSTEMS = ("zfuse", "zfuse-cache", "rclone-full")
# zfuse: default options; zfuse-cache: with -o cache=DIR (when this zfuse has it)
SYSTEMS = ("zfuse", "zfuse-cache", "zarr", "rclone-off", "rclone-full", "s3fs")
FIGURES = ("mount", "mount_local", "seq_zstd", "warm_zstd", "seq_sharded", "seq_many", "par8_zstd",
           "par8_sharded", "region_tifffile", "region_gdal", "ls_lR", "remount_zstd", "remount_sharded")
WHAT = {
    "mount": "mount until the mountpoint's first stat answers (zarr: open_group)",
    "mount_local": "zfuse only: mount of a local copy of the same group (the goal's reference)",
    "seq_zstd": "sequential cold read, 64 zstd chunks (peers: the 64 objects)",
    "warm_zstd": "warm re-read of the same on the same mount (zarr: read again)",
    "seq_sharded": "sequential cold read, sharded (zfuse 64 inner-chunk files; peers 4 shard objects)",
    "seq_many": f"sequential cold read of {MANY_ROWS * MANY[1]} chunk files of 1 byte, listed row by row "
                "(zfuse and zarr only)",
    "par8_zstd": "8 reader processes, zstd (zarr: arr[:])",
    "par8_sharded": "8 reader processes, sharded (zarr: arr[:])",
    "region_tifffile": "1024x1024 region of image.ome.tif, tifffile aszarr (zarr: slicing)",
    "region_gdal": "the same region with gdal_translate -srcwin (zarr: slicing)",
    "ls_lR": "ls -lR of 10,000 chunk objects (zarr: list_prefix)",
    "remount_zstd": "read the zstd chunks again after a remount (zfuse, zfuse-cache, rclone-full)",
    "remount_sharded": "read the sharded array again after a remount",
}


WARM_IMPORTS = "import zfuse.cli, zfuse.daemon, zfuse.open_view, zfuse.view.tree, zfuse.fuse_ops, s3fs, crc32c"


def _aws_env() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true"}


def _drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# -- data ---------------------------------------------------------------------------------
def build_and_upload(lab: Lab, workdir: Path, log: Callable[[str], None]) -> None:
    import boto3

    root = workdir / "data" / GROUP
    zarr.open_group(str(root), mode="w", zarr_format=3)
    pixels = image((N, N), 0)
    for name, spec in ARRAYS.items():
        create(root / name, spec)[...] = pixels
    many = zarr.create_array(store=str(root / "many"), shape=MANY, chunks=(1, 1), dtype="uint8",
                             compressors=None, fill_value=0, zarr_format=3)
    many[...] = (np.arange(MANY[0] * MANY[1]) % 250 + 1).astype("uint8").reshape(MANY)
    files = [f for f in sorted(root.rglob("*")) if f.is_file()]
    client = boto3.client("s3", endpoint_url=lab.endpoint, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)

    def put(f: Path) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{GROUP}/{f.relative_to(root)}", Body=f.read_bytes())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))
    log(f"  uploaded {len(files)} objects ({sum(f.stat().st_size for f in files) / 1e6:.0f} MB) "
        f"in {time.perf_counter() - t0:.1f} s")
    # kept: zfuse's mount of this local copy is the mount figure's reference


def expected_files(name: str, zfuse: bool) -> int:
    """Chunk files (zfuse: inner chunks) or stored objects (the peers: shards) of array `name`."""
    spec = ARRAYS[name]
    per_object = 1 if zfuse or not spec.shards else (spec.shards[0] // spec.chunks[0]) ** 2
    return len(spec.coords()) // per_object


def walk_files(top: Path) -> list[str]:
    """Every file under `top` in chunk order (c/i/j numerically), listed as `find` or a shell
    glob would: the sequential readers list the chunk directories first, as legacy tools do."""
    found: list[tuple[tuple[int, ...], str]] = []

    def walk(path: str, key: tuple[int, ...]) -> None:
        with os.scandir(path) as it:
            for entry in it:
                sub = (*key, int(entry.name.partition(".")[0]))
                if entry.is_dir():
                    walk(entry.path, sub)
                else:
                    found.append((sub, entry.path))

    walk(str(top), ())
    return [p for _, p in sorted(found)]


# -- systems --------------------------------------------------------------------------------
class Skipped(Exception):
    """This system cannot run here (not installed, did not mount): reported, not fatal."""


@dataclass
class MountedSystem:
    name: str
    proc: subprocess.Popen | None
    path: Path
    log_path: Path | None = None

    def unmount(self) -> None:
        if is_mounted(self.path):
            subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True)
            if is_mounted(self.path):
                subprocess.run(["umount", str(self.path)], capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
                self.proc.kill()
                self.proc.wait(timeout=10)
        if is_mounted(self.path):  # a daemon gone leaves its mount behind
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def is_mounted(path: Path) -> bool:
    """From the mount table: os.path.ismount says False for a FUSE mount whose daemon died."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def unmount_all_under(directory: Path) -> None:
    """Lazily unmount whatever is still mounted under `directory` (before removing it: a
    recursive delete through a live mount would delete the bucket's objects)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in points:
        if point.startswith(str(directory) + "/"):
            subprocess.run(["umount", "-l", point], capture_output=True)


def zfuse_cache_option() -> bool:
    """Whether this zfuse has `-o cache=DIR` (another change adds it)."""
    out = subprocess.run([sys.executable, "-m", "zfuse.cli", "mount", "-h"], capture_output=True,
                         text=True, cwd=CODE).stdout
    return re.search(r"^\s+cache=", out, re.M) is not None


class Systems:
    """How each system is mounted and what it reads."""

    def __init__(self, lab: Lab, workdir: Path) -> None:
        self.lab = lab
        self.workdir = workdir
        self.count = 0
        self.zfuse_cache = zfuse_cache_option()
        self.rclone_conf = workdir / "rclone.conf"
        self.rclone_conf.write_text(
            f"[zb]\ntype = s3\nprovider = Other\nendpoint = {lab.endpoint}\naccess_key_id = {KEY}\n"
            f"secret_access_key = {SECRET}\nregion = us-east-1\n")
        self.s3fs_passwd = workdir / "s3fs.passwd"
        self.s3fs_passwd.write_text(f"{KEY}:{SECRET}\n")
        self.s3fs_passwd.chmod(0o600)

    def available(self, name: str) -> str | None:
        """None if `name` can run, else why not."""
        need = {"rclone-off": "rclone", "rclone-full": "rclone", "s3fs": "s3fs"}.get(name)
        if need and shutil.which(need) is None:
            return f"{need} not installed (apt-get install -y {need})"
        if name == "zfuse-cache" and not self.zfuse_cache:
            return "this zfuse has no -o cache= (zfuse mount -h)"
        return None

    def command(self, name: str, mnt: Path, cache: Path) -> tuple[list[str], dict[str, str], Path | None]:
        env = {**os.environ, **_aws_env()}
        if name == "zfuse-local":
            return ([sys.executable, "-m", "zfuse.cli", "mount", str(self.workdir / "data" / GROUP), str(mnt),
                     "-f"], env, CODE)
        if name.startswith("zfuse"):
            opts = f"endpoint_url={self.lab.endpoint}" + (f",cache={cache}" if name == "zfuse-cache" else "")
            return ([sys.executable, "-m", "zfuse.cli", "mount", f"s3://{BUCKET}/{GROUP}", str(mnt), "-f",
                     "-o", opts], env, CODE)
        if name.startswith("rclone"):
            mode = name.split("-")[1]
            # rclone 1.60 refuses a CA bundle for its plain-http transport
            env.pop("AWS_CA_BUNDLE", None)
            # --use-server-modtime: a file's time from the listing; by default rclone HEADs every
            # object for its mtime metadata, one at a time (`ls -lR` of 10,000: ~250 s at 20 ms)
            return (["rclone", "mount", f"zb:{BUCKET}", str(mnt), "--config", str(self.rclone_conf),
                     "--vfs-cache-mode", mode, "--cache-dir", str(cache), "--use-server-modtime"], env, None)
        if name == "s3fs":
            return (["s3fs", BUCKET, str(mnt), "-f", "-o",
                     f"url={self.lab.endpoint},use_path_request_style,passwd_file={self.s3fs_passwd}"],
                    env, None)
        raise ValueError(name)

    def mount(self, name: str, cache: Path) -> tuple[MountedSystem, float]:
        """Start the mount; seconds until the mountpoint's first stat answers."""
        self.count += 1
        mnt = self.workdir / "mnt" / f"{name}-{self.count}"
        mnt.mkdir(parents=True)
        cache.mkdir(parents=True, exist_ok=True)
        cmd, env, cwd = self.command(name, mnt, cache)
        if name.startswith("zfuse"):
            # the page cache holds the modules every zfuse mount imports, whatever figure
            # dropped it before: the mount figures compare mounts, not cold disk reads
            subprocess.run([sys.executable, "-c", WARM_IMPORTS], cwd=cwd, env=env, check=True)
        log_path = mnt.with_suffix(".log")
        parent_dev = os.stat(mnt.parent).st_dev
        t0 = time.perf_counter()
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=cwd)
        mounted = MountedSystem(name, proc, mnt, log_path)
        while True:
            try:
                if os.stat(mnt).st_dev != parent_dev:
                    return mounted, time.perf_counter() - t0
            except OSError:
                pass
            if proc.poll() is not None:
                mounted.unmount()
                raise Skipped(f"{name} exited ({proc.returncode}) before mounting: "
                              f"{log_path.read_text(errors='replace')[-500:]}")
            if time.perf_counter() - t0 > 60:
                mounted.unmount()
                raise Skipped(f"{name} not mounted after 60 s")
            time.sleep(0.002)


def zarr_store(lab: Lab) -> Any:
    """zarr-python's store as zfuse opens it (same s3fs options), with a new S3FileSystem."""
    from zarr.storage import FsspecStore

    from zfuse.store import fsspec_options

    options = fsspec_options("s3", {"endpoint_url": lab.endpoint, "region": "us-east-1"})
    return FsspecStore.from_url(f"s3://{BUCKET}/{GROUP}", storage_options={**options, "skip_instance_cache": True},
                                read_only=True)


def close_store(store: Any) -> None:
    """Close the S3 client of a store made with skip_instance_cache (else aiohttp warns at exit)."""
    from zarr.core.sync import sync

    client = getattr(store.fs, "_s3", None)
    if client is not None:
        sync(client.close())


# -- measuring --------------------------------------------------------------------------
@dataclass
class Sample:
    seconds: float
    requests: list[Request]
    late: int  # requests that started after the figure ended (background work)
    note: str = ""

    def count(self, kind: str) -> int:
        return sum(r.kind == kind for r in self.requests)

    @property
    def ranged(self) -> int:
        return sum(r.kind == "GET" and bool(r.range) for r in self.requests)

    @property
    def get_bytes(self) -> int:
        return sum(r.nbytes for r in self.requests if r.kind == "GET")

    @property
    def in_flight(self) -> int:
        return max_in_flight(self.requests)


@dataclass
class Table:
    """Samples per (rtt, figure, system); why a system or figure was skipped."""

    samples: dict[tuple[int, str, str], list[Sample]] = field(default_factory=dict)
    skipped: dict[tuple[int, str, str], str] = field(default_factory=dict)

    def add(self, rtt: int, figure: str, system: str, sample: Sample) -> None:
        self.samples.setdefault((rtt, figure, system), []).append(sample)

    def median_s(self, rtt: int, figure: str, system: str) -> float | None:
        got = self.samples.get((rtt, figure, system))
        return statistics.median(s.seconds for s in got) if got else None


class Runner:
    def __init__(self, lab: Lab, systems: Systems, table: Table, rtt: int, log: Callable[[str], None]) -> None:
        self.lab, self.systems, self.table, self.rtt, self.log = lab, systems, table, rtt, log

    def settle(self) -> None:
        """Let requests still under way (read-ahead) finish and reach the log."""
        time.sleep(0.1 + 4 * self.rtt / 1000)

    def measure(self, figure: str, system: str, fn: Callable[[], Any], cold: bool = True) -> Any:
        if cold:
            _drop_caches()
        offset = self.lab.log_offset()
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
        wall_end = time.time()
        if isinstance(out, Timed):  # the figure timed itself (readers started before its clock)
            seconds, out = out.seconds, out.value
        self.settle()
        reqs = self.lab.requests_since(offset)
        during = [r for r in reqs if r.start <= wall_end + 0.002]
        with open(self.systems.workdir / "figures.tsv", "a") as f:
            f.write(f"{self.rtt}\t{system}\t{figure}\t{wall_end - seconds:.3f}\t{wall_end:.3f}\t{len(during)}\n")
        self.table.add(self.rtt, figure, system, Sample(seconds, during, len(reqs) - len(during)))
        return out

    def mount(self, system: str, cache: Path, figure: str | None, record_as: str | None = None) -> MountedSystem:
        offset = self.lab.log_offset()
        mounted, seconds = self.systems.mount(system, cache)
        wall_live = time.time()
        self.settle()
        if figure:
            reqs = self.lab.requests_since(offset)
            during = [r for r in reqs if r.start <= wall_live + 0.002]
            with open(self.systems.workdir / "figures.tsv", "a") as f:
                f.write(f"{self.rtt}\t{system}\t{figure}\t{wall_live - seconds:.3f}\t{wall_live:.3f}\t{len(during)}\n")
            self.table.add(self.rtt, figure, record_as or system, Sample(seconds, during, len(reqs) - len(during)))
        return mounted

    # -- one system's figures in one repetition --------------------------------------
    def run_mounted(self, system: str, rep: int) -> None:
        cache = self.systems.workdir / "cache" / f"{system}-{self.rtt}-{rep}"
        zf = system.startswith("zfuse")
        if system == "zfuse":
            self.mount("zfuse-local", cache, "mount_local", record_as="zfuse").unmount()
        m = self.mount(system, cache, "mount")
        try:
            root = m.path

            def files(name: str) -> list[str]:
                paths = walk_files(root / name / "c" if zf else root / GROUP / name / "c")
                if len(paths) != expected_files(name, zf):
                    raise AssertionError(f"{system}: {len(paths)} files listed in {name}, not "
                                         f"{expected_files(name, zf)}")
                return paths

            def listed_and_read(name: str) -> int:
                return read_files(files(name))

            def listed_and_read_by_8(name: str) -> Timed:
                # the listing is timed; the readers' interpreters start outside the clock
                t0 = time.perf_counter()
                paths = files(name)
                listing = time.perf_counter() - t0
                seconds, nbytes = read_in_processes(paths, READERS)
                return Timed(listing + seconds, nbytes)

            self.measure("seq_zstd", system, lambda: listed_and_read("zstd"))
            self.measure("warm_zstd", system, lambda: listed_and_read("zstd"), cold=False)
            self.measure("seq_sharded", system, lambda: listed_and_read("sharded"))
            if system in SMALL_CHUNK_SYSTEMS:
                many_rows = [root / "many" / "c" / str(y) if zf else root / GROUP / "many" / "c" / str(y)
                             for y in range(MANY_ROWS)]
                self.measure("seq_many", system,
                             lambda: read_files([p for row in many_rows for p in walk_files(row)]))
            self.measure("par8_zstd", system, lambda: listed_and_read_by_8("pzstd"))
            self.measure("par8_sharded", system, lambda: listed_and_read_by_8("psharded"))
            if zf:
                y, x, size = REGION
                got = self.measure("region_tifffile", system,
                                   lambda: region_tifffile(root / "rzstd" / "image.ome.tif"))
                if not np.array_equal(got, expected_region()):
                    raise AssertionError("the region read through zfuse's image.ome.tif differs from the data")
                if shutil.which("gdal_translate"):
                    out = self.systems.workdir / f"gdal-{rep}.tif"
                    self.measure("region_gdal", system,
                                 lambda: region_gdal(root / "gzstd" / "image.ome.tif", out))
                    out.unlink(missing_ok=True)
                else:
                    self.table.skipped[(self.rtt, "region_gdal", system)] = "gdal_translate not installed"
            many = root / "many" if zf else root / GROUP / "many"
            if rep < LS_REPS.get(system, LS_REPS_OTHERS):
                self.measure("ls_lR", system, lambda: ls_lR(many))
        finally:
            m.unmount()
        if system not in REMOUNT_SYSTEMS:
            return
        m = self.mount(system, cache, None)
        try:
            root = m.path
            self.measure("remount_zstd", system, lambda: listed_and_read("zstd"))
            self.measure("remount_sharded", system, lambda: listed_and_read("sharded"))
        finally:
            m.unmount()

    def run_zarr(self, rep: int) -> None:
        from zarr.core.sync import sync

        store = zarr_store(self.lab)
        group = self.measure("mount", "zarr", lambda: zarr.open_group(store, mode="r"), cold=False)
        arrays = {name: group[name] for name in ARRAYS}
        self.measure("seq_zstd", "zarr", lambda: read_chunks(arrays["zstd"], ZSTD))
        self.measure("warm_zstd", "zarr", lambda: read_chunks(arrays["zstd"], ZSTD), cold=False)
        self.measure("seq_sharded", "zarr", lambda: read_chunks(arrays["sharded"], SHARDED))
        many = group["many"]
        self.measure("seq_many", "zarr",
                     lambda: sum(many[y, x].nbytes for y in range(MANY_ROWS) for x in range(MANY[1])))
        self.measure("par8_zstd", "zarr", lambda: arrays["pzstd"][...].nbytes)
        self.measure("par8_sharded", "zarr", lambda: arrays["psharded"][...].nbytes)
        y, x, size = REGION
        got = self.measure("region_tifffile", "zarr", lambda: arrays["rzstd"][y:y + size, x:x + size])
        if not np.array_equal(got, expected_region()):
            raise AssertionError("zarr-python's region differs from the data")
        self.measure("region_gdal", "zarr", lambda: arrays["gzstd"][y:y + size, x:x + size].nbytes)

        async def list_many() -> int:
            return len([k async for k in store.list_prefix("many/")])

        if rep < LS_REPS.get("zarr", LS_REPS_OTHERS):
            self.measure("ls_lR", "zarr", lambda: sync(list_many()))
        close_store(store)

    def run_rep(self, rep: int, order: Sequence[str]) -> None:
        for system in order:
            if (why := self.systems.available(system)) is not None:
                self.table.skipped[(self.rtt, "*", system)] = why
                continue
            t0 = time.perf_counter()
            try:
                if system == "zarr":
                    self.run_zarr(rep)
                else:
                    self.run_mounted(system, rep)
            except Skipped as e:
                self.table.skipped[(self.rtt, "*", system)] = str(e)
                self.log(f"    {system}: skipped: {e}")
                continue
            except Exception as e:  # one system failing is a finding, not the end of the run
                why = f"failed in repetition {rep + 1}: {type(e).__name__}: {str(e)[:300]}"
                self.table.skipped[(self.rtt, "*", system)] = why
                self.log(f"    {system}: {why}")
                continue
            self.log(f"    {system}: {time.perf_counter() - t0:.1f} s")


@dataclass
class Timed:
    seconds: float
    value: Any


def expected_region() -> np.ndarray:
    y, x, size = REGION
    return image((N, N), 0)[y:y + size, x:x + size]


def read_chunks(arr: zarr.Array, spec: Spec) -> int:
    return sum(read_block(arr, spec, i, j).nbytes for i, j in spec.coords())


def region_tifffile(path: Path) -> np.ndarray:
    import tifffile

    store = tifffile.imread(path, aszarr=True)
    try:
        y, x, size = REGION
        return zarr.open_array(store, mode="r")[y:y + size, x:x + size]
    finally:
        store.close()


def region_gdal(path: Path, out: Path) -> int:
    y, x, size = REGION
    subprocess.run(["gdal_translate", "-q", "-srcwin", str(x), str(y), str(size), str(size), str(path), str(out)],
                   check=True, capture_output=True)
    return out.stat().st_size


def ls_lR(path: Path) -> int:
    out = subprocess.run(["ls", "-lR", str(path)], capture_output=True, text=True, check=True).stdout
    return sum(line.startswith("-") for line in out.splitlines())


# -- report --------------------------------------------------------------------------------
def requests_cell(samples: list[Sample]) -> str:
    """The server's requests (median per repetition), bytes of GET bodies, most in flight at once."""
    med = statistics.median
    gets, ranged = med(s.count("GET") for s in samples), med(s.ranged for s in samples)
    heads, lists = med(s.count("HEAD") for s in samples), med(s.count("LIST") for s in samples)
    parts = [f"{gets:g} GET" + (f" ({ranged:g} ranged)" if ranged else "")]
    if heads:
        parts.append(f"{heads:g} HEAD")
    if lists:
        parts.append(f"{lists:g} LIST")
    # writes too: a read-write zfuse mount probes the store's conditional PUTs
    for kind in sorted({r.kind for s in samples for r in s.requests} - {"GET", "HEAD", "LIST"}):
        parts.append(f"{med(s.count(kind) for s in samples):g} {kind}")
    parts.append(f"{med(s.get_bytes for s in samples) / 1e6:.1f} MB")
    parts.append(f"≤{max(s.in_flight for s in samples)}")
    return ", ".join(parts)


def cell(samples: list[Sample]) -> str:
    return f"{statistics.median(s.seconds for s in samples):.3f} s, {requests_cell(samples)}"


def waves(reqs: Sequence[Request], gap_s: float = 0.005) -> str:
    """Requests grouped by when they reached the server (a pause of more than `gap_s` starts a
    new wave): how many waves, their sizes, and the time from one to the next."""
    starts = sorted(r.start for r in reqs)
    if not starts:
        return "no requests"
    groups: list[list[float]] = [[starts[0]]]
    for t in starts[1:]:
        if t - groups[-1][-1] > gap_s:
            groups.append([])
        groups[-1].append(t)
    sizes = [len(g) for g in groups]
    steps = [b[0] - a[0] for a, b in zip(groups[:-1], groups[1:], strict=True)]
    step = f", one every {statistics.median(steps) * 1000:.0f} ms (median)" if steps else ""
    shown = " ".join(map(str, sizes[:24])) + (" ..." if len(sizes) > 24 else "")
    return f"{len(groups)} waves over {(starts[-1] - starts[0]) * 1000:.0f} ms{step}: {shown}"


def timelines(table: Table, rtts: Sequence[int], systems: Sequence[str]) -> str:
    """The zfuse figures' requests in time (the last repetition's)."""
    lines = ["", "zfuse's requests in time (last repetition; a wave = requests arriving within 5 ms of each other):"]
    for rtt in rtts:
        for system in systems:
            if not system.startswith("zfuse"):
                continue
            for fig in FIGURES:
                got = table.samples.get((rtt, fig, system))
                if got:
                    late = f", {got[-1].late} after the figure ended" if got[-1].late else ""
                    lines.append(f"- RTT {rtt} ms {system} {fig}: {waves(got[-1].requests)}{late}")
    return "\n".join(lines)


def report(table: Table, rtts: Sequence[int], systems: Sequence[str]) -> str:
    """Per RTT: median times with the ratio other/zfuse, then the requests behind them."""
    lines = []
    for rtt in rtts:
        head = ["| figure | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
        lines += ["", f"RTT {rtt} ms: median time (ratio = that system's time / zfuse's)", "", *head]
        for fig in FIGURES:
            z = table.median_s(rtt, fig, "zfuse")
            row = []
            for system in systems:
                t = table.median_s(rtt, fig, system)
                ratio = f" ({t / z:.2f}x)" if t is not None and z and system != "zfuse" else ""
                row.append("-" if t is None else f"{t:.3f} s{ratio}")
            lines.append(f"| {fig} | " + " | ".join(row) + " |")
        lines += ["", f"RTT {rtt} ms: the server's requests (median per repetition), MB of GET bodies, "
                  "most requests in flight at once", "", *head]
        for fig in FIGURES:
            row = [requests_cell(got) if (got := table.samples.get((rtt, fig, system))) else "-"
                   for system in systems]
            lines.append(f"| {fig} | " + " | ".join(row) + " |")
    lines.append(timelines(table, rtts, systems))
    if table.skipped:
        lines.append("\nskipped:")
        for (rtt, fig, system), why in sorted(table.skipped.items()):
            lines.append(f"- RTT {rtt} ms, {system}, {fig}: {why}")
    return "\n".join(lines)


def run(reps: int, rtts: Sequence[int], systems_run: Sequence[str] = SYSTEMS, log: Callable[[str], None] = print,
        keep: Path | None = None) -> tuple[Table, dict[str, Any]]:
    """Every figure of every system, `reps` times at each RTT. `keep`: a directory that gets
    nginx's access log and figures.tsv (which figure ran when) for a closer look."""
    if os.geteuid() != 0:
        raise RuntimeError("s3remote needs root (network namespaces, iptables, dropping the page cache)")
    workdir = tmp_dir() / "s3remote"
    workdir.mkdir(parents=True, exist_ok=True)
    table = Table()
    info: dict[str, Any] = {}
    saved = {k: os.environ.get(k) for k in _aws_env()}
    os.environ.update(_aws_env())
    try:
        with Lab(workdir, KEY, SECRET, log=log) as lab:
            build_and_upload(lab, workdir, log)
            systems = Systems(lab, workdir)
            info["zfuse_cache_option"] = systems.zfuse_cache
            for rtt in rtts:
                lab.set_delay(rtt / 2)
                ping = lab.ping_rtt_ms()
                info[f"ping_rtt{rtt}_ms"] = ping
                log(f"  RTT {rtt} ms: ping min/avg/max {ping[0]:.2f}/{ping[1]:.2f}/{ping[2]:.2f} ms")
                runner = Runner(lab, systems, table, rtt, log)
                for rep in range(reps):
                    shift = rep % len(systems_run)
                    order = [*systems_run[shift:], *systems_run[:shift]]
                    log(f"   repetition {rep + 1}/{reps}: {', '.join(order)}")
                    runner.run_rep(rep, order)
            lab.set_delay(0)
    finally:
        unmount_all_under(workdir)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("access.log", "figures.tsv"):
                if (workdir / name).exists():
                    shutil.copy(workdir / name, keep / name)
        shutil.rmtree(workdir, ignore_errors=True)
    return table, info


def reps_default(quick: bool) -> int:
    env = os.environ.get("ZFUSE_BENCH_REMOTE_REPS")
    return int(env) if env else (1 if quick else 5)


def bench_s3remote(cfg: Config) -> list[Result]:
    """benchmarks.run's entry: 5 repetitions (--quick: 1; ZFUSE_BENCH_REMOTE_REPS=N), RTT 0 and 20 ms."""
    rtts = [0, 20]
    keep = os.environ.get("ZFUSE_BENCH_REMOTE_KEEP")
    table, info = run(reps_default(cfg.quick), rtts, SYSTEMS, cfg.log, Path(keep) if keep else None)
    print(report(table, rtts, SYSTEMS))
    results = []
    for rtt in rtts:
        for fig in FIGURES:
            z = table.samples.get((rtt, fig, "zfuse"))
            ref = table.samples.get((rtt, fig, "zarr"))
            if not z:
                continue
            zt = statistics.median(s.seconds for s in z)
            rt = statistics.median(s.seconds for s in ref) if ref else None
            extra: dict[str, Any] = {s: cell(got) for s in SYSTEMS if (got := table.samples.get((rtt, fig, s)))}
            results.append(Result(name=f"s3remote_{fig}_rtt{rtt}", what=f"{WHAT[fig]}, RTT {rtt} ms",
                                  zfuse_s=zt, ref_s=rt, ref_name="zarr-python in-process",
                                  ratio=rt / zt if rt else None, goal="report", extra={**extra, **info}))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.s3_remote", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 5; --quick 1)")
    p.add_argument("--quick", action="store_true", help="one repetition")
    p.add_argument("--rtt", type=int, nargs="+", default=[0, 20], help="round-trip times in ms (default 0 20)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--keep", type=Path, default=None,
                   help="copy nginx's access log and figures.tsv (when each figure ran) here")
    args = p.parse_args(argv)
    systems = [s for s in SYSTEMS if s in args.systems]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=CODE).stdout.strip()
    t0 = time.perf_counter()
    from benchmarks.common import cleanup_tmp

    try:
        table, info = run(args.reps or reps_default(args.quick), args.rtt, systems, keep=args.keep)
    finally:
        cleanup_tmp()
    print(f"\ncommit {commit}, {time.perf_counter() - t0:.0f} s, {info}")
    print(report(table, args.rtt, systems))
    return 0


if __name__ == "__main__":
    sys.exit(main())
