"""A group's members, with no FUSE in it: `HierarchyNode` (a group or an array of the
hierarchy) lists its members when first asked and opens them (all at once, or, for a
big group, one lookup at a time); `OpenedMembers` bounds how many the view holds
opened, and has groups forget theirs past it; `LiveArrays` finds an array still in
use when its member is opened again. `tree.py` puts the nodes at their paths and
builds them from a zarr hierarchy (`build_view`, which makes each group's
`MemberOpener`).
"""

from __future__ import annotations

import bisect
import collections
import enum
import operator
import threading
import weakref
from collections.abc import Callable
from typing import NamedTuple

from zfuse.stats import Stats
from zfuse.view.array_view import ArrayView


class NeedsIO(enum.Enum):
    """`View.entry(..., memory_only=True)`: the answer needs store I/O."""

    NEEDS_IO = "needs store I/O"


NEEDS_IO = NeedsIO.NEEDS_IO


# a group with more member names opens each member when first looked up, not all at once
MEMBERS_OPENED_TOGETHER = 1000
MEMBERS_OPENED_AHEAD = 16  # a lookup there opens the member and the next ones listed (one wave)


class MemberOpener(NamedTuple):
    """How a group's members are found and opened (made by `build_view`)."""

    names: Callable[[], list[str]]  # the names members may have, sorted (store I/O: a listing)
    # the nodes of these names (store I/O); names that are no node are left out
    open: Callable[[list[str]], dict[str, HierarchyNode]]
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
        self._held: collections.OrderedDict[HierarchyNode, int] = collections.OrderedDict()  # least used first
        self._total = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # .path: the groups this thread's lookup goes through
        if stats is not None and limit is not None:
            stats.gauge("group_members_held", lambda: self._total)

    def walking(self, path: list[HierarchyNode] | None) -> list[HierarchyNode] | None:
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

    def used(self, groups: list[HierarchyNode]) -> None:
        """These groups were looked through, the deepest first."""
        if self.limit is None:
            return
        with self._lock:
            held = self._held
            for group in groups:
                if group in held:
                    held.move_to_end(group)

    def opened(self, group: HierarchyNode, count: int) -> None:
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
                    victims.append((other, held))
                    over -= held
            for other, held in victims:
                del self._held[other]
                self._total -= held
        forgotten = 0
        busy = []
        for other, held in victims:
            done = other.forget_members()
            if done is None:
                busy.append((other, held))  # (being listed: still held, forgotten later)
            else:
                forgotten += done
        if busy:
            with self._lock:
                for other, held in busy:
                    self._held[other] = self._held.get(other, 0) + held
                    self._held.move_to_end(other, last=False)
                    self._total += held
        if over > 0 and group.is_big:  # this group alone is past the bound (a big one walked): its oldest
            own = group.forget_members(over + self.limit // 4) or 0  # (a quarter more: not one per lookup)
            forgotten += own
            with self._lock:
                if group in self._held:
                    self._held[group] -= own
                    self._total -= own
        if forgotten and self.stats is not None:
            self.stats.count("group_members_forgotten", forgotten)


class HierarchyNode:
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

    __slots__ = ("_children", "_lock", "_metadata", "_names", "_opened", "_opener", "array", "kind", "readme")

    def __init__(self, kind: str, *, array: ArrayView | None = None, metadata: bytes | None = b"", readme: bytes = b"",
                 opener: MemberOpener | None = None) -> None:
        self.kind = kind  # "group" | "array"
        self.array = array
        self._metadata = metadata  # None: the array's view metadata, made when first read
        self.readme = readme  # why the node is shown without chunk files (empty: it is not)
        self._opener = opener
        # every member, opened (a small group, or a node without members); None: not yet
        self._children: dict[str, HierarchyNode] | None = {} if opener is None else None
        self._names: list[str] | None = None  # a big group: the names listed (sorted)
        self._opened: dict[str, HierarchyNode | None] = {}  # a big group: looked up so far (None: no node)
        self._lock = threading.Lock()

    @property
    def metadata(self) -> bytes:
        """The node's `zarr.json` as the view shows it."""
        if self._metadata is None:
            assert self.array is not None
            return self.array.metadata_bytes
        return self._metadata

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
            opened: dict[str, HierarchyNode | None] = {}
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

    def _listed_now(self) -> tuple[dict[str, HierarchyNode] | None, list[str], dict[str, HierarchyNode | None]]:
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

    def member(self, name: str) -> HierarchyNode | None:
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

    def member_in_memory(self, name: str) -> HierarchyNode | None | NeedsIO:
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

    def listing(self) -> list[tuple[str, HierarchyNode | None]]:
        """(name, member) by name; for a big group a member not looked up yet is None:
        a directory, neither opened nor known to be a node (store I/O: the listing)."""
        children, names, opened = self._listed_now()
        if children is not None:
            return list(children.items())
        return [(name, opened.get(name)) for name in names if opened.get(name, True) is not None]

    @property
    def children(self) -> dict[str, HierarchyNode]:
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

    def _open_into_opened(self, names: list[str]) -> dict[str, HierarchyNode | None]:
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

    def forget_members(self, count: int | None = None) -> int | None:
        """Forget the opened members (`count`: a big group's oldest ones only), to be
        listed and opened again when asked. Returns how many were forgotten; None, and
        nothing forgotten, while the group is being listed or opened in another thread
        (never waited for: that thread may hold a group's lock this one holds too, in
        the other order: a lookup listing a local group opens its groups' members)."""
        if self._opener is None:
            return 0  # (an array, or a node without members)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._children is not None:
                forgotten = len(self._children)
                self._children = None
            elif count is None:
                forgotten = len(self._opened)
                self._names, self._opened = None, {}
            else:
                # the oldest only: the listing stays, and so do the latest opened (the
                # lookup that asked for this is using them)
                count = min(count, len(self._opened) - MEMBERS_OPENED_AHEAD)
                if count <= 0:
                    return 0
                kept = list(self._opened.items())[count:]
                forgotten = len(self._opened) - len(kept)
                self._opened = dict(kept)
        finally:
            self._lock.release()
        return forgotten

    def opened_children(self) -> dict[str, HierarchyNode]:
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

    def add(self, path: tuple[str, ...], view: ArrayView) -> ArrayView:
        """`view` as `path`'s, unless another thread made one first: then that one (two
        lookups opening the same member side by side keep one view)."""
        with self._lock:
            return self._views.setdefault(path, view)

    def items(self) -> list[tuple[tuple[str, ...], ArrayView]]:
        """(path, view) by path."""
        with self._lock:
            return sorted(self._views.items(), key=operator.itemgetter(0))
