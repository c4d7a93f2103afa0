"""The mounted view as a tree of paths, with no FUSE in it.

Paths are tuples of names relative to the mount root. The tree holds:
groups and arrays (directories), each node's ``zarr.json`` (a file), the
directories that chunk keys imply (``c/``, ``c/0/``) and chunk files named by
the array's own chunk key plus ``.tiff``.

Each array's chunk files (names, which exist, bytes) are its `ArrayView`
(`array_view.py`), and each group's members its `HierarchyNode` (`members.py`:
listed and opened when asked, forgotten past a bound); this module puts the
arrays, groups, metadata files and whole-image files at their paths, and builds
the view from a zarr hierarchy.

Invariants:
- `entry()` never reads chunk data: a chunk file's size comes from metadata
  alone. `entry()` of one chunk file costs at most one existence check and
  `list_dir()` of a chunk directory one listing of that key prefix (see
  `array_view.py`); `View.needs_io()` (and `entry(..., memory_only=True)`) say
  whether an answer is already in memory, so callers on an event loop know when
  to use a thread.
"""

from __future__ import annotations

import bisect
import collections
import json
import logging
import operator
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import zarr

from zfuse.stats import Stats
from zfuse.view.array_view import ArrayView, ChunkCache, ViewOptions
from zfuse.view.caches import BoundedLRU, ViewCaches
from zfuse.view.entry import META_NAME, Entry, Node
from zfuse.view.hierarchy import (
    ImplicitGroup,
    json_default,
    member_names,
    node_type_of,
    open_members,
    stored_metadata,
    unsupported_metadata,
    unsupported_reason,
)
from zfuse.view.members import (
    NEEDS_IO,
    HierarchyNode,
    LiveArrays,
    MemberOpener,
    NeedsIO,
    OpenedMembers,
)
from zfuse.view.ome_zarr import ome_axes, ome_datasets
from zfuse.view.source import LIST_PAGE, ChunkSource, Coords, ZarrChunkSource, store_access
from zfuse.view.whole_image import NAMES as IMAGE_NAMES

if TYPE_CHECKING:
    from zfuse.store import MeteredStore
from zfuse.view.whole_image import (
    ImageWorkers,
    WholeImage,
    plan_whole_images,
    pyramid_dataset_paths,
)

log = logging.getLogger("zfuse.view")

README_NAME = "README"  # in the directory of a node shown without chunk files: why


CHUNK_ENTRIES_KEPT = 16384  # chunk files remembered as existing (View.entry)
# levels of groups shown below the root: a crafted hierarchy nested deeper (200 empty
# directories do it) would open members recursively past Python's stack
DEPTH_MAX = 64
PROBLEMS_KEPT = 10_000  # nodes shown without chunk files that are listed with their reason
IMAGE_DIRS_KEPT = 4096  # directories whose whole-image files stay planned (the least used are forgotten)

class Problem(NamedTuple):
    """A node shown without chunk files, and why (the reason names its path)."""

    path: str
    reason: str


class Problems:
    """The nodes shown without chunk files, found as groups open their members (from
    worker threads), kept in path order; watchers hear of each new one. At most
    PROBLEMS_KEPT are kept and told (a crafted store may hold a million broken
    members); the rest are counted (`problems_not_listed` in `.zfuse/stats`)."""

    def __init__(self, stats: Stats | None = None) -> None:
        self._found: list[Problem] = []
        self._seen: set[Problem] = set()
        self._watchers: list[Callable[[Problem], None]] = []
        self._lock = threading.Lock()
        self._stats = stats

    def add(self, problem: Problem) -> bool:
        """Whether `problem` is new and kept (the caller then logs it)."""
        with self._lock:
            if problem in self._seen:
                return False  # (found again: a member forgotten and opened anew, a group whose opening failed part way)
            if len(self._found) >= PROBLEMS_KEPT:
                if self._stats is not None:
                    self._stats.count("problems_not_listed")
                return False
            self._seen.add(problem)
            bisect.insort(self._found, problem, key=_problem_path)
            watchers = list(self._watchers)
        for seen in watchers:
            seen(problem)
        return True

    def found(self) -> list[Problem]:
        with self._lock:
            return list(self._found)

    def watch(self, seen: Callable[[Problem], None]) -> None:
        with self._lock:
            self._watchers.append(seen)


_problem_path = operator.attrgetter("path")


