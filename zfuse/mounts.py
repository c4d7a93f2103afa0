"""Running zfuse mounts, for `zfuse status`, `zfuse reload` and `zfuse umount`.

Mounts are found in the kernel's mount table (`/proc/self/mountinfo`, type
`fuse.zfuse`, source = the mounted store). Each daemon describes itself in its
mount's `.zfuse/mount` (JSON: pid, sources, concat_axis, mountpoint,
read_only, started, reloads, last_reload, last_reload_error, log, version) next to its
counters in `.zfuse/stats`; reading those goes through the mount, so a hung
daemon is reported as unresponsive after a timeout, and a dead one (the kernel
answers ENOTCONN) as stale.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

FSTYPE = "fuse.zfuse"
MOUNT_FILE = (".zfuse", "mount")
ERRORS_FILE = (".zfuse", "errors")
RECENT_ERRORS = 5  # lines of .zfuse/errors `zfuse status` shows
STATS_FILE = (".zfuse", "stats")
T = TypeVar("T")


@dataclass
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mountpoint: str
    fstype: str
    source: str
    options: str  # per-mount options (rw/ro, nosuid, ...)
    super_options: str  # filesystem options (user_id=, allow_other, ...)

    @property
    def owner_uid(self) -> int | None:
        """The uid of the user who mounted it (a FUSE mount's `user_id=`), if said."""
        owner = re.search(r"(?:^|,)user_id=(\d+)", self.super_options)
        return int(owner.group(1)) if owner else None


def _unescape(field: str) -> str:
    # the kernel writes space, tab, newline and backslash as \\ooo octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table(path: str = "/proc/self/mountinfo") -> list[MountEntry]:
    entries = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            entries.append(MountEntry(
                mountpoint=_unescape(fields[4]), options=fields[5], fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]), super_options=fields[sep + 3] if len(fields) > sep + 3 else "",
            ))
    return entries


#: symbolic links `normalise` follows at most (the kernel's own bound)
LINKS_FOLLOWED = 40


