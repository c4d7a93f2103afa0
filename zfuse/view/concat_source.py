"""A virtual concatenation (`zfuse.ext.concat.ConcatArray`) as a chunk source.

The view's chunk grid is the first source's (inner) chunk shape; chunk keys
use the default encoding (``c/i/j``). A view chunk exists when any stored
chunk of any source overlaps it; that is found by listing each source once
(`ZarrChunkSource.list_chunks`) and mapping source chunks onto view chunks,
not by probing every grid position.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding

from zfuse.ext.chunk_keys import ChunkKeyDecoder
from zfuse.ext.concat import ConcatArray
from zfuse.view.source import ChunkSource, Coords, ZarrChunkSource


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

    def chunk_key(self, coords: Coords) -> str:
        return "/".join(("c", *map(str, coords)))

    def decode_key(self, key: str) -> Coords | None:
        return self._key_decoder(key)

    def list_chunks(self) -> list[Coords]:
        axis = self.array.axis
        found: set[Coords] = set()
        for part, offset in zip(self.parts, self.array.offsets, strict=True):
            for coords in part.list_chunks():
                region = part.chunk_region(coords)
                ranges = []
                for dim, r in enumerate(region):
                    start, stop = r.start, r.stop
                    if dim == axis:
                        start, stop = start + offset, stop + offset
                    c = self.chunk_shape[dim]
                    ranges.append(range(start // c, -(-stop // c)))
                found.update(itertools.product(*ranges))
        return sorted(found)

    def chunk_exists(self, coords: Coords) -> bool:
        """Whether any stored source chunk overlaps view chunk `coords`: existence
        checks of those source chunks only (usually one), no listing."""
        return self.in_grid(coords) and any(part.chunk_exists(c) for part, c in self._part_chunks(coords))

    def _part_chunks(self, coords: Coords) -> Iterator[tuple[ZarrChunkSource, Coords]]:
        """(part, its chunk) of every source chunk view chunk `coords` overlaps."""
        for index, src_region, _ in self.array.chunk_sources(coords):
            part = self.parts[index]
            ranges = [range(r.start // c, -(-r.stop // c)) for r, c in zip(src_region, part.chunk_shape, strict=True)]
            for c in itertools.product(*ranges):
                yield part, c

    def part_key_names(self, coords: Coords, most: int = 4) -> list[str]:
        """The source chunks behind view chunk `coords`, as messages name them (each
        source's name, then its chunk key); at most `most`, then how many more."""
        found = [f"{part.name}: {part.chunk_key(c)}" for part, c in itertools.islice(self._part_chunks(coords), most + 1)]
        return found if len(found) <= most else [*found[:most], "..."]

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
        return self.array.read_chunk(coords)

    def write_chunk(self, coords: Coords, data: np.ndarray) -> None:
        """Through the parts (each locks and forgets what it stores), never past them."""
        data = np.asarray(data, dtype=self.dtype)
        try:
            aligned = self._aligned(coords)
            if aligned is not None:
                part, src_coords = aligned
                part.write_chunk(src_coords, data)
                return
            full = self.full_chunk(data)
            origin = [r.start for r in self.chunk_region(coords)]
            for index, src_region, view_region in self.array.chunk_sources(coords):
                here = tuple(slice(v.start - o, v.stop - o) for v, o in zip(view_region, origin, strict=True))
                self.parts[index].write_region(src_region, full[here])
        finally:
            self.forget_listing()  # (after: a listing made meanwhile may not show it)

    def delete_chunk(self, coords: Coords) -> None:
        """The view chunk's values made the parts' fill values (each part drops a chunk
        left all fill), through the parts."""
        try:
            for index, src_region, _ in self.array.chunk_sources(coords):
                part = self.parts[index]
                part.write_region(src_region, part.fill_value)
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

    def use_index_cache(self, cache: Any) -> None:
        for part in self.parts:
            part.use_index_cache(cache)

    def invalidate(self) -> None:
        super().invalidate()  # the whole-array listing `iter_chunk_dir` falls back on
        for part in self.parts:
            part.invalidate()
