"""Mount lifecycle: serve a view (opened by `zfuse.open_view`) over FUSE, unmount.

The CLI parses arguments into `MountConfig`; `serve()` runs in the daemon
process. Readiness is reported once the kernel mount exists: to a parent
process through a pipe (background mode) and to systemd (`NOTIFY_SOCKET`,
Type=notify). SIGTERM/SIGINT unmount cleanly after committing what open
files hold; SIGHUP drops cached metadata, listings and chunks.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import signal
import socket
import stat
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from zfuse import defaults
from zfuse.source_paths import local_path
from zfuse.stats import Stats

if TYPE_CHECKING:  # imported where used: the CLI (umount, status) starts without zarr
    from zfuse.view.tree import View

log = logging.getLogger("zfuse.daemon")


@dataclass
class MountConfig:
    sources: list[str]
    mountpoint: str
    concat_axis: int | None = None
    read_only: bool = False
    allow_other: bool = False
    cache_bytes: int = defaults.CACHE_BYTES
    listing_cache_names: int = defaults.LISTING_CACHE_NAMES
    index_cache_bytes: int = defaults.INDEX_CACHE_BYTES
    members_kept: int = defaults.MEMBERS_KEPT
    all_chunks: bool = False
    crop_edges: bool = False
    lossy_writes: bool = False
    max_threads: int = defaults.THREADS
    metadata_ttl: float | None = None
    timeout: float | None = None
    replace_window: float | None = None
    read_ahead_kb: int = defaults.READ_AHEAD_KB
    pending_timeout: float | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    fuse_options: list[str] = field(default_factory=list)
    # where the daemon's log lines go: a file (--log-file), else stderr (foreground,
    # systemd's journal), else the system log once a background daemon detaches
    log_file: str | None = None
    # what a successful close() promises: "disk" (survives a power cut: fdatasync per
    # object) or "process" (survives the daemon; fsync() makes it survive a power cut)
    durability: str = "disk"
    log_operations: bool = False  # -v: every FUSE operation at DEBUG level
    # the live mount's device (`note_mount`): no reload opens a source on it
    mount_dev: int | None = None
    log_destination: str = "stderr"

    @property
    def durable(self) -> bool:
        """Whether each stored object is on disk before close() returns."""
        return self.durability == "disk"


def note_mount(config: MountConfig) -> None:
    """Once the mount is live (blocking: a stat of it, which this daemon answers): its
    device, which no reload may open a source on (`config.mount_dev`), and its
    read-ahead window (`set_read_ahead`)."""
    try:
        config.mount_dev = os.stat(config.mountpoint).st_dev
    except OSError as e:
        log.warning("cannot stat the mountpoint %s: %s", config.mountpoint, e)
        return
    set_read_ahead(config.mountpoint, config.read_ahead_kb)


def set_read_ahead(mountpoint: str, kib: int) -> bool:
    """Raise the kernel's read-ahead window of this mount (its bdi in sysfs; root only).

    The kernel reads a FUSE file in requests of at most the read-ahead window
    (128 KiB by default): a 512 KiB chunk file costs four round trips through
    the daemon. A window of a few chunk files makes it one. Without permission
    (not root) the default stays and nothing else changes.
    """
    if kib <= 0:
        return False
    try:
        dev = os.stat(mountpoint).st_dev
        path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(path, "w") as f:
            f.write(str(kib))
    except OSError as e:  # (root is expected to set it: a read-only /sys, a container)
        (log.warning if os.geteuid() == 0 else log.debug)("read-ahead window left at the kernel's default: %s", e)
        return False
    log.debug("read-ahead window %d KiB (%s)", kib, path)
    return True


def sd_notify(message: str) -> None:
    """Send a systemd notification if NOTIFY_SOCKET is set (no libsystemd needed)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


ZARR_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zmetadata")
GC_YOUNG_THRESHOLD = 10_000  # allocations between young-generation collections (Python: 700)


