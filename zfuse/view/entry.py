"""What is at one path of the view: its kind (`Node`) and an `Entry` of it.

The vocabulary shared by the tree (`tree.py`, which finds entries and lists
directories) and the open files (`zfuse.handles`, which say what an open file
is): a module of its own, so an open file needs no listing code to say it.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView
    from zfuse.view.source import Coords

META_NAME = "zarr.json"  # every group's and array's metadata file


class Node(Enum):
    """What is at a path. `is_dir`: a directory (else a file). `read_only`: never written,
    truncated or replaced through the mount (zfuse's own files, metadata, whole-image
    views), whatever the mount's mode."""

    is_dir: bool
    read_only: bool

    # members are singletons: identity hashing in C, not Enum's hash of the name in
    # Python (a node kind is a dict key once per entry of every listing)
    __hash__ = object.__hash__

    def __new__(cls, value: str, is_dir: bool, read_only: bool = False) -> Node:
        member = object.__new__(cls)
        member._value_ = value
        member.is_dir = is_dir
        member.read_only = read_only
        return member

    GROUP = "group", True  # values: a hierarchy node's kind ("group"/"array") is Node(kind)
    ARRAY = "array", True
    KEYDIR = "keydir", True  # a directory chunk keys imply (c/, c/0/), or made by mkdir
    ZFUSE_DIR = "zfuse_dir", True, True  # .zfuse/, zfuse's own
    META = "meta", False, True  # zarr.json, README
    CHUNK = "chunk", False  # a chunk file (coords None: a scratch file being written)
    IMAGE = "image", False, True  # a whole-image file (its reader in Entry.reader)
    ZFUSE_FILE = "zfuse_file", False, True  # .zfuse/stats, mount, errors: live, read-only


class Entry(NamedTuple):
    """What is at one path (`node`): a directory, a metadata file, a chunk file, ...

    A NamedTuple, not a dataclass: `ls -lR` of 100,000 chunks builds one per
    file, and tuple construction is several times cheaper.
    """

    node: Node
    size: int = 0
    array: ArrayView | None = None
    coords: Coords | None = None
    content: bytes | None = None  # metadata files
    reader: Any = None  # Node.IMAGE files: an object with size, read_cached(off, n), read(off, n)
