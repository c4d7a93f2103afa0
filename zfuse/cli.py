"""The `zfuse` command: mount, umount, status, reload, info, concat.

`zfuse mount SOURCE MOUNTPOINT` returns once the mount is live (the daemon
keeps running in the background) or exits non-zero with a clear message.
`zfuse SOURCE MOUNTPOINT -o opts` (no subcommand) is the form `mount.fuse3`
uses for `mount -t fuse.zfuse` and /etc/fstab.

Every subcommand and option has help text and an example (`zfuse CMD -h`);
the man page `zfuse.1` is generated from the same parser (zfuse/manpage.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from zfuse import mount_options
from zfuse.daemon import MountConfig
from zfuse.daemonize import describe_open_error, run_foreground, spawn_daemon
from zfuse.mount_options import MOUNT_OPTIONS, apply_mount_options
from zfuse.source_paths import local_path

__all__ = ["MOUNT_OPTIONS", "apply_mount_options", "build_parser", "main", "parse_size"]

SUBCOMMANDS = {"mount", "umount", "unmount", "status", "reload", "info", "concat"}

_MOUNT_EPILOG = """\
-o options (comma-separated; also in /etc/fstab and mount -t fuse.zfuse):
{options}
  libfuse's own options (allow_root, fsname=, noatime, ...) are passed to FUSE
  unchanged; any other name is refused.

logging:
  In the foreground (-f) the daemon logs to stderr; under systemd (zfuse@.service
  runs `zfuse mount -f`) that is the journal: journalctl -u zfuse@NAME.
  In the background it logs to --log-file PATH (or -o log_file=PATH) if given,
  else to the system log (/dev/log) if there is one. A refused write (close()
  fails with EINVAL) is logged there with its reason.

examples:
  zfuse mount data.zarr /mnt/view
  zfuse mount -o ro,cache_size=1G --log-file ~/zfuse.log s3://bucket/a.zarr /mnt/a
  zfuse mount --concat 0 a.zarr b.zarr /mnt/ab
  mount -t fuse.zfuse /data/a.zarr /mnt/a -o ro,allow_other,log_file=/var/log/zfuse-a.log
