"""The FUSE floor: the smallest pyfuse3 + trio filesystem that serves a directory's files.

    python -m benchmarks.minimal_fs SOURCE_DIR MOUNTPOINT [--no-flush]
    python -m benchmarks.minimal_fs --listing ROWSxCOLS MOUNTPOINT


A read-only passthrough with zfuse's request pattern and none of its work: lookup
and getattr from `os.lstat` (attributes valid 5 s, as zfuse's), open with
`keep_cache`, each read one `os.pread` in a worker thread (the one thread hop
per read a daemon that does not block its loop needs), FLUSH answered (as on a
read-write mount) or refused with ENOSYS once (`--no-flush`, as zfuse's `-o ro`
mounts: the kernel sends no FLUSH again). What a figure gains over this is the
room left in zfuse's own code; `benchmarks/floor.py` runs both side by side.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Any

import pyfuse3
import trio

TIMEOUT = 5.0


class PassthroughOperations(pyfuse3.Operations):
    def __init__(self, root: str, *, flush: bool) -> None:
        super().__init__()
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: root}
        self.inodes: dict[str, int] = {root: pyfuse3.ROOT_INODE}
        self.fds: dict[int, int] = {}
        self.flush_answered = flush

    def _attrs(self, path: str) -> pyfuse3.EntryAttributes:
        st = os.lstat(path)
        ino = self.inodes.get(path)
        if ino is None:
            ino = self.inodes[path] = len(self.paths) + pyfuse3.ROOT_INODE
            self.paths[ino] = path
        out = pyfuse3.EntryAttributes()
        out.st_ino = ino
        out.st_mode = st.st_mode if stat.S_ISDIR(st.st_mode) else stat.S_IFREG | 0o444
        out.st_nlink = st.st_nlink
        out.st_size = st.st_size
        out.st_atime_ns = out.st_mtime_ns = out.st_ctime_ns = st.st_mtime_ns
        out.st_blksize = 1 << 20
        out.st_blocks = (st.st_size + 511) >> 9
        out.attr_timeout = out.entry_timeout = TIMEOUT
        return out

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        try:
            return self._attrs(os.path.join(self.paths[parent_inode], os.fsdecode(name)))
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._attrs(self.paths[inode])

    async def opendir(self, inode: int, ctx: Any) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        names = sorted(os.listdir(self.paths[fh]))
        for i, name in enumerate(names[start_id:], start_id + 1):
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(os.path.join(self.paths[fh], name)), i):
                break

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        fd = os.open(self.paths[inode], os.O_RDONLY)
        self.fds[fd] = inode
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await trio.to_thread.run_sync(os.pread, fh, size, off)

    async def flush(self, fh: int) -> None:
        if not self.flush_answered:
            raise pyfuse3.FUSEError(errno.ENOSYS)

    async def release(self, fh: int) -> None:
        self.fds.pop(fh, None)
        os.close(fh)


class ListingOperations(pyfuse3.Operations):
    """The listing floor: `c/I/J.tiff` for ROWS x COLS chunk files, every answer made
    before the mount (names, attributes, inode numbers), no I/O: what `ls -lR` of a
    zfuse mount of a ROWS x COLS grid costs with nothing but the requests. Each
    directory is answered in one pass as zfuse answers one (READDIRPLUS with
    attributes valid 5 s; lookups too, should the kernel ask)."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.attrs: dict[int, pyfuse3.EntryAttributes] = {}
        self.children: dict[int, list[tuple[bytes, int]]] = {}
        root = pyfuse3.ROOT_INODE
        self.attrs[root] = self._make(root, True)
        c = self._add(root, b"c", True)
        for i in range(rows):
            d = self._add(c, str(i).encode(), True)
            for j in range(cols):
                self._add(d, f"{j}.tiff".encode(), False)

    def _make(self, ino: int, is_dir: bool) -> pyfuse3.EntryAttributes:
        out = pyfuse3.EntryAttributes()
        out.st_ino = ino
        out.st_mode = (stat.S_IFDIR | 0o555) if is_dir else (stat.S_IFREG | 0o444)
        out.st_nlink = 2 if is_dir else 1
        out.st_size = 0 if is_dir else 412
        out.st_blksize = 1 << 20
        out.st_blocks = 1
        out.attr_timeout = out.entry_timeout = TIMEOUT
        return out

    def _add(self, parent: int, name: bytes, is_dir: bool) -> int:
        ino = len(self.attrs) + pyfuse3.ROOT_INODE
        self.attrs[ino] = self._make(ino, is_dir)
        self.children.setdefault(parent, []).append((name, ino))
        if is_dir:
            self.children[ino] = []
        return ino

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        for child, ino in self.children.get(parent_inode, ()):
            if child == name:
                return self.attrs[ino]
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self.attrs[inode]

    async def opendir(self, inode: int, ctx: Any) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        attrs, reply = self.attrs, pyfuse3.readdir_reply
        for i, (name, ino) in enumerate(self.children[fh][start_id:], start_id + 1):
            if not reply(token, name, attrs[ino], i):
                break


def main(argv: list[str]) -> int:
    if argv[0] == "--listing":
        rows, cols = map(int, argv[1].split("x"))
        listing_ops = ListingOperations(rows, cols)
        return _serve(listing_ops, argv[2])
    source, mountpoint = [arg for arg in argv if arg != "--no-flush"]
    return _serve(PassthroughOperations(os.path.abspath(source), flush="--no-flush" not in argv), mountpoint)


def _serve(ops: pyfuse3.Operations, mountpoint: str) -> int:
    options = set(pyfuse3.default_options) | {"fsname=zfuse-floor", "ro"}
    options.discard("default_permissions")
    pyfuse3.init(ops, mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
