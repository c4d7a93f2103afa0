"""Every default a mount option has, in one place: the CLI's table of options
(`mount_options`), the daemon's `MountConfig`, the view's `ViewOptions`, the write
path and the store layer all take their defaults from here, and `zfuse mount -h`
and the man page print them from here. Nothing is imported: the CLI loads this
before numpy or zarr."""

from __future__ import annotations

CACHE_BYTES = 256 * 2**20  # decoded chunks kept (cache_size)
LISTING_CACHE_NAMES = 200_000  # names of listings and existence answers kept (~190 bytes each)
INDEX_CACHE_BYTES = 64 * 2**20  # shard indexes kept (index_cache_size)
#: group members (arrays, groups) held opened across the mount, about 15 KB each
#: (members_kept): past it the groups used least lately forget theirs
MEMBERS_KEPT = 10_000
#: bytes the disk cache of a remote store (`cache=DIR`) may hold on disk (cache_limit)
DISK_CACHE_BYTES = 10 * 2**30
THREADS = 8  # worker threads for store I/O and decoding
#: seconds an unlinked chunk stays in the store for a replacement (converters take
#: seconds between deleting and creating their output)
REPLACE_WINDOW = 30.0
PENDING_TIMEOUT = 300.0  # seconds an incomplete closed file waits to be completed
#: bytes that files being written (not yet closed, pending, scratch) may hold in the
#: daemon together: past it a write fails with ENOSPC, whatever the machine has
WRITE_BUFFERS = 4 * 2**30
#: bytes of old copies the daemon holds for readers of chunks replaced or removed while
#: open (one per version, shared); past it such a reader's reads fail with ESTALE
OLD_COPIES_BYTES = 2**30
#: files the daemon holds for writers at once (open, pending, scratch, empty new chunks):
#: each costs about 2 KB even empty, which the byte budget above does not see
FILES_HELD_MAX = 10_000
READ_AHEAD_KB = 1024  # the kernel's read-ahead window for the mount
#: seconds one request to a remote store (s3://, gs://, https://) may take by default:
#: a read waits about this long at most when the server hangs (local stores: none)
REMOTE_TIMEOUT = 20.0
#: seconds a remote store's client waits for a connection: its tries (3 on S3) fit in the
#: timeout above, so a store that drops connections silently is found unreachable
CONNECT_TIMEOUT = 4.0
#: bytes of a remote object read whole at most, unless its reader knows better (a chunk:
#: twice its values and a MiB; metadata: the 16 MiB documents are read to); an endless
#: body is not held
REMOTE_OBJECT_MAX = 2**30
# the object a read-write mount of an S3 store writes, once, to learn whether the store
# honours conditional writes (removed after): never a member of the hierarchy, even
# when a listing made meanwhile sees it
CONDITIONS_PROBE_PREFIX = ".zfuse-conditions-probe-"
#: the daemon's own directory at the mount's root (stats, errors); a store member of that
#: name is not shown
CONTROL_DIR_NAME = ".zfuse"
