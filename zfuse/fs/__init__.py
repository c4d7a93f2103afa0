"""The filesystem layer: every file operation on the mount, decided without FUSE.

`zfuse.fuse_ops` translates each FUSE request into one call of `FileSystem`
(`filesystem.py`) and the result or `FsError` into one reply, so everything a
request decides is tested with plain calls (tests/test_fs.py), no kernel.

`FileSystem` keeps inodes, open files (one handle kind each, `zfuse.handles`),
directory handles, the errno choices and the policies; each part below owns its
own state and is told of what happens by `FileSystem`:

| part | module | owns |
|---|---|---|
| listing ahead | `listing_ahead.py` | walkers' directories listed ahead of their opendir |
| read-ahead | `read_ahead.py` | chunks decoded (or stored files asked of the OS) ahead of a sequential reader |
| stored files | `stored_files.py` | what is remembered of the stored files chunks are read from (names, the one the page cache holds, kept open) |
| page-cache readers | `page_cache.py` | who reads a chunk through the kernel's page cache; writers waiting on them |
| whole-image pages | `image_push.py` | whole-image files' cached pages between opens, tiles pushed ahead of a reader |
| `.zfuse/` | `special.py` | the daemon's own files and the error journal |
| shared types | `types.py` | `Path`, `Attributes`, `OpenReply`, `FsError`, `Kernel` |
"""

from zfuse.fs.filesystem import FileSystem, process_of
from zfuse.fs.listing_ahead import LIST_AHEAD, encode_names
from zfuse.fs.types import (
    ATTR_TIMEOUT,
    ROOT_INODE,
    AcceptRun,
    Attributes,
    FsError,
    Kernel,
    OpenReply,
    Path,
)

__all__ = [
    "ATTR_TIMEOUT",
    "LIST_AHEAD",
    "ROOT_INODE",
    "AcceptRun",
    "Attributes",
    "FileSystem",
    "FsError",
    "Kernel",
    "OpenReply",
    "Path",
    "encode_names",
    "process_of",
]
