"""The mount's inode table: inode numbers, the path each stands for, and the
kernel's references to each (its lookup count). No FUSE.

Most inodes of a big mount are chunk files the kernel learnt of from one
listing (`ls -lR` of 100,000 chunks hands it 100,000 READDIRPLUS entries). An
`Inode` object and two dict entries for each cost more than the listing itself,
so the entries of a directory listed in one run are kept as a *run*: the
directory's path, its sorted names, the number of the first (the others follow
in order) and a reference count per name. An entry of a run becomes an `Inode`
(in the dicts) the first time someone asks for it as one (`get`, `new`,
`take_path`); asking for its number only (`ino_of`), counting references and
forgetting need no object.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

Path = tuple[str, ...]

_MADE = -1  # a run entry's count once it is an Inode in the dicts (look there)


@dataclass(slots=True)
class Inode:
    ino: int
    path: Path
    lookups: int = 0
    detached: bool = False  # its name now belongs to another file, or was unlinked


class _Run:
    """The entries of one directory listed in one run: `names` sorted, entry i is inode
    `first + i`; `counts[i]` its references (0: none, not known; _MADE: an Inode now)."""

    __slots__ = ("parent", "names", "first", "counts", "live", "made")

    def __init__(self, parent: Path, names: Sequence[str], first: int) -> None:
        self.parent = parent
        self.names = names
        self.first = first
        self.counts = [0] * len(names)
        self.live = 0  # entries with references (counts > 0)
        self.made = 0  # entries made Inodes of their own (_MADE)

    def index(self, name: str) -> int | None:
        i = bisect.bisect_left(self.names, name)
        return i if i < len(self.names) and self.names[i] == name else None


class InodeTable:
    """Inode number <-> path, and the kernel's references. Used on the event loop;
    only `ino_of` and `reserve` may also be called from other threads."""

    def __init__(self, root: Inode) -> None:
        self._inodes: dict[int, Inode] = {root.ino: root}
        self._ino_of: dict[Path, int] = {root.path: root.ino}
        self._known_children: dict[Path, int] = {}  # parent -> its children in the dicts
        self._runs: dict[Path, _Run] = {}  # by parent
        self._run_firsts: list[int] = []  # sorted, with _runs_by_first: a number's run
        self._runs_by_first: dict[int, _Run] = {}
        self._next = root.ino + 1
        self._numbers = threading.Lock()

    # -- numbers -----------------------------------------------------------------
    def reserve(self, count: int) -> int:
        """The first of `count` consecutive numbers no inode has or will be given."""
        with self._numbers:
            first, self._next = self._next, self._next + count
        return first

    # -- lookups -----------------------------------------------------------------
    def ino_of(self, path: Path) -> int | None:
        """The number of the inode that `path` names, if the kernel may know one."""
        ino = self._ino_of.get(path)
        if ino is not None or not path:
            return ino
        run = self._runs.get(path[:-1])
        if run is None:
            return None
        i = run.index(path[-1])
        return run.first + i if i is not None and run.counts[i] > 0 else None

    def get(self, ino: int) -> Inode | None:
        inode = self._inodes.get(ino)
        if inode is not None:
            return inode
        found = self._run_entry(ino)
        return self._make(*found) if found is not None else None

    def path_of(self, ino: int) -> Path | None:
        """The path `ino` was last known by (no Inode made for a run entry)."""
        inode = self._inodes.get(ino)
        if inode is not None:
            return inode.path
        found = self._run_entry(ino)
        return (*found[0].parent, found[0].names[found[1]]) if found is not None else None

    def __getitem__(self, ino: int) -> Inode:
        inode = self.get(ino)
        if inode is None:
            raise KeyError(ino)
        return inode

    def __contains__(self, ino: int) -> bool:
        return ino in self._inodes or self._run_entry(ino) is not None

    def __len__(self) -> int:
        return len(self._inodes) + sum(run.live for run in self._runs.values())

    def inos(self) -> Iterator[int]:
        """Every inode number the kernel may know (a snapshot)."""
        out = list(self._inodes)
        for run in list(self._runs.values()):
            out.extend(run.first + i for i, count in enumerate(run.counts) if count > 0)
        return iter(out)

    # -- changes -----------------------------------------------------------------
    def new(self, path: Path, number: int | None = None) -> Inode:
        """The inode `path` names, made (with no references) if it has none: numbered
        `number` if given (one `reserve`d for it), else a new number."""
        ino = self.ino_of(path)
        if ino is not None:
            return self[ino]
        inode = Inode(self.reserve(1) if number is None else number, path)
        self._inodes[inode.ino] = inode
        self._index(inode)
        return inode

    def number(self, path: Path) -> tuple[int, bool]:
        """(inode number, known): the number `path` has, or a new one reserved for it
        (known False) that `referenced` makes an Inode once the kernel takes it, so an
        entry left out of a full readdir reply leaves nothing behind."""
        ino = self.ino_of(path)
        return (ino, True) if ino is not None else (self.reserve(1), False)

    def referenced(self, path: Path, ino: int, known: bool) -> None:
        """The kernel took a reference to `path`'s inode `ino` (as `number` gave it)."""
        if known:
            self.remember(ino)
        else:
            self.new(path, ino).lookups += 1

    def take_path(self, path: Path) -> Inode | None:
        """The inode `path` names, no longer named by it (unlinked, replaced or renamed:
        it stays valid by number); None if `path` has none."""
        ino = self.ino_of(path)
        if ino is None:
            return None
        inode = self[ino]
        self._unindex(path)
        return inode

    def set_path(self, inode: Inode, path: Path) -> None:
        """`inode` is named `path` now (a rename): the one `path` named must have been
        taken first (`take_path`)."""
        if self._ino_of.get(inode.path) == inode.ino:
            self._unindex(inode.path)
        inode.path = path
        self._index(inode)

    def run_first(self, parent: Path, names: Sequence[str]) -> int | None:
        """The number of `names[0]` for a run of directory `parent`'s entries `names`
        (sorted), the others following in order: the run kept for the same names, or
        new numbers. None when some child of `parent` is an Inode of its own, or a run
        of other names is kept: entry by entry then."""
        if self._known_children.get(parent):
            return None
        run = self._runs.get(parent)
        if run is None:
            return self.reserve(len(names))
        return run.first if run.names == names and not run.made else None

    def add_run(self, parent: Path, names: Sequence[str], first: int, start: int, end: int) -> None:
        """The kernel took one reference to each of entries [start, end) of the run
        `run_first` numbered from `first`."""
        if start >= end:
            return
        run = self._runs.get(parent)
        if run is None:
            run = self._runs[parent] = _Run(parent, names, first)
            bisect.insort(self._run_firsts, first)
            self._runs_by_first[first] = run
        counts = run.counts
        if not any(counts[start:end]):  # offered for the first time (`ls -lR`): in C
            counts[start:end] = [1] * (end - start)
            run.live += end - start
            return
        for i in range(start, end):
            count = counts[i]
            if count == 0:
                run.live += 1
            counts[i] = count + 1

    def remember(self, ino: int) -> None:
        """The kernel took one more reference to `ino` (a lookup reply)."""
        inode = self._inodes.get(ino)
        if inode is not None:
            inode.lookups += 1
            return
        found = self._run_entry(ino)
        if found is not None:
            run, i = found
            run.counts[i] += 1

    def forget(self, ino: int, count: int) -> Path | None:
        """The kernel dropped `count` references to `ino`: its path if that was the last
        (the inode is gone), else None."""
        inode = self._inodes.get(ino)
        if inode is not None:
            inode.lookups -= count
            if inode.lookups > 0:
                return None
            del self._inodes[ino]
            if self._ino_of.get(inode.path) == ino:
                self._unindex(inode.path)
            return inode.path
        found = self._run_entry(ino)
        if found is None:
            return None
        run, i = found
        run.counts[i] -= count
        if run.counts[i] > 0:
            return None
        run.counts[i] = 0
        self._lost_one(run)
        return (*run.parent, run.names[i])

    # -- internals ---------------------------------------------------------------
    def _run_entry(self, ino: int) -> tuple[_Run, int] | None:
        """The run and index of `ino`, if it is a run entry with references."""
        firsts = self._run_firsts
        k = bisect.bisect_right(firsts, ino) - 1
        if k < 0:
            return None
        run = self._runs_by_first.get(firsts[k])
        if run is None:
            return None
        i = ino - run.first
        return (run, i) if 0 <= i < len(run.names) and run.counts[i] > 0 else None

    def _make(self, run: _Run, i: int) -> Inode:
        """Run entry i as an Inode of its own, with its references."""
        inode = Inode(run.first + i, (*run.parent, run.names[i]), run.counts[i])
        run.counts[i] = _MADE
        run.made += 1
        self._inodes[inode.ino] = inode
        self._index(inode)
        self._lost_one(run)
        return inode

    def _lost_one(self, run: _Run) -> None:
        run.live -= 1
        if run.live == 0:  # nothing of it is known by number any more
            del self._runs[run.parent]
            del self._runs_by_first[run.first]
            self._run_firsts.remove(run.first)

    def _index(self, inode: Inode) -> None:
        self._ino_of[inode.path] = inode.ino
        if inode.path:
            parent = inode.path[:-1]
            self._known_children[parent] = self._known_children.get(parent, 0) + 1

    def _unindex(self, path: Path) -> None:
        if self._ino_of.pop(path, None) is not None and path:
            parent = path[:-1]
            left = self._known_children[parent] - 1
            if left:
                self._known_children[parent] = left
            else:
                del self._known_children[parent]
