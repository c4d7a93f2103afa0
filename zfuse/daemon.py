"""Mount lifecycle: open a source, build the view, serve it over FUSE, unmount.

The CLI parses arguments into `MountConfig`; `serve()` runs in the daemon
process. Readiness is reported once the kernel mount exists: to a parent
process through a pipe (background mode) and to systemd (`NOTIFY_SOCKET`,
Type=notify). SIGTERM/SIGINT unmount cleanly after committing what open
files hold; SIGHUP drops cached metadata, listings and chunks.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from zfuse.stats import Stats
from zfuse.store import MeteredStore, open_store
from zfuse.view.tree import View, ViewOptions, build_view

log = logging.getLogger("zfuse.daemon")


@dataclass
class MountConfig:
    sources: list[str]
    mountpoint: str
    concat_axis: int | None = None
    read_only: bool = False
    allow_other: bool = False
    cache_bytes: int = 256 * 1024 * 1024
    listing_cache_names: int = ViewOptions.listing_cache_names
    index_cache_bytes: int = ViewOptions.shard_index_cache_bytes
    all_chunks: bool = False
    crop_edges: bool = False
    max_threads: int = 8
    metadata_ttl: float | None = None
    timeout: float | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    fuse_options: list[str] = field(default_factory=list)


def open_source(
    sources: list[str],
    concat_axis: int | None = None,
    *,
    read_only: bool = False,
    storage_options: dict[str, Any] | None = None,
    stats: Stats | None = None,
    timeout: float | None = None,
) -> Any:
    """The zarr group/array (or concatenation) a mount shows, on metered stores."""
    from zfuse.ext.api import open_array, open_group

    mode = "r" if read_only else "r+"

    def store_of(source: str) -> MeteredStore:
        return MeteredStore(open_store(source, read_only=read_only, storage_options=storage_options),
                            stats, timeout)

    if concat_axis is not None:
        from zfuse.concat import concat

        return concat([open_array(store_of(s), mode=mode) for s in sources], axis=concat_axis)
    (source,) = sources
    from zfuse.concat import is_concat_description, load_concat

    if os.path.isfile(source) and is_concat_description(source):
        return load_concat(source, mode=mode)
    store = store_of(source)
    try:
        return open_group(store, mode=mode)
    except Exception as group_error:
        try:
            return open_array(store, mode=mode)
        except Exception:
            raise group_error from None


READ_ONLY_SCHEMES = ("http://", "https://")


def make_view(config: MountConfig, stats: Stats | None = None) -> View:
    if not config.read_only and any(s.startswith(READ_ONLY_SCHEMES) for s in config.sources):
        log.info("http(s) sources are read-only: mounting read-only")
        config.read_only = True
    options = ViewOptions(
        all_chunks=config.all_chunks,
        crop_edges=config.crop_edges,
        cache_bytes=config.cache_bytes,
        read_only=config.read_only,
        listing_cache_names=config.listing_cache_names,
        shard_index_cache_bytes=config.index_cache_bytes,
    )
    obj = open_source(config.sources, config.concat_axis, read_only=config.read_only,
                      storage_options=config.storage_options, stats=stats, timeout=config.timeout)
    from zfuse.concat import ConcatArray

    if isinstance(obj, ConcatArray):
        from zfuse.view.concat_source import ConcatChunkSource

        obj = ConcatChunkSource(obj)
    return build_view(obj, options, stats)


def sd_notify(message: str) -> None:
    """Send a systemd notification if NOTIFY_SOCKET is set (no libsystemd needed)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


def check_mountpoint(mountpoint: str) -> None:
    path = Path(mountpoint)
    if not path.is_dir():
        raise SystemExit(f"zfuse: mountpoint {mountpoint} is not a directory")
    if os.path.ismount(path):
        raise SystemExit(f"zfuse: mountpoint {mountpoint} is busy (already a mount point)")
    if not os.path.exists("/dev/fuse"):
        raise SystemExit("zfuse: /dev/fuse is missing (is the fuse kernel module loaded?)")


def serve(
    config: MountConfig,
    view: View,
    stats: Stats,
    on_ready: Callable[[], None] | None = None,
    reload: Callable[[], View] | None = None,
) -> None:
    """Mount `view` at the mountpoint and serve until unmounted or signalled."""
    import pyfuse3

    from zfuse.fuse_ops import ZfuseOperations

    ops = ZfuseOperations(view, read_only=config.read_only, max_threads=config.max_threads, stats=stats)
    ops.reload = reload
    options = {"fsname=zfuse", "subtype=zfuse", "default_permissions", *config.fuse_options}
    if config.read_only:
        options.add("ro")
    if config.allow_other:
        options.add("allow_other")
    pyfuse3.init(ops, config.mountpoint, options)
    unmounted = False
    try:
        log.info("mounted %s at %s", " ".join(config.sources), config.mountpoint)
        if on_ready is not None:
            on_ready()
        sd_notify("READY=1\nSTATUS=mounted " + config.mountpoint)
        trio.run(_main, ops, config)
        sd_notify("STOPPING=1")
    finally:
        try:
            pyfuse3.close(unmount=True)
            unmounted = True
        finally:
            log.info("unmounted %s%s", config.mountpoint, "" if unmounted else " (failed)")


async def _main(ops: Any, config: MountConfig) -> None:
    import pyfuse3

    async with trio.open_nursery() as nursery:
        ops.nursery = nursery
        nursery.start_soon(_watch_signals, ops)
        if config.metadata_ttl:
            nursery.start_soon(_refresh_every, ops, config.metadata_ttl)
        await pyfuse3.main()
        await ops.writes.commit_all(ops._thread)
        nursery.cancel_scope.cancel()


async def _watch_signals(ops: Any) -> None:
    import pyfuse3

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                log.info("SIGHUP: reloading metadata and dropping caches")
                await ops.refresh()
                continue
            log.info("%s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


async def _refresh_every(ops: Any, seconds: float) -> None:
    while True:
        await trio.sleep(seconds)
        await ops.refresh()
