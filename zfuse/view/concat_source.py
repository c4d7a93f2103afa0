"""A virtual concatenation (`zfuse.ext.concat.ConcatArray`) as a chunk source.

The view's chunk grid is the first source's (inner) chunk shape; chunk keys
use the default encoding (``c/i/j``). A view chunk exists when any stored
chunk of any source overlaps it; that is found by listing each source once
(`ZarrChunkSource.list_chunks`, kept as numpy ranges of view chunks) and
answering each directory from those ranges, page by page: a directory costs
work in the number of stored source chunks, never in the view chunks they
cover (one big source chunk over a grid of small view chunks covers millions).
A view chunk is read from the source chunks it overlaps, each through its
part's bounded decoding (`ZarrChunkSource.read_chunk`), never through zarr's
indexing, which bounds nothing.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding

from zfuse.errors import MetadataError, ZfuseError
from zfuse.ext.chunk_keys import ChunkKeyDecoder
from zfuse.ext.concat import ConcatArray
from zfuse.view.chunk_codecs import same_values
from zfuse.view.chunk_listing import LIST_PAGE, DirPage
from zfuse.view.source import ChunkSource, Coords, ZarrChunkSource

log = logging.getLogger("zfuse.view")

#: view chunks `list_chunks` gives at most (`zfuse info`'s count; a mount lists by
#: directory): one big source chunk over small view chunks covers millions
LISTED_MAX = 1 << 20


@dataclass
class _Held:
    """What one source chunk (`chunk`) held of a view chunk's piece before a write: the
    region (`sub`, in the part; `within`, in the chunk; `sub_here`, in the view chunk),
    whether it was stored, its old values there (None: not stored, or unreadable)."""

    chunk: Coords
    sub: tuple[slice, ...]
    within: tuple[slice, ...]
    sub_here: tuple[slice, ...]
    existed: bool
    old: np.ndarray | None
    whole: np.ndarray | None  # (the chunk's values, where its part's codecs are checked)


@dataclass
class _Piece:
    """What a view chunk covers of one part: `src_region` in the part, `here` in the view
    chunk, and what each source chunk there held (`held`)."""

    part: ZarrChunkSource
    src_region: tuple[slice, ...]
    here: tuple[slice, ...]
    held: list[_Held]

    def holds(self, full: np.ndarray) -> bool:
        """Whether the part holds `full`'s values of this piece already (stored, readable)."""
        return all(h.existed and h.old is not None and same_values(h.old, np.asarray(full[h.sub_here], h.old.dtype))
                   for h in self.held)