#: entries of the directory snapshots a view keeps for its readers (`View.dir_snapshots`)
DIR_SNAPSHOT_ENTRIES = 100_000

class View:
    """The whole mount: a hierarchy of groups and arrays, addressed by path."""

    def __init__(
        self, root: HierarchyNode, options: ViewOptions, cache: ChunkCache, problems: Problems | None = None,
        kept: OpenedMembers | None = None, alive: LiveArrays | None = None,
    ) -> None:
        self.root = root
        self.options = options
        self.cache = cache
        # every array (or group) shown without chunk files, with the reason, as found
        self._problems = problems or Problems()
        self._kept = kept or OpenedMembers(options.members_kept)
        self._alive = alive or LiveArrays()
        # directory path -> why it has no whole-image file (planned when first looked at;
        # at most IMAGE_DIRS_KEPT reasons)
        self.images_not_shown: dict[str, str] = {}
        # sorted snapshots of array directories, by (path, listing version): every open
        # of the directory reads the one snapshot (`DirReader`), entries counted
        # (bounded by the listing cache's names too: memory follows `listing_cache`)
        self.dir_snapshots = BoundedLRU(min(DIR_SNAPSHOT_ENTRIES, options.listing_cache_names))
        # (least used first: at most IMAGE_DIRS_KEPT directories)
        self._images: collections.OrderedDict[tuple[str, ...], dict[str, WholeImage]] = collections.OrderedDict()
        self._images_lock = threading.Lock()
        # the threads whole-image files use (read ahead, decode side by side): the view's,
        # for as long as it is the mount's
        self.image_workers = ImageWorkers()
        # chunk files found to exist, with their array's listing version then: a re-open
        # (a warm re-read opens every file again) answers without decoding its name
        # again, until the array's listings change (a write, a removal, a refresh)
        self._chunk_entries: dict[tuple[str, ...], tuple[ArrayView, Any, Entry]] = {}
        # the metered stores the view's sources were opened on (`make_view` sets them)
        self.stores: list[MeteredStore] = []

    @property
    def problems(self) -> list[Problem]:
        """Every node shown without chunk files so far, and why, in path order (a remote
        group's members are looked at when the group is first opened)."""
        return self._problems.found()

    def watch_problems(self, seen: Callable[[Problem], None]) -> None:
        """Call `seen` with every problem found from now on (any thread)."""
        self._problems.watch(seen)

    def arrays(self) -> Iterator[tuple[tuple[str, ...], ArrayView]]:
        """Every array opened so far and still held, by path (`open_all` first for all
        of them): the opened members' and those forgotten but still in use."""
        yield from self._alive.items()

    def open_all(self) -> None:
        """Open every group's members (store I/O: the whole hierarchy, as `zfuse info`
        describes it)."""
        def walk(node: HierarchyNode) -> None:
            for child in node.children.values():
                walk(child)

        walk(self.root)

    def open_paths(self, paths: Iterator[tuple[str, ...]] | list[tuple[str, ...]]) -> None:
        """Open the groups on these paths (store I/O), so that what a reload rebinds to
        (open files, pending writes) is found from memory."""
        for path in paths:
            try:
                self._split(path)
            except Exception as e:  # (its rebinding then finds nothing: the old node is kept)
                log.warning("%s: could not open the groups on the way: %s", "/".join(path), e)

    def _split(self, path: tuple[str, ...], *, memory_only: bool = False) -> tuple[HierarchyNode, tuple[str, ...]] | None:
        """The deepest group/array node on `path`, and the rest of the path. Groups on
        the way open their members if they have not (store I/O), unless `memory_only`:
        then None, the answer needs that I/O."""
        node = self.root
        through: list[HierarchyNode] = []  # the groups looked through: marked used, the deepest first
        before = self._kept.walking(through)  # (what they open forgets none of them)
        try:
            for i, name in enumerate(path):
                through.append(node)
                if memory_only:
                    if not node.loaded:
                        # (a group's own zarr.json is no member's name: answered as it is)
                        return (node, path[i:]) if path[i:] == (META_NAME,) else None
                    child = node.member_in_memory(name)
                    if child is NEEDS_IO:
                        return None
                else:
                    child = node.member(name)
                if child is None:
                    return node, path[i:]
                node = child  # type: ignore[assignment]
            return node, ()
        finally:
            self._kept.walking(before)
            if through:
                through.reverse()
                self._kept.used(through)

    def _split_opening(self, path: tuple[str, ...]) -> tuple[HierarchyNode, tuple[str, ...]]:
        split = self._split(path)
        assert split is not None
        return split

    def array_at(self, path: tuple[str, ...]) -> tuple[ArrayView | None, tuple[str, ...]]:
        node, rest = self._split_opening(path)
        return node.array, rest

    def chunk_at(self, path: tuple[str, ...], *, memory_only: bool = False) -> tuple[ArrayView | None, Coords | None]:
        """The array `path` is in, and the chunk it names (None: not a chunk file name).
        From the name alone: whether that chunk exists is not asked. `memory_only`:
        (None, None) where a group on the way has not opened its members yet."""
        split = self._split(path, memory_only=memory_only)
        if split is None:
            return None, None
        arr, rest = split[0].array, split[1]
        return arr, (arr.coords_of(rest) if arr is not None and rest else None)

    def retry_failed(self, path: tuple[str, ...]) -> None:
        """A chunk file looked up again: its store is asked again at once if a request
        for the chunk timed out or failed lately (cheap while none did)."""
        if any(store.failures.pending() for store in self.stores):
            arr, coords = self.chunk_at(path, memory_only=True)
            if arr is not None and coords is not None:
                arr.source.retry_failed(coords)

    def needs_io(self, path: tuple[str, ...], *, listing: bool = False) -> bool:
        """Whether `entry(path)` (or with `listing`, `list_dir(path)`) needs store I/O.
        False: the answer is in memory, callers on an event loop may call directly."""
        if not listing:
            return self.entry(path, memory_only=True) is NEEDS_IO
        split = self._split(path, memory_only=True)
        if split is None:
            return True
        node, rest = split
        if not rest and (not node.loaded or not self._images_planned(path)):
            # a group whose members are not open yet, or a directory whose whole-image
            # files are to be planned (again): that may open members (store I/O)
            return True
        arr = node.array
        return arr is not None and arr.needs_listing(rest)

    def entry(self, path: tuple[str, ...], *, memory_only: bool = False) -> Entry | None | NeedsIO:
        """What is at `path`. A chunk file not known yet costs one existence check
        (store I/O: worker thread, unless `needs_io(path)` is False); nothing lists.
        With `memory_only`, such a file gives `NEEDS_IO` instead: a caller on an event
        loop answers everything else without a thread hop, in one pass."""
        known = self._chunk_entries.get(path)
        if known is not None and known[0].listing_version == known[1]:
            return known[2]
        split = self._split(path, memory_only=memory_only)
        if split is None:
            return NEEDS_IO  # a group on the way opens its members first
        node, rest = split
        if not rest:
            return Entry(Node(node.kind), array=node.array)
        if rest == (META_NAME,):
            return Entry(Node.META, size=len(node.metadata), content=node.metadata)
        if rest == (README_NAME,) and node.readme:
            return Entry(Node.META, size=len(node.readme), content=node.readme)
        if len(rest) == 1 and rest[0] in IMAGE_NAMES:
            if memory_only and not self._images_planned(path[:-1]):
                return NEEDS_IO  # (planning may open members: store I/O)
            image = self.whole_images(path[:-1], node).get(rest[0])
            if image is not None:
                return Entry(Node.IMAGE, size=image.size, array=node.array, reader=image)
        arr = node.array
        if arr is None or arr.layout is None:
            return None
        coords = arr.coords_of(rest)
        if coords is not None:
            version = arr.listing_version  # (before the answer it stands for)
            exists = arr.known(coords) if memory_only else arr.exists(coords)
            if exists is None:
                return NEEDS_IO
            if not exists:
                return None
            found = Entry(Node.CHUNK, size=arr.file_size(coords), array=arr, coords=coords)
            if len(self._chunk_entries) >= CHUNK_ENTRIES_KEPT:
                self._chunk_entries.clear()  # (forgetting costs one name decoded again)
            self._chunk_entries[path] = (arr, version, found)
            return found
        # A directory some chunk key of the grid would live in exists even when
        # empty, so `cp x c/3/0.tiff` works after `rm c/3/*`.
        return Entry(Node.KEYDIR, array=arr) if arr.is_key_prefix(rest) else None

    def list_dir(self, path: tuple[str, ...]) -> list[tuple[str, Entry]]:
        """Entries of a directory, sorted by name. A chunk directory not listed yet is
        listed (that key prefix only; store I/O: worker thread, unless
        `needs_io(path, listing=True)` is False)."""
        out = [item for page in self.iter_entries(path) for item in page]
        out.sort(key=lambda item: item[0])
        return out

    def iter_entries(self, path: tuple[str, ...]) -> Iterator[list[tuple[str, Entry]]]:
        """Pages of a directory's entries, in listing order (see `list_dir`)."""
        node, rest = self._split_opening(path)
        if not rest:
            first = [(META_NAME, Entry(Node.META, size=len(node.metadata), content=node.metadata))]
            if node.readme:
                first.append((README_NAME, Entry(Node.META, size=len(node.readme), content=node.readme)))
            # (a big group's member not looked up yet: a directory, its kind unknown)
            first += [(name, _UNOPENED if child is None else Entry(Node(child.kind), array=child.array))
                      for name, child in node.listing()]
            first += [(name, Entry(Node.IMAGE, size=image.size, array=node.array, reader=image))
                      for name, image in self.whole_images(path, node).items()]
            yield first
        arr = node.array
        if arr is None or arr.layout is None:
            return
        # hot: one Entry per chunk file of every listing (100,000 in `ls -lR` of a big
        # array); positional construction, and one size for all unless edges are cropped
        # (tuple.__new__ with every field: a NamedTuple's own __new__ is a Python
        # function, 0.5 µs a call)
        keydir = Entry(Node.KEYDIR, 0, arr)  # shared: entries are immutable
        chunk, size, new = Node.CHUNK, (None if arr.options.crop_edges else arr.layout.file_size), tuple.__new__
        for page in arr.iter_dir(rest):
            if size is None:
                yield [(name, keydir if coords is None else Entry(chunk, arr.file_size(coords), arr, coords))
                       for name, coords in page]
            else:
                yield [(name, keydir if coords is None else new(Entry, (chunk, size, arr, coords, None, None)))
                       for name, coords in page]

    def list_ahead(self, path: tuple[str, ...]) -> bool:
        """List chunk directory `path` into the listing cache, if it is not there
        (store I/O: worker thread). For a recursive walker (`ls -R`, `find`), whose
        next directories are then answered from memory. True: it was listed."""
        node, rest = self._split_opening(path)
        arr = node.array
        if arr is None or not arr.needs_listing(rest):
            return False
        for _ in arr.iter_dir(rest):
            pass
        return True

    def listed_subdirs(self, path: tuple[str, ...], limit: int) -> list[str] | None:
        """The subdirectory names of chunk directory `path`, sorted, from its listing in
        memory; None when it is not listed, [] when it has more than `limit` entries."""
        split = self._split(path, memory_only=True)
        if split is None:
            return None
        node, rest = split
        arr = node.array
        if arr is None or arr.layout is None or arr.needs_listing(rest):
            return None
        names: list[str] = []
        seen = 0
        for page in arr.iter_dir(rest):
            seen += len(page)
            if seen > limit:
                return []
            names += [name for name, coords in page if coords is None]
        names.sort()
        return names

    def lists_locally(self, path: tuple[str, ...]) -> bool:
        """Whether listing directory `path` reads a local disk (short work in the calling
        thread), not a remote store."""
        split = self._split(path, memory_only=True)
        arr = None if split is None else split[0].array
        return arr is not None and arr.source.lists_locally

    def listing_version(self, path: tuple[str, ...]) -> Any:
        """A token that changes whenever a listing of `path` could (a refresh, a chunk
        added or removed in its array): a snapshot taken at an equal token is current."""
        split = self._split(path, memory_only=True)
        arr = None if split is None else split[0].array
        return None if arr is None else arr.listing_version

    def uniform_listing(self, path: tuple[str, ...]) -> tuple[list[str], Node, int, Any] | None:
        """(names sorted, node, size, listing version) of chunk directory `path` when its
        listing is in memory and its entries all share their attributes: every one a
        chunk file of one size, or every one a chunk directory. What a `list_dir` of it
        would show, without an Entry per name; None otherwise. From memory only."""
        split = self._split(path, memory_only=True)
        if split is None:
            return None
        node, rest = split
        arr = node.array
        if arr is None or not rest or arr.layout is None or not arr.is_key_prefix(rest):
            return None
        version = arr.listing_version  # (before the names it stands for)
        listed = arr.listed_names(rest)
        if listed is None or listed[1] is None:
            return None
        names, chunks = listed
        if chunks and arr.options.crop_edges:
            return None  # edge chunk files differ in size
        names.sort()
        return (names, Node.CHUNK, arr.layout.file_size, version) if chunks else (names, Node.KEYDIR, 0, version)

    def dir_reader(self, path: tuple[str, ...], tail: list[tuple[str, Entry]] | None = None) -> DirReader:
        """A reader of directory `path` for readdir, `tail` entries (scratch files) last."""
        return DirReader(self, path, tail or [])

    def refresh(self) -> None:
        self.cache.clear()
        with self._images_lock:
            self._images.clear()
            self.images_not_shown.clear()  # planned again on the next look
        for _, arr in self.arrays():
            arr.refresh()

    def _current_images(self, path: tuple[str, ...]) -> dict[str, WholeImage] | None:
        """Directory `path`'s whole-image files if they are planned and not stale."""
        with self._images_lock:
            images = self._images.get(path)
            if images is not None and not any(i.stale for i in images.values()):
                self._images.move_to_end(path)
                return images
        return None

    def _images_planned(self, path: tuple[str, ...]) -> bool:
        """Whether directory `path`'s whole-image files can be had from memory: planned
        and current, or to be planned from nodes all in memory (planning looks up the
        path, a group's members and its multiscale datasets: a forgotten one would be
        opened, store I/O)."""
        if self._current_images(path) is not None:
            return True
        split = self._split(path, memory_only=True)
        if split is None or split[1]:
            return False
        node = split[0]
        if node.kind != "group":
            return True
        return node.loaded and all(self._split((*path, *rel.strip("/").split("/")), memory_only=True) is not None
                                   for rel in pyramid_dataset_paths(node))

    def whole_images(self, path: tuple[str, ...], node: HierarchyNode | None = None) -> dict[str, WholeImage]:
        """The whole-image files directory `path` shows (planned from metadata; opening
        members the plan needs, if they were forgotten, is store I/O)."""
        images = self._current_images(path)
        if images is not None:
            return images
        if node is None:
            node, rest = self._split_opening(path)
            if rest:
                return {}
        parent = self._split_opening(path[:-1])[0] if path else None
        not_shown = self.images_not_shown if len(self.images_not_shown) < IMAGE_DIRS_KEPT else {}
        images = plan_whole_images(path, node, parent, not_shown, workers=self.image_workers)
        with self._images_lock:
            self._images[path] = images
            self._images.move_to_end(path)
            while len(self._images) > IMAGE_DIRS_KEPT:  # (a file open keeps its own)
                self._images.popitem(last=False)
        return images

    def all_whole_images(self) -> Iterator[tuple[tuple[str, ...], WholeImage]]:
        """Every whole-image file of the view, with its path."""

        def walk(node: HierarchyNode, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], WholeImage]]:
            for name, image in self.whole_images(path, node).items():
                yield (*path, name), image
            for name, child in node.children.items():
                yield from walk(child, (*path, name))

        yield from walk(self.root, ())