"""


def parse_size(text: str) -> int:
    """'256M', '1G', '1048576' -> bytes (an argparse type)."""
    try:
        return mount_options.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- the parser -------------------------------------------------------------------
class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def _add_mount_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="Zarr store: a directory, s3://, gs://, https:// URL, or a concat "
                        "description file (several SOURCEs with --concat)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing directory (best empty)")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground, logging to stderr (what systemd runs)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="comma-separated mount options, listed below")
    p.add_argument("--cache-size", type=parse_size, default=None, metavar="SIZE",
                   help="decoded-chunk cache, e.g. 512M (default 256M); same as -o cache_size=")
    p.add_argument("--all-chunks", action="store_true",
                   help="list every grid position; missing chunks read as the fill value")
    p.add_argument("--crop-edges", action="store_true",
                   help="edge chunks cropped to the array bounds (default: full chunk shape)")
    p.add_argument("--concat", type=int, default=None, metavar="AXIS",
                   help="show the SOURCEs concatenated along AXIS")
    p.add_argument("--log-file", default=None, metavar="PATH",
                   help="append the daemon's log to PATH, readable without root "
                        "(same as -o log_file=PATH)")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log every FUSE operation (debug level)")
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; `zfuse CMD -h` and the man page come from it."""
    parser = argparse.ArgumentParser(
        prog="zfuse", formatter_class=_Formatter,
        description="Mount a Zarr store so that every chunk is a standalone TIFF file.",
        epilog="zfuse SOURCE MOUNTPOINT -o OPTIONS   is the form mount -t fuse.zfuse and "
               "/etc/fstab use.\n"
               "Run `zfuse COMMAND -h` for a command's options and examples; "
               "`man zfuse` for the manual.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def add(name: str, summary: str, description: str, examples: list[str],
            handler: Callable[..., int], epilog: str = "") -> argparse.ArgumentParser:
        text = epilog or "examples:\n" + "".join(f"  {e}\n" for e in examples)
        p = sub.add_parser(name, help=summary, description=description, epilog=text,
                           formatter_class=_Formatter)
        p.set_defaults(handler=handler)
        return p

    options = mount_options.options_help()
    p = add("mount", "mount a Zarr store: every chunk a TIFF file",
            "Mount SOURCE at MOUNTPOINT: groups and arrays are directories, every chunk a .tiff "
            "file. Returns once the mount is live; the daemon stays in the background.",
            [], cmd_mount, epilog=_MOUNT_EPILOG.format(options=options.rstrip("\n")))
    _add_mount_arguments(p)

    p = add("umount", "unmount (committing what open files hold)",
            "Unmount MOUNTPOINT: the daemon commits what open files hold, then exits.",
            ["zfuse umount /mnt/view", "zfuse umount -z /mnt/view   # stale or busy mount"],
            cmd_umount)
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="where a zfuse mount is")
    p.add_argument("-z", "--lazy", action="store_true",
                   help="lazy unmount: detach now, finish once no process uses the mount; also "
                        "clears a stale mount whose daemon died ('Transport endpoint is not "
                        "connected')")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="wait at most S seconds (default 120) for the daemon to exit once "
                        "unmounted: it commits open files and carries out pending deletions "
                        "first, so a script may go on once umount returns")

    p = add("status", "list running zfuse mounts: source, pid, uptime, counters",
            "Show every zfuse mount (or the given ones): mountpoint, source, daemon PID, "
            "read-only or not, uptime, log destination, reloads and the counters of "
            ".zfuse/stats. A mount whose daemon died is shown as STALE.",
            ["zfuse status", "zfuse status /mnt/view --json"], cmd_status)
    p.add_argument("mountpoints", nargs="*", metavar="MOUNTPOINT",
                   help="only these mounts (default: all zfuse mounts)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S",
                   help="give up on a daemon that does not answer within S seconds (default 5)")

    p = add("reload", "re-read the source's metadata and drop caches (SIGHUP)",
            "Make the daemon serving MOUNTPOINT open its source again (new, removed or resized "
            "arrays appear) and drop cached listings and chunks; waits until the reload is done.",
            ["zfuse reload /mnt/view"], cmd_reload)
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="where a zfuse mount is")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="how long to wait for the reload to finish (default 60)")

    p = add("info", "what a mount of SOURCE would show (arrays, chunks, TIFF sizes)",
            "Per array: shape, dtype, chunk grid (inner chunks of shards), codecs and "
            "extensions, TIFF header and file size, number of chunk files, or why an array "
            "is not shown. For a concatenation: the sources and their offsets.",
            ["zfuse info data.zarr", "zfuse info --json s3://bucket/a.zarr -o anon",
             "zfuse info --concat 0 a.zarr b.zarr"], cmd_info)
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="Zarr store path or URL, or a concat description file")
    p.add_argument("--concat", type=int, default=None, metavar="AXIS",
                   help="describe the SOURCEs concatenated along AXIS")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="mount options that affect opening or the view: endpoint_url=, profile=, "
                        "region=, anon, all_chunks, crop_edges, timeout= (see zfuse mount -h)")

    p = add("concat", "save a virtual concatenation as a description file",
            "Check that the SOURCE arrays can be concatenated along AXIS (same dtype, rank and "
            "other axes) and write OUT, a small JSON file that zfuse mount, zfuse info and "
            "zfuse.load_concat() accept. Nothing is copied.",
            ["zfuse concat --axis 0 ab.json a.zarr b.zarr && zfuse mount ab.json /mnt/ab"],
            cmd_concat)
    p.add_argument("--axis", type=int, required=True, metavar="N",
                   help="the axis along which the sources follow each other")
    p.add_argument("out", metavar="OUT.json",
                   help="description file to write (sources under its directory are stored "
                        "relative to it)")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="Zarr arrays, in order")
    return parser


