"""What the filesystem's parts and the FUSE adapter share: paths, attributes, replies,
the kernel's interface, the errno-carrying failure, and the attribute constants.

A module of its own so that the parts (`listing_ahead`, `read_ahead`,
`stored_files`, `page_cache`, `special`, `image_push`) and `FileSystem` import
these without importing one another.
"""

from __future__ import annotations

import stat as stat_mod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

Path = tuple[str, ...]
T = TypeVar("T")
Run = Callable[..., Awaitable[Any]]  # blocking work, in a worker thread on a mount
Spawn = Callable[[Callable[..., Any], Any], None]  # background work reporting nothing back

ROOT_INODE = 1
ATTR_TIMEOUT = 5.0
# st_blksize: coreutils cp copies in buffers of st_blksize, so a chunk file's 1 MiB
# (the kernel's largest write request) writes a 512 KiB chunk in one request, not four.
# Other files keep 128 KiB: Python's buffered files read ahead by it, and a tile read
# of a whole-image file would fetch 1 MiB around each tile.
CHUNK_BLKSIZE = 1 << 20
BLKSIZE = 128 << 10


class FsError(Exception):
    """An operation failed with `errno` (already logged and counted)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.errno = code


class Kernel(Protocol):
    """What the filesystem asks of the kernel: forget cached data and names."""

    def invalidate_inode(self, ino: int) -> None: ...

    def invalidate_inode_here(self, ino: int) -> None:
        """`invalidate_inode` in the calling worker thread (it may wait on the kernel,
        which may wait on the event loop: never on the loop itself)."""
        ...

    def invalidate_entry(self, parent_ino: int, name: str) -> None: ...

    def store(self, ino: int, offset: int, data: bytes) -> None:
        """Put bytes into a file's page cache (whole-image tiles ahead of a region
        reader). Called from a worker thread. Optional: without it nothing is pushed."""


class Attributes(NamedTuple):
    """What `stat` shows of one file (a tuple: one is built per entry of every listing)."""

    ino: int
    mode: int
    size: int
    mtime_ns: int
    uid: int
    gid: int
    timeout: float  # attribute and entry cache seconds
    blksize: int  # the I/O size `stat` suggests: writers such as cp size their buffer by it

    @property
    def is_dir(self) -> bool:
        return stat_mod.S_ISDIR(self.mode)


@dataclass
class OpenReply:
    fh: int
    keep_cache: bool = False
    direct_io: bool = False
    # the kernel need not send FLUSH at close: set for read-only opens, whose close
    # has nothing to commit (one request less per `cat`; needs pyfuse3 with noflush)
    noflush: bool = False


# readdir's offer of a run of entries sharing one set of attributes (names encoded,
# inode numbers, the attributes, the offset before the first): how many were taken
AcceptRun = Callable[[Sequence[bytes], Sequence[int], Attributes, int], int]


async def run_here(fn: Callable[..., T], *args: Any) -> T:
    """`Run` without threads (plain-call tests)."""
    return fn(*args)
