"""The `-o` mount options zfuse understands: one table, from which the parser, `zfuse
mount -h` and the man page are all made, so none of them can leave one out.

Each `MountOption` names its spelling (`cache_size=SIZE`), what it means, and how
it sets a `MountConfig` from the text after `=`. A value that does not parse is
refused naming the option and what it takes (`-o timeout=abc: timeout takes
seconds, e.g. 30`). libfuse's own options (`_FUSE_OPTIONS`) go to FUSE unchanged,
mount(8)/fstab words that mean nothing to a FUSE daemon are dropped, and any other
name is refused with the nearest names (a slip, before the store is opened).
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zfuse import defaults

__all__ = ["MOUNT_OPTIONS", "MountOption", "OptionError", "apply_mount_options", "options_help", "parse_size"]

def _mib(nbytes: int) -> str:
    return f"{nbytes // 2**20}M"


_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?$")
# mount(8)/fstab options that mean nothing to a FUSE daemon
_IGNORED = frozenset({"dev", "suid", "nodev", "nosuid", "exec", "noexec", "auto", "noauto", "user",
                      "nouser", "users", "owner", "group", "comment", "_netdev", "nofail", "defaults",
                      "x-systemd.automount"})


# what libfuse 3 itself takes (mount.fuse3(8): its mount options and the kernel's mount
# flags; a low-level filesystem gets none of the high-level library's, such as
# kernel_cache or uid=): anything else is a slip, refused before the store is opened
# (libfuse refused it only after, as "fuse_session_new() failed"). Not max_read: pyfuse3
# sets its own, and another made the kernel's INIT fail after the mount had said ready
_FUSE_OPTIONS = frozenset({
    "allow_other", "allow_root", "auto_unmount", "default_permissions", "blkdev", "blksize",
    "fsname", "subtype", "rootmode", "fd", "user_id", "group_id", "debug",
    "context", "fscontext", "defcontext", "rootcontext",
    "ro", "rw", "async", "sync", "dirsync", "atime", "noatime", "diratime", "nodiratime",
    "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime", "nolazytime",
})


class OptionError(ValueError):
    """A `-o` option whose value does not parse; the message names the option."""


def parse_size(text: str) -> int:
    """'256M', '1G', '1048576' -> bytes."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 256M or 1G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"takes seconds, e.g. 30, not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"takes a number of seconds >= 0, not {text!r}")
    return value


#: the shortest `metadata_ttl` (a reload opens the whole source again: 1e-9 held a core
#: at 100 % with 4,233 reloads in 10 s, and a remote server with their requests)
METADATA_TTL_MIN = 0.1


