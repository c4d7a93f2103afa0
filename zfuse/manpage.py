"""The `zfuse(1)` man page, generated from the command-line parser.

`python -m zfuse.manpage > man/zfuse.1` regenerates the shipped page (installed
as share/man/man1/zfuse.1 next to the `zfuse` script, where `man zfuse`
finds it); a test checks that the shipped page is what this module produces,
so the page never drifts from `zfuse CMD -h`.
"""

from __future__ import annotations

import argparse
import sys

from zfuse import __version__
from zfuse.cli import MOUNT_OPTIONS, build_parser

_SECTIONS_AFTER = r"""
.SH FILES INSIDE A MOUNT
.TP
.B .zfuse/stats
JSON counters: store requests and bytes, cache hits, chunks decoded and decode
time, read\-ahead, chunks written and deleted, rejected writes, errors.
.TP
.B .zfuse/mount
JSON: the daemon's pid, sources, mountpoint, read_only, start time,
number of reloads and the last reload's error, where it logs.
.B zfuse status
and
.B zfuse reload
read it.
.SH SIGNALS
SIGTERM and SIGINT commit what open files hold, unmount and exit 0.
SIGHUP (or
.BR "zfuse reload" )
opens the source again and drops cached listings and chunks.
.SH WHEN SOMETHING GOES WRONG
.TP
.B Where is the log?
With
.B \-f
(and under systemd): stderr, i.e. the journal
.RB ( "journalctl \-u zfuse@NAME" ).
In the background:
.B \-\-log\-file PATH
or
.BR "\-o log_file=PATH" ,
else the system log if there is one.
.B zfuse status
says where each mount logs.
.TP
.B close() fails with EINVAL
The file written is a complete TIFF that does not fit the chunk: wrong dtype,
shape or compression. The stored chunk is unchanged; the reason is in the log
(and in
.B .zfuse/errors
where the daemon provides it).
.TP
.B Transport endpoint is not connected
The daemon of that mount is gone (killed, crashed). The mountpoint stays
unusable until it is cleared:
.BR "zfuse umount \-z MOUNTPOINT" ,
then mount again.
.B zfuse status
shows such mounts as STALE.
.TP
.B Device or resource busy on umount
A process still has a file or its working directory in the mount
.RB ( "fuser \-vm MOUNTPOINT" );
.B zfuse umount \-z
detaches the mount now and finishes when it is no longer used.
.SH SEE ALSO
.BR fusermount3 (1),
.BR mount.fuse3 (8),
.BR findmnt (8),
.BR systemd.service (5);
README.md and SEMANTICS.md of the zfuse sources.
"""


def _esc(text: str) -> str:
    """Text for roff: backslashes and hyphens escaped, no line starting with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in text.split("\n"):
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line)
    return "\n".join(lines)


def _option_label(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs != 0:
            names += f" {action.metavar or action.dest.upper()}"
        return names
    return str(action.metavar or action.dest)


def _subcommand(name: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    out = [f'.SS "zfuse {name}" \\(em {_esc(summary)}']
    usage = parser.format_usage().removeprefix("usage: ").strip()
    out += [".nf", ".B " + _esc(" ".join(usage.split())), ".fi", ".PP", _esc(parser.description or ""),
            ".PP"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        out += [".TP", ".B " + _esc(_option_label(action)), _esc(action.help or "")]
    epilog = parser.epilog or ""
    if name == "mount":
        # the -o table and logging notes get sections of their own
        epilog = epilog[epilog.index("examples:"):]
    if epilog:
        title, _, body = epilog.partition("\n")
        out += [".PP", _esc(title.rstrip(":").capitalize() + ":"), ".RS", ".nf",
                _esc(body.rstrip("\n")), ".fi", ".RE"]
    return out


def render() -> str:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    summaries = {c.dest: c.help or "" for c in sub._choices_actions}
    out = [
        f'.TH ZFUSE 1 "" "zfuse {__version__}" "User Commands"',
        ".SH NAME",
        "zfuse \\- mount a Zarr store so that every chunk is a standalone TIFF file",
        ".SH SYNOPSIS",
        ".nf",
    ]
    for p in sub.choices.values():
        out.append(".B " + _esc(" ".join(p.format_usage().removeprefix("usage: ").split())))
    out += [
        ".B zfuse SOURCE MOUNTPOINT \\-o OPTIONS",
        ".fi",
        ".SH DESCRIPTION",
        _esc("zfuse mounts an existing Zarr store (local, s3://, gs://, https://) as a filesystem "
             "in which every chunk is a standalone, valid .tiff file. Groups and arrays are "
             "directories; reading a chunk file decodes the chunk; writing a TIFF into the mount "
             "stores it back, encoded as the array's metadata says. The last form is what "
             "mount -t fuse.zfuse and /etc/fstab run (through mount.fuse3)."),
        ".SH COMMANDS",
    ]
    for name, p in sub.choices.items():
        out += _subcommand(name, p, summaries[name])
    out += [".SH MOUNT OPTIONS",
            _esc("Given as -o OPTS to zfuse mount, or in the options field of /etc/fstab "
                 "(type fuse.zfuse). libfuse's own options (allow_root, fsname=, noatime, ...) go to "
                 "FUSE unchanged; any other name is refused.")]
    for option in MOUNT_OPTIONS:
        out += [".TP", ".B " + _esc(option.spelled), _esc(option.meaning)]
    return "\n".join(out) + "\n" + _SECTIONS_AFTER.lstrip("\n")


if __name__ == "__main__":
    sys.stdout.write(render())