_UNOPENED = Entry(Node.GROUP)
_by_name = operator.itemgetter(0)  # sort key of (name, entry) pairs (in C: no call per item)


class DirReader:
    """One open directory, read by offset (readdir). A directory of up to
    `SNAPSHOT_MAX` names is one sorted snapshot taken at the first `fetch`; a
    bigger one (a flat array of a million chunks) is streamed in listing order,
    one page in memory at a time, and answered as soon as the page asked for is
    read. Seeking back restarts the listing.

    `at_hand` answers from memory (event loop); `fetch` may do store I/O (worker
    thread). One reader is used by one readdir at a time (the kernel serialises them).
    """

    SNAPSHOT_MAX = 10 * LIST_PAGE

    def __init__(self, view: View, path: tuple[str, ...], tail: list[tuple[str, Entry]]) -> None:
        self.view = view
        self.path = path
        self.tail = tail
        self._pages: Iterator[list[tuple[str, Entry]]] | None = None
        self._base = 0  # offset of _buffer[0]
        self._buffer: list[tuple[str, Entry]] = []
        self._done = False
        self._started = False
        self._version: Any = None  # the view's listing version when the listing started

    def current(self) -> bool:
        """Whether this reader, its snapshot taken (`fetch(0)`) and not read from yet,
        shows what a new reader would: a whole snapshot, taken at the view's current
        listing version (made ahead in another thread, it is then as good as new)."""
        return self._started and self._done and self._base == 0 and \
            self._version == self.view.listing_version(self.path)

    def at_hand(self, start: int) -> list[tuple[str, Entry]] | None:
        """Entries from offset `start` that are in memory; [] at the end; None: `fetch` first."""
        if not self._started:
            return None
        end = self._base + len(self._buffer)
        if self._base <= start < end:
            return self._buffer[start - self._base :]
        if start >= end and self._done:
            return []
        return None

    def fetch(self, start: int) -> None:
        """Read until offset `start` is at hand (store I/O for directories not listed)."""
        if not self._started or start < self._base:
            self._restart()
        assert self._pages is not None
        while not self._done and start >= self._base + len(self._buffer):
            self._base += len(self._buffer)
            page = next(self._pages, None)
            if page is None:
                self._buffer, self._done = self.tail, True
            else:
                self._buffer = page

    def _restart(self) -> None:
        self._version = self.view.listing_version(self.path)
        self._base, self._done, self._started = 0, False, True
        # an array directory's snapshot at this listing version (a big one's first
        # entries), shared by every reader of it: each opendir listed and held its own
        # (1,000 handles of a 10,000-chunk directory held 1.6 GB, and opendir loops
        # starved other clients)
        key = (self.path, self._version) if self._version is not None and not self.tail else None
        shared = self.view.dir_snapshots.get(key) if key is not None else None
        if shared is not None:
            entries, whole = shared
            self._buffer, self._done = entries, whole
            # (big: the listing after the shared first entries, read when asked for)
            self._pages = iter(()) if whole else _after(self.view.iter_entries(self.path), len(entries))
            return
        self._pages = self.view.iter_entries(self.path)
        first: list[tuple[str, Entry]] = []
        for page in self._pages:
            first += page
            if len(first) > self.SNAPSHOT_MAX:
                self._buffer = first  # big: streamed from here on, in listing order
                if key is not None:
                    self.view.dir_snapshots.put(key, (first, False), len(first) + 1)
                return
        first.sort(key=_by_name)
        self._buffer, self._done = first + self.tail, True
        if key is not None:
            self.view.dir_snapshots.put(key, (self._buffer, True), len(self._buffer) + 1)


