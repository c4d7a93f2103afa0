"""The tiles of a whole-image file: a tile cache (the kernel reads one tile in several
requests), decoded tiles (one chunk's pixels, or assembled from the chunks a tile
overlaps, fill value elsewhere) and passthrough tiles (the stored chunk stream as
is, read by range straight from a local chunk file, or whole through the store
with its crc32c checksums checked and stripped), and the threads that decode the
further tiles of one read side by side (`TileDecoders`).

Decoded tiles: uncompressed. Passthrough tiles (`layout.passthrough_compression`):
the stored stream; a stored size that no longer matches the header makes the
file stale (`StaleImageError`: reopen it).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zfuse.errors import CorruptDataError, OutsideStoreError, ZfuseError
from zfuse.stats import Stats
from zfuse.view.caches import BoundedLRU, SingleFlight
from zfuse.view.tiff_ifd import COMPRESSION_DEFLATE, COMPRESSION_NONE
from zfuse.view.whole_image.header import Counts
from zfuse.view.whole_image.layout import ImageAxes, Level, unravel
from zfuse.workers import WorkerThreads

if TYPE_CHECKING:
    from zfuse.view.array_view import ArrayView

_TILE_CACHE_BYTES = 64 * 1024**2


class StaleImageError(CorruptDataError):
    """The store changed under an open whole-image file (EIO; reopen it)."""


class TileDecoders:
    """Threads decoding the further tiles of one read (two; started on first use: after
    any fork). Owned by whoever owns the whole-image files (the view)."""

    def __init__(self, workers: int = 2) -> None:
        self._threads = WorkerThreads(workers, "zfuse-tile-decode")

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._threads.submit(_call, (fn, args))

    def close(self) -> None:
        """Stop the threads (decodes under way finish; queued ones are dropped)."""
        self._threads.close()


def _call(job: tuple[Callable[..., Any], tuple[Any, ...]]) -> None:
    fn, args = job
    fn(*args)


class Tiles:
    """The tiles of one file (levels as planned): cached, single flight, decoded or
    passed through. `modes` and `counts` (per level: compression when passed through,
    else None; tile byte counts) are the header's, once settled."""

    def __init__(self, levels: list[Level], dtype: np.dtype, stats: Stats, label: str,
                 decoders: TileDecoders, invalidate: Callable[[str], None], samples: int = 1) -> None:
        """`samples`: 3 for RGB interleaved tiles, put together from the 3 planes of the
        array (the file's plane k is the array's planes 3k, 3k+1, 3k+2)."""
        self.levels = levels
        self.samples = samples
        self.dtype = dtype
        self.stats = stats
        self.label = label
        self._decoders = decoders
        self._invalidate = invalidate
        # built tiles: the kernel reads one tile in several requests. Bounded by
        # _TILE_CACHE_BYTES, or by the largest tile, so that a tile bigger than that
        # is still built once for all the requests reading it
        largest = max((max(lv.tile_bytes * samples, lv.slot) for lv in levels), default=0)
        self._tiles = BoundedLRU(max(_TILE_CACHE_BYTES, largest))
        self._fills: dict[tuple[int, int], bytes] = {}
        self._assembling = SingleFlight()  # tiles being fetched or assembled

    def _stale(self, why: str) -> StaleImageError:
        self._invalidate(why)
        return StaleImageError(why)

    def fill_stream(self, lv: Level, compression: int) -> bytes:
        """A tile of the fill value, compressed as the level's stored chunks are."""
        key = (id(lv), compression)
        data = self._fills.get(key)
        if data is None:
            data = self._fills[key] = _encode(compression, self._fill_tile(lv).tobytes())
        return data

    def _fill_tile(self, lv: Level) -> np.ndarray:
        return np.full((lv.tile_h, lv.tile_w), fill_value_of(lv.array), dtype=pixel_dtype(self.dtype))

    def _key(self, level: int, plane: int, tile: int) -> tuple[int, int, int, int]:
        """A built tile's key: with its array's count of chunks written through the view,
        so that a tile built before a write is never served after it."""
        return level, plane, tile, self.levels[level].array.data_version

    def cached(self, level: int, plane: int, tile: int) -> bytes | None:
        return self._tiles.get(self._key(level, plane, tile))

    def _keep(self, key: tuple[int, int, int, int], data: bytes) -> None:
        """Keep a built tile: the kernel reads one tile in several requests."""
        self._tiles.put(key, data, len(data))

    def _direct_chunk(self, lv: Level, plane: int, tile: int) -> tuple[int, ...] | None:
        """The chunk whose decoded bytes *are* this tile's pixels, if there is one."""
        if not lv.chunk_per_tile or self.samples > 1:
            return None
        if getattr(lv.array.options, "crop_edges", False):
            return None  # cropped edge chunks are shorter than a tile
        return lv.tile_chunk(plane, tile)

    def from_memory(self, level: int, plane: int, tile: int, modes: Sequence[int | None] | None) -> bytes | None:
        data = self.cached(level, plane, tile)
        if data is not None:
            return data
        if modes is not None and modes[level] is not None:
            return None
        lv = self.levels[level]
        coords = self._direct_chunk(lv, plane, tile)
        if coords is None:
            return None
        arr = lv.array
        return arr.cached_pixels(coords)

    def tile(self, level: int, plane: int, tile: int, modes: Sequence[int | None], counts: Sequence[Counts]) -> bytes:
        """A tile's stored bytes (passthrough stream, or decoded pixels) (blocking)."""
        data = self.cached(level, plane, tile)
        if data is not None:
            return data
        lv = self.levels[level]
        mode = modes[level]
        if mode is None:
            coords = self._direct_chunk(lv, plane, tile)
            if coords is not None:
                data = lv.array.pixel_bytes(coords)  # the chunk cache holds it (single flight)
                if len(data) == lv.tile_bytes:
                    return data
        # Single flight: the kernel reads one tile in several concurrent requests;
        # only the first fetches or assembles it, the others wait for it.
        with self._assembling.turn((level, plane, tile)):
            key = self._key(level, plane, tile)  # (before: a write meanwhile keeps it from later reads)
            data = self._tiles.get(key)
            if data is not None:
                return data
            if mode is not None:
                data = self._passthrough_tile(lv, level, plane, tile, mode, counts)
            elif self.samples > 1:
                data = self.interleave(lv, plane, tile)
            else:
                data = self.assemble(lv, plane, tile)
            self._keep(key, data)
            return data

    def decode_side_by_side(self, keys: list[tuple[int, int, int]], modes: Sequence[int | None]) -> None:
        """Start decoding the chunks of these tiles (the second and further tiles of one
        read: the kernel's read-ahead asks for two) in other threads, so they decode
        while this thread decodes the first; the read then finds them in the chunk
        cache, or waits for the decode under way (single flight)."""
        for level, plane, tile in keys:
            lv = self.levels[level]
            if modes[level] is not None:
                continue  # passed through: nothing to decode
            coords = self._direct_chunk(lv, plane, tile)
            if coords is not None and not lv.array.is_cached(coords):
                self._decoders.submit(lv.array.pixel_bytes, coords)  # a failure: the read reports it

    def stored_piece(
        self, level: int, plane: int, tile: int, within: int, length: int, into: memoryview | None,
        modes: Sequence[int | None] | None, counts: Sequence[Counts] | None,
    ) -> bytes | memoryview | None:
        """Bytes [within, within+length) of a passthrough tile read straight from its
        stored chunk file (blocking), or None when the level has no such file. With
        `into` (a buffer of at least `length` bytes) the file is read into it, and
        the part of it read is returned.

        A local store's chunk file *is* the tile's stream (no checksum to strip), so a
        read takes just the range asked for: no whole-chunk fetch through zarr's event
        loop and store threads, no copies, nothing kept (the OS page cache keeps it)."""
        lv = self.levels[level]
        if lv.passthrough is None or lv.passthrough[1]:
            return None
        assert modes is not None and counts is not None  # the read settled them
        mode = modes[level]
        if mode is None:
            return None
        coords = lv.tile_chunk(plane, tile)
        path = lv.chunk_file(coords)
        if path is None:
            return None
        expected = counts[level].at(plane * lv.tiles + tile)
        try:
            # opened inside the store (openat2 beneath its root): a link swapped in since
            # `stored_chunk_path` looked cannot lead the read out of the store [outside-1]
            fd = lv.array.source.open_raw_chunk(coords)
        except OutsideStoreError:
            return None  # decoded instead, where reading it fails (EIO, naming the key)
        except FileNotFoundError:  # nothing stored: the fill value
            fill = self.fill_stream(lv, mode)
            size, data = len(fill), fill[within : within + length]
        else:
            try:
                size = os.fstat(fd).st_size
                want = max(0, min(length, size - within))
                if not want:
                    data: bytes | memoryview = b""
                elif into is not None:
                    data = into[: os.preadv(fd, [into[:want]], within)]
                else:
                    data = os.pread(fd, want, within)
            finally:
                os.close(fd)
            if len(data) != want:
                size = within + len(data)  # it shrank while we read: stale, below
        if size != expected and mode == COMPRESSION_NONE and expected == lv.tile_bytes:
            # Not a tile's worth of raw values (the header did not look): the decoder
            # reads it, as for any decoded tile, or this tile fails, naming the chunk.
            try:
                return self.assemble(lv, plane, tile)[within : within + length]
            except StaleImageError:
                raise
            except ZfuseError as e:
                if type(e) is not CorruptDataError:  # (the decoder's own "does not decode" is said below)
                    raise
                raise CorruptDataError(
                    f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} ({path}) has "
                    f"{size} bytes, not the {lv.tile_bytes} of its uncompressed values: {e}") from e
            except Exception as e:
                raise CorruptDataError(
                    f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} ({path}) has "
                    f"{size} bytes, not the {lv.tile_bytes} of its uncompressed values: {e}") from e
        if size != expected:
            why = (f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} changed in "
                   f"the store since this file was opened ({size} bytes, header says "
                   f"{expected}); reopen the file")
            raise self._stale(why)
        if within == 0:
            self.stats.count("tiles_passed_through")
        return data

    def _passthrough_tile(self, lv: Level, level: int, plane: int, tile: int, mode: int, counts: Sequence[Counts]) -> bytes:
        assert lv.passthrough is not None and counts is not None
        coords = lv.tile_chunk(plane, tile)
        expected = counts[level].at(plane * lv.tiles + tile)
        raw = lv.array.source.read_stored(coords)
        if raw is None:
            data = self.fill_stream(lv, mode)
        else:
            data = _strip_checksums(raw, lv.passthrough[1], f"{lv.array.source.name} chunk {coords}")
        if len(data) != expected:
            why = (f"{self.label}: chunk {coords} of {lv.array.source.name or 'the array'} changed in "
                   f"the store since this file was opened ({len(data)} bytes, header says "
                   f"{expected}); reopen the file")
            raise self._stale(why)
        self.stats.count("tiles_passed_through")
        return data

    def interleave(self, lv: Level, plane: int, tile: int) -> bytes:
        """An RGB (chunky) tile: the tile of each sample's plane, interleaved. The chunks of
        the three planes are decoded side by side (other threads), as a read of several
        tiles does."""
        n = self.samples
        planes = [plane * n + s for s in range(n)]
        for p in planes[1:]:
            for coords in self._tile_chunks(lv, p, tile):
                if not lv.array.is_cached(coords):
                    self._decoders.submit(lv.array.pixel_bytes, coords)  # a failure: the read reports it
        dtype = pixel_dtype(self.dtype)
        parts = [np.frombuffer(self.assemble(lv, p, tile), dtype=dtype) for p in planes]
        return np.stack(parts, axis=-1).tobytes()

    def fetch_ahead(self, keys: list[tuple[int, int, int]]) -> None:
        """Start fetching the chunks of these tiles (level, plane, tile) from a remote
        store all at once, for the reads to come; returns at once."""
        wanted: dict[int, list[tuple[int, ...]]] = {}
        for level, plane, tile in keys:
            wanted.setdefault(level, []).extend(self._tile_chunks(self.levels[level], plane, tile))
        for level, coords in wanted.items():
            self.levels[level].array.fetch_ahead(coords)

    def _tile_chunks(self, lv: Level, plane: int, tile: int) -> list[tuple[int, ...]]:
        """The chunks a tile of a plane overlaps."""
        ty, tx = divmod(tile, lv.tiles_across)
        y0, x0 = ty * lv.tile_h, tx * lv.tile_w
        y1, x1 = min(y0 + lv.tile_h, lv.height), min(x0 + lv.tile_w, lv.width)
        lead = unravel(plane, lv.lead)
        lead_chunk = tuple(i // c for i, c in zip(lead, lv.chunk_lead, strict=True))
        return [lv.axes.chunk_coords(lead_chunk, cy, cx)
                for cy in range(y0 // lv.chunk_h, (y1 - 1) // lv.chunk_h + 1)
                for cx in range(x0 // lv.chunk_w, (x1 - 1) // lv.chunk_w + 1)]

    def assemble(self, lv: Level, plane: int, tile: int) -> bytes:
        """A decoded tile put together from the chunks it overlaps (fill value elsewhere)."""
        started = time.perf_counter()
        dtype = pixel_dtype(self.dtype)
        out = np.full((lv.tile_h, lv.tile_w), fill_value_of(lv.array), dtype=dtype)
        ty, tx = divmod(tile, lv.tiles_across)
        y0, x0 = ty * lv.tile_h, tx * lv.tile_w
        y1, x1 = min(y0 + lv.tile_h, lv.height), min(x0 + lv.tile_w, lv.width)
        lead = unravel(plane, lv.lead)
        lead_chunk = tuple(i // c for i, c in zip(lead, lv.chunk_lead, strict=True))
        lead_in = tuple(i % c for i, c in zip(lead, lv.chunk_lead, strict=True))
        crop = crop_edges(lv.array)
        for cy in range(y0 // lv.chunk_h, (y1 - 1) // lv.chunk_h + 1):
            for cx in range(x0 // lv.chunk_w, (x1 - 1) // lv.chunk_w + 1):
                coords = lv.axes.chunk_coords(lead_chunk, cy, cx)
                plane2d = chunk_plane(lv.array, lv.axes, coords, lead_in, dtype, crop)
                ys, xs = cy * lv.chunk_h, cx * lv.chunk_w
                a0, a1 = max(y0, ys), min(y1, ys + plane2d.shape[0])
                b0, b1 = max(x0, xs), min(x1, xs + plane2d.shape[1])
                if a0 < a1 and b0 < b1:
                    out[a0 - y0 : a1 - y0, b0 - x0 : b1 - x0] = plane2d[a0 - ys : a1 - ys, b0 - xs : b1 - xs]
        self.stats.count("tiles_assembled")
        self.stats.count("tile_assembly_seconds", time.perf_counter() - started)
        return out.tobytes()


def crop_edges(arr: ArrayView) -> bool:
    """Whether the array's edge chunks are cropped (shorter than a chunk)."""
    return bool(getattr(arr.options, "crop_edges", False))


def chunk_plane(arr: ArrayView, axes: ImageAxes, coords: tuple[int, ...], lead_in: tuple[int, ...],
                dtype: np.dtype, crop: bool, raw: bytes | memoryview | None = None) -> np.ndarray:
    """One Y/X plane of a chunk (`lead_in`: its index in the chunk's page axes, in the
    order of `axes`, the array's `ImageAxes`) as a 2-d view of the decoded values
    (blocking: decodes the chunk unless `raw` is given). The chunk file's axes may run
    in another order than the chunk's (`TiffLayout.file_axes`): put back in the chunk's
    order, then in the image's."""
    src = arr.source
    if raw is None:
        raw = arr.pixel_bytes(coords)
    shape = tuple(src.chunk_shape)
    if crop:
        shape = tuple(r.stop - r.start for r in src.chunk_region(coords))
    flat = np.frombuffer(raw, dtype=dtype)
    layout = arr.layout
    chunk = layout.from_file_order(flat, shape) if layout is not None else flat.reshape(shape)
    return axes.plane(chunk, lead_in)


def _encode(compression: int, data: bytes) -> bytes:
    if compression == COMPRESSION_DEFLATE:
        return zlib.compress(data, 6)
    return data


def _strip_checksums(raw: bytes, trailer: int, what: str) -> bytes:
    """The stream before `trailer` bytes of crc32c checksums (each checked)."""
    if trailer == 0:
        return raw
    import crc32c

    data = raw
    for _ in range(trailer // 4):
        if len(data) < 4:
            raise CorruptDataError(f"{what}: shorter than its checksum")
        body, stored = data[:-4], int.from_bytes(data[-4:], "little")
        if crc32c.crc32c(body) != stored:
            raise CorruptDataError(f"{what}: crc32c checksum mismatch")
        data = body
    return data


def pixel_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind == "b":
        return np.dtype(np.uint8)
    return np.dtype(dtype).newbyteorder("<")


def fill_value_of(arr: ArrayView) -> Any:
    fill = arr.source.fill_value
    if fill is None:
        return 0
    if np.dtype(arr.source.dtype).kind == "b":
        return int(bool(fill))
    return fill

