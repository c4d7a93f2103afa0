"""Directory read-ahead for recursive walkers (`ls -R`, `find`, `du`): `ListingAhead`.

It owns which directories a walker is going through (`Walk`, per parent), the
directories scheduled to be listed ahead (`AheadJob`) and the ones made ready for
the walker's opendir (`Prepared`). `FileSystem` tells it of every opendir
(`opened`) and asks it for what it made (`take_prepared`, `scheduled`). No FUSE;
listings run through the view, in the threads it is given.
"""

from __future__ import annotations

import collections
import logging
import operator
import threading
from dataclasses import dataclass
from typing import Any

from zfuse.fs.types import Path, Spawn
from zfuse.stats import Stats
from zfuse.view.tree import DirReader, Node, View

log = logging.getLogger("zfuse.fs")

LIST_AHEAD = 8  # sibling directories listed ahead of a recursive walker (ls -R, find)
LIST_AHEAD_WAIT = 60.0  # seconds an opendir waits for its directory's read-ahead listing
PREPARED_KEPT = 2 * LIST_AHEAD  # directory readers made ahead, kept until opened
PREPARED_ENTRIES = 1000  # at most, per directory made ready ahead (bigger ones: listed ahead only)
WALKS_KEPT = 16  # parent directories whose subdirectory order is kept for walk detection

_FIRST, _SECOND, _FOURTH = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)


def encode_names(names: list[str]) -> list[bytes]:
    """Names as a readdir reply carries them (UTF-8, undecodable bytes restored), in one
    encode of all of them: a quarter of the cost of one per name. A name never holds
    NUL, so splitting at NUL gives the names back."""
    if not names:
        return []
    return "\0".join(names).encode("utf-8", "surrogateescape").split(b"\0")


@dataclass
class Prepared:
    """A directory listed ahead, ready for the walker's opendir, made in the listing
    thread (off the event loop): its names, and whether every entry is a stored chunk
    of one size (or a chunk directory), whose attributes are then one tuple for all
    (its names then also encoded as a reply carries them: readdir offers them as one
    run, and the reader is not read: made from the listing, `uniform`). Otherwise the
    reader holds the sorted snapshot."""

    reader: DirReader
    names: list[str]
    encoded: list[bytes]
    uniform: tuple[Node, int] | None
    version: Any = None  # the listing version a `uniform` one stands for

    @classmethod
    def of(cls, reader: DirReader) -> Prepared:
        """From `reader`'s snapshot (taken)."""
        # C-level passes (map, sets), not a Python statement per entry
        entries = reader.at_hand(0) or []
        names = list(map(_FIRST, entries))
        found = list(map(_SECOND, entries))
        nodes, sizes = set(map(_FIRST, found)), set(map(_SECOND, found))
        uniform = None
        if len(sizes) == 1 and (nodes == {Node.KEYDIR} or (nodes == {Node.CHUNK} and None not in map(_FOURTH, found))):
            uniform = (nodes.pop(), sizes.pop())  # every entry a stored chunk of one size, or a chunk directory
        encoded = encode_names(names) if uniform is not None else []
        return cls(reader, names, encoded, uniform)

    @classmethod
    def uniform_of(cls, view: View, path: Path) -> Prepared | None:
        """From the directory's listing in memory, with no Entry per name, when its
        entries share their attributes (`View.uniform_listing`); None otherwise."""
        listing = view.uniform_listing(path)
        if listing is None or len(listing[0]) > PREPARED_ENTRIES:
            return None
        names, node, size, version = listing
        return cls(view.dir_reader(path), names, encode_names(names), (node, size), version)

    def current(self, view: View) -> bool:
        """Whether it still shows what a listing in `view` now would."""
        if self.reader.view is not view:
            return False
        if self.version is not None:
            return self.version == view.listing_version(self.reader.path)
        return self.reader.current()


@dataclass
class Walk:
    """The subdirectories of one listed directory, in listing order, and the
    position of the one opened last: opening the next one after it is a walk."""

    names: list[str]
    position: dict[str, int]
    last: int = -2
    ahead: int = -1  # position of the last one listed ahead


class AheadJob:
    """A directory scheduled to be listed ahead. Whoever takes it first lists it: the
    listing thread, or the walker's own opendir when the thread has not got to it yet
    (under CPU load the listing thread can fall behind; the opendir then does not wait
    for the directories queued before). `done` is held until the listing ends."""

    __slots__ = ("view", "path", "done", "taken")

    def __init__(self, view: View, path: Path) -> None:
        self.view = view
        self.path = path
        self.done = threading.Lock()  # a Lock, not an Event: a tenth of the cost to make
        self.done.acquire()
        self.taken = False


_TAKE = threading.Lock()  # guards `AheadJob.taken` (held for one test-and-set)


def let_go(_: object) -> None:
    """A background job that only frees its argument, in the thread that runs it."""


def _take(job: AheadJob) -> bool:
    """Whether the caller is the one to list `job`'s directory."""
    with _TAKE:
        mine, job.taken = not job.taken, True
    return mine


