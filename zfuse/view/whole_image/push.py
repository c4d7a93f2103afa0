"""What a whole-image file puts ahead of its reader: tiles pushed into the kernel's
page cache ahead of a region reader (`Pusher.pushes_after`), and the chunk files
of the next tiles read ahead by the OS (`Pusher.read_ahead`, through the
`ReadAheadAdvisor`'s thread: posix_fadvise WILLNEED).

Reading a tile that is one local chunk file asks the OS to read ahead the files
of the tiles right, below and below right (a region reader's next).

Over a remote store every pushed tile is a request and its bytes: there only
what the reader's pattern shows is pushed (`Pusher(remote=True)`): once a reader
has read one row of a region left to right and starts the next row at the same
column, the rest of that row, as wide as the one before, is pushed at once (its
tiles are fetched side by side instead of one round trip each). Nothing is
guessed beyond the region: no ring, no tile below.

Heuristics only: which bytes, never the bytes themselves (no decoding here).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from zfuse.view.whole_image.layout import FileLayout
from zfuse.workers import WorkerThreads

# Chunk files of tiles up to this size are read ahead (three neighbours): bigger
# tiles would make the disk read more than a small region needs.
_READ_AHEAD_MAX_TILE = 8 * 1024**2
# Tiles stored ahead in the kernel's page cache (see `pushes_after`): at least a
# few pages (smaller tiles are many requests' worth of bookkeeping for little), at
# most the read-ahead's limit.
_PAGE = 4096
_PUSH_MIN_TILE = 4 * _PAGE
_PUSH_MAX_TILE = _READ_AHEAD_MAX_TILE
_TILES_REMEMBERED = 1 << 16  # tiles asked for or pushed, per file (then forgotten)
_PUSH_RING = 2  # tiles around a read in an area already read, pushed ahead
_PUSH_RING_BYTES = 16 * 1024**2  # at most this much of the ring per read (big tiles: the nearest)
_PUSH_RECENT = 8  # the reader's last reads of new tiles: whether it works in an area


def _advise_all(chunks: list[tuple[Any, tuple[int, ...]]]) -> None:
    for array, coords in chunks:
        # inside the store only (a path opened here had let the daemon, often root, open
        # files an attacker chose); not stored or refused: nothing to advise, the read says
        array.advise_stored(coords)


class ReadAheadAdvisor:
    """One background thread that asks the OS to read files ahead (posix_fadvise
    WILLNEED). Opening a file and mapping its blocks may wait on the disk (cold
    inodes): a request being answered should not. Only the latest requests are kept
    (a reader that moved on does not need the old ones). Owned by whoever owns the
    whole-image files (the view); `close` (or dropping it) ends the thread."""

    def __init__(self, keep: int = 64) -> None:
        self._thread = WorkerThreads(1, "zfuse-read-ahead", keep=keep)

    def will_need(self, chunks: list[tuple[Any, tuple[int, ...]]]) -> None:
        """Read ahead the stored files of these (array view, chunk coordinates)."""
        if chunks:
            self._thread.submit(_advise_all, chunks)

    def close(self) -> None:
        self._thread.close()


class Pusher:
    """The push and read-ahead state of one file: tiles the kernel asked for, tiles
    pushed, the reader's last new tiles, chunk files read ahead.

    `byte_count(level, plane, tile)`: the bytes of a tile in its slot, None while not
    known (passthrough byte counts not looked up yet); `change_marks()`: changes when
    the file's bytes may have (then everything remembered is forgotten)."""

    def __init__(self, layout: FileLayout, byte_count: Callable[[int, int, int], int | None],
                 change_marks: Callable[[], tuple[int, ...]], advisor: ReadAheadAdvisor,
                 remote: bool = False,
                 fetch_ahead: Callable[[list[tuple[int, int, int]]], None] | None = None) -> None:
        self.layout = layout
        self.remote = remote
        # remote: starts the fetches of the tiles (level, plane, tile) a push chose, side by
        # side (the push then stores them one after another)
        self._fetch_ahead = fetch_ahead
        # remote: the row of tiles the reader is going through, (level, plane, row,
        # first column, last column), and the width of the row before it
        self._row: tuple[int, int, int, int, int] | None = None
        self.levels = layout.levels
        self._byte_count = byte_count
        self._change_marks = change_marks
        self._advisor = advisor
        self._lock = threading.Lock()
        self._advised: set[tuple[int, int, int]] = set()  # tiles whose chunk file was read ahead
        # region readers (pushes_after): tiles the kernel asked for, and tiles pushed
        self._asked: set[tuple[int, int, int]] = set()
        self._pushed: set[tuple[int, int, int]] = set()
        self._region_reader = False
        self._recent: deque[tuple[int, int, int, int]] = deque(maxlen=_PUSH_RECENT)  # (level, plane, row, column)
        self._push_marks: tuple[int, ...] = change_marks()

    def pushes_after(self, offset: int, size: int) -> list[tuple[int, int]]:
        """Byte ranges (offset, length) worth storing in the kernel's page cache ahead of
        the reader, nearest first, after the kernel asked for [offset, offset+size).

        A region reader (tifffile `aszarr`, napari, GDAL) reads a region's tiles one
        after another, each a FUSE round trip and a disk read when cold, and the
        kernel's read-ahead of this file follows tile rows only. Nothing is pushed
        until the reads show such a reader: a tile asked for next to one an earlier
        read asked for (so reading one tile decodes only the chunks it covers). Then
        the first tile of each read that was neither asked for nor pushed before
        brings the rest of its region: the tiles right, below and below right. If it
        also lies near one of the last few such tiles (within two tiles: the reader
        works in an area, as a viewer panning does), it brings the ring of tiles two
        around it (up to 16 MiB of it, nearest first), so the neighbouring regions
        are read while the reader works. A reader jumping about a large image gets
        no more than its own regions. Tiles already asked for or pushed are left out.
        """
        with self._lock:
            marks = self._change_marks()
            if marks != self._push_marks:  # other bytes now: start over
                self._asked.clear()
                self._pushed.clear()
                self._recent.clear()
                self._push_marks = marks
            tiles = self.layout.tiles_in(offset, size)
            if tiles and self._in_zeros(offset):
                # the kernel reading ahead into the zeros after a tile (remote slots end in
                # them): no read of that tile, nor a sign of where the reader goes
                tiles = tiles[1:]
            if not tiles:
                return []
            if self.remote:
                out, keys = self._rest_of_row(tiles)
            else:
                return self._around(tiles)
        if keys and self._fetch_ahead is not None:
            self._fetch_ahead(keys)
        return out

    def _around(self, tiles: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """(Under the lock.) A local store's push: the rest of the region, and the ring
        around it (see `pushes_after`)."""
        first = tiles[0]
        fresh = first not in self._asked and first not in self._pushed
        if not self._region_reader:
            self._region_reader = any(self._next_to_asked(t) for t in tiles if t not in self._asked)
        if len(self._asked) + len(tiles) > _TILES_REMEMBERED or len(self._pushed) > _TILES_REMEMBERED:
            self._asked.clear()
            self._pushed.clear()
        self._asked.update(tiles)
        if not self._region_reader or not fresh:
            return []  # a tile pushed (too late) or read before: its region is on its way
        level, plane, tile = first
        lv = self.levels[level]
        ty, tx = divmod(tile, lv.tiles_across)
        near: list[tuple[int, int]] = [(ty, tx + 1), (ty + 1, tx), (ty + 1, tx + 1)]
        if any(r[:2] == (level, plane) and max(abs(r[2] - ty), abs(r[3] - tx)) <= _PUSH_RING
               for r in self._recent):
            ring = [(ty + dy, tx + dx) for dy in range(-_PUSH_RING, _PUSH_RING + 1)
                    for dx in range(-_PUSH_RING, _PUSH_RING + 1)]
            # nearest first; at equal distance forward (right, below) first
            ring.sort(key=lambda p: (max(abs(p[0] - ty), abs(p[1] - tx)), p[0] < ty, p[1] < tx, p))
            near += ring
        self._recent.append((level, plane, ty, tx))
        out = []
        ring_bytes = 0
        for k, (ny, nx) in enumerate(near):
            if not (0 <= ny < lv.tiles_down and 0 <= nx < lv.tiles_across):
                continue
            key = (level, plane, ny * lv.tiles_across + nx)
            if key in self._asked or key in self._pushed:
                continue
            span = self._push_span(*key)
            if span is None:
                continue
            if k >= 3:  # the ring, beyond the region's own tiles
                ring_bytes += span[1]
                if ring_bytes > _PUSH_RING_BYTES:
                    break
            self._pushed.add(key)
            out.append(span)
        return out

    def _in_zeros(self, offset: int) -> bool:
        """Whether `offset` lies in the zeros after a tile's bytes in its slot."""
        found = self.layout.locate(offset) if offset >= self.layout.data_start else None
        if found is None:
            return False
        count = self._byte_count(*found[:3])
        return count is not None and found[3] >= count

    def _rest_of_row(self, tiles: list[tuple[int, int, int]]
                     ) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
        """(Under the lock.) A remote store's push: the rest of a row of a region, once
        the row before it showed the region's width (see the module's docstring); the
        spans and their tiles."""
        self._asked.update(tiles)
        level, plane, tile = tiles[0]
        lv = self.levels[level]
        ty, tx = divmod(tile, lv.tiles_across)
        row = self._row
        out: list[tuple[int, int]] = []
        keys: list[tuple[int, int, int]] = []
        if row is not None and row[:2] == (level, plane) and row[2] == ty and row[3] <= tx <= row[4] + 1:
            self._row = (level, plane, ty, row[3], max(row[4], tx))  # along the row
        elif row is not None and row[:2] == (level, plane) and row[2] == ty - 1 and row[3] == tx < row[4]:
            # the next row of the region, from the same column: the rest of it, as wide
            self._row = (level, plane, ty, tx, row[4])
            for nx in range(tx + 1, min(row[4], lv.tiles_across - 1) + 1):
                key = (level, plane, ty * lv.tiles_across + nx)
                if key in self._asked or key in self._pushed:
                    continue
                span = self._push_span(*key)
                if span is not None:
                    self._pushed.add(key)
                    out.append(span)
                    keys.append(key)
        else:
            self._row = (level, plane, ty, tx, tx)
        return out, keys

    def push_wanted(self, offset: int) -> bool:
        """Whether the tile at `offset` is still worth pushing: the kernel has not asked
        for it since it was chosen (the push would only repeat that read)."""
        found = self.layout.locate(offset)
        return found is not None and found[:3] not in self._asked

    def _next_to_asked(self, key: tuple[int, int, int]) -> bool:
        level, plane, tile = key
        lv = self.levels[level]
        ty, tx = divmod(tile, lv.tiles_across)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                ny, nx = ty + dy, tx + dx
                if (dy or dx) and 0 <= ny < lv.tiles_down and 0 <= nx < lv.tiles_across:
                    if (level, plane, ny * lv.tiles_across + nx) in self._asked:
                        return True
        return False

    def _push_span(self, level: int, plane: int, tile: int) -> tuple[int, int] | None:
        """The whole pages of a tile's slot that hold its bytes, or None when the tile
        is not worth pushing (tiny or huge tiles, slots not page aligned, a passthrough
        level whose byte counts are not known yet)."""
        lv = self.levels[level]
        if not _PUSH_MIN_TILE <= lv.tile_bytes <= _PUSH_MAX_TILE:
            return None
        start = self.layout.slot_offset(level, plane, tile)
        if start % _PAGE or lv.slot % _PAGE:
            return None
        count = self._byte_count(level, plane, tile)
        if count is None:
            return None
        length = min(-(-count // _PAGE) * _PAGE, lv.slot)
        return (start, length) if length else None

    def read_ahead(self, level: int, plane: int, tile: int) -> None:
        """Ask the OS to start reading the chunk files of the tiles a region reader needs
        next: right, below and below right (the kernel's read-ahead of this file only
        follows rows). Local chunk files only; the disk works while the reader does
        (posix_fadvise WILLNEED in a background thread: nothing decoded or kept here)."""
        key = (level, plane, tile)
        lv = self.levels[level]
        if key in self._advised or lv.tile_bytes > _READ_AHEAD_MAX_TILE:
            return
        if not lv.chunk_per_tile:
            return  # tiles assembled from several chunks: no file per tile
        if len(self._advised) > 65536:
            self._advised.clear()
        self._advised.add(key)
        ty, tx = divmod(tile, lv.tiles_across)
        chunks = []
        for ny, nx in ((ty, tx + 1), (ty + 1, tx), (ty + 1, tx + 1)):
            if ny < lv.tiles_down and nx < lv.tiles_across:
                coords = lv.tile_chunk(plane, ny * lv.tiles_across + nx)
                if lv.chunk_file(coords) is None:
                    return
                chunks.append((lv.array, coords))
        self._advisor.will_need(chunks)
