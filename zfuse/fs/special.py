"""`.zfuse/`, the daemon's own directory on the mount: `SpecialFiles`, and the error
journal behind `.zfuse/errors` (`ErrorJournal`).

- `.zfuse/stats`: the daemon's counters (JSON).
- `.zfuse/errors`: every refusal, abandoned file and store error, one line each,
  readable by the mount's user (the last `ERRORS_KEPT`).
- `.zfuse/mount`: what the daemon says about itself (`mount_info`, given by the
  daemon; read by `zfuse status` and `zfuse reload`).

Each is a snapshot taken at open; sizes are padded so `stat` and `read` agree. No FUSE.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from typing import Any

from zfuse import defaults
from zfuse.errors import printable
from zfuse.fs.types import Path
from zfuse.stats import Stats
from zfuse.view.tree import Entry, Node

SPECIAL_DIR = defaults.CONTROL_DIR_NAME
STATS_FILE, ERRORS_FILE = "stats", "errors"
MOUNT_FILE = "mount"  # the daemon's pid, sources, reloads, log (JSON; read by zfuse status/reload)
ERRORS_KEPT = 500


def padded_json(value: dict[str, Any]) -> bytes:
    """JSON padded to a 1 KiB multiple: the size `stat` reports stays the size `read` gets."""
    text = json.dumps(value, indent=2, sort_keys=True)
    return (text + " " * (-(len(text) + 1) % 1024) + "\n").encode()


def is_special(path: Path) -> bool:
    """Whether `path` is `.zfuse/` or in it."""
    return path[:1] == (SPECIAL_DIR,)


ERROR_LINE_MAX = 2048  # characters of one line of `.zfuse/errors` (a reason may quote a store's words)


class ErrorJournal:
    """The lines of `.zfuse/errors` (the last ERRORS_KEPT, each at most ERROR_LINE_MAX
    characters). Its text is made once per change: every descriptor open on it shares
    it (3,000 of them each held a copy: 500 MB)."""

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        self._text: bytes | None = b""

    def add(self, path: Path, reason: str) -> None:
        """One line: time, path, reason."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        reason = " ".join(reason.split())  # one line per entry
        line = f"{stamp}\t{printable('/'.join(path) or '/')}\t{printable(reason)}"
        self.lines.append(line if len(line) <= ERROR_LINE_MAX else line[: ERROR_LINE_MAX - 3] + "...")
        self._text = None

    def text(self) -> bytes:
        text = self._text
        if text is None:
            text = self._text = ("\n".join(self.lines) + "\n").encode() if self.lines else b""
        return text


class SpecialFiles:
    """The entries and bytes of `.zfuse/`. `live_stats` adds what only the filesystem
    knows (caches, pending files) to the counters; `mount_info` is the daemon's (without
    it there is no `.zfuse/mount`)."""

    def __init__(self, stats: Stats, journal: ErrorJournal, live_stats: Callable[[], dict[str, Any]],
                 mount_info: Callable[[], dict[str, Any]] | None = None) -> None:
        self.stats = stats
        self.journal = journal
        self.live_stats = live_stats
        self.mount_info = mount_info

    def listing(self) -> list[tuple[str, Entry]]:
        """What `ls .zfuse` shows, sorted: each file with its entry (made once: an entry's
        size is its content's)."""
        found = ((name, self.entry((SPECIAL_DIR, name))) for name in (ERRORS_FILE, MOUNT_FILE, STATS_FILE))
        return [(name, entry) for name, entry in found if entry is not None]

    def entry(self, path: Path) -> Entry | None:
        """`.zfuse/` and its files; None for every other path."""
        if path == (SPECIAL_DIR,):
            return Entry(Node.ZFUSE_DIR)
        if len(path) != 2 or path[0] != SPECIAL_DIR:
            return None
        if path[1] in (STATS_FILE, ERRORS_FILE) or (path[1] == MOUNT_FILE and self.mount_info is not None):
            return Entry(Node.ZFUSE_FILE, size=len(self.content(path[1])))
        return None

    def content(self, name: str) -> bytes:
        if name == ERRORS_FILE:
            return self.journal.text()
        if name == MOUNT_FILE and self.mount_info is not None:
            return padded_json(self.mount_info())
        snapshot = self.stats.snapshot()
        snapshot.update(self.live_stats())
        return padded_json(snapshot)