def check_mountpoint(mountpoint: str) -> str | None:
    """Refuse a mountpoint that cannot be used, saying why and what to do; return a
    warning to show if it can be used but something is off (a non-empty directory).

    A mountpoint is looked up in the mount table as the table spells it (symbolic links
    followed: one to a live mount had a second daemon stacked over the first) before it
    is stat'ed, so a hung daemon's mount is refused as busy, not waited for."""
    from zfuse.mounts import find_mount

    entry = find_mount(mountpoint)
    if entry is not None:
        if _is_stale(entry.mountpoint):
            raise SystemExit(
                f"zfuse: mountpoint {mountpoint} is a stale mount: the zfuse daemon that served it "
                f"is gone (Transport endpoint is not connected); clear it with: "
                f"zfuse umount -z {mountpoint}")
        raise SystemExit(f"zfuse: mountpoint {mountpoint} is busy (already a mount point"
                         f"{'' if entry.mountpoint == os.path.abspath(mountpoint) else ': ' + entry.mountpoint})")
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise SystemExit(f"zfuse: mountpoint {mountpoint} does not exist (create it with mkdir)") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise SystemExit(
                f"zfuse: mountpoint {mountpoint} is a stale mount: the zfuse daemon that served it "
                f"is gone ({e.strerror}); clear it with: zfuse umount -z {mountpoint}") from None
        raise SystemExit(f"zfuse: cannot use mountpoint {mountpoint}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SystemExit(f"zfuse: mountpoint {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        if _is_stale(mountpoint):
            raise SystemExit(
                f"zfuse: mountpoint {mountpoint} is a stale mount: the zfuse daemon that served it "
                f"is gone (Transport endpoint is not connected); clear it with: "
                f"zfuse umount -z {mountpoint}")
        raise SystemExit(f"zfuse: mountpoint {mountpoint} is busy (already a mount point)")
    if not os.path.exists("/dev/fuse"):
        raise SystemExit("zfuse: /dev/fuse is missing (is the fuse kernel module loaded?)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise SystemExit(_fuse_device_refusal())
    try:
        hidden = len(os.listdir(mountpoint))
    except OSError:
        hidden = 0
    if hidden:
        return (f"mountpoint {mountpoint} is not empty: its {hidden} "
                f"entr{'y is' if hidden == 1 else 'ies are'} hidden while zfuse is mounted there")
    return None


def _fuse_device_refusal() -> str:
    """Why this user cannot mount: /dev/fuse is not theirs to open (libfuse says only
    "fuse_session_mount failed"), and what to do."""
    import grp
    import pwd

    st = os.stat("/dev/fuse")

    def name(lookup: Any, ident: int) -> str:
        try:
            return str(lookup(ident)[0])
        except KeyError:
            return str(ident)

    return (f"zfuse: /dev/fuse is not readable and writable by uid {os.geteuid()} (it is "
            f"{stat.filemode(st.st_mode)} {name(pwd.getpwuid, st.st_uid)}:{name(grp.getgrgid, st.st_gid)}), "
            "so no FUSE filesystem can be mounted by this user: Debian makes it crw-rw-rw- "
            "(ask an administrator: a udev rule KERNEL==\"fuse\", MODE=\"0666\" keeps it so; chmod 0666 "
            "/dev/fuse until the next boot); in a container, pass --device /dev/fuse")


def mounted_elsewhere(sources: list[str]) -> str | None:
    """A warning if zfuse already mounts the same source(s) somewhere: the two daemons
    keep their own caches and listings, so neither sees the other's writes until a
    reload. None if not (or the mount table cannot be read)."""
    from zfuse.mounts import zfuse_mounts

    shown = fsname_of(sources)
    try:
        others = [e.mountpoint for e in zfuse_mounts() if e.source == shown]
    except OSError:
        return None
    if not others:
        return None
    return (f"{shown} is already mounted at {', '.join(others)}: the mounts do not see each "
            "other's writes until a reload (zfuse reload MOUNTPOINT, or -o metadata_ttl=S)")


def _is_stale(mountpoint: str) -> bool:
    """True if a FUSE mount's daemon is gone (the kernel may still answer stat() of
    its root from cache; statfs always asks the daemon). A hung daemon is not stale."""
    from zfuse.mounts import MountNotResponding, call_with_timeout

    try:
        call_with_timeout(os.statvfs, mountpoint, timeout=2.0)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    except MountNotResponding:
        return False
    return False


def _zipped(path: str) -> bool:
    """Whether a file is a zip archive (zarr's ZipStore, OME-Zarr's .ozx); never blocks
    on a FIFO or device (only regular files are looked into)."""
    import stat
    import zipfile

    try:
        return stat.S_ISREG(os.stat(path).st_mode) and zipfile.is_zipfile(path)
    except OSError:
        return False


#: parent directories a mounted level's OME-Zarr image is looked for in (ngff-zarr's
#: levels are `img.zarr/scale0/image`: two up)
LEVEL_ANCESTORS = 3


def read_ahead_hint(config: MountConfig) -> str | None:
    """A warning when `-o read_ahead_kb=` asks for another window than the default and
    this process cannot set it (the kernel's sysfs file is root's): it had been ignored
    without a word."""
    if config.read_ahead_kb in (0, defaults.READ_AHEAD_KB) or os.geteuid() == 0:
        return None
    return (f"read_ahead_kb={config.read_ahead_kb} needs root (the kernel's setting is root's): the "
            "mount keeps the kernel's default window (128 KiB)")


def unwritable_hint(config: MountConfig) -> str | None:
    """A warning when a read-write mount's local source directory is one this process may
    not write (another user's store, a read-only filesystem): each write and deletion
    in it is then refused at open(), unlink() or rename() (`ChunkSource.write_refusal`);
    None otherwise."""
    if config.read_only:
        return None
    for source in config.sources:
        path = local_path(source)
        if path is None or not os.path.isdir(path):
            continue
        if os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
            continue
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            why, code = "is on a read-only filesystem", "EROFS"
        else:
            why, code = f"is not writable by uid {os.geteuid()}", "EACCES"
        return (f"{source} {why}: writes and deletions through the mount fail with {code} where its "
                "directories are not writable; mount with -o ro to show it read-only")
    return None


def level_hint(sources: list[str]) -> str | None:
    """A hint when the one local source is a level of an OME-Zarr image (`img.zarr/0`,
    ngff-zarr's `img.zarr/scale0/image`, or its `scale0`): its axes, scales and channel
    names are the image group's, which zfuse does not read for a mount of the level (the
    store is the level's directory). Read from the metadata documents of at most
    LEVEL_ANCESTORS parent directories alone (each to the metadata bound); None when it
    is no such level."""
    if len(sources) != 1 or local_path(sources[0]) is None:
        return None
    path = os.path.abspath(local_path(sources[0]) or "").rstrip("/")
    if not any(os.path.isfile(os.path.join(path, n)) for n in ("zarr.json", ".zarray", ".zgroup")):
        return None
    ancestor, rel = path, ""
    for _ in range(LEVEL_ANCESTORS):
        ancestor, name = os.path.split(ancestor)
        if not name:
            return None
        rel = f"{name}/{rel}" if rel else name
        for paths in _multiscale_dataset_paths(ancestor):
            if rel in paths or any(p.startswith(rel + "/") for p in paths):
                return (f"{sources[0]} is level {rel!r} of the OME-Zarr image {ancestor}: its axes, scales and "
                        "channel names are the image's, not shown for the level alone; mount the image "
                        f"({ancestor}) to have them")
    return None


def _multiscale_dataset_paths(directory: str) -> list[list[str]]:
    """The dataset paths of each OME-Zarr multiscale in the group metadata of `directory`
    (zarr.json, or v2's .zattrs), read to the metadata bound; [] if none."""
    from zfuse.ext.metadata_json import MAX_METADATA_BYTES, load_metadata
    from zfuse.view.ome_zarr import MULTISCALE_LEVELS_MAX, MULTISCALES_MAX, multiscale_list

    found: list[list[str]] = []
    for doc_name in ("zarr.json", ".zattrs"):
        doc_path = os.path.join(directory, doc_name)
        try:
            if not os.path.isfile(doc_path) or os.path.getsize(doc_path) > MAX_METADATA_BYTES:
                continue
            with open(doc_path, "rb") as f:
                doc = load_metadata(f.read(MAX_METADATA_BYTES + 1), doc_name)
        except (OSError, ValueError):
            continue
        attrs = doc.get("attributes", {}) if doc_name == "zarr.json" else doc
        for ms in multiscale_list(attrs)[:MULTISCALES_MAX]:
            datasets = ms.get("datasets") if isinstance(ms, dict) else None
            paths = [d.get("path") for d in datasets[:MULTISCALE_LEVELS_MAX] if isinstance(d, dict)] if isinstance(datasets, list) else []
            found.append([p.strip("/") for p in paths if isinstance(p, str)])
    return found


def check_sources(sources: list[str]) -> None:
    """Refuse a local source that cannot be a Zarr store, naming what it is instead
    (zarr-python's own errors name internal store wrappers, or the wrong thing)."""
    from zfuse.ext.concat import is_concat_description

    for source in sources:
        path = local_path(source)
        if path is None:
            continue  # remote: only opening it can tell
        try:
            os.stat(path)
        except OSError as e:  # (not "no such file" for a store this user may not reach)
            raise SystemExit(f"zfuse: cannot open {source}: {_unreachable(path, e)}") from None
        if not os.path.isdir(path):
            if is_concat_description(path):
                continue
            if _zipped(path):
                raise SystemExit(
                    f"zfuse: {source} is a zipped Zarr store (a .zip file): zfuse mounts Zarr directories and "
                    f"URLs; unzip it (unzip {source} -d DIR) and mount the directory")
            raise SystemExit(
                f"zfuse: {source} is a file, not a Zarr store: a SOURCE is a Zarr directory, "
                "a URL, or a concat description file (written by `zfuse concat`)")
        if not os.access(path, os.R_OK | os.X_OK):
            raise SystemExit(f"zfuse: cannot open {source}: permission denied (the directory is not "
                             f"readable by uid {os.geteuid()})")
        present = [n for n in ZARR_METADATA_FILES if os.path.lexists(os.path.join(path, n))]
        for name in present:  # (a FIFO had been "no Zarr metadata found", after six warnings)
            kind = _file_kind(os.path.join(path, name))
            if kind is not None:
                raise SystemExit(f"zfuse: {os.path.join(source, name)} is {kind}, not a regular file: no Zarr "
                                 "metadata is read from it")
        if present:
            continue
        message = f"zfuse: no Zarr metadata (zarr.json, .zarray or .zgroup) found at {source}"
        below = _zarr_children(path)
        if below:
            shown = ", ".join(os.path.join(source, name) for name in below[:3])
            message += f"; Zarr data one level down: {shown}{', ...' if len(below) > 3 else ''}"
        raise SystemExit(message)


def _file_kind(path: str) -> str | None:
    """What `path` (links followed) is when it is no regular file: "a FIFO", ...; None
    for a regular file, or one that cannot be looked at (opening it says why)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
    return next((said for test, said in kinds if test(mode)), None)


def _unreachable(path: str, error: OSError) -> str:
    """What a failed stat of `path` means: its own error, and for a permission, the
    first directory on the way that this user may not enter."""
    if error.errno != errno.EACCES:
        return error.strerror.lower() if error.strerror else str(error)
    parts = os.path.abspath(path).split("/")
    for depth in range(2, len(parts)):
        above = "/".join(parts[:depth]) or "/"
        if not os.access(above, os.X_OK):
            return f"permission denied: uid {os.geteuid()} may not enter {above}"
    return "permission denied"


def check_not_nested(mountpoint: str, sources: list[str], written: dict[str, str | None] | None = None) -> None:
    """Refuse a mount whose daemon would read its own mount: a mountpoint that is a local
    source, lies inside one (a store's directory, or one a concat description names), or
    holds one (a description file there too); compared by the directories' identities
    (device and inode), so a bind mount or a link of the store is the store. A source
    served by another zfuse mount counts with that mount's own sources (two daemons
    inside each other's stores). A store with its own mountpoint inside showed itself in
    itself at every reload, and a read through it, or through a link in the store
    leading into it, waited for an answer only that read could give: readers unkillable,
    `zfuse umount` busy, until the FUSE connection was aborted. `written`: what else the
    daemon writes ({"-o cache=": DIR, "the log file": PATH}), refused inside the mount
    too (each write would go through the daemon itself)."""
    from zfuse.ext.concat import description_sources

    mount_id = _identity(mountpoint)
    above_mount = _identities_up(mountpoint)
    for what, path in (written or {}).items():
        if path is not None and mount_id in _identities_up(path):
            raise SystemExit(f"zfuse: {what} {path} is inside the mountpoint {mountpoint}: the daemon would "
                             "write it through its own mount; put it elsewhere")

    def check(each: str, is_file: bool, served: str = "") -> None:
        ident = _identity(each)
        if not is_file and ident is not None and ident == mount_id:
            where = "is"
        elif mount_id is not None and mount_id in _identities_up(each):
            where = "lies inside"
        elif not is_file and ident is not None and ident in above_mount:
            where = "holds"
        else:
            return
        raise SystemExit(f"zfuse: {each}{served} {where} the mountpoint {mountpoint}: the daemon would read "
                         "its own mount (and wait for itself for ever); mount it on a directory outside the store")

    try:  # (read once: a description may name thousands of stores)
        from zfuse.mounts import zfuse_mounts

        serving = zfuse_mounts()
    except OSError:
        serving = []
    for source in sources:
        path = local_path(source)
        if path is None:
            continue
        named = [(path, os.path.isfile(path))]
        named += [(p, os.path.isfile(p)) for s in description_sources(path) if (p := local_path(s)) is not None]
        for each, is_file in named:
            check(each, is_file)
            for served_by, its_source in _zfuse_mounts_serving(each, serving):
                check(its_source, os.path.isfile(its_source), f" (the store of the zfuse mount {served_by}, "
                                                              f"which serves {each})")


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _identities_up(path: str) -> list[tuple[int, int]]:
    """(device, inode) of `path` and of each directory above it, those that exist."""
    real = os.path.realpath(path)
    found = []
    while True:
        ident = _identity(real)
        if ident is not None:
            found.append(ident)
        if real == "/":
            return found
        real = os.path.dirname(real)


def _zfuse_mounts_serving(path: str, entries: list[Any]) -> list[tuple[str, str]]:
    """(mountpoint, local source) of each zfuse mount of `entries` (the mount table's)
    `path` lies in: the sources its `.zfuse/mount` lists (a concatenation's description
    expanded to the stores it names), else, for a daemon that does not answer in time,
    those its fsname spells."""
    from zfuse.ext.concat import description_sources
    from zfuse.mounts import MOUNT_FILE, MountNotResponding, read_json

    if not entries:
        return []
    real = os.path.realpath(path)
    out = []
    for entry in entries:
        if not (real == entry.mountpoint or real.startswith(entry.mountpoint.rstrip("/") + "/")):
            continue
        try:
            sources = [str(s) for s in read_json(entry.mountpoint, MOUNT_FILE, timeout=2.0).get("sources") or []]
        except (OSError, ValueError, AttributeError, MountNotResponding):
            sources = [urllib.parse.unquote(shown) for shown in entry.source.replace("\\,", ",").split("+")]
        for source in sources:
            local = local_path(source)
            if local is not None:
                out.append((entry.mountpoint, local))
                out += [(entry.mountpoint, p) for d in description_sources(local) if (p := local_path(d)) is not None]
    return out


def _zarr_children(path: str) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [n for n in names
            if any(os.path.exists(os.path.join(path, n, m)) for m in ZARR_METADATA_FILES)]


def fsname_of(sources: list[str]) -> str:
    """What `mount`/`findmnt` show as the mount's source: the source path or URL
    (credentials removed: /proc/mounts is world-readable). libfuse splits options
    at commas (escaped with a backslash) and pyfuse3 passes them as ASCII."""
    shown = []
    for source in sources:
        if "://" in source:
            parts = urllib.parse.urlsplit(source)
            if parts.username or parts.password:
                host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
                source = parts._replace(netloc=host).geturl()
        shown.append(source)
    text = "+".join(shown)
    text = urllib.parse.quote(text, safe="".join(chr(c) for c in range(0x21, 0x7F)) + " ")
    return text.replace("\\", "\\\\").replace(",", "\\,")


def serve(
    config: MountConfig,
    view: View,
    stats: Stats,
    on_ready: Callable[[], None] | None = None,
    reload: Callable[[], View] | None = None,
) -> None:
    """Mount `view` at the mountpoint and serve until unmounted or signalled."""
    import pyfuse3
    import trio

    from zfuse import __version__
    from zfuse.fuse_ops import ZfuseOperations

    state: dict[str, Any] = {
        "pid": os.getpid(),
        "sources": list(config.sources),
        "concat_axis": config.concat_axis,
        "mountpoint": config.mountpoint,
        "read_only": config.read_only,
        "started": time.time(),
        "reloads": 0,
        "last_reload": None,
        "last_reload_error": None,
        "version": __version__,
    }

    def mount_info() -> dict[str, Any]:
        # no uptime here: the content changes only when something happens (status
        # computes the uptime from `started`)
        return {**state, "log": config.log_destination}

    def reload_and_record() -> View:
        assert reload is not None
        try:
            new_view = reload()
        except Exception as e:
            state["last_reload_error"] = f"{type(e).__name__}: {e}"
            raise
        state["last_reload_error"] = None
        return new_view

    ops = ZfuseOperations(view, read_only=config.read_only, max_threads=config.max_threads, stats=stats,
                          replace_window=config.replace_window, pending_timeout=config.pending_timeout,
                          durable=config.durable, reload=reload_and_record if reload is not None else None,
                          mount_info=mount_info)
    if config.log_operations:
        from zfuse.fuse_ops import log_operations

        log_operations(ops)
    options = {f"fsname={fsname_of(config.sources)}", "subtype=zfuse", "default_permissions",
               *config.fuse_options}
    if config.read_only:
        options.add("ro")
    if config.allow_other:
        options.add("allow_other")
    pyfuse3.init(ops, config.mountpoint, options)
    unmounted = False
    try:
        log.info("mounted %s at %s", " ".join(config.sources), config.mountpoint)
        if on_ready is not None:
            on_ready()
        sd_notify("READY=1\nSTATUS=mounted " + config.mountpoint)
        # A listing creates an inode, an entry and its attributes per file (100,000 in
        # `ls -lR` of a big array): with young collections every 700 allocations, the
        # cyclic GC took a third of the daemon's listing CPU (benchmarks/README.md).
        gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
        trio.run(_main, ops, config, state)
        sd_notify("STOPPING=1")
    finally:
        try:
            pyfuse3.close(unmount=True)
            unmounted = True
        finally:
            log.info("unmounted %s%s", config.mountpoint, "" if unmounted else " (failed)")


async def _main(ops: Any, config: MountConfig, state: dict[str, Any]) -> None:
    import pyfuse3
    import trio

    async with trio.open_nursery() as nursery:
        ops.nursery = nursery
        nursery.start_soon(_watch_signals, ops, state)
        nursery.start_soon(_tick, ops)
        # stat of our own mountpoint needs this loop serving: a worker thread
        nursery.start_soon(partial(trio.to_thread.run_sync, note_mount, config))
        if config.metadata_ttl:
            nursery.start_soon(_refresh_every, ops, config.metadata_ttl, state)
        await pyfuse3.main()
        await ops.fs.shutdown()
        nursery.cancel_scope.cancel()


async def _reload(ops: Any, state: dict[str, Any]) -> None:
    """Reload, then count it: `zfuse reload` waits for `reloads` in `.zfuse/mount` to grow."""
    try:
        await ops.fs.refresh()
    except Exception as e:  # a failed reload never takes the mount down
        log.exception("reload failed, serving on: %s", e)
        state["last_reload_error"] = str(e)
    state["reloads"] += 1
    state["last_reload"] = time.time()


async def _tick(ops: Any) -> None:
    """Deferred deletions and abandoned pending files, when they fall due."""
    import trio

    while True:
        # the deadlines are on the writes' clock (time.monotonic): never trio.current_time()
        due = ops.fs.writes.due_in()
        await trio.sleep(0.25 if due is None else min(max(due, 0.02), 0.25))
        try:
            await ops.fs.tick()
        except Exception:  # already logged and journaled; keep ticking
            pass


async def _watch_signals(ops: Any, state: dict[str, Any]) -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                log.info("SIGHUP: reloading metadata and dropping caches")
                await _reload(ops, state)
                continue
            log.info("%s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


async def _refresh_every(ops: Any, seconds: float, state: dict[str, Any]) -> None:
    """Reload every `seconds`, and at least RELOAD_SHARE times as long apart as a reload
    takes (a slow store's reloads space out: at most a fifth of the time reloading)."""
    import trio

    took = 0.0
    while True:
        await trio.sleep(max(seconds, RELOAD_SHARE * took))
        started = time.monotonic()
        await _reload(ops, state)
        took = time.monotonic() - started


RELOAD_SHARE = 5  # reloads at least this many times their duration apart