class ConcatChunkSource(ChunkSource):
    def __init__(self, array: ConcatArray, name: str = "") -> None:
        super().__init__()
        self.array = array
        self.name = name or "concat"
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.chunk_shape = tuple(array.chunks)
        self.fill_value = array.fill_value
        self._key_decoder = ChunkKeyDecoder(len(self.shape), encoding=DefaultChunkKeyEncoding())
        self.parts = [ZarrChunkSource(src, name=n) for src, n in zip(array.sources, array.names, strict=True)]
        if not all(src.read_only for src in array.sources):
            _refuse_repeated_sources(self.parts)
        # per part: its stored chunks as ranges of view chunks, (n, ndim, 2) [lo, hi); and per
        # source array (named again: listed once), its stored chunks. Listed when a directory
        # is first listed, kept until a write or `invalidate` (`_generation`: a listing made
        # across one is used once, not kept)
        self._ranges: dict[int, np.ndarray] = {}
        self._listed: dict[int, np.ndarray] = {}
        self._generation = 0
        self._ranges_guard = threading.Lock()

    def chunk_key(self, coords: Coords) -> str:
        return "/".join(("c", *map(str, coords)))

    def decode_key(self, key: str) -> Coords | None:
        return self._key_decoder(key)

    def _stored_ranges(self, index: int) -> np.ndarray:
        """Part `index`'s stored chunks as the view chunks each overlaps: an (n, ndim, 2)
        array of [lo, hi) per axis (its source array listed once, until `forget_listing`)."""
        source = id(self.array.sources[index])
        with self._ranges_guard:
            found, coords, generation = self._ranges.get(index), self._listed.get(source), self._generation
        if found is not None:
            return found
        part, ndim = self.parts[index], len(self.shape)
        if coords is None:
            coords = np.array(part.list_chunks(), dtype=np.int64).reshape(-1, ndim)
        start = coords * np.array(part.chunk_shape, dtype=np.int64)
        stop = np.minimum(start + np.array(part.chunk_shape, dtype=np.int64), np.array(part.shape, dtype=np.int64))
        start[:, self.array.axis] += self.array.offsets[index]
        stop[:, self.array.axis] += self.array.offsets[index]
        view = np.array(self.chunk_shape, dtype=np.int64)
        found = np.stack([start // view, -(-stop // view)], axis=2)
        with self._ranges_guard:
            if self._generation == generation:  # (no write meanwhile: else this listing may be stale)
                self._listed[source] = coords
                self._ranges[index] = found
        return found

    def _covered(self, fixed: Coords, axis: int) -> list[tuple[int, int]]:
        """The view chunk indexes along `axis` that stored chunks cover, among those whose
        leading coordinates are `fixed` (axes 0 .. axis - 1): merged [lo, hi) runs. Where
        `fixed` pins the concatenation axis, only the sources of that row are looked at
        (found by bisection: a description may name 100,000)."""
        concat_axis = self.array.axis
        if concat_axis < len(fixed):
            step = self.chunk_shape[concat_axis]
            row = fixed[concat_axis] * step
            indexes: Iterable[int] = self.array.sources_between(row, row + step)
        else:
            indexes = range(len(self.parts))
        runs: list[np.ndarray] = []
        for index in indexes:
            ranges = self._stored_ranges(index)
            keep = np.ones(len(ranges), dtype=bool)
            for k, c in enumerate(fixed):
                keep &= (ranges[:, k, 0] <= c) & (c < ranges[:, k, 1])
            if keep.any():
                runs.append(ranges[keep, axis, :])
        if not runs:
            return []
        joined = np.concatenate(runs)
        joined = joined[np.argsort(joined[:, 0], kind="stable")]
        merged: list[tuple[int, int]] = []
        grid = self.grid_shape[axis]
        for lo, hi in joined.tolist():
            lo, hi = max(lo, 0), min(hi, grid)
            if lo >= hi:
                continue
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        return merged

    def iter_chunk_dir(self, parts: tuple[str, ...]) -> Iterator[DirPage]:
        """One directory of the view's chunk keys (``c/i/j``), in pages of LIST_PAGE names,
        from the parts' stored chunks (`_covered`): never the whole view listed."""
        fixed = self.dir_coords(parts)
        origin, axis_at = self.key_layout()
        depth = len(parts)
        if fixed is None or depth >= len(origin):
            yield []
            return
        leaf = depth == len(origin) - 1  # (the file names: the last axis)
        if not leaf and depth not in axis_at:  # ("c": every chunk key's first name)
            yield [(origin[depth], None)] if self._covered((), 0) else []
            return
        axis = len(fixed)
        page: DirPage = []
        for lo, hi in self._covered(fixed, axis):
            for i in range(lo, hi):
                page.append((str(i), (*fixed, i) if leaf else None))
                if len(page) >= LIST_PAGE:
                    yield page
                    page = []
        yield page

    def list_chunks(self) -> list[Coords]:
        """Every view chunk some stored source chunk overlaps (at most LISTED_MAX: past
        that a ZfuseError; a mount lists directory by directory, `iter_chunk_dir`)."""
        found: list[Coords] = []

        def walk(fixed: Coords) -> None:
            axis = len(fixed)
            for lo, hi in self._covered(fixed, axis):
                if len(found) + (hi - lo if axis == len(self.shape) - 1 else 0) > LISTED_MAX:
                    raise ZfuseError(f"{self.name}: its stored chunks cover more than {LISTED_MAX} view chunks: "
                                     "not listed whole (a mount lists them directory by directory)")
                for i in range(lo, hi):
                    if axis == len(self.shape) - 1:
                        found.append((*fixed, i))
                    else:
                        walk((*fixed, i))

        walk(())
        return found

    def chunk_exists(self, coords: Coords) -> bool:
        """Whether any stored source chunk overlaps view chunk `coords`: existence
        checks of those source chunks only (usually one), no listing."""
        return self.in_grid(coords) and any(part.chunk_exists(c) for part, c in self._part_chunks(coords))

    def _part_chunks(self, coords: Coords) -> Iterator[tuple[ZarrChunkSource, Coords]]:
        """(part, its chunk) of every source chunk view chunk `coords` overlaps."""
        for part, here, src_region in self._view_pieces(coords):
            for c, *_ in self._overlaps(part, here, src_region):
                yield part, c

    def _view_pieces(self, coords: Coords) -> Iterator[tuple[ZarrChunkSource, tuple[slice, ...], tuple[slice, ...]]]:
        """(part, the region of view chunk `coords` it holds, in the view chunk; that
        region in the part) of every part the view chunk covers."""
        origin = [r.start for r in self.chunk_region(coords)]
        for index, src_region, view_region in self.array.chunk_sources(coords):
            here = tuple(slice(v.start - o, v.stop - o) for v, o in zip(view_region, origin, strict=True))
            yield self.parts[index], here, src_region

    @staticmethod
    def _overlaps(part: ZarrChunkSource, here: tuple[slice, ...], src_region: tuple[slice, ...],
                  ) -> Iterator[tuple[Coords, tuple[slice, ...], tuple[slice, ...], tuple[slice, ...]]]:
        """(chunk, `sub`: what of `src_region` it holds, in the part; `within`: the same in
        the chunk; `sub_here`: the same in the view chunk) of each of `part`'s chunks
        that region overlaps (`here`: the region in the view chunk). The one place the
        three are worked out, for reads, writes, their rollback and their check."""
        ranges = [range(r.start // n, -(-r.stop // n)) for r, n in zip(src_region, part.chunk_shape, strict=True)]
        for c in itertools.product(*ranges):
            region = part.chunk_region(c)
            lo = [max(a.start, b.start) for a, b in zip(src_region, region, strict=True)]
            hi = [min(a.stop, b.stop) for a, b in zip(src_region, region, strict=True)]
            if any(a >= b for a, b in zip(lo, hi, strict=True)):
                continue
            yield (c, tuple(slice(a, b) for a, b in zip(lo, hi, strict=True)),
                   tuple(slice(a - r.start, b - r.start) for a, b, r in zip(lo, hi, region, strict=True)),
                   tuple(slice(h.start + a - s.start, h.start + b - s.start)
                         for a, b, s, h in zip(lo, hi, src_region, here, strict=True)))

    def part_key_names(self, coords: Coords, most: int = 4) -> list[str]:
        """The source chunks behind view chunk `coords`, as messages name them (each
        source's name, then its chunk key); at most `most`, then how many more."""
        found = [f"{part.name}: {part.chunk_key(c)}" for part, c in itertools.islice(self._part_chunks(coords), most + 1)]
        return found if len(found) <= most else [*found[:most], "..."]

    @property
    def checks_written_values(self) -> bool:
        return any(part.checks_written_values for part in self.parts)

    def write_refusal(self, coords: Coords) -> OSError | None:
        return next((r for part, c in self._part_chunks(coords) if (r := part.write_refusal(c)) is not None), None)

    def retry_failed(self, coords: Coords) -> None:
        if self.in_grid(coords):
            for part, c in self._part_chunks(coords):
                part.retry_failed(c)

    def _aligned(self, coords: Coords) -> tuple[ZarrChunkSource, Coords] | None:
        """The one source chunk that is exactly view chunk `coords`, if there is one.

        Then reads and writes go straight to that source chunk (one get or set
        through its codecs) instead of zarr indexing on a region.
        """
        pieces = self.array.chunk_sources(coords)
        if len(pieces) != 1:
            return None
        index, src_region, _ = pieces[0]
        part = self.parts[index]
        if part.chunk_shape != self.chunk_shape or getattr(part, "sharding", None) is not None:
            return None
        if not np.array_equal(np.asarray(part.fill_value), np.asarray(self.fill_value), equal_nan=True):
            return None
        starts = [r.start for r in src_region]
        if any(s % c for s, c in zip(starts, self.chunk_shape, strict=True)):
            return None
        src_coords = tuple(s // c for s, c in zip(starts, self.chunk_shape, strict=True))
        # the view chunk must not extend past the source chunk (a shorter source's end)
        if part.chunk_region(src_coords) != tuple(
            slice(r.start, r.start + (v.stop - v.start)) for r, v in zip(src_region, self.chunk_region(coords), strict=True)
        ):
            return None
        return part, src_coords

    def read_chunk(self, coords: Coords, must_exist: bool = False) -> np.ndarray:
        aligned = self._aligned(coords)
        if aligned is not None:
            part, src_coords = aligned
            return part.read_chunk(src_coords, must_exist=must_exist)
        # assembled from the source chunks it overlaps, each decoded by its part (bounded:
        # zarr's indexing had decoded a 64 KB zstd frame into 2 GiB)
        out = np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        for part, here, src_region in self._view_pieces(coords):
            for c, _, within, sub_here in self._overlaps(part, here, src_region):
                out[sub_here] = part.read_chunk(c)[within]
        return out

    def write_chunk(self, coords: Coords, data: np.ndarray, *, lossy: bool = False) -> None:
        """Through the parts (each locks and forgets what it stores), never past them."""
        data = np.asarray(data, dtype=self.dtype)
        try:
            aligned = self._aligned(coords)
            if aligned is not None:
                part, src_coords = aligned
                part.write_chunk(src_coords, data, lossy=lossy)
                return
            full = self.full_chunk(data)
            pieces = self._pieces(coords)
            changed = [p for p in pieces if not p.holds(full)]
            if not changed:
                return  # (what the parts hold already: a lossy part would change it)
            if not lossy:
                self._check_parts_hold(pieces, full)
            self._write_parts(changed, lambda here: full[here])
        finally:
            self.forget_listing()  # (after: a listing made meanwhile may not show it)

    def _pieces(self, coords: Coords) -> list[_Piece]:
        """What view chunk `coords` covers of each part, with what each source chunk
        there held before (`_Held`)."""
        pieces = []
        for part, here, src_region in self._view_pieces(coords):
            held = []
            for c, sub, within, sub_here in self._overlaps(part, here, src_region):
                existed = part.chunk_exists(c)
                chunk = None
                if existed:
                    try:  # (unreadable: the write replaces it, and a rollback cannot put it back)
                        chunk = part.read_chunk(c, must_exist=True)
                    except Exception:
                        chunk = None
                # the whole chunk kept only where the check needs it (`_check_parts_hold`)
                whole = chunk if chunk is not None and not part.codecs.exact else None
                old = np.array(chunk[within]) if chunk is not None else None
                held.append(_Held(c, sub, within, sub_here, existed, old, whole))
            pieces.append(_Piece(part, src_region, here, held))
        return pieces

    def _write_parts(self, pieces: list[_Piece], values: Any) -> None:
        """Write each piece into its part (`values(here)`: the values of region `here` of
        the view chunk, or None: the fill value); if one fails, the pieces written, and
        the one that failed, are put back as they were: old values where a chunk was
        stored, erased where none was (a failed second part had left the first one's
        rows new while close() failed; putting back a chunk of fill values had made one
        where there was none)."""
        done: list[_Piece] = []
        try:
            for piece in pieces:
                done.append(piece)  # (before: a part that fails midway may have stored some)
                value = values(piece.here)
                piece.part.write_region(piece.src_region, value if value is not None else piece.part.fill_value)
        except BaseException:
            for piece in done:
                for held in piece.held:
                    try:
                        if not held.existed:
                            piece.part.write_region(held.sub, piece.part.fill_value)  # (erased: nothing made)
                        elif held.old is not None:
                            piece.part.write_region(held.sub, held.old)
                        else:
                            log.error("%s: %s's chunk at %s did not read before the failed write: not put back",
                                      self.name, piece.part.name, held.sub)
                    except Exception as e:  # (the first failure is the one raised; this one logged)
                        log.error("%s: putting back %s's old values after a failed write failed too: %s",
                                  self.name, piece.part.name, e)
            raise

    @staticmethod
    def _check_parts_hold(pieces: list[_Piece], full: np.ndarray) -> None:
        """Each source chunk a straddling view chunk writes into, as it would be after the
        write, checked to read back the same where its part's codecs are not known to be
        exact (`ChunkCodecs.check_exact`: InvalidTiffError, nothing written); from what
        `_pieces` decoded of it (a chunk that did not read is read again: its error is
        the write's)."""
        for piece in pieces:
            part = piece.part
            if part.codecs.exact:
                continue
            for held in piece.held:
                if held.whole is not None:
                    after = np.array(held.whole, dtype=part.dtype)
                else:  # (fill where none is stored)
                    after = np.array(part.read_chunk(held.chunk), dtype=part.dtype)
                after[held.within] = full[held.sub_here]
                region = part.chunk_region(held.chunk)
                part.codecs.check_exact(after, tuple(slice(0, r.stop - r.start) for r in region), False)

    def delete_chunk(self, coords: Coords) -> None:
        """The view chunk's values made the parts' fill values (each part drops a chunk
        left all fill), through the parts."""
        try:
            self._write_parts(self._pieces(coords), lambda here: None)
        finally:
            self.forget_listing()

    def v3_metadata(self) -> dict[str, Any]:
        meta = dict(self.parts[0].v3_metadata())
        meta["shape"] = list(self.shape)
        meta["attributes"] = {
            "zfuse_concat": {"axis": self.array.axis, "sources": list(self.array.names),
                             "offsets": list(self.array.offsets)}
        }
        return meta

    def extensions(self) -> list[str]:
        return ["virtual concatenation"]

    def unbounded_reason(self) -> str | None:
        """A part's (nested sharding): its chunks are read here as they are alone."""
        return next((f"{part.name}: {why}" for part in self.parts if (why := part.unbounded_reason())), None)

    def shard_index_nbytes(self) -> int | None:
        """The largest of the parts' shard indexes (the view keeps them in its index cache)."""
        sizes = [n for part in self.parts if (n := part.shard_index_nbytes()) is not None]
        return max(sizes) if sizes else None

    def forget_listing(self) -> None:
        super().forget_listing()
        with self._ranges_guard:
            self._ranges.clear()
            self._listed.clear()
            self._generation += 1

    def use_index_cache(self, cache: Any) -> None:
        for part in self.parts:
            part.use_index_cache(cache)

    def invalidate(self) -> None:
        for part in self.parts:  # (first: a listing made meanwhile would use their old state)
            part.invalidate()
        super().invalidate()  # (and `forget_listing`: the sources' listings kept)


def _refuse_repeated_sources(parts: list[ZarrChunkSource]) -> None:
    """MetadataError where one array is two sources of a read-write concatenation (the
    same path, or two spellings of it: a write through one view chunk left the other's
    copy of the same values stale). Read-only, a source may repeat."""
    seen: dict[Any, int] = {}
    for index, part in enumerate(parts):
        root = part.access.root
        identity: Any = ("store", id(part.store), part.prefix)
        if root is not None:
            try:
                st = os.stat(os.path.join(root, part.prefix))
                identity = ("local", st.st_dev, st.st_ino)
            except OSError:
                pass
        elif part.access.bounded is not None:
            identity = ("remote", part.access.bounded.source, part.prefix)
        first = seen.setdefault(identity, index)
        if first != index:
            raise MetadataError(f"sources {first} ({parts[first].name}) and {index} ({part.name}) are one array: "
                                "a read-write concatenation would show one copy stale after a write "
                                "through the other; mount it read-only (-o ro), or name each array once")
