"""Which sources are local: a plain path, or a URL of fsspec's local filesystem
(`file://`, `local://`); every other URL is a remote store's. One rule for the mount's
checks and for opening the store (a `local://` store had passed as remote: past the
checks that a mount never reads itself, and read by path, not inside the store only)."""

from __future__ import annotations

LOCAL_SCHEMES = ("file://", "local://")


def local_path(source: str) -> str | None:
    """The path of a local source, None for a remote one."""
    for scheme in LOCAL_SCHEMES:
        if source.startswith(scheme):
            return source[len(scheme):]
    return None if "://" in source else source
