"""Exception types shared by every layer.

Each layer raises these (never bare ValueError for input problems) so that the
FUSE adapter can map them to errno values in one table (`errno_for` below).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator


class ZfuseError(Exception):
    """Base class of every error zfuse raises on purpose."""


class MetadataError(ZfuseError, ValueError):
    """Array/group metadata is malformed or names something unsupported."""


class CorruptDataError(ZfuseError):
    """Stored bytes are inconsistent: bad checksum, bad shard index, missing or mis-sized part."""


class OutsideStoreError(CorruptDataError):
    """A store key that would read or write outside the store's directory: a component
    that is empty, `.`, `..`, absolute or holds NUL or a backslash, or a symbolic link
    leading out of the store. Refused (EIO, naming the key), never followed."""


class InvalidTiffError(ZfuseError, ValueError):
    """Bytes written into the mount are not an acceptable TIFF for that chunk."""


class RefusedAgainError(InvalidTiffError):
    """A write or close of a file already refused (and journaled) at an earlier write:
    EINVAL again, logged quietly, not journaled a second time."""


class TiffLayoutError(ZfuseError, ValueError):
    """No chunk-file TIFF layout or header can be made from these arguments (a chunk
    shape, dtype or per-axis list that does not fit, coordinates outside the grid)."""


class TiffHeaderError(ZfuseError, ValueError):
    """Bytes read as a zfuse chunk file's header are not one (no TIFF, cut off, no position)."""


class SourceMismatchError(ZfuseError, ValueError):
    """Arrays given to a virtual concatenation do not agree (dtype, rank, other axes)."""


class ArgumentError(ZfuseError, ValueError):
    """A caller's argument the extensions cannot use: an unknown open mode, as many
    names as sources, chunk data of the chunk's shape."""


class NotAChunkKeyError(ZfuseError, ValueError):
    """A key its chunk key encoding did not produce (``decode_chunk_key``; zarr expects ValueError)."""


class StoreTimeoutError(ZfuseError, TimeoutError):
    """A store request that got no answer in time (`-o timeout=`), or one refused at once
    because the same key timed out moments ago. EIO; the message names the request,
    the key, the wait and the store."""


class StoreServerError(ZfuseError, OSError):
    """A store request the server failed (a 5xx, a throttle, a lost connection) after the
    tries of its client, or one refused at once because the same key failed so moments
    ago. EREMOTEIO, or the failure's own errno (ECONNRESET, ...); the message names the request, the key, what the server answered
    and the store."""

    def __init__(self, message: str, code: int | None = None) -> None:
        import errno

        super().__init__(code or errno.EREMOTEIO, message)


class ReadOnlyError(ZfuseError):
    """A change on a read-only mount (EROFS)."""


class ReadOnlyArrayError(ReadOnlyError, ValueError):
    """A write to an array (or concatenation) that was opened read-only."""


class FileTooLargeError(ZfuseError):
    """A write past the size any TIFF of this chunk could need (EFBIG)."""


class NotAllowedError(ZfuseError, OSError):
    """A file operation the view refuses, carrying its errno (EPERM, EACCES, ENOENT, ...)."""

    def __init__(self, code: int, message: str) -> None:
        OSError.__init__(self, code, message)


def errno_for(exc: BaseException) -> int:
    """The one table from exceptions to errno values (used at the FUSE boundary)."""
    import errno

    if isinstance(exc, ReadOnlyError):
        return errno.EROFS
    if isinstance(exc, FileTooLargeError):
        return errno.EFBIG
    if isinstance(exc, MemoryError):
        return errno.ENOMEM  # the daemon's, not the file's: the same write may pass later
    if isinstance(exc, InvalidTiffError):
        return errno.EINVAL
    if isinstance(exc, (CorruptDataError, MetadataError)):
        return errno.EIO
    if isinstance(exc, FileNotFoundError):
        return errno.ENOENT
    if isinstance(exc, PermissionError) and not exc.errno:
        return errno.EACCES  # (s3fs's AccessDenied carries no errno: a read-only key's write)
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno  # (a resolver's code is negative, EAI_NONAME -2: no errno)
    return errno.EIO  # timeouts, bugs: the caller sees an I/O error, the log has the cause


# control characters, and the line breaks str.splitlines() honours besides them
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """`text` as one line of UTF-8: a name that is not UTF-8 (its bytes decoded with
    surrogates, as the kernel's names are) shows escaped, ``\\udcff``, rather than
    failing every read of the journal and the log line saying it; a control character
    (a newline in a name forged whole lines of `.zfuse/errors` and the log) as ``\\x0a``."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        text)


#: causes of an exception `causes` walks at most (a cycle of contexts must not loop)
CAUSES_WALKED = 8


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then what it was raised from (its cause, else its context), in turn: where
    a store's own answer (a status, an S3 error, a lost connection) lies under the
    errors of the libraries between; at most CAUSES_WALKED."""
    for _ in range(CAUSES_WALKED):
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


def source_label(source: str) -> str:
    """A source as messages and log lines show it: a URL without the credentials it may
    hold, in its user part or its query (a presigned URL's signature, a token): the
    conditional-writes probe's lines, the metered store's timeouts, a refused mount's
    message."""
    if "://" not in source:
        return source
    try:
        parts = urllib.parse.urlsplit(source)
    except ValueError:  # (no URL: "http://[::1/x"): its credentials cut out as text
        scheme, _, rest = source.partition("://")
        host, slash, path = rest.partition("/")
        return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"
    if "@" in parts.netloc or parts.query:
        # (any port, parsed or not; a query may hold a presigned URL's signature or a token)
        return parts._replace(netloc=parts.netloc.rpartition("@")[2], query="").geturl()
    return source