def absolute(path: str) -> str:
    """`path` made absolute as the kernel would walk it: `.` and repeated slashes dropped,
    `..` kept (after a symbolic link it is the link target's parent: abspath's lexical
    `a/..` had named another directory than the kernel's)."""
    joined = os.path.join(os.getcwd(), os.path.expanduser(path))
    parts = [p for p in joined.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def normalise(mountpoint: str, table: list[MountEntry] | None = None) -> str:
    """The absolute path as the mount table spells it: its directory resolved, then the
    path itself followed while it is a symbolic link, never stat'ing a path the mount
    table holds (realpath lstat'ed the mountpoint, which asks its daemon: `zfuse umount`
    and `zfuse reload` of a hung daemon's mount hung with it; a stale one keeps its name).
    `table`: the mount table, read already (read here if None)."""
    mounted = {entry.mountpoint for entry in (mount_table() if table is None else table)}
    # absolute, but not normalised: `..` after a linked directory is the link target's
    # parent, as the kernel resolves it, not the link's
    path = os.path.join(os.getcwd(), mountpoint)
    return _resolve("/" + path.lstrip("/"), mounted, [LINKS_FOLLOWED])  # ("//x" is "/x" on Linux)


def _resolve(path: str, mounted: set[str], links_left: list[int]) -> str:
    """`path` resolved as the kernel resolves it, each component in turn, never stat'ing
    one the mount table holds (`normalise`); `links_left`: links still to follow."""
    while True:
        parent, name = os.path.split(path)
        if parent == path:
            return path  # the root
        if name in ("", "."):
            path = parent
            continue
        if name == "..":
            return os.path.dirname(_resolve(parent, mounted, links_left))
        parent = _resolve(parent, mounted, links_left)
        path = os.path.join(parent, name)
        if path in mounted or links_left[0] <= 0:
            return path
        try:
            target = os.readlink(path)  # (a link is no mount: its own directory's, no daemon asked)
        except OSError:
            return path  # not a link (or nothing there)
        links_left[0] -= 1
        path = "/" + os.path.join(parent, target).lstrip("/")


def find_mount(mountpoint: str) -> MountEntry | None:
    """The mount at `mountpoint` (the last one: mounts stack), or None."""
    table = mount_table()  # (read once: a table of thousands of mounts costs its parsing)
    target = normalise(mountpoint, table)
    found = None
    for entry in table:
        if entry.mountpoint == target:
            found = entry
    return found


def zfuse_mounts(table: list[MountEntry] | None = None) -> list[MountEntry]:
    """The zfuse mounts of the mount table (`table`: read already; read here if None)."""
    return [e for e in (mount_table() if table is None else table) if e.fstype == FSTYPE]


class MountNotResponding(Exception):
    """Reading a file of the mount did not finish in time (a hung daemon or store)."""


def call_with_timeout(fn: Callable[..., T], *args: Any, timeout: float) -> T:
    """fn(*args) in a helper thread, so that a hung FUSE daemon cannot hang the caller
    (the thread is a daemon thread: it dies with the process)."""
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as e:
            result["error"] = e

    thread = threading.Thread(target=call, daemon=True, name="zfuse-probe")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise MountNotResponding(f"{' '.join(map(str, args))}: no answer after {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


#: bytes a mount's `.zfuse/` JSON file is read up to (a few KB from zfuse's daemon; any
#: FUSE filesystem may call itself zfuse in the mount table, and answer without end)
ZFUSE_FILE_MAX = 4 << 20


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(ZFUSE_FILE_MAX + 1)
    if len(data) > ZFUSE_FILE_MAX:
        raise OSError(errno.EFBIG, f"{path}: more than {ZFUSE_FILE_MAX} bytes: not read further")
    return data


def read_json(mountpoint: str, parts: tuple[str, ...], timeout: float) -> dict[str, Any]:
    """A JSON file inside a mount (`.zfuse/mount`, `.zfuse/stats`), read with a timeout."""
    return json.loads(call_with_timeout(_read_bytes, os.path.join(mountpoint, *parts), timeout=timeout))


def describe_mount(entry: MountEntry, timeout: float = 5.0) -> dict[str, Any]:
    """What `zfuse status` shows for one mount: the kernel's view plus the daemon's."""
    item: dict[str, Any] = {
        "mountpoint": entry.mountpoint,
        "source": entry.source,
        "read_only": entry.options.split(",")[0] == "ro",
    }
    if entry.owner_uid is not None:
        item["uid"] = entry.owner_uid
    try:
        info = read_json(entry.mountpoint, MOUNT_FILE, timeout)
        stats = read_json(entry.mountpoint, STATS_FILE, timeout)
    except MountNotResponding as e:
        item.update(state="unresponsive", problem=str(e))
        return item
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            item.update(state="stale", problem=(
                f"the daemon is gone ({e.strerror}); clear it with: zfuse umount -z {entry.mountpoint}"))
        elif e.errno in (errno.EACCES, errno.EPERM):
            item.update(state="unreadable", problem=(
                f"{e.strerror}: mounted by uid {item.get('uid', '?')} without allow_other"))
        elif e.errno == errno.ENOENT:
            item.update(state="unknown", problem="no .zfuse/mount: a daemon older than this zfuse")
        else:
            item.update(state="error", problem=f"{e.strerror or e}")
        return item
    except ValueError as e:
        item.update(state="error", problem=f"unreadable .zfuse/mount: {e}")
        return item
    item["state"] = "running"
    for key in ("pid", "sources", "concat_axis", "read_only", "started", "reloads",
                "last_reload", "last_reload_error", "log", "version"):
        if key in info:
            item[key] = info[key]
    item["uptime_s"] = round(time.time() - float(info.get("started", time.time())), 3)
    item["stats"] = {k: v for k, v in stats.items() if k != "uptime_s"}
    try:  # refusals, files closed incomplete (pending) and store errors, newest last
        journal = call_with_timeout(_read_bytes, os.path.join(entry.mountpoint, *ERRORS_FILE), timeout=timeout)
        item["recent_errors"] = journal.decode("utf-8", "replace").splitlines()[-RECENT_ERRORS:]
    except (OSError, MountNotResponding):
        item["recent_errors"] = []
    return item


def status(mountpoints: list[str] | None = None, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every zfuse mount (or the given ones, which must be zfuse mounts)."""
    table = mount_table()
    entries = zfuse_mounts(table)
    if mountpoints:
        wanted = [normalise(m, table) for m in mountpoints]
        by_path = {e.mountpoint: e for e in entries}
        missing = [m for m, w in zip(mountpoints, wanted, strict=True) if w not in by_path]
        if missing:
            raise NotMounted(missing[0])
        entries = [by_path[w] for w in wanted]
    return [describe_mount(e, timeout) for e in entries]


class NotMounted(Exception):
    """The path is not a zfuse mount."""


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_status(items: list[dict[str, Any]]) -> str:
    if not items:
        return "no zfuse mounts"
    lines = []
    for item in items:
        mode = "read-only" if item.get("read_only") else "read-write"
        if item["state"] != "running":
            lines.append(f"{item['mountpoint']}  {item['state'].upper()}  source {item['source']}")
            lines.append(f"  {item['problem']}")
            continue
        lines.append(f"{item['mountpoint']}  pid {item['pid']}  {mode}  up {_duration(item['uptime_s'])}")
        axis = item.get("concat_axis")
        joined = " ".join(item.get("sources", [item["source"]]))
        lines.append(f"  source  {joined}" + (f"  (concatenated along axis {axis})" if axis is not None else ""))
        lines.append(f"  log     {item.get('log', '?')}")
        reloads = f"  reloads {item.get('reloads', 0)}"
        if item.get("last_reload"):
            reloads += f", last {_duration(time.time() - item['last_reload'])} ago"
        if item.get("last_reload_error"):
            reloads += f", FAILED: {item['last_reload_error']}"
        lines.append(reloads)
        stats = item.get("stats", {})
        store = store_health(stats)
        if store:
            lines.append(f"  store   {store}")
        counters = "  ".join(f"{k}={_number(v)}" for k, v in sorted(stats.items()))
        lines.append(f"  stats   {counters or '-'}")
        for line in item.get("recent_errors", []):
            lines.append(f"  recent  {line}")
    return "\n".join(lines)


def store_health(stats: dict[str, Any]) -> str:
    """One line on the store's requests, if any is under way or failed: how many are in
    flight and how long the oldest has waited, timeouts, other errors ('' if all is
    quiet)."""
    flying = int(stats.get("store_requests_in_flight", 0))
    timeouts = int(stats.get("store_timeouts", 0))
    fast = int(stats.get("store_failed_fast", 0))
    errors = int(stats.get("store_errors", 0))
    if not (flying or timeouts or errors):
        return ""
    parts = [f"{flying} request{'s' if flying != 1 else ''} in flight"
             + (f" (oldest {_number(float(stats.get('store_oldest_request_s', 0)))} s)" if flying else "")]
    parts.append(f"{timeouts} timed out" + (f" ({fast} more failed at once)" if fast else ""))
    parts.append(f"{errors} other error{'s' if errors != 1 else ''}")
    return ", ".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


class ReloadError(Exception):
    """`zfuse reload` could not reload, or the daemon reported a failed reload."""


def reload_mount(mountpoint: str, timeout: float = 60.0) -> dict[str, Any]:
    """SIGHUP the daemon serving `mountpoint`; return its `.zfuse/mount` once its
    reload counter has grown (the reload finished). Raise ReloadError otherwise."""
    entry = find_mount(mountpoint)
    if entry is None or entry.fstype != FSTYPE:
        raise NotMounted(mountpoint)
    try:
        before = read_json(entry.mountpoint, MOUNT_FILE, min(timeout, 10.0))
    except MountNotResponding as e:
        raise ReloadError(f"the daemon does not answer: {e}") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise ReloadError(f"{mountpoint} is a stale mount: its daemon is gone; "
                              f"clear it with: zfuse umount -z {mountpoint}") from None
        raise ReloadError(f"cannot read {os.path.join(entry.mountpoint, *MOUNT_FILE)}: "
                          f"{e.strerror or e}") from None
    pid, count = int(before["pid"]), int(before["reloads"])
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise ReloadError(f"the daemon's process {pid} does not exist here "
                          "(another PID namespace?)") from None
    except PermissionError:
        raise ReloadError(f"not allowed to signal the daemon (pid {pid}): it belongs to "
                          "another user; run zfuse reload as that user or as root") from None
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        after = read_json(entry.mountpoint, MOUNT_FILE, max(0.1, deadline - time.monotonic()))
        if int(after["reloads"]) > count:
            if after.get("last_reload_error"):
                raise ReloadError(f"the reload failed, the mount keeps showing the previous "
                                  f"state: {after['last_reload_error']}")
            return after
        if time.monotonic() > deadline:
            raise ReloadError(f"sent SIGHUP to pid {pid}, but no reload finished within "
                              f"{timeout:g} s (a slow store? see its log: {after.get('log')})")
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
