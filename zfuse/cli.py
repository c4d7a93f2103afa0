"""The `zfuse` command: mount, umount, info, concat.

`zfuse mount SOURCE MOUNTPOINT` returns once the mount is live (the daemon
keeps running in the background) or exits non-zero with a clear message.
`zfuse SOURCE MOUNTPOINT -o opts` (no subcommand) is the form `mount.fuse3`
uses for `mount -t fuse.zfuse` and /etc/fstab.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from typing import Any

from zfuse.daemon import MountConfig

SUBCOMMANDS = {"mount", "umount", "unmount", "info", "concat"}
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?$")


def parse_size(text: str) -> int:
    """'256M', '1G', '1048576' -> bytes."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 256M or 1G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def apply_mount_options(config: MountConfig, options: list[str]) -> None:
    """Fold `-o a,b=c` options into the config; unknown ones go to FUSE unchanged."""
    for group in options:
        for opt in filter(None, (o.strip() for o in group.split(","))):
            key, _, value = opt.partition("=")
            if key == "ro":
                config.read_only = True
            elif key == "rw":
                config.read_only = False
            elif key == "allow_other":
                config.allow_other = True
            elif key == "cache_size":
                config.cache_bytes = parse_size(value)
            elif key == "listing_cache":
                config.listing_cache_names = parse_size(value)  # a count of names: 200k, 1M
            elif key == "index_cache_size":
                config.index_cache_bytes = parse_size(value)
            elif key == "all_chunks":
                config.all_chunks = True
            elif key == "crop_edges":
                config.crop_edges = True
            elif key == "metadata_ttl":
                config.metadata_ttl = float(value)
            elif key == "timeout":
                config.timeout = float(value)
            elif key == "threads":
                config.max_threads = int(value)
            elif key in ("endpoint_url", "profile", "region", "anon"):
                _storage_option(config, key, value)
            elif key in ("dev", "suid", "nodev", "nosuid", "exec", "noexec", "auto", "noauto",
                         "user", "nouser", "_netdev", "nofail", "defaults", "x-systemd.automount"):
                continue  # mount(8)/fstab options that mean nothing to a FUSE daemon
            elif key.startswith("x-"):
                continue
            else:
                config.fuse_options.append(opt)


def _storage_option(config: MountConfig, key: str, value: str) -> None:
    so = config.storage_options
    if key == "endpoint_url":
        so.setdefault("client_kwargs", {})["endpoint_url"] = value
        so["endpoint_url"] = value
    elif key == "anon":
        so["anon"] = value.lower() not in ("0", "false", "no")
    else:
        so[key] = value


def _mount_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zfuse mount", description="Mount a Zarr store: every chunk a TIFF file.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="store path or URL (several with --concat)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                   help="comma-separated: ro, allow_other, cache_size=SIZE, metadata_ttl=S, timeout=S, endpoint_url=URL, ...")
    p.add_argument("--cache-size", type=parse_size, default=None, help="decoded-chunk cache (default 256M)")
    p.add_argument("--all-chunks", action="store_true", help="list every grid position; missing chunks read as fill value")
    p.add_argument("--crop-edges", action="store_true", help="edge chunks cropped to the array bounds")
    p.add_argument("--concat", type=int, default=None, metavar="AXIS", help="show the SOURCEs concatenated along AXIS")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v: log every FUSE operation")
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _configure_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr, format="zfuse[%(process)d] %(levelname)s %(name)s: %(message)s")
    if not verbose:
        for noisy in ("botocore", "s3fs", "aiobotocore", "fsspec", "urllib3"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_mount(argv: list[str]) -> int:
    args = _mount_parser().parse_args(argv)
    if args.concat is None and len(args.sources) != 1:
        print("zfuse: several SOURCEs need --concat AXIS", file=sys.stderr)
        return 2
    config = MountConfig(sources=args.sources, mountpoint=os.path.abspath(args.mountpoint), concat_axis=args.concat)
    try:
        apply_mount_options(config, args.options)
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"zfuse: bad -o option: {e}", file=sys.stderr)
        return 2
    if args.cache_size is not None:
        config.cache_bytes = args.cache_size
    config.all_chunks |= args.all_chunks
    config.crop_edges |= args.crop_edges
    if not args.foreground:
        return _spawn_daemon(argv)
    _configure_logging(args.verbose)
    return _run_foreground(config, args.ready_fd, args.verbose)