def _after(pages: Iterator[list[tuple[str, Entry]]], skip: int) -> Iterator[list[tuple[str, Entry]]]:
    """The pages of a listing after its first `skip` entries (read, not held)."""
    for page in pages:
        if skip >= len(page):
            skip -= len(page)
            continue
        yield page[skip:]
        skip = 0


# -- building a view from a source -------------------------------------------


def _group_metadata(group: zarr.Group) -> bytes:
    meta = {"zarr_format": 3, "node_type": "group", "attributes": dict(group.attrs)}
    return json.dumps(meta, indent=2, default=json_default).encode()


def _readme(reason: str) -> bytes:
    return (
        f"{reason}\n\n"
        "zfuse shows this node without chunk files; the rest of the hierarchy is shown as usual.\n"
    ).encode()


def build_view(
    obj: zarr.Group | zarr.Array | ChunkSource, options: ViewOptions, stats: Stats | None = None
) -> View:
    """The view of a zarr group/array (or any chunk source) opened by the caller.

    Each member is opened on its own (`hierarchy.open_members`): an array
    that zarr-python cannot open, or that has no TIFF form, is a directory
    with its ``zarr.json`` and a ``README`` saying why, and is listed in
    `View.problems`; its neighbours are shown as usual. A local store's groups are
    opened here, all of them; a remote store's when first looked at. A group of more
    than MEMBERS_OPENED_TOGETHER names opens each member when it is looked up (`HierarchyNode`).
    """
    cache = ChunkCache(options.cache_bytes)
    caches = ViewCaches(options.listing_cache_names, options.shard_index_cache_bytes, stats)
    problems = Problems(stats)
    kept = OpenedMembers(options.members_kept, stats)
    alive = LiveArrays()
    # a remote store's groups open their members when first looked at: a mount is
    # live once the root is read, not after a listing and a request per member
    lazy = isinstance(obj, zarr.Group) and store_access(obj.store_path.store).remote

    def shown_path(path: tuple[str, ...]) -> str:
        return "/".join(path) or "/"

    def not_shown(path: tuple[str, ...], kind: str, reason: str, metadata: bytes) -> HierarchyNode:
        if problems.add(Problem(shown_path(path), reason)):
            log.warning("%s", reason)
        return HierarchyNode(kind, metadata=metadata, readme=_readme(reason))

    def array_node(source: ChunkSource, ome: dict[str, Any] | None, path: tuple[str, ...]) -> HierarchyNode:
        try:
            view = alive.get(path)  # opened before, forgotten by its group, still in use
            if view is None:
                view = alive.add(path, ArrayView(source, options, cache, ome, stats, caches))
        except Exception as exc:  # metadata the view cannot lay out: this array only
            doc = source.stored_form()
            reason = unsupported_reason(shown_path(path), exc, doc)
            return not_shown(path, "array", reason, unsupported_metadata(doc, reason))
        if view.unsupported:
            reason = unsupported_reason(shown_path(path), view.unsupported, {"node_type": "array"})
            node = not_shown(path, "array", reason, view.metadata_bytes)
            node.array = view
            return node
        return HierarchyNode("array", array=view, metadata=None)  # (made when first read)

    def failed_node(group: zarr.Group, name: str, exc: BaseException, path: tuple[str, ...]) -> HierarchyNode:
        try:
            doc = stored_metadata(group.store_path.store, "/".join(p for p in (group.path, name) if p))
        except Exception:  # (the store failing that read too: the member's own failure says why)
            doc = None
        kind = node_type_of(doc) or "array"
        reason = unsupported_reason(shown_path(path), exc, doc)
        return not_shown(path, kind, reason, unsupported_metadata(doc, reason))

    def group_node(group: zarr.Group, path: tuple[str, ...],
                   datasets: dict[tuple[str, ...], dict[str, Any]]) -> HierarchyNode:
        """`datasets`: OME axes and scales of the arrays that multiscales of groups above
        name, by path: a dataset may be nested (ngff-zarr's `scale0/image`)."""
        attrs = dict(group.attrs)
        try:
            here = ome_datasets(attrs) or {}
        except Exception as e:  # noqa: BLE001 - crafted attributes: that group shown plain, not the store refused
            log.warning("%s: OME-Zarr multiscales not understood, shown without them: %s: %s",
                        shown_path(path), type(e).__name__, e)
            here = {}
        datasets = {**datasets, **{(*path, *rel.split("/")): ome for rel, ome in here.items() if rel}}

        def open_named(names: list[str]) -> dict[str, HierarchyNode]:
            if stats is not None:
                stats.count("group_members_opened", len(names))
            children: dict[str, HierarchyNode] = {}
            for name, member in open_members(group, names):
                member_path = (*path, name)
                if len(member_path) > DEPTH_MAX:
                    kind = "group" if isinstance(member, zarr.Group) else "array"
                    reason = unsupported_reason(shown_path(member_path), f"more than {DEPTH_MAX} levels of "
                                                "groups below the mount's root", {"node_type": kind})
                    doc = {"zarr_format": 3, "node_type": kind}
                    children[name] = not_shown(member_path, kind, reason, unsupported_metadata(doc, reason))
                elif isinstance(member, BaseException):
                    children[name] = failed_node(group, name, member, member_path)
                elif isinstance(member, zarr.Group):
                    child = group_node(member, member_path, datasets)
                    if isinstance(member, ImplicitGroup) and child.is_empty():
                        continue  # a directory with nothing zarr can reach below it
                    children[name] = child
                else:
                    try:
                        source: ChunkSource = ZarrChunkSource(member, name=member.path)
                    except Exception as exc:
                        children[name] = failed_node(group, name, exc, member_path)
                        continue
                    ome = datasets.get(member_path) or ome_axes(attrs, name)
                    children[name] = array_node(source, ome, member_path)
            return children

        opener = MemberOpener(lambda: member_names(group), open_named, [rel for rel in here if rel], kept)
        node = HierarchyNode("group", metadata=_group_metadata(group), opener=opener)
        if not lazy and kept.has_room():
            node.is_empty()  # a local store's members are listed (and opened, up to bounds) now
        return node

    if isinstance(obj, zarr.Group):
        root = group_node(obj, (), {})
    elif isinstance(obj, zarr.Array):
        root = array_node(ZarrChunkSource(obj, name=obj.path), None, ())
    else:
        root = array_node(obj, None, ())
    return View(root, options, cache, problems, kept, alive)
