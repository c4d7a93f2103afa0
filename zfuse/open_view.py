"""Opening what a mount shows: the sources' stores, the zarr node (or concatenation) at
their root, and the view built from it. No FUSE: `zfuse info` and the tests build a
view here without a daemon; the daemon serves the view the CLI built here.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from zfuse.errors import MetadataError
from zfuse.source_paths import local_path
from zfuse.stats import Stats

if TYPE_CHECKING:  # zarr and the view are imported where used: `zfuse --help` starts without them
    from zfuse.daemon import MountConfig
    from zfuse.store import MeteredStore
    from zfuse.view.tree import View

log = logging.getLogger("zfuse.daemon")  # the name its lines always had


def open_source(
    sources: list[str],
    concat_axis: int | None = None,
    *,
    read_only: bool = False,
    storage_options: dict[str, Any] | None = None,
    stats: Stats | None = None,
    timeout: float | None = None,
    durable: bool = True,
    unsettled: list[Any] | None = None,
    opened_from: list[tuple[str, Any]] | None = None,
) -> Any:
    """The zarr group/array (or concatenation) a mount shows, on metered stores. Each
    request is bounded by `timeout` seconds (0: not bounded); by default a remote
    source's by DEFAULT_REMOTE_TIMEOUT, a local directory's not at all.

    A read-write S3 store's probe of conditional writes runs in the background; it is
    waited for here, or, with `unsettled`, left to the caller (`MeteredStore.settle_conditions`
    of each store put there), which builds the view meanwhile. `opened_from`: gets
    (source, store) of each source opened as a store here."""
    from zfuse.ext.api import open_array
    from zfuse.store import MeteredStore, default_timeout, is_remote, open_store

    mode = "r" if read_only else "r+"
    opened: list[MeteredStore] = []

    def store_of(source: str) -> MeteredStore:
        store = MeteredStore(open_store(source, read_only=read_only, storage_options=storage_options,
                                        durable=durable), stats, default_timeout(source, timeout), source)
        opened.append(store)
        if opened_from is not None:
            opened_from.append((source, store))
        return store

    def settled(node: Any) -> Any:
        """What was opened, once each remote store's probe of conditional writes (run
        meanwhile, in the background) has answered: a store that ignores them is refused
        here, at the mount, not at the first write."""
        if unsettled is not None:
            unsettled.extend(opened)
            return node
        for store in opened:
            store.settle_conditions()
        return node

    if concat_axis is not None:
        from zfuse.ext.concat import concat

        return settled(concat([open_array(store_of(s), mode=mode) for s in sources], axis=concat_axis,
                              names=sources))
    (source,) = sources
    from zfuse.ext.concat import is_concat_description, load_concat

    if os.path.isfile(source) and is_concat_description(source):
        # its sources on the mount's own stores: nothing outside a local source's
        # directory is read (zarr's own store followed a chunk's link to /etc/shadow)
        return settled(load_concat(source, mode=mode, store_of=store_of))
    if not is_remote(source):
        return _open_node(store_of(source), source, mode)
    from zfuse.ext.open_memo import OpenMemo

    # a remote root's zarr.json is read by four steps of opening: one round trip, not four
    memo = OpenMemo(store_of(source))
    try:
        return settled(_open_node(memo, source, mode))
    finally:
        memo.close_memo()


def _open_node(store: Any, source: str, mode: str) -> Any:
    """The group or array at the root of `store`; refused with the node's own reason.

    What the root is comes from its stored metadata, so a single-array store
    zarr-python cannot open is refused with the array's reason, not with the
    error of trying it as a group.
    """
    from zfuse.errors import MetadataError
    from zfuse.ext.api import open_array, open_group, resolve_store
    from zfuse.view.hierarchy import (
        check_codecs,
        node_type_of,
        open_root_group,
        stored_metadata,
        unsupported_reason,
    )

    wrapped, path = resolve_store(store, mode)
    doc = stored_metadata(wrapped, path)
    if isinstance(doc, dict) and "zfuse_unparsable" in doc:
        # past zfuse's bounds (too large, nested too deep) or no JSON: say so, not what
        # zarr-python says of a store it finds nothing in (or its RecursionError)
        raise MetadataError(f"{source}: {doc['zfuse_unparsable']}")
    kind = node_type_of(doc)
    # the format read off the stored document: zarr-python probes no other format's files
    known: dict[str, Any] = {"zarr_format": doc["zarr_format"]} if doc and doc.get("zarr_format") in (2, 3) else {}
    if kind == "array":
        try:
            array = open_array(wrapped, mode=mode, path=path or None, **known)
            check_codecs(array)
            return array
        except Exception as exc:
            raise MetadataError(unsupported_reason(source, exc, doc)) from exc
    if kind == "group":
        try:
            return open_root_group(lambda s, **kw: open_group(s, mode=mode, path=path or None, **known, **kw),
                                   wrapped)
        except Exception as exc:
            raise MetadataError(unsupported_reason(source, exc, doc)) from exc
    # nothing recognisable at the root: let zarr-python say why
    try:
        return open_group(wrapped, mode=mode, path=path or None)
    except Exception as group_error:
        try:
            return open_array(wrapped, mode=mode, path=path or None)
        except Exception:
            raise group_error from None


READ_ONLY_SCHEMES = ("http://", "https://")


def make_view(config: MountConfig, stats: Stats | None = None, *, all_members: bool = False,
              opened_from: list[tuple[str, Any]] | None = None) -> View:
    """The view of the config's sources. `all_members`: keep every group member opened
    (`zfuse info` describes them all), not a mount's bounded number. `opened_from`: see
    `open_source`."""
    if not config.read_only and any(s.startswith(READ_ONLY_SCHEMES) for s in config.sources):
        log.info("http(s) sources are read-only: mounting read-only")
        config.read_only = True
    from zfuse.view.tree import ViewOptions, build_view

    options = ViewOptions(
        all_chunks=config.all_chunks,
        crop_edges=config.crop_edges,
        cache_bytes=config.cache_bytes,
        read_only=config.read_only,
        listing_cache_names=config.listing_cache_names,
        shard_index_cache_bytes=config.index_cache_bytes,
        read_ahead_bytes=config.read_ahead_kb * 1024,
        members_kept=None if all_members else config.members_kept,
        lossy_writes=config.lossy_writes,
    )
    unsettled: list[MeteredStore] = []
    opened: list[tuple[str, Any]] = []
    obj = open_source(config.sources, config.concat_axis, read_only=config.read_only,
                      storage_options=config.storage_options, stats=stats, timeout=config.timeout,
                      durable=config.durable, unsettled=unsettled, opened_from=opened)
    if opened_from is not None:
        opened_from.extend(opened)
    from zfuse.ext.concat import ConcatArray

    if isinstance(obj, ConcatArray):
        from zfuse.view.concat_source import ConcatChunkSource

        obj = ConcatChunkSource(obj)
    view = build_view(obj, options, stats)
    view.stores = [store for _, store in opened]
    # the conditional-writes probe ran while the members were listed and opened: a store
    # that ignores conditions is refused now, before the mount is served
    for store in unsettled:
        store.settle_conditions()
    return view


def local_source_identities(config: MountConfig) -> dict[str, tuple[int, int, int]]:
    """(device, inode, owner) of each local source as the mount found it (links
    followed: the directory or description file mounted), for `reload_view`."""
    from zfuse.ext.concat import description_sources
    from zfuse.store import is_remote

    paths = []
    for source in config.sources:
        if not is_remote(source):
            paths.append(source)
            # (a description's sources too, as it names them now)
            paths += [s for s in description_sources(local_path(source) or source) if not is_remote(s)]
    found = {}
    for path in paths:
        try:
            st = os.stat(local_path(path) or path)
        except OSError:
            continue
        found[path] = (st.st_dev, st.st_ino, st.st_uid)
    return found


def reload_view(config: MountConfig, stats: Stats | None, identities: dict[str, tuple[int, int, int]]) -> View:
    """The view made again (a reload), of the sources the mount opened: a local source
    path that now names another directory or file of *another owner* (swapped for a
    link to someone else's store by whoever may write its parent) is refused
    (MetadataError: the reload keeps the view it had). A root daemon mounted -o
    allow_other otherwise served, after the next reload, a store only root may read.
    One of the same owner (`mv new.zarr a.zarr`, a description saved anew by `zfuse
    concat` or an editor) is what its owner could have written in place: reloaded."""
    from zfuse.view.source import store_access

    def check(source: str, found: tuple[int, int, int] | None) -> None:
        dev, ino, owner = identities[source]
        if found is None or (found[:2] != (dev, ino) and found[2] != owner):
            raise MetadataError(f"{source} is no longer what was mounted (replaced by another "
                                "owner's, or gone, since the mount): not reloaded; mount it again "
                                "to show what is there now")

    now = local_source_identities(config)
    for source, (dev, _, _) in now.items():
        if dev == config.mount_dev:  # (opening it would read this very mount: wait for itself)
            raise MetadataError(f"{source} is now inside this mount ({config.mountpoint}) itself: not "
                                "reloaded; the daemon would read its own mount")
    for source in identities:
        # (a description's source it no longer names: not looked at; one it names anew:
        # nothing to compare with, as at the mount)
        if source in config.sources or source in now:
            check(source, now.get(source))
    opened: list[tuple[str, Any]] = []
    view = make_view(config, stats, opened_from=opened)
    # and the directory each store opened (the path may have been swapped back meanwhile)
    for source, store in opened:
        files = store_access(store).files
        if source in identities and files is not None:
            st = os.fstat(files.root_fd())
            check(source, (st.st_dev, st.st_ino, st.st_uid))
    return view
