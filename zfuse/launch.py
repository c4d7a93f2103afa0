"""glibc's malloc tuned for the daemon: `zfuse mount` re-executes itself with it.

`zfuse mount` re-executes itself once with MALLOC_TUNABLES in its environment (glibc
reads them only when a process starts) before anything heavy is imported: the cost is
one bare interpreter start (~20 ms), not the CLI's imports twice.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

# glibc's malloc settings for the daemon. Each chunk decoded is a new buffer of about
# a chunk's size that the chunk cache keeps, so its first writes fault in 4 KiB pages
# (128 faults per 512 KiB chunk, ~0.2 ms, about as long as decoding it with zstd).
# Transparent huge pages for the heap fault it in 2 MiB at a time; one arena makes the
# worker threads' buffers come from that heap too (each thread's own arena grows page by
# page and never gets huge pages). benchmarks/README.md has the figures.
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1"


def malloc_tuned_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """`environ` with MALLOC_TUNABLES added to GLIBC_TUNABLES, or None when there is
    nothing to add: not glibc, the tunables (or other malloc hugetlb settings) are set
    already, or ZFUSE_MALLOC_TUNING=0. glibc reads tunables only when a process starts,
    so `zfuse mount` re-executes itself once with this environment."""
    current = environ.get("GLIBC_TUNABLES", "")
    if environ.get("ZFUSE_MALLOC_TUNING") == "0" or "glibc.malloc.hugetlb" in current:
        return None
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError):
        return None  # not glibc
    return {**environ, "GLIBC_TUNABLES": f"{current}:{MALLOC_TUNABLES}" if current else MALLOC_TUNABLES}


def is_mount(argv: Sequence[str]) -> bool:
    """Whether the command line `zfuse ARGV...` mounts (`mount`, or the mount.fuse3 form
    SOURCE MOUNTPOINT that cli.main turns into `mount`)."""
    from_fstab = bool(argv) and not argv[0].startswith("-") and argv[0] not in NOT_MOUNTING
    return bool(argv) and (argv[0] == "mount" or from_fstab)


NOT_MOUNTING = {"umount", "unmount", "status", "reload", "info", "concat"}


def exec_tuned(argv: Sequence[str]) -> None:
    """Run this command again, same process, with malloc tuned (`malloc_tuned_environment`)
    if it mounts and is not tuned yet; on any failure it goes on untuned."""
    if not is_mount(argv):
        return
    env = malloc_tuned_environment(os.environ)
    if env is None:
        return
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        pass