def _run_foreground(config: MountConfig, ready_fd: int | None, verbose: int) -> int:
    from zfuse.daemon import check_mountpoint, make_view, serve
    from zfuse.stats import Stats

    def report(message: str) -> None:
        if ready_fd is not None:
            os.write(ready_fd, message.encode())
            os.close(ready_fd)
            if message == "ready":
                _detach_stdio()

    def fail(message: str) -> int:
        # in the background the parent prints it; in the foreground we do
        if ready_fd is not None:
            report("error: " + message)
        else:
            print("zfuse: " + message, file=sys.stderr)
        return 1

    try:
        check_mountpoint(config.mountpoint)
        stats = Stats()
        view = make_view(config, stats)
    except SystemExit as e:
        return fail(str(e.code).removeprefix("zfuse: "))
    except Exception as e:
        return fail(f"cannot open {' '.join(config.sources)}: {type(e).__name__}: {e}")
    if verbose:
        from zfuse.fuse_ops import enable_operation_log

        enable_operation_log()
    try:
        serve(config, view, stats, on_ready=lambda: report("ready"),
              reload=lambda: make_view(config, stats))
    except Exception as e:
        return fail(f"mount failed: {e}")
    return 0


def _detach_stdio() -> None:
    """A backgrounded daemon lets go of its caller's stdout/stderr, as libfuse's
    fuse_daemonize does: `mount -t fuse.zfuse` run with pipes (`$(mount ...)`,
    subprocess) would otherwise wait for EOF until the filesystem is unmounted."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    # keep logging somewhere: the system log when there is one
    if os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address="/dev/log")
        handler.setFormatter(logging.Formatter("zfuse[%(process)d]: %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)


def _spawn_daemon(argv: list[str]) -> int:
    """Run the daemon in the background; return once the mount is live or failed."""
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", "zfuse.cli", "mount", *argv, "-f", "--ready-fd", str(write_fd)]
    proc = subprocess.Popen(cmd, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(write_fd)
    chunks = []
    while True:
        data = os.read(read_fd, 4096)
        if not data:
            break
        chunks.append(data)
    os.close(read_fd)
    message = b"".join(chunks).decode(errors="replace")
    if message == "ready":
        return 0
    code = proc.wait()
    if message.startswith("error: "):
        print("zfuse: " + message[len("error: "):], file=sys.stderr)
    else:
        print(f"zfuse: the daemon exited ({code}) before the mount was ready", file=sys.stderr)
    return 1


def cmd_umount(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="zfuse umount")
    p.add_argument("mountpoint")
    p.add_argument("-z", "--lazy", action="store_true")
    args = p.parse_args(argv)
    cmd = ["fusermount3", "-u", *(["-z"] if args.lazy else []), args.mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"zfuse: cannot unmount {args.mountpoint}: {result.stderr.strip()}", file=sys.stderr)
        return 1
    return 0


def cmd_info(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="zfuse info", description="What the view of SOURCE will contain.")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("--concat", type=int, default=None, metavar="AXIS")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-o", dest="options", action="append", default=[])
    args = p.parse_args(argv)
    from zfuse.info import describe_source

    config = MountConfig(sources=args.sources, mountpoint="", concat_axis=args.concat, read_only=True)
    apply_mount_options(config, args.options)
    try:
        report = describe_source(config)
    except Exception as e:
        print(f"zfuse: cannot open {' '.join(args.sources)}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from zfuse.info import format_report

        print(format_report(report))
    return 0


def cmd_concat(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="zfuse concat", description="Save a virtual concatenation description.")
    p.add_argument("--axis", type=int, required=True)
    p.add_argument("out")
    p.add_argument("sources", nargs="+")
    args = p.parse_args(argv)
    from zfuse.concat import save_concat

    try:
        save_concat(args.out, args.sources, args.axis)
    except Exception as e:
        print(f"zfuse: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: zfuse {mount,umount,info,concat} ...\n"
              "       zfuse SOURCE MOUNTPOINT [-o OPTIONS]   (as run by mount -t fuse.zfuse)")
        return 0 if argv else 2
    if argv[0] == "--version":
        from zfuse import __version__

        print(f"zfuse {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        command, rest = "mount", argv  # mount.fuse3 form: SOURCE MOUNTPOINT -o opts
    handlers: dict[str, Any] = {
        "mount": cmd_mount, "umount": cmd_umount, "unmount": cmd_umount,
        "info": cmd_info, "concat": cmd_concat,
    }
    return handlers[command](rest)


if __name__ == "__main__":
    sys.exit(main())
