"""Exception types shared by every layer.

Each layer raises these (never bare ValueError for input problems) so that the
FUSE adapter can map them to errno values in one table (zfuse/fuse_ops.py).
"""

from __future__ import annotations


class ZfuseError(Exception):
    """Base class of every error zfuse raises on purpose."""


class MetadataError(ZfuseError, ValueError):
    """Array/group metadata is malformed or names something unsupported."""


class CorruptDataError(ZfuseError):
    """Stored bytes are inconsistent: bad checksum, bad shard index, missing or mis-sized part."""


class InvalidTiffError(ZfuseError, ValueError):
    """Bytes written into the mount are not an acceptable TIFF for that chunk."""


class SourceMismatchError(ZfuseError, ValueError):
    """Arrays given to a virtual concatenation do not agree (dtype, rank, other axes)."""


class ReadOnlyArrayError(ZfuseError, ValueError):
    """A write to an array (or concatenation) that was opened read-only."""