# -- mount ----------------------------------------------------------------------
def cmd_mount(args: argparse.Namespace, argv: list[str]) -> int:
    if args.concat is None and len(args.sources) != 1:
        print("zfuse: several SOURCEs need --concat AXIS", file=sys.stderr)
        return 2
    from zfuse.mounts import absolute

    # local paths absolute: the daemon leaves the caller's working directory
    sources = [s if (path := local_path(s)) is None else absolute(path) for s in args.sources]
    config = MountConfig(sources=sources, mountpoint=absolute(args.mountpoint), concat_axis=args.concat)
    try:
        apply_mount_options(config, args.options)
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"zfuse: bad -o option: {e}", file=sys.stderr)
        return 2
    if args.cache_size is not None:
        config.cache_bytes = args.cache_size
    if args.log_file is not None:
        config.log_file = absolute(args.log_file)
    config.all_chunks |= args.all_chunks
    config.crop_edges |= args.crop_edges
    if not args.foreground:
        if not os.path.exists("/dev/fuse"):  # before spawning: a bare /dev has no /dev/null either
            print("zfuse: /dev/fuse is missing (is the fuse kernel module loaded?)", file=sys.stderr)
            return 1
        return spawn_daemon(config, args.sources, args.verbose)
    return run_foreground(config, args.sources, args.ready_fd, args.verbose)


# -- umount, status, reload -------------------------------------------------------------
def cmd_umount(args: argparse.Namespace, argv: list[str]) -> int:
    from zfuse.mounts import FSTYPE, find_mount

    shown = args.mountpoint
    entry = find_mount(args.mountpoint)
    if entry is None:
        print(f"zfuse: {shown} is not mounted", file=sys.stderr)
        return 1
    if not entry.fstype.startswith("fuse"):
        print(f"zfuse: {shown} is not a zfuse mount (it is {entry.fstype}); use umount(8)",
              file=sys.stderr)
        return 1
    owner = entry.owner_uid
    if owner is not None and os.getuid() not in (0, owner):
        # (fusermount3 would say "entry for ... not found in /etc/mtab")
        print(f"zfuse: cannot unmount {shown}: it was mounted by {_user_named(owner)}; only they or root "
              "can unmount it", file=sys.stderr)
        return 1
    # The daemon, to wait for once unmounted (its pid from .zfuse/mount, held by a pidfd
    # so a reused pid cannot be mistaken for it); a lazy unmount does not wait.
    daemon = None if args.lazy else _daemon_pidfd(entry.mountpoint)
    pending = _pending_files(entry.mountpoint)
    cmd = ["fusermount3", "-u", *(["-z"] if args.lazy else []), entry.mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        reason = result.stderr.strip().removeprefix("fusermount3: ")
        if "busy" in reason.lower():
            print(f"zfuse: cannot unmount {shown}: it is busy (a process has a file or its "
                  f"working directory there; `fuser -vm {shown}` shows which); "
                  f"`zfuse umount -z {shown}` detaches it now and finishes once it is unused",
                  file=sys.stderr)
        elif entry.fstype != FSTYPE:
            print(f"zfuse: cannot unmount {shown} ({entry.fstype}): {reason}", file=sys.stderr)
        else:
            print(f"zfuse: cannot unmount {shown}: {reason}", file=sys.stderr)
        if daemon is not None:
            os.close(daemon)
        return 1
    if pending:
        # (a writer that wrote fewer planes than the chunk holds: its cp exited 0)
        shown_paths = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if len(pending) > 5 else "")
        print(f"zfuse: {len(pending)} file(s) written incomplete were dropped at unmount, their stored "
              f"chunks unchanged: {shown_paths}", file=sys.stderr)
    if daemon is not None:
        try:
            if not select.select([daemon], [], [], args.timeout)[0]:
                print(f"zfuse: {shown} is unmounted, but its daemon is still finishing after "
                      f"{args.timeout:g} s (committing open files, deleting unlinked chunks); "
                      "see its log", file=sys.stderr)
                return 1
        finally:
            os.close(daemon)
    return 0


