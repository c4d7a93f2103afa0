"""The mounted view as a tree of paths, with no FUSE in it.

Paths are tuples of names relative to the mount root. The tree holds:
groups and arrays (directories), each node's ``zarr.json`` (a file), the
directories that chunk keys imply (``c/``, ``c/0/``) and chunk files named by
the array's own chunk key plus ``.tiff``.

Each array's chunk files (names, which exist, bytes) are its `ArrayView`
(`array_view.py`); this module puts the arrays, groups, metadata files and
whole-image files at their paths, and builds the view from a zarr hierarchy.

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
import enum
import json
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import zarr

from zfuse.stats import Stats
from zfuse.view.array_view import ArrayView, ChunkCache, ViewOptions
from zfuse.view.caches import ViewCaches
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
from zfuse.view.source import LIST_PAGE, ChunkSource, Coords, ZarrChunkSource, store_access
from zfuse.view.tiff_meta import ome_axes, ome_datasets
from zfuse.view.whole_image import NAMES as IMAGE_NAMES
from zfuse.view.whole_image import ImageWorkers, WholeImage, plan_whole_images

log = logging.getLogger("zfuse.view")

README_NAME = "README"  # in the directory of a node shown without chunk files: why


class NeedsIO(enum.Enum):
    """`View.entry(..., memory_only=True)`: the answer needs store I/O."""

    NEEDS_IO = "needs store I/O"


NEEDS_IO = NeedsIO.NEEDS_IO
CHUNK_ENTRIES_KEPT = 16384  # chunk files remembered as existing (View.entry)
# a group with more member names opens each member when first looked up, not all at once
MEMBERS_OPENED_TOGETHER = 1000
MEMBERS_OPENED_AHEAD = 16  # a lookup there opens the member and the next ones listed (one wave)
# levels of groups shown below the root: a crafted hierarchy nested deeper (200 empty
# directories do it) would open members recursively past Python's stack
DEPTH_MAX = 64
PROBLEMS_KEPT = 10_000  # nodes shown without chunk files that are listed with their reason
IMAGE_DIRS_KEPT = 4096  # directories whose whole-image files stay planned (the least used are forgotten)

class MemberOpener(NamedTuple):
    """How a group's members are found and opened (made by `build_view`)."""

    names: Callable[[], list[str]]  # the names members may have, sorted (store I/O: a listing)
    # the nodes of these names (store I/O); names that are no node are left out
    open: Callable[[list[str]], dict[str, _Node]]
    datasets: list[str]  # relative paths of multiscale datasets, opened with the group
    kept: OpenedMembers  # the view's bound on members held opened