def _ttl(text: str) -> float:
    value = _seconds(text)
    if 0 < value < METADATA_TTL_MIN:
        raise ValueError(f"takes at least {METADATA_TTL_MIN:g} seconds (or 0: never), not {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"takes a whole number, e.g. 8, not {text!r}") from None
    if value < 1:
        raise ValueError(f"takes a whole number >= 1, not {text!r}")
    return value


def _size(text: str) -> int:
    return parse_size(text)


def _durability(text: str) -> str:
    if text not in ("disk", "process"):
        raise ValueError(f"is disk or process, not {text!r}")
    return text


def _path(text: str) -> str:
    if not text:
        raise ValueError("needs a path: -o log_file=PATH")
    return os.path.abspath(os.path.expanduser(text))


def _storage(key: str) -> Callable[[Any, str], None]:
    def apply(config: Any, value: str) -> None:
        so = config.storage_options
        if key == "endpoint_url":
            so.setdefault("client_kwargs", {})["endpoint_url"] = value
            so["endpoint_url"] = value
        elif key == "anon":
            so["anon"] = value.lower() not in ("0", "false", "no")
        else:
            so[key] = value
    return apply


def _cache_option(name: str) -> Callable[[Any, str], None]:
    # carried in the storage options, to the remote store `zfuse.store.open_store` makes
    # (which takes them out again: fsspec never sees them)
    def apply(config: Any, value: str) -> None:
        if name == "cache_dir":
            config.storage_options["zfuse_cache"] = _path(value) if value else _path_needed("cache=DIR")
        elif name == "last_writer_wins":
            config.storage_options["zfuse_last_writer_wins"] = True
        else:
            config.storage_options["zfuse_cache_limit"] = _size(value)
    return apply


def _path_needed(spelling: str) -> str:
    raise ValueError(f"needs a path: -o {spelling}")


def _field(name: str, parse: Callable[[str], Any]) -> Callable[[Any, str], None]:
    def apply(config: Any, value: str) -> None:
        setattr(config, name, parse(value))
    return apply


def _flag(name: str, value: bool = True) -> Callable[[Any, str], None]:
    def apply(config: Any, text: str) -> None:
        setattr(config, name, value)
    return apply


@dataclass(frozen=True)
class MountOption:
    """One `-o` option: `key` (or `key=META`), what it means, how it sets the config."""

    key: str
    meta: str
    meaning: str
    apply: Callable[[Any, str], None]

    @property
    def spelled(self) -> str:
        return f"{self.key}={self.meta}" if self.meta else self.key


MOUNT_OPTIONS: tuple[MountOption, ...] = (
    MountOption("ro", "", "read-only: every write fails with EROFS", _flag("read_only")),
    MountOption("rw", "", "read-write (the default, except for http(s) sources)", _flag("read_only", False)),
    MountOption("allow_other", "", "other users may see the mount (non-root needs user_allow_other "
                "in /etc/fuse.conf)", _flag("allow_other")),
    MountOption("cache_size", "SIZE", f"bounded LRU of decoded chunks, e.g. 512M (default {_mib(defaults.CACHE_BYTES)})",
                _field("cache_bytes", _size)),
    MountOption("listing_cache", "N", f"chunk names kept from store listings, e.g. 1M (default {defaults.LISTING_CACHE_NAMES // 1000}k)",
                _field("listing_cache_names", _size)),
    MountOption("members_kept", "N", f"group members (arrays, groups) held opened, about 15 KB each; past it "
                f"the least used are opened again when next looked up (default {defaults.MEMBERS_KEPT // 1000}k)",
                _field("members_kept", _size)),
    MountOption("index_cache_size", "SIZE", f"bounded cache of shard indexes, e.g. 256M (default {_mib(defaults.INDEX_CACHE_BYTES)})",
                _field("index_cache_bytes", _size)),
    MountOption("cache", "DIR", "keep what remote stores (s3://, gs://, https://) sent in DIR, across "
                "mounts, checked against each object's ETag (made 0700; mounts may share it)",
                _cache_option("cache_dir")),
    MountOption("cache_limit", "SIZE", "bound the cache= directory on disk, least recently used "
                f"evicted first (default {defaults.DISK_CACHE_BYTES // 2**30}G)", _cache_option("cache_limit")),
    MountOption("last_writer_wins", "", "write to an object store without conditional writes (If-Match: "
                "an S3 store that ignores them, gs://, az://): another host's concurrent update of a "
                "shard can be lost",
                _cache_option("last_writer_wins")),
    MountOption("all_chunks", "", "list every grid position; missing chunks read as the fill value",
                _flag("all_chunks")),
    MountOption("crop_edges", "", "edge chunks cropped to the array bounds", _flag("crop_edges")),
    MountOption("lossy_writes", "", "store written values as an array's lossy or narrowing codecs make "
                "them (JPEG, FixedScaleOffset, AsType, ...): without it such a write that would read back "
                "otherwise fails with EINVAL", _flag("lossy_writes")),
    MountOption("metadata_ttl", "S", "every S seconds (at least 0.1; and on SIGHUP / zfuse reload) open the "
                "source again",
                _field("metadata_ttl", _ttl)),
    MountOption("timeout", "S", "bound every store request: a hung server gives EIO, not a hung ls or cat "
                f"(default {defaults.REMOTE_TIMEOUT:g} for remote sources, none for local directories; 0: none)",
                _field("timeout", _seconds)),
    MountOption("threads", "N", f"worker threads for file reads (store I/O and decoding), and as many for "
                f"lookups, listings, opens and writes (default {defaults.THREADS})",
                _field("max_threads", _count)),
    MountOption("replace_window", "S", "an unlinked chunk stays in the store this long for a "
                f"replacement (default {defaults.REPLACE_WINDOW:g})", _field("replace_window", _seconds)),
    MountOption("pending_timeout", "S", "an incomplete closed TIFF waits this long to be completed "
                f"(default {defaults.PENDING_TIMEOUT:g})", _field("pending_timeout", _seconds)),
    MountOption("durability", "disk|process", "what close() promises: on disk (default, fdatasync per "
                "object) or in the store's files (survives the daemon; fsync() reaches the disk; as "
                "zarr-python's LocalStore)", _field("durability", _durability)),
    MountOption("read_ahead_kb", "N", "the kernel's read-ahead window for this mount, in KiB "
                f"(default {defaults.READ_AHEAD_KB}; root only)", _field("read_ahead_kb", _count)),
    MountOption("log_file", "PATH", "append the daemon's log (refused writes and why, errors) to PATH",
                _field("log_file", _path)),
    MountOption("endpoint_url", "URL", "object store endpoint (S3-compatible servers)",
                _storage("endpoint_url")),
    MountOption("profile", "NAME", "AWS profile for s3:// credentials", _storage("profile")),
    MountOption("region", "NAME", "object store region", _storage("region")),
    MountOption("anon", "", "anonymous access to a public bucket", _storage("anon")),
)
_BY_KEY = {option.key: option for option in MOUNT_OPTIONS}


def apply_mount_options(config: Any, options: list[str]) -> None:
    """Fold `-o a,b=c` options into the config; libfuse's own go to FUSE unchanged.
    Raises OptionError naming the option whose value does not parse, or that neither
    zfuse nor libfuse takes."""
    for group in options:
        for opt in filter(None, (o.strip() for o in group.split(","))):
            key, _, value = opt.partition("=")
            option = _BY_KEY.get(key)
            if option is not None:
                try:
                    option.apply(config, value)
                except ValueError as e:
                    raise OptionError(f"-o {opt}: {key} {e}" if not str(e).startswith(("not ", "needs "))
                                      else f"-o {opt}: {e}") from None
            elif key in _IGNORED or key.startswith("x-"):
                continue
            elif key in _FUSE_OPTIONS:
                config.fuse_options.append(opt)
            else:
                raise OptionError(_unknown(key))


#: libfuse's options zfuse refuses, and why
_REFUSED_FUSE_OPTIONS = {
    "max_read": "pyfuse3 sets the kernel's largest read itself; another made the kernel refuse the mount "
                "after it had said it was live",
}


def _unknown(key: str) -> str:
    """The refusal of an option neither zfuse nor libfuse takes, with the nearest names."""
    import difflib

    if key in _REFUSED_FUSE_OPTIONS:
        return f"option {key!r} is libfuse's, refused: {_REFUSED_FUSE_OPTIONS[key]}"
    near = difflib.get_close_matches(key, [*_BY_KEY, *_FUSE_OPTIONS], n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    return f"unknown option {key!r}{hint}; zfuse's options: zfuse mount -h"


def options_help(indent: int = 2, column: int = 20, width: int = 100) -> str:
    """The table as `zfuse mount -h` shows it: a name too long for its column puts its
    meaning on the lines below, never run together with it."""
    lines = []
    for option in MOUNT_OPTIONS:
        name = " " * indent + option.spelled
        body = textwrap.wrap(option.meaning, width - column)
        if len(name) < column:
            lines.append(name.ljust(column) + body[0])
        else:
            lines += [name, " " * column + body[0]]
        lines += [" " * column + more for more in body[1:]]
    return "\n".join(lines) + "\n"