def _user_named(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _pending_files(mountpoint: str) -> list[str]:
    """The files of a mount written incomplete and pending now (an unmount drops them),
    as `.zfuse/stats` names them; [] if there are none, or the daemon does not answer."""
    from zfuse.mounts import STATS_FILE, MountNotResponding, read_json

    try:
        stats = read_json(mountpoint, STATS_FILE, timeout=2.0)
    except (MountNotResponding, OSError, ValueError):
        return []
    paths = stats.get("pending_paths")
    return [str(p) for p in paths] if isinstance(paths, list) else []


def _daemon_pidfd(mountpoint: str) -> int | None:
    """A pidfd of the daemon serving `mountpoint` (readable once it exits), or None if its
    pid cannot be learnt in a few seconds (a hung or dead daemon: nothing to wait for)."""
    from zfuse.mounts import MOUNT_FILE, read_json

    try:
        pid = int(read_json(mountpoint, MOUNT_FILE, timeout=5.0)["pid"])
        return os.pidfd_open(pid)
    except Exception:
        return None


def cmd_status(args: argparse.Namespace, argv: list[str]) -> int:
    from zfuse.mounts import NotMounted, format_status, status

    try:
        items = status(args.mountpoints, timeout=args.timeout)
    except NotMounted as e:
        print(f"zfuse: {e} is not a zfuse mount", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(items, indent=2))
    else:
        print(format_status(items))
    # another user's mount this user may not look into (no allow_other) is no failure of
    # the mounts asked about, unless it was named
    asked = bool(args.mountpoints)
    return 0 if all(i["state"] == "running" or (not asked and _others_private(i)) for i in items) else 1


def _others_private(item: dict[str, Any]) -> bool:
    """Whether a status item is another user's mount that is unreadable only for want of
    allow_other."""
    return item["state"] == "unreadable" and item.get("uid") not in (None, os.getuid())


def cmd_reload(args: argparse.Namespace, argv: list[str]) -> int:
    from zfuse.mounts import NotMounted, ReloadError, reload_mount

    try:
        info = reload_mount(args.mountpoint, timeout=args.timeout)
    except NotMounted:
        print(f"zfuse: {args.mountpoint} is not a zfuse mount", file=sys.stderr)
        return 1
    except ReloadError as e:
        print(f"zfuse: cannot reload {args.mountpoint}: {e}", file=sys.stderr)
        return 1
    print(f"reloaded {args.mountpoint} (reload {info['reloads']}, pid {info['pid']})")
    return 0


# -- info, concat ----------------------------------------------------------------------
def cmd_info(args: argparse.Namespace, argv: list[str]) -> int:
    from zfuse.daemon import check_sources, level_hint
    from zfuse.info import describe_source

    # the report says why an array is not shown: no separate warning on stderr
    logging.getLogger("zfuse.view").setLevel(logging.ERROR)
    config = MountConfig(sources=args.sources, mountpoint="", concat_axis=args.concat, read_only=True)
    try:
        apply_mount_options(config, args.options)
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"zfuse: bad -o option: {e}", file=sys.stderr)
        return 2
    try:
        check_sources(args.sources)
        report = describe_source(config)
        hint = level_hint(args.sources)
        if hint is not None:  # (what a mount of it warns: said where newcomers look)
            report["notes"] = [hint]
    except SystemExit as e:
        print(e.code, file=sys.stderr)
        return 1
    except Exception as e:
        print(f"zfuse: {describe_open_error(args.sources, e, config.storage_options)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from zfuse.info import format_report

        print(format_report(report))
    return 0


def cmd_concat(args: argparse.Namespace, argv: list[str]) -> int:
    from zfuse.ext.concat import save_concat

    try:
        save_concat(args.out, args.sources, args.axis)
    except Exception as e:
        print(f"zfuse: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_usage(sys.stderr)
        return 2
    if argv[0] == "--version":
        from zfuse import __version__

        print(f"zfuse {__version__}")
        return 0
    if argv[0] == "unmount":
        argv[0] = "umount"  # the other spelling people type
    elif argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
        argv = ["mount", *argv]  # mount.fuse3 form: SOURCE MOUNTPOINT -o opts
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return 2
    try:
        code = args.handler(args, argv[1:])
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`zfuse info --json X | head`): not an error of ours;
        # point stdout at /dev/null so the interpreter's final flush stays quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