class OpenedMembers:
    """The members a view's groups hold opened: at most `limit` together (None: no
    bound, for `zfuse info`, which describes them all).

    Past the bound, the groups used least lately forget their opened members (a
    crafted store of a million members, walked by `find`, would otherwise keep every
    one, about 15 KB each); a forgotten member is opened again when next looked up, and
    an array's view still in use (an open file, a pending write) is found again rather
    than made anew (`build_view`'s `alive`). A lookup marks the groups on its path used,
    deepest first (`View._split`), so a group is always more recent than the groups
    below it: members are forgotten from the leaves up. The groups a lookup is going
    through (`walking`) are never forgotten by what it opens."""

    def __init__(self, limit: int | None, stats: Stats | None = None) -> None:
        self.limit = limit
        self.stats = stats
        self._held: collections.OrderedDict[_Node, int] = collections.OrderedDict()  # least used first
        self._total = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # .path: the groups this thread's lookup goes through
        if stats is not None and limit is not None:
            stats.gauge("group_members_held", lambda: self._total)

    def walking(self, path: list[_Node] | None) -> list[_Node] | None:
        """This thread's lookup goes through the groups in `path` (a list it appends to;
        None: no lookup). Returns the one it replaces, to be set back after."""
        before = getattr(self._local, "path", None)
        self._local.path = path
        return before

    def has_room(self) -> bool:
        """Whether a local store's groups may still open their members at mount: while
        fewer than half the bound are held. (Up to the bound, a walker going through the
        store in listing order would find each group forgotten just before it got
        there, as the ones after it were opened: every member opened twice.)"""
        return self.limit is None or self._total < self.limit // 2

    def used(self, groups: list[_Node]) -> None:
        """These groups were looked through, the deepest first."""
        if self.limit is None:
            return
        with self._lock:
            held = self._held
            for group in groups:
                if group in held:
                    held.move_to_end(group)

    def opened(self, group: _Node, count: int) -> None:
        """`group` holds `count` more members opened: past the bound, others forget."""
        if self.limit is None or count <= 0:
            return
        walked = getattr(self._local, "path", None) or ()
        with self._lock:
            self._held[group] = self._held.get(group, 0) + count
            self._held.move_to_end(group)
            self._total += count
            over = self._total - self.limit
            victims = []
            for other, held in self._held.items():
                if over <= 0:
                    break
                if other is not group and not any(other is on_path for on_path in walked):
                    victims.append(other)
                    over -= held
            for other in victims:
                self._total -= self._held.pop(other)
        forgotten = sum(other.forget_members() for other in victims)
        if over > 0 and group.is_big:  # this group alone is past the bound (a big one walked): its oldest
            own = group.forget_members(over + self.limit // 4)  # (a quarter more: not one per lookup)
            forgotten += own
            with self._lock:
                if group in self._held:
                    self._held[group] -= own
                    self._total -= own
        if forgotten and self.stats is not None:
            self.stats.count("group_members_forgotten", forgotten)


class _Node:
    """A group or array of the hierarchy.

    A group lists its members when first asked (`_list`): a remote store's then, a
    local store's at mount. A group of at most MEMBERS_OPENED_TOGETHER names opens them
    all at once (a metadata read each, side by side). A bigger one (a plate of
    thousands of wells, a crafted store of a million) opens each member when it is
    first looked up, so listing it costs the listing alone and memory grows with what
    is looked at, not with what the store holds. Either forgets its opened members
    when the view holds too many (`OpenedMembers`), and opens them again when asked.

    (Threads: what a group holds is replaced, never changed in place, except a big
    group's `_opened`, added to under its lock: a reader takes each attribute once.)"""

    __slots__ = ("_children", "_lock", "_names", "_opened", "_opener", "array", "kind", "metadata", "readme")

    def __init__(self, kind: str, *, array: ArrayView | None = None, metadata: bytes = b"", readme: bytes = b"",
                 opener: MemberOpener | None = None) -> None:
        self.kind = kind  # "group" | "array"
        self.array = array
        self.metadata = metadata
        self.readme = readme  # why the node is shown without chunk files (empty: it is not)
        self._opener = opener
        # every member, opened (a small group, or a node without members); None: not yet
        self._children: dict[str, _Node] | None = {} if opener is None else None
        self._names: list[str] | None = None  # a big group: the names listed (sorted)
        self._opened: dict[str, _Node | None] = {}  # a big group: looked up so far (None: no node)
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the members are listed (their names answer from memory)."""
        return self._children is not None or self._names is not None

    def _list(self) -> None:
        """List the members if not yet (store I/O; a failure, such as a timeout, leaves
        them to be listed on the next ask): one listing for every thread that asks."""
        if self.loaded:
            return
        opener = self._opener
        assert opener is not None
        with self._lock:
            if self.loaded:
                return
            names = opener.names()
            children = opener.open(names) if len(names) <= MEMBERS_OPENED_TOGETHER else None
            opened: dict[str, _Node | None] = {}
            # the groups this one's multiscale datasets lie in (ngff-zarr's scale0/image)
            # open with it, side by side: its pyramid file is then planned from memory
            if children is None:
                firsts = list(dict.fromkeys(rel.split("/")[0] for rel in opener.datasets))
                found = opener.open(firsts) if firsts else {}
                opened.update((first, found.get(first)) for first in firsts)
            for rel in opener.datasets:
                first, *below = rel.split("/")
                node = children.get(first) if children is not None else opened[first]
                for name in below[:-1]:
                    node = None if node is None else node.member(name)
            if children is not None:
                self._children = children
            else:
                self._opened = opened
                self._names = names
        # (outside the lock: other groups may be told to forget theirs)
        opener.kept.opened(self, len(children) if children is not None else len(opened))

    def _listed_now(self) -> tuple[dict[str, _Node] | None, list[str], dict[str, _Node | None]]:
        """(every member, or None for a big group; its names; those opened so far),
        listed first if they are not (store I/O)."""
        while True:
            self._list()
            children, names, opened = self._children, self._names, self._opened
            if children is not None:
                return children, [], {}
            if names is not None:
                return None, names, opened
            # (forgotten meanwhile: listed again)

    def member(self, name: str) -> _Node | None:
        """The member `name`, None if there is none (store I/O while not listed, and for a
        big group while `name` is not opened yet)."""
        children, names, opened = self._listed_now()
        if children is not None:
            return children.get(name)
        if name in opened:
            return opened[name]
        i = bisect.bisect_left(names, name)
        if i == len(names) or names[i] != name:
            return None
        # with the names after it (a walker's next lookups, in listing order), side by side
        batch = [name, *[n for n in names[i + 1:i + 2 * MEMBERS_OPENED_AHEAD] if n not in opened]]
        return self._open_into_opened(batch[:MEMBERS_OPENED_AHEAD]).get(name)

    def member_in_memory(self, name: str) -> _Node | None | NeedsIO:
        """`member(name)` if memory answers it, else NEEDS_IO."""
        children, names, opened = self._children, self._names, self._opened
        if children is not None:
            return children.get(name)
        if names is None:
            return NEEDS_IO
        if name in opened:
            return opened[name]
        return NEEDS_IO if _listed(names, name) else None

    def has_member(self, name: str) -> bool:
        """Whether a member may be called `name` (from the listing: nothing is opened)."""
        children, names, _ = self._listed_now()
        return name in children if children is not None else _listed(names, name)

    def listing(self) -> list[tuple[str, _Node | None]]:
        """(name, member) by name; for a big group a member not looked up yet is None:
        a directory, neither opened nor known to be a node (store I/O: the listing)."""
        children, names, opened = self._listed_now()
        if children is not None:
            return list(children.items())
        return [(name, opened.get(name)) for name in names if opened.get(name, True) is not None]

    @property
    def children(self) -> dict[str, _Node]:
        """Every member by name, all opened now if they are not yet (store I/O: for a big
        group, a metadata read per member; `zfuse info` describes them all; with the
        view's bound on opened members, those it kept)."""
        children, names, opened = self._listed_now()
        if children is not None:
            return children
        missing = [name for name in names if name not in opened]
        for start in range(0, len(missing), MEMBERS_OPENED_TOGETHER):
            self._open_into_opened(missing[start:start + MEMBERS_OPENED_TOGETHER])
        return self.opened_children()

    def _open_into_opened(self, names: list[str]) -> dict[str, _Node | None]:
        """(A big group.) Open these members side by side, outside the lock (lookups go
        on meanwhile), and keep them (a name opened meanwhile by another thread keeps
        that node). Returns each name's node."""
        assert self._opener is not None
        found = self._opener.open(names)
        added = 0
        with self._lock:
            opened = self._opened
            for name in names:
                if name not in opened:
                    opened[name] = found.get(name)
                    added += 1
            nodes = {name: opened[name] for name in names}
        self._opener.kept.opened(self, added)
        return nodes

    @property
    def is_big(self) -> bool:
        """A group whose members are opened one lookup at a time (more than
        MEMBERS_OPENED_TOGETHER names)."""
        return self._names is not None

    def forget_members(self, count: int | None = None) -> int:
        """Forget the opened members (`count`: a big group's oldest ones only), to be
        listed and opened again when asked. Returns how many were forgotten."""
        if self._opener is None:
            return 0  # (an array, or a node without members)
        with self._lock:
            if self._children is not None:
                forgotten = len(self._children)
                self._children = None
            elif count is None or count >= len(self._opened):
                forgotten = len(self._opened)
                self._names, self._opened = None, {}
            else:
                kept = list(self._opened.items())[count:]
                forgotten = len(self._opened) - len(kept)
                self._opened = dict(kept)
        return forgotten

    def opened_children(self) -> dict[str, _Node]:
        """The members opened so far ({} before the group is listed)."""
        children = self._children
        if children is not None:
            return children
        return {name: node for name, node in list(self._opened.items()) if node is not None}

    def is_empty(self) -> bool:
        """Whether no member is listed (store I/O: the listing)."""
        children, names, _ = self._listed_now()
        return not (children if children is not None else names)


def _listed(names: list[str], name: str) -> bool:
    i = bisect.bisect_left(names, name)
    return i < len(names) and names[i] == name


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


class LiveArrays:
    """Every array view a view has made and that is still held (by its group, or by an
    open file or a pending write after its group forgot it), by path: a member opened
    again gets the view still in use, never a second one with caches of its own."""

    def __init__(self) -> None:
        self._views: weakref.WeakValueDictionary[tuple[str, ...], ArrayView] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def get(self, path: tuple[str, ...]) -> ArrayView | None:
        with self._lock:
            return self._views.get(path)

    def add(self, path: tuple[str, ...], view: ArrayView) -> None:
        with self._lock:
            self._views[path] = view

    def items(self) -> list[tuple[tuple[str, ...], ArrayView]]:
        """(path, view) by path."""
        with self._lock:
            return sorted(self._views.items(), key=operator.itemgetter(0))


class View:
    """The whole mount: a hierarchy of groups and arrays, addressed by path."""

    def __init__(
        self, root: _Node, options: ViewOptions, cache: ChunkCache, problems: Problems | None = None,
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
        def walk(node: _Node) -> None:
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

    def _split(self, path: tuple[str, ...], *, memory_only: bool = False) -> tuple[_Node, tuple[str, ...]] | None:
        """The deepest group/array node on `path`, and the rest of the path. Groups on
        the way open their members if they have not (store I/O), unless `memory_only`:
        then None, the answer needs that I/O."""
        node = self.root
        through: list[_Node] = []  # the groups looked through: marked used, the deepest first
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

    def _split_opening(self, path: tuple[str, ...]) -> tuple[_Node, tuple[str, ...]]:
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

    def needs_io(self, path: tuple[str, ...], *, listing: bool = False) -> bool:
        """Whether `entry(path)` (or with `listing`, `list_dir(path)`) needs store I/O.
        False: the answer is in memory, callers on an event loop may call directly."""
        if not listing:
            return self.entry(path, memory_only=True) is NEEDS_IO
        split = self._split(path, memory_only=True)
        if split is None:
            return True
        node, rest = split
        if not rest and not node.loaded:
            return True  # a group whose members are not open yet
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

    def whole_images(self, path: tuple[str, ...], node: _Node | None = None) -> dict[str, WholeImage]:
        """The whole-image files directory `path` shows (planned from metadata, no I/O)."""
        with self._images_lock:
            images = self._images.get(path)
            if images is not None and not any(i.stale for i in images.values()):
                self._images.move_to_end(path)
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

        def walk(node: _Node, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], WholeImage]]:
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
        self._pages = self.view.iter_entries(self.path)
        self._base, self._done, self._started = 0, False, True
        first: list[tuple[str, Entry]] = []
        for page in self._pages:
            first += page
            if len(first) > self.SNAPSHOT_MAX:
                self._buffer = first  # big: streamed from here on, in listing order
                return
        first.sort(key=_by_name)
        self._buffer, self._done = first + self.tail, True


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
    than MEMBERS_OPENED_TOGETHER names opens each member when it is looked up (`_Node`).
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

    def not_shown(path: tuple[str, ...], kind: str, reason: str, metadata: bytes) -> _Node:
        if problems.add(Problem(shown_path(path), reason)):
            log.warning("%s", reason)
        return _Node(kind, metadata=metadata, readme=_readme(reason))

    def array_node(source: ChunkSource, ome: dict[str, Any] | None, path: tuple[str, ...]) -> _Node:
        try:
            view = alive.get(path)  # opened before, forgotten by its group, still in use
            if view is None:
                view = ArrayView(source, options, cache, ome, stats, caches)
                alive.add(path, view)
        except Exception as exc:  # metadata the view cannot lay out: this array only
            doc = source.stored_form()
            reason = unsupported_reason(shown_path(path), exc, doc)
            return not_shown(path, "array", reason, unsupported_metadata(doc, reason))
        if view.unsupported:
            reason = unsupported_reason(shown_path(path), view.unsupported, {"node_type": "array"})
            node = not_shown(path, "array", reason, view.metadata_bytes)
            node.array = view
            return node
        return _Node("array", array=view, metadata=view.metadata_bytes)

    def failed_node(group: zarr.Group, name: str, exc: BaseException, path: tuple[str, ...]) -> _Node:
        doc = stored_metadata(group.store_path.store, "/".join(p for p in (group.path, name) if p))
        kind = node_type_of(doc) or "array"
        reason = unsupported_reason(shown_path(path), exc, doc)
        return not_shown(path, kind, reason, unsupported_metadata(doc, reason))

    def group_node(group: zarr.Group, path: tuple[str, ...],
                   datasets: dict[tuple[str, ...], dict[str, Any]]) -> _Node:
        """`datasets`: OME axes and scales of the arrays that multiscales of groups above
        name, by path: a dataset may be nested (ngff-zarr's `scale0/image`)."""
        attrs = dict(group.attrs)
        here = ome_datasets(attrs) or {}
        datasets = {**datasets, **{(*path, *rel.split("/")): ome for rel, ome in here.items() if rel}}

        def open_named(names: list[str]) -> dict[str, _Node]:
            if stats is not None:
                stats.count("group_members_opened", len(names))
            children: dict[str, _Node] = {}
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
        node = _Node("group", metadata=_group_metadata(group), opener=opener)
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