class ListingAhead:
    """Which directories a walker goes through, and those listed ahead of it.

    Local stores' directories are listed on `spawn_listing` (short jobs holding the
    GIL, best on one thread of their own: threads listing at once only take turns at
    the GIL, with each other and the event loop); remote stores' listings, long waits
    that overlap well, on `spawn`. Without either nothing is listed ahead.
    """

    def __init__(self, stats: Stats, spawn_listing: Spawn | None, spawn: Spawn | None) -> None:
        self.stats = stats
        self.spawn_listing = spawn_listing
        self.spawn = spawn
        self.walks: collections.OrderedDict[Path, Walk] = collections.OrderedDict()
        self.scheduled: dict[Path, AheadJob] = {}  # scheduled to be listed ahead, not done yet
        # readers of directories listed ahead, their sorted snapshot made in the listing
        # thread: an opendir takes one if it is still current (oldest first; bounded)
        self.prepared: collections.OrderedDict[Path, Prepared] = collections.OrderedDict()

    def take_prepared(self, path: Path, view: View, usable: bool) -> Prepared | None:
        """The directory the listing thread made ready for `path` (taken either way), if
        `usable` and it still shows what a listing in `view` now would."""
        prepared = self.prepared.pop(path, None) if self.prepared else None
        if prepared is None or not usable or not prepared.current(view):
            return None
        return prepared

    def let_go(self, dir_handle: object) -> None:
        """A directory handle on a prepared directory closed: a directory listed ahead
        holds a few hundred objects (its names, encoded names, or its snapshot), freed
        in the listing thread, off the walker's path."""
        if self.spawn_listing is not None:
            self.spawn_listing(let_go, dir_handle)

    def opened(self, view: View, path: Path) -> None:
        """A directory was opened. When a listed directory's subdirectories are opened
        one after another in listing order (the second in a row), the next
        `LIST_AHEAD` are listed in the background, so a recursive walk finds each
        directory in memory instead of waiting for a listing per directory. A single
        `ls` of one directory lists that directory only."""
        if self.spawn_listing is None or not path:
            return
        parent = path[:-1]
        walk = self.walks.get(parent)
        if walk is None:
            # in the order a walker sorting by name visits them (as readdir gave them)
            names = view.listed_subdirs(parent, DirReader.SNAPSHOT_MAX)
            if names is None:
                return  # not listed: nobody is walking it
            walk = self.walks[parent] = Walk(names, {name: i for i, name in enumerate(names)})
            while len(self.walks) > WALKS_KEPT:
                self.walks.popitem(last=False)
        self.walks.move_to_end(parent)
        i = walk.position.get(path[-1])
        if i is None:
            return
        walking, walk.last = walk.last == i - 1, i
        if not walking:
            walk.ahead = i  # a new start: what lies ahead of it is looked at afresh
            return
        start = max(i + 1, walk.ahead + 1)  # the ones before were scheduled already
        walk.ahead = max(walk.ahead, i + LIST_AHEAD)
        for name in walk.names[start : i + 1 + LIST_AHEAD]:
            nxt = (*parent, name)
            if nxt in self.scheduled or not view.needs_io(nxt, listing=True):
                continue
            job = self.scheduled[nxt] = AheadJob(view, nxt)
            spawn = self.spawn_listing if view.lists_locally(nxt) else self.spawn
            spawn(self._list, job)  # type: ignore[misc]

    def fetch(self, job: AheadJob, reader: DirReader) -> None:
        """Opendir of a directory scheduled to be listed ahead (worker thread): list it
        here if nobody has started to, else wait until that listing is done (then from
        memory, unless it failed, was evicted, or has not finished in `LIST_AHEAD_WAIT`
        seconds: then `reader` lists it itself)."""
        if _take(job):
            try:
                reader.fetch(0)
            finally:
                self._done(job)
            return
        if job.done.acquire(timeout=LIST_AHEAD_WAIT):
            job.done.release()
        reader.fetch(0)

    def _done(self, job: AheadJob) -> None:
        if self.scheduled.get(job.path) is job:
            del self.scheduled[job.path]
        job.done.release()

    def _list(self, job: AheadJob) -> None:
        if not _take(job):
            return  # the walker got there first and listed it itself
        view, path = job.view, job.path
        try:
            if view.list_ahead(path):
                self.stats.count("listing_read_ahead")
            # what the walker's opendir will want, sorted here: a chunk directory's names,
            # else the reader's snapshot (if the listing is kept in memory: never a
            # second listing)
            if not view.needs_io(path, listing=True):
                prepared = Prepared.uniform_of(view, path)  # a chunk directory: names only
                if prepared is None:
                    reader = view.dir_reader(path)
                    reader.fetch(0)
                    # small enough to be one snapshot, and for its prepared names to be few
                    if reader.current() and len(reader.at_hand(0) or ()) <= PREPARED_ENTRIES:
                        prepared = Prepared.of(reader)
                if prepared is not None:
                    self.prepared[path] = prepared
                    while len(self.prepared) > PREPARED_KEPT:
                        self.prepared.pop(next(iter(self.prepared)), None)
        except Exception as e:  # the walker's own opendir lists it again and reports it
            log.debug("listing %s ahead failed: %s", "/".join(path), e)
        finally:
            self._done(job)
